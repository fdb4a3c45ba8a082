//! The IB CM (`vrnic-cm`) over the device's GSI QP (issue 31): two
//! in-process devices, each with QP1 and a `Cm`, connect an RC QP pair with
//! IB CM MADs carried as UD datagrams on QP1 (REQ, REP, RTU), move the RC
//! QPs to RTS with what the CM exchanged (QPNs, starting PSNs), pass a SEND
//! over the connection, and disconnect (DREQ, DREP). The pieces the agent
//! will join, joined by hand: the MAD's sender is read from the GRH area of
//! its receive completion, as the agent will read it.

mod verbs_common;

use verbs_common::{connect, two_contexts, Node, GID_INDEX};
use vrnic_cm::{
    CmEventKind, CmId, CmState, PathParams, PortIdentity, RepParams, ReqParams, Source,
    CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME, CMA_MAX_CM_RETRIES,
};
use vrnic_guest::verbs::*;
use vrnic_wire::{service_id, PortSpace, MAD_LEN};

/// rping's default port, in rdma_cm's TCP port space.
const PORT: u16 = 7174;
/// Receive slots on QP1, each a GRH area and a MAD.
const SLOTS: usize = 8;
const SLOT: usize = 512;
/// Where in each node's MR the QP1 receive slots, the outgoing MAD and the
/// RC message live.
const RECV_AT: usize = 0;
const SEND_AT: usize = SLOTS * SLOT;
const MSG_AT: usize = SEND_AT + SLOT;
const MSG_LEN: usize = 1000;

/// One side: its node, its GSI QP, an address handle to the peer (set once
/// both ends exist) and its CM.
struct End {
    node: Node,
    gsi: Qp,
    to_peer: Option<Ah>,
    cm: vrnic_cm::Cm,
}

fn wire_gid(g: Gid) -> vrnic_wire::Gid {
    vrnic_wire::Gid(g.raw)
}

fn end(ctx: &Context, mac_last: u8) -> End {
    let node = Node::new(ctx, 64 * 1024);
    let mut gsi = node.qp(QpType::Gsi, None, SLOTS as u32, 0);
    connect(&mut gsi, 0, 0, 0, Gid::default());
    for i in 0..SLOTS {
        gsi.post_recv(&RecvWr {
            wr_id: i as u64,
            sg_list: &[node.mr.sge(RECV_AT + i * SLOT, GRH_LEN + MAD_LEN)],
        })
        .expect("post a QP1 receive");
    }
    let cm = vrnic_cm::Cm::new(PortIdentity {
        gid: wire_gid(node.gid(GID_INDEX)),
        ca_guid: vrnic_cm::ca_guid_from_mac([2, 0, 0, 0, 0, mac_last]),
        ca_ack_delay: 15,
        seed: u64::from(mac_last) * 0x9e37_79b9,
    });
    End {
        node,
        gsi,
        to_peer: None,
        cm,
    }
}

/// Sends every MAD `from`'s CM has queued on its QP1 and hands each to
/// `to`'s CM as QP1 receives it (sender from the GRH area); returns how
/// many crossed.
fn pump(now: u64, from: &mut End, to: &mut End) -> usize {
    let mut n = 0;
    while let Some(out) = from.cm.pop_mad() {
        assert_eq!(out.dest_qpn, 1);
        assert_eq!(out.to_gid, wire_gid(to.node.gid(GID_INDEX)), "{out:?}");
        from.node.mr.write(SEND_AT, &out.mad);
        from.gsi
            .post_send(&SendWr {
                wr_id: 100,
                opcode: WrOpcode::Send,
                send_flags: SEND_SIGNALED,
                sg_list: &[from.node.mr.sge(SEND_AT, MAD_LEN)],
                // The kernel's MAD layer: remote QP 1, the QP's own Q_Key.
                ud: UdWr {
                    ah: from.to_peer.as_ref().expect("the peer's AH").handle(),
                    remote_qpn: out.dest_qpn,
                    remote_qkey: 0x8000_0000,
                },
                ..Default::default()
            })
            .expect("post the MAD");
        let sent = from.node.wait(1, "the MAD's send completion");
        assert!(sent[0].is_success(), "{sent:?}");
        let got = to.node.wait(1, "the MAD on QP1");
        let w = got[0];
        assert!(w.is_success(), "{w:?}");
        assert_eq!((w.qp_num, w.src_qp), (1, 1));
        assert_eq!(w.byte_len as usize, GRH_LEN + MAD_LEN);
        let slot = RECV_AT + w.wr_id as usize * SLOT;
        let buf = to.node.mr.to_vec();
        // IPv4: the IPv4 header in bytes 20..40 of the GRH area, its source
        // address at 32..36, the sender's IPv4-mapped GID.
        let src = &buf[slot + 32..slot + 36];
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(src);
        let mad = buf[slot + GRH_LEN..slot + GRH_LEN + MAD_LEN].to_vec();
        to.gsi
            .post_recv(&RecvWr {
                wr_id: w.wr_id,
                sg_list: &[to.node.mr.sge(slot, GRH_LEN + MAD_LEN)],
            })
            .expect("repost the QP1 receive");
        to.cm.handle_mad(
            now,
            Source {
                gid: vrnic_wire::Gid(gid),
                qpn: w.src_qp,
                pkey_index: 0,
            },
            &mad,
        );
        n += 1;
    }
    n
}

fn one_event(e: &mut End) -> (CmId, CmEventKind) {
    let ev = e.cm.pop_event().expect("a CM event");
    assert!(e.cm.pop_event().is_none(), "one event only");
    (ev.id, ev.kind)
}

#[test]
fn an_rc_connection_made_and_ended_by_ib_cm_mads_on_qp1() {
    let (ca, cb) = two_contexts();
    let (mut a, mut b) = (end(&ca, 1), end(&cb, 2));
    a.to_peer = Some(a.node.ah_to(b.node.gid(GID_INDEX), GID_INDEX));
    b.to_peer = Some(b.node.ah_to(a.node.gid(GID_INDEX), GID_INDEX));
    let sid = service_id(PortSpace::Tcp, PORT);
    b.cm.listen(sid).expect("listen");

    let mut ra = a.node.qp(QpType::Rc, None, 4, 0);
    let mut rb = b.node.qp(QpType::Rc, None, 4, 0);
    let (psn_a, psn_b) = (0x0a_0001, 0x0b_0001);

    // REQ: rdma_cm's values (cma.c), A's RC QP and PSN.
    let ida =
        a.cm.connect(
            0,
            &ReqParams {
                service_id: sid,
                qpn: ra.qp_num(),
                starting_psn: psn_a,
                uc: false,
                responder_resources: 1,
                initiator_depth: 1,
                retry_count: 7,
                rnr_retry_count: 7,
                srq: false,
                flow_control: true,
                remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
                local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
                max_cm_retries: CMA_MAX_CM_RETRIES,
                path: PathParams {
                    remote_gid: wire_gid(b.node.gid(GID_INDEX)),
                    mtu: 3,
                    packet_life_time: CMA_IBOE_PACKET_LIFETIME,
                    flow_label: 0,
                    hop_limit: 64,
                    traffic_class: 0,
                    sl: 0,
                    rate: 0,
                },
                private_data: b"vrnic".to_vec(),
            },
        )
        .expect("connect");
    assert_eq!(pump(0, &mut a, &mut b), 1);
    let (idb, kind) = one_event(&mut b);
    let CmEventKind::ReqReceived {
        listener,
        req,
        source,
    } = kind
    else {
        panic!("not a REQ: {kind:?}")
    };
    assert_eq!(listener, sid);
    assert_eq!(source.gid, wire_gid(a.node.gid(GID_INDEX)));
    assert_eq!(&req.private_data[..5], b"vrnic");
    assert_eq!((req.local_qpn, req.starting_psn), (ra.qp_num(), psn_a));

    // B: its QP to RTS with the REQ's QPN and PSN, then REP.
    connect(
        &mut rb,
        psn_b,
        req.local_qpn,
        req.starting_psn,
        a.node.gid(GID_INDEX),
    );
    b.cm.accept(
        0,
        idb,
        &RepParams {
            qpn: rb.qp_num(),
            starting_psn: psn_b,
            responder_resources: 1,
            initiator_depth: 1,
            failover_accepted: 0,
            flow_control: true,
            rnr_retry_count: 7,
            srq: false,
            private_data: b"ok".to_vec(),
        },
    )
    .expect("accept");
    assert_eq!(pump(0, &mut b, &mut a), 1);
    let (id, kind) = one_event(&mut a);
    assert_eq!(id, ida);
    let CmEventKind::RepReceived(rep) = kind else {
        panic!("not a REP: {kind:?}")
    };
    assert_eq!((rep.local_qpn, rep.starting_psn), (rb.qp_num(), psn_b));
    assert_eq!(&rep.private_data[..2], b"ok");

    // A: its QP to RTS with the REP's, then RTU.
    connect(
        &mut ra,
        psn_a,
        rep.local_qpn,
        rep.starting_psn,
        b.node.gid(GID_INDEX),
    );
    a.cm.send_rtu(ida, &[]).expect("RTU");
    assert_eq!(pump(0, &mut a, &mut b), 1);
    let (id, kind) = one_event(&mut b);
    assert_eq!(id, idb);
    assert!(matches!(kind, CmEventKind::RtuReceived), "{kind:?}");
    assert_eq!(a.cm.state(ida), Some(CmState::Established));
    assert_eq!(b.cm.state(idb), Some(CmState::Established));

    // The connection carries data: A sends, B receives it intact.
    let msg: Vec<u8> = (0..MSG_LEN).map(|i| (i * 7 + 3) as u8).collect();
    a.node.mr.write(MSG_AT, &msg);
    rb.post_recv(&RecvWr {
        wr_id: 7,
        sg_list: &[b.node.mr.sge(MSG_AT, MSG_LEN)],
    })
    .expect("post the RC receive");
    ra.post_send(&SendWr {
        wr_id: 8,
        opcode: WrOpcode::Send,
        send_flags: SEND_SIGNALED,
        sg_list: &[a.node.mr.sge(MSG_AT, MSG_LEN)],
        ..Default::default()
    })
    .expect("post the RC send");
    let s = a.node.wait(1, "the RC send");
    assert!(s[0].is_success() && s[0].wr_id == 8, "{s:?}");
    let r = b.node.wait(1, "the RC receive");
    assert!(r[0].is_success() && r[0].wr_id == 7, "{r:?}");
    assert_eq!(r[0].byte_len as usize, MSG_LEN);
    assert_eq!(&b.node.mr.to_vec()[MSG_AT..MSG_AT + MSG_LEN], &msg[..]);

    // DREQ from A, DREP from B; both in timewait, then gone.
    a.cm.disconnect(0, ida, &[]).expect("DREQ");
    assert_eq!(pump(0, &mut a, &mut b), 1);
    let (id, kind) = one_event(&mut b);
    assert_eq!(id, idb);
    assert!(matches!(kind, CmEventKind::DreqReceived { .. }), "{kind:?}");
    b.cm.reply_disconnect(0, idb, &[]).expect("DREP");
    assert_eq!(pump(0, &mut b, &mut a), 1);
    let (id, kind) = one_event(&mut a);
    assert_eq!(id, ida);
    assert!(matches!(kind, CmEventKind::DrepReceived), "{kind:?}");
    assert_eq!(a.cm.state(ida), Some(CmState::Timewait));
    assert_eq!(b.cm.state(idb), Some(CmState::Timewait));
    // Timewait ends on the CM's clock (no MAD crosses).
    for e in [&mut a, &mut b] {
        let t = e.cm.next_timer().expect("the timewait timer");
        e.cm.poll(t);
        assert!(e.cm.pop_mad().is_none());
    }
    assert!(matches!(one_event(&mut a).1, CmEventKind::TimewaitExit));
    assert!(matches!(one_event(&mut b).1, CmEventKind::TimewaitExit));
}
