//! The verbs API end to end: two in-process devices ([`LoopbackTransport`])
//! joined by a `MemLink` pair, driven only through `vrnic_guest::verbs`.
//!
//! Every wait polls a CQ against a wall-clock deadline
//! ([`verbs_common::DEADLINE`]); no test sleeps to synchronise.

mod verbs_common;

use std::net::Ipv4Addr;

use verbs_common::{connect, two_contexts, wait_cq, GID_INDEX, PATH_MTU};
use vrnic::abi;
use vrnic_guest::verbs::*;

/// One side of an RC connection. Field order is drop order: QP, CQ, MR, PD.
struct Side {
    qp: Qp,
    cq: Cq,
    mr: Mr<'static>,
    _pd: Pd,
    ctx: Context,
}

impl Side {
    fn new(ctx: &Context, buf_len: usize, depth: u32) -> Side {
        let pd = Pd::alloc(ctx).expect("alloc PD");
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE;
        let mr = Mr::alloc(&pd, buf_len, access).expect("register MR");
        let cq = Cq::new(ctx, 2 * depth).expect("create CQ");
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: depth,
                max_recv_wr: depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let mut qp = Qp::new(&pd, &init).expect("create QP");
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: ACCESS_REMOTE_WRITE,
            ..Default::default()
        };
        qp.modify(
            &attr,
            QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS,
        )
        .expect("RESET -> INIT");
        Side {
            qp,
            cq,
            mr,
            _pd: pd,
            ctx: ctx.clone(),
        }
    }

    /// RTR then RTS towards `peer`, with `ibv_rc_pingpong`'s attributes.
    fn connect(&mut self, my_psn: u32, peer_qpn: u32, peer_psn: u32, peer_gid: Gid) {
        connect(&mut self.qp, my_psn, peer_qpn, peer_psn, peer_gid);
    }

    fn gid(&self) -> Gid {
        self.ctx
            .query_gid(1, GID_INDEX.into())
            .expect("query GID 1")
    }

    /// Polls until `n` completions arrived; panics after the deadline.
    fn wait(&mut self, n: usize, what: &str) -> Vec<WorkCompletion> {
        wait_cq(&mut self.cq, n, what)
    }

    /// Polls for one completion, and for none after it.
    fn wait_one(&mut self, what: &str) -> WorkCompletion {
        let wc = self.wait(1, what)[0];
        let mut more = [WorkCompletion::default(); 1];
        assert_eq!(self.cq.poll(&mut more), 0, "{what}: unexpected {more:?}");
        wc
    }
}

/// A connected pair, each side with a `buf_len`-byte MR and queues of `depth`.
fn connected_pair(buf_len: usize, depth: u32) -> (Side, Side) {
    let (ca, cb) = two_contexts();
    let mut a = Side::new(&ca, buf_len, depth);
    let mut b = Side::new(&cb, buf_len, depth);
    let (ga, gb) = (a.gid(), b.gid());
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    a.connect(0x0a_0001, qb, 0x0b_0001, gb);
    b.connect(0x0b_0001, qa, 0x0a_0001, ga);
    (a, b)
}

/// Deterministic bytes for message `n`, different for every message and offset.
fn pattern(n: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            let x = (i as u32).wrapping_mul(0x9e37_79b1) ^ n.wrapping_mul(0x85eb_ca6b);
            (x >> 24) as u8 ^ (x as u8)
        })
        .collect()
}

#[test]
fn queries_describe_the_port_and_its_ipv4_mapped_gid() {
    let (ca, _cb) = two_contexts();
    let dev = ca.query_device().expect("query device");
    assert!(
        dev.max_qp > 0 && dev.max_cqe > 0 && dev.max_sge > 0,
        "{dev:?}"
    );
    let port = ca.query_port(1).expect("query port 1");
    assert_eq!(
        port.active_mtu, PATH_MTU,
        "link MTU 1500 gives path MTU 1024"
    );
    assert_eq!(port.link_layer, 2, "IBV_LINK_LAYER_ETHERNET");
    let gid = ca.query_gid(1, GID_INDEX.into()).expect("query GID 1");
    assert_eq!(gid, Gid::from(Ipv4Addr::new(10, 0, 0, 1)));
    assert_eq!(gid.to_string(), "::ffff:10.0.0.1");
    assert!(ca.query_gid(1, 7).is_err(), "no GID 7");
    assert_eq!(ca.query_pkey(1, 0).expect("query P_Key 0"), 0xffff);
    assert!(ca.query_pkey(1, 1).is_err(), "one P_Key");
}

#[test]
fn memory_outside_dma_arenas_cannot_be_registered_on_loopback() {
    let (ca, _cb) = two_contexts();
    let pd = Pd::alloc(&ca).expect("alloc PD");
    let mut heap = vec![0u8; 4096];
    let err = Mr::register(&pd, &mut heap, ACCESS_LOCAL_WRITE).expect_err("heap is not DMA memory");
    assert_eq!(err.errno(), libc::EFAULT, "{err}");
    // A slice of DMA memory registers fine through the same path.
    let dma = ca.alloc_dma(8192, 4096).expect("DMA memory");
    // SAFETY: 8192 bytes of DMA memory alive as long as the context.
    let slice = unsafe { std::slice::from_raw_parts_mut(dma.ptr, dma.len) };
    let mr =
        Mr::register(&pd, &mut slice[100..5000], ACCESS_LOCAL_WRITE).expect("register DMA slice");
    assert_eq!(mr.addr(), dma.ptr as u64 + 100);
    assert_eq!(mr.len(), 4900);
}

#[test]
fn qp_reaches_rts_with_the_attributes_it_was_given() {
    let (a, b) = connected_pair(4096, 4);
    let attr = a.qp.query().expect("query QP");
    assert_eq!(attr.qp_state, QpState::Rts);
    assert_eq!(attr.dest_qp_num, b.qp.qp_num());
    assert_eq!(attr.sq_psn, 0x0a_0001);
    assert_eq!(attr.rq_psn, 0x0b_0001);
    assert_eq!(attr.path_mtu, PATH_MTU);
    assert_eq!((attr.timeout, attr.retry_cnt, attr.rnr_retry), (14, 7, 7));
    assert_eq!(attr.ah_attr.dgid, b.gid());
    assert_eq!(a.qp.cap().max_send_wr, 4);
}

#[test]
fn receive_queue_full_is_enomem_like_ibv_post_recv() {
    let (ca, _cb) = two_contexts();
    let mut s = Side::new(&ca, 4096, 4);
    let sge = [s.mr.sge(0, 64)];
    for i in 0..4 {
        s.qp.post_recv(&RecvWr {
            wr_id: i,
            sg_list: &sge,
        })
        .expect("room in the RQ");
    }
    let err =
        s.qp.post_recv(&RecvWr {
            wr_id: 4,
            sg_list: &sge,
        })
        .expect_err("RQ full");
    assert!(
        matches!(
            err,
            VerbsError::QueueFull {
                outstanding: 4,
                size: 4,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.errno(), libc::ENOMEM);
    let two = [sge[0], sge[0]];
    let err =
        s.qp.post_recv(&RecvWr {
            wr_id: 5,
            sg_list: &two,
        })
        .expect_err("1 SGE max");
    assert_eq!(err.errno(), libc::EINVAL);
}

/// A send before RTS is `EINVAL` with nothing posted, as rxe's
/// `rxe_post_send` answers (pyverbs' `test_post_send_qp_state_bad_flow`);
/// receives are taken from INIT on, and once the QP is in RTS the same
/// send goes and lands.
#[test]
fn a_send_before_rts_is_einval_and_posts_nothing() {
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Side::new(&ca, 8192, 4), Side::new(&cb, 8192, 4));
    let sge = [a.mr.sge(0, 64)];
    let wr = SendWr {
        wr_id: 7,
        opcode: WrOpcode::Send,
        send_flags: SEND_SIGNALED,
        sg_list: &sge,
        ..Default::default()
    };
    let err = a.qp.post_send(&wr).expect_err("a send in INIT");
    assert!(
        matches!(err, VerbsError::InvalidArgument(ArgError::NotReady { .. })),
        "{err}"
    );
    assert_eq!(err.errno(), libc::EINVAL);
    let (ga, gb) = (a.gid(), b.gid());
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    a.connect(0x0a_0001, qb, 0x0b_0001, gb);
    b.connect(0x0b_0001, qa, 0x0a_0001, ga);
    // Nothing of the refused post went: the first send is message 0.
    send_one(&mut a, &mut b, 0, 64);
}

/// Sends message `n` of `size` bytes from the start of `tx`'s MR into the
/// second half of `rx`'s and checks both completions and every byte.
fn send_one(tx: &mut Side, rx: &mut Side, n: u32, size: usize) {
    let what = format!("size {size}, message {n}");
    rx.mr.fill(0);
    let rsge = [rx.mr.sge(size, size)];
    rx.qp
        .post_recv(&RecvWr {
            wr_id: 1000 + u64::from(n),
            sg_list: &rsge,
        })
        .expect("post recv");
    let msg = pattern(n, size);
    tx.mr.write(0, &msg);
    let ssge = [tx.mr.sge(0, size)];
    let wr = SendWr {
        wr_id: u64::from(n),
        opcode: WrOpcode::Send,
        send_flags: SEND_SIGNALED,
        sg_list: &ssge,
        ..Default::default()
    };
    tx.qp.post_send(&wr).expect("post send");
    let sc = tx.wait_one(&format!("{what}: send completion"));
    assert_eq!(
        (sc.status_str(), sc.wr_id, sc.opcode),
        ("success", u64::from(n), abi::WC_OP_SEND)
    );
    let rc = rx.wait_one(&format!("{what}: receive completion"));
    assert_eq!(rc.status_str(), "success", "{what}: {rc:?}");
    assert_eq!(
        (rc.wr_id, rc.opcode),
        (1000 + u64::from(n), abi::WC_OP_RECV),
        "{what}"
    );
    assert_eq!(rc.byte_len as usize, size, "{what}");
    assert_eq!(rc.qp_num, rx.qp.qp_num(), "{what}");
    assert_eq!(rc.imm_data, None, "{what}");
    let got = rx.mr.to_vec();
    assert!(
        got[..size].iter().all(|&x| x == 0),
        "{what}: bytes outside the receive SGE changed"
    );
    if let Some(i) = (0..size).find(|&i| got[size + i] != msg[i]) {
        panic!(
            "{what}: byte {i} is {:#04x}, sent {:#04x}",
            got[size + i],
            msg[i]
        );
    }
}

#[test]
fn send_recv_ping_pong_moves_every_byte_at_each_size() {
    const ITERS: u32 = 6;
    for size in [1usize, 1024, 4096, 65536] {
        // Queues of 4 and CQs of 8: the iterations wrap every ring.
        let (mut a, mut b) = connected_pair(2 * size, 4);
        for it in 0..ITERS {
            send_one(&mut a, &mut b, 2 * it, size);
            send_one(&mut b, &mut a, 2 * it + 1, size);
        }
    }
}

#[test]
fn rdma_write_with_immediate_lands_byte_for_byte_in_the_peer_mr() {
    const LEN: usize = 8192 + 77; // nine packets at MTU 1024, the last one short
    const OFFSET: usize = 100;
    let (mut a, mut b) = connected_pair(16384, 4);
    // The write with immediate consumes a receive at B; it needs no buffer.
    b.qp.post_recv(&RecvWr {
        wr_id: 77,
        sg_list: &[],
    })
    .expect("post recv");
    let msg = pattern(42, LEN);
    a.mr.write(0, &msg);
    let sge = [a.mr.sge(0, LEN)];
    let wr = SendWr {
        wr_id: 5,
        opcode: WrOpcode::RdmaWriteWithImm,
        send_flags: SEND_SIGNALED,
        sg_list: &sge,
        imm_data: 0xdead_beef,
        rdma: RdmaWr {
            remote_addr: b.mr.addr() + OFFSET as u64,
            rkey: b.mr.rkey(),
        },
        ..Default::default()
    };
    a.qp.post_send(&wr).expect("post RDMA WRITE with immediate");
    let sc = a.wait_one("write completion");
    assert_eq!(
        (sc.status_str(), sc.wr_id, sc.opcode),
        ("success", 5, abi::WC_OP_RDMA_WRITE)
    );
    let rc = b.wait_one("immediate completion");
    assert_eq!(rc.status_str(), "success", "{rc:?}");
    assert_eq!((rc.wr_id, rc.opcode), (77, abi::WC_OP_RECV_RDMA_WITH_IMM));
    assert_eq!(rc.imm_data, Some(0xdead_beef));
    assert_ne!(rc.wc_flags & abi::WC_WITH_IMM, 0);
    let got = b.mr.to_vec();
    assert!(
        got[..OFFSET].iter().all(|&x| x == 0),
        "bytes before the target changed"
    );
    assert!(
        got[OFFSET + LEN..].iter().all(|&x| x == 0),
        "bytes after the target changed"
    );
    if let Some(i) = (0..LEN).find(|&i| got[OFFSET + i] != msg[i]) {
        panic!(
            "byte {i} is {:#04x}, wrote {:#04x}",
            got[OFFSET + i],
            msg[i]
        );
    }
}

#[test]
fn rdma_write_with_a_bad_rkey_completes_with_remote_access_error() {
    let (mut a, mut b) = connected_pair(4096, 4);
    a.mr.write(0, &pattern(1, 512));
    let sge = [a.mr.sge(0, 512)];
    let wr = SendWr {
        wr_id: 9,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SEND_SIGNALED,
        sg_list: &sge,
        rdma: RdmaWr {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey() ^ 0x5a5a_0000,
        },
        ..Default::default()
    };
    a.qp.post_send(&wr).expect("post RDMA WRITE");
    let wc = a.wait_one("completion of the write with a bad rkey");
    assert_eq!(wc.wr_id, 9);
    assert_eq!(
        wc.status,
        abi::WC_REM_ACCESS_ERR,
        "got {} ({})",
        wc.status_str(),
        wc.status
    );
    assert_eq!(wc.status_str(), "remote access error");
    assert!(
        b.mr.to_vec().iter().all(|&x| x == 0),
        "the target MR was written"
    );
    let mut none = [WorkCompletion::default(); 1];
    assert_eq!(b.cq.poll(&mut none), 0, "the responder completes nothing");
}
