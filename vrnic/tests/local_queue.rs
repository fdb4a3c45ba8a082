//! Issue 28: the local ACK timeout measures the peer's silence, not the
//! time a packet waited in the device's own queue or in its owner's hands
//! for a full link. A QP whose packets are held there for many ACK
//! timeouts neither retransmits nor fails; once they go, it completes.

mod common;

use common::*;
use vrnic::abi;

/// Whether `f` is a RoCEv2 frame (not ARP).
fn is_roce(f: &[u8]) -> bool {
    matches!(vrnic::wire::parse_frame(f), Ok(vrnic::wire::Frame::Roce(_)))
}

const ALL: u32 = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;

/// A signaled SEND WQE with id `wr_id`.
fn signaled_send(wr_id: u64) -> abi::SendWqe {
    abi::SendWqe {
        wr_id,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    }
}

/// A connected pair that has exchanged one SEND (so A knows B's MAC).
fn warm_pair() -> RcPair {
    let (la, lb) = QueueLink::pair();
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), ConnOpts::default(), true);
    let src = s.a.alloc(4096);
    let (lkey, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let dst = s.b.alloc(4096);
    let (lkey_b, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 100, &[sge(dst, 4096, lkey_b)], now);
    s.post(signaled_send(101), &[sge(src, 8, lkey)]);
    assert_eq!(s.cqe(false, "warm-up").status, abi::WC_SUCCESS);
    assert_eq!(s.cqe(true, "warm-up").status, abi::WC_SUCCESS);
    s
}

/// A SEND from A to B whose frames A's owner pops but keeps
/// (`set_tx_held_from`), as `link::txq::TxFlush` keeps frames for a full
/// destination, for 20 ACK timeouts (retry_cnt 7 would end it after 8);
/// then hands them to the link.
#[test]
fn frames_held_by_the_owner_do_not_count_as_the_peers_silence() {
    let mut s = warm_pair();
    let src = s.a.alloc(4096);
    s.a.fill(src, &[3; 64]);
    let (lkey, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let dst = s.b.alloc(4096);
    let (lkey_b, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 1, &[sge(dst, 4096, lkey_b)], now);
    let first = s.a.dev.tx_popped();
    s.post(signaled_send(2), &[sge(src, 64, lkey)]);
    // The owner takes the SEND's frame and holds it.
    let mut held = Vec::new();
    while let Some(f) = s.a.dev.pop_tx() {
        held.push(f);
    }
    assert!(!held.is_empty(), "the SEND went out of the device");
    s.a.dev.set_tx_held_from(Some(first));
    let timeout = vrnic::transport::requester::ack_timeout_ns(14).unwrap();
    let mut now = s.now;
    for _ in 0..20 {
        now += timeout + 1;
        s.a.dev.poll(&s.a.mem, now);
        let out: Vec<_> = std::iter::from_fn(|| s.a.dev.pop_tx()).collect();
        assert!(!out.iter().any(|f| is_roce(f)), "nothing resent while held");
        assert_eq!(s.a.poll_cq(&mut s.ca), None, "no completion while held");
    }
    let st = s.a.dev.stats();
    assert_eq!((st.retransmits, st.tail_probes), (0, 0));
    assert!(
        st.ack_timeouts_deferred >= 20,
        "{}",
        st.ack_timeouts_deferred
    );
    // The link takes them: the SEND completes, without a retry.
    s.a.dev.set_tx_held_from(None);
    for f in held {
        s.a.link.send(&f).unwrap();
    }
    s.now = now;
    let c = s.cqe(false, "the held SEND");
    assert_eq!((c.wr_id, c.status), (2, abi::WC_SUCCESS));
    let c = s.cqe(true, "its receive");
    assert_eq!((c.wr_id, c.status, c.byte_len), (1, abi::WC_SUCCESS, 64));
    assert_eq!(s.b.read(dst, 64), vec![3; 64]);
    assert_eq!(s.a.dev.stats().retransmits, 0);
    assert_eq!(s.a.dev.stats().tail_probes, 0);
}

/// The same SEND, its frame lost after it left (the owner took it and
/// dropped it): the timer is the peer's silence again and the QP
/// retries, then fails with `RETRY_EXC_ERR` when the peer never answers.
#[test]
fn frames_that_left_and_were_lost_still_time_out() {
    let mut s = warm_pair();
    let src = s.a.alloc(4096);
    let (lkey, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    s.post(signaled_send(2), &[sge(src, 64, lkey)]);
    let timeout = vrnic::transport::requester::ack_timeout_ns(14).unwrap();
    let mut now = s.now;
    let mut done = None;
    for _ in 0..40 {
        while s.a.dev.pop_tx().is_some() {} // lost on the wire
        now += timeout + 1;
        s.a.dev.poll(&s.a.mem, now);
        done = s.a.poll_cq(&mut s.ca);
        if done.is_some() {
            break;
        }
    }
    let c = done.unwrap_or_else(|| panic!("no failure within 40 timeouts: {:?}", s.a.dev.stats()));
    assert_eq!((c.wr_id, c.status), (2, abi::WC_RETRY_EXC_ERR));
    assert_eq!(s.a.dev.stats().ack_timeouts_deferred, 0);
}
