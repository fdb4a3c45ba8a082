//! The engine's counters (`vrnic stats`): the device-wide [`DeviceStats`]
//! and the per-QP [`QpStats`] (`qp_<qpn>_<name>` lines), each from one
//! list, and [`Counters`], which counts them.
//!
//! Adding a counter: one line (with its doc comment) in the list below,
//! `device_counters!` for a device counter, [`QpStats`]'s for a per-QP one
//! of its own; then `stats.count(Counter::<name>, n)` where it happens.
//! A device counter marked `=> qp.<field>` is counted on the QP as well
//! when a QP's transport step counts it (a [`QpStats`] field). `vrnic
//! stats` prints both lists in list order (vhost's `stats::Snapshot` and
//! `stats::render_qps`): new counters go at the end.
//!
//! Per-QP attribution: the device runs every transport step for a QP
//! between `Counters::begin_step` and `Counters::end_step`
//! (`device::qp_step!`), and [`Counters::count`] counts a marked counter
//! in the step's share as well, which the step's end adds to the QP's
//! counters; the transport needs no per-QP bookkeeping of its own.
//! Counted outside a step (ICRC errors, frames for no QP), a counter stays
//! device-wide: a frame that fails its ICRC cannot be trusted to name its
//! QP.

use std::ops::Deref;

use crate::transport::hdr_check;
use crate::wire::NakCode;

/// Defines [`DeviceStats`] from its list (`name` or `name => qp.field`),
/// [`Counter`] naming each counter, and [`Counters::count`] counting them.
macro_rules! device_counters {
    ( $( $(#[$m:meta])* $f:ident $(=> qp.$q:ident)? ),* $(,)? ) => {
        crate::counters! {
            /// Per-device counters (see `vrnic stats`), in output order.
            #[derive(Debug, Clone, Default, PartialEq, Eq)]
            pub struct DeviceStats {
                $( $(#[$m])* $f ),*
            }
        }

        /// A counter of [`DeviceStats`], named as its field
        /// ([`Counters::count`]).
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Counter {
            $(
                #[doc = concat!("[`DeviceStats::", stringify!($f), "`]")]
                $f,
            )*
        }

        impl Counter {
            /// Every counter, in [`DeviceStats::NAMES`] order.
            pub const ALL: [Counter; DeviceStats::COUNT] = [$(Counter::$f),*];
        }

        impl Counters {
            /// Counts `n` on counter `c`, and on the QP whose step runs
            /// when `c` is one of a QP's ([`QpStats`]).
            #[inline(always)]
            pub fn count(&mut self, c: Counter, n: u64) {
                match c {
                    $(
                        Counter::$f => {
                            self.total.$f += n;
                            $(
                                if self.in_step {
                                    self.step.$q += n;
                                    self.dirty = true;
                                }
                            )?
                        }
                    )*
                }
            }
        }
    };
}

device_counters! {
    /// Frames handed to the link.
    tx_frames => qp.tx_packets,
    /// Frames received from the link.
    rx_frames,
    /// Frames dropped: not RoCEv2/ARP for us, malformed, for no QP, or
    /// failing the header checks (also counted by class, `rx_drop_*`).
    rx_dropped => qp.rx_dropped,
    /// Frames dropped for a bad ICRC.
    icrc_errors,
    /// Control commands rejected with an error status.
    cmd_errors,
    /// Request packets retransmitted (timeouts and RNR back-offs).
    retransmits => qp.retransmits,
    /// NAKs sent (sequence, access, invalid request, operational).
    naks_sent,
    /// NAKs received.
    naks_received,
    /// RNR NAKs sent.
    rnr_naks_sent => qp.rnr_naks_sent,
    /// RNR NAKs received.
    rnr_naks_received => qp.rnr_naks_received,
    /// Duplicate requests received (re-acknowledged, not re-executed).
    duplicates => qp.duplicates,
    /// NAKs sent with code PSN sequence error (IBTA Table 44).
    nak_psn_seq_sent => qp.nak_psn_seq_sent,
    /// NAKs sent with code invalid request.
    nak_inv_req_sent => qp.nak_inv_req_sent,
    /// NAKs sent with code remote access error.
    nak_rem_access_sent => qp.nak_rem_access_sent,
    /// NAKs sent with code remote operational error.
    nak_rem_op_sent => qp.nak_rem_op_sent,
    /// NAKs received with code PSN sequence error.
    nak_psn_seq_received => qp.nak_psn_seq_received,
    /// NAKs received with code invalid request (or invalid RD request).
    nak_inv_req_received => qp.nak_inv_req_received,
    /// NAKs received with code remote access error.
    nak_rem_access_received => qp.nak_rem_access_received,
    /// NAKs received with code remote operational error.
    nak_rem_op_received => qp.nak_rem_op_received,
    /// RoCEv2 payload bytes sent: after the BTH and extension headers,
    /// without pad and ICRC; retransmissions count again.
    tx_bytes => qp.tx_bytes,
    /// RoCEv2 payload bytes received in packets for one of the device's
    /// QPs (counted as [`DeviceStats::tx_bytes`]).
    rx_bytes => qp.rx_bytes,
    /// Doorbells ignored ([`Device::doorbell`](crate::device::Device::doorbell)), for any reason: an
    /// unknown kind or handle, a handle of another context (also counted
    /// in [`DeviceStats::doorbells_foreign`]), or a producer index outside
    /// `[fetch index, consumer index + ring size]` of its queue (device
    /// spec §5.x.6.9); and producer indices read from QP records outside
    /// that window (`Device::poll_records`).
    doorbells_ignored,
    /// Doorbells ignored (also in `doorbells_ignored`) because the QP, SRQ
    /// or CQ they name exists but belongs to another device context than
    /// their [`abi::Doorbell::ctx`](crate::abi::Doorbell::ctx) (device spec §5.x.6.13): in a guest
    /// whose programs share a device through the agent, a program ringing
    /// another program's queues.
    doorbells_foreign,
    /// Packets dropped (also in `rx_dropped`) because their opcode is of
    /// another transport than the QP's (rxe's `check_type_state`).
    rx_drop_qp_type,
    /// Packets dropped (also in `rx_dropped`) because the QP's state does
    /// not receive them: a request before RTR or in ERR, a response
    /// outside RTS/SQD (rxe's `check_type_state`).
    rx_drop_qp_state,
    /// RC/UC packets dropped (also in `rx_dropped`) whose source IP is not
    /// the QP's destination GID or whose destination IP is not its source
    /// GID (rxe's `check_addr`).
    rx_drop_bad_src_addr,
    /// Packets dropped (also in `rx_dropped`) whose BTH P_Key does not
    /// match the QP's P_Key table entry (IBTA §10.9.3, rxe's `check_keys`).
    rx_drop_bad_pkey,
    /// UD packets dropped (also in `rx_dropped`) whose DETH Q_Key is not
    /// the QP's (IBTA C10-16, rxe's `check_keys`).
    rx_drop_bad_qkey,
    /// Packets (also in `tx_frames`) sent to another function of the
    /// daemon in the frame of an earlier one (a batch, `batch::gso`).
    tx_batched,
    /// Of those, packets whose payload stayed in this device's memory for
    /// the receiver to copy (by reference, `vrnic::data`).
    tx_by_ref,
    /// ACKs that took the place of an earlier ACK of the same QP at the
    /// end of a batch (coalesced, `Output::send_with`): not counted in
    /// `tx_frames` again.
    acks_coalesced,
    /// SQ and RQ producer indices taken from QP records instead of
    /// doorbells (device spec §5.x.6.9, "Doorbell records"): new values
    /// read while the device polls.
    records_read,
    /// Replies to peers (ACKs, NAKs, RNR NAKs, atomic ACKs, ARP replies,
    /// neighbour advertisements) dropped because
    /// `transport::TX_REPLY_MAX` packets already waited for the link
    /// (`Output::send_reply`): the peer's retransmission recovers them.
    replies_dropped => qp.replies_dropped,
    /// Expired ACK timers that started again instead of retrying: the
    /// QP's last packets were still in this device's transmit queue or
    /// held by its owner for a full link (`completer::on_timer`).
    ack_timeouts_deferred,
    /// Tail loss probes sent: the last unacknowledged packet of a QP sent
    /// again after about two round trips without progress
    /// (`transport::probe`).
    tail_probes,
    /// Packets for QP1 dropped (also in `rx_dropped`) because the device
    /// has no GSI QP: none was created, or it was destroyed.
    rx_drop_no_gsi,
    /// UD (and GSI) datagrams dropped unsent, their WQEs completed
    /// successfully, because their destination's resolution (ARP or
    /// neighbour discovery) failed: a datagram lost on the way, rather
    /// than a send queue waiting for a neighbour that never answers (a
    /// spoofed source's MAD would stall QP1's every answer behind it).
    tx_drop_unresolved,
}

crate::counters! {
    /// Counters of one QP since it was created: packets, events, and payload
    /// bytes (`tx_bytes`, `rx_bytes`). All but `rx_packets` are its share of
    /// a device counter (the `=> qp.` marks of [`DeviceStats`]'s list).
    #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
    pub struct QpStats {
        /// RoCEv2 packets sent for this QP (requests, responses, ACKs/NAKs).
        tx_packets,
        /// RoCEv2 packets received for this QP (valid ICRC).
        rx_packets,
        /// RoCEv2 payload bytes sent for this QP (after the BTH and extension
        /// headers, without pad and ICRC; retransmissions count again).
        tx_bytes,
        /// RoCEv2 payload bytes received for this QP (as `tx_bytes`).
        rx_bytes,
        /// Received packets the QP dropped (wrong transport, Q_Key, state, UC/UD
        /// messages that could not be delivered).
        rx_dropped,
        /// Retransmissions started by an ACK timeout or the end of an RNR
        /// back-off: one per go-back-N rewind, however many packets it resends
        /// (resends after a PSN sequence NAK show in `nak_psn_seq_received`).
        retransmits,
        /// Duplicate requests or responses received.
        duplicates,
        /// NAKs sent: PSN sequence error (IBTA Table 44 code 0).
        nak_psn_seq_sent,
        /// NAKs sent: invalid request (code 1).
        nak_inv_req_sent,
        /// NAKs sent: remote access error (code 2).
        nak_rem_access_sent,
        /// NAKs sent: remote operational error (code 3).
        nak_rem_op_sent,
        /// NAKs received: PSN sequence error.
        nak_psn_seq_received,
        /// NAKs received: invalid request.
        nak_inv_req_received,
        /// NAKs received: remote access error.
        nak_rem_access_received,
        /// NAKs received: remote operational error.
        nak_rem_op_received,
        /// RNR NAKs sent.
        rnr_naks_sent,
        /// RNR NAKs received.
        rnr_naks_received,
        /// Replies to this QP's peer (ACK, NAK, RNR NAK, atomic ACK) dropped
        /// at the link backlog's reply bound (`transport::TX_REPLY_MAX`).
        replies_dropped,
    }
}

/// The device's counters as the engine counts them: [`DeviceStats`] (read
/// through `Deref`), counted with [`Counters::count`] only, so that every
/// counter a QP's step counts is its QP's as well.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    total: DeviceStats,
    /// The running step's share of the per-QP counters.
    step: QpStats,
    /// A QP's step runs (`Counters::begin_step`).
    in_step: bool,
    /// `step` holds counts.
    dirty: bool,
}

impl Deref for Counters {
    type Target = DeviceStats;

    fn deref(&self) -> &DeviceStats {
        &self.total
    }
}

impl Counters {
    /// The counters.
    pub fn stats(&self) -> &DeviceStats {
        &self.total
    }

    /// A QP's transport step starts: counts go to its share from now on.
    pub(crate) fn begin_step(&mut self) {
        // Left over only by a step that panicked: nobody's.
        if self.dirty {
            self.step = QpStats::default();
            self.dirty = false;
        }
        self.in_step = true;
    }

    /// The step started by `Counters::begin_step` ends: its share goes
    /// to `qp`, the QP it ran for.
    pub(crate) fn end_step(&mut self, qp: &mut QpStats) {
        self.in_step = false;
        if self.dirty {
            qp.add_all(&self.step);
            self.step = QpStats::default();
            self.dirty = false;
        }
    }

    /// Counts a NAK sent with `code` (in `naks_sent` and by code).
    pub fn nak_sent(&mut self, code: NakCode) {
        use NakCode::*;
        self.count(Counter::naks_sent, 1);
        let c = match code {
            PsnSequenceError => Counter::nak_psn_seq_sent,
            InvalidRequest | InvalidRdRequest => Counter::nak_inv_req_sent,
            RemoteAccessError => Counter::nak_rem_access_sent,
            RemoteOperationalError => Counter::nak_rem_op_sent,
        };
        self.count(c, 1);
    }

    /// Counts a NAK received with `code` (in `naks_received` and by code).
    pub fn nak_received(&mut self, code: NakCode) {
        use NakCode::*;
        self.count(Counter::naks_received, 1);
        let c = match code {
            PsnSequenceError => Counter::nak_psn_seq_received,
            InvalidRequest | InvalidRdRequest => Counter::nak_inv_req_received,
            RemoteAccessError => Counter::nak_rem_access_received,
            RemoteOperationalError => Counter::nak_rem_op_received,
        };
        self.count(c, 1);
    }

    /// Counts a packet dropped by [`hdr_check::hdr_check`] (in
    /// `rx_dropped` and by class).
    pub fn hdr_drop(&mut self, why: hdr_check::HdrDrop) {
        use hdr_check::HdrDrop::*;
        self.count(Counter::rx_dropped, 1);
        let c = match why {
            QpType => Counter::rx_drop_qp_type,
            QpState => Counter::rx_drop_qp_state,
            BadAddr => Counter::rx_drop_bad_src_addr,
            BadPkey => Counter::rx_drop_bad_pkey,
            BadQkey => Counter::rx_drop_bad_qkey,
        };
        self.count(c, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_gives_its_qp_the_marked_counters_it_counted_and_nothing_else() {
        let mut c = Counters::default();
        // Outside a step: device-wide only.
        c.count(Counter::rx_dropped, 2);
        let mut qp = QpStats::default();
        c.begin_step();
        c.count(Counter::tx_frames, 3);
        c.count(Counter::tx_bytes, 100);
        c.nak_sent(NakCode::RemoteAccessError);
        c.count(Counter::tail_probes, 1);
        c.end_step(&mut qp);
        let want = QpStats {
            tx_packets: 3,
            tx_bytes: 100,
            nak_rem_access_sent: 1,
            ..Default::default()
        };
        assert_eq!(qp, want);
        assert_eq!(
            (c.rx_dropped, c.tx_frames, c.naks_sent, c.tail_probes),
            (2, 3, 1, 1)
        );
        // A step that counts nothing leaves its QP alone.
        let mut idle = QpStats::default();
        c.begin_step();
        c.end_step(&mut idle);
        assert_eq!(idle, QpStats::default());
        // A step that never ended (a panic) leaves nothing to the next.
        c.begin_step();
        c.count(Counter::retransmits, 1);
        c.begin_step();
        c.end_step(&mut idle);
        assert_eq!(idle, QpStats::default());
        assert_eq!(c.retransmits, 1);
    }

    #[test]
    fn every_qp_counter_but_rx_packets_is_a_share_of_a_device_counter() {
        // Each marked device counter, counted in a step, moves exactly one
        // QP counter; together they move every QP counter but rx_packets.
        let mut moved = Vec::new();
        for (counter, name) in Counter::ALL.into_iter().zip(DeviceStats::NAMES) {
            assert_eq!(format!("{counter:?}"), name);
            let mut c = Counters::default();
            let mut qp = QpStats::default();
            c.begin_step();
            c.count(counter, 1);
            c.end_step(&mut qp);
            let got: Vec<_> = qp.iter().filter(|(_, v)| *v != 0).collect();
            assert!(got.len() <= 1, "{name}: {got:?}");
            moved.extend(got.into_iter().map(|(n, _)| n));
        }
        moved.sort_unstable();
        let mut want: Vec<_> = QpStats::NAMES
            .into_iter()
            .filter(|n| *n != "rx_packets")
            .collect();
        want.sort_unstable();
        assert_eq!(moved, want);
    }
}
