//! ConnectRequest (REQ) and its paths: the message's layout, parse and emit.

use super::*;

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
/// bytes 140-231 Private Data (92 bytes; rdma_cm: a [`crate::CmaHdr`]
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
    /// [`crate::service_id`] of port space and port).
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
