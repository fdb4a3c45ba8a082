//! Verbs semantics a user depends on, between two engines: inline data,
//! 16-SGE gather and scatter, a receive buffer too short for the SEND, and
//! solicited completion events (`ibv_post_send(3)`, `ibv_req_notify_cq(3)`).

mod common;

use common::*;
use vrnic::abi;
use vrnic::mem::{self, DmaMemory};

const ROUNDS: usize = 10_000;

struct Rc {
    a: Node,
    b: Node,
    cqa: Cq,
    cqb: Cq,
    qa: Qp,
    qb: Qp,
    la: u64,
    lka: u32,
    lb: u64,
    lkb: u32,
}

fn rc(sge: u32) -> Rc {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a.create_qp(pa, &cqa, 16, sge);
    let qb = b.create_qp(pb, &cqb, 16, sge);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect(&qa, ipb, qb.qpn, 3, 1, 2, 7, 7);
    b.connect(&qb, ipa, qa.qpn, 3, 2, 1, 7, 7);
    let la = a.alloc(65536);
    let (lka, _) = a.reg_mr(pa, la, 65536, abi::ACCESS_LOCAL_WRITE).unwrap();
    let lb = b.alloc(65536);
    let (lkb, _) = b.reg_mr(pb, lb, 65536, abi::ACCESS_LOCAL_WRITE).unwrap();
    Rc {
        a,
        b,
        cqa,
        cqb,
        qa,
        qb,
        la,
        lka,
        lb,
        lkb,
    }
}

fn wait(r: &mut Rc, on_b: bool) -> abi::Cqe {
    let mut got = None;
    let mut now = 0;
    let (cqa, cqb) = (&mut r.cqa, &mut r.cqb);
    run_until(&mut r.a, &mut r.b, &mut now, ROUNDS, |a, b| {
        got = if on_b { b.poll_cq(cqb) } else { a.poll_cq(cqa) };
        got.is_some()
    });
    got.expect("checked by run_until")
}

#[test]
fn inline_send_needs_no_mr_and_arrives_intact() {
    let mut r = rc(1);
    let data: Vec<u8> = (0..60u8).collect();
    let sge = abi::Sge {
        addr: r.lb,
        length: 100,
        lkey: r.lkb,
    };
    r.b.post_recv(&mut r.qb, 1, &[sge], 0);
    // The WQE carries the bytes after its 64-byte header (SEND_INLINE).
    let slot = r.qa.sq + (r.qa.sq_pi % r.qa.sq_size) as u64 * r.qa.sq_stride as u64;
    let w = abi::SendWqe {
        wr_id: 9,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED | abi::SEND_INLINE,
        inline_len: data.len() as u32,
        ..Default::default()
    };
    mem::write_obj(&r.a.mem, slot, &w).unwrap();
    r.a.mem.write(slot + 64, &data).unwrap();
    r.qa.sq_pi += 1;
    let db = abi::Doorbell {
        kind: abi::DB_SQ,
        handle: r.qa.qpn,
        index: r.qa.sq_pi,
        ..Default::default()
    };
    r.a.dev.doorbell(&r.a.mem, &db, 0);
    assert_eq!(wait(&mut r, false).status, abi::WC_SUCCESS);
    let c = wait(&mut r, true);
    assert_eq!((c.status, c.byte_len), (abi::WC_SUCCESS, 60));
    assert_eq!(r.b.read(r.lb, 60), data);
}

#[test]
fn sixteen_sges_gather_and_scatter_in_order() {
    let mut r = rc(16);
    let piece = 300u32;
    let all: Vec<u8> = (0..16 * piece).map(|i| (i % 241) as u8).collect();
    // Gather from 16 pieces spread out in A's MR, scatter to 16 pieces in B's.
    let send: Vec<abi::Sge> = (0..16u64)
        .map(|i| {
            let addr = r.la + i * 1000;
            let k = i as usize * piece as usize;
            r.a.fill(addr, &all[k..k + piece as usize]);
            abi::Sge {
                addr,
                length: piece,
                lkey: r.lka,
            }
        })
        .collect();
    let recv: Vec<abi::Sge> = (0..16u64)
        .map(|i| abi::Sge {
            addr: r.lb + 40000 - i * 2000,
            length: piece,
            lkey: r.lkb,
        })
        .collect();
    r.b.post_recv(&mut r.qb, 1, &recv, 0);
    let w = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    r.a.post_send(&mut r.qa, w, &send, 0);
    assert_eq!(wait(&mut r, false).status, abi::WC_SUCCESS);
    let c = wait(&mut r, true);
    assert_eq!((c.status, c.byte_len), (abi::WC_SUCCESS, 16 * piece));
    for (i, s) in recv.iter().enumerate() {
        let k = i * piece as usize;
        assert_eq!(
            r.b.read(s.addr, piece as usize),
            &all[k..k + piece as usize]
        );
    }
}

#[test]
fn a_send_longer_than_the_receive_buffer_fails_on_both_sides() {
    let mut r = rc(1);
    let sge = abi::Sge {
        addr: r.lb,
        length: 100,
        lkey: r.lkb,
    };
    r.b.post_recv(&mut r.qb, 1, &[sge], 0);
    let w = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    let send = abi::Sge {
        addr: r.la,
        length: 101,
        lkey: r.lka,
    };
    r.a.post_send(&mut r.qa, w, &[send], 0);
    // IBTA §9.9.3.1.1: the responder NAKs (invalid request); the receive
    // completes with a local length error.
    assert_eq!(wait(&mut r, false).status, abi::WC_REM_INV_REQ_ERR);
    assert_eq!(wait(&mut r, true).status, abi::WC_LOC_LEN_ERR);
}

#[test]
fn a_cq_armed_for_solicited_completions_fires_only_for_solicited_ones() {
    let mut r = rc(1);
    for i in 0..2 {
        r.b.post_recv(&mut r.qb, i, &[], 0);
    }
    let arm = abi::Doorbell {
        kind: abi::DB_CQ_ARM_SOLICITED,
        handle: r.cqb.cqn,
        index: r.cqb.ci,
        ..Default::default()
    };
    r.b.dev.doorbell(&r.b.mem, &arm, 0);
    let plain = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    r.a.post_send(&mut r.qa, plain, &[], 0);
    assert_eq!(wait(&mut r, true).wr_id, 0);
    let events = |n: &mut Node| {
        std::iter::from_fn(|| n.dev.pop_event())
            .filter(|e| e.kind == abi::EV_COMP)
            .count()
    };
    assert_eq!(events(&mut r.b), 0, "an unsolicited SEND raises no event");
    let solicited = abi::SendWqe {
        send_flags: abi::SEND_SIGNALED | abi::SEND_SOLICITED,
        ..plain
    };
    r.a.post_send(&mut r.qa, solicited, &[], 0);
    assert_eq!(wait(&mut r, true).wr_id, 1);
    assert_eq!(events(&mut r.b), 1, "the solicited SEND raises one");
}

#[test]
fn arming_a_cq_behind_its_completions_fires_at_once() {
    // Doorbells are asynchronous: a CQE may be written after the driver's
    // last poll and before the device processes its arm. The arm's consumer
    // index tells the device; it must raise the event then, not wait for
    // the next completion (which a ping-pong never sends).
    let mut r = rc(1);
    r.b.post_recv(&mut r.qb, 0, &[], 0);
    let stale = r.cqb.ci;
    let send = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    r.a.post_send(&mut r.qa, send, &[], 0);
    assert_eq!(wait(&mut r, true).wr_id, 0);
    let cqn = r.cqb.cqn;
    let events = |n: &mut Node| {
        std::iter::from_fn(|| n.dev.pop_event())
            .filter(|e| e.kind == abi::EV_COMP && e.handle == cqn)
            .count()
    };
    assert_eq!(events(&mut r.b), 0);
    let arm = |index| abi::Doorbell {
        kind: abi::DB_CQ_ARM,
        handle: cqn,
        index,
        ..Default::default()
    };
    r.b.dev.doorbell(&r.b.mem, &arm(stale), 0);
    assert_eq!(
        events(&mut r.b),
        1,
        "armed behind a written CQE: event at once"
    );
    r.b.dev.doorbell(&r.b.mem, &arm(r.cqb.ci), 0);
    assert_eq!(
        events(&mut r.b),
        0,
        "armed up to date: waits for the next CQE"
    );
    r.b.post_recv(&mut r.qb, 2, &[], 0);
    r.a.post_send(&mut r.qa, abi::SendWqe { wr_id: 3, ..send }, &[], 0);
    assert_eq!(wait(&mut r, true).wr_id, 2);
    assert_eq!(events(&mut r.b), 1, "the next CQE fires the armed CQ");
}

#[test]
fn per_qp_counters_follow_the_device_counters_of_their_qp() {
    use vrnic::link::fault::FaultRates;
    let rates = FaultRates {
        drop: 0.1,
        ..Default::default()
    };
    let (mut a, mut b) = lossy_pair(1500, 3, rates);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (mut cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let mut qa = a.create_qp(pa, &cqa, 64, 1);
    let mut qb = b.create_qp(pb, &cqb, 64, 1);
    let idle = a.create_qp(pa, &cqa, 4, 1);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect(&qa, ipb, qb.qpn, 3, 1, 2, 7, 7);
    b.connect(&qb, ipa, qa.qpn, 3, 2, 1, 7, 7);
    let la = a.alloc(8192);
    let (lka, _) = a.reg_mr(pa, la, 8192, abi::ACCESS_LOCAL_WRITE).unwrap();
    for i in 0..40 {
        b.post_recv(&mut qb, i, &[], 0);
    }
    for i in 0..40 {
        let w = abi::SendWqe {
            wr_id: i,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        let _ = (la, lka);
        a.post_send(&mut qa, w, &[], 0);
    }
    let mut done = 0;
    let mut now = 0;
    run_until(&mut a, &mut b, &mut now, ROUNDS, |a, _| {
        while let Some(c) = a.poll_cq(&mut cqa) {
            assert_eq!(c.status, abi::WC_SUCCESS);
            done += 1;
        }
        done == 40
    });
    let stats = a.dev.qp_stats();
    let get = |qpn: u32| stats.iter().find(|(n, _)| *n == qpn).unwrap().1;
    let (busy, quiet) = (get(qa.qpn), get(idle.qpn));
    // Recovered by go-back-N after NAKs, tail loss probes (answered by
    // ACKs or NAKs: not per QP) or ACK timeouts.
    assert!(
        busy.retransmits + busy.nak_psn_seq_received + a.dev.stats().tail_probes > 0,
        "10% loss forces recovery"
    );
    assert_eq!(
        busy.retransmits,
        a.dev.stats().retransmits,
        "all of them this QP's"
    );
    assert!(busy.tx_packets >= 40 && busy.rx_packets > 0);
    assert_eq!(
        quiet,
        vrnic::device::QpStats::default(),
        "an idle QP counts nothing"
    );
    let responder = b.dev.qp_stats()[0].1;
    assert_eq!(responder.duplicates, b.dev.stats().duplicates);
    assert_eq!(
        responder.nak_psn_seq_sent,
        b.dev.stats().nak_psn_seq_sent,
        "sequence NAKs are the responder QP's"
    );
}
