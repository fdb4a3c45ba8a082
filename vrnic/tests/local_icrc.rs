//! Two engines of one process (a daemon's functions, through its embedded
//! switch) leave the ICRC out of the frames between them
//! (`LinkCaps::local_macs`, `wire::Icrc::Unneeded`), and RC works as on a
//! wire: SEND, WRITE and a READ whose stream holds the requests behind it
//! (held requests are processed later), and the frames between them
//! carry batches of packets (`batch::gso`), each packet handled on its own,
//! and runs of packets (`batch::Run`), each handled as its packets would be.

mod common;

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use common::*;
use vrnic::abi;
use vrnic::batch;
use vrnic::data::PeerMemory;
use vrnic::link::{Icrc, Link, LinkCaps, LocalMacs, LocalReach, MemLink, Rx};
use vrnic::wire::{self, WireError};

const ALL: u32 = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;

/// What the links of a pair saw.
#[derive(Default)]
struct Counts {
    /// RoCEv2 frames sent without an ICRC.
    bare: AtomicU64,
    /// Batches among them.
    batches: AtomicU64,
    /// Runs received, and the packets they stood for.
    runs: AtomicU64,
    run_packets: AtomicU64,
    /// Batches delivered a second time (`LocalLink::replay`).
    replayed: AtomicU64,
}

/// A [`MemLink`] that, like a port of the embedded switch, reaches
/// `peer` within the process: frames to it need no ICRC. Counts what it
/// carries ([`Counts`]).
struct LocalLink {
    inner: MemLink,
    peer: [u8; 6],
    counts: Arc<Counts>,
    /// Receive buffer: a batch is longer than a wire's frame.
    buf: Vec<u8>,
    /// With payloads by reference: the peer's memory, once it exists.
    peer_mem: Option<PeerSlot>,
    /// Delivers each batch this many times more (a duplicated frame).
    replay: u32,
    /// Changes each frame before it is delivered (a sender that breaks
    /// the rules).
    tamper: Option<fn(&mut Vec<u8>)>,
}

type PeerSlot = Arc<OnceLock<Arc<dyn PeerMemory>>>;

/// A peer that reads this device's memory, and whose memory this device
/// reads: packets between them may leave their payload in the sender's
/// memory (`LocalReach::by_reference`).
struct ByRef {
    peer: [u8; 6],
    mem: PeerSlot,
}

impl LocalReach for ByRef {
    fn contains(&self, mac: &[u8; 6]) -> bool {
        *mac == self.peer
    }
    fn by_reference(&self, mac: &[u8; 6]) -> bool {
        *mac == self.peer && self.mem.get().is_some()
    }
    fn memory_of(&self, mac: &[u8; 6]) -> Option<Arc<dyn PeerMemory>> {
        (*mac == self.peer)
            .then(|| self.mem.get().cloned())
            .flatten()
    }
}

impl Link for LocalLink {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if wire::parse_roce(frame).err() == Some(WireError::BadIcrc)
            && wire::parse_roce_with(frame, Icrc::Unneeded).is_ok()
        {
            self.counts.bare.fetch_add(1, Ordering::Relaxed);
            if batch::gso::is_batch(frame) {
                self.counts.batches.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.inner.send(frame)
    }

    /// A copy as the inner link's; handed over: each frame read into the
    /// link's own buffer, without its ICRC.
    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
        let deliver = match rx {
            Rx::Copy(buf) => return self.inner.recv(buf),
            Rx::Deliver(_, deliver) => deliver,
        };
        let Some(n) = self.inner.recv(&mut self.buf)? else {
            return Ok(None);
        };
        let mut tampered;
        let frame = match self.tamper {
            Some(f) => {
                tampered = self.buf[..n].to_vec();
                f(&mut tampered);
                &tampered[..]
            }
            None => &self.buf[..n],
        };
        let peer = self.peer_mem.as_ref().and_then(|m| m.get().cloned());
        if let (Ok(first), Some(mem)) = (wire::parse_roce_with(frame, Icrc::Unneeded), &peer) {
            for seg in batch::gso::rest(frame, &first.hdr, Some(mem.as_ref())) {
                if let Ok(batch::gso::Segment::Run(r)) = seg {
                    self.counts.runs.fetch_add(1, Ordering::Relaxed);
                    let n = u64::from(r.count);
                    self.counts.run_packets.fetch_add(n, Ordering::Relaxed);
                }
            }
        }
        deliver(frame, Icrc::Unneeded);
        if batch::gso::is_batch(frame) {
            for _ in 0..self.replay {
                self.counts.replayed.fetch_add(1, Ordering::Relaxed);
                deliver(frame, Icrc::Unneeded);
            }
        }
        Ok(Some(n))
    }

    fn caps(&self) -> LinkCaps {
        let peer = self.peer;
        let local = match &self.peer_mem {
            Some(mem) => LocalMacs::with(ByRef {
                peer,
                mem: mem.clone(),
            }),
            None => LocalMacs::new(move |m: &[u8; 6]| *m == peer),
        };
        LinkCaps {
            local_macs: Some(local),
            ..LinkCaps::default()
        }
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

#[test]
fn rc_between_engines_of_one_process_needs_no_icrc() {
    rc_between_engines(false);
}

/// The same, the payloads of SEND, WRITE and READ response packets left
/// in the sender's memory for the receiver to copy from there
/// (`vrnic::data`): the data arrives intact, also through the requests
/// held behind the READ.
#[test]
fn payloads_by_reference_arrive_intact() {
    rc_between_engines(true);
}

/// Two nodes of one process with path MTU 4096 (see [`LocalLink`]), each
/// reading the other's memory when `by_ref`; both links deliver each
/// batch `replay` times more.
fn local_pair(by_ref: bool, replay: u32, o: ConnOpts) -> (RcPair, Arc<Counts>) {
    local_pair_with(by_ref, replay, o, None)
}

/// [`local_pair`] whose link to A changes each frame with `tamper_a`.
fn local_pair_with(
    by_ref: bool,
    replay: u32,
    o: ConnOpts,
    tamper_a: Option<fn(&mut Vec<u8>)>,
) -> (RcPair, Arc<Counts>) {
    let (la, lb) = MemLink::pair();
    let (slot_a, slot_b): (PeerSlot, PeerSlot) = Default::default();
    let counts = Arc::new(Counts::default());
    let buf = vec![0; batch::gso::BATCH_MAX_BYTES];
    // Node::new gives node n the MAC 2:0:0:0:0:n.
    let la = LocalLink {
        inner: la,
        peer: [2, 0, 0, 0, 0, 2],
        counts: counts.clone(),
        buf: buf.clone(),
        peer_mem: by_ref.then(|| slot_b.clone()),
        replay,
        tamper: tamper_a,
    };
    let lb = LocalLink {
        inner: lb,
        peer: [2, 0, 0, 0, 0, 1],
        counts: counts.clone(),
        buf,
        peer_mem: by_ref.then(|| slot_a.clone()),
        replay,
        tamper: None,
    };
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), o, true);
    // Each side reads the other's memory (as the switch's ports do).
    let _ = slot_a.set(s.a.mem.clone());
    let _ = slot_b.set(s.b.mem.clone());
    let local = s.a.link.caps().local_macs;
    s.a.dev.set_local_macs(local);
    let local = s.b.link.caps().local_macs;
    s.b.dev.set_local_macs(local);
    (s, counts)
}

fn rc_between_engines(by_ref: bool) {
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    let (mut s, counts) = local_pair(by_ref, 0, o);

    // A READ of 100 packets from B, then a SEND and a WRITE right behind
    // it (in the RC window of 128 packets): B holds them while its READ
    // response stream runs (64 packets a turn).
    let len = 100 * 4096;
    let (rsrc, rdst) = (s.b.alloc(len), s.a.alloc(len));
    let rdata = pattern(len, 1);
    s.b.fill(rsrc, &rdata);
    let (_, rk_b) = s.b.reg_mr(s.pdb, rsrc, len as u64, ALL).unwrap();
    let (lk_a, _) = s.a.reg_mr(s.pda, rdst, len as u64, ALL).unwrap();
    let slen = 10_000;
    let (ssrc, sdst) = (s.a.alloc(slen), s.b.alloc(slen));
    let sdata = pattern(slen, 2);
    s.a.fill(ssrc, &sdata);
    let (lk_s, _) = s.a.reg_mr(s.pda, ssrc, slen as u64, ALL).unwrap();
    let (lk_d, rk_d) = s.b.reg_mr(s.pdb, sdst, slen as u64, ALL).unwrap();
    let wlen = 9000;
    let wdst = s.b.alloc(wlen);
    let (_, rk_w) = s.b.reg_mr(s.pdb, wdst, wlen as u64, ALL).unwrap();
    let _ = rk_d;
    let now = s.now;
    s.b.post_recv(&mut s.qb, 7, &[sge(sdst, slen as u32, lk_d)], now);
    let read = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_READ,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: rsrc,
        rkey: rk_b,
        ..Default::default()
    };
    s.post(read, &[sge(rdst, len as u32, lk_a)]);
    let send = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    s.post(send, &[sge(ssrc, slen as u32, lk_s)]);
    let write = abi::SendWqe {
        wr_id: 3,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: wdst,
        rkey: rk_w,
        ..Default::default()
    };
    s.post(write, &[sge(ssrc, wlen as u32, lk_s)]);

    for want in 1..=3u64 {
        let c = s.cqe(false, "A's completions");
        assert_eq!((c.wr_id, c.status), (want, abi::WC_SUCCESS), "{c:?}");
    }
    let c = s.cqe(true, "B's receive");
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (7, abi::WC_SUCCESS, slen as u32)
    );
    assert!(s.a.read(rdst, len) == rdata, "READ data differs");
    assert!(s.b.read(sdst, slen) == sdata, "SEND data differs");
    assert!(s.b.read(wdst, wlen) == sdata[..wlen], "WRITE data differs");
    // Again with no READ in the way: B executes the SEND and the WRITE as
    // they come (their payloads copied from A's memory by reference).
    let fresh = pattern(slen, 3);
    s.a.fill(ssrc, &fresh);
    let sdst2 = s.b.alloc(slen);
    let (lk_d2, _) = s.b.reg_mr(s.pdb, sdst2, slen as u64, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 8, &[sge(sdst2, slen as u32, lk_d2)], now);
    s.post(
        abi::SendWqe { wr_id: 4, ..send },
        &[sge(ssrc, slen as u32, lk_s)],
    );
    s.post(
        abi::SendWqe { wr_id: 5, ..write },
        &[sge(ssrc, wlen as u32, lk_s)],
    );
    for want in 4..=5u64 {
        let c = s.cqe(false, "A's completions");
        assert_eq!((c.wr_id, c.status), (want, abi::WC_SUCCESS), "{c:?}");
    }
    let c = s.cqe(true, "B's receive");
    assert_eq!((c.wr_id, c.status), (8, abi::WC_SUCCESS));
    assert!(s.b.read(sdst2, slen) == fresh, "second SEND data differs");
    assert!(
        s.b.read(wdst, wlen) == fresh[..wlen],
        "second WRITE data differs"
    );
    let (sa, sb) = (s.a.dev.stats(), s.b.dev.stats());
    assert_eq!((sa.icrc_errors, sb.icrc_errors), (0, 0));
    assert_eq!(
        sa.retransmits + sb.retransmits,
        0,
        "nothing lost or dropped"
    );
    // 100 READ responses, 3 SEND and 3 WRITE packets, the requests, ACKs.
    // Batched: fewer frames than packets.
    let (bare, batches) = (
        counts.bare.load(Ordering::Relaxed),
        counts.batches.load(Ordering::Relaxed),
    );
    assert!(
        bare >= 6 && batches >= 4,
        "{bare} frames without ICRC, {batches} batches"
    );
    assert_eq!(
        sb.tx_frames + sa.tx_frames,
        sa.rx_frames + sb.rx_frames,
        "every packet counted once each way"
    );
    assert!(
        sb.tx_frames >= 100,
        "B sent its 100 READ responses as packets"
    );
}

/// A signalled send WQE of `opcode`.
fn wqe(wr_id: u64, opcode: u8) -> abi::SendWqe {
    abi::SendWqe {
        wr_id,
        opcode,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    }
}

/// SEND, SEND with immediate and with invalidate, WRITE and WRITE with
/// immediate of many packets, and READ responses, between two functions
/// go as runs
/// (`batch::Run`: one entry per message, or per ACK interval of a long
/// one), and land as their packets would have: the bytes, the receive
/// completions with their lengths, immediate data, invalidated key and
/// solicited flag, one completion per WQE, the packets counted one by
/// one, nothing resent.
#[test]
fn whole_messages_go_as_runs_and_arrive_as_their_packets_would() {
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    let (mut s, counts) = local_pair(true, 0, o);
    let big = 256 * 1024;
    let src = s.a.alloc(big);
    let data = pattern(big, 9);
    s.a.fill(src, &data);
    let (lk, _) = s.a.reg_mr(s.pda, src, big as u64, ALL).unwrap();
    // B: where the WRITEs land, receive buffers, and an MR whose key a
    // SEND with invalidate names.
    let w1 = s.b.alloc(64 * 1024);
    let (_, rk1) = s.b.reg_mr(s.pdb, w1, 64 * 1024, ALL).unwrap();
    let w2 = s.b.alloc(big);
    let (_, rk2) = s.b.reg_mr(s.pdb, w2, big as u64, ALL).unwrap();
    let w3 = s.b.alloc(20_000);
    let (_, rk3) = s.b.reg_mr(s.pdb, w3, 20_000, ALL).unwrap();
    let victim = s.b.alloc(64);
    let (_, rk_victim) = s.b.reg_mr(s.pdb, victim, 64, ALL).unwrap();
    let rlen = 16 * 1024;
    let recv: Vec<u64> = (0..4).map(|_| s.b.alloc(rlen)).collect();
    let now = s.now;
    for (i, &r) in recv.iter().enumerate() {
        let (lkr, _) = s.b.reg_mr(s.pdb, r, rlen as u64, ALL).unwrap();
        s.b.post_recv(&mut s.qb, 10 + i as u64, &[sge(r, rlen as u32, lkr)], now);
    }
    // A WRITE of 16 packets, one of 64 (runs end at its ACK requests,
    // every 32 packets), a WRITE with immediate, SENDs of 4, 3 and 2
    // packets (one from two SGEs), with immediate (solicited) and with
    // invalidate.
    let at = |off: usize, len: usize| sge(src + off as u64, len as u32, lk);
    let write = |wr_id, remote_addr, rkey| abi::SendWqe {
        remote_addr,
        rkey,
        ..wqe(wr_id, abi::WR_RDMA_WRITE)
    };
    s.post(write(1, w1, rk1), &[at(0, 64 * 1024)]);
    s.post(write(2, w2, rk2), &[at(0, big)]);
    let imm = [1, 2, 3, 4];
    let wimm = abi::SendWqe {
        opcode: abi::WR_RDMA_WRITE_WITH_IMM,
        imm_data: imm,
        ..write(3, w3, rk3)
    };
    s.post(wimm, &[at(100, 20_000)]);
    let (l4, l5, l6) = (3 * 4096 + 1, 2 * 4096 + 3, 5000);
    s.post(wqe(4, abi::WR_SEND), &[at(1, 5000), at(9000, l4 - 5000)]);
    let simm = abi::SendWqe {
        imm_data: [9, 9, 9, 9],
        send_flags: abi::SEND_SIGNALED | abi::SEND_SOLICITED,
        ..wqe(5, abi::WR_SEND_WITH_IMM)
    };
    s.post(simm, &[at(7, l5)]);
    let sinv = abi::SendWqe {
        imm_data: rk_victim.to_be_bytes(),
        ..wqe(6, abi::WR_SEND_WITH_INV)
    };
    s.post(sinv, &[at(3, l6)]);

    for want in 1..=6u64 {
        let c = s.cqe(false, "A's completions");
        assert_eq!((c.wr_id, c.status), (want, abi::WC_SUCCESS), "{c:?}");
    }
    let want = [
        (
            10,
            abi::WC_OP_RECV_RDMA_WITH_IMM,
            20_000,
            abi::WC_WITH_IMM,
            imm,
        ),
        (11, abi::WC_OP_RECV, l4, 0, [0; 4]),
        (12, abi::WC_OP_RECV, l5, abi::WC_WITH_IMM, [9; 4]),
        (
            13,
            abi::WC_OP_RECV,
            l6,
            abi::WC_WITH_INV,
            rk_victim.to_be_bytes(),
        ),
    ];
    for (wr_id, opcode, len, flags, imm) in want {
        let c = s.cqe(true, "B's receive");
        assert_eq!(
            (
                c.wr_id,
                c.status,
                c.opcode,
                c.byte_len as usize,
                c.wc_flags,
                c.imm_data
            ),
            (wr_id, abi::WC_SUCCESS, opcode, len, flags, imm),
            "{c:?}"
        );
    }
    s.assert_quiet(50, "one completion per WQE");
    assert!(s.b.read(w1, 64 * 1024) == data[..64 * 1024], "WRITE 1");
    assert!(s.b.read(w2, big) == data, "WRITE 2");
    assert!(
        s.b.read(w3, 20_000) == data[100..20_100],
        "WRITE with immediate"
    );
    let mut sent4 = data[1..5001].to_vec();
    sent4.extend_from_slice(&data[9000..9000 + l4 - 5000]);
    assert!(s.b.read(recv[1], l4) == sent4, "SEND from two SGEs");
    assert!(
        s.b.read(recv[2], l5) == data[7..7 + l5],
        "SEND with immediate"
    );
    assert!(
        s.b.read(recv[3], l6) == data[3..3 + l6],
        "SEND with invalidate"
    );

    let (runs, in_runs) = (
        counts.runs.load(Ordering::Relaxed),
        counts.run_packets.load(Ordering::Relaxed),
    );
    let packets = 16 + 64 + 5 + 4 + 3 + 2;
    assert!(
        runs >= 6 && in_runs >= 60,
        "{runs} runs of {in_runs} packets in all"
    );
    let (sa, sb) = (s.a.dev.stats(), s.b.dev.stats());
    assert_eq!(
        sa.retransmits + sa.naks_received + sb.duplicates + sb.rx_dropped,
        0
    );
    assert!(sa.tx_frames >= packets, "{} packets sent", sa.tx_frames);
    assert_eq!(
        sa.tx_frames, sb.rx_frames,
        "A's packets, counted one by one"
    );
    assert_eq!(sb.tx_frames, sa.rx_frames, "B's ACKs");
    assert_eq!(sa.tx_bytes, sb.rx_bytes);

    // READs: their responses come back as runs too, and land whole.
    let runs_before = counts.runs.load(Ordering::Relaxed);
    let back = s.a.alloc(big);
    let (lk_back, _) = s.a.reg_mr(s.pda, back, big as u64, ALL).unwrap();
    for (wr_id, len) in [(20, big), (21, 3 * 4096 + 5)] {
        let read = abi::SendWqe {
            remote_addr: w2,
            rkey: rk2,
            ..wqe(wr_id, abi::WR_RDMA_READ)
        };
        s.post(read, &[sge(back, len as u32, lk_back)]);
        let c = s.cqe(false, "a READ");
        assert_eq!(
            (c.wr_id, c.status, c.byte_len as usize),
            (wr_id, abi::WC_SUCCESS, len)
        );
        assert!(s.a.read(back, len) == data[..len], "READ of {len} bytes");
    }
    let read_runs = counts.runs.load(Ordering::Relaxed) - runs_before;
    assert!(read_runs >= 3, "{read_runs} runs of READ responses");
    let (sa, sb) = (s.a.dev.stats(), s.b.dev.stats());
    assert_eq!(
        (sa.retransmits, sa.duplicates, sb.duplicates, sb.tx_frames),
        (0, 0, 0, sa.rx_frames),
        "each response sent once, and landed"
    );

    // The SEND with invalidate took the victim's key away.
    s.post(write(7, victim, rk_victim), &[at(0, 64)]);
    let c = s.cqe(false, "WRITE to an invalidated key");
    assert_eq!((c.wr_id, c.status), (7, abi::WC_REM_ACCESS_ERR), "{c:?}");
}

/// A WRITE between two functions whose target MR is invalidated (a SEND
/// with invalidate on another QP) or deregistered after its FIRST packet:
/// the run of its packets that follows is refused as its packets would be
/// (remote access error, B's QP to ERR), not written whole through the
/// key the FIRST packet checked, as it was after an invalidation (issue
/// 27, finding A; the dereg case already held).
#[test]
fn a_run_of_a_write_whose_mr_went_away_does_not_land() {
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    for how in [MrLoss::SendWithInvalidate, MrLoss::Dereg] {
        let (mut s, _) = local_pair(true, 0, o);
        let r = write_across_mr_loss(&mut s, o, 4096, 96, how);
        assert!(r.runs_after >= 1, "{how:?}: runs behind the FIRST packet");
    }
}

/// A's buffer of `len` patterned bytes, its data and its lkey.
fn source(s: &mut RcPair, len: usize, seed: u8) -> (u64, Vec<u8>, u32) {
    let src = s.a.alloc(len);
    let data = pattern(len, seed);
    s.a.fill(src, &data);
    let (lk, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
    (src, data, lk)
}

/// Posts a receive of `len` bytes on B; its address.
fn post_recv(s: &mut RcPair, wr_id: u64, len: usize) -> u64 {
    let dst = s.b.alloc(len);
    let (lk, _) = s.b.reg_mr(s.pdb, dst, len as u64, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, wr_id, &[sge(dst, len as u32, lk)], now);
    dst
}

/// Pumps both nodes (1 ms steps when idle) until `done`, at most 20,000
/// rounds.
fn pump_until(s: &mut RcPair, what: &str, done: impl Fn(&RcPair) -> bool) {
    for _ in 0..20_000 {
        if done(s) {
            return;
        }
        if s.a.pump(s.now) + s.b.pump(s.now) == 0 {
            s.now += 1_000_000;
        }
    }
    panic!("{what}: not within 20,000 rounds");
}

/// A run the receiver cannot take whole is handled as its packets: a SEND
/// and a WRITE with immediate that find no receive WQE are answered with
/// RNR NAKs and land once one is posted; a batch delivered twice has its
/// runs' packets answered as duplicates, executed once, and its READ
/// responses' copies ignored.
#[test]
fn runs_that_cannot_be_taken_whole_are_handled_as_their_packets() {
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    let (mut s, counts) = local_pair(true, 0, o);
    let (src, data, lk) = source(&mut s, 64 * 1024, 4);
    // A one-packet SEND opens the batch, so the next message goes whole
    // as a run: a SEND of 3 packets with no receive WQE for it.
    let r0 = post_recv(&mut s, 20, 64);
    s.post(wqe(1, abi::WR_SEND), &[sge(src, 8, lk)]);
    let len = 2 * 4096 + 77;
    s.post(wqe(2, abi::WR_SEND), &[sge(src + 8, len as u32, lk)]);
    let c = s.cqe(false, "the short SEND");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_SUCCESS));
    pump_until(&mut s, "an RNR NAK", |s| s.b.dev.stats().rnr_naks_sent > 0);
    assert!(counts.runs.load(Ordering::Relaxed) >= 1, "it came as a run");
    let r1 = post_recv(&mut s, 21, len);
    let c = s.cqe(false, "the SEND after RNR");
    assert_eq!((c.wr_id, c.status), (2, abi::WC_SUCCESS), "{c:?}");
    for (wr_id, n) in [(20, 8), (21, len)] {
        let c = s.cqe(true, "B's receives");
        assert_eq!(
            (c.wr_id, c.status, c.byte_len as usize),
            (wr_id, abi::WC_SUCCESS, n)
        );
    }
    assert!(s.b.read(r0, 8) == data[..8]);
    assert!(s.b.read(r1, len) == data[8..8 + len], "SEND after RNR");

    // The same for a WRITE with immediate: its bytes land, its receive
    // WQE is awaited.
    let dst = s.b.alloc(len);
    let (_, rk) = s.b.reg_mr(s.pdb, dst, len as u64, ALL).unwrap();
    let r2 = post_recv(&mut s, 22, 64);
    s.post(wqe(3, abi::WR_SEND), &[sge(src, 8, lk)]);
    let w = abi::SendWqe {
        remote_addr: dst,
        rkey: rk,
        imm_data: [5, 6, 7, 8],
        ..wqe(4, abi::WR_RDMA_WRITE_WITH_IMM)
    };
    s.post(w, &[sge(src + 100, len as u32, lk)]);
    let c = s.cqe(false, "the short SEND");
    assert_eq!((c.wr_id, c.status), (3, abi::WC_SUCCESS));
    let rnr = s.b.dev.stats().rnr_naks_sent;
    pump_until(&mut s, "a second RNR NAK", |s| {
        s.b.dev.stats().rnr_naks_sent > rnr
    });
    post_recv(&mut s, 23, 64);
    let c = s.cqe(false, "the WRITE with immediate after RNR");
    assert_eq!((c.wr_id, c.status), (4, abi::WC_SUCCESS), "{c:?}");
    let c = s.cqe(true, "B's receive");
    assert_eq!((c.wr_id, c.status), (22, abi::WC_SUCCESS));
    let c = s.cqe(true, "B's receive");
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len as usize, c.imm_data),
        (
            23,
            abi::WC_SUCCESS,
            abi::WC_OP_RECV_RDMA_WITH_IMM,
            len,
            [5, 6, 7, 8]
        )
    );
    assert!(s.b.read(r2, 8) == data[..8]);
    assert!(
        s.b.read(dst, len) == data[100..100 + len],
        "WRITE after RNR"
    );
    s.assert_quiet(50, "nothing more");

    // Every batch delivered twice.
    let (mut s, counts) = local_pair(true, 1, o);
    let (src, data, lk) = source(&mut s, 64 * 1024, 5);
    let dst = s.b.alloc(64 * 1024);
    let (_, rk) = s.b.reg_mr(s.pdb, dst, 64 * 1024, ALL).unwrap();
    let r = post_recv(&mut s, 30, 64 * 1024);
    s.post(wqe(1, abi::WR_SEND), &[sge(src, 64 * 1024, lk)]);
    let w = abi::SendWqe {
        remote_addr: dst,
        rkey: rk,
        ..wqe(2, abi::WR_RDMA_WRITE)
    };
    s.post(w, &[sge(src, 64 * 1024, lk)]);
    for want in 1..=2 {
        let c = s.cqe(false, "A's completions");
        assert_eq!((c.wr_id, c.status), (want, abi::WC_SUCCESS), "{c:?}");
    }
    let c = s.cqe(true, "B's receive");
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (30, abi::WC_SUCCESS, 64 * 1024)
    );
    s.assert_quiet(50, "each message executed once");
    assert!(s.b.read(r, 64 * 1024) == data && s.b.read(dst, 64 * 1024) == data);
    // The expected PSN moved by the packets executed, not by their
    // copies: the next WRITE lands.
    let dst2 = s.b.alloc(64 * 1024);
    let (_, rk2) = s.b.reg_mr(s.pdb, dst2, 64 * 1024, ALL).unwrap();
    let w = abi::SendWqe {
        remote_addr: dst2,
        rkey: rk2,
        ..wqe(3, abi::WR_RDMA_WRITE)
    };
    s.post(w, &[sge(src + 4, 60 * 1024, lk)]);
    let c = s.cqe(false, "the WRITE after");
    assert_eq!((c.wr_id, c.status), (3, abi::WC_SUCCESS), "{c:?}");
    assert!(
        s.b.read(dst2, 60 * 1024) == data[4..4 + 60 * 1024],
        "the WRITE after"
    );
    let (runs, replayed) = (
        counts.runs.load(Ordering::Relaxed),
        counts.replayed.load(Ordering::Relaxed),
    );
    assert!(
        runs >= 2 && replayed >= 1,
        "{runs} runs, {replayed} batches replayed"
    );
    let dups = s.b.dev.stats().duplicates;
    assert!(
        dups >= 15,
        "the replayed runs' packets are duplicates: {dups}"
    );
    // A READ whose responses come twice lands once.
    let back = s.a.alloc(64 * 1024);
    let (lk_back, _) = s.a.reg_mr(s.pda, back, 64 * 1024, ALL).unwrap();
    let read = abi::SendWqe {
        remote_addr: dst,
        rkey: rk,
        ..wqe(4, abi::WR_RDMA_READ)
    };
    let replayed = counts.replayed.load(Ordering::Relaxed);
    s.post(read, &[sge(back, 64 * 1024, lk_back)]);
    let c = s.cqe(false, "the READ");
    assert_eq!((c.wr_id, c.status), (4, abi::WC_SUCCESS), "{c:?}");
    s.assert_quiet(50, "one completion");
    assert!(s.a.read(back, 64 * 1024) == data, "READ data");
    assert!(
        counts.replayed.load(Ordering::Relaxed) > replayed,
        "the responses came twice"
    );
}

/// UC between two functions: SENDs and WRITEs of many packets go as runs
/// too and land whole, each completing on the sender once sent; a SEND
/// that finds no receive WQE is dropped (counted as its packets) and the
/// next message lands.
#[test]
fn uc_messages_go_as_runs_too() {
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    let (mut s, counts) = local_pair(true, 0, o);
    let spec = QpSpec::typed(abi::QPT_UC, 0);
    let mut ua = s.a.create_qp_with(s.pda, &s.ca, spec);
    let mut ub = s.b.create_qp_with(s.pdb, &s.cb, spec);
    let (ipa, ipb) = (s.a.ip, s.b.ip);
    s.a.connect_uc(&ua, ipb, ub.qpn, 5);
    s.b.connect_uc(&ub, ipa, ua.qpn, 5);
    let big = 256 * 1024;
    let (src, data, lk) = source(&mut s, big, 6);
    let dst = s.b.alloc(big);
    let (_, rk) = s.b.reg_mr(s.pdb, dst, big as u64, ALL).unwrap();
    let r = s.b.alloc(16 * 1024);
    let (lkr, _) = s.b.reg_mr(s.pdb, r, 16 * 1024, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut ub, 40, &[sge(r, 16 * 1024, lkr)], now);
    let send_len = 3 * 4096 + 9;
    let post = |s: &mut RcPair, ua: &mut Qp, w: abi::SendWqe, sg: abi::Sge| {
        let now = s.now;
        s.a.post_send(ua, w, &[sg], now);
    };
    // A WRITE of 64 packets (its first opens the batch, the rest go as
    // two runs, cut at 32 packets) and a SEND of 4 behind it (one run).
    let w = abi::SendWqe {
        remote_addr: dst,
        rkey: rk,
        ..wqe(1, abi::WR_RDMA_WRITE)
    };
    post(&mut s, &mut ua, w, sge(src, big as u32, lk));
    post(
        &mut s,
        &mut ua,
        wqe(2, abi::WR_SEND),
        sge(src + 5, send_len as u32, lk),
    );
    for want in 1..=2 {
        let c = s.cqe(false, "A's UC completions");
        assert_eq!(
            (c.wr_id, c.status, c.qp_num),
            (want, abi::WC_SUCCESS, ua.qpn),
            "{c:?}"
        );
    }
    let c = s.cqe(true, "B's UC receive");
    assert_eq!(
        (c.wr_id, c.status, c.byte_len as usize, c.qp_num),
        (40, abi::WC_SUCCESS, send_len, ub.qpn)
    );
    assert!(s.b.read(dst, big) == data, "UC WRITE");
    assert!(s.b.read(r, send_len) == data[5..5 + send_len], "UC SEND");
    assert!(counts.runs.load(Ordering::Relaxed) >= 3, "UC runs");
    // No receive WQE: a WRITE opens the batch, the SEND behind it goes
    // as a run and is dropped whole; the next SEND lands.
    let dropped = s.b.dev.stats().rx_dropped;
    let w = abi::SendWqe {
        remote_addr: dst,
        rkey: rk,
        ..wqe(3, abi::WR_RDMA_WRITE)
    };
    post(&mut s, &mut ua, w, sge(src, 100, lk));
    post(
        &mut s,
        &mut ua,
        wqe(4, abi::WR_SEND),
        sge(src, send_len as u32, lk),
    );
    for want in 3..=4 {
        let c = s.cqe(false, "A's UC completions");
        assert_eq!((c.wr_id, c.status), (want, abi::WC_SUCCESS), "{c:?}");
    }
    s.assert_quiet(20, "the SEND without a receive WQE");
    assert_eq!(s.b.dev.stats().rx_dropped - dropped, 4, "its 4 packets");
    let now = s.now;
    s.b.post_recv(&mut ub, 41, &[sge(r, 16 * 1024, lkr)], now);
    post(
        &mut s,
        &mut ua,
        wqe(5, abi::WR_SEND),
        sge(src + 9, send_len as u32, lk),
    );
    let c = s.cqe(false, "A's UC completion");
    assert_eq!((c.wr_id, c.status), (5, abi::WC_SUCCESS));
    let c = s.cqe(true, "B's UC receive");
    assert_eq!(
        (c.wr_id, c.status, c.byte_len as usize),
        (41, abi::WC_SUCCESS, send_len)
    );
    assert!(
        s.b.read(r, send_len) == data[9..9 + send_len],
        "the SEND after"
    );
}

/// Makes every run of READ responses in the batch `frame` that ends with
/// the READ's LAST end with a MIDDLE instead (its AETH taken out, the
/// entry's length mended): a run that is well formed but does not end
/// the READ as its packets must.
fn end_read_runs_in_a_middle(frame: &mut Vec<u8>) {
    let Ok(first) = wire::parse_roce_with(frame, Icrc::Unneeded) else {
        return;
    };
    if !batch::gso::is_batch(frame) {
        return;
    }
    let mut off = first.hdr.frame_len(first.payload.len());
    while off + 2 <= frame.len() {
        let len = u16::from_be_bytes([frame[off], frame[off + 1]]);
        let mut seg = usize::from(len & if len & 0x8000 != 0 { 0x3fff } else { 0x7fff });
        if len & 0xc000 == 0xc000 {
            // Count and stride, then the first packet's headers.
            let first_op = wire::Opcode::from_u8(frame[off + 6]);
            let at = off + 6 + first_op.map_or(0, |o| o.header_len());
            if first_op.is_some_and(|o| o.is_read_response())
                && frame[at] == wire::Opcode::RcReadResponseLast as u8
            {
                frame[at] = wire::Opcode::RcReadResponseMiddle as u8;
                frame.drain(at + 12..at + 16);
                seg -= 4;
                frame[off..off + 2].copy_from_slice(&(seg as u16 | 0xc000).to_be_bytes());
            }
        }
        off += 2 + seg;
    }
}

/// A run of READ responses whose last packet is a MIDDLE where the READ
/// ends is not taken whole: its packets fail the READ with
/// `WC_BAD_RESP_ERR`, as they would have one by one (rxe's `do_read`
/// checks), and the run's bytes do not complete it.
#[test]
fn a_run_that_does_not_end_a_read_properly_fails_it_as_its_packets_would() {
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    let (mut s, counts) = local_pair_with(true, 0, o, Some(end_read_runs_in_a_middle));
    let len = 3 * 4096 + 5;
    let src = s.b.alloc(len);
    s.b.fill(src, &pattern(len, 7));
    let (_, rk) = s.b.reg_mr(s.pdb, src, len as u64, ALL).unwrap();
    let dst = s.a.alloc(len);
    let (lk, _) = s.a.reg_mr(s.pda, dst, len as u64, ALL).unwrap();
    let read = abi::SendWqe {
        remote_addr: src,
        rkey: rk,
        ..wqe(1, abi::WR_RDMA_READ)
    };
    s.post(read, &[sge(dst, len as u32, lk)]);
    let c = s.cqe(false, "the READ");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_BAD_RESP_ERR), "{c:?}");
    assert!(
        counts.runs.load(Ordering::Relaxed) >= 1,
        "its responses came as a run"
    );
}
