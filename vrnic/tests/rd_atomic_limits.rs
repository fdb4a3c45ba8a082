//! The limits of RDMA READ and atomics and of the requester's window, as a
//! user of two connected RC QPs sees them on the wire between two engines:
//!
//! - `max_dest_rd_atomic` 0 (IBTA §9.5, rxe's `check_resource`): a READ or
//!   an atomic is NAKed as an invalid request, the requester completes it
//!   with `REM_INV_REQ_ERR`, flushes what follows, the responder QP goes to
//!   ERR, nothing is executed and nothing hangs.
//! - `max_dest_rd_atomic` = `max_rd_atomic` = N: N READs are on the wire at
//!   once, the next waits, all complete.
//! - The responder resources (IBTA §9.7.5.2.3, §9.7.5.2.5; rxe's
//!   `duplicate_request`): a duplicate atomic among the last N is answered
//!   with its original value and not executed again; an older one, a very
//!   old duplicate READ (re-injected long after) and a forged READ asking
//!   for other bytes or another R_Key are dropped; a READ resent from its
//!   first missing response is answered.
//! - The requester's window (`MAX_INFLIGHT_PKTS`, rxe's
//!   `RXE_MAX_UNACKED_PSNS`): a 1 MiB WRITE at path MTU 256 never has more
//!   than the window of unacknowledged PSNs on the wire, against a slow
//!   receiver, behind a 1 MiB READ and over a lossy link, and completes.
//!
//! Simulated clock only; no sleeps; every loop is bounded.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use vrnic::abi;
use vrnic::link::fault::{FaultConfig, FaultLink, FaultRates};
use vrnic::link::Link;
use vrnic::transport::requester::MAX_INFLIGHT_PKTS;
use vrnic::wire::{self, AethKind, Frame, Opcode, RocePacket};

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;

/// One RoCEv2 frame seen at A's end of the link: sent by A (`tx`) or
/// handed to A (`!tx`).
#[derive(Clone)]
struct Seen {
    tx: bool,
    frame: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A's link, wrapped: every RoCEv2 frame A sends and receives is logged in
/// order. A frame A receives is logged when the device is about to process
/// it, so a frame A sends afterwards was built knowing it.
struct Tap {
    inner: Box<dyn Link>,
    log: Log,
}

impl Tap {
    fn keep(&self, tx: bool, frame: &[u8]) {
        if matches!(wire::parse_frame(frame), Ok(Frame::Roce(_))) {
            self.log.lock().unwrap().push(Seen {
                tx,
                frame: frame.to_vec(),
            });
        }
    }
}

impl Link for Tap {
    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        self.keep(true, frame);
        self.inner.send(frame)
    }

    fn receive(&mut self, rx: vrnic::link::Rx<'_>) -> std::io::Result<Option<usize>> {
        rx.read(|buf| {
            let r = self.inner.recv(buf)?;
            if let Some(n) = r {
                self.keep(false, &buf[..n]);
            }
            Ok(r)
        })
    }

    fn caps(&self) -> vrnic::link::LinkCaps {
        vrnic::link::LinkCaps {
            fd: self.inner.caps().fd,
            ..Default::default()
        }
    }
}

fn roce(frame: &[u8]) -> RocePacket<'_> {
    match wire::parse_frame(frame) {
        Ok(Frame::Roce(p)) => p,
        _ => panic!("not a RoCEv2 frame"),
    }
}

/// The two engines, A's end of the link logged.
struct T {
    s: RcPair,
    log: Log,
}

/// Connection attributes with `max_rd_atomic` and `max_dest_rd_atomic`
/// both `n` (what `ConnOpts::max_rd_atomic` sets).
fn opts(mtu: u32, n: u8) -> ConnOpts {
    ConnOpts {
        mtu,
        max_rd_atomic: n,
        ..ConnOpts::default()
    }
}

/// A connected with `oa`, B with the mirror image except that B offers
/// `b_dest_rd_atomic` responder resources; `lossy` puts a 5%-drop link
/// (both directions) between them.
fn pair(oa: ConnOpts, b_dest_rd_atomic: u8, lossy: Option<u64>) -> T {
    let (la, lb) = QueueLink::pair();
    let (la, lb): (Box<dyn Link>, Box<dyn Link>) = match lossy {
        None => (Box::new(la), Box::new(lb)),
        Some(seed) => {
            let cfg = |seed| FaultConfig {
                seed,
                tx: FaultRates {
                    drop: 0.05,
                    ..FaultRates::default()
                },
                rx: FaultRates::default(),
            };
            (
                Box::new(FaultLink::new(Box::new(la), cfg(seed)).unwrap()),
                Box::new(FaultLink::new(Box::new(lb), cfg(!seed)).unwrap()),
            )
        }
    };
    let log = Log::default();
    let la = Tap {
        inner: la,
        log: log.clone(),
    };
    let mut s = RcPair::on((Box::new(la), lb), oa, false);
    let ob = ConnOpts {
        my_psn: oa.peer_psn,
        peer_psn: oa.my_psn,
        max_rd_atomic: b_dest_rd_atomic,
        ..oa
    };
    let (ipa, qa) = (s.a.ip, s.qa.qpn);
    s.b.connect_opts(&s.qb, ipa, qa, ob);
    T { s, log }
}

impl T {
    /// Frames logged so far.
    fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }

    /// Number of frames logged so far.
    fn logged(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// A's request frames logged from index `from` on.
    fn sent_from(&self, from: usize) -> Vec<Vec<u8>> {
        self.log.lock().unwrap()[from..]
            .iter()
            .filter(|f| f.tx)
            .map(|f| f.frame.clone())
            .collect()
    }

    /// Hands `frame` to B again, as if the link delivered it late, and
    /// returns what B answers (not delivered to A).
    fn b_answers(&mut self, frame: &[u8]) -> Vec<Vec<u8>> {
        self.s.b.dev.receive(&self.s.b.mem, frame, self.s.now);
        std::iter::from_fn(|| self.s.b.dev.pop_tx()).collect()
    }

    /// Posts one signalled WQE on A and waits for its completion, which
    /// must succeed; returns A's request frames sent meanwhile.
    fn post_ok(&mut self, wqe: abi::SendWqe, sges: &[abi::Sge], what: &str) -> Vec<Vec<u8>> {
        let before = self.logged();
        self.s.post(wqe, sges);
        let c = self.s.cqe(false, what);
        assert_eq!((c.status, c.wr_id), (abi::WC_SUCCESS, wqe.wr_id), "{what}");
        self.sent_from(before)
    }

    /// B's counters (device-wide; B has one QP).
    fn b_stats(&self) -> vrnic::device::DeviceStats {
        self.s.b.dev.stats().clone()
    }
}

fn write(wr_id: u64, remote: u64, rkey: u32) -> abi::SendWqe {
    abi::SendWqe {
        opcode: abi::WR_RDMA_WRITE,
        ..read_wqe(wr_id, remote, rkey)
    }
}

fn fetch_add(wr_id: u64, remote: u64, rkey: u32, add: u64) -> abi::SendWqe {
    abi::SendWqe {
        opcode: abi::WR_ATOMIC_FETCH_AND_ADD,
        compare_add: add,
        ..read_wqe(wr_id, remote, rkey)
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 13 + i / 509) as u8).wrapping_add(seed))
        .collect()
}

fn u64_at(n: &Node, gpa: u64) -> u64 {
    u64::from_le_bytes(n.read(gpa, 8).try_into().unwrap())
}

// ---------------------------------------------------------------------------
// max_dest_rd_atomic 0.

/// Posts `wqe` (a READ or an atomic on B's 8 bytes at `target`, which hold
/// 7) and a SEND behind it, against a B with no responder resources.
fn no_responder_resources(make: impl Fn(u64, u32) -> abi::SendWqe, what: &str) {
    let mut t = pair(opts(3, 1), 0, None);
    let target = t.s.b.alloc(4096);
    t.s.b.fill(target, &7u64.to_le_bytes());
    let (_, rk_b) = t.s.b.reg_mr(t.s.pdb, target, 4096, ALL).unwrap();
    let local = t.s.a.alloc(4096);
    let (lk_a, _) = t.s.a.reg_mr(t.s.pda, local, 4096, ALL).unwrap();
    let before = t.logged();
    t.s.post(make(target, rk_b), &[sge(local, 8, lk_a)]);
    let send = abi::SendWqe {
        wr_id: 9,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    t.s.post(send, &[sge(local + 64, 16, lk_a)]);
    let c = t.s.cqe(false, what);
    assert_eq!((c.status, c.wr_id), (abi::WC_REM_INV_REQ_ERR, 1), "{what}");
    let c = t.s.cqe(false, what);
    assert_eq!(
        (c.status, c.wr_id),
        (abi::WC_WR_FLUSH_ERR, 9),
        "{what}: the WQE behind"
    );
    t.s.assert_quiet(1000, what);
    // B answered with one NAK invalid request and nothing else, executed
    // nothing, and its QP is in ERR.
    let answers: Vec<_> = t.seen()[before..]
        .iter()
        .filter(|f| !f.tx)
        .map(|f| {
            let p = roce(&f.frame);
            (p.hdr.bth.opcode, p.hdr.aeth.map(|a| a.kind()))
        })
        .collect();
    assert_eq!(
        answers,
        [(
            Opcode::RcAck,
            Some(AethKind::Nak(wire::NakCode::InvalidRequest))
        )],
        "{what}: B's answers"
    );
    assert_eq!(t.b_stats().nak_inv_req_sent, 1, "{what}");
    assert_eq!(t.s.a.dev.stats().nak_inv_req_received, 1, "{what}");
    assert_eq!(t.s.b.qp_state(t.s.qb.qpn), abi::QPS_ERR, "{what}");
    assert_eq!(t.s.a.qp_state(t.s.qa.qpn), abi::QPS_ERR, "{what}");
    assert_eq!(u64_at(&t.s.b, target), 7, "{what}: executed");
    assert_eq!(t.s.a.read(local, 8), [0; 8], "{what}: result written");
}

#[test]
fn read_without_responder_resources_completes_with_rem_inv_req_err() {
    no_responder_resources(|va, rkey| read_wqe(1, va, rkey), "READ");
}

#[test]
fn compare_and_swap_without_responder_resources_completes_with_rem_inv_req_err() {
    // Compare 7 with 7: executed, it would swap in 99.
    let cas = |va, rkey| abi::SendWqe {
        opcode: abi::WR_ATOMIC_CMP_AND_SWP,
        compare_add: 7,
        swap: 99,
        ..read_wqe(1, va, rkey)
    };
    no_responder_resources(cas, "compare-and-swap");
}

// ---------------------------------------------------------------------------
// N outstanding READs.

#[test]
fn max_rd_atomic_reads_are_outstanding_at_once_and_all_complete() {
    for n in [2u8, 16] {
        // MTU 256: each 1000-byte READ has 4 response packets.
        let mut t = pair(opts(1, n), n, None);
        let count = usize::from(n) + 1;
        let len = 1000usize;
        let size = count * 1024;
        let remote = t.s.b.alloc(size);
        let data = pattern(size, n);
        t.s.b.fill(remote, &data);
        let (_, rk_b) = t.s.b.reg_mr(t.s.pdb, remote, size as u64, ALL).unwrap();
        let local = t.s.a.alloc(size);
        let (lk_a, _) = t.s.a.reg_mr(t.s.pda, local, size as u64, ALL).unwrap();
        for k in 0..count as u64 {
            let off = k * 1024;
            let w = read_wqe(k, remote + off, rk_b);
            t.s.post(w, &[sge(local + off, len as u32, lk_a)]);
        }
        for k in 0..count as u64 {
            let c = t.s.cqe(false, "READ");
            assert_eq!((c.status, c.wr_id), (abi::WC_SUCCESS, k), "n {n}");
        }
        for k in 0..count {
            let off = k * 1024;
            assert_eq!(
                t.s.a.read(local + off as u64, len),
                data[off..off + len],
                "n {n}: READ {k}"
            );
        }
        // A put n READ requests on the wire before B's first response
        // came back, the last one only after; B answered each once.
        let seen = t.seen();
        let first_rx = seen.iter().position(|f| !f.tx).expect("responses");
        let early = seen[..first_rx].iter().filter(|f| f.tx).count();
        assert_eq!(early, usize::from(n), "READs outstanding at once");
        let requests = seen.iter().filter(|f| f.tx).count();
        assert_eq!(requests, count, "n {n}: one request per READ");
        assert_eq!(t.b_stats().duplicates, 0, "n {n}");
        assert_eq!(t.s.a.dev.stats().retransmits, 0, "n {n}");
        assert_eq!(t.s.b.qp_state(t.s.qb.qpn), abi::QPS_RTS);
    }
}

// ---------------------------------------------------------------------------
// The responder resources: duplicates.

#[test]
fn duplicate_atomics_are_replayed_within_the_resources_never_re_executed() {
    const N: u8 = 4;
    let mut t = pair(opts(3, N), N, None);
    let counter = t.s.b.alloc(8);
    t.s.b.fill(counter, &5u64.to_le_bytes());
    let (_, rk_b) = t.s.b.reg_mr(t.s.pdb, counter, 8, ALL).unwrap();
    let local = t.s.a.alloc(64);
    let (lk_a, _) = t.s.a.reg_mr(t.s.pda, local, 64, ALL).unwrap();
    let adds = [1u64, 10, 100, 1000, 10_000];
    let mut requests = Vec::new();
    for (k, add) in adds.iter().enumerate().take(usize::from(N)) {
        let w = fetch_add(k as u64, counter, rk_b, *add);
        let sent = t.post_ok(w, &[sge(local + 8 * k as u64, 8, lk_a)], "FAA");
        assert_eq!(sent.len(), 1);
        requests.push(sent[0].clone());
    }
    assert_eq!(u64_at(&t.s.b, counter), 1116);
    // Every one of the last N, duplicated: its own original value again.
    let originals = [5u64, 6, 16, 116, 1116];
    let (dups, dropped) = (t.b_stats().duplicates, t.b_stats().rx_dropped);
    for (k, req) in requests.iter().enumerate() {
        let a = t.b_answers(req);
        assert_eq!(a.len(), 1, "duplicate FAA {k}: one answer");
        let p = roce(&a[0]);
        assert_eq!(p.hdr.bth.opcode, Opcode::RcAtomicAck);
        assert_eq!(p.hdr.bth.psn, roce(req).hdr.bth.psn);
        assert_eq!(p.hdr.atomic_ack_eth.map(|e| e.orig), Some(originals[k]));
    }
    assert_eq!(u64_at(&t.s.b, counter), 1116, "a duplicate was executed");
    assert_eq!(t.b_stats().duplicates, dups + u64::from(N));
    assert_eq!(t.b_stats().rx_dropped, dropped);
    // One more atomic takes the oldest resource: its duplicate is dropped
    // (never executed again), the others are still answered.
    let k = usize::from(N);
    let w = fetch_add(k as u64, counter, rk_b, adds[k]);
    let sent = t.post_ok(w, &[sge(local + 8 * k as u64, 8, lk_a)], "FAA");
    requests.push(sent[0].clone());
    assert_eq!(u64_at(&t.s.b, counter), 11_116);
    assert!(t.b_answers(&requests[0]).is_empty(), "stale FAA answered");
    assert_eq!(t.b_stats().rx_dropped, dropped + 1);
    for (k, req) in requests.iter().enumerate().skip(1) {
        let a = t.b_answers(req);
        assert_eq!(a.len(), 1, "duplicate FAA {k}");
        assert_eq!(
            roce(&a[0]).hdr.atomic_ack_eth.map(|e| e.orig),
            Some(originals[k])
        );
    }
    assert_eq!(u64_at(&t.s.b, counter), 11_116, "a duplicate was executed");
    let got: Vec<u64> = (0..adds.len() as u64)
        .map(|k| u64_at(&t.s.a, local + 8 * k))
        .collect();
    assert_eq!(got, originals);
    assert_eq!(t.s.b.qp_state(t.s.qb.qpn), abi::QPS_RTS);
}

#[test]
fn a_very_old_duplicate_read_is_dropped_not_answered() {
    const N: u8 = 4;
    let mut t = pair(opts(1, N), N, None);
    let size = 64 << 10;
    let remote = t.s.b.alloc(size);
    let data = pattern(size, 1);
    t.s.b.fill(remote, &data);
    let (_, rk_b) = t.s.b.reg_mr(t.s.pdb, remote, size as u64, ALL).unwrap();
    let local = t.s.a.alloc(size);
    let (lk_a, _) = t.s.a.reg_mr(t.s.pda, local, size as u64, ALL).unwrap();
    let old = t.post_ok(
        read_wqe(1, remote, rk_b),
        &[sge(local, 1000, lk_a)],
        "old READ",
    );
    assert_eq!(old.len(), 1);
    // Long after: 600 WRITEs (the READ's PSN falls far behind) and N more
    // READs (the responder resources all hold newer requests).
    for k in 0..600u64 {
        let w = write(100 + k, remote + 32 * 1024, rk_b);
        t.post_ok(w, &[sge(local + 32 * 1024, 300, lk_a)], "WRITE");
    }
    for k in 0..u64::from(N) {
        let off = 2048 * (k + 1);
        let w = read_wqe(10 + k, remote + off, rk_b);
        t.post_ok(w, &[sge(local + off, 1000, lk_a)], "READ");
    }
    let b_mem = t.s.b.read(remote, size);
    let (dups, dropped) = (t.b_stats().duplicates, t.b_stats().rx_dropped);
    let b_tx = t.s.b.dev.stats().tx_frames;
    // The old READ, re-injected: nothing comes back.
    assert!(t.b_answers(&old[0]).is_empty(), "stale READ answered");
    assert_eq!(t.b_stats().duplicates, dups + 1);
    assert_eq!(t.b_stats().rx_dropped, dropped + 1);
    assert_eq!(t.s.b.dev.stats().tx_frames, b_tx);
    assert_eq!(t.s.b.read(remote, size), b_mem);
    assert_eq!(t.s.b.qp_state(t.s.qb.qpn), abi::QPS_RTS);
    // The connection carries on.
    let w = read_wqe(50, remote + 16 * 1024, rk_b);
    let last = t.post_ok(w, &[sge(local + 16 * 1024, 1000, lk_a)], "READ after");
    assert_eq!(t.s.a.read(local, 1000), data[..1000]);
    assert_eq!(
        t.s.a.read(local + 16 * 1024, 1000),
        data[16 * 1024..16 * 1024 + 1000]
    );
    assert_eq!(t.s.a.dev.stats().retransmits, 0);
    // The newest READ, duplicated, is answered: all four responses.
    let a = t.b_answers(&last[0]);
    let ops: Vec<_> = a.iter().map(|f| roce(f).hdr.bth.opcode).collect();
    assert_eq!(
        ops,
        [
            Opcode::RcReadResponseFirst,
            Opcode::RcReadResponseMiddle,
            Opcode::RcReadResponseMiddle,
            Opcode::RcReadResponseLast
        ]
    );
}

/// `frame` (a READ request) with its PSN `k` later and its RETH changed.
fn forged_read(frame: &[u8], k: u32, reth: impl Fn(&mut wire::Reth)) -> Vec<u8> {
    let p = roce(frame);
    let mut hdr = p.hdr.clone();
    hdr.bth.psn = vrnic::transport::psn::add(hdr.bth.psn, k);
    reth(hdr.reth.as_mut().expect("a READ request"));
    let mut out = Vec::new();
    wire::emit_frame(&hdr, p.payload, &mut out);
    out
}

#[test]
fn a_duplicate_read_is_answered_only_for_the_bytes_and_r_key_of_the_original() {
    // MTU 256: the READ of 1000 bytes has response PSNs p .. p+3.
    let mut t = pair(opts(1, 1), 1, None);
    let size = 16 << 10;
    let remote = t.s.b.alloc(size);
    let data = pattern(size, 2);
    t.s.b.fill(remote, &data);
    let (_, rk_b) = t.s.b.reg_mr(t.s.pdb, remote, size as u64, ALL).unwrap();
    // Another MR over the same bytes: a valid R_Key, but not the READ's.
    let (_, rk_other) = t.s.b.reg_mr(t.s.pdb, remote, size as u64, ALL).unwrap();
    let local = t.s.a.alloc(4096);
    let (lk_a, _) = t.s.a.reg_mr(t.s.pda, local, 4096, ALL).unwrap();
    let va = remote + 4096;
    let sent = t.post_ok(read_wqe(1, va, rk_b), &[sge(local, 1000, lk_a)], "READ");
    let req = &sent[0];
    let psn0 = roce(req).hdr.bth.psn;
    let dropped = t.b_stats().rx_dropped;
    let refused = [
        // More bytes than the original.
        forged_read(req, 0, |r| r.dma_len = 4000),
        // Bytes before the original.
        forged_read(req, 0, |r| r.va -= 256),
        // Bytes far beyond it.
        forged_read(req, 0, |r| r.va = u64::MAX - 8),
        // The same bytes under another R_Key.
        forged_read(req, 0, |r| r.rkey = rk_other),
        // A "resend" from the second response asking for all the bytes:
        // its responses would run past the original's PSNs.
        forged_read(req, 1, |_| {}),
    ];
    for (i, f) in refused.iter().enumerate() {
        assert!(t.b_answers(f).is_empty(), "forged READ {i} answered");
    }
    assert_eq!(t.b_stats().rx_dropped, dropped + refused.len() as u64);
    // A resend from the third response, as a requester sends it after
    // losing it: the last two responses, at their original PSNs.
    let resend = forged_read(req, 2, |r| {
        r.va += 512;
        r.dma_len -= 512;
    });
    let a = t.b_answers(&resend);
    let got: Vec<_> = a
        .iter()
        .map(|f| {
            let p = roce(f);
            (p.hdr.bth.opcode, p.hdr.bth.psn, p.payload.to_vec())
        })
        .collect();
    let at = |o: usize, n: usize| data[4096 + o..4096 + o + n].to_vec();
    assert_eq!(
        got,
        [
            (
                Opcode::RcReadResponseFirst,
                vrnic::transport::psn::add(psn0, 2),
                at(512, 256)
            ),
            (
                Opcode::RcReadResponseLast,
                vrnic::transport::psn::add(psn0, 3),
                at(768, 232)
            ),
        ]
    );
    assert_eq!(t.s.b.qp_state(t.s.qb.qpn), abi::QPS_RTS);
}

// ---------------------------------------------------------------------------
// The requester's window of unacknowledged PSNs.

/// Replays A's log and returns the most PSNs A ever had unacknowledged
/// when it sent a request packet: the packet's PSN minus the newest PSN
/// acknowledged by what A had received (an ACK acknowledges its PSN, a
/// NAK the one before, a READ response and an atomic ACK their own), as
/// the completer counts.
fn most_unacknowledged(seen: &[Seen], start_acked: u32) -> i32 {
    use vrnic::transport::psn;
    let mut acked = start_acked;
    let mut most = 0;
    let ack = |p: u32, acked: &mut u32| {
        if psn::diff(p, *acked) > 0 {
            *acked = p;
        }
    };
    for f in seen {
        let p = roce(&f.frame);
        let (op, q) = (p.hdr.bth.opcode, p.hdr.bth.psn);
        if f.tx {
            most = most.max(psn::diff(q, acked));
            continue;
        }
        let before = psn::add(q, psn::PSN_MASK);
        match (op, p.hdr.aeth.map(|a| a.kind())) {
            (Opcode::RcAck, Some(AethKind::Ack { .. })) => ack(q, &mut acked),
            (Opcode::RcAck, _) => ack(before, &mut acked),
            _ => ack(q, &mut acked),
        }
    }
    most
}

/// Pumps A `a_turns` times for each turn of B (a receiver that keeps up
/// `1 / a_turns` of the time), advancing the clock 1 ms when nothing
/// moved, until A has `want` completions; returns them.
fn run_slow_receiver(t: &mut T, a_turns: usize, want: usize, what: &str) -> Vec<abi::Cqe> {
    let mut cqes = Vec::new();
    for _ in 0..200_000 {
        while let Some(c) = t.s.a.poll_cq(&mut t.s.ca) {
            cqes.push(c);
        }
        if cqes.len() >= want {
            return cqes;
        }
        let mut moved = 0;
        for _ in 0..a_turns {
            moved += t.s.a.pump(t.s.now);
        }
        moved += t.s.b.pump(t.s.now);
        if moved == 0 {
            t.s.now += 1_000_000;
        }
    }
    panic!("{what}: {} of {want} completions", cqes.len());
}

/// 1 MiB WRITE source on A and destination on B (filled with `seed`).
struct Big {
    src: u64,
    dst: u64,
    lk_a: u32,
    rk_b: u32,
    data: Vec<u8>,
}

const MIB: usize = 1 << 20;

fn big(t: &mut T, seed: u8) -> Big {
    let src = t.s.a.alloc(MIB);
    let dst = t.s.b.alloc(MIB);
    let data = pattern(MIB, seed);
    t.s.a.fill(src, &data);
    let (lk_a, _) = t.s.a.reg_mr(t.s.pda, src, MIB as u64, ALL).unwrap();
    let (_, rk_b) = t.s.b.reg_mr(t.s.pdb, dst, MIB as u64, ALL).unwrap();
    Big {
        src,
        dst,
        lk_a,
        rk_b,
        data,
    }
}

/// A's initial "acknowledged" PSN: the one before its first (my_psn 0).
const START_ACKED: u32 = vrnic::transport::psn::PSN_MASK;

#[test]
fn a_1_mib_write_at_mtu_256_never_exceeds_the_window_against_a_slow_receiver() {
    // Path MTU 256: 4096 packets. A runs four times for each turn of B.
    let mut t = pair(opts(1, 1), 1, None);
    let b = big(&mut t, 3);
    t.s.post(write(1, b.dst, b.rk_b), &[sge(b.src, MIB as u32, b.lk_a)]);
    let c = run_slow_receiver(&mut t, 4, 1, "1 MiB WRITE");
    assert_eq!((c[0].status, c[0].wr_id), (abi::WC_SUCCESS, 1));
    assert_eq!(t.s.b.read(b.dst, MIB), b.data);
    let seen = t.seen();
    let requests = seen.iter().filter(|f| f.tx).count();
    assert_eq!(requests, 4096, "every packet once (ARP aside)");
    assert_eq!(
        most_unacknowledged(&seen, START_ACKED),
        MAX_INFLIGHT_PKTS as i32,
        "unacknowledged PSNs on the wire"
    );
    assert_eq!(t.s.a.dev.stats().retransmits, 0);
}

#[test]
fn a_write_behind_a_1_mib_read_waits_for_the_responses_to_reach_the_window() {
    // The READ's 4096 response PSNs count: the WRITE's packets go out only
    // within the window of what the responses acknowledged.
    let mut t = pair(opts(1, 1), 1, None);
    let b = big(&mut t, 4);
    let dst_a = t.s.a.alloc(MIB);
    let (lk_dst, _) = t.s.a.reg_mr(t.s.pda, dst_a, MIB as u64, ALL).unwrap();
    t.s.b.fill(b.dst, &b.data);
    t.s.post(
        read_wqe(1, b.dst, b.rk_b),
        &[sge(dst_a, MIB as u32, lk_dst)],
    );
    let w = write(2, b.dst, b.rk_b);
    t.s.post(w, &[sge(b.src, 64 << 10, b.lk_a)]);
    let c = run_slow_receiver(&mut t, 4, 2, "READ then WRITE");
    let got: Vec<_> = c.iter().map(|c| (c.status, c.wr_id)).collect();
    assert_eq!(got, [(abi::WC_SUCCESS, 1), (abi::WC_SUCCESS, 2)]);
    assert_eq!(t.s.a.read(dst_a, MIB), b.data);
    let seen = t.seen();
    let most = most_unacknowledged(&seen, START_ACKED);
    assert!(
        most <= MAX_INFLIGHT_PKTS as i32,
        "{most} PSNs unacknowledged"
    );
    // The WRITE's first packet (PSN 4096) left only once B's READ
    // responses had covered all but the window of the READ's 4096 PSNs.
    let first_write = seen
        .iter()
        .position(|f| f.tx && roce(&f.frame).hdr.bth.opcode == Opcode::RcWriteFirst)
        .expect("WRITE sent");
    let responses = seen[..first_write].iter().filter(|f| !f.tx).count();
    assert!(
        responses >= 4096 - MAX_INFLIGHT_PKTS as usize,
        "WRITE sent after only {responses} READ responses"
    );
}

#[test]
fn a_1_mib_write_over_a_lossy_link_keeps_the_window_and_completes() {
    for seed in [1u64, 2] {
        let mut t = pair(opts(1, 1), 1, Some(seed));
        let b = big(&mut t, seed as u8);
        for k in 0..2u64 {
            t.s.post(write(k, b.dst, b.rk_b), &[sge(b.src, MIB as u32, b.lk_a)]);
        }
        let c = run_slow_receiver(&mut t, 2, 2, "lossy 1 MiB WRITEs");
        let got: Vec<_> = c.iter().map(|c| (c.status, c.wr_id)).collect();
        assert_eq!(
            got,
            [(abi::WC_SUCCESS, 0), (abi::WC_SUCCESS, 1)],
            "seed {seed}"
        );
        assert_eq!(t.s.b.read(b.dst, MIB), b.data, "seed {seed}");
        let seen = t.seen();
        let most = most_unacknowledged(&seen, START_ACKED);
        assert!(
            most <= MAX_INFLIGHT_PKTS as i32,
            "seed {seed}: {most} PSNs unacknowledged"
        );
        // Go-back-N resends at most a window per rewind (a sequence NAK
        // or an ACK timeout).
        let sent = seen.iter().filter(|f| f.tx).count() as u64;
        let st = t.s.a.dev.stats();
        let rewinds = st.nak_psn_seq_received + st.retransmits;
        eprintln!("seed {seed}: {sent} request frames for 8192 packets, {rewinds} rewinds");
        assert!(
            sent <= 8192 + rewinds * u64::from(MAX_INFLIGHT_PKTS),
            "seed {seed}: {sent} request frames after {rewinds} rewinds"
        );
    }
}

// ---------------------------------------------------------------------------
// Long READs asked for in chunks (issue 28: the responses of many QPs'
// multi-megabyte READs overflowed the receiving socket's queue).

/// One READ request A sent: its first PSN and how many response PSNs it
/// asks for at path MTU `mtu`.
fn read_request(frame: &[u8], mtu: u32) -> Option<(u32, u32)> {
    let p = roce(frame);
    if p.hdr.bth.opcode != Opcode::RcReadRequest {
        return None;
    }
    let reth = p.hdr.reth.expect("a READ request has a RETH");
    Some((p.hdr.bth.psn, reth.dma_len.div_ceil(mtu).max(1)))
}

/// Walks A's log of a loss-free READ: returns the requests in order, the
/// most requests outstanding at once (sent, their last response not yet
/// received) and the most response PSNs asked for beyond the last one
/// received.
fn read_requests(seen: &[Seen], mtu: u32) -> (Vec<(u32, u32)>, usize, i32) {
    use vrnic::transport::psn;
    let (mut requests, mut ends) = (Vec::new(), Vec::<u32>::new());
    let (mut most_out, mut most_ahead, mut received) = (0, 0, START_ACKED);
    for f in seen {
        if f.tx {
            let Some((first, n)) = read_request(&f.frame, mtu) else {
                continue;
            };
            requests.push((first, n));
            let last = psn::add(first, n - 1);
            ends.push(last);
            most_out = most_out.max(ends.len());
            most_ahead = most_ahead.max(psn::diff(last, received));
            continue;
        }
        let p = roce(&f.frame);
        if p.hdr.bth.opcode.is_read_response() {
            received = p.hdr.bth.psn;
            ends.retain(|&e| psn::diff(e, received) > 0);
        }
    }
    (requests, most_out, most_ahead)
}

#[test]
fn a_1_mib_read_is_asked_for_in_chunks_within_the_window_and_max_rd_atomic() {
    // Path MTU 256: 4096 response packets. With the full window (128),
    // a chunk is the window shared by up to 4 requests.
    for (n, chunk) in [(1u8, 128u32), (2, 64), (16, 32)] {
        let mut t = pair(opts(1, n), n, None);
        let b = big(&mut t, n);
        t.s.b.fill(b.dst, &b.data);
        let dst_a = t.s.a.alloc(MIB);
        let (lk_dst, _) = t.s.a.reg_mr(t.s.pda, dst_a, MIB as u64, ALL).unwrap();
        t.s.post(
            read_wqe(1, b.dst, b.rk_b),
            &[sge(dst_a, MIB as u32, lk_dst)],
        );
        let c = run_slow_receiver(&mut t, 1, 1, "1 MiB READ");
        assert_eq!((c[0].status, c[0].wr_id), (abi::WC_SUCCESS, 1), "n {n}");
        assert_eq!(t.s.a.read(dst_a, MIB), b.data, "n {n}");
        let (requests, most_out, most_ahead) = read_requests(&t.seen(), 256);
        // Consecutive chunks, each asked for once.
        let want: Vec<(u32, u32)> = (0..4096 / chunk).map(|j| (j * chunk, chunk)).collect();
        assert_eq!(requests, want, "n {n}: the READ requests (PSN, packets)");
        assert!(
            most_out <= usize::from(n),
            "n {n}: {most_out} requests outstanding"
        );
        assert!(
            most_ahead <= (MAX_INFLIGHT_PKTS + chunk) as i32,
            "n {n}: responses asked for {most_ahead} PSNs beyond the last received"
        );
        assert_eq!(t.s.a.dev.stats().retransmits, 0, "n {n}");
        assert_eq!(t.b_stats().duplicates, 0, "n {n}");
    }
}

#[test]
fn long_reads_over_a_lossy_link_re_request_inside_their_chunks_and_complete() {
    // 5% of the frames dropped each way: lost responses are asked for
    // again from the first missing one to the end of its chunk, which the
    // responder finds inside a request it executed (a re-request that is
    // not would be dropped, and the READ would run out of retries).
    for seed in [1u64, 2, 3] {
        let mut t = pair(opts(1, 4), 4, Some(seed));
        let b = big(&mut t, seed as u8);
        t.s.b.fill(b.dst, &b.data);
        let dst_a = t.s.a.alloc(2 * MIB);
        let (lk_dst, _) = t.s.a.reg_mr(t.s.pda, dst_a, 2 * MIB as u64, ALL).unwrap();
        let half = (MIB / 2) as u64;
        for k in 0..2u64 {
            let w = read_wqe(k, b.dst + k * half, b.rk_b);
            t.s.post(w, &[sge(dst_a + k * MIB as u64, half as u32, lk_dst)]);
        }
        let c = run_slow_receiver(&mut t, 1, 2, "lossy READs");
        let got: Vec<_> = c.iter().map(|c| (c.status, c.wr_id)).collect();
        assert_eq!(
            got,
            [(abi::WC_SUCCESS, 0), (abi::WC_SUCCESS, 1)],
            "seed {seed}"
        );
        for k in 0..2usize {
            let at = dst_a + (k * MIB) as u64;
            let want = &b.data[k * MIB / 2..(k + 1) * MIB / 2];
            assert!(
                t.s.a.read(at, MIB / 2) == want,
                "seed {seed}: READ {k}'s bytes"
            );
        }
        // Every re-request lies inside one of the first requests' ranges.
        let seen = t.seen();
        let mut firsts = Vec::new();
        let mut resent = 0;
        for f in seen.iter().filter(|f| f.tx) {
            let Some((p, n)) = read_request(&f.frame, 256) else {
                continue;
            };
            use vrnic::transport::psn;
            match firsts
                .iter()
                .find(|&&(q, m): &&(u32, u32)| psn::diff(p, q) >= 0 && psn::diff(p, q) < m as i32)
            {
                None => firsts.push((p, n)),
                Some(&(q, m)) => {
                    resent += 1;
                    let end = psn::add(q, m);
                    assert_eq!(
                        psn::add(p, n),
                        end,
                        "seed {seed}: re-request {p}+{n} ends at {end}"
                    );
                }
            }
        }
        assert!(resent > 0, "seed {seed}: the loss made no re-request");
        eprintln!(
            "seed {seed}: {} requests, {resent} re-requests",
            firsts.len()
        );
    }
}

// ---------------------------------------------------------------------------
// The device's in-flight budget, shared by its QPs (issue 28: 64 QPs'
// windows together overflowed the queues in front of the receiver).

#[test]
fn many_qps_stay_inside_the_devices_in_flight_budget_and_all_complete() {
    use std::collections::HashMap;
    use vrnic::transport::psn;
    use vrnic::transport::requester::IN_FLIGHT_BUDGET_BYTES;
    // Path MTU 4096: 17 QPs x a 1 MiB WRITE (256 packets each); their
    // windows alone (17 x 128 packets, 8.5 MiB) would be far past the
    // budget.
    let o = opts(5, 1);
    let mut t = pair(o, 1, None);
    let mut pairs: Vec<_> = (0..16).map(|_| t.s.second_pair(o)).collect();
    let n = pairs.len() + 1;
    let src = t.s.a.alloc(n * MIB);
    let dst = t.s.b.alloc(n * MIB);
    let data = pattern(n * MIB, 9);
    t.s.a.fill(src, &data);
    let (lk_a, _) = t.s.a.reg_mr(t.s.pda, src, (n * MIB) as u64, ALL).unwrap();
    let (_, rk_b) = t.s.b.reg_mr(t.s.pdb, dst, (n * MIB) as u64, ALL).unwrap();
    t.s.post(write(0, dst, rk_b), &[sge(src, MIB as u32, lk_a)]);
    for (k, (qa, _)) in (1..).zip(pairs.iter_mut()) {
        let at = (k * MIB) as u64;
        let now = t.s.now;
        let w = write(k as u64, dst + at, rk_b);
        t.s.a
            .post_send(qa, w, &[sge(src + at, MIB as u32, lk_a)], now);
    }
    let c = run_slow_receiver(&mut t, 1, n, "17 WRITEs of 1 MiB");
    let mut ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..n as u64).collect::<Vec<_>>());
    assert!(c.iter().all(|c| c.status == abi::WC_SUCCESS), "{c:?}");
    assert!(t.s.b.read(dst, n * MIB) == data, "the WRITEs' bytes");
    // Per QP (by A's QPN): the newest PSN sent and the newest acknowledged.
    let mut b_to_a: HashMap<u32, u32> = pairs.iter().map(|(a, b)| (b.qpn, a.qpn)).collect();
    b_to_a.insert(t.s.qb.qpn, t.s.qa.qpn);
    let mut sent: HashMap<u32, u32> = HashMap::new();
    let mut acked: HashMap<u32, u32> = HashMap::new();
    let mut most = 0u64;
    for f in t.seen() {
        let p = roce(&f.frame);
        let (q, ps) = (p.hdr.bth.dest_qp, p.hdr.bth.psn);
        if f.tx {
            let qa = b_to_a[&q];
            sent.insert(qa, ps);
            acked.entry(qa).or_insert(START_ACKED);
            let in_flight: u64 = sent
                .iter()
                .map(|(qa, s)| psn::diff(*s, acked[qa]).max(0) as u64)
                .sum();
            most = most.max(in_flight * 4096);
        } else if let Some(AethKind::Ack { .. }) = p.hdr.aeth.map(|a| a.kind()) {
            acked.insert(q, ps);
        }
    }
    // Each QP may send one packet beyond the budget when it has none in
    // flight.
    let bound = IN_FLIGHT_BUDGET_BYTES + n as u64 * 4096;
    assert!(
        most <= bound,
        "{most} bytes in flight, budget {IN_FLIGHT_BUDGET_BYTES}"
    );
    assert!(
        most > IN_FLIGHT_BUDGET_BYTES / 2,
        "{most} bytes in flight: the budget was never used"
    );
    assert_eq!(t.s.a.dev.stats().retransmits, 0);
}
