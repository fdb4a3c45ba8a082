//! The driver side of a split virtqueue (virtio 1.2 §2.7): descriptor
//! table, available ring and used ring in driver memory, kick and call
//! eventfds, and both notification-suppression schemes (§2.7.7 flags and
//! §2.7.10 `VIRTIO_F_EVENT_IDX`), honoured the way a guest driver must.

use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vhost::VringConfigData;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrnic::mem::DmaMemory;

use crate::memory::DriverMemory;
use crate::FrontendError;

/// `VIRTQ_DESC_F_NEXT`.
const F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`.
const F_WRITE: u16 = 2;
/// `VIRTQ_USED_F_NO_NOTIFY`.
const USED_F_NO_NOTIFY: u16 = 1;

/// One buffer of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Guest-physical address.
    pub addr: u64,
    /// Length, bytes.
    pub len: u32,
    /// Device-writable.
    pub writable: bool,
}

impl Buffer {
    /// A device-readable buffer.
    pub fn readable(addr: u64, len: u32) -> Self {
        Self {
            addr,
            len,
            writable: false,
        }
    }

    /// A device-writable buffer.
    pub fn writable(addr: u64, len: u32) -> Self {
        Self {
            addr,
            len,
            writable: true,
        }
    }
}

/// A used-ring element: the device finished the chain at `head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    /// Head descriptor index of the chain.
    pub head: u16,
    /// Bytes the device wrote into the chain's writable buffers.
    pub len: u32,
}

/// A split virtqueue as a driver drives it.
pub struct SplitQueue {
    index: u16,
    size: u16,
    event_idx: bool,
    desc: u64,
    avail: u64,
    used: u64,
    free: Vec<u16>,
    /// Descriptors of each in-flight chain, by head.
    chains: Vec<Vec<u16>>,
    avail_idx: u16,
    last_used: u16,
    kick: EventFd,
    call: EventFd,
}

impl SplitQueue {
    /// Allocates the rings of queue `index` with `size` entries (a power of
    /// two) in `mem`. `event_idx`: `VIRTIO_F_EVENT_IDX` was negotiated.
    ///
    /// # Errors
    /// [`FrontendError::OutOfMemory`], or [`FrontendError::Setup`] for a
    /// bad size or when the eventfds cannot be made.
    pub fn new(
        mem: &mut DriverMemory,
        index: u16,
        size: u16,
        event_idx: bool,
    ) -> Result<Self, FrontendError> {
        if size == 0 || !size.is_power_of_two() {
            return Err(FrontendError::Setup(format!(
                "queue size {size} is not a power of two"
            )));
        }
        let n = u64::from(size);
        let desc = mem.alloc(16 * n, 16)?;
        let avail = mem.alloc(6 + 2 * n, 2)?;
        let used = mem.alloc(6 + 8 * n, 4)?;
        let efd = || {
            EventFd::new(EFD_NONBLOCK).map_err(|e| FrontendError::Setup(format!("eventfd: {e}")))
        };
        Ok(Self {
            index,
            size,
            event_idx,
            desc,
            avail,
            used,
            free: (0..size).rev().collect(),
            chains: vec![Vec::new(); usize::from(size)],
            avail_idx: 0,
            last_used: 0,
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
        self.size
    }

    /// Guest-physical addresses of the descriptor table, the available
    /// ring and the used ring, for tests that write them by hand.
    pub fn rings(&self) -> (u64, u64, u64) {
        (self.desc, self.avail, self.used)
    }

    /// Free descriptors.
    pub fn free_descriptors(&self) -> usize {
        self.free.len()
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
        Ok(VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: 0,
            desc_table_addr: host(self.desc)?,
            used_ring_addr: host(self.used)?,
            avail_ring_addr: host(self.avail)?,
            log_addr: None,
        })
    }

    /// Makes a chain of `bufs` available (descriptors, avail ring entry and
    /// index, with the barriers of virtio 1.2 §2.7.13) and kicks the device
    /// if it asked for kicks. Returns the chain's head.
    ///
    /// # Errors
    /// [`FrontendError::QueueFull`] without enough free descriptors;
    /// [`FrontendError::Setup`] for an empty chain.
    pub fn add(&mut self, mem: &DriverMemory, bufs: &[Buffer]) -> Result<u16, FrontendError> {
        if bufs.is_empty() {
            return Err(FrontendError::Setup("empty chain".into()));
        }
        if bufs.len() > self.free.len() {
            return Err(FrontendError::QueueFull(self.index));
        }
        let ids: Vec<u16> = (0..bufs.len()).filter_map(|_| self.free.pop()).collect();
        let m = mem.mem();
        for (i, b) in bufs.iter().enumerate() {
            let next = ids.get(i + 1).copied();
            let flags =
                if b.writable { F_WRITE } else { 0 } | if next.is_some() { F_NEXT } else { 0 };
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&b.addr.to_le_bytes());
            d[8..12].copy_from_slice(&b.len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&next.unwrap_or(0).to_le_bytes());
            m.write(self.desc + 16 * u64::from(ids[i]), &d)?;
        }
        let head = ids[0];
        self.chains[usize::from(head)] = ids;
        let slot = self.avail + 4 + 2 * u64::from(self.avail_idx % self.size);
        m.write(slot, &head.to_le_bytes())?;
        let old = self.avail_idx;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        fence(Ordering::SeqCst);
        m.write(self.avail + 2, &self.avail_idx.to_le_bytes())?;
        fence(Ordering::SeqCst);
        if self.needs_kick(mem, old, self.avail_idx)? {
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
    /// [`SplitQueue::republish`] undoes it.
    ///
    /// # Errors
    /// [`FrontendError::Mem`] if the ring is outside memory.
    pub fn write_avail_idx(&self, mem: &DriverMemory, idx: u16) -> Result<(), FrontendError> {
        mem.mem().write(self.avail + 2, &idx.to_le_bytes())?;
        Ok(())
    }

    /// A hostile driver: makes chain `head` (already made available once)
    /// available again and again, keeping the avail index a ring ahead of
    /// the device's used index, until `stop` is set; kicks every 1024
    /// moves, and sleeps `pause` after each (zero: never). Returns how many
    /// times it moved the index. The queue is unusable afterwards.
    ///
    /// # Errors
    /// [`FrontendError::Mem`] if the ring is outside memory.
    pub fn flood(
        &self,
        mem: &DriverMemory,
        head: u16,
        stop: &std::sync::atomic::AtomicBool,
        pause: std::time::Duration,
    ) -> Result<u64, FrontendError> {
        let m = mem.mem();
        for i in 0..u64::from(self.size) {
            m.write(self.avail + 4 + 2 * i, &head.to_le_bytes())?;
        }
        let mut moves = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let mut used = [0u8; 2];
            m.read(self.used + 2, &mut used)?;
            let idx = u16::from_le_bytes(used).wrapping_add(self.size - 1);
            fence(Ordering::SeqCst);
            self.write_avail_idx(mem, idx)?;
            moves += 1;
            if moves.is_multiple_of(1024) {
                self.kick();
            }
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
        Ok(moves)
    }

    /// Writes the driver's true available index again and kicks.
    ///
    /// # Errors
    /// [`FrontendError::Mem`] if the ring is outside memory.
    pub fn republish(&self, mem: &DriverMemory) -> Result<(), FrontendError> {
        self.write_avail_idx(mem, self.avail_idx)?;
        fence(Ordering::SeqCst);
        self.kick();
        Ok(())
    }

    /// Whether the device would want a kick for the next chain made
    /// available (notifications on: no `VIRTQ_USED_F_NO_NOTIFY`, or with
    /// `VIRTIO_F_EVENT_IDX` an avail event at the current index).
    ///
    /// # Errors
    /// [`FrontendError::Mem`] if the ring is outside memory.
    pub fn wants_kick(&self, mem: &DriverMemory) -> Result<bool, FrontendError> {
        self.needs_kick(mem, self.avail_idx, self.avail_idx.wrapping_add(1))
    }

    /// Whether the device wants a kick for entries `old..new`.
    fn needs_kick(&self, mem: &DriverMemory, old: u16, new: u16) -> Result<bool, FrontendError> {
        let m = mem.mem();
        let mut b = [0u8; 2];
        if self.event_idx {
            m.read(self.used + 4 + 8 * u64::from(self.size), &mut b)?;
            let ev = u16::from_le_bytes(b);
            Ok(new.wrapping_sub(ev).wrapping_sub(1) < new.wrapping_sub(old))
        } else {
            m.read(self.used, &mut b)?;
            Ok(u16::from_le_bytes(b) & USED_F_NO_NOTIFY == 0)
        }
    }

    /// The next used element, if the device returned one. Frees the chain's
    /// descriptors.
    ///
    /// # Errors
    /// [`FrontendError::BadUsed`] when the device returned a head that is
    /// not in flight.
    pub fn pop_used(&mut self, mem: &DriverMemory) -> Result<Option<Used>, FrontendError> {
        let m = mem.mem();
        let mut b = [0u8; 2];
        m.read(self.used + 2, &mut b)?;
        if u16::from_le_bytes(b) == self.last_used {
            return Ok(None);
        }
        fence(Ordering::Acquire);
        let mut e = [0u8; 8];
        m.read(
            self.used + 4 + 8 * u64::from(self.last_used % self.size),
            &mut e,
        )?;
        self.last_used = self.last_used.wrapping_add(1);
        let id = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
        let len = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let chain = usize::try_from(id)
            .ok()
            .and_then(|i| self.chains.get_mut(i))
            .map(std::mem::take)
            .filter(|c| !c.is_empty())
            .ok_or(FrontendError::BadUsed {
                queue: self.index,
                head: id,
            })?;
        self.free.extend(chain);
        Ok(Some(Used {
            head: id as u16,
            len,
        }))
    }

    /// Waits up to `timeout` for the next used element, sleeping on the
    /// call eventfd (after asking for a call with `used_event` under
    /// EVENT_IDX).
    ///
    /// # Errors
    /// [`FrontendError::Timeout`] if none came; as [`SplitQueue::pop_used`].
    pub fn wait_used(
        &mut self,
        mem: &DriverMemory,
        timeout: Duration,
    ) -> Result<Used, FrontendError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.event_idx {
                let at = self.avail + 4 + 2 * u64::from(self.size);
                mem.mem().write(at, &self.last_used.to_le_bytes())?;
                fence(Ordering::SeqCst);
            }
            if let Some(u) = self.pop_used(mem)? {
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
pub(crate) fn wait_readable(fd: &impl AsRawFd, timeout: Duration) -> bool {
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}
