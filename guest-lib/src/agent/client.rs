//! A program's side: [`AgentTransport`], a [`Transport`] to a device
//! through its guest agent (see the [module documentation](super)).
//!
//! Commands and doorbells go over the agent socket; events arrive on a
//! second socket whose other end the program handed the agent
//! ([`Transport::event_fd`] is that socket, so completion channels sleep
//! in `poll(2)` on it). DMA memory and address translation are the
//! program's own: hugepage memory and `/proc/self/pagemap` in a VM
//! ([`proto::MODE_PHYS`], pinned with [`Pins`]), plain memory and
//! `ctx << 48 | address` for an agent over an in-process device
//! ([`proto::MODE_PROCESS`]), a memory file of the program's own that the
//! agent adds to the daemon's memory for an agent over a daemon's
//! vhost-user socket ([`proto::MODE_FILE`], a container).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vrnic_abi::{self as abi, Pod};

use super::pin::Pins;
use super::procmem::device_address;
use super::proto::{self, Welcome};
use crate::dma::DmaAllocator;
use crate::pci::SharedMap;
use crate::transport::{DmaBuf, Transport, TransportError};
use crate::vhost_user::{DmaCarver, Ram, RAM_SIZE};

/// Longest wait for the agent's answer to a command (a large `REG_MR`
/// takes the device tens of ms; the agent serves programs in turn).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the shared doorbell queue (its lock, a free slot).
pub const DOORBELL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a started agent to accept connections.
pub const SPAWN_TIMEOUT: Duration = Duration::from_secs(20);
/// The exit status of an agent that found its device held by another
/// process (`EX_TEMPFAIL`): most likely an agent another program started
/// at the same moment, which listens once it has the device open.
pub const EXIT_DEVICE_BUSY: i32 = 75;

fn io_err(what: impl Into<String>, source: std::io::Error) -> TransportError {
    TransportError::Io {
        what: what.into(),
        source,
    }
}

fn gone() -> TransportError {
    TransportError::NoDevice("the vrnic agent has gone away".into())
}

/// Where DMA memory comes from.
#[derive(Debug)]
enum Memory {
    /// A VM: hugepages, pagemap, pins.
    Phys { dma: DmaAllocator },
    /// An in-process device in the agent: plain mappings of this process.
    Process { maps: Vec<(usize, usize)> },
    /// A daemon's function over vhost-user: this process's memory file
    /// (one for all its connections: a buffer registered in two contexts
    /// is remapped once), which the agent added to the daemon's memory
    /// table; this connection's DMA memory is carved from chunks of its
    /// own, given back once the agent closed its context.
    File {
        ram: Arc<Mutex<Ram>>,
        dma: DmaCarver,
    },
}

/// The agent's shared doorbell queue as this program maps it: the ring,
/// and what must stay mapped or open while it is used.
#[derive(Debug)]
struct SharedRing {
    ring: crate::dbring::DbRing,
    _region: SharedMap,
    _notify: Notifier,
}

/// What notifies the device of [`SharedRing`]'s doorbells.
#[derive(Debug)]
enum Notifier {
    /// The mapped notification register (a VM).
    Register { _map: SharedMap },
    /// The queue's kick eventfd (over vhost-user).
    EventFd { _kick: OwnedFd },
}

impl SharedRing {
    /// Maps the ring the welcome describes, with the descriptors that came
    /// with it (the memfd; the kick eventfd over vhost-user). Errors: a
    /// description or descriptors that do not fit ([`gone`]), the mappings'.
    fn map(db: &proto::SharedDb, fds: &[OwnedFd]) -> Result<SharedRing, TransportError> {
        let len = db.layout.len as usize;
        match (&db.notify, fds) {
            (proto::DbNotify::Register { file, offset }, [memfd, ..]) => {
                if len > crate::pci::SHARED_DB_REGION {
                    return Err(gone());
                }
                let region = SharedMap::map(
                    memfd.as_raw_fd(),
                    crate::pci::SHARED_DB_REGION,
                    0,
                    libc::MAP_POPULATE,
                )?;
                let (nmap, reg) = crate::pci::map_notify(file, *offset)?;
                // SAFETY: both mappings are kept beside the ring.
                let ring = unsafe {
                    crate::dbring::DbRing::new(region.ptr(), db.layout, reg, abi::DOORBELLQ)
                }?;
                Ok(SharedRing {
                    ring,
                    _region: region,
                    _notify: Notifier::Register { _map: nmap },
                })
            }
            (proto::DbNotify::EventFd { region_offset }, [memfd, kick, ..]) => {
                if !region_offset.is_multiple_of(crate::vhost_user::PAGE as u64) {
                    return Err(gone());
                }
                let region = SharedMap::map(
                    memfd.as_raw_fd(),
                    len.next_multiple_of(crate::vhost_user::PAGE),
                    *region_offset,
                    libc::MAP_POPULATE,
                )?;
                let kick = kick
                    .try_clone()
                    .map_err(|e| io_err("the doorbell queue's kick eventfd", e))?;
                // SAFETY: the mapping and the eventfd are kept beside the ring.
                let ring = unsafe {
                    crate::dbring::DbRing::with_eventfd(region.ptr(), db.layout, kick.as_raw_fd())
                }?;
                Ok(SharedRing {
                    ring,
                    _region: region,
                    _notify: Notifier::EventFd { _kick: kick },
                })
            }
            _ => Err(gone()),
        }
    }
}

/// A [`Transport`] through the guest agent. See the [module documentation](self).
#[derive(Debug)]
pub struct AgentTransport {
    sock: OwnedFd,
    events: OwnedFd,
    config: abi::ConfigSpace,
    ctx: u16,
    mem: Memory,
    pins: Option<Pins>,
    /// The agent's doorbell queue, posted to directly; `None`: doorbells
    /// go through the agent.
    ring: Option<SharedRing>,
    /// An `EV_DEVICE_FATAL` is owed: the agent went away.
    lost: bool,
    pending: VecDeque<abi::Event>,
}

impl AgentTransport {
    /// Connects to the agent at `path`. Errors: no agent there
    /// ([`TransportError::Io`] with the `connect(2)` error), or the agent
    /// refused (`NoDevice`, or `Status` with its errno).
    pub fn connect(path: &Path) -> Result<AgentTransport, TransportError> {
        let sock = proto::connect(path).map_err(|e| io_err("connecting to the vrnic agent", e))?;
        let (events, events_peer) =
            proto::seqpacket_pair().map_err(|e| io_err("creating the event socket", e))?;
        proto::set_nonblocking(&events).map_err(|e| io_err("event socket", e))?;
        // Pins matter only where the device uses physical addresses; without
        // io_uring the pages are still locked (mlock) but may be reused if the
        // program is killed mid-transfer, which is said once on stderr.
        let pins = match Pins::new() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(
                    "io_uring page pins unavailable ({e}); registered memory is only mlocked"
                );
                None
            }
        };
        let mut hello = vec![proto::MSG_HELLO];
        hello.extend_from_slice(&proto::VERSION.to_le_bytes());
        let pin_fd: i32 = pins.as_ref().map_or(-1, |p| p.fd());
        hello.extend_from_slice(&pin_fd.to_le_bytes());
        proto::send(sock.as_raw_fd(), &hello, &[events_peer.as_raw_fd()], 0)
            .map_err(|e| io_err("agent hello", e))?;
        drop(events_peer);
        let mut buf = [0u8; proto::MAX_MSG];
        if !proto::wait_readable(sock.as_raw_fd(), COMMAND_TIMEOUT)
            .map_err(|e| io_err("waiting for the agent", e))?
        {
            return Err(TransportError::Timeout(COMMAND_TIMEOUT.as_millis() as u64));
        }
        let (n, wfds) =
            proto::recv(sock.as_raw_fd(), &mut buf, 0).map_err(|e| io_err("agent", e))?;
        let w = Welcome::decode(&buf[..n]).ok_or_else(gone)?;
        if w.status != 0 {
            return Err(TransportError::Status {
                opcode: abi::CMD_OPEN_CTX,
                status: w.status,
            });
        }
        let mem = match w.mode {
            proto::MODE_PHYS => Memory::Phys {
                dma: DmaAllocator::new()?,
            },
            proto::MODE_PROCESS => Memory::Process { maps: Vec::new() },
            proto::MODE_FILE => Memory::File {
                ram: share_memory(&sock)?,
                dma: DmaCarver::default(),
            },
            m => {
                return Err(TransportError::NoDevice(format!(
                    "agent memory mode {m} unknown"
                )))
            }
        };
        // An in-process device reaches this process by process_vm_*: a
        // killed program's memory simply becomes unreachable, no pins needed.
        let pins = if w.mode == proto::MODE_PHYS {
            pins
        } else {
            None
        };
        let ring = match &w.db {
            Some(db) => Some(SharedRing::map(db, &wfds)?),
            None => None,
        };
        Ok(AgentTransport {
            sock,
            events,
            config: w.config,
            ctx: w.ctx,
            mem,
            pins,
            ring,
            lost: false,
            pending: VecDeque::new(),
        })
    }

    /// Connects to the agent at `path`, starting `agent_bin` first when no
    /// agent answers there (`agent_bin --socket PATH ARGS...`, detached, its
    /// log in `PATH.log`; `args` name the device: `--pci BDF`, `--vhost-user
    /// SOCKET`), then waiting at most [`SPAWN_TIMEOUT`] for it. Two
    /// programs starting at once may both start one: the second agent finds
    /// the device taken and exits ([`EXIT_DEVICE_BUSY`]), and both programs
    /// connect to the first, which listens only once it has opened the
    /// device (seconds, in a TCG guest): so an agent that exits busy is
    /// waited past, up to the same bound; any other exit is an error at once.
    pub fn connect_or_spawn(
        path: &Path,
        agent_bin: &Path,
        args: &[std::ffi::OsString],
    ) -> Result<AgentTransport, TransportError> {
        Self::connect_or_spawn_within(path, agent_bin, args, SPAWN_TIMEOUT)
    }

    /// [`connect_or_spawn`](Self::connect_or_spawn) with its bound.
    pub fn connect_or_spawn_within(
        path: &Path,
        agent_bin: &Path,
        args: &[std::ffi::OsString],
        timeout: Duration,
    ) -> Result<AgentTransport, TransportError> {
        match Self::connect(path) {
            Ok(t) => return Ok(t),
            Err(TransportError::Io { .. }) => {}
            Err(e) => return Err(e),
        }
        let log = PathBuf::from(format!("{}.log", path.display()));
        if let Some(dir) = path.parent() {
            private_dir(dir)?;
        }
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| io_err(format!("opening {}", log.display()), e))?;
        let mut cmd = Command::new(agent_bin);
        cmd.arg("--socket").arg(path).args(args);
        cmd.stdin(std::process::Stdio::null())
            .stdout(logf.try_clone().map_err(|e| io_err("agent log", e))?)
            .stderr(logf);
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: setsid is async-signal-safe; the agent leaves this
            // program's session so that it outlives it.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| io_err(format!("starting {}", agent_bin.display()), e))?;
        let deadline = Instant::now() + timeout;
        let mut exited = None;
        let gone = |st: std::process::ExitStatus| {
            TransportError::NoDevice(format!(
                "the vrnic agent exited ({st}); see {}",
                log.display()
            ))
        };
        loop {
            match Self::connect(path) {
                Ok(t) => {
                    // Reaped by init once this program exits; no zombie kept
                    // beyond it. Not waited for here: it keeps running.
                    drop(child);
                    return Ok(t);
                }
                Err(TransportError::Io { .. }) if Instant::now() < deadline => {
                    if exited.is_none() {
                        if let Ok(Some(st)) = child.try_wait() {
                            if st.code() != Some(EXIT_DEVICE_BUSY) {
                                // Failed: a last try (another agent may listen by now).
                                return Self::connect(path).map_err(|_| gone(st));
                            }
                            // Lost the race to another agent: wait for it to listen.
                            exited = Some(st);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(TransportError::Io { .. }) if exited.is_some() => {
                    return Err(gone(exited.unwrap_or_default()));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Asks the agent at `path` how many programs it serves (and holds
    /// pins of) and what objects exist on its device (all contexts).
    pub fn status(path: &Path) -> Result<proto::Status, TransportError> {
        let sock = proto::connect(path).map_err(|e| io_err("connecting to the vrnic agent", e))?;
        proto::send(sock.as_raw_fd(), &[proto::MSG_STATUS], &[], 0)
            .map_err(|e| io_err("agent status", e))?;
        if !proto::wait_readable(sock.as_raw_fd(), COMMAND_TIMEOUT)
            .map_err(|e| io_err("waiting for the agent", e))?
        {
            return Err(TransportError::Timeout(COMMAND_TIMEOUT.as_millis() as u64));
        }
        let mut buf = [0u8; proto::MAX_MSG];
        let (n, _) = proto::recv(sock.as_raw_fd(), &mut buf, 0).map_err(|e| io_err("agent", e))?;
        proto::Status::decode(&buf[..n]).ok_or_else(gone)
    }

    /// This program's device context.
    pub fn ctx(&self) -> u16 {
        self.ctx
    }

    fn fail(&mut self) -> TransportError {
        self.lost = true;
        gone()
    }
}

/// Creates directory `dir` (mode 0700) unless it exists, and checks that
/// only this user can put an agent's socket there: owned by this user, not
/// writable by group or others (an agent socket in a directory another user
/// controls could be theirs). Errors: `Io` (`EPERM` for a directory that
/// fails the check).
fn private_dir(dir: &Path) -> Result<(), TransportError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_err(format!("creating {}", dir.display()), e))?;
    let md = std::fs::metadata(dir).map_err(|e| io_err(format!("{}", dir.display()), e))?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if md.uid() != uid || md.mode() & 0o022 != 0 {
        return Err(io_err(
            format!(
                "{}: owned by uid {} with mode {:o}; an agent's directory must be this user's alone",
                dir.display(),
                md.uid(),
                md.mode() & 0o7777
            ),
            std::io::Error::from_raw_os_error(libc::EPERM),
        ));
    }
    Ok(())
}

/// This process's memory file ([`proto::MODE_FILE`]), made on first use
/// and kept for the process's life; a forked child makes its own (its
/// parent's allocations are not its to reuse).
fn process_ram() -> Result<Arc<Mutex<Ram>>, TransportError> {
    static RAM: Mutex<Option<(u32, Arc<Mutex<Ram>>)>> = Mutex::new(None);
    let mut g = RAM.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    match g.take() {
        Some((p, r)) if p == pid => {
            *g = Some((p, r.clone()));
            return Ok(r);
        }
        // The parent's, inherited over fork(2): left mapped as it is.
        Some(parent) => std::mem::forget(parent),
        None => {}
    }
    let r = Arc::new(Mutex::new(Ram::new(RAM_SIZE, 0)?));
    *g = Some((pid, r.clone()));
    Ok(r)
}

/// Hands this process's memory file to the agent ([`proto::MSG_MEMORY`]),
/// which adds it to the daemon's memory unless another connection of the
/// process did; its answer says at which device address. Errors: the
/// agent's refusal (`Status` with its errno, e.g. `ENOSPC`: the function's
/// memory table is full; `EBUSY`: the file moved while another context of
/// the process uses it, after the agent restarted), the memory file's, a
/// lost agent.
fn share_memory(sock: &OwnedFd) -> Result<Arc<Mutex<Ram>>, TransportError> {
    let ram = process_ram()?;
    let mut r = ram.lock().unwrap_or_else(|e| e.into_inner());
    let mut m = vec![proto::MSG_MEMORY];
    m.extend_from_slice(&(r.len() as u64).to_le_bytes());
    proto::send(sock.as_raw_fd(), &m, &[r.fd()], 0)
        .map_err(|e| io_err("sending the memory file to the agent", e))?;
    if !proto::wait_readable(sock.as_raw_fd(), COMMAND_TIMEOUT)
        .map_err(|e| io_err("waiting for the agent", e))?
    {
        return Err(TransportError::Timeout(COMMAND_TIMEOUT.as_millis() as u64));
    }
    let mut buf = [0u8; proto::MAX_MSG];
    let (n, _) = proto::recv(sock.as_raw_fd(), &mut buf, 0).map_err(|e| io_err("agent", e))?;
    let a = buf
        .get(..n)
        .filter(|a| a.len() == 13 && a[0] == proto::MSG_MEMORY);
    let Some(a) = a else {
        return Err(gone());
    };
    let status = u32::from_le_bytes([a[1], a[2], a[3], a[4]]);
    let mut base = [0u8; 8];
    base.copy_from_slice(&a[5..13]);
    let base = u64::from_le_bytes(base);
    let status = match status {
        // Held by the process's static and here: more holders are other
        // contexts, whose addresses must not move.
        0 if r.gpa_base() != 0 && r.gpa_base() != base && Arc::strong_count(&ram) > 2 => {
            libc::EBUSY as u32
        }
        s => s,
    };
    if status != 0 {
        return Err(TransportError::Status {
            opcode: abi::CMD_OPEN_CTX,
            status,
        });
    }
    r.set_gpa_base(base);
    drop(r);
    Ok(ram)
}

impl Transport for AgentTransport {
    fn config(&self) -> abi::ConfigSpace {
        self.config
    }

    /// Sends the command and waits for the answer, at most [`COMMAND_TIMEOUT`].
    fn command_in(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        crate::transport::not_this_context(ctx, opcode)?;
        if self.lost {
            return Err(gone());
        }
        if body.len() > abi::MAX_CMD_BODY {
            return Err(io_err(
                format!("command {opcode}"),
                std::io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        let mut m = Vec::with_capacity(3 + body.len());
        m.push(proto::MSG_CMD);
        m.extend_from_slice(&opcode.to_le_bytes());
        m.extend_from_slice(body);
        if proto::send(self.sock.as_raw_fd(), &m, &[], 0).is_err() {
            return Err(self.fail());
        }
        match proto::wait_readable(self.sock.as_raw_fd(), COMMAND_TIMEOUT) {
            Ok(true) => {}
            Ok(false) => return Err(TransportError::Timeout(COMMAND_TIMEOUT.as_millis() as u64)),
            Err(_) => return Err(self.fail()),
        }
        let mut buf = [0u8; proto::MAX_MSG];
        let n = match proto::recv(self.sock.as_raw_fd(), &mut buf, 0) {
            Ok((n, _)) if n >= 5 && buf[0] == proto::MSG_RESP => n,
            _ => return Err(self.fail()),
        };
        let status = u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]);
        if status != 0 {
            return Err(TransportError::Status { opcode, status });
        }
        let body = &buf[5..n];
        let k = body.len().min(resp.len());
        resp[..k].copy_from_slice(&body[..k]);
        Ok(k)
    }

    fn doorbell(&mut self, db: &abi::Doorbell) -> Result<(), TransportError> {
        if self.lost {
            return Err(gone());
        }
        if let Some(SharedRing { ring, .. }) = &self.ring {
            let db = abi::Doorbell {
                ctx: self.ctx,
                ..*db
            };
            return ring.post(&db, DOORBELL_TIMEOUT);
        }
        let mut m = Vec::with_capacity(1 + size_of::<abi::Doorbell>());
        m.push(proto::MSG_DB);
        m.extend_from_slice(db.as_bytes());
        // The agent runs at a real-time priority (vrnic-agent --rt), so this
        // send switches to it at once even when this program then spins.
        proto::send(self.sock.as_raw_fd(), &m, &[], 0).map_err(|_| self.fail())
    }

    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        match &mut self.mem {
            Memory::Phys { dma } => {
                let b = dma.alloc(len, align)?;
                if let Some(p) = &mut self.pins {
                    p.pin(b.ptr as usize, b.len)
                        .map_err(|e| io_err("pinning DMA memory", e))?;
                }
                Ok(b)
            }
            Memory::Process { maps } => {
                if !align.is_power_of_two() || align > 2 << 20 {
                    return Err(TransportError::NoDmaMemory(len));
                }
                let align = align.max(4096);
                let size = len.max(1).div_ceil(4096) * 4096 + align;
                // SAFETY: an anonymous private mapping; the result is checked.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        size,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(TransportError::NoDmaMemory(len));
                }
                maps.push((p as usize, size));
                let start = (p as usize).next_multiple_of(align);
                Ok(DmaBuf {
                    ptr: start as *mut u8,
                    len,
                    gpa: device_address(self.ctx, start),
                })
            }
            Memory::File { ram, dma } => lock(ram).carve(dma, len, align),
        }
    }

    /// Over a daemon's function (the program's memory file), back to this
    /// connection's memory for its next objects, as
    /// [`crate::vhost_user::VhostUserTransport`]'s; a VM's hugepages and an
    /// in-process device's mappings stay for the transport's lifetime.
    fn release_dma(&mut self, buf: DmaBuf) {
        if let Memory::File { ram, dma } = &mut self.mem {
            lock(ram).release_in(dma, buf);
        }
    }

    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        match &self.mem {
            Memory::Phys { dma } => dma.pagemap().virt_to_phys(va),
            Memory::Process { .. } => Ok(device_address(self.ctx, va)),
            Memory::File { ram, .. } => lock(ram).virt_to_phys(va),
        }
    }

    fn page_size(&self) -> usize {
        match &self.mem {
            Memory::Phys { dma } => dma.pagemap().page_size(),
            Memory::Process { .. } | Memory::File { .. } => crate::vhost_user::PAGE,
        }
    }

    /// Next event from the agent; after the agent went away, one
    /// `EV_DEVICE_FATAL` (and nothing more).
    fn poll_event(&mut self) -> Option<abi::Event> {
        if let Some(e) = self.pending.pop_front() {
            return Some(e);
        }
        let mut buf = [0u8; proto::MAX_MSG];
        match proto::recv(self.events.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT) {
            Ok((n, _)) if n > 1 && buf[0] == proto::MSG_EVENT => abi::Event::read_from(&buf[1..n]),
            Ok((0, _)) if !self.lost => {
                self.lost = true;
                Some(abi::Event {
                    kind: abi::EV_DEVICE_FATAL,
                    ctx: abi::ALL_CTX,
                    ..Default::default()
                })
            }
            _ => None,
        }
    }

    /// True when doorbells go through the agent (no shared doorbell
    /// queue): it must get the CPU to forward them; and over a daemon's
    /// vhost-user socket, whose worker runs on this machine's CPUs.
    fn yield_when_idle(&self) -> bool {
        self.ring.is_none() || matches!(self.mem, Memory::File { .. })
    }

    /// True over a daemon's vhost-user socket ([`proto::MODE_FILE`]): the
    /// daemon polls the QP records, and doorbells go through the agent only
    /// while it does not.
    fn doorbell_records(&self) -> bool {
        matches!(self.mem, Memory::File { .. })
    }

    /// Not over a daemon's vhost-user socket: the daemon reaches registered
    /// pages through the memory file.
    fn needs_locked_pages(&self) -> bool {
        !matches!(self.mem, Memory::File { .. })
    }

    /// The event socket: readable when the agent sent an event.
    fn event_fd(&self) -> Option<RawFd> {
        Some(self.events.as_raw_fd())
    }

    /// Nothing to acknowledge: [`Transport::poll_event`] consumes the messages.
    fn ack_event(&mut self) {}

    /// Pins the range (the verbs layer has locked it already); over a
    /// daemon's vhost-user socket, remaps it onto the memory file
    /// ([`crate::vhost_user`]'s way, with its limits).
    fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        if let Memory::File { ram, .. } = &self.mem {
            return lock(ram).map_user(va, len);
        }
        if let Some(p) = &mut self.pins {
            if let Err(e) = p.pin(va, len) {
                // A mapping io_uring cannot pin (read-only, file-backed):
                // locked only, as before pins existed.
                tracing::debug!("pinning {va:#x}+{len}: {e}; the range is only mlocked");
            }
        }
        Ok(())
    }

    fn unmap_user(&mut self, va: usize, len: usize) {
        if let Memory::File { ram, .. } = &self.mem {
            return lock(ram).unmap_user(va, len);
        }
        if let Some(p) = &mut self.pins {
            p.unpin(va, len);
        }
    }
}

/// The process's memory file, locked (a panic elsewhere leaves it usable).
fn lock(ram: &Mutex<Ram>) -> std::sync::MutexGuard<'_, Ram> {
    ram.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for AgentTransport {
    fn drop(&mut self) {
        if let Memory::File { ram, dma } = &mut self.mem {
            // The DMA chunks go back only once the agent closed the context
            // (it closes the socket after CMD_CLOSE_CTX): until then the
            // device may still write there. Bounded; past it they are kept.
            // SAFETY: shutdown of our own socket.
            unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_WR) };
            let deadline = Instant::now() + COMMAND_TIMEOUT;
            let mut buf = [0u8; proto::MAX_MSG];
            let closed = loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match proto::wait_readable(self.sock.as_raw_fd(), left) {
                    Ok(true) => match proto::recv(self.sock.as_raw_fd(), &mut buf, 0) {
                        Ok((0, _)) => break true,
                        Ok(_) => continue,
                        Err(_) => break true,
                    },
                    _ => break false,
                }
            };
            if closed {
                lock(ram).free_dma(dma);
            } else {
                tracing::warn!(
                    "the agent did not close the context in time; its DMA memory is kept"
                );
            }
        }
        if let Memory::Process { maps } = &self.mem {
            for &(p, size) in maps {
                // SAFETY: mappings this transport made; the device no longer
                // uses them (the caller destroyed its objects first).
                unsafe { libc::munmap(p as *mut libc::c_void, size) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake agent: a shell script exiting with `code` at once, never
    /// listening.
    fn fake_agent(dir: &Path, code: i32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let bin = dir.join(format!("agent-{code}"));
        std::fs::write(&bin, format!("#!/bin/sh\nexit {code}\n")).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        bin
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vrnic-spawn-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        d
    }

    /// Two programs starting at once in a TCG guest (e2e `software`: cmtime's
    /// server and client): the second's agent found the device taken and
    /// exited busy while the first's was still opening it; the second
    /// program gave up at once ("the vrnic agent exited (exit status: 1)").
    /// An agent that exits busy is waited past, up to the bound.
    #[test]
    fn a_busy_agent_is_waited_past_until_the_bound() {
        let d = scratch("busy");
        let bin = fake_agent(&d, EXIT_DEVICE_BUSY);
        let t0 = Instant::now();
        let r = AgentTransport::connect_or_spawn_within(
            &d.join("agent.sock"),
            &bin,
            &[],
            Duration::from_millis(1500),
        );
        let Err(e) = r else {
            panic!("nothing listens, yet it connected")
        };
        assert!(t0.elapsed() >= Duration::from_millis(1400), "{e}");
        assert!(e.to_string().contains("exited"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn an_agent_that_fails_otherwise_is_an_error_at_once() {
        let d = scratch("fail");
        let bin = fake_agent(&d, 1);
        let t0 = Instant::now();
        let r = AgentTransport::connect_or_spawn_within(
            &d.join("agent.sock"),
            &bin,
            &[],
            Duration::from_secs(10),
        );
        let Err(e) = r else {
            panic!("nothing listens, yet it connected")
        };
        assert!(t0.elapsed() < Duration::from_secs(5), "{e}");
        assert!(e.to_string().contains("exit status: 1"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
