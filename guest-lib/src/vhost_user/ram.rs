//! The memory a process shares with a vrnic daemon: one sparse memfd,
//! DMA memory carved from it, and the program's registered pages remapped
//! onto it ([`Ram`]; see the [module documentation](super) for why and
//! the limits). The device reaches it at a device address of its own
//! (`gpa_base`): [`super::GPA_BASE`] for a process attached to the daemon
//! itself, another range for each program of a guest agent over
//! vhost-user ([`crate::agent`], [`crate::agent::proto::MODE_FILE`]).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{errno, io_err};
use crate::transport::{DmaBuf, TransportError};

/// DMA memory is carved from chunks of this many bytes.
const DMA_CHUNK: usize = 2 << 20;
/// Page size of the memfd and of the remapped pages, bytes.
pub(crate) const PAGE: usize = 4096;

/// The shared memory: a memfd mapped at `base`, page-granular first-fit
/// allocation of its offsets, and DMA memory handed out from it
/// ([`DmaCarver`]).
#[derive(Debug)]
pub(crate) struct Ram {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    /// Free extents, offset → length (bytes, page multiples), coalesced.
    free: BTreeMap<usize, usize>,
    /// DMA memory of the connection itself (rings, bounce buffer) and of
    /// [`Transport::alloc_dma`] on this transport.
    dma: DmaCarver,
    /// Device address of the memfd's first byte.
    gpa_base: u64,
    /// The program's registered pages remapped onto the memfd.
    user: UserPages,
}

/// Carves DMA memory out of the shared memory, remembering what it took so
/// that it can be given back at once: the connection has one, and each
/// device context sharing it ([`shared::VhostUserContext`]) one of its own,
/// returned when the context is closed.
///
/// Buffers are also given back one at a time ([`Ram::release_in`], for
/// [`Transport::release_dma`](crate::transport::Transport::release_dma)):
/// a program that creates and destroys CQs and QPs for as long as it runs
/// must not use up the shared memory (it did: 4095 create/destroy cycles
/// of a CQ of `max_cqe` entries, 4 MiB each, spent the 16 GiB, and every
/// create failed with `ENOMEM` though none was alive). So a buffer of up
/// to [`SLOT_MAX`] bytes is a slot of a power-of-two size carved from
/// 2 MiB chunks, kept on a free list of its size when released and zeroed
/// when handed out again; a larger one (alignment up to a page) is pages
/// of its own, taken first-fit and given back (their memory released) when
/// released. Only a buffer aligned to more than a page is carved for good.
#[derive(Debug, Default)]
pub(crate) struct DmaCarver {
    /// The chunk being carved: (offset, used, size).
    current: Option<(usize, usize, usize)>,
    /// Every chunk taken: (offset, size).
    chunks: Vec<(usize, usize)>,
    /// Slots handed out: offset → size.
    slots: BTreeMap<usize, usize>,
    /// Released slots by size: offsets.
    free_slots: BTreeMap<usize, Vec<usize>>,
    /// Buffers of pages of their own handed out: offset → bytes.
    extents: BTreeMap<usize, usize>,
}

/// Largest buffer handed out as a slot ([`DmaCarver`]), bytes.
const SLOT_MAX: usize = 2048;
/// Smallest slot, bytes: a cache line, the alignment doorbell records ask.
const SLOT_MIN: usize = 64;

// SAFETY: the mapping is owned by the Ram; access is synchronised by the
// transport's owner (`&mut self` for every change).
unsafe impl Send for Ram {}

impl Ram {
    pub(crate) fn new(len: usize, gpa_base: u64) -> Result<Self, TransportError> {
        // SAFETY: plain syscall with a static name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"vrnic-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io_err("memfd_create", io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io_err("ftruncate of guest RAM", io::Error::last_os_error()));
        }
        // SAFETY: a new shared mapping of our memfd; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io_err("mmap of guest RAM", io::Error::last_os_error()));
        }
        Ok(Ram {
            fd,
            base: base.cast(),
            len,
            free: BTreeMap::from([(0, len)]),
            dma: DmaCarver::default(),
            gpa_base,
            user: BTreeMap::new(),
        })
    }

    fn gpa(&self, off: usize) -> u64 {
        self.gpa_base + off as u64
    }

    /// Takes `bytes` (a page multiple) of the memfd, first fit.
    fn take(&mut self, bytes: usize) -> Option<usize> {
        let (&off, &len) = self.free.iter().find(|(_, &l)| l >= bytes)?;
        self.free.remove(&off);
        if len > bytes {
            self.free.insert(off + bytes, len - bytes);
        }
        Some(off)
    }

    /// Returns `[off, off + bytes)` and releases its memory.
    pub(crate) fn give_back(&mut self, off: usize, bytes: usize) {
        // SAFETY: plain syscall on our memfd; failure only keeps memory committed.
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off as libc::off_t,
                bytes as libc::off_t,
            )
        };
        let (mut start, mut len) = (off, bytes);
        if let Some((&p, &pl)) = self.free.range(..off).next_back() {
            if p + pl == off {
                self.free.remove(&p);
                start = p;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(off + bytes)) {
            self.free.remove(&(off + bytes));
            len += nl;
        }
        self.free.insert(start, len);
    }

    pub(crate) fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        let mut dma = std::mem::take(&mut self.dma);
        let r = self.carve(&mut dma, len, align);
        self.dma = dma;
        r
    }

    /// [`Ram::release_in`] for the connection's own DMA memory.
    pub(crate) fn release_dma(&mut self, buf: DmaBuf) {
        let mut dma = std::mem::take(&mut self.dma);
        self.release_in(&mut dma, buf);
        self.dma = dma;
    }

    /// `len` zeroed bytes aligned to `align` for `carver`: a slot, pages of
    /// their own, or (aligned to more than a page) carved from its chunk
    /// ([`DmaCarver`]).
    pub(crate) fn carve(
        &mut self,
        carver: &mut DmaCarver,
        len: usize,
        align: usize,
    ) -> Result<DmaBuf, TransportError> {
        if !align.is_power_of_two() || align > DMA_CHUNK {
            return Err(TransportError::NoDmaMemory(len));
        }
        let len = len.max(1);
        let slot = len.max(align).max(SLOT_MIN).next_power_of_two();
        if slot <= SLOT_MAX {
            if let Some(off) = carver.free_slots.get_mut(&slot).and_then(Vec::pop) {
                carver.slots.insert(off, slot);
                let buf = self.buf(off, len);
                // SAFETY: the slot lies inside the mapping, and nothing uses
                // it since it was released (after the device let go of it).
                unsafe { std::ptr::write_bytes(buf.ptr, 0, slot) };
                return Ok(buf);
            }
            let buf = self.carve_chunk(carver, slot, slot)?;
            carver.slots.insert(self.offset_of(&buf), slot);
            return Ok(buf);
        }
        if align <= PAGE {
            let bytes = len
                .checked_next_multiple_of(PAGE)
                .ok_or(TransportError::NoDmaMemory(len))?;
            let off = self.take(bytes).ok_or(TransportError::NoDmaMemory(len))?;
            carver.extents.insert(off, bytes);
            return Ok(self.buf(off, len));
        }
        self.carve_chunk(carver, len, align)
    }

    /// Gives `buf`, handed out by [`Ram::carve`] for `carver`, back for
    /// reuse: a slot to its free list, pages of their own to the shared
    /// memory (released). A buffer carved for good, or one `carver` did
    /// not hand out, stays as it is. Only once the device no longer uses
    /// it.
    pub(crate) fn release_in(&mut self, carver: &mut DmaCarver, buf: DmaBuf) {
        let off = self.offset_of(&buf);
        if let Some(slot) = carver.slots.remove(&off) {
            carver.free_slots.entry(slot).or_default().push(off);
        } else if let Some(bytes) = carver.extents.remove(&off) {
            self.give_back(off, bytes);
        }
    }

    /// Offset in the memfd of `buf`'s first byte (`usize::MAX` for a buffer
    /// outside the mapping, which no carver has handed out).
    fn offset_of(&self, buf: &DmaBuf) -> usize {
        (buf.ptr as usize)
            .checked_sub(self.base as usize)
            .filter(|&o| o < self.len)
            .unwrap_or(usize::MAX)
    }

    /// `len` bytes aligned to `align` from `carver`'s chunk, or from a new
    /// chunk it takes.
    fn carve_chunk(
        &mut self,
        carver: &mut DmaCarver,
        len: usize,
        align: usize,
    ) -> Result<DmaBuf, TransportError> {
        if let Some((off, used, size)) = carver.current {
            let start = (off + used).next_multiple_of(align);
            if start + len <= off + size {
                carver.current = Some((off, start + len - off, size));
                return Ok(self.buf(start, len));
            }
        }
        let size = len
            .checked_next_multiple_of(DMA_CHUNK)
            .ok_or(TransportError::NoDmaMemory(len))?;
        let off = self.take(size).ok_or(TransportError::NoDmaMemory(len))?;
        carver.current = Some((off, len, size));
        carver.chunks.push((off, size));
        Ok(self.buf(off, len))
    }

    fn buf(&self, off: usize, len: usize) -> DmaBuf {
        DmaBuf {
            // SAFETY: off + len <= self.len: inside the mapping.
            ptr: unsafe { self.base.add(off) },
            len,
            gpa: self.gpa(off),
        }
    }

    /// Sets where the device reaches the memfd's first byte (learnt after
    /// the memfd was handed over); before any memory is handed out.
    pub(crate) fn set_gpa_base(&mut self, gpa_base: u64) {
        self.gpa_base = gpa_base;
    }

    /// Where the device reaches the memfd's first byte (0: not yet known).
    pub(crate) fn gpa_base(&self) -> u64 {
        self.gpa_base
    }

    /// The memfd, for the daemon's memory table.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Size of the memfd (and its mapping), bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Where the memfd is mapped in this process.
    pub(crate) fn base(&self) -> usize {
        self.base as usize
    }

    /// Pages of the program currently remapped onto the memfd.
    pub(crate) fn user_pages(&self) -> usize {
        self.user.len()
    }

    /// Gives back every chunk `carver` took (their memory is released).
    /// Only once the device no longer uses any of it.
    pub(crate) fn free_dma(&mut self, carver: &mut DmaCarver) {
        carver.current = None;
        carver.slots.clear();
        carver.free_slots.clear();
        for (off, size) in carver.chunks.drain(..) {
            self.give_back(off, size);
        }
        for (off, bytes) in std::mem::take(&mut carver.extents) {
            self.give_back(off, bytes);
        }
    }

    /// The device address of `va`: inside the memfd's own mapping, or in a
    /// page remapped by [`Ram::map_user`]. Anything else is `EFAULT`.
    pub(crate) fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        let base = self.base as usize;
        if va >= base && va < base + self.len {
            return Ok(self.gpa(va - base));
        }
        let page = va & !(PAGE - 1);
        self.user
            .get(&page)
            .map(|&(off, _)| self.gpa(off) + (va - page) as u64)
            .ok_or_else(|| errno(format!("address {va:#x} is not registered"), libc::EFAULT))
    }

    /// Remaps the run of pages `[va, va + n * PAGE)` (none of them
    /// remapped yet) onto fresh shared memory, contents kept.
    fn remap_run(&mut self, va: usize, n: usize) -> Result<(), TransportError> {
        FORK_HANDLER.call_once(|| {
            // SAFETY: registers plain function pointers (see `fork_prepare`).
            unsafe {
                libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child))
            };
        });
        let bytes = n * PAGE;
        check_private(va, bytes)?;
        let off = self.take(bytes).ok_or_else(|| {
            errno(
                format!("registering {bytes} bytes at {va:#x}"),
                libc::ENOMEM,
            )
        })?;
        // Copy with pwrite(2) from the program's pages into the memfd: an
        // unmapped page is EFAULT, not a crash (and no ptrace-class call a
        // container's seccomp profile may refuse).
        let mut done = 0usize;
        while done < bytes {
            // SAFETY: the kernel reads `[va + done, va + bytes)` and checks it.
            let got = unsafe {
                libc::pwrite(
                    self.fd.as_raw_fd(),
                    (va + done) as *const libc::c_void,
                    bytes - done,
                    (off + done) as libc::off_t,
                )
            };
            if got <= 0 {
                let e = if got < 0 {
                    io::Error::last_os_error()
                } else {
                    io::Error::from_raw_os_error(libc::EFAULT)
                };
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                self.give_back(off, bytes);
                return Err(io_err(format!("reading memory at {va:#x}+{bytes}"), e));
            }
            done += got as usize;
        }
        // SAFETY: replaces the program's own pages `[va, va + bytes)` (which
        // it asked to register) by the same bytes in shared memory.
        let p = unsafe {
            raw::mmap(
                va as *mut libc::c_void,
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            self.give_back(off, bytes);
            return Err(io_err(format!("remapping {va:#x}+{bytes}"), e));
        }
        for i in 0..n {
            self.user.insert(va + i * PAGE, (off + i * PAGE, 1));
            lock_remapped().insert(va + i * PAGE);
        }
        Ok(())
    }

    /// Gives the run `[va, va + n * PAGE)` (remapped, last user gone) back
    /// its private anonymous memory with the same contents.
    ///
    /// The copy is made in a fresh private mapping of its own, which then
    /// replaces the run in one `mremap(2)`; not in a heap buffer: the run
    /// is often heap memory itself (a small `posix_memalign`'d buffer, as
    /// pyverbs registers, shares its page with malloc's other chunks), so
    /// a heap buffer could lie inside the run, be wiped with it and copy
    /// zeros back over malloc's chunks (`free(): invalid pointer` later).
    ///
    /// A page the program unmapped itself while it was still registered
    /// (UCX's registration cache, `ucs_rcache`, deregisters lazily, after
    /// its memory pool has `munmap`ped the chunk: `ucx_info -d` does so in
    /// `uct_ib_md_close`) is not restored: its offset is given back and
    /// nothing is mapped there. Such a hole could otherwise be where the
    /// kernel puts the copy (`mmap(NULL)` reuses it), and reading it faults.
    fn restore_run(&mut self, va: usize, n: usize) {
        let bytes = n * PAGE;
        if !is_mapped(va, n) {
            if n > 1 {
                for i in 0..n {
                    self.restore_run(va + i * PAGE, 1);
                }
            } else if let Some((off, _)) = self.user.remove(&va) {
                lock_remapped().remove(&va);
                self.give_back(off, PAGE);
            }
            return;
        }
        if let Err(e) = privatize(va, bytes) {
            tracing::warn!("restoring {va:#x}+{bytes}: {e}; the pages stay shared");
            return;
        }
        let mut remapped = lock_remapped();
        for i in 0..n {
            remapped.remove(&(va + i * PAGE));
            if let Some((off, _)) = self.user.remove(&(va + i * PAGE)) {
                self.give_back(off, PAGE);
            }
        }
    }

    /// Remaps the pages of `[va, va + len)` onto shared memory (see the
    /// module documentation). Errors: `EINVAL` for an unaligned or empty
    /// range or one inside a hugetlb mapping, `EFAULT` for unmapped memory,
    /// `ENOMEM` when the shared memory is full.
    pub(crate) fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        let end = va.checked_add(len);
        let (true, Some(end)) = (
            va.is_multiple_of(PAGE) && len.is_multiple_of(PAGE) && len > 0,
            end,
        ) else {
            return Err(errno(format!("range {va:#x}+{len}"), libc::EINVAL));
        };
        let base = self.base as usize;
        if va < base + self.len && end > base {
            // DMA memory of this transport (Mr::alloc): already shared.
            return Ok(());
        }
        let mut done: Vec<usize> = Vec::new();
        let mut page = va;
        while page < end {
            if let Some(e) = self.user.get_mut(&page) {
                e.1 = e.1.saturating_add(1);
                done.push(page);
                page += PAGE;
                continue;
            }
            let mut n = 1;
            while page + n * PAGE < end && !self.user.contains_key(&(page + n * PAGE)) {
                n += 1;
            }
            if let Err(e) = self.remap_run(page, n) {
                // Undo what this call did.
                for p in done {
                    self.release_page(p);
                }
                return Err(e);
            }
            done.extend((0..n).map(|i| page + i * PAGE));
            page += n * PAGE;
        }
        Ok(())
    }

    pub(crate) fn unmap_user(&mut self, va: usize, len: usize) {
        let base = self.base as usize;
        let end = va.saturating_add(len);
        if va < base + self.len && end > base {
            return;
        }
        // Drop this MR's hold on every page; restore the pages nobody
        // holds any more, a run of neighbours at a time.
        let mut run: Option<(usize, usize)> = None;
        let mut page = va & !(PAGE - 1);
        while page < end {
            let last = match self.user.get_mut(&page) {
                Some(e) => {
                    e.1 = e.1.saturating_sub(1);
                    e.1 == 0
                }
                None => false,
            };
            run = match (run, last) {
                (Some((s, n)), true) => Some((s, n + 1)),
                (None, true) => Some((page, 1)),
                (Some((s, n)), false) => {
                    self.restore_run(s, n);
                    None
                }
                (None, false) => None,
            };
            page += PAGE;
        }
        if let Some((s, n)) = run {
            self.restore_run(s, n);
        }
    }

    /// Drops one MR's hold on `page`; the last one restores it.
    fn release_page(&mut self, page: usize) {
        self.unmap_user(page, PAGE);
    }
}

/// Makes `[va, va + bytes)` (mapped shared onto a memory file) private
/// anonymous memory with the same contents, at the same address: a
/// [`snapshot`] moved over it ([`move_over`]). Not through a heap buffer,
/// which could lie inside the run, be wiped with it and copy zeros back
/// over malloc's chunks (`free(): invalid pointer` later). Errors:
/// [`snapshot`]'s and `mremap(2)`'s (the run then stays shared).
fn privatize(va: usize, bytes: usize) -> io::Result<()> {
    let tmp = snapshot(va, bytes)?;
    move_over(tmp, va, bytes)
}

/// Moves the private copy `tmp` (`bytes` long, [`snapshot`]) over
/// `[va, va + bytes)` in one `mremap(2)` (`MREMAP_FIXED` unmaps what was
/// there first). Errors: `mremap(2)`'s; the copy is then unmapped and the
/// range left as it was.
fn move_over(tmp: usize, va: usize, bytes: usize) -> io::Result<()> {
    // SAFETY: `tmp` is a mapping of `bytes` bytes of this process's own,
    // used by nothing else; the range it replaces is a remapped run.
    let p = unsafe {
        raw::mremap(
            tmp as *mut libc::c_void,
            bytes,
            bytes,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            va as *mut libc::c_void,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: the copy, not moved.
        unsafe { raw::munmap(tmp as *mut libc::c_void, bytes) };
        return Err(e);
    }
    Ok(())
}

/// `mmap(2)`, `mremap(2)` and `munmap(2)` made with `syscall(2)`, not
/// through libc's wrappers, for swapping a registered page's backing (same
/// address, same contents): a program's memory hooks must not hear of it.
/// UCX's `ucm` patches libc's `mmap`/`munmap`/`mremap` to learn of memory
/// the program unmaps and invalidates its registration cache's entries
/// there (`UCX_MEM_EVENTS`); it took the library's swap inside
/// `ibv_reg_mr` for an unmap of the buffer just registered, deregistered
/// it while a transfer into it was under way, and an MPI rendezvous
/// message arrived altered. Errors as the calls' (`MAP_FAILED`/-1, errno
/// set by `syscall(2)`).
mod raw {
    use libc::{c_int, c_void, off_t, size_t};

    /// `mmap(2)`.
    ///
    /// # Safety
    /// As `mmap(2)`: a fixed `addr` replaces what is mapped there.
    pub(super) unsafe fn mmap(
        addr: *mut c_void,
        len: size_t,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: off_t,
    ) -> *mut c_void {
        // SAFETY: the caller's; the kernel checks every argument.
        let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
        if r == -1 {
            libc::MAP_FAILED
        } else {
            r as *mut c_void
        }
    }

    /// `mremap(2)` with a new address.
    ///
    /// # Safety
    /// As `mremap(2)`: `MREMAP_FIXED` replaces what is mapped at `new`.
    pub(super) unsafe fn mremap(
        old: *mut c_void,
        old_len: size_t,
        new_len: size_t,
        flags: c_int,
        new: *mut c_void,
    ) -> *mut c_void {
        // SAFETY: the caller's; the kernel checks every argument.
        let r = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new) };
        if r == -1 {
            libc::MAP_FAILED
        } else {
            r as *mut c_void
        }
    }

    /// `munmap(2)`.
    ///
    /// # Safety
    /// As `munmap(2)`: nothing may use the range after.
    pub(super) unsafe fn munmap(addr: *mut c_void, len: size_t) -> c_int {
        // SAFETY: the caller's.
        unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
    }
}

/// Every page of this process remapped onto a memory file (all [`Ram`]s),
/// for [`fork_prepare`].
static REMAPPED: std::sync::Mutex<std::collections::BTreeSet<usize>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Registers the fork handlers ([`fork_prepare`]) once, at the first
/// remapped page.
static FORK_HANDLER: std::sync::Once = std::sync::Once::new();

fn lock_remapped() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<usize>> {
    REMAPPED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Snapshots of the remapped runs taken before a fork ([`fork_prepare`]):
/// (address, bytes, private copy).
static SNAPSHOTS: std::sync::Mutex<Vec<(usize, usize, usize)>> = std::sync::Mutex::new(Vec::new());

fn lock_snapshots() -> std::sync::MutexGuard<'static, Vec<(usize, usize, usize)>> {
    SNAPSHOTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A private anonymous copy of `[va, va + bytes)`, at an address the
/// kernel picks. The copy is made in a fresh mapping of its own, not in a
/// heap buffer: the run is often heap memory itself (a small
/// `posix_memalign`'d buffer, as pyverbs registers, shares its page with
/// malloc's other chunks). Errors: `ENOMEM` for a range the program
/// unmapped itself (nothing to copy), `mmap(2)`'s.
fn snapshot(va: usize, bytes: usize) -> io::Result<usize> {
    if !is_mapped(va, bytes / PAGE) {
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    }
    // SAFETY: a new private mapping at an address the kernel picks; no
    // existing memory is touched.
    let tmp = unsafe {
        raw::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the run is mapped (checked) and ours; `tmp` is a distinct
    // fresh mapping of `bytes` bytes, so the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(va as *const u8, tmp.cast::<u8>(), bytes) };
    Ok(tmp as usize)
}

/// `pthread_atfork(3)` handlers giving a forked child private copies of its
/// parent's registered pages, as a kernel with copy-on-fork does (the
/// reason `ibv_is_fork_initialized(3)` answers `IBV_FORK_UNNEEDED`),
/// instead of sharing them with the parent, whose device keeps using them.
/// The copies must hold the pages as they were at the fork, so the parent
/// takes them before it forks (the device may write the pages as soon as
/// the parent goes on): `fork_prepare` copies each run of neighbouring
/// pages (a page at a time in a run with a page the program unmapped); in
/// the child `fork_child` moves each copy over its run (`mremap(2)`, no
/// copy: the child's view of the parent's private copy is copy-on-write);
/// in the parent `fork_parent` unmaps them. The cost: one copy of all
/// registered memory per `fork(2)`.
extern "C" fn fork_prepare() {
    let set = lock_remapped();
    let mut snaps = lock_snapshots();
    snaps.clear();
    let mut take = |s: usize, n: usize| match snapshot(s, n * PAGE) {
        Ok(tmp) => snaps.push((s, n * PAGE, tmp)),
        Err(_) => {
            for i in 0..n {
                if let Ok(tmp) = snapshot(s + i * PAGE, PAGE) {
                    snaps.push((s + i * PAGE, PAGE, tmp));
                }
            }
        }
    };
    let mut run: Option<(usize, usize)> = None;
    for &page in set.iter() {
        run = match run {
            Some((s, n)) if s + n * PAGE == page => Some((s, n + 1)),
            Some((s, n)) => {
                take(s, n);
                Some((page, 1))
            }
            None => Some((page, 1)),
        };
    }
    if let Some((s, n)) = run {
        take(s, n);
    }
}

/// See [`fork_prepare`]: the parent's copies go.
extern "C" fn fork_parent() {
    let mut snaps = lock_snapshots();
    for &(_, bytes, tmp) in snaps.iter() {
        // SAFETY: a copy fork_prepare mapped; nothing else uses it.
        unsafe { raw::munmap(tmp as *mut libc::c_void, bytes) };
    }
    snaps.clear();
}

/// See [`fork_prepare`]: the child's copies replace its runs; its set of
/// remapped pages is emptied (they are no longer the child's to give back).
extern "C" fn fork_child() {
    let Ok(mut snaps) = SNAPSHOTS.try_lock() else {
        return;
    };
    for &(va, bytes, tmp) in snaps.iter() {
        // A copy that cannot be moved is unmapped; the run stays shared.
        let _ = move_over(tmp, va, bytes);
    }
    snaps.clear();
    if let Ok(mut set) = REMAPPED.try_lock() {
        set.clear();
    }
}

impl Drop for Ram {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unused once the transport is gone.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Registered pages of the program remapped onto the shared memory:
/// page address → (memfd offset, number of MRs covering it).
type UserPages = BTreeMap<usize, (usize, u32)>;

/// Whether every page of `[va, va + n * PAGE)` is mapped in this process
/// (`mincore(2)` fails with `ENOMEM` when one is not). No allocation.
fn is_mapped(va: usize, n: usize) -> bool {
    const CHUNK: usize = 64;
    let mut vec = [0u8; CHUNK];
    let mut done = 0;
    while done < n {
        let k = (n - done).min(CHUNK);
        // SAFETY: mincore only reads the page tables of the range and
        // writes one byte per page into `vec`, which holds CHUNK >= k.
        let r = unsafe {
            libc::mincore(
                (va + done * PAGE) as *mut libc::c_void,
                k * PAGE,
                vec.as_mut_ptr(),
            )
        };
        if r != 0 {
            return false;
        }
        done += k;
    }
    true
}

/// Refuses to remap `[va, va + bytes)` when any of it is a shared mapping
/// (`s` in `/proc/self/maps`: memory shared with another process, which
/// remapping would silently unshare) or a hugetlb one (`/anon_hugepage`,
/// hugetlbfs: 4 KiB pages cannot be mapped over it). Errors: `EINVAL` for
/// those, `EFAULT` for a range no mapping covers, `Io` when the maps cannot
/// be read.
fn check_private(va: usize, bytes: usize) -> Result<(), TransportError> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| io_err("reading /proc/self/maps", e))?;
    let end = va + bytes;
    let mut covered = va;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((s, e)) = range.split_once('-') else {
            continue;
        };
        let (Ok(s), Ok(e)) = (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)) else {
            continue;
        };
        if e <= va || s >= end {
            continue;
        }
        let path = f.nth(3).unwrap_or("");
        let hugetlb = path.starts_with("/anon_hugepage") || path.contains("hugepages");
        if perms.as_bytes().get(3) == Some(&b's') || hugetlb {
            let what = if hugetlb { "a hugetlb" } else { "a shared" };
            return Err(errno(
                format!(
                    "registering {va:#x}+{bytes}: {what} mapping ({line}) cannot be moved onto \
                     the daemon's memory"
                ),
                libc::EINVAL,
            ));
        }
        if s <= covered {
            covered = covered.max(e);
        }
    }
    if covered < end {
        return Err(errno(
            format!("registering {va:#x}+{bytes}: {covered:#x} is not mapped"),
            libc::EFAULT,
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private anonymous mapping of `n` pages, page `i` filled with `i + 1`.
    fn private_pages(n: usize) -> usize {
        // SAFETY: a new private mapping at an address the kernel picks.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        for i in 0..n {
            // SAFETY: page i of the mapping just made.
            unsafe { std::ptr::write_bytes(p.cast::<u8>().add(i * PAGE), i as u8 + 1, PAGE) };
        }
        p as usize
    }

    /// DMA memory given back one buffer at a time is handed out again,
    /// zeroed: creating and destroying rings for ever does not use up the
    /// shared memory, and closing the context gives back what is left.
    #[test]
    fn released_dma_is_reused_zeroed_and_churn_does_not_run_out() {
        let mut ram = Ram::new(8 << 20, 1 << 32).expect("ram");
        let free_before: usize = ram.free.values().sum();
        let mut carver = DmaCarver::default();
        // A ring of 2 MiB and a record, 100 times: 200 MiB through 8 MiB.
        for _ in 0..100 {
            let ring = ram.carve(&mut carver, 2 << 20, PAGE).expect("ring");
            let rec = ram.carve(&mut carver, 8, 64).expect("record");
            assert_eq!(ring.gpa % PAGE as u64, 0);
            assert_eq!(rec.gpa % 64, 0);
            // SAFETY: both buffers are ours, inside the mapping.
            unsafe {
                assert_eq!(*ring.ptr.add(4096), 0, "a reused ring is zeroed");
                assert_eq!(*rec.ptr, 0, "a reused record is zeroed");
                *ring.ptr.add(4096) = 0xa5;
                *rec.ptr = 0x5a;
            }
            ram.release_in(&mut carver, ring);
            ram.release_in(&mut carver, rec);
        }
        // Slots of one size share a chunk; released ones come back first.
        let a = ram.carve(&mut carver, 100, 64).expect("slot");
        let b = ram.carve(&mut carver, 100, 64).expect("slot");
        assert_eq!(b.gpa, a.gpa + 128);
        ram.release_in(&mut carver, a);
        assert_eq!(ram.carve(&mut carver, 128, 8).expect("slot").gpa, a.gpa);
        // A buffer another carver handed out is not this one's to release.
        let mut other = DmaCarver::default();
        let c = ram.carve(&mut other, 3 * PAGE, PAGE).expect("extent");
        ram.release_in(&mut carver, c);
        assert_eq!(other.extents.len(), 1);
        ram.free_dma(&mut other);
        ram.free_dma(&mut carver);
        assert_eq!(ram.free.values().sum::<usize>(), free_before);
        assert_eq!(ram.free.len(), 1, "the free extents coalesce again");
    }

    /// A program that unmaps registered memory before deregistering it
    /// (UCX's registration cache does): the pages still mapped are restored
    /// with their contents, the unmapped one is left alone, and every
    /// offset is given back.
    #[test]
    fn unmap_user_after_program_unmapped_part_of_the_range() {
        let mut ram = Ram::new(4 << 20, 0).expect("ram");
        let free_before: usize = ram.free.values().sum();
        let va = private_pages(3);
        ram.map_user(va, 3 * PAGE).expect("map_user");
        assert_eq!(ram.user_pages(), 3);
        // SAFETY: the middle page of our own mapping.
        let r = unsafe { libc::munmap((va + PAGE) as *mut libc::c_void, PAGE) };
        assert_eq!(r, 0);
        ram.unmap_user(va, 3 * PAGE);
        assert_eq!(ram.user_pages(), 0);
        assert_eq!(ram.free.values().sum::<usize>(), free_before);
        for i in [0, 2] {
            // SAFETY: pages 0 and 2 are still mapped (restored, private).
            let b = unsafe { *((va + i * PAGE) as *const u8) };
            assert_eq!(b, i as u8 + 1);
        }
        // SAFETY: our own mapping's remaining pages.
        unsafe {
            libc::munmap(va as *mut libc::c_void, PAGE);
            libc::munmap((va + 2 * PAGE) as *mut libc::c_void, PAGE);
        }
    }

    /// The whole registered range unmapped by the program first.
    #[test]
    fn unmap_user_after_program_unmapped_the_range() {
        let mut ram = Ram::new(4 << 20, 0).expect("ram");
        let va = private_pages(2);
        ram.map_user(va, 2 * PAGE).expect("map_user");
        // SAFETY: our own mapping.
        let r = unsafe { libc::munmap(va as *mut libc::c_void, 2 * PAGE) };
        assert_eq!(r, 0);
        ram.unmap_user(va, 2 * PAGE);
        assert_eq!(ram.user_pages(), 0);
    }
}
