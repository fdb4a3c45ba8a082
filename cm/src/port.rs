//! The identity of the port a [`Cm`] serves.

#[cfg(doc)]
use crate::{timing::cm_ack_timeout, Cm};
use vrnic_wire::Gid;

/// A CA GUID derived from a MAC address as an EUI-64 (the universal/local
/// bit flipped, `ff:fe` in the middle), as RoCE devices derive theirs
/// (rxe's `rxe_init_device_param` takes the netdev's MAC the same way).
pub fn ca_guid_from_mac(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// The port a [`Cm`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortIdentity {
    /// The local GID the CM's connections use (RoCEv2: the IPv4-mapped or
    /// IPv6 address), put in REQs' primary path.
    pub gid: Gid,
    /// The CA GUID sent in REQ and REP ([`ca_guid_from_mac`]).
    pub ca_guid: u64,
    /// The device's local CA ACK delay exponent (rxe reports 15), used by
    /// [`cm_ack_timeout`].
    pub ca_ack_delay: u8,
    /// The seed of the comm ID allocator: the cyclic index's start and the
    /// XOR operand (cm.c's `cm.random_id_operand`). Give each start a
    /// different, random one.
    pub seed: u64,
}
