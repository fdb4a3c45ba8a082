//! A vrnic device reached from a container or a plain host process:
//! [`VhostUserTransport`], the process itself being the device's
//! vhost-user frontend (the DPDK virtio-user way) — no VM, no kernel
//! module, no privilege: only the daemon's vhost-user socket, mounted into
//! the container.
//!
//! What QEMU does for a guest, this transport does for the process
//! (vhost-user spec, "Starting the device"): `GET_FEATURES`,
//! `GET_PROTOCOL_FEATURES`, `SET_PROTOCOL_FEATURES`, `SET_OWNER`,
//! `SET_FEATURES`, `SET_MEM_TABLE`, and per queue `SET_VRING_NUM`,
//! `SET_VRING_BASE`, `SET_VRING_ADDR`, `SET_VRING_CALL`, `SET_VRING_KICK`,
//! `SET_VRING_ENABLE`; the configuration space through `GET_CONFIG`.
//! The queues themselves are driven by the same code as the virtio-pci
//! driver's (`crate::driver`); a queue is notified through its kick
//! eventfd, and the event queue interrupts through its call eventfd
//! ([`Transport::event_fd`]).
//!
//! # Memory: "guest RAM" is one memfd
//! The daemon reaches only memory the frontend shares with `SET_MEM_TABLE`.
//! The transport creates one sparse memfd of [`RAM_SIZE`] bytes (nothing
//! is committed until touched), maps it shared at one address of this
//! process and gives it to the daemon as a single region at
//! guest-physical address [`GPA_BASE`]. Rings and other DMA memory are
//! carved from it ([`Transport::alloc_dma`]).
//!
//! Memory a program registers is whatever it allocated (malloc, stack,
//! `mmap`). [`Transport::map_user`] makes it reachable without copies on the
//! data path, the way FreeFlow did: each page of the MR's range is copied
//! once into a free page of the memfd, and that memfd page is mapped over
//! the program's page at the same virtual address (`mmap(MAP_FIXED |
//! MAP_SHARED)`). The program keeps its pointer and sees the same bytes;
//! from then on the page *is* shared memory, and the device reads and
//! writes it in place. A page covered by several MRs is remapped once
//! (counted). When the last MR covering it is deregistered
//! ([`Transport::unmap_user`]), its contents are copied into a fresh
//! private anonymous mapping, which `mremap(2)` moves over the page at the
//! same address, and the memfd page is returned (`fallocate(PUNCH_HOLE)`).
//! No heap buffer is used for that copy: a registered page is often heap
//! memory itself (a small `posix_memalign`'d buffer shares its page with
//! malloc's other chunks).
//!
//! Limits, documented in `docs/ARCHITECTURE.md`:
//! - registration costs one copy of the range (and deregistration one
//!   more); a thread writing the range's pages *during* `ibv_reg_mr` or
//!   the last `ibv_dereg_mr` may lose that write (the same caveat as
//!   FreeFlow's; for a heap buffer that includes malloc's neighbouring
//!   chunks in those pages);
//! - remapped pages are `PROT_READ | PROT_WRITE` whatever they were;
//! - pages of a hugetlb mapping cannot be remapped with 4 KiB pages, and
//!   memory already shared with another process (`MAP_SHARED`, shm) would
//!   silently stop being shared: `ibv_reg_mr` fails with `EINVAL` on both
//!   (`/proc/self/maps` is read at registration);
//! - after `fork(2)`, remapped pages are shared with the child rather than
//!   copied on write (as with `ibv_fork_init(3)`, children must not touch
//!   registered memory);
//! - registered memory in all counts at most [`RAM_SIZE`] bytes.
//!
//! A vhost-user backend serves one frontend per socket at a time: one
//! program per function. Within that program, any number of device opens
//! share its one connection, each in a device context of its own
//! ([`VhostUserContext`], module [`shared`]). Several programs of one
//! container share a function through the guest agent ([`crate::agent`])
//! as in a VM.

pub mod shared;

pub use shared::VhostUserContext;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrnic_abi::{self as abi, Pod};

use crate::driver::{ControlQueue, Kick, Queue, SlotQueue, RESP_LEN, RESP_OFF, SLOT};
use crate::transport::{DmaBuf, Transport, TransportError};
use crate::virtio::{polled_queue, QueueLayout, VIRTIO_F_VERSION_1};

/// `VIRTIO_RING_F_EVENT_IDX` (virtio 1.2 §6): bit number.
const VIRTIO_RING_F_EVENT_IDX: u32 = 29;

/// Environment variable naming the daemon's vhost-user socket.
pub const SOCKET_ENV: &str = "VRNIC_VHOST_USER";
/// Where a container finds the socket when [`SOCKET_ENV`] is not set (the
/// path to mount the daemon's socket at).
pub const DEFAULT_SOCKET: &str = "/run/vrnic/vhost-user.sock";
/// Guest-physical address of the shared memory's first byte.
pub const GPA_BASE: u64 = 1 << 32;
/// Size of the shared memory, bytes: the sum of all DMA memory and
/// registered pages of one process. Sparse: only what is used is committed.
pub const RAM_SIZE: usize = 16 << 30;
/// Bound on every wait for the daemon (a vhost-user reply, a command).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest virtqueue size asked for; halved until the daemon accepts it
/// (its `--queue-size`).
const MAX_QUEUE: u16 = 256;
/// Smallest virtqueue size tried.
const MIN_QUEUE: u16 = 8;
/// DMA memory is carved from chunks of this many bytes.
const DMA_CHUNK: usize = 2 << 20;
const PAGE: usize = 4096;

fn io_err(what: impl Into<String>, source: io::Error) -> TransportError {
    TransportError::Io {
        what: what.into(),
        source,
    }
}

fn errno(what: impl Into<String>, e: i32) -> TransportError {
    io_err(what, io::Error::from_raw_os_error(e))
}

fn vhost_err(what: &str, e: vhost::Error) -> TransportError {
    io_err(
        format!("vhost-user {what}"),
        io::Error::other(e.to_string()),
    )
}

/// The socket a program uses: [`SOCKET_ENV`] if set, else
/// [`DEFAULT_SOCKET`] if it exists.
pub fn socket_from_env() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(SOCKET_ENV) {
        return Some(p.into());
    }
    let d = Path::new(DEFAULT_SOCKET);
    d.exists().then(|| d.to_path_buf())
}

/// The shared memory: a memfd mapped at `base`, page-granular first-fit
/// allocation of its offsets, and a bump allocator for DMA memory.
#[derive(Debug)]
struct Ram {
    fd: OwnedFd,
    base: *mut u8,
    len: usize,
    /// Free extents, offset → length (bytes, page multiples), coalesced.
    free: BTreeMap<usize, usize>,
    /// DMA memory of the connection itself (rings, bounce buffer) and of
    /// [`Transport::alloc_dma`] on this transport.
    dma: DmaCarver,
}

/// Carves DMA memory out of 2 MiB chunks of the shared memory, remembering
/// the chunks it took so that they can be given back at once: the
/// connection has one, and each device context sharing it
/// ([`shared::VhostUserContext`]) one of its own, returned when the
/// context is closed.
#[derive(Debug, Default)]
pub(crate) struct DmaCarver {
    /// The chunk being carved: (offset, used, size).
    current: Option<(usize, usize, usize)>,
    /// Every chunk taken: (offset, size).
    chunks: Vec<(usize, usize)>,
}

// SAFETY: the mapping is owned by the Ram; access is synchronised by the
// transport's owner (`&mut self` for every change).
unsafe impl Send for Ram {}

impl Ram {
    fn new(len: usize) -> Result<Self, TransportError> {
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
        })
    }

    fn gpa(&self, off: usize) -> u64 {
        GPA_BASE + off as u64
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
    fn give_back(&mut self, off: usize, bytes: usize) {
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

    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        let mut dma = std::mem::take(&mut self.dma);
        let r = self.carve(&mut dma, len, align);
        self.dma = dma;
        r
    }

    /// `len` bytes aligned to `align` from `carver`'s chunk, or from a new
    /// chunk it takes.
    fn carve(
        &mut self,
        carver: &mut DmaCarver,
        len: usize,
        align: usize,
    ) -> Result<DmaBuf, TransportError> {
        if !align.is_power_of_two() || align > DMA_CHUNK {
            return Err(TransportError::NoDmaMemory(len));
        }
        let len = len.max(1);
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

/// A vrnic function reached over its daemon's vhost-user socket; see the
/// module documentation.
///
/// Field order matters for drop: the connection closes first (the daemon
/// stops using the memory), then the queues' eventfds and the memory go.
pub struct VhostUserTransport {
    conn: Frontend,
    config: abi::ConfigSpace,
    ctrl: ControlQueue,
    db: SlotQueue,
    ev: SlotQueue,
    timeout: Duration,
    _kicks: Vec<Arc<EventFd>>,
    calls: Vec<EventFd>,
    user: UserPages,
    ram: Ram,
    socket: PathBuf,
}

impl std::fmt::Debug for VhostUserTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserTransport")
            .field("socket", &self.socket)
            .field("user_pages", &self.user.len())
            .finish_non_exhaustive()
    }
}

impl VhostUserTransport {
    /// Connects to the daemon's vhost-user socket at `socket`, starts the
    /// device and checks it is a vrnic of this ABI.
    ///
    /// Errors: [`TransportError::NoDevice`] when nothing listens there, the
    /// daemon refuses the negotiation or the connection (the function
    /// already serves another program: the daemon takes one frontend at a
    /// time), or the device is not a vrnic of [`abi::ABI_VERSION`];
    /// [`TransportError::Io`] for memory and eventfd failures and a
    /// vhost-user request that failed. Bounded: a daemon that does not
    /// answer the set-up within [`DEFAULT_TIMEOUT`] fails it
    /// ([`VhostUserTransport::open_within`]).
    pub fn open(socket: &Path) -> Result<Self, TransportError> {
        Self::open_within(socket, DEFAULT_TIMEOUT)
    }

    /// [`VhostUserTransport::open`], the set-up's vhost-user requests
    /// bounded by `timeout` together: past it the connection is shut down
    /// (the vhost crate retries a receive that `SO_RCVTIMEO` ended, so
    /// that alone bounds nothing) and the request waiting fails.
    pub fn open_within(socket: &Path, timeout: Duration) -> Result<Self, TransportError> {
        let nodev = |m: String| TransportError::NoDevice(format!("{}: {m}", socket.display()));
        let mut fe = Frontend::connect(socket, abi::NUM_QUEUES as u64)
            .map_err(|e| nodev(format!("connect: {e}")))?;
        // SAFETY: `fe` owns the descriptor and outlives the call.
        let conn = unsafe { std::os::fd::BorrowedFd::borrow_raw(fe.as_raw_fd()) };
        let watchdog =
            Watchdog::arm(conn, timeout).map_err(|e| io_err("the connection's watchdog", e))?;
        set_recv_timeout(&fe, timeout)?;
        negotiate(&mut fe, false).map_err(|e| {
            nodev(format!(
                "{e} (refused or no answer: does the function serve another \
                 program? a vrnic function takes one frontend at a time)"
            ))
        })?;
        let buf = vec![0u8; size_of::<abi::ConfigSpace>()];
        let (_, raw) = fe
            .get_config(
                0,
                size_of::<abi::ConfigSpace>() as u32,
                VhostUserConfigFlags::empty(),
                &buf,
            )
            .map_err(|e| vhost_err("GET_CONFIG", e))?;
        let config = abi::ConfigSpace::read_from(&raw).unwrap_or_default();
        if config.signature != abi::SIGNATURE {
            return Err(nodev(format!(
                "signature {:?} is not vrnic's",
                String::from_utf8_lossy(&config.signature)
            )));
        }
        if config.abi_version != abi::ABI_VERSION {
            return Err(nodev(format!(
                "vrnic ABI version {} (this driver speaks {})",
                config.abi_version,
                abi::ABI_VERSION
            )));
        }

        let mut ram = Ram::new(RAM_SIZE)?;
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: GPA_BASE,
            memory_size: ram.len as u64,
            userspace_addr: ram.base as u64,
            mmap_offset: 0,
            mmap_handle: ram.fd.as_raw_fd(),
        }])
        .map_err(|e| vhost_err("SET_MEM_TABLE", e))?;

        let mut kicks = Vec::new();
        let mut calls = Vec::new();
        let mut queues = Vec::new();
        for index in 0..abi::NUM_QUEUES as u16 {
            let (q, kick, call) = start_queue(&mut fe, &mut ram, index)?;
            queues.push(q);
            kicks.push(kick);
            calls.push(call);
        }
        let mut queues = queues.into_iter();
        let (Some(ctrlq), Some(dbq), Some(evq)) = (queues.next(), queues.next(), queues.next())
        else {
            return Err(nodev("queues".into()));
        };
        let ctrl = ControlQueue {
            queue: ctrlq,
            bounce: ram.alloc_dma(RESP_OFF + RESP_LEN, 64)?,
            pending: None,
        };
        let db_size = usize::from(dbq.q.size());
        let db = SlotQueue {
            queue: dbq,
            slots: ram.alloc_dma(SLOT * db_size, 64)?,
        };
        let ev_size = usize::from(evq.q.size());
        let mut ev = SlotQueue {
            queue: evq,
            slots: ram.alloc_dma(SLOT * ev_size, 64)?,
        };
        ev.prefill()?;
        ev.queue.q.set_interrupts(true);
        ev.queue.kick()?;
        if watchdog.disarm() {
            return Err(nodev(format!("no answer within {timeout:?}")));
        }
        tracing::info!(
            "vrnic over vhost-user {}: queues {}/{db_size}/{ev_size}, MAC {:02x?}",
            socket.display(),
            ctrl.queue.q.size(),
            config.mac
        );
        Ok(VhostUserTransport {
            conn: fe,
            config,
            ctrl,
            db,
            ev,
            timeout: DEFAULT_TIMEOUT,
            _kicks: kicks,
            calls,
            user: BTreeMap::new(),
            ram,
            socket: socket.to_path_buf(),
        })
    }

    /// The socket this transport is connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Pages of the program currently remapped onto shared memory.
    pub fn user_pages(&self) -> usize {
        self.user.len()
    }

    /// [`Transport::alloc_dma`] from `carver`'s chunks (a device context's
    /// memory, given back with [`VhostUserTransport::free_dma`]).
    pub(crate) fn alloc_dma_in(
        &mut self,
        carver: &mut DmaCarver,
        len: usize,
        align: usize,
    ) -> Result<DmaBuf, TransportError> {
        self.ram.carve(carver, len, align)
    }

    /// Gives back every chunk `carver` took (their memory is released).
    /// Only once the device no longer uses any of it: after the context
    /// that allocated it was closed.
    pub(crate) fn free_dma(&mut self, carver: &mut DmaCarver) {
        carver.current = None;
        for (off, size) in carver.chunks.drain(..) {
            self.ram.give_back(off, size);
        }
    }

    /// Whether the daemon still holds this connection: false once it has
    /// closed or shut down its end (the daemon stopped, or its function
    /// was deleted). Commands check it first and fail with `STATUS_ENODEV`
    /// on a connection that ended; this asks without waiting.
    pub fn is_connected(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.conn.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd on our own socket; no waiting.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        !(r == 1 && p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0)
    }

    /// Remaps the run of pages `[va, va + n * PAGE)` (none of them
    /// remapped yet) onto fresh shared memory, contents kept.
    fn remap_run(&mut self, va: usize, n: usize) -> Result<(), TransportError> {
        let bytes = n * PAGE;
        check_private(va, bytes)?;
        let off = self.ram.take(bytes).ok_or_else(|| {
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
                    self.ram.fd.as_raw_fd(),
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
                self.ram.give_back(off, bytes);
                return Err(io_err(format!("reading memory at {va:#x}+{bytes}"), e));
            }
            done += got as usize;
        }
        // SAFETY: replaces the program's own pages `[va, va + bytes)` (which
        // it asked to register) by the same bytes in shared memory.
        let p = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.ram.fd.as_raw_fd(),
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            self.ram.give_back(off, bytes);
            return Err(io_err(format!("remapping {va:#x}+{bytes}"), e));
        }
        for i in 0..n {
            self.user.insert(va + i * PAGE, (off + i * PAGE, 1));
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
    fn restore_run(&mut self, va: usize, n: usize) {
        let bytes = n * PAGE;
        // SAFETY: a new private mapping at an address the kernel picks; no
        // existing memory is touched.
        let tmp = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if tmp == libc::MAP_FAILED {
            tracing::warn!(
                "restoring {va:#x}+{bytes}: {}; the pages stay shared",
                io::Error::last_os_error()
            );
            return;
        }
        // SAFETY: the run is mapped shared and ours; `tmp` is a distinct
        // fresh mapping of `bytes` bytes, so the two do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(va as *const u8, tmp.cast::<u8>(), bytes) };
        // SAFETY: moves the private copy over the run (MREMAP_FIXED unmaps
        // the run's shared pages first); `tmp` is ours and `bytes` long.
        let p = unsafe {
            libc::mremap(
                tmp,
                bytes,
                bytes,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                va as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            tracing::warn!(
                "restoring {va:#x}+{bytes}: {}; the pages stay shared",
                io::Error::last_os_error()
            );
            // SAFETY: `tmp` is our own mapping, not moved.
            unsafe { libc::munmap(tmp, bytes) };
            return;
        }
        for i in 0..n {
            if let Some((off, _)) = self.user.remove(&(va + i * PAGE)) {
                self.ram.give_back(off, PAGE);
            }
        }
    }
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

/// Sets queue `index` up: rings in shared memory (the largest size the
/// daemon takes), kick and call eventfds, enabled.
fn start_queue(
    fe: &mut Frontend,
    ram: &mut Ram,
    index: u16,
) -> Result<(Queue, Arc<EventFd>, EventFd), TransportError> {
    let q = usize::from(index);
    let mut size = MAX_QUEUE;
    loop {
        match fe.set_vring_num(q, size) {
            Ok(()) => break,
            Err(_) if size > MIN_QUEUE => size /= 2,
            Err(e) => return Err(vhost_err("SET_VRING_NUM", e)),
        }
    }
    let layout = QueueLayout::new(size)?;
    let mem = ram.alloc_dma(layout.len, QueueLayout::ALIGN.max(64))?;
    // SAFETY: `mem` is layout.len bytes of 64-aligned shared memory at
    // mem.gpa, owned by the transport for its whole life.
    let vq = unsafe { polled_queue(layout, mem.ptr, mem.gpa) }?;
    let hva = |gpa: u64| ram.base as u64 + (gpa - GPA_BASE);
    fe.set_vring_base(q, 0)
        .map_err(|e| vhost_err("SET_VRING_BASE", e))?;
    fe.set_vring_addr(
        q,
        &VringConfigData {
            queue_max_size: size,
            queue_size: size,
            flags: 0,
            desc_table_addr: hva(vq.desc_gpa()),
            used_ring_addr: hva(vq.used_gpa()),
            avail_ring_addr: hva(vq.avail_gpa()),
            log_addr: None,
        },
    )
    .map_err(|e| vhost_err("SET_VRING_ADDR", e))?;
    let efd = || EventFd::new(EFD_NONBLOCK).map_err(|e| io_err("eventfd", e));
    let call = efd()?;
    let kick = Arc::new(efd()?);
    fe.set_vring_call(q, &call)
        .map_err(|e| vhost_err("SET_VRING_CALL", e))?;
    fe.set_vring_kick(q, &kick)
        .map_err(|e| vhost_err("SET_VRING_KICK", e))?;
    fe.set_vring_enable(q, true)
        .map_err(|e| vhost_err("SET_VRING_ENABLE", e))?;
    let queue = Queue {
        q: vq,
        notifier: Kick::EventFd {
            fd: kick.clone(),
            queue: index,
        },
    };
    Ok((queue, kick, call))
}

/// The negotiation QEMU runs on a new connection (`vhost_dev_init`, then
/// `vhost_dev_start`'s `SET_FEATURES`): `GET_FEATURES`,
/// `GET_PROTOCOL_FEATURES`, `SET_PROTOCOL_FEATURES` (`CONFIG`, and
/// `REPLY_ACK` when offered, after which every request without a reply of
/// its own is acknowledged, so a refused one fails where it is made),
/// `SET_OWNER`, `SET_FEATURES`. `VIRTIO_RING_F_EVENT_IDX` is acknowledged
/// only with `event_idx` and when offered (this transport's driver code
/// uses the flags of virtio 1.2 §2.7.7 and passes false). Returns the
/// acknowledged features. Also used by the daemon's protocol test harness.
///
/// Errors: [`TransportError::Io`] (`EPROTO`) when the backend lacks
/// `VIRTIO_F_VERSION_1`, protocol features or `CONFIG`; a failed request.
pub fn negotiate(fe: &mut Frontend, event_idx: bool) -> Result<u64, TransportError> {
    let offered = fe
        .get_features()
        .map_err(|e| vhost_err("GET_FEATURES", e))?;
    let need = VIRTIO_F_VERSION_1 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    if offered & need != need {
        return Err(errno(
            format!("features {offered:#x} lack {need:#x}"),
            libc::EPROTO,
        ));
    }
    let pf = fe
        .get_protocol_features()
        .map_err(|e| vhost_err("GET_PROTOCOL_FEATURES", e))?;
    if !pf.contains(VhostUserProtocolFeatures::CONFIG) {
        return Err(errno(
            format!("protocol features {pf:?} lack CONFIG"),
            libc::EPROTO,
        ));
    }
    let ack = pf & VhostUserProtocolFeatures::REPLY_ACK;
    fe.set_protocol_features(VhostUserProtocolFeatures::CONFIG | ack)
        .map_err(|e| vhost_err("SET_PROTOCOL_FEATURES", e))?;
    if !ack.is_empty() {
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    }
    fe.set_owner().map_err(|e| vhost_err("SET_OWNER", e))?;
    let event_idx_bit = 1u64 << VIRTIO_RING_F_EVENT_IDX;
    let acked = need
        | if event_idx && offered & event_idx_bit != 0 {
            event_idx_bit
        } else {
            0
        };
    fe.set_features(acked)
        .map_err(|e| vhost_err("SET_FEATURES", e))?;
    Ok(acked)
}

/// Shuts a vhost-user connection down if it is not disarmed within its
/// timeout, so that a request waiting on it fails: the vhost crate retries
/// a receive that `SO_RCVTIMEO` ended, so that alone bounds nothing
/// ([`VhostUserTransport::open_within`]; the daemon's test frontend uses it
/// too). It keeps a duplicate of the connection's descriptor, so the
/// connection may be closed before the watchdog is disarmed or dropped.
#[derive(Debug)]
pub struct Watchdog {
    cancel: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<bool>>,
}

impl Watchdog {
    /// Arms it for the connection `conn` for `timeout`.
    ///
    /// Errors: duplicating the descriptor or starting the thread failed.
    pub fn arm(conn: std::os::fd::BorrowedFd<'_>, timeout: Duration) -> io::Result<Self> {
        let fd = conn.try_clone_to_owned()?;
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("vrnic-watchdog".into())
            .spawn(move || {
                if rx.recv_timeout(timeout) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
                    return false;
                }
                // SAFETY: `fd` is this thread's own descriptor of the
                // connection's socket; shutdown(2) only ends the connection.
                unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
                true
            })?;
        Ok(Self {
            cancel: Some(tx),
            thread: Some(thread),
        })
    }

    /// Stops it; whether it had fired (the connection is shut down then).
    pub fn disarm(mut self) -> bool {
        self.stop()
    }

    fn stop(&mut self) -> bool {
        self.cancel = None;
        self.thread
            .take()
            .is_some_and(|t| t.join().unwrap_or(false))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Bounds every wait for a vhost-user reply by `timeout` (`SO_RCVTIMEO`).
/// Errors: [`TransportError::Io`] from `setsockopt(2)`.
pub fn set_recv_timeout(fe: &Frontend, timeout: Duration) -> Result<(), TransportError> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: `tv` is a valid timeval of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fe.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io_err("SO_RCVTIMEO", io::Error::last_os_error()));
    }
    Ok(())
}

impl Transport for VhostUserTransport {
    /// [`Transport::command`] for device context `ctx`
    /// ([`Transport::command`] is this for [`abi::DEFAULT_CTX`]). As the
    /// virtio-pci driver's: one command at a time through a bounce buffer
    /// in shared memory, polled for at most [`DEFAULT_TIMEOUT`]. On a
    /// connection the daemon closed (it stopped, or the function was
    /// deleted) every command fails at once with `STATUS_ENODEV`.
    fn command_in(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        // A daemon that went away never answers: say so now rather than
        // after the timeout (one non-blocking poll per command).
        if !self.is_connected() {
            return Err(TransportError::Status {
                opcode,
                status: abi::STATUS_ENODEV,
            });
        }
        self.ctrl.execute(ctx, opcode, body, resp, self.timeout)
    }

    fn config(&self) -> abi::ConfigSpace {
        self.config
    }

    fn doorbell(&mut self, db: &abi::Doorbell) -> Result<(), TransportError> {
        self.db.ring(db, self.timeout)
    }

    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        self.ram.alloc_dma(len, align)
    }

    /// The device address of `va`: inside the shared memory's own mapping,
    /// or in a page remapped by [`Transport::map_user`]. Anything else is
    /// `EFAULT`.
    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        let base = self.ram.base as usize;
        if va >= base && va < base + self.ram.len {
            return Ok(self.ram.gpa(va - base));
        }
        let page = va & !(PAGE - 1);
        self.user
            .get(&page)
            .map(|&(off, _)| self.ram.gpa(off) + (va - page) as u64)
            .ok_or_else(|| errno(format!("address {va:#x} is not registered"), libc::EFAULT))
    }

    fn page_size(&self) -> usize {
        PAGE
    }

    /// The daemon's worker runs on this machine's CPUs: a program spinning
    /// on an empty CQ yields so it does not hold the core the worker needs
    /// (on a 2-CPU host, two spinning perftest processes would otherwise
    /// starve both daemons' workers).
    fn yield_when_idle(&self) -> bool {
        true
    }

    /// True: the daemon polls this process's QP records (device spec
    /// §5.x.6.9).
    fn doorbell_records(&self) -> bool {
        true
    }

    /// The daemon reaches registered pages through the memfd: no lock.
    fn needs_locked_pages(&self) -> bool {
        false
    }

    fn poll_event(&mut self) -> Option<abi::Event> {
        self.ev.pop_event()
    }

    /// The event queue's call eventfd (the daemon signals it when it
    /// delivered an event).
    fn event_fd(&self) -> Option<RawFd> {
        self.calls
            .get(usize::from(abi::EVENTQ))
            .map(|c| c.as_raw_fd())
    }

    /// Remaps the pages of `[va, va + len)` onto shared memory (see the
    /// module documentation). Errors: `EINVAL` for an unaligned or empty
    /// range or one inside a hugetlb mapping, `EFAULT` for unmapped memory,
    /// `ENOMEM` when the shared memory is full.
    fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        let end = va.checked_add(len);
        let (true, Some(end)) = (
            va.is_multiple_of(PAGE) && len.is_multiple_of(PAGE) && len > 0,
            end,
        ) else {
            return Err(errno(format!("range {va:#x}+{len}"), libc::EINVAL));
        };
        let base = self.ram.base as usize;
        if va < base + self.ram.len && end > base {
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

    fn unmap_user(&mut self, va: usize, len: usize) {
        let base = self.ram.base as usize;
        let end = va.saturating_add(len);
        if va < base + self.ram.len && end > base {
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
}

impl VhostUserTransport {
    /// Drops one MR's hold on `page`; the last one restores it.
    fn release_page(&mut self, page: usize) {
        self.unmap_user(page, PAGE);
    }
}
