//! Socket addresses as rdma_ucm commands carry them (`sockaddr_in`,
//! `sockaddr_in6`, `__kernel_sockaddr_storage`, `sockaddr_ib`), and the
//! RoCE mapping between IP addresses and GIDs (Linux `ib_addr.h`
//! `rdma_ip2gid`/`rdma_gid2ip`: an IPv4 address is the GID
//! `::ffff:a.b.c.d`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;
/// `AF_IB`.
pub const AF_IB: u16 = 27;
/// `sizeof(struct sockaddr_in)`.
pub const SIN_LEN: usize = 16;
/// `sizeof(struct sockaddr_in6)`.
pub const SIN6_LEN: usize = 28;
/// `sizeof(struct sockaddr_ib)`.
pub const SIB_LEN: usize = 48;
/// `sizeof(struct __kernel_sockaddr_storage)`.
pub const SS_LEN: usize = 128;

/// Why an address is refused (the errno ucma.c/cma.c answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    /// Too short or a size that does not match its family (`EINVAL`).
    #[error("malformed address")]
    Invalid,
    /// A family other than `AF_INET`/`AF_INET6` (`EAFNOSUPPORT`; `AF_IB`
    /// is not served).
    #[error("address family not supported")]
    Family,
}

impl AddrError {
    /// The negative errno of the answer.
    pub fn errno(self) -> i32 {
        match self {
            AddrError::Invalid => -libc::EINVAL,
            AddrError::Family => -libc::EAFNOSUPPORT,
        }
    }
}

/// The family of the address at the start of `b` (native-endian `u16`), 0
/// when `b` is too short.
pub fn family(b: &[u8]) -> u16 {
    b.get(..2).map_or(0, |f| u16::from_ne_bytes([f[0], f[1]]))
}

/// Parses a `sockaddr_in` or `sockaddr_in6` at the start of `b`.
/// Errors: [`AddrError::Family`] for any other family,
/// [`AddrError::Invalid`] when `b` is shorter than the family's size.
pub fn parse(b: &[u8]) -> Result<SocketAddr, AddrError> {
    match family(b) {
        AF_INET => {
            let b = b.get(..SIN_LEN).ok_or(AddrError::Invalid)?;
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        AF_INET6 => {
            let b = b.get(..SIN6_LEN).ok_or(AddrError::Invalid)?;
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let ip: [u8; 16] = b[8..24].try_into().map_err(|_| AddrError::Invalid)?;
            let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flow,
                scope,
            )))
        }
        _ => Err(AddrError::Family),
    }
}

/// The size of `a`'s `sockaddr` (`rdma_addr_size`).
pub fn size(a: &SocketAddr) -> usize {
    match a {
        SocketAddr::V4(_) => SIN_LEN,
        SocketAddr::V6(_) => SIN6_LEN,
    }
}

/// Writes `a` as a `sockaddr_in`/`sockaddr_in6` at the start of `out`
/// (at least [`SIN6_LEN`] bytes); returns its size.
pub fn emit(a: &SocketAddr, out: &mut [u8]) -> usize {
    match a {
        SocketAddr::V4(v) => {
            out[..SIN_LEN].fill(0);
            out[0..2].copy_from_slice(&AF_INET.to_ne_bytes());
            out[2..4].copy_from_slice(&v.port().to_be_bytes());
            out[4..8].copy_from_slice(&v.ip().octets());
            SIN_LEN
        }
        SocketAddr::V6(v) => {
            out[..SIN6_LEN].fill(0);
            out[0..2].copy_from_slice(&AF_INET6.to_ne_bytes());
            out[2..4].copy_from_slice(&v.port().to_be_bytes());
            out[4..8].copy_from_slice(&v.flowinfo().to_be_bytes());
            out[8..24].copy_from_slice(&v.ip().octets());
            out[24..28].copy_from_slice(&v.scope_id().to_ne_bytes());
            SIN6_LEN
        }
    }
}

/// Writes a `sockaddr_ib` (`AF_IB`) naming `gid`, P_Key `pkey` and service
/// ID `sid` at the start of `out` (ucma.c `ucma_query_gid`); returns its
/// size.
pub fn emit_ib(gid: &[u8; 16], pkey: u16, sid: u64, out: &mut [u8]) -> usize {
    out[..SIB_LEN].fill(0);
    out[0..2].copy_from_slice(&AF_IB.to_ne_bytes());
    out[2..4].copy_from_slice(&pkey.to_be_bytes());
    out[8..24].copy_from_slice(gid);
    out[24..32].copy_from_slice(&sid.to_be_bytes());
    out[32..40].copy_from_slice(&u64::MAX.to_be_bytes());
    SIB_LEN
}

/// The RoCE GID of `ip` (`rdma_ip2gid`): IPv4 as `::ffff:a.b.c.d`.
pub fn ip_to_gid(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v) => v.to_ipv6_mapped().octets(),
        IpAddr::V6(v) => v.octets(),
    }
}

/// The IP address of a RoCE GID (`rdma_gid2ip`): an IPv4-mapped GID is
/// its IPv4 address.
pub fn gid_to_ip(gid: &[u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Whether `a` is the wildcard or a loopback address of its family
/// (`cma_any_addr`: `cma_zero_addr || cma_loopback_addr`). Bound to one,
/// an id has no device, listens on every address, and resolves a
/// destination from the function's own address (`cma_resolve_loopback`);
/// libfabric's verbs provider binds "localhost" to probe for devices.
pub fn is_any(a: &SocketAddr) -> bool {
    a.ip().is_unspecified() || a.ip().is_loopback()
}

/// The wildcard address of `a`'s family, with `port`.
pub fn any_of(family_of: &SocketAddr, port: u16) -> SocketAddr {
    match family_of {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refusals() {
        let a: SocketAddr = "10.0.0.1:7174".parse().unwrap();
        let mut b = [0u8; SS_LEN];
        assert_eq!(emit(&a, &mut b), SIN_LEN);
        assert_eq!(parse(&b), Ok(a));
        assert_eq!(parse(&b[..SIN_LEN - 1]), Err(AddrError::Invalid));
        let a6: SocketAddr = "[fd00::2]:1".parse().unwrap();
        assert_eq!(emit(&a6, &mut b), SIN6_LEN);
        assert_eq!(parse(&b), Ok(a6));
        assert_eq!(parse(&b[..SIN6_LEN - 1]), Err(AddrError::Invalid));
        b[0..2].copy_from_slice(&AF_IB.to_ne_bytes());
        assert_eq!(parse(&b), Err(AddrError::Family));
        assert_eq!(parse(&[]), Err(AddrError::Family));
        let g = ip_to_gid("10.0.0.1".parse().unwrap());
        assert_eq!(&g[10..], &[0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(gid_to_ip(&g), "10.0.0.1".parse::<IpAddr>().unwrap());
        assert!(is_any(&any_of(&a, 5)));
        assert!(is_any(&"127.0.0.1:7".parse().unwrap()) && is_any(&"[::1]:7".parse().unwrap()));
    }
}
