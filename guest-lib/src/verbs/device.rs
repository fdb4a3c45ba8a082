//! Device-level types: [`Gid`].

use std::net::{Ipv4Addr, Ipv6Addr};

/// A GID (`union ibv_gid`): 16 bytes in network byte order. For RoCEv2 it
/// is an IPv6 address, IPv4-mapped (`::ffff:a.b.c.d`) for an IPv4 port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gid {
    /// The bytes, network order (`ibv_gid.raw`).
    pub raw: [u8; 16],
}

impl Gid {
    /// The subnet prefix: bytes 0..8 as a big-endian integer
    /// (`ibv_gid.global.subnet_prefix`).
    pub fn subnet_prefix(&self) -> u64 {
        u64::from_be_bytes(self.raw[..8].try_into().expect("8 bytes"))
    }

    /// The interface ID: bytes 8..16 as a big-endian integer
    /// (`ibv_gid.global.interface_id`). `ibv_rc_pingpong` treats a GID with a
    /// zero interface ID as "no GID" (no GRH).
    pub fn interface_id(&self) -> u64 {
        u64::from_be_bytes(self.raw[8..].try_into().expect("8 bytes"))
    }

    /// True when every byte is zero.
    pub fn is_zero(&self) -> bool {
        self.raw == [0; 16]
    }

    /// The IPv4 address of an IPv4-mapped GID.
    pub fn to_ipv4_mapped(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.raw).to_ipv4_mapped()
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(a: Ipv6Addr) -> Self {
        Gid { raw: a.octets() }
    }
}

impl From<Ipv4Addr> for Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d`.
    fn from(a: Ipv4Addr) -> Self {
        Gid {
            raw: a.to_ipv6_mapped().octets(),
        }
    }
}

impl From<Gid> for Ipv6Addr {
    fn from(g: Gid) -> Self {
        Ipv6Addr::from(g.raw)
    }
}

impl std::fmt::Display for Gid {
    /// The IPv6 text form, as `inet_ntop(AF_INET6, ...)` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&Ipv6Addr::from(self.raw), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_gid_round_trips_and_prints_like_inet_ntop() {
        let g = Gid::from(Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(g.raw[10..], [0xff, 0xff, 10, 0, 0, 2]);
        assert_eq!(g.to_string(), "::ffff:10.0.0.2");
        assert_eq!(g.to_ipv4_mapped(), Some(Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(g.subnet_prefix(), 0);
        assert_eq!(g.interface_id(), 0x0000_ffff_0a00_0002);
        assert!(!g.is_zero());
        assert_eq!(Gid::default().to_string(), "::");
        assert!(Gid::default().is_zero());
    }
}
