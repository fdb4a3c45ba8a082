//! The RC requester's congestion window: how many PSNs of SEND and WRITE
//! packets a QP may have unacknowledged, between [`CWND_MIN`] and
//! [`MAX_INFLIGHT_PKTS`], set by loss (issue 28).
//!
//! A loss-based window control in the manner of TCP Reno (RFC 5681):
//! slow start up to a threshold, then one packet more per window
//! acknowledged (additive increase); a PSN sequence error NAK (the peer
//! saw a gap: fast retransmit) halves the window; an ACK timeout halves
//! the threshold and cuts the window to a quarter. Each QP has its
//! own, so QPs sharing a full queue back off each in turn and converge
//! to equal shares (Chiu and Jain, 1989: AIMD is fair) instead of
//! resending whole windows into it together until their retries run out.
//!
//! Why loss and not ECN/DCQCN marking: vrnic's peers are rxe and
//! hardware RNICs on links vrnic does not control (TAPs, bridges, veth
//! pairs, whose queues mark nothing), and the loss is where the queues
//! overflow: a full TAP queue in the kernel, a socket's receive buffer.
//! Marking from the daemon's own queues would see none of those, and the
//! daemon's own queues lose nothing (they hold the sender back,
//! `link::txq`). A window also caps what one QP puts into a shared queue,
//! which is what fairness between QPs needs.
//!
//! READs are held by it too: the requester asks for a long READ in chunks
//! ([`crate::transport::requester::read_chunk`]), each sent when its first
//! PSN is inside the window, so that the responses, which acknowledge as
//! they land, are paced like SEND and WRITE packets; a gap in them halves
//! the window as a sequence NAK does. Atomics (one PSN) are not.

/// Most PSNs an RC QP sends beyond the last one acknowledged (rxe's
/// `RXE_MAX_UNACKED_PSNS`), the window's ceiling: the requester stops,
/// mid-message if need be, until ACKs (or READ responses) move the
/// window. It bounds what go-back-N resends after a loss; a READ request
/// is sent when the PSNs it asks for fit in the window, or when nothing
/// else is in flight (one [`crate::transport::requester::read_chunk`] at
/// most).
pub const MAX_INFLIGHT_PKTS: u32 = 128;

/// Smallest congestion window, packets: after an ACK timeout.
pub const CWND_MIN: u32 = 8;

/// A QP's congestion window, in packets (PSNs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cwnd {
    /// The window: PSNs of SEND/WRITE packets that may be unacknowledged,
    /// [`CWND_MIN`]..=[`MAX_INFLIGHT_PKTS`].
    window: u32,
    /// Below it the window grows by each packet acknowledged (slow
    /// start), at or above it by one per window acknowledged.
    threshold: u32,
    /// Packets acknowledged toward the next additive increase.
    acked: u32,
}

impl Default for Cwnd {
    /// A full window: a QP starts at the most it may send, as before the
    /// window existed, and loss brings it down.
    fn default() -> Self {
        Self {
            window: MAX_INFLIGHT_PKTS,
            threshold: MAX_INFLIGHT_PKTS,
            acked: 0,
        }
    }
}

impl Cwnd {
    /// The window, packets.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// `n` more packets were acknowledged: slow start below the
    /// threshold, additive increase above it, never past
    /// [`MAX_INFLIGHT_PKTS`].
    pub fn on_ack(&mut self, n: u32) {
        if self.window < self.threshold {
            self.window = self.window.saturating_add(n).min(self.threshold);
            return;
        }
        self.acked = self.acked.saturating_add(n);
        while self.acked >= self.window && self.window < MAX_INFLIGHT_PKTS {
            self.acked -= self.window;
            self.window += 1;
        }
        if self.window >= MAX_INFLIGHT_PKTS {
            self.acked = 0;
        }
    }

    /// A PSN sequence error NAK: the peer lost packets but the ones after
    /// arrived; the window halves (multiplicative decrease).
    pub fn on_nak(&mut self) {
        self.threshold = (self.window / 2).max(CWND_MIN);
        self.window = self.threshold;
        self.acked = 0;
    }

    /// An ACK timeout: nothing came back for a whole timeout; the window
    /// drops to a quarter (at least [`CWND_MIN`]) and slow-starts to half
    /// what it was. Not to one packet, as TCP's does (RFC 5681 §3.1):
    /// the retry count (`retry_cnt`, at most 7) ends the QP after a few
    /// rounds without progress, and a round of a handful of packets with
    /// their ACKs on a lossy link fails too often for that.
    pub fn on_timeout(&mut self) {
        self.threshold = (self.window / 2).max(CWND_MIN);
        self.window = (self.window / 4).max(CWND_MIN);
        self.acked = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nak_halves_the_window_and_acks_grow_it_back_one_per_window() {
        let mut c = Cwnd::default();
        c.on_nak();
        assert_eq!(c.window(), MAX_INFLIGHT_PKTS / 2);
        // One window acknowledged: one packet more.
        c.on_ack(MAX_INFLIGHT_PKTS / 2);
        assert_eq!(c.window(), MAX_INFLIGHT_PKTS / 2 + 1);
        for _ in 0..10_000 {
            c.on_ack(32);
        }
        assert_eq!(c.window(), MAX_INFLIGHT_PKTS);
    }

    #[test]
    fn a_timeout_cuts_the_window_and_slow_start_reopens_it_to_half() {
        let mut c = Cwnd::default();
        c.on_timeout();
        assert_eq!(c.window(), MAX_INFLIGHT_PKTS / 4);
        c.on_ack(8);
        assert_eq!(c.window(), MAX_INFLIGHT_PKTS / 4 + 8);
        c.on_ack(1000);
        assert_eq!(c.window(), MAX_INFLIGHT_PKTS / 2);
        // Repeated loss never takes it below the minimum.
        for _ in 0..10 {
            c.on_timeout();
            c.on_nak();
        }
        assert_eq!(c.window(), CWND_MIN);
    }

    #[test]
    fn two_windows_sharing_losses_converge_to_equal_shares() {
        // AIMD from unequal starts: both see every loss (a shared full
        // queue), both grow one packet per round.
        let (mut a, mut b) = (Cwnd::default(), Cwnd::default());
        a.on_timeout();
        for _ in 0..200 {
            a.on_ack(a.window());
            b.on_ack(b.window());
            if a.window() + b.window() > MAX_INFLIGHT_PKTS {
                a.on_nak();
                b.on_nak();
            }
        }
        let (x, y) = (f64::from(a.window()), f64::from(b.window()));
        assert!((x - y).abs() <= 0.1 * (x + y), "{x} vs {y}");
    }
}
