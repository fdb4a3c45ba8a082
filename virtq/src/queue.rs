//! The driver's state over a split virtqueue.

use crate::{
    BufDesc, QueueLayout, RawMemory, Ring, RingMemory, UsedElem, VirtqError,
    VIRTQ_AVAIL_F_NO_INTERRUPT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
};

/// How a [`SplitQueue`] is driven.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueConfig {
    /// `VIRTIO_F_EVENT_IDX` was negotiated (§2.7.10): kicks are decided on
    /// the device's `avail_event`, interrupts asked for with `used_event`;
    /// otherwise on `VIRTQ_USED_F_NO_NOTIFY` and with
    /// `VIRTQ_AVAIL_F_NO_INTERRUPT` (§2.7.7).
    pub event_idx: bool,
    /// Whether the queue starts asking for interrupts. `false`: polled;
    /// without `event_idx`, `VIRTQ_AVAIL_F_NO_INTERRUPT` is set at once.
    /// (With `event_idx` the flags stay 0, §2.7.7.2; `used_event` starts at
    /// 0.)
    pub interrupts: bool,
}

impl QueueConfig {
    /// Polled, without `VIRTIO_F_EVENT_IDX`: the guest drivers' queues.
    pub const POLLED: QueueConfig = QueueConfig {
        event_idx: false,
        interrupts: false,
    };
}

const NONE: u16 = u16::MAX;

/// The driver side of a split virtqueue (§2.7) over a [`Ring`]. Tracks free
/// descriptors in a private free list (never trusting what the device
/// could write into shared memory), publishes chains on the available ring,
/// reaps the used ring and decides kicks.
///
/// Memory ordering (the `virtio_wmb`/`virtio_rmb`/`virtio_mb` of §2.7.13
/// and §2.7.14): descriptors and the ring entry are written before
/// `avail.idx` is stored with release order ([`SplitQueue::add`]);
/// `used.idx` is loaded with acquire order before the used entry and the
/// device-written buffers are read ([`SplitQueue::pop_used`]); a full
/// barrier separates publishing from reading the device's suppression
/// field ([`SplitQueue::needs_notify`]) and asking for interrupts from
/// re-checking the used ring ([`SplitQueue::set_interrupts`]).
///
/// Free descriptors form a list through `next`: [`SplitQueue::add`] takes
/// them from its head, [`SplitQueue::pop_used`] puts a returned chain back
/// at its head, so a freed chain's descriptors are the next used.
#[derive(Debug)]
pub struct SplitQueue<M: RingMemory = RawMemory> {
    ring: Ring<M>,
    desc_gpa: u64,
    avail_gpa: u64,
    used_gpa: u64,
    event_idx: bool,
    interrupts: bool,
    /// Next free descriptor after each free one ([`NONE`] ends the list).
    next: Vec<u16>,
    /// Descriptors of the chain headed by each in-flight head; 0 otherwise.
    chain_len: Vec<u16>,
    free_head: u16,
    num_free: u16,
    /// The avail index this driver published last.
    avail_idx: u16,
    /// The avail index at the last kick decision.
    notified_idx: u16,
    /// The used index this driver has reaped up to.
    last_used: u16,
}

impl<M: RingMemory> SplitQueue<M> {
    /// A queue on the rings of `layout` in `mem`, whose device address
    /// (guest-physical) is `gpa`. Zeroes the rings, then asks for
    /// interrupts or not as `config` says.
    ///
    /// Errors: `mem` shorter than the layout ([`VirtqError::TooSmall`]).
    pub fn new(
        mem: M,
        layout: QueueLayout,
        gpa: u64,
        config: QueueConfig,
    ) -> Result<Self, VirtqError> {
        let ring = Ring::new(mem, layout)?;
        // SAFETY: [0, layout.len) lies in the memory (Ring::new checked).
        unsafe { ring.memory().zero(0, layout.len) };
        let n = layout.size as usize;
        let q = SplitQueue {
            ring,
            desc_gpa: gpa + layout.desc as u64,
            avail_gpa: gpa + layout.avail as u64,
            used_gpa: gpa + layout.used as u64,
            event_idx: config.event_idx,
            interrupts: config.interrupts,
            next: (1..=n as u32)
                .map(|i| if i as usize == n { NONE } else { i as u16 })
                .collect(),
            chain_len: vec![0; n],
            free_head: 0,
            num_free: layout.size,
            avail_idx: 0,
            notified_idx: 0,
            last_used: 0,
        };
        if !config.event_idx && !config.interrupts {
            q.ring.set_avail_flags(VIRTQ_AVAIL_F_NO_INTERRUPT);
        }
        Ok(q)
    }

    /// The rings, for drivers that write them by hand (tests of a device's
    /// robustness) or read what the device wrote.
    pub fn ring(&self) -> &Ring<M> {
        &self.ring
    }

    /// Queue size (descriptors).
    pub fn size(&self) -> u16 {
        self.ring.size()
    }

    /// Whether `VIRTIO_F_EVENT_IDX` drives this queue.
    pub fn event_idx(&self) -> bool {
        self.event_idx
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    /// Descriptors in chains the device has not returned yet.
    pub fn in_flight(&self) -> u16 {
        self.size() - self.num_free
    }

    /// The avail index this driver published last (what `avail.idx` holds
    /// unless someone wrote it behind the queue's back).
    pub fn avail_idx(&self) -> u16 {
        self.avail_idx
    }

    /// The descriptor the next [`SplitQueue::add`] will use as the chain's
    /// head (lets a caller bind per-descriptor buffers to chains); `None`
    /// when the queue is full.
    pub fn next_head(&self) -> Option<u16> {
        (self.num_free > 0).then_some(self.free_head)
    }

    /// Guest-physical address of the descriptor table.
    pub fn desc_gpa(&self) -> u64 {
        self.desc_gpa
    }

    /// Guest-physical address of the available ring (driver area).
    pub fn avail_gpa(&self) -> u64 {
        self.avail_gpa
    }

    /// Guest-physical address of the used ring (device area).
    pub fn used_gpa(&self) -> u64 {
        self.used_gpa
    }

    /// Asks the device to interrupt after it adds used buffers (`true`) or
    /// not to (`false`), §2.7.7 and §2.7.10. Without `VIRTIO_F_EVENT_IDX`:
    /// clears or sets `VIRTQ_AVAIL_F_NO_INTERRUPT`. With it, `true` writes
    /// `used_event` = the used index reaped so far (an interrupt when the
    /// device uses the next buffer; call again after reaping to re-arm),
    /// `false` writes nothing (the flags stay 0; the device interrupts at
    /// most once more). A full barrier follows ([`Ring::full_barrier`]),
    /// so a caller that then re-checks the used ring cannot miss a buffer
    /// the device added without interrupting.
    pub fn set_interrupts(&mut self, on: bool) {
        self.interrupts = on;
        if self.event_idx {
            if on {
                self.ring.set_used_event(self.last_used);
            }
        } else {
            self.ring
                .set_avail_flags(if on { 0 } else { VIRTQ_AVAIL_F_NO_INTERRUPT });
        }
        self.ring.full_barrier();
    }

    /// Whether the queue asks for interrupts (the last
    /// [`SplitQueue::set_interrupts`], or the configuration).
    pub fn interrupts(&self) -> bool {
        self.interrupts
    }

    /// Adds a chain of buffers and makes it available to the device:
    /// descriptors, then the available ring entry, then (release)
    /// `avail.idx`. Device-readable buffers must precede device-writable
    /// ones (§2.7.4.2). Returns the head descriptor index, which
    /// [`SplitQueue::pop_used`] reports when the device is done. Does not
    /// notify ([`SplitQueue::needs_notify`]).
    ///
    /// Errors: empty chain, readable after writable, not enough free
    /// descriptors ([`VirtqError::Full`]); nothing is changed then.
    pub fn add(&mut self, bufs: &[BufDesc]) -> Result<u16, VirtqError> {
        if bufs.is_empty() {
            return Err(VirtqError::EmptyChain);
        }
        if bufs.windows(2).any(|w| w[0].writable && !w[1].writable) {
            return Err(VirtqError::ReadableAfterWritable);
        }
        self.add_any_order(bufs)
    }

    /// [`SplitQueue::add`] without the order check: a chain may mix
    /// device-readable and device-writable buffers in any order, as a
    /// driver testing a device's handling of a chain that breaks §2.7.4.2
    /// needs.
    ///
    /// Errors: empty chain, not enough free descriptors.
    pub fn add_any_order(&mut self, bufs: &[BufDesc]) -> Result<u16, VirtqError> {
        if bufs.is_empty() {
            return Err(VirtqError::EmptyChain);
        }
        if bufs.len() > self.num_free as usize {
            return Err(VirtqError::Full {
                needed: bufs.len(),
                free: self.num_free,
            });
        }
        let head = self.free_head;
        let mut i = head;
        for (k, b) in bufs.iter().enumerate() {
            let last = k + 1 == bufs.len();
            let nxt = self.next[i as usize];
            let mut flags = if b.writable { VIRTQ_DESC_F_WRITE } else { 0 };
            if !last {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            self.ring
                .write_desc(i, b.addr, b.len, flags, if last { 0 } else { nxt });
            i = nxt;
        }
        self.free_head = i;
        self.num_free -= bufs.len() as u16;
        self.chain_len[head as usize] = bufs.len() as u16;
        self.ring.set_avail_entry(self.avail_idx, head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // Release: the descriptors and the ring entry are visible before the index.
        self.ring.publish_avail_idx(self.avail_idx);
        Ok(head)
    }

    /// Whether the device wants a notification for the chains added since
    /// the last call (§2.7.10): a full barrier ([`Ring::full_barrier`]: the
    /// index store must be visible before the device's field is read),
    /// then [`Ring::notify_wanted`] for the avail indices from the last
    /// call's to the current one. Call it after adding, and notify when it
    /// says so.
    pub fn needs_notify(&mut self) -> bool {
        self.ring.full_barrier();
        let old = std::mem::replace(&mut self.notified_idx, self.avail_idx);
        self.ring.notify_wanted(self.event_idx, old, self.avail_idx)
    }

    /// Whether the device would want a notification for one more chain
    /// made available now ([`Ring::notify_wanted`] for the next index; no
    /// barrier: a snapshot of the device's field, for tests that wait for
    /// a device to ask for kicks again).
    pub fn wants_notify_next(&self) -> bool {
        self.ring.notify_wanted(
            self.event_idx,
            self.avail_idx,
            self.avail_idx.wrapping_add(1),
        )
    }

    /// Reaps the next chain the device has finished with, returning its
    /// descriptors to the free list; `Ok(None)` when there is none. The
    /// device-written contents of the chain's buffers are visible to the
    /// caller after this returns `Some`.
    ///
    /// Errors (the device broke the protocol): [`VirtqError::BadUsedId`]
    /// (the entry is skipped), [`VirtqError::BadUsedIdx`] (nothing is
    /// reaped).
    pub fn pop_used(&mut self) -> Result<Option<UsedElem>, VirtqError> {
        let used = self.ring.used_idx();
        if used == self.last_used {
            return Ok(None);
        }
        let size = self.size();
        let ahead = used.wrapping_sub(self.last_used);
        if ahead > size {
            return Err(VirtqError::BadUsedIdx { used, ahead, size });
        }
        let (id, len) = self.ring.used_elem(self.last_used);
        self.last_used = self.last_used.wrapping_add(1);
        if id >= u32::from(size) || self.chain_len[id as usize] == 0 {
            return Err(VirtqError::BadUsedId(id));
        }
        let head = id as u16;
        let n = self.chain_len[head as usize];
        let mut tail = head;
        for _ in 1..n {
            tail = self.next[tail as usize];
        }
        self.next[tail as usize] = if self.num_free == 0 {
            NONE
        } else {
            self.free_head
        };
        self.free_head = head;
        self.num_free += n;
        self.chain_len[head as usize] = 0;
        Ok(Some(UsedElem { id: head, len }))
    }
}

#[cfg(test)]
mod tests;
