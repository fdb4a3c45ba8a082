//! Named regressions of issue 9, "hostile guests": what a driver that
//! breaks the device spec on purpose must not achieve.
//!
//! - `backwards_sq_doorbell_is_ignored` (item 6): a `DB_SQ` producer index
//!   behind the requester's fetch index (or past the ring, or naming no
//!   QP) is ignored and counted; the QP's later flush completes exactly
//!   the WQEs that were posted, instead of looping ~2^32 times.
//!
//! Simulated clock only; every wait is bounded. A test whose device could
//! loop for minutes runs under [`bounded`], so a regression fails instead
//! of hanging the suite.

mod common;

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
