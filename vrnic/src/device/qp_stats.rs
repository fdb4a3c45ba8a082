//! Per-QP counters (`vrnic stats` shows them as `qp_<qpn>_<name>` lines).
//!
//! The transport counts into the device-wide [`DeviceStats`]; the device
//! attributes each transport step to the QP it ran for by the difference
//! of the device counters before and after the step (`device::qp_step!`, [`QpStats::add_delta`]),
//! so the transport code needs no per-QP bookkeeping of its own. ICRC
//! errors and frames for no QP stay device-wide: a frame that fails its
//! ICRC cannot be trusted to name its QP.

use super::DeviceStats;

/// Counters of one QP since it was created: packets, events, and payload
/// bytes (`tx_bytes`, `rx_bytes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// RoCEv2 packets sent for this QP (requests, responses, ACKs/NAKs).
    pub tx_packets: u64,
    /// RoCEv2 packets received for this QP (valid ICRC).
    pub rx_packets: u64,
    /// RoCEv2 payload bytes sent for this QP (after the BTH and extension
    /// headers, without pad and ICRC; retransmissions count again).
    pub tx_bytes: u64,
    /// RoCEv2 payload bytes received for this QP (as `tx_bytes`).
    pub rx_bytes: u64,
    /// Received packets the QP dropped (wrong transport, Q_Key, state, UC/UD
    /// messages that could not be delivered).
    pub rx_dropped: u64,
    /// Retransmissions started by an ACK timeout or the end of an RNR
    /// back-off: one per go-back-N rewind, however many packets it resends
    /// (resends after a PSN sequence NAK show in `nak_psn_seq_received`).
    pub retransmits: u64,
    /// Duplicate requests or responses received.
    pub duplicates: u64,
    /// NAKs sent: PSN sequence error (IBTA Table 44 code 0).
    pub nak_psn_seq_sent: u64,
    /// NAKs sent: invalid request (code 1).
    pub nak_inv_req_sent: u64,
    /// NAKs sent: remote access error (code 2).
    pub nak_rem_access_sent: u64,
    /// NAKs sent: remote operational error (code 3).
    pub nak_rem_op_sent: u64,
    /// NAKs received: PSN sequence error.
    pub nak_psn_seq_received: u64,
    /// NAKs received: invalid request.
    pub nak_inv_req_received: u64,
    /// NAKs received: remote access error.
    pub nak_rem_access_received: u64,
    /// NAKs received: remote operational error.
    pub nak_rem_op_received: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// Replies to this QP's peer (ACK, NAK, RNR NAK, atomic ACK) dropped
    /// at the link backlog's reply bound (`transport::TX_REPLY_MAX`).
    pub replies_dropped: u64,
}

impl QpStats {
    /// Adds what the device counters moved by between `before` and
    /// `after` (one transport step for this QP).
    pub fn add_delta(&mut self, before: &DeviceStats, after: &DeviceStats) {
        let d = |a: u64, b: u64| b.wrapping_sub(a);
        self.tx_packets += d(before.tx_frames, after.tx_frames);
        self.tx_bytes += d(before.tx_bytes, after.tx_bytes);
        self.rx_bytes += d(before.rx_bytes, after.rx_bytes);
        self.rx_dropped += d(before.rx_dropped, after.rx_dropped);
        self.retransmits += d(before.retransmits, after.retransmits);
        self.duplicates += d(before.duplicates, after.duplicates);
        self.nak_psn_seq_sent += d(before.nak_psn_seq_sent, after.nak_psn_seq_sent);
        self.nak_inv_req_sent += d(before.nak_inv_req_sent, after.nak_inv_req_sent);
        self.nak_rem_access_sent += d(before.nak_rem_access_sent, after.nak_rem_access_sent);
        self.nak_rem_op_sent += d(before.nak_rem_op_sent, after.nak_rem_op_sent);
        self.nak_psn_seq_received += d(before.nak_psn_seq_received, after.nak_psn_seq_received);
        self.nak_inv_req_received += d(before.nak_inv_req_received, after.nak_inv_req_received);
        self.nak_rem_access_received += d(
            before.nak_rem_access_received,
            after.nak_rem_access_received,
        );
        self.nak_rem_op_received += d(before.nak_rem_op_received, after.nak_rem_op_received);
        self.rnr_naks_sent += d(before.rnr_naks_sent, after.rnr_naks_sent);
        self.rnr_naks_received += d(before.rnr_naks_received, after.rnr_naks_received);
        self.replies_dropped += d(before.replies_dropped, after.replies_dropped);
    }

    /// `(name, value)` for every counter, names as the field names.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("tx_packets", self.tx_packets),
            ("rx_packets", self.rx_packets),
            ("tx_bytes", self.tx_bytes),
            ("rx_bytes", self.rx_bytes),
            ("rx_dropped", self.rx_dropped),
            ("retransmits", self.retransmits),
            ("duplicates", self.duplicates),
            ("nak_psn_seq_sent", self.nak_psn_seq_sent),
            ("nak_inv_req_sent", self.nak_inv_req_sent),
            ("nak_rem_access_sent", self.nak_rem_access_sent),
            ("nak_rem_op_sent", self.nak_rem_op_sent),
            ("nak_psn_seq_received", self.nak_psn_seq_received),
            ("nak_inv_req_received", self.nak_inv_req_received),
            ("nak_rem_access_received", self.nak_rem_access_received),
            ("nak_rem_op_received", self.nak_rem_op_received),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("rnr_naks_received", self.rnr_naks_received),
            ("replies_dropped", self.replies_dropped),
        ]
        .into_iter()
    }
}
