//! Global Identifiers (IBTA Vol 1 4.1.1) as used by RoCEv2 (Annex A17):
//! a GID is an IPv6 address, IPv4 addresses being IPv4-mapped (RFC 4291
//! 2.5.5.2).

use core::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A 128-bit GID in network byte order. For RoCEv2 it is the IPv6 address
/// of a port, or `::ffff:a.b.c.d` for an IPv4 address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address: IPv6 as is, IPv4 as the IPv4-mapped IPv6
    /// address `::ffff:a.b.c.d` (RFC 4291 2.5.5.2; IBTA A17 RoCEv2 GIDs).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address of this GID: IPv4-mapped GIDs give `IpAddr::V4`,
    /// every other GID `IpAddr::V6`.
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The link-local GID `fe80::/64` + modified EUI-64 interface ID of a
    /// MAC address (RFC 4291 2.5.1 and Appendix A: universal/local bit
    /// flipped, `ff:fe` inserted), as RoCE derives the default GID.
    pub fn link_local_from_mac(mac: [u8; 6]) -> Gid {
        let mut g = [0u8; 16];
        g[0] = 0xfe;
        g[1] = 0x80;
        g[8] = mac[0] ^ 0x02;
        g[9] = mac[1];
        g[10] = mac[2];
        g[11] = 0xff;
        g[12] = 0xfe;
        g[13..16].copy_from_slice(&mac[3..6]);
        Gid(g)
    }
}

impl From<IpAddr> for Gid {
    /// [`Gid::from_ip`].
    fn from(ip: IpAddr) -> Gid {
        Gid::from_ip(ip)
    }
}

impl From<Ipv6Addr> for Gid {
    /// The 16 address bytes as is.
    fn from(ip: Ipv6Addr) -> Gid {
        Gid(ip.octets())
    }
}

impl fmt::Display for Gid {
    /// RFC 5952 IPv6 text, e.g. `fe80::21b:21ff:fe00:1` or `::ffff:10.0.0.1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn ipv4_mapped() {
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let g = Gid::from_ip(ip);
        assert_eq!(g.0, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(g.to_ip(), ip);
        assert_eq!(g.to_string(), "::ffff:10.0.0.1");
    }

    #[test]
    fn ipv6_round_trip() {
        let ip: IpAddr = "2001:db8::42".parse().unwrap();
        let g = Gid::from(ip);
        assert_eq!(g.to_ip(), ip);
        assert_eq!(g.to_string(), "2001:db8::42");
        // An IPv4-compatible (not mapped) address stays IPv6.
        let compat: IpAddr = "::10.0.0.1".parse().unwrap();
        assert_eq!(Gid::from_ip(compat).to_ip(), compat);
    }

    #[test]
    fn link_local() {
        let g = Gid::link_local_from_mac([0x00, 0x1b, 0x21, 0x00, 0x00, 0x01]);
        assert_eq!(g.to_string(), "fe80::21b:21ff:fe00:1");
        let g = Gid::link_local_from_mac([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        assert_eq!(g.to_string(), "fe80::5054:ff:fe12:3456");
    }
}
