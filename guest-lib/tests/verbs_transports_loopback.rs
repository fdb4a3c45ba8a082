//! The transports' finer points through the verbs API, on two in-process
//! devices ([`vrnic_guest::loopback::LoopbackTransport`]) joined by a
//! `MemLink` pair: UD over IPv6 GIDs (the GRH area holds the IPv6 header),
//! a UD QP on a shared receive queue, UC SEND with immediate over several
//! packets, SEND with invalidate, RTS → SQD → RTS with `EV_SQ_DRAINED`,
//! fences and `max_rd_atomic` 0. (UD over IPv4, Q_Keys, SQE, address
//! handle rules, the SRQ limit event, UC RDMA WRITE with immediate and
//! inline data are in `verbs_ud_uc_srq.rs`.)
//!
//! Every wait polls a CQ or the event queue against a wall-clock deadline
//! ([`verbs_common::DEADLINE`]); no test sleeps to synchronise. Where a test
//! needs to know that something was *not* sent (a SEND held in SQD), it
//! sends a second message behind it on the same in-order link and checks
//! which one arrived: the device executes doorbells in order and the link
//! delivers frames in order.

mod verbs_common;

use std::net::{Ipv4Addr, Ipv6Addr};

use verbs_common::{
    config, connect, connect_pair, two_contexts, Node, GID_INDEX, PATH_MTU, POISON, QKEY,
};
use vrnic::link::mem::MemLink;
use vrnic_guest::loopback::LoopbackTransport;
use vrnic_guest::verbs::*;

/// GID index of the first `--ipv6` address (after link-local 0 and
/// IPv4-mapped 1).
const IPV6_GID_INDEX: u8 = 2;

/// Deterministic bytes for message `n`.
fn pattern(n: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(131) ^ n.wrapping_mul(0x5b)) as u8)
        .collect()
}

/// The IPv6 address of device `n` (`fd00::n`).
fn ipv6_of(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n.into())
}

/// Two contexts as [`verbs_common::two_contexts`], each device with the
/// further IPv6 address `fd00::n` (GID index 2).
fn two_contexts_ipv6() -> (Context, Context) {
    let (la, lb) = MemLink::pair();
    let cfg = |n: u8| {
        let mut c = config(n, 1500);
        c.ipv6 = vec![ipv6_of(n)];
        c
    };
    let ta = LoopbackTransport::new(cfg(1), Box::new(la)).expect("device A starts");
    let tb = LoopbackTransport::new(cfg(2), Box::new(lb)).expect("device B starts");
    (
        Context::open(Box::new(ta)).expect("open A"),
        Context::open(Box::new(tb)).expect("open B"),
    )
}

/// A signalled SEND work request (opcode `opcode`) of `sge`.
fn send_wr<'a>(wr_id: u64, opcode: WrOpcode, sge: &'a [Sge]) -> SendWr<'a> {
    SendWr {
        wr_id,
        opcode,
        send_flags: SEND_SIGNALED,
        sg_list: sge,
        ..Default::default()
    }
}

#[test]
fn ud_over_ipv6_gids_puts_the_ipv6_header_in_the_grh_area() {
    let (ca, cb) = two_contexts_ipv6();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    // GID table: 0 link-local (fe80::/64 from the MAC), 1 IPv4-mapped, 2 fd00::n,
    // then unused entries up to the table's length (16), which the device
    // does not know.
    assert_eq!(a.ctx.query_port(1).expect("query port").gid_tbl_len, 16);
    assert!(a.ctx.query_gid(1, 3).is_err(), "GID 3 is unused");
    assert_eq!(a.gid(0).subnet_prefix(), 0xfe80_0000_0000_0000);
    assert_eq!(
        a.gid(GID_INDEX).to_ipv4_mapped(),
        Some(Ipv4Addr::new(10, 0, 0, 1))
    );
    assert_eq!(a.gid(IPV6_GID_INDEX), Gid::from(ipv6_of(1)));
    assert_eq!(
        a.ctx
            .query_gid(1, 3)
            .expect_err("past the end of the table")
            .errno(),
        libc::ENOENT
    );

    let mut qa = a.qp(QpType::Ud, None, 8, 0);
    let mut qb = b.qp(QpType::Ud, None, 8, 0);
    connect(&mut qa, 1, 0, 0, Gid::default());
    connect(&mut qb, 2, 0, 0, Gid::default());
    let to_a = AhAttr {
        dgid: Gid::from(ipv6_of(1)),
        sgid_index: IPV6_GID_INDEX,
        hop_limit: 64,
        traffic_class: 0x20,
        flow_label: 0x12345,
        is_global: true,
        port_num: 1,
        ..Default::default()
    };
    // An IPv6 destination needs an IPv6 source GID (as the kernel's RoCE).
    let v4_source = AhAttr {
        sgid_index: GID_INDEX,
        ..to_a
    };
    assert_eq!(
        Ah::new(&b.pd, &v4_source)
            .expect_err("IPv4 source for an IPv6 destination")
            .errno(),
        libc::EINVAL
    );
    let ah = Ah::new(&b.pd, &to_a).expect("create AH");

    qa.post_recv(&RecvWr {
        wr_id: 21,
        sg_list: &[a.mr.sge(0, GRH_LEN + 1024)],
    })
    .expect("post recv");
    let m = pattern(4, 777);
    b.mr.write(0, &m);
    let sge = [b.mr.sge(0, m.len())];
    let wr = SendWr {
        ud: UdWr {
            ah: ah.handle(),
            remote_qpn: qa.qp_num(),
            remote_qkey: QKEY,
        },
        ..send_wr(1, WrOpcode::SendWithImm, &sge)
    };
    let wr = SendWr {
        imm_data: 0x600d_f00d,
        ..wr
    };
    qb.post_send(&wr).expect("post UD send");
    assert!(b.wait(1, "UD send")[0].is_success());
    let w = a.wait(1, "UD receive over IPv6")[0];
    assert_eq!(w.status_str(), "success", "{w:?}");
    assert_eq!(w.wr_id, 21);
    assert_eq!(
        w.byte_len as usize,
        GRH_LEN + m.len(),
        "byte_len = 40 + payload"
    );
    assert_eq!(w.src_qp, qb.qp_num());
    assert_eq!(w.wc_flags & (WC_GRH | WC_WITH_IMM), WC_GRH | WC_WITH_IMM);
    assert_eq!(w.imm_data, Some(0x600d_f00d));
    let buf = a.mr.to_vec();
    let grh = &buf[..GRH_LEN];
    assert_eq!(
        grh[0] >> 4,
        6,
        "the GRH area is the IPv6 header: {grh:02x?}"
    );
    assert_eq!(
        (u32::from(grh[0] & 0xf) << 4) | u32::from(grh[1] >> 4),
        0x20,
        "traffic class"
    );
    assert_eq!(
        u32::from_be_bytes([0, grh[1] & 0xf, grh[2], grh[3]]),
        0x12345,
        "flow label"
    );
    assert_eq!(grh[6], 17, "next header: UDP");
    assert_eq!(grh[7], 64, "hop limit");
    assert_eq!(grh_sgid(grh), Some(Gid::from(ipv6_of(2))), "source GID");
    assert_eq!(&grh[24..40], &ipv6_of(1).octets(), "destination GID");
    assert_eq!(
        &buf[GRH_LEN..GRH_LEN + m.len()],
        &m[..],
        "payload at offset 40"
    );
    assert!(
        buf[GRH_LEN + m.len()..GRH_LEN + 1024]
            .iter()
            .all(|&x| x == POISON),
        "nothing written past the message"
    );
}

#[test]
fn a_ud_qp_on_an_srq_receives_datagrams_with_the_grh_area() {
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    let mut srq = Srq::new(
        &a.pd,
        &SrqInitAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        },
    )
    .expect("create SRQ");
    let mut qa = a.qp(QpType::Ud, Some(&srq), 8, 0);
    assert_eq!(
        (qa.srq_num(), qa.cap().max_recv_wr),
        (Some(srq.srq_num()), 0)
    );
    let err = qa
        .post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[a.mr.sge(0, 64)],
        })
        .expect_err("a QP on an SRQ has no receive queue");
    assert_eq!(err.errno(), libc::EINVAL);
    let mut qb = b.qp(QpType::Ud, None, 8, 0);
    connect(&mut qa, 1, 0, 0, Gid::default());
    connect(&mut qb, 2, 0, 0, Gid::default());
    let ah = Ah::new(
        &b.pd,
        &AhAttr {
            dgid: a.gid(GID_INDEX),
            sgid_index: GID_INDEX,
            is_global: true,
            port_num: 1,
            ..Default::default()
        },
    )
    .expect("create AH");

    const SLOT: usize = 1024;
    for i in 0..2 {
        srq.post_recv(&RecvWr {
            wr_id: 40 + i as u64,
            sg_list: &[a.mr.sge(i * SLOT, SLOT)],
        })
        .expect("post SRQ receive");
    }
    let ud = UdWr {
        ah: ah.handle(),
        remote_qpn: qa.qp_num(),
        remote_qkey: QKEY,
    };
    let mut sent = Vec::new();
    for n in 0..2u32 {
        let m = pattern(n, 100 + 50 * n as usize);
        b.mr.write(n as usize * SLOT, &m);
        let sge = [b.mr.sge(n as usize * SLOT, m.len())];
        let wr = SendWr {
            ud,
            ..send_wr(n.into(), WrOpcode::Send, &sge)
        };
        qb.post_send(&wr).expect("post UD send");
        sent.push(m);
    }
    assert!(b.wait(2, "UD sends").iter().all(|w| w.is_success()));
    let recvs = a.wait(2, "UD receives from the SRQ");
    let buf = a.mr.to_vec();
    for (n, (w, m)) in recvs.iter().zip(&sent).enumerate() {
        assert_eq!(w.status_str(), "success", "{w:?}");
        assert_eq!(w.wr_id, 40 + n as u64, "SRQ WQEs in order");
        assert_eq!(w.qp_num, qa.qp_num());
        assert_eq!(w.src_qp, qb.qp_num());
        assert_ne!(w.wc_flags & WC_GRH, 0);
        assert_eq!(w.byte_len as usize, GRH_LEN + m.len());
        let area = &buf[n * SLOT..];
        assert_eq!(grh_sgid(&area[..GRH_LEN]), Some(b.gid(GID_INDEX)));
        assert_eq!(&area[GRH_LEN..GRH_LEN + m.len()], &m[..]);
    }
    assert_eq!(srq.outstanding(), 0, "the SRQ record caught up");
}

#[test]
fn uc_send_with_immediate_spans_several_packets() {
    const LEN: usize = 2500; // three packets at path MTU 1024
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    let mut qa = a.qp(QpType::Uc, None, 8, 0);
    let mut qb = b.qp(QpType::Uc, None, 8, 0);
    connect_pair(&mut qa, &a, &mut qb, &b, GID_INDEX);
    qb.post_recv(&RecvWr {
        wr_id: 77,
        sg_list: &[b.mr.sge(0, 4096)],
    })
    .expect("post recv");
    let m = pattern(7, LEN);
    a.mr.write(0, &m);
    let sge = [a.mr.sge(0, LEN)];
    let wr = SendWr {
        imm_data: 0x1234_5678,
        ..send_wr(3, WrOpcode::SendWithImm, &sge)
    };
    qa.post_send(&wr).expect("post UC SEND with immediate");
    let sc = a.wait(1, "UC send")[0];
    assert_eq!(
        (sc.status_str(), sc.opcode),
        ("success", vrnic::abi::WC_OP_SEND)
    );
    let w = b.wait(1, "UC receive")[0];
    assert_eq!(w.status_str(), "success", "{w:?}");
    assert_eq!((w.wr_id, w.byte_len as usize), (77, LEN));
    assert_eq!((w.imm_data, w.wc_flags), (Some(0x1234_5678), WC_WITH_IMM));
    // ibv_poll_cq(3) defines src_qp for UD only; vrnic names the peer.
    assert_eq!(w.src_qp, qa.qp_num(), "src_qp of a connected receive");
    assert_eq!(&b.mr.to_vec()[..LEN], &m[..]);
}

#[test]
fn send_with_invalidate_revokes_the_named_rkey() {
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    let mut qa = a.qp(QpType::Rc, None, 8, 0);
    let mut qb = b.qp(QpType::Rc, None, 8, 0);
    connect_pair(&mut qa, &a, &mut qb, &b, GID_INDEX);
    // A second MR at B: the one A will invalidate.
    let win = Mr::alloc(
        &b.pd,
        4096,
        ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ,
    )
    .expect("register the window MR");
    a.mr.write(0, &pattern(1, 64));
    let src = [a.mr.sge(0, 64)];
    let write = SendWr {
        rdma: RdmaWr {
            remote_addr: win.addr(),
            rkey: win.rkey(),
        },
        ..send_wr(1, WrOpcode::RdmaWrite, &src)
    };
    qa.post_send(&write).expect("post WRITE");
    let w = a.wait(1, "WRITE before invalidation")[0];
    assert_eq!(w.status_str(), "success");
    assert_eq!(win.to_vec()[..64], pattern(1, 64)[..]);

    qb.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &[b.mr.sge(0, 256)],
    })
    .expect("post recv");
    let data = [a.mr.sge(0, 16)];
    let inv = SendWr {
        imm_data: win.rkey(),
        ..send_wr(2, WrOpcode::SendWithInv, &data)
    };
    qa.post_send(&inv).expect("post SEND with invalidate");
    let w = a.wait(1, "SEND with invalidate")[0];
    assert_eq!(
        (w.status_str(), w.opcode),
        ("success", vrnic::abi::WC_OP_SEND)
    );
    let r = b.wait(1, "receive of the SEND with invalidate")[0];
    assert_eq!(r.status_str(), "success", "{r:?}");
    assert_eq!((r.wr_id, r.byte_len), (9, 16));
    assert_eq!(r.wc_flags, WC_WITH_INV);
    assert_eq!(r.invalidated_rkey, Some(win.rkey()));
    assert_eq!(r.imm_data, None, "no immediate data");

    // The rkey no longer works remotely: the WRITE is NAKed.
    let again = SendWr { wr_id: 3, ..write };
    qa.post_send(&again).expect("post WRITE");
    let w = a.wait(1, "WRITE through the invalidated rkey")[0];
    assert_eq!(
        w.status,
        vrnic::abi::WC_REM_ACCESS_ERR,
        "{}",
        w.status_str()
    );
    assert_eq!(qa.query().expect("query").qp_state, QpState::Err);
}

#[test]
fn sqd_holds_new_sends_until_rts_and_raises_sq_drained() {
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    // Two RC connections; B receives both on one CQ.
    let (mut qa1, mut qb1) = (a.qp(QpType::Rc, None, 8, 0), b.qp(QpType::Rc, None, 8, 0));
    let (mut qa2, mut qb2) = (a.qp(QpType::Rc, None, 8, 0), b.qp(QpType::Rc, None, 8, 0));
    connect_pair(&mut qa1, &a, &mut qb1, &b, GID_INDEX);
    connect_pair(&mut qa2, &a, &mut qb2, &b, GID_INDEX);
    for (i, q) in [&mut qb1, &mut qb2].into_iter().enumerate() {
        q.post_recv(&RecvWr {
            wr_id: 100 + i as u64,
            sg_list: &[b.mr.sge(i * 1024, 1024)],
        })
        .expect("post recv");
    }

    // RTS -> SQD (STATE alone): nothing outstanding, so drained at once.
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        ..Default::default()
    };
    qa1.modify(&sqd, QP_ATTR_STATE).expect("RTS -> SQD");
    let e = a.wait_event(EV_SQ_DRAINED, "EV_SQ_DRAINED");
    assert_eq!(e.handle, qa1.qp_num());
    assert_eq!(qa1.query().expect("query").qp_state, QpState::Sqd);

    // X on the drained QP waits; Y on the other QP, posted after it, goes.
    a.mr.write(0, &pattern(1, 32));
    a.mr.write(1024, &pattern(2, 48));
    let x = [a.mr.sge(0, 32)];
    let y = [a.mr.sge(1024, 48)];
    qa1.post_send(&send_wr(1, WrOpcode::Send, &x))
        .expect("post X in SQD");
    qa2.post_send(&send_wr(2, WrOpcode::Send, &y))
        .expect("post Y");
    // Had X been sent, it would have arrived (and completed on B's CQ)
    // before Y: the device runs doorbells and the link delivers in order.
    let first = b.wait(1, "the first receive at B")[0];
    assert_eq!(
        (first.qp_num, first.wr_id, first.byte_len),
        (qb2.qp_num(), 101, 48),
        "Y arrives first; X is held in SQD"
    );
    let sent = a.wait(1, "Y's completion")[0];
    assert_eq!((sent.wr_id, sent.status_str()), (2, "success"));

    // SQD -> RTS (STATE alone) lets X go.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    qa1.modify(&rts, QP_ATTR_STATE).expect("SQD -> RTS");
    let w = a.wait(1, "X's completion")[0];
    assert_eq!((w.wr_id, w.status_str()), (1, "success"));
    let r = b.wait(1, "X at B")[0];
    assert_eq!((r.qp_num, r.wr_id, r.byte_len), (qb1.qp_num(), 100, 32));
    let buf = b.mr.to_vec();
    assert_eq!(buf[..32], pattern(1, 32)[..]);
    assert_eq!(buf[1024..1024 + 48], pattern(2, 48)[..]);
}

/// INIT → RTR → RTS for an RC QP as rc_pingpong does it, with the
/// requester's `max_rd_atomic` given.
fn connect_rc(qp: &mut Qp, peer: &Qp, peer_gid: Gid, max_rd_atomic: u8) {
    let mut path = RcPath::new(peer_gid, GID_INDEX, peer.qp_num(), 0x100, 0x100, PATH_MTU);
    path.max_rd_atomic = max_rd_atomic;
    qp.connect_rc(&path).expect("INIT -> RTR -> RTS");
}

/// `max_rd_atomic` 0 works as 1 (as on rxe), and a fenced SEND behind
/// READs completes after them, in order, with every byte right.
#[test]
fn reads_with_max_rd_atomic_0_and_a_fenced_send_complete_in_order() {
    const LEN: usize = 1500;
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 16384), Node::new(&cb, 16384));
    let mut qa = a.qp(QpType::Rc, None, 8, 0);
    let mut qb = b.qp(QpType::Rc, None, 8, 0);
    connect_rc(&mut qa, &qb, b.gid(GID_INDEX), 0);
    connect_rc(&mut qb, &qa, a.gid(GID_INDEX), 1);
    assert_eq!(qa.query().expect("query").max_rd_atomic, 0);
    for i in 0..3 {
        b.mr.write(i * 2048, &pattern(10 + i as u32, LEN));
    }
    qb.post_recv(&RecvWr {
        wr_id: 50,
        sg_list: &[b.mr.sge(8192, 1024)],
    })
    .expect("post recv");
    for i in 0..3u64 {
        let dst = [a.mr.sge(i as usize * 2048, LEN)];
        let read = SendWr {
            rdma: RdmaWr {
                remote_addr: b.mr.addr() + i * 2048,
                rkey: b.mr.rkey(),
            },
            ..send_wr(i, WrOpcode::RdmaRead, &dst)
        };
        qa.post_send(&read).expect("post READ");
    }
    a.mr.write(8192, &pattern(99, 200));
    let src = [a.mr.sge(8192, 200)];
    let fenced = SendWr {
        send_flags: SEND_SIGNALED | SEND_FENCE,
        ..send_wr(3, WrOpcode::Send, &src)
    };
    qa.post_send(&fenced).expect("post fenced SEND");
    let done = a.wait(4, "three READs and the fenced SEND");
    let ids: Vec<(u64, &str)> = done.iter().map(|w| (w.wr_id, w.status_str())).collect();
    assert_eq!(
        ids,
        [
            (0, "success"),
            (1, "success"),
            (2, "success"),
            (3, "success")
        ]
    );
    for w in &done[..3] {
        assert_eq!(
            (w.opcode, w.byte_len as usize),
            (vrnic::abi::WC_OP_RDMA_READ, LEN)
        );
    }
    let got = a.mr.to_vec();
    for i in 0..3 {
        assert_eq!(
            got[i * 2048..i * 2048 + LEN],
            pattern(10 + i as u32, LEN)[..],
            "READ {i}"
        );
    }
    let r = b.wait(1, "the fenced SEND at B")[0];
    assert_eq!((r.wr_id, r.byte_len, r.status_str()), (50, 200, "success"));
    assert_eq!(b.mr.to_vec()[8192..8192 + 200], pattern(99, 200)[..]);
}

#[test]
fn post_send_rejects_wrapping_remote_ranges_and_messages_past_max_msg_sz() {
    // Issue 9, item 4: EINVAL at post time, as rxe's validate_send_wr;
    // nothing is posted, and a good WR still goes through after them.
    let (ca, cb) = two_contexts();
    let (mut a, b) = (Node::new(&ca, 4096), Node::new(&cb, 4096));
    let mut qa = a.qp(QpType::Rc, None, 4, 0);
    let mut qb = b.qp(QpType::Rc, None, 4, 0);
    connect_pair(&mut qa, &a, &mut qb, &b, GID_INDEX);
    let sge = [a.mr.sge(0, 100)];
    let target = (b.mr.addr(), b.mr.rkey());
    for (opcode, remote_addr) in [
        (WrOpcode::RdmaWrite, u64::MAX - 9),
        (WrOpcode::RdmaRead, u64::MAX - 98),
        (WrOpcode::RdmaWriteWithImm, u64::MAX),
    ] {
        let mut wr = send_wr(1, opcode, &sge);
        wr.rdma = RdmaWr {
            remote_addr,
            rkey: target.1,
        };
        let e = qa.post_send(&wr).expect_err("a wrapping remote range");
        assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e:?}");
    }
    let eight = [a.mr.sge(0, 8)];
    let mut wr = send_wr(2, WrOpcode::AtomicFetchAndAdd, &eight);
    wr.atomic.remote_addr = u64::MAX - 7;
    let e = qa.post_send(&wr).expect_err("a wrapping atomic");
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e:?}");
    // One SGE of 2^31 + 1 bytes (never read: refused at post time).
    let big = [Sge {
        addr: a.mr.addr(),
        length: (1 << 31) + 1,
        lkey: a.mr.lkey(),
    }];
    let wr = send_wr(3, WrOpcode::Send, &big);
    let e = qa.post_send(&wr).expect_err("a message past max_msg_sz");
    assert!(matches!(e, VerbsError::InvalidArgument(_)), "{e:?}");
    // The QP is unharmed: a WRITE ending at the last byte of B's MR works.
    let mut wr = send_wr(4, WrOpcode::RdmaWrite, &sge);
    wr.send_flags = SEND_SIGNALED;
    wr.rdma = RdmaWr {
        remote_addr: target.0 + 4096 - 100,
        rkey: target.1,
    };
    qa.post_send(&wr).expect("a good WRITE");
    let w = a.wait(1, "the good WRITE")[0];
    assert_eq!((w.wr_id, w.status_str()), (4, "success"));
}
