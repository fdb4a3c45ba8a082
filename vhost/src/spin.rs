//! Adaptive polling: spin briefly, then sleep (issue 10).
//!
//! A blocking wake-up costs about 13 µs one way on this kind of machine
//! (`epoll_wait` → eventfd → scheduler; ../shared/reference, "RTT eventfd
//! thread↔thread 26.7 µs"), and a 64-byte ping-pong through vrnic takes
//! several of them. So after a wake-up that found work, the worker keeps
//! polling its doorbell queue (and QP records), its link and its timer for up
//! to a budget (`vrnic --poll-us`, [`DEFAULT_POLL_NS`]) after the *last*
//! work it found, and only then sleeps in `epoll_wait` again.
//!
//! - While it polls, the driver's notifications stay off (virtio 1.2
//!   §2.7.7: `VIRTQ_USED_F_NO_NOTIFY`; with `VIRTIO_F_EVENT_IDX` the
//!   avail event is simply not moved, §2.7.10), so a driver posting a
//!   doorbell does not kick: no eventfd write in a process, no MMIO exit in
//!   a guest. The session ends with notifications on and the queues
//!   checked once more, so nothing posted meanwhile waits for a kick.
//! - Every empty round yields the CPU (`sched_yield(2)`): a program that
//!   polls its CQ and yields when it finds nothing (guest-lib's verbs over
//!   vhost-user do, `Transport::yield_when_idle`) or another function's
//!   worker on the same core runs at once, and posts its doorbell while
//!   this worker waits for it. Without the yield, a worker sharing a core
//!   with its own program polls for nothing until the budget ends (55 µs
//!   per 64-byte `ib_send_lat` iteration instead of 8 measured here).
//! - But a thread that does not yield (perftest's `ib_write_lat` spins on
//!   its buffer; a vCPU running a polling guest) keeps the core for a whole
//!   time slice once it gets it: 2 ms per `ib_write_lat` iteration was
//!   measured. A yield that took [`LONG_YIELD_NS`] or more shows such a
//!   neighbour: the session ends and the worker does not poll for a
//!   while ([`Backoff`]: [`BACKOFF_MIN_NS`] after the first such yield,
//!   twice the last pause after each further one, up to [`BACKOFF_NS`];
//!   each session that polls its whole [`SESSION_MAX_NS`] without one
//!   halves it again: a busy vCPU keeps the pause long, a program's
//!   start-up does not), sleeping in `epoll_wait` as without polling,
//!   where a wake-up preempts the neighbour. A
//!   neighbour that never yields soon costs one time slice per
//!   [`BACKOFF_NS`]; a one-off long yield (a program starting) costs a
//!   millisecond of polling, not 100 ms of wake-ups (`ib_send_lat` 64 B
//!   between two daemons over AF_PACKET, alternating runs: 10–21 µs
//!   typical with a fixed 100 ms pause, 6.3–9.9 µs with this).
//! - A session lasts at most [`SESSION_MAX_NS`], and ends at once when
//!   another thread waits for the data path (a vhost-user request of the
//!   frontend: memory table, ring stop; a stats reader), so neither waits
//!   behind a busy worker; the worker's exit event is seen at the next
//!   `epoll_wait`.
//! - A stopped or lost device ([`DataPath::stop`], [`DataPath::lost`]),
//!   or one the driver has not used yet, is not polled.
//! - The control queue is never polled: commands are the slow path (one
//!   `REG_MR` can cost milliseconds), served by each function's own
//!   worker when its driver kicks, with the queue's notifications on all
//!   the time. So the daemon's poller never runs another function's
//!   commands ([`crate::poll_group`]: a frontend flooding its control queue
//!   costs the others nothing but the CPU its own worker takes, as any
//!   thread), and a session ends as soon as its own control queue has a
//!   command, which the worker then serves at its next wake-up (the kick
//!   is waiting in its epoll set).

use std::sync::atomic::{AtomicUsize, Ordering};

use vhost_user_backend::VringT;
use virtio_queue::QueueT;
use vm_memory::GuestAddressSpace;
use vrnic::abi;
use vrnic::device::Nanos;
use vrnic::link::{LinkSetting, Polling};

pub use crate::backoff::{Backoff, BACKOFF_MIN_NS};
use crate::datapath::{DataPath, Vring};
use crate::memory::GuestMem;

/// Default polling budget after the last work found, nanoseconds (50 µs:
/// a few round trips of a busy 64-byte ping-pong through vrnic, ≈6–8 µs
/// each here). `vrnic --poll-us 0` turns polling off.
pub const DEFAULT_POLL_NS: Nanos = 50_000;
/// Longest polling session before the worker goes back to `epoll_wait`
/// (where its other events, such as the exit event, are seen),
/// nanoseconds.
pub const SESSION_MAX_NS: Nanos = 2_000_000;
/// A `sched_yield` that kept the worker off the core this long shows a
/// neighbour that does not yield, nanoseconds (100 µs: a yielding poller
/// gives the core back within a few µs; a time slice is ≥ 700 µs).
pub const LONG_YIELD_NS: Nanos = 100_000;
/// Longest pause in polling after [`LONG_YIELD_NS`] yields ([`Backoff`]),
/// nanoseconds (100 ms: one lost time slice per 100 ms at most).
pub const BACKOFF_NS: Nanos = 100_000_000;

/// Most rounds `DataPath::serve_late` serves before the worker sleeps
/// (a driver posting without pause keeps waking it anyway).
pub const LATE_ROUNDS: u32 = 4;

/// How a worker polls (`DataPath::spin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollConfig {
    /// Polling budget after the last work found, nanoseconds; 0: the
    /// worker never polls.
    pub budget_ns: Nanos,
    /// Longest pause in polling after yields of [`LONG_YIELD_NS`] or more
    /// ([`Backoff`]), nanoseconds; 0: no pause.
    pub backoff_ns: Nanos,
}

impl Default for PollConfig {
    /// [`DEFAULT_POLL_NS`] and [`BACKOFF_NS`].
    fn default() -> Self {
        Self {
            budget_ns: DEFAULT_POLL_NS,
            backoff_ns: BACKOFF_NS,
        }
    }
}

impl DataPath {
    /// Polls the device's queues, link and timer until `cfg.budget_ns` pass
    /// without work, [`SESSION_MAX_NS`] pass in all, or `waiters` is
    /// non-zero (another thread wants the data path). See the module.
    /// `vrings` are all the device's vrings, indexed by queue number;
    /// `after` runs after each round that found work and once after the
    /// session's closing serve (the backend publishes the counters, as
    /// after each wake-up).
    pub(crate) fn spin(
        &mut self,
        vrings: &[Vring],
        cfg: PollConfig,
        waiters: &AtomicUsize,
        after: &mut dyn FnMut(&mut DataPath),
        others: &mut dyn FnMut() -> bool,
    ) {
        if cfg.budget_ns == 0 || !self.serving() || self.spin_backoff.active(self.now()) {
            return;
        }
        let Some((ctrl, db)) = ctrl_db(vrings) else {
            return;
        };
        // Notifications off from the start: a driver posting while the
        // worker polls does not kick (a kick would also wake the worker
        // once more after the session, for nothing).
        self.notifications_off(db, Polling::Own);
        let start = self.now();
        let mut last_work = start;
        self.stats.poll_sessions += 1;
        // When the last round yielded: its start (an idle round is short,
        // so the time from it to the next round's start is the yield's).
        let mut yielded_at: Option<Nanos> = None;
        // The session polled SESSION_MAX_NS with every yield short: no
        // neighbour that keeps the core shares it now.
        let mut calm = false;
        loop {
            let now = self.now();
            if yielded_at
                .take()
                .is_some_and(|y| now.saturating_sub(y) >= LONG_YIELD_NS)
            {
                // A thread that does not yield shares this core: stop
                // polling for a while (see the module).
                self.spin_backoff.long_yield(now, cfg.backoff_ns);
                self.stats.poll_backoffs += 1;
                break;
            }
            if self.has_avail(ctrl) {
                // A command: served at the next wake-up (its kick waits).
                break;
            }
            let mut work = self.poll_round(db, now);
            if work {
                self.after_work(vrings);
                after(self);
            }
            work |= others();
            if work {
                // The idle rounds before this work are polling's cost.
                self.stats.poll_idle_ns += now.saturating_sub(last_work);
                last_work = self.now();
            } else if now.saturating_sub(last_work) >= cfg.budget_ns {
                break;
            }
            if now.saturating_sub(start) >= SESSION_MAX_NS {
                calm = true;
                break;
            }
            if waiters.load(Ordering::Relaxed) > 0 || self.lost() {
                break;
            }
            if !work {
                std::hint::spin_loop();
                // SAFETY: no arguments; it cannot fail on Linux.
                unsafe { libc::sched_yield() };
                yielded_at = Some(now);
            }
        }
        if calm {
            self.spin_backoff.calm();
        }
        self.stats.poll_idle_ns += self.now().saturating_sub(last_work);
        self.notifications_on(vrings);
        after(self);
    }

    /// Polling mode on, by `who` (the worker itself or the poller): the
    /// driver's doorbell notifications off (virtio 1.2 §2.7.7
    /// `VIRTQ_USED_F_NO_NOTIFY`; with `VIRTIO_F_EVENT_IDX` the avail event
    /// is simply not moved, §2.7.10), `spinning` set so the doorbell
    /// queue's service leaves them off, and the link told
    /// ([`vrnic::link::LinkSetting::Polling`]: a switch port's senders then
    /// write no eventfd). The control queue's stay on (see the module).
    fn notifications_off(&mut self, db: &Vring, who: Polling) {
        if let Err(e) = db.disable_notification() {
            tracing::debug!("cannot disable notifications: {e}");
        }
        self.link.set(LinkSetting::Polling(who));
        self.device.begin_record_polling();
        self.spinning = true;
    }

    /// Polling mode off: the link readable again if frames wait, the
    /// queues (if there are both) served once more, which turns the
    /// driver's notifications back on and serves what it posted while
    /// they were off, then the device's work after it
    /// ([`DataPath::after_work`]).
    fn notifications_on(&mut self, vrings: &[Vring]) {
        self.link.set(LinkSetting::Polling(Polling::Off));
        self.spinning = false;
        // The drivers ring again: what they wrote to their QP records
        // before they could see that is taken now.
        self.end_record_polling();
        if let Some((ctrl, db)) = ctrl_db(vrings) {
            self.process_doorbells(db);
            self.process_control(ctrl);
        }
        self.after_work(vrings);
    }

    /// One polling round: the doorbell queue, the QP records, the link
    /// and the timer (as of `now`), not the control queue (see the
    /// module); whether it found work. The caller runs
    /// [`DataPath::after_work`] after a round that did.
    pub(crate) fn poll_round(&mut self, db: &Vring, now: Nanos) -> bool {
        let mut work = false;
        if self.has_avail(db) {
            self.process_doorbells(db);
            work = true;
        }
        if self.device.watching_records() {
            work |= self.poll_records(now);
        }
        let (frames, _) = self.receive_counted();
        work |= frames > 0;
        if self.deadline_passed(now) {
            self.on_timer();
            work = true;
        }
        work
    }

    /// Adopted by its poll group's poller ([`crate::poll_group`]): the
    /// driver's doorbell notifications off, as in the poller's own session
    /// (its commands still kick its own worker). False
    /// (not adopted) when the device is not served or already polled.
    pub(crate) fn adopt(&mut self, vrings: &[Vring]) -> bool {
        let Some((_, db)) = ctrl_db(vrings) else {
            return false;
        };
        if self.spinning || !self.serving() {
            return false;
        }
        self.notifications_off(db, Polling::Other);
        self.stats.poll_adopted += 1;
        true
    }

    /// One round of an adopted device ([`DataPath::poll_round`] and, after
    /// work, [`DataPath::after_work`]); whether it found work.
    pub(crate) fn poll_adopted(&mut self, vrings: &[Vring]) -> bool {
        let Some((_, db)) = ctrl_db(vrings) else {
            return false;
        };
        if !self.spinning || !self.serving() {
            return false;
        }
        let now = self.now();
        let work = self.poll_round(db, now);
        if work {
            self.after_work(vrings);
        }
        work
    }

    /// The poller gives an adopted device back to its worker: notifications
    /// on, and what came while they were off served (as at the end of
    /// [`DataPath::spin`]).
    pub(crate) fn release(&mut self, vrings: &[Vring]) {
        self.notifications_on(vrings);
    }

    /// Serves what the driver made available on the doorbell and control
    /// queues while the worker was busy, just before it sleeps: up to
    /// [`LATE_ROUNDS`] rounds, each followed by `after` (the backend
    /// publishes the counters). Returns the number of rounds that found
    /// chains.
    ///
    /// The notification protocol (virtio 1.2 §2.7.10, the serve loop's
    /// re-enable and re-check) should make a driver kick for any such
    /// chain, but between two TCG guests a doorbell was seen left without
    /// a kick: `ib_send_lat -n 5000` stalled until an unrelated wake-up
    /// (the next ARP, ~30 s later) in 5 of 6 runs, with and without
    /// polling, and in none of 3 with this check (2026-11-25). The likely
    /// cause, found later: guest-lib's barrier before reading
    /// `VIRTQ_USED_F_NO_NOTIFY` was a `lock or`, which TCG runs without a
    /// host barrier for a one-vCPU guest (`guest-lib/src/barrier.rs` has
    /// used `mfence` since). This check stays for drivers with the same
    /// mistake: a chain found here is served at once, and the kick that
    /// may still come finds nothing.
    pub(crate) fn serve_late(
        &mut self,
        vrings: &[Vring],
        after: &mut dyn FnMut(&mut DataPath),
    ) -> u32 {
        let Some((ctrl, db)) = ctrl_db(vrings) else {
            return 0;
        };
        let mut rounds = 0;
        // A pass stopped at its bound has its next wake-up armed already:
        // the rest waits for it, so the worker lets go of the data path.
        while rounds < LATE_ROUNDS && self.serving() && !self.queue_more() {
            let (late_db, late_ctrl) = (self.has_avail(db), self.has_avail(ctrl));
            if !late_db && !late_ctrl {
                break;
            }
            tracing::debug!(
                late_db,
                late_ctrl,
                "chains made available while the worker was busy"
            );
            self.stats.late_chains += 1;
            if late_db {
                self.process_doorbells(db);
            }
            if late_ctrl {
                self.process_control(ctrl);
            }
            self.after_work(vrings);
            after(self);
            rounds += 1;
        }
        rounds
    }

    /// [`vrnic::device::Device::poll_records`] in the driver's memory
    /// as of now: whether a QP record held new work requests.
    fn poll_records(&mut self, now: Nanos) -> bool {
        let guard = self.memory().memory();
        self.device.poll_records(&GuestMem::new(&guard), now)
    }

    /// [`vrnic::device::Device::end_record_polling`] in the driver's memory.
    fn end_record_polling(&mut self) {
        let now = self.now();
        let guard = self.memory().memory();
        self.device.end_record_polling(&GuestMem::new(&guard), now);
    }

    /// Whether the device serves its queues now: the driver has used it
    /// since the last reset, and it is neither stopped nor lost.
    fn serving(&self) -> bool {
        self.running() && !self.stopped() && !self.lost()
    }

    /// Whether `vring` is live and the driver made chains available that
    /// the device has not taken (the avail index read from guest memory).
    fn has_avail(&self, vring: &Vring) -> bool {
        let guard = self.memory().memory();
        let state = vring.get_ref();
        let q = state.get_queue();
        if !q.ready() || !state.is_enabled() {
            return false;
        }
        q.avail_idx(&*guard, Ordering::Acquire)
            .is_ok_and(|idx| idx.0 != q.next_avail())
    }
}

/// The control and doorbell queues among `vrings` (indexed by queue
/// number), in that order.
fn ctrl_db(vrings: &[Vring]) -> Option<(&Vring, &Vring)> {
    Some((
        vrings.get(usize::from(abi::CONTROLQ))?,
        vrings.get(usize::from(abi::DOORBELLQ))?,
    ))
}
