//! The agent's side: [`Agent`] owns the device's [`Transport`] and serves
//! programs on a Unix socket (see the [module documentation](super)).
//!
//! One thread, one `poll(2)` loop over the listening socket, every
//! program's socket and the device's event descriptor. A program's command
//! is executed synchronously in its context (bounded by the transport's
//! command timeout), a doorbell forwarded with its context, an event sent
//! on the owning program's event socket (without blocking: a program that
//! does not read its events loses them, counted). A program whose socket
//! closes or misbehaves loses its context: `CMD_CLOSE_CTX` first, then its
//! pin descriptor is dropped.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrnic_abi::{self as abi, command, Pod};

use super::procmem::ProcessMemory;
use super::proto::{self, Welcome};
use crate::transport::{Transport, TransportError};

/// Longest the loop sleeps without an event descriptor (the device's
/// events are then polled), and between checks of the stop flag.
const POLL_INTERVAL: Duration = Duration::from_millis(1);
/// Longest the loop sleeps with an event descriptor.
const IDLE_INTERVAL: Duration = Duration::from_millis(200);

/// Counters of an agent.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AgentStats {
    /// Programs served since start.
    pub programs: u64,
    /// Programs whose context was closed because they went away.
    pub closed: u64,
    /// Events dropped: the owning program's event socket was full or gone.
    pub events_dropped: u64,
    /// Messages refused as malformed (the program was disconnected).
    pub bad_messages: u64,
}

struct Program {
    sock: OwnedFd,
    /// `None` until its HELLO.
    ctx: Option<u16>,
    events: Option<OwnedFd>,
    /// Held until the context is closed (see [`super::pin`]).
    _pins: Option<OwnedFd>,
    /// The program's memory file ([`proto::MODE_FILE`]), by identity
    /// ([`FileId`]); its share is dropped once its context is closed.
    shared: Option<FileId>,
    pid: i32,
}

/// A memory file's identity (`st_dev`, `st_ino`): every connection of one
/// process hands the agent the same file.
type FileId = (u64, u64);

/// A memory file the device reaches ([`proto::MODE_FILE`]).
#[derive(Debug, Clone, Copy)]
struct SharedFile {
    /// Its device address ([`Transport::share_memory`]).
    gpa: u64,
    /// Programs (connections) using it.
    users: u32,
}

/// A guest agent serving programs on one device.
pub struct Agent {
    dev: Box<dyn Transport>,
    listener: OwnedFd,
    path: PathBuf,
    programs: Vec<Program>,
    mode: u8,
    procmem: Option<Arc<ProcessMemory>>,
    /// Exit after this long without programs (`None`: never).
    linger: Option<Duration>,
    /// The device's doorbell queue, which programs post to themselves,
    /// and the descriptors that travel with its description.
    shared_db: Option<(proto::SharedDb, Vec<RawFd>)>,
    /// Memory files the device reaches ([`proto::MODE_FILE`]), shared once
    /// however many connections of a process hand them over.
    files: std::collections::HashMap<FileId, SharedFile>,
    /// The connection manager service (rdma_ucm connections), started at
    /// the first one.
    ucma: Option<super::ucma::service::Service>,
    ucma_stats: super::ucma::service::SharedStats,
    stats: AgentStats,
}

impl Agent {
    /// An agent for `dev` listening at `path` (replacing a stale socket
    /// file: whoever holds the device is the only agent). `procmem`: the
    /// device's memory is other processes' ([`proto::MODE_PROCESS`]);
    /// `None` for a VM ([`proto::MODE_PHYS`]). Errors: the socket cannot
    /// be made.
    pub fn new(
        dev: Box<dyn Transport>,
        path: PathBuf,
        procmem: Option<Arc<ProcessMemory>>,
        linger: Option<Duration>,
    ) -> io::Result<Agent> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(&path);
        let listener = proto::listen(&path)?;
        proto::set_nonblocking(&listener)?;
        Ok(Agent {
            dev,
            listener,
            path,
            programs: Vec::new(),
            mode: if procmem.is_some() {
                proto::MODE_PROCESS
            } else {
                proto::MODE_PHYS
            },
            procmem,
            linger,
            shared_db: None,
            files: std::collections::HashMap::new(),
            ucma: None,
            ucma_stats: Default::default(),
            stats: AgentStats::default(),
        })
    }

    /// Serves programs whose memory the device reaches through files they
    /// share ([`proto::MODE_FILE`]: the transport is a daemon's vhost-user
    /// socket, [`Transport::share_memory`]).
    pub fn share_files(&mut self) {
        self.mode = proto::MODE_FILE;
    }

    /// Lets programs post doorbells to `db` themselves (the transport's
    /// [`crate::pci::PciTransport::shared_doorbells`]): no hop through the
    /// agent per doorbell.
    pub fn share_doorbells(&mut self, db: crate::pci::SharedDoorbells) {
        let d = proto::SharedDb {
            layout: db.layout,
            notify: proto::DbNotify::Register {
                file: db.notify_file,
                offset: db.notify_offset,
            },
        };
        self.shared_db = Some((d, vec![db.memfd]));
    }

    /// [`Agent::share_doorbells`] over a daemon's vhost-user socket
    /// ([`crate::vhost_user::VhostUserTransport::shared_doorbells`]): the
    /// agent's memory file and the queue's kick eventfd travel with the
    /// welcome.
    pub fn share_vhost_user_doorbells(&mut self, db: crate::vhost_user::SharedDoorbells) {
        let d = proto::SharedDb {
            layout: db.layout,
            notify: proto::DbNotify::EventFd {
                region_offset: db.offset,
            },
        };
        self.shared_db = Some((d, vec![db.memfd, db.kick]));
    }

    /// What the connection manager service holds (updated by its
    /// thread; all zero before the first rdma_ucm connection).
    pub fn ucma_stats(&self) -> super::ucma::service::SharedStats {
        self.ucma_stats.clone()
    }

    /// Counters so far.
    pub fn stats(&self) -> &AgentStats {
        &self.stats
    }

    /// Serves until `stop` is set, or until the agent has had no program
    /// for its linger time. Returns the counters.
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<AgentStats> {
        let mut idle_since = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            if !self.programs.is_empty() {
                idle_since = Instant::now();
            } else if self.linger.is_some_and(|l| idle_since.elapsed() >= l) {
                tracing::info!("no programs for {:?}; exiting", self.linger);
                break;
            }
            self.wait()?;
            self.accept()?;
            let mut i = 0;
            while i < self.programs.len() {
                if self.serve(i) {
                    i += 1;
                } else {
                    self.drop_program(i);
                }
            }
            self.route_events();
        }
        Ok(self.stats.clone())
    }

    fn wait(&mut self) -> io::Result<()> {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.programs.len() + 2);
        let pfd = |fd: RawFd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds.push(pfd(self.listener.as_raw_fd()));
        fds.extend(self.programs.iter().map(|p| pfd(p.sock.as_raw_fd())));
        let ev = self.dev.event_fd();
        if let Some(e) = ev {
            fds.push(pfd(e));
        }
        let timeout = if ev.is_some() {
            IDLE_INTERVAL
        } else {
            POLL_INTERVAL
        };
        // SAFETY: `fds` is a live array of `fds.len()` pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, timeout.as_millis() as i32) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        if ev.is_some() && fds.last().is_some_and(|p| p.revents != 0) {
            self.dev.ack_event();
        }
        Ok(())
    }

    fn accept(&mut self) -> io::Result<()> {
        while let Some(sock) = proto::accept(&self.listener)? {
            if let Err(e) = proto::set_nonblocking(&sock) {
                tracing::warn!("a new program's socket: {e}");
                continue;
            }
            let pid = proto::peer_pid(&sock).unwrap_or(0);
            self.programs.push(Program {
                sock,
                ctx: None,
                events: None,
                _pins: None,
                shared: None,
                pid,
            });
        }
        Ok(())
    }

    /// Handles the messages waiting from program `i`; false when it is to
    /// be dropped (gone, or a protocol error).
    fn serve(&mut self, i: usize) -> bool {
        let mut buf = [0u8; proto::MAX_MSG];
        // A bounded batch per round, so one busy program cannot starve the others.
        for _ in 0..64 {
            let fd = self.programs[i].sock.as_raw_fd();
            let (n, fds) = match proto::recv(fd, &mut buf, libc::MSG_DONTWAIT) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            };
            if n == 0 {
                return false;
            }
            let ok = match (buf[0], self.programs[i].ctx) {
                (proto::MSG_HELLO, None) => self.hello(i, &buf[..n], fds),
                (proto::MSG_STATUS, None) => {
                    self.status(i);
                    // Answered; the asker is not a program.
                    return false;
                }
                (super::ucma::proto::MSG_UCMA_HELLO, None) => {
                    self.ucma_hello(i, &buf[..n]);
                    // The connection is the CM service's now.
                    return false;
                }
                (proto::MSG_CMD, Some(ctx)) => self.command(i, ctx, &buf[..n]),
                (proto::MSG_DB, Some(ctx)) => self.doorbell(ctx, &buf[..n]),
                (proto::MSG_MEMORY, Some(_))
                    if self.mode == proto::MODE_FILE && self.programs[i].shared.is_none() =>
                {
                    self.memory(i, &buf[..n], fds)
                }
                _ => false,
            };
            if !ok {
                self.stats.bad_messages += 1;
                return false;
            }
        }
        true
    }

    /// Hands an rdma_ucm connection (an event channel of vrnic's
    /// `librdmacm.so.1`) to the connection manager service, starting it
    /// at the first; the program's entry is then dropped (it has no
    /// context).
    fn ucma_hello(&mut self, i: usize, m: &[u8]) {
        if self.ucma.is_none() {
            match super::ucma::service::Service::spawn(self.path.clone(), self.ucma_stats.clone()) {
                Ok(s) => self.ucma = Some(s),
                Err(e) => {
                    tracing::warn!("starting the connection manager: {e}");
                    return;
                }
            }
        }
        match self.programs[i].sock.try_clone() {
            Ok(sock) => {
                if let Some(s) = &self.ucma {
                    s.hand_off(sock, m);
                }
            }
            Err(e) => tracing::warn!("an rdma_ucm connection: {e}"),
        }
    }

    fn hello(&mut self, i: usize, m: &[u8], fds: Vec<OwnedFd>) -> bool {
        let version = m
            .get(1..5)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes);
        let pin_fd = m
            .get(5..9)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_le_bytes);
        if version != Some(proto::VERSION) || fds.len() != 1 {
            return false;
        }
        let events = fds.into_iter().next();
        // The program's pins, held until its context is closed (physical
        // addresses only: an in-process device cannot reach a dead process,
        // and a daemon keeps a program's memory file mapped until the agent
        // withdraws it).
        let pins = match pin_fd {
            Some(fd) if fd >= 0 && self.mode == proto::MODE_PHYS => {
                match super::pin::take_fd(self.programs[i].pid, fd) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        tracing::warn!(
                            pid = self.programs[i].pid,
                            "taking the program's page pins: {e}; its pages are held only while it lives"
                        );
                        None
                    }
                }
            }
            _ => None,
        };
        // Raw, not `execute::<command::OpenCtx>`: the agent has always sent
        // `CMD_OPEN_CTX` with 8 zero bytes, which the device ignores (the
        // command has no body); kept so the bytes on the wire stay as they
        // were.
        let mut resp = [0u8; abi::MAX_CMD_BODY];
        let (status, ctx) = match self.dev.command(abi::CMD_OPEN_CTX, &[0; 8], &mut resp) {
            Ok(_) => (
                0,
                abi::Handle::read_from(&resp).map_or(0, |h| h.handle as u16),
            ),
            Err(TransportError::Status { status, .. }) => (status, 0),
            Err(e) => {
                tracing::warn!("opening a device context: {e}");
                (libc::EIO as u32, 0)
            }
        };
        let w = Welcome {
            status,
            ctx,
            mode: self.mode,
            config: self.dev.config(),
            db: self.shared_db.as_ref().map(|(d, _)| d.clone()),
        };
        let fds: Vec<RawFd> = self.shared_db.iter().flat_map(|(_, f)| f.clone()).collect();
        let p = &mut self.programs[i];
        if proto::send(p.sock.as_raw_fd(), &w.encode(), &fds, 0).is_err() || status != 0 {
            if status == 0 {
                p.ctx = Some(ctx);
            }
            return false;
        }
        p.ctx = Some(ctx);
        p.events = events;
        p._pins = pins;
        if let Some(pm) = &self.procmem {
            pm.set(ctx, p.pid);
        }
        self.stats.programs += 1;
        tracing::info!(ctx, pid = p.pid, "program connected");
        true
    }

    /// A program's memory file ([`proto::MSG_MEMORY`]): added to the
    /// device's memory unless another connection of the process shared it
    /// already; the answer says where the device reaches it. A refusal (the
    /// device's memory table is full) is answered with its errno and keeps
    /// the program connected: its open fails, and it goes.
    fn memory(&mut self, i: usize, m: &[u8], fds: Vec<OwnedFd>) -> bool {
        let len = m
            .get(1..9)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes);
        let (Some(len), [fd]) = (len, fds.as_slice()) else {
            return false;
        };
        let Ok(len) = usize::try_from(len) else {
            return false;
        };
        let id = match file_id(fd) {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!("a program's memory file: {e}");
                return false;
            }
        };
        let (status, base) = match self.files.get_mut(&id) {
            Some(f) => {
                f.users += 1;
                (0, f.gpa)
            }
            None => match self.dev.share_memory(fd.as_raw_fd(), len) {
                Ok(gpa) => {
                    self.files.insert(id, SharedFile { gpa, users: 1 });
                    (0u32, gpa)
                }
                Err(e) => {
                    tracing::warn!(
                        pid = self.programs[i].pid,
                        "sharing a program's memory: {e}"
                    );
                    (e.errno() as u32, 0)
                }
            },
        };
        let p = &mut self.programs[i];
        if status == 0 {
            p.shared = Some(id);
        }
        let mut a = vec![proto::MSG_MEMORY];
        a.extend_from_slice(&status.to_le_bytes());
        a.extend_from_slice(&base.to_le_bytes());
        proto::send(p.sock.as_raw_fd(), &a, &[], 0).is_ok()
    }

    fn status(&mut self, i: usize) {
        let usage = match self.dev.execute::<command::QueryUsage>(&()) {
            Ok((usage, _)) => usage,
            Err(e) => {
                tracing::warn!("querying the device's usage: {e}");
                abi::Usage::default()
            }
        };
        let st = proto::Status {
            programs: self.programs.iter().filter(|p| p.ctx.is_some()).count() as u32,
            pinned: self.programs.iter().filter(|p| p._pins.is_some()).count() as u32,
            usage,
        };
        let m = st.encode();
        let _ = proto::send(
            self.programs[i].sock.as_raw_fd(),
            &m,
            &[],
            libc::MSG_DONTWAIT,
        );
    }

    fn command(&mut self, i: usize, ctx: u16, m: &[u8]) -> bool {
        if m.len() < 3 || m.len() - 3 > abi::MAX_CMD_BODY {
            return false;
        }
        let opcode = u16::from_le_bytes([m[1], m[2]]);
        let mut resp = [0u8; abi::MAX_CMD_BODY];
        let (status, n) = match self.dev.command_in(ctx, opcode, &m[3..], &mut resp) {
            Ok(n) => (0, n),
            Err(TransportError::Status { status, .. }) => (status, 0),
            Err(TransportError::Timeout(_)) => (libc::ETIMEDOUT as u32, 0),
            Err(e) => {
                tracing::warn!(ctx, opcode, "command: {e}");
                (libc::EIO as u32, 0)
            }
        };
        let mut out = Vec::with_capacity(5 + n);
        out.push(proto::MSG_RESP);
        out.extend_from_slice(&status.to_le_bytes());
        out.extend_from_slice(&resp[..n]);
        // The program waits for this answer: a full socket means it is gone.
        proto::send(self.programs[i].sock.as_raw_fd(), &out, &[], 0).is_ok()
    }

    fn doorbell(&mut self, ctx: u16, m: &[u8]) -> bool {
        let Some(mut db) = m.get(1..).and_then(abi::Doorbell::read_from) else {
            return false;
        };
        db.ctx = ctx;
        if let Err(e) = self.dev.doorbell(&db) {
            tracing::warn!(ctx, "doorbell: {e}");
        }
        true
    }

    fn route_events(&mut self) {
        // Bounded: at most one event queue's worth per round.
        for _ in 0..1024 {
            let Some(ev) = self.dev.poll_event() else {
                return;
            };
            let mut msg = vec![proto::MSG_EVENT];
            msg.extend_from_slice(ev.as_bytes());
            let mut delivered = false;
            for p in &self.programs {
                if ev.ctx != abi::ALL_CTX && p.ctx != Some(ev.ctx) {
                    continue;
                }
                if let Some(e) = &p.events {
                    delivered |= proto::send(e.as_raw_fd(), &msg, &[], libc::MSG_DONTWAIT).is_ok();
                }
            }
            if !delivered {
                self.stats.events_dropped += 1;
            }
        }
    }

    /// Closes program `i`'s context, then lets its descriptors (and with
    /// them its pins) go.
    fn drop_program(&mut self, i: usize) {
        let p = self.programs.swap_remove(i);
        let Some(ctx) = p.ctx else {
            return;
        };
        let body = abi::Handle {
            handle: ctx.into(),
            reserved: 0,
        };
        match self.dev.execute::<command::CloseCtx>(&body) {
            Ok(_) => tracing::info!(ctx, pid = p.pid, "program gone; context closed"),
            Err(e) => tracing::warn!(ctx, pid = p.pid, "closing the context: {e}"),
        }
        if let Some(pm) = &self.procmem {
            pm.set(ctx, 0);
        }
        // Its memory goes only now, nothing of the context referring to
        // it, and only with the process's last connection.
        if let Some(id) = p.shared {
            if let Some(f) = self.files.get_mut(&id) {
                f.users -= 1;
                if f.users == 0 {
                    self.dev.unshare_memory(f.gpa);
                    self.files.remove(&id);
                }
            }
        }
        self.stats.closed += 1;
        drop(p);
    }
}

/// The identity of the file behind `fd`. Errors: `fstat(2)`'s.
fn file_id(fd: &OwnedFd) -> io::Result<FileId> {
    // SAFETY: stat is plain data, filled by fstat on our own descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a valid stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

impl Drop for Agent {
    fn drop(&mut self) {
        while !self.programs.is_empty() {
            self.drop_program(self.programs.len() - 1);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
