//! Named regressions of issue 9, "hostile guests": what a driver that
//! breaks the device spec on purpose must not achieve.
//!
//! - `backwards_sq_doorbell_is_ignored` (item 6): a `DB_SQ` producer index
//!   behind the requester's fetch index (or past the ring, or naming no
//!   QP) is ignored and counted; the QP's later flush completes exactly
//!   the WQEs that were posted, instead of looping ~2^32 times.
//! - `read_into_read_only_mr_is_loc_prot_err`,
//!   `atomic_into_read_only_mr_is_loc_prot_err` (item 7): a READ or atomic
//!   whose local SGE is in an MR registered without `LOCAL_WRITE`
//!   completes with `IBV_WC_LOC_PROT_ERR`, nothing is requested or
//!   written, the QP moves to ERR; `receive_into_read_only_mr_is_loc_prot_err`:
//!   likewise a receive WQE's SGEs need `LOCAL_WRITE`.
//! - `rkeys_unpredictable_and_not_recycled`, `qpns_not_reused_soon`
//!   (item 2): MR keys carry bits a peer cannot predict from the keys it
//!   has seen, and neither a deregistered key nor a destroyed QP number
//!   names a new object soon after, a device reset included.
//! - `sqd_to_rts_uses_the_callers_clock` (item 9): a `MODIFY_QP` that
//!   starts sending (SQD → RTS with WQEs posted) arms the ACK timer from
//!   the caller's clock, not from time 0: no false retransmission, no
//!   `RETRY_EXC_ERR` with `retry_cnt` 0.
//!
//! - `mr_page_budget_enforced`, `object_limits_enforced`,
//!   `query_device_advertises_limits` (item 8): MR page lists have a
//!   per-MR maximum (`EINVAL` past it) and a per-device budget (`ENOMEM`,
//!   freed by `DEREG_MR` and a reset); PDs, MRs, CQs, QPs, SRQs and AHs
//!   their maximum counts and the SQ/RQ/SRQ rings a per-device budget of
//!   entries (`ENOMEM`, room again after a destroy); `CMD_QUERY_DEVICE`
//!   advertises exactly the limits enforced.
//!
//! - `sends_on_many_qps_respect_the_tx_backlog`: a guest ringing many
//!   QPs at once does not make the device queue more than
//!   `TX_BACKLOG_MAX` frames for the link; polls resume the rest.
//!
//! Simulated clock only; every wait is bounded. A test whose device could
//! loop for minutes runs under [`bounded`], so a regression fails instead
//! of hanging the suite.

mod common;

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use vrnic::abi;

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;

fn setup(oa: ConnOpts, connect_b: bool) -> RcPair {
    let (la, lb) = QueueLink::pair();
    RcPair::on((Box::new(la), Box::new(lb)), oa, connect_b)
}

/// Runs `f` on its own thread and fails the test if it has not finished
/// within `secs` seconds of wall-clock time (a device stuck in a loop);
/// a panic inside `f` is the test's panic.
fn bounded(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("the device did not finish within {secs} s: an unbounded loop")
        }
    }
}

fn doorbell(n: &mut Node, kind: u16, handle: u32, index: u32, now: u64) {
    let db = abi::Doorbell {
        kind,
        handle,
        index,
        ..Default::default()
    };
    n.dev.doorbell(&n.mem, &db, now);
}

// ---------------------------------------------------------------------------
// Item 6: backwards and out-of-range doorbells.

#[test]
fn backwards_sq_doorbell_is_ignored() {
    bounded(30, || {
        // B stays in RESET: A's SENDs are fetched and sent, never acknowledged.
        let mut s = setup(ConnOpts::default(), false);
        let src = s.a.alloc(4096);
        let (lk, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
        for wr_id in 1..=4 {
            s.post(
                abi::SendWqe {
                    wr_id,
                    opcode: abi::WR_SEND,
                    send_flags: abi::SEND_SIGNALED,
                    ..Default::default()
                },
                &[sge(src, 64, lk)],
            );
        }
        // Once B's MAC is known the requester has fetched and sent WQEs
        // 0..4 and none is completed: the fetch index is 4, the completion
        // index 0.
        for _ in 0..100 {
            if s.a.pump(s.now) + s.b.pump(s.now) == 0 {
                break;
            }
        }
        assert!(
            s.a.dev.stats().tx_bytes >= 4 * 64,
            "the four SENDs went out"
        );
        let (qpn, now) = (s.qa.qpn, s.now);
        let before = s.a.dev.stats().clone();
        // Behind the fetch index, though within a ring of the completion index.
        doorbell(&mut s.a, abi::DB_SQ, qpn, 2, now);
        doorbell(&mut s.a, abi::DB_SQ, qpn, 0, now);
        // Past the ring: more than 64 WQEs beyond the completion index.
        doorbell(&mut s.a, abi::DB_SQ, qpn, 65, now);
        // An RQ producer index behind its consumer index.
        doorbell(&mut s.a, abi::DB_RQ, qpn, u32::MAX, now);
        // No such QP, CQ or SRQ; no such kind.
        doorbell(&mut s.a, abi::DB_SQ, qpn ^ 0x80_0000, 5, now);
        doorbell(&mut s.a, abi::DB_CQ_ARM, 0xdead, 0, now);
        doorbell(&mut s.a, abi::DB_SRQ, 0xdead, 1, now);
        doorbell(&mut s.a, 0x77, qpn, 5, now);
        assert!(
            s.a.dev.pop_tx().is_none(),
            "an ignored doorbell sends nothing"
        );
        // ERR flushes exactly the four WQEs posted, in order (the flush
        // used to run from the fetch index 4 to the bogus producer index
        // 2: about 2^32 iterations with the device held).
        let err = abi::QpAttr {
            qpn,
            attr_mask: abi::QP_ATTR_STATE,
            qp_state: abi::QPS_ERR,
            ..Default::default()
        };
        s.a.cmd(abi::CMD_MODIFY_QP, &err).unwrap();
        for wr_id in 1..=4 {
            let c = s.a.poll_cq(&mut s.ca).expect("a flushed WQE");
            assert_eq!((c.wr_id, c.status), (wr_id, abi::WC_WR_FLUSH_ERR));
        }
        assert_eq!(s.a.poll_cq(&mut s.ca), None, "only the posted WQEs");
        // The QP record shows the SQ consumed up to the last real WQE.
        let rec = s.a.read(s.qa.rec, 8);
        assert_eq!(u32::from_le_bytes(rec[..4].try_into().unwrap()), 4);
        assert_eq!(u32::from_le_bytes(rec[4..].try_into().unwrap()), 0);
        let after = s.a.dev.stats().clone();
        assert_eq!(
            after.doorbells_ignored - before.doorbells_ignored,
            8,
            "every bad doorbell is counted: {after:?}"
        );
        // A good doorbell still works on the QP in ERR: flushed at once.
        s.post(
            abi::SendWqe {
                wr_id: 5,
                opcode: abi::WR_SEND,
                send_flags: abi::SEND_SIGNALED,
                ..Default::default()
            },
            &[sge(src, 64, lk)],
        );
        let c = s.a.poll_cq(&mut s.ca).expect("the new WQE is flushed");
        assert_eq!((c.wr_id, c.status), (5, abi::WC_WR_FLUSH_ERR));
        assert_eq!(s.a.dev.stats().doorbells_ignored, after.doorbells_ignored);
    });
}

// ---------------------------------------------------------------------------
// Item 7: READ and atomic results, and receives, need LOCAL_WRITE.

/// A posts `wqe` whose one local SGE is 8 bytes at the start of a 4 KiB
/// buffer registered with access 0 (local read only) and filled with
/// 0xee; B's memory is readable and atomically writable. Checks that the
/// WQE fails with `LOC_PROT_ERR` before anything is asked of B, that the
/// buffer and B's memory are unchanged and that A's QP is in ERR.
fn local_result_into_read_only_mr(opcode: u8, len: u32) {
    let mut s = setup(ConnOpts::default(), true);
    let remote = s.b.alloc(4096);
    let theirs: Vec<u8> = (0..4096u32).map(|i| (i * 13) as u8).collect();
    s.b.fill(remote, &theirs);
    let (_, rk_b) = s.b.reg_mr(s.pdb, remote, 4096, ALL).unwrap();
    let local = s.a.alloc(4096);
    s.a.fill(local, &[0xee; 4096]);
    let (lk_ro, _) = s.a.reg_mr(s.pda, local, 4096, 0).unwrap();
    s.post(
        abi::SendWqe {
            wr_id: 1,
            opcode,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: remote,
            rkey: rk_b,
            compare_add: 1,
            swap: 2,
            ..Default::default()
        },
        &[sge(local, len, lk_ro)],
    );
    // Queued behind it: flushed, never sent.
    s.post(
        abi::SendWqe {
            wr_id: 2,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[sge(local, 16, lk_ro)],
    );
    let c = s.cqe(false, "the READ/atomic");
    assert_eq!(
        (c.wr_id, c.status),
        (1, abi::WC_LOC_PROT_ERR),
        "opcode {opcode}: a result may not land in a read-only MR"
    );
    let c = s.cqe(false, "the WQE behind it");
    assert_eq!((c.wr_id, c.status), (2, abi::WC_WR_FLUSH_ERR));
    assert_eq!(
        s.a.qp_state(s.qa.qpn),
        abi::QPS_ERR,
        "a local error is fatal"
    );
    s.assert_quiet(100, "after LOC_PROT_ERR");
    assert_eq!(s.a.read(local, 4096), vec![0xee; 4096], "nothing written");
    assert_eq!(s.b.read(remote, 4096), theirs, "nothing executed at B");
    assert_eq!(s.b.dev.stats().rx_bytes, 0, "nothing requested of B");
}

#[test]
fn read_into_read_only_mr_is_loc_prot_err() {
    local_result_into_read_only_mr(abi::WR_RDMA_READ, 4096);
}

#[test]
fn atomic_into_read_only_mr_is_loc_prot_err() {
    local_result_into_read_only_mr(abi::WR_ATOMIC_FETCH_AND_ADD, 8);
    local_result_into_read_only_mr(abi::WR_ATOMIC_CMP_AND_SWP, 8);
}

#[test]
fn receive_into_read_only_mr_is_loc_prot_err() {
    let mut s = setup(ConnOpts::default(), true);
    let dst = s.b.alloc(4096);
    s.b.fill(dst, &[0xee; 4096]);
    let (lk_ro, _) =
        s.b.reg_mr(s.pdb, dst, 4096, abi::ACCESS_REMOTE_READ)
            .unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 7, &[sge(dst, 4096, lk_ro)], now);
    let src = s.a.alloc(4096);
    s.a.fill(src, &[0x55; 4096]);
    let (lk_a, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    s.post(
        abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[sge(src, 100, lk_a)],
    );
    let r = s.cqe(true, "the receive");
    assert_eq!((r.wr_id, r.status), (7, abi::WC_LOC_PROT_ERR));
    let c = s.cqe(false, "the SEND");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_REM_OP_ERR));
    assert_eq!(s.b.read(dst, 4096), vec![0xee; 4096], "nothing written");
    assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_ERR);
}

// ---------------------------------------------------------------------------
// Item 2: keys and QP numbers.

fn dereg(n: &mut Node, lkey: u32) -> Result<Vec<u8>, u32> {
    n.cmd(
        abi::CMD_DEREG_MR,
        &abi::Handle {
            handle: lkey,
            reserved: 0,
        },
    )
}

#[test]
fn rkeys_unpredictable_and_not_recycled() {
    let (mut a, mut b) = pair(1500);
    let (pda, pdb) = (a.alloc_pd(), b.alloc_pd());
    let (bufa, bufb) = (a.alloc(4096), b.alloc(4096));
    // Sixteen MRs at once on each of two devices: what one device's keys
    // are says nothing of the other's, nor of its own next ones.
    let ka: Vec<u32> = (0..16)
        .map(|_| a.reg_mr(pda, bufa, 4096, ALL).unwrap().1)
        .collect();
    let kb: Vec<u32> = (0..16)
        .map(|_| b.reg_mr(pdb, bufb, 4096, ALL).unwrap().1)
        .collect();
    assert_ne!(ka, kb, "two devices hand out the same keys");
    let low: HashSet<u8> = ka.iter().map(|k| *k as u8).collect();
    assert!(low.len() > 1, "the key bytes are all alike: {ka:x?}");
    // Register and deregister the same buffer many times: no key comes
    // back, and none of the old ones works any more.
    let mut seen: HashSet<u32> = ka.iter().copied().collect();
    let mut stale = Vec::new();
    for _ in 0..600 {
        let (lkey, rkey) = a.reg_mr(pda, bufa, 4096, ALL).unwrap();
        assert!(seen.insert(rkey), "rkey {rkey:#x} handed out twice");
        dereg(&mut a, lkey).unwrap();
        stale.push(lkey);
    }
    for k in &stale {
        assert_eq!(
            dereg(&mut a, *k),
            Err(abi::STATUS_ENOENT),
            "stale key {k:#x}"
        );
    }
    // A device reset (a guest reboot) does not start the keys again.
    a.dev.reset();
    let pda = a.alloc_pd();
    for _ in 0..16 {
        let (_, rkey) = a.reg_mr(pda, bufa, 4096, ALL).unwrap();
        assert!(
            seen.insert(rkey),
            "rkey {rkey:#x} named an MR before the reset"
        );
    }
}

#[test]
fn qpns_not_reused_soon() {
    let (mut a, _b) = pair(1500);
    let pd = a.alloc_pd();
    let cq = a.create_cq(64);
    let mut seen = HashSet::new();
    for _ in 0..300 {
        let qp = a.create_qp(pd, &cq, 4, 1);
        assert!(seen.insert(qp.qpn), "QPN {:#x} reused", qp.qpn);
        assert!(qp.qpn > 1 && qp.qpn <= 0xff_ffff, "QPN {:#x}", qp.qpn);
        a.cmd(
            abi::CMD_DESTROY_QP,
            &abi::Handle {
                handle: qp.qpn,
                reserved: 0,
            },
        )
        .unwrap();
    }
    // A reset destroys every QP; the new ones get new numbers, so packets
    // still in flight for the old ones find no QP.
    a.dev.reset();
    let pd = a.alloc_pd();
    let cq = a.create_cq(64);
    for _ in 0..8 {
        let qp = a.create_qp(pd, &cq, 4, 1);
        assert!(
            seen.insert(qp.qpn),
            "QPN {:#x} reused after a reset",
            qp.qpn
        );
    }
}

// ---------------------------------------------------------------------------
// Item 9: commands run at the caller's time.

fn modify_state(n: &mut Node, qpn: u32, state: u32) {
    let a = abi::QpAttr {
        qpn,
        attr_mask: abi::QP_ATTR_STATE,
        qp_state: state,
        ..Default::default()
    };
    n.cmd(abi::CMD_MODIFY_QP, &a).unwrap();
}

#[test]
fn sqd_to_rts_uses_the_callers_clock() {
    // No retry: one expired ACK timer fails the WQE.
    let o = ConnOpts {
        retry: 0,
        ..Default::default()
    };
    let mut s = setup(o, true);
    let src = s.a.alloc(4096);
    let (lk_a, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let dst = s.b.alloc(4096);
    let (lk_b, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let send = |wr_id| abi::SendWqe {
        wr_id,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    let now = s.now;
    s.b.post_recv(&mut s.qb, 1, &[sge(dst, 4096, lk_b)], now);
    s.b.post_recv(&mut s.qb, 2, &[sge(dst, 4096, lk_b)], now);
    // One SEND end to end first (the peer's MAC is then known).
    s.post(send(1), &[sge(src, 64, lk_a)]);
    let c = s.cqe(false, "the first SEND");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_SUCCESS));
    let r = s.cqe(true, "the first receive");
    assert_eq!((r.wr_id, r.status), (1, abi::WC_SUCCESS));
    // Drain the send queue, post while drained, let time pass.
    let qpn = s.qa.qpn;
    modify_state(&mut s.a, qpn, abi::QPS_SQD);
    s.post(send(2), &[sge(src, 64, lk_a)]);
    s.assert_quiet(10, "in SQD");
    s.now += 5_000_000_000;
    let now = s.now;
    s.a.pump(now);
    s.b.pump(now);
    let before = s.a.dev.stats().retransmits;
    // SQD -> RTS sends the WQE posted meanwhile, at the node's time.
    modify_state(&mut s.a, qpn, abi::QPS_RTS);
    let c = s.cqe(false, "the SEND posted in SQD");
    assert_eq!(
        (c.wr_id, c.status),
        (2, abi::WC_SUCCESS),
        "the ACK timer ran from the caller's clock"
    );
    assert_eq!(
        s.a.dev.stats().retransmits,
        before,
        "no false retransmission"
    );
    assert_eq!(s.a.qp_state(qpn), abi::QPS_RTS);
    let r = s.cqe(true, "the second receive");
    assert_eq!((r.wr_id, r.status), (2, abi::WC_SUCCESS));
}

// ---------------------------------------------------------------------------
// Item 8: the daemon's memory per device is bounded. Every kind of object
// has a maximum count, MR page lists a per-MR and a per-device budget,
// and SQ/RQ/SRQ rings a per-device budget of entries; past a per-object
// maximum a command fails with EINVAL, past a device budget with ENOMEM
// (limits as rxe's `rxe_param.h`; ENOMEM as mlx5's "limits exceeded",
// where today's rxe answers -EINVAL at `max_elem`: device spec §5.x.6.2).

use vrnic::device::{MAX_MR_PAGES, MAX_MR_PAGES_TOTAL, MAX_TOTAL_WR};

/// A lone node (its link unused) with one PD.
fn lone() -> (Node, u32) {
    let (la, _lb) = QueueLink::pair();
    let mut n = Node::new(1, Box::new(la), 1500);
    let pd = n.alloc_pd();
    (n, pd)
}

/// `CMD_REG_MR` of `npages` 4 KiB pages, all of them the page at `page`,
/// through the page list at `list` (at least `npages` entries of it).
fn reg_pages(n: &mut Node, pd: u32, list: u64, npages: u32) -> Result<u32, u32> {
    let r = abi::RegMr {
        pdn: pd,
        access: abi::ACCESS_LOCAL_WRITE,
        iova: 0x10_0000_0000,
        length: u64::from(npages) * 4096,
        page_shift: 12,
        npages,
        page_list: list,
    };
    n.cmd(abi::CMD_REG_MR, &r)
        .map(|b| <abi::MrKeys as abi::Pod>::read_from(&b).unwrap().lkey)
}

/// A page list of `npages` entries naming the same page.
fn alias_list(n: &mut Node, npages: u32) -> u64 {
    let page = n.alloc(4096);
    let list = n.alloc(npages as usize * 8);
    let entries: Vec<u8> = (0..npages).flat_map(|_| page.to_le_bytes()).collect();
    n.fill(list, &entries);
    list
}

#[test]
fn mr_page_budget_enforced() {
    let (mut n, pd) = lone();
    let list = alias_list(&mut n, MAX_MR_PAGES + 1);
    // One MR past the per-MR maximum: EINVAL, whatever the budget.
    assert_eq!(
        reg_pages(&mut n, pd, list, MAX_MR_PAGES + 1),
        Err(abi::STATUS_EINVAL)
    );
    // MRs of the per-MR maximum until the device's budget is spent.
    let fit = (MAX_MR_PAGES_TOTAL / MAX_MR_PAGES) as usize;
    let mut keys = Vec::new();
    for k in 0..fit {
        keys.push(
            reg_pages(&mut n, pd, list, MAX_MR_PAGES).unwrap_or_else(|s| panic!("MR {k}: {s}")),
        );
    }
    assert_eq!(
        reg_pages(&mut n, pd, list, MAX_MR_PAGES),
        Err(abi::STATUS_ENOMEM),
        "MR {fit} past the page budget"
    );
    assert_eq!(
        reg_pages(&mut n, pd, list, 1),
        Err(abi::STATUS_ENOMEM),
        "one page past the budget"
    );
    // A deregistered MR's pages are available again, and only those.
    let lkey = keys.pop().unwrap();
    n.cmd(
        abi::CMD_DEREG_MR,
        &abi::Handle {
            handle: lkey,
            reserved: 0,
        },
    )
    .unwrap();
    let small = reg_pages(&mut n, pd, list, 1).expect("one page after dereg");
    assert_eq!(
        reg_pages(&mut n, pd, list, MAX_MR_PAGES),
        Err(abi::STATUS_ENOMEM),
        "the freed pages less one"
    );
    assert!(reg_pages(&mut n, pd, list, MAX_MR_PAGES - 1).is_ok());
    assert_eq!(reg_pages(&mut n, pd, list, 1), Err(abi::STATUS_ENOMEM));
    // A device reset frees every page.
    let _ = small;
    n.dev.reset();
    let pd = n.alloc_pd();
    for k in 0..fit {
        reg_pages(&mut n, pd, list, MAX_MR_PAGES)
            .unwrap_or_else(|s| panic!("after reset, MR {k}: {s}"));
    }
}

/// Creates objects with `create` until it fails, at most `max + 1` times;
/// asserts that exactly `max` succeed and the next fails with ENOMEM, then
/// that destroying one (`destroy`) makes room for exactly one more.
fn fill_to_max(
    n: &mut Node,
    what: &str,
    max: usize,
    mut create: impl FnMut(&mut Node) -> Result<u32, u32>,
    mut destroy: impl FnMut(&mut Node, u32) -> Result<Vec<u8>, u32>,
) -> Vec<u32> {
    let mut made = Vec::new();
    for k in 0..max {
        match create(n) {
            Ok(h) => made.push(h),
            Err(s) => panic!("{what} {k} of {max}: status {s}"),
        }
    }
    assert_eq!(create(n), Err(abi::STATUS_ENOMEM), "{what} past {max}");
    let h = made.pop().unwrap();
    destroy(n, h).unwrap_or_else(|s| panic!("destroying {what}: {s}"));
    made.push(create(n).unwrap_or_else(|s| panic!("{what} after a destroy: {s}")));
    assert_eq!(
        create(n),
        Err(abi::STATUS_ENOMEM),
        "{what} past {max} again"
    );
    made
}

fn destroy_cmd(opcode: u16) -> impl FnMut(&mut Node, u32) -> Result<Vec<u8>, u32> {
    move |n, handle| {
        n.cmd(
            opcode,
            &abi::Handle {
                handle,
                reserved: 0,
            },
        )
    }
}

#[test]
fn object_limits_enforced() {
    use vrnic::device::{MAX_AH, MAX_CQ, MAX_MR, MAX_PD, MAX_QP, MAX_QP_WR, MAX_SRQ};
    let (mut n, pd) = lone();
    // Rings and records may overlap: the device only checks that they
    // are driver memory.
    let ring = n.alloc(2 << 20);
    let db = n.alloc(4096);
    let list = alias_list(&mut n, 1);

    fill_to_max(
        &mut n,
        "PD",
        MAX_PD - 1,
        |n| {
            n.cmd(abi::CMD_ALLOC_PD, &abi::Handle::default())
                .map(Node::handle_of)
        },
        destroy_cmd(abi::CMD_DEALLOC_PD),
    );
    let mrs = fill_to_max(
        &mut n,
        "MR",
        MAX_MR,
        |n| reg_pages(n, pd, list, 1),
        destroy_cmd(abi::CMD_DEREG_MR),
    );
    for lkey in mrs {
        destroy_cmd(abi::CMD_DEREG_MR)(&mut n, lkey).unwrap();
    }
    let cq = |cqe| abi::CreateCq {
        cqe,
        reserved: 0,
        ring,
        db,
    };
    let cqs = fill_to_max(
        &mut n,
        "CQ",
        MAX_CQ,
        |n| n.cmd(abi::CMD_CREATE_CQ, &cq(1)).map(Node::handle_of),
        destroy_cmd(abi::CMD_DESTROY_CQ),
    );
    let cqn = cqs[0];
    let qp = |sq_size, rq_size| abi::CreateQp {
        pdn: pd,
        qp_type: abi::QPT_RC,
        send_cqn: cqn,
        recv_cqn: cqn,
        sq_size,
        rq_size,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline: 0,
        sq_sig_all: 0,
        sq: ring,
        rq: ring,
        db,
        srqn: 0,
        flags: 0,
    };
    let qpn_of = |b: Vec<u8>| <abi::CreateQpResp as abi::Pod>::read_from(&b).unwrap().qpn;
    let qps = fill_to_max(
        &mut n,
        "QP",
        MAX_QP,
        |n| n.cmd(abi::CMD_CREATE_QP, &qp(1, 1)).map(qpn_of),
        destroy_cmd(abi::CMD_DESTROY_QP),
    );
    for qpn in qps {
        destroy_cmd(abi::CMD_DESTROY_QP)(&mut n, qpn).unwrap();
    }
    let srq = |max_wr| abi::CreateSrq {
        pdn: pd,
        max_wr,
        max_sge: 1,
        srq_limit: 0,
        ring,
        db,
    };
    let srqn_of = |b: Vec<u8>| {
        <abi::CreateSrqResp as abi::Pod>::read_from(&b)
            .unwrap()
            .srqn
    };
    let srqs = fill_to_max(
        &mut n,
        "SRQ",
        MAX_SRQ,
        |n| n.cmd(abi::CMD_CREATE_SRQ, &srq(1)).map(srqn_of),
        destroy_cmd(abi::CMD_DESTROY_SRQ),
    );
    for srqn in srqs {
        destroy_cmd(abi::CMD_DESTROY_SRQ)(&mut n, srqn).unwrap();
    }
    let ah = abi::CreateAh {
        pdn: pd,
        dgid: std::net::Ipv4Addr::new(10, 0, 0, 2)
            .to_ipv6_mapped()
            .octets(),
        sgid_index: 1,
        hop_limit: 64,
        port_num: 1,
        is_global: 1,
        ..Default::default()
    };
    fill_to_max(
        &mut n,
        "AH",
        MAX_AH,
        |n| n.cmd(abi::CMD_CREATE_AH, &ah).map(Node::handle_of),
        destroy_cmd(abi::CMD_DESTROY_AH),
    );

    // Ring entries, all QPs and SRQs together: QPs of the largest rings
    // (SQ + RQ) until the device's budget is spent, then an SRQ of the
    // largest ring does not fit either; one QP destroyed makes room.
    let per_qp = 2 * u64::from(MAX_QP_WR);
    let fit = (u64::from(MAX_TOTAL_WR) / per_qp) as usize;
    let big = fill_to_max(
        &mut n,
        "QP of the largest rings",
        fit,
        |n| {
            n.cmd(abi::CMD_CREATE_QP, &qp(MAX_QP_WR, MAX_QP_WR))
                .map(qpn_of)
        },
        destroy_cmd(abi::CMD_DESTROY_QP),
    );
    assert_eq!(
        n.cmd(abi::CMD_CREATE_SRQ, &srq(MAX_QP_WR)).map(srqn_of),
        Err(abi::STATUS_ENOMEM)
    );
    assert_eq!(
        n.cmd(abi::CMD_CREATE_QP, &qp(1, 1)).map(qpn_of),
        Err(abi::STATUS_ENOMEM),
        "two entries past the ring budget"
    );
    // One QP's SQ and RQ make room for two SRQs of the largest ring.
    destroy_cmd(abi::CMD_DESTROY_QP)(&mut n, big[0]).unwrap();
    for _ in 0..2 {
        n.cmd(abi::CMD_CREATE_SRQ, &srq(MAX_QP_WR))
            .map(srqn_of)
            .unwrap();
    }
    assert_eq!(
        n.cmd(abi::CMD_CREATE_SRQ, &srq(1)).map(srqn_of),
        Err(abi::STATUS_ENOMEM)
    );
    // A ring above the per-object maximum is EINVAL, not ENOMEM.
    assert_eq!(
        n.cmd(abi::CMD_CREATE_SRQ, &srq(2 * MAX_QP_WR)).map(srqn_of),
        Err(abi::STATUS_EINVAL)
    );
}

#[test]
fn query_device_advertises_limits() {
    use vrnic::device::*;
    let (mut n, _) = lone();
    let b = n
        .cmd(abi::CMD_QUERY_DEVICE, &abi::Handle::default())
        .unwrap();
    assert_eq!(b.len(), size_of::<abi::DeviceAttr>());
    let a = <abi::DeviceAttr as abi::Pod>::read_from(&b).unwrap();
    let got = [
        ("max_qp", a.max_qp as usize, MAX_QP),
        ("max_cq", a.max_cq as usize, MAX_CQ),
        ("max_mr", a.max_mr as usize, MAX_MR),
        ("max_pd", a.max_pd as usize, MAX_PD),
        ("max_srq", a.max_srq as usize, MAX_SRQ),
        ("max_ah", a.max_ah as usize, MAX_AH),
        ("max_qp_wr", a.max_qp_wr as usize, MAX_QP_WR as usize),
        ("max_srq_wr", a.max_srq_wr as usize, MAX_QP_WR as usize),
        ("max_cqe", a.max_cqe as usize, MAX_CQE as usize),
        ("max_sge", a.max_sge as usize, MAX_SGE as usize),
        ("max_srq_sge", a.max_srq_sge as usize, MAX_SGE as usize),
        (
            "max_mr_pages",
            a.max_mr_pages as usize,
            MAX_MR_PAGES as usize,
        ),
        (
            "max_total_mr_pages",
            a.max_total_mr_pages as usize,
            MAX_MR_PAGES_TOTAL as usize,
        ),
        (
            "max_total_wr",
            a.max_total_wr as usize,
            MAX_TOTAL_WR as usize,
        ),
    ];
    for (what, advertised, enforced) in got {
        assert_eq!(advertised, enforced, "{what}");
    }
    assert_eq!(a.max_mr_size, MAX_MR_SIZE);
    // The configuration space agrees with the query.
    let c = n.dev.config_space();
    assert_eq!(
        (
            c.max_qp,
            c.max_cq,
            c.max_mr,
            c.max_pd,
            c.max_qp_wr,
            c.max_cqe
        ),
        (
            a.max_qp,
            a.max_cq,
            a.max_mr,
            a.max_pd,
            a.max_qp_wr,
            a.max_cqe
        )
    );
}

#[test]
fn sends_on_many_qps_respect_the_tx_backlog() {
    // A guest rings 16 QPs, each with a 1 MiB RDMA WRITE (1024 packets at
    // path MTU 1024, a window of 128), without the daemon draining the
    // link in between: what waits for the link stays within
    // TX_BACKLOG_MAX frames, and polls resume the rest.
    use vrnic::transport::TX_BACKLOG_MAX;
    let mut s = setup(ConnOpts::default(), true);
    for _ in 0..4 {
        s.a.pump(s.now);
        s.b.pump(s.now);
    }
    let len = 1 << 20;
    let src = s.a.alloc(len);
    let (lkey, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
    let (ip_b, qpn_b, now) = (s.b.ip, s.qb.qpn, s.now);
    let mut qps: Vec<_> = (0..16)
        .map(|_| {
            let q = s.a.create_qp(s.pda, &s.ca, 4, 1);
            s.a.connect(&q, ip_b, qpn_b, 3, 0, 0, 7, 7);
            q
        })
        .collect();
    for q in &mut qps {
        let w = abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_RDMA_WRITE,
            remote_addr: 0x1000,
            rkey: 0x1234,
            ..Default::default()
        };
        s.a.post_send(q, w, &[sge(src, len as u32, lkey)], now);
    }
    let queued = std::iter::from_fn(|| s.a.dev.pop_tx()).count();
    assert!(
        queued <= TX_BACKLOG_MAX,
        "16 doorbells queued {queued} frames"
    );
    // Each QP sends its window (128 PSNs) in all, a backlog per poll.
    let mut total = queued;
    for _ in 0..64 {
        s.a.dev.poll(&s.a.mem, now);
        let n = std::iter::from_fn(|| s.a.dev.pop_tx()).count();
        assert!(n <= TX_BACKLOG_MAX, "one poll queued {n} frames");
        if n == 0 {
            break;
        }
        total += n;
    }
    assert_eq!(
        total,
        16 * vrnic::transport::requester::MAX_INFLIGHT_PKTS as usize
    );
}
