//! The data path: everything the backend's single worker thread does with
//! the three virtqueues, the link and the timer, in terms of the
//! transport-agnostic [`vrnic::device::Device`].
//!
//! Queue handling follows virtio 1.2 §2.7 (split virtqueues) with the
//! notification suppression of §2.7.7 and §2.7.10 (`VIRTIO_F_EVENT_IDX`):
//! every pass over a queue runs "disable notifications, drain, re-enable,
//! re-check" so no kick is lost whichever scheme was negotiated.
//!
//! Nothing here trusts the driver: descriptor addresses and lengths go
//! through bounds-checked memory ([`crate::memory::GuestMem`]), and a chain
//! the device cannot use is completed with 0 bytes used and counted in
//! [`BackendStats`].

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use std::sync::Arc;

use tracing::{debug, error, info, warn};
use vhost_user_backend::{ShutdownHandle, VringT};
use virtio_queue::{DescriptorChain, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vrnic::abi::{self, Pod};
use vrnic::device::{Device, Nanos};
use vrnic::link::{Link, LinkSetting, Polling, TxFlush};

pub use crate::backend_stats::BackendStats;
use crate::chain::{self, Segment};
use crate::fault::Fault;
use crate::memory::{GuestMem, Poison};
use crate::stats::{Snapshot, StatsBoard};
use crate::timer::Timer;

/// The vring type the backend uses ([`crate::vring`]).
pub use crate::vring::Vring;

/// Worker event id of the link's descriptor (ids `0..NUM_QUEUES` are the
/// queues, `NUM_QUEUES` is reserved by vhost-user-backend for its exit and
/// vring-enable events).
pub const LINK_EVENT: u16 = abi::NUM_QUEUES as u16 + 1;
/// Worker event id of the device timer.
pub const TIMER_EVENT: u16 = abi::NUM_QUEUES as u16 + 2;

/// Largest control request or response the device handles, bytes: a
/// header and [`abi::MAX_CMD_BODY`].
pub const MAX_CONTROL_MSG: usize = abi::MAX_CMD_BODY + 8;
/// Frames received from the link per readiness event, at most.
pub const RX_BATCH: usize = 64;
/// While a frame waits for a full link ([`TxFlush`]), the worker tries
/// again this soon (ns) even without another wake-up: 50 µs, a few frame
/// times.
pub const TX_RETRY_NS: Nanos = 50_000;
/// Receive buffer size, bytes: the largest frame accepted from the link
/// (9000-byte MTU plus Ethernet and VLAN headers, with room to spare).
pub const RX_BUF_SIZE: usize = 16 * 1024;
/// Events kept for the driver while the event queue has no buffers; the
/// oldest events are kept, later ones are dropped and counted.
pub const MAX_PENDING_EVENTS: usize = 1024;
/// How often a link without a pollable descriptor is polled, nanoseconds.
pub const LINK_POLL_INTERVAL_NS: Nanos = 1_000_000;
/// Most chains one pass over a queue serves (`DataPath::serve_queue`):
/// a full ring of the largest size. A driver that keeps moving its avail
/// index ahead (virtio-queue reads it again at every pop) cannot keep the
/// worker, or the daemon's poller, in one pass.
pub const PASS_CHAINS_MAX: usize = abi::MAX_QUEUE_SIZE as usize;
/// Time after which a pass over a queue serves no further chain,
/// nanoseconds (the chain in hand is finished): a command can cost
/// milliseconds (`REG_MR` of 2^19 pages), and the worker's other queues
/// and functions wait meanwhile.
pub const PASS_BUDGET_NS: Nanos = 1_000_000;
// A control pass that stops at its bound is followed by a pause as long as
// it ([`DataPath::take_queue_more`]).
/// Device poll rounds per worker wake-up before yielding to other events.
const POLL_ROUNDS: usize = 16;
/// Shortest interval between two publishes of the per-QP counters to the
/// stats board, nanoseconds (10 ms): copying the table is O(number of QPs),
/// too much for every wake-up. A change is published at most this late,
/// also when the worker has nothing else to do (the timer fires for it).
pub const QP_STATS_INTERVAL_NS: Nanos = 10_000_000;
/// Retry delay when a stats reader held the per-QP table, nanoseconds.
const QP_STATS_RETRY_NS: Nanos = 1_000_000;

/// The data-path state: the device, its link, its timer and the event
/// backlog. Owned by the backend, used by its worker thread.
pub struct DataPath {
    pub(crate) device: Device,
    pub(crate) link: Box<dyn Link>,
    /// The link's descriptor ([`vrnic::link::LinkCaps::fd`]), kept: asked
    /// for at every wake-up.
    pub(crate) link_fd: Option<RawFd>,
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    /// Whether `mem` still stands (none for an empty table): lost when an
    /// access to it faulted ([`crate::fault`]).
    poison: Option<Arc<Poison>>,
    /// The frontend's connection, closed when its memory is lost
    /// (`DataPath::memory_fault`).
    conn: Option<ShutdownHandle>,
    timer: Timer,
    /// Deadline the timer is armed for, device time.
    armed: Option<Nanos>,
    epoch: Instant,
    pending_events: VecDeque<abi::Event>,
    segs: Vec<Segment>,
    req: [u8; MAX_CONTROL_MSG],
    resp: [u8; MAX_CONTROL_MSG],
    rx_buf: Vec<u8>,
    /// The last receive stopped at [`RX_BATCH`] frames: the link may hold
    /// more that its descriptor does not show (frames it read ahead), so
    /// the worker receives again at its next wake-up, which it arms at
    /// once ([`DataPath::after_work`]).
    rx_more: bool,
    /// A pass over the doorbell queue stopped at its bound
    /// ([`PASS_CHAINS_MAX`], [`PASS_BUDGET_NS`]) with chains left: it is
    /// served again at the worker's next wake-up, which is armed at once.
    db_more: bool,
    /// A pass over the control queue stopped at its bound with commands
    /// left: it is served again from this device time on, as long after
    /// the pass as the pass took, so a flood of slow commands takes at
    /// most half of the worker's time (a NIC's command interface has a
    /// rate too).
    ctrl_more_at: Option<Nanos>,
    /// A frame the link was too full to take, sent first next time.
    txq: TxFlush,
    /// The driver has used a queue since the last reset.
    running: bool,
    /// The frontend stopped the control queue of the device in use
    /// ([`DataPath::stop`]); the device keeps its state but does nothing
    /// until the queue restarts ([`DataPath::hold_while_stopped`]).
    stopped: bool,
    /// The control queue's next available index after the last command
    /// served (what `GET_VRING_BASE` reports; 0 after a reset).
    ctrl_next_avail: u16,
    /// The queues' start indices were checked since the last reset
    /// ([`DataPath::check_driver`]).
    checked: bool,
    /// The driver's state belongs to another backend: commands fail with
    /// `STATUS_ENODEV`, doorbells are ignored, until a reset.
    lost: bool,
    pub(crate) stats: BackendStats,
    /// The counters as of the last per-QP publish.
    qp_stats_seen: Option<Snapshot>,
    /// Earliest device time of the next per-QP publish.
    qp_stats_next: Nanos,
    /// A per-QP publish is owed at this device time (the timer is armed
    /// for it).
    qp_stats_due: Option<Nanos>,
    /// The worker is polling ([`crate::spin`]): queues drained leave the
    /// driver's notifications off.
    pub(crate) spinning: bool,
    /// When the worker pauses its polling ([`crate::spin`]).
    pub(crate) spin_backoff: crate::backoff::Backoff,
}

impl DataPath {
    /// A data path for `device` on `link`, with an empty memory table.
    ///
    /// # Errors
    /// Creating the timerfd failed.
    pub fn new(mut device: Device, link: Box<dyn Link>) -> io::Result<Self> {
        // Frames to the other functions of the daemon need no ICRC.
        let caps = link.caps();
        device.set_local_macs(caps.local_macs);
        // No driver until a frontend sets its memory table.
        let mut link = link;
        link.set(LinkSetting::Attended(false));
        Ok(Self {
            device,
            link,
            link_fd: caps.fd,
            mem: GuestMemoryAtomic::new(GuestMemoryMmap::new()),
            poison: None,
            conn: None,
            timer: Timer::new()?,
            armed: None,
            epoch: Instant::now(),
            pending_events: VecDeque::new(),
            segs: Vec::new(),
            req: [0; MAX_CONTROL_MSG],
            resp: [0; MAX_CONTROL_MSG],
            rx_buf: vec![0; RX_BUF_SIZE],
            rx_more: false,
            db_more: false,
            ctrl_more_at: None,
            txq: TxFlush::new(),
            running: false,
            stopped: false,
            ctrl_next_avail: 0,
            checked: false,
            lost: false,
            stats: BackendStats::default(),
            qp_stats_seen: None,
            qp_stats_next: 0,
            qp_stats_due: None,
            spinning: false,
            spin_backoff: crate::backoff::Backoff::default(),
        })
    }

    /// The timer descriptor (readable when the device's deadline passed).
    pub fn timer(&self) -> &Timer {
        &self.timer
    }

    /// Device time: nanoseconds on the monotonic clock since the data path
    /// was made.
    pub fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Replaces the memory table (vhost-user `SET_MEM_TABLE`), and shares
    /// it with the daemon's other functions through the link
    /// ([`LinkSetting::Memory`]; an empty table withdraws it). The table is
    /// registered for [`crate::memory::blame`], the old one forgotten.
    pub fn set_memory(&mut self, mem: GuestMemoryAtomic<GuestMemoryMmap>) {
        use vm_memory::GuestMemoryBackend;
        if let Some(old) = self.poison.take() {
            crate::memory::unregister(&old);
        }
        let table = mem.memory();
        let shared: Option<Arc<dyn vrnic::data::PeerMemory>> =
            (table.num_regions() > 0).then(|| {
                let poison = Arc::new(Poison::default());
                crate::memory::register(&table, &poison);
                self.poison = Some(poison.clone());
                Arc::new(crate::memory::SharedMemory::new(mem.clone(), poison)) as _
            });
        drop(table);
        self.link.set(LinkSetting::Attended(shared.is_some()));
        self.link.set(LinkSetting::Memory(shared));
        self.mem = mem;
    }

    /// The connection of the frontend being served (none between
    /// connections), closed if its memory is lost.
    pub fn set_connection(&mut self, conn: Option<ShutdownHandle>) {
        self.conn = conn;
    }

    /// After work on this data path inside [`crate::fault::catch`]: blames
    /// a caught fault on the memory it hit ([`crate::memory::blame`]; on
    /// this function's own when it hit no registered table), then, if this
    /// function's memory is lost, answers it (`DataPath::memory_fault`).
    /// Whether it was lost.
    pub fn check_memory(&mut self, fault: Option<Fault>) -> bool {
        if let Some(f) = fault {
            if !crate::memory::blame(f) {
                match &self.poison {
                    Some(p) => p.set_lost(),
                    None => {
                        // No table: nothing of this function to reset but
                        // the device; the fault is counted all the same.
                        self.memory_fault(f.addr);
                        return true;
                    }
                }
            }
        }
        let lost = self.poison.as_ref().is_some_and(|p| p.lost());
        if lost {
            self.memory_fault(fault.map_or(0, |f| f.addr));
        }
        lost
    }

    /// The frontend's memory lost its backing under the daemon (see
    /// [`crate::fault`]): counts it (`memory_faults`), resets the device,
    /// drops the memory table (the queues stop: nothing is read from it
    /// again) and closes the frontend's connection, whose end the server
    /// handles as any other disconnection. The daemon's other functions
    /// carry on; reads of this memory by their workers fail from now on.
    pub(crate) fn memory_fault(&mut self, addr: usize) {
        self.stats.memory_faults += 1;
        error!(
            host_addr = format_args!("{addr:#x}"),
            "the frontend's memory lost its backing (a region's file shrunk after SET_MEM_TABLE, \
             or its huge pages ran out): device reset, memory table dropped, connection closed"
        );
        self.reset();
        self.set_memory(GuestMemoryAtomic::new(GuestMemoryMmap::new()));
        if let Some(c) = self.conn.take() {
            c.shutdown();
        }
    }

    /// After an engine panic caught around work on this data path: counts
    /// it (`engine_panics`) and resets the device ([`DataPath::reset`]).
    pub(crate) fn reset_after_panic(&mut self) {
        self.stats.engine_panics += 1;
        self.reset();
    }

    /// The memory table (the last `SET_MEM_TABLE`).
    pub fn memory(&self) -> &GuestMemoryAtomic<GuestMemoryMmap> {
        &self.mem
    }

    /// Resets the device (virtio 1.2 §2.4) and drops the event backlog.
    pub fn reset(&mut self) {
        self.device.reset();
        self.pending_events.clear();
        self.armed = None;
        if let Err(e) = self.timer.disarm() {
            warn!("cannot disarm the device timer: {e}");
        }
        self.timer.clear();
        self.running = false;
        self.stopped = false;
        self.db_more = false;
        self.ctrl_more_at = None;
        self.ctrl_next_avail = 0;
        self.checked = false;
        self.lost = false;
        // A panic caught while the worker polled ends here: the queues must
        // not stay in polling mode (notifications left off for good).
        self.spinning = false;
        // Given back, if the daemon's poller had it (crate::poll_group).
        self.link.set(LinkSetting::Polling(Polling::Off));
        self.stats.device_resets += 1;
        self.qp_stats_due = None;
    }

    /// Publishes the per-QP counters to `board` if they may have changed
    /// since the last time, at most once per [`QP_STATS_INTERVAL_NS`].
    /// `snap` holds the device and backend counters just published: every
    /// per-QP change (a packet, a NAK, a QP created or destroyed, a reset)
    /// moves one of them, so an unchanged `snap` means an unchanged table.
    /// A publish held back by the interval, or by a reader holding the
    /// table, is owed and the timer is armed for it. With `wait`, publishes
    /// now and waits for a reader (for callers other than the worker).
    pub(crate) fn publish_qp_stats(&mut self, board: &StatsBoard, snap: &Snapshot, wait: bool) {
        if self.qp_stats_seen.as_ref() == Some(snap) {
            return;
        }
        let now = self.now();
        let due = if wait || now >= self.qp_stats_next {
            let device = &self.device;
            let published = if wait {
                board.replace_qps(|v| device.qp_stats_into(v));
                true
            } else {
                board.publish_qps(|v| device.qp_stats_into(v))
            };
            if published {
                self.qp_stats_seen = Some(*snap);
                self.qp_stats_next = now.saturating_add(QP_STATS_INTERVAL_NS);
                self.qp_stats_due = None;
                return;
            }
            now.saturating_add(QP_STATS_RETRY_NS)
        } else {
            self.qp_stats_next
        };
        if self.qp_stats_due != Some(due) {
            self.qp_stats_due = Some(due);
            let next = self.armed.map_or(due, |d| d.min(due));
            self.arm(Some(next), now);
        }
    }

    /// Whether the driver has used the control or doorbell queue since the
    /// last reset.
    pub fn running(&self) -> bool {
        self.running
    }

    /// Serves the control queue: every available chain is one command,
    /// `[CmdHeader + body (readable)][RespHeader + body (writable)]`.
    pub fn process_control(&mut self, vring: &Vring) {
        // After a pass that stopped at its bound, nothing until its pause
        // is over, whoever asks (a kick, the poller's give-back): the
        // timer is armed for it.
        if let Some(at) = self.ctrl_more_at {
            if at > self.now() {
                return;
            }
            self.ctrl_more_at = None;
        }
        // Never polled: its notifications stay on (crate::spin).
        self.serve_queue(vring, Self::control_chain, false, true);
        self.ctrl_next_avail = vring.queue_next_avail();
    }

    /// The frontend stopped the control queue (`GET_VRING_BASE`). QEMU does
    /// that when the VM pauses (`stop`) and when the guest resets the
    /// device, and the two cannot be told apart until the queue restarts
    /// (vhost-user spec, "Ring states"; QEMU's `vhost_dev_stop`). So a
    /// device in use keeps its state, but stops touching guest memory and
    /// the link: frames that arrive are dropped (peers retransmit, as to a
    /// paused guest running rxe), timers wait. [`DataPath::hold_while_stopped`]
    /// decides at the restart. A device not in use is simply reset.
    pub fn stop(&mut self) {
        if !self.running {
            self.reset();
            return;
        }
        self.stopped = true;
        self.stats.device_stops += 1;
        self.armed = None;
        if let Err(e) = self.timer.disarm() {
            warn!("cannot disarm the device timer: {e}");
        }
        self.timer.clear();
    }

    /// Whether the device is stopped ([`DataPath::stop`]) and not yet
    /// restarted.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// To be called first for every worker event. While the device is
    /// stopped and the control queue is not live again, drains the link
    /// (frames dropped, counted in `rx_dropped_stopped`), silences the
    /// timer and returns true: nothing else may run. Once the control queue
    /// is live again, decides and returns false:
    /// - it restarted at the index where it stopped (not 0): a VM resumed
    ///   (QEMU's `vhost_dev_start` passes back the `GET_VRING_BASE` value),
    ///   so the device carries on with every object it had;
    /// - otherwise the driver re-initialised the queue (a device reset, a
    ///   new driver): the device is reset first. A control queue that
    ///   stopped at index 0 after exactly a multiple of 65,536 commands is
    ///   taken for a reset too (the indices are 16-bit).
    pub fn hold_while_stopped(&mut self, event: u16, vrings: &[Vring]) -> bool {
        if !self.stopped {
            return false;
        }
        match vrings.get(usize::from(abi::CONTROLQ)) {
            Some(ctrl) if queue_live(ctrl) => {
                let base = ctrl.queue_next_avail();
                if base != 0 && base == self.ctrl_next_avail {
                    self.stopped = false;
                    self.stats.device_resumes += 1;
                    info!(
                        base,
                        "control queue restarted where it stopped: device resumed"
                    );
                } else {
                    info!(
                        base,
                        stopped_at = self.ctrl_next_avail,
                        "control queue re-initialised: resetting the device"
                    );
                    self.reset();
                }
                false
            }
            _ => {
                if event == LINK_EVENT {
                    self.drop_rx();
                } else if event == TIMER_EVENT {
                    self.timer.clear();
                }
                true
            }
        }
    }

    /// To be called for every worker event, before
    /// [`DataPath::hold_while_stopped`]. The first time after a reset that
    /// the control queue is live, before the device served any chain,
    /// checks where the queues start: a driver
    /// that initialised them starts both the control and the doorbell queue
    /// at index 0 (virtio 1.2 §2.7). Any other start index means the driver
    /// set the device up against an earlier backend, whose objects this one
    /// never had: QEMU re-sends the whole vhost-user setup with the queues'
    /// last indices to a backend that (re)connects (`vhost_dev_start`;
    /// vhost-user spec, "Ring states"). The device is then *lost* (device
    /// spec §5.x.9): it raises `EV_DEVICE_FATAL`, answers every command
    /// with `STATUS_ENODEV` and ignores doorbells, so no handle of the
    /// earlier backend reaches the engine, until the driver resets it.
    pub fn check_driver(&mut self, vrings: &[Vring]) {
        if self.checked || self.stopped {
            return;
        }
        if self.running {
            // It served chains since the reset: the indices it sees now are
            // its own (the start was index 0, or it would be lost).
            self.checked = true;
            return;
        }
        let Some(ctrl) = vrings.get(usize::from(abi::CONTROLQ)) else {
            return;
        };
        if !queue_live(ctrl) {
            return;
        }
        self.checked = true;
        let ctrl_base = ctrl.queue_next_avail();
        // The doorbell queue counts if QEMU has started it already (it
        // starts the queues one after the other).
        let db_base = vrings
            .get(usize::from(abi::DOORBELLQ))
            .filter(|v| queue_live(v))
            .map_or(0, |v| v.queue_next_avail());
        if ctrl_base == 0 && db_base == 0 {
            return;
        }
        warn!(
            ctrl_base,
            db_base,
            "the driver's queues start where another backend left them: \
             device lost until the driver resets it"
        );
        self.lost = true;
        self.stats.device_lost += 1;
        // Raised before any command of that driver is served.
        self.pending_events.push_front(abi::Event {
            kind: abi::EV_DEVICE_FATAL,
            ctx: abi::ALL_CTX,
            ..Default::default()
        });
    }

    /// Whether the device is lost ([`DataPath::check_driver`]).
    pub fn lost(&self) -> bool {
        self.lost
    }

    /// Reads and drops up to [`RX_BATCH`] frames (the device is stopped).
    fn drop_rx(&mut self) {
        for _ in 0..RX_BATCH {
            match self.link.recv(&mut self.rx_buf) {
                Ok(Some(_)) => self.stats.rx_dropped_stopped += 1,
                Ok(None) | Err(_) => return,
            }
        }
    }

    /// Serves the doorbell queue: every available chain carries one 16-byte
    /// [`abi::Doorbell`] in its readable part.
    pub fn process_doorbells(&mut self, vring: &Vring) {
        let polled = self.spinning;
        self.serve_queue(vring, Self::doorbell_chain, polled, false);
    }

    /// Receives up to [`RX_BATCH`] frames from the link into the device.
    /// Returns whether the batch was full (more frames may be waiting).
    pub fn receive(&mut self) -> bool {
        self.receive_counted().1
    }

    /// [`DataPath::receive`], also returning how many frames it took.
    pub(crate) fn receive_counted(&mut self) -> (usize, bool) {
        let (n, more) = self.receive_batch();
        self.rx_more = more;
        (n, more)
    }

    /// Whether the last receive stopped at its bound ([`RX_BATCH`]).
    pub(crate) fn rx_more(&self) -> bool {
        self.rx_more
    }

    /// Whether a queue pass stopped at its bound and waits to be served
    /// again (its wake-up is armed).
    pub(crate) fn queue_more(&self) -> bool {
        self.db_more || self.ctrl_more_at.is_some()
    }

    /// Which queues' last pass stopped at its bound: `(doorbell,
    /// control)`; the doorbell queue's is taken (the control queue's pause
    /// is [`DataPath::process_control`]'s to keep).
    pub(crate) fn take_queue_more(&mut self) -> (bool, bool) {
        (
            std::mem::take(&mut self.db_more),
            self.ctrl_more_at.is_some(),
        )
    }

    fn receive_batch(&mut self) -> (usize, bool) {
        let guard = self.mem.memory();
        let mem = GuestMem::new(&guard);
        // One clock read per batch, not per frame (a batch lasts tens of
        // µs; the device's timers are in ms), taken when the first frame
        // comes: an empty poll reads no clock.
        let mut now = None;
        for i in 0..RX_BATCH {
            let (device, epoch) = (&mut self.device, self.epoch);
            // From the link's own buffer where it has one (the switch).
            let got = self.link.recv_with(&mut self.rx_buf, &mut |frame, icrc| {
                let t = *now.get_or_insert_with(|| epoch.elapsed().as_nanos() as Nanos);
                device.receive_frame(&mem, frame, icrc, t)
            });
            match got {
                Ok(true) => {}
                Ok(false) => return (i, false),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    return (i, false)
                }
                Err(e) => {
                    self.stats.link_rx_errors += 1;
                    debug!("link receive failed: {e}");
                    return (i, false);
                }
            }
        }
        (RX_BATCH, true)
    }

    /// Whether the deadline the timer is armed for has passed by `now`.
    pub(crate) fn deadline_passed(&self, now: Nanos) -> bool {
        self.armed.is_some_and(|d| d <= now)
    }

    /// The timer fired: consumes the expiry. The deadline's work runs in
    /// [`DataPath::after_work`].
    pub fn on_timer(&mut self) {
        self.timer.clear();
        self.armed = None;
    }

    /// Runs after every wake-up of the worker: polls the device (timers,
    /// pending sends), hands its frames to the link, delivers its events to
    /// the event queue and arms the timer for its next deadline.
    ///
    /// `vrings` are all the device's vrings, indexed by queue number.
    /// While the link may still hold frames (the last receive stopped at
    /// its bound, `DataPath::rx_more`) every pass arms the worker's next
    /// wake-up at once.
    pub fn after_work(&mut self, vrings: &[Vring]) {
        let more_rx = self.rx_more;
        let guard = self.mem.memory();
        let mem = GuestMem::new(&guard);
        let mut next = None;
        // One clock read for the pass (it takes microseconds; the device's
        // deadlines are a millisecond or more apart): a read costs
        // ≈ 30 ns here, and a poller makes this pass after every round
        // that found work, for itself and every function it serves.
        let now = self.now();
        for _ in 0..POLL_ROUNDS {
            self.flush_tx(now);
            next = self.device.poll(&mem, now);
            match next {
                Some(d) if d <= now => continue,
                _ => break,
            }
        }
        self.flush_tx(now);

        while let Some(ev) = self.device.pop_event() {
            if self.pending_events.len() >= MAX_PENDING_EVENTS {
                self.stats.events_dropped += 1;
            } else {
                self.pending_events.push_back(ev);
            }
        }
        if let Some(evq) = vrings.get(abi::EVENTQ as usize) {
            self.deliver_events(evq, &mem);
        }

        if self.link_fd.is_none() || more_rx {
            let poll_at = now + if more_rx { 0 } else { LINK_POLL_INTERVAL_NS };
            next = Some(next.map_or(poll_at, |d| d.min(poll_at)));
        }
        // An owed per-QP publish keeps its deadline; one due now is made
        // by the publish that follows this wake-up.
        if let Some(due) = self.qp_stats_due.filter(|&d| d > now) {
            next = Some(next.map_or(due, |d| d.min(due)));
        }
        if self.db_more {
            next = Some(now);
        }
        if let Some(at) = self.ctrl_more_at {
            next = Some(next.map_or(at, |d| d.min(at)));
        }
        if self.txq.holding() {
            let retry = now + TX_RETRY_NS;
            next = Some(next.map_or(retry, |d| d.min(retry)));
        }
        self.arm(next, now);
    }

    /// Hands the frames the device queued to the link; a frame the link is
    /// too full to take waits, first in line, for the next pass
    /// ([`TxFlush`]; the timer brings that pass within [`TX_RETRY_NS`]).
    fn flush_tx(&mut self, now: Nanos) {
        let done = self.txq.flush(&mut *self.link, &mut self.device, now);
        self.stats.link_tx_errors += (done.failed + done.given_up) as u64;
    }

    /// Arms the timer for device time `next` (`None`: disarms it), as
    /// seen at `now`.
    fn arm(&mut self, next: Option<Nanos>, now: Nanos) {
        if next == self.armed {
            return;
        }
        let r = match next {
            Some(d) => self.timer.arm(Duration::from_nanos(d.saturating_sub(now))),
            None => self.timer.disarm(),
        };
        match r {
            Ok(()) => self.armed = next,
            Err(e) => warn!("cannot arm the device timer: {e}"),
        }
    }

    /// Writes waiting events into available event-queue buffers.
    fn deliver_events(&mut self, vring: &Vring, mem: &GuestMem<'_>) {
        if self.pending_events.is_empty() || !queue_live(vring) {
            return;
        }
        let mut used_any = false;
        loop {
            let mut progress = false;
            while let Some(ev) = self.pending_events.front().copied() {
                let Some(chain) = pop_chain(vring, mem) else {
                    break;
                };
                progress = true;
                let head = chain.head_index();
                self.segs.clear();
                self.segs.extend(chain.map(segment));
                let used = self.event_chain(mem, ev);
                complete(vring, head, used);
                used_any = true;
            }
            if self.pending_events.is_empty() {
                break;
            }
            // Out of buffers with events waiting: ask for a kick when the
            // driver adds some (with EVENT_IDX this publishes avail_event),
            // then re-check for buffers added meanwhile. Stop when a pass
            // made no progress (an avail index the queue rejects would
            // otherwise loop forever).
            match vring.enable_notification() {
                Ok(true) if progress => continue,
                Ok(_) => break,
                Err(e) => {
                    debug!("cannot enable notifications: {e}");
                    break;
                }
            }
        }
        if used_any {
            signal(vring, mem.table());
        }
    }

    /// Writes `ev` into the chain in `self.segs`; pops it from the backlog
    /// when written. Returns the used length.
    fn event_chain(&mut self, mem: &GuestMem<'_>, ev: abi::Event) -> u32 {
        let writable = match chain::split(&self.segs) {
            Ok((_, w)) if chain::total_len(w) >= size_of::<abi::Event>() as u64 => w,
            _ => {
                self.stats.bad_event_buffers += 1;
                debug!("event buffer with fewer than 16 writable bytes");
                return 0;
            }
        };
        match chain::scatter(mem, writable, ev.as_bytes()) {
            Ok(n) => {
                self.pending_events.pop_front();
                self.stats.events_delivered += 1;
                n as u32
            }
            Err(e) => {
                self.stats.bad_event_buffers += 1;
                debug!("event buffer outside guest memory: {e}");
                0
            }
        }
    }

    /// Drains `vring`, calling `handle` on each chain's segments; `handle`
    /// returns the used length. Signals the driver if it asked for it.
    /// `polled`: the queue is polled (its notifications stay off until the
    /// polling session ends, [`crate::spin`]); `paced`: a pass stopped at
    /// its bound is followed by a pause as long as it (the control queue).
    fn serve_queue(
        &mut self,
        vring: &Vring,
        handle: fn(&mut Self, &GuestMem<'_>, &[Segment]) -> u32,
        polled: bool,
        paced: bool,
    ) {
        if !queue_live(vring) {
            return;
        }
        let guard = self.mem.memory();
        // No table (none yet, or dropped when it lost its backing): the
        // vring's notification flags live in the frontend's memory too.
        if vm_memory::GuestMemoryBackend::num_regions(&*guard) == 0 {
            return;
        }
        let mem = GuestMem::new(&guard);
        let mut segs = std::mem::take(&mut self.segs);
        let mut used_any = false;
        // Passes in a row that popped nothing although the queue said
        // chains were available.
        let mut idle_passes = 0;
        // The pass's bound: chains served and time spent.
        let started = self.now();
        let mut served = 0usize;
        'pass: loop {
            // While the worker polls, notifications are already off (from
            // the session's start): no write to guest memory per round.
            if !polled {
                if let Err(e) = vring.disable_notification() {
                    debug!("cannot disable notifications: {e}");
                }
            }
            let mut progress = false;
            // (`pop_chain` releases the vring lock before `complete` takes it.)
            while let Some(chain) = pop_chain(vring, &mem) {
                progress = true;
                self.running = true;
                let head = chain.head_index();
                segs.clear();
                segs.extend(chain.map(segment));
                let used = handle(self, &mem, &segs);
                complete(vring, head, used);
                used_any = true;
                served += 1;
                let now = self.now();
                let took = now.saturating_sub(started);
                if served >= PASS_CHAINS_MAX || took >= PASS_BUDGET_NS {
                    // The rest waits for a wake-up armed for it (the
                    // notifications stay off until a pass ends empty):
                    // at once for doorbells, as long after as the pass
                    // took for commands.
                    if paced {
                        self.ctrl_more_at = Some(now.saturating_add(took));
                    } else {
                        self.db_more = true;
                    }
                    break 'pass;
                }
            }
            // While the worker polls, the driver need not kick: it sees
            // notifications off. `spin` re-enables and re-checks at the end.
            if polled {
                break;
            }
            // Re-enable and re-check for chains added meanwhile. A chain
            // the driver added while notifications were off came without a
            // kick, so it must be served now even after a pass that found
            // nothing (it may have arrived just after that pass looked);
            // only a second empty pass in a row stops (an avail index the
            // queue rejects would otherwise loop forever).
            if progress {
                idle_passes = 0;
            } else {
                idle_passes += 1;
            }
            match vring.enable_notification() {
                Ok(true) if idle_passes < 2 => continue,
                Ok(true) => {
                    debug!("avail index ahead but no chain could be popped; waiting for a kick");
                    break;
                }
                Ok(false) => break,
                Err(e) => {
                    debug!("cannot enable notifications: {e}");
                    break;
                }
            }
        }
        self.segs = segs;
        if used_any {
            signal(vring, mem.table());
        }
    }

    fn control_chain(&mut self, mem: &GuestMem<'_>, segs: &[Segment]) -> u32 {
        let Ok((readable, writable)) = chain::split(segs) else {
            self.stats.rejected_chains += 1;
            debug!("control chain: readable descriptor after a writable one");
            return 0;
        };
        let cap = chain::total_len(writable).min(MAX_CONTROL_MSG as u64) as usize;
        if cap < size_of::<abi::RespHeader>() || !chain::in_memory(mem, writable, cap) {
            self.stats.rejected_chains += 1;
            debug!(cap, "control chain: no usable writable part");
            return 0;
        }
        let now = self.now();
        let resp = &mut self.resp[..cap];
        resp.fill(0);
        let n = match chain::gather(mem, readable, &mut self.req) {
            Ok(_) if self.lost => {
                self.stats.lost_requests += 1;
                let h = abi::RespHeader {
                    status: abi::STATUS_ENODEV,
                    len: 0,
                };
                resp[..8].copy_from_slice(h.as_bytes());
                8
            }
            Ok(len) => {
                self.stats.commands += 1;
                self.device
                    .control(mem, &self.req[..len], resp, now)
                    .min(cap)
            }
            Err(e) => {
                self.stats.faulted_commands += 1;
                debug!("control request outside guest memory: {e}");
                let h = abi::RespHeader {
                    status: abi::STATUS_EFAULT,
                    len: 0,
                };
                resp[..8].copy_from_slice(h.as_bytes());
                8
            }
        };
        match chain::scatter(mem, writable, &self.resp[..n]) {
            Ok(done) => done as u32,
            Err(e) => {
                // Checked above; only a memory table change could get here.
                self.stats.rejected_chains += 1;
                debug!("control response outside guest memory: {e}");
                0
            }
        }
    }

    fn doorbell_chain(&mut self, mem: &GuestMem<'_>, segs: &[Segment]) -> u32 {
        let readable = match chain::split(segs) {
            Ok((r, _)) => r,
            Err(_) => {
                self.stats.bad_doorbells += 1;
                return 0;
            }
        };
        let mut db = abi::Doorbell::default();
        match chain::gather(mem, readable, db.as_bytes_mut()) {
            Ok(_) if self.lost => self.stats.lost_requests += 1,
            Ok(n) if n == size_of::<abi::Doorbell>() => {
                self.stats.doorbells += 1;
                let now = self.now();
                self.device.doorbell(mem, &db, now);
            }
            Ok(n) => {
                self.stats.bad_doorbells += 1;
                debug!(len = n, "short doorbell");
            }
            Err(e) => {
                self.stats.bad_doorbells += 1;
                debug!("doorbell outside guest memory: {e}");
            }
        }
        0
    }
}

/// The next available chain. The vring's lock is held only inside.
fn pop_chain<'m>(
    vring: &Vring,
    mem: &GuestMem<'m>,
) -> Option<DescriptorChain<&'m GuestMemoryMmap>> {
    let mut state = vring.get_mut();
    state.get_queue_mut().pop_descriptor_chain(mem.table())
}

fn segment(d: virtio_queue::desc::split::Descriptor) -> Segment {
    Segment {
        addr: d.addr().0,
        len: d.len(),
        writable: d.is_write_only(),
    }
}

/// Whether the driver set the queue up and the frontend enabled it.
fn queue_live(vring: &Vring) -> bool {
    let state = vring.get_ref();
    state.get_queue().ready() && state.is_enabled()
}

/// `VIRTQ_AVAIL_F_NO_INTERRUPT` (virtio 1.2 §2.7.7).
const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Whether the driver wants a used-buffer notification for what was just
/// added to `queue`'s used ring. With `VIRTIO_F_EVENT_IDX`: virtio-queue's
/// `needs_notification` (`used_event`, §2.7.10). Without it: unless the
/// driver set `VIRTQ_AVAIL_F_NO_INTERRUPT` in `avail.flags` (§2.7.7.1: the
/// device SHOULD NOT notify then), which virtio-queue 0.18 does not check
/// ("isn't supported yet") — so a driver that polls a queue (guest-lib's
/// control and doorbell queues) is not interrupted for it.
fn driver_wants_interrupt(
    queue: &mut impl QueueT,
    mem: &GuestMemoryMmap,
) -> Result<bool, virtio_queue::Error> {
    if queue.event_idx_enabled() {
        return queue.needs_notification(mem);
    }
    // The used entries are written before the flag is read (§2.7.13.3.1).
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    let flags: u16 = vm_memory::Bytes::read_obj(mem, vm_memory::GuestAddress(queue.avail_ring()))
        .map_err(virtio_queue::Error::GuestMemory)?;
    Ok(u16::from_le(flags) & VIRTQ_AVAIL_F_NO_INTERRUPT == 0)
}

fn complete(vring: &Vring, head: u16, used: u32) {
    if let Err(e) = vring.add_used(head, used) {
        debug!(head, "cannot add a used element: {e}");
    }
}

fn signal(vring: &Vring, mem: &GuestMemoryMmap) {
    let wants = {
        let mut state = vring.get_mut();
        driver_wants_interrupt(state.get_queue_mut(), mem)
    };
    match wants {
        Ok(false) => {}
        Ok(true) | Err(_) => {
            if let Err(e) = vring.signal_used_queue() {
                debug!("cannot signal the driver: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read_ahead::ReadAhead;
    use virtio_queue::Queue;
    use vm_memory::{Bytes, GuestAddress};
    use vrnic::device::DeviceConfig;
    use vrnic::link::MemLink;

    /// A receive that stops at its bound with frames read ahead keeps the
    /// worker's next wake-up at once through every later pass, until a
    /// receive finds the link empty.
    #[test]
    fn frames_read_ahead_beyond_the_receive_bound_wake_the_worker_at_once() {
        let (link, mut peer) = MemLink::pair_with_depth(4 * RX_BATCH);
        let dev = Device::new(DeviceConfig {
            mac: [2, 0x76, 10, 0, 0, 1],
            ipv4: std::net::Ipv4Addr::new(10, 0, 0, 1),
            prefix_len: 24,
            ipv6: Vec::new(),
            link_mtu: 1500,
        });
        let mut dp = DataPath::new(dev, Box::new(ReadAhead::new(link))).unwrap();
        let mut junk = vec![0xffu8; 60];
        junk[12..14].copy_from_slice(&[0x88, 0xb5]);
        for _ in 0..RX_BATCH + 10 {
            peer.send(&junk).unwrap();
        }
        assert!(dp.receive(), "stopped at its bound");
        dp.after_work(&[]);
        let soon = |dp: &DataPath| dp.armed.is_some_and(|d| d <= dp.now());
        assert!(soon(&dp), "armed at once: {:?}", dp.armed);
        // A pass for another reason (a doorbell) keeps it.
        dp.after_work(&[]);
        assert!(soon(&dp), "kept: {:?}", dp.armed);
        // The rest comes with the next receive; then the timer is the
        // device's own again.
        assert!(!dp.receive());
        dp.after_work(&[]);
        assert!(!soon(&dp), "{:?}", dp.armed);
    }

    #[test]
    fn no_interrupt_flag_is_honoured_without_event_idx() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let mut q = Queue::new(16).unwrap();
        q.set_size(16);
        q.set_desc_table_address(Some(0x1000), Some(0));
        q.set_avail_ring_address(Some(0x2000), Some(0));
        q.set_used_ring_address(Some(0x3000), Some(0));
        // A polled queue (guest-lib's control and doorbell queues): no interrupt.
        mem.write_obj(VIRTQ_AVAIL_F_NO_INTERRUPT.to_le(), GuestAddress(0x2000))
            .unwrap();
        assert!(!driver_wants_interrupt(&mut q, &mem).unwrap());
        // The event queue asks for them.
        mem.write_obj(0u16, GuestAddress(0x2000)).unwrap();
        assert!(driver_wants_interrupt(&mut q, &mem).unwrap());
        // An avail ring outside guest memory is an error (the caller signals).
        q.set_avail_ring_address(Some(0x20000), Some(0));
        assert!(driver_wants_interrupt(&mut q, &mem).is_err());
    }
}
