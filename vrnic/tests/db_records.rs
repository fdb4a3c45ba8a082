//! Doorbell records (device spec §5.x.6.9, "Doorbell records"): while
//! the device polls, a QP created with `QP_F_SQ_RECORD` or
//! `QP_F_RQ_RECORD` that rang is watched — `QP_REC_POLLED` set in its
//! record — and send (receive) WQEs whose producer index the driver only
//! wrote to the record are executed (used), in order, intact; when polling
//! ends the flag is cleared and what the record holds is taken once more,
//! so no WQE waits for a doorbell that was left out. A bad index in a
//! record is ignored and counted once, and a doorbell the record overtook
//! is no error.

mod common;

use common::*;
use vrnic::abi;
use vrnic::mem::DmaMemory;

const ROUNDS: usize = 10_000;

/// The device's flags in `q`'s QP record on `node`.
fn record_flags(node: &Node, q: &Qp) -> u32 {
    let mut b = [0u8; 4];
    node.mem.read(q.rec + abi::QP_REC_FLAGS, &mut b).unwrap();
    u32::from_le_bytes(b)
}

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
    now: u64,
}

/// A (with `flags` on its QP) and B connected, 16 WQEs a queue, a 64 KiB
/// MR each.
fn rc(flags: u32) -> Rc {
    rc_with(flags, 0)
}

/// [`rc`] with `flags_b` on B's QP.
fn rc_with(flags: u32, flags_b: u32) -> Rc {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let spec = QpSpec {
        size: 16,
        sge: 1,
        ..QpSpec::rc()
    };
    let qa = a.create_qp_with(pa, &cqa, QpSpec { flags, ..spec });
    let qb = b.create_qp_with(
        pb,
        &cqb,
        QpSpec {
            flags: flags_b,
            ..spec
        },
    );
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
        now: 0,
    }
}

impl Rc {
    /// Writes SEND `n` (100 bytes of `n`) into A's SQ, without a doorbell,
    /// and a receive WQE for it on B.
    fn write_send(&mut self, n: u8) {
        let off = u64::from(n) * 100;
        self.a.fill(self.la + off, &[n; 100]);
        let recv = sge(self.lb + off, 100, self.lkb);
        let now = self.now;
        self.b.post_recv(&mut self.qb, n.into(), &[recv], now);
        let w = abi::SendWqe {
            wr_id: n.into(),
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        self.a
            .write_send(&mut self.qa, w, &[sge(self.la + off, 100, self.lka)]);
    }

    /// Writes a receive WQE for SEND `n` on B, without a doorbell, and
    /// SEND `n` into A's SQ, rung.
    fn send_to_unannounced_recv(&mut self, n: u8) {
        let off = u64::from(n) * 100;
        self.a.fill(self.la + off, &[n; 100]);
        let recv = sge(self.lb + off, 100, self.lkb);
        self.b.write_recv(&mut self.qb, n.into(), &[recv]);
        let w = abi::SendWqe {
            wr_id: n.into(),
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        let now = self.now;
        self.a
            .post_send(&mut self.qa, w, &[sge(self.la + off, 100, self.lka)], now);
    }

    /// Writes B's RQ producer index `pi` into its QP record.
    fn write_rq_record(&mut self, pi: u32) {
        self.b
            .mem
            .write(self.qb.rec + abi::QP_REC_RQ_PI, &pi.to_le_bytes())
            .unwrap();
    }

    /// Rings `DB_SQ` on A with the QP's producer index.
    fn ring(&mut self) {
        let db = abi::Doorbell {
            ctx: self.a.ctx,
            kind: abi::DB_SQ,
            handle: self.qa.qpn,
            index: self.qa.sq_pi,
            ..Default::default()
        };
        self.a.dev.doorbell(&self.a.mem, &db, self.now);
    }

    /// Writes A's SQ producer index `pi` into its QP record, as a driver
    /// with `QP_F_SQ_RECORD` does.
    fn write_record(&mut self, pi: u32) {
        self.a
            .mem
            .write(self.qa.rec + abi::QP_REC_SQ_PI, &pi.to_le_bytes())
            .unwrap();
    }

    /// A's record flags.
    fn flags(&self) -> u32 {
        record_flags(&self.a, &self.qa)
    }

    /// Runs both nodes until B received SENDs `ns` in order, intact, and A
    /// completed them.
    fn expect_sends(&mut self, ns: &[u8]) {
        for &n in ns {
            let mut got = None;
            let (cqa, cqb) = (&mut self.cqa, &mut self.cqb);
            run_until(&mut self.a, &mut self.b, &mut self.now, ROUNDS, |_, b| {
                got = b.poll_cq(cqb);
                got.is_some()
            });
            let c = got.expect("checked by run_until");
            assert_eq!(
                (c.status, c.wr_id, c.byte_len),
                (abi::WC_SUCCESS, n.into(), 100)
            );
            let off = u64::from(n) * 100;
            assert_eq!(self.b.read(self.lb + off, 100), vec![n; 100], "SEND {n}");
            let mut done = None;
            run_until(&mut self.a, &mut self.b, &mut self.now, ROUNDS, |a, _| {
                done = a.poll_cq(cqa);
                done.is_some()
            });
            assert_eq!(
                done.map(|c| (c.status, c.wr_id)),
                Some((abi::WC_SUCCESS, n.into()))
            );
        }
    }

    /// Pumps both nodes for `rounds` rounds (simulated milliseconds) and
    /// checks that B received nothing.
    fn expect_nothing(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.a.pump(self.now);
            self.b.pump(self.now);
            self.now += 1_000_000;
        }
        assert_eq!(
            self.b.poll_cq(&mut self.cqb),
            None,
            "a SEND nobody announced"
        );
    }
}

#[test]
fn sends_announced_in_the_record_while_the_device_polls_need_no_doorbell() {
    let mut r = rc(abi::QP_F_SQ_RECORD);
    r.a.dev.begin_record_polling();
    // The first SEND rings: from then on the device watches the record.
    r.write_send(1);
    r.write_record(1);
    assert_eq!(r.flags(), 0);
    r.ring();
    assert_eq!(r.flags(), abi::QP_REC_POLLED);
    r.expect_sends(&[1]);
    // Two more, announced in the record only: nothing until the device
    // reads it, then both, in order.
    r.write_send(2);
    r.write_send(3);
    r.write_record(3);
    r.expect_nothing(3);
    assert!(r.a.dev.poll_records(&r.a.mem, r.now));
    assert!(!r.a.dev.poll_records(&r.a.mem, r.now), "read twice");
    r.expect_sends(&[2, 3]);
    // One written just before polling ends (the driver saw the flag still
    // set): taken when it ends, and the flag is clear after.
    r.write_send(4);
    r.write_record(4);
    assert!(r.a.dev.end_record_polling(&r.a.mem, r.now));
    assert_eq!(r.flags(), 0);
    assert!(!r.a.dev.watching_records());
    r.expect_sends(&[4]);
    // Not polling: the record is not read; the doorbell the driver now
    // rings (the flag is clear) is what announces the SEND.
    r.write_send(5);
    r.write_record(5);
    assert!(!r.a.dev.poll_records(&r.a.mem, r.now));
    r.expect_nothing(3);
    r.ring();
    assert_eq!(r.flags(), 0, "watched outside polling");
    r.expect_sends(&[5]);
    let s = r.a.dev.stats();
    assert_eq!((s.records_read, s.doorbells_ignored), (2, 0));
}

#[test]
fn a_bad_index_in_a_record_is_ignored_once_and_an_overtaken_doorbell_is_no_error() {
    let mut r = rc(abi::QP_F_SQ_RECORD);
    r.a.dev.begin_record_polling();
    r.write_send(1);
    r.write_record(1);
    r.ring();
    r.expect_sends(&[1]);
    // An index beyond the ring: ignored, counted once however often the
    // device reads it.
    r.write_record(1 + 16 + 5);
    r.a.dev.poll_records(&r.a.mem, r.now);
    r.a.dev.poll_records(&r.a.mem, r.now);
    assert_eq!(r.a.dev.stats().doorbells_ignored, 1);
    r.expect_nothing(3);
    // The QP carries on with a good index.
    r.write_send(2);
    r.write_send(3);
    r.write_record(3);
    assert!(r.a.dev.poll_records(&r.a.mem, r.now));
    r.expect_sends(&[2, 3]);
    // A doorbell the record overtook (the driver rang before it saw the
    // flag) names an index the device already has: nothing happens.
    for index in [2, 3] {
        let db = abi::Doorbell {
            ctx: r.a.ctx,
            kind: abi::DB_SQ,
            handle: r.qa.qpn,
            index,
            ..Default::default()
        };
        r.a.dev.doorbell(&r.a.mem, &db, r.now);
    }
    assert_eq!(r.a.dev.stats().doorbells_ignored, 1);
    r.expect_nothing(3);
}

#[test]
fn only_qps_that_ask_are_watched_and_reset_or_destroy_ends_it() {
    // A QP without the flag rings as always and is never watched.
    let mut r = rc(0);
    r.a.dev.begin_record_polling();
    r.write_send(1);
    r.ring();
    assert!(!r.a.dev.watching_records());
    assert_eq!(r.flags(), 0);
    r.expect_sends(&[1]);

    // One with it is watched until it moves to RESET (its producer index
    // restarts at 0 there; a stale record must not be read).
    let mut r = rc(abi::QP_F_SQ_RECORD);
    r.a.dev.begin_record_polling();
    r.write_send(1);
    r.write_record(1);
    r.ring();
    assert!(r.a.dev.watching_records());
    r.expect_sends(&[1]);
    let reset = abi::QpAttr {
        qpn: r.qa.qpn,
        attr_mask: abi::QP_ATTR_STATE,
        qp_state: abi::QpState::Reset as u32,
        ..Default::default()
    };
    r.a.cmd(abi::CMD_MODIFY_QP, &reset).unwrap();
    assert!(!r.a.dev.watching_records());
    assert_eq!(r.flags(), 0);

    // A destroyed QP is forgotten.
    let mut r = rc(abi::QP_F_SQ_RECORD);
    r.a.dev.begin_record_polling();
    r.write_send(1);
    r.write_record(1);
    r.ring();
    assert!(r.a.dev.watching_records());
    r.a.cmd(
        abi::CMD_DESTROY_QP,
        &abi::Handle {
            handle: r.qa.qpn,
            reserved: 0,
        },
    )
    .unwrap();
    assert!(!r.a.dev.watching_records());
    assert!(!r.a.dev.end_record_polling(&r.a.mem, r.now));
}

/// An RC QP of 16 WQEs a queue and one SGE with an SQ record.
fn sq_recorded() -> QpSpec {
    QpSpec {
        size: 16,
        sge: 1,
        flags: abi::QP_F_SQ_RECORD,
        ..QpSpec::rc()
    }
}

/// Rings `q`'s SQ doorbell on `node` for an empty queue (index 0): it is
/// accepted and, while the device polls, starts the watch as any other.
fn ring_empty_sq(node: &mut Node, q: &Qp) {
    let db = abi::Doorbell {
        ctx: node.ctx,
        kind: abi::DB_SQ,
        handle: q.qpn,
        index: 0,
        ..Default::default()
    };
    node.dev.doorbell(&node.mem, &db, 0);
}

/// A context that is closed (its program exited: `CMD_CLOSE_CTX`) takes
/// its QPs' watches with it, as their destroy would.
#[test]
fn closing_a_context_ends_the_watch_of_its_qps() {
    let (mut a, _b) = pair(1500);
    let ctx = a.open_ctx();
    a.ctx = ctx;
    let pd = a.alloc_pd();
    let cq = a.create_cq(64);
    let q = a.create_qp_with(pd, &cq, sq_recorded());
    a.dev.begin_record_polling();
    ring_empty_sq(&mut a, &q);
    assert!(a.dev.watching_records());
    a.close_ctx(ctx).unwrap();
    assert!(
        !a.dev.watching_records(),
        "a closed context's QP stays watched"
    );
    assert!(!a.dev.end_record_polling(&a.mem, 0));
}

#[test]
fn at_most_watch_max_records_are_watched_and_unknown_flags_are_refused() {
    let (mut a, _b) = pair(1500);
    let pd = a.alloc_pd();
    let cq = a.create_cq(64);
    a.dev.begin_record_polling();
    let n = vrnic::device::WATCH_MAX + 2;
    let qps: Vec<Qp> = (0..n)
        .map(|_| a.create_qp_with(pd, &cq, sq_recorded()))
        .collect();
    for q in &qps {
        ring_empty_sq(&mut a, q);
    }
    let flags = record_flags;
    let watched = qps.iter().filter(|q| flags(&a, q) != 0).count();
    assert_eq!(watched, vrnic::device::WATCH_MAX);
    // The watch is released in full when polling ends.
    a.dev.end_record_polling(&a.mem, 0);
    assert!(qps.iter().all(|q| flags(&a, q) == 0));

    let c = abi::CreateQp {
        pdn: pd,
        qp_type: abi::QPT_RC,
        send_cqn: cq.cqn,
        recv_cqn: cq.cqn,
        sq_size: 16,
        rq_size: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        sq: a.alloc(4096),
        rq: a.alloc(4096),
        db: a.alloc(16),
        flags: abi::QP_F_ALL + 1,
        ..Default::default()
    };
    assert_eq!(a.cmd(abi::CMD_CREATE_QP, &c), Err(abi::STATUS_EINVAL));
    // An RQ record needs an RQ: not with an SRQ.
    let srq = abi::CreateSrq {
        pdn: pd,
        max_wr: 16,
        max_sge: 1,
        ring: a.alloc(4096),
        db: a.alloc(8),
        ..Default::default()
    };
    let srqn = Node::handle_of(a.cmd(abi::CMD_CREATE_SRQ, &srq).unwrap());
    let on_srq = abi::CreateQp {
        rq_size: 0,
        srqn,
        flags: abi::QP_F_RQ_RECORD,
        ..c
    };
    assert_eq!(a.cmd(abi::CMD_CREATE_QP, &on_srq), Err(abi::STATUS_EINVAL));
    let ok = abi::CreateQp {
        flags: abi::QP_F_SQ_RECORD,
        ..on_srq
    };
    assert!(a.cmd(abi::CMD_CREATE_QP, &ok).is_ok());
}

#[test]
fn receives_announced_in_the_record_need_no_doorbell_and_reset_ends_the_watch() {
    let mut r = rc_with(0, abi::QP_F_RQ_RECORD);
    r.b.dev.begin_record_polling();
    // The first receive rings: B's record is watched from then on.
    r.send_to_unannounced_recv(1);
    r.write_rq_record(1);
    let db = abi::Doorbell {
        ctx: r.b.ctx,
        kind: abi::DB_RQ,
        handle: r.qb.qpn,
        index: 1,
        ..Default::default()
    };
    r.b.dev.doorbell(&r.b.mem, &db, r.now);
    assert_eq!(record_flags(&r.b, &r.qb), abi::QP_REC_POLLED);
    r.expect_sends(&[1]);
    // Receives announced in the record only, read in a polling round:
    // the SENDs land in them, in order.
    r.send_to_unannounced_recv(2);
    r.send_to_unannounced_recv(3);
    r.write_rq_record(3);
    assert!(r.b.dev.poll_records(&r.b.mem, r.now));
    r.expect_sends(&[2, 3]);
    // One written as polling ends is taken then.
    r.send_to_unannounced_recv(4);
    r.write_rq_record(4);
    assert!(r.b.dev.end_record_polling(&r.b.mem, r.now));
    assert_eq!(record_flags(&r.b, &r.qb), 0);
    r.expect_sends(&[4]);
    let s = r.b.dev.stats();
    assert_eq!((s.records_read, s.doorbells_ignored), (2, 0));
    // Watched again, then moved to RESET: no longer watched, flag clear.
    r.b.dev.begin_record_polling();
    r.b.dev
        .doorbell(&r.b.mem, &abi::Doorbell { index: 4, ..db }, r.now);
    assert!(r.b.dev.watching_records());
    let reset = abi::QpAttr {
        qpn: r.qb.qpn,
        attr_mask: abi::QP_ATTR_STATE,
        qp_state: abi::QpState::Reset as u32,
        ..Default::default()
    };
    r.b.cmd(abi::CMD_MODIFY_QP, &reset).unwrap();
    assert!(!r.b.dev.watching_records());
    assert_eq!(record_flags(&r.b, &r.qb), 0);
}
