//! The port's identity as the transport uses it: its addresses, GID
//! table and P_Key.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::wire::Gid;

/// The port's identity: addresses used in packets, and its GID table.
#[derive(Debug, Clone)]
pub struct PortId {
    /// MAC address.
    pub mac: [u8; 6],
    /// IPv4 address (GID index 1).
    pub ipv4: Ipv4Addr,
    /// Further IPv6 addresses (GID indices 2, 3, ...).
    pub ipv6: Vec<Ipv6Addr>,
    /// The P_Key table (IBTA §10.9.1), by index: [`DEFAULT_PKEY`] alone,
    /// as rxe's port (`RXE_PORT_PKEY_TBL_LEN` 1).
    pub pkeys: Vec<u16>,
}

/// The default P_Key, full member of the default partition (IBTA §10.9.1.1).
pub const DEFAULT_PKEY: u16 = 0xffff;

impl PortId {
    /// The GID table (as Linux RoCE lays it out for RoCEv2): index 0 the
    /// link-local GID from the MAC (modified EUI-64), index 1 the
    /// IPv4-mapped GID of [`PortId::ipv4`], then one GID per address of
    /// [`PortId::ipv6`]. `None` past the end.
    pub fn gid(&self, index: u32) -> Option<Gid> {
        match index {
            0 => Some(Gid::link_local_from_mac(self.mac)),
            1 => Some(Gid::from_ip(IpAddr::V4(self.ipv4))),
            n => self
                .ipv6
                .get(n as usize - 2)
                .map(|a| Gid::from_ip(IpAddr::V6(*a))),
        }
    }

    /// Number of GID table entries.
    pub fn gid_count(&self) -> u32 {
        2 + self.ipv6.len() as u32
    }

    /// P_Key table entry `index`, `None` past the end (`ibv_query_pkey(3)`).
    pub fn pkey(&self, index: u32) -> Option<u16> {
        self.pkeys.get(usize::try_from(index).ok()?).copied()
    }

    /// True when `ip` is one of the port's addresses (a GID of its table).
    pub fn owns(&self, ip: IpAddr) -> bool {
        // The common case first (every packet received asks), without
        // building the link-local GID.
        if ip == IpAddr::V4(self.ipv4) {
            return true;
        }
        let g = Gid::from_ip(ip);
        (0..self.gid_count()).any(|i| self.gid(i) == Some(g))
    }
}
