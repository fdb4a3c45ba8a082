//! The rings' fields, as a driver reads and writes them.

use crate::{need_event, QueueLayout, RawMemory, RingMemory, VirtqError, VIRTQ_USED_F_NO_NOTIFY};

/// A stateless view of a split virtqueue's rings (§2.7) in [`RingMemory`]:
/// every field a driver writes or reads, at the offsets of its
/// [`QueueLayout`], with the memory orders of §2.7.13 (descriptors and
/// ring entries before the avail index, which is stored with release
/// order) and §2.7.14 (the used index loaded with acquire order before the
/// entries it covers). Ring indices are free-running 16-bit counters; the
/// entry of index `i` is slot `i mod size`.
///
/// [`crate::SplitQueue`] keeps the driver's state over one; the shared
/// doorbell ring's producers, which share no private state, and a test
/// driver's deliberate protocol breaches use it directly.
#[derive(Debug)]
pub struct Ring<M: RingMemory = RawMemory> {
    mem: M,
    layout: QueueLayout,
}

impl<M: RingMemory> Ring<M> {
    /// The rings of `layout` at the start of `mem`. Errors: `mem` is
    /// shorter than `layout.len` ([`VirtqError::TooSmall`]).
    pub fn new(mem: M, layout: QueueLayout) -> Result<Self, VirtqError> {
        if mem.len() < layout.len {
            return Err(VirtqError::TooSmall {
                len: mem.len(),
                needed: layout.len,
            });
        }
        Ok(Ring { mem, layout })
    }

    /// The layout.
    pub fn layout(&self) -> QueueLayout {
        self.layout
    }

    /// Queue size, descriptors.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// The memory the rings live in.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    /// `i mod size` (size is a power of two).
    fn slot(&self, i: u16) -> usize {
        usize::from(i & (self.layout.size - 1))
    }

    /// Writes descriptor `i mod size` (§2.7.5: `addr`, `len`, `flags`,
    /// `next`, 16 bytes), field by field.
    pub fn write_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = self.layout.desc + 16 * self.slot(i);
        // SAFETY: descriptor slot < size lies in the table, inside
        // layout.len <= mem.len(); d is 16-aligned, so each field is
        // aligned to its size.
        unsafe {
            self.mem.write_u64(d, addr);
            self.mem.write_u32(d + 8, len);
            self.mem.write_u16(d + 12, flags);
            self.mem.write_u16(d + 14, next);
        }
    }

    /// The available ring's `flags` (§2.7.6).
    pub fn avail_flags(&self) -> u16 {
        // SAFETY: avail + 0, 2-aligned, inside the layout.
        unsafe { self.mem.read_u16(self.layout.avail) }
    }

    /// Writes the available ring's `flags`.
    pub fn set_avail_flags(&self, flags: u16) {
        // SAFETY: as in avail_flags.
        unsafe { self.mem.write_u16(self.layout.avail, flags) }
    }

    /// The available index as the memory holds it, loaded with acquire
    /// order (producers sharing the ring read what another published).
    pub fn avail_idx(&self) -> u16 {
        // SAFETY: avail + 2, 2-aligned, inside the layout.
        unsafe { self.mem.load_u16_acquire(self.layout.avail + 2) }
    }

    /// Writes the available ring's entry for ring index `idx` (slot
    /// `idx mod size`): the head of the chain made available as `idx`.
    pub fn set_avail_entry(&self, idx: u16, head: u16) {
        let at = self.layout.avail + 4 + 2 * self.slot(idx);
        // SAFETY: slot < size: inside the available ring, 2-aligned.
        unsafe { self.mem.write_u16(at, head) }
    }

    /// Stores the available index with release order (§2.7.13.2: the
    /// descriptors and ring entries written before are visible to a device
    /// that sees the index).
    pub fn publish_avail_idx(&self, idx: u16) {
        // SAFETY: avail + 2, 2-aligned, inside the layout.
        unsafe { self.mem.store_u16_release(self.layout.avail + 2, idx) }
    }

    /// Writes `used_event` (§2.7.10: with `VIRTIO_F_EVENT_IDX`, the device
    /// interrupts when its used index passes it).
    pub fn set_used_event(&self, idx: u16) {
        // SAFETY: the available ring's last field, 2-aligned, inside the layout.
        unsafe { self.mem.write_u16(self.layout.used_event(), idx) }
    }

    /// The used ring's `flags` (§2.7.8).
    pub fn used_flags(&self) -> u16 {
        // SAFETY: used + 0, 4-aligned, inside the layout.
        unsafe { self.mem.read_u16(self.layout.used) }
    }

    /// The device's used index, loaded with acquire order (§2.7.14: the
    /// entries and buffers it covers are visible after).
    pub fn used_idx(&self) -> u16 {
        // SAFETY: used + 2, 2-aligned, inside the layout.
        unsafe { self.mem.load_u16_acquire(self.layout.used + 2) }
    }

    /// The used ring's entry for ring index `idx` (slot `idx mod size`):
    /// `(id, len)` as the device wrote them (untrusted).
    pub fn used_elem(&self, idx: u16) -> (u32, u32) {
        let e = self.layout.used + 4 + 8 * self.slot(idx);
        // SAFETY: slot < size: inside the used ring; used is 4-aligned.
        unsafe { (self.mem.read_u32(e), self.mem.read_u32(e + 4)) }
    }

    /// `avail_event` (§2.7.10: with `VIRTIO_F_EVENT_IDX`, the device wants
    /// a notification when the avail index passes it).
    pub fn avail_event(&self) -> u16 {
        // SAFETY: the used ring's last field, 2-aligned, inside the layout.
        unsafe { self.mem.read_u16(self.layout.avail_event()) }
    }

    /// The memory's full barrier ([`RingMemory::full_barrier`]).
    pub fn full_barrier(&self) {
        self.mem.full_barrier();
    }

    /// Whether the device wants a notification for the chains made
    /// available as indices `old..new` (§2.7.10): with `event_idx`,
    /// whether the avail index passed `avail_event` ([`need_event`]);
    /// without, whether `VIRTQ_USED_F_NO_NOTIFY` is clear. Reads the
    /// device's field only: the caller puts the full barrier between its
    /// index store and this ([`crate::SplitQueue::needs_notify`] does).
    pub fn notify_wanted(&self, event_idx: bool, old: u16, new: u16) -> bool {
        if event_idx {
            need_event(self.avail_event(), new, old)
        } else {
            self.used_flags() & VIRTQ_USED_F_NO_NOTIFY == 0
        }
    }
}
