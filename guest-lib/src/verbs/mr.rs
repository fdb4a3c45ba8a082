//! Memory regions (`ibv_reg_mr(3)`).

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Mutex;

use vrnic_abi::{self as abi, command};

use super::{lock, ArgError, Pd, Result, Sge, VerbsError};

/// A registered memory region (`struct ibv_mr`), deregistered
/// (`ibv_dereg_mr(3)`, `CMD_DEREG_MR`) on drop.
///
/// `'a` is the lifetime of the memory it covers: [`Mr::register`] borrows a
/// slice mutably for as long as the MR lives, so the device is the only
/// other party touching it; [`Mr::alloc`] owns DMA memory (`Mr<'static>`).
/// Read and write the contents with [`Mr::read`] and [`Mr::write`]; they
/// are meaningful only while no work request that accesses them is
/// outstanding (as with `ibv_reg_mr(3)` buffers in C).
///
/// The region's `addr` (its iova) is the process virtual address of its
/// first byte, as with `ibv_reg_mr(3)`; [`Sge::addr`] and remote addresses
/// use it.
#[derive(Debug)]
pub struct Mr<'a> {
    pd: Pd,
    ptr: *mut u8,
    len: usize,
    access: u32,
    keys: abi::MrKeys,
    /// The range given to [`crate::transport::Transport::map_user`], undone on drop.
    mapped: Option<(usize, usize)>,
    _locked: Option<LockedRange>,
    _mem: PhantomData<&'a mut [u8]>,
}

// SAFETY: an Mr is a description of memory it has exclusive use of (with the
// device); moving it to another thread moves that use with it. It is not
// Sync: `write` takes `&self`.
unsafe impl Send for Mr<'_> {}

impl<'a> Mr<'a> {
    /// Registers `buf` (`ibv_reg_mr(3)`): locks its pages in memory
    /// (`mlock(2)`), builds the page list from [`crate::transport::Transport::virt_to_phys`]
    /// at the transport's page size and executes `CMD_REG_MR`.
    /// `access` is a combination of `ACCESS_*` (`ibv_access_flags`).
    ///
    /// Errors: `EINVAL` for an empty `buf`; `mlock` failures
    /// ([`VerbsError::Os`], e.g. `ENOMEM` above `RLIMIT_MEMLOCK`); a failed
    /// address translation (memory the transport cannot give the device,
    /// e.g. outside the loopback transport's arenas); the device's status
    /// (`EPERM` for remote write/atomic without local write, `EINVAL` for
    /// more pages than `max_mr_pages`, `ENOMEM` at `max_mr` or past
    /// `max_total_mr_pages`, `ibv_query_device`'s budgets).
    pub fn register(pd: &Pd, buf: &'a mut [u8], access: u32) -> Result<Mr<'a>> {
        Self::reg(pd, buf.as_mut_ptr(), buf.len(), access, true)
    }

    fn reg(pd: &Pd, ptr: *mut u8, len: usize, access: u32, lock_pages: bool) -> Result<Mr<'a>> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument(ArgError::EmptyMr));
        }
        let start = ptr as usize;
        let end = start
            .checked_add(len)
            .ok_or(VerbsError::InvalidArgument(ArgError::MrWraps))?;
        let ctx = pd.context();
        let locked = if lock_pages && ctx.with_transport(|t| t.needs_locked_pages()) {
            Some(LockedRange::lock(start, len)?)
        } else {
            None
        };

        let ps = ctx.page_size();
        let first = start & !(ps - 1);
        let npages = (end - first).div_ceil(ps);
        let mapped = if lock_pages {
            let range = (first, npages * ps);
            ctx.with_transport(|t| t.map_user(range.0, range.1))?;
            Some(range)
        } else {
            None
        };
        let unmap = |e: VerbsError| {
            if let Some((va, len)) = mapped {
                ctx.with_transport(|t| t.unmap_user(va, len));
            }
            e
        };
        let npages_u32 = u32::try_from(npages)
            .map_err(|_| VerbsError::InvalidArgument(ArgError::MrTooLarge { len }))?;
        let guard = ctx.page_list_buf(npages * 8).map_err(unmap)?;
        let list = guard.buf();
        ctx.with_transport(|t| -> Result<()> {
            for i in 0..npages {
                let gpa = t.virt_to_phys(first + i * ps)?;
                // SAFETY: the page-list buffer holds at least npages * 8
                // bytes (page_list_buf) and is ours while `guard` lives.
                unsafe {
                    list.ptr
                        .add(i * 8)
                        .cast::<[u8; 8]>()
                        .write_unaligned(gpa.to_le_bytes())
                };
            }
            Ok(())
        })
        .map_err(unmap)?;
        let body = abi::RegMr {
            pdn: pd.pdn(),
            access,
            iova: start as u64,
            length: len as u64,
            page_shift: ps.trailing_zeros(),
            npages: npages_u32,
            page_list: list.gpa,
        };
        let keys: abi::MrKeys = ctx.execute::<command::RegMr>(&body).map_err(unmap)?;
        drop(guard);
        Ok(Mr {
            pd: pd.clone(),
            ptr,
            len,
            access,
            keys,
            mapped,
            _locked: locked,
            _mem: PhantomData,
        })
    }

    /// Local key (`ibv_mr.lkey`), for [`Sge::lkey`].
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }

    /// Remote key (`ibv_mr.rkey`), for a peer's RDMA and atomic work requests.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }

    /// First address of the region (`ibv_mr.addr`): the process virtual
    /// address of its first byte.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Length, bytes (`ibv_mr.length`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: registration rejects empty regions.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `ACCESS_*` flags the region was registered with.
    pub fn access(&self) -> u32 {
        self.access
    }

    /// The PD the region belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// Pointer to the first byte, for callers that manage the memory themselves.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// A scatter/gather element for `len` bytes at byte `offset` of the region.
    ///
    /// # Panics
    /// When `offset..offset + len` is not inside the region or `len` exceeds `u32`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        self.check(offset, len);
        Sge {
            addr: self.addr() + offset as u64,
            length: u32::try_from(len).expect("SGE length fits u32"),
            lkey: self.lkey(),
        }
    }

    /// Copies `dst.len()` bytes at byte `offset` of the region into `dst`.
    ///
    /// # Panics
    /// When the range is not inside the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        self.check(offset, dst.len());
        // SAFETY: in bounds (checked); the region is valid for 'a; the
        // device only writes it while a work request is outstanding, which
        // the caller excludes (type-level doc).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
    }

    /// Copies `src` to byte `offset` of the region.
    ///
    /// # Panics
    /// When the range is not inside the region.
    pub fn write(&self, offset: usize, src: &[u8]) {
        self.check(offset, src.len());
        // SAFETY: as in `read`; Mr is not Sync, so no other thread writes
        // through this Mr concurrently.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) };
    }

    /// Sets every byte of the region to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: as in `write`, for the whole region.
        unsafe { std::ptr::write_bytes(self.ptr, byte, self.len) };
    }

    /// The region's contents.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.read(0, &mut v);
        v
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "range {offset}+{len} outside the {}-byte memory region",
            self.len
        );
    }
}

impl Mr<'static> {
    /// Registers `len` bytes at `ptr` (`ibv_reg_mr(3)` with a raw address),
    /// locking them as [`Mr::register`] does.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be valid, writable memory that stays allocated
    /// and is not otherwise accessed while a work request using it is
    /// outstanding, until the returned `Mr` is dropped.
    pub unsafe fn register_raw(
        pd: &Pd,
        ptr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Mr<'static>> {
        Self::reg(pd, ptr, len, access, true)
    }

    /// Allocates `len` zeroed bytes of page-aligned DMA memory from the
    /// transport and registers them: the buffer `ibv_rc_pingpong` would
    /// `memalign` and `ibv_reg_mr`. The memory is already resident, so it is
    /// not `mlock`ed; it lives as long as the transport (it is not returned
    /// when the MR is dropped). On the loopback transport MR memory must come
    /// from here (or another DMA allocation).
    ///
    /// Errors: as [`Mr::register`], plus the transport's out-of-DMA-memory error.
    pub fn alloc(pd: &Pd, len: usize, access: u32) -> Result<Mr<'static>> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument(ArgError::EmptyMr));
        }
        let ctx = pd.context();
        let ps = ctx.page_size();
        let rounded = len
            .checked_next_multiple_of(ps)
            .ok_or(VerbsError::InvalidArgument(ArgError::MrTooLarge { len }))?;
        let buf = ctx.alloc_dma(rounded, ps.min(2 << 20))?;
        Self::reg(pd, buf.ptr, len, access, false)
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        let ctx = self.pd.context();
        ctx.destroy::<command::DeregMr>("MR", self.keys.lkey);
        if let Some((va, len)) = self.mapped {
            ctx.with_transport(|t| t.unmap_user(va, len));
        }
    }
}

/// Pages locked with `mlock(2)` for an MR. Linux memory locks do not nest,
/// so locks are counted per page across all MRs of the process and a page
/// is unlocked when the last MR covering it goes.
#[derive(Debug)]
struct LockedRange {
    first: usize,
    pages: usize,
}

static LOCKED_PAGES: Mutex<BTreeMap<usize, u32>> = Mutex::new(BTreeMap::new());

fn system_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(ps)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

impl LockedRange {
    fn lock(start: usize, len: usize) -> Result<LockedRange> {
        let ps = system_page_size();
        let first = start & !(ps - 1);
        let pages = (start + len - first).div_ceil(ps);
        // SAFETY: mlock only changes residency of existing mappings; it fails
        // (ENOMEM) for unmapped addresses.
        if unsafe { libc::mlock(first as *const libc::c_void, pages * ps) } != 0 {
            return Err(VerbsError::Os {
                what: format!("mlock of {} bytes at {first:#x}", pages * ps),
                source: std::io::Error::last_os_error(),
            });
        }
        let mut map = lock(&LOCKED_PAGES);
        for i in 0..pages {
            *map.entry(first + i * ps).or_insert(0) += 1;
        }
        Ok(LockedRange { first, pages })
    }
}

impl Drop for LockedRange {
    fn drop(&mut self) {
        let ps = system_page_size();
        let mut map = lock(&LOCKED_PAGES);
        // Unlock maximal runs of pages no other MR holds.
        let mut run: Option<(usize, usize)> = None;
        let flush = |run: &mut Option<(usize, usize)>| {
            if let Some((a, n)) = run.take() {
                // SAFETY: munlock only changes residency; failure is harmless.
                unsafe { libc::munlock(a as *const libc::c_void, n * ps) };
            }
        };
        for i in 0..self.pages {
            let page = self.first + i * ps;
            let free = match map.get_mut(&page) {
                Some(c) if *c > 1 => {
                    *c -= 1;
                    false
                }
                _ => {
                    map.remove(&page);
                    true
                }
            };
            match (&mut run, free) {
                (Some((_, n)), true) => *n += 1,
                (None, true) => run = Some((page, 1)),
                (_, false) => flush(&mut run),
            }
        }
        flush(&mut run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_locks_are_counted_across_overlapping_ranges() {
        let ps = system_page_size();
        let mut buf = vec![0u8; 3 * ps];
        let start = buf.as_mut_ptr() as usize;
        let a = LockedRange::lock(start, 2 * ps).expect("mlock within RLIMIT_MEMLOCK");
        let b = LockedRange::lock(start + ps, ps).expect("mlock within RLIMIT_MEMLOCK");
        let count = |p: usize| lock(&LOCKED_PAGES).get(&(p & !(ps - 1))).copied();
        assert_eq!(count(start + ps), Some(2));
        drop(a);
        assert_eq!(count(start), None);
        assert_eq!(count(start + ps), Some(1));
        drop(b);
        assert_eq!(count(start + ps), None);
    }
}
