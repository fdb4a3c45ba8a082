//! Guest memory as the device sees it: the vhost-user memory table
//! (vhost-user spec, "VHOST_USER_SET_MEM_TABLE"), addressed by guest-physical
//! address.

use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use vm_memory::{
    Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryBackend, GuestMemoryMmap,
    GuestMemoryRegion,
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

    /// Where a read or write of `len` bytes at `gpa` goes: nowhere (`len`
    /// 0), within one region (nearly always: one region lookup), or across
    /// regions. Errors: a byte outside guest memory.
    fn span(&self, gpa: u64, len: usize) -> Result<Span<'a>, MemError> {
        if len == 0 {
            return Ok(Span::Empty);
        }
        if let Some(s) = self.one_region(gpa, len) {
            return Ok(Span::One(s));
        }
        if !self.contains(gpa, len) {
            return Err(MemError { addr: gpa, len });
        }
        Ok(Span::Across)
    }
}

/// Where an access goes ([`GuestMem::span`]).
enum Span<'a> {
    /// No byte.
    Empty,
    /// Within one region: its slice.
    One(vm_memory::VolatileSlice<'a, vm_memory::bitmap::MS<'a, GuestMemoryMmap>>),
    /// Across regions, all in guest memory.
    Across,
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
        match self.span(gpa, buf.len())? {
            Span::Empty => Ok(()),
            Span::One(from) => {
                from.copy_to(buf);
                Ok(())
            }
            Span::Across => self.mem.read_slice(buf, GuestAddress(gpa)).map_err(|_| err),
        }
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let err = MemError {
            addr: gpa,
            len: buf.len(),
        };
        match self.span(gpa, buf.len())? {
            Span::Empty => Ok(()),
            Span::One(to) => {
                to.copy_from(buf);
                Ok(())
            }
            Span::Across => self
                .mem
                .write_slice(buf, GuestAddress(gpa))
                .map_err(|_| err),
        }
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
/// each read, bounds-checked as [`GuestMem`]. Once the memory is
/// [`Poison::lost`] every read fails; a read that faults
/// ([`crate::fault`]) fails and marks it lost.
pub struct SharedMemory {
    mem: GuestMemoryAtomic<GuestMemoryMmap>,
    poison: Arc<Poison>,
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory")
            .field("regions", &self.mem.memory().num_regions())
            .field("lost", &self.poison.lost())
            .finish()
    }
}

impl SharedMemory {
    /// Shares `mem`, lost when `poison` is.
    pub fn new(mem: GuestMemoryAtomic<GuestMemoryMmap>, poison: Arc<Poison>) -> Self {
        Self { mem, poison }
    }
}

impl PeerMemory for SharedMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let err = MemError {
            addr: gpa,
            len: buf.len(),
        };
        if self.poison.lost() {
            return Err(err);
        }
        let table = self.mem.memory();
        let (r, fault) = crate::fault::catch(|| GuestMem::new(&table).read(gpa, buf));
        match fault {
            None => r,
            Some(f) => {
                blame(f);
                Err(err)
            }
        }
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
        let err = MemError { addr: gpa, len };
        if src.poison.lost() {
            return Some(Err(err));
        }
        let table = src.mem.memory();
        let from = table.get_slice(GuestAddress(src_gpa), len).ok()?;
        let to = self.mem.get_slice(GuestAddress(gpa), len).ok()?;
        if from.len() != len || to.len() != len {
            return None;
        }
        // Overlapping ranges (a function writing into its own memory) are
        // fine: the copy is a memmove. A fault on either side marks the
        // memory it hit lost ([`blame`]) and fails the copy.
        let ((), fault) = crate::fault::catch(|| from.copy_to_volatile_slice(to));
        match fault {
            None => Some(Ok(())),
            Some(f) => {
                blame(f);
                Some(Err(err))
            }
        }
    }
}

/// Whether a function's memory table still stands: set lost when an access
/// to it faulted ([`crate::fault`]), by whichever thread made the access.
/// The function's worker then resets the device, drops the table and
/// closes the connection (`DataPath::memory_fault`); its peers' reads fail
/// from then on ([`SharedMemory`]).
#[derive(Debug, Default)]
pub struct Poison {
    lost: AtomicBool,
}

impl Poison {
    /// Whether an access to the table faulted.
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Marks the table lost.
    pub fn set_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }
}

/// The host address ranges `[start, end)` of a memory table's regions,
/// with the table's [`Poison`]: how [`blame`] finds whose memory faulted.
struct Owner {
    ranges: Vec<(usize, usize)>,
    poison: Weak<Poison>,
}

/// Every installed memory table of the process ([`register`]).
static OWNERS: Mutex<Vec<Owner>> = Mutex::new(Vec::new());

fn owners() -> std::sync::MutexGuard<'static, Vec<Owner>> {
    OWNERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Registers `table` as one function's memory, lost with `poison`, so a
/// fault in it is blamed on that function ([`blame`]). Tables whose
/// poison is gone are forgotten.
pub fn register(table: &GuestMemoryMmap, poison: &Arc<Poison>) {
    let ranges = table
        .iter()
        .filter_map(|r| {
            let start = r.get_host_address(vm_memory::MemoryRegionAddress(0)).ok()? as usize;
            Some((start, start.checked_add(r.len() as usize)?))
        })
        .collect();
    let mut o = owners();
    o.retain(|x| x.poison.strong_count() > 0);
    o.push(Owner {
        ranges,
        poison: Arc::downgrade(poison),
    });
}

/// Forgets the table lost with `poison` (it is being replaced or dropped).
pub fn unregister(poison: &Arc<Poison>) {
    let p = Arc::as_ptr(poison);
    owners().retain(|x| x.poison.strong_count() > 0 && x.poison.as_ptr() != p);
}

/// Marks lost the registered table the faulting address lies in; whether
/// one did. A fault outside every registered table (a table already
/// replaced) is blamed on nobody.
pub fn blame(f: crate::fault::Fault) -> bool {
    let o = owners();
    let hit = o
        .iter()
        .find(|x| x.ranges.iter().any(|&(s, e)| (s..e).contains(&f.addr)))
        .and_then(|x| x.poison.upgrade());
    match hit {
        Some(p) => {
            p.set_lost();
            true
        }
        None => false,
    }
}

/// Why a memory table is refused ([`check_table`]).
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A region maps bytes past the end of its file: the daemon's first
    /// access to them would fault.
    #[error(
        "region at guest-physical {gpa:#x} maps bytes {offset}..{end} of a file of {size} bytes"
    )]
    PastEnd {
        /// The region's guest-physical address.
        gpa: u64,
        /// The region's offset in its file, bytes.
        offset: u64,
        /// The end of the region in its file, bytes.
        end: u64,
        /// The file's size, bytes.
        size: u64,
    },
    /// The region's file could not be checked.
    #[error("region at guest-physical {gpa:#x}: cannot stat its file: {source}")]
    Stat {
        /// The region's guest-physical address.
        gpa: u64,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Checks a memory table from `SET_MEM_TABLE` against its files: every
/// region must lie within its file as it is now (fstat(2)). A region of a
/// file the frontend may still shrink (an unsealed memfd, a hugetlbfs
/// file) can lose its backing later; [`crate::fault`] covers that.
///
/// # Errors
/// [`TableError`] for the first region that fails.
pub fn check_table(table: &GuestMemoryMmap) -> Result<(), TableError> {
    for r in table.iter() {
        let Some(fo) = r.file_offset() else {
            continue;
        };
        let gpa = r.start_addr().0;
        let size = fo
            .file()
            .metadata()
            .map_err(|source| TableError::Stat { gpa, source })?
            .len();
        let offset = fo.start();
        let end = offset.saturating_add(r.len());
        if end > size {
            return Err(TableError::PastEnd {
                gpa,
                offset,
                end,
                size,
            });
        }
    }
    Ok(())
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

    /// A table of one region of `len` bytes at 0x10000 over a memfd, and
    /// the memfd.
    fn memfd_table(len: u64) -> (GuestMemoryMmap, std::fs::File) {
        use std::os::fd::FromRawFd;
        // SAFETY: a new memfd, owned by the File.
        let file = unsafe {
            let fd = libc::memfd_create(c"memory-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            std::fs::File::from_raw_fd(fd)
        };
        file.set_len(len).unwrap();
        let fo = vm_memory::FileOffset::new(file.try_clone().unwrap(), 0);
        let t = GuestMemoryMmap::from_ranges_with_files(&[(
            GuestAddress(0x10000),
            len as usize,
            Some(fo),
        )])
        .unwrap();
        (t, file)
    }

    /// A region past the end of its file is refused; one within it passes.
    #[test]
    fn a_region_past_the_end_of_its_file_is_refused() {
        let (t, file) = memfd_table(0x4000);
        check_table(&t).unwrap();
        file.set_len(0x3000).unwrap();
        let e = check_table(&t).unwrap_err();
        assert!(
            matches!(
                e,
                TableError::PastEnd {
                    gpa: 0x10000,
                    offset: 0,
                    end: 0x4000,
                    size: 0x3000
                }
            ),
            "{e}"
        );
    }

    /// Another function's read of a memory whose file shrank fails (no
    /// SIGBUS reaches the process), marks that memory lost, and every
    /// later read of it, even of pages still backed, fails; the reader's
    /// own memory stays usable.
    #[test]
    fn a_peer_read_of_a_shrunk_memory_fails_and_marks_it_lost() {
        let (t, file) = memfd_table(0x4000);
        let poison = Arc::new(Poison::default());
        register(&t, &poison);
        let shared = SharedMemory::new(GuestMemoryAtomic::new(t), poison.clone());
        let own = table();
        let me = GuestMem::new(&own);
        me.write(0x1000, &[5; 16]).unwrap();
        file.set_len(0x1000).unwrap();
        assert!(me.copy_from_peer(0x1000, &shared, 0x12000, 16).is_err());
        assert!(poison.lost(), "the shrunk memory is marked lost");
        // The reader's memory stays usable (the failed copy may have
        // written part of its destination, as a failed DMA does).
        let mut b = [0u8; 16];
        me.write(0x1000, &[6; 16]).unwrap();
        me.read(0x1000, &mut b).unwrap();
        assert_eq!(b, [6; 16]);
        assert!(PeerMemory::read(&shared, 0x10000, &mut b).is_err());
        unregister(&poison);

        // A plain read (through a buffer) as well.
        let (t, file) = memfd_table(0x2000);
        let poison = Arc::new(Poison::default());
        register(&t, &poison);
        let shared = SharedMemory::new(GuestMemoryAtomic::new(t), poison.clone());
        file.set_len(0).unwrap();
        assert!(PeerMemory::read(&shared, 0x10000, &mut b).is_err());
        assert!(poison.lost());
        unregister(&poison);
    }

    #[test]
    fn empty_table_rejects_everything() {
        let t = GuestMemoryMmap::new();
        let m = GuestMem::new(&t);
        assert!(m.read(0, &mut [0u8; 1]).is_err());
        assert!(!m.contains(0, 1));
    }
}
