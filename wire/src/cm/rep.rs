//! ConnectReply (REP): the message's layout, parse and emit.

use super::*;

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
