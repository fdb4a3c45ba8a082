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

/// One path of a REQ (IBTA 12.6.5, Table 106: the primary path at byte
/// 52, the alternate at byte 96): 44 bytes.
///
/// ```text
/// bytes 0-1    Local Port LID
/// bytes 2-3    Remote Port LID
/// bytes 4-19   Local Port GID
/// bytes 20-35  Remote Port GID
/// bytes 36-39  Flow Label (bits 31-12), reserved (11-6), Packet Rate (5-0)
/// byte  40     Traffic Class
/// byte  41     Hop Limit
/// byte  42     SL(7-4) Subnet Local(3) reserved(2-0)
/// byte  43     Local ACK Timeout(7-3) reserved(2-0)
/// ```
///
/// Linux over RoCE (`cm.c` `cm_format_req`): LIDs 0xFFFF (permissive)
/// when the hop limit is above 1, Subnet Local 0, hop limit the route's
/// TTL. An alternate path that is all zero means "none" (the kernel
/// tests its local LID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPath {
    /// Local Port LID (the sender's).
    pub local_lid: u16,
    /// Remote Port LID.
    pub remote_lid: u16,
    /// Local Port GID: the sender's (RoCEv2: its IP address as a GID).
    pub local_gid: Gid,
    /// Remote Port GID: the receiver's.
    pub remote_gid: Gid,
    /// Flow Label, 20 bits.
    pub flow_label: u32,
    /// Packet Rate, 6 bits (IBTA rate encoding).
    pub packet_rate: u8,
    /// Traffic Class (the GRH/IP traffic class).
    pub traffic_class: u8,
    /// Hop Limit (the GRH hop limit / IP TTL).
    pub hop_limit: u8,
    /// Service Level, 4 bits.
    pub sl: u8,
    /// Subnet Local: the path stays in the subnet (LID-routed).
    pub subnet_local: bool,
    /// Local ACK Timeout, 5 bits (4.096 µs × 2^value).
    pub local_ack_timeout: u8,
}

impl CmPath {
    /// Length of a path in a REQ, in bytes.
    pub const LEN: usize = 44;

    /// Parses `buf[..44]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        let fl = be32(&b[36..]);
        Ok(CmPath {
            local_lid: be16(b),
            remote_lid: be16(&b[2..]),
            local_gid: Gid(bytes(&b[4..])),
            remote_gid: Gid(bytes(&b[20..])),
            flow_label: fl >> 12,
            packet_rate: (fl & 0x3f) as u8,
            traffic_class: b[40],
            hop_limit: b[41],
            sl: hi(b[42], 4),
            subnet_local: b[42] & 0x08 != 0,
            local_ack_timeout: hi(b[43], 5),
        })
    }

    /// Writes the path into `buf[..44]`, reserved bits 0. Panics if `buf`
    /// is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..Self::LEN];
        put16(b, self.local_lid);
        put16(&mut b[2..], self.remote_lid);
        b[4..20].copy_from_slice(&self.local_gid.0);
        b[20..36].copy_from_slice(&self.remote_gid.0);
        put32(
            &mut b[36..],
            ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f),
        );
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = to_hi(self.sl, 4) | (u8::from(self.subnet_local) << 3);
        b[43] = to_hi(self.local_ack_timeout, 5);
    }
}

/// ConnectRequest, REQ (IBTA 12.6.5, Table 106; Linux
/// `ibta_vol1_c12.h` `CM_REQ_*`, `cm.c` `cm_format_req`).
///
/// ```text
/// bytes 0-3     Local Communication ID
/// byte  4       reserved
/// bytes 5-7     Vendor ID (ECE, 24 bits)
/// bytes 8-15    Service ID
/// bytes 16-23   Local CA GUID
/// bytes 24-27   reserved
/// bytes 28-31   Local Q_Key
/// bytes 32-34   Local QPN               byte 35  Responder Resources
/// bytes 36-38   Local EECN              byte 39  Initiator Depth
/// bytes 40-42   Remote EECN
/// byte  43      Remote CM Response Timeout(7-3) Transport Service Type(2-1)
///               End-to-End Flow Control(0)
/// bytes 44-46   Starting PSN
/// byte  47      Local CM Response Timeout(7-3) Retry Count(2-0)
/// bytes 48-49   Partition Key
/// byte  50      Path MTU(7-4) RDC Exists(3) RNR Retry Count(2-0)
/// byte  51      Max CM Retries(7-4) SRQ(3) Extended Transport Type(2-0)
/// bytes 52-95   primary path ([`CmPath`])
/// bytes 96-139  alternate path ([`CmPath`]); byte 139 bit 2: SAP Supported
/// bytes 140-231 Private Data (92 bytes; rdma_cm: a [`super::CmaHdr`]
///               then up to 56 bytes of the consumer's)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmReq {
    /// Local Communication ID: the sender's connection handle.
    pub local_comm_id: u32,
    /// Vendor ID, 24 bits: ECE vendor, 0 without ECE (Linux
    /// `CM_REQ_VENDOR_ID`; the ECE options ride in the MAD header's
    /// attribute modifier).
    pub vendor_id: u32,
    /// Service ID: what the REQ connects to (rdma_cm:
    /// [`super::service_id`] of port space and port).
    pub service_id: u64,
    /// Local CA GUID: the sender's node GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (0 from Linux for RC).
    pub local_qkey: u32,
    /// Local QPN, 24 bits: the sender's QP.
    pub local_qpn: u32,
    /// Responder Resources: RDMA READs/atomics the sender accepts at once.
    pub responder_resources: u8,
    /// Local EECN, 24 bits (RD only; 0).
    pub local_eecn: u32,
    /// Initiator Depth: RDMA READs/atomics the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EECN, 24 bits (RD only; 0).
    pub remote_eecn: u32,
    /// Remote CM Response Timeout, 5 bits (4.096 µs × 2^value): how long
    /// the sender waits for a reply; rdma_cm sends 20.
    pub remote_cm_response_timeout: u8,
    /// Transport Service Type, 2 bits ([`transport_type`]).
    pub transport_service_type: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN, 24 bits: the sender's first send PSN.
    pub starting_psn: u32,
    /// Local CM Response Timeout, 5 bits.
    pub local_cm_response_timeout: u8,
    /// Retry Count, 3 bits: transport retries the receiver should use.
    pub retry_count: u8,
    /// Partition Key.
    pub partition_key: u16,
    /// Path Packet Payload MTU, 4 bits (IBTA MTU encoding: 1 = 256 …
    /// 5 = 4096).
    pub path_mtu: u8,
    /// RDC Exists (RD only).
    pub rdc_exists: bool,
    /// RNR Retry Count, 3 bits (7 = infinite).
    pub rnr_retry_count: u8,
    /// Max CM Retries, 4 bits: how often the sender resends (rdma_cm: 15).
    pub max_cm_retries: u8,
    /// SRQ: the sender's QP uses a shared receive queue.
    pub srq: bool,
    /// Extended Transport Type, 3 bits ([`transport_type::EXTENDED_XRC`]).
    pub extended_transport_type: u8,
    /// The primary path (bytes 52-95).
    pub primary_path: CmPath,
    /// The alternate path (bytes 96-139), all zero when there is none.
    pub alternate_path: CmPath,
    /// SAP Supported (byte 139 bit 2).
    pub sap_supported: bool,
    /// Private Data, 92 bytes.
    pub private_data: [u8; private_data_len::REQ],
}

impl CmReq {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmReq {
            local_comm_id: be32(b),
            vendor_id: be24(&b[5..]),
            service_id: be64(&b[8..]),
            local_ca_guid: be64(&b[16..]),
            local_qkey: be32(&b[28..]),
            local_qpn: be24(&b[32..]),
            responder_resources: b[35],
            local_eecn: be24(&b[36..]),
            initiator_depth: b[39],
            remote_eecn: be24(&b[40..]),
            remote_cm_response_timeout: hi(b[43], 5),
            transport_service_type: (b[43] >> 1) & 0x3,
            end_to_end_flow_control: b[43] & 0x1 != 0,
            starting_psn: be24(&b[44..]),
            local_cm_response_timeout: hi(b[47], 5),
            retry_count: b[47] & 0x7,
            partition_key: be16(&b[48..]),
            path_mtu: hi(b[50], 4),
            rdc_exists: b[50] & 0x08 != 0,
            rnr_retry_count: b[50] & 0x7,
            max_cm_retries: hi(b[51], 4),
            srq: b[51] & 0x08 != 0,
            extended_transport_type: b[51] & 0x7,
            primary_path: CmPath::parse(&b[52..])?,
            alternate_path: CmPath::parse(&b[96..])?,
            sap_supported: b[139] & 0x04 != 0,
            private_data: bytes(&b[140..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put24(&mut b[5..], self.vendor_id);
        put64(&mut b[8..], self.service_id);
        put64(&mut b[16..], self.local_ca_guid);
        put32(&mut b[28..], self.local_qkey);
        put24(&mut b[32..], self.local_qpn);
        b[35] = self.responder_resources;
        put24(&mut b[36..], self.local_eecn);
        b[39] = self.initiator_depth;
        put24(&mut b[40..], self.remote_eecn);
        b[43] = to_hi(self.remote_cm_response_timeout, 5)
            | ((self.transport_service_type & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        put24(&mut b[44..], self.starting_psn);
        b[47] = to_hi(self.local_cm_response_timeout, 5) | (self.retry_count & 0x7);
        put16(&mut b[48..], self.partition_key);
        b[50] = to_hi(self.path_mtu, 4)
            | (u8::from(self.rdc_exists) << 3)
            | (self.rnr_retry_count & 0x7);
        b[51] = to_hi(self.max_cm_retries, 4)
            | (u8::from(self.srq) << 3)
            | (self.extended_transport_type & 0x7);
        self.primary_path.emit(&mut b[52..]);
        self.alternate_path.emit(&mut b[96..]);
        b[139] |= u8::from(self.sap_supported) << 2;
        b[140..].copy_from_slice(&self.private_data);
    }
}

/// MsgRcptAck, MRA (IBTA 12.6.6, Table 107; Linux `CM_MRA_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// byte  8      Message MRAed(7-6) reserved(5-0)
/// byte  9      Service Timeout(7-3) reserved(2-0)
/// bytes 10-231 Private Data (222 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmMra {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's (0 when MRAing a REQ).
    pub remote_comm_id: u32,
    /// Message MRAed, 2 bits ([`msg_response`]).
    pub message_mraed: u8,
    /// Service Timeout, 5 bits (4.096 µs × 2^value): how long the sender
    /// needs before it replies.
    pub service_timeout: u8,
    /// Private Data, 222 bytes.
    pub private_data: [u8; private_data_len::MRA],
}

impl CmMra {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmMra {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            message_mraed: hi(b[8], 2),
            service_timeout: hi(b[9], 5),
            private_data: bytes(&b[10..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8] = to_hi(self.message_mraed, 2);
        b[9] = to_hi(self.service_timeout, 5);
        b[10..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReject, REJ (IBTA 12.6.7, Table 108; Linux `CM_REJ_*`).
///
/// ```text
/// bytes 0-3     Local Communication ID
/// bytes 4-7     Remote Communication ID
/// byte  8       Message REJected(7-6) reserved(5-0)
/// byte  9       Reject Info Length(7-1) reserved(0)
/// bytes 10-11   Reason
/// bytes 12-83   Additional Rejection Information (ARI, 72 bytes)
/// bytes 84-231  Private Data (148 bytes)
/// ```
///
/// The ARI length is the top 7 bits of byte 9: a length of 16 is the byte
/// 0x20.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmRej {
    /// Local Communication ID: the sender's (0 if it never had one).
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Message REJected, 2 bits ([`msg_response`]).
    pub message_rejected: u8,
    /// Reject Info Length, 7 bits: how many ARI bytes are meaningful
    /// (at most 72).
    pub ari_length: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional Rejection Information, 72 bytes.
    pub ari: [u8; private_data_len::ADDITIONAL_INFO],
    /// Private Data, 148 bytes.
    pub private_data: [u8; private_data_len::REJ],
}

impl CmRej {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmRej {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            message_rejected: hi(b[8], 2),
            ari_length: hi(b[9], 7),
            reason: be16(&b[10..]),
            ari: bytes(&b[12..]),
            private_data: bytes(&b[84..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8] = to_hi(self.message_rejected, 2);
        b[9] = to_hi(self.ari_length, 7);
        put16(&mut b[10..], self.reason);
        b[12..84].copy_from_slice(&self.ari);
        b[84..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReply, REP (IBTA 12.6.8, Table 110; Linux `CM_REP_*`,
/// `cm.c` `cm_format_rep`).
///
/// ```text
/// bytes 0-3     Local Communication ID
/// bytes 4-7     Remote Communication ID
/// bytes 8-11    Local Q_Key
/// bytes 12-14   Local QPN               byte 15  Vendor ID bits 23-16
/// bytes 16-18   Local EE Context Number byte 19  Vendor ID bits 15-8
/// bytes 20-22   Starting PSN            byte 23  Vendor ID bits 7-0
/// byte  24      Responder Resources
/// byte  25      Initiator Depth
/// byte  26      Target ACK Delay(7-3) Failover Accepted(2-1)
///               End-to-End Flow Control(0)
/// byte  27      RNR Retry Count(7-5) SRQ(4) reserved(3-0)
/// bytes 28-35   Local CA GUID
/// bytes 36-231  Private Data (196 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmRep {
    /// Local Communication ID: the sender's (the passive side's).
    pub local_comm_id: u32,
    /// Remote Communication ID: the REQ's Local Communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN, 24 bits: the sender's QP.
    pub local_qpn: u32,
    /// Vendor ID, 24 bits (ECE), split over bytes 15, 19 and 23 (Linux
    /// `CM_REP_VENDOR_ID_H/M/L`).
    pub vendor_id: u32,
    /// Local EE Context Number, 24 bits (RD; Linux puts an XRC target's
    /// QPN here instead of in Local QPN).
    pub local_eecn: u32,
    /// Starting PSN, 24 bits: the sender's first send PSN.
    pub starting_psn: u32,
    /// Responder Resources.
    pub responder_resources: u8,
    /// Initiator Depth.
    pub initiator_depth: u8,
    /// Target ACK Delay, 5 bits.
    pub target_ack_delay: u8,
    /// Failover Accepted, 2 bits (0 accepted, 1 rejected, 2 unsupported).
    pub failover_accepted: u8,
    /// End-to-End Flow Control.
    pub end_to_end_flow_control: bool,
    /// RNR Retry Count, 3 bits.
    pub rnr_retry_count: u8,
    /// SRQ: the sender's QP uses a shared receive queue.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private Data, 196 bytes.
    pub private_data: [u8; private_data_len::REP],
}

impl CmRep {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmRep {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            local_qkey: be32(&b[8..]),
            local_qpn: be24(&b[12..]),
            vendor_id: u32::from_be_bytes([0, b[15], b[19], b[23]]),
            local_eecn: be24(&b[16..]),
            starting_psn: be24(&b[20..]),
            responder_resources: b[24],
            initiator_depth: b[25],
            target_ack_delay: hi(b[26], 5),
            failover_accepted: (b[26] >> 1) & 0x3,
            end_to_end_flow_control: b[26] & 0x1 != 0,
            rnr_retry_count: hi(b[27], 3),
            srq: b[27] & 0x10 != 0,
            local_ca_guid: be64(&b[28..]),
            private_data: bytes(&b[36..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        put32(&mut b[8..], self.local_qkey);
        put24(&mut b[12..], self.local_qpn);
        put24(&mut b[16..], self.local_eecn);
        put24(&mut b[20..], self.starting_psn);
        let [_, vh, vm, vl] = self.vendor_id.to_be_bytes();
        (b[15], b[19], b[23]) = (vh, vm, vl);
        b[24] = self.responder_resources;
        b[25] = self.initiator_depth;
        b[26] = to_hi(self.target_ack_delay, 5)
            | ((self.failover_accepted & 0x3) << 1)
            | u8::from(self.end_to_end_flow_control);
        b[27] = to_hi(self.rnr_retry_count, 3) | (u8::from(self.srq) << 4);
        put64(&mut b[28..], self.local_ca_guid);
        b[36..].copy_from_slice(&self.private_data);
    }
}

/// ReadyToUse, RTU (IBTA 12.6.9, Table 111; Linux `CM_RTU_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// bytes 8-231  Private Data (224 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmRtu {
    /// Local Communication ID: the sender's (the active side's).
    pub local_comm_id: u32,
    /// Remote Communication ID: the REP's Local Communication ID.
    pub remote_comm_id: u32,
    /// Private Data, 224 bytes.
    pub private_data: [u8; private_data_len::RTU],
}

impl CmRtu {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmRtu {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            private_data: bytes(&b[8..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8..].copy_from_slice(&self.private_data);
    }
}

/// DisconnectRequest, DREQ (IBTA 12.6.10, Table 112; Linux `CM_DREQ_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// bytes 8-10   Remote QPN/EECN          byte 11 reserved
/// bytes 12-231 Private Data (220 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmDreq {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN, 24 bits: the receiver's QP of the connection.
    pub remote_qpn_eecn: u32,
    /// Private Data, 220 bytes.
    pub private_data: [u8; private_data_len::DREQ],
}

impl CmDreq {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmDreq {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            remote_qpn_eecn: be24(&b[8..]),
            private_data: bytes(&b[12..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        put24(&mut b[8..], self.remote_qpn_eecn);
        b[12..].copy_from_slice(&self.private_data);
    }
}

/// DisconnectReply, DREP (IBTA 12.6.11, Table 113; Linux `CM_DREP_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// bytes 8-231  Private Data (224 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmDrep {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the DREQ's Local Communication ID.
    pub remote_comm_id: u32,
    /// Private Data, 224 bytes.
    pub private_data: [u8; private_data_len::DREP],
}

impl CmDrep {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmDrep {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            private_data: bytes(&b[8..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8..].copy_from_slice(&self.private_data);
    }
}

/// LoadAlternatePath, LAP (IBTA 12.6.12, Table 115; Linux `CM_LAP_*`).
/// Its path fields are not in a REQ path's order.
///
/// ```text
/// bytes 0-3     Local Communication ID
/// bytes 4-7     Remote Communication ID
/// bytes 8-11    reserved
/// bytes 12-14   Remote QPN/EECN
/// byte  15      Remote CM Response Timeout(7-3) reserved(2-0)
/// bytes 16-19   reserved
/// bytes 20-21   Alternate Local Port LID
/// bytes 22-23   Alternate Remote Port LID
/// bytes 24-39   Alternate Local Port GID
/// bytes 40-55   Alternate Remote Port GID
/// bytes 56-58   Alternate Flow Label (bits 23-4) reserved(3-0)
/// byte  59      Alternate Traffic Class
/// byte  60      Alternate Hop Limit
/// byte  61      reserved(7-6) Alternate Packet Rate(5-0)
/// byte  62      Alternate SL(7-4) Alternate Subnet Local(3) reserved(2-0)
/// byte  63      Alternate Local ACK Timeout(7-3) reserved(2-0)
/// bytes 64-231  Private Data (168 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmLap {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN, 24 bits.
    pub remote_qpn_eecn: u32,
    /// Remote CM Response Timeout, 5 bits.
    pub remote_cm_response_timeout: u8,
    /// The alternate path; its fields have a REQ path's meaning.
    pub alternate_path: CmPath,
    /// Private Data, 168 bytes.
    pub private_data: [u8; private_data_len::LAP],
}

impl CmLap {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmLap {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            remote_qpn_eecn: be24(&b[12..]),
            remote_cm_response_timeout: hi(b[15], 5),
            alternate_path: CmPath {
                local_lid: be16(&b[20..]),
                remote_lid: be16(&b[22..]),
                local_gid: Gid(bytes(&b[24..])),
                remote_gid: Gid(bytes(&b[40..])),
                flow_label: be32(&b[56..]) >> 12,
                traffic_class: b[59],
                hop_limit: b[60],
                packet_rate: b[61] & 0x3f,
                sl: hi(b[62], 4),
                subnet_local: b[62] & 0x08 != 0,
                local_ack_timeout: hi(b[63], 5),
            },
            private_data: bytes(&b[64..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        let p = &self.alternate_path;
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        put24(&mut b[12..], self.remote_qpn_eecn);
        b[15] = to_hi(self.remote_cm_response_timeout, 5);
        put16(&mut b[20..], p.local_lid);
        put16(&mut b[22..], p.remote_lid);
        b[24..40].copy_from_slice(&p.local_gid.0);
        b[40..56].copy_from_slice(&p.remote_gid.0);
        put24(&mut b[56..], (p.flow_label & 0xf_ffff) << 4);
        b[59] = p.traffic_class;
        b[60] = p.hop_limit;
        b[61] = p.packet_rate & 0x3f;
        b[62] = to_hi(p.sl, 4) | (u8::from(p.subnet_local) << 3);
        b[63] = to_hi(p.local_ack_timeout, 5);
        b[64..].copy_from_slice(&self.private_data);
    }
}

/// AlternatePathResponse, APR (IBTA 12.6.13, Table 116; Linux `CM_APR_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// byte  8      Additional Information Length
/// byte  9      AP Status
/// bytes 10-11  reserved
/// bytes 12-83  Additional Information (72 bytes)
/// bytes 84-231 Private Data (148 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmApr {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Additional Information Length.
    pub additional_info_length: u8,
    /// AP Status (Linux `enum ib_cm_apr_status`: 0 success).
    pub ap_status: u8,
    /// Additional Information, 72 bytes.
    pub additional_info: [u8; private_data_len::ADDITIONAL_INFO],
    /// Private Data, 148 bytes.
    pub private_data: [u8; private_data_len::APR],
}

impl CmApr {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmApr {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            additional_info_length: b[8],
            ap_status: b[9],
            additional_info: bytes(&b[12..]),
            private_data: bytes(&b[84..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8] = self.additional_info_length;
        b[9] = self.ap_status;
        b[12..84].copy_from_slice(&self.additional_info);
        b[84..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReq, SIDR_REQ (IBTA 12.11.1, Table 119; Linux
/// `CM_SIDR_REQ_*`): a UD peer asks for the QPN and Q_Key of a service.
///
/// ```text
/// bytes 0-3    Request ID
/// bytes 4-5    Partition Key
/// bytes 6-7    reserved
/// bytes 8-15   Service ID
/// bytes 16-231 Private Data (216 bytes; rdma_cm: a [`super::CmaHdr`]
///              first)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmSidrReq {
    /// Request ID: the sender's handle, echoed in the SIDR_REP.
    pub request_id: u32,
    /// Partition Key.
    pub partition_key: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private Data, 216 bytes.
    pub private_data: [u8; private_data_len::SIDR_REQ],
}

impl CmSidrReq {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmSidrReq {
            request_id: be32(b),
            partition_key: be16(&b[4..]),
            service_id: be64(&b[8..]),
            private_data: bytes(&b[16..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.request_id);
        put16(&mut b[4..], self.partition_key);
        put64(&mut b[8..], self.service_id);
        b[16..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReqResp, SIDR_REP (IBTA 12.11.2, Table 120; Linux
/// `CM_SIDR_REP_*`, `cm.c` `cm_format_sidr_rep`).
///
/// ```text
/// bytes 0-3    Request ID
/// byte  4      Status
/// byte  5      Additional Information Length
/// bytes 6-7    Vendor ID bits 23-8
/// bytes 8-10   QPN                      byte 11  Vendor ID bits 7-0
/// bytes 12-19  Service ID
/// bytes 20-23  Q_Key
/// bytes 24-95  Additional Information (72 bytes)
/// bytes 96-231 Private Data (136 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmSidrRep {
    /// Request ID: the SIDR_REQ's.
    pub request_id: u32,
    /// Status ([`sidr_status`]).
    pub status: u8,
    /// Additional Information Length.
    pub additional_info_length: u8,
    /// Vendor ID, 24 bits (ECE): bytes 6-7 then byte 11 (Linux
    /// `CM_SIDR_REP_VENDOR_ID_H/L`). Linux's `cm_format_sidr_rep` writes
    /// `(vendor_id >> 8) & 0xff` into the 16-bit high part, so from Linux
    /// bits 23-16 read 0.
    pub vendor_id: u32,
    /// QPN, 24 bits: the service's UD QP.
    pub qpn: u32,
    /// Service ID: the SIDR_REQ's.
    pub service_id: u64,
    /// Q_Key of the service's QP (rdma_cm: `RDMA_UDP_QKEY` 0x01234567).
    pub qkey: u32,
    /// Additional Information, 72 bytes.
    pub additional_info: [u8; private_data_len::ADDITIONAL_INFO],
    /// Private Data, 136 bytes.
    pub private_data: [u8; private_data_len::SIDR_REP],
}

impl CmSidrRep {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmSidrRep {
            request_id: be32(b),
            status: b[4],
            additional_info_length: b[5],
            vendor_id: u32::from_be_bytes([0, b[6], b[7], b[11]]),
            qpn: be24(&b[8..]),
            service_id: be64(&b[12..]),
            qkey: be32(&b[20..]),
            additional_info: bytes(&b[24..]),
            private_data: bytes(&b[96..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.request_id);
        b[4] = self.status;
        b[5] = self.additional_info_length;
        put24(&mut b[8..], self.qpn);
        let [_, vh, vm, vl] = self.vendor_id.to_be_bytes();
        (b[6], b[7], b[11]) = (vh, vm, vl);
        put64(&mut b[12..], self.service_id);
        put32(&mut b[20..], self.qkey);
        b[24..96].copy_from_slice(&self.additional_info);
        b[96..].copy_from_slice(&self.private_data);
    }
}

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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::{CmaAddrs, CmaHdr};
    use super::*;

    /// A MAD built by hand at absolute offsets (the kernel's offsets plus
    /// the 24-byte header), never by the code under test: a CM header of
    /// attribute `attr` and TID `tid`, then `fields` written where they go.
    fn mad(attr: u16, tid: u64, fields: &[(usize, &[u8])]) -> [u8; 256] {
        let mut m = [0u8; 256];
        m[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        m[8..16].copy_from_slice(&tid.to_be_bytes());
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        for (at, bytes) in fields {
            m[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        m
    }

    /// Parses a hand-built MAD, checks that emitting the message gives the
    /// same 256 bytes back, and returns the message.
    fn parse_and_reemit(bytes: &[u8; 256]) -> CmMessage {
        let m = Mad::parse(bytes).unwrap();
        let msg = CmMessage::parse(&m).unwrap();
        assert_eq!(msg.to_mad(m.hdr.tid, m.hdr.attr_mod).to_bytes(), *bytes);
        msg
    }

    fn gid4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        Ipv4Addr::new(a, b, c, d).to_ipv6_mapped().octets()
    }

    #[test]
    fn req_at_the_kernels_offsets() {
        let mut cma = [0u8; 36];
        cma[1] = 0x40; // cma_hdr: version 0, IPv4
        cma[2..4].copy_from_slice(&[0xc3, 0x50]); // source port 50000
        cma[16..20].copy_from_slice(&[10, 0, 0, 21]);
        cma[32..36].copy_from_slice(&[10, 0, 0, 22]);
        let bytes = mad(
            0x0010,
            0x0000_0001_1122_3344,
            &[
                (24, &[0x11, 0x22, 0x33, 0x44]),             // local comm ID
                (29, &[0xab, 0xcd, 0xef]),                   // vendor ID (byte 28 reserved)
                (32, &[0, 0, 0, 0, 0x01, 0x06, 0x1d, 0x2f]), // service ID: TCP 7471
                (40, &[2, 0, 0, 0xff, 0xfe, 0, 0, 0x15]),    // local CA GUID
                (52, &[0x01, 0x02, 0x03, 0x04]),             // local Q_Key
                (56, &[0x12, 0x34, 0x56, 0x10]),             // local QPN, responder resources
                (60, &[0x00, 0x00, 0x07, 0x0f]),             // local EECN, initiator depth
                (64, &[0x00, 0x00, 0x09, 0xa1]), // remote EECN; timeout 20, RC, flow control
                (68, &[0xab, 0xcd, 0xef, 0xa7]), // starting PSN; timeout 20, retry 7
                (72, &[0xff, 0xff, 0x37, 0xf8]), // P_Key; MTU 3, RNR 7; 15 retries, SRQ
                (76, &[0xff, 0xff, 0xff, 0xff]), // primary LIDs: permissive
                (80, &gid4(10, 0, 0, 21)),       // primary local GID
                (96, &gid4(10, 0, 0, 22)),       // primary remote GID
                (112, &[0xab, 0xcd, 0xe0, 0x10]), // flow label 0xabcde, rate 16
                (116, &[0x20, 0x40, 0x50, 0x90]), // tclass, hop limit 64, SL 5, ACK timeout 18
                (163, &[0x04]),                  // SAP supported (alternate path empty)
                (164, &cma),
                (200, b"hello"),
            ],
        );
        let CmMessage::Req(req) = parse_and_reemit(&bytes) else {
            panic!("not a REQ");
        };
        assert_eq!(req.local_comm_id, 0x1122_3344);
        assert_eq!(req.vendor_id, 0xab_cdef);
        assert_eq!(req.service_id, 0x0106_1d2f);
        assert_eq!(req.local_ca_guid, 0x0200_00ff_fe00_0015);
        assert_eq!(req.local_qkey, 0x0102_0304);
        assert_eq!((req.local_qpn, req.responder_resources), (0x12_3456, 0x10));
        assert_eq!((req.local_eecn, req.initiator_depth), (7, 15));
        assert_eq!(req.remote_eecn, 9);
        assert_eq!(req.remote_cm_response_timeout, 20);
        assert_eq!(req.transport_service_type, transport_type::RC);
        assert!(req.end_to_end_flow_control);
        assert_eq!(req.starting_psn, 0xab_cdef);
        assert_eq!((req.local_cm_response_timeout, req.retry_count), (20, 7));
        assert_eq!(req.partition_key, 0xffff);
        assert_eq!(
            (req.path_mtu, req.rdc_exists, req.rnr_retry_count),
            (3, false, 7)
        );
        assert_eq!(
            (req.max_cm_retries, req.srq, req.extended_transport_type),
            (15, true, 0)
        );
        let p = req.primary_path;
        assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
        assert_eq!(p.local_gid, Gid(gid4(10, 0, 0, 21)));
        assert_eq!(p.remote_gid, Gid(gid4(10, 0, 0, 22)));
        assert_eq!((p.flow_label, p.packet_rate), (0xabcde, 16));
        assert_eq!((p.traffic_class, p.hop_limit), (0x20, 64));
        assert_eq!((p.sl, p.subnet_local, p.local_ack_timeout), (5, false, 18));
        assert_eq!(req.alternate_path, CmPath::default());
        assert!(req.sap_supported);
        let hdr = CmaHdr::parse(&req.private_data).unwrap();
        assert_eq!(hdr.src_port, 50000);
        assert_eq!(
            hdr.addrs,
            CmaAddrs::V4 {
                src: Ipv4Addr::new(10, 0, 0, 21),
                dst: Ipv4Addr::new(10, 0, 0, 22)
            }
        );
        assert_eq!(&req.private_data[36..41], b"hello");
    }

    #[test]
    fn req_bitfields_one_at_a_time() {
        // Each narrow field alone at its maximum, against the kernel's masks.
        let base = CmReq::parse(&[0u8; 232]).unwrap();
        let cases: Vec<(CmReq, usize, u8)> = vec![
            (
                CmReq {
                    remote_cm_response_timeout: 31,
                    ..base.clone()
                },
                43,
                0xf8,
            ),
            (
                CmReq {
                    transport_service_type: 3,
                    ..base.clone()
                },
                43,
                0x06,
            ),
            (
                CmReq {
                    end_to_end_flow_control: true,
                    ..base.clone()
                },
                43,
                0x01,
            ),
            (
                CmReq {
                    local_cm_response_timeout: 31,
                    ..base.clone()
                },
                47,
                0xf8,
            ),
            (
                CmReq {
                    retry_count: 7,
                    ..base.clone()
                },
                47,
                0x07,
            ),
            (
                CmReq {
                    path_mtu: 15,
                    ..base.clone()
                },
                50,
                0xf0,
            ),
            (
                CmReq {
                    rdc_exists: true,
                    ..base.clone()
                },
                50,
                0x08,
            ),
            (
                CmReq {
                    rnr_retry_count: 7,
                    ..base.clone()
                },
                50,
                0x07,
            ),
            (
                CmReq {
                    max_cm_retries: 15,
                    ..base.clone()
                },
                51,
                0xf0,
            ),
            (
                CmReq {
                    srq: true,
                    ..base.clone()
                },
                51,
                0x08,
            ),
            (
                CmReq {
                    extended_transport_type: 7,
                    ..base.clone()
                },
                51,
                0x07,
            ),
            (
                CmReq {
                    sap_supported: true,
                    ..base.clone()
                },
                139,
                0x04,
            ),
        ];
        for (req, at, byte) in cases {
            let mut b = [0u8; 232];
            req.emit(&mut b);
            let mut want = [0u8; 232];
            want[at] = byte;
            assert_eq!(b, want, "field at byte {at}");
            assert_eq!(CmReq::parse(&b).unwrap(), req);
        }
        // Wider values are masked to the field.
        let mut b = [0u8; 232];
        CmReq {
            local_qpn: 0xff12_3456,
            starting_psn: 0x0100_0001,
            retry_count: 9,
            ..base
        }
        .emit(&mut b);
        assert_eq!(&b[32..36], &[0x12, 0x34, 0x56, 0]);
        assert_eq!(&b[44..48], &[0, 0, 1, 0x01]);
    }

    #[test]
    fn rep_at_the_kernels_offsets() {
        let bytes = mad(
            0x0013,
            0x0000_0001_1122_3344,
            &[
                (24, &[0x55, 0x66, 0x77, 0x88]),          // local comm ID
                (28, &[0x11, 0x22, 0x33, 0x44]),          // remote comm ID
                (32, &[0, 0, 0, 0]),                      // local Q_Key
                (36, &[0x00, 0x0a, 0xbc, 0x01]),          // local QPN; vendor ID high
                (40, &[0x00, 0x00, 0x00, 0x02]),          // local EECN; vendor ID middle
                (44, &[0x65, 0x43, 0x21, 0x03]),          // starting PSN; vendor ID low
                (48, &[0x10, 0x0f, 0x7d, 0xf0]), // resp. res., depth; ACK delay 15, failover 2, FC; RNR 7, SRQ
                (52, &[2, 0, 0, 0xff, 0xfe, 0, 0, 0x16]), // local CA GUID
                (60, b"rep private"),
                (255, &[0x99]), // the last private data byte
            ],
        );
        let CmMessage::Rep(rep) = parse_and_reemit(&bytes) else {
            panic!("not a REP");
        };
        assert_eq!(
            (rep.local_comm_id, rep.remote_comm_id),
            (0x5566_7788, 0x1122_3344)
        );
        assert_eq!(rep.local_qkey, 0);
        assert_eq!(rep.local_qpn, 0xabc);
        assert_eq!(rep.vendor_id, 0x01_0203);
        assert_eq!(rep.local_eecn, 0);
        assert_eq!(rep.starting_psn, 0x65_4321);
        assert_eq!((rep.responder_resources, rep.initiator_depth), (0x10, 0x0f));
        assert_eq!(rep.target_ack_delay, 15);
        assert_eq!(rep.failover_accepted, 2);
        assert!(rep.end_to_end_flow_control);
        assert_eq!((rep.rnr_retry_count, rep.srq), (7, true));
        assert_eq!(rep.local_ca_guid, 0x0200_00ff_fe00_0016);
        assert_eq!(&rep.private_data[..11], b"rep private");
        assert_eq!(rep.private_data[195], 0x99);
    }

    #[test]
    fn rej_mra_rtu_dreq_drep_at_the_kernels_offsets() {
        let ari = gid4(10, 0, 0, 9);
        let bytes = mad(
            0x0012,
            5,
            &[
                (24, &[0, 0, 0, 0]),
                (28, &[0x11, 0x22, 0x33, 0x44]),
                (32, &[0x40, 0x20, 0x00, 0x0c]), // REP rejected; ARI length 16 (<< 1); reason 12
                (36, &ari),
                (108, &[0x5a; 148]),
            ],
        );
        let CmMessage::Rej(rej) = parse_and_reemit(&bytes) else {
            panic!("not a REJ");
        };
        assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0, 0x1122_3344));
        assert_eq!(rej.message_rejected, msg_response::REP);
        assert_eq!(rej.ari_length, 16);
        assert_eq!(rej.reason, rej_reason::INVALID_GID);
        assert_eq!(&rej.ari[..16], &ari);
        assert_eq!(rej.private_data, [0x5a; 148]);

        let bytes = mad(
            0x0011,
            6,
            &[
                (24, &[0, 0, 0, 1]),
                (28, &[0, 0, 0, 2]),
                (32, &[0x80, 0xc0]),
                (34, b"mra"),
            ],
        );
        let CmMessage::Mra(mra) = parse_and_reemit(&bytes) else {
            panic!("not an MRA");
        };
        assert_eq!((mra.local_comm_id, mra.remote_comm_id), (1, 2));
        assert_eq!(
            (mra.message_mraed, mra.service_timeout),
            (msg_response::OTHER, 24)
        );
        assert_eq!(&mra.private_data[..3], b"mra");

        let bytes = mad(
            0x0014,
            7,
            &[(24, &[0, 0, 0, 3]), (28, &[0, 0, 0, 4]), (32, b"rtu")],
        );
        assert_eq!(
            parse_and_reemit(&bytes),
            CmMessage::Rtu(CmRtu {
                local_comm_id: 3,
                remote_comm_id: 4,
                private_data: {
                    let mut p = [0u8; 224];
                    p[..3].copy_from_slice(b"rtu");
                    p
                },
            })
        );

        let bytes = mad(
            0x0015,
            8,
            &[
                (24, &[0, 0, 0, 5]),
                (28, &[0, 0, 0, 6]),
                (32, &[0x12, 0x34, 0x56]),
                (36, b"dreq"),
            ],
        );
        let CmMessage::Dreq(dreq) = parse_and_reemit(&bytes) else {
            panic!("not a DREQ");
        };
        assert_eq!((dreq.local_comm_id, dreq.remote_comm_id), (5, 6));
        assert_eq!(dreq.remote_qpn_eecn, 0x12_3456);
        assert_eq!(&dreq.private_data[..4], b"dreq");

        let bytes = mad(
            0x0016,
            9,
            &[(24, &[0, 0, 0, 6]), (28, &[0, 0, 0, 5]), (255, &[1])],
        );
        let CmMessage::Drep(drep) = parse_and_reemit(&bytes) else {
            panic!("not a DREP");
        };
        assert_eq!((drep.local_comm_id, drep.remote_comm_id), (6, 5));
        assert_eq!(drep.private_data[223], 1);
    }

    #[test]
    fn sidr_at_the_kernels_offsets() {
        let bytes = mad(
            0x0017,
            10,
            &[
                (24, &[0xde, 0xad, 0xbe, 0xef]),
                (28, &[0xff, 0xff]),
                (32, &[0, 0, 0, 0, 0x01, 0x11, 0x1d, 0x2f]), // UDP port 7471
                (40, &[0x00, 0x40]),                         // cma_hdr start
            ],
        );
        let CmMessage::SidrReq(req) = parse_and_reemit(&bytes) else {
            panic!("not a SIDR_REQ");
        };
        assert_eq!(req.request_id, 0xdead_beef);
        assert_eq!(req.partition_key, 0xffff);
        assert_eq!(req.service_id, 0x0111_1d2f);
        assert_eq!(&req.private_data[..2], &[0x00, 0x40]);

        let bytes = mad(
            0x0018,
            10,
            &[
                (24, &[0xde, 0xad, 0xbe, 0xef]),
                (28, &[0x00, 0x00, 0xaa, 0xbb]), // status, info length, vendor ID high
                (32, &[0x00, 0x01, 0x23, 0xcc]), // QPN 0x123; vendor ID low
                (36, &[0, 0, 0, 0, 0x01, 0x11, 0x1d, 0x2f]),
                (44, &[0x01, 0x23, 0x45, 0x67]), // Q_Key RDMA_UDP_QKEY
                (48, &[0x77; 72]),
                (120, &[0x88; 136]),
            ],
        );
        let CmMessage::SidrRep(rep) = parse_and_reemit(&bytes) else {
            panic!("not a SIDR_REP");
        };
        assert_eq!(rep.request_id, 0xdead_beef);
        assert_eq!(rep.status, sidr_status::SUCCESS);
        assert_eq!(rep.additional_info_length, 0);
        assert_eq!(rep.vendor_id, 0xaa_bbcc);
        assert_eq!(rep.qpn, 0x123);
        assert_eq!(rep.service_id, 0x0111_1d2f);
        assert_eq!(rep.qkey, 0x0123_4567);
        assert_eq!(rep.additional_info, [0x77; 72]);
        assert_eq!(rep.private_data, [0x88; 136]);
    }

    #[test]
    fn lap_and_apr_at_the_kernels_offsets() {
        let bytes = mad(
            0x0019,
            11,
            &[
                (24, &[0, 0, 0, 1]),
                (28, &[0, 0, 0, 2]),
                (36, &[0x12, 0x34, 0x56, 0xa0]), // remote QPN; timeout 20
                (44, &[0xff, 0xff, 0xff, 0xfe]), // alternate LIDs
                (48, &gid4(10, 0, 1, 1)),
                (64, &gid4(10, 0, 1, 2)),
                (80, &[0xab, 0xcd, 0xe0, 0x20]), // flow label 0xabcde; tclass 0x20
                (84, &[0x40, 0x10, 0x58, 0x90]), // hop limit, rate 16, SL 5 + subnet local, ACK 18
                (88, b"lap"),
            ],
        );
        let CmMessage::Lap(lap) = parse_and_reemit(&bytes) else {
            panic!("not a LAP");
        };
        assert_eq!(lap.remote_qpn_eecn, 0x12_3456);
        assert_eq!(lap.remote_cm_response_timeout, 20);
        let p = lap.alternate_path;
        assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xfffe));
        assert_eq!(
            (p.local_gid, p.remote_gid),
            (Gid(gid4(10, 0, 1, 1)), Gid(gid4(10, 0, 1, 2)))
        );
        assert_eq!(
            (p.flow_label, p.traffic_class, p.hop_limit),
            (0xabcde, 0x20, 0x40)
        );
        assert_eq!(
            (p.packet_rate, p.sl, p.subnet_local, p.local_ack_timeout),
            (16, 5, true, 18)
        );
        assert_eq!(&lap.private_data[..3], b"lap");

        let bytes = mad(
            0x001a,
            12,
            &[
                (24, &[0, 0, 0, 2]),
                (28, &[0, 0, 0, 1]),
                (32, &[4, 3]),
                (36, b"info"),
                (108, b"apr"),
            ],
        );
        let CmMessage::Apr(apr) = parse_and_reemit(&bytes) else {
            panic!("not an APR");
        };
        assert_eq!((apr.additional_info_length, apr.ap_status), (4, 3));
        assert_eq!(&apr.additional_info[..4], b"info");
        assert_eq!(&apr.private_data[..3], b"apr");
    }

    /// The bits no field covers, per message, from `ibta_vol1_c12.h`:
    /// (offset in the data area, mask of reserved bits).
    fn reserved_bits(attr: CmAttrId) -> Vec<(usize, u8)> {
        let mut r = match attr {
            CmAttrId::Req => vec![
                (4, 0xff),
                (24, 0xff),
                (25, 0xff),
                (26, 0xff),
                (27, 0xff),
                (90, 0x0f),
                (91, 0xc0),
                (94, 0x07),
                (95, 0x07),
                (134, 0x0f),
                (135, 0xc0),
                (138, 0x07),
                (139, 0x03),
            ],
            CmAttrId::Mra => vec![(8, 0x3f), (9, 0x07)],
            CmAttrId::Rej => vec![(8, 0x3f), (9, 0x01)],
            CmAttrId::Rep => vec![(27, 0x0f)],
            CmAttrId::Rtu | CmAttrId::Drep | CmAttrId::SidrRep => vec![],
            CmAttrId::Dreq => vec![(11, 0xff)],
            CmAttrId::SidrReq => vec![(6, 0xff), (7, 0xff)],
            CmAttrId::Lap => vec![(15, 0x07), (58, 0x0f), (61, 0xc0), (62, 0x07), (63, 0x07)],
            CmAttrId::Apr => vec![(10, 0xff), (11, 0xff)],
        };
        if attr == CmAttrId::Lap {
            r.extend([8, 9, 10, 11, 16, 17, 18, 19].map(|i| (i, 0xff)));
        }
        r
    }

    #[test]
    fn every_bit_but_the_reserved_ones_round_trips() {
        for attr in CmAttrId::ALL {
            let msg = CmMessage::parse_data(attr, &[0xff; 232]).unwrap();
            let mut out = [0u8; 232];
            msg.emit(&mut out);
            let mut want = [0xffu8; 232];
            for (at, mask) in reserved_bits(attr) {
                want[at] &= !mask;
            }
            assert_eq!(out.to_vec(), want.to_vec(), "{attr:?}");
        }
    }

    #[test]
    fn header_and_attribute_errors() {
        let good = mad(0x0014, 1, &[]);
        assert!(CmMessage::parse(&Mad::parse(&good).unwrap()).is_ok());
        for (at, v) in [(0, 2u8), (1, 0x03), (2, 1), (3, 0x83)] {
            let mut b = good;
            b[at] = v;
            let err = CmMessage::parse(&Mad::parse(&b).unwrap()).unwrap_err();
            assert!(matches!(err, WireError::NotCmMad { .. }), "{err:?}");
        }
        for attr in [0x0000, 0x000f, 0x001b, 0x0110, 0xffff] {
            let mut b = good;
            b[16..18].copy_from_slice(&u16::to_be_bytes(attr));
            assert_eq!(
                CmMessage::parse(&Mad::parse(&b).unwrap()),
                Err(WireError::UnknownCmAttribute(attr))
            );
        }
    }

    #[test]
    fn truncated_data_areas() {
        for attr in CmAttrId::ALL {
            for n in [0, 1, 8, 231] {
                assert_eq!(
                    CmMessage::parse_data(attr, &[0u8; 232][..n]),
                    Err(WireError::Truncated),
                    "{attr:?} {n}"
                );
            }
            assert!(CmMessage::parse_data(attr, &[0u8; 300]).is_ok());
        }
        assert_eq!(CmPath::parse(&[0u8; 43]), Err(WireError::Truncated));
    }

    #[test]
    fn to_mad_builds_the_cm_header() {
        let msg = CmMessage::parse_data(CmAttrId::Dreq, &[0u8; 232]).unwrap();
        let m = msg.to_mad(0x0000_0002_0000_0009, 0x1234);
        assert_eq!(
            &m.to_bytes()[..24],
            &[1, 7, 2, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 9, 0, 0x15, 0, 0, 0, 0, 0x12, 0x34]
        );
        assert_eq!(msg.attr_id(), CmAttrId::Dreq);
    }

    #[test]
    fn rej_reasons_match_the_kernel() {
        use rej_reason::*;
        let all = [
            NO_QP,
            NO_EEC,
            NO_RESOURCES,
            TIMEOUT,
            UNSUPPORTED,
            INVALID_COMM_ID,
            INVALID_COMM_INSTANCE,
            INVALID_SERVICE_ID,
            INVALID_TRANSPORT_TYPE,
            STALE_CONN,
            RDC_NOT_EXIST,
            INVALID_GID,
            INVALID_LID,
            INVALID_SL,
            INVALID_TRAFFIC_CLASS,
            INVALID_HOP_LIMIT,
            INVALID_PACKET_RATE,
            INVALID_ALT_GID,
            INVALID_ALT_LID,
            INVALID_ALT_SL,
            INVALID_ALT_TRAFFIC_CLASS,
            INVALID_ALT_HOP_LIMIT,
            INVALID_ALT_PACKET_RATE,
            PORT_CM_REDIRECT,
            PORT_REDIRECT,
            INVALID_MTU,
            INSUFFICIENT_RESP_RESOURCES,
            CONSUMER_DEFINED,
            INVALID_RNR_RETRY,
            DUPLICATE_LOCAL_COMM_ID,
            INVALID_CLASS_VERSION,
            INVALID_FLOW_LABEL,
            INVALID_ALT_FLOW_LABEL,
        ];
        assert_eq!(all.to_vec(), (1..=33).collect::<Vec<u16>>());
        assert_eq!(VENDOR_OPTION_NOT_SUPPORTED, 35);
        assert_eq!(
            [sidr_status::SUCCESS, sidr_status::UNSUPPORTED_VERSION],
            [0, 5]
        );
    }
}
