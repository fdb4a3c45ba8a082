//! A minimal driver for engine tests: builds rings, WQEs and commands in a
//! [`VecMemory`] exactly as guest-lib does in a VM, and pumps frames between
//! two devices over an in-memory link pair on a simulated clock.
#![allow(dead_code)]

use vrnic::abi::{self, Pod};
use vrnic::batch;
use vrnic::device::{Device, DeviceConfig, Nanos};
use vrnic::link::fault::{FaultConfig, FaultLink, FaultRates};
use vrnic::link::mem::MemLink;
use vrnic::link::Link;
use vrnic::mem::{self, DmaMemory, VecMemory};
use vrnic::wire;

pub const MEM_BASE: u64 = 0x10_0000;
pub const MEM_SIZE: usize = 64 << 20;

pub struct Node {
    pub dev: Device,
    pub mem: std::sync::Arc<VecMemory>,
    pub link: Box<dyn Link>,
    next: u64,
    pub ip: std::net::Ipv4Addr,
    /// The node's simulated clock: the time of the last [`Node::pump`],
    /// at which [`Node::cmd`] runs commands.
    pub now: Nanos,
    /// The device context [`Node::cmd`] and the doorbells act for
    /// (`abi::DEFAULT_CTX` unless a test opens another).
    pub ctx: u16,
}

pub struct Qp {
    pub qpn: u32,
    pub sq: u64,
    pub rq: u64,
    pub rec: u64,
    pub sq_stride: u32,
    pub rq_stride: u32,
    pub sq_size: u32,
    pub rq_size: u32,
    pub sq_pi: u32,
    pub rq_pi: u32,
}

/// What [`Node::create_qp_with`] creates.
#[derive(Clone, Copy, Debug)]
pub struct QpSpec {
    /// `abi::QPT_*`.
    pub qp_type: u32,
    /// WQEs per queue (the RQ has none on an SRQ).
    pub size: u32,
    /// SGEs per send and receive WQE.
    pub sge: u32,
    /// The SRQ the QP receives from; 0: its own RQ.
    pub srqn: u32,
    /// 1: every send WQE completes (`sq_sig_all`).
    pub sq_sig_all: u32,
    /// `CreateQp::flags` (`abi::QP_F_*`).
    pub flags: u32,
}

impl QpSpec {
    /// An RC QP: 64 WQEs, 4 SGEs, own RQ, only signalled sends completing.
    pub fn rc() -> QpSpec {
        QpSpec {
            qp_type: abi::QPT_RC,
            size: 64,
            sge: 4,
            srqn: 0,
            sq_sig_all: 0,
            flags: 0,
        }
    }

    /// A QP of `qp_type` whose every send completes, on SRQ `srqn` (0: none).
    pub fn typed(qp_type: u32, srqn: u32) -> QpSpec {
        QpSpec {
            qp_type,
            srqn,
            sq_sig_all: 1,
            ..QpSpec::rc()
        }
    }
}

pub struct Cq {
    pub cqn: u32,
    pub ring: u64,
    pub db: u64,
    pub size: u32,
    pub ci: u32,
}

impl Node {
    pub fn new(last_octet: u8, link: Box<dyn Link>, mtu: u32) -> Node {
        let ip = std::net::Ipv4Addr::new(10, 0, 0, last_octet);
        let cfg = DeviceConfig {
            mac: [2, 0, 0, 0, 0, last_octet],
            ipv4: ip,
            prefix_len: 24,
            ipv6: Vec::new(),
            link_mtu: mtu,
        };
        Node {
            dev: Device::new(cfg),
            mem: std::sync::Arc::new(VecMemory::new(MEM_BASE, MEM_SIZE)),
            link,
            next: MEM_BASE,
            ip,
            now: 0,
            ctx: abi::DEFAULT_CTX,
        }
    }

    /// Allocates zeroed driver memory (4 KiB aligned).
    pub fn alloc(&mut self, len: usize) -> u64 {
        let gpa = self.next;
        self.next += (len as u64).div_ceil(4096) * 4096;
        assert!(
            self.next <= MEM_BASE + MEM_SIZE as u64,
            "test memory exhausted"
        );
        gpa
    }

    pub fn cmd<T: Pod>(&mut self, opcode: u16, body: &T) -> Result<Vec<u8>, u32> {
        let mut req = abi::CmdHeader {
            opcode,
            ctx: self.ctx,
            len: size_of::<T>() as u32,
        }
        .as_bytes()
        .to_vec();
        req.extend_from_slice(body.as_bytes());
        let mut resp = [0u8; 8 + abi::MAX_CMD_BODY];
        let n = self.dev.control(&self.mem, &req, &mut resp, self.now);
        assert!(n >= 8);
        let h = abi::RespHeader::read_from(&resp).unwrap();
        if h.status != 0 {
            return Err(h.status);
        }
        Ok(resp[8..n].to_vec())
    }

    pub fn handle_of(r: Vec<u8>) -> u32 {
        abi::Handle::read_from(&r).unwrap().handle
    }

    /// Opens a device context (`CMD_OPEN_CTX`, from the default context,
    /// as an agent does); `self.ctx` is left as it was.
    pub fn open_ctx(&mut self) -> u16 {
        let saved = self.ctx;
        self.ctx = abi::DEFAULT_CTX;
        let c = Self::handle_of(
            self.cmd(abi::CMD_OPEN_CTX, &abi::Handle::default())
                .unwrap(),
        );
        self.ctx = saved;
        u16::try_from(c).unwrap()
    }

    /// `CMD_CLOSE_CTX` of `ctx` from the default context; `self.ctx` is
    /// left as it was.
    pub fn close_ctx(&mut self, ctx: u16) -> Result<Vec<u8>, u32> {
        let saved = self.ctx;
        self.ctx = abi::DEFAULT_CTX;
        let r = self.cmd(
            abi::CMD_CLOSE_CTX,
            &abi::Handle {
                handle: ctx.into(),
                reserved: 0,
            },
        );
        self.ctx = saved;
        r
    }

    pub fn alloc_pd(&mut self) -> u32 {
        Self::handle_of(
            self.cmd(abi::CMD_ALLOC_PD, &abi::Handle::default())
                .unwrap(),
        )
    }

    /// Registers `[gpa, gpa+len)` with iova == gpa. Returns (lkey, rkey).
    pub fn reg_mr(&mut self, pdn: u32, gpa: u64, len: u64, access: u32) -> Result<(u32, u32), u32> {
        let first = gpa & !4095;
        let npages = (gpa + len - first).div_ceil(4096);
        let list = self.alloc(npages as usize * 8);
        for i in 0..npages {
            self.mem
                .write(list + i * 8, &(first + i * 4096).to_le_bytes())
                .unwrap();
        }
        let r = abi::RegMr {
            pdn,
            access,
            iova: gpa,
            length: len,
            page_shift: 12,
            npages: npages as u32,
            page_list: list,
        };
        let k = abi::MrKeys::read_from(&self.cmd(abi::CMD_REG_MR, &r)?).unwrap();
        Ok((k.lkey, k.rkey))
    }

    pub fn create_cq(&mut self, size: u32) -> Cq {
        let ring = self.alloc(size as usize * 32);
        let db = self.alloc(8);
        let cqn = Self::handle_of(
            self.cmd(
                abi::CMD_CREATE_CQ,
                &abi::CreateCq {
                    cqe: size,
                    reserved: 0,
                    ring,
                    db,
                },
            )
            .unwrap(),
        );
        Cq {
            cqn,
            ring,
            db,
            size,
            ci: 0,
        }
    }

    /// An RC QP of `size` WQEs per queue and `sge` SGEs per WQE on `cq`,
    /// only signalled sends completing.
    pub fn create_qp(&mut self, pdn: u32, cq: &Cq, size: u32, sge: u32) -> Qp {
        let spec = QpSpec {
            size,
            sge,
            ..QpSpec::rc()
        };
        self.create_qp_with(pdn, cq, spec)
    }

    /// A QP as `spec` says, on `cq` for sends and receives, its rings and
    /// record in this node's memory.
    pub fn create_qp_with(&mut self, pdn: u32, cq: &Cq, spec: QpSpec) -> Qp {
        let QpSpec {
            qp_type,
            size,
            sge,
            srqn,
            sq_sig_all,
            flags,
        } = spec;
        let (sq_stride, rq_stride) = (abi::sq_stride(sge, 64), abi::rq_stride(sge));
        let sq = self.alloc((size * sq_stride) as usize);
        let rq = self.alloc((size * rq_stride) as usize);
        // Room for both doorbell records (abi::QP_RECORD_RQ_LEN).
        let rec = self.alloc(32);
        let c = abi::CreateQp {
            pdn,
            qp_type,
            send_cqn: cq.cqn,
            recv_cqn: cq.cqn,
            sq_size: size,
            rq_size: if srqn == 0 { size } else { 0 },
            max_send_sge: sge,
            max_recv_sge: sge,
            max_inline: 64,
            sq_sig_all,
            sq,
            rq,
            db: rec,
            srqn,
            flags,
        };
        let r = abi::CreateQpResp::read_from(&self.cmd(abi::CMD_CREATE_QP, &c).unwrap()).unwrap();
        assert_eq!(r.sq_stride, sq_stride);
        if srqn == 0 {
            assert_eq!(r.rq_stride, rq_stride);
        }
        Qp {
            qpn: r.qpn,
            sq,
            rq,
            rec,
            sq_stride,
            rq_stride,
            sq_size: size,
            rq_size: size,
            sq_pi: 0,
            rq_pi: 0,
        }
    }

    /// RESET → INIT → RTR → RTS towards `peer_qpn` at `peer_ip`, as ibv_rc_pingpong does.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        &mut self,
        qp: &Qp,
        peer_ip: std::net::Ipv4Addr,
        peer_qpn: u32,
        mtu: u32,
        my_psn: u32,
        peer_psn: u32,
        retry: u8,
        rnr: u8,
    ) {
        let o = ConnOpts {
            mtu,
            my_psn,
            peer_psn,
            retry,
            rnr,
            ..ConnOpts::default()
        };
        self.connect_opts(qp, peer_ip, peer_qpn, o);
    }

    pub fn post_send(&mut self, qp: &mut Qp, wqe: abi::SendWqe, sges: &[abi::Sge], now: Nanos) {
        self.write_send(qp, wqe, sges);
        let db = abi::Doorbell {
            ctx: self.ctx,
            kind: abi::DB_SQ,
            handle: qp.qpn,
            index: qp.sq_pi,
            ..Default::default()
        };
        self.dev.doorbell(&self.mem, &db, now);
    }

    /// Writes a send WQE into the next SQ slot and moves the producer
    /// index past it, ringing no doorbell.
    pub fn write_send(&mut self, qp: &mut Qp, wqe: abi::SendWqe, sges: &[abi::Sge]) {
        let slot = qp.sq + (qp.sq_pi % qp.sq_size) as u64 * qp.sq_stride as u64;
        let w = abi::SendWqe {
            num_sge: sges.len() as u8,
            ..wqe
        };
        mem::write_obj(&self.mem, slot, &w).unwrap();
        for (i, s) in sges.iter().enumerate() {
            mem::write_obj(&self.mem, slot + 64 + 16 * i as u64, s).unwrap();
        }
        qp.sq_pi += 1;
    }

    pub fn post_recv(&mut self, qp: &mut Qp, wr_id: u64, sges: &[abi::Sge], now: Nanos) {
        self.write_recv(qp, wr_id, sges);
        let db = abi::Doorbell {
            ctx: self.ctx,
            kind: abi::DB_RQ,
            handle: qp.qpn,
            index: qp.rq_pi,
            ..Default::default()
        };
        self.dev.doorbell(&self.mem, &db, now);
    }

    /// Writes a receive WQE into the next RQ slot and moves the producer
    /// index past it, ringing no doorbell.
    pub fn write_recv(&mut self, qp: &mut Qp, wr_id: u64, sges: &[abi::Sge]) {
        let slot = qp.rq + (qp.rq_pi % qp.rq_size) as u64 * qp.rq_stride as u64;
        mem::write_obj(
            &self.mem,
            slot,
            &abi::RecvWqe {
                wr_id,
                num_sge: sges.len() as u32,
                reserved: 0,
            },
        )
        .unwrap();
        for (i, s) in sges.iter().enumerate() {
            mem::write_obj(&self.mem, slot + 16 + 16 * i as u64, s).unwrap();
        }
        qp.rq_pi += 1;
    }

    /// Polls one CQE with the owner-bit rule; updates the consumer index record.
    pub fn poll_cq(&mut self, cq: &mut Cq) -> Option<abi::Cqe> {
        let slot = cq.ring + (cq.ci % cq.size) as u64 * 32;
        let c: abi::Cqe = mem::read_obj(&self.mem, slot).unwrap();
        if c.owner != ((cq.ci / cq.size) & 1) as u8 ^ 1 {
            return None;
        }
        cq.ci += 1;
        mem::write_obj(
            &self.mem,
            cq.db,
            &abi::Handle {
                handle: cq.ci,
                reserved: 0,
            },
        )
        .unwrap();
        Some(c)
    }

    /// Moves frames: device → link, link → device. Returns frames moved.
    pub fn pump(&mut self, now: Nanos) -> usize {
        self.now = now;
        let mut moved = 0;
        self.dev.poll(&self.mem, now);
        while let Some(f) = self.dev.pop_tx() {
            let _ = self.link.send(&f);
            self.dev.recycle_tx(f);
            moved += 1;
        }
        let mut buf = vec![0u8; 10000];
        let (dev, mem) = (&mut self.dev, &self.mem);
        for _ in 0..4096 {
            // As the daemon's worker reads a link (`Link::recv_with`).
            match self.link.recv_with(&mut buf, &mut |f, icrc| {
                dev.receive_frame(mem, f, icrc, now)
            }) {
                Ok(true) => moved += 1,
                _ => break,
            }
        }
        while let Some(f) = self.dev.pop_tx() {
            let _ = self.link.send(&f);
            self.dev.recycle_tx(f);
            moved += 1;
        }
        moved
    }

    pub fn fill(&self, gpa: u64, data: &[u8]) {
        self.mem.write(gpa, data).unwrap();
    }

    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.mem.read(gpa, &mut b).unwrap();
        b
    }
}

/// Pumps both nodes on a simulated clock (advancing 1 ms per idle round)
/// until `done` holds; panics after `max_rounds` rounds.
pub fn run_until(
    a: &mut Node,
    b: &mut Node,
    now: &mut Nanos,
    max_rounds: usize,
    mut done: impl FnMut(&mut Node, &mut Node) -> bool,
) {
    for _ in 0..max_rounds {
        if done(a, b) {
            return;
        }
        let moved = a.pump(*now) + b.pump(*now);
        if moved == 0 {
            *now += 1_000_000;
        }
    }
    panic!("condition not reached within {max_rounds} rounds");
}

pub fn pair(mtu: u32) -> (Node, Node) {
    let (la, lb) = MemLink::pair();
    (
        Node::new(1, Box::new(la), mtu),
        Node::new(2, Box::new(lb), mtu),
    )
}

/// Two nodes whose links drop, duplicate, reorder and corrupt frames they
/// send at `rates`, deterministically from `seed`.
pub fn lossy_pair(mtu: u32, seed: u64, rates: FaultRates) -> (Node, Node) {
    let (la, lb) = MemLink::pair_with_depth(1 << 16);
    faulty_nodes(Box::new(la), Box::new(lb), mtu, seed, rates)
}

/// Nodes 1 and 2 on `la` and `lb`, each link wrapped in a [`FaultLink`]
/// faulting the frames it sends at `rates` (seeded from `seed`, differently
/// per side).
fn faulty_nodes(
    la: Box<dyn Link>,
    lb: Box<dyn Link>,
    mtu: u32,
    seed: u64,
    rates: FaultRates,
) -> (Node, Node) {
    let cfg = |seed| FaultConfig {
        seed,
        tx: rates,
        rx: FaultRates::default(),
    };
    let fa = FaultLink::new(la, cfg(seed)).unwrap();
    let fb = FaultLink::new(lb, cfg(seed ^ 0x9e37_79b9_7f4a_7c15)).unwrap();
    (
        Node::new(1, Box::new(fa), mtu),
        Node::new(2, Box::new(fb), mtu),
    )
}

/// One end of a plain in-memory link: an unbounded FIFO each way, no
/// eventfd and no lock contention (one test thread drives both ends), so the
/// long lossy runs spend their time in the engine, not in syscalls. Frames
/// arrive in the order sent; faults come from a [`FaultLink`] around it.
pub struct QueueLink {
    tx: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Vec<u8>>>>,
    rx: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<Vec<u8>>>>,
}

impl QueueLink {
    pub fn pair() -> (QueueLink, QueueLink) {
        let ab = std::sync::Arc::default();
        let ba = std::sync::Arc::default();
        (
            QueueLink {
                tx: std::sync::Arc::clone(&ab),
                rx: std::sync::Arc::clone(&ba),
            },
            QueueLink { tx: ba, rx: ab },
        )
    }
}

impl Link for QueueLink {
    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.tx.lock().unwrap().push_back(frame.to_vec());
        Ok(())
    }

    fn receive(&mut self, rx: vrnic::link::Rx<'_>) -> std::io::Result<Option<usize>> {
        rx.read(|buf| {
            let Some(f) = self.rx.lock().unwrap().pop_front() else {
                return Ok(None);
            };
            let n = f.len().min(buf.len());
            buf[..n].copy_from_slice(&f[..n]);
            Ok(Some(n))
        })
    }
}

/// As [`lossy_pair`], over a [`QueueLink`] pair (no eventfd per frame).
pub fn lossy_queue_pair(mtu: u32, seed: u64, rates: FaultRates) -> (Node, Node) {
    let (la, lb) = QueueLink::pair();
    faulty_nodes(Box::new(la), Box::new(lb), mtu, seed, rates)
}

/// As [`run_until`], but returns whether `done` held within `max_rounds`
/// instead of panicking, so the caller can report its own context (seed,
/// operation) on failure.
pub fn try_run_until(
    a: &mut Node,
    b: &mut Node,
    now: &mut Nanos,
    max_rounds: usize,
    mut done: impl FnMut(&mut Node, &mut Node) -> bool,
) -> bool {
    for _ in 0..max_rounds {
        if done(a, b) {
            return true;
        }
        let moved = a.pump(*now) + b.pump(*now);
        if moved == 0 {
            *now += 1_000_000;
        }
    }
    done(a, b)
}

/// Connection attributes for [`Node::connect_opts`] (the defaults are the
/// ones [`Node::connect`] uses).
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    /// Path MTU enum (1 = 256 ... 5 = 4096).
    pub mtu: u32,
    pub my_psn: u32,
    pub peer_psn: u32,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub timeout: u8,
    pub retry: u8,
    pub rnr: u8,
    /// RNR NAK timer this QP asks its peer to wait (IBTA Table 45 code).
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            mtu: 3,
            my_psn: 0,
            peer_psn: 0,
            timeout: 14,
            retry: 7,
            rnr: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 1,
        }
    }
}

/// The INIT, RTR and RTS attributes, in that order, that take QP `qpn`
/// from RESET to RTS towards `peer_qpn` at `peer_ip` with every attribute
/// of [`ConnOpts`] ([`Node::connect_opts`] applies them).
pub fn conn_attrs(
    qpn: u32,
    peer_ip: std::net::Ipv4Addr,
    peer_qpn: u32,
    o: ConnOpts,
) -> [abi::QpAttr; 3] {
    let all = abi::ACCESS_LOCAL_WRITE
        | abi::ACCESS_REMOTE_WRITE
        | abi::ACCESS_REMOTE_READ
        | abi::ACCESS_REMOTE_ATOMIC;
    let init = abi::QpAttr {
        qpn,
        attr_mask: abi::QP_ATTR_STATE
            | abi::QP_ATTR_PKEY_INDEX
            | abi::QP_ATTR_PORT
            | abi::QP_ATTR_ACCESS_FLAGS,
        qp_state: abi::QPS_INIT,
        port_num: 1,
        qp_access_flags: all,
        ..Default::default()
    };
    let rtr = abi::QpAttr {
        qpn,
        attr_mask: abi::QP_ATTR_STATE
            | abi::QP_ATTR_AV
            | abi::QP_ATTR_PATH_MTU
            | abi::QP_ATTR_DEST_QPN
            | abi::QP_ATTR_RQ_PSN
            | abi::QP_ATTR_MAX_DEST_RD_ATOMIC
            | abi::QP_ATTR_MIN_RNR_TIMER,
        qp_state: abi::QPS_RTR,
        path_mtu: o.mtu,
        dest_qp_num: peer_qpn,
        rq_psn: o.peer_psn,
        max_dest_rd_atomic: o.max_rd_atomic,
        min_rnr_timer: o.min_rnr_timer,
        dgid: peer_ip.to_ipv6_mapped().octets(),
        sgid_index: 1,
        is_global: 1,
        hop_limit: 1,
        ..Default::default()
    };
    let rts = abi::QpAttr {
        qpn,
        attr_mask: abi::QP_ATTR_STATE
            | abi::QP_ATTR_SQ_PSN
            | abi::QP_ATTR_TIMEOUT
            | abi::QP_ATTR_RETRY_CNT
            | abi::QP_ATTR_RNR_RETRY
            | abi::QP_ATTR_MAX_QP_RD_ATOMIC,
        qp_state: abi::QPS_RTS,
        sq_psn: o.my_psn,
        timeout: o.timeout,
        retry_cnt: o.retry,
        rnr_retry: o.rnr,
        max_rd_atomic: o.max_rd_atomic,
        ..Default::default()
    };
    [init, rtr, rts]
}

impl Node {
    /// RESET → INIT → RTR → RTS with every attribute of [`ConnOpts`].
    pub fn connect_opts(
        &mut self,
        qp: &Qp,
        peer_ip: std::net::Ipv4Addr,
        peer_qpn: u32,
        o: ConnOpts,
    ) {
        for a in conn_attrs(qp.qpn, peer_ip, peer_qpn, o) {
            self.cmd(abi::CMD_MODIFY_QP, &a).unwrap();
        }
    }

    /// A UC QP from RESET to RTS towards `peer_qpn` at `peer_ip`: path MTU
    /// `mtu` (enum), both PSNs 0x100, local and remote write access (UC
    /// has no READ or atomics; IBTA §9.8).
    pub fn connect_uc(&mut self, qp: &Qp, peer_ip: std::net::Ipv4Addr, peer_qpn: u32, mtu: u32) {
        use abi::*;
        let base = QpAttr {
            qpn: qp.qpn,
            ..Default::default()
        };
        let steps = [
            QpAttr {
                attr_mask: QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS,
                qp_state: QPS_INIT,
                port_num: 1,
                qp_access_flags: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
                ..base
            },
            QpAttr {
                attr_mask: QP_ATTR_STATE
                    | QP_ATTR_AV
                    | QP_ATTR_PATH_MTU
                    | QP_ATTR_DEST_QPN
                    | QP_ATTR_RQ_PSN,
                qp_state: QPS_RTR,
                path_mtu: mtu,
                dest_qp_num: peer_qpn,
                rq_psn: 0x100,
                dgid: peer_ip.to_ipv6_mapped().octets(),
                sgid_index: 1,
                is_global: 1,
                ..base
            },
            QpAttr {
                attr_mask: QP_ATTR_STATE | QP_ATTR_SQ_PSN,
                qp_state: QPS_RTS,
                sq_psn: 0x100,
                ..base
            },
        ];
        for a in steps {
            self.cmd(CMD_MODIFY_QP, &a).unwrap();
        }
    }

    /// The QP's state as `CMD_QUERY_QP` reports it.
    pub fn qp_state(&mut self, qpn: u32) -> u32 {
        let r = self
            .cmd(
                abi::CMD_QUERY_QP,
                &abi::Handle {
                    handle: qpn,
                    reserved: 0,
                },
            )
            .unwrap();
        abi::QpAttr::read_from(&r).unwrap().qp_state
    }
}

/// One SGE.
pub fn sge(addr: u64, length: u32, lkey: u32) -> abi::Sge {
    abi::Sge { addr, length, lkey }
}

/// A signalled RDMA READ of `remote` under `rkey` (its SGEs given at
/// posting), `wr_id` its id.
pub fn read_wqe(wr_id: u64, remote: u64, rkey: u32) -> abi::SendWqe {
    abi::SendWqe {
        wr_id,
        opcode: abi::WR_RDMA_READ,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: remote,
        rkey,
        ..Default::default()
    }
}

/// Two nodes with one RC QP each (A: `qa` on `ca` in PD `pda`; B likewise),
/// driven on a simulated clock `now` (ns).
pub struct RcPair {
    pub a: Node,
    pub b: Node,
    pub qa: Qp,
    pub qb: Qp,
    pub ca: Cq,
    pub cb: Cq,
    pub pda: u32,
    pub pdb: u32,
    pub now: Nanos,
}

impl RcPair {
    /// Two nodes on `links` (link MTU 9000 for path MTU 4096, else 1500),
    /// CQs of 256 entries, QPs of 64 WQEs with 4 SGEs; A connected with
    /// `oa`, B (when `connect_b`) with the mirror image (same MTU, PSNs
    /// swapped).
    pub fn on(links: (Box<dyn Link>, Box<dyn Link>), oa: ConnOpts, connect_b: bool) -> RcPair {
        let link_mtu = if oa.mtu == 5 { 9000 } else { 1500 };
        let start = 1_000_000_000;
        let mut a = Node::new(1, links.0, link_mtu);
        let mut b = Node::new(2, links.1, link_mtu);
        (a.now, b.now) = (start, start);
        let pda = a.alloc_pd();
        let pdb = b.alloc_pd();
        let ca = a.create_cq(256);
        let cb = b.create_cq(256);
        let qa = a.create_qp(pda, &ca, 64, 4);
        let qb = b.create_qp(pdb, &cb, 64, 4);
        let (ipa, ipb) = (a.ip, b.ip);
        a.connect_opts(&qa, ipb, qb.qpn, oa);
        if connect_b {
            let ob = ConnOpts {
                my_psn: oa.peer_psn,
                peer_psn: oa.my_psn,
                ..oa
            };
            b.connect_opts(&qb, ipa, qa.qpn, ob);
        }
        RcPair {
            a,
            b,
            qa,
            qb,
            ca,
            cb,
            pda,
            pdb,
            now: start,
        }
    }

    /// Pumps both nodes, advancing the clock by `step` ns whenever nothing
    /// moved, until a CQE is on A's (`on_b` false) or B's CQ. `None` after
    /// `max_rounds` rounds.
    pub fn next_cqe_step(
        &mut self,
        on_b: bool,
        step: Nanos,
        max_rounds: usize,
    ) -> Option<abi::Cqe> {
        for _ in 0..max_rounds {
            let c = if on_b {
                self.b.poll_cq(&mut self.cb)
            } else {
                self.a.poll_cq(&mut self.ca)
            };
            if c.is_some() {
                return c;
            }
            if self.a.pump(self.now) + self.b.pump(self.now) == 0 {
                self.now += step;
            }
        }
        None
    }

    /// The next CQE on A or B (1 ms clock steps); panics with `what` when
    /// none comes within 20,000 rounds.
    pub fn cqe(&mut self, on_b: bool, what: &str) -> abi::Cqe {
        self.next_cqe_step(on_b, 1_000_000, 20_000)
            .unwrap_or_else(|| panic!("{what}: no completion within 20,000 rounds"))
    }

    /// Lets the link run for `ms` simulated milliseconds of idleness and
    /// checks that neither CQ receives anything more.
    pub fn assert_quiet(&mut self, ms: u64, what: &str) {
        let until = self.now + ms * 1_000_000;
        for _ in 0..100_000 {
            if self.now >= until {
                break;
            }
            if self.a.pump(self.now) + self.b.pump(self.now) == 0 {
                self.now += 1_000_000;
            }
        }
        assert_eq!(self.a.poll_cq(&mut self.ca), None, "{what}: extra CQE on A");
        assert_eq!(self.b.poll_cq(&mut self.cb), None, "{what}: extra CQE on B");
    }

    /// Posts a send WQE on A's QP.
    pub fn post(&mut self, wqe: abi::SendWqe, sges: &[abi::Sge]) {
        let now = self.now;
        self.a.post_send(&mut self.qa, wqe, sges, now);
    }
}

/// Frames in flight one way, and spare buffers.
#[derive(Default)]
pub struct Wire {
    pub frames: std::collections::VecDeque<Vec<u8>>,
    pub spare: Vec<Vec<u8>>,
}

/// One end of a buffer-recycling in-memory link (unbounded: the RC window
/// bounds it).
pub struct PoolLink {
    tx: std::sync::Arc<std::sync::Mutex<Wire>>,
    rx: std::sync::Arc<std::sync::Mutex<Wire>>,
}

pub fn pool_pair() -> (PoolLink, PoolLink) {
    let (ab, ba) = (std::sync::Arc::default(), std::sync::Arc::default());
    (
        PoolLink {
            tx: std::sync::Arc::clone(&ab),
            rx: std::sync::Arc::clone(&ba),
        },
        PoolLink { tx: ba, rx: ab },
    )
}

impl Link for PoolLink {
    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        let mut w = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let mut b = w.spare.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(frame);
        w.frames.push_back(b);
        Ok(())
    }

    fn receive(&mut self, rx: vrnic::link::Rx<'_>) -> std::io::Result<Option<usize>> {
        rx.read(|buf| {
            let mut w = self.rx.lock().unwrap_or_else(|e| e.into_inner());
            let Some(f) = w.frames.pop_front() else {
                return Ok(None);
            };
            let n = f.len().min(buf.len());
            buf[..n].copy_from_slice(&f[..n]);
            w.spare.push(f);
            Ok(Some(n))
        })
    }
}

impl RcPair {
    /// A second RC QP pair between A and B, on the same PDs and CQs as
    /// the first, connected with `o` (B with its mirror image).
    pub fn second_pair(&mut self, o: ConnOpts) -> (Qp, Qp) {
        let qa = self.a.create_qp(self.pda, &self.ca, 64, 4);
        let qb = self.b.create_qp(self.pdb, &self.cb, 64, 4);
        let (ipa, ipb) = (self.a.ip, self.b.ip);
        self.a.connect_opts(&qa, ipb, qb.qpn, o);
        let ob = ConnOpts {
            my_psn: o.peer_psn,
            peer_psn: o.my_psn,
            ..o
        };
        self.b.connect_opts(&qb, ipa, qa.qpn, ob);
        (qa, qb)
    }
}

/// Every frame waiting on `n`'s link, as the link would hand it to the
/// device (with its ICRC mode), not handed to it.
pub fn take_frames(n: &mut Node) -> Vec<(Vec<u8>, vrnic::link::Icrc)> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    for _ in 0..100_000 {
        let more = n
            .link
            .recv_with(&mut buf, &mut |f, icrc| got.push((f.to_vec(), icrc)))
            .unwrap();
        if !more {
            return got;
        }
    }
    panic!("the link never ran dry");
}

/// How an RDMA WRITE's target MR goes away in [`write_across_mr_loss`].
#[derive(Clone, Copy, Debug)]
pub enum MrLoss {
    /// A's SEND with invalidate naming its rkey, on a second QP pair,
    /// executed by B (IBTA §10.6.6).
    SendWithInvalidate,
    /// B's driver deregisters it (`CMD_DEREG_MR`).
    Dereg,
}

/// What [`write_across_mr_loss`] saw.
pub struct MrLossRun {
    /// Runs of the WRITE's packets (`batch::Run`) in the frame B received
    /// again after the MR went away: the packets the run path
    /// (`responder::on_run`) got.
    pub runs_after: usize,
}

/// An RDMA WRITE of `packets` path-MTU packets (`mtu` bytes each; `o`
/// the connection's options) from A's QP into a fresh MR of B filled with
/// 0x5a, whose MR goes away (`how`) after B has executed the WRITE's
/// FIRST packet and before the rest: B gets the FIRST packet alone, then
/// the loss, then every frame of the WRITE in order (the first again: its
/// FIRST packet is a duplicate then, and the packets after it in that
/// frame, by reference between two functions of a daemon, a run). Checks
/// that only the FIRST packet's bytes landed, that B answered a remote
/// access error NAK and moved its QP to ERR, and that A's WRITE completes
/// with `IBV_WC_REM_ACCESS_ERR` (IBTA §9.7.4.1.3, §10.6.6; rxe's
/// `check_rkey` for every packet). Simulated clock; bounded waits.
pub fn write_across_mr_loss(
    s: &mut RcPair,
    o: ConnOpts,
    mtu: usize,
    packets: usize,
    how: MrLoss,
) -> MrLossRun {
    const ALL: u32 = abi::ACCESS_LOCAL_WRITE
        | abi::ACCESS_REMOTE_WRITE
        | abi::ACCESS_REMOTE_READ
        | abi::ACCESS_REMOTE_ATOMIC;
    let (qa2, mut qb2) = s.second_pair(o);
    let len = mtu * packets;
    let src = s.a.alloc(len);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8 | 1).collect();
    s.a.fill(src, &data);
    let (lk, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
    let dst = s.b.alloc(len);
    s.b.fill(dst, &vec![0x5a; len]);
    let (lk_dst, rk) = s.b.reg_mr(s.pdb, dst, len as u64, ALL).unwrap();
    // Neighbours resolved first (a WRITE of 8 bytes into the MR's last
    // 8 bytes, which the WRITE under test overwrites), so that nothing but
    // the frames under test travels later.
    let warm = abi::SendWqe {
        wr_id: 100,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: dst + len as u64 - 8,
        rkey: rk,
        ..Default::default()
    };
    s.post(warm, &[sge(src, 8, lk)]);
    let c = s.cqe(false, "the warm-up WRITE");
    assert_eq!((c.wr_id, c.status), (100, abi::WC_SUCCESS), "{c:?}");
    s.b.fill(dst + len as u64 - 8, &[0x5a; 8]);

    // B: a receive WQE on the second pair, for the SEND with invalidate.
    let rbuf = s.b.alloc(64);
    let (lk_r, _) = s.b.reg_mr(s.pdb, rbuf, 64, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut qb2, 7, &[sge(rbuf, 64, lk_r)], now);
    let write = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: dst,
        rkey: rk,
        ..Default::default()
    };
    s.post(write, &[sge(src, len as u32, lk)]);
    let mut qa2 = qa2;
    if let MrLoss::SendWithInvalidate = how {
        let inv = abi::SendWqe {
            wr_id: 2,
            opcode: abi::WR_SEND_WITH_INV,
            send_flags: abi::SEND_SIGNALED,
            imm_data: rk.to_be_bytes(),
            ..Default::default()
        };
        s.a.post_send(&mut qa2, inv, &[sge(src, 16, lk)], now);
    }
    // A sends everything the window allows; B receives none of it yet.
    for _ in 0..64 {
        if s.a.pump(now) == 0 {
            break;
        }
    }
    let frames = take_frames(&mut s.b);
    let dest = |f: &[u8], icrc| {
        wire::parse_roce_with(f, icrc)
            .map(|p| (p.hdr.bth.dest_qp, p.hdr.bth.opcode))
            .ok()
    };
    let (mut w, mut inv) = (Vec::new(), Vec::new());
    for (f, icrc) in frames {
        match dest(&f, icrc) {
            Some((q, _)) if q == s.qb.qpn => w.push((f, icrc)),
            Some((q, _)) if q == qb2.qpn => inv.push((f, icrc)),
            other => panic!("an unexpected frame for B: {other:?}"),
        }
    }
    assert!(!w.is_empty(), "A sent the WRITE");
    let (first, icrc) = &w[0];
    let p = wire::parse_roce_with(first, *icrc).unwrap();
    assert_eq!(p.hdr.bth.opcode, wire::Opcode::RcWriteFirst);
    // A frame's packet: its payload in the frame, not by reference.
    assert_eq!(p.payload.len(), mtu);
    let peer: &dyn vrnic::data::PeerMemory = s.a.mem.as_ref();
    let runs_after = batch::gso::rest(first, &p.hdr, Some(peer))
        .filter(|seg| matches!(seg, Ok(batch::gso::Segment::Run(_))))
        .count();
    // The FIRST packet alone.
    let mut alone = Vec::new();
    wire::emit_frame(&p.hdr, p.payload, &mut alone);
    let b = &mut s.b;
    b.dev.receive(&b.mem, &alone, now);
    assert_eq!(b.read(dst, mtu), data[..mtu], "the FIRST packet landed");
    // The MR goes away.
    let naks = b.dev.stats().nak_rem_access_sent;
    match how {
        MrLoss::SendWithInvalidate => {
            assert!(!inv.is_empty(), "A sent the SEND with invalidate");
            for (f, icrc) in &inv {
                b.dev.receive_frame(&b.mem, f, *icrc, now);
            }
        }
        MrLoss::Dereg => {
            let h = abi::Handle {
                handle: lk_dst,
                reserved: 0,
            };
            b.cmd(abi::CMD_DEREG_MR, &h).unwrap();
        }
    }
    // Then the WRITE's frames, the first one again.
    for (f, icrc) in &w {
        b.dev.receive_frame(&b.mem, f, *icrc, now);
    }
    assert_eq!(
        b.dev.stats().nak_rem_access_sent,
        naks + 1,
        "a remote access error NAK"
    );
    assert_eq!(b.qp_state(s.qb.qpn), abi::QPS_ERR, "B's QP");
    let after = b.read(dst, len);
    let landed = after.iter().zip(&data).take_while(|(x, y)| x == y).count();
    assert_eq!(landed, mtu, "bytes of the WRITE that landed");
    assert!(
        after[mtu..].iter().all(|&x| x == 0x5a),
        "B's memory past the FIRST packet is unchanged"
    );

    // A learns it: the WRITE fails with a remote access error (the SEND
    // with invalidate, on its own pair, succeeds), and nothing more lands.
    let mut got = Vec::new();
    let want = if let MrLoss::SendWithInvalidate = how {
        2
    } else {
        1
    };
    for _ in 0..want {
        let c = s.cqe(false, "A's completions");
        got.push((c.wr_id, c.status));
    }
    got.sort();
    let mut expect = vec![(1, abi::WC_REM_ACCESS_ERR)];
    if want == 2 {
        expect.push((2, abi::WC_SUCCESS));
        let c = s.cqe(true, "B's receive of the SEND with invalidate");
        assert_eq!(
            (c.wr_id, c.status, c.wc_flags, c.imm_data),
            (7, abi::WC_SUCCESS, abi::WC_WITH_INV, rk.to_be_bytes()),
            "{c:?}"
        );
    }
    assert_eq!(got, expect, "A's completions");
    s.assert_quiet(50, "after the failed WRITE");
    assert!(
        s.b.read(dst + mtu as u64, len - mtu)
            .iter()
            .all(|&x| x == 0x5a),
        "nothing landed later"
    );
    MrLossRun { runs_after }
}
