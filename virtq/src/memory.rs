//! How a queue reaches the memory its rings live in.

use std::ptr;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::{QueueLayout, VirtqError};

/// The memory a split virtqueue's rings live in, shared with the device,
/// addressed by byte offset from its start. Values are in CPU order; the
/// memory holds them little-endian (virtio 1.x rings are little-endian,
/// §2.7). Every access is one naturally aligned load or store the device
/// cannot see torn; plain accesses are volatile (the device changes the
/// memory at any time), and the `*_acquire`/`*_release` ones carry those
/// orders against the device's accesses (§2.7.13, §2.7.14).
///
/// [`Ring`](crate::Ring) calls these only with offsets inside its
/// [`QueueLayout`], which it checks against [`RingMemory::len`] once.
///
/// # Safety
/// An implementation must make every access with `off + size <= len()`
/// and `off` a multiple of the access's size valid for as long as the
/// value lives, with the alignment of `off` meaning alignment in memory
/// (the memory's start is [`QueueLayout::ALIGN`]-aligned), and give the
/// acquire and release accesses those orders.
pub unsafe trait RingMemory {
    /// Length of the memory, bytes.
    fn len(&self) -> usize;

    /// Whether the memory is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the u16 at `off`.
    ///
    /// # Safety
    /// `off + 2 <= len()`, `off` even.
    unsafe fn read_u16(&self, off: usize) -> u16;

    /// Reads the u32 at `off`.
    ///
    /// # Safety
    /// `off + 4 <= len()`, `off` a multiple of 4.
    unsafe fn read_u32(&self, off: usize) -> u32;

    /// Writes the u16 at `off`.
    ///
    /// # Safety
    /// As [`RingMemory::read_u16`].
    unsafe fn write_u16(&self, off: usize, v: u16);

    /// Writes the u32 at `off`.
    ///
    /// # Safety
    /// As [`RingMemory::read_u32`].
    unsafe fn write_u32(&self, off: usize, v: u32);

    /// Writes the u64 at `off`.
    ///
    /// # Safety
    /// `off + 8 <= len()`, `off` a multiple of 8.
    unsafe fn write_u64(&self, off: usize, v: u64);

    /// Loads the u16 at `off` with acquire order: what the device wrote
    /// before storing it (release) is visible after.
    ///
    /// # Safety
    /// As [`RingMemory::read_u16`].
    unsafe fn load_u16_acquire(&self, off: usize) -> u16;

    /// Stores the u16 at `off` with release order: every access before it
    /// is visible to a device that loads it (acquire).
    ///
    /// # Safety
    /// As [`RingMemory::read_u16`].
    unsafe fn store_u16_release(&self, off: usize, v: u16);

    /// Zeroes `[off, off + len)`, before the device is given the rings.
    ///
    /// # Safety
    /// `off + len <= self.len()`.
    unsafe fn zero(&self, off: usize, len: usize);

    /// A full barrier between this driver's accesses to the memory: no
    /// load after it is performed before a store before it is visible to
    /// the device. [`crate::barrier::mb`] unless the memory is reached some
    /// other way.
    fn full_barrier(&self) {
        crate::barrier::mb();
    }
}

/// Ring memory mapped in this process: DMA memory (the virtio-pci driver),
/// a shared memfd (the vhost-user drivers' guest RAM, the agent's shared
/// doorbell region). A copyable description; the mapping must outlive
/// every copy (see [`RawMemory::new`]).
#[derive(Clone, Copy, Debug)]
pub struct RawMemory {
    base: *mut u8,
    len: usize,
}

// SAFETY: RawMemory describes memory shared with a device; it has no
// thread affinity, and every access is a single volatile or atomic load or
// store whose ordering the ring's protocol provides.
unsafe impl Send for RawMemory {}
// SAFETY: as above: concurrent accesses through copies are what shared
// ring memory is for (the shared doorbell ring's producers).
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// The `len` bytes at `base`. Errors: `base` is not
    /// [`QueueLayout::ALIGN`]-aligned ([`VirtqError::Misaligned`]).
    ///
    /// # Safety
    /// `base..base + len` must be valid for volatile and atomic reads and
    /// writes, shared with nothing but the device and drivers following
    /// the ring's protocol, for as long as this value, a copy of it or a
    /// queue made of it is used.
    pub unsafe fn new(base: *mut u8, len: usize) -> Result<Self, VirtqError> {
        if !(base as usize).is_multiple_of(QueueLayout::ALIGN) {
            return Err(VirtqError::Misaligned(base as usize));
        }
        Ok(RawMemory { base, len })
    }

    /// The memory's first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base
    }

    fn at<T>(&self, off: usize) -> *mut T {
        // SAFETY (of the callers' dereferences): callers pass an offset
        // within len (RingMemory's contract); `add` stays in the mapping.
        self.base.wrapping_add(off).cast()
    }
}

// SAFETY: `new`'s contract makes [base, base + len) valid; base is
// ALIGN-aligned, so an offset aligned to an access's size is an aligned
// address; AtomicU16 accesses give the acquire and release orders.
unsafe impl RingMemory for RawMemory {
    fn len(&self) -> usize {
        self.len
    }

    unsafe fn read_u16(&self, off: usize) -> u16 {
        // SAFETY: in bounds and aligned per the caller's contract.
        u16::from_le(unsafe { ptr::read_volatile(self.at::<u16>(off)) })
    }

    unsafe fn read_u32(&self, off: usize) -> u32 {
        // SAFETY: as above.
        u32::from_le(unsafe { ptr::read_volatile(self.at::<u32>(off)) })
    }

    unsafe fn write_u16(&self, off: usize, v: u16) {
        // SAFETY: as above.
        unsafe { ptr::write_volatile(self.at::<u16>(off), v.to_le()) }
    }

    unsafe fn write_u32(&self, off: usize, v: u32) {
        // SAFETY: as above.
        unsafe { ptr::write_volatile(self.at::<u32>(off), v.to_le()) }
    }

    unsafe fn write_u64(&self, off: usize, v: u64) {
        // SAFETY: as above.
        unsafe { ptr::write_volatile(self.at::<u64>(off), v.to_le()) }
    }

    unsafe fn load_u16_acquire(&self, off: usize) -> u16 {
        // SAFETY: as above; 2-aligned, valid for the memory's life, which
        // outlasts the reference.
        u16::from_le(unsafe { AtomicU16::from_ptr(self.at::<u16>(off)) }.load(Ordering::Acquire))
    }

    unsafe fn store_u16_release(&self, off: usize, v: u16) {
        // SAFETY: as above.
        unsafe { AtomicU16::from_ptr(self.at::<u16>(off)) }.store(v.to_le(), Ordering::Release)
    }

    unsafe fn zero(&self, off: usize, len: usize) {
        // SAFETY: in bounds per the caller's contract.
        unsafe { ptr::write_bytes(self.at::<u8>(off), 0, len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Mem;

    #[test]
    fn raw_memory_is_little_endian_and_checks_alignment() {
        let m = Mem::new(64);
        // SAFETY: m is 64 bytes and outlives r.
        let r = unsafe { RawMemory::new(m.ptr, 64) }.unwrap();
        assert_eq!(r.len(), 64);
        assert!(!r.is_empty());
        // SAFETY: offsets in bounds and aligned.
        unsafe {
            r.write_u64(8, 0x0102_0304_0506_0708);
            r.write_u32(16, 0x0a0b_0c0d);
            r.store_u16_release(20, 0xbeef);
            assert_eq!(r.read_u32(8), 0x0506_0708);
            assert_eq!(r.read_u16(20), 0xbeef);
            assert_eq!(r.load_u16_acquire(16), 0x0c0d);
            assert_eq!(*m.ptr.add(8), 0x08, "little-endian");
            r.zero(8, 16);
            assert_eq!(r.read_u32(12), 0);
        }
        // SAFETY: an error, nothing is accessed.
        let e = unsafe { RawMemory::new(m.ptr.wrapping_add(2), 8) }.unwrap_err();
        assert_eq!(e, VirtqError::Misaligned(m.ptr as usize + 2));
    }
}
