//! A vhost-user frontend and virtio driver for tests, standing in for QEMU
//! and a guest driver: it connects to a vrnic backend's socket, negotiates
//! like QEMU does (vhost-user spec, "Starting the device"), shares a memfd
//! as guest RAM, sets up the three split virtqueues and speaks the device
//! ABI ([`vrnic::abi`]) over them.
//!
//! - [`TestDaemon`]: a backend served on a temporary socket in a thread.
//! - [`TestFrontend`]: the connected frontend + driver.
//! - [`DriverMemory`], [`FrontendQueue`]: guest RAM and the driver side of
//!   a virtqueue (`vrnic-virtq`'s split virtqueue, the one guest-lib's
//!   drivers use), for tests that build chains by hand.
//!
//! This is the daemon's protocol-level test tool: raw chains, avail
//! indices, pauses, resets, reconnects, raw control commands and
//! doorbells. Verbs traffic through a daemon is driven by the driver
//! programs use, guest-lib's verbs over its vhost-user transport
//! (`vrnic_guest::vhost_user::VhostUserTransport`; see `tests/common`):
//! one driver-side implementation, not two.
//!
//! Every wait is bounded by [`FrontendOptions::timeout`].
//!
//! A crate of its own (it was the daemon's `frontend` module): it drives
//! the daemon's library (`vrnic_vhost`, which [`TestDaemon`] serves in a
//! thread) with guest-lib's vhost-user negotiation, so the daemon itself
//! depends on no driver. The daemon's integration tests use it as a
//! dev-dependency; the host programs `vrnic-soak` (`src/bin/vrnic-soak.rs`,
//! the soak's traffic driver) and `vrnic-flood` (`src/bin/vrnic-flood.rs`,
//! a hostile frontend for benchmarks) are its binaries.
#![deny(missing_docs)]

mod daemon;
mod memory;
mod queue;

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Duration;

use vhost::vhost_user::message::VhostUserConfigFlags;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use virtio_bindings::bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vrnic::abi::{self, Pod};
use vrnic::mem::{DmaMemory, MemError};

pub use daemon::{arp_request_frame, test_device_config, TestDaemon};
pub use memory::{DriverMemory, PAGE};
pub use queue::{Buffer, FrontendQueue, Used};

use vrnic_vhost::datapath::MAX_CONTROL_MSG;

/// Test frontend failures.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    /// A vhost-user request failed.
    #[error("vhost-user: {0}")]
    Vhost(#[from] vhost::Error),
    /// Setting something up failed (memory, eventfds, sockets, threads).
    #[error("setup: {0}")]
    Setup(String),
    /// The backend's features are not what a vrnic frontend needs.
    #[error("negotiation: {0}")]
    Negotiation(String),
    /// A driver-memory access failed.
    #[error("driver memory: {0}")]
    Mem(#[from] MemError),
    /// Driver memory is exhausted (bytes requested).
    #[error("driver memory exhausted allocating {0} bytes")]
    OutOfMemory(u64),
    /// The queue has too few free descriptors.
    #[error("queue {0} has too few free descriptors")]
    QueueFull(u16),
    /// The device broke the virtqueue protocol (other than
    /// [`FrontendError::BadUsed`]), e.g. a used index more than a queue
    /// ahead.
    #[error("queue {queue}: {source}")]
    Queue {
        /// Queue index.
        queue: u16,
        /// What the queue found.
        source: vrnic_virtq::VirtqError,
    },
    /// The device used nothing in time.
    #[error("queue {queue}: nothing used within {waited:?}")]
    Timeout {
        /// Queue index.
        queue: u16,
        /// How long the frontend waited.
        waited: Duration,
    },
    /// The device returned a chain that was not in flight.
    #[error("queue {queue}: device used head {head}, which is not in flight")]
    BadUsed {
        /// Queue index.
        queue: u16,
        /// The head the device returned.
        head: u32,
    },
    /// A control response shorter than a [`abi::RespHeader`].
    #[error("control response of {used} bytes (a header is 8)")]
    ShortResponse {
        /// Bytes the device wrote.
        used: u32,
    },
    /// The daemon thread failed or did not finish in time.
    #[error("daemon: {0}")]
    Daemon(String),
}

/// How the test frontend sets the device up.
#[derive(Debug, Clone)]
pub struct FrontendOptions {
    /// Negotiate `VIRTIO_RING_F_EVENT_IDX` (if the backend offers it).
    pub event_idx: bool,
    /// Size of each virtqueue (a power of two, at most the backend's).
    pub queue_size: u16,
    /// Guest RAM regions, `(guest-physical address, bytes)`, page-aligned.
    pub memory: Vec<(u64, usize)>,
    /// Bound on every wait for the device.
    pub timeout: Duration,
}

impl Default for FrontendOptions {
    fn default() -> Self {
        Self {
            event_idx: true,
            queue_size: 64,
            memory: vec![(0x4000_0000, 8 << 20)],
            timeout: Duration::from_secs(10),
        }
    }
}

/// A connected frontend with a started device: queues set up and enabled.
pub struct TestFrontend {
    fe: Frontend,
    mem: DriverMemory,
    queues: Vec<FrontendQueue>,
    timeout: Duration,
    acked: u64,
    ctrl_req: u64,
    ctrl_resp: u64,
    db_slots: u64,
    db_next: u64,
    event_bufs: HashMap<u16, u64>,
}

impl TestFrontend {
    /// Connects to the backend at `socket` and starts the device the way
    /// QEMU does: `GET_FEATURES`, `GET_PROTOCOL_FEATURES`,
    /// `SET_PROTOCOL_FEATURES`, `SET_OWNER`, `SET_FEATURES`,
    /// `SET_MEM_TABLE`, then per queue `SET_VRING_NUM/BASE/ADDR/CALL/KICK`
    /// and `SET_VRING_ENABLE`.
    ///
    /// # Errors
    /// [`FrontendError`] when any step fails.
    pub fn connect(socket: &Path, opts: &FrontendOptions) -> Result<Self, FrontendError> {
        let fe = Frontend::connect(socket, abi::NUM_QUEUES as u64)?;
        Self::start(fe, opts)
    }

    /// [`TestFrontend::connect`] the other way round, as QEMU with
    /// `-chardev socket,...,server=on`: waits up to `opts.timeout` for a
    /// backend to connect to `listener` (the daemon's `--connect` mode),
    /// then starts the device.
    ///
    /// # Errors
    /// [`FrontendError::Timeout`]-like [`FrontendError::Setup`] when no
    /// backend came; as [`TestFrontend::connect`].
    pub fn accept(
        listener: &std::os::unix::net::UnixListener,
        opts: &FrontendOptions,
    ) -> Result<Self, FrontendError> {
        let mut p = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = opts.timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } != 1 {
            return Err(FrontendError::Setup(format!(
                "no backend connected within {:?}",
                opts.timeout
            )));
        }
        let (stream, _) = listener
            .accept()
            .map_err(|e| FrontendError::Setup(format!("accept: {e}")))?;
        Self::start(Frontend::from_stream(stream, abi::NUM_QUEUES as u64), opts)
    }

    fn start(mut fe: Frontend, opts: &FrontendOptions) -> Result<Self, FrontendError> {
        // The set-up bounded by `opts.timeout` ([`within`]).
        let watchdog = arm(&fe, opts.timeout)?;
        let acked = negotiate(&mut fe, opts)?;
        let event_idx = acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;

        let mut mem = DriverMemory::new(&opts.memory)?;
        fe.set_mem_table(&mem.region_infos()?)?;
        let queues = (0..abi::NUM_QUEUES)
            .map(|q| FrontendQueue::new(&mut mem, q as u16, opts.queue_size, event_idx))
            .collect::<Result<Vec<_>, _>>()?;
        let ctrl_req = mem.alloc(MAX_CONTROL_MSG as u64, 8)?;
        let ctrl_resp = mem.alloc(MAX_CONTROL_MSG as u64, 8)?;
        let db_slots = mem.alloc(16 * u64::from(opts.queue_size), 16)?;
        let mut this = Self {
            fe,
            mem,
            queues,
            timeout: opts.timeout,
            acked,
            ctrl_req,
            ctrl_resp,
            db_slots,
            db_next: 0,
            event_bufs: HashMap::new(),
        };
        for q in 0..abi::NUM_QUEUES {
            this.start_queue(q, 0)?;
        }
        expired(watchdog, "the set-up", opts.timeout)?;
        Ok(this)
    }

    /// The underlying vhost-user frontend, for protocol-level tests.
    pub fn vhost(&mut self) -> &mut Frontend {
        &mut self.fe
    }

    /// Virtqueue `q` as the driver sees it (its rings and eventfds), for
    /// tests that write the rings or send its eventfds by hand.
    ///
    /// # Panics
    /// When `q` is not a queue index (`q >= abi::NUM_QUEUES`).
    pub fn queue(&self, q: u16) -> &FrontendQueue {
        &self.queues[usize::from(q)]
    }

    /// Guest RAM.
    pub fn memory(&self) -> &DriverMemory {
        &self.mem
    }

    /// Guest RAM, for allocating.
    pub fn memory_mut(&mut self) -> &mut DriverMemory {
        &mut self.mem
    }

    /// Virtio features acknowledged with `SET_FEATURES`.
    pub fn acked_features(&self) -> u64 {
        self.acked
    }

    /// Bound on waits for the device.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `GET_CONFIG` of `size` bytes at `offset`.
    ///
    /// Only for ranges inside the configuration space: the backend answers
    /// others with an empty payload (vhost-user spec), which the vhost
    /// crate's frontend does not parse; it waits for the payload until the
    /// socket's receive timeout ([`FrontendOptions::timeout`]) and the
    /// connection is unusable afterwards.
    ///
    /// # Errors
    /// [`FrontendError::Vhost`].
    pub fn get_config(&mut self, offset: u32, size: u32) -> Result<Vec<u8>, FrontendError> {
        let buf = vec![0u8; size as usize];
        self.bounded("GET_CONFIG", |this| {
            let (_, payload) =
                this.fe
                    .get_config(offset, size, VhostUserConfigFlags::empty(), &buf)?;
            Ok(payload)
        })
    }

    /// The whole configuration space, read once.
    ///
    /// # Errors
    /// As [`TestFrontend::get_config`].
    pub fn config_space(&mut self) -> Result<abi::ConfigSpace, FrontendError> {
        let b = self.get_config(0, size_of::<abi::ConfigSpace>() as u32)?;
        abi::ConfigSpace::read_from(&b).ok_or(FrontendError::ShortResponse {
            used: b.len() as u32,
        })
    }

    /// Makes the chain `bufs` available on queue `q` without waiting.
    /// Returns its head.
    ///
    /// # Errors
    /// As [`FrontendQueue::add`].
    pub fn post(&mut self, q: u16, bufs: &[Buffer]) -> Result<u16, FrontendError> {
        self.queues[usize::from(q)].add(bufs)
    }

    /// Waits for the next used element of queue `q`.
    ///
    /// # Errors
    /// As [`FrontendQueue::wait_used`].
    pub fn wait(&mut self, q: u16) -> Result<Used, FrontendError> {
        self.queues[usize::from(q)].wait_used(self.timeout)
    }

    /// The next used element of queue `q`, if there is one, without
    /// waiting.
    ///
    /// # Errors
    /// As [`FrontendQueue::pop_used`].
    pub fn try_used(&mut self, q: u16) -> Result<Option<Used>, FrontendError> {
        self.queues[usize::from(q)].pop_used()
    }

    /// Whether the device would want a kick for the next chain on queue
    /// `q` ([`FrontendQueue::wants_kick`]).
    ///
    /// # Errors
    /// None today (the rings are in the frontend's own memory); kept for
    /// the callers' `?`.
    pub fn wants_kick(&self, q: u16) -> Result<bool, FrontendError> {
        Ok(self.queues[usize::from(q)].wants_kick())
    }

    /// Overwrites queue `q`'s available index with `idx` and kicks; for
    /// robustness tests. [`TestFrontend::republish`] undoes it.
    ///
    /// # Errors
    /// None today; kept for the callers' `?`.
    pub fn write_avail_idx(&mut self, q: u16, idx: u16) -> Result<(), FrontendError> {
        let vq = &self.queues[usize::from(q)];
        vq.write_avail_idx(idx);
        vq.kick();
        Ok(())
    }

    /// Writes queue `q`'s true available index again and kicks.
    ///
    /// # Errors
    /// None today; kept for the callers' `?`.
    pub fn republish(&mut self, q: u16) -> Result<(), FrontendError> {
        self.queues[usize::from(q)].republish();
        Ok(())
    }

    /// Posts the chain `bufs` on queue `q` and waits for the device to use
    /// it (nothing else may be in flight on `q`).
    ///
    /// # Errors
    /// As [`TestFrontend::post`] and [`TestFrontend::wait`];
    /// [`FrontendError::BadUsed`] if another chain came back.
    pub fn submit(&mut self, q: u16, bufs: &[Buffer]) -> Result<Used, FrontendError> {
        let head = self.post(q, bufs)?;
        let used = self.wait(q)?;
        if used.id != head {
            return Err(FrontendError::BadUsed {
                queue: q,
                head: used.id.into(),
            });
        }
        Ok(used)
    }

    /// Writes the command `opcode` with `body` into the control request
    /// area; the chain of request and response areas that carries it.
    ///
    /// # Errors
    /// [`FrontendError::Setup`] for a body over [`abi::MAX_CMD_BODY`];
    /// [`FrontendError::Mem`] if the areas are outside memory.
    fn write_request(&self, opcode: u16, body: &[u8]) -> Result<[Buffer; 2], FrontendError> {
        if body.len() > abi::MAX_CMD_BODY {
            return Err(FrontendError::Setup(format!(
                "command body of {} bytes",
                body.len()
            )));
        }
        let h = abi::CmdHeader {
            opcode,
            ctx: 0,
            len: body.len() as u32,
        };
        let m = self.mem.mem();
        m.write(self.ctrl_req, h.as_bytes())?;
        m.write(self.ctrl_req + 8, body)?;
        Ok([
            Buffer::readable(self.ctrl_req, 8 + body.len() as u32),
            Buffer::writable(self.ctrl_resp, MAX_CONTROL_MSG as u32),
        ])
    }

    /// Executes one control command: `[CmdHeader + body][RespHeader +
    /// body]` on the control queue, the response area sized for the
    /// largest response. Returns the response header and body (the bytes
    /// the device wrote after the header).
    ///
    /// # Errors
    /// [`FrontendError::Setup`] for a body over [`abi::MAX_CMD_BODY`];
    /// [`FrontendError::ShortResponse`] when the device wrote less than a
    /// header; as [`TestFrontend::submit`].
    pub fn control(
        &mut self,
        opcode: u16,
        body: &[u8],
    ) -> Result<(abi::RespHeader, Vec<u8>), FrontendError> {
        let bufs = self.write_request(opcode, body)?;
        self.mem
            .mem()
            .write(self.ctrl_resp, &[0u8; MAX_CONTROL_MSG])?;
        let used = self.submit(abi::CONTROLQ, &bufs)?;
        if used.len < 8 {
            return Err(FrontendError::ShortResponse { used: used.len });
        }
        let mut resp = vec![0u8; (used.len as usize).min(MAX_CONTROL_MSG)];
        self.mem.mem().read(self.ctrl_resp, &mut resp)?;
        let hdr = abi::RespHeader::read_from(&resp)
            .ok_or(FrontendError::ShortResponse { used: used.len })?;
        Ok((hdr, resp.split_off(8)))
    }

    /// A hostile driver ([`FrontendQueue::flood`]): one `opcode` command with
    /// `body` made available on the control queue again and again, without
    /// waiting for the device, until `stop` is set, sleeping `pause` after
    /// each move of the avail index (zero: never). Returns how often the
    /// avail index moved. The frontend is unusable afterwards (close it).
    ///
    /// # Errors
    /// [`FrontendError::Setup`] for a body over [`abi::MAX_CMD_BODY`]; as
    /// [`TestFrontend::post`].
    pub fn flood_control(
        &mut self,
        opcode: u16,
        body: &[u8],
        stop: &std::sync::atomic::AtomicBool,
        pause: std::time::Duration,
    ) -> Result<u64, FrontendError> {
        let bufs = self.write_request(opcode, body)?;
        let head = self.post(abi::CONTROLQ, &bufs)?;
        Ok(self.queues[usize::from(abi::CONTROLQ)].flood(head, stop, pause))
    }

    /// Posts one doorbell without waiting for the device to consume it.
    ///
    /// # Errors
    /// As [`TestFrontend::post`].
    pub fn post_doorbell(&mut self, db: &abi::Doorbell) -> Result<u16, FrontendError> {
        let slots = u64::from(self.queues[usize::from(abi::DOORBELLQ)].size());
        let at = self.db_slots + 16 * (self.db_next % slots);
        self.db_next += 1;
        self.mem.mem().write(at, db.as_bytes())?;
        self.post(abi::DOORBELLQ, &[Buffer::readable(at, 16)])
    }

    /// Rings one doorbell and waits until the device consumed it.
    ///
    /// # Errors
    /// As [`TestFrontend::submit`].
    pub fn doorbell(&mut self, db: &abi::Doorbell) -> Result<Used, FrontendError> {
        let head = self.post_doorbell(db)?;
        let used = self.wait(abi::DOORBELLQ)?;
        if used.id != head {
            return Err(FrontendError::BadUsed {
                queue: abi::DOORBELLQ,
                head: used.id.into(),
            });
        }
        Ok(used)
    }

    /// Gives the device `n` more 16-byte event buffers.
    ///
    /// # Errors
    /// As [`TestFrontend::post`]; [`FrontendError::OutOfMemory`].
    pub fn post_event_buffers(&mut self, n: usize) -> Result<(), FrontendError> {
        for _ in 0..n {
            let buf = self.mem.alloc(16, 16)?;
            let head = self.post(abi::EVENTQ, &[Buffer::writable(buf, 16)])?;
            self.event_bufs.insert(head, buf);
        }
        Ok(())
    }

    /// The next event the device delivered, waiting up to `timeout`; the
    /// buffer is given back to the device. `None` when none came.
    ///
    /// # Errors
    /// [`FrontendError::ShortResponse`] if the device used fewer than 16
    /// bytes; [`FrontendError::BadUsed`]; as [`TestFrontend::post`].
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<abi::Event>, FrontendError> {
        let used = match self.queues[usize::from(abi::EVENTQ)].wait_used(timeout) {
            Ok(u) => u,
            Err(FrontendError::Timeout { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let buf = self
            .event_bufs
            .remove(&used.id)
            .ok_or(FrontendError::BadUsed {
                queue: abi::EVENTQ,
                head: used.id.into(),
            })?;
        let mut ev = abi::Event::default();
        self.mem.mem().read(buf, ev.as_bytes_mut())?;
        let head = self.post(abi::EVENTQ, &[Buffer::writable(buf, 16)])?;
        self.event_bufs.insert(head, buf);
        if (used.len as usize) < size_of::<abi::Event>() {
            return Err(FrontendError::ShortResponse { used: used.len });
        }
        Ok(Some(ev))
    }

    /// Stops queue `q` (`GET_VRING_BASE`); returns the backend's next
    /// available index. Stopping the control queue stops the device (its
    /// state is kept until the queue restarts; see
    /// [`vrnic_vhost::datapath::DataPath::stop`]).
    ///
    /// # Errors
    /// [`FrontendError::Vhost`].
    pub fn stop_queue(&mut self, q: u16) -> Result<u32, FrontendError> {
        self.bounded("GET_VRING_BASE", |this| {
            Ok(this.fe.get_vring_base(usize::from(q))?)
        })
    }

    /// Stops the device as QEMU's `vhost_dev_stop` does when the VM pauses
    /// (QMP `stop`) or the guest resets the device: `SET_VRING_ENABLE 0`,
    /// then `GET_VRING_BASE`, on every queue. Returns each queue's next
    /// available index, for [`TestFrontend::resume_device`].
    ///
    /// # Errors
    /// [`FrontendError::Vhost`].
    pub fn stop_device(&mut self) -> Result<Vec<u32>, FrontendError> {
        self.bounded("the device's stop", |this| {
            for q in 0..abi::NUM_QUEUES {
                this.fe.set_vring_enable(q, false)?;
            }
            (0..abi::NUM_QUEUES)
                .map(|q| Ok(this.fe.get_vring_base(q)?))
                .collect()
        })
    }

    /// Starts the device again as QEMU's `vhost_dev_start` does at QMP
    /// `cont`: `SET_MEM_TABLE`, then per queue `SET_VRING_NUM`,
    /// `SET_VRING_BASE` with `bases[q]` (what [`TestFrontend::stop_device`]
    /// returned), `SET_VRING_ADDR` (the same rings), `CALL`, `KICK`,
    /// `SET_VRING_ENABLE 1`.
    ///
    /// # Errors
    /// [`FrontendError::Vhost`]; [`FrontendError::Setup`] when `bases` does
    /// not hold one index per queue.
    pub fn resume_device(&mut self, bases: &[u32]) -> Result<(), FrontendError> {
        if bases.len() != abi::NUM_QUEUES {
            return Err(FrontendError::Setup(format!(
                "{} ring bases for {} queues",
                bases.len(),
                abi::NUM_QUEUES
            )));
        }
        self.bounded("the device's restart", |this| {
            this.fe.set_mem_table(&this.mem.region_infos()?)?;
            for (q, &base) in bases.iter().enumerate() {
                this.start_queue(q, base)?;
            }
            Ok(())
        })
    }

    /// Connects to the backend at `socket` (a new one, standing for a
    /// restarted daemon) and sets the running device up there as QEMU does
    /// for a backend that (re)connects: the negotiation, `SET_MEM_TABLE`
    /// with the same memory, and every queue with its rings and `bases[q]`
    /// as the start index (what QEMU restores from the used rings). The
    /// driver's state (rings, buffers, handles) is kept.
    ///
    /// # Errors
    /// [`FrontendError`] when any step fails; [`FrontendError::Setup`] when
    /// `bases` does not hold one index per queue.
    pub fn reattach(
        &mut self,
        socket: &Path,
        opts: &FrontendOptions,
        bases: &[u32],
    ) -> Result<(), FrontendError> {
        let mut fe = Frontend::connect(socket, abi::NUM_QUEUES as u64)?;
        let acked = within(&mut fe, opts.timeout, "the negotiation", |fe| {
            negotiate(fe, opts)
        })?;
        if acked != self.acked {
            return Err(FrontendError::Negotiation(format!(
                "features {acked:#x} differ from the first backend's {:#x}",
                self.acked
            )));
        }
        self.fe = fe;
        self.resume_device(bases)
    }

    /// Starts the device with new, empty rings at index 0, as a driver does
    /// after resetting the device (the objects the device had are gone).
    ///
    /// # Errors
    /// [`FrontendError`] when allocating or any vhost-user step fails.
    pub fn reinit_device(&mut self) -> Result<(), FrontendError> {
        self.bounded("SET_MEM_TABLE", |this| {
            Ok(this.fe.set_mem_table(&this.mem.region_infos()?)?)
        })?;
        for q in 0..abi::NUM_QUEUES {
            self.reinit_queue(q as u16)?;
        }
        Ok(())
    }

    /// Starts queue `q` with a new, empty ring at index 0 (one step of
    /// [`TestFrontend::reinit_device`], for tests that interleave the
    /// queues' start with traffic, as QEMU's `vhost_dev_start` may).
    ///
    /// # Errors
    /// [`FrontendError`] when allocating or any vhost-user step fails.
    pub fn reinit_queue(&mut self, q: u16) -> Result<(), FrontendError> {
        let event_idx = self.acked & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let q = usize::from(q);
        let size = self.queues[q].size();
        self.queues[q] = FrontendQueue::new(&mut self.mem, q as u16, size, event_idx)?;
        self.bounded("the queue's start", |this| this.start_queue(q, 0))?;
        if q == usize::from(abi::DOORBELLQ) {
            self.db_next = 0;
        }
        if q == usize::from(abi::EVENTQ) {
            self.event_bufs.clear();
        }
        Ok(())
    }

    /// Runs `f`, vhost-user requests of `what`, within the frontend's
    /// timeout ([`within`]).
    fn bounded<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Self) -> Result<T, FrontendError>,
    ) -> Result<T, FrontendError> {
        let timeout = self.timeout;
        let watchdog = arm(&self.fe, timeout)?;
        let r = f(self);
        expired(watchdog, what, timeout)?;
        r
    }

    fn start_queue(&mut self, q: usize, base: u32) -> Result<(), FrontendError> {
        let vq = &self.queues[q];
        self.fe.set_vring_num(q, vq.size())?;
        self.fe.set_vring_base(q, base as u16)?;
        self.fe.set_vring_addr(q, &vq.config(&self.mem)?)?;
        self.fe.set_vring_call(q, vq.call_fd())?;
        self.fe.set_vring_kick(q, vq.kick_fd())?;
        self.fe.set_vring_enable(q, true)?;
        Ok(())
    }
}

/// Runs `f`, vhost-user requests of `what` on `fe`, within `timeout`:
/// guest-lib's watchdog shuts the connection down when the backend has not
/// answered by then (the vhost crate retries a receive that `SO_RCVTIMEO`
/// ended, so the socket's timeout alone bounds nothing), and the error
/// says so.
fn within<T>(
    fe: &mut Frontend,
    timeout: Duration,
    what: &str,
    f: impl FnOnce(&mut Frontend) -> Result<T, FrontendError>,
) -> Result<T, FrontendError> {
    let watchdog = arm(fe, timeout)?;
    let r = f(fe);
    expired(watchdog, what, timeout)?;
    r
}

/// A watchdog on `fe`'s connection for `timeout`.
fn arm(
    fe: &Frontend,
    timeout: Duration,
) -> Result<vrnic_guest::vhost_user::Watchdog, FrontendError> {
    // SAFETY: `fe` owns the descriptor and outlives the call; the
    // watchdog keeps a duplicate of its own.
    let conn = unsafe { std::os::fd::BorrowedFd::borrow_raw(fe.as_raw_fd()) };
    vrnic_guest::vhost_user::Watchdog::arm(conn, timeout)
        .map_err(|e| FrontendError::Setup(format!("watchdog: {e}")))
}

/// Disarms `watchdog`; an error when it had fired.
fn expired(
    watchdog: vrnic_guest::vhost_user::Watchdog,
    what: &str,
    timeout: Duration,
) -> Result<(), FrontendError> {
    if watchdog.disarm() {
        return Err(FrontendError::Setup(format!(
            "the backend did not answer {what} within {timeout:?}"
        )));
    }
    Ok(())
}

/// The negotiation QEMU runs on a new connection, as guest-lib's
/// vhost-user driver runs it ([`vrnic_guest::vhost_user::negotiate`]), with
/// every reply bounded by `opts.timeout`. Returns the acknowledged features.
fn negotiate(fe: &mut Frontend, opts: &FrontendOptions) -> Result<u64, FrontendError> {
    vrnic_guest::vhost_user::set_recv_timeout(fe, opts.timeout)
        .map_err(|e| FrontendError::Setup(e.to_string()))?;
    vrnic_guest::vhost_user::negotiate(fe, opts.event_idx)
        .map_err(|e| FrontendError::Negotiation(e.to_string()))
}
