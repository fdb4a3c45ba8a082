//! Tail loss probes of the RC requester: when the packets at the end of
//! what a QP sent, or their ACK, are lost, nothing comes back to say so:
//! no later packet makes the responder NAK the gap, and without a probe
//! the QP waits out its whole ACK timeout (67 ms at perftest's `timeout`
//! 14) before go-back-N. With a window cut by loss ([`super::cwnd`]) the
//! tail of a window is lost far more often than with one full window, and
//! those waits were most of a lossy link's lost time (issue 28).
//!
//! After a probe timeout of about two round trips ([`Rtt::pto`]) without
//! progress, the requester resends the last packet it sent, asking for an
//! ACK (RFC 8985 §7, "tail loss probe", in go-back-N form): the responder
//! answers a duplicate with an ACK of everything it has (the lost ACK's
//! news), an in-order packet with its ACK (the lost tail was that packet),
//! and a packet past a gap with a PSN sequence error NAK (go-back-N from
//! the gap). One probe per episode: it costs one packet, and the ACK
//! timer and retry count stay as they were (IBTA §9.7.6.1.3).
//!
//! The round trip is sampled per QP as TCP's is (RFC 6298): one packet at
//! a time, from its send to the ACK that covers it, none across a
//! retransmission (Karn's rule).

use crate::transport::psn;

/// Probe timeout before any round trip was sampled, ns (4 ms).
pub const PTO_UNKNOWN_NS: u64 = 4_000_000;
/// Shortest probe timeout, ns (500 µs): a scheduling hiccup of a busy
/// host is not a loss.
pub const PTO_MIN_NS: u64 = 500_000;

/// A QP's smoothed round-trip time and its sample in progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rtt {
    /// Smoothed round trip, ns (0: none sampled yet).
    srtt: u64,
    /// The PSN being timed and when it was sent.
    sample: Option<(u32, u64)>,
}

impl Rtt {
    /// A packet with PSN `p` was sent at `now`: timed unless another is.
    pub fn on_send(&mut self, p: u32, now: u64) {
        if self.sample.is_none() {
            self.sample = Some((p, now));
        }
    }

    /// Every PSN up to `acked` is acknowledged at `now`: a timed one gives
    /// a sample, smoothed with gain 1/8 (RFC 6298 §2).
    pub fn on_ack(&mut self, acked: u32, now: u64) {
        let Some((p, at)) = self.sample else {
            return;
        };
        if psn::diff(acked, p) < 0 {
            return;
        }
        self.sample = None;
        let r = now.saturating_sub(at).max(1);
        self.srtt = if self.srtt == 0 {
            r
        } else {
            (self.srtt.saturating_mul(7) + r) / 8
        };
    }

    /// Packets are being sent again: the timed one may be answered by
    /// either copy, so it is not timed (Karn's rule).
    pub fn on_rewind(&mut self) {
        self.sample = None;
    }

    /// The smoothed round trip, ns (0 before the first sample).
    pub fn srtt(&self) -> u64 {
        self.srtt
    }

    /// The probe timeout, ns: two round trips (at least [`PTO_MIN_NS`];
    /// [`PTO_UNKNOWN_NS`] before any sample), and never past half the ACK
    /// timeout `ack_timeout` (`None`: infinite).
    pub fn pto(&self, ack_timeout: Option<u64>) -> u64 {
        let base = if self.srtt == 0 {
            PTO_UNKNOWN_NS
        } else {
            self.srtt.saturating_mul(2).max(PTO_MIN_NS)
        };
        match ack_timeout {
            Some(t) => base.min(t / 2),
            None => base,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_round_trip_is_sampled_one_packet_at_a_time_and_smoothed() {
        let mut r = Rtt::default();
        assert_eq!(r.pto(Some(67_000_000)), PTO_UNKNOWN_NS);
        r.on_send(10, 1_000);
        r.on_send(11, 2_000); // not timed: 10 is
        r.on_ack(9, 500_000);
        assert_eq!(r.srtt(), 0, "10 not acknowledged yet");
        r.on_ack(11, 1_001_000);
        assert_eq!(r.srtt(), 1_000_000);
        assert_eq!(r.pto(Some(67_000_000)), 2_000_000);
        r.on_send(20, 2_000_000);
        r.on_ack(20, 2_000_000 + 9_000_000);
        assert_eq!(r.srtt(), (7 * 1_000_000 + 9_000_000) / 8);
        // Capped at half the ACK timeout; at least the minimum.
        assert_eq!(r.pto(Some(1_000_000)), 500_000);
        let mut fast = Rtt::default();
        fast.on_send(1, 0);
        fast.on_ack(1, 10);
        assert_eq!(fast.pto(None), PTO_MIN_NS);
    }

    #[test]
    fn a_resent_packet_is_not_timed() {
        let mut r = Rtt::default();
        r.on_send(5, 0);
        r.on_rewind();
        r.on_ack(5, 70_000_000);
        assert_eq!(r.srtt(), 0);
    }
}
