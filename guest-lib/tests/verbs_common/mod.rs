//! What the verbs-level tests share: two in-process devices
//! ([`LoopbackTransport`]) joined by a `MemLink` pair, bounded CQ and event
//! waits, and the [`Node`] each side of a test is. Each test file uses part
//! of it.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use vrnic::device::DeviceConfig;
use vrnic::link::mem::MemLink;
use vrnic_guest::loopback::LoopbackTransport;
use vrnic_guest::verbs::*;

/// Longest any test waits for completions or events.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Path MTU of the connected QPs: 1024 bytes (`ibv_mtu` 3).
pub const PATH_MTU: u32 = 3;
/// The IPv4-mapped RoCEv2 GID.
pub const GID_INDEX: u8 = 1;

/// Device `n`: MAC 02:00:00:00:00:0n, 10.0.0.n/24, the given link MTU.
pub fn config(n: u8, link_mtu: u32) -> DeviceConfig {
    DeviceConfig {
        mac: [0x02, 0, 0, 0, 0, n],
        ipv4: Ipv4Addr::new(10, 0, 0, n),
        prefix_len: 24,
        ipv6: Vec::new(),
        link_mtu,
    }
}

/// Two contexts on devices 10.0.0.1 and 10.0.0.2, linked back to back by a
/// link of `link_mtu` bytes (1500 gives path MTU 1024, 9000 gives 4096).
pub fn two_contexts_mtu(link_mtu: u32) -> (Context, Context) {
    let (la, lb) = MemLink::pair();
    let ta = LoopbackTransport::new(config(1, link_mtu), Box::new(la)).expect("device A starts");
    let tb = LoopbackTransport::new(config(2, link_mtu), Box::new(lb)).expect("device B starts");
    (
        Context::open(Box::new(ta)).expect("open A"),
        Context::open(Box::new(tb)).expect("open B"),
    )
}

/// [`two_contexts_mtu`] on a 1500-byte link.
pub fn two_contexts() -> (Context, Context) {
    two_contexts_mtu(1500)
}

/// Polls `cq` until `n` completions arrived or [`DEADLINE`] passed; panics
/// then, naming `what`.
pub fn wait_cq(cq: &mut Cq, n: usize, what: &str) -> Vec<WorkCompletion> {
    let got = cq.poll_wait(n, DEADLINE);
    assert_eq!(
        got.len(),
        n,
        "{what}: {} of {n} completions after {DEADLINE:?}: {got:?}",
        got.len()
    );
    got
}

/// INIT → RTR → RTS with the masks `ibv_modify_qp(3)` requires for the
/// QP's type (UD: RTR with the state only; UC: no READ/atomic, retry or
/// RNR attributes).
pub fn connect(qp: &mut Qp, my_psn: u32, peer_qpn: u32, peer_psn: u32, peer_gid: Gid) {
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: PATH_MTU,
        dest_qp_num: peer_qpn,
        rq_psn: peer_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dgid: peer_gid,
            sgid_index: GID_INDEX,
            hop_limit: 64,
            is_global: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let connected =
        QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_PATH_MTU | QP_ATTR_DEST_QPN | QP_ATTR_RQ_PSN;
    let (rtr, rts) = match qp.qp_type() {
        QpType::Ud | QpType::Gsi => (QP_ATTR_STATE, QP_ATTR_STATE | QP_ATTR_SQ_PSN),
        QpType::Uc => (connected, QP_ATTR_STATE | QP_ATTR_SQ_PSN),
        QpType::Rc => (
            connected | QP_ATTR_MAX_DEST_RD_ATOMIC | QP_ATTR_MIN_RNR_TIMER,
            QP_ATTR_STATE
                | QP_ATTR_SQ_PSN
                | QP_ATTR_TIMEOUT
                | QP_ATTR_RETRY_CNT
                | QP_ATTR_RNR_RETRY
                | QP_ATTR_MAX_QP_RD_ATOMIC,
        ),
    };
    qp.modify(&attr, rtr).expect("INIT -> RTR");
    attr.qp_state = QpState::Rts;
    attr.sq_psn = my_psn;
    attr.timeout = 14;
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;
    attr.max_rd_atomic = 1;
    qp.modify(&attr, rts).expect("RTR -> RTS");
}

/// ud_pingpong's Q_Key, on every UD QP [`Node::qp`] makes.
pub const QKEY: u32 = 0x1111_1111;
/// What receive buffers hold before a message lands.
pub const POISON: u8 = 0xa5;

/// One side of a test: a PD, a `mr_len`-byte MR (local write, remote read
/// and write) filled with [`POISON`], and a CQ of 32.
pub struct Node {
    pub ctx: Context,
    pub pd: Pd,
    pub mr: Mr<'static>,
    pub cq: Cq,
}

impl Node {
    pub fn new(ctx: &Context, mr_len: usize) -> Node {
        let pd = Pd::alloc(ctx).expect("alloc PD");
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
        let mr = Mr::alloc(&pd, mr_len, access).expect("register MR");
        mr.fill(POISON);
        let cq = Cq::new(ctx, 32).expect("create CQ");
        Node {
            ctx: ctx.clone(),
            pd,
            mr,
            cq,
        }
    }

    /// The GID at `index` of port 1.
    pub fn gid(&self, index: u8) -> Gid {
        self.ctx.query_gid(1, index.into()).expect("query the GID")
    }

    /// A QP of `qp_type` on this node's CQ (`wrs` WRs each way, 1 SGE,
    /// `inline` bytes of inline data), optionally on `srq`, moved to INIT
    /// with the masks `ibv_modify_qp(3)` requires (UD: [`QKEY`]; GSI:
    /// `GSI_QKEY`, as the kernel's MAD layer sets it; else
    /// remote read and write).
    pub fn qp(&self, qp_type: QpType, srq: Option<&Srq>, wrs: u32, inline: u32) -> Qp {
        let init = QpInitAttr {
            qp_type,
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq,
            cap: QpCap {
                max_send_wr: wrs,
                max_recv_wr: wrs,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: inline,
            },
            sq_sig_all: false,
        };
        let mut qp = Qp::new(&self.pd, &init).expect("create QP");
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            ..Default::default()
        };
        let mut mask = QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT;
        if qp_type == QpType::Gsi {
            attr.qkey = vrnic_abi::GSI_QKEY;
            mask |= QP_ATTR_QKEY;
        } else if qp_type == QpType::Ud {
            attr.qkey = QKEY;
            mask |= QP_ATTR_QKEY;
        } else {
            attr.qp_access_flags = ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
            mask |= QP_ATTR_ACCESS_FLAGS;
        }
        qp.modify(&attr, mask).expect("RESET -> INIT");
        qp
    }

    /// An address handle to `dgid` from the GID at `sgid_index`
    /// (ud_pingpong's: GRH, hop limit 64).
    pub fn ah_to(&self, dgid: Gid, sgid_index: u8) -> Ah {
        let attr = AhAttr {
            dgid,
            sgid_index,
            hop_limit: 64,
            is_global: true,
            port_num: 1,
            ..Default::default()
        };
        Ah::new(&self.pd, &attr).expect("create AH")
    }

    /// Waits for `n` completions on the node's CQ ([`wait_cq`]).
    pub fn wait(&mut self, n: usize, what: &str) -> Vec<WorkCompletion> {
        wait_cq(&mut self.cq, n, what)
    }

    /// Waits for an event of `kind`, skipping others; panics after
    /// [`DEADLINE`].
    pub fn wait_event(&self, kind: u16, what: &str) -> Event {
        let start = Instant::now();
        loop {
            if let Some(e) = self.ctx.poll_event() {
                if e.kind == kind {
                    return e;
                }
                continue;
            }
            assert!(start.elapsed() < DEADLINE, "no {what} after {DEADLINE:?}");
            std::thread::yield_now();
        }
    }
}

/// Connects `a` and `b` (QPs of nodes `na` and `nb`) to each other
/// through the GIDs at `gid_index`.
pub fn connect_pair(a: &mut Qp, na: &Node, b: &mut Qp, nb: &Node, gid_index: u8) {
    let (qa, qb) = (a.qp_num(), b.qp_num());
    connect(a, 0x0a_0001, qb, 0x0b_0001, nb.gid(gid_index));
    connect(b, 0x0b_0001, qa, 0x0a_0001, na.gid(gid_index));
}
