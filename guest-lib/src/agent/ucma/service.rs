//! The connection manager service thread: one `poll(2)` loop over every
//! rdma_ucm connection (one per event channel), the completions of the
//! function's GSI QP (QP1) and the CM's timers; no thread per connection.
//!
//! The agent's main loop hands it each connection whose first message is
//! [`MSG_UCMA_HELLO`](super::proto::MSG_UCMA_HELLO) ([`Service::hand_off`]: a channel and an eventfd
//! wake-up). The service reaches the device as an ordinary program of its
//! own agent ([`AgentTransport`] to the agent's socket, a device context
//! of its own), opened when the first channel arrives and closed when no
//! channel, connection or timewait remains, so the agent's verbs path is
//! untouched and its linger still ends it. That works in the agent's three
//! memory modes as any program does; the tests cover
//! [`crate::agent::proto::MODE_PROCESS`].

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use vrnic_cm::{Outgoing, Source};
use vrnic_wire::MAD_LEN;

use super::core::{DeviceInfo, Ucma, MAX_CHANNELS};
use super::proto::{self as uproto, MAX_UCMA_MSG, MSG_UCMA_CMD, UCMA_VERSION};
use crate::agent::client::AgentTransport;
use crate::agent::proto;
use crate::verbs::{
    grh_sgid, Ah, AhAttr, Context, Cq, Gid, Mr, Pd, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendWr, UdWr, WrOpcode, ACCESS_LOCAL_WRITE, GRH_LEN, QP_ATTR_PKEY_INDEX, QP_ATTR_PORT,
    QP_ATTR_QKEY, QP_ATTR_SQ_PSN, QP_ATTR_STATE, SEND_SIGNALED,
};

/// QP1 receive slots (each a GRH area and a MAD).
const RECV_SLOTS: usize = 32;
/// QP1 send slots.
const SEND_SLOTS: usize = 32;
const RECV_SLOT: usize = 512;
const SEND_AT: usize = RECV_SLOTS * RECV_SLOT;
/// MADs waiting for a free send slot; beyond it one is dropped (the CM
/// retransmits, as after a lost MAD).
const MAX_PENDING_MADS: usize = 1024;
/// The CA ACK delay exponent the CM uses (rxe's 15).
const CA_ACK_DELAY: u8 = 15;
/// The longest the loop sleeps.
const MAX_SLEEP: Duration = Duration::from_millis(500);

/// What the service holds, published after every round of its loop.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UcmaStats {
    /// Open event channels.
    pub channels: usize,
    /// rdma_cm ids.
    pub ids: usize,
    /// IB CM connections (timewait included).
    pub connections: usize,
    /// Whether the service holds its device context (QP1).
    pub device_open: bool,
    /// Events dropped: a channel's queue was full.
    pub events_dropped: u64,
    /// Connections closed for sending garbage.
    pub bad_connections: u64,
}

/// Where the service publishes its [`UcmaStats`].
pub type SharedStats = Arc<std::sync::Mutex<UcmaStats>>;

/// The handle the agent keeps: hands connections to the thread.
pub struct Service {
    tx: mpsc::Sender<(OwnedFd, Vec<u8>)>,
    wake: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
}

/// An eventfd, non-blocking (the service's own wake) or blocking (a
/// channel's wake descriptor: the library reads `O_NONBLOCK` on it as the
/// application's choice, as on rdma-core's device file).
fn eventfd(nonblock: bool) -> io::Result<OwnedFd> {
    let flags = libc::EFD_CLOEXEC | if nonblock { libc::EFD_NONBLOCK } else { 0 };
    // SAFETY: eventfd(2) with valid flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn efd_add(fd: RawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer to an eventfd.
    let _ = unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
}

/// Zeroes eventfd `fd`'s counter if it is readable; never blocks, whether
/// or not the descriptor is non-blocking (a channel's may be blocking, or
/// made non-blocking by the application sharing it).
fn efd_clear(fd: RawFd) {
    if !matches!(proto::wait_readable(fd, Duration::ZERO), Ok(true)) {
        return;
    }
    let mut b = [0u8; 8];
    // SAFETY: reads 8 bytes into a live buffer from an eventfd that poll
    // just found readable (only this thread reads it).
    let _ = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 8) };
}

impl Service {
    /// Starts the service thread for the agent listening at
    /// `agent_socket`. Errors: the eventfd or the thread cannot be made.
    /// It publishes what it holds in `stats`.
    pub fn spawn(agent_socket: PathBuf, stats: SharedStats) -> io::Result<Service> {
        let (tx, rx) = mpsc::channel();
        let wake = Arc::new(eventfd(true)?);
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s) = (wake.clone(), stop.clone());
        std::thread::Builder::new()
            .name("vrnic-ucma".into())
            .spawn(move || Thread::new(agent_socket, rx, w, s, stats).run())?;
        Ok(Service { tx, wake, stop })
    }

    /// Hands the service connection `sock`, whose first message `hello`
    /// was [`MSG_UCMA_HELLO`](super::proto::MSG_UCMA_HELLO).
    pub fn hand_off(&self, sock: OwnedFd, hello: &[u8]) {
        if self.tx.send((sock, hello.to_vec())).is_ok() {
            efd_add(self.wake.as_raw_fd());
        }
    }
}

impl Drop for Service {
    /// Stops the thread without waiting for it (it may be waiting for
    /// this agent's answer to a device command).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        efd_add(self.wake.as_raw_fd());
    }
}

/// One rdma_ucm connection.
struct Conn {
    sock: OwnedFd,
    /// The wake descriptor (the library holds a duplicate).
    wake: OwnedFd,
    chan: u32,
    woken: bool,
}

/// The service's QP1.
struct Device {
    ctx: Context,
    _pd: Pd,
    mr: Mr<'static>,
    cq: Cq,
    qp: Qp,
    ahs: HashMap<[u8; 16], Ah>,
    free_send: Vec<usize>,
    pending: VecDeque<Outgoing>,
    info: DeviceInfo,
    /// Whether the CQ is armed for a completion event.
    armed: bool,
}

impl Device {
    fn open(path: &std::path::Path) -> Result<Device, String> {
        let t = AgentTransport::connect(path).map_err(|e| format!("connecting: {e}"))?;
        let ctx = Context::open(Box::new(t)).map_err(|e| format!("opening: {e}"))?;
        let dev = ctx.query_device().map_err(|e| e.to_string())?;
        let port = ctx.query_port(1).map_err(|e| e.to_string())?;
        let mut gids = Vec::new();
        for i in 0..port.gid_tbl_len.min(16) {
            if let Ok(g) = ctx.query_gid(1, i) {
                if !g.is_zero() {
                    gids.push((i as u8, g.raw));
                }
            }
        }
        let info = DeviceInfo {
            gids,
            node_guid: dev.node_guid,
            mtu: port.active_mtu.clamp(1, 5) as u8,
            ca_ack_delay: CA_ACK_DELAY,
        };
        let pd = Pd::alloc(&ctx).map_err(|e| e.to_string())?;
        let len = SEND_AT + SEND_SLOTS * MAD_LEN;
        let mr = Mr::alloc(&pd, len, ACCESS_LOCAL_WRITE).map_err(|e| e.to_string())?;
        let cq = Cq::new(&ctx, (RECV_SLOTS + SEND_SLOTS) as u32).map_err(|e| e.to_string())?;
        let init = QpInitAttr {
            qp_type: QpType::Gsi,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: SEND_SLOTS as u32,
                max_recv_wr: RECV_SLOTS as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let mut qp = Qp::new(&pd, &init).map_err(|e| format!("the GSI QP: {e}"))?;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey: vrnic_abi::GSI_QKEY,
            ..Default::default()
        };
        qp.modify(
            &a,
            QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_QKEY,
        )
        .map_err(|e| e.to_string())?;
        a.qp_state = QpState::Rtr;
        qp.modify(&a, QP_ATTR_STATE).map_err(|e| e.to_string())?;
        a.qp_state = QpState::Rts;
        a.sq_psn = 0;
        qp.modify(&a, QP_ATTR_STATE | QP_ATTR_SQ_PSN)
            .map_err(|e| e.to_string())?;
        let mut d = Device {
            ctx,
            _pd: pd,
            mr,
            cq,
            qp,
            ahs: HashMap::new(),
            free_send: (0..SEND_SLOTS).collect(),
            pending: VecDeque::new(),
            info,
            armed: false,
        };
        for i in 0..RECV_SLOTS {
            d.repost(i)?;
        }
        d.cq.req_notify(false).map_err(|e| e.to_string())?;
        d.armed = true;
        Ok(d)
    }

    fn repost(&mut self, slot: usize) -> Result<(), String> {
        self.qp
            .post_recv(&RecvWr {
                wr_id: slot as u64,
                sg_list: &[self.mr.sge(slot * RECV_SLOT, GRH_LEN + MAD_LEN)],
            })
            .map_err(|e| e.to_string())
    }

    /// Sends what waits, as send slots allow.
    fn send(&mut self, ucma: &mut Ucma) {
        while let Some(m) = ucma.pop_mad() {
            if self.pending.len() >= MAX_PENDING_MADS {
                self.pending.pop_front();
            }
            self.pending.push_back(m);
        }
        while let Some(slot) = self.free_send.last().copied() {
            let Some(m) = self.pending.pop_front() else {
                return;
            };
            let dgid = m.to_gid.0;
            if !self.ahs.contains_key(&dgid) {
                let ip = super::sockaddr::gid_to_ip(&dgid);
                let sgid_index = self
                    .info
                    .source_for(ip)
                    .and_then(|s| self.info.gid_index(s))
                    .unwrap_or(0);
                let attr = AhAttr {
                    dgid: Gid { raw: dgid },
                    sgid_index,
                    hop_limit: super::core::HOP_LIMIT,
                    is_global: true,
                    port_num: 1,
                    ..Default::default()
                };
                match Ah::new(&self._pd, &attr) {
                    Ok(ah) => {
                        // Bounded: one AH per peer, at most the CM's peers.
                        if self.ahs.len() >= 4096 {
                            self.ahs.clear();
                        }
                        self.ahs.insert(dgid, ah);
                    }
                    Err(e) => {
                        tracing::warn!("an AH to a CM peer: {e}");
                        continue;
                    }
                }
            }
            let off = SEND_AT + slot * MAD_LEN;
            self.mr.write(off, &m.mad);
            let ah = self.ahs[&dgid].handle();
            let r = self.qp.post_send(&SendWr {
                wr_id: (RECV_SLOTS + slot) as u64,
                opcode: WrOpcode::Send,
                send_flags: SEND_SIGNALED,
                sg_list: &[self.mr.sge(off, MAD_LEN)],
                ud: UdWr {
                    ah,
                    remote_qpn: m.dest_qpn,
                    remote_qkey: 0x8000_0000,
                },
                ..Default::default()
            });
            match r {
                Ok(()) => {
                    self.free_send.pop();
                }
                Err(e) => {
                    tracing::warn!("sending a MAD on QP1: {e}");
                    return;
                }
            }
        }
    }

    /// Handles QP1's completions and the device's events; false when the
    /// device is gone (the agent closed this context).
    fn complete(&mut self, ucma: &mut Ucma, now: u64) -> bool {
        let mut alive = true;
        for _ in 0..1024 {
            match self.ctx.poll_event() {
                Some(e) if e.kind == vrnic_abi::EV_DEVICE_FATAL => alive = false,
                // The CQ's arm was used up.
                Some(e) if e.kind == vrnic_abi::EV_COMP => self.armed = false,
                Some(_) => {}
                None => break,
            }
        }
        if !alive {
            return false;
        }
        let mut wc = [crate::verbs::WorkCompletion::default(); 16];
        loop {
            let n = self.cq.poll(&mut wc);
            if n == 0 {
                if self.armed {
                    return true;
                }
                // Re-armed only after its event: an arm costs a doorbell.
                if self.cq.req_notify(false).is_err() {
                    return false;
                }
                self.armed = true;
                if self.cq.poll(&mut wc[..1]) == 0 {
                    return true;
                }
                // A completion slipped in before the arm: handle it.
                self.one(ucma, now, &wc[0]);
                continue;
            }
            for w in &wc[..n] {
                self.one(ucma, now, w);
            }
        }
    }

    fn one(&mut self, ucma: &mut Ucma, now: u64, w: &crate::verbs::WorkCompletion) {
        let slot = w.wr_id as usize;
        if slot >= RECV_SLOTS {
            if slot - RECV_SLOTS < SEND_SLOTS {
                self.free_send.push(slot - RECV_SLOTS);
            }
            return;
        }
        if w.is_success() && w.byte_len as usize >= GRH_LEN + MAD_LEN {
            let mut buf = [0u8; GRH_LEN + MAD_LEN];
            self.mr.read(slot * RECV_SLOT, &mut buf);
            if let Some(g) = grh_sgid(&buf[..GRH_LEN]) {
                ucma.handle_mad(
                    now,
                    Source {
                        gid: vrnic_wire::Gid(g.raw),
                        qpn: w.src_qp,
                        pkey_index: 0,
                    },
                    &buf[GRH_LEN..],
                );
            }
        }
        if let Err(e) = self.repost(slot) {
            tracing::warn!("reposting a QP1 receive: {e}");
        }
    }
}

struct Thread {
    path: PathBuf,
    rx: mpsc::Receiver<(OwnedFd, Vec<u8>)>,
    wake: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    conns: Vec<Conn>,
    dev: Option<Device>,
    ucma: Option<Ucma>,
    start: Instant,
    stats: SharedStats,
    bad: u64,
}

impl Thread {
    fn new(
        path: PathBuf,
        rx: mpsc::Receiver<(OwnedFd, Vec<u8>)>,
        wake: Arc<OwnedFd>,
        stop: Arc<AtomicBool>,
        stats: SharedStats,
    ) -> Thread {
        Thread {
            path,
            rx,
            wake,
            stop,
            conns: Vec::new(),
            dev: None,
            ucma: None,
            start: Instant::now(),
            stats,
            bad: 0,
        }
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            self.wait();
            self.accept();
            let now = self.now();
            if let (Some(d), Some(u)) = (self.dev.as_mut(), self.ucma.as_mut()) {
                if !d.complete(u, now) {
                    // The device is gone: so are its connections; every
                    // channel is closed (the library sees ECONNRESET).
                    tracing::warn!("the connection manager lost its device context");
                    self.conns.clear();
                    self.ucma = None;
                    self.dev = None;
                    continue;
                }
                if u.next_timer().is_some_and(|t| t <= now) {
                    u.poll(now);
                }
            }
            let mut i = 0;
            while i < self.conns.len() {
                if self.serve(i) {
                    i += 1;
                } else {
                    let c = self.conns.swap_remove(i);
                    let now = self.now();
                    if let Some(u) = self.ucma.as_mut() {
                        u.close_channel(now, c.chan);
                    }
                }
            }
            if let (Some(d), Some(u)) = (self.dev.as_mut(), self.ucma.as_mut()) {
                d.send(u);
            }
            self.update_wakes();
            self.release_if_idle();
            self.publish();
        }
        // Stopping: every channel closes as its socket would.
        let now = self.now();
        if let (Some(d), Some(u)) = (self.dev.as_mut(), self.ucma.as_mut()) {
            for c in &self.conns {
                u.close_channel(now, c.chan);
            }
            d.send(u);
        }
    }

    fn wait(&mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.conns.len() + 2);
        let pfd = |fd: RawFd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds.push(pfd(self.wake.as_raw_fd()));
        fds.extend(self.conns.iter().map(|c| pfd(c.sock.as_raw_fd())));
        if let Some(e) = self.dev.as_ref().and_then(|d| d.ctx.event_fd()) {
            fds.push(pfd(e));
        }
        let now = self.now();
        let mut sleep = MAX_SLEEP;
        if let Some(t) = self.ucma.as_ref().and_then(|u| u.next_timer()) {
            sleep = sleep.min(Duration::from_nanos(t.saturating_sub(now)));
        }
        if self.dev.as_ref().is_some_and(|d| !d.pending.is_empty()) {
            sleep = Duration::from_millis(1);
        }
        let ms = sleep.as_millis().min(i32::MAX as u128) as i32;
        // A timer due within the millisecond: wake at once rather than sleep 0 then spin.
        let ms = if ms == 0 && !sleep.is_zero() { 1 } else { ms };
        // SAFETY: `fds` is a live array of `fds.len()` pollfds.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, ms) };
        if fds[0].revents != 0 {
            efd_clear(self.wake.as_raw_fd());
        }
        if let Some(d) = &self.dev {
            d.ctx.ack_event();
        }
    }

    fn accept(&mut self) {
        while let Ok((sock, hello)) = self.rx.try_recv() {
            let status = match uproto::decode_hello(&hello) {
                Some(UCMA_VERSION) => 0,
                _ => -libc::EPROTO,
            };
            self.add(sock, status);
        }
    }

    fn add(&mut self, sock: OwnedFd, mut status: i32) {
        if status == 0 && self.conns.len() >= MAX_CHANNELS {
            status = -libc::EMFILE;
        }
        if status == 0 && self.dev.is_none() {
            match Device::open(&self.path) {
                Ok(d) => {
                    let seed = self.start.elapsed().as_nanos() as u64
                        ^ u64::from(std::process::id()).rotate_left(32);
                    self.ucma = Some(Ucma::new(d.info.clone(), seed));
                    self.dev = Some(d);
                }
                Err(e) => {
                    tracing::warn!("the connection manager's device access: {e}");
                    status = -libc::ENODEV;
                }
            }
        }
        let chan = if status == 0 {
            self.ucma.as_mut().and_then(|u| u.open_channel())
        } else {
            None
        };
        let wake = match eventfd(false) {
            Ok(w) => w,
            Err(_) => return,
        };
        let (status, chan) = match chan {
            Some(c) => (0, c),
            None if status == 0 => (-libc::EMFILE, 0),
            None => (status, 0),
        };
        let ok = proto::send(
            sock.as_raw_fd(),
            &uproto::welcome(status, chan),
            &[wake.as_raw_fd()],
            libc::MSG_DONTWAIT,
        )
        .is_ok();
        if status != 0 || !ok {
            if status == 0 {
                let now = self.now();
                if let Some(u) = self.ucma.as_mut() {
                    u.close_channel(now, chan);
                }
            }
            return;
        }
        let _ = proto::set_nonblocking(&sock);
        self.conns.push(Conn {
            sock,
            wake,
            chan,
            woken: false,
        });
    }

    /// Executes the commands waiting on connection `i`; false when it is
    /// gone or sent garbage (it is then closed).
    fn serve(&mut self, i: usize) -> bool {
        let mut buf = vec![0u8; MAX_UCMA_MSG];
        for _ in 0..64 {
            let fd = self.conns[i].sock.as_raw_fd();
            let n = match proto::recv(fd, &mut buf, libc::MSG_DONTWAIT) {
                Ok((n, _)) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            };
            if n == 0 {
                return false;
            }
            let Some(c) = uproto::decode_command(&buf[..n]).filter(|_| buf[0] == MSG_UCMA_CMD)
            else {
                self.bad += 1;
                return false;
            };
            let now = self.now();
            let Some(u) = self.ucma.as_mut() else {
                return false;
            };
            let (ret, resp) = u.command(now, self.conns[i].chan, c.cmd, c.body, c.extra, c.out);
            // The wake descriptor agrees with the queue before the answer
            // leaves: after GET_EVENT took the last event it is no longer
            // readable.
            let has = u.has_event(self.conns[i].chan);
            Self::set_wake(&mut self.conns[i], has);
            let a = uproto::answer(ret, &resp, c.out);
            // The library waits for this answer: a full socket means it is gone.
            if proto::send(fd, &a, &[], libc::MSG_DONTWAIT).is_err() {
                return false;
            }
        }
        true
    }

    /// Makes each channel's wake descriptor readable exactly while an
    /// event waits.
    fn update_wakes(&mut self) {
        let Some(u) = self.ucma.as_ref() else {
            return;
        };
        for c in &mut self.conns {
            Self::set_wake(c, u.has_event(c.chan));
        }
    }

    fn set_wake(c: &mut Conn, has: bool) {
        if has && !c.woken {
            efd_add(c.wake.as_raw_fd());
        } else if !has && c.woken {
            efd_clear(c.wake.as_raw_fd());
        }
        c.woken = has;
    }

    fn publish(&self) {
        let u = self.ucma.as_ref();
        let st = UcmaStats {
            channels: self.conns.len(),
            ids: u.map_or(0, |u| u.id_count()),
            connections: u.map_or(0, |u| u.connection_count()),
            device_open: self.dev.is_some(),
            events_dropped: u.map_or(0, |u| u.events_dropped()),
            bad_connections: self.bad,
        };
        if let Ok(mut s) = self.stats.lock() {
            *s = st;
        }
    }

    /// Closes the device when nothing needs it (no channel, no connection
    /// or timewait, nothing to send).
    fn release_if_idle(&mut self) {
        let idle = self.conns.is_empty()
            && self
                .ucma
                .as_ref()
                .is_some_and(|u| u.connection_count() == 0)
            && self
                .dev
                .as_ref()
                .is_some_and(|d| d.pending.is_empty() && d.free_send.len() == SEND_SLOTS);
        if idle {
            self.ucma = None;
            self.dev = None;
        }
    }
}
