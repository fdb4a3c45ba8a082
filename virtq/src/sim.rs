//! A simulated device and plain test memory, for unit tests of drivers
//! (this crate's, and guest-lib's with the `sim` feature). Not for
//! production: the device trusts the driver and panics on a broken ring.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::{QueueLayout, VIRTQ_DESC_F_NEXT};

/// Zeroed heap memory aligned to 64 bytes, freed on drop.
#[derive(Debug)]
pub struct Mem {
    /// The first byte.
    pub ptr: *mut u8,
    layout: Layout,
}

impl Mem {
    /// `len` (> 0) zeroed bytes.
    ///
    /// # Panics
    /// When `len` is 0 or the allocation fails (test code).
    pub fn new(len: usize) -> Self {
        assert!(len > 0);
        let layout = Layout::from_size_align(len, 64).unwrap();
        // SAFETY: len > 0.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Mem { ptr, layout }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) };
    }
}

/// One descriptor as the simulated device read it (`struct virtq_desc`).
#[derive(Debug, PartialEq, Eq)]
pub struct D {
    /// `addr`.
    pub addr: u64,
    /// `len`.
    pub len: u32,
    /// `flags`.
    pub flags: u16,
    /// `next`.
    pub next: u16,
}

/// The device side of a ring at `base`: consumes available chains,
/// returns used ones, and writes its suppression fields.
#[derive(Debug)]
pub struct Device {
    /// The ring's layout.
    pub l: QueueLayout,
    /// The ring's first byte.
    pub base: *mut u8,
    last_avail: u16,
    used_idx: u16,
}

// SAFETY: the simulated device owns its view of the ring; a test keeps the
// memory alive while the device runs in another thread.
unsafe impl Send for Device {}

impl Device {
    /// The device of the ring of layout `l` at `base` (which must stay
    /// valid while the device is used).
    pub fn new(l: QueueLayout, base: *mut u8) -> Self {
        Device {
            l,
            base,
            last_avail: 0,
            used_idx: 0,
        }
    }

    fn at<T>(&self, off: usize) -> *mut T {
        self.base.wrapping_add(off).cast()
    }

    /// The u16 at byte `off` of the ring.
    pub fn rd16(&self, off: usize) -> u16 {
        // SAFETY: the test passes an offset inside the ring.
        u16::from_le(unsafe { ptr::read_volatile(self.at::<u16>(off)) })
    }

    fn wr16(&self, off: usize, v: u16) {
        // SAFETY: an offset of the layout, inside the ring.
        unsafe { ptr::write_volatile(self.at::<u16>(off), v.to_le()) }
    }

    fn desc(&self, i: u16) -> D {
        let d = self.l.desc + 16 * usize::from(i % self.l.size);
        // SAFETY: descriptor i mod size lies in the table.
        unsafe {
            D {
                addr: u64::from_le(ptr::read_volatile(self.at::<u64>(d))),
                len: u32::from_le(ptr::read_volatile(self.at::<u32>(d + 8))),
                flags: u16::from_le(ptr::read_volatile(self.at::<u16>(d + 12))),
                next: u16::from_le(ptr::read_volatile(self.at::<u16>(d + 14))),
            }
        }
    }

    /// The avail index, loaded with acquire order.
    pub fn avail_idx(&self) -> u16 {
        // SAFETY: avail + 2, 2-aligned, inside the ring.
        u16::from_le(
            unsafe { AtomicU16::from_ptr(self.at::<u16>(self.l.avail + 2)) }
                .load(Ordering::Acquire),
        )
    }

    /// Takes the next available chain: (head, descriptors).
    ///
    /// # Panics
    /// On a descriptor loop (test code).
    pub fn take(&mut self) -> Option<(u16, Vec<D>)> {
        if self.avail_idx() == self.last_avail {
            return None;
        }
        let slot = usize::from(self.last_avail % self.l.size);
        let head = self.rd16(self.l.avail + 4 + 2 * slot);
        self.last_avail = self.last_avail.wrapping_add(1);
        let mut chain = vec![];
        let mut i = head;
        loop {
            let d = self.desc(i);
            let more = d.flags & VIRTQ_DESC_F_NEXT != 0;
            i = d.next;
            chain.push(d);
            assert!(chain.len() <= self.l.size as usize, "descriptor loop");
            if !more {
                break;
            }
        }
        Some((head, chain))
    }

    /// Returns chain `id` with `len` bytes written: the used entry, then
    /// the used index (release).
    pub fn complete(&mut self, id: u32, len: u32) {
        let e = self.l.used + 4 + 8 * usize::from(self.used_idx % self.l.size);
        // SAFETY: used entry slot < size, inside the ring, 4-aligned.
        unsafe {
            ptr::write_volatile(self.at::<u32>(e), id.to_le());
            ptr::write_volatile(self.at::<u32>(e + 4), len.to_le());
        }
        self.used_idx = self.used_idx.wrapping_add(1);
        self.set_used_idx(self.used_idx);
    }

    /// Stores `used.idx` (release) without writing entries: a device that
    /// lies about how far it got.
    pub fn set_used_idx(&self, idx: u16) {
        // SAFETY: used + 2, 2-aligned, inside the ring.
        unsafe { AtomicU16::from_ptr(self.at::<u16>(self.l.used + 2)) }
            .store(idx.to_le(), Ordering::Release);
    }

    /// Writes the used ring's flags.
    pub fn set_used_flags(&mut self, f: u16) {
        self.wr16(self.l.used, f);
    }

    /// Writes `avail_event`.
    pub fn set_avail_event(&mut self, v: u16) {
        self.wr16(self.l.avail_event(), v);
    }

    /// The driver's `used_event`.
    pub fn used_event(&self) -> u16 {
        self.rd16(self.l.used_event())
    }

    /// The driver's available ring flags.
    pub fn avail_flags(&self) -> u16 {
        self.rd16(self.l.avail)
    }
}
