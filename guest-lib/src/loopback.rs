//! An in-process vrnic device: [`LoopbackTransport`] runs a
//! [`vrnic::device::Device`] on an engine thread of this process, so the
//! verbs layer and its users (tests, `vrnic-pingpong --loopback`) run without
//! a VM.
//!
//! "Guest-physical" memory is this process's own memory: a device address
//! is the process virtual address, but the device reaches only the DMA
//! memory this transport allocated ([`LoopbackMemory`]); every other address
//! is out of range for it, and [`Transport::virt_to_phys`] refuses it. MR
//! buffers therefore come from [`Transport::alloc_dma`] (e.g.
//! [`crate::verbs::Mr::alloc`]) — unless the transport was told
//! [`LoopbackTransport::allow_user_memory`]: then the ranges of registered
//! MRs ([`Transport::map_user`], e.g. an application's malloc'd buffer under
//! vrnic's libibverbs.so.1) are reachable too, from registration to
//! deregistration, bounds-checked like the arenas.
//!
//! Two transports over a [`vrnic::link::mem::MemLink`] pair form a
//! two-node RoCE network in one process:
//! ```ignore
//! let (a, b) = vrnic::link::mem::MemLink::pair();
//! let ta = LoopbackTransport::new(cfg_a, Box::new(a))?;
//! let tb = LoopbackTransport::new(cfg_b, Box::new(b))?;
//! let (ctx_a, ctx_b) = (Context::open(Box::new(ta))?, Context::open(Box::new(tb))?);
//! ```

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::net::Ipv4Addr;

use vrnic::device::{Device, DeviceConfig, DeviceStats, Nanos};
use vrnic::link::{Link, LinkStats, TxFlush};
use vrnic::mem::{DmaMemory, MemError};
use vrnic_abi::{self as abi, Pod};

use crate::transport::{DmaBuf, Transport, TransportError};

/// Longest wait for the engine thread to answer a command or a query.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the engine thread to stop when the transport is dropped.
pub const JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the engine thread sleeps waiting for work when idle (it also
/// wakes for a request, for a frame on a link with a descriptor, and for
/// the device's next timer).
const IDLE_WAIT: Duration = Duration::from_millis(1);
/// After the last work, the engine thread keeps polling (yielding the CPU
/// between polls) this long before it sleeps, which saves a wake-up per hop
/// of a ping-pong.
const SPIN_AFTER_WORK: Duration = Duration::from_micros(50);
/// Frames taken from the link per engine-loop round.
const RX_BATCH: usize = 64;
/// Channel messages handled per engine-loop round.
const MSG_BATCH: usize = 256;
/// Environment variable: when set (to anything), the engine thread prints
/// the device's and the link's counters in one `vrnic-stats:` line on
/// stderr when it stops ([`stats_line`]), so a benchmark run (Debian's
/// perftest under libibverbs.so.1, `scripts/bench.sh`) shows the drops and
/// retransmissions behind its figure.
pub const STATS_ENV: &str = "VRNIC_STATS";
/// Default size of a DMA arena, bytes (reserved, not committed).
const ARENA_SIZE: usize = 64 << 20;
/// Largest DMA alignment ([`Transport::alloc_dma`]).
const MAX_ALIGN: usize = 2 << 20;

/// The DMA memory of a [`LoopbackTransport`]: a few large zeroed,
/// page-aligned anonymous mappings ("arenas") handed out by a bump
/// allocator and never reused, so every allocation starts zeroed. A device
/// address equals the process virtual address; [`DmaMemory`] accesses are
/// allowed only inside what has been allocated.
///
/// Each [`DmaMemory::write`] is a release and each [`DmaMemory::read`] an
/// acquire with respect to the driver's accesses, so a device that writes a
/// CQE body and then, in a second write, its owner byte publishes them in
/// that order.
#[derive(Debug, Default)]
pub struct LoopbackMemory {
    arenas: RwLock<Vec<Arena>>,
    /// Process memory ranges `[start, end)` of registered MRs
    /// ([`LoopbackMemory::map_user`]); a range registered twice is listed twice.
    user: RwLock<Vec<(usize, usize)>>,
}

#[derive(Debug)]
struct Arena {
    base: usize,
    size: usize,
    used: usize,
}

impl LoopbackMemory {
    /// An empty memory; arenas are mapped on first allocation.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allocates `len` zeroed bytes aligned to `align` (a power of two, at
    /// most 2 MiB). `len` 0 allocates one byte.
    ///
    /// Errors: [`TransportError::NoDmaMemory`] for a bad alignment or when
    /// `mmap(2)` fails.
    pub fn alloc(&self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(TransportError::NoDmaMemory(len));
        }
        let len = len.max(1);
        let mut arenas = self.arenas.write().unwrap_or_else(|e| e.into_inner());
        for a in arenas.iter_mut() {
            let start = (a.base + a.used).next_multiple_of(align);
            if start
                .checked_add(len)
                .is_some_and(|end| end <= a.base + a.size)
            {
                a.used = start + len - a.base;
                return Ok(DmaBuf {
                    ptr: start as *mut u8,
                    len,
                    gpa: start as u64,
                });
            }
        }
        let size = len
            .checked_add(align)
            .and_then(|n| n.max(ARENA_SIZE).checked_next_multiple_of(MAX_ALIGN))
            .ok_or(TransportError::NoDmaMemory(len))?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(TransportError::NoDmaMemory(len));
        }
        let base = base as usize;
        let start = base.next_multiple_of(align);
        arenas.push(Arena {
            base,
            size,
            used: start + len - base,
        });
        Ok(DmaBuf {
            ptr: start as *mut u8,
            len,
            gpa: start as u64,
        })
    }

    /// The process address of `[gpa, gpa + len)` when it lies inside
    /// allocated DMA memory or inside one range given to
    /// [`LoopbackMemory::map_user`].
    pub fn translate(&self, gpa: u64, len: usize) -> Result<*mut u8, MemError> {
        let err = MemError { addr: gpa, len };
        let start = usize::try_from(gpa).map_err(|_| err)?;
        let end = start.checked_add(len).ok_or(err)?;
        let arenas = self.arenas.read().unwrap_or_else(|e| e.into_inner());
        if arenas
            .iter()
            .any(|a| start >= a.base && end <= a.base + a.used)
        {
            return Ok(start as *mut u8);
        }
        drop(arenas);
        let user = self.user.read().unwrap_or_else(|e| e.into_inner());
        user.iter()
            .find(|(s, e)| start >= *s && end <= *e)
            .map(|_| start as *mut u8)
            .ok_or(err)
    }

    /// Makes the process memory `[va, va + len)` reachable (the range of an
    /// MR being registered). The caller keeps it mapped until the matching
    /// [`LoopbackMemory::unmap_user`]. Errors: `EINVAL` for an empty range
    /// or one that wraps.
    pub fn map_user(&self, va: usize, len: usize) -> Result<(), TransportError> {
        let end = va
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or_else(|| TransportError::Io {
                what: format!("user memory range {va:#x}+{len}"),
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        self.user
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push((va, end));
        Ok(())
    }

    /// Removes one [`LoopbackMemory::map_user`] of `[va, va + len)`.
    pub fn unmap_user(&self, va: usize, len: usize) {
        let mut user = self.user.write().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = user.iter().position(|r| *r == (va, va.wrapping_add(len))) {
            user.swap_remove(i);
        }
    }
}

impl DmaMemory for LoopbackMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let p = self.translate(gpa, buf.len())?;
        // SAFETY: `p..p + len` is inside a live arena (checked); arenas are
        // unmapped only when the memory is dropped.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        fence(Ordering::Acquire);
        Ok(())
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let p = self.translate(gpa, buf.len())?;
        fence(Ordering::Release);
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p, buf.len()) };
        Ok(())
    }
}

impl Drop for LoopbackMemory {
    fn drop(&mut self) {
        let arenas = self.arenas.get_mut().unwrap_or_else(|e| e.into_inner());
        for a in arenas.drain(..) {
            // SAFETY: each arena is a mapping made by `alloc`, unmapped once.
            unsafe { libc::munmap(a.base as *mut libc::c_void, a.size) };
        }
    }
}

/// Parses an in-process device's description,
/// `netdev=IF,ip=A.B.C.D/N[,mac=xx:..][,mtu=M]` (libibverbs'
/// `VRNIC_LOOPBACK`, `vrnic-agent --loopback`): the interface, the port's
/// IPv4 address and prefix (GID index 1), the MAC and link MTU (default:
/// the interface's, from sysfs). Errors: a readable message.
pub fn parse_spec(spec: &str) -> Result<(String, DeviceConfig), String> {
    let mut netdev = None;
    let mut ip = None;
    let mut mac = None;
    let mut mtu = None;
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("{kv:?} is not key=value"))?;
        match k.trim() {
            "netdev" => netdev = Some(v.trim().to_string()),
            "ip" => {
                let (a, n) = v.split_once('/').unwrap_or((v, "24"));
                let a: Ipv4Addr = a.trim().parse().map_err(|e| format!("ip {a:?}: {e}"))?;
                let n: u8 = n
                    .trim()
                    .parse()
                    .ok()
                    .filter(|n| *n <= 32)
                    .ok_or_else(|| format!("prefix length {n:?}"))?;
                ip = Some((a, n));
            }
            "mac" => mac = Some(parse_mac(v.trim())?),
            "mtu" => mtu = Some(v.trim().parse().map_err(|e| format!("mtu {v:?}: {e}"))?),
            other => return Err(format!("unknown key {other:?}")),
        }
    }
    let netdev = netdev.ok_or("netdev= missing")?;
    let (ipv4, prefix_len) = ip.ok_or("ip= missing")?;
    let mac = match mac {
        Some(m) => m,
        None => parse_mac(sysfs_net(&netdev, "address")?.trim())?,
    };
    let link_mtu = match mtu {
        Some(m) => m,
        None => sysfs_net(&netdev, "mtu")?
            .trim()
            .parse()
            .map_err(|e| format!("mtu of {netdev}: {e}"))?,
    };
    Ok((
        netdev,
        DeviceConfig {
            mac,
            ipv4,
            prefix_len,
            ipv6: Vec::new(),
            link_mtu,
        },
    ))
}

fn sysfs_net(netdev: &str, attr: &str) -> Result<String, String> {
    let p = format!("/sys/class/net/{netdev}/{attr}");
    std::fs::read_to_string(&p).map_err(|e| format!("{p}: {e}"))
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut m = [0u8; 6];
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("MAC {s:?}"));
    }
    for (b, p) in m.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("MAC {s:?}"))?;
    }
    Ok(m)
}

/// How requests wake the engine thread: an eventfd it sleeps on, written
/// only while it sleeps. A doorbell to an engine that is polling costs no
/// system call (in this VM one costs microseconds, as much as the rest of
/// a 64-byte message's handling).
///
/// The two sides order their accesses with sequentially consistent fences
/// (Dekker): a requester counts its message in `queued` before sending
/// it, fences, then writes the eventfd if `asleep`; the engine sets
/// `asleep`, fences, and sleeps only if `queued` is 0. So either the
/// engine sees the message coming or the requester sees it asleep: no
/// wake-up is lost.
#[derive(Debug)]
struct Wake {
    fd: OwnedFd,
    /// The engine is (about to be) in `ppoll`.
    asleep: AtomicBool,
    /// Messages sent and not yet taken by the engine.
    queued: AtomicUsize,
}

impl Wake {
    /// A wake-up over the eventfd `fd`, for an engine that is awake.
    fn new(fd: OwnedFd) -> Self {
        Wake {
            fd,
            asleep: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
        }
    }

    /// After a message counted in `queued` was sent: wakes the engine if
    /// it sleeps.
    fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.asleep.load(Ordering::Relaxed) {
            // SAFETY: eventfd_write on our own descriptor; it fails only when
            // the counter would overflow, and then it is readable anyway.
            unsafe { libc::eventfd_write(self.fd.as_raw_fd(), 1) };
        }
    }

    /// The engine is going to sleep: false (and stays awake) when a
    /// message is waiting.
    fn may_sleep(&self) -> bool {
        self.asleep.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.queued.load(Ordering::Relaxed) > 0 {
            self.asleep.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// The engine woke up: clears the eventfd for the next sleep.
    fn awake(&self) {
        self.asleep.store(false, Ordering::Relaxed);
        let mut count: libc::eventfd_t = 0;
        // SAFETY: eventfd_read into a live u64; EAGAIN when already clear.
        unsafe { libc::eventfd_read(self.fd.as_raw_fd(), &mut count) };
    }
}

/// Requests to the engine thread.
enum Msg {
    /// A control command (`CmdHeader` + body); the reply is the device's
    /// response bytes.
    Command(Vec<u8>, mpsc::SyncSender<Vec<u8>>),
    Doorbell(abi::Doorbell),
    Stats(mpsc::SyncSender<DeviceStats>),
}

/// A [`Transport`] to a [`Device`] running on an engine thread of this
/// process, attached to a [`Link`]. See the [module documentation](self).
///
/// Commands execute synchronously on the engine thread (bounded by
/// [`COMMAND_TIMEOUT`]); doorbells are queued to it. The engine thread
/// takes frames from the link, runs the device's timers, sends its frames
/// and queues its events for [`Transport::poll_event`]. Dropping the
/// transport stops the thread (bounded by [`JOIN_TIMEOUT`]).
pub struct LoopbackTransport {
    config: abi::ConfigSpace,
    mem: Arc<LoopbackMemory>,
    /// [`LoopbackTransport::allow_user_memory`] was called.
    user_memory: bool,
    /// Signalled (eventfd) by the engine thread when it queues events.
    event_fd: Arc<OwnedFd>,
    tx: Option<mpsc::Sender<Msg>>,
    /// Wakes the engine thread for requests.
    wake: Arc<Wake>,
    events: Arc<Mutex<VecDeque<abi::Event>>>,
    /// Closed by the engine thread when it exits.
    exited: mpsc::Receiver<()>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LoopbackTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackTransport")
            .field("mac", &self.config.mac)
            .finish_non_exhaustive()
    }
}

impl LoopbackTransport {
    /// Starts a device with `cfg` on a new engine thread, attached to `link`.
    ///
    /// Errors: [`TransportError::Io`] when the wake-up `eventfd(2)` or the
    /// thread cannot be created; [`TransportError::Timeout`] when the thread
    /// does not start in time.
    pub fn new(cfg: DeviceConfig, link: Box<dyn Link>) -> Result<Self, TransportError> {
        Self::start(cfg, link, None)
    }

    /// Like [`LoopbackTransport::new`], but the device reaches driver
    /// memory through `device_mem` instead of this transport's own DMA
    /// memory: for a guest agent serving other processes
    /// ([`crate::agent::procmem::ProcessMemory`]). [`Transport::alloc_dma`]
    /// still hands out this transport's own memory, which the device then
    /// cannot reach.
    pub fn with_device_memory(
        cfg: DeviceConfig,
        link: Box<dyn Link>,
        device_mem: Arc<dyn DmaMemory + Send + Sync>,
    ) -> Result<Self, TransportError> {
        Self::start(cfg, link, Some(device_mem))
    }

    fn start(
        cfg: DeviceConfig,
        link: Box<dyn Link>,
        device_mem: Option<Arc<dyn DmaMemory + Send + Sync>>,
    ) -> Result<Self, TransportError> {
        // SAFETY: plain syscall; the result is checked and then owned.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            let source = std::io::Error::last_os_error();
            return Err(TransportError::Io {
                what: "creating the loopback wake-up eventfd".into(),
                source,
            });
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let wake = Arc::new(Wake::new(unsafe { OwnedFd::from_raw_fd(raw) }));
        // SAFETY: as above.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            let source = std::io::Error::last_os_error();
            return Err(TransportError::Io {
                what: "creating the loopback event eventfd".into(),
                source,
            });
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let event_fd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let mem = Arc::new(LoopbackMemory::new());
        let events = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = mpsc::channel();
        let (config_tx, config_rx) = mpsc::sync_channel(1);
        let (exited_tx, exited) = mpsc::sync_channel::<()>(0);
        let engine = Engine {
            mem: device_mem.unwrap_or_else(|| mem.clone()),
            events: events.clone(),
            event_fd: event_fd.clone(),
            rx,
            wake: wake.clone(),
            link,
            tx: TxFlush::new(),
            epoch: Instant::now(),
        };
        let thread = std::thread::Builder::new()
            .name("vrnic-loopback".into())
            .spawn(move || {
                let _exited = exited_tx;
                let dev = Device::new(cfg);
                if config_tx.send(dev.config_space()).is_ok() {
                    engine.run(dev);
                }
            })
            .map_err(|source| TransportError::Io {
                what: "spawning the loopback engine thread".into(),
                source,
            })?;
        let config = config_rx
            .recv_timeout(COMMAND_TIMEOUT)
            .map_err(|_| TransportError::Timeout(COMMAND_TIMEOUT.as_millis() as u64))?;
        Ok(LoopbackTransport {
            config,
            mem,
            user_memory: false,
            event_fd,
            tx: Some(tx),
            wake,
            events,
            exited,
            thread: Some(thread),
        })
    }

    /// Lets MRs cover any memory of this process, not only
    /// [`Transport::alloc_dma`] memory: [`Transport::map_user`] then adds
    /// the MR's range to what the device may access, until
    /// [`Transport::unmap_user`]. For a process whose registered buffers are
    /// its own (an rdma-core application under vrnic's libibverbs.so.1).
    pub fn allow_user_memory(&mut self) {
        self.user_memory = true;
    }

    /// The transport's DMA memory, as the device sees it.
    pub fn memory(&self) -> &Arc<LoopbackMemory> {
        &self.mem
    }

    /// The device's counters.
    pub fn device_stats(&self) -> Result<DeviceStats, TransportError> {
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.send(Msg::Stats(reply_tx))?;
        reply_rx
            .recv_timeout(COMMAND_TIMEOUT)
            .map_err(|e| self.reply_error(e))
    }

    fn send(&self, m: Msg) -> Result<(), TransportError> {
        let tx = self.tx.as_ref().ok_or_else(stopped)?;
        self.wake.queued.fetch_add(1, Ordering::Relaxed);
        if tx.send(m).is_err() {
            self.wake.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(stopped());
        }
        self.wake.notify();
        Ok(())
    }

    fn reply_error(&self, e: RecvTimeoutError) -> TransportError {
        match e {
            RecvTimeoutError::Timeout => {
                TransportError::Timeout(COMMAND_TIMEOUT.as_millis() as u64)
            }
            RecvTimeoutError::Disconnected => stopped(),
        }
    }
}

fn stopped() -> TransportError {
    TransportError::NoDevice("the loopback engine thread has stopped".into())
}

impl Transport for LoopbackTransport {
    fn command_in(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        let hdr = abi::CmdHeader {
            opcode,
            ctx,
            len: body.len() as u32,
        };
        let mut req = Vec::with_capacity(size_of::<abi::CmdHeader>() + body.len());
        req.extend_from_slice(hdr.as_bytes());
        req.extend_from_slice(body);
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        self.send(Msg::Command(req, reply_tx))?;
        let reply = reply_rx
            .recv_timeout(COMMAND_TIMEOUT)
            .map_err(|e| self.reply_error(e))?;
        let Some(rh) = abi::RespHeader::read_from(&reply) else {
            return Err(TransportError::Io {
                what: format!("command {opcode}: device response of {} bytes", reply.len()),
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        };
        if rh.status != abi::STATUS_OK {
            return Err(TransportError::Status {
                opcode,
                status: rh.status,
            });
        }
        let body = &reply[size_of::<abi::RespHeader>()..];
        let n = (rh.len as usize).min(body.len()).min(resp.len());
        resp[..n].copy_from_slice(&body[..n]);
        Ok(n)
    }

    fn config(&self) -> abi::ConfigSpace {
        self.config
    }

    fn doorbell(&mut self, db: &abi::Doorbell) -> Result<(), TransportError> {
        self.send(Msg::Doorbell(*db))
    }

    /// True: the engine thread runs on this process's CPUs.
    fn yield_when_idle(&self) -> bool {
        true
    }

    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        self.mem.alloc(len, align)
    }

    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        self.mem
            .translate(va as u64, 1)
            .map(|_| va as u64)
            .map_err(|e| TransportError::Io {
                what: format!("address {va:#x} is not loopback DMA memory ({e})"),
                source: std::io::Error::from_raw_os_error(libc::EFAULT),
            })
    }

    fn poll_event(&mut self) -> Option<abi::Event> {
        self.events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.event_fd.as_raw_fd())
    }

    fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        if self.user_memory {
            self.mem.map_user(va, len)
        } else {
            Ok(())
        }
    }

    fn unmap_user(&mut self, va: usize, len: usize) {
        if self.user_memory {
            self.mem.unmap_user(va, len);
        }
    }
}

impl Drop for LoopbackTransport {
    fn drop(&mut self) {
        // Closing the channel stops the engine loop.
        drop(self.tx.take());
        let Some(thread) = self.thread.take() else {
            return;
        };
        match self.exited.recv_timeout(JOIN_TIMEOUT) {
            Err(RecvTimeoutError::Disconnected) => {
                if thread.join().is_err() {
                    tracing::error!("the loopback engine thread panicked");
                }
            }
            _ => tracing::error!(
                "the loopback engine thread did not stop within {JOIN_TIMEOUT:?}; detaching it"
            ),
        }
    }
}

/// The engine thread's state (everything but the device).
struct Engine {
    mem: Arc<dyn DmaMemory + Send + Sync>,
    events: Arc<Mutex<VecDeque<abi::Event>>>,
    event_fd: Arc<OwnedFd>,
    rx: mpsc::Receiver<Msg>,
    wake: Arc<Wake>,
    link: Box<dyn Link>,
    /// A frame the link was too full to take, sent first next time.
    tx: TxFlush,
    epoch: Instant,
}

impl Engine {
    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Handles one message.
    fn handle(&self, dev: &mut Device, m: Msg) {
        match m {
            Msg::Command(req, reply) => {
                let mut resp = vec![0u8; size_of::<abi::RespHeader>() + abi::MAX_CMD_BODY];
                let n = dev.control(&*self.mem, &req, &mut resp, self.now());
                resp.truncate(n);
                // The caller may have given up waiting; nothing to do then.
                let _ = reply.send(resp);
            }
            Msg::Doorbell(db) => dev.doorbell(&*self.mem, &db, self.now()),
            Msg::Stats(reply) => {
                let _ = reply.send(dev.stats().clone());
            }
        }
    }

    fn run(mut self, mut dev: Device) {
        let mut frame = vec![0u8; 65536];
        let mut last_work = Instant::now();
        loop {
            let mut work = false;
            for _ in 0..MSG_BATCH {
                match self.rx.try_recv() {
                    Ok(m) => {
                        self.wake.queued.fetch_sub(1, Ordering::Relaxed);
                        self.handle(&mut dev, m);
                        work = true;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if std::env::var_os(STATS_ENV).is_some() {
                            let line = stats_line(dev.stats(), self.link.link_stats());
                            eprintln!("{line} tx_given_up={}", self.tx.given_up());
                        }
                        return;
                    }
                }
            }
            for _ in 0..RX_BATCH {
                match self.link.recv(&mut frame) {
                    Ok(Some(n)) => {
                        dev.receive(&*self.mem, &frame[..n.min(frame.len())], self.now());
                        work = true;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!("loopback link receive failed: {e}");
                        break;
                    }
                }
            }
            let now = self.now();
            let next = dev.poll(&*self.mem, now);
            work |= next.is_some_and(|t| t <= now);
            // A full link keeps the frame (and those behind it) for the
            // next pass instead of losing it to a retransmission timeout.
            let now = self.now();
            let flushed = self.tx.flush(&mut *self.link, &mut dev, now);
            work |= flushed.sent > 0;
            let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
            let mut queued = false;
            while let Some(ev) = dev.pop_event() {
                events.push_back(ev);
                queued = true;
            }
            drop(events);
            if queued {
                // SAFETY: eventfd_write on our own descriptor (see `send`).
                unsafe { libc::eventfd_write(self.event_fd.as_raw_fd(), 1) };
            }

            if work {
                last_work = Instant::now();
                continue;
            }
            // Waiting for a full link to drain: sleep on its descriptor.
            if !flushed.held && last_work.elapsed() < SPIN_AFTER_WORK {
                std::thread::yield_now();
                continue;
            }
            let until_timer = next.map_or(IDLE_WAIT, |t| {
                Duration::from_nanos(t.saturating_sub(self.now()))
            });
            self.wait(until_timer.min(IDLE_WAIT), flushed.held);
        }
    }

    /// Sleeps until a request or (on a link with a descriptor) a frame
    /// arrives, the link can take a frame again (`writable`: a frame is
    /// held for it), or `timeout` passes.
    fn wait(&self, timeout: Duration, writable: bool) {
        if !self.wake.may_sleep() {
            return;
        }
        let mut fds = [
            libc::pollfd {
                fd: self.wake.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.link.caps().fd.unwrap_or(-1),
                events: if writable {
                    libc::POLLIN | libc::POLLOUT
                } else {
                    libc::POLLIN
                },
                revents: 0,
            },
        ];
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos().into(),
        };
        // SAFETY: `fds` and `ts` are live for the call; a negative fd is ignored by ppoll.
        unsafe {
            libc::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                &ts,
                std::ptr::null(),
            )
        };
        self.wake.awake();
    }
}

/// The `vrnic-stats:` line of [`STATS_ENV`]: `key=value` pairs, the
/// device's frame, payload byte, retransmission, NAK and duplicate counters
/// ([`DeviceStats`]), then the link's (`link_` prefix; [`LinkStats`],
/// absent for a link without counters). `link_rx_dropped` counts frames
/// the kernel dropped before the engine could read them.
pub fn stats_line(d: &DeviceStats, l: Option<LinkStats>) -> String {
    let mut s = format!(
        "vrnic-stats: tx_frames={} rx_frames={} tx_bytes={} rx_bytes={} rx_dropped={} \
         retransmits={} nak_psn_seq_sent={} nak_psn_seq_received={} duplicates={} \
         rnr_naks_sent={}",
        d.tx_frames,
        d.rx_frames,
        d.tx_bytes,
        d.rx_bytes,
        d.rx_dropped,
        d.retransmits,
        d.nak_psn_seq_sent,
        d.nak_psn_seq_received,
        d.duplicates,
        d.rnr_naks_sent,
    );
    if let Some(l) = l {
        s += &format!(
            " link_tx_frames={} link_tx_dropped={} link_rx_frames={} link_rx_dropped={}",
            l.tx_frames, l.tx_dropped, l.rx_frames, l.rx_dropped
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    impl LoopbackMemory {
        fn virt_ok(&self, gpa: u64) -> bool {
            self.translate(gpa, 1).is_ok()
        }
    }

    fn readable(fd: &OwnedFd) -> bool {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, no waiting.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    #[test]
    fn wake_writes_the_eventfd_only_for_a_sleeping_engine_and_loses_no_message() {
        // SAFETY: plain syscall; the result is checked and then owned.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let w = Wake::new(unsafe { OwnedFd::from_raw_fd(raw) });
        // An engine that is polling: a message costs no eventfd write.
        w.queued.fetch_add(1, Ordering::Relaxed);
        w.notify();
        assert!(!readable(&w.fd));
        // A message counted before the engine's check keeps it awake.
        assert!(!w.may_sleep(), "slept with a message waiting");
        assert!(!w.asleep.load(Ordering::Relaxed));
        w.queued.fetch_sub(1, Ordering::Relaxed);
        // Nothing waiting: it sleeps, and the next message wakes it.
        assert!(w.may_sleep());
        w.queued.fetch_add(1, Ordering::Relaxed);
        w.notify();
        assert!(readable(&w.fd), "a sleeping engine was not woken");
        w.awake();
        assert!(!readable(&w.fd) && !w.asleep.load(Ordering::Relaxed));
    }

    #[test]
    fn stats_line_names_the_counters_bench_sh_reads() {
        let d = DeviceStats {
            retransmits: 3,
            nak_psn_seq_received: 4,
            tx_bytes: 6,
            ..Default::default()
        };
        let l = LinkStats {
            rx_dropped: 5,
            ..Default::default()
        };
        let line = stats_line(&d, Some(l));
        assert!(line.starts_with("vrnic-stats: "), "{line}");
        for kv in [
            "retransmits=3",
            "nak_psn_seq_received=4",
            "link_rx_dropped=5",
            "tx_bytes=6",
        ] {
            assert!(line.split(' ').any(|w| w == kv), "{kv} in {line}");
        }
        assert!(!stats_line(&d, None).contains("link_"));
    }

    #[test]
    fn memory_allows_only_allocated_ranges_and_honours_alignment() {
        let m = LoopbackMemory::new();
        let a = m.alloc(100, 4096).unwrap();
        assert_eq!(a.gpa % 4096, 0);
        assert_eq!(a.ptr as u64, a.gpa);
        m.write(a.gpa + 90, &[1; 10]).unwrap();
        let mut r = [0u8; 10];
        m.read(a.gpa + 90, &mut r).unwrap();
        assert_eq!(r, [1; 10]);
        // SAFETY: `a` is 100 bytes of live memory.
        let byte = unsafe { *a.ptr.add(95) };
        assert_eq!(byte, 1, "device address is the process address");
        assert!(
            m.read(a.gpa + 95, &mut r).is_err(),
            "runs past everything allocated"
        );
        assert!(m.virt_ok(a.gpa + 99) && !m.virt_ok(a.gpa + 100));
        let b = m.alloc(10, 2 << 20).unwrap();
        assert_eq!(b.gpa % (2 << 20), 0);
        assert!(m.virt_ok(b.gpa + 9) && !m.virt_ok(b.gpa + 10));
        let stack = [0u8; 16];
        assert!(
            m.read(stack.as_ptr() as u64, &mut r).is_err(),
            "not DMA memory"
        );
        assert!(m.write(u64::MAX - 4, &r).is_err());
        assert!(m.alloc(1, 3).is_err());
        assert!(m.alloc(1, 4 << 20).is_err());
        // A large allocation gets its own zeroed arena.
        let big = m.alloc(ARENA_SIZE + 1, 4096).unwrap();
        let mut tail = [9u8; 4];
        m.read(big.gpa + ARENA_SIZE as u64 - 3, &mut tail).unwrap();
        assert_eq!(tail, [0; 4]);
    }

    #[test]
    fn user_ranges_are_reachable_only_between_map_and_unmap() {
        let m = LoopbackMemory::new();
        let heap = [7u8; 100];
        let va = heap.as_ptr() as usize;
        let mut r = [0u8; 10];
        assert!(m.read(va as u64, &mut r).is_err(), "not mapped yet");
        m.map_user(va, 50).unwrap();
        m.read(va as u64 + 40, &mut r).unwrap();
        assert_eq!(r, [7; 10]);
        assert!(
            m.read(va as u64 + 41, &mut r).is_err(),
            "runs past the range"
        );
        // Registered twice (two MRs on one buffer): reachable until both go.
        m.map_user(va, 50).unwrap();
        m.unmap_user(va, 50);
        assert!(m.virt_ok(va as u64));
        m.unmap_user(va, 50);
        assert!(!m.virt_ok(va as u64), "unmapped");
        assert!(m.map_user(va, 0).is_err());
        assert!(m.map_user(usize::MAX - 4, 10).is_err());
    }
}
