//! `vrnic-soak`: a traffic driver for soak tests (issue 9). Connects as
//! the vhost-user frontend to two running `vrnic` daemons through
//! guest-lib's verbs over its vhost-user transport
//! (`vrnic_guest::vhost_user`, the containers' driver; no QEMU), creates `--qps` RC QP pairs between them and,
//! for `--duration` seconds, keeps every QP busy in both directions with a
//! seeded mix of SEND, RDMA WRITE, RDMA WRITE with immediate and RDMA READ
//! of 1 B to 256 KiB. On `--large-qps` of the QPs (a quarter by default,
//! spread evenly) `--large-percent` of the operations (2) are large
//! instead: 1 MiB to `--large-max` (8 MiB), every kind, their buffers
//! (sources, targets, receive buffers, READ sources) sized for them, in a
//! memory region of the QP's own. Every completion's status, opcode, length and
//! immediate is checked, and every byte: destinations are filled with
//! [`POISON`] before each operation, the data is a pattern that never
//! holds that byte, and 16 guard bytes after each message must stay
//! poisoned. Prints a progress line every `--report` seconds (operations,
//! bytes, the large operations and the longest any operation took, the
//! daemons' retransmits) and exits non-zero on any error, any operation
//! older than `--op-timeout` or no progress for `--stall` seconds: every
//! wait is bounded. (In `scripts/soak.sh`, over 1% loss with the daemons'
//! debug build, the longest a large operation took was 0.8 s, 2.3 s with
//! `--large-percent 10`: far inside the 60 s bound.)
//!
//! `scripts/soak.sh` runs it between two daemons over a lossy link.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use clap::Parser;
use vrnic::abi;
use vrnic_guest::verbs::{
    Context, Cq, Mr, Pd, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RcPath, RdmaWr, RecvWr,
    SendWr, WorkCompletion, WrOpcode, QP_ATTR_ACCESS_FLAGS, QP_ATTR_PKEY_INDEX, QP_ATTR_PORT,
    QP_ATTR_STATE, SEND_SIGNALED,
};
use vrnic_guest::vhost_user::VhostUserTransport;
use vrnic_vhost::stats;

/// Page size the buffer slots are rounded to, bytes.
const PAGE: u64 = 4096;

/// The byte every destination holds before an operation; patterns never
/// contain it, so every byte of a message must have been written.
const POISON: u8 = 0xa5;
/// Largest message of the ordinary mix, bytes.
const MAX_LEN: u64 = 256 << 10;
/// Smallest large message, bytes.
const LARGE_MIN: u64 = 1 << 20;
/// The first operations of each flow of a QP with large operations: every
/// kind once, at `--large-max`.
const FIRST_LARGEST: [Kind; 4] = [Kind::Read, Kind::Write, Kind::WriteImm, Kind::Send];
/// Most bytes of memory regions per side: the device's page-list budget
/// is 8 GiB (`vrnic::device::MAX_MR_PAGES_TOTAL`), and the driver's host
/// has to hold both sides' memory.
const MAX_MR_BYTES: u64 = 4 << 30;
/// Guard bytes after a message that must stay [`POISON`].
const GUARD: u64 = 16;
/// Largest extra offset of a message in its slot (misaligned addresses).
const MAX_SKEW: u64 = 63;
/// Bytes per buffer slot for a largest message of `max_len`: the message,
/// its skew and guard, page-rounded.
fn slot_bytes(max_len: u64) -> u64 {
    max_len + PAGE
}
/// Operations outstanding per flow (QP and direction).
const DEPTH: usize = 4;
/// Receive buffers per QP (twice [`DEPTH`], so SENDs rarely meet RNR).
const RECVS: usize = 2 * DEPTH;
/// Path MTU 1024 bytes, as `ibv_mtu`.
const MTU_1024: u32 = 3;
/// All the access rights the traffic needs.
const ACCESS: u32 = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;

/// Soak traffic between two vrnic daemons.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Daemon A's vhost-user socket.
    #[arg(long)]
    a: PathBuf,
    /// Daemon B's vhost-user socket.
    #[arg(long)]
    b: PathBuf,
    /// RC QP pairs.
    #[arg(long, default_value_t = 32)]
    qps: usize,
    /// Seconds of traffic (then the outstanding operations are drained).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 10)]
    report: u64,
    /// Seed of the operation mix.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fail when one operation takes longer than this many seconds.
    #[arg(long, default_value_t = 60)]
    op_timeout: u64,
    /// QPs that carry large operations too (default: a quarter of them).
    #[arg(long)]
    large_qps: Option<usize>,
    /// Largest large operation, bytes (large ones are 1 MiB to this).
    #[arg(long, default_value_t = 8 << 20)]
    large_max: u64,
    /// Per cent of the operations on those QPs that are large.
    #[arg(long, default_value_t = 2)]
    large_percent: u64,
    /// Fail when nothing completes for this many seconds.
    #[arg(long, default_value_t = 30)]
    stall: u64,
}

/// splitmix64: the seeded generator of sizes, kinds and patterns.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `len` bytes of the pattern of `key`; never [`POISON`].
/// A word at a time, so that megabytes of it cost little even in a debug
/// build (the driver is one, like the daemon it soaks).
fn pattern(key: u64, len: usize) -> Vec<u8> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut v = Vec::with_capacity(len + 8);
    let mut i = 0u64;
    while v.len() < len {
        let w = mix(key ^ i.wrapping_mul(0x1000_0000_01b3));
        // A byte of `w` is POISON iff that byte of `x` is zero.
        let x = w ^ (ONES * u64::from(POISON));
        if x.wrapping_sub(ONES) & !x & (ONES << 7) != 0 {
            let mut b = w.to_le_bytes();
            for c in &mut b {
                if *c == POISON {
                    *c = !POISON;
                }
            }
            v.extend_from_slice(&b);
        } else {
            v.extend_from_slice(&w.to_le_bytes());
        }
        i += 1;
    }
    v.truncate(len);
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    WriteImm,
    Read,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Send => "send",
            Kind::Write => "write",
            Kind::WriteImm => "write_imm",
            Kind::Read => "read",
        }
    }
    /// Consumes a receive WQE at the responder.
    fn consumes_recv(self) -> bool {
        matches!(self, Kind::Send | Kind::WriteImm)
    }
}

/// One operation in flight.
#[derive(Debug, Clone)]
struct Op {
    kind: Kind,
    key: u64,
    len: u64,
    /// Offset of the data in the requester's slot / the responder's.
    local_off: u64,
    remote_off: u64,
    posted: Instant,
    req_done: bool,
    resp_done: bool,
}

impl Op {
    fn large(&self) -> bool {
        self.len >= LARGE_MIN
    }
}

/// One daemon with its frontend, one PD, one CQ, per QP one MR over its
/// buffers. Field order is drop order: QPs, MRs, CQ, PD, context.
struct Side {
    name: &'static str,
    qps: Vec<Qp>,
    /// Per QP: its buffers' MR, `SLOTS_PER_QP` slots of `slot[qp]` bytes.
    mrs: Vec<Mr<'static>>,
    slot: Vec<u64>,
    cq: Cq,
    _pd: Pd,
    ctx: Context,
    stats: PathBuf,
    qp_index: HashMap<u32, usize>,
    /// Per QP: the receive slot of each posted receive, by wr_id.
    recv_slots: Vec<VecDeque<u64>>,
    /// Per QP and receive slot: the bytes from its start that may hold
    /// more than [`POISON`] (none at first: the MR starts poisoned; then
    /// the last message and its guard), poisoned again when it is reposted.
    recv_dirty: Vec<Vec<u64>>,
}

/// Per QP, slots in the MR: DEPTH local (sources/READ destinations),
/// DEPTH targets (of the peer's WRITEs), RECVS receive buffers, one READ
/// source.
const SLOTS_PER_QP: u64 = (2 * DEPTH + RECVS + 1) as u64;

impl Side {
    /// Offset of slot `n` in QP `qp`'s MR.
    fn slot(&self, qp: usize, n: u64) -> u64 {
        n * self.slot[qp]
    }
    /// The longest message QP `qp`'s buffers take.
    fn max_len(&self, qp: usize) -> u64 {
        self.slot[qp] - PAGE
    }
    fn local(&self, qp: usize, s: usize) -> u64 {
        self.slot(qp, s as u64)
    }
    fn target(&self, qp: usize, s: usize) -> u64 {
        self.slot(qp, (DEPTH + s) as u64)
    }
    fn recv(&self, qp: usize, r: usize) -> u64 {
        self.slot(qp, (2 * DEPTH + r) as u64)
    }
    fn read_src(&self, qp: usize) -> u64 {
        self.slot(qp, (2 * DEPTH + RECVS) as u64)
    }
    fn write(&self, qp: usize, off: u64, data: &[u8]) -> Result<()> {
        self.mrs[qp].write(off as usize, data);
        Ok(())
    }
    fn poison(&self, qp: usize, off: u64, len: u64) -> Result<()> {
        self.write(qp, off, &vec![POISON; len as usize])
    }
    /// Checks `want` at `off` of QP `qp`'s MR followed by [`GUARD`]
    /// poisoned bytes.
    fn check(&self, qp: usize, off: u64, want: &[u8], what: &str) -> Result<()> {
        let mut got = vec![0u8; want.len() + GUARD as usize];
        self.mrs[qp].read(off as usize, &mut got);
        // The slice comparison first (a memcmp), the position only on a
        // difference.
        if got[..want.len()] != *want {
            let i = got.iter().zip(want).position(|(g, w)| g != w).unwrap_or(0);
            bail!(
                "{what}: byte {i} of {} is {:#04x}, expected {:#04x}",
                want.len(),
                got[i],
                want[i]
            );
        }
        if let Some(i) = got[want.len()..].iter().position(|&b| b != POISON) {
            bail!("{what}: byte {} past the message was written", i);
        }
        Ok(())
    }
    fn post_recv(&mut self, qp: usize, r: usize) -> Result<()> {
        let off = self.recv(qp, r);
        self.poison(qp, off, self.recv_dirty[qp][r])?;
        self.recv_dirty[qp][r] = 0;
        let sge = self.mrs[qp].sge(off as usize, (self.max_len(qp) + MAX_SKEW) as usize);
        self.qps[qp].post_recv(&RecvWr {
            wr_id: r as u64,
            sg_list: &[sge],
        })?;
        self.recv_slots[qp].push_back(r as u64);
        Ok(())
    }
    fn counters(&self) -> Result<HashMap<String, u64>> {
        let reply = stats::query(&self.stats, Duration::from_secs(5))
            .with_context(|| format!("{}: vrnic stats", self.name))?;
        Ok(stats::parse(&reply)?.into_iter().collect())
    }
}

/// Connects to the daemon at `socket`: QP `i` takes messages up to
/// `max_len[i]` bytes.
fn connect(name: &'static str, socket: &Path, max_len: &[u64]) -> Result<Side> {
    let qps = max_len.len();
    let t = VhostUserTransport::open(socket)
        .with_context(|| format!("{name}: connecting to {}", socket.display()))?;
    let ctx = Context::open(Box::new(t)).with_context(|| format!("{name}: opening the device"))?;
    let pd = Pd::alloc(&ctx)?;
    let cq = Cq::new(&ctx, (qps as u32 * 64).next_power_of_two())?;
    let slot: Vec<u64> = max_len.iter().map(|&m| slot_bytes(m)).collect();
    let mut mrs = Vec::new();
    for (i, s) in slot.iter().enumerate() {
        let mr = Mr::alloc(&pd, (SLOTS_PER_QP * s) as usize, ACCESS)
            .with_context(|| format!("{name}: the MR of QP {i} ({} bytes)", SLOTS_PER_QP * s))?;
        // Every receive slot starts poisoned (one memset for all).
        mr.fill(POISON);
        mrs.push(mr);
    }
    let mut list = Vec::new();
    let mut qp_index = HashMap::new();
    for i in 0..qps {
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let mut qp = Qp::new(&pd, &init)?;
        let attr = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ,
            ..Default::default()
        };
        qp.modify(
            &attr,
            QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS,
        )?;
        qp_index.insert(qp.qp_num(), i);
        list.push(qp);
    }
    Ok(Side {
        name,
        qps: list,
        mrs,
        recv_dirty: vec![vec![0; RECVS]; qps],
        slot,
        cq,
        _pd: pd,
        ctx,
        stats: stats::default_socket(socket),
        qp_index,
        recv_slots: vec![VecDeque::new(); qps],
    })
}

/// Operations of one direction of one QP pair.
struct Flow {
    /// The requester's side (0 = A, 1 = B) and QP index.
    req: usize,
    qp: usize,
    n: u64,
    slots: [Option<Op>; DEPTH],
    /// Operations that consume a receive, in posting order: (slot).
    recv_order: VecDeque<usize>,
    /// The responder's READ source pattern.
    read_src: Vec<u8>,
}

#[derive(Default)]
struct Totals {
    ops: [u64; 4],
    bytes: u64,
    /// Large operations (at least [`LARGE_MIN`] bytes) and their bytes.
    large_ops: u64,
    large_bytes: u64,
    /// The longest any operation, and any large one, took from posting to
    /// both ends' completions.
    max_op: Duration,
    max_large_op: Duration,
}

struct Soak {
    sides: [Side; 2],
    flows: Vec<Flow>,
    seed: u64,
    totals: Totals,
    op_timeout: Duration,
    /// Per QP: true when it carries large operations.
    large_qp: Vec<bool>,
    large_max: u64,
    large_percent: u64,
}

fn kind_index(k: Kind) -> usize {
    match k {
        Kind::Send => 0,
        Kind::Write => 1,
        Kind::WriteImm => 2,
        Kind::Read => 3,
    }
}

impl Soak {
    fn flow_of(&self, req: usize, qp: usize) -> usize {
        req * self.sides[0].qps.len() + qp
    }

    /// Posts a new operation in free slot `s` of flow `f`.
    fn post(&mut self, f: usize, s: usize) -> Result<()> {
        let fl = &mut self.flows[f];
        let (req, qp) = (fl.req, fl.qp);
        let r = mix(self.seed ^ (f as u64) << 40 ^ fl.n);
        let n = fl.n;
        fl.n += 1;
        let mut kind = match r % 100 {
            0..30 => Kind::Send,
            30..55 => Kind::Write,
            55..75 => Kind::WriteImm,
            _ => Kind::Read,
        };
        let r2 = mix(r);
        let r3 = mix(r2 ^ 0x1a2e);
        let e = (r2 >> 8) % 19; // 2^0 .. 2^18 = 256 KiB
        let mut len = 1 + (r2 >> 16) % (1u64 << e);
        if self.large_qp[qp] && n < FIRST_LARGEST.len() as u64 {
            // Each kind at its largest first, so that every bounded pool
            // and queue of the daemons reaches its high-water mark during
            // the soak's warm-up, not in the measured run (whose RSS must
            // stay flat).
            kind = FIRST_LARGEST[n as usize];
            len = self.large_max;
        } else if self.large_qp[qp] && r3 % 100 < self.large_percent {
            // 1 MiB .. large_max.
            len = LARGE_MIN + (r3 >> 8) % (self.large_max - LARGE_MIN + 1);
        }
        let local_off = (r2 >> 40) % (MAX_SKEW + 1);
        let mut remote_off = (r2 >> 48) % (MAX_SKEW + 1);
        let key = mix(r2);
        let (rs, ls) = (1 - req, req);
        if kind == Kind::Read {
            // Anywhere in the responder's READ source of this QP.
            remote_off = (r2 >> 20) % (self.sides[rs].max_len(qp) - len + 1);
        }
        let local = self.sides[ls].local(qp, s) + local_off;
        let remote = &self.sides[rs].mrs[qp];
        let (opcode, rdma, imm_data) = match kind {
            Kind::Read => {
                self.sides[ls].poison(qp, local, len + GUARD)?;
                let at = self.sides[rs].read_src(qp) + remote_off;
                let rdma = RdmaWr {
                    remote_addr: remote.addr() + at,
                    rkey: remote.rkey(),
                };
                (WrOpcode::RdmaRead, rdma, 0)
            }
            _ => {
                self.sides[ls].write(qp, local, &pattern(key, len as usize))?;
                let mut rdma = RdmaWr::default();
                if kind != Kind::Send {
                    let t = self.sides[rs].target(qp, s) + remote_off;
                    self.sides[rs].poison(qp, t, len + GUARD)?;
                    rdma = RdmaWr {
                        remote_addr: self.sides[rs].mrs[qp].addr() + t,
                        rkey: self.sides[rs].mrs[qp].rkey(),
                    };
                }
                let opcode = match kind {
                    Kind::Send => WrOpcode::Send,
                    Kind::Write => WrOpcode::RdmaWrite,
                    _ => WrOpcode::RdmaWriteWithImm,
                };
                (opcode, rdma, key as u32)
            }
        };
        let fl = &mut self.flows[f];
        fl.slots[s] = Some(Op {
            kind,
            key,
            len,
            local_off,
            remote_off,
            posted: Instant::now(),
            req_done: false,
            resp_done: !kind.consumes_recv(),
        });
        if kind.consumes_recv() {
            fl.recv_order.push_back(s);
        }
        let side = &mut self.sides[ls];
        let sge = side.mrs[qp].sge(local as usize, len as usize);
        side.qps[qp].post_send(&SendWr {
            wr_id: ((f as u64) << 8) | s as u64,
            opcode,
            send_flags: SEND_SIGNALED,
            sg_list: &[sge],
            imm_data,
            rdma,
            ..Default::default()
        })?;
        Ok(())
    }

    /// Frees slot `s` of flow `f` once both ends are done with it.
    fn maybe_free(&mut self, f: usize, s: usize) {
        let fl = &mut self.flows[f];
        if let Some(op) = &fl.slots[s] {
            if op.req_done && op.resp_done {
                let t = &mut self.totals;
                let took = op.posted.elapsed();
                t.ops[kind_index(op.kind)] += 1;
                t.bytes += op.len;
                t.max_op = t.max_op.max(took);
                if op.large() {
                    t.large_ops += 1;
                    t.large_bytes += op.len;
                    t.max_large_op = t.max_large_op.max(took);
                }
                fl.slots[s] = None;
            }
        }
    }

    /// Handles one CQE of side `side`.
    fn complete(&mut self, side: usize, c: WorkCompletion) -> Result<()> {
        let qp = *self.sides[side].qp_index.get(&c.qp_num).with_context(|| {
            format!("{}: CQE for unknown QP {}", self.sides[side].name, c.qp_num)
        })?;
        let who = format!("{} QP {} ({c:?})", self.sides[side].name, c.qp_num);
        ensure!(
            c.status == abi::WC_SUCCESS,
            "{who}: completion status {}",
            c.status
        );
        if c.opcode & abi::WC_OP_RECV != 0 {
            // A receive: the flow whose requester is the other side.
            let f = self.flow_of(1 - side, qp);
            let r = self.sides[side].recv_slots[qp]
                .pop_front()
                .with_context(|| format!("{who}: a receive completion with no receive posted"))?;
            ensure!(
                c.wr_id == r,
                "{who}: receive wr_id {} out of order (expected {r})",
                c.wr_id
            );
            let s = self.flows[f]
                .recv_order
                .pop_front()
                .with_context(|| format!("{who}: a receive completion with no SEND posted"))?;
            let op = self.flows[f].slots[s]
                .clone()
                .context("receive for a free slot")?;
            ensure!(
                c.byte_len as u64 == op.len,
                "{who}: byte_len, expected {}",
                op.len
            );
            let want = pattern(op.key, op.len as usize);
            match op.kind {
                Kind::Send => {
                    ensure!(c.opcode == abi::WC_OP_RECV, "{who}: opcode, expected RECV");
                    let off = self.sides[side].recv(qp, r as usize);
                    // The message and its guard are poisoned again when the
                    // receive is reposted.
                    self.sides[side].recv_dirty[qp][r as usize] =
                        (op.len + GUARD).min(self.sides[side].slot[qp]);
                    self.sides[side].check(qp, off, &want, &format!("{who}: SEND data"))?;
                }
                Kind::WriteImm => {
                    ensure!(
                        c.opcode == abi::WC_OP_RECV_RDMA_WITH_IMM
                            && c.wc_flags & abi::WC_WITH_IMM != 0
                            && c.imm_data == Some(op.key as u32),
                        "{who}: expected RECV_RDMA_WITH_IMM with immediate {:#x}",
                        op.key as u32
                    );
                    let off = self.sides[side].target(qp, s) + op.remote_off;
                    self.sides[side].check(qp, off, &want, &format!("{who}: WRITE_IMM data"))?;
                }
                _ => bail!("{who}: a receive for a {}", op.kind.name()),
            }
            self.sides[side].post_recv(qp, r as usize)?;
            if let Some(o) = &mut self.flows[f].slots[s] {
                o.resp_done = true;
            }
            self.maybe_free(f, s);
            return Ok(());
        }
        let f = (c.wr_id >> 8) as usize;
        let s = (c.wr_id & 0xff) as usize;
        ensure!(
            f < self.flows.len()
                && s < DEPTH
                && self.flows[f].req == side
                && self.flows[f].qp == qp,
            "{who}: wr_id {:#x} names no operation of this QP",
            c.wr_id
        );
        let op = self.flows[f].slots[s]
            .clone()
            .context("completion for a free slot")?;
        ensure!(!op.req_done, "{who}: a second completion");
        let want_op = match op.kind {
            Kind::Send => abi::WC_OP_SEND,
            Kind::Write | Kind::WriteImm => abi::WC_OP_RDMA_WRITE,
            Kind::Read => abi::WC_OP_RDMA_READ,
        };
        ensure!(
            c.opcode == want_op,
            "{who}: opcode, expected {want_op} for {}",
            op.kind.name()
        );
        let rs = 1 - side;
        match op.kind {
            Kind::Write => {
                let off = self.sides[rs].target(qp, s) + op.remote_off;
                let want = pattern(op.key, op.len as usize);
                self.sides[rs].check(
                    qp,
                    off,
                    &want,
                    &format!("{who}: WRITE data at the responder"),
                )?;
            }
            Kind::Read => {
                ensure!(
                    c.byte_len as u64 == op.len,
                    "{who}: READ byte_len, expected {}",
                    op.len
                );
                let fl = &self.flows[f];
                let want = &fl.read_src[op.remote_off as usize..(op.remote_off + op.len) as usize];
                let off = self.sides[side].local(qp, s) + op.local_off;
                self.sides[side].check(qp, off, want, &format!("{who}: READ data"))?;
            }
            _ => {}
        }
        if let Some(o) = &mut self.flows[f].slots[s] {
            o.req_done = true;
        }
        self.maybe_free(f, s);
        Ok(())
    }

    /// Polls both CQs dry; returns how many CQEs there were.
    fn poll(&mut self) -> Result<usize> {
        let mut n = 0;
        for side in 0..2 {
            loop {
                let mut wc = [WorkCompletion::default(); 16];
                let k = self.sides[side].cq.poll(&mut wc);
                for c in &wc[..k] {
                    n += 1;
                    self.complete(side, *c)?;
                }
                if k < wc.len() {
                    break;
                }
            }
        }
        Ok(n)
    }

    /// Fills every free slot; returns how many operations were posted.
    fn fill(&mut self) -> Result<usize> {
        let mut n = 0;
        for f in 0..self.flows.len() {
            for s in 0..DEPTH {
                if self.flows[f].slots[s].is_none() {
                    self.post(f, s)?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    fn outstanding(&self) -> usize {
        self.flows
            .iter()
            .map(|f| f.slots.iter().flatten().count())
            .sum()
    }

    /// The oldest operation in flight, if it is older than the bound.
    fn check_ages(&self) -> Result<()> {
        for fl in &self.flows {
            for op in fl.slots.iter().flatten() {
                let age = op.posted.elapsed();
                ensure!(
                    age <= self.op_timeout,
                    "{} QP {}: a {} of {} B outstanding for {age:?} (completed at the requester: {}, at the responder: {})",
                    self.sides[fl.req].name,
                    self.sides[fl.req].qps[fl.qp].qp_num(),
                    op.kind.name(),
                    op.len,
                    op.req_done,
                    op.resp_done
                );
            }
        }
        Ok(())
    }

    /// Sleeps until a completion event or `timeout`, arming both CQs
    /// first; fails on any event other than a completion.
    fn wait(&mut self, timeout: Duration) -> Result<()> {
        for sd in &mut self.sides {
            sd.cq.req_notify(false)?;
        }
        if self.poll()? > 0 {
            return Ok(());
        }
        let mut fds: Vec<libc::pollfd> = self
            .sides
            .iter()
            .filter_map(|sd| sd.ctx.event_fd())
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid array of pollfds for its length.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        let mut evs = Vec::new();
        for (i, sd) in self.sides.iter().enumerate() {
            sd.ctx.ack_event();
            while let Some(ev) = sd.ctx.poll_event() {
                evs.push((i, ev));
            }
        }
        for (i, ev) in evs {
            ensure!(
                ev.kind == abi::EV_COMP,
                "{}: async event {} for handle {} (info {})",
                self.sides[i].name,
                ev.kind,
                ev.handle,
                ev.info
            );
        }
        Ok(())
    }

    fn retransmits(&self) -> Result<[u64; 2]> {
        let mut r = [0; 2];
        for (i, sd) in self.sides.iter().enumerate() {
            r[i] = sd.counters()?.get("retransmits").copied().unwrap_or(0);
        }
        Ok(r)
    }

    fn progress(&self, t0: Instant, tag: &str) -> Result<()> {
        let t = &self.totals;
        let r = self.retransmits()?;
        println!(
            "soak {tag} t={}s ops={} send={} write={} write_imm={} read={} bytes={} MiB/s={:.1} large_ops={} large_bytes={} max_op_s={:.1} max_large_op_s={:.1} in_flight={} retransmits_a={} retransmits_b={}",
            t0.elapsed().as_secs(),
            t.ops.iter().sum::<u64>(),
            t.ops[0],
            t.ops[1],
            t.ops[2],
            t.ops[3],
            t.bytes,
            t.bytes as f64 / (1 << 20) as f64 / t0.elapsed().as_secs_f64().max(1e-3),
            t.large_ops,
            t.large_bytes,
            t.max_op.as_secs_f64(),
            t.max_large_op.as_secs_f64(),
            self.outstanding(),
            r[0],
            r[1]
        );
        Ok(())
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    ensure!(cli.qps >= 1 && cli.qps <= 256, "--qps must be 1..=256");
    ensure!(cli.report >= 1, "--report must be at least 1");
    let large_qps = cli.large_qps.unwrap_or(cli.qps / 4);
    ensure!(large_qps <= cli.qps, "--large-qps must be at most --qps");
    ensure!(
        (LARGE_MIN..=1 << 30).contains(&cli.large_max),
        "--large-max must be 1 MiB..=1 GiB"
    );
    ensure!(cli.large_percent <= 100, "--large-percent must be 0..=100");
    // Large QPs spread evenly: QP i is one when i * large_qps mod qps < large_qps.
    let large_qp: Vec<bool> = (0..cli.qps)
        .map(|i| large_qps > 0 && (i * large_qps) % cli.qps < large_qps)
        .collect();
    let max_len: Vec<u64> = large_qp
        .iter()
        .map(|&l| if l { cli.large_max } else { MAX_LEN })
        .collect();
    let mr_bytes: u64 = max_len.iter().map(|&m| SLOTS_PER_QP * slot_bytes(m)).sum();
    ensure!(
        mr_bytes <= MAX_MR_BYTES,
        "{mr_bytes} bytes of memory regions per side: more than {MAX_MR_BYTES} (fewer --large-qps or a smaller --large-max)"
    );
    let a = connect("A", &cli.a, &max_len)?;
    let b = connect("B", &cli.b, &max_len)?;
    let mut soak = Soak {
        sides: [a, b],
        flows: Vec::new(),
        seed: cli.seed,
        totals: Totals::default(),
        op_timeout: Duration::from_secs(cli.op_timeout),
        large_qp,
        large_max: cli.large_max,
        large_percent: cli.large_percent,
    };
    // Connect the pairs: PSNs from the seed, MTU 1024.
    for i in 0..cli.qps {
        let psn = |s: usize| (mix(cli.seed ^ (i as u64) << 1 ^ s as u64) & 0xff_ffff) as u32;
        for s in 0..2 {
            let [a, b] = &mut soak.sides;
            let (me, peer) = if s == 0 { (a, &*b) } else { (b, &*a) };
            let peer_qpn = peer.qps[i].qp_num();
            let qp = &mut me.qps[i];
            let qpn = qp.qp_num();
            let gid = peer.ctx.query_gid(1, 1)?;
            qp.connect_rc(&RcPath::new(gid, 1, peer_qpn, psn(1 - s), psn(s), MTU_1024))
                .with_context(|| format!("{}: connecting QP {qpn}", me.name))?;
        }
    }
    // Receives and READ sources.
    for s in 0..2 {
        for i in 0..cli.qps {
            for r in 0..RECVS {
                soak.sides[s].post_recv(i, r)?;
            }
        }
    }
    for req in 0..2 {
        for (i, &len) in max_len.iter().enumerate() {
            let rs = 1 - req;
            let read_src = pattern(
                mix(cli.seed ^ 0x5eed ^ ((rs * 1000 + i) as u64)),
                len as usize,
            );
            let off = soak.sides[rs].read_src(i);
            soak.sides[rs].write(i, off, &read_src)?;
            soak.flows.push(Flow {
                req,
                qp: i,
                n: 0,
                slots: Default::default(),
                recv_order: VecDeque::new(),
                read_src,
            });
        }
    }
    println!(
        "soak start: {} QP pairs, {} flows x {DEPTH} operations in flight, 1 B..{} KiB; on {large_qps} QPs {}% large, 1 MiB..{} KiB; {} MiB of MRs per side; seed {}, {} s",
        cli.qps,
        soak.flows.len(),
        MAX_LEN >> 10,
        cli.large_percent,
        cli.large_max >> 10,
        mr_bytes >> 20,
        cli.seed,
        cli.duration
    );
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(cli.duration);
    let report = Duration::from_secs(cli.report);
    let stall = Duration::from_secs(cli.stall);
    let mut next_report = t0 + report;
    let mut last_progress = Instant::now();
    let mut last_ops = 0;
    loop {
        let now = Instant::now();
        let running = now < end;
        if !running && soak.outstanding() == 0 {
            break;
        }
        if running {
            soak.fill()?;
        }
        if Instant::now() >= next_report {
            soak.progress(t0, "progress")?;
            next_report += report;
        }
        let done = soak.poll()?;
        let ops: u64 = soak.totals.ops.iter().sum();
        if done > 0 || ops != last_ops {
            last_progress = Instant::now();
            last_ops = ops;
        } else {
            ensure!(
                last_progress.elapsed() <= stall,
                "no completion for {stall:?} with {} operations in flight",
                soak.outstanding()
            );
            soak.check_ages()?;
            soak.wait(Duration::from_millis(100))?;
        }
    }
    // Every QP still in RTS.
    for sd in &soak.sides {
        for qp in &sd.qps {
            let st = qp.query()?.qp_state;
            ensure!(
                st == QpState::Rts,
                "{}: QP {} in state {st:?} at the end",
                sd.name,
                qp.qp_num()
            );
        }
    }
    soak.progress(t0, "done")?;
    println!("soak: ok");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte-at-a-time pattern the word-wise one must equal.
    fn pattern_bytewise(key: u64, len: usize) -> Vec<u8> {
        let mut v = Vec::new();
        let mut i = 0u64;
        while v.len() < len {
            v.extend_from_slice(&mix(key ^ i.wrapping_mul(0x1000_0000_01b3)).to_le_bytes());
            i += 1;
        }
        v.truncate(len);
        for b in &mut v {
            if *b == POISON {
                *b = !POISON;
            }
        }
        v
    }

    #[test]
    fn pattern_never_holds_poison_and_matches_the_bytewise_one() {
        let mut poisoned_words = 0;
        for key in 0..64u64 {
            for len in [0, 1, 7, 8, 9, 4097, 65536] {
                let p = pattern(key, len);
                assert_eq!(p.len(), len);
                assert!(!p.contains(&POISON), "key {key} len {len}");
                assert_eq!(p, pattern_bytewise(key, len), "key {key} len {len}");
            }
            // The replacement path is taken (about 3% of words hold POISON).
            poisoned_words += (0..8192u64)
                .map(|i| mix(key ^ i.wrapping_mul(0x1000_0000_01b3)).to_le_bytes())
                .filter(|w| w.contains(&POISON))
                .count();
        }
        assert!(poisoned_words > 0);
    }
}
