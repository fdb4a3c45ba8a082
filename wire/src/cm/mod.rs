//! InfiniBand Communication Management messages (IBTA Vol 1 chapter 12,
//! 12.6 and 12.11) as the Linux kernel CM sends them in the data area of
//! a 256-byte MAD on QP1 ([`super::Mad`]).
//!
//! Layouts follow Linux `include/rdma/ibta_vol1_c12.h`, which names the
//! IBTA table of each message and gives every field as (byte offset in
//! the MAD data area, bit offset from the byte's most significant bit,
//! width); `drivers/infiniband/core/cm.c` fills them. Offsets below are
//! relative to the MAD data area: add 24 for the offset in the MAD.
//! Multi-byte fields are big-endian; an n-bit field that starts at a byte
//! takes its most significant bits (a 24-bit QPN at byte 32 is bytes
//! 32-34, a 5-bit timeout at byte 43 is bits 7-3).
//!
//! Every message is exactly the 232-byte data area: private data always
//! has its full size on the wire (the CM carries no length; unused bytes
//! are 0). `parse` reads `buf[..232]` and ignores reserved bits; `emit`
//! writes all 232 bytes, reserved bits 0, and masks each field to its
//! width.

use super::mad::{CmAttrId, Mad, MadHeader, MAD_DATA_LEN};
use super::{be16, be24, be32, need, Gid, WireError};

/// Length of every CM message: the MAD data area, 232 bytes.
pub const CM_MSG_LEN: usize = MAD_DATA_LEN;

/// Private data sizes of the CM messages, in bytes (Linux
/// `include/rdma/ib_cm.h`, `enum ib_cm_data_size`).
pub mod private_data_len {
    /// REQ: 92 bytes.
    pub const REQ: usize = 92;
    /// MRA: 222 bytes.
    pub const MRA: usize = 222;
    /// REJ: 148 bytes.
    pub const REJ: usize = 148;
    /// REP: 196 bytes.
    pub const REP: usize = 196;
    /// RTU: 224 bytes.
    pub const RTU: usize = 224;
    /// DREQ: 220 bytes.
    pub const DREQ: usize = 220;
    /// DREP: 224 bytes.
    pub const DREP: usize = 224;
    /// LAP: 168 bytes.
    pub const LAP: usize = 168;
    /// APR: 148 bytes.
    pub const APR: usize = 148;
    /// SIDR_REQ: 216 bytes.
    pub const SIDR_REQ: usize = 216;
    /// SIDR_REP: 136 bytes.
    pub const SIDR_REP: usize = 136;
    /// REJ's Additional Rejection Information, APR's and SIDR_REP's
    /// Additional Information: 72 bytes each.
    pub const ADDITIONAL_INFO: usize = 72;
}

/// `ConnectReject` reasons (IBTA 12.6.7, REJ; Linux `include/rdma/ib_cm.h`,
/// `enum ib_cm_rej_reason`, whose names these are without `IB_CM_REJ_`).
/// 34 is not defined.
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No EE context available.
    pub const NO_EEC: u16 = 2;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout: the sender gave up waiting (sent by the Linux CM when a
    /// REQ or REP retries out).
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID: no listener (Linux sends it for a REQ that
    /// matches no listen).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection: the REQ's QPN and CA GUID are in timewait.
    pub const STALE_CONN: u16 = 10;
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: u16 = 11;
    /// Primary remote port GID rejected (ARI: the acceptable GID).
    pub const INVALID_GID: u16 = 12;
    /// Primary remote port LID rejected.
    pub const INVALID_LID: u16 = 13;
    /// Primary SL rejected.
    pub const INVALID_SL: u16 = 14;
    /// Primary traffic class rejected.
    pub const INVALID_TRAFFIC_CLASS: u16 = 15;
    /// Primary hop limit rejected.
    pub const INVALID_HOP_LIMIT: u16 = 16;
    /// Primary packet rate rejected.
    pub const INVALID_PACKET_RATE: u16 = 17;
    /// Alternate remote port GID rejected.
    pub const INVALID_ALT_GID: u16 = 18;
    /// Alternate remote port LID rejected.
    pub const INVALID_ALT_LID: u16 = 19;
    /// Alternate SL rejected.
    pub const INVALID_ALT_SL: u16 = 20;
    /// Alternate traffic class rejected.
    pub const INVALID_ALT_TRAFFIC_CLASS: u16 = 21;
    /// Alternate hop limit rejected.
    pub const INVALID_ALT_HOP_LIMIT: u16 = 22;
    /// Alternate packet rate rejected.
    pub const INVALID_ALT_PACKET_RATE: u16 = 23;
    /// Port CM redirection.
    pub const PORT_CM_REDIRECT: u16 = 24;
    /// Port redirection.
    pub const PORT_REDIRECT: u16 = 25;
    /// Invalid path MTU.
    pub const INVALID_MTU: u16 = 26;
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: u16 = 27;
    /// Consumer reject: rdma_cm's `rdma_reject` and a listener that fails
    /// a connect request (private data carries the consumer's reason).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: u16 = 29;
    /// Local communication ID already in use.
    pub const DUPLICATE_LOCAL_COMM_ID: u16 = 30;
    /// Unsupported class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
    /// Invalid primary flow label.
    pub const INVALID_FLOW_LABEL: u16 = 32;
    /// Invalid alternate flow label.
    pub const INVALID_ALT_FLOW_LABEL: u16 = 33;
    /// Vendor option (Enhanced Connection Establishment) not supported.
    pub const VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
}

/// SIDR_REP status values (IBTA 12.11.2, Table 120; Linux
/// `include/rdma/ib_cm.h`, `enum ib_cm_sidr_status`).
pub mod sidr_status {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// No listener for the service ID (Linux answers a SIDR_REQ nobody
    /// listens for with this).
    pub const UNSUPPORTED: u8 = 1;
    /// The service rejected the request.
    pub const REJECT: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
    /// Redirect: Additional Information holds a ClassPortInfo.
    pub const REDIRECT: u8 = 4;
    /// Unsupported class version.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// Which message a REJ rejects or an MRA acknowledges (2-bit field;
/// Linux `drivers/infiniband/core/cm_msgs.h`, `enum cm_msg_response`).
pub mod msg_response {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Another message (for an MRA: a LAP).
    pub const OTHER: u8 = 2;
}

/// Values of REQ's 2-bit Transport Service Type (IBTA 12.6.5; Linux
/// `cm_msgs.h` `cm_req_set_qp_type`).
pub mod transport_type {
    /// Reliable Connection.
    pub const RC: u8 = 0;
    /// Unreliable Connection.
    pub const UC: u8 = 1;
    /// Reliable Datagram (not used by Linux).
    pub const RD: u8 = 2;
    /// Extended: the Extended Transport Type field says which; 1 there is
    /// XRC.
    pub const EXTENDED: u8 = 3;
    /// Extended Transport Type of XRC.
    pub const EXTENDED_XRC: u8 = 1;
}

#[inline]
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(bytes(b))
}

/// The first `N` bytes of a slice the caller has length-checked.
#[inline]
fn bytes<const N: usize>(b: &[u8]) -> [u8; N] {
    b[..N].try_into().expect("length checked by the caller")
}

#[inline]
fn put16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_be_bytes());
}

/// The low 24 bits of `v` into `b[..3]`.
#[inline]
fn put24(b: &mut [u8], v: u32) {
    b[..3].copy_from_slice(&v.to_be_bytes()[1..]);
}

#[inline]
fn put32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
fn put64(b: &mut [u8], v: u64) {
    b[..8].copy_from_slice(&v.to_be_bytes());
}

/// The `width` most significant bits of `byte` (an `IBA_FIELD8_LOC`).
#[inline]
fn hi(byte: u8, width: u32) -> u8 {
    byte >> (8 - width)
}

/// `v` into the `width` most significant bits of a byte.
#[inline]
fn to_hi(v: u8, width: u32) -> u8 {
    (v & ((1 << width) - 1)) << (8 - width)
}

/// Writes the common part of every emit: the 232-byte area, zeroed.
#[inline]
fn area(buf: &mut [u8]) -> &mut [u8] {
    let b = &mut buf[..CM_MSG_LEN];
    b.fill(0);
    b
}

mod disconnect;
mod lap;
mod mra;
mod rej;
mod rep;
mod req;
mod rtu;
mod sidr;
#[cfg(test)]
mod tests;

pub use disconnect::{CmDrep, CmDreq};
pub use lap::{CmApr, CmLap};
pub use mra::CmMra;
pub use rej::CmRej;
pub use rep::CmRep;
pub use req::{CmPath, CmReq};
pub use rtu::CmRtu;
pub use sidr::{CmSidrRep, CmSidrReq};

/// Any CM message, chosen by the MAD's attribute ID.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// REQ (attribute 0x10).
    Req(CmReq),
    /// MRA (0x11).
    Mra(CmMra),
    /// REJ (0x12).
    Rej(CmRej),
    /// REP (0x13).
    Rep(CmRep),
    /// RTU (0x14).
    Rtu(CmRtu),
    /// DREQ (0x15).
    Dreq(CmDreq),
    /// DREP (0x16).
    Drep(CmDrep),
    /// SIDR_REQ (0x17).
    SidrReq(CmSidrReq),
    /// SIDR_REP (0x18).
    SidrRep(CmSidrRep),
    /// LAP (0x19).
    Lap(CmLap),
    /// APR (0x1A).
    Apr(CmApr),
}

impl CmMessage {
    /// The message a MAD carries.
    ///
    /// Errors: [`WireError::NotCmMad`] unless the header is one Linux's CM
    /// agent receives (base version 1, class 0x07, class version 2, method
    /// Send: [`MadHeader::is_cm`]); [`WireError::UnknownCmAttribute`] for
    /// an attribute ID that names no CM message (the kernel drops both).
    pub fn parse(mad: &Mad) -> Result<Self, WireError> {
        let h = &mad.hdr;
        if !h.is_cm() {
            return Err(WireError::NotCmMad {
                base_version: h.base_version,
                mgmt_class: h.mgmt_class,
                class_version: h.class_version,
                method: h.method,
            });
        }
        let attr = CmAttrId::from_u16(h.attr_id).ok_or(WireError::UnknownCmAttribute(h.attr_id))?;
        Self::parse_data(attr, &mad.data)
    }

    /// The message of attribute `attr` in a MAD data area `buf[..232]`;
    /// [`WireError::Truncated`] if shorter.
    pub fn parse_data(attr: CmAttrId, buf: &[u8]) -> Result<Self, WireError> {
        Ok(match attr {
            CmAttrId::Req => CmMessage::Req(CmReq::parse(buf)?),
            CmAttrId::Mra => CmMessage::Mra(CmMra::parse(buf)?),
            CmAttrId::Rej => CmMessage::Rej(CmRej::parse(buf)?),
            CmAttrId::Rep => CmMessage::Rep(CmRep::parse(buf)?),
            CmAttrId::Rtu => CmMessage::Rtu(CmRtu::parse(buf)?),
            CmAttrId::Dreq => CmMessage::Dreq(CmDreq::parse(buf)?),
            CmAttrId::Drep => CmMessage::Drep(CmDrep::parse(buf)?),
            CmAttrId::SidrReq => CmMessage::SidrReq(CmSidrReq::parse(buf)?),
            CmAttrId::SidrRep => CmMessage::SidrRep(CmSidrRep::parse(buf)?),
            CmAttrId::Lap => CmMessage::Lap(CmLap::parse(buf)?),
            CmAttrId::Apr => CmMessage::Apr(CmApr::parse(buf)?),
        })
    }

    /// The attribute ID of this message.
    pub fn attr_id(&self) -> CmAttrId {
        match self {
            CmMessage::Req(_) => CmAttrId::Req,
            CmMessage::Mra(_) => CmAttrId::Mra,
            CmMessage::Rej(_) => CmAttrId::Rej,
            CmMessage::Rep(_) => CmAttrId::Rep,
            CmMessage::Rtu(_) => CmAttrId::Rtu,
            CmMessage::Dreq(_) => CmAttrId::Dreq,
            CmMessage::Drep(_) => CmAttrId::Drep,
            CmMessage::SidrReq(_) => CmAttrId::SidrReq,
            CmMessage::SidrRep(_) => CmAttrId::SidrRep,
            CmMessage::Lap(_) => CmAttrId::Lap,
            CmMessage::Apr(_) => CmAttrId::Apr,
        }
    }

    /// Writes the message into a MAD data area `buf[..232]`. Panics if
    /// `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        match self {
            CmMessage::Req(m) => m.emit(buf),
            CmMessage::Mra(m) => m.emit(buf),
            CmMessage::Rej(m) => m.emit(buf),
            CmMessage::Rep(m) => m.emit(buf),
            CmMessage::Rtu(m) => m.emit(buf),
            CmMessage::Dreq(m) => m.emit(buf),
            CmMessage::Drep(m) => m.emit(buf),
            CmMessage::SidrReq(m) => m.emit(buf),
            CmMessage::SidrRep(m) => m.emit(buf),
            CmMessage::Lap(m) => m.emit(buf),
            CmMessage::Apr(m) => m.emit(buf),
        }
    }

    /// The whole MAD of this message: a CM header ([`MadHeader::cm`]) with
    /// transaction ID `tid` and attribute modifier `attr_mod` (0 unless
    /// ECE), and the message as its data.
    pub fn to_mad(&self, tid: u64, attr_mod: u32) -> Mad {
        let mut mad = Mad {
            hdr: MadHeader::cm(self.attr_id(), tid, attr_mod),
            data: [0; MAD_DATA_LEN],
        };
        self.emit(&mut mad.data);
        mad
    }
}
