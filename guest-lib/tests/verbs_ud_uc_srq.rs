//! The verbs API beyond RC SEND: UD with address handles and the GRH
//! area, Q_Key rules and SQE recovery; UC RDMA WRITE with immediate; a
//! shared receive queue used by two QPs with its limit event; inline data.
//! Two in-process devices ([`vrnic_guest::loopback::LoopbackTransport`])
//! joined by a `MemLink` pair, driven only through `vrnic_guest::verbs`.
//!
//! Every wait polls a CQ or the event queue against a wall-clock deadline
//! ([`verbs_common::DEADLINE`]); no test sleeps to synchronise. Where a
//! test needs to know that something did *not* arrive (a datagram with the
//! wrong Q_Key), it sends a second message behind it on the same in-order
//! link and checks which one consumed the receive.

mod verbs_common;

use std::net::Ipv4Addr;
use std::time::Instant;

use verbs_common::{
    connect, connect_pair, two_contexts, two_contexts_mtu, Node, DEADLINE, GID_INDEX, PATH_MTU,
    POISON, QKEY,
};
use vrnic::abi;
use vrnic_guest::verbs::*;

/// Deterministic bytes for message `n`.
fn pattern(n: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(31) ^ n.wrapping_mul(0x9d)) as u8)
        .collect()
}

/// A UD QP on each of two nodes linked by a `link_mtu`-byte link, with
/// `mr_len`-byte MRs (B's QP with `inline_b` inline bytes), both in RTS,
/// and B's address handle to A: `(qa, qb, ah, a, b)`.
fn ud_pair(link_mtu: u32, mr_len: usize, inline_b: u32) -> (Qp, Qp, Ah, Node, Node) {
    let (ca, cb) = two_contexts_mtu(link_mtu);
    let (a, b) = (Node::new(&ca, mr_len), Node::new(&cb, mr_len));
    let mut qa = a.qp(QpType::Ud, None, 4, 0);
    let mut qb = b.qp(QpType::Ud, None, 4, inline_b);
    connect(&mut qa, 1, 0, 0, Gid::default());
    connect(&mut qb, 2, 0, 0, Gid::default());
    let ah = b.ah_to(a.gid(GID_INDEX), GID_INDEX);
    (qa, qb, ah, a, b)
}

/// Posts a signalled SEND of `sge` (or `inline`) on a UD QP to `qpn`
/// through `ah` with Q_Key `qkey`.
fn ud_send(
    qp: &mut Qp,
    wr_id: u64,
    sge: &[Sge],
    inline: Option<&[u8]>,
    ud: UdWr,
    imm: Option<u32>,
) {
    let wr = SendWr {
        wr_id,
        opcode: if imm.is_some() {
            WrOpcode::SendWithImm
        } else {
            WrOpcode::Send
        },
        send_flags: SEND_SIGNALED,
        sg_list: sge,
        inline_data: inline,
        imm_data: imm.unwrap_or(0),
        ud,
        ..Default::default()
    };
    qp.post_send(&wr).expect("post UD send");
}

#[test]
fn ud_receive_has_the_grh_area_then_the_payload_and_names_the_sender() {
    let (mut qa, mut qb, ah, mut a, mut b) = ud_pair(1500, 8192, 128);
    assert_ne!(ah.handle(), 0);
    assert_eq!(ah.attr().dgid, a.gid(GID_INDEX));

    // Two receives at A, 1024 bytes apart, each GRH + 512 bytes.
    for i in 0..2u64 {
        qa.post_recv(&RecvWr {
            wr_id: 10 + i,
            sg_list: &[a.mr.sge(1024 * i as usize, GRH_LEN + 512)],
        })
        .expect("post recv");
    }
    let ud = UdWr {
        ah: ah.handle(),
        remote_qpn: qa.qp_num(),
        remote_qkey: QKEY,
    };
    // A SEND from an SGE, then an inline SEND with immediate.
    let m0 = pattern(0, 300);
    b.mr.write(0, &m0);
    ud_send(&mut qb, 1, &[b.mr.sge(0, 300)], None, ud, None);
    let mut m1 = pattern(1, 100);
    ud_send(&mut qb, 2, &[], Some(&m1), ud, Some(0xfeed_0001));
    m1.fill(0); // inline data was copied at post time
    let m1 = pattern(1, 100);

    let sends = b.wait(2, "UD send completions");
    assert!(sends
        .iter()
        .all(|w| w.is_success() && w.opcode == abi::WC_OP_SEND));
    let recvs = a.wait(2, "UD receive completions");
    let buf = a.mr.to_vec();
    for (k, (w, m)) in recvs.iter().zip([&m0, &m1]).enumerate() {
        assert_eq!(w.status_str(), "success", "{w:?}");
        assert_eq!(w.wr_id, 10 + k as u64);
        assert_eq!(w.opcode, abi::WC_OP_RECV);
        assert_eq!(
            w.byte_len as usize,
            GRH_LEN + m.len(),
            "byte_len = 40 + payload"
        );
        assert_ne!(w.wc_flags & WC_GRH, 0, "GRH flag");
        assert_eq!(w.src_qp, qb.qp_num(), "source QP");
        assert_eq!(w.qp_num, qa.qp_num());
        let area = &buf[1024 * k..];
        let grh = &area[..GRH_LEN];
        assert!(
            grh[..20].iter().all(|&x| x == 0),
            "IPv4: 20 zero bytes first"
        );
        assert_eq!(grh[20], 0x45, "then the IPv4 header");
        assert_eq!(&grh[36..40], &[10, 0, 0, 1], "destination address");
        assert_eq!(grh_sgid(grh), Some(b.gid(GID_INDEX)), "source address");
        assert_eq!(
            &area[GRH_LEN..GRH_LEN + m.len()],
            &m[..],
            "payload at offset 40"
        );
        assert!(
            area[GRH_LEN + m.len()..GRH_LEN + 512]
                .iter()
                .all(|&x| x == POISON),
            "nothing written past the message"
        );
    }
    assert_eq!(recvs[0].imm_data, None);
    assert_eq!(recvs[1].imm_data, Some(0xfeed_0001));
    assert_ne!(recvs[1].wc_flags & WC_WITH_IMM, 0);
}

#[test]
fn ud_q_key_mismatch_is_dropped_and_a_controlled_q_key_uses_the_qps() {
    let (mut qa, mut qb, ah, mut a, mut b) = ud_pair(1500, 8192, 0);
    qa.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: &[a.mr.sge(0, GRH_LEN + 64)],
    })
    .expect("post recv");
    let mut ud = UdWr {
        ah: ah.handle(),
        remote_qpn: qa.qp_num(),
        remote_qkey: 0x2222,
    };
    b.mr.write(0, &[1; 16]);
    b.mr.write(16, &[2; 32]);
    // Wrong Q_Key: silently dropped by A (IBTA C10-16); B's send still succeeds.
    ud_send(&mut qb, 1, &[b.mr.sge(0, 16)], None, ud, None);
    // Most significant bit set: B sends its QP's Q_Key (0x11111111).
    ud.remote_qkey = 0x8000_0000;
    ud_send(&mut qb, 2, &[b.mr.sge(16, 32)], None, ud, None);
    let sends = b.wait(2, "sends");
    assert!(sends.iter().all(|w| w.is_success()), "{sends:?}");
    let w = a.wait(1, "the datagram with the right Q_Key")[0];
    assert_eq!(
        w.byte_len as usize,
        GRH_LEN + 32,
        "the second datagram: {w:?}"
    );
    assert_eq!(a.mr.to_vec()[GRH_LEN..GRH_LEN + 32], [2; 32]);
}

#[test]
fn a_ud_send_without_an_address_handle_moves_the_qp_to_sqe_until_rts() {
    let (mut qa, mut qb, ah, mut a, mut b) = ud_pair(1500, 8192, 0);
    let sge = [b.mr.sge(0, 8)];
    let bad = UdWr {
        ah: ah.handle() + 100,
        remote_qpn: qa.qp_num(),
        remote_qkey: QKEY,
    };
    ud_send(&mut qb, 1, &sge, None, bad, None);
    let w = b.wait(1, "send through a missing AH")[0];
    assert_eq!(w.status, abi::WC_LOC_QP_OP_ERR, "{}", w.status_str());
    assert_eq!(qb.query().expect("query").qp_state, QpState::Sqe);
    // A send posted in SQE is flushed.
    ud_send(
        &mut qb,
        2,
        &sge,
        None,
        UdWr {
            ah: ah.handle(),
            ..bad
        },
        None,
    );
    let w = b.wait(1, "send posted in SQE")[0];
    assert_eq!(w.status, abi::WC_WR_FLUSH_ERR, "{}", w.status_str());
    // SQE -> RTS (ibv_modify_qp(3): STATE only), then sends work again.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    qb.modify(&rts, QP_ATTR_STATE).expect("SQE -> RTS");
    qa.post_recv(&RecvWr {
        wr_id: 9,
        sg_list: &[a.mr.sge(0, GRH_LEN + 8)],
    })
    .expect("post recv");
    let good = UdWr {
        ah: ah.handle(),
        ..bad
    };
    ud_send(&mut qb, 3, &sge, None, good, None);
    assert!(b.wait(1, "send after recovery")[0].is_success());
    let w = a.wait(1, "receive after recovery")[0];
    assert_eq!((w.wr_id, w.byte_len as usize), (9, GRH_LEN + 8));
}

#[test]
fn address_handles_follow_ibv_create_ah_rules() {
    let (ca, _cb) = two_contexts();
    let n = Node::new(&ca, 4096);
    let peer = Gid::from(Ipv4Addr::new(10, 0, 0, 2));
    let good = AhAttr {
        dgid: peer,
        sgid_index: GID_INDEX,
        is_global: true,
        port_num: 1,
        ..Default::default()
    };
    let errno = |attr: AhAttr| Ah::new(&n.pd, &attr).expect_err("refused").errno();
    assert_eq!(
        errno(AhAttr {
            is_global: false,
            ..good
        }),
        libc::EINVAL,
        "RoCE needs a GRH"
    );
    assert_eq!(
        errno(AhAttr {
            port_num: 0,
            ..good
        }),
        libc::EINVAL,
        "port 0"
    );
    assert_eq!(
        errno(AhAttr {
            sgid_index: 9,
            ..good
        }),
        libc::EINVAL,
        "no GID 9"
    );
    assert_eq!(
        errno(AhAttr {
            sgid_index: 0,
            ..good
        }),
        libc::EINVAL,
        "link-local IPv6 source for an IPv4 destination"
    );
    assert_eq!(
        errno(AhAttr {
            dgid: Gid::default(),
            ..good
        }),
        libc::EINVAL
    );
    let a1 = Ah::new(&n.pd, &good).expect("create AH");
    let a2 = Ah::new(&n.pd, &good).expect("create a second AH");
    assert_ne!(a1.handle(), a2.handle());
    // The PD stays allocated while its AHs live; dropping them frees it.
    drop((a1, a2));
}

#[test]
fn an_srq_feeds_two_qps_in_arrival_order_and_raises_its_limit_event() {
    const SLOT: usize = 256;
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 16 * SLOT), Node::new(&cb, 16 * SLOT));
    let mut srq = Srq::new(
        &a.pd,
        &SrqInitAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        },
    )
    .expect("create SRQ");
    assert_eq!((srq.max_wr(), srq.max_sge()), (8, 1));
    let mut a0 = a.qp(QpType::Rc, Some(&srq), 4, 0);
    let mut a1 = a.qp(QpType::Rc, Some(&srq), 4, 0);
    assert_eq!(a0.srq_num(), Some(srq.srq_num()));
    assert_eq!(a0.cap().max_recv_wr, 0);
    let mut b0 = b.qp(QpType::Rc, None, 4, 0);
    let mut b1 = b.qp(QpType::Rc, None, 4, 0);
    connect_pair(&mut a0, &a, &mut b0, &b, GID_INDEX);
    connect_pair(&mut a1, &a, &mut b1, &b, GID_INDEX);

    let err = a0
        .post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[a.mr.sge(0, SLOT)],
        })
        .expect_err("a QP on an SRQ has no receive queue");
    assert_eq!(err.errno(), libc::EINVAL);
    for i in 0..8 {
        srq.post_recv(&RecvWr {
            wr_id: 100 + i as u64,
            sg_list: &[a.mr.sge(i * SLOT, SLOT)],
        })
        .expect("post SRQ receive");
    }
    let err = srq
        .post_recv(&RecvWr {
            wr_id: 108,
            sg_list: &[a.mr.sge(0, SLOT)],
        })
        .expect_err("SRQ full");
    assert_eq!(err.errno(), libc::ENOMEM);
    assert_eq!(srq.outstanding(), 8);
    assert_eq!(
        srq.arm_limit(9).expect_err("limit above max_wr").errno(),
        libc::EINVAL
    );
    let resize = SrqAttr {
        max_wr: 16,
        ..Default::default()
    };
    assert_eq!(
        srq.modify(&resize, SRQ_ATTR_MAX_WR)
            .expect_err("no resize")
            .errno(),
        libc::EOPNOTSUPP
    );
    srq.arm_limit(4).expect("arm the limit");
    assert_eq!(srq.query().expect("query SRQ").srq_limit, 4);

    // Message n (n = 0..5) from B0 (even) or B1 (odd), 10 + n bytes.
    let send = |qp: &mut Qp, b: &Node, n: u32| {
        let m = pattern(n, 10 + n as usize);
        b.mr.write(n as usize * SLOT, &m);
        let wr = SendWr {
            wr_id: n.into(),
            send_flags: SEND_SIGNALED,
            sg_list: &[b.mr.sge(n as usize * SLOT, m.len())],
            ..Default::default()
        };
        qp.post_send(&wr).expect("post send");
        m
    };
    let srq_limit_events = |ctx: &Context| {
        std::iter::from_fn(|| ctx.poll_event())
            .filter(|e| e.kind == EV_SRQ_LIMIT)
            .count()
    };
    let mut sent = Vec::new();
    for n in 0..4 {
        let qp = if n % 2 == 0 { &mut b0 } else { &mut b1 };
        sent.push(send(qp, &b, n));
        // One at a time, so the SRQ order is the send order.
        assert!(b.wait(1, "send")[0].is_success());
    }
    let recvs = a.wait(4, "receives of messages 0..4");
    assert_eq!(
        srq_limit_events(&a.ctx),
        0,
        "4 WQEs remain: not below the limit"
    );
    sent.push(send(&mut b0, &b, 4));
    assert!(b.wait(1, "send 4")[0].is_success());
    let recvs: Vec<_> = recvs
        .into_iter()
        .chain(a.wait(1, "receive of message 4"))
        .collect();
    let buf = a.mr.to_vec();
    for (n, w) in recvs.iter().enumerate() {
        assert_eq!(w.status_str(), "success", "{w:?}");
        assert_eq!(
            w.wr_id,
            100 + n as u64,
            "SRQ WQEs are taken in arrival order"
        );
        let on = if n % 2 == 0 { &a0 } else { &a1 };
        assert_eq!(w.qp_num, on.qp_num(), "message {n} arrived on its QP");
        assert_eq!(w.byte_len as usize, sent[n].len());
        assert_eq!(&buf[n * SLOT..n * SLOT + sent[n].len()], &sent[n][..]);
    }
    // 3 WQEs remain, fewer than 4: IBV_EVENT_SRQ_LIMIT_REACHED, once.
    let start = Instant::now();
    let event = loop {
        if let Some(e) = a.ctx.poll_event().filter(|e| e.kind == EV_SRQ_LIMIT) {
            break e;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no EV_SRQ_LIMIT after {DEADLINE:?}"
        );
        std::thread::yield_now();
    };
    assert_eq!(event.handle, srq.srq_num());
    assert_eq!(
        srq.query().expect("query SRQ").srq_limit,
        0,
        "the limit disarmed"
    );
    assert_eq!(srq.outstanding(), 3);

    // A1 leaves (ERR): IBV_EVENT_QP_LAST_WQE_REACHED; the SRQ's WQEs stay for A0.
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    a1.modify(&err, QP_ATTR_STATE).expect("A1 -> ERR");
    let start = Instant::now();
    loop {
        match a.ctx.poll_event() {
            Some(e) if e.kind == EV_QP_LAST_WQE_REACHED => {
                assert_eq!(e.handle, a1.qp_num());
                break;
            }
            Some(e) => assert_ne!(e.kind, EV_SRQ_LIMIT, "the limit fired twice"),
            None => {
                assert!(start.elapsed() < DEADLINE, "no EV_QP_LAST_WQE_REACHED");
                std::thread::yield_now();
            }
        }
    }
    let m = send(&mut b0, &b, 5);
    assert!(b.wait(1, "send 5")[0].is_success());
    let w = a.wait(1, "receive of message 5 on A0")[0];
    assert_eq!((w.wr_id, w.qp_num), (105, a0.qp_num()));
    assert_eq!(a.mr.to_vec()[5 * SLOT..5 * SLOT + m.len()], m[..]);
    assert_eq!(srq.outstanding(), 2);
}

#[test]
fn uc_rdma_write_with_immediate_lands_and_consumes_a_receive() {
    const LEN: usize = 3000; // three packets at path MTU 1024
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    let mut qa = a.qp(QpType::Uc, None, 4, 0);
    let mut qb = b.qp(QpType::Uc, None, 4, 0);
    // UC takes no RDMA READ/atomic or RNR attributes (ibv_modify_qp(3)).
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: PATH_MTU,
        ah_attr: AhAttr {
            dgid: b.gid(GID_INDEX),
            sgid_index: GID_INDEX,
            is_global: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let all = QP_ATTR_STATE
        | QP_ATTR_AV
        | QP_ATTR_PATH_MTU
        | QP_ATTR_DEST_QPN
        | QP_ATTR_RQ_PSN
        | QP_ATTR_MAX_DEST_RD_ATOMIC;
    assert_eq!(
        qa.modify(&rtr, all)
            .expect_err("UC RTR with MAX_DEST_RD_ATOMIC")
            .errno(),
        libc::EINVAL
    );
    connect_pair(&mut qa, &a, &mut qb, &b, GID_INDEX);
    assert_eq!(qa.query().expect("query").qp_state, QpState::Rts);

    qb.post_recv(&RecvWr {
        wr_id: 55,
        sg_list: &[],
    })
    .expect("post recv");
    let msg = pattern(9, LEN);
    a.mr.write(0, &msg);
    let wr = SendWr {
        wr_id: 5,
        opcode: WrOpcode::RdmaWriteWithImm,
        send_flags: SEND_SIGNALED,
        sg_list: &[a.mr.sge(0, LEN)],
        imm_data: 0x0bad_cafe,
        rdma: RdmaWr {
            remote_addr: b.mr.addr() + 100,
            rkey: b.mr.rkey(),
        },
        ..Default::default()
    };
    qa.post_send(&wr).expect("post UC WRITE with immediate");
    let sc = a.wait(1, "UC write completion")[0];
    assert_eq!(
        (sc.status_str(), sc.opcode),
        ("success", abi::WC_OP_RDMA_WRITE)
    );
    let rc = b.wait(1, "immediate completion")[0];
    assert_eq!(rc.status_str(), "success", "{rc:?}");
    assert_eq!((rc.wr_id, rc.opcode), (55, abi::WC_OP_RECV_RDMA_WITH_IMM));
    assert_eq!(rc.imm_data, Some(0x0bad_cafe));
    let got = b.mr.to_vec();
    assert!(
        got[..100].iter().all(|&x| x == POISON),
        "bytes before the target"
    );
    assert_eq!(&got[100..100 + LEN], &msg[..]);
    assert!(
        got[100 + LEN..].iter().all(|&x| x == POISON),
        "bytes after the target"
    );

    // UC has no RDMA READ: the QP completes it with a local QP operation error.
    let read = SendWr {
        wr_id: 6,
        opcode: WrOpcode::RdmaRead,
        send_flags: SEND_SIGNALED,
        sg_list: &[a.mr.sge(0, 64)],
        rdma: wr.rdma,
        ..Default::default()
    };
    qa.post_send(&read).expect("post READ");
    let w = a.wait(1, "READ on UC")[0];
    assert_eq!(w.status, abi::WC_LOC_QP_OP_ERR, "{}", w.status_str());
}

#[test]
fn inline_data_is_copied_at_post_time_and_bounded_by_the_qp() {
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    let mut qa = a.qp(QpType::Rc, None, 4, 256);
    let mut qb = b.qp(QpType::Rc, None, 4, 0);
    connect_pair(&mut qa, &a, &mut qb, &b, GID_INDEX);
    let cap = qa.cap().max_inline_data;
    assert!(cap >= 256, "granted {cap} inline bytes");

    qb.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[b.mr.sge(0, 1024)],
    })
    .expect("post recv");
    let mut data = pattern(3, 256);
    let wr = SendWr {
        wr_id: 2,
        send_flags: SEND_SIGNALED,
        inline_data: Some(&data),
        ..Default::default()
    };
    qa.post_send(&wr).expect("post inline send");
    let sent = data.clone();
    data.fill(0); // the WQE holds its own copy
    assert!(a.wait(1, "inline send")[0].is_success());
    let w = b.wait(1, "inline receive")[0];
    assert_eq!((w.status_str(), w.byte_len), ("success", 256));
    assert_eq!(b.mr.to_vec()[..256], sent[..]);

    let big = vec![1u8; cap as usize + 1];
    let too_big = SendWr {
        inline_data: Some(&big),
        ..Default::default()
    };
    assert_eq!(
        qa.post_send(&too_big)
            .expect_err("over max_inline_data")
            .errno(),
        libc::EINVAL
    );
    let sge = [a.mr.sge(0, 8)];
    let both = SendWr {
        inline_data: Some(&big[..8]),
        sg_list: &sge,
        ..Default::default()
    };
    assert_eq!(
        qa.post_send(&both).expect_err("inline and SGEs").errno(),
        libc::EINVAL
    );
    let flag = SendWr {
        send_flags: SEND_INLINE,
        sg_list: &sge,
        ..Default::default()
    };
    assert_eq!(
        qa.post_send(&flag).expect_err("SEND_INLINE flag").errno(),
        libc::EINVAL
    );
}

/// A UD message may be as long as the port's active MTU
/// (`ibv_ud_pingpong` checks `size` against `active_mtu` only), e.g. 4096
/// bytes on a 9000-byte link.
#[test]
fn ud_messages_may_fill_the_port_mtu() {
    let (mut qa, mut qb, ah, mut a, mut b) = ud_pair(9000, 16384, 0);
    let port = a.ctx.query_port(1).expect("query port");
    assert_eq!(port.active_mtu, 5, "a 4096-byte MTU");
    qa.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[a.mr.sge(0, GRH_LEN + 4096)],
    })
    .expect("post recv");
    let ud = UdWr {
        ah: ah.handle(),
        remote_qpn: qa.qp_num(),
        remote_qkey: QKEY,
    };
    ud_send(&mut qb, 1, &[b.mr.sge(0, 4096)], None, ud, None);
    let w = b.wait(1, "4096-byte UD send")[0];
    assert_eq!(w.status_str(), "success");
    let w = a.wait(1, "4096-byte UD receive")[0];
    assert_eq!(w.byte_len as usize, GRH_LEN + 4096);
}

/// `ibv_modify_qp(3)` to RESET empties the work queues: the QP can be
/// brought up again and its rings start afresh (the driver restarts its
/// producer indices, the device its consumer indices and the QP record).
#[test]
fn a_qp_taken_back_to_reset_starts_its_queues_afresh() {
    let (mut qa, mut qb, ah, mut a, mut b) = ud_pair(1500, 8192, 0);
    let ud = UdWr {
        ah: ah.handle(),
        remote_qpn: qa.qp_num(),
        remote_qkey: QKEY,
    };
    let sge = [b.mr.sge(0, 16)];
    // Three messages, so the indices are away from 0, and a receive left posted.
    for n in 0..3u64 {
        b.mr.write(0, &[n as u8; 16]);
        qa.post_recv(&RecvWr {
            wr_id: n,
            sg_list: &[a.mr.sge(0, GRH_LEN + 16)],
        })
        .expect("post recv");
        ud_send(&mut qb, n, &sge, None, ud, None);
        assert!(b.wait(1, "send")[0].is_success());
        assert!(a.wait(1, "receive")[0].is_success());
    }
    qa.post_recv(&RecvWr {
        wr_id: 99,
        sg_list: &[a.mr.sge(1024, GRH_LEN + 16)],
    })
    .expect("post a receive that RESET discards");
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    qa.modify(&reset, QP_ATTR_STATE).expect("RTS -> RESET");
    qb.modify(&reset, QP_ATTR_STATE).expect("RTS -> RESET");
    for (q, n) in [(&mut qa, &a), (&mut qb, &b)] {
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            ..Default::default()
        };
        q.modify(
            &init,
            QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_QKEY,
        )
        .expect("RESET -> INIT");
        connect(q, 7, 0, 0, n.gid(GID_INDEX));
    }
    // The whole depth is free again (the discarded receive is gone) ...
    for i in 0..4u64 {
        qa.post_recv(&RecvWr {
            wr_id: 200 + i,
            sg_list: &[a.mr.sge(2048 + 512 * i as usize, GRH_LEN + 16)],
        })
        .expect("room for max_recv_wr receives after RESET");
    }
    // ... and the next message lands in the first receive posted after it.
    b.mr.write(0, &[0x77; 16]);
    ud_send(&mut qb, 9, &sge, None, ud, None);
    assert!(b.wait(1, "send after RESET")[0].is_success());
    let w = a.wait(1, "receive after RESET")[0];
    assert_eq!((w.wr_id, w.byte_len as usize), (200, GRH_LEN + 16), "{w:?}");
    assert_eq!(
        a.mr.to_vec()[2048 + GRH_LEN..2048 + GRH_LEN + 16],
        [0x77; 16]
    );
}

/// The port's GSI QP (QP1) through the verbs API, as the guest agent will
/// run the CM: one per device, numbered 1, 256-byte MADs from QP1 to QP1
/// with the GSI Q_Key whatever the work request names, the GRH area and
/// the sender's QP1 in the receive completion.
#[test]
fn gsi_qps_exchange_mads_and_only_one_exists_per_device() {
    const MAD: usize = 256;
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (Node::new(&ca, 8192), Node::new(&cb, 8192));
    let mut qa = a.qp(QpType::Gsi, None, 4, 0);
    let mut qb = b.qp(QpType::Gsi, None, 4, 0);
    assert_eq!((qa.qp_num(), qb.qp_num()), (abi::GSI_QPN, abi::GSI_QPN));
    assert_eq!(qa.qp_type(), QpType::Gsi);
    assert!(
        Qp::new(
            &a.pd,
            &QpInitAttr {
                qp_type: QpType::Gsi,
                send_cq: &a.cq,
                recv_cq: &a.cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .is_err(),
        "a second GSI QP on the device"
    );
    connect(&mut qa, 1, 0, 0, Gid::default());
    connect(&mut qb, 2, 0, 0, Gid::default());
    let to_a = b.ah_to(a.gid(GID_INDEX), GID_INDEX);
    let to_b = a.ah_to(b.gid(GID_INDEX), GID_INDEX);
    let (ma, mb) = (pattern(10, MAD), pattern(11, MAD));
    a.mr.write(0, &ma);
    b.mr.write(0, &mb);
    for (qp, node) in [(&mut qa, &a), (&mut qb, &b)] {
        qp.post_recv(&RecvWr {
            wr_id: 5,
            sg_list: &[node.mr.sge(4096, GRH_LEN + MAD)],
        })
        .expect("post recv");
    }
    // The kernel's MAD layer: remote QP 1, "the QP's own" Q_Key; and a
    // work request naming neither, which goes to QP1 with the GSI Q_Key
    // all the same.
    let set_qkey = UdWr {
        ah: to_b.handle(),
        remote_qpn: 1,
        remote_qkey: 0x8000_0000,
    };
    ud_send(&mut qa, 1, &[a.mr.sge(0, MAD)], None, set_qkey, None);
    let anything = UdWr {
        ah: to_a.handle(),
        remote_qpn: 0x42,
        remote_qkey: QKEY,
    };
    ud_send(&mut qb, 2, &[b.mr.sge(0, MAD)], None, anything, None);
    for (node, peer, want) in [(&mut a, 2u8, &mb), (&mut b, 1u8, &ma)] {
        // The node's send and its receive, in either order (one CQ).
        let got = node.wait(2, "the send and the MAD");
        let send = got.iter().find(|w| w.opcode == abi::WC_OP_SEND);
        assert!(send.expect("the send").is_success(), "{got:?}");
        let w = *got
            .iter()
            .find(|w| w.opcode == abi::WC_OP_RECV)
            .expect("the MAD");
        assert_eq!(w.status_str(), "success", "{w:?}");
        assert_eq!((w.wr_id, w.qp_num, w.src_qp), (5, 1, 1));
        assert_eq!(w.byte_len as usize, GRH_LEN + MAD);
        assert_ne!(w.wc_flags & WC_GRH, 0);
        let buf = node.mr.to_vec();
        assert_eq!(&buf[4096 + 32..4096 + 36], &[10, 0, 0, peer], "source");
        assert_eq!(&buf[4096 + GRH_LEN..4096 + GRH_LEN + MAD], &want[..]);
    }
    // Destroyed, QP1 can be created again.
    drop(qa);
    let again = a.qp(QpType::Gsi, None, 4, 0);
    assert_eq!(again.qp_num(), abi::GSI_QPN);
}
