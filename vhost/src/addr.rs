//! Port addresses from the command line: `ADDR/PREFIX` IPv4 addresses,
//! `xx:xx:xx:xx:xx:xx` MAC addresses and the default MAC derived from the
//! IPv4 address.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// An address that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// Not `a.b.c.d/prefix` with a prefix of 1 to 32.
    #[error("{input:?} is not an IPv4 address with a prefix length (e.g. 10.0.0.1/24)")]
    Ipv4Prefix {
        /// The text given.
        input: String,
    },
    /// Not six colon-separated hex bytes, or a multicast address.
    #[error("{input:?} is not a unicast MAC address (e.g. 02:76:0a:00:00:01)")]
    Mac {
        /// The text given.
        input: String,
    },
}

/// An IPv4 address with its prefix length, as `10.0.0.1/24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Prefix {
    /// The address.
    pub addr: Ipv4Addr,
    /// Prefix length, 1..=32.
    pub len: u8,
}

impl FromStr for Ipv4Prefix {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, AddrError> {
        let err = || AddrError::Ipv4Prefix {
            input: s.to_string(),
        };
        let (a, l) = s.split_once('/').ok_or_else(err)?;
        let addr: Ipv4Addr = a.parse().map_err(|_| err())?;
        let len: u8 = l.parse().map_err(|_| err())?;
        if !(1..=32).contains(&len) {
            return Err(err());
        }
        Ok(Self { addr, len })
    }
}

impl fmt::Display for Ipv4Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// A unicast Ethernet MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// The default MAC of a port with IPv4 address `ip`: locally
    /// administered unicast `02:76:a:b:c:d` (0x76 is 'v') for `a.b.c.d`, so
    /// ports on one network get distinct, recognisable MACs.
    pub fn from_ipv4(ip: Ipv4Addr) -> Self {
        let [a, b, c, d] = ip.octets();
        Self([0x02, 0x76, a, b, c, d])
    }
}

impl FromStr for Mac {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, AddrError> {
        let err = || AddrError::Mac {
            input: s.to_string(),
        };
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for b in &mut mac {
            let p = parts.next().ok_or_else(err)?;
            if p.is_empty() || p.len() > 2 {
                return Err(err());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() || mac[0] & 1 != 0 {
            return Err(err());
        }
        Ok(Self(mac))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ipv4_prefix() {
        let p: Ipv4Prefix = "10.0.0.1/24".parse().unwrap();
        assert_eq!(
            p,
            Ipv4Prefix {
                addr: Ipv4Addr::new(10, 0, 0, 1),
                len: 24
            }
        );
        assert_eq!(p.to_string(), "10.0.0.1/24");
        for bad in [
            "10.0.0.1",
            "10.0.0.1/0",
            "10.0.0.1/33",
            "10.0.0/24",
            "x/24",
            "10.0.0.1/",
        ] {
            assert!(bad.parse::<Ipv4Prefix>().is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_and_derives_macs() {
        let m: Mac = "02:76:0a:00:00:01".parse().unwrap();
        assert_eq!(m, Mac::from_ipv4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(m.to_string(), "02:76:0a:00:00:01");
        assert_eq!(
            "2:0:0:0:0:ff".parse::<Mac>().unwrap().0,
            [2, 0, 0, 0, 0, 0xff]
        );
        for bad in [
            "02:76:0a:00:00",
            "02:76:0a:00:00:01:02",
            "01:00:5e:00:00:01",
            "02:76:0a:00:00:1ff",
            "02::0a:00:00:01",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
        let d = Mac::from_ipv4(Ipv4Addr::new(192, 168, 1, 2)).0;
        assert_eq!(d[0] & 0b11, 0b10, "locally administered unicast");
    }
}
