//! rdma_cm's IP addressing on top of IB CM (IBTA Vol 1 Annex A11, "RDMA
//! IP CM Service"; Linux `drivers/infiniband/core/cma.c`): the private-data
//! header that starts every REQ and SIDR_REQ an IP-addressed `rdma_cm_id`
//! sends, and the service IDs that encode port space and port.
//!
//! An `AF_IB` `rdma_cm_id` sends no header; every IPv4/IPv6 one does,
//! RoCE included.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{be16, need, WireError};

/// `cma_version` of the header, the only one Linux sends and accepts
/// (`cma.c` `CMA_VERSION`).
pub const CMA_VERSION: u8 = 0x00;

/// The addresses of a [`CmaHdr`]: both of one IP version, as
/// `cma_format_hdr` writes them from the `rdma_cm_id`'s source and
/// destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmaAddrs {
    /// IP version 4: each address in the last 4 of its 16 bytes.
    V4 {
        /// The sender's address.
        src: Ipv4Addr,
        /// The address the sender connects to.
        dst: Ipv4Addr,
    },
    /// IP version 6: each address in its 16 bytes.
    V6 {
        /// The sender's address.
        src: Ipv6Addr,
        /// The address the sender connects to.
        dst: Ipv6Addr,
    },
}

/// rdma_cm's private-data header, `struct cma_hdr`: 36 bytes at the start
/// of a REQ's or SIDR_REQ's private data (IBTA Annex A11; Linux `cma.c`
/// `cma_format_hdr`, `cma_save_ip_info`).
///
/// ```text
/// byte  0      cma_version (0)
/// byte  1      IP version(7-4) reserved(3-0)
/// bytes 2-3    source port
/// bytes 4-19   source address (IPv4: 12 bytes 0, then the address)
/// bytes 20-35  destination address (same)
/// ```
///
/// The destination port is not here: it is the low 16 bits of the REQ's
/// service ID ([`service_id`]). The consumer's private data follows the
/// header: up to [`REQ_USER_PRIVATE_DATA_MAX`] bytes in a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdr {
    /// The sender's port (the `rdma_cm_id`'s bound source port).
    pub src_port: u16,
    /// Source and destination addresses.
    pub addrs: CmaAddrs,
}

/// Most private data an rdma_cm consumer can put in a REQ: 92 bytes less
/// the 36-byte [`CmaHdr`].
pub const REQ_USER_PRIVATE_DATA_MAX: usize = 92 - CmaHdr::LEN;

/// Most private data an rdma_cm consumer can put in a SIDR_REQ: 216 bytes
/// less the 36-byte [`CmaHdr`].
pub const SIDR_REQ_USER_PRIVATE_DATA_MAX: usize = 216 - CmaHdr::LEN;

impl CmaHdr {
    /// Length of the header, in bytes.
    pub const LEN: usize = 36;

    /// Parses `buf[..36]` as Linux's `cma_save_ip_info` reads it.
    ///
    /// Errors: [`WireError::Truncated`] if shorter;
    /// [`WireError::BadCmaHeader`] if the version is not [`CMA_VERSION`]
    /// or the IP version neither 4 nor 6 (Linux fails the REQ then). The
    /// reserved nibble and, for IPv4, the 12 bytes before each address are
    /// ignored.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        let ip_version = b[1] >> 4;
        let addr16 = |at: usize| -> [u8; 16] { b[at..at + 16].try_into().expect("16 bytes") };
        let addrs = match (b[0], ip_version) {
            (CMA_VERSION, 4) => CmaAddrs::V4 {
                src: Ipv4Addr::new(b[16], b[17], b[18], b[19]),
                dst: Ipv4Addr::new(b[32], b[33], b[34], b[35]),
            },
            (CMA_VERSION, 6) => CmaAddrs::V6 {
                src: Ipv6Addr::from(addr16(4)),
                dst: Ipv6Addr::from(addr16(20)),
            },
            (version, _) => {
                return Err(WireError::BadCmaHeader {
                    version,
                    ip_version,
                })
            }
        };
        Ok(CmaHdr {
            src_port: be16(&b[2..]),
            addrs,
        })
    }

    /// Writes the header into `buf[..36]` as `cma_format_hdr` does (IPv4:
    /// the 12 bytes before each address 0). Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..Self::LEN];
        b.fill(0);
        b[0] = CMA_VERSION;
        b[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        match self.addrs {
            CmaAddrs::V4 { src, dst } => {
                b[1] = 4 << 4;
                b[16..20].copy_from_slice(&src.octets());
                b[32..36].copy_from_slice(&dst.octets());
            }
            CmaAddrs::V6 { src, dst } => {
                b[1] = 6 << 4;
                b[4..20].copy_from_slice(&src.octets());
                b[20..36].copy_from_slice(&dst.octets());
            }
        }
    }

    /// The source address.
    pub fn src(&self) -> IpAddr {
        match self.addrs {
            CmaAddrs::V4 { src, .. } => IpAddr::V4(src),
            CmaAddrs::V6 { src, .. } => IpAddr::V6(src),
        }
    }

    /// The destination address.
    pub fn dst(&self) -> IpAddr {
        match self.addrs {
            CmaAddrs::V4 { dst, .. } => IpAddr::V4(dst),
            CmaAddrs::V6 { dst, .. } => IpAddr::V6(dst),
        }
    }
}

/// An rdma_cm port space: which service-ID range an `rdma_cm_id`'s ports
/// live in (Linux `include/uapi/rdma/rdma_user_cm.h`,
/// `enum rdma_ucm_port_space`; IBTA Annex A11 service ID bytes 4-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`.
    Ipoib = 0x0002,
    /// `RDMA_PS_TCP`: RC connections (rping, perftest, libfabric, UCX).
    Tcp = 0x0106,
    /// `RDMA_PS_UDP`: UD via SIDR (udaddy, mckey).
    Udp = 0x0111,
    /// `RDMA_PS_IB`: RC or UD, chosen by the QP type.
    Ib = 0x013f,
}

impl PortSpace {
    /// Every port space.
    pub const ALL: [PortSpace; 4] = [
        PortSpace::Ipoib,
        PortSpace::Tcp,
        PortSpace::Udp,
        PortSpace::Ib,
    ];

    /// The port space of its number, `None` for any other.
    pub fn from_u16(ps: u16) -> Option<PortSpace> {
        PortSpace::ALL.into_iter().find(|p| *p as u16 == ps)
    }
}

/// The mask of the port-space part of an IP-based service ID (Linux
/// `include/rdma/rdma_cm.h` `RDMA_IB_IP_PS_MASK`): all but the port.
pub const SERVICE_ID_PS_MASK: u64 = 0xffff_ffff_ffff_0000;

/// The service ID of port `port` in port space `ps`: `(ps << 16) + port`,
/// e.g. TCP port 7471 is 0x0000_0000_0106_1D2F (Linux `cma.c`
/// `rdma_get_service_id`; IBTA Annex A11).
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    (u64::from(ps as u16) << 16) + u64::from(port)
}

/// The port of a service ID: its low 16 bits (Linux `cma.c`
/// `cma_port_from_service_id`).
pub fn service_id_port(sid: u64) -> u16 {
    sid as u16
}

/// The port space of an rdma_cm service ID; `None` unless the service ID
/// is one [`service_id`] makes (bits 63-32 zero, bits 31-16 a port
/// space): Linux's IP listeners match the whole 64-bit service ID.
pub fn service_id_port_space(sid: u64) -> Option<PortSpace> {
    if sid >> 32 != 0 {
        return None;
    }
    PortSpace::from_u16((sid >> 16) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_as_cma_format_hdr_writes_it() {
        let h = CmaHdr {
            src_port: 0xc001,
            addrs: CmaAddrs::V4 {
                src: Ipv4Addr::new(10, 0, 0, 21),
                dst: Ipv4Addr::new(10, 0, 0, 22),
            },
        };
        let mut b = [0xaau8; 36];
        h.emit(&mut b);
        let mut want = [0u8; 36];
        want[1] = 0x40;
        want[2..4].copy_from_slice(&[0xc0, 0x01]);
        want[16..20].copy_from_slice(&[10, 0, 0, 21]);
        want[32..36].copy_from_slice(&[10, 0, 0, 22]);
        assert_eq!(b, want);
        assert_eq!(CmaHdr::parse(&b), Ok(h));
        assert_eq!(h.src(), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 21)));
        assert_eq!(h.dst(), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 22)));
        // The pad before an IPv4 address and the reserved nibble are ignored.
        b[4] = 0xff;
        b[1] |= 0x0f;
        assert_eq!(CmaHdr::parse(&b), Ok(h));
    }

    #[test]
    fn ipv6_header() {
        let src: Ipv6Addr = "fd00::15".parse().unwrap();
        let dst: Ipv6Addr = "fd00::16".parse().unwrap();
        let h = CmaHdr {
            src_port: 7471,
            addrs: CmaAddrs::V6 { src, dst },
        };
        let mut b = [0u8; 40];
        h.emit(&mut b);
        assert_eq!(&b[..4], &[0, 0x60, 0x1d, 0x2f]);
        assert_eq!(&b[4..20], &src.octets());
        assert_eq!(&b[20..36], &dst.octets());
        assert_eq!(CmaHdr::parse(&b), Ok(h));
        assert_eq!(h.dst(), IpAddr::V6(dst));
    }

    #[test]
    fn bad_headers() {
        let mut b = [0u8; 36];
        b[1] = 0x40;
        assert!(CmaHdr::parse(&b).is_ok());
        for n in 0..36 {
            assert_eq!(CmaHdr::parse(&b[..n]), Err(WireError::Truncated));
        }
        b[0] = 1;
        assert_eq!(
            CmaHdr::parse(&b),
            Err(WireError::BadCmaHeader {
                version: 1,
                ip_version: 4
            })
        );
        b[0] = 0;
        for v in [0u8, 5, 15] {
            b[1] = v << 4;
            assert_eq!(
                CmaHdr::parse(&b),
                Err(WireError::BadCmaHeader {
                    version: 0,
                    ip_version: v
                })
            );
        }
        assert_eq!(REQ_USER_PRIVATE_DATA_MAX, 56);
        assert_eq!(SIDR_REQ_USER_PRIVATE_DATA_MAX, 180);
    }

    #[test]
    fn service_ids() {
        assert_eq!(service_id(PortSpace::Tcp, 7471), 0x0000_0000_0106_1d2f);
        assert_eq!(service_id(PortSpace::Udp, 0), 0x0000_0000_0111_0000);
        assert_eq!(service_id(PortSpace::Ib, 0xffff), 0x0000_0000_013f_ffff);
        assert_eq!(service_id(PortSpace::Ipoib, 1), 0x0000_0000_0002_0001);
        // include/rdma/rdma_cm.h's RDMA_IB_IP_PS_* values.
        assert_eq!(
            service_id(PortSpace::Tcp, 0x1234) & SERVICE_ID_PS_MASK,
            0x0000_0000_0106_0000
        );
        for ps in PortSpace::ALL {
            for port in [0, 1, 4791, 0xffff] {
                let sid = service_id(ps, port);
                assert_eq!(service_id_port(sid), port);
                assert_eq!(service_id_port_space(sid), Some(ps));
            }
        }
        assert_eq!(service_id_port_space(0x0000_0000_0107_0000), None);
        assert_eq!(service_id_port_space(0x0200_0000_0106_0000), None);
        assert_eq!(PortSpace::from_u16(0x0001), None);
    }
}
