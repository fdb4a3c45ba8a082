//! Per-QP counters ([`vrnic::device::QpStats`]): each transport event is
//! counted on the QP it happened to (remote access NAKs, RNR NAKs,
//! retransmissions, duplicates, packets and payload bytes), QPs that did
//! nothing count nothing, the per-QP counters add up to the device's, and
//! they go with their QP.

mod common;

use common::*;
use vrnic::abi;
use vrnic::device::{Device, QpStats};
use vrnic::link::fault::FaultRates;

const ALL: u32 = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;
/// Path MTU 1024 as `ibv_mtu`.
const MTU_1024: u32 = 3;
/// Bound on the simulated rounds of one exchange.
const ROUNDS: usize = 50_000;

/// Two nodes with one connected RC QP each (and one CQ per node for both
/// directions), plus an idle QP on A that is never connected.
struct Rc {
    a: Node,
    b: Node,
    qa: Qp,
    qb: Qp,
    idle: u32,
    ca: Cq,
    cb: Cq,
    pda: u32,
    pdb: u32,
    now: u64,
}

fn rc(mut a: Node, mut b: Node, rnr_retry: u8) -> Rc {
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let (ca, cb) = (a.create_cq(256), b.create_cq(256));
    let qa = a.create_qp(pda, &ca, 64, 1);
    let idle = a.create_qp(pda, &ca, 4, 1).qpn;
    let qb = b.create_qp(pdb, &cb, 64, 1);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect(&qa, ipb, qb.qpn, MTU_1024, 10, 20, 7, rnr_retry);
    b.connect(&qb, ipa, qa.qpn, MTU_1024, 20, 10, 7, rnr_retry);
    Rc {
        a,
        b,
        qa,
        qb,
        idle,
        ca,
        cb,
        pda,
        pdb,
        now: 1_000_000_000,
    }
}

/// The counters of QP `qpn` of `dev`.
fn of(dev: &Device, qpn: u32) -> QpStats {
    dev.qp_stats()
        .into_iter()
        .find(|(n, _)| *n == qpn)
        .unwrap_or_else(|| panic!("QP {qpn} has no counters"))
        .1
}

/// Every per-QP counter summed over the device's QPs.
fn sum(dev: &Device) -> Vec<(&'static str, u64)> {
    let mut total: Vec<(&'static str, u64)> = QpStats::default().iter().collect();
    for (_, s) in dev.qp_stats() {
        for (t, (_, v)) in total.iter_mut().zip(s.iter()) {
            t.1 += v;
        }
    }
    total
}

/// Waits for one completion on A's (`on_b` false) or B's CQ.
fn wait_cqe(s: &mut Rc, on_b: bool) -> abi::Cqe {
    let mut got = None;
    let Rc {
        a, b, ca, cb, now, ..
    } = s;
    run_until(a, b, now, ROUNDS, |a, b| {
        got = if on_b { b.poll_cq(cb) } else { a.poll_cq(ca) };
        got.is_some()
    });
    got.expect("run_until returned with a completion")
}

#[test]
fn a_bad_rkey_write_counts_one_remote_access_nak_on_each_qp() {
    let (a, b) = pair(1500);
    let mut s = rc(a, b, 7);
    let src = s.a.alloc(4096);
    let dst = s.b.alloc(4096);
    let (lk, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let (_, rk) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let wqe = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: dst,
        rkey: rk ^ 0x100,
        ..Default::default()
    };
    let now = s.now;
    s.a.post_send(&mut s.qa, wqe, &[sge(src, 200, lk)], now);
    let c = wait_cqe(&mut s, false);
    assert_eq!(c.status, abi::WC_REM_ACCESS_ERR);

    let req = of(&s.a.dev, s.qa.qpn);
    let resp = of(&s.b.dev, s.qb.qpn);
    assert_eq!(
        (resp.nak_rem_access_sent, req.nak_rem_access_received),
        (1, 1),
        "one NAK sent by the responder's QP, received by the requester's"
    );
    for (name, v) in resp.iter().chain(req.iter()) {
        if name.starts_with("nak_") && !name.starts_with("nak_rem_access") {
            assert_eq!(v, 0, "{name}");
        }
    }
    assert_eq!((req.tx_packets, req.tx_bytes), (1, 200), "one WRITE ONLY");
    assert_eq!((resp.rx_packets, resp.rx_bytes), (1, 200));
    assert_eq!((resp.tx_packets, resp.tx_bytes), (1, 0), "the NAK");
    assert_eq!((req.rx_packets, req.rx_bytes), (1, 0));
    assert_eq!(req.retransmits + resp.retransmits, 0);
    assert_eq!(
        of(&s.a.dev, s.idle),
        QpStats::default(),
        "an idle QP counts nothing"
    );
    let (da, db) = (s.a.dev.stats(), s.b.dev.stats());
    assert_eq!((db.nak_rem_access_sent, da.nak_rem_access_received), (1, 1));
    assert_eq!((da.tx_bytes, db.rx_bytes), (200, 200));
}

#[test]
fn rnr_naks_and_the_retries_after_them_are_counted_on_their_qps() {
    let (a, b) = pair(1500);
    let mut s = rc(a, b, 7);
    let src = s.a.alloc(4096);
    let dst = s.b.alloc(4096);
    let (lka, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let (lkb, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let wqe = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    let now = s.now;
    s.a.post_send(&mut s.qa, wqe, &[sge(src, 100, lka)], now);
    // No receive posted: B refuses the SEND until A has retried twice.
    {
        let Rc { a, b, now, qa, .. } = &mut s;
        let qpn = qa.qpn;
        run_until(a, b, now, ROUNDS, |a, _| of(&a.dev, qpn).retransmits >= 2);
    }
    let now = s.now;
    s.b.post_recv(&mut s.qb, 2, &[sge(dst, 100, lkb)], now);
    assert_eq!(wait_cqe(&mut s, false).status, abi::WC_SUCCESS);
    assert_eq!(wait_cqe(&mut s, true).status, abi::WC_SUCCESS);

    let req = of(&s.a.dev, s.qa.qpn);
    let resp = of(&s.b.dev, s.qb.qpn);
    assert!(resp.rnr_naks_sent >= 2, "{resp:?}");
    assert_eq!(req.rnr_naks_received, resp.rnr_naks_sent, "none lost");
    assert_eq!(
        req.retransmits, req.rnr_naks_received,
        "one retry per RNR back-off"
    );
    assert_eq!(req.tx_packets, req.retransmits + 1, "each try is one SEND");
    assert_eq!(req.tx_bytes, 100 * req.tx_packets);
    assert_eq!(resp.rx_bytes, req.tx_bytes);
    assert_eq!(
        naks(&resp) + naks(&req),
        0,
        "RNR NAKs are not counted as NAKs"
    );
    let (da, db) = (s.a.dev.stats(), s.b.dev.stats());
    assert_eq!(db.rnr_naks_sent, resp.rnr_naks_sent);
    assert_eq!(da.rnr_naks_received, req.rnr_naks_received);
    assert_eq!(of(&s.a.dev, s.idle), QpStats::default());
}

/// Sum of the per-code NAK counters of `q`.
fn naks(q: &QpStats) -> u64 {
    q.iter()
        .filter(|(n, _)| n.starts_with("nak_"))
        .map(|(_, v)| v)
        .sum()
}

#[test]
fn a_lossy_exchange_counts_retransmissions_and_duplicates_where_they_happen() {
    let rates = FaultRates {
        drop: 0.1,
        duplicate: 0.05,
        ..Default::default()
    };
    let (a, b) = lossy_pair(1500, 11, rates);
    let mut s = rc(a, b, 7);
    // One single-packet SEND at a time: a lost SEND or ACK is found by the
    // ACK timeout (a retransmission), and a retransmitted SEND whose ACK
    // was lost is a duplicate at the responder.
    let (n, len) = (100u64, 500u32);
    let src = s.a.alloc(len as usize);
    let dst = s.b.alloc(len as usize);
    let (lka, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
    let (lkb, _) = s.b.reg_mr(s.pdb, dst, len as u64, ALL).unwrap();
    for i in 0..n {
        let now = s.now;
        s.b.post_recv(&mut s.qb, i, &[sge(dst, len, lkb)], now);
        let wqe = abi::SendWqe {
            wr_id: i,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        s.a.post_send(&mut s.qa, wqe, &[sge(src, len, lka)], now);
        let c = wait_cqe(&mut s, false);
        assert_eq!((c.wr_id, c.status), (i, abi::WC_SUCCESS));
        assert_eq!(wait_cqe(&mut s, true).status, abi::WC_SUCCESS);
    }

    let req = of(&s.a.dev, s.qa.qpn);
    let resp = of(&s.b.dev, s.qb.qpn);
    assert!(
        req.retransmits > 0,
        "10% loss needs retransmissions: {req:?}"
    );
    assert!(resp.duplicates > 0, "duplicate requests: {resp:?}");
    assert!(req.tx_packets > n, "{n} SENDs and their retries: {req:?}");
    assert_eq!(req.tx_bytes, len as u64 * req.tx_packets, "{req:?}");
    assert!(resp.tx_packets >= n, "an ACK per SEND: {resp:?}");
    assert_eq!(of(&s.a.dev, s.idle), QpStats::default());
    // With one busy QP per device, its counters are the device's.
    for (dev, qpn) in [(&s.a.dev, s.qa.qpn), (&s.b.dev, s.qb.qpn)] {
        let st = dev.stats();
        let q = of(dev, qpn);
        assert_eq!(q.retransmits, st.retransmits);
        assert_eq!(q.duplicates, st.duplicates);
        assert_eq!(q.nak_psn_seq_sent, st.nak_psn_seq_sent);
        assert_eq!(q.nak_psn_seq_received, st.nak_psn_seq_received);
        assert_eq!((q.tx_bytes, q.rx_bytes), (st.tx_bytes, st.rx_bytes));
        assert_eq!(sum(dev), q.iter().collect::<Vec<_>>());
    }
}

#[test]
fn a_send_resumed_by_modify_qp_is_counted_on_its_qp() {
    let (a, b) = pair(1500);
    let mut s = rc(a, b, 7);
    let src = s.a.alloc(4096);
    let dst = s.b.alloc(4096);
    let (lka, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let (lkb, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let send = |wr_id| abi::SendWqe {
        wr_id,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    // A first SEND resolves B's address and leaves nothing in flight.
    let now = s.now;
    s.b.post_recv(&mut s.qb, 1, &[sge(dst, 4096, lkb)], now);
    s.b.post_recv(&mut s.qb, 2, &[sge(dst, 4096, lkb)], now);
    s.a.post_send(&mut s.qa, send(1), &[sge(src, 10, lka)], now);
    assert_eq!(wait_cqe(&mut s, false).status, abi::WC_SUCCESS);
    let sent = |s: &Rc| {
        let q = of(&s.a.dev, s.qa.qpn);
        (q.tx_packets, q.tx_bytes)
    };
    assert_eq!(sent(&s), (1, 10));

    let to = |state| abi::QpAttr {
        qpn: s.qa.qpn,
        attr_mask: abi::QP_ATTR_STATE,
        qp_state: state,
        ..Default::default()
    };
    let (sqd, rts) = (to(abi::QPS_SQD), to(abi::QPS_RTS));
    s.a.cmd(abi::CMD_MODIFY_QP, &sqd).unwrap();
    let now = s.now;
    s.a.post_send(&mut s.qa, send(2), &[sge(src, 64, lka)], now);
    assert_eq!(sent(&s), (1, 10), "held in SQD");
    // SQD → RTS sends the waiting WQE from inside the command.
    s.a.cmd(abi::CMD_MODIFY_QP, &rts).unwrap();
    assert_eq!(sent(&s), (2, 74), "sent by MODIFY_QP");
    assert_eq!(wait_cqe(&mut s, false).status, abi::WC_SUCCESS);
}

#[test]
fn counters_go_with_their_qp_and_a_reset() {
    let (a, b) = pair(1500);
    let mut s = rc(a, b, 7);
    let qpns: Vec<u32> = s.a.dev.qp_stats().iter().map(|(n, _)| *n).collect();
    let mut sorted = vec![s.qa.qpn, s.idle];
    sorted.sort_unstable();
    assert_eq!(qpns, sorted, "every QP, by QP number");
    let h = abi::Handle {
        handle: s.idle,
        reserved: 0,
    };
    s.a.cmd(abi::CMD_DESTROY_QP, &h).unwrap();
    assert_eq!(
        s.a.dev
            .qp_stats()
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        vec![s.qa.qpn]
    );
    let before = s.b.dev.stats().clone();
    s.b.dev.reset();
    assert!(s.b.dev.qp_stats().is_empty());
    assert_eq!(*s.b.dev.stats(), before, "device-wide counters stay");
}
