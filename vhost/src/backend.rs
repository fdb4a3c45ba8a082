//! The vrnic vhost-user backend: feature negotiation, configuration space,
//! memory table and lifecycle (vhost-user spec: "Feature negotiation",
//! "Ring states", `VHOST_USER_GET_CONFIG`, `VHOST_USER_SET_MEM_TABLE`,
//! `VHOST_USER_GET_VRING_BASE`, `VHOST_USER_RESET_DEVICE`), and the worker's
//! event dispatch into the [`DataPath`].
//!
//! One worker thread (vhost-user-backend's `VringEpollHandler`) runs the
//! whole data path: the three queue kicks, the link's descriptor
//! ([`LINK_EVENT`]) and the device timer ([`TIMER_EVENT`]). The data path
//! sits behind one mutex that only the vhost-user message thread contends
//! for, and only while the frontend reconfigures the device.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::{debug, error, info};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::VhostUserBackend;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use vrnic::abi::{self, Pod};
use vrnic::device::{Device, DeviceStats};
use vrnic::link::Link;

use crate::datapath::{BackendStats, DataPath, Vring};
use crate::poll_group::PollGroup;
use crate::spin::PollConfig;
use crate::stats::{Snapshot, StatsBoard};

pub use crate::datapath::{LINK_EVENT, TIMER_EVENT};

/// Virtio features offered: `VIRTIO_F_VERSION_1` (virtio 1.2 §6),
/// `VIRTIO_RING_F_EVENT_IDX` (§2.7.10) and `VHOST_USER_F_PROTOCOL_FEATURES`
/// (vhost-user spec, "Protocol features").
pub const FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();

/// vhost-user protocol features offered: `CONFIG` (the frontend reads the
/// configuration space with `GET_CONFIG`) and `REPLY_ACK` (a frontend that
/// sets `NEED_REPLY` learns which request failed; vhost-user-backend still
/// closes the connection after a failed request).
pub fn protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::REPLY_ACK
}

/// Longest a worker that wakes up waits for the threads waiting for the
/// data path to take it first (`VrnicBackend::lock_worker`).
pub const GIVE_WAY_MAX: Duration = Duration::from_millis(10);

/// Backend settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendConfig {
    /// Largest virtqueue size the backend accepts (`SET_VRING_NUM`): a
    /// power of two in `1..=abi::MAX_QUEUE_SIZE`.
    pub queue_size: u16,
    /// Adaptive polling of the worker ([`crate::spin`]).
    pub poll: PollConfig,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            queue_size: abi::MAX_QUEUE_SIZE,
            poll: PollConfig::default(),
        }
    }
}

/// Errors making a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The queue size is not a power of two in `1..=abi::MAX_QUEUE_SIZE`.
    #[error("queue size {0} is not a power of two between 1 and {max}", max = abi::MAX_QUEUE_SIZE)]
    QueueSize(u16),
    /// The device timer (a timerfd) could not be created.
    #[error("cannot create the device timer: {0}")]
    Timer(#[source] io::Error),
}

/// The vrnic vhost-user backend: one [`Device`] on one [`Link`], served to
/// one frontend at a time. Pass it (in an `Arc`) to vhost-user-backend's
/// `VhostUserDaemon`; [`crate::server`] does that.
pub struct VrnicBackend {
    /// Shared with the daemon's [`PollGroup`], whose poller may serve it.
    dp: Arc<Mutex<DataPath>>,
    /// Threads other than the worker waiting for `dp`: a polling worker
    /// gives way when non-zero ([`crate::spin`]).
    waiters: Arc<AtomicUsize>,
    /// The functions of the daemon, polled by one worker at a time.
    group: Option<Arc<PollGroup>>,
    /// Whether the group knows this connection's vrings.
    joined: AtomicBool,
    queue_size: u16,
    poll: PollConfig,
    acked_features: AtomicU64,
    board: Arc<StatsBoard>,
    /// Descriptors of the exit-event consumers handed to vhost-user-backend
    /// ([`VhostUserBackend::exit_event`]), which it leaks: its
    /// `VringEpollHandler::new` (0.24) registers `consumer.into_raw_fd()`
    /// with its epoll and never closes it, one eventfd per connection.
    /// Closed by [`VrnicBackend::close_exit_events`].
    exit_consumers: Mutex<Vec<RawFd>>,
}

impl VrnicBackend {
    /// A backend serving `device` over `link`.
    ///
    /// # Errors
    /// [`BackendError`] for a bad queue size or when the timer cannot be made.
    pub fn new(
        device: Device,
        link: Box<dyn Link>,
        cfg: BackendConfig,
    ) -> Result<Self, BackendError> {
        let q = cfg.queue_size;
        if q == 0 || q > abi::MAX_QUEUE_SIZE || !q.is_power_of_two() {
            return Err(BackendError::QueueSize(q));
        }
        Ok(Self {
            dp: Arc::new(Mutex::new(
                DataPath::new(device, link).map_err(BackendError::Timer)?,
            )),
            waiters: Arc::new(AtomicUsize::new(0)),
            group: None,
            joined: AtomicBool::new(false),
            queue_size: q,
            poll: cfg.poll,
            acked_features: AtomicU64::new(0),
            board: Arc::new(StatsBoard::new()),
            exit_consumers: Mutex::new(Vec::new()),
        })
    }

    /// Makes the backend a member of `group`: the functions of one daemon,
    /// polled by one worker at a time ([`crate::poll_group`]).
    pub fn set_poll_group(&mut self, group: Arc<PollGroup>) {
        self.group = Some(group);
    }

    /// The data path, for any thread but the worker: counted in
    /// `waiters` while it waits, so a polling worker lets go.
    fn lock(&self) -> MutexGuard<'_, DataPath> {
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let dp = self.lock_dp();
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        dp
    }

    /// The data path, for the worker: after the threads waiting for it
    /// ([`VrnicBackend::lock`]) had their turn, for up to [`GIVE_WAY_MAX`].
    ///
    /// The mutex is not fair: a worker that always has work takes it
    /// again as soon as it lets go, before the waiter its release woke
    /// runs. A driver can keep it busy for ever (rings that feed
    /// themselves: a used ring laid over the avail ring makes every
    /// completion a new available chain; or a flood), and then the
    /// frontend's next request (`SET_MEM_TABLE`, `GET_VRING_BASE`) waited
    /// for ever (found by `tests/vhost_user_sequences.rs`). A waiter takes
    /// the lock within microseconds once the worker stops retaking it.
    fn lock_worker(&self) -> MutexGuard<'_, DataPath> {
        if self.waiters.load(Ordering::Relaxed) > 0 {
            let until = Instant::now() + GIVE_WAY_MAX;
            while self.waiters.load(Ordering::Relaxed) > 0 && Instant::now() < until {
                std::thread::yield_now();
            }
        }
        self.lock_dp()
    }

    fn lock_dp(&self) -> MutexGuard<'_, DataPath> {
        // A panic in the engine is caught inside the lock (see
        // `handle_event`), so poisoning only follows a bug here; the data
        // path is still usable.
        self.dp.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The link's pollable descriptor, if it has one (register it as
    /// [`LINK_EVENT`]).
    pub fn link_fd(&self) -> Option<RawFd> {
        self.lock().link_fd
    }

    /// The device timer's descriptor (register it as [`TIMER_EVENT`]).
    pub fn timer_fd(&self) -> RawFd {
        self.lock().timer().as_raw_fd()
    }

    /// The vhost-user side's counters.
    pub fn stats(&self) -> BackendStats {
        self.lock().stats
    }

    /// The engine's counters.
    pub fn device_stats(&self) -> DeviceStats {
        self.lock().device.stats().clone()
    }

    /// Where the counters are published: after every worker wake-up and
    /// every reset, without locking ([`StatsBoard`]), the per-QP ones at
    /// most every [`crate::datapath::QP_STATS_INTERVAL_NS`]; for readers
    /// that must not hold up the data path (the `vrnic stats` server).
    pub fn stats_board(&self) -> Arc<StatsBoard> {
        self.board.clone()
    }

    /// Publishes the counters; the per-QP ones rate-limited
    /// ([`DataPath::publish_qp_stats`]), or at once with `wait` (callers
    /// other than the worker, which may not run again).
    fn publish(&self, dp: &mut DataPath, wait: bool) {
        publish_to(&self.board, dp, wait);
    }

    /// Counts a frontend refused while another was served
    /// (`frontends_refused`, [`crate::server`]).
    pub(crate) fn refused(&self) {
        let mut dp = self.lock();
        dp.stats.frontends_refused += 1;
        self.publish(&mut dp, false);
    }

    /// Virtio features the frontend acknowledged (`SET_FEATURES`).
    pub fn acked_features(&self) -> u64 {
        self.acked_features.load(Ordering::Relaxed)
    }

    /// Resets the device (virtio 1.2 §2.4): every verbs object is destroyed
    /// and waiting events are dropped.
    pub fn reset(&self) {
        let mut dp = self.lock();
        let ((), fault) = crate::fault::catch(|| dp.reset());
        dp.check_memory(fault);
        self.publish(&mut dp, true);
    }

    /// The connection of the frontend being served ([`crate::server`]),
    /// which the backend closes when the frontend's memory is lost
    /// (`DataPath::memory_fault`); none once it ended.
    pub fn set_connection(&self, conn: Option<vhost_user_backend::ShutdownHandle>) {
        self.lock().set_connection(conn);
    }

    /// The frontend's connection ended (it closed the socket, or its QEMU
    /// died): resets the device (every object of that guest is destroyed,
    /// its waiting events and frames dropped, its timers disarmed) and
    /// drops the memory table, which unmaps the guest's RAM and closes the
    /// region fds (the next frontend sends its own, `SET_MEM_TABLE`).
    pub fn disconnected(&self) {
        if let Some(g) = &self.group {
            g.leave(&self.dp);
            self.joined.store(false, Ordering::Relaxed);
        }
        let mut dp = self.lock();
        // Its memory is dropped below in any case: a fault here is only
        // counted.
        let ((), fault) = crate::fault::catch(|| dp.reset());
        dp.check_memory(fault);
        dp.set_connection(None);
        dp.set_memory(GuestMemoryAtomic::new(GuestMemoryMmap::new()));
        self.publish(&mut dp, true);
    }

    /// Closes the exit-event consumers handed to vhost-user-backend, which
    /// it does not close itself (see the field). Call only once the
    /// `VhostUserDaemon` that asked for them is dropped (its worker joined
    /// and its epoll closed): [`crate::server`] does.
    pub(crate) fn close_exit_events(&self) {
        let mut fds = self
            .exit_consumers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for fd in fds.drain(..) {
            // SAFETY: `fd` is an eventfd this backend created and gave to
            // vhost-user-backend, which turned it into a raw descriptor and
            // dropped everything that used it with the daemon; nothing else
            // owns it.
            unsafe { libc::close(fd) };
        }
    }

    /// Number of guest memory regions the backend has mapped (the last
    /// `SET_MEM_TABLE`'s; 0 with no frontend connected).
    pub fn mapped_regions(&self) -> usize {
        use vm_memory::{GuestAddressSpace, GuestMemoryBackend};
        self.lock().memory().memory().num_regions()
    }

    /// Polls after a wake-up ([`DataPath::spin`]): alone, or as the poll
    /// group's poller, serving the other members too; not at all while
    /// another member's worker is the poller (it serves this one).
    fn spin(&self, dp: &mut DataPath, vrings: &[Vring]) {
        let publish = &mut |dp: &mut DataPath| self.publish(dp, false);
        let Some(g) = self.group.as_ref().filter(|g| g.len() > 1) else {
            dp.spin(vrings, self.poll, &self.waiters, publish, &mut || false);
            return;
        };
        if !g.lead() {
            return;
        }
        // Given back and stepped down when the session ends, and also when
        // a panic in this function's engine unwinds through it (caught in
        // `handle_event`): the other functions must not stay adopted.
        let mut session = Session {
            group: g,
            adopted: Vec::new(),
        };
        let adopted = &mut session.adopted;
        let others =
            &mut || g.poll_others(&self.dp, adopted, &|board, dp| publish_to(board, dp, false));
        dp.spin(vrings, self.poll, &self.waiters, publish, others);
    }

    fn dispatch(dp: &mut DataPath, device_event: u16, vrings: &[Vring]) {
        dp.check_driver(vrings);
        if dp.hold_while_stopped(device_event, vrings) {
            return;
        }
        let queue = |q: u16| vrings.get(usize::from(q));
        match device_event {
            abi::CONTROLQ => {
                if let Some(v) = queue(abi::CONTROLQ) {
                    dp.process_control(v);
                }
            }
            abi::DOORBELLQ => {
                if let Some(v) = queue(abi::DOORBELLQ) {
                    dp.process_doorbells(v);
                }
            }
            // New event buffers: delivered in `after_work`.
            abi::EVENTQ => {}
            LINK_EVENT => {
                dp.receive();
            }
            TIMER_EVENT => dp.on_timer(),
            other => debug!(event = other, "unknown worker event"),
        }
        // A queue pass that stopped at its bound: that queue again (each
        // pass bounded; the control queue once its pause is over), after
        // the other events of this wake-up.
        if device_event != abi::CONTROLQ && device_event != abi::DOORBELLQ {
            let (db, ctrl) = dp.take_queue_more();
            if let Some(v) = queue(abi::DOORBELLQ).filter(|_| db) {
                dp.process_doorbells(v);
            }
            if let Some(v) = queue(abi::CONTROLQ).filter(|_| ctrl) {
                dp.process_control(v);
            }
        }
        // A polled link, or one that may hold frames its descriptor does
        // not show (the last receive stopped at its bound).
        if (dp.link_fd.is_none() || dp.rx_more()) && device_event != LINK_EVENT {
            dp.receive();
        }
        dp.after_work(vrings);
    }
}

/// A poller's session ([`VrnicBackend::spin`]): on drop, the adopted
/// functions are given back and the poller steps down.
struct Session<'a> {
    group: &'a PollGroup,
    adopted: Vec<crate::poll_group::Adopted>,
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let adopted = std::mem::take(&mut self.adopted);
        self.group
            .give_back(adopted, &|board, dp| publish_to(board, dp, false));
        self.group.step_down();
    }
}

/// Publishes `dp`'s counters on `board`; the per-QP ones rate-limited
/// ([`DataPath::publish_qp_stats`]), or at once with `wait`.
fn publish_to(board: &StatsBoard, dp: &mut DataPath, wait: bool) {
    let snap = Snapshot::new(dp.device.stats(), &dp.stats);
    board.publish(&snap);
    dp.publish_qp_stats(board, &snap, wait);
}

impl VhostUserBackend for VrnicBackend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        abi::NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.queue_size)
    }

    fn features(&self) -> u64 {
        FEATURES
    }

    fn acked_features(&self, features: u64) {
        self.acked_features.store(features, Ordering::Relaxed);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        protocol_features()
    }

    /// `VHOST_USER_RESET_DEVICE`.
    fn reset_device(&self) {
        info!("frontend reset the device");
        self.reset();
    }

    /// The vrings apply EVENT_IDX themselves; the data path's queue passes
    /// work under either notification scheme.
    fn set_event_idx(&self, enabled: bool) {
        debug!(enabled, "EVENT_IDX");
    }

    /// Bytes `[offset, offset + size)` of [`abi::ConfigSpace`]; empty (the
    /// frontend sees an error) when the range is not inside its 64 bytes.
    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let cs = self.lock().device.config_space();
        let bytes = cs.as_bytes();
        let range = usize::try_from(offset)
            .ok()
            .and_then(|o| Some(o..o.checked_add(usize::try_from(size).ok()?)?));
        match range.and_then(|r| bytes.get(r)) {
            Some(b) => b.to_vec(),
            None => {
                debug!(offset, size, "GET_CONFIG outside the configuration space");
                Vec::new()
            }
        }
    }

    /// The configuration space is read-only (virtio 1.2 §4.1.4.6 for the
    /// device-specific part): writes are refused.
    fn set_config(&self, offset: u32, buf: &[u8]) -> io::Result<()> {
        debug!(offset, len = buf.len(), "SET_CONFIG refused");
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "vrnic configuration space is read-only",
        ))
    }

    /// `VHOST_USER_SET_MEM_TABLE`. A table set while the device is stopped
    /// (no control queue running since the last reset) also resets the
    /// device, so nothing refers to the old table.
    ///
    /// A table with a region past the end of its file is refused
    /// ([`crate::memory::check_table`]; counted in
    /// `memory_tables_refused`): the device is reset, no table is kept, and
    /// vhost-user-backend closes the connection after the failed request.
    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        let mut dp = self.lock();
        if let Err(e) = crate::memory::check_table(&mem.memory()) {
            error!("memory table refused: {e}; closing the connection");
            dp.stats.memory_tables_refused += 1;
            let ((), fault) = crate::fault::catch(|| dp.reset());
            dp.check_memory(fault);
            dp.set_memory(GuestMemoryAtomic::new(GuestMemoryMmap::new()));
            self.publish(&mut dp, true);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
        }
        let ((), fault) = crate::fault::catch(|| {
            dp.set_memory(mem);
            if !dp.running() {
                dp.reset();
            }
        });
        dp.check_memory(fault);
        self.publish(&mut dp, true);
        Ok(())
    }

    /// `VHOST_USER_GET_VRING_BASE`: the frontend stops a ring. Stopping the
    /// control queue stops the device ([`DataPath::stop`]): QEMU stops
    /// every started queue both when the VM pauses and when the guest
    /// resets the device (vhost-user spec "Ring states"); which of the two
    /// it was shows when the queue restarts.
    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        debug!(queue_index, "ring stopped");
        if queue_index == u32::from(abi::CONTROLQ) {
            info!("control queue stopped: device stopped, state kept until it restarts");
            let mut dp = self.lock();
            let ((), fault) = crate::fault::catch(|| dp.stop());
            dp.check_memory(fault);
            self.publish(&mut dp, true);
        }
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        match new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC) {
            Ok(pair) => {
                self.exit_consumers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(pair.0.as_raw_fd());
                Some(pair)
            }
            Err(e) => {
                error!("cannot create the worker's exit event: {e}");
                None
            }
        }
    }

    /// Worker events. Never fails: an error would stop the worker thread,
    /// and nothing a guest does may do that. A panic in the engine is
    /// caught, logged and answered with a device reset; a frontend memory
    /// that lost its backing ([`crate::fault`]), with a reset and the end
    /// of its connection ([`DataPath::check_memory`]).
    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[Vring],
        _thread_id: usize,
    ) -> io::Result<()> {
        if let Some(g) = &self.group {
            if !self.joined.swap(true, Ordering::Relaxed) {
                g.join(&self.dp, &self.waiters, &self.board, vrings);
            }
        }
        let mut dp = self.lock_worker();
        let (r, fault) = crate::fault::catch(|| {
            catch_unwind(AssertUnwindSafe(|| {
                Self::dispatch(&mut dp, device_event, vrings);
                // Counters are published after each round of work, the
                // wake-up's own included, so what a driver saw answered is in
                // the snapshot before the next round answers anything.
                self.publish(&mut dp, false);
                self.spin(&mut dp, vrings);
                dp.serve_late(vrings, &mut |dp| self.publish(dp, false));
                // Every round above published what it did: nothing is left to
                // publish here (a second snapshot per wake-up, for nothing).
            }))
        });
        if r.is_err() {
            error!(
                event = device_event,
                "the engine panicked: resetting the device"
            );
            dp.reset_after_panic();
            self.publish(&mut dp, false);
        }
        if dp.check_memory(fault) {
            self.publish(&mut dp, false);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrnic::link::MemLink;

    fn backend() -> VrnicBackend {
        let (link, _peer) = MemLink::pair();
        let ip = std::net::Ipv4Addr::new(10, 0, 0, 1);
        let cfg = vrnic::device::DeviceConfig {
            mac: [2, 0x76, 10, 0, 0, 1],
            ipv4: ip,
            prefix_len: 24,
            ipv6: Vec::new(),
            link_mtu: 1500,
        };
        VrnicBackend::new(Device::new(cfg), Box::new(link), BackendConfig::default()).unwrap()
    }

    /// A panic of the poller's own engine unwinds through its session
    /// (caught in `handle_event`): the session still steps down, so
    /// another worker can poll the group afterwards.
    #[test]
    fn a_poller_session_steps_down_when_a_panic_unwinds_through_it() {
        let group = PollGroup::new();
        assert!(group.lead());
        let r = catch_unwind(AssertUnwindSafe(|| {
            let _session = Session {
                group: &group,
                adopted: Vec::new(),
            };
            panic!("engine bug");
        }));
        assert!(r.is_err());
        assert!(group.lead(), "the group has no poller after the unwind");
    }

    #[test]
    fn get_config_is_bounds_checked() {
        let b = backend();
        let all = VhostUserBackend::get_config(&b, 0, 64);
        assert_eq!(all.len(), 64);
        assert_eq!(&all[..8], &abi::SIGNATURE);
        assert_eq!(
            VhostUserBackend::get_config(&b, 8, 4),
            abi::ABI_VERSION.to_le_bytes()
        );
        assert_eq!(VhostUserBackend::get_config(&b, 63, 1).len(), 1);
        for (off, size) in [(60, 8), (64, 1), (0, 65), (u32::MAX, 2), (1, u32::MAX)] {
            assert!(
                VhostUserBackend::get_config(&b, off, size).is_empty(),
                "{off}+{size}"
            );
        }
        assert!(VhostUserBackend::set_config(&b, 0, &[0]).is_err());
    }

    #[test]
    fn offers_the_features_a_vrnic_frontend_needs() {
        let b = backend();
        assert_eq!(b.num_queues(), 3);
        assert_eq!(b.max_queue_size(), usize::from(abi::MAX_QUEUE_SIZE));
        assert_eq!(b.features() & (1 << 32), 1 << 32);
        assert!(b
            .protocol_features()
            .contains(VhostUserProtocolFeatures::CONFIG));
    }
}
