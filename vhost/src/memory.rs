//! Guest memory as the device sees it: the vhost-user memory table
//! (vhost-user spec, "VHOST_USER_SET_MEM_TABLE"), addressed by guest-physical
//! address.

use std::any::Any;
use std::sync::atomic::Ordering;

use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
};
use vrnic::data::PeerMemory;
use vrnic::mem::{DmaMemory, MemError};

/// [`DmaMemory`] over a snapshot of the frontend's memory table (a
/// vm-memory [`GuestMemoryMmap`], e.g. from
/// `GuestMemoryAtomic::memory()`).
///
/// Every access is bounds-checked: an access succeeds only when every byte
/// of `[gpa, gpa + len)` lies in some region of the table. Ranges that run
/// past the end of the table, start outside it, overflow the 64-bit address
/// space or span a hole between two regions return [`MemError`]. Ranges
/// spanning two regions that are adjacent in guest-physical space are
/// allowed. Zero-length accesses always succeed and touch nothing.
///
/// The memory is shared with the guest, which may change it at any time;
/// reads and writes are volatile copies.
#[derive(Clone, Copy)]
pub struct GuestMem<'a> {
    mem: &'a GuestMemoryMmap,
}

impl<'a> GuestMem<'a> {
    /// Wraps a memory table snapshot.
    pub fn new(mem: &'a GuestMemoryMmap) -> Self {
        Self { mem }
    }

    /// The memory table itself.
    pub fn table(&self) -> &'a GuestMemoryMmap {
        self.mem
    }

    /// Whether every byte of `[gpa, gpa + len)` is in the memory table.
    /// `true` for `len == 0`.
    pub fn contains(&self, gpa: u64, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let Some(_end) = gpa.checked_add(len as u64 - 1) else {
            return false;
        };
        GuestMemoryBackend::check_range(self.mem, GuestAddress(gpa), len)
    }
}

impl<'a> GuestMem<'a> {
    /// `[gpa, gpa + len)` as one slice, when it lies in one region of the
    /// table (one lookup); `None` otherwise (across regions, or outside).
    fn one_region(
        &self,
        gpa: u64,
        len: usize,
    ) -> Option<vm_memory::VolatileSlice<'a, vm_memory::bitmap::MS<'a, GuestMemoryMmap>>> {
        let s = self.mem.get_slice(GuestAddress(gpa), len).ok()?;
        (s.len() == len).then_some(s)
    }
}

impl DmaMemory for GuestMem<'_> {
    /// One aligned 32-bit load (vm-memory's `Bytes::load`): a driver's
    /// concurrent store is never seen torn.
    fn load_u32(&self, gpa: u64) -> Result<u32, MemError> {
        self.mem
            .load::<u32>(GuestAddress(gpa), Ordering::Acquire)
            .map(u32::from_le)
            .map_err(|_| MemError { addr: gpa, len: 4 })
    }

    /// One aligned 32-bit store (vm-memory's `Bytes::store`).
    fn store_u32(&self, gpa: u64, v: u32) -> Result<(), MemError> {
        self.mem
            .store(v.to_le(), GuestAddress(gpa), Ordering::Release)
            .map_err(|_| MemError { addr: gpa, len: 4 })
    }

    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let err = MemError {
            addr: gpa,
            len: buf.len(),
        };
        if buf.is_empty() {
            return Ok(());
        }
        // Within one region (nearly always): one region lookup.
        if let Some(from) = self.one_region(gpa, buf.len()) {
            from.copy_to(buf);
            return Ok(());
        }
        if !self.contains(gpa, buf.len()) {
            return Err(err);
        }
        self.mem.read_slice(buf, GuestAddress(gpa)).map_err(|_| err)
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let err = MemError {
            addr: gpa,
            len: buf.len(),
        };
        if buf.is_empty() {
            return Ok(());
        }
        if let Some(to) = self.one_region(gpa, buf.len()) {
            to.copy_from(buf);
            return Ok(());
        }
        if !self.contains(gpa, buf.len()) {
            return Err(err);
        }
        self.mem
            .write_slice(buf, GuestAddress(gpa))
            .map_err(|_| err)
    }

    fn copy_from_peer(
        &self,
        gpa: u64,
        src: &dyn PeerMemory,
        src_gpa: u64,
        len: usize,
    ) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        match self.copy_direct(gpa, src, src_gpa, len) {
            Some(r) => r,
            None => vrnic::mem::bounce_copy(self, gpa, src, src_gpa, len),
        }
    }
}

/// A function's guest memory as the daemon's other functions read it
/// (payloads by reference, [`vrnic::data`]): the memory table as it is at
/// each read, bounds-checked as [`GuestMem`].
pub struct SharedMemory(GuestMemoryAtomic<GuestMemoryMmap>);

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory")
            .field("regions", &self.0.memory().num_regions())
            .finish()
    }
}

impl SharedMemory {
    /// Shares `mem`.
    pub fn new(mem: GuestMemoryAtomic<GuestMemoryMmap>) -> Self {
        Self(mem)
    }
}

impl PeerMemory for SharedMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let table = self.0.memory();
        GuestMem::new(&table).read(gpa, buf)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl GuestMem<'_> {
    /// [`DmaMemory::copy_from_peer`] from a [`SharedMemory`]: one copy
    /// from the other guest's memory into this one, when each range lies
    /// in one region of its table; `None` otherwise (the caller copies
    /// through a buffer).
    fn copy_direct(
        &self,
        gpa: u64,
        src: &dyn PeerMemory,
        src_gpa: u64,
        len: usize,
    ) -> Option<Result<(), MemError>> {
        let src = src.as_any().downcast_ref::<SharedMemory>()?;
        let table = src.0.memory();
        let from = table.get_slice(GuestAddress(src_gpa), len).ok()?;
        let to = self.mem.get_slice(GuestAddress(gpa), len).ok()?;
        if from.len() != len || to.len() != len {
            return None;
        }
        // Overlapping ranges (a function writing into its own memory) are
        // fine: the copy is a memmove.
        from.copy_to_volatile_slice(to);
        Some(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regions [0x1000, 0x2000) and [0x2000, 0x3000) (adjacent), then a hole,
    /// then [0x8000, 0x9000).
    fn table() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x2000), 0x1000),
            (GuestAddress(0x8000), 0x1000),
        ])
        .unwrap()
    }

    /// The doorbell records' 32-bit accesses: little-endian, whole, and
    /// refused when unaligned or outside the table.
    #[test]
    fn aligned_u32_accesses_are_whole_and_checked() {
        let t = table();
        let m = GuestMem::new(&t);
        m.store_u32(0x1ffc, 0x0403_0201).unwrap();
        let mut b = [0u8; 4];
        m.read(0x1ffc, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4], "little-endian");
        assert_eq!(m.load_u32(0x1ffc), Ok(0x0403_0201));
        for bad in [0x1ffe, 0x3000, 0x7ffc, u64::MAX - 3] {
            assert!(m.load_u32(bad).is_err(), "{bad:#x}");
            assert!(m.store_u32(bad, 1).is_err(), "{bad:#x}");
        }
    }

    #[test]
    fn reads_back_what_it_wrote() {
        let t = table();
        let m = GuestMem::new(&t);
        m.write(0x1234, b"vrnic").unwrap();
        let mut b = [0u8; 5];
        m.read(0x1234, &mut b).unwrap();
        assert_eq!(&b, b"vrnic");
    }

    #[test]
    fn accepts_ranges_across_adjacent_regions() {
        let t = table();
        let m = GuestMem::new(&t);
        m.write(0x1ffe, &[1, 2, 3, 4]).unwrap();
        let mut b = [0u8; 4];
        m.read(0x1ffe, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4]);
        assert!(m.contains(0x1000, 0x2000));
    }

    #[test]
    fn rejects_holes_edges_and_overflow() {
        let t = table();
        let m = GuestMem::new(&t);
        let mut b = [0u8; 4];
        // Entirely outside.
        assert_eq!(m.read(0x0, &mut b), Err(MemError { addr: 0, len: 4 }));
        assert!(m.read(0x4000, &mut b).is_err());
        // Starting inside, running into the hole after 0x3000.
        assert!(m.read(0x2ffe, &mut b).is_err());
        assert!(m.write(0x2ffe, &b).is_err());
        // Starting before a region, ending inside it.
        assert!(m.read(0x7ffe, &mut b).is_err());
        // Spanning the hole entirely.
        assert!(!m.contains(0x2000, 0x7000));
        // Past the end of the last region.
        assert!(m.read(0x8ffd, &mut b).is_err());
        assert!(m.read(0x8ffc, &mut b).is_ok());
        // 64-bit overflow.
        assert!(m.read(u64::MAX - 1, &mut b).is_err());
        assert!(m.write(u64::MAX, &b).is_err());
        // Zero-length accesses touch nothing.
        assert!(m.read(u64::MAX, &mut []).is_ok());
        // A failed write leaves memory untouched.
        m.write(0x2ffc, &[9, 9, 9, 9]).unwrap();
        assert!(m.write(0x2ffc, &[0; 8]).is_err());
        m.read(0x2ffc, &mut b).unwrap();
        assert_eq!(b, [9, 9, 9, 9]);
    }

    #[test]
    fn empty_table_rejects_everything() {
        let t = GuestMemoryMmap::new();
        let m = GuestMem::new(&t);
        assert!(m.read(0, &mut [0u8; 1]).is_err());
        assert!(!m.contains(0, 1));
    }
}
