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
//! carved from it ([`Transport::alloc_dma`]) and given back when the CQ,
//! QP or SRQ they served is destroyed ([`Transport::release_dma`]): rings
//! as pages punched out of the memfd, records as slots reused.
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
//! - at `fork(2)` the child gets private copies of the remapped pages as
//!   they were at the fork (`pthread_atfork(3)` handlers: the parent copies
//!   every remapped run before it forks, the child moves the copies over its
//!   pages), as a kernel with copy-on-fork copies pinned pages; this costs
//!   a copy of all registered memory per fork;
//! - registered memory in all counts at most [`RAM_SIZE`] bytes.
//!
//! A vhost-user backend serves one frontend per socket at a time: one
//! program per function. Within that program, any number of device opens
//! share its one connection, each in a device context of its own
//! ([`VhostUserContext`], module [`shared`]). Several programs of one
//! container share a function through the agent ([`crate::agent`],
//! `vrnic-agent --vhost-user`), which is the frontend: each program's
//! memory file (module `ram`) is added to the daemon's memory table
//! ([`Transport::share_memory`], at most [`MAX_SHARED`] of them).

mod ram;
pub mod shared;

pub use shared::VhostUserContext;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
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

pub(crate) use ram::{DmaCarver, Ram, PAGE};

use crate::dbring::{DbRing, DbRingLayout};
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
/// Most memory files of other processes the device reaches beside this
/// transport's own ([`Transport::share_memory`]: a guest agent's programs):
/// a `SET_MEM_TABLE` carries at most 32 descriptors (vhost crate's
/// `MAX_ATTACHED_FD_ENTRIES`), one of them the transport's own.
pub const MAX_SHARED: usize = 31;
/// Device address space of each shared file, bytes: the file of slot `k`
/// lies at `GPA_BASE + (k + 1) * SHARED_STRIDE`, and is at most this long.
pub const SHARED_STRIDE: u64 = 1 << 36;
/// `userspace_addr` of a shared file in the memory table: the frontend
/// does not map it, and the daemon uses this only to translate ring
/// addresses (`SET_VRING_ADDR`), which are never in it; above every
/// user-space address of x86-64 and AArch64, so it never overlaps the
/// transport's own mapping.
const SHARED_UADDR: u64 = 0xffff_8000_0000_0000;
/// Bound on every wait for the daemon (a vhost-user reply, a command).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest virtqueue size asked for; halved until the daemon accepts it
/// (its `--queue-size`).
const MAX_QUEUE: u16 = 256;
/// Smallest virtqueue size tried.
const MIN_QUEUE: u16 = 8;

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

/// The doorbell queue.
enum Doorbells {
    /// Posted by this transport alone.
    Private(SlotQueue),
    /// A [`DbRing`] other processes post to as well (the agent's
    /// programs): its rings and slots in the memfd at `off`.
    Shared {
        ring: DbRing,
        layout: DbRingLayout,
        off: usize,
        /// Kept for its size only: nothing is posted through it.
        _queue: Queue,
    },
}

/// Where a shared doorbell queue ([`VhostUserTransport::open_shared`])
/// lies, for the processes that post to it: `layout.len` bytes of `memfd`
/// at `offset` (page-aligned), notified through eventfd `kick`.
#[derive(Debug, Clone, Copy)]
pub struct SharedDoorbells {
    /// The transport's memory file.
    pub memfd: RawFd,
    /// The ring's first byte in it (a page multiple).
    pub offset: u64,
    /// Where the ring's parts lie from there.
    pub layout: DbRingLayout,
    /// The doorbell queue's kick eventfd.
    pub kick: RawFd,
}

/// A vrnic function reached over its daemon's vhost-user socket; see the
/// module documentation.
///
/// Field order matters for drop: the connection closes first (the daemon
/// stops using the memory), then the queues' eventfds and the memory go.
pub struct VhostUserTransport {
    conn: Frontend,
    config: abi::ConfigSpace,
    ctrl: ControlQueue,
    db: Doorbells,
    ev: SlotQueue,
    timeout: Duration,
    _kicks: Vec<Arc<EventFd>>,
    calls: Vec<EventFd>,
    /// Other processes' memory files the device reaches, by slot
    /// ([`Transport::share_memory`]).
    shared: Vec<Option<(OwnedFd, u64)>>,
    ram: Ram,
    socket: PathBuf,
}

impl std::fmt::Debug for VhostUserTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserTransport")
            .field("socket", &self.socket)
            .field("user_pages", &self.ram.user_pages())
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
        Self::open_with(socket, timeout, false)
    }

    /// [`VhostUserTransport::open`] with a doorbell queue other processes
    /// post to directly ([`crate::dbring`], its place given by
    /// [`VhostUserTransport::shared_doorbells`]): the agent's, whose
    /// programs then post doorbells without a hop through it.
    pub fn open_shared(socket: &Path) -> Result<Self, TransportError> {
        Self::open_with(socket, DEFAULT_TIMEOUT, true)
    }

    /// Where the shared doorbell queue lies
    /// ([`VhostUserTransport::open_shared`]); `None` for a private one.
    pub fn shared_doorbells(&self) -> Option<SharedDoorbells> {
        match &self.db {
            Doorbells::Shared { layout, off, .. } => Some(SharedDoorbells {
                memfd: self.ram.fd(),
                offset: *off as u64,
                layout: *layout,
                kick: self._kicks.get(usize::from(abi::DOORBELLQ))?.as_raw_fd(),
            }),
            Doorbells::Private(_) => None,
        }
    }

    fn open_with(
        socket: &Path,
        timeout: Duration,
        shared_db: bool,
    ) -> Result<Self, TransportError> {
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

        let mut ram = Ram::new(RAM_SIZE, GPA_BASE)?;
        fe.set_mem_table(&[own_region(&ram)])
            .map_err(|e| vhost_err("SET_MEM_TABLE", e))?;

        let mut kicks = Vec::new();
        let mut calls = Vec::new();
        let mut queues = Vec::new();
        let mut shared = None;
        for index in 0..abi::NUM_QUEUES as u16 {
            let (q, kick, call) = if index == abi::DOORBELLQ && shared_db {
                let size = vring_size(&mut fe, index)?;
                let layout = DbRingLayout::new(size)
                    .ok_or_else(|| nodev(format!("doorbell queue size {size}")))?;
                let mem = ram.alloc_dma(layout.len as usize, PAGE)?;
                let (q, kick, call) = start_queue_in(&mut fe, &ram, index, size, &mem)?;
                // SAFETY: the region is the transport's memory (kept for its
                // life, 4096-aligned), the kick eventfd is kept in `kicks`.
                let ring = unsafe { DbRing::with_eventfd(mem.ptr, layout, kick.as_raw_fd()) }?;
                ring.init_descriptors(mem.gpa + u64::from(layout.slots));
                let off = (mem.gpa - GPA_BASE) as usize;
                shared = Some((ring, layout, off));
                (q, kick, call)
            } else {
                start_queue(&mut fe, &mut ram, index)?
            };
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
        let db = match shared {
            Some((ring, layout, off)) => Doorbells::Shared {
                ring,
                layout,
                off,
                _queue: dbq,
            },
            None => Doorbells::Private(SlotQueue {
                queue: dbq,
                slots: ram.alloc_dma(SLOT * db_size, 64)?,
            }),
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
            shared: Vec::new(),
            ram,
            socket: socket.to_path_buf(),
        })
    }

    /// The socket this transport is connected to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The memory table: this transport's memory, then each shared file.
    fn memory_table(&self) -> Vec<VhostUserMemoryRegionInfo> {
        let own = own_region(&self.ram);
        let shared = self.shared.iter().enumerate().filter_map(|(k, s)| {
            let (fd, len) = s.as_ref()?;
            let gpa = shared_gpa(k);
            Some(VhostUserMemoryRegionInfo {
                guest_phys_addr: gpa,
                memory_size: *len,
                userspace_addr: SHARED_UADDR + gpa,
                mmap_offset: 0,
                mmap_handle: fd.as_raw_fd(),
            })
        });
        std::iter::once(own).chain(shared).collect()
    }

    /// Pages of the program currently remapped onto shared memory.
    pub fn user_pages(&self) -> usize {
        self.ram.user_pages()
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

    /// [`Transport::release_dma`] of `buf`, handed out for `carver`
    /// ([`VhostUserTransport::alloc_dma_in`]).
    pub(crate) fn release_dma_in(&mut self, carver: &mut DmaCarver, buf: DmaBuf) {
        self.ram.release_in(carver, buf)
    }

    /// Gives back every chunk `carver` took (their memory is released).
    /// Only once the device no longer uses any of it: after the context
    /// that allocated it was closed.
    pub(crate) fn free_dma(&mut self, carver: &mut DmaCarver) {
        self.ram.free_dma(carver)
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
}

/// The transport's own memory in the memory table, at [`GPA_BASE`].
fn own_region(ram: &Ram) -> VhostUserMemoryRegionInfo {
    VhostUserMemoryRegionInfo {
        guest_phys_addr: GPA_BASE,
        memory_size: ram.len() as u64,
        userspace_addr: ram.base() as u64,
        mmap_offset: 0,
        mmap_handle: ram.fd(),
    }
}

/// Device address of shared slot `k`.
fn shared_gpa(k: usize) -> u64 {
    GPA_BASE + (k as u64 + 1) * SHARED_STRIDE
}

/// Sets queue `index` up: rings in shared memory (the largest size the
/// daemon takes), kick and call eventfds, enabled.
fn start_queue(
    fe: &mut Frontend,
    ram: &mut Ram,
    index: u16,
) -> Result<(Queue, Arc<EventFd>, EventFd), TransportError> {
    let size = vring_size(fe, index)?;
    let layout = QueueLayout::new(size)?;
    let mem = ram.alloc_dma(layout.len, QueueLayout::ALIGN.max(64))?;
    start_queue_in(fe, ram, index, size, &mem)
}

/// `SET_VRING_NUM` for queue `index`: the largest size the daemon takes
/// (its `--queue-size`), from [`MAX_QUEUE`] down to [`MIN_QUEUE`].
fn vring_size(fe: &mut Frontend, index: u16) -> Result<u16, TransportError> {
    let q = usize::from(index);
    let mut size = MAX_QUEUE;
    loop {
        match fe.set_vring_num(q, size) {
            Ok(()) => return Ok(size),
            Err(_) if size > MIN_QUEUE => size /= 2,
            Err(e) => return Err(vhost_err("SET_VRING_NUM", e)),
        }
    }
}

/// Sets queue `index` (of `size` descriptors, already told the daemon) up
/// with its split ring at the start of `mem`: addresses, kick and call
/// eventfds, enabled.
fn start_queue_in(
    fe: &mut Frontend,
    ram: &Ram,
    index: u16,
    size: u16,
    mem: &DmaBuf,
) -> Result<(Queue, Arc<EventFd>, EventFd), TransportError> {
    let q = usize::from(index);
    let layout = QueueLayout::new(size)?;
    // SAFETY: `mem` is at least layout.len bytes of 64-aligned shared memory
    // at mem.gpa, owned by the transport for its whole life.
    let vq = unsafe { polled_queue(layout, mem.ptr, mem.gpa) }?;
    let hva = |gpa: u64| ram.base() as u64 + (gpa - GPA_BASE);
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
        match &mut self.db {
            Doorbells::Private(q) => q.ring(db, self.timeout),
            Doorbells::Shared { ring, .. } => ring.post(db, self.timeout),
        }
    }

    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        self.ram.alloc_dma(len, align)
    }

    fn release_dma(&mut self, buf: DmaBuf) {
        self.ram.release_dma(buf)
    }

    /// The device address of `va`: inside the shared memory's own mapping,
    /// or in a page remapped by [`Transport::map_user`]. Anything else is
    /// `EFAULT`.
    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        self.ram.virt_to_phys(va)
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
    /// range or one inside a hugetlb or shared mapping, `EFAULT` for
    /// unmapped memory, `ENOMEM` when the shared memory is full.
    fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        self.ram.map_user(va, len)
    }

    fn unmap_user(&mut self, va: usize, len: usize) {
        self.ram.unmap_user(va, len)
    }

    /// Adds `fd` to the daemon's memory table at the first free slot
    /// ([`SHARED_STRIDE`] apart) and sends the whole table again
    /// (`SET_MEM_TABLE` while the device runs, as QEMU does when a guest's
    /// memory is hot-plugged). Errors: `EINVAL` for an empty file or one
    /// longer than [`SHARED_STRIDE`], `ENOSPC` past [`MAX_SHARED`] files,
    /// the `dup(2)` and the request's.
    fn share_memory(&mut self, fd: RawFd, len: usize) -> Result<u64, TransportError> {
        if len == 0 || len as u64 > SHARED_STRIDE {
            return Err(errno(
                format!("sharing a memory file of {len} bytes"),
                libc::EINVAL,
            ));
        }
        // SAFETY: the caller's descriptor is open for the call; it is only duplicated.
        let own = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|e| io_err("dup of a shared memory file", e))?;
        let k = match self.shared.iter().position(Option::is_none) {
            Some(k) => k,
            None if self.shared.len() < MAX_SHARED => {
                self.shared.push(None);
                self.shared.len() - 1
            }
            None => {
                return Err(errno(
                    format!("sharing a memory file: {MAX_SHARED} are shared already"),
                    libc::ENOSPC,
                ))
            }
        };
        self.shared[k] = Some((own, len as u64));
        if let Err(e) = self.conn.set_mem_table(&self.memory_table()) {
            self.shared[k] = None;
            return Err(vhost_err("SET_MEM_TABLE", e));
        }
        Ok(shared_gpa(k))
    }

    /// Drops the file at `gpa` from the memory table and sends the table
    /// again; the daemon unmaps it. A failure is logged: the daemon then
    /// keeps the file mapped until the connection ends.
    fn unshare_memory(&mut self, gpa: u64) {
        let Some(k) = (0..self.shared.len()).find(|&k| shared_gpa(k) == gpa) else {
            return;
        };
        if self.shared[k].take().is_none() {
            return;
        }
        if let Err(e) = self.conn.set_mem_table(&self.memory_table()) {
            tracing::warn!("withdrawing a shared memory file: SET_MEM_TABLE: {e}");
        }
    }
}
