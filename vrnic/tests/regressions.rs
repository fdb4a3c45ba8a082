//! Named RC regressions of issue 3 that `engine_rc.rs` does not already
//! cover (the mapping of every named case to its test is in the issue's
//! report; `engine_rc.rs` holds WRITE of MTU+1 and of 1 MiB, READ of 1 MiB,
//! READ/WRITE out of the MR's bounds, WRITE with a bad R_Key and RNR with
//! `rnr_retry` 0):
//!
//! - `read_bad_rkey`: READ with an unknown R_Key, an R_Key of another PD and
//!   an MR without remote read: `REM_ACCESS_ERR`, the requester and the
//!   responder QP in ERR, both queues flushed, nothing hangs.
//! - `rnr_late_receive_succeeds`: a receive posted after several RNR retries
//!   (spaced by the responder's RNR timer) still gets the SEND.
//! - `rnr_retry_three_fails_after_four_rnr_naks`: `rnr_retry` 3 means three
//!   retries, then `RNR_RETRY_EXC_ERR`.
//! - `retry_exhausted_silent_peer`: `RETRY_EXC_ERR` after exactly
//!   (retry_cnt + 1) local ACK timeouts of 4.096 µs × 2^timeout (at least
//!   1 ms), on the simulated clock, for several (timeout, retry_cnt).
//! - `psn_wrap_*`: WRITE, READ and atomics whose PSNs cross 2^24 with a
//!   packet lost and a stale duplicate delivered right after the wrap.
//! - `max_dest_rd_atomic`, the responder's READ/atomic resources: none
//!   (0) NAKs READ and atomics as invalid requests; N READs may be
//!   outstanding at once; a duplicate READ or atomic is answered again
//!   only while it is among the last N (an atomic from its remembered
//!   result, never re-executed) and dropped after; `ibv_modify_qp` refuses
//!   more than the device's 16.
//! - `a_long_write_stops_at_the_window_until_acknowledged`: a 1 MiB WRITE
//!   at path MTU 256 puts at most `MAX_INFLIGHT_PKTS` unacknowledged
//!   packets on the wire, the last asking for an ACK.
//!
//! Simulated clock only; every wait is bounded.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use vrnic::abi;
use vrnic::device::Nanos;
use vrnic::link::Link;
use vrnic::wire::{self, Frame};

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;

/// The RC pair of these tests (a [`QueueLink`] between them).
type Setup = RcPair;

fn setup(oa: ConnOpts, connect_b: bool) -> Setup {
    let (la, lb) = QueueLink::pair();
    RcPair::on((Box::new(la), Box::new(lb)), oa, connect_b)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7 + i / 251) as u8).wrapping_add(seed))
        .collect()
}

fn events(n: &mut Node) -> Vec<abi::Event> {
    std::iter::from_fn(|| n.dev.pop_event()).collect()
}

// ---------------------------------------------------------------------------
// READ with a bad R_Key.

#[test]
fn read_bad_rkey() {
    for case in [
        "unknown R_Key",
        "R_Key of another PD",
        "MR without remote read",
    ] {
        let mut s = setup(ConnOpts::default(), true);
        let remote = s.b.alloc(4096);
        s.b.fill(remote, &pattern(4096, 1));
        let access = if case == "MR without remote read" {
            abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE
        } else {
            ALL
        };
        let (lk_b, rk_b) = s.b.reg_mr(s.pdb, remote, 4096, access).unwrap();
        let rkey = match case {
            "unknown R_Key" => rk_b ^ 0x0100_0000,
            "R_Key of another PD" => {
                let other_pd = s.b.alloc_pd();
                let other = s.b.alloc(4096);
                s.b.reg_mr(other_pd, other, 4096, ALL).unwrap().1
            }
            _ => rk_b,
        };
        let local = s.a.alloc(8192);
        s.a.fill(local, &[0xee; 8192]);
        let (lk_a, _) = s.a.reg_mr(s.pda, local, 8192, ALL).unwrap();
        // A receive waiting on B: the responder's move to ERR must flush it.
        let now = s.now;
        s.b.post_recv(&mut s.qb, 77, &[sge(remote, 4096, lk_b)], now);
        s.post(
            abi::SendWqe {
                wr_id: 1,
                opcode: abi::WR_RDMA_READ,
                send_flags: abi::SEND_SIGNALED,
                remote_addr: remote,
                rkey,
                ..Default::default()
            },
            &[sge(local, 4096, lk_a)],
        );
        // Queued behind the failing READ: flushed, never sent.
        s.post(
            abi::SendWqe {
                wr_id: 2,
                opcode: abi::WR_SEND,
                send_flags: abi::SEND_SIGNALED,
                ..Default::default()
            },
            &[sge(local, 16, lk_a)],
        );
        let c1 = s.cqe(false, case);
        assert_eq!(
            (c1.wr_id, c1.status, c1.opcode),
            (1, abi::WC_REM_ACCESS_ERR, abi::WC_OP_RDMA_READ),
            "{case}: the READ"
        );
        let c2 = s.cqe(false, case);
        assert_eq!((c2.wr_id, c2.status), (2, abi::WC_WR_FLUSH_ERR), "{case}");
        let r = s.cqe(true, case);
        assert_eq!(
            (r.wr_id, r.status),
            (77, abi::WC_WR_FLUSH_ERR),
            "{case}: B's receive is flushed"
        );
        let (qpa, qpb) = (s.qa.qpn, s.qb.qpn);
        // IBTA §9.9.3.1.2 / §10.8.3: a remote access error is fatal to the
        // responder QP, and the requester QP moves to ERR with the error CQE.
        assert_eq!(s.b.qp_state(qpb), abi::QPS_ERR, "{case}: responder QP");
        assert_eq!(s.a.qp_state(qpa), abi::QPS_ERR, "{case}: requester QP");
        let st = s.b.dev.stats();
        assert_eq!(
            (st.nak_rem_access_sent, st.naks_sent),
            (1, 1),
            "{case}: one remote access NAK"
        );
        assert!(
            events(&mut s.b)
                .iter()
                .any(|e| e.kind == abi::EV_QP_FATAL && e.handle == qpb),
            "{case}: B reports its QP fatal"
        );
        assert_eq!(
            s.a.read(local, 8192),
            vec![0xee; 8192],
            "{case}: nothing read"
        );
        // Work posted to the dead QP completes at once, flushed.
        s.post(
            abi::SendWqe {
                wr_id: 3,
                opcode: abi::WR_RDMA_READ,
                send_flags: abi::SEND_SIGNALED,
                remote_addr: remote,
                rkey: rk_b,
                ..Default::default()
            },
            &[sge(local, 64, lk_a)],
        );
        let c3 = s.cqe(false, case);
        assert_eq!((c3.wr_id, c3.status), (3, abi::WC_WR_FLUSH_ERR), "{case}");
        s.assert_quiet(1000, case);
    }
}

// ---------------------------------------------------------------------------
// RNR.

/// B asks for RNR timer code 16 (2.56 ms, IBTA Table 45).
const RNR_TIMER: u8 = 16;

/// A posts a 300-byte SEND to B, which has no receive posted.
fn rnr_setup(rnr_retry: u8) -> Setup {
    let o = ConnOpts {
        rnr: rnr_retry,
        min_rnr_timer: RNR_TIMER,
        my_psn: 1000,
        peer_psn: 2000,
        ..Default::default()
    };
    let mut s = setup(o, true);
    let src = s.a.alloc(4096);
    s.a.fill(src, &pattern(300, 5));
    let (lk_a, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    s.post(
        abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[sge(src, 300, lk_a)],
    );
    s
}

/// Pumps in 10 µs steps until B has sent `naks` RNR NAKs; returns the
/// simulated time at which each of them was sent.
fn wait_rnr_naks(s: &mut Setup, naks: u64) -> Vec<Nanos> {
    let mut at = Vec::new();
    for _ in 0..1_000_000 {
        let sent = s.b.dev.stats().rnr_naks_sent;
        while (at.len() as u64) < sent {
            at.push(s.now);
        }
        if sent >= naks || s.a.poll_cq(&mut s.ca).is_some() {
            break;
        }
        if s.a.pump(s.now) + s.b.pump(s.now) == 0 {
            s.now += 10_000;
        }
    }
    at
}

#[test]
fn rnr_late_receive_succeeds() {
    let mut s = rnr_setup(7);
    let at = wait_rnr_naks(&mut s, 5);
    assert_eq!(at.len(), 5, "B refused the SEND five times");
    let timer = wire::rnr_timer_ns(RNR_TIMER);
    for w in at.windows(2) {
        assert!(
            w[1] - w[0] >= timer,
            "A waited the RNR timer ({timer} ns) between retries: {at:?}"
        );
    }
    assert_eq!(s.a.qp_state(s.qa.qpn), abi::QPS_RTS, "still sending");
    // The receive comes late; the next retry lands in it.
    let dst = s.b.alloc(4096);
    let (lk_b, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 9, &[sge(dst, 4096, lk_b)], now);
    let c = s.cqe(false, "the late SEND");
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (1, abi::WC_SUCCESS, abi::WC_OP_SEND)
    );
    let r = s.cqe(true, "the late receive");
    assert_eq!((r.wr_id, r.status, r.byte_len), (9, abi::WC_SUCCESS, 300));
    assert_eq!(s.b.read(dst, 300), pattern(300, 5));
    assert_eq!(
        s.b.read(dst + 300, 16),
        vec![0; 16],
        "nothing past the message"
    );
    let st = s.a.dev.stats();
    assert!(st.retransmits >= 5, "one resend per RNR NAK: {st:?}");
    assert_eq!(
        (s.b.dev.stats().rnr_naks_sent, st.rnr_naks_received),
        (5, 5),
        "no RNR NAK once the receive was there"
    );
    s.assert_quiet(1000, "after the late receive");
}

#[test]
fn rnr_retry_three_fails_after_four_rnr_naks() {
    let mut s = rnr_setup(3);
    let start = s.now;
    let c = s
        .next_cqe_step(false, 10_000, 1_000_000)
        .expect("RNR retries run out");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_RNR_RETRY_EXC_ERR));
    // The first attempt and three retries were refused, each retry after
    // the RNR timer.
    assert_eq!(s.a.dev.stats().rnr_naks_received, 4);
    assert_eq!(s.b.dev.stats().rnr_naks_sent, 4);
    assert!(s.now - start >= 3 * wire::rnr_timer_ns(RNR_TIMER));
    assert_eq!(s.a.qp_state(s.qa.qpn), abi::QPS_ERR, "requester QP");
    // An RNR is not an error of the responder: its QP carries on.
    assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_RTS, "responder QP");
    s.assert_quiet(1000, "after RNR_RETRY_EXC_ERR");
}

// ---------------------------------------------------------------------------
// Retry exhaustion against a silent peer.

/// The engine's local ACK timeout: 4.096 µs × 2^timeout, at least 1 ms
/// (`ack_timeout_ns` in vrnic/src/transport/requester.rs).
fn expected_ack_timeout_ns(timeout: u8) -> u64 {
    (4096u64 << timeout).max(1_000_000)
}

#[test]
fn retry_exhausted_silent_peer() {
    // (timeout, retry_cnt): the 1 ms floor, just above it, the usual 14,
    // no retry at all, and a long one.
    for (timeout, retry) in [(1u8, 3u8), (8, 7), (14, 2), (10, 0), (18, 1)] {
        let what = format!("timeout {timeout}, retry_cnt {retry}");
        let o = ConnOpts {
            timeout,
            retry,
            ..Default::default()
        };
        // B's QP stays in RESET: it silently drops everything A sends (its
        // device still answers ARP).
        let mut s = setup(o, false);
        let src = s.a.alloc(4096);
        let (lk_a, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
        let start = s.now;
        s.post(
            abi::SendWqe {
                wr_id: 1,
                opcode: abi::WR_SEND,
                send_flags: abi::SEND_SIGNALED,
                ..Default::default()
            },
            &[sge(src, 2000, lk_a)],
        );
        // A fine clock (10 µs per idle round) so the bound below is tight.
        let step = 10_000;
        let c = s
            .next_cqe_step(false, step, 2_000_000)
            .unwrap_or_else(|| panic!("{what}: never gave up"));
        assert_eq!((c.wr_id, c.status), (1, abi::WC_RETRY_EXC_ERR), "{what}");
        let elapsed = s.now - start;
        let t = expected_ack_timeout_ns(timeout);
        let tries = u64::from(retry) + 1;
        // Each timeout fires at the first clock step at or past its
        // deadline (at most one step late per try), and the CQE is seen
        // one step after the last.
        let (lo, hi) = (tries * t, tries * (t + step) + step);
        assert!(
            (lo..=hi).contains(&elapsed),
            "{what}: gave up after {elapsed} ns, expected {tries} × {t} ns \
             (+ ≤ {step} ns per try): {lo}..={hi}"
        );
        let st = s.a.dev.stats();
        assert_eq!(
            st.retransmits,
            u64::from(retry),
            "{what}: one resend per retry"
        );
        assert_eq!(s.a.qp_state(s.qa.qpn), abi::QPS_ERR, "{what}");
        s.assert_quiet(1000, &what);
    }
}

// ---------------------------------------------------------------------------
// PSN wrap with scripted faults.

/// What to do to one frame.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Drop it (the first time it is sent).
    Drop,
    /// Deliver it, and a copy of it again right after the frame with PSN
    /// `after` (of any opcode) has gone out.
    DupAfter { after: u32 },
}

#[derive(Debug)]
struct Rule {
    /// Matches requests (true) or responses and ACKs (false).
    request: bool,
    psn: u32,
    act: Act,
    fired: bool,
}

#[derive(Default)]
struct Script {
    rules: Vec<Rule>,
    /// Copies waiting for the frame with this PSN.
    held: Vec<(u32, Vec<u8>)>,
}

/// A link that applies a [`Script`] to the RoCE frames it sends.
struct ScriptLink {
    inner: QueueLink,
    script: Arc<Mutex<Script>>,
}

impl Link for ScriptLink {
    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        let Ok(Frame::Roce(p)) = wire::parse_frame(frame) else {
            return self.inner.send(frame);
        };
        let (psn, request) = (p.hdr.bth.psn, p.hdr.bth.opcode.is_request());
        let mut s = self.script.lock().unwrap();
        let rule = s
            .rules
            .iter_mut()
            .find(|r| !r.fired && r.psn == psn && r.request == request);
        if let Some(r) = rule {
            r.fired = true;
            match r.act {
                Act::Drop => return Ok(()),
                Act::DupAfter { after } => s.held.push((after, frame.to_vec())),
            }
        }
        self.inner.send(frame)?;
        let mut i = 0;
        while i < s.held.len() {
            if s.held[i].0 == psn {
                let (_, f) = s.held.remove(i);
                self.inner.send(&f)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn receive(&mut self, rx: vrnic::link::Rx<'_>) -> std::io::Result<Option<usize>> {
        rx.read(|buf| self.inner.recv(buf))
    }
}

/// A setup whose links apply `a_rules` to what A sends and `b_rules` to
/// what B sends; A's first PSN is `psn`.
fn scripted(
    mtu: u32,
    psn: u32,
    a_rules: Vec<Rule>,
    b_rules: Vec<Rule>,
) -> (Setup, [Arc<Mutex<Script>>; 2]) {
    let o = ConnOpts {
        mtu,
        my_psn: psn,
        peer_psn: 0x42,
        // A short ACK timeout: a lost last ACK costs 1 ms, not 67.
        timeout: 8,
        ..Default::default()
    };
    scripted_with(o, a_rules, b_rules)
}

/// [`scripted`] with A's connection attributes `o` (B's mirror them).
fn scripted_with(
    o: ConnOpts,
    a_rules: Vec<Rule>,
    b_rules: Vec<Rule>,
) -> (Setup, [Arc<Mutex<Script>>; 2]) {
    let (la, lb) = QueueLink::pair();
    let sa = Arc::new(Mutex::new(Script {
        rules: a_rules,
        ..Default::default()
    }));
    let sb = Arc::new(Mutex::new(Script {
        rules: b_rules,
        ..Default::default()
    }));
    let links: (Box<dyn Link>, Box<dyn Link>) = (
        Box::new(ScriptLink {
            inner: la,
            script: sa.clone(),
        }),
        Box::new(ScriptLink {
            inner: lb,
            script: sb.clone(),
        }),
    );
    (RcPair::on(links, o, true), [sa, sb])
}

fn rule(request: bool, psn: u32, act: Act) -> Rule {
    Rule {
        request,
        psn,
        act,
        fired: false,
    }
}

fn assert_all_fired(scripts: &[Arc<Mutex<Script>>; 2]) {
    for (side, s) in ["A", "B"].iter().zip(scripts) {
        let s = s.lock().unwrap();
        for r in &s.rules {
            assert!(r.fired, "{side}'s rule {r:?} never matched a frame");
        }
        assert!(s.held.is_empty(), "{side}: a held duplicate was never sent");
    }
}

#[test]
fn psn_wrap_write_with_a_lost_packet_and_a_stale_duplicate() {
    // 8 packets at path MTU 256: PSNs 0xfffffc ..= 0x000003.
    let (mut s, scripts) = scripted(
        1,
        0xff_fffc,
        vec![
            // The first packet after the wrap is lost: B NAKs (sequence
            // error) at 0x000000 and A goes back across the wrap.
            rule(true, 0x00_0000, Act::Drop),
            // A copy of the packet before the wrap arrives after 0x000001:
            // a duplicate, not a packet 2^24 - 3 PSNs ahead.
            rule(true, 0xff_fffe, Act::DupAfter { after: 0x00_0001 }),
        ],
        vec![],
    );
    let len = 8 * 256;
    let src = s.a.alloc(len);
    let dst = s.b.alloc(len + 4096);
    let data = pattern(len, 3);
    s.a.fill(src, &data);
    let (lk_a, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
    let (_, rk_b) = s.b.reg_mr(s.pdb, dst, len as u64 + 4096, ALL).unwrap();
    s.post(
        abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_RDMA_WRITE,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: dst,
            rkey: rk_b,
            ..Default::default()
        },
        &[sge(src, len as u32, lk_a)],
    );
    // And a SEND behind it (PSN 0x000004), to see the stream carry on.
    let dst2 = s.b.alloc(4096);
    let (lk_b, _) = s.b.reg_mr(s.pdb, dst2, 4096, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 5, &[sge(dst2, 4096, lk_b)], now);
    s.post(
        abi::SendWqe {
            wr_id: 2,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[sge(src, 100, lk_a)],
    );
    let c1 = s.cqe(false, "WRITE across the wrap");
    let c2 = s.cqe(false, "SEND after the wrap");
    assert_eq!((c1.wr_id, c1.status), (1, abi::WC_SUCCESS));
    assert_eq!((c2.wr_id, c2.status), (2, abi::WC_SUCCESS));
    let r = s.cqe(true, "receive after the wrap");
    assert_eq!((r.wr_id, r.status, r.byte_len), (5, abi::WC_SUCCESS, 100));
    assert!(s.b.read(dst, len) == data, "WRITE bytes across the wrap");
    assert_eq!(
        s.b.read(dst + len as u64, 64),
        vec![0; 64],
        "nothing past it"
    );
    assert_eq!(s.b.read(dst2, 100), data[..100]);
    assert_all_fired(&scripts);
    let st = s.b.dev.stats();
    assert!(st.nak_psn_seq_sent >= 1, "B saw the gap at 0: {st:?}");
    assert!(
        st.duplicates >= 1,
        "B recognised 0xfffffe as a duplicate: {st:?}"
    );
    assert_eq!(st.naks_sent, st.nak_psn_seq_sent, "no other NAK: {st:?}");
    s.assert_quiet(1000, "WRITE across the wrap");
}

#[test]
fn psn_wrap_read_with_a_lost_response_and_a_stale_duplicate() {
    // One READ request at 0xfffffd covering 8 response PSNs up to 0x000004.
    let (mut s, scripts) = scripted(
        1,
        0xff_fffd,
        vec![],
        vec![
            // The first response after the wrap is lost: A asks again from
            // 0x000000.
            rule(false, 0x00_0000, Act::Drop),
            // A stale copy of the response before the wrap, after 0x000001.
            rule(false, 0xff_ffff, Act::DupAfter { after: 0x00_0001 }),
        ],
    );
    let len = 8 * 256 - 7;
    let remote = s.b.alloc(len);
    let data = pattern(len, 9);
    s.b.fill(remote, &data);
    let (_, rk_b) = s.b.reg_mr(s.pdb, remote, len as u64, ALL).unwrap();
    let local = s.a.alloc(len + 64);
    let (lk_a, _) = s.a.reg_mr(s.pda, local, len as u64 + 64, ALL).unwrap();
    s.post(
        abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_RDMA_READ,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: remote,
            rkey: rk_b,
            ..Default::default()
        },
        &[sge(local, len as u32, lk_a)],
    );
    let c = s.cqe(false, "READ across the wrap");
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (1, abi::WC_SUCCESS, abi::WC_OP_RDMA_READ, len as u32)
    );
    assert!(s.a.read(local, len) == data, "READ bytes across the wrap");
    assert_eq!(
        s.a.read(local + len as u64, 64),
        vec![0; 64],
        "nothing past it"
    );
    assert_all_fired(&scripts);
    let (sa, sb) = (s.a.dev.stats(), s.b.dev.stats());
    assert!(
        sb.duplicates >= 1,
        "B re-generated from 0 for a re-request: {sb:?}"
    );
    assert!(sa.duplicates >= 1, "A ignored the stale response: {sa:?}");
    s.assert_quiet(1000, "READ across the wrap");
}

#[test]
fn psn_wrap_atomics_replayed_not_re_executed_across_the_wrap() {
    // Fetch-and-add at 0xfffffe and 0xffffff, compare-and-swap at 0x000000.
    let (mut s, scripts) = scripted(
        3,
        0xff_fffe,
        vec![
            // A copy of the fetch-and-add at 0xffffff arrives after the
            // compare-and-swap at 0: a duplicate, answered from the replay
            // cache and never executed again.
            rule(true, 0xff_ffff, Act::DupAfter { after: 0x00_0000 }),
        ],
        vec![
            // The atomic ACK at 0xffffff is lost: A resends after its ACK
            // timeout and B must replay, not add again.
            rule(false, 0xff_ffff, Act::Drop),
        ],
    );
    let target = s.b.alloc(4096);
    s.b.fill(target, &1000u64.to_le_bytes());
    let (_, rk_b) = s.b.reg_mr(s.pdb, target, 4096, ALL).unwrap();
    let res = s.a.alloc(4096);
    let (lk_a, _) = s.a.reg_mr(s.pda, res, 4096, ALL).unwrap();
    let faa = |wr_id, add| abi::SendWqe {
        wr_id,
        opcode: abi::WR_ATOMIC_FETCH_AND_ADD,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: target,
        rkey: rk_b,
        compare_add: add,
        ..Default::default()
    };
    s.post(faa(1, 5), &[sge(res, 8, lk_a)]);
    s.post(faa(2, 7), &[sge(res + 8, 8, lk_a)]);
    s.post(
        abi::SendWqe {
            wr_id: 3,
            opcode: abi::WR_ATOMIC_CMP_AND_SWP,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: target,
            rkey: rk_b,
            compare_add: 1012,
            swap: 4242,
            ..Default::default()
        },
        &[sge(res + 16, 8, lk_a)],
    );
    for (wr_id, op) in [
        (1, abi::WC_OP_FETCH_ADD),
        (2, abi::WC_OP_FETCH_ADD),
        (3, abi::WC_OP_COMP_SWAP),
    ] {
        let c = s.cqe(false, "atomics across the wrap");
        assert_eq!((c.wr_id, c.status, c.opcode), (wr_id, abi::WC_SUCCESS, op));
    }
    let orig: Vec<u64> = (0..3)
        .map(|i| u64::from_le_bytes(s.a.read(res + 8 * i, 8).try_into().unwrap()))
        .collect();
    assert_eq!(
        orig,
        [1000, 1005, 1012],
        "each atomic saw the one before, once"
    );
    assert_eq!(
        s.b.read(target, 8),
        4242u64.to_le_bytes(),
        "the compare-and-swap matched: no add ran twice"
    );
    assert_all_fired(&scripts);
    // The scripted copy and A's resend of the atomic whose ACK was lost:
    // A asks again as soon as the compare-and-swap's ACK, past it, shows
    // the loss (rxe's check_psn), before its ACK timer expires.
    assert!(s.b.dev.stats().duplicates >= 2, "{:?}", s.b.dev.stats());
    assert_eq!(
        s.a.dev.stats().retransmits,
        0,
        "A resent at the later ACK, not after a timeout"
    );
    s.assert_quiet(1000, "atomics across the wrap");
}

// ---------------------------------------------------------------------------
// Lost READ responses: found without waiting for the ACK timeout (67 ms).

/// A READ of 4 responses at path MTU 256 (PSNs 0x10..=0x13) into A, B's
/// bytes a pattern; returns (A's buffer, the pattern, A's lkey, B's
/// address, B's rkey).
fn read_setup(s: &mut Setup, len: usize) -> (u64, Vec<u8>, u32, u64, u32) {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    let remote = s.b.alloc(len);
    s.b.fill(remote, &data);
    let (_, rk_b) = s.b.reg_mr(s.pdb, remote, len as u64, ALL).unwrap();
    let local = s.a.alloc(len);
    let (lk_a, _) = s.a.reg_mr(s.pda, local, len as u64, ALL).unwrap();
    (local, data, lk_a, remote, rk_b)
}

#[test]
fn a_lost_last_read_response_is_asked_for_again_by_the_tail_probe() {
    // Nothing follows the lost response: no gap shows, only silence. The
    // tail probe (a round trip or two, not the 67 ms ACK timeout) asks
    // for it again.
    let (mut s, scripts) = scripted_with(read_opts(1), vec![], vec![rule(false, 0x13, Act::Drop)]);
    let (local, data, lk_a, remote, rk_b) = read_setup(&mut s, 1000);
    s.post(read_wqe(1, remote, rk_b), &[sge(local, 1000, lk_a)]);
    let t0 = s.now;
    let c = s.cqe(false, "READ with its last response lost");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_SUCCESS));
    assert_eq!(s.a.read(local, 1000), data);
    assert_all_fired(&scripts);
    let st = s.a.dev.stats();
    assert_eq!((st.retransmits, st.tail_probes), (0, 1), "{st:?}");
    assert!(s.now - t0 < 67_000_000, "took {} ns", s.now - t0);
    s.assert_quiet(200, "READ after the probe");
}

#[test]
fn a_response_past_the_head_read_asks_for_its_lost_responses_at_once() {
    // Two READs outstanding; the first one's last response is lost. The
    // second one's responses show the loss (rxe's check_psn): the first
    // is asked for again from its missing response, without a timeout
    // and without a probe.
    let (mut s, scripts) = scripted_with(read_opts(2), vec![], vec![rule(false, 0x13, Act::Drop)]);
    let (local, data, lk_a, remote, rk_b) = read_setup(&mut s, 2000);
    for k in 0..2u64 {
        let at = 1000 * k;
        s.post(
            read_wqe(k, remote + at, rk_b),
            &[sge(local + at, 1000, lk_a)],
        );
    }
    let t0 = s.now;
    for k in 0..2u64 {
        let c = s.cqe(false, "two READs, the first's last response lost");
        assert_eq!((c.wr_id, c.status), (k, abi::WC_SUCCESS));
    }
    assert_eq!(s.a.read(local, 2000), data);
    assert_all_fired(&scripts);
    let st = s.a.dev.stats();
    assert_eq!((st.retransmits, st.tail_probes), (0, 0), "{st:?}");
    assert!(s.now - t0 < 67_000_000, "took {} ns", s.now - t0);
    s.assert_quiet(200, "two READs");
}

#[test]
fn a_read_re_requested_mid_chunk_goes_at_once_though_the_gap_halved_the_window() {
    // max_rd_atomic 1: a 1 MiB READ (4096 responses at path MTU 256) is
    // asked for in chunks of the whole window, 128. Response 10 is lost:
    // the gap re-requests 10..128 and halves the window to 64. The
    // re-request must go (everything before it has arrived), not wait for
    // room the window will never have: the soak's 8 MiB READs waited out
    // their retries like this, with RETRY_EXC_ERR.
    let (mut s, scripts) = scripted_with(
        read_opts(1),
        vec![],
        vec![rule(false, 0x10 + 10, Act::Drop)],
    );
    let len = 1 << 20;
    let (local, data, lk_a, remote, rk_b) = read_setup(&mut s, len);
    s.post(read_wqe(1, remote, rk_b), &[sge(local, len as u32, lk_a)]);
    let t0 = s.now;
    let c = s.cqe(false, "1 MiB READ, response 10 lost");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_SUCCESS));
    assert!(s.a.read(local, len) == data, "the READ's bytes");
    assert_all_fired(&scripts);
    let st = s.a.dev.stats();
    assert_eq!(st.retransmits, 0, "{st:?}");
    assert!(s.now - t0 < 67_000_000, "took {} ns", s.now - t0);
}

/// Path MTU 256, A's first PSN 0x10, the default 67 ms ACK timeout,
/// `max_rd_atomic` (and B's `max_dest_rd_atomic`) `n`.
fn read_opts(n: u8) -> ConnOpts {
    ConnOpts {
        mtu: 1,
        my_psn: 0x10,
        peer_psn: 0x42,
        max_rd_atomic: n,
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// max_dest_rd_atomic: the responder's READ/atomic resources.

/// A link that keeps a copy of every RoCEv2 frame sent through it.
struct Recorder {
    inner: Box<dyn Link>,
    sent: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Link for Recorder {
    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        if matches!(wire::parse_frame(frame), Ok(Frame::Roce(_))) {
            self.sent.lock().unwrap().push(frame.to_vec());
        }
        self.inner.send(frame)
    }

    fn receive(&mut self, rx: vrnic::link::Rx<'_>) -> std::io::Result<Option<usize>> {
        rx.read(|buf| self.inner.recv(buf))
    }

    fn caps(&self) -> vrnic::link::LinkCaps {
        vrnic::link::LinkCaps {
            fd: self.inner.caps().fd,
            ..Default::default()
        }
    }
}

/// [`setup`] with A's RoCEv2 frames recorded.
fn recorded_setup(oa: ConnOpts, connect_b: bool) -> (Setup, Arc<Mutex<Vec<Vec<u8>>>>) {
    let (la, lb) = QueueLink::pair();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let la = Recorder {
        inner: Box::new(la),
        sent: sent.clone(),
    };
    (
        RcPair::on((Box::new(la), Box::new(lb)), oa, connect_b),
        sent,
    )
}

impl Setup {
    /// Hands `frame` to B's device again, as a duplicate from the wire, and
    /// returns what B answers (not delivered to A).
    fn b_replies_to(&mut self, frame: &[u8]) -> Vec<Vec<u8>> {
        self.b.dev.receive(&self.b.mem, frame, self.now);
        std::iter::from_fn(|| self.b.dev.pop_tx()).collect()
    }
}

/// The BTH opcode and AtomicAckETH original value of a RoCEv2 frame.
fn opcode_and_orig(frame: &[u8]) -> (wire::Opcode, Option<u64>) {
    let Ok(Frame::Roce(p)) = wire::parse_frame(frame) else {
        panic!("not a RoCEv2 frame");
    };
    (p.hdr.bth.opcode, p.hdr.atomic_ack_eth.map(|a| a.orig))
}

/// Posts one signalled work request on A and waits for its successful
/// completion; returns the RoCEv2 frames A sent meanwhile (`rec`).
fn post_ok(
    s: &mut Setup,
    rec: &Mutex<Vec<Vec<u8>>>,
    wqe: abi::SendWqe,
    sges: &[abi::Sge],
    what: &str,
) -> Vec<Vec<u8>> {
    let before = rec.lock().unwrap().len();
    s.post(wqe, sges);
    let c = s.cqe(false, what);
    assert_eq!((c.status, c.wr_id), (abi::WC_SUCCESS, wqe.wr_id), "{what}");
    rec.lock().unwrap()[before..].to_vec()
}

#[test]
fn read_and_atomics_without_responder_resources_fail_with_invalid_request() {
    for op in [abi::WR_RDMA_READ, abi::WR_ATOMIC_FETCH_AND_ADD] {
        // A may have one outstanding; B offers max_dest_rd_atomic 0.
        let mut s = setup(ConnOpts::default(), false);
        let ob = ConnOpts {
            max_rd_atomic: 0,
            my_psn: ConnOpts::default().peer_psn,
            peer_psn: ConnOpts::default().my_psn,
            ..ConnOpts::default()
        };
        let (ipa, qa) = (s.a.ip, s.qa.qpn);
        s.b.connect_opts(&s.qb, ipa, qa, ob);
        let remote = s.b.alloc(4096);
        let (_, rk_b) = s.b.reg_mr(s.pdb, remote, 4096, ALL).unwrap();
        let local = s.a.alloc(4096);
        let (lk_a, _) = s.a.reg_mr(s.pda, local, 4096, ALL).unwrap();
        s.post(
            abi::SendWqe {
                wr_id: 3,
                opcode: op,
                send_flags: abi::SEND_SIGNALED,
                remote_addr: remote,
                rkey: rk_b,
                compare_add: 1,
                ..Default::default()
            },
            &[sge(local, 8, lk_a)],
        );
        let c = s.cqe(false, "READ/atomic to max_dest_rd_atomic 0");
        assert_eq!(
            (c.status, c.wr_id),
            (abi::WC_REM_INV_REQ_ERR, 3),
            "opcode {op}"
        );
        assert_eq!(s.b.dev.stats().nak_inv_req_sent, 1, "opcode {op}");
        assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_ERR, "opcode {op}");
        assert_eq!(s.b.read(remote, 8), vec![0; 8], "opcode {op}: not executed");
    }
}

#[test]
fn max_dest_rd_atomic_reads_may_be_outstanding_at_once() {
    let o = ConnOpts {
        max_rd_atomic: 4,
        ..ConnOpts::default()
    };
    let (mut s, rec) = recorded_setup(o, true);
    let remote = s.b.alloc(4 * 3000);
    let data = pattern(4 * 3000, 9);
    s.b.fill(remote, &data);
    let (_, rk_b) = s.b.reg_mr(s.pdb, remote, 4 * 3000, ALL).unwrap();
    let local = s.a.alloc(4 * 3000);
    let (lk_a, _) = s.a.reg_mr(s.pda, local, 4 * 3000, ALL).unwrap();
    for k in 0..4u64 {
        s.post(
            abi::SendWqe {
                wr_id: k,
                opcode: abi::WR_RDMA_READ,
                send_flags: abi::SEND_SIGNALED,
                remote_addr: remote + k * 3000,
                rkey: rk_b,
                ..Default::default()
            },
            &[sge(local + k * 3000, 3000, lk_a)],
        );
    }
    for k in 0..4u64 {
        let c = s.cqe(false, "READ");
        assert_eq!((c.status, c.wr_id), (abi::WC_SUCCESS, k));
    }
    // All four requests left before the first response came back: A sent
    // nothing in between (a READ is acknowledged by its response).
    let ops: Vec<_> = rec
        .lock()
        .unwrap()
        .iter()
        .map(|f| opcode_and_orig(f).0)
        .collect();
    assert_eq!(ops, [wire::Opcode::RcReadRequest; 4], "A's frames");
    assert_eq!(s.a.read(local, 4 * 3000), data);
}

#[test]
fn a_duplicate_read_is_answered_only_within_the_responder_resources() {
    // max_dest_rd_atomic 1: B remembers its last READ or atomic only.
    let (mut s, rec) = recorded_setup(ConnOpts::default(), true);
    let remote = s.b.alloc(8192);
    let data = pattern(8192, 3);
    s.b.fill(remote, &data);
    let (_, rk_b) = s.b.reg_mr(s.pdb, remote, 8192, ALL).unwrap();
    let local = s.a.alloc(8192);
    let (lk_a, _) = s.a.reg_mr(s.pda, local, 8192, ALL).unwrap();
    let read = |wr_id: u64, off: u64, len: u32| {
        (
            abi::SendWqe {
                wr_id,
                opcode: abi::WR_RDMA_READ,
                send_flags: abi::SEND_SIGNALED,
                remote_addr: remote + off,
                rkey: rk_b,
                ..Default::default()
            },
            [sge(local + off, len, lk_a)],
        )
    };
    let (w, g) = read(1, 0, 2048);
    let first = post_ok(&mut s, &rec, w, &g, "READ 1");
    let (w, g) = read(2, 4096, 100);
    let second = post_ok(&mut s, &rec, w, &g, "READ 2");
    assert_eq!((first.len(), second.len()), (1, 1), "one request each");
    let dups = s.b.dev.stats().duplicates;
    // READ 2 is B's resource: its duplicate gets its response again.
    let again = s.b_replies_to(&second[0]);
    let ops: Vec<_> = again.iter().map(|f| opcode_and_orig(f).0).collect();
    assert_eq!(ops, [wire::Opcode::RcReadResponseOnly]);
    // READ 1 no longer is: its duplicate is dropped, not re-executed.
    assert!(s.b_replies_to(&first[0]).is_empty(), "stale READ answered");
    assert_eq!(s.b.dev.stats().duplicates, dups + 2);
    // The connection carries on.
    let (w, g) = read(3, 6000, 2000);
    post_ok(&mut s, &rec, w, &g, "READ 3");
    assert_eq!(s.a.read(local, 2048), data[..2048]);
    assert_eq!(s.a.read(local + 6000, 2000), data[6000..8000]);
    assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_RTS);
}

#[test]
fn a_duplicate_atomic_is_replayed_within_the_resources_and_never_re_executed() {
    let (mut s, rec) = recorded_setup(ConnOpts::default(), true);
    let counter = s.b.alloc(8);
    s.b.fill(counter, &5u64.to_le_bytes());
    let (_, rk_b) = s.b.reg_mr(s.pdb, counter, 8, ALL).unwrap();
    let local = s.a.alloc(16);
    let (lk_a, _) = s.a.reg_mr(s.pda, local, 16, ALL).unwrap();
    let faa = |wr_id: u64, add: u64| abi::SendWqe {
        wr_id,
        opcode: abi::WR_ATOMIC_FETCH_AND_ADD,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: counter,
        rkey: rk_b,
        compare_add: add,
        ..Default::default()
    };
    let value = |s: &Setup| u64::from_le_bytes(s.b.read(counter, 8).try_into().unwrap());
    let first = post_ok(&mut s, &rec, faa(1, 1), &[sge(local, 8, lk_a)], "FAA 1");
    assert_eq!(value(&s), 6);
    // Within the resources: answered with the original value, not run again.
    let again = s.b_replies_to(&first[0]);
    assert_eq!(again.len(), 1);
    assert_eq!(
        opcode_and_orig(&again[0]),
        (wire::Opcode::RcAtomicAck, Some(5))
    );
    assert_eq!(value(&s), 6, "duplicate executed");
    let second = post_ok(
        &mut s,
        &rec,
        faa(2, 10),
        &[sge(local + 8, 8, lk_a)],
        "FAA 2",
    );
    assert_eq!(value(&s), 16);
    // FAA 1 fell out of the one resource: dropped; FAA 2 replayed.
    assert!(
        s.b_replies_to(&first[0]).is_empty(),
        "stale atomic answered"
    );
    let again = s.b_replies_to(&second[0]);
    assert_eq!(
        again.iter().map(|f| opcode_and_orig(f)).collect::<Vec<_>>(),
        [(wire::Opcode::RcAtomicAck, Some(6))]
    );
    assert_eq!(value(&s), 16, "duplicate executed");
    assert_eq!(
        s.a.read(local, 16),
        [5u64.to_ne_bytes(), 6u64.to_ne_bytes()].concat()
    );
}

#[test]
fn modify_qp_refuses_rd_atomic_limits_beyond_the_device_maximum() {
    // B's QP is in RESET (not connected by the setup).
    let mut s = setup(ConnOpts::default(), false);
    let qpn = s.qb.qpn;
    let attrs = |max_rd_atomic| {
        let o = ConnOpts {
            max_rd_atomic,
            ..ConnOpts::default()
        };
        conn_attrs(qpn, s.a.ip, s.qa.qpn, o)
    };
    // ibv_query_device's max_qp_rd_atom / max_qp_init_rd_atom (128, as rxe).
    let max = vrnic::verbs::qp::MAX_QP_RD_ATOM as u8;
    let [init, rtr16, rts16] = attrs(max);
    let [_, rtr17, rts17] = attrs(max + 1);
    s.b.cmd(abi::CMD_MODIFY_QP, &init).unwrap();
    assert_eq!(
        s.b.cmd(abi::CMD_MODIFY_QP, &rtr17).err(),
        Some(abi::STATUS_EINVAL)
    );
    assert_eq!(s.b.qp_state(qpn), abi::QPS_INIT);
    s.b.cmd(abi::CMD_MODIFY_QP, &rtr16).unwrap();
    assert_eq!(
        s.b.cmd(abi::CMD_MODIFY_QP, &rts17).err(),
        Some(abi::STATUS_EINVAL)
    );
    assert_eq!(s.b.qp_state(qpn), abi::QPS_RTR);
    s.b.cmd(abi::CMD_MODIFY_QP, &rts16).unwrap();
    assert_eq!(s.b.qp_state(qpn), abi::QPS_RTS);
}

// ---------------------------------------------------------------------------
// The requester's window of unacknowledged PSNs.

#[test]
fn a_long_write_stops_at_the_window_until_acknowledged() {
    use vrnic::transport::requester::MAX_INFLIGHT_PKTS;
    let o = ConnOpts {
        mtu: 1, // 256 bytes: 1 MiB is 4096 packets
        ..ConnOpts::default()
    };
    let (mut s, rec) = recorded_setup(o, true);
    let len = 1usize << 20;
    let src = s.a.alloc(len);
    let dst = s.b.alloc(len);
    let data = pattern(len, 5);
    s.a.fill(src, &data);
    let (lk_a, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
    let (_, rk_b) = s.b.reg_mr(s.pdb, dst, len as u64, ALL).unwrap();
    let write = |wr_id| abi::SendWqe {
        wr_id,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: dst,
        rkey: rk_b,
        ..Default::default()
    };
    // A first small WRITE resolves B's MAC.
    post_ok(&mut s, &rec, write(1), &[sge(src, 1, lk_a)], "first WRITE");
    let before = rec.lock().unwrap().len();
    s.post(write(2), &[sge(src, len as u32, lk_a)]);
    // B does not answer: A sends one window, then waits (also across
    // polls and a little time, short of the ACK timeout).
    for _ in 0..50 {
        s.a.pump(s.now);
        s.now += 10_000;
    }
    let window: Vec<Vec<u8>> = rec.lock().unwrap()[before..].to_vec();
    assert_eq!(
        window.len(),
        MAX_INFLIGHT_PKTS as usize,
        "packets sent unacknowledged"
    );
    let Ok(Frame::Roce(last)) = wire::parse_frame(&window[window.len() - 1]) else {
        panic!("not RoCEv2");
    };
    assert!(
        last.hdr.bth.ack_req,
        "the packet that fills the window asks for an ACK"
    );
    let c = s.cqe(false, "1 MiB WRITE");
    assert_eq!((c.status, c.wr_id), (abi::WC_SUCCESS, 2));
    assert_eq!(s.b.read(dst, len), data);
    assert_eq!(s.a.dev.stats().retransmits, 0, "no timeout needed");
}

/// rxe's `check_op_valid`: a WRITE needs `IBV_ACCESS_REMOTE_WRITE` on the
/// responder's QP whatever its length; a zero-length WRITE (no RETH
/// address or rkey needed, C9-88) to a QP without it is a remote access
/// error too, not a silent success.
#[test]
fn zero_length_write_needs_remote_write_on_the_qp() {
    let mut p = RcPair::on(
        {
            let (la, lb) = vrnic::link::mem::MemLink::pair();
            (Box::new(la), Box::new(lb))
        },
        ConnOpts::default(),
        true,
    );
    // RTS → RTS: the responder's QP keeps local write only.
    let a = abi::QpAttr {
        qpn: p.qb.qpn,
        attr_mask: abi::QP_ATTR_ACCESS_FLAGS,
        qp_access_flags: abi::ACCESS_LOCAL_WRITE,
        ..Default::default()
    };
    p.b.cmd(abi::CMD_MODIFY_QP, &a).unwrap();
    p.post(
        abi::SendWqe {
            wr_id: 7,
            opcode: abi::WR_RDMA_WRITE,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[],
    );
    let c = p.cqe(false, "zero-length WRITE");
    assert_eq!((c.wr_id, c.status), (7, abi::WC_REM_ACCESS_ERR));
}
