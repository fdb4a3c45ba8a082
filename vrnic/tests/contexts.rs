//! Device contexts (device spec §5.x.6.13): several programs share one
//! device, each sees only its own objects, and closing a context (a
//! program that exited or was killed) destroys everything it had while
//! the other contexts carry on.

mod common;

use common::*;
use vrnic::abi::{self, Pod};
use vrnic::mem;

fn h(handle: u32) -> abi::Handle {
    abi::Handle {
        handle,
        reserved: 0,
    }
}

#[test]
fn a_context_sees_only_its_own_objects() {
    let (mut a, _b) = pair(1500);
    let c1 = a.open_ctx();
    let c2 = a.open_ctx();
    assert_ne!(c1, c2);
    a.ctx = c1;
    let pd = a.alloc_pd();
    let cq = a.create_cq(16);
    let buf = a.alloc(4096);
    let (lkey, _) = a.reg_mr(pd, buf, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    let qp = a.create_qp(pd, &cq, 16, 1);

    a.ctx = c2;
    let enoent = Err(abi::STATUS_ENOENT);
    assert_eq!(a.cmd(abi::CMD_QUERY_QP, &h(qp.qpn)).map(|_| ()), enoent);
    assert_eq!(a.cmd(abi::CMD_DESTROY_QP, &h(qp.qpn)).map(|_| ()), enoent);
    assert_eq!(a.cmd(abi::CMD_DEREG_MR, &h(lkey)).map(|_| ()), enoent);
    assert_eq!(a.cmd(abi::CMD_DESTROY_CQ, &h(cq.cqn)).map(|_| ()), enoent);
    assert_eq!(a.cmd(abi::CMD_DEALLOC_PD, &h(pd)).map(|_| ()), enoent);
    let [init, _, _] = conn_attrs(qp.qpn, a.ip, 1, ConnOpts::default());
    assert_eq!(a.cmd(abi::CMD_MODIFY_QP, &init).map(|_| ()), enoent);
    assert_eq!(a.reg_mr(pd, buf, 4096, 0), Err(abi::STATUS_ENOENT));
    // Building on another context's PD or CQ is refused.
    let own_pd = a.alloc_pd();
    let own_cq = a.create_cq(16);
    let c = abi::CreateQp {
        pdn: own_pd,
        qp_type: abi::QPT_RC,
        send_cqn: cq.cqn,
        recv_cqn: own_cq.cqn,
        sq_size: 16,
        rq_size: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        sq: a.alloc(4096),
        rq: a.alloc(4096),
        db: a.alloc(16),
        ..Default::default()
    };
    assert_eq!(a.cmd(abi::CMD_CREATE_QP, &c).map(|_| ()), enoent);
    let c = abi::CreateQp {
        pdn: pd,
        send_cqn: own_cq.cqn,
        ..c
    };
    assert_eq!(a.cmd(abi::CMD_CREATE_QP, &c).map(|_| ()), enoent);
    // A doorbell rung by the other context is ignored and counted.
    let before = a.dev.stats().doorbells_ignored;
    let db = abi::Doorbell {
        kind: abi::DB_SQ,
        ctx: c2,
        handle: qp.qpn,
        index: 1,
        ..Default::default()
    };
    let now = a.now;
    a.dev.doorbell(&a.mem, &db, now);
    assert_eq!(a.dev.stats().doorbells_ignored, before + 1);

    // The owner still has everything.
    a.ctx = c1;
    let r = a.cmd(abi::CMD_QUERY_QP, &h(qp.qpn)).unwrap();
    assert_eq!(abi::QpAttr::read_from(&r).unwrap().qpn, qp.qpn);
    a.cmd(abi::CMD_DEREG_MR, &h(lkey)).unwrap();
}

#[test]
fn opening_and_closing_follow_the_rules() {
    let (mut a, _b) = pair(1500);
    let c1 = a.open_ctx();
    assert_eq!(a.dev.context_count(), 2);
    // Only the default context opens and closes contexts.
    a.ctx = c1;
    assert_eq!(
        a.cmd(abi::CMD_OPEN_CTX, &abi::Handle::default())
            .map(|_| ()),
        Err(abi::STATUS_EPERM)
    );
    assert_eq!(
        a.cmd(abi::CMD_CLOSE_CTX, &h(c1.into())).map(|_| ()),
        Err(abi::STATUS_EPERM)
    );
    a.ctx = abi::DEFAULT_CTX;
    assert_eq!(
        a.close_ctx(abi::DEFAULT_CTX).map(|_| ()),
        Err(abi::STATUS_EINVAL)
    );
    assert_eq!(a.close_ctx(77).map(|_| ()), Err(abi::STATUS_ENOENT));
    assert_eq!(
        a.cmd(abi::CMD_CLOSE_CTX, &h(1 << 20)).map(|_| ()),
        Err(abi::STATUS_EINVAL)
    );
    a.close_ctx(c1).unwrap();
    // A closed context's commands find nothing, not even the device.
    a.ctx = c1;
    assert_eq!(
        a.cmd(abi::CMD_ALLOC_PD, &abi::Handle::default())
            .map(|_| ()),
        Err(abi::STATUS_ENOENT)
    );
    // Numbers are not reused at once, and the table is bounded.
    a.ctx = abi::DEFAULT_CTX;
    let mut seen = vec![c1];
    for _ in 0..abi::MAX_CTX - 1 {
        seen.push(a.open_ctx());
    }
    assert_ne!(seen[1], c1, "a closed context's number came back at once");
    assert_eq!(a.dev.context_count(), abi::MAX_CTX);
    assert_eq!(
        a.cmd(abi::CMD_OPEN_CTX, &abi::Handle::default())
            .map(|_| ()),
        Err(abi::STATUS_ENOMEM)
    );
}

/// A program killed mid-transfer: its context is closed while an RC
/// transfer runs. Everything it had is gone (the device's object counts
/// are back to what the other context holds), its peer's QP fails with
/// `RETRY_EXC_ERR` rather than hanging, and another context on the same
/// device completes a transfer afterwards.
#[test]
fn closing_a_context_mid_transfer_frees_everything_and_others_carry_on() {
    let mut p = RcPair::on(
        {
            let (la, lb) = vrnic::link::mem::MemLink::pair();
            (Box::new(la), Box::new(lb))
        },
        ConnOpts {
            retry: 2,
            timeout: 10,
            ..ConnOpts::default()
        },
        true,
    );
    // A second program on node a, in a context of its own, with an MR.
    let other = p.a.open_ctx();
    p.a.ctx = other;
    let opd = p.a.alloc_pd();
    let ocq = p.a.create_cq(16);
    let obuf = p.a.alloc(4096);
    p.a.reg_mr(opd, obuf, 4096, abi::ACCESS_LOCAL_WRITE)
        .unwrap();
    let oqp = p.a.create_qp(opd, &ocq, 16, 1);
    let baseline = p.a.dev.object_counts();

    // The victim: a context of its own on node a, RC-connected to b.
    let victim = p.a.open_ctx();
    p.a.ctx = victim;
    let vpd = p.a.alloc_pd();
    let mut vcq = p.a.create_cq(64);
    let len = 64 * 1024;
    let vbuf = p.a.alloc(len);
    let (vkey, _) =
        p.a.reg_mr(vpd, vbuf, len as u64, abi::ACCESS_LOCAL_WRITE)
            .unwrap();
    let mut vqp = p.a.create_qp(vpd, &vcq, 64, 1);
    let bbuf = p.b.alloc(len);
    let (_, brkey) =
        p.b.reg_mr(
            p.pdb,
            bbuf,
            len as u64,
            abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE,
        )
        .unwrap();
    let mut bqp = p.b.create_qp(p.pdb, &p.cb, 64, 1);
    let o = ConnOpts {
        retry: 2,
        timeout: 10,
        ..ConnOpts::default()
    };
    let (ipa, ipb) = (p.a.ip, p.b.ip);
    p.a.connect_opts(&vqp, ipb, bqp.qpn, o);
    p.b.connect_opts(&bqp, ipa, vqp.qpn, o);
    // Data flows: one WRITE completes.
    let wqe = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: bbuf,
        rkey: brkey,
        ..Default::default()
    };
    let now = p.now;
    p.a.post_send(&mut vqp, wqe, &[sge(vbuf, len as u32, vkey)], now);
    let mut now = p.now;
    run_until(&mut p.a, &mut p.b, &mut now, 10_000, |a, _| {
        a.poll_cq(&mut vcq).is_some()
    });
    // b sends to the victim, which has posted no receive... and then dies.
    let sbuf = p.b.alloc(64);
    let (skey, _) = p.b.reg_mr(p.pdb, sbuf, 64, 0).unwrap();
    let send = abi::SendWqe {
        wr_id: 9,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    p.b.post_send(&mut bqp, send, &[sge(sbuf, 64, skey)], now);
    p.a.pump(now);
    p.a.close_ctx(victim).unwrap();
    assert_eq!(
        p.a.dev.object_counts(),
        baseline,
        "the closed context left objects behind"
    );
    assert_eq!(p.a.dev.context_count(), 2);
    p.a.ctx = abi::DEFAULT_CTX;
    let u = abi::Usage::read_from(&p.a.cmd(abi::CMD_QUERY_USAGE, &h(0)).unwrap()).unwrap();
    assert_eq!(
        [u.ctxs, u.pds, u.mrs, u.cqs, u.qps, u.ahs, u.srqs, u.mr_pages],
        [2, 2, 1, 2, 2, 0, 0, 1],
        "usage after the close: a's default-context pair, the other program's objects"
    );

    // The peer fails cleanly (no hang): RNR or retry exhaustion.
    let mut cb = std::mem::replace(&mut p.cb, p.b.create_cq(1));
    let mut status = None;
    run_until(&mut p.a, &mut p.b, &mut now, 100_000, |_, b| {
        if let Some(c) = b.poll_cq(&mut cb) {
            status = Some(c.status);
        }
        status.is_some()
    });
    assert_eq!(status, Some(abi::WC_RETRY_EXC_ERR));

    // The other context's objects still work: its QP answers a query,
    // its CQ arms, and new objects can be made.
    p.a.ctx = other;
    let r = p.a.cmd(abi::CMD_QUERY_QP, &h(oqp.qpn)).unwrap();
    assert_eq!(abi::QpAttr::read_from(&r).unwrap().qpn, oqp.qpn);
    let _ = p.a.create_cq(16);
}

#[test]
fn events_name_the_owning_context() {
    let mut p = RcPair::on(
        {
            let (la, lb) = vrnic::link::mem::MemLink::pair();
            (Box::new(la), Box::new(lb))
        },
        ConnOpts::default(),
        true,
    );
    let c = p.b.open_ctx();
    p.b.ctx = c;
    let pd = p.b.alloc_pd();
    let mut cq = p.b.create_cq(16);
    let buf = p.b.alloc(4096);
    let (lkey, _) = p.b.reg_mr(pd, buf, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    let mut qp = p.b.create_qp(pd, &cq, 16, 1);
    let (ipa, ipb) = (p.a.ip, p.b.ip);
    let mut aqp = p.a.create_qp(p.pda, &p.ca, 16, 1);
    p.a.connect_opts(&aqp, ipb, qp.qpn, ConnOpts::default());
    p.b.connect_opts(&qp, ipa, aqp.qpn, ConnOpts::default());
    let now = p.now;
    p.b.post_recv(&mut qp, 5, &[sge(buf, 4096, lkey)], now);
    let arm = abi::Doorbell {
        kind: abi::DB_CQ_ARM,
        ctx: c,
        handle: cq.cqn,
        index: 0,
        ..Default::default()
    };
    p.b.dev.doorbell(&p.b.mem, &arm, now);
    let abuf = p.a.alloc(64);
    let (akey, _) = p.a.reg_mr(p.pda, abuf, 64, 0).unwrap();
    let send = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    p.a.post_send(&mut aqp, send, &[sge(abuf, 64, akey)], now);
    let mut now = p.now;
    let mut ev = None;
    run_until(&mut p.a, &mut p.b, &mut now, 10_000, |_, b| {
        if ev.is_none() {
            ev = b.dev.pop_event();
        }
        ev.is_some() && b.poll_cq(&mut cq).is_some()
    });
    let ev = ev.unwrap();
    assert_eq!((ev.kind, ev.handle, ev.ctx), (abi::EV_COMP, cq.cqn, c));
}

/// The counters of QP `qpn` on `node`.
fn qp_stats(node: &Node, qpn: u32) -> vrnic::device::QpStats {
    node.dev
        .qp_stats()
        .into_iter()
        .find(|(n, _)| *n == qpn)
        .map(|(_, s)| s)
        .unwrap()
}

/// Issue 27, finding 8: a program sharing the device through the agent
/// rings doorbells naming another program's queues. Each is ignored (the
/// victim's WQEs written but not yet announced stay unexecuted: nothing is
/// sent, a peer's SEND meets an empty receive queue) and counted in
/// `doorbells_foreign` as well as `doorbells_ignored`; a doorbell naming
/// no object is ignored but not foreign; the victim's own doorbells then
/// run exactly those WQEs.
#[test]
fn a_doorbell_naming_another_contexts_queue_is_ignored_and_counted() {
    let (mut a, mut b) = pair(1500);
    let (victim, intruder) = (a.open_ctx(), a.open_ctx());
    let mut now = 1_000_000_000;
    (a.now, b.now) = (now, now);

    // The victim on node a: a QP with its own RQ, and a QP on an SRQ.
    a.ctx = victim;
    let vpd = a.alloc_pd();
    let mut vcq = a.create_cq(64);
    let vbuf = a.alloc(4096);
    let (vkey, _) = a.reg_mr(vpd, vbuf, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    let mut vqp = a.create_qp(vpd, &vcq, 16, 1);
    let create_srq = abi::CreateSrq {
        pdn: vpd,
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
        ring: a.alloc(4096),
        db: a.alloc(8),
    };
    let srq =
        abi::CreateSrqResp::read_from(&a.cmd(abi::CMD_CREATE_SRQ, &create_srq).unwrap()).unwrap();
    let sqp = a.create_qp_with(
        vpd,
        &vcq,
        QpSpec {
            size: 16,
            sge: 1,
            ..QpSpec::typed(abi::QPT_RC, srq.srqn)
        },
    );
    // The intruder, in another context of the same device, with a CQ.
    a.ctx = intruder;
    let _ipd = a.alloc_pd();
    let icq = a.create_cq(16);

    // The peers on node b (the default context, as a driver that does not
    // share its device uses).
    let bpd = b.alloc_pd();
    let mut bcq = b.create_cq(64);
    let bbuf = b.alloc(4096);
    let (bkey, _) = b.reg_mr(bpd, bbuf, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    let mut bq1 = b.create_qp(bpd, &bcq, 16, 1);
    let mut bq2 = b.create_qp(bpd, &bcq, 16, 1);
    let (ipa, ipb) = (a.ip, b.ip);
    a.ctx = victim;
    a.connect_opts(&vqp, ipb, bq1.qpn, ConnOpts::default());
    a.connect_opts(&sqp, ipb, bq2.qpn, ConnOpts::default());
    b.connect_opts(&bq1, ipa, vqp.qpn, ConnOpts::default());
    b.connect_opts(&bq2, ipa, sqp.qpn, ConnOpts::default());
    b.post_recv(&mut bq1, 100, &[sge(bbuf, 64, bkey)], now);

    let ring = |a: &mut Node, ctx: u16, kind: u16, handle: u32, index: u32| {
        let db = abi::Doorbell {
            kind,
            ctx,
            handle,
            index,
            ..Default::default()
        };
        let now = a.now;
        a.dev.doorbell(&a.mem, &db, now);
    };
    let counts = |a: &Node| {
        let s = a.dev.stats();
        (s.doorbells_foreign, s.doorbells_ignored)
    };
    assert_eq!(counts(&a), (0, 0));

    // CQ arm with a consumer index behind the CQ's: taken, it would raise
    // EV_COMP at once.
    ring(&mut a, intruder, abi::DB_CQ_ARM, vcq.cqn, vcq.ci + 1);
    assert_eq!(counts(&a), (1, 1), "foreign CQ arm");
    assert_eq!(a.dev.pop_event(), None, "a foreign arm raised an event");

    // SQ: a signalled SEND written, announced by the intruder only.
    let send = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    a.write_send(&mut vqp, send, &[sge(vbuf, 64, vkey)]);
    ring(&mut a, intruder, abi::DB_SQ, vqp.qpn, vqp.sq_pi);
    // The default context names no queue of another context either.
    ring(&mut a, abi::DEFAULT_CTX, abi::DB_SQ, vqp.qpn, vqp.sq_pi);
    assert_eq!(counts(&a), (3, 3), "foreign SQ doorbells");
    for _ in 0..10 {
        a.pump(now);
        b.pump(now);
        now += 1_000_000;
    }
    assert_eq!(
        qp_stats(&a, vqp.qpn).tx_packets,
        0,
        "a foreign DB_SQ sent a packet"
    );

    // RQ and SRQ: a receive written into each, announced by the intruder
    // only; the peers' SENDs find nothing and are RNR NAKed.
    a.write_recv(&mut vqp, 2, &[sge(vbuf + 1024, 64, vkey)]);
    ring(&mut a, intruder, abi::DB_RQ, vqp.qpn, vqp.rq_pi);
    let slot = create_srq.ring;
    mem::write_obj(
        &*a.mem,
        slot,
        &abi::RecvWqe {
            wr_id: 3,
            num_sge: 1,
            reserved: 0,
        },
    )
    .unwrap();
    mem::write_obj(&*a.mem, slot + 16, &sge(vbuf + 2048, 64, vkey)).unwrap();
    ring(&mut a, intruder, abi::DB_SRQ, srq.srqn, 1);
    assert_eq!(counts(&a), (5, 5), "foreign RQ and SRQ doorbells");
    let bsend = |wr_id| abi::SendWqe {
        wr_id,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    b.post_send(&mut bq1, bsend(11), &[sge(bbuf + 1024, 32, bkey)], now);
    b.post_send(&mut bq2, bsend(12), &[sge(bbuf + 2048, 32, bkey)], now);
    let rnr = try_run_until(&mut a, &mut b, &mut now, 1000, |a, _| {
        qp_stats(a, vqp.qpn).rnr_naks_sent > 0 && qp_stats(a, sqp.qpn).rnr_naks_sent > 0
    });
    assert!(
        rnr,
        "no RNR NAK: a foreign DB_RQ or DB_SRQ posted a receive"
    );
    assert_eq!(
        a.poll_cq(&mut vcq),
        None,
        "a foreign doorbell completed work"
    );
    assert_eq!(
        b.poll_cq(&mut bcq),
        None,
        "a foreign doorbell completed work"
    );
    assert_eq!(a.dev.pop_event(), None);

    // Ignored but not foreign: an object that does not exist.
    ring(&mut a, intruder, abi::DB_SQ, vqp.qpn + 1000, 1);
    assert_eq!(
        counts(&a),
        (5, 6),
        "a doorbell naming nothing is not foreign"
    );
    // The intruder's own doorbells are taken.
    ring(&mut a, intruder, abi::DB_CQ_ARM, icq.cqn, 0);
    assert_eq!(counts(&a), (5, 6), "the intruder's own arm");

    // The victim's own doorbells run exactly what it had written.
    ring(&mut a, victim, abi::DB_CQ_ARM, vcq.cqn, vcq.ci);
    ring(&mut a, victim, abi::DB_RQ, vqp.qpn, vqp.rq_pi);
    ring(&mut a, victim, abi::DB_SRQ, srq.srqn, 1);
    ring(&mut a, victim, abi::DB_SQ, vqp.qpn, vqp.sq_pi);
    assert_eq!(counts(&a), (5, 6), "the victim's own doorbells");
    let (mut on_a, mut on_b, mut ev) = (Vec::new(), Vec::new(), None);
    run_until(&mut a, &mut b, &mut now, 10_000, |a, b| {
        while let Some(c) = a.poll_cq(&mut vcq) {
            on_a.push((c.wr_id, c.status));
        }
        while let Some(c) = b.poll_cq(&mut bcq) {
            on_b.push((c.wr_id, c.status));
        }
        ev = ev.or_else(|| a.dev.pop_event());
        on_a.len() == 3 && on_b.len() == 3 && ev.is_some()
    });
    on_a.sort_unstable();
    on_b.sort_unstable();
    let ok = abi::WC_SUCCESS;
    assert_eq!(on_a, [(1, ok), (2, ok), (3, ok)]);
    assert_eq!(on_b, [(11, ok), (12, ok), (100, ok)]);
    let ev = ev.unwrap();
    assert_eq!(
        (ev.kind, ev.handle, ev.ctx),
        (abi::EV_COMP, vcq.cqn, victim)
    );
    assert_eq!(counts(&a), (5, 6));
}
