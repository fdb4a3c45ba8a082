//! Driver memory for the test frontend: guest RAM in a memfd, mapped
//! shared here and sent to the backend with `SET_MEM_TABLE` (vhost-user
//! spec, "Memory access"), like QEMU's `memory-backend-memfd,share=on`.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use vrnic_vhost::GuestMem;

use crate::FrontendError;

/// Page size the regions and allocations are aligned to, bytes.
pub const PAGE: u64 = 4096;

/// Guest RAM shared with the backend: one or more regions at chosen
/// guest-physical addresses, backed by one memfd, with a bump allocator.
pub struct DriverMemory {
    table: GuestMemoryMmap,
    regions: Vec<(u64, u64)>,
    /// Next free guest-physical address in region `cursor.0`.
    cursor: (usize, u64),
}

impl DriverMemory {
    /// Maps regions `(guest-physical address, size in bytes)`, sorted and
    /// non-overlapping, each page-aligned. Memory starts zeroed.
    ///
    /// # Errors
    /// [`FrontendError::Setup`] when a region is unaligned, the memfd cannot
    /// be made or the mapping fails.
    pub fn new(regions: &[(u64, usize)]) -> Result<Self, FrontendError> {
        let setup = |m: String| FrontendError::Setup(m);
        if regions.is_empty() {
            return Err(setup("no memory regions".into()));
        }
        let total: u64 = regions.iter().map(|r| r.1 as u64).sum();
        let file =
            memfd(c"vrnic-test-guest-ram").map_err(|e| setup(format!("memfd_create: {e}")))?;
        file.set_len(total)
            .map_err(|e| setup(format!("memfd size: {e}")))?;
        let mut ranges = Vec::new();
        let mut off = 0u64;
        for &(gpa, size) in regions {
            if !gpa.is_multiple_of(PAGE) || !(size as u64).is_multiple_of(PAGE) || size == 0 {
                return Err(setup(format!(
                    "region {gpa:#x}+{size:#x} is not page-aligned"
                )));
            }
            let f = file
                .try_clone()
                .map_err(|e| setup(format!("dup memfd: {e}")))?;
            ranges.push((GuestAddress(gpa), size, Some(FileOffset::new(f, off))));
            off += size as u64;
        }
        let table = GuestMemoryMmap::from_ranges_with_files(&ranges)
            .map_err(|e| setup(format!("mmap guest RAM: {e}")))?;
        Ok(Self {
            table,
            regions: regions.iter().map(|&(g, s)| (g, s as u64)).collect(),
            cursor: (0, regions[0].0),
        })
    }

    /// The memory table entries to send with `SET_MEM_TABLE`
    /// (`userspace_addr` is this process's mapping).
    ///
    /// # Errors
    /// [`FrontendError::Setup`] if a region has no backing file (never for
    /// memory made by [`DriverMemory::new`]).
    pub fn region_infos(&self) -> Result<Vec<VhostUserMemoryRegionInfo>, FrontendError> {
        self.table
            .iter()
            .map(|r| {
                VhostUserMemoryRegionInfo::from_guest_region(r)
                    .map_err(|e| FrontendError::Setup(format!("{e}")))
            })
            .collect()
    }

    /// This process's address of guest-physical address `gpa` (the
    /// "frontend virtual address" `SET_VRING_ADDR` carries).
    pub fn host_addr(&self, gpa: u64) -> Option<u64> {
        self.table
            .get_host_address(GuestAddress(gpa))
            .ok()
            .map(|p| p as u64)
    }

    /// Bounds-checked access to the memory ([`vrnic::mem::DmaMemory`]).
    pub fn mem(&self) -> GuestMem<'_> {
        GuestMem::new(&self.table)
    }

    /// Shrinks the memfd behind the regions to `len` bytes, as a hostile
    /// frontend may after `SET_MEM_TABLE`: the pages past `len` lose their
    /// backing, in the daemon's mapping as in this one. Touching them from
    /// this process afterwards raises `SIGBUS` here.
    ///
    /// # Errors
    /// [`FrontendError::Setup`] when the file cannot be shrunk.
    pub fn shrink_file(&self, len: u64) -> Result<(), FrontendError> {
        let file = self
            .table
            .iter()
            .find_map(|r| r.file_offset())
            .ok_or_else(|| FrontendError::Setup("no backing file".into()))?
            .file();
        file.set_len(len)
            .map_err(|e| FrontendError::Setup(format!("ftruncate: {e}")))
    }

    /// The regions, `(guest-physical address, size in bytes)`.
    pub fn regions(&self) -> &[(u64, u64)] {
        &self.regions
    }

    /// Allocates `len` bytes aligned to `align` (a power of two; at least
    /// 1) that do not cross a region boundary. Never freed.
    ///
    /// # Errors
    /// [`FrontendError::OutOfMemory`] when no region has room.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<u64, FrontendError> {
        let align = align.max(1);
        while let Some(&(base, size)) = self.regions.get(self.cursor.0) {
            let start = self.cursor.1.max(base).next_multiple_of(align);
            if start + len <= base + size {
                self.cursor.1 = start + len;
                return Ok(start);
            }
            self.cursor.0 += 1;
            if let Some(&(next, _)) = self.regions.get(self.cursor.0) {
                self.cursor.1 = next;
            }
        }
        Err(FrontendError::OutOfMemory(len))
    }
}

fn memfd(name: &CStr) -> io::Result<File> {
    // SAFETY: `name` is NUL-terminated; the result is checked and owned.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}
