//! Device contexts (device spec §5.x.6.13): several programs share one
//! device, each sees only its own objects, and closing a context (a
//! program that exited or was killed) destroys everything it had while
//! the other contexts carry on.

mod common;

use common::*;
use vrnic::abi::{self, Pod};

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
