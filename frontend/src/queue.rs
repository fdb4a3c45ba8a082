//! The frontend's virtqueues: `vrnic-virtq`'s driver-side split virtqueue
//! (virtio 1.2 §2.7, the one guest-lib's drivers use) on rings in the
//! frontend's guest RAM, with vhost-user's kick and call eventfds, both
//! notification-suppression schemes (§2.7.7 flags, §2.7.10
//! `VIRTIO_F_EVENT_IDX`) honoured the way a guest driver must, and the
//! protocol breaches robustness tests make on purpose (chains in any
//! order, avail index overwrites, a flood).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vhost::VringConfigData;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrnic_virtq::{QueueConfig, QueueLayout, RawMemory, SplitQueue, VirtqError};

use crate::memory::DriverMemory;
use crate::FrontendError;

/// One buffer of a chain: guest-physical address, length, whether the
/// device writes it.
pub use vrnic_virtq::BufDesc as Buffer;
/// A used-ring element: the device finished the chain at `id` (its head).
pub use vrnic_virtq::UsedElem as Used;

/// A split virtqueue as the test frontend drives it: the driver's state
/// ([`vrnic_virtq::SplitQueue`]), its rings' guest-physical addresses and
/// its eventfds. Made by [`crate::TestFrontend`] only, whose guest RAM
/// holds the rings for as long as the frontend (and so the queue) lives.
pub struct FrontendQueue {
    index: u16,
    q: SplitQueue<RawMemory>,
    kick: EventFd,
    call: EventFd,
}

impl FrontendQueue {
    /// Allocates the rings of queue `index` with `size` entries (a power of
    /// two) in `mem` (one allocation laid out as [`QueueLayout`] says: the
    /// descriptor table, the available ring right after it, the used ring
    /// 4-aligned after that) and starts the driver's state: interrupts
    /// asked for; `event_idx`: `VIRTIO_F_EVENT_IDX` was negotiated.
    ///
    /// # Errors
    /// [`FrontendError::OutOfMemory`], or [`FrontendError::Setup`] for a
    /// bad size or when the eventfds cannot be made.
    pub(crate) fn new(
        mem: &mut DriverMemory,
        index: u16,
        size: u16,
        event_idx: bool,
    ) -> Result<Self, FrontendError> {
        let layout = QueueLayout::new(size).map_err(|_| {
            FrontendError::Setup(format!("queue size {size} is not a power of two"))
        })?;
        let gpa = mem.alloc(layout.len as u64, QueueLayout::ALIGN as u64)?;
        let host = mem
            .host_addr(gpa)
            .ok_or_else(|| FrontendError::Setup(format!("ring at {gpa:#x} not mapped")))?;
        // SAFETY: [gpa, gpa + layout.len) was allocated in one region of
        // `mem` (the allocator never crosses a region boundary), which is
        // one shared mapping in this process: `host` is valid for
        // layout.len bytes, and the allocator gives it to nothing else.
        // The mapping lives as long as `mem`, which the TestFrontend owns
        // beside its queues (and only it makes queues): no access through
        // the queue outlives it (dropping a queue touches no memory).
        let raw = unsafe { RawMemory::new(host as *mut u8, layout.len) }
            .map_err(|e| FrontendError::Setup(e.to_string()))?;
        let config = QueueConfig {
            event_idx,
            interrupts: true,
        };
        let q = SplitQueue::new(raw, layout, gpa, config)
            .map_err(|e| FrontendError::Setup(e.to_string()))?;
        let efd = || {
            EventFd::new(EFD_NONBLOCK).map_err(|e| FrontendError::Setup(format!("eventfd: {e}")))
        };
        Ok(Self {
            index,
            q,
            kick: efd()?,
            call: efd()?,
        })
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Queue size, entries.
    pub fn size(&self) -> u16 {
        self.q.size()
    }

    /// Guest-physical addresses of the descriptor table, the available
    /// ring and the used ring, for tests that write them by hand.
    pub fn rings(&self) -> (u64, u64, u64) {
        (self.q.desc_gpa(), self.q.avail_gpa(), self.q.used_gpa())
    }

    /// Free descriptors.
    pub fn free_descriptors(&self) -> usize {
        usize::from(self.q.num_free())
    }

    /// The kick eventfd (`SET_VRING_KICK`).
    pub fn kick_fd(&self) -> &EventFd {
        &self.kick
    }

    /// The call eventfd (`SET_VRING_CALL`).
    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }

    /// `SET_VRING_ADDR` data: the rings' addresses in this process.
    ///
    /// # Errors
    /// [`FrontendError::Setup`] if a ring is not in `mem`.
    pub fn config(&self, mem: &DriverMemory) -> Result<VringConfigData, FrontendError> {
        let host = |gpa| {
            mem.host_addr(gpa)
                .ok_or_else(|| FrontendError::Setup(format!("ring at {gpa:#x} not mapped")))
        };
        let (desc, avail, used) = self.rings();
        Ok(VringConfigData {
            queue_max_size: self.size(),
            queue_size: self.size(),
            flags: 0,
            desc_table_addr: host(desc)?,
            used_ring_addr: host(used)?,
            avail_ring_addr: host(avail)?,
            log_addr: None,
        })
    }

    fn error(&self, e: VirtqError) -> FrontendError {
        match e {
            VirtqError::Full { .. } => FrontendError::QueueFull(self.index),
            VirtqError::EmptyChain => FrontendError::Setup("empty chain".into()),
            VirtqError::BadUsedId(head) => FrontendError::BadUsed {
                queue: self.index,
                head,
            },
            source => FrontendError::Queue {
                queue: self.index,
                source,
            },
        }
    }

    /// Makes a chain of `bufs` available, readable and writable buffers in
    /// whatever order they come (a test may break §2.7.4.2 on purpose), and
    /// kicks the device if it asked for kicks
    /// ([`SplitQueue::needs_notify`]). Returns the chain's head.
    ///
    /// # Errors
    /// [`FrontendError::QueueFull`] without enough free descriptors;
    /// [`FrontendError::Setup`] for an empty chain.
    pub fn add(&mut self, bufs: &[Buffer]) -> Result<u16, FrontendError> {
        let head = self.q.add_any_order(bufs).map_err(|e| self.error(e))?;
        if self.q.needs_notify() {
            self.kick();
        }
        Ok(head)
    }

    /// Kicks the device unconditionally.
    pub fn kick(&self) {
        let _ = self.kick.write(1);
    }

    /// Overwrites the available ring's index with `idx` without changing
    /// what the driver thinks it published; for robustness tests.
    /// [`FrontendQueue::republish`] undoes it.
    pub fn write_avail_idx(&self, idx: u16) {
        self.q.ring().publish_avail_idx(idx);
    }

    /// A hostile driver: makes chain `head` (already made available once)
    /// available again and again, keeping the avail index a ring ahead of
    /// the device's used index, until `stop` is set; kicks every 1024
    /// moves, and sleeps `pause` after each (zero: never). Returns how many
    /// times it moved the index. The queue is unusable afterwards.
    pub fn flood(&self, head: u16, stop: &AtomicBool, pause: Duration) -> u64 {
        let ring = self.q.ring();
        for i in 0..self.size() {
            ring.set_avail_entry(i, head);
        }
        let mut moves = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let idx = ring.used_idx().wrapping_add(self.size() - 1);
            ring.full_barrier();
            ring.publish_avail_idx(idx);
            moves += 1;
            if moves.is_multiple_of(1024) {
                self.kick();
            }
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
        moves
    }

    /// Writes the driver's true available index again and kicks.
    pub fn republish(&self) {
        self.write_avail_idx(self.q.avail_idx());
        self.q.ring().full_barrier();
        self.kick();
    }

    /// Whether the device would want a kick for the next chain made
    /// available (notifications on: no `VIRTQ_USED_F_NO_NOTIFY`, or with
    /// `VIRTIO_F_EVENT_IDX` an avail event at the current index).
    pub fn wants_kick(&self) -> bool {
        self.q.wants_notify_next()
    }

    /// The next used element, if the device returned one. Frees the chain's
    /// descriptors.
    ///
    /// # Errors
    /// [`FrontendError::BadUsed`] when the device returned a head that is
    /// not in flight; [`FrontendError::Queue`] when its used index ran
    /// more than a queue ahead.
    pub fn pop_used(&mut self) -> Result<Option<Used>, FrontendError> {
        self.q.pop_used().map_err(|e| self.error(e))
    }

    /// Waits up to `timeout` for the next used element, sleeping on the
    /// call eventfd (after asking for a call with `used_event` under
    /// `VIRTIO_F_EVENT_IDX`; without it the queue's flags ask for every
    /// call).
    ///
    /// # Errors
    /// [`FrontendError::Timeout`] if none came; as [`FrontendQueue::pop_used`].
    pub fn wait_used(&mut self, timeout: Duration) -> Result<Used, FrontendError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.q.event_idx() {
                self.q.set_interrupts(true);
            }
            if let Some(u) = self.pop_used()? {
                return Ok(u);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FrontendError::Timeout {
                    queue: self.index,
                    waited: timeout,
                });
            }
            wait_readable(&self.call, left);
            let _ = self.call.read();
        }
    }
}

/// Waits until `fd` is readable or `timeout` passes.
fn wait_readable(fd: &impl AsRawFd, timeout: Duration) -> bool {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}
