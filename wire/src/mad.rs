//! Management Datagrams (MADs) as the General Services Interface (QP1)
//! carries them: the 24-byte common MAD header and the 256-byte MAD
//! (IBTA Vol 1 13.4, "MAD format"; Linux `include/rdma/ib_mad.h`,
//! `struct ib_mad_hdr` and `struct ib_mad`).
//!
//! On RoCEv2 a MAD is the whole payload of one UD SEND to QPN 1 (the GSI
//! QP), Q_Key [`GSI_QKEY`], P_Key [`DEFAULT_PKEY`]; every MAD is exactly
//! [`MAD_LEN`] bytes (no RMPP for the CM class). The CM messages that fill
//! the data area are in [`super::cm`].

use super::{be16, be32, need, WireError};

/// Length of a MAD: header plus data, 256 bytes (`IB_MGMT_MAD_SIZE`).
pub const MAD_LEN: usize = 256;

/// Length of the data area after the common header, 232 bytes
/// (`IB_MGMT_MAD_DATA`); a CM message fills all of it.
pub const MAD_DATA_LEN: usize = MAD_LEN - MadHeader::LEN;

/// The QP number of the General Services Interface: every MAD of the CM
/// class is sent to and from QP1 (IBTA ch. 13, GSI; Linux `IB_QP1`).
pub const GSI_QPN: u32 = 1;

/// The well-known Q_Key of QP1 (IBTA ch. 13, GSI; Linux `IB_QP1_QKEY`). The
/// kernel posts GSI sends with the Q_Key `0x80000000` (`IB_QP_SET_QKEY`,
/// "use the QP's own Q_Key"), so this value is what the DETH carries;
/// Linux rxe drops QP1 packets with any other.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// The default (full-member) partition key that GSI MADs carry on RoCE
/// (Linux `IB_DEFAULT_PKEY_FULL`).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// `BaseVersion` of every InfiniBand MAD (Linux `IB_MGMT_BASE_VERSION`).
pub const MGMT_BASE_VERSION: u8 = 1;

/// `MgmtClass` of Communication Management (IBTA 12.6; Linux
/// `IB_MGMT_CLASS_CM`).
pub const MGMT_CLASS_CM: u8 = 0x07;

/// `ClassVersion` the Linux CM sends and registers for: 2, "IB
/// specification 1.2" (Linux `drivers/infiniband/core/cm_msgs.h`,
/// `IB_CM_CLASS_VERSION`). MADs of other class versions reach no agent.
pub const CM_CLASS_VERSION: u8 = 2;

/// `Method` Send (Linux `IB_MGMT_METHOD_SEND`): the only method of the CM
/// class; every CM message is an unsolicited Send.
pub const MGMT_METHOD_SEND: u8 = 0x03;

/// The CM class's attribute IDs: which message a CM MAD carries (IBTA
/// Vol 1 12.6, CM messages; Linux `include/rdma/ib_cm.h`, `CM_*_ATTR_ID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum CmAttrId {
    /// ConnectRequest (REQ).
    Req = 0x0010,
    /// MsgRcptAck (MRA): "message received, reply later".
    Mra = 0x0011,
    /// ConnectReject (REJ).
    Rej = 0x0012,
    /// ConnectReply (REP).
    Rep = 0x0013,
    /// ReadyToUse (RTU).
    Rtu = 0x0014,
    /// DisconnectRequest (DREQ).
    Dreq = 0x0015,
    /// DisconnectReply (DREP).
    Drep = 0x0016,
    /// ServiceIDResReq (SIDR_REQ): UD service ID resolution request.
    SidrReq = 0x0017,
    /// ServiceIDResReqResp (SIDR_REP).
    SidrRep = 0x0018,
    /// LoadAlternatePath (LAP).
    Lap = 0x0019,
    /// AlternatePathResponse (APR).
    Apr = 0x001a,
}

impl CmAttrId {
    /// Every CM attribute, in attribute ID order.
    pub const ALL: [CmAttrId; 11] = [
        CmAttrId::Req,
        CmAttrId::Mra,
        CmAttrId::Rej,
        CmAttrId::Rep,
        CmAttrId::Rtu,
        CmAttrId::Dreq,
        CmAttrId::Drep,
        CmAttrId::SidrReq,
        CmAttrId::SidrRep,
        CmAttrId::Lap,
        CmAttrId::Apr,
    ];

    /// The attribute of an `AttributeID`, `None` if it names no CM message.
    pub fn from_u16(id: u16) -> Option<CmAttrId> {
        CmAttrId::ALL.into_iter().find(|a| *a as u16 == id)
    }
}

big_endian_header! {
    /// The common MAD header: 24 bytes, big-endian (IBTA Vol 1 13.4; Linux
    /// `struct ib_mad_hdr`).
    ///
    /// ```text
    /// byte  0      BaseVersion (1)
    /// byte  1      MgmtClass (0x07 CM)
    /// byte  2      ClassVersion (2 for CM)
    /// byte  3      R(7) Method(6..0) (0x03 Send)
    /// bytes 4-5    Status
    /// bytes 6-7    ClassSpecific
    /// bytes 8-15   TransactionID
    /// bytes 16-17  AttributeID
    /// bytes 18-19  reserved
    /// bytes 20-23  AttributeModifier
    /// ```
    ///
    /// Every field is kept as it is on the wire (the reserved one too), so
    /// `parse` and `emit` are exact inverses.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct MadHeader {
        /// `BaseVersion`: 1 for InfiniBand MADs ([`MGMT_BASE_VERSION`]).
        pub base_version: u8,
        /// `MgmtClass`: the management class, [`MGMT_CLASS_CM`] for CM.
        pub mgmt_class: u8,
        /// `ClassVersion`: [`CM_CLASS_VERSION`] for CM.
        pub class_version: u8,
        /// `R` (bit 7, response) and `Method` (bits 6-0);
        /// [`MGMT_METHOD_SEND`] for every CM message.
        pub method: u8,
        /// `Status`: 0 in every CM message.
        pub status: u16,
        /// `ClassSpecific`: 0 in the CM class.
        pub class_specific: u16,
        /// `TransactionID`, opaque to the receiver. The Linux CM puts its
        /// agent's `hi_tid` in the high 32 bits and the sender's local
        /// communication ID in the low 32 (`cm.c` `cm_form_tid`), in host
        /// byte order (a `__be32` cast to `u64`, so byte-swapped on
        /// little-endian hosts); REP and RTU reuse the REQ's, a REJ or MRA
        /// answering a message carries that message's.
        pub tid: u64,
        /// `AttributeID`: which CM message follows ([`CmAttrId`]).
        pub attr_id: u16,
        /// Reserved, 0 on emit by every sender.
        pub reserved: u16,
        /// `AttributeModifier`: 0 in CM except with Enhanced Connection
        /// Establishment, where the Linux CM carries the ECE options of a
        /// REQ, REP or SIDR_REP here (`cm.c` `cm_format_mad_ece_hdr`).
        pub attr_mod: u32,
    }
}

impl MadHeader {
    /// A CM header: base version 1, class CM, class version 2, method
    /// Send, status and class-specific 0, as Linux's `cm_format_mad_hdr`
    /// builds it.
    pub fn cm(attr_id: CmAttrId, tid: u64, attr_mod: u32) -> MadHeader {
        MadHeader {
            base_version: MGMT_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: MGMT_METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id: attr_id as u16,
            reserved: 0,
            attr_mod,
        }
    }

    /// Whether this is a header the Linux CM agent accepts: base version 1,
    /// class CM, class version 2, method Send. The attribute is not
    /// checked.
    pub fn is_cm(&self) -> bool {
        self.base_version == MGMT_BASE_VERSION
            && self.mgmt_class == MGMT_CLASS_CM
            && self.class_version == CM_CLASS_VERSION
            && self.method == MGMT_METHOD_SEND
    }
}

/// A whole MAD: the common header and the 232 data bytes that follow it
/// (Linux `struct ib_mad`), exactly [`MAD_LEN`] bytes on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Mad {
    /// The common MAD header (bytes 0-23).
    pub hdr: MadHeader,
    /// The class-specific data (bytes 24-255); for CM, one message.
    pub data: [u8; MAD_DATA_LEN],
}

impl Default for Mad {
    fn default() -> Mad {
        Mad {
            hdr: MadHeader::default(),
            data: [0; MAD_DATA_LEN],
        }
    }
}

impl Mad {
    /// Length of a MAD on the wire, in bytes.
    pub const LEN: usize = MAD_LEN;

    /// Parses a MAD that is exactly `buf`: [`WireError::Truncated`] if
    /// `buf` is shorter than 256 bytes, [`WireError::BadLength`] if it is
    /// longer (a MAD on QP1 is the whole UD payload, and is 256 bytes).
    /// The header's fields are not checked here.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        if buf.len() != Self::LEN {
            return Err(WireError::BadLength);
        }
        let hdr = MadHeader::parse(b)?;
        let mut data = [0u8; MAD_DATA_LEN];
        data.copy_from_slice(&b[MadHeader::LEN..]);
        Ok(Mad { hdr, data })
    }

    /// Writes the MAD into `buf[..256]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..Self::LEN];
        self.hdr.emit(b);
        b[MadHeader::LEN..].copy_from_slice(&self.data);
    }

    /// The MAD as its 256 wire bytes.
    pub fn to_bytes(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        self.emit(&mut b);
        b
    }

    /// The `AttributeID` and `TransactionID` of a buffer that may hold a
    /// MAD, read without parsing the rest (for counters and logs); `None`
    /// if `buf` is shorter than the header.
    pub fn peek_attr_tid(buf: &[u8]) -> Option<(u16, u64)> {
        let b = buf.get(..MadHeader::LEN)?;
        let tid = (u64::from(be32(&b[8..])) << 32) | u64::from(be32(&b[12..]));
        Some((be16(&b[16..]), tid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_ib_mad_hdr() {
        let h = MadHeader {
            base_version: 1,
            mgmt_class: 0x07,
            class_version: 2,
            method: 0x03,
            status: 0x0102,
            class_specific: 0x0304,
            tid: 0x1122_3344_5566_7788,
            attr_id: 0x0010,
            reserved: 0xabcd,
            attr_mod: 0xdead_beef,
        };
        let mut b = [0u8; 24];
        h.emit(&mut b);
        assert_eq!(
            b,
            [
                1, 0x07, 2, 0x03, 0x01, 0x02, 0x03, 0x04, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                0x88, 0x00, 0x10, 0xab, 0xcd, 0xde, 0xad, 0xbe, 0xef
            ]
        );
        assert_eq!(MadHeader::parse(&b), Ok(h));
        assert_eq!(MadHeader::LEN, 24);
        assert_eq!(MAD_DATA_LEN, 232);
    }

    #[test]
    fn cm_header_is_what_cm_format_mad_hdr_builds() {
        let h = MadHeader::cm(CmAttrId::Rep, 7, 0);
        let mut b = [0u8; 24];
        h.emit(&mut b);
        assert_eq!(&b[..4], &[1, 7, 2, 3]);
        assert_eq!(&b[16..18], &[0x00, 0x13]);
        assert!(h.is_cm());
        assert!(!MadHeader {
            class_version: 1,
            ..h
        }
        .is_cm());
        assert!(!MadHeader { method: 0x81, ..h }.is_cm());
    }

    #[test]
    fn attribute_ids() {
        let ids: Vec<u16> = CmAttrId::ALL.iter().map(|a| *a as u16).collect();
        assert_eq!(ids, (0x10..=0x1a).collect::<Vec<u16>>());
        for a in CmAttrId::ALL {
            assert_eq!(CmAttrId::from_u16(a as u16), Some(a));
        }
        assert_eq!(CmAttrId::from_u16(0x0f), None);
        assert_eq!(CmAttrId::from_u16(0x1b), None);
        assert_eq!(CmAttrId::from_u16(0x0110), None);
    }

    #[test]
    fn mad_is_exactly_256_bytes() {
        let mut bytes = [0u8; 257];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = i as u8;
        }
        let m = Mad::parse(&bytes[..256]).unwrap();
        assert_eq!(m.hdr.attr_id, 0x1011);
        assert_eq!(m.data[0], 24);
        assert_eq!(m.data[231], 255);
        assert_eq!(m.to_bytes(), bytes[..256]);
        assert_eq!(Mad::parse(&bytes), Err(WireError::BadLength));
        assert_eq!(Mad::parse(&[0u8; 1024]), Err(WireError::BadLength));
        for n in [0, 1, 23, 24, 255] {
            assert_eq!(Mad::parse(&bytes[..n]), Err(WireError::Truncated));
        }
        assert_eq!(
            Mad::peek_attr_tid(&bytes),
            Some((0x1011, 0x0809_0a0b_0c0d_0e0f))
        );
        assert_eq!(Mad::peek_attr_tid(&bytes[..23]), None);
    }
}
