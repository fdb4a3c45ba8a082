//! Wire formats of RoCEv2: Ethernet/IP/UDP framing, the IBTA base and
//! extension transport headers, the invariant CRC, GIDs and ARP; and the
//! management datagrams that ride on QP1: the MAD header, IB
//! Communication Management messages and rdma_cm's addressing on top.
//!
//! Modelled on smoltcp's `wire` module: every header is a plain struct (the
//! parsed "Repr") with `LEN`, `parse(&[u8]) -> Result<Self, WireError>` and
//! `emit(&self, &mut [u8])`; all knowledge about opcodes lives in one table
//! ([`Opcode`], like Linux rxe's `rxe_opcode[]`). Ethernet, IPv4, IPv6 and UDP
//! are handled with `etherparse`, CRC-32 with `crc32fast`.
//!
//! Sources: IBTA Specification Vol 1 Release 1.4 chapter 9 (transport
//! headers), chapters 12 and 13 (CM, MADs), Annexes A11 (RDMA IP CM
//! service) and A17 (RoCEv2); Linux `include/rdma/ibta_vol1_c12.h` for
//! the CM layouts as the kernel sends them; RFC 791 (IPv4), RFC 8200 (IPv6),
//! RFC 768 (UDP), RFC 826 (ARP), RFC 4291 (IPv6 addressing).
//!
//! Parsing never panics on any input bytes; `emit` functions panic only if
//! the caller passes a buffer shorter than the documented length.

#![deny(missing_docs)]

/// Defines a header made of big-endian integer fields that follow each
/// other with no gap or reserved bits: the struct as written (its fields in
/// wire order), its length `LEN` (the sum of the fields' sizes), `parse` and
/// `emit`. Each field's offset follows from the sizes of those before it, so
/// `parse` and `emit` cannot disagree on the layout.
macro_rules! big_endian_header {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $($(#[$field_attr:meta])* pub $field:ident: $ty:ty,)+
        }
    ) => {
        $(#[$attr])*
        pub struct $name {
            $($(#[$field_attr])* pub $field: $ty,)+
        }

        impl $name {
            /// Length of the header on the wire, in bytes.
            pub const LEN: usize = 0 $(+ std::mem::size_of::<$ty>())+;

            /// Parses `buf[..Self::LEN]`; [`WireError::Truncated`] if `buf`
            /// is shorter.
            #[allow(unused_assignments)] // the offset after the last field
            pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
                let mut rest = need(buf, Self::LEN)?;
                Ok($name {
                    $($field: {
                        let (bytes, tail) = rest.split_at(std::mem::size_of::<$ty>());
                        rest = tail;
                        <$ty>::from_be_bytes(bytes.try_into().expect("split at its size"))
                    },)+
                })
            }

            /// Writes the header into `buf[..Self::LEN]`. Panics if `buf` is
            /// shorter.
            #[allow(unused_assignments)] // the offset after the last field
            pub fn emit(&self, buf: &mut [u8]) {
                let mut at = 0;
                $(
                    let end = at + std::mem::size_of::<$ty>();
                    buf[at..end].copy_from_slice(&self.$field.to_be_bytes());
                    at = end;
                )+
            }
        }
    };
}

mod aeth;
mod arp;
mod atomic;
mod bth;
mod cm;
mod cma;
mod deth;
mod gid;
mod icrc;
mod immdt;
mod mad;
mod opcode;
mod packet;
mod reth;

#[cfg(test)]
mod packet_tests;
#[cfg(test)]
mod proptests;
#[cfg(any(test, feature = "samples"))]
pub mod samples;
#[cfg(test)]
mod vectors;

pub use aeth::{rnr_timer_ns, Aeth, AethKind, NakCode};
pub use arp::{emit_arp, ArpPacket};
pub use atomic::{AtomicAckEth, AtomicEth};
pub use bth::Bth;
pub use cm::{
    msg_response, private_data_len, rej_reason, sidr_status, transport_type, CmApr, CmDrep, CmDreq,
    CmLap, CmMessage, CmMra, CmPath, CmRej, CmRep, CmReq, CmRtu, CmSidrRep, CmSidrReq, CM_MSG_LEN,
};
pub use cma::{
    service_id, service_id_port, service_id_port_space, CmaAddrs, CmaHdr, PortSpace, CMA_VERSION,
    REQ_USER_PRIVATE_DATA_MAX, SERVICE_ID_PS_MASK, SIDR_REQ_USER_PRIVATE_DATA_MAX,
};
pub use deth::Deth;
pub use gid::Gid;
pub use icrc::{icrc, ICRC_LEN};
pub use immdt::{Ieth, Immdt};
pub use mad::{
    CmAttrId, Mad, MadHeader, CM_CLASS_VERSION, DEFAULT_PKEY, GSI_QKEY, GSI_QPN, MAD_DATA_LEN,
    MAD_LEN, MGMT_BASE_VERSION, MGMT_CLASS_CM, MGMT_METHOD_SEND,
};
pub use opcode::{Opcode, Transport};
pub use packet::{
    emit_frame, emit_frame_icrc, emit_frame_open, emit_frame_with, emit_run_peer, emit_segment,
    emit_segment_peer, pad_len, parse_frame, parse_frame_with, parse_ib, parse_ib_headers,
    parse_roce, parse_roce_with, parse_run_parts, seal_icrc, Frame, Icrc, RoceHeaders, RocePacket,
    PEER_SEGMENT_MAX, SEGMENT_MAX,
};
pub use reth::Reth;

// The lengths IBTA 9.3 gives the headers that `big_endian_header!` defines
// (there, the sum of their fields' sizes).
const _: () =
    assert!(Reth::LEN == 16 && AtomicEth::LEN == 28 && AtomicAckEth::LEN == 8 && Ieth::LEN == 4);

/// The UDP destination port that identifies RoCEv2 (IBTA Annex A17.2.1,
/// IANA-assigned port 4791).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Why a frame or header could not be parsed.
///
/// Returned by every `parse` function in this module and by [`parse_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer ends before a fixed-size header or before the end that a
    /// length field (IPv4 total length, IPv6 payload length) declares.
    #[error("buffer truncated")]
    Truncated,
    /// The Ethernet frame does not carry IPv4 or IPv6 (returned by
    /// [`parse_roce`]; [`parse_frame`] reports such frames as `Other`/`Arp`).
    #[error("not an IP packet")]
    NotIp,
    /// The IP packet is not UDP to port 4791 (returned by [`parse_roce`];
    /// [`parse_frame`] reports such frames as [`Frame::Other`]).
    #[error("not a RoCEv2 packet (UDP port 4791)")]
    NotRoce,
    /// The IP header is malformed: wrong version, IPv4 IHL < 5 or total
    /// length smaller than the header (RFC 791 / RFC 8200).
    #[error("malformed IP header")]
    BadIpHeader,
    /// The IPv4 header checksum is wrong (RFC 791).
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// A RoCEv2 packet arrived as the first IPv4 fragment (more-fragments
    /// set): RoCEv2 senders set DF and never fragment (RFC 791 flags).
    #[error("fragmented IPv4 RoCEv2 packet")]
    Fragmented,
    /// The BTH opcode is not one this NIC implements (IBTA 9.2, Table 38).
    #[error("unknown BTH opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0 (IBTA 9.2: TVer is 0 for
    /// this version of the specification).
    #[error("unsupported BTH transport version {0}")]
    BadTver(u8),
    /// The BTH pad count exceeds the payload that carries the pad bytes
    /// (IBTA 9.2 PadCnt).
    #[error("BTH pad count larger than payload")]
    BadPadCount,
    /// Length fields disagree: UDP length vs IP length, too short for the
    /// headers the opcode requires plus the ICRC, payload+pad not a multiple
    /// of 4, or payload on an opcode that carries none.
    #[error("inconsistent packet length")]
    BadLength,
    /// The invariant CRC does not match (IBTA Annex A17.3.3).
    #[error("bad ICRC")]
    BadIcrc,
    /// A MAD is not one the CM agent receives: base version not 1, class
    /// not CM (0x07), class version not 2 or method not Send (returned by
    /// [`CmMessage::parse`]).
    #[error(
        "not a CM MAD (base version {base_version}, class {mgmt_class:#04x}, \
         class version {class_version}, method {method:#04x})"
    )]
    NotCmMad {
        /// The MAD's `BaseVersion`.
        base_version: u8,
        /// The MAD's `MgmtClass`.
        mgmt_class: u8,
        /// The MAD's `ClassVersion`.
        class_version: u8,
        /// The MAD's `Method`.
        method: u8,
    },
    /// A CM MAD's attribute ID names no CM message (IBTA 12.6; REQ 0x10 to
    /// APR 0x1A).
    #[error("unknown CM attribute {0:#06x}")]
    UnknownCmAttribute(u16),
    /// rdma_cm's private-data header has a version other than 0 or an IP
    /// version other than 4 or 6 (returned by [`CmaHdr::parse`]).
    #[error("bad rdma_cm header (version {version}, IP version {ip_version})")]
    BadCmaHeader {
        /// Byte 0, `cma_version`.
        version: u8,
        /// The high nibble of byte 1.
        ip_version: u8,
    },
}

/// Big-endian reads from a slice the caller has already length-checked.
/// Indexing here cannot fail once the check is done.
#[inline]
fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

#[inline]
fn be24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

#[inline]
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Returns `Err(Truncated)` unless `buf` holds at least `len` bytes.
#[inline]
fn need(buf: &[u8], len: usize) -> Result<&[u8], WireError> {
    buf.get(..len).ok_or(WireError::Truncated)
}
