//! What the daemon's integration tests share: a program driving a vrnic
//! function the way programs do — guest-lib's verbs (`vrnic_guest::verbs`)
//! over its vhost-user transport (`VhostUserTransport`, the containers'
//! driver) — with the test able to end that program's connection as the
//! kernel does for a killed process ([`Conn::kill`]). Every wait is bounded
//! by [`WAIT`].
//!
//! Tests that need the vhost-user protocol itself (raw chains, pauses,
//! reconnects) use `vrnic_frontend::TestFrontend` instead.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::os::fd::RawFd;
use std::path::Path;
use std::result::Result;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vrnic::abi;
use vrnic_guest::transport::{DmaBuf, Transport, TransportError};
use vrnic_guest::verbs::*;
use vrnic_guest::vhost_user::VhostUserTransport;

/// Bound on every wait for the device.
pub const WAIT: Duration = Duration::from_secs(10);
/// Path MTU 1024 bytes, as `ibv_mtu`.
pub const MTU_1024: u32 = 3;
/// The GID a port's RoCEv2 IPv4 address has (`::ffff:a.b.c.d`).
pub const GID_INDEX: u32 = 1;
/// Every access right RC traffic needs.
pub const ALL_ACCESS: u32 = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

/// A program's connection to a function: the `VhostUserTransport` its
/// [`Context`] runs on, shared with the test.
#[derive(Clone)]
pub struct Conn(Arc<Mutex<Option<VhostUserTransport>>>);

impl Conn {
    fn lock(&self) -> MutexGuard<'_, Option<VhostUserTransport>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the daemon still holds the connection
    /// ([`VhostUserTransport::is_connected`]); false after [`Conn::kill`].
    pub fn is_connected(&self) -> bool {
        self.lock().as_ref().is_some_and(|t| t.is_connected())
    }

    /// Ends the program as `kill -9` would: the transport is dropped (the
    /// vhost-user connection closes, the shared memory is unmapped) with
    /// every verbs object still alive and nothing destroyed. From then on
    /// every command of the context fails at once.
    ///
    /// # Safety
    /// The program's CQs and QPs point into the shared memory: none may be
    /// polled or posted to afterwards, only dropped; and none of its MRs may
    /// cover memory registered with `Mr::register` (its pages would stay
    /// mapped onto the memfd), only `Mr::alloc`'s.
    pub unsafe fn kill(&self) {
        drop(self.lock().take());
    }

    /// Executes a raw control command on the program's device (for a
    /// handle the verbs API cannot name, e.g. another program's QP).
    /// Returns the response body, or the transport's error (an error status
    /// is `TransportError::Status`).
    pub fn command(&self, opcode: u16, body: &[u8]) -> Result<Vec<u8>, TransportError> {
        let mut resp = [0u8; abi::MAX_CMD_BODY];
        let n = self.with(|t| t.command(opcode, body, &mut resp))?;
        Ok(resp[..n].to_vec())
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut VhostUserTransport) -> Result<T, TransportError>,
    ) -> Result<T, TransportError> {
        match self.lock().as_mut() {
            Some(t) => f(t),
            None => Err(TransportError::NoDevice("the program was killed".into())),
        }
    }
}

/// The [`Transport`] a program's [`Context`] runs on: the shared
/// `VhostUserTransport`, or nothing once the program was killed.
struct Shared {
    conn: Conn,
    config: abi::ConfigSpace,
}

impl Transport for Shared {
    fn config(&self) -> abi::ConfigSpace {
        self.config
    }
    fn command(
        &mut self,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        self.conn.with(|t| t.command(opcode, body, resp))
    }
    fn command_in(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        self.conn.with(|t| t.command_in(ctx, opcode, body, resp))
    }
    fn doorbell(&mut self, db: &abi::Doorbell) -> Result<(), TransportError> {
        self.conn.with(|t| t.doorbell(db))
    }
    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        self.conn.with(|t| t.alloc_dma(len, align))
    }
    fn release_dma(&mut self, buf: DmaBuf) {
        // A killed program's memory went with it.
        let _ = self.conn.with(|t| {
            t.release_dma(buf);
            Ok(())
        });
    }
    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        self.conn.with(|t| t.virt_to_phys(va))
    }
    fn page_size(&self) -> usize {
        self.conn.lock().as_ref().map_or(4096, |t| t.page_size())
    }
    fn poll_event(&mut self) -> Option<abi::Event> {
        self.conn.lock().as_mut().and_then(|t| t.poll_event())
    }
    fn event_fd(&self) -> Option<RawFd> {
        self.conn.lock().as_ref().and_then(|t| t.event_fd())
    }
    fn ack_event(&mut self) {
        if let Some(t) = self.conn.lock().as_mut() {
            t.ack_event();
        }
    }
    fn yield_when_idle(&self) -> bool {
        self.conn
            .lock()
            .as_ref()
            .is_some_and(|t| t.yield_when_idle())
    }
    fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        self.conn.with(|t| t.map_user(va, len))
    }
    fn needs_locked_pages(&self) -> bool {
        self.conn
            .lock()
            .as_ref()
            .is_some_and(|t| t.needs_locked_pages())
    }
    fn unmap_user(&mut self, va: usize, len: usize) {
        if let Some(t) = self.conn.lock().as_mut() {
            t.unmap_user(va, len);
        }
    }
}

/// A program on the function at `socket`: its context, over
/// `VhostUserTransport::open(socket)`, and its connection.
pub fn open(socket: &Path) -> (Context, Conn) {
    let t = VhostUserTransport::open(socket)
        .unwrap_or_else(|e| panic!("vhost-user transport on {}: {e}", socket.display()));
    let config = t.config();
    let conn = Conn(Arc::new(Mutex::new(Some(t))));
    let shared = Shared {
        conn: conn.clone(),
        config,
    };
    let ctx = Context::open(Box::new(shared)).expect("context opens");
    (ctx, conn)
}

/// An RC QP in RESET completing on `cq`: 16 send and 16 receive work
/// requests of up to 2 SGEs, no inline data, completions only for
/// signalled sends.
pub fn rc_qp(pd: &Pd, cq: &Cq) -> Qp {
    let init = QpInitAttr {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    Qp::new(pd, &init).expect("CREATE_QP")
}

/// The port's RoCEv2 IPv4 GID ([`GID_INDEX`]) of `ctx`'s device, as
/// `ibv_rc_pingpong -g 1` sends it to its peer.
pub fn gid(ctx: &Context) -> Gid {
    ctx.query_gid(1, GID_INDEX).expect("QUERY_GID")
}

/// The far end of an RC connection.
#[derive(Clone, Copy, Debug)]
pub struct Peer {
    /// The peer's GID (see [`gid`]).
    pub gid: Gid,
    /// The peer's QP number.
    pub qpn: u32,
    /// The PSN the peer sends first.
    pub psn: u32,
}

/// Takes `qp` RESET → INIT → RTR → RTS towards `peer` with
/// `ibv_rc_pingpong`'s attributes (path MTU 1024, GID index 1, hop limit
/// 64, ACK timeout 14, 7 retries, infinite RNR retries, one READ or atomic
/// outstanding each way), remote read and write allowed; it sends from
/// `my_psn`.
pub fn connect_rc(qp: &mut Qp, peer: Peer, my_psn: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL_ACCESS,
        ..Default::default()
    };
    qp.modify(
        &init,
        QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS,
    )
    .expect("RESET -> INIT");
    qp.connect_rc(&RcPath::new(
        peer.gid,
        GID_INDEX as u8,
        peer.qpn,
        peer.psn,
        my_psn,
        MTU_1024,
    ))
    .expect("INIT -> RTR -> RTS");
}

/// The next `n` completions of `cq`; panics, naming `what`, when they have
/// not all come within [`WAIT`].
pub fn wait_cq_n(cq: &mut Cq, n: usize, what: &str) -> Vec<WorkCompletion> {
    let got = cq.poll_wait(n, WAIT);
    assert_eq!(
        got.len(),
        n,
        "{what}: {} of {n} completions after {WAIT:?}: {got:?}",
        got.len()
    );
    got
}

/// The next completion of `cq` (see [`wait_cq_n`]).
pub fn wait_cq(cq: &mut Cq, what: &str) -> WorkCompletion {
    wait_cq_n(cq, 1, what)[0]
}

/// A SEND of `sge`, signalled, as work request `wr_id`.
pub fn send(qp: &mut Qp, wr_id: u64, sge: Sge) {
    qp.post_send(&SendWr {
        wr_id,
        opcode: WrOpcode::Send,
        send_flags: SEND_SIGNALED,
        sg_list: &[sge],
        ..Default::default()
    })
    .expect("post SEND");
}

/// A receive into `sge` (none: a receive for an immediate alone) as work
/// request `wr_id`.
pub fn recv(qp: &mut Qp, wr_id: u64, sge: Option<Sge>) {
    let sges: Vec<Sge> = sge.into_iter().collect();
    qp.post_recv(&RecvWr {
        wr_id,
        sg_list: &sges,
    })
    .expect("post RECV");
}

/// `len` zeroed bytes of the program's memory holding `data` at their
/// start, registered with [`ALL_ACCESS`].
pub fn buffer(pd: &Pd, len: usize, data: &[u8]) -> Mr<'static> {
    let mr = Mr::alloc(pd, len, ALL_ACCESS).expect("REG_MR");
    mr.write(0, data);
    mr
}

/// A byte pattern of `len` bytes that differs with `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Waits up to `timeout` until one of `ctxs` has an event (one thread
/// driving several devices, as `vrnic-soak` does): takes every event
/// already there, and only if there was none sleeps on the contexts'
/// event descriptors at once. Returns `(index into ctxs, event)`; empty
/// when none came in time. Arm the CQs first (`Cq::req_notify`) to get
/// completion events.
pub fn wait_events(ctxs: &[&Context], timeout: Duration) -> Vec<(usize, abi::Event)> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut out = Vec::new();
        for (i, ctx) in ctxs.iter().enumerate() {
            ctx.ack_event();
            while let Some(ev) = ctx.poll_event() {
                out.push((i, ev));
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if !out.is_empty() || left.is_zero() {
            return out;
        }
        let mut pfds: Vec<libc::pollfd> = ctxs
            .iter()
            .map(|c| libc::pollfd {
                fd: c.event_fd().expect("a vhost-user context has an event fd"),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: `pfds` holds `pfds.len()` valid pollfds.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    }
}

/// Open descriptors of this process (`/proc/self/fd`).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Mappings of memfds in this process: guest memory a daemon maps.
pub fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| l.contains("/memfd:"))
        .count()
}

/// Threads of this process (`/proc/self/task`).
pub fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// Waits (bounded by [`WAIT`]) until `f` gives `want`; the last value.
pub fn settle(want: usize, f: fn() -> usize) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = f();
        if got == want || Instant::now() >= deadline {
            return got;
        }
        std::thread::yield_now();
    }
}

/// A fresh directory under the system's temporary directory, named after
/// `tag` and this process, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// Creates `vrnic-test-TAG-PID`, replacing what a crashed earlier run
    /// left there.
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("vrnic-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
