//! DMA memory for the user-space virtio-pci driver: pinned, physically
//! contiguous chunks and virtual-to-physical translation.
//!
//! There is no IOMMU in the vrnic guest, so the device (QEMU and the
//! vhost-user daemon) addresses guest-physical memory directly. A driver
//! running in user space therefore needs memory that
//! 1. stays at the same physical address while the device uses it (locked,
//!    populated, excluded from `fork` copy-on-write), and
//! 2. is physically contiguous for every buffer handed to the device as one
//!    `(address, length)` pair (virtqueue rings, CQ/SQ/RQ rings, bounce
//!    buffers).
//!
//! [`DmaAllocator`] gets both from 2 MiB huge pages (`mmap` with
//! `MAP_HUGETLB | MAP_HUGE_2MB | MAP_POPULATE | MAP_LOCKED`; the guest kernel
//! boots with `hugepages=N`): a huge page is physically contiguous, and
//! hugetlb pages are never migrated by compaction. Chunks are carved from
//! the current huge page by a bump allocator and never cross a huge page, so
//! the largest chunk is 2 MiB.
//!
//! When no huge page can be had (pool empty or absent), the allocator falls
//! back to ordinary 4 KiB pages: a chunk must then fit in one page (`len <=
//! 4096`, `align <= 4096`), because two neighbouring virtual pages are not
//! physically adjacent in general.
//!
//! Translation uses `/proc/self/pagemap` (proc(5), and the kernel's
//! `Documentation/admin-guide/mm/pagemap.rst`): one little-endian u64 per
//! virtual page; bit 63 "page present", bit 62 "page swapped", bits 0-54 the
//! page frame number (PFN). Since Linux 4.2 the PFN reads as 0 without
//! `CAP_SYS_ADMIN`, so the driver must run as root.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::ptr;

use crate::transport::{DmaBuf, TransportError};

/// Size of one huge page, bytes (2 MiB), and the largest chunk
/// [`DmaAllocator::alloc`] returns.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Size of the small pages used by the fallback, bytes. x86-64 base page.
pub const SMALL_PAGE_SIZE: usize = 4096;

/// pagemap entry bit 63: the page is present in RAM.
pub const PAGEMAP_PRESENT: u64 = 1 << 63;
/// pagemap entry bit 62: the page is swapped out.
pub const PAGEMAP_SWAPPED: u64 = 1 << 62;
/// pagemap entry bits 0-54: the page frame number, when present.
pub const PAGEMAP_PFN_MASK: u64 = (1 << 55) - 1;

fn io_err(what: impl Into<String>, source: io::Error) -> TransportError {
    TransportError::Io {
        what: what.into(),
        source,
    }
}

/// The base page size of this system, bytes (`sysconf(_SC_PAGESIZE)`;
/// 4096 on x86-64).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        SMALL_PAGE_SIZE
    }
}

/// Decodes one pagemap entry for the virtual address `va` into a physical
/// address: `PFN * page_size + (va % page_size)`.
///
/// Errors (all [`TransportError::Io`]): the page is not present (or is
/// swapped out): `ErrorKind::NotFound`; the PFN is 0, which is what the
/// kernel reports to a process without `CAP_SYS_ADMIN`:
/// `ErrorKind::PermissionDenied`.
pub fn decode_pagemap_entry(
    entry: u64,
    va: usize,
    page_size: usize,
) -> Result<u64, TransportError> {
    if entry & PAGEMAP_PRESENT == 0 || entry & PAGEMAP_SWAPPED != 0 {
        return Err(io_err(
            format!("translating {va:#x}"),
            io::Error::new(
                io::ErrorKind::NotFound,
                "page not present in RAM (not populated/locked?)",
            ),
        ));
    }
    let pfn = entry & PAGEMAP_PFN_MASK;
    if pfn == 0 {
        return Err(io_err(
            format!("translating {va:#x}"),
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                "pagemap PFN reads as 0 (need root / CAP_SYS_ADMIN)",
            ),
        ));
    }
    let ps = page_size as u64;
    Ok(pfn * ps + (va as u64 % ps))
}

/// An open `/proc/self/pagemap`, translating virtual addresses of this
/// process to physical (guest-physical in a VM) addresses.
#[derive(Debug)]
pub struct Pagemap {
    file: File,
    page_size: usize,
}

impl Pagemap {
    /// Opens `/proc/self/pagemap`. Errors: [`TransportError::Io`] when the
    /// file cannot be opened.
    pub fn open() -> Result<Self, TransportError> {
        let file = File::open("/proc/self/pagemap")
            .map_err(|e| io_err("opening /proc/self/pagemap", e))?;
        Ok(Pagemap {
            file,
            page_size: page_size(),
        })
    }

    /// The page size translations are made at, bytes.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Physical address of the byte at `va`. The page must be resident and
    /// should be locked (otherwise the answer may be stale by the time it is
    /// used). Errors: see [`decode_pagemap_entry`]; reading the file fails:
    /// [`TransportError::Io`].
    pub fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        let mut entry = [0u8; 8];
        let off = (va / self.page_size) as u64 * 8;
        self.file
            .read_exact_at(&mut entry, off)
            .map_err(|e| io_err(format!("reading /proc/self/pagemap for {va:#x}"), e))?;
        decode_pagemap_entry(u64::from_le_bytes(entry), va, self.page_size)
    }
}

/// One-shot translation of `va` through a freshly opened
/// `/proc/self/pagemap`; see [`Pagemap::virt_to_phys`]. Prefer a long-lived
/// [`Pagemap`] for repeated translations.
pub fn virt_to_phys(va: usize) -> Result<u64, TransportError> {
    Pagemap::open()?.virt_to_phys(va)
}

/// The page-aligned range covering `[ptr, ptr + len)`: (start, length).
fn page_span(ptr: *const u8, len: usize) -> (usize, usize) {
    let ps = page_size();
    let start = ptr as usize & !(ps - 1);
    let end = (ptr as usize).saturating_add(len).saturating_add(ps - 1) & !(ps - 1);
    (start, end - start)
}

/// Locks the pages covering `[ptr, ptr + len)` into RAM (`mlock(2)`,
/// rounded out to whole pages), faulting them in, so that their physical
/// addresses stay valid while the device uses them (e.g. a user buffer
/// being registered as an MR). `len == 0` is a no-op.
///
/// Caveat: Linux may still migrate mlocked pages during memory compaction
/// unless `/proc/sys/vm/compact_unevictable_allowed` is 0 (the vrnic guest
/// image sets that); programs served by the guest agent also pin them with
/// io_uring registered buffers ([`crate::agent::pin`]), which compaction
/// cannot move. Errors: `mlock` fails (`ENOMEM`: over
/// `RLIMIT_MEMLOCK` or unmapped range; `EPERM`): [`TransportError::Io`].
pub fn lock_range(ptr: *const u8, len: usize) -> Result<(), TransportError> {
    if len == 0 {
        return Ok(());
    }
    let (start, span) = page_span(ptr, len);
    // SAFETY: mlock only changes page residency; an invalid range is
    // reported as ENOMEM, not undefined behaviour.
    if unsafe { libc::mlock(start as *const libc::c_void, span) } != 0 {
        return Err(io_err(
            format!("mlock({start:#x}, {span})"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Undoes [`lock_range`] (`munlock(2)` of the covering pages). Locks do not
/// nest: one unlock releases every lock on those pages. `len == 0` is a
/// no-op. Errors: `munlock` fails: [`TransportError::Io`].
pub fn unlock_range(ptr: *const u8, len: usize) -> Result<(), TransportError> {
    if len == 0 {
        return Ok(());
    }
    let (start, span) = page_span(ptr, len);
    // SAFETY: as in lock_range.
    if unsafe { libc::munlock(start as *const libc::c_void, span) } != 0 {
        return Err(io_err(
            format!("munlock({start:#x}, {span})"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Which kind of pages the allocator last obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaMode {
    /// 2 MiB huge pages: chunks up to [`HUGE_PAGE_SIZE`].
    HugePages,
    /// 4 KiB pages (no huge page available): chunks up to [`SMALL_PAGE_SIZE`].
    SmallPages,
}

/// One mmap'd, locked region and the physical address of its first byte.
#[derive(Debug)]
struct Region {
    ptr: *mut u8,
    len: usize,
    phys: u64,
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// The region chunks are currently carved from, and the next free offset.
#[derive(Debug)]
struct Arena {
    region: Region,
    next: usize,
}

impl Arena {
    /// Carves `len` bytes at `align` if they fit; `None` otherwise.
    fn carve(&mut self, len: usize, align: usize) -> Option<DmaBuf> {
        let off = self.next.checked_add(align - 1)? & !(align - 1);
        let end = off.checked_add(len)?;
        if end > self.region.len {
            return None;
        }
        self.next = end;
        // SAFETY: off + len <= region.len, inside the mapping.
        let ptr = unsafe { self.region.ptr.add(off) };
        // Memory is fresh from mmap (zero) and never reused; zero it anyway
        // so the contract does not depend on that.
        // SAFETY: as above; the chunk is owned by nobody else yet.
        unsafe { ptr::write_bytes(ptr, 0, len) };
        Some(DmaBuf {
            ptr,
            len,
            gpa: self.region.phys + off as u64,
        })
    }
}

/// A bump allocator of DMA memory: zeroed, locked chunks, each physically
/// contiguous, alive until the allocator is dropped (chunks are never freed
/// individually).
///
/// Chunks come from 2 MiB huge pages when the kernel has any (at most
/// [`HUGE_PAGE_SIZE`] bytes, any power-of-two alignment up to 2 MiB), else
/// from single 4 KiB pages (at most 4096 bytes, alignment at most 4096). A
/// chunk never crosses a page of its kind. Needs root: physical addresses
/// come from `/proc/self/pagemap`.
#[derive(Debug)]
pub struct DmaAllocator {
    pagemap: Pagemap,
    huge: Option<Arena>,
    small: Option<Arena>,
    retired: Vec<Region>,
    huge_unavailable: bool,
    mode: DmaMode,
}

// SAFETY: the allocator exclusively owns its mappings; the raw pointers are
// only dereferenced through &mut self.
unsafe impl Send for DmaAllocator {}

impl DmaAllocator {
    /// Creates an allocator; no memory is mapped until the first
    /// [`DmaAllocator::alloc`]. Errors: `/proc/self/pagemap` cannot be
    /// opened: [`TransportError::Io`].
    pub fn new() -> Result<Self, TransportError> {
        Ok(DmaAllocator {
            pagemap: Pagemap::open()?,
            huge: None,
            small: None,
            retired: Vec::new(),
            huge_unavailable: false,
            mode: DmaMode::HugePages,
        })
    }

    /// The pagemap this allocator translates with.
    pub fn pagemap(&self) -> &Pagemap {
        &self.pagemap
    }

    /// Whether huge pages are in use ([`DmaMode::HugePages`]) or the
    /// allocator has fallen back to 4 KiB pages.
    pub fn mode(&self) -> DmaMode {
        self.mode
    }

    /// Largest chunk the allocator can currently return, bytes:
    /// [`HUGE_PAGE_SIZE`] with huge pages, [`SMALL_PAGE_SIZE`] after the
    /// fallback.
    pub fn max_alloc(&self) -> usize {
        match self.mode {
            DmaMode::HugePages => HUGE_PAGE_SIZE,
            DmaMode::SmallPages => SMALL_PAGE_SIZE,
        }
    }

    /// Allocates `len` zeroed bytes aligned to `align` (a power of two;
    /// 0 is taken as 1), physically contiguous.
    ///
    /// Errors: `len == 0`, `align` not a power of two or above 2 MiB:
    /// [`TransportError::Io`] (`InvalidInput`); `len > 2 MiB`, or `len >
    /// 4096` / `align > 4096` while no huge page is available, or the pages
    /// cannot be mapped: [`TransportError::NoDmaMemory`]; translation fails
    /// (not root): [`TransportError::Io`].
    pub fn alloc(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        let align = align.max(1);
        if len == 0 || !align.is_power_of_two() || align > HUGE_PAGE_SIZE {
            return Err(io_err(
                format!("allocating {len} bytes of DMA memory aligned to {align}"),
                io::Error::new(io::ErrorKind::InvalidInput, "length 0 or bad alignment"),
            ));
        }
        if len > HUGE_PAGE_SIZE {
            return Err(TransportError::NoDmaMemory(len));
        }
        if let Some(buf) = self.huge.as_mut().and_then(|a| a.carve(len, align)) {
            return Ok(buf);
        }
        if !self.huge_unavailable {
            match self.map_region(HUGE_PAGE_SIZE) {
                Ok(Some(region)) => {
                    if let Some(old) = self.huge.take() {
                        self.retired.push(old.region);
                    }
                    self.mode = DmaMode::HugePages;
                    let arena = self.huge.insert(Arena { region, next: 0 });
                    return arena
                        .carve(len, align)
                        .ok_or(TransportError::NoDmaMemory(len));
                }
                Ok(None) => {
                    tracing::warn!(
                        "no 2 MiB huge page available (boot the guest with hugepages=N); \
                         DMA chunks are limited to 4 KiB from now on"
                    );
                    self.huge_unavailable = true;
                    self.mode = DmaMode::SmallPages;
                }
                Err(e) => return Err(e),
            }
        }
        if len > SMALL_PAGE_SIZE || align > SMALL_PAGE_SIZE {
            return Err(TransportError::NoDmaMemory(len));
        }
        if let Some(buf) = self.small.as_mut().and_then(|a| a.carve(len, align)) {
            return Ok(buf);
        }
        let region = self
            .map_region(SMALL_PAGE_SIZE)?
            .ok_or(TransportError::NoDmaMemory(len))?;
        if let Some(old) = self.small.take() {
            self.retired.push(old.region);
        }
        let arena = self.small.insert(Arena { region, next: 0 });
        arena
            .carve(len, align)
            .ok_or(TransportError::NoDmaMemory(len))
    }

    /// Maps, populates and locks one page of `size` (huge when
    /// `size == HUGE_PAGE_SIZE`), excludes it from fork and translates it.
    /// `Ok(None)`: the kernel has no such page to give (ENOMEM, or hugetlb
    /// unsupported).
    fn map_region(&self, size: usize) -> Result<Option<Region>, TransportError> {
        let huge = size == HUGE_PAGE_SIZE;
        let mut flags =
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE | libc::MAP_LOCKED;
        if huge {
            flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
        }
        // SAFETY: anonymous mapping at a kernel-chosen address.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EINVAL) | Some(libc::ENOENT) if huge => Ok(None),
                Some(libc::ENOMEM) | Some(libc::EAGAIN) => Ok(None),
                _ => Err(io_err(format!("mmap of {size} bytes of DMA memory"), e)),
            };
        }
        let mut region = Region {
            ptr: p as *mut u8,
            len: size,
            phys: 0,
        };
        // A copy-on-write fork would move the parent's pages under the device.
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(p, size, libc::MADV_DONTFORK) };
        // MAP_LOCKED does not fail when locking fails; lock explicitly.
        lock_range(region.ptr, size)?;
        let phys = self.pagemap.virt_to_phys(region.ptr as usize)?;
        // Sanity: a huge page maps physically contiguous 4 KiB sub-pages.
        if huge {
            let last = size - self.pagemap.page_size();
            let phys_last = self.pagemap.virt_to_phys(region.ptr as usize + last)?;
            if phys_last != phys + last as u64 {
                return Err(io_err(
                    "checking huge page contiguity",
                    io::Error::other(format!(
                        "huge page at {phys:#x} is not contiguous (last sub-page at {phys_last:#x})"
                    )),
                ));
            }
        }
        region.phys = phys;
        Ok(Some(region))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn pagemap_entry_decoding() {
        let e = PAGEMAP_PRESENT | 0x1234;
        assert_eq!(
            decode_pagemap_entry(e, 0x7000_0abc, 4096).unwrap(),
            0x1234 * 4096 + 0xabc
        );
        assert!(
            decode_pagemap_entry(0x1234, 0, 4096).is_err(),
            "not present"
        );
        assert!(
            decode_pagemap_entry(PAGEMAP_PRESENT, 0, 4096).is_err(),
            "PFN 0"
        );
        assert!(decode_pagemap_entry(PAGEMAP_PRESENT | PAGEMAP_SWAPPED | 5, 0, 4096).is_err());
        // Flag bits 55..61 are not part of the PFN.
        let e = PAGEMAP_PRESENT | (1 << 55) | (1 << 61) | 7;
        assert_eq!(decode_pagemap_entry(e, 0, 4096).unwrap(), 7 * 4096);
    }

    #[test]
    fn locked_page_translates_when_root() {
        if !is_root() {
            eprintln!("skipped: pagemap PFNs need root");
            return;
        }
        let mut page = vec![0u8; 2 * 4096];
        let p = page.as_mut_ptr();
        lock_range(p, 4096).unwrap();
        let pm = Pagemap::open().unwrap();
        let phys = pm.virt_to_phys(p as usize + 100).unwrap();
        assert_ne!(phys, 0);
        assert_eq!(phys % 4096, (p as u64 + 100) % 4096);
        unlock_range(p, 4096).unwrap();
    }

    #[test]
    fn allocator_returns_aligned_zeroed_contiguous_chunks() {
        if !is_root() {
            eprintln!("skipped: pagemap PFNs need root");
            return;
        }
        let mut a = DmaAllocator::new().unwrap();
        let pm = Pagemap::open().unwrap();
        let mut prev_end = 0usize;
        for (len, align) in [(100, 8), (1000, 64), (16, 16), (4096, 4096), (3000, 2)] {
            let b = a.alloc(len, align).unwrap();
            assert_eq!(b.len, len);
            assert_eq!(b.ptr as usize % align, 0);
            assert_eq!(b.gpa % align as u64, 0);
            // SAFETY: the chunk is ours and len bytes long.
            let s = unsafe { std::slice::from_raw_parts_mut(b.ptr, b.len) };
            assert!(s.iter().all(|&x| x == 0));
            s.fill(0xa5);
            assert_eq!(pm.virt_to_phys(b.ptr as usize).unwrap(), b.gpa);
            assert_eq!(
                pm.virt_to_phys(b.ptr as usize + len - 1).unwrap(),
                b.gpa + len as u64 - 1
            );
            let page = a.max_alloc();
            assert_eq!(
                b.ptr as usize / page,
                (b.ptr as usize + len - 1) / page,
                "chunk crosses a page"
            );
            if b.ptr as usize / page == prev_end / page {
                assert!(b.ptr as usize >= prev_end, "chunks overlap");
            }
            prev_end = b.ptr as usize + len;
        }
        match a.mode() {
            DmaMode::HugePages => {
                assert!(a.alloc(HUGE_PAGE_SIZE, 4096).is_ok());
            }
            DmaMode::SmallPages => {
                assert!(matches!(
                    a.alloc(4097, 8),
                    Err(TransportError::NoDmaMemory(4097))
                ));
                assert!(matches!(
                    a.alloc(64, 8192),
                    Err(TransportError::NoDmaMemory(64))
                ));
            }
        }
    }

    #[test]
    fn allocator_rejects_bad_requests() {
        let mut a = DmaAllocator::new().unwrap();
        assert!(matches!(
            a.alloc(HUGE_PAGE_SIZE + 1, 8),
            Err(TransportError::NoDmaMemory(_))
        ));
        assert!(matches!(a.alloc(0, 8), Err(TransportError::Io { .. })));
        assert!(matches!(a.alloc(8, 3), Err(TransportError::Io { .. })));
        assert!(matches!(
            a.alloc(8, 2 * HUGE_PAGE_SIZE),
            Err(TransportError::Io { .. })
        ));
    }
}
