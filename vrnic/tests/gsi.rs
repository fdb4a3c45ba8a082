//! The GSI QP (QP1, `QPT_GSI`; IBTA Vol 1 §13.5, device spec §5.x.6.5
//! "The GSI QP") between two engines over an in-memory link, and against
//! crafted frames: 256-byte MADs from QP1 to QP1 both ways with the GSI's
//! Q_Key, P_Key and UDP source port on the wire and the GRH area in the
//! receive; datagrams with another Q_Key or P_Key, of another transport,
//! or for QP1 while no GSI QP exists, dropped and counted; one GSI QP per
//! device, number 1 never handed to another QP; MADs to addresses nobody
//! answers for (a spoofed sender's) lost after their resolutions, which
//! run together, never stalling the MADs queued behind them.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::*;
use vrnic::abi::{self, Pod};
use vrnic::device::Nanos;
use vrnic::wire::{self, Bth, Frame, Opcode, RoceHeaders};

const MAD: usize = 256;
const ROUNDS: usize = 10_000;

/// A GSI QP on `pd` and `cq` (16 WQEs each way, 1 SGE), or the status
/// `CMD_CREATE_QP` answered.
fn create_gsi(n: &mut Node, pd: u32, cq: &Cq) -> Result<Qp, u32> {
    let size = 16;
    let (sq_stride, rq_stride) = (abi::sq_stride(1, 0), abi::rq_stride(1));
    let sq = n.alloc((size * sq_stride) as usize);
    let rq = n.alloc((size * rq_stride) as usize);
    let rec = n.alloc(16);
    let c = abi::CreateQp {
        pdn: pd,
        qp_type: abi::QPT_GSI,
        send_cqn: cq.cqn,
        recv_cqn: cq.cqn,
        sq_size: size,
        rq_size: size,
        max_send_sge: 1,
        max_recv_sge: 1,
        sq_sig_all: 1,
        sq,
        rq,
        db: rec,
        ..Default::default()
    };
    let r = abi::CreateQpResp::read_from(&n.cmd(abi::CMD_CREATE_QP, &c)?).unwrap();
    Ok(Qp {
        qpn: r.qpn,
        sq,
        rq,
        rec,
        sq_stride: r.sq_stride,
        rq_stride: r.rq_stride,
        sq_size: size,
        rq_size: size,
        sq_pi: 0,
        rq_pi: 0,
    })
}

/// RESET → INIT → RTR → RTS as the kernel's MAD layer moves QP1
/// (`ib_mad_change_qp_state_to_init`: STATE, PKEY_INDEX and QKEY, no
/// PORT), with Q_Key attribute `qkey`.
fn bring_up(n: &mut Node, qpn: u32, qkey: u32) {
    for (mask, state) in [
        (
            abi::QP_ATTR_STATE | abi::QP_ATTR_PKEY_INDEX | abi::QP_ATTR_QKEY,
            abi::QPS_INIT,
        ),
        (abi::QP_ATTR_STATE, abi::QPS_RTR),
        (abi::QP_ATTR_STATE | abi::QP_ATTR_SQ_PSN, abi::QPS_RTS),
    ] {
        let a = abi::QpAttr {
            qpn,
            attr_mask: mask,
            qp_state: state,
            qkey,
            ..Default::default()
        };
        n.cmd(abi::CMD_MODIFY_QP, &a).unwrap();
    }
}

fn destroy_qp(n: &mut Node, qpn: u32) -> Result<Vec<u8>, u32> {
    let h = abi::Handle {
        handle: qpn,
        reserved: 0,
    };
    n.cmd(abi::CMD_DESTROY_QP, &h)
}

/// One side: PD, CQ, GSI QP brought up, a 4 KiB buffer registered, an AH
/// to `peer`.
struct Side {
    pd: u32,
    cq: Cq,
    qp: Qp,
    buf: u64,
    lkey: u32,
    ah: u32,
}

fn side(n: &mut Node, peer: Ipv4Addr) -> Side {
    let pd = n.alloc_pd();
    let cq = n.create_cq(64);
    let qp = create_gsi(n, pd, &cq).expect("create the GSI QP");
    assert_eq!(qp.qpn, abi::GSI_QPN);
    bring_up(n, qp.qpn, abi::GSI_QKEY);
    let buf = n.alloc(4096);
    let (lkey, _) = n.reg_mr(pd, buf, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    let c = abi::CreateAh {
        pdn: pd,
        dgid: peer.to_ipv6_mapped().octets(),
        sgid_index: 1,
        port_num: 1,
        is_global: 1,
        ..Default::default()
    };
    let ah = Node::handle_of(n.cmd(abi::CMD_CREATE_AH, &c).unwrap());
    Side {
        pd,
        cq,
        qp,
        buf,
        lkey,
        ah,
    }
}

fn mad(seed: u8) -> Vec<u8> {
    (0..MAD)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

/// Posts a 256-byte MAD from `s`'s buffer (offset 0) as a SEND to the
/// peer, with the WQE's `remote_qpn` and `remote_qkey` as given.
fn post_mad(n: &mut Node, s: &mut Side, data: &[u8], remote_qpn: u32, remote_qkey: u32) {
    n.fill(s.buf, data);
    let wqe = abi::SendWqe {
        wr_id: 0x3ad,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        remote_qpn,
        remote_qkey,
        ah: s.ah,
        ..Default::default()
    };
    n.post_send(&mut s.qp, wqe, &[sge(s.buf, MAD as u32, s.lkey)], n.now);
}

/// Posts a receive for `s` into its buffer at 1024 (room for the GRH
/// area and a MAD).
fn post_mad_recv(n: &mut Node, s: &mut Side, wr_id: u64) {
    n.post_recv(&mut s.qp, wr_id, &[sge(s.buf + 1024, 2048, s.lkey)], n.now);
}

/// Pumps until `n` CQEs arrived on `cq` of the chosen node (bounded).
fn collect(a: &mut Node, b: &mut Node, on_b: bool, cq: &mut Cq, n: usize) -> Vec<abi::Cqe> {
    let mut got = Vec::new();
    let mut now = a.now.max(b.now);
    run_until(a, b, &mut now, ROUNDS, |a, b| {
        let node = if on_b { b } else { a };
        while let Some(c) = node.poll_cq(cq) {
            got.push(c);
        }
        got.len() >= n
    });
    got
}

/// Checks a MAD receive on `s`: the CQE and the GRH area (IPv4: 20 zero
/// bytes, then the IPv4 header from `src` to `dst`) and the data.
fn check_mad_recv(n: &Node, s: &Side, c: &abi::Cqe, src: Ipv4Addr, want: &[u8]) {
    assert_eq!(c.status, abi::WC_SUCCESS);
    assert_eq!(c.opcode, abi::WC_OP_RECV);
    assert_eq!(c.byte_len, 40 + MAD as u32);
    assert_eq!(c.qp_num, abi::GSI_QPN);
    assert_eq!(c.src_qp, abi::GSI_QPN, "from the peer's QP1");
    assert_eq!(c.wc_flags, abi::WC_GRH);
    let grh = n.read(s.buf + 1024, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20], 0x45, "IPv4 header");
    assert_eq!(&grh[32..36], &src.octets());
    assert_eq!(&grh[36..40], &n.ip.octets());
    assert_eq!(n.read(s.buf + 1024 + 40, MAD), want, "the MAD intact");
}

#[test]
fn gsi_qps_exchange_256_byte_mads_both_ways() {
    let (mut a, mut b) = pair(1500);
    let (ip_a, ip_b) = (a.ip, b.ip);
    let mut sa = side(&mut a, ip_b);
    let mut sb = side(&mut b, ip_a);
    // As the kernel's MAD layer posts them: remote QP 1, Q_Key "the QP's
    // own" (IB_QP_SET_QKEY's high bit).
    post_mad_recv(&mut b, &mut sb, 1);
    let m1 = mad(1);
    post_mad(&mut a, &mut sa, &m1, 1, 0x8000_0000);
    let sent = collect(&mut a, &mut b, false, &mut sa.cq, 1);
    assert_eq!(
        (sent[0].status, sent[0].opcode),
        (abi::WC_SUCCESS, abi::WC_OP_SEND)
    );
    let got = collect(&mut a, &mut b, true, &mut sb.cq, 1);
    assert_eq!(got[0].wr_id, 1);
    check_mad_recv(&b, &sb, &got[0], ip_a, &m1);

    // Back from B, the WQE naming another QP and Q_Key: the GSI QP sends
    // to QP1 with the GSI Q_Key whatever the WQE says. The frame on the
    // wire is checked on its way.
    post_mad_recv(&mut a, &mut sa, 2);
    let m2 = mad(2);
    post_mad(&mut b, &mut sb, &m2, 0x99, 0x1234_5678);
    let frames: Vec<Vec<u8>> = std::iter::from_fn(|| b.dev.pop_tx()).collect();
    assert_eq!(frames.len(), 1, "one datagram, the MAC already known");
    let Ok(Frame::Roce(p)) = wire::parse_frame(&frames[0]) else {
        panic!("not RoCEv2");
    };
    assert_eq!(p.hdr.bth.opcode, Opcode::UdSendOnly);
    assert_eq!(p.hdr.bth.dest_qp, abi::GSI_QPN);
    assert_eq!(p.hdr.bth.pkey, abi::GSI_PKEY);
    let deth = p.hdr.deth.expect("DETH");
    assert_eq!((deth.qkey, deth.src_qp), (abi::GSI_QKEY, abi::GSI_QPN));
    assert_eq!(p.hdr.udp_src, abi::GSI_UDP_SPORT, "rxe's port for QP1");
    assert_eq!(p.payload.len(), MAD);
    for f in &frames {
        a.dev.receive(&a.mem, f, a.now);
    }
    let got = collect(&mut a, &mut b, false, &mut sa.cq, 1);
    assert_eq!(got[0].wr_id, 2);
    check_mad_recv(&a, &sa, &got[0], ip_b, &m2);
    let sent = collect(&mut a, &mut b, true, &mut sb.cq, 1);
    assert_eq!(sent[0].status, abi::WC_SUCCESS);
    assert_eq!(a.dev.stats().rx_dropped + b.dev.stats().rx_dropped, 0);
}

#[test]
fn gsi_refuses_a_second_create_and_destroy_frees_qp1() {
    let (mut n, _peer) = lone_node();
    let pd = n.alloc_pd();
    let cq = n.create_cq(16);
    let qp = create_gsi(&mut n, pd, &cq).unwrap();
    assert_eq!(qp.qpn, abi::GSI_QPN);
    assert_eq!(
        create_gsi(&mut n, pd, &cq).err(),
        Some(abi::STATUS_EBUSY),
        "one GSI QP per device"
    );
    // Another context of the function: first come, first served.
    let other = n.open_ctx();
    let mine = n.ctx;
    n.ctx = other;
    let pd2 = n.alloc_pd();
    let cq2 = n.create_cq(16);
    assert_eq!(create_gsi(&mut n, pd2, &cq2).err(), Some(abi::STATUS_EBUSY));
    // Nor may it destroy the first context's.
    assert_eq!(
        destroy_qp(&mut n, abi::GSI_QPN).err(),
        Some(abi::STATUS_ENOENT)
    );
    n.ctx = mine;
    destroy_qp(&mut n, abi::GSI_QPN).unwrap();
    n.ctx = other;
    let again = create_gsi(&mut n, pd2, &cq2).expect("free again after destroy");
    assert_eq!(again.qpn, abi::GSI_QPN);
    // Closing the owning context frees it too.
    n.close_ctx(other).unwrap();
    n.ctx = mine;
    assert_eq!(create_gsi(&mut n, pd, &cq).unwrap().qpn, abi::GSI_QPN);
}

#[test]
fn qp_numbers_never_take_qp1_or_its_place() {
    let (mut n, _peer) = lone_node();
    let pd = n.alloc_pd();
    let cq = n.create_cq(16);
    // One set of rings for every QP: the device only checks they are
    // driver memory.
    let ring = n.alloc(4096);
    let rec = n.alloc(4096);
    let c = abi::CreateQp {
        pdn: pd,
        qp_type: abi::QPT_UD,
        send_cqn: cq.cqn,
        recv_cqn: cq.cqn,
        sq_size: 1,
        rq_size: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        sq: ring,
        rq: ring + 2048,
        db: rec,
        ..Default::default()
    };
    let create = |n: &mut Node, qp_type: u32| {
        let c = abi::CreateQp { qp_type, ..c };
        n.cmd(abi::CMD_CREATE_QP, &c)
            .map(|r| abi::CreateQpResp::read_from(&r).unwrap().qpn)
    };
    // Numbers cycle from 0x11 through the table's slots several times
    // (slot 1 of 2048 is QP1's): never 1.
    for _ in 0..5000 {
        let qpn = create(&mut n, abi::QPT_RC).unwrap();
        assert!(qpn >= 0x11, "QP number {qpn:#x}");
        destroy_qp(&mut n, qpn).unwrap();
    }
    // With every QP but one alive, the GSI QP still fits; then the device
    // is full.
    let max = vrnic::device::MAX_QP;
    let live: Vec<u32> = (0..max - 1)
        .map(|i| {
            let t = [abi::QPT_RC, abi::QPT_UC, abi::QPT_UD][i % 3];
            create(&mut n, t).unwrap()
        })
        .collect();
    assert!(live.iter().all(|&q| q != abi::GSI_QPN));
    assert_eq!(create(&mut n, abi::QPT_GSI), Ok(abi::GSI_QPN));
    assert_eq!(create(&mut n, abi::QPT_UD), Err(abi::STATUS_ENOMEM));
    assert_eq!(create(&mut n, abi::QPT_GSI), Err(abi::STATUS_ENOMEM));
    destroy_qp(&mut n, abi::GSI_QPN).unwrap();
    let q = create(&mut n, abi::QPT_UD).unwrap();
    assert_ne!(q, abi::GSI_QPN);
    assert_eq!(
        create(&mut n, abi::QPT_GSI),
        Err(abi::STATUS_ENOMEM),
        "QP1 counts against MAX_QP"
    );
}

// ---------------------------------------------------------------------------
// Crafted datagrams (hostile_peer.rs's style): a stranger on the segment.

const STRANGER: (Ipv4Addr, [u8; 6]) = (Ipv4Addr::new(10, 0, 0, 77), [2, 0, 0, 0, 0, 77]);

/// A node alone on a link whose other end the test holds.
fn lone_node() -> (Node, QueueLink) {
    let (la, lb) = QueueLink::pair();
    (Node::new(1, Box::new(la), 1500), lb)
}

/// A UD datagram from the stranger to `dst`'s QP `dest_qp`.
fn datagram(dst: &Node, dest_qp: u32, opcode: Opcode, pkey: u16, qkey: u32) -> RoceHeaders {
    RoceHeaders {
        eth_src: STRANGER.1,
        eth_dst: dst.dev.config_space().mac,
        ip_src: IpAddr::V4(STRANGER.0),
        ip_dst: IpAddr::V4(dst.ip),
        ip_id: 0,
        ttl: 64,
        tclass: 0,
        flow_label: 0,
        udp_src: abi::GSI_UDP_SPORT,
        bth: Bth {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            tver: 0,
            pkey,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn: 0,
        },
        reth: None,
        aeth: None,
        atomic_eth: None,
        atomic_ack_eth: None,
        deth: opcode.has_deth().then_some(wire::Deth {
            qkey,
            src_qp: abi::GSI_QPN,
        }),
        immdt: None,
        ieth: None,
    }
}

fn inject(n: &mut Node, hdr: &RoceHeaders, payload: &[u8], now: Nanos) {
    let mut f = Vec::new();
    wire::emit_frame(hdr, payload, &mut f);
    n.dev.receive(&n.mem, &f, now);
    while n.dev.pop_tx().is_some() {}
}

#[test]
fn gsi_drops_and_counts_wrong_keys_and_other_transports() {
    let (mut n, _peer) = lone_node();
    let pd = n.alloc_pd();
    let mut cq = n.create_cq(16);
    let mut qp = create_gsi(&mut n, pd, &cq).unwrap();
    // The QP's own Q_Key attribute does not change what QP1 accepts.
    let attr_qkey = 0x1111_2222;
    bring_up(&mut n, qp.qpn, attr_qkey);
    let buf = n.alloc(4096);
    let (lkey, _) = n.reg_mr(pd, buf, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    n.post_recv(&mut qp, 7, &[sge(buf, 4096, lkey)], 0);
    let ud = Opcode::UdSendOnly;
    let bad_pkey = [0x1234, 0x8001, 0x0000];
    for pkey in bad_pkey {
        let h = datagram(&n, 1, ud, pkey, abi::GSI_QKEY);
        inject(&mut n, &h, &[1; MAD], 0);
    }
    let bad_qkey = [attr_qkey, abi::GSI_QKEY ^ 1, 0, 0x8000_0000];
    for qkey in bad_qkey {
        let h = datagram(&n, 1, ud, abi::GSI_PKEY, qkey);
        inject(&mut n, &h, &[1; MAD], 0);
    }
    // An RC SEND to QP1: another transport.
    let h = datagram(&n, 1, Opcode::RcSendOnly, abi::GSI_PKEY, 0);
    inject(&mut n, &h, &[1; MAD], 0);
    assert_eq!(n.poll_cq(&mut cq), None, "a bad datagram was received");
    let st = n.dev.stats().clone();
    assert_eq!(st.rx_drop_bad_pkey, bad_pkey.len() as u64);
    assert_eq!(st.rx_drop_bad_qkey, bad_qkey.len() as u64);
    assert_eq!(st.rx_drop_qp_type, 1);
    assert_eq!(st.rx_dropped, (bad_pkey.len() + bad_qkey.len() + 1) as u64);
    let qp1 = n
        .dev
        .qp_stats()
        .into_iter()
        .find(|(q, _)| *q == 1)
        .unwrap()
        .1;
    assert_eq!(qp1.rx_dropped, st.rx_dropped, "counted against QP1");
    // The receive stayed posted for a good one (a limited member of the
    // default partition matches too, as on rxe: IBTA §10.9.3).
    let payload = mad(9);
    let h = datagram(&n, 1, ud, 0x7fff, abi::GSI_QKEY);
    inject(&mut n, &h, &payload, 0);
    let c = n.poll_cq(&mut cq).expect("the good MAD");
    assert_eq!((c.wr_id, c.status), (7, abi::WC_SUCCESS));
    assert_eq!(
        (c.byte_len, c.src_qp, c.wc_flags),
        (40 + MAD as u32, 1, abi::WC_GRH)
    );
    assert_eq!(&n.read(buf + 32, 4), &STRANGER.0.octets());
    assert_eq!(n.read(buf + 40, MAD), payload);
}

#[test]
fn datagrams_for_qp1_without_a_gsi_qp_are_dropped_and_counted() {
    let (mut n, _peer) = lone_node();
    let h = datagram(&n, 1, Opcode::UdSendOnly, abi::GSI_PKEY, abi::GSI_QKEY);
    inject(&mut n, &h, &[3; MAD], 0);
    inject(&mut n, &h, &[], 0);
    let st = n.dev.stats().clone();
    assert_eq!((st.rx_drop_no_gsi, st.rx_dropped), (2, 2));
    // A GSI QP that came and went: the same.
    let pd = n.alloc_pd();
    let cq = n.create_cq(16);
    create_gsi(&mut n, pd, &cq).unwrap();
    destroy_qp(&mut n, abi::GSI_QPN).unwrap();
    inject(&mut n, &h, &[3; MAD], 0);
    assert_eq!(n.dev.stats().rx_drop_no_gsi, 3);
    // Other QPs without a QP are not QP1's.
    let other = datagram(&n, 0x11, Opcode::UdSendOnly, abi::GSI_PKEY, abi::GSI_QKEY);
    inject(&mut n, &other, &[3; MAD], 0);
    let st = n.dev.stats().clone();
    assert_eq!((st.rx_drop_no_gsi, st.rx_dropped), (3, 4));
}

#[test]
fn gsi_posts_only_sends() {
    let (mut a, mut b) = pair(1500);
    let (ip_a, ip_b) = (a.ip, b.ip);
    let mut sa = side(&mut a, ip_b);
    let _sb = side(&mut b, ip_a);
    for opcode in [
        abi::WR_RDMA_WRITE,
        abi::WR_RDMA_READ,
        abi::WR_ATOMIC_FETCH_AND_ADD,
    ] {
        let wqe = abi::SendWqe {
            wr_id: u64::from(opcode),
            opcode,
            send_flags: abi::SEND_SIGNALED,
            remote_qpn: 1,
            ah: sa.ah,
            ..Default::default()
        };
        a.post_send(&mut sa.qp, wqe, &[sge(sa.buf, 8, sa.lkey)], a.now);
        let c = collect(&mut a, &mut b, false, &mut sa.cq, 1);
        assert_eq!(
            (c[0].wr_id, c[0].status),
            (u64::from(opcode), abi::WC_LOC_QP_OP_ERR)
        );
        assert_eq!(
            a.qp_state(abi::GSI_QPN),
            abi::QPS_SQE,
            "UD's send queue error"
        );
        a.cmd(
            abi::CMD_MODIFY_QP,
            &abi::QpAttr {
                qpn: abi::GSI_QPN,
                attr_mask: abi::QP_ATTR_STATE,
                qp_state: abi::QPS_RTS,
                ..Default::default()
            },
        )
        .unwrap();
    }
}

/// An AH on `s`'s PD to `peer`.
fn ah_to(n: &mut Node, s: &Side, peer: Ipv4Addr) -> u32 {
    let c = abi::CreateAh {
        pdn: s.pd,
        dgid: peer.to_ipv6_mapped().octets(),
        sgid_index: 1,
        port_num: 1,
        is_global: 1,
        ..Default::default()
    };
    Node::handle_of(n.cmd(abi::CMD_CREATE_AH, &c).unwrap())
}

/// Issue 31, hostile CM traffic: the CM answers a forged MAD (a DREQ for
/// no connection gets a DREP, a REQ beyond the backlog a REJ) at its
/// source, which a stranger spoofs; nobody answers ARP for it. Such a MAD
/// is lost once its resolution fails (counted `tx_drop_unresolved`), the
/// resolutions of the WQEs queued behind it run at the same time, and a
/// MAD to a live peer behind them all goes out within about one
/// resolution (3 requests, 200 ms apart) rather than one per address.
/// Before, QP1 waited at the first unresolvable address for good: one
/// forged MAD silenced a function's CM.
#[test]
fn gsi_mads_to_unanswered_addresses_are_lost_without_stalling_the_queue() {
    let (mut a, mut b) = pair(1500);
    let (ip_a, ip_b) = (a.ip, b.ip);
    let mut sa = side(&mut a, ip_b);
    let mut sb = side(&mut b, ip_a);
    post_mad_recv(&mut b, &mut sb, 1);
    let to_b = sa.ah;
    // 15 MADs to strangers nobody answers for, then one to B (the send
    // queue holds 16).
    for i in 0..15u8 {
        sa.ah = ah_to(&mut a, &sa, Ipv4Addr::new(10, 0, 0, 100 + i));
        post_mad(&mut a, &mut sa, &mad(i), 1, 0x8000_0000);
    }
    sa.ah = to_b;
    let m = mad(0xb0);
    post_mad(&mut a, &mut sa, &m, 1, 0x8000_0000);
    let start = a.now;
    let got = collect(&mut a, &mut b, true, &mut sb.cq, 1);
    let took = a.now.max(b.now) - start;
    check_mad_recv(&b, &sb, &got[0], ip_a, &m);
    assert!(
        took < 1_500_000_000,
        "the MAD to B waited {took} ns behind the unresolved ones"
    );
    let sent = collect(&mut a, &mut b, false, &mut sa.cq, 16);
    assert!(sent.iter().all(|c| c.status == abi::WC_SUCCESS), "{sent:?}");
    assert_eq!(a.dev.stats().tx_drop_unresolved, 15);
}
