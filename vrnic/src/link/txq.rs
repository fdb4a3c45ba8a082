//! Handing a device's frames to a link without losing them to a full link.
//!
//! [`super::Link::send`] drops a frame the link cannot take now, as a NIC
//! with a full TX ring would, and the RC transport then recovers by
//! retransmission: for a frame at the tail of a window that is the local
//! ACK timeout (67 ms at perftest's `timeout` 14). An owner that drains a
//! device through [`TxFlush`] instead hands the link up to [`SEND_BATCH`]
//! frames at a time ([`super::Link::try_send_many`]: one `sendmmsg(2)`
//! on AF_PACKET) and keeps a frame the link is too full to take, with
//! every later frame for the same destination MAC, to try them again
//! first on its next pass (when the link's descriptor polls writable): a
//! destination's frames leave complete and in order. Frames for other
//! destinations go on meanwhile (a full queue of one function of the
//! daemon, or a full uplink, holds back only the frames meant for it,
//! issue 27), up to [`HELD_MAX`] frames held for one destination or
//! [`HELD_TOTAL_MAX`] in all: then the flusher takes nothing more from
//! the device, whose own queue fills, and at `transport::TX_BACKLOG_MAX`
//! frames its requesters and READ responders stop producing —
//! backpressure up to the WQEs. A destination on the wire that stays full
//! for [`TX_HOLD_MAX_NS`] loses its oldest held frame after all (counted),
//! so a stuck link cannot stall the device's other work forever. A local
//! destination (another function of the daemon,
//! [`super::LinkCaps::local_macs`]) is a queue its own worker drains: its
//! frames are held as long as it takes frames at all, and given up only
//! after [`TX_HOLD_LOCAL_MAX_NS`] without one (issue 28: between
//! functions, a full queue holds the sender back instead of losing its
//! frames; the switch itself drops only for a destination gone or
//! unattended).
//!
//! The flusher tells its source which frames it still holds
//! ([`FrameSource::set_held_from`], by the sequence numbers of
//! [`FrameSource::next_seq`]): a device's ACK timers wait for them rather
//! than count their time in its hands as the peer's silence.

use crate::time::Nanos;

use super::Link;

/// Longest a frame is held for a full destination, ns (10 ms): then it is
/// given up ([`TxFlush::given_up`]) and the RC transport retransmits it.
pub const TX_HOLD_MAX_NS: Nanos = 10_000_000;
/// Longest a local destination ([`super::LinkCaps::local_macs`]) may take
/// no frame at all before its oldest held frame is given up, ns (1 s): a
/// function whose worker is wedged must not stall its senders forever;
/// one that drains, however slowly, loses nothing.
pub const TX_HOLD_LOCAL_MAX_NS: Nanos = 1_000_000_000;
/// Most frames one [`TxFlush::flush`] hands to the link, so one call is
/// bounded however fast a source refills (the device's queue is bounded
/// too: `transport::TX_BACKLOG_MAX` data frames, with the replies at
/// most `transport::TX_REPLY_MAX` packets in all).
pub const FLUSH_MAX: usize = 4096;
/// Frames held for one full destination after which the flusher takes no
/// more frames from its source until that destination takes some (a
/// burst of one QP: [`SEND_BATCH`]).
pub const HELD_MAX: usize = SEND_BATCH;
/// Frames held for all full destinations together after which the
/// flusher takes no more from its source.
pub const HELD_TOTAL_MAX: usize = 4 * SEND_BATCH;

/// Where [`TxFlush`] takes frames from: a device's transmit queue
/// (`crate::device::Device` implements it), in
/// order, with the buffers given back for reuse.
pub trait FrameSource {
    /// The next frame to send, if any.
    fn next_frame(&mut self) -> Option<Vec<u8>>;
    /// Takes back the buffer of a frame the link has taken (or that was
    /// given up).
    fn recycle(&mut self, frame: Vec<u8>);
    /// The sequence number of the frame [`FrameSource::next_frame`]
    /// returns next (frames numbered from 0 in the order they come); 0 for
    /// a source that does not number its frames.
    fn next_seq(&self) -> u64 {
        0
    }
    /// The flusher still holds frames from sequence number `seq` on (some
    /// of them), or none (`None`).
    fn set_held_from(&mut self, _seq: Option<u64>) {}
}

/// What one [`TxFlush::flush`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flushed {
    /// Frames the link took, or that were lost: given up or failed.
    pub sent: usize,
    /// Of those, frames given up after [`TX_HOLD_MAX_NS`] of a full
    /// destination.
    pub given_up: usize,
    /// Of those, frames the link refused with an error other than "full".
    pub failed: usize,
    /// Frames are held for a full destination: call again when the link's
    /// descriptor polls writable (or soon, for a link without one).
    pub held: bool,
}

/// Most frames one [`TxFlush`] hands to [`Link::try_send_many`] at once:
/// one `sendmmsg(2)` of 32 frames.
pub const SEND_BATCH: usize = 32;
/// Bytes of frames a [`TxFlush`] takes from its source ahead of the link,
/// at most (the last frame taken may pass it): 32 frames of a 9000-byte
/// MTU, or four batches between functions ([`crate::batch::gso`]).
pub const SEND_BATCH_BYTES: usize = 32 * 9216;

/// Frames held for one full destination, oldest first.
#[derive(Debug)]
struct Held {
    /// The destination MAC (the frames' first six bytes).
    dst: [u8; 6],
    /// When the link first refused `frames[0]`, or last took one.
    since: Nanos,
    frames: Vec<Vec<u8>>,
    /// The sequence numbers of `frames` ([`FrameSource::next_seq`]).
    seqs: Vec<u64>,
}

/// The destination MAC of a frame (zeros for a frame too short to have
/// one: the link refuses it with an error, never as full).
fn dst_of(frame: &[u8]) -> [u8; 6] {
    frame
        .get(..6)
        .and_then(|d| <[u8; 6]>::try_from(d).ok())
        .unwrap_or_default()
}

/// The frames taken from a source and not yet sent, between passes: those
/// held for full destinations and the batch in hand; see the
/// [module documentation](self).
#[derive(Debug, Default)]
pub struct TxFlush {
    /// At most [`SEND_BATCH`] frames and (but for the last)
    /// [`SEND_BATCH_BYTES`], in order, for destinations not held.
    pending: Vec<Vec<u8>>,
    /// The sequence numbers of `pending`'s frames, in the same order.
    pending_seqs: Vec<u64>,
    /// Per full destination, in the order they filled.
    held: Vec<Held>,
    given_up: u64,
}

impl TxFlush {
    /// A flusher holding nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands the held frames, then `src`'s frames, to `link`, up to
    /// [`SEND_BATCH`] per [`Link::try_send_many`], until `src` is empty,
    /// [`FLUSH_MAX`] frames went, or the held frames reach [`HELD_MAX`]
    /// for one destination or [`HELD_TOTAL_MAX`] in all. A frame the link
    /// is too full to take is held, with every later one for its
    /// destination; frames for other destinations go on. `now` (ns, any
    /// fixed epoch) times the hold: a destination full for
    /// [`TX_HOLD_MAX_NS`] loses its oldest held frame. A link error other
    /// than "full" loses that one frame (it is logged), as [`Link::send`]
    /// errors do.
    pub fn flush(&mut self, link: &mut dyn Link, src: &mut dyn FrameSource, now: Nanos) -> Flushed {
        let mut done = Flushed::default();
        self.retry_held(link, src, now, &mut done);
        while done.sent < FLUSH_MAX {
            let room = SEND_BATCH.min(FLUSH_MAX - done.sent);
            let mut bytes: usize = self.pending.iter().map(Vec::len).sum();
            while self.pending.len() < room && bytes < SEND_BATCH_BYTES && !self.held_full() {
                let seq = src.next_seq();
                let Some(f) = src.next_frame() else {
                    break;
                };
                // Behind the frames held for its destination, in order.
                let dst = dst_of(&f);
                if let Some(h) = self.held.iter_mut().find(|h| h.dst == dst) {
                    h.frames.push(f);
                    h.seqs.push(seq);
                    continue;
                }
                bytes += f.len();
                self.pending.push(f);
                self.pending_seqs.push(seq);
            }
            if self.pending.is_empty() {
                break;
            }
            // A link that takes a buffer leaves one of its own in its place.
            let took = match link.try_send_many(&mut self.pending) {
                Ok(0) => {
                    // The first frame's destination is full: hold it and
                    // the rest of the batch for it; the others go on.
                    let dst = dst_of(&self.pending[0]);
                    let (mut mine, mut mine_seqs) = (Vec::new(), Vec::new());
                    let (mut others, mut seqs) = (Vec::new(), Vec::new());
                    let tagged = self.pending.drain(..).zip(self.pending_seqs.drain(..));
                    for (f, seq) in tagged {
                        if dst_of(&f) == dst {
                            mine.push(f);
                            mine_seqs.push(seq);
                        } else {
                            others.push(f);
                            seqs.push(seq);
                        }
                    }
                    self.pending = others;
                    self.pending_seqs = seqs;
                    self.held.push(Held {
                        dst,
                        since: now.max(1),
                        frames: mine,
                        seqs: mine_seqs,
                    });
                    continue;
                }
                // A link that stops early (`sendmmsg`) is offered the rest
                // again at once.
                Ok(n) => n.min(self.pending.len()),
                Err(e) => {
                    done.failed += 1;
                    tracing::debug!("link send failed: {e}");
                    1
                }
            };
            done.sent += took;
            for frame in self.pending.drain(..took) {
                src.recycle(frame);
            }
            self.pending_seqs.drain(..took.min(self.pending_seqs.len()));
        }
        done.held = !self.held.is_empty();
        src.set_held_from(self.oldest_seq());
        done
    }

    /// The sequence number of the oldest frame held or pending, if any.
    fn oldest_seq(&self) -> Option<u64> {
        let held = self.held.iter().filter_map(|h| h.seqs.first().copied());
        held.chain(self.pending_seqs.first().copied()).min()
    }

    /// Offers each full destination its held frames again, oldest
    /// destination first; one full for [`TX_HOLD_MAX_NS`] loses its oldest
    /// frame.
    fn retry_held(
        &mut self,
        link: &mut dyn Link,
        src: &mut dyn FrameSource,
        now: Nanos,
        done: &mut Flushed,
    ) {
        let local = link.caps().local_macs;
        let mut i = 0;
        while let Some(h) = self.held.get_mut(i) {
            let bound = match &local {
                Some(l) if l.contains(&h.dst) => TX_HOLD_LOCAL_MAX_NS,
                _ => TX_HOLD_MAX_NS,
            };
            let took = match link.try_send_many(&mut h.frames) {
                Ok(0) if now.saturating_sub(h.since) < bound => 0,
                Ok(0) => {
                    self.given_up = self.given_up.wrapping_add(1);
                    done.given_up += 1;
                    tracing::debug!("destination full for {bound} ns: a frame given up");
                    h.since = now.max(1);
                    1
                }
                Ok(n) => {
                    h.since = now.max(1);
                    n.min(h.frames.len())
                }
                Err(e) => {
                    done.failed += 1;
                    tracing::debug!("link send failed: {e}");
                    1
                }
            };
            done.sent += took;
            for frame in h.frames.drain(..took) {
                src.recycle(frame);
            }
            h.seqs.drain(..took.min(h.seqs.len()));
            if h.frames.is_empty() {
                self.held.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Whether the held frames stop the flusher taking more from its
    /// source ([`HELD_MAX`], [`HELD_TOTAL_MAX`]).
    fn held_full(&self) -> bool {
        let mut total = 0;
        for h in &self.held {
            if h.frames.len() >= HELD_MAX {
                return true;
            }
            total += h.frames.len();
        }
        total >= HELD_TOTAL_MAX
    }

    /// True while a frame waits for the link.
    pub fn holding(&self) -> bool {
        !self.held.is_empty() || !self.pending.is_empty()
    }

    /// Frames given up after being held for [`TX_HOLD_MAX_NS`].
    pub fn given_up(&self) -> u64 {
        self.given_up
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::Rx;
    use std::collections::VecDeque;
    use std::io;

    /// A link that is full for its first `refuse` tries, then takes
    /// everything; what it took, in order.
    struct Stubborn {
        refuse: usize,
        took: Vec<Vec<u8>>,
    }

    impl Link for Stubborn {
        fn send(&mut self, frame: &[u8]) -> io::Result<()> {
            // What a NIC-like link does when full: the frame is lost.
            if self.refuse == 0 {
                self.took.push(frame.to_vec());
            }
            self.refuse = self.refuse.saturating_sub(1);
            Ok(())
        }

        fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
            if self.refuse > 0 {
                self.refuse -= 1;
                return Ok(false);
            }
            self.took.push(frame.to_vec());
            Ok(true)
        }

        fn receive(&mut self, _: Rx<'_>) -> io::Result<Option<usize>> {
            Ok(None)
        }
    }

    #[derive(Default)]
    struct Queue {
        frames: VecDeque<Vec<u8>>,
        recycled: usize,
    }

    impl FrameSource for Queue {
        fn next_frame(&mut self) -> Option<Vec<u8>> {
            self.frames.pop_front()
        }
        fn recycle(&mut self, _: Vec<u8>) {
            self.recycled += 1;
        }
    }

    /// `n` frames to `n` destinations: frame `i` is 60 bytes of `i`.
    fn frames(n: u8) -> Queue {
        Queue {
            frames: (0..n).map(|i| vec![i; 60]).collect(),
            ..Queue::default()
        }
    }

    /// Frame `i` to destination MAC `[d; 6]`: that MAC, then 54 bytes of `i`.
    fn frame_to(d: u8, i: u8) -> Vec<u8> {
        let mut f = vec![d; 6];
        f.resize(60, i);
        f
    }

    /// `n` frames to one destination, `[7; 6]`.
    fn frames_to_one(n: u8) -> Queue {
        Queue {
            frames: (0..n).map(|i| frame_to(7, i)).collect(),
            ..Queue::default()
        }
    }

    #[test]
    fn a_link_that_is_full_for_a_while_gets_every_frame_in_order() {
        let mut link = Stubborn {
            refuse: 3,
            took: Vec::new(),
        };
        let mut src = frames_to_one(5);
        let mut tx = TxFlush::new();
        let mut now = 1_000;
        let mut passes = Vec::new();
        for _ in 0..10 {
            passes.push(tx.flush(&mut link, &mut src, now));
            now += 1_000;
        }
        assert_eq!(
            link.took,
            (0..5).map(|i| frame_to(7, i)).collect::<Vec<_>>()
        );
        assert_eq!(passes[..4].iter().filter(|f| f.held).count(), 3);
        assert_eq!(
            passes[3],
            Flushed {
                sent: 5,
                ..Flushed::default()
            }
        );
        assert_eq!((src.recycled, tx.given_up(), tx.holding()), (5, 0, false));
    }

    /// A switch port full of another function's frames: its destination
    /// (`[7; 6]`) is local, everything else is not.
    struct BusyPort(Stubborn);

    impl Link for BusyPort {
        fn send(&mut self, frame: &[u8]) -> io::Result<()> {
            self.0.send(frame)
        }
        fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
            self.0.try_send(frame)
        }
        fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
            self.0.receive(rx)
        }
        fn caps(&self) -> crate::link::LinkCaps {
            crate::link::LinkCaps {
                local_macs: Some(crate::link::LocalMacs::new(|m| *m == [7; 6])),
                ..Default::default()
            }
        }
    }

    /// A [`Queue`] that numbers its frames and keeps what the flusher
    /// reports holding.
    #[derive(Default)]
    struct Numbered {
        q: Queue,
        next: u64,
        held_from: Option<u64>,
    }

    impl FrameSource for Numbered {
        fn next_frame(&mut self) -> Option<Vec<u8>> {
            let f = self.q.next_frame()?;
            self.next += 1;
            Some(f)
        }
        fn recycle(&mut self, f: Vec<u8>) {
            self.q.recycle(f);
        }
        fn next_seq(&self) -> u64 {
            self.next
        }
        fn set_held_from(&mut self, seq: Option<u64>) {
            self.held_from = seq;
        }
    }

    /// Issue 28: frames for a local destination that takes nothing are
    /// held past [`TX_HOLD_MAX_NS`], up to [`TX_HOLD_LOCAL_MAX_NS`]; the
    /// source learns the oldest frame still held, and that none is once
    /// the destination took them all.
    #[test]
    fn a_full_local_destination_holds_its_frames_and_says_which() {
        let mut link = BusyPort(Stubborn {
            refuse: usize::MAX,
            took: Vec::new(),
        });
        let mut src = Numbered {
            q: Queue {
                frames: [
                    frame_to(9, 0),
                    frame_to(7, 1),
                    frame_to(7, 2),
                    frame_to(9, 3),
                ]
                .into(),
                ..Queue::default()
            },
            ..Numbered::default()
        };
        let mut tx = TxFlush::new();
        let t0 = 1_000;
        // Both destinations full: the one on the wire loses a frame after
        // TX_HOLD_MAX_NS, the local one keeps both of its.
        tx.flush(&mut link, &mut src, t0);
        assert_eq!(src.held_from, Some(0));
        let f = tx.flush(&mut link, &mut src, t0 + TX_HOLD_MAX_NS);
        assert_eq!(f.given_up, 1, "frame 0, for the wire");
        assert_eq!(src.held_from, Some(1));
        let f = tx.flush(&mut link, &mut src, t0 + 2 * TX_HOLD_MAX_NS);
        assert_eq!((f.given_up, tx.given_up()), (1, 2), "frame 3, for the wire");
        assert_eq!(src.held_from, Some(1), "frames 1 and 2 held, local");
        assert!(
            tx.flush(&mut link, &mut src, t0 + TX_HOLD_LOCAL_MAX_NS - 1)
                .held
        );
        assert_eq!(tx.given_up(), 2);
        // The local destination takes them: nothing is held.
        link.0.refuse = 0;
        let f = tx.flush(&mut link, &mut src, t0 + TX_HOLD_LOCAL_MAX_NS - 1);
        assert_eq!((f.sent, f.held), (2, false));
        assert_eq!(link.0.took, [frame_to(7, 1), frame_to(7, 2)]);
        assert_eq!(src.held_from, None);
        // A local destination that takes nothing for TX_HOLD_LOCAL_MAX_NS
        // does lose its oldest frame (a wedged function).
        link.0.refuse = usize::MAX;
        src.q.frames.push_back(frame_to(7, 4));
        let t1 = t0 + 2 * TX_HOLD_LOCAL_MAX_NS;
        tx.flush(&mut link, &mut src, t1);
        assert_eq!(src.held_from, Some(4));
        tx.flush(&mut link, &mut src, t1 + TX_HOLD_LOCAL_MAX_NS - 1);
        assert_eq!(tx.given_up(), 2);
        let f = tx.flush(&mut link, &mut src, t1 + TX_HOLD_LOCAL_MAX_NS);
        assert_eq!((f.given_up, f.held, src.held_from), (1, false, None));
    }

    #[test]
    fn a_link_full_for_longer_than_the_hold_loses_only_the_held_frame() {
        let mut link = Stubborn {
            refuse: usize::MAX,
            took: Vec::new(),
        };
        let mut src = frames_to_one(3);
        let mut tx = TxFlush::new();
        let t0 = 5_000;
        assert!(tx.flush(&mut link, &mut src, t0).held);
        assert!(tx.flush(&mut link, &mut src, t0 + TX_HOLD_MAX_NS - 1).held);
        assert_eq!(tx.given_up(), 0);
        // Frame 0 is given up; frame 1 is then held from now on.
        let f = tx.flush(&mut link, &mut src, t0 + TX_HOLD_MAX_NS);
        assert_eq!(
            f,
            Flushed {
                sent: 1,
                given_up: 1,
                held: true,
                ..Flushed::default()
            }
        );
        assert_eq!((tx.given_up(), src.recycled), (1, 1));
        link.refuse = 0;
        tx.flush(&mut link, &mut src, t0 + TX_HOLD_MAX_NS + 1);
        assert_eq!(link.took, vec![frame_to(7, 1), frame_to(7, 2)]);
    }

    /// A link that takes at most `per_call` frames per
    /// [`Link::try_send_many`] (as `sendmmsg` stopping early) and fails
    /// frames whose first byte is in `bad`; what it took, and its calls.
    struct Batching {
        per_call: usize,
        bad: Vec<u8>,
        took: Vec<u8>,
        calls: usize,
    }

    impl Link for Batching {
        fn send(&mut self, _: &[u8]) -> io::Result<()> {
            unreachable!("TxFlush sends with try_send_many")
        }

        fn try_send_many(&mut self, frames: &mut [Vec<u8>]) -> io::Result<usize> {
            self.calls += 1;
            for (i, f) in frames.iter().take(self.per_call).enumerate() {
                if self.bad.contains(&f[0]) {
                    return if i == 0 {
                        Err(io::Error::from_raw_os_error(libc::EMSGSIZE))
                    } else {
                        Ok(i)
                    };
                }
                self.took.push(f[0]);
            }
            Ok(frames.len().min(self.per_call))
        }

        fn receive(&mut self, _: Rx<'_>) -> io::Result<Option<usize>> {
            Ok(None)
        }
    }

    #[test]
    fn frames_go_in_batches_in_order_and_a_failing_frame_loses_only_itself() {
        let mut link = Batching {
            per_call: SEND_BATCH,
            bad: vec![40],
            took: Vec::new(),
            calls: 0,
        };
        let mut src = frames(100);
        let f = TxFlush::new().flush(&mut link, &mut src, 1);
        assert_eq!(
            f,
            Flushed {
                sent: 100,
                failed: 1,
                ..Flushed::default()
            }
        );
        let want: Vec<u8> = (0..100).filter(|&i| i != 40).collect();
        assert_eq!(link.took, want);
        assert_eq!(src.recycled, 100);
        // 32, 8 (stopped before 40), 40 alone (failed), 32, 19: batches.
        assert_eq!(link.calls, 5);

        // A link that stops early: the rest is offered again at once.
        let mut link = Batching {
            per_call: 5,
            bad: Vec::new(),
            took: Vec::new(),
            calls: 0,
        };
        let f = TxFlush::new().flush(&mut link, &mut frames(12), 1);
        assert_eq!((f.sent, f.held), (12, false));
        assert_eq!(link.took, (0..12).collect::<Vec<u8>>());
    }

    /// A link whose destination `[full; 6]` takes nothing while `full` is
    /// set, and everything else; what it took, in order.
    struct OneFull {
        full: Option<u8>,
        took: Vec<Vec<u8>>,
    }

    impl Link for OneFull {
        fn send(&mut self, _: &[u8]) -> io::Result<()> {
            unreachable!("TxFlush sends with try_send_many")
        }

        fn try_send_many(&mut self, frames: &mut [Vec<u8>]) -> io::Result<usize> {
            let n = frames
                .iter()
                .take_while(|f| self.full.is_none_or(|d| f[0] != d))
                .count();
            self.took.extend(frames[..n].iter().cloned());
            Ok(n)
        }

        fn receive(&mut self, _: Rx<'_>) -> io::Result<Option<usize>> {
            Ok(None)
        }
    }

    /// Issue 27: a full destination holds back only its own frames; the
    /// others leave, each destination's in order; the held ones follow
    /// in order once it takes frames again.
    #[test]
    fn a_full_destination_holds_back_only_its_own_frames() {
        let mut link = OneFull {
            full: Some(1),
            took: Vec::new(),
        };
        // Destinations 1, 2, 3 in turn, 10 frames each.
        let mut src = Queue {
            frames: (0..30).map(|i| frame_to(1 + i % 3, i)).collect(),
            ..Queue::default()
        };
        let mut tx = TxFlush::new();
        let f = tx.flush(&mut link, &mut src, 1);
        assert_eq!((f.sent, f.held, f.given_up), (20, true, 0));
        let others: Vec<_> = (0..30)
            .filter(|i| i % 3 != 0)
            .map(|i| frame_to(1 + i % 3, i))
            .collect();
        assert_eq!(link.took, others, "the others, in order");
        link.full = None;
        let f = tx.flush(&mut link, &mut src, 2);
        assert_eq!((f.sent, f.held), (10, false));
        let mine: Vec<_> = (0..30)
            .filter(|i| i % 3 == 0)
            .map(|i| frame_to(1, i))
            .collect();
        assert_eq!(&link.took[20..], &mine[..], "the held ones, in order");
        assert_eq!((src.recycled, tx.holding()), (30, false));
    }

    /// Past [`HELD_MAX`] frames held for one destination the flusher takes
    /// nothing more from its source (backpressure), and what it took is
    /// not lost.
    #[test]
    fn frames_held_past_the_bound_stop_the_source() {
        let mut link = OneFull {
            full: Some(1),
            took: Vec::new(),
        };
        let n = 3 * HELD_MAX as u8;
        let mut src = Queue {
            frames: (0..n).map(|i| frame_to(1 + i % 2, i)).collect(),
            ..Queue::default()
        };
        let mut tx = TxFlush::new();
        let f = tx.flush(&mut link, &mut src, 1);
        assert!(f.held);
        assert!(!src.frames.is_empty(), "the source is held back");
        let held: usize = tx.held.iter().map(|h| h.frames.len()).sum();
        assert!((HELD_MAX..HELD_MAX + SEND_BATCH).contains(&held), "{held}");
        link.full = None;
        let mut sent = f.sent;
        for t in 2..10 {
            sent += tx.flush(&mut link, &mut src, t).sent;
        }
        assert_eq!(
            (sent, src.recycled, tx.holding()),
            (n as usize, n as usize, false)
        );
        for d in [1, 2] {
            let order: Vec<u8> = link
                .took
                .iter()
                .filter(|f| f[0] == d)
                .map(|f| f[59])
                .collect();
            let want: Vec<u8> = (0..n).filter(|i| 1 + i % 2 == d).collect();
            assert_eq!(order, want, "destination {d} in order");
        }
    }

    #[test]
    fn one_pass_is_bounded() {
        let mut link = Stubborn {
            refuse: 0,
            took: Vec::new(),
        };
        struct Endless;
        impl FrameSource for Endless {
            fn next_frame(&mut self) -> Option<Vec<u8>> {
                Some(vec![0; 60])
            }
            fn recycle(&mut self, _: Vec<u8>) {}
        }
        let f = TxFlush::new().flush(&mut link, &mut Endless, 1);
        assert_eq!(
            f,
            Flushed {
                sent: FLUSH_MAX,
                ..Flushed::default()
            }
        );
    }
}
