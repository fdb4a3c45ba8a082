//! Hostile input on stable Rust, through the same harness as the cargo-fuzz
//! targets in `fuzz/` (`vrnic::fuzzing`, feature `fuzzing`): a device with
//! RC, UC and UD QPs, an SRQ and MRs ([`Target`]) first runs a real
//! exchange with a peer engine (SEND, WRITE, WRITE with immediate, READ,
//! both atomics on RC, SEND and WRITE on UC, SEND on UD, and RC requests of
//! its own answered by the peer); then it receives thousands of seeded
//! mutations of the peer's frames — bit flips, truncations, splices of two
//! frames, header-field changes — about half of them with the IPv4
//! checksum and ICRC made right again so that they reach the transport.
//! Passing means: no panic, a bounded output per input (checked by the
//! harness), the mutations reached the transport (NAKs, duplicates,
//! fatal errors were seen), and the device still works afterwards.
//!
//! `VRNIC_FUZZ_CORPUS=DIR` also writes the exchange's frames as seed inputs
//! for the cargo-fuzz targets (`DIR/receive_frame`, `DIR/parse_frame`).

mod common;

use common::*;
use vrnic::abi::{self, Pod};
use vrnic::batch;
use vrnic::fuzzing::{self, qp, Peer, Target};
use vrnic::wire::{self, Frame, Opcode, RoceHeaders};

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;

/// Mutated frames fed per seed.
const MUTATIONS: u64 = 20_000;

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A QP of the peer of type `qp_type` (no SRQ).
fn typed_qp(a: &mut Node, pd: u32, cq: &Cq, qp_type: u32) -> Qp {
    a.create_qp_with(pd, cq, QpSpec::typed(qp_type, 0))
}

/// Brings a UC or UD QP of the peer to RTS.
fn bring_up(a: &mut Node, q: &Qp, qp_type: u32, dest_qpn: u32, psn: u32, rq_psn: u32) {
    let base = abi::QpAttr {
        qpn: q.qpn,
        ..Default::default()
    };
    let ud = qp_type == abi::QPT_UD;
    let steps = [
        abi::QpAttr {
            attr_mask: abi::QP_ATTR_STATE
                | abi::QP_ATTR_PKEY_INDEX
                | abi::QP_ATTR_PORT
                | if ud {
                    abi::QP_ATTR_QKEY
                } else {
                    abi::QP_ATTR_ACCESS_FLAGS
                },
            qp_state: abi::QPS_INIT,
            port_num: 1,
            qkey: fuzzing::QKEY,
            qp_access_flags: ALL,
            ..base
        },
        if ud {
            abi::QpAttr {
                attr_mask: abi::QP_ATTR_STATE,
                qp_state: abi::QPS_RTR,
                ..base
            }
        } else {
            abi::QpAttr {
                attr_mask: abi::QP_ATTR_STATE
                    | abi::QP_ATTR_AV
                    | abi::QP_ATTR_PATH_MTU
                    | abi::QP_ATTR_DEST_QPN
                    | abi::QP_ATTR_RQ_PSN,
                qp_state: abi::QPS_RTR,
                path_mtu: 3,
                dest_qp_num: dest_qpn,
                rq_psn,
                dgid: fuzzing::IP.to_ipv6_mapped().octets(),
                sgid_index: 1,
                is_global: 1,
                ..base
            }
        },
        abi::QpAttr {
            attr_mask: abi::QP_ATTR_STATE | abi::QP_ATTR_SQ_PSN,
            qp_state: abi::QPS_RTS,
            sq_psn: psn,
            ..base
        },
    ];
    for s in steps {
        a.cmd(abi::CMD_MODIFY_QP, &s).unwrap();
    }
}

/// Runs a real exchange between a peer engine (A, 10.0.0.1) and a fresh
/// [`Target`]; returns the target and every RoCE frame A sent it.
fn exchange() -> (Target, Vec<Vec<u8>>) {
    let (la, _lb) = QueueLink::pair();
    let mut a = Node::new(1, Box::new(la), 1500);
    assert_eq!(a.ip, fuzzing::PEER_IP, "A is the harness's peer");
    let pd = a.alloc_pd();
    let mut cq = a.create_cq(256);
    let mut rc = a.create_qp(pd, &cq, 64, 4);
    let mut uc = typed_qp(&mut a, pd, &cq, abi::QPT_UC);
    let mut ud = typed_qp(&mut a, pd, &cq, abi::QPT_UD);
    // The harness's default peer is this one, so the frames recorded here
    // are in-sequence inputs for `fuzzing::fuzz_receive` (seed corpus).
    let peer = Peer::default();
    assert_eq!((rc.qpn, uc.qpn), (peer.rc_qpn, peer.uc_qpn));
    let mut t = Target::new(peer);
    let tq = t.qpns();
    a.connect(&rc, fuzzing::IP, tq[qp::RC], 3, peer.psn, peer.my_psn, 7, 7);
    bring_up(&mut a, &uc, abi::QPT_UC, tq[qp::UC], peer.psn, peer.my_psn);
    bring_up(&mut a, &ud, abi::QPT_UD, 0, 0x42, 0);
    let buf = a.alloc(1 << 20);
    let (lk, rk) = a.reg_mr(pd, buf, 1 << 20, ALL).unwrap();
    for i in 0..8 {
        let sge = abi::Sge {
            addr: buf + 0x80000 + i * 8192,
            length: 8192,
            lkey: lk,
        };
        a.post_recv(&mut rc, 100 + i, &[sge], 0);
    }
    // The target's own requests into A's memory.
    t.post_sample_requests(buf + 0x40000, rk);
    let remote = t.mr_base[0] + (1 << 19);
    let (rkey, ro_rkey) = (t.rkey, t.ro_rkey);
    let ops = [
        (abi::WR_SEND, 3000u32, remote, rkey),
        (abi::WR_RDMA_WRITE, 5000, remote, rkey),
        (abi::WR_RDMA_WRITE_WITH_IMM, 100, remote + 8192, rkey),
        (abi::WR_RDMA_READ, 2500, remote, rkey),
        (abi::WR_RDMA_READ, 1500, t.mr_base[1], ro_rkey),
        (abi::WR_ATOMIC_FETCH_AND_ADD, 8, remote + 16384, rkey),
        (abi::WR_ATOMIC_CMP_AND_SWP, 8, remote + 16384, rkey),
        (abi::WR_SEND_WITH_IMM, 0, 0, 0),
    ];
    for (i, (opcode, len, remote_addr, rkey)) in ops.into_iter().enumerate() {
        let w = abi::SendWqe {
            wr_id: i as u64,
            opcode,
            send_flags: abi::SEND_SIGNALED,
            remote_addr,
            rkey,
            compare_add: 1,
            swap: 7,
            imm_data: [1, 2, 3, 4],
            ..Default::default()
        };
        let sge = abi::Sge {
            addr: buf + i as u64 * 8192,
            length: len,
            lkey: lk,
        };
        a.post_send(&mut rc, w, &[sge], 0);
    }
    for (i, (opcode, len)) in [
        (abi::WR_SEND, 2000u32),
        (abi::WR_RDMA_WRITE, 1500),
        (abi::WR_RDMA_WRITE_WITH_IMM, 10),
    ]
    .into_iter()
    .enumerate()
    {
        let w = abi::SendWqe {
            wr_id: 20 + i as u64,
            opcode,
            remote_addr: remote + 32768,
            rkey,
            ..Default::default()
        };
        let sge = abi::Sge {
            addr: buf,
            length: len,
            lkey: lk,
        };
        a.post_send(&mut uc, w, &[sge], 0);
    }
    let ah = Node::handle_of(
        a.cmd(
            abi::CMD_CREATE_AH,
            &abi::CreateAh {
                pdn: pd,
                dgid: fuzzing::IP.to_ipv6_mapped().octets(),
                sgid_index: 1,
                port_num: 1,
                is_global: 1,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    for (i, dest) in [tq[qp::UD], tq[qp::UD_SRQ]].into_iter().enumerate() {
        let w = abi::SendWqe {
            wr_id: 30 + i as u64,
            opcode: abi::WR_SEND,
            remote_qpn: dest,
            remote_qkey: fuzzing::QKEY,
            ah,
            ..Default::default()
        };
        let sge = abi::Sge {
            addr: buf,
            length: 500,
            lkey: lk,
        };
        a.post_send(&mut ud, w, &[sge], 0);
    }
    // Shuttle frames by hand, recording what A sends.
    t.keep_tx = true;
    let mut frames = Vec::new();
    for round in 0..400u64 {
        let now = 1_000_000_000 + round * 2_000_000;
        t.now = now;
        a.dev.poll(&a.mem, now);
        t.advance(0);
        let mut moved = false;
        while let Some(f) = a.dev.pop_tx() {
            t.receive(&f);
            if matches!(wire::parse_frame(&f), Ok(Frame::Roce(_))) {
                frames.push(f);
            }
            moved = true;
        }
        for f in std::mem::take(&mut t.tx) {
            a.dev.receive(&a.mem, &f, now);
            moved = true;
        }
        if !moved && round > 10 {
            break;
        }
    }
    t.keep_tx = false;
    let mut got = Vec::new();
    while let Some(c) = a.poll_cq(&mut cq) {
        got.push((c.wr_id, c.status));
    }
    got.sort_unstable();
    let mut want: Vec<(u64, u8)> = (0..ops.len() as u64)
        .chain(20..23)
        .chain(30..32)
        .chain(100..102)
        .map(|w| (w, abi::WC_SUCCESS))
        .collect();
    want.sort_unstable();
    assert_eq!(got, want, "the seed exchange completed on the peer");
    // The target's five requests and its seven receives (RC SEND, WRITE
    // with immediate, SEND with immediate; UC SEND, WRITE with immediate;
    // two UD SENDs) completed too.
    assert_eq!(t.cqes, 5 + 7, "target completions");
    (t, frames)
}

/// Field-level mutation of a parsed frame (re-emitted with a valid ICRC).
fn mutate_headers(rng: &mut Rng, hdr: &mut RoceHeaders, payload: &mut Vec<u8>, qpns: &[u32]) {
    match rng.below(12) {
        0 => hdr.bth.psn = rng.next() as u32 & 0xff_ffff,
        1 => hdr.bth.psn = hdr.bth.psn.wrapping_add(rng.below(5) as u32) & 0xff_ffff,
        2 => hdr.bth.dest_qp = qpns[rng.below(qpns.len() as u64) as usize],
        3 => {
            if let Some(r) = hdr.reth.as_mut() {
                match rng.below(3) {
                    0 => r.va = rng.next(),
                    1 => r.dma_len = rng.next() as u32,
                    _ => r.rkey = rng.next() as u32,
                }
            }
        }
        4 => payload.truncate(rng.below(payload.len() as u64 + 1) as usize),
        5 => payload.extend((0..rng.below(5000)).map(|_| rng.next() as u8)),
        6 => {
            if let Some(a) = hdr.aeth.as_mut() {
                a.syndrome = rng.next() as u8;
                a.msn = rng.next() as u32 & 0xff_ffff;
            }
        }
        7 => {
            if let Some(a) = hdr.atomic_eth.as_mut() {
                a.va = rng.next();
                a.rkey = rng.next() as u32;
            }
        }
        8 => hdr.bth.ack_req = !hdr.bth.ack_req,
        9 => {
            if let Some(d) = hdr.deth.as_mut() {
                d.qkey = rng.next() as u32;
                d.src_qp = rng.next() as u32 & 0xff_ffff;
            }
        }
        _ => {
            // Another opcode of the table: its extension headers may now be
            // missing or extra, so the parser sees a malformed or different
            // packet.
            let all: Vec<Opcode> = (0..=255u8).filter_map(Opcode::from_u8).collect();
            hdr.bth.opcode = all[rng.below(all.len() as u64) as usize];
        }
    }
}

/// The target's RC responder's expected PSN after the exchange: one past
/// the last request PSN the peer sent on RC.
fn rc_epsn(frames: &[Vec<u8>], rc_qpn: u32) -> u32 {
    let mut epsn = Peer::default().psn;
    for f in frames {
        if let Ok(Frame::Roce(p)) = wire::parse_frame(f) {
            let b = p.hdr.bth;
            if b.dest_qp == rc_qpn && b.opcode.is_request() {
                let n = match (b.opcode, p.hdr.reth) {
                    (Opcode::RcReadRequest, Some(r)) => r.dma_len.div_ceil(1024).max(1),
                    _ => 1,
                };
                let end = vrnic::transport::psn::add(b.psn, n);
                if vrnic::transport::psn::diff(end, epsn) > 0 {
                    epsn = end;
                }
            }
        }
    }
    epsn
}

fn storm(seed: u64) {
    let (mut t, frames) = exchange();
    assert!(frames.len() >= 20, "{} frames", frames.len());
    let qpns = t.qpns();
    let mut rng = Rng(seed);
    let mut epsn = rc_epsn(&frames, qpns[qp::RC]);
    let mut revived = 0;
    let mut sent = 0usize;
    for i in 0..MUTATIONS {
        // A fatal error moves a QP to ERR (as it must): bring it back so
        // later inputs reach live QPs again.
        if i % 16 == 0 {
            revived += t.revive(epsn);
        }
        if i % 128 == 0 {
            // Requests of the target's own in flight, so that mutated ACKs,
            // NAKs and READ/atomic responses reach a busy completer (after
            // a revive its PSNs restart where the exchange's did).
            t.post_sample_requests(0x10_0000, 0x1234);
        }
        if i % 64 == 63 {
            // Let timers run: retransmissions of the target's own requests,
            // RNR back-offs.
            sent += t.advance(rng.below(200_000_000));
        }
        let base = &frames[rng.below(frames.len() as u64) as usize];
        let mut f = base.clone();
        let fix = rng.below(2) == 0;
        match i % 8 {
            0 | 1 => {
                for _ in 0..=rng.below(4) {
                    let at = rng.below(f.len() as u64) as usize;
                    f[at] ^= 1 << rng.below(8);
                }
            }
            2 => f.truncate(rng.below(f.len() as u64 + 1) as usize),
            3 => {
                // Splice: the head of one frame and the tail of another.
                let other = &frames[rng.below(frames.len() as u64) as usize];
                let cut = rng.below(f.len() as u64 + 1) as usize;
                let from = rng.below(other.len() as u64 + 1) as usize;
                f.truncate(cut);
                f.extend_from_slice(&other[from..]);
            }
            _ => {
                let Ok(Frame::Roce(p)) = wire::parse_frame(base) else {
                    unreachable!("only RoCE frames were recorded")
                };
                let mut hdr = p.hdr.clone();
                let mut payload = p.payload.to_vec();
                for _ in 0..=rng.below(3) {
                    mutate_headers(&mut rng, &mut hdr, &mut payload, &qpns);
                }
                let in_sequence =
                    i % 8 == 7 && hdr.bth.dest_qp == qpns[qp::RC] && hdr.bth.opcode.is_request();
                if in_sequence {
                    // At the expected PSN, so the responder executes it.
                    hdr.bth.psn = epsn;
                }
                f.clear();
                wire::emit_frame(&hdr, &payload, &mut f);
                if in_sequence {
                    let before = t.dev.stats().clone();
                    sent += t.receive(&f);
                    let after = t.dev.stats();
                    // Executed (not a duplicate, gap or drop): moved on.
                    if after.duplicates == before.duplicates
                        && after.nak_psn_seq_sent == before.nak_psn_seq_sent
                        && after.rx_dropped == before.rx_dropped
                        && after.icrc_errors == before.icrc_errors
                    {
                        let n = match (hdr.bth.opcode, hdr.reth) {
                            (Opcode::RcReadRequest, Some(r))
                                if after.naks_sent == before.naks_sent =>
                            {
                                r.dma_len.div_ceil(1024).max(1)
                            }
                            _ => 1,
                        };
                        epsn = vrnic::transport::psn::add(epsn, n);
                    }
                    continue;
                }
                // Already consistent; the flip below would break it again.
                sent += t.receive(&f);
                continue;
            }
        }
        if fix {
            fuzzing::fix_checksums(&mut f);
        }
        sent += t.receive(&f);
    }
    // Pure noise too.
    for _ in 0..500 {
        let n = rng.below(200) as usize;
        let f: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        sent += t.receive(&f);
    }
    let st = t.dev.stats().clone();
    eprintln!(
        "seed {seed}: {} frames sent, {revived} QPs revived, {st:?}",
        sent
    );
    assert!(
        st.icrc_errors > 0 && st.rx_dropped > 0,
        "seed {seed}: {st:?}"
    );
    // The checksum-fixed half reached the transport.
    assert!(st.naks_sent > 0 && st.duplicates > 0, "seed {seed}: {st:?}");
    assert!(
        st.nak_inv_req_sent + st.nak_rem_access_sent + st.nak_rem_op_sent > 0,
        "seed {seed}: requests were executed and refused: {st:?}"
    );
    assert!(
        st.naks_received + st.rnr_naks_received > 0,
        "seed {seed}: responses reached the completer: {st:?}"
    );
    assert!(revived > 0, "seed {seed}: no QP ever failed");
    assert!(sent > 0, "seed {seed}: the device never answered");
    // Still working: every QP back up, a UD SEND from the peer lands and a
    // command is served.
    t.revive(epsn);
    let before = t.cqes;
    let ud = frames
        .iter()
        .find(|f| {
            matches!(wire::parse_frame(f), Ok(Frame::Roce(p))
                if p.hdr.bth.opcode == Opcode::UdSendOnly && p.hdr.bth.dest_qp == qpns[qp::UD])
        })
        .expect("the exchange had a UD SEND");
    t.receive(ud);
    assert_eq!(t.cqes, before + 1, "seed {seed}: a UD SEND still completes");
    let (status, _) = t.command(abi::CMD_ALLOC_PD, &abi::Handle::default());
    assert_eq!(status, 0, "seed {seed}: the device still serves commands");
}

#[test]
fn mutated_frames_never_panic_and_the_device_keeps_working() {
    for seed in [0x5eed, 2, 3] {
        storm(seed);
    }
}

#[test]
fn arbitrary_control_commands_and_doorbells_are_answered_without_panic() {
    let mut t = Target::new(Peer::default());
    let mut rng = Rng(7);
    let mut errors = 0;
    for i in 0..20_000u32 {
        if i % 8 == 7 {
            // A doorbell with small (valid-looking) or arbitrary fields.
            let pick = |rng: &mut Rng| {
                if rng.below(2) == 0 {
                    rng.below(0x40) as u32
                } else {
                    rng.next() as u32
                }
            };
            let db = abi::Doorbell {
                kind: rng.below(8) as u16,
                handle: pick(&mut rng),
                index: pick(&mut rng),
                ..Default::default()
            };
            t.doorbell(&db);
            continue;
        }
        let opcode = rng.below(24) as u16;
        let len = rng.below(abi::MAX_CMD_BODY as u64 + 16) as usize;
        let mut req = abi::CmdHeader {
            opcode,
            ctx: 0,
            len: len as u32,
        }
        .as_bytes()
        .to_vec();
        for _ in 0..len {
            // Small numbers often, so handles, sizes and indices hit real objects.
            let v = match rng.below(3) {
                0 => rng.below(4) as u8,
                1 => rng.below(32) as u8,
                _ => rng.next() as u8,
            };
            req.push(v);
        }
        // Sometimes an address inside driver memory, so commands get past EFAULT.
        if len >= 24 && i % 3 == 0 {
            let gpa = fuzzing::MEM_BASE + rng.below(fuzzing::MEM_SIZE as u64);
            req[16..24].copy_from_slice(&gpa.to_le_bytes());
        }
        if rng.below(16) == 0 {
            req.truncate(rng.below(req.len() as u64) as usize);
        }
        t.control(&req);
        if t.dev.stats().cmd_errors > errors {
            errors = t.dev.stats().cmd_errors;
        }
        if i % 256 == 255 {
            t.advance(10_000_000);
        }
    }
    assert!(errors > 0, "some commands were refused");
    let (status, _) = t.command(abi::CMD_ALLOC_PD, &abi::Handle::default());
    assert_eq!(status, 0, "the device still serves commands");
}

/// The libFuzzer entry points run on a few deterministic inputs (the
/// exchange's frames in their record format), so a change that breaks them
/// shows up in CI, not only under cargo-fuzz; and `VRNIC_FUZZ_CORPUS`
/// exports those inputs as a seed corpus.
/// Batches (`batch::gso`) of the exchange's packets, some by reference
/// and runs of packets (`batch::Run`) among them, as another function of
/// the daemon hands them over (`Icrc::Unneeded`), intact or damaged:
/// every packet of a batch is handled as its own, damage never panics,
/// and the device keeps working.
#[test]
fn batches_of_mutated_packets_never_panic_and_the_device_keeps_working() {
    let (mut t, frames) = exchange();
    let qpns = t.qpns();
    let pkts: Vec<(RoceHeaders, Vec<u8>)> = frames
        .iter()
        .filter_map(|f| match wire::parse_frame(f) {
            Ok(Frame::Roce(p)) => Some((p.hdr.clone(), p.payload.to_vec())),
            _ => None,
        })
        .collect();
    let mut rng = Rng(0xba7c);
    let mut intact = 0;
    for i in 0..2000 {
        let mut f = Vec::new();
        let mut end = 0;
        let mut first: Option<RoceHeaders> = None;
        let entries = 1 + rng.below(6);
        // Packets: a run counts as its packets.
        let mut n = entries;
        for _ in 0..entries {
            let (h, payload) = &pkts[rng.below(pkts.len() as u64) as usize];
            let fill = |b: &mut [u8]| {
                b.copy_from_slice(payload);
                Ok::<(), ()>(())
            };
            end = match &first {
                None => {
                    first = Some(h.clone());
                    batch::gso::start(&mut f, h, payload.len(), fill).unwrap()
                }
                Some(fh) => {
                    // Of the first packet's flow.
                    let h = RoceHeaders {
                        bth: h.bth,
                        reth: h.reth,
                        aeth: h.aeth,
                        atomic_eth: h.atomic_eth,
                        atomic_ack_eth: h.atomic_ack_eth,
                        deth: h.deth,
                        immdt: h.immdt,
                        ieth: h.ieth,
                        ..fh.clone()
                    };
                    match rng.below(3) {
                        0 => batch::gso::append(&mut f, end, &h, payload.len(), fill).unwrap(),
                        // Its payload by reference, in the peer's memory
                        // (now and then past its end).
                        1 => {
                            let at = fuzzing::PEER_MEM_BASE + rng.below(PEER_SPAN);
                            let pieces = |out: &mut Vec<u8>| {
                                vrnic::data::push_piece(out, at, payload.len() as u32);
                                Ok::<(), ()>(())
                            };
                            match batch::gso::append_peer(&mut f, end, &h, payload.len(), pieces) {
                                Ok(Some(e)) => e,
                                _ => end,
                            }
                        }
                        // A run of a SEND or WRITE to the packet's QP.
                        _ => {
                            let (e, count) = append_run(&mut f, end, &h, &t, &mut rng);
                            n += count - 1;
                            e
                        }
                    }
                }
            };
        }
        f.truncate(end);
        let rx_before = t.dev.stats().rx_frames;
        match i % 4 {
            0 => intact += 1,
            1 | 2 => {
                for _ in 0..=rng.below(3) {
                    let at = rng.below(f.len() as u64) as usize;
                    f[at] ^= 1 << rng.below(8);
                }
            }
            _ => f.truncate(rng.below(f.len() as u64 + 1) as usize),
        }
        t.receive_with(&f, wire::Icrc::Unneeded);
        if i % 4 == 0 {
            let rx = t.dev.stats().rx_frames - rx_before;
            assert_eq!(rx, n, "batch {i}: every packet received");
        }
        if i % 16 == 0 {
            t.revive(rc_epsn(&frames, qpns[qp::RC]));
        }
    }
    assert_eq!(intact, 500);
    // Still working: a UD SEND from the peer lands and a command is served.
    t.revive(rc_epsn(&frames, qpns[qp::RC]));
    let before = t.cqes;
    let ud = frames
        .iter()
        .find(|f| {
            matches!(wire::parse_frame(f), Ok(Frame::Roce(p))
                if p.hdr.bth.opcode == Opcode::UdSendOnly && p.hdr.bth.dest_qp == qpns[qp::UD])
        })
        .expect("the exchange had a UD SEND");
    t.receive(ud);
    assert_eq!(t.cqes, before + 1, "a UD SEND still completes");
    let (status, _) = t.command(abi::CMD_ALLOC_PD, &abi::Handle::default());
    assert_eq!(status, 0, "the device still serves commands");
}

/// Bytes of the peer's memory runs and packets by reference start in: a
/// few go past its end.
const PEER_SPAN: u64 = fuzzing::PEER_MEM_SIZE as u64 - 2048;

/// Appends to the batch `f` (ending at `end`) a run of 2 to 5 packets of
/// a SEND, WRITE or READ response of the flow of `h`, to its QP and from
/// its PSN, its
/// payload in the peer's memory, as another function of the daemon sends
/// one (`batch::Run`); a WRITE's RETH names the target's MR 0. Returns the
/// batch's new end and the run's packet count.
fn append_run(
    f: &mut Vec<u8>,
    end: usize,
    h: &RoceHeaders,
    t: &Target,
    rng: &mut Rng,
) -> (usize, u64) {
    use Opcode::*;
    let kinds = [
        (RcSendFirst, RcSendLast),
        (RcSendMiddle, RcSendLastImm),
        (RcSendFirst, RcSendLastInv),
        (RcWriteFirst, RcWriteLast),
        (RcWriteFirst, RcWriteLastImm),
        (RcWriteFirst, RcWriteMiddle),
        (RcWriteMiddle, RcWriteLast),
        (UcSendFirst, UcSendLast),
        (UcWriteFirst, UcWriteLastImm),
        (RcReadResponseFirst, RcReadResponseLast),
        (RcReadResponseMiddle, RcReadResponseMiddle),
    ];
    let (fo, lo) = kinds[rng.below(kinds.len() as u64) as usize];
    let count = 2 + rng.below(4) as u32;
    let stride = 1024u32;
    let total = (count - 1) * stride + 1 + rng.below(u64::from(stride)) as u32;
    let psn = h.bth.psn;
    let mut first = h.of_flow(wire::Bth {
        opcode: fo,
        ack_req: false,
        solicited: false,
        ..h.bth
    });
    if fo.has_reth() {
        first.reth = Some(wire::Reth {
            va: t.mr_base[0] + rng.below(4096),
            rkey: t.rkey,
            dma_len: total,
        });
    }
    let mut last = h.of_flow(wire::Bth {
        opcode: lo,
        psn: (psn + count - 1) & 0xff_ffff,
        ack_req: rng.below(2) == 0,
        ..h.bth
    });
    let aeth = wire::Aeth::ack(rng.below(8) as u32, 31);
    first.aeth = fo.has_aeth().then_some(aeth);
    last.aeth = lo.has_aeth().then_some(aeth);
    last.immdt = lo.has_immdt().then_some(wire::Immdt([1, 2, 3, 4]));
    last.ieth = lo.has_ieth().then_some(wire::Ieth {
        rkey: rng.next() as u32,
    });
    let at = fuzzing::PEER_MEM_BASE + rng.below(PEER_SPAN);
    let cut = rng.below(u64::from(total)) as u32;
    let pieces = |out: &mut Vec<u8>| {
        vrnic::data::push_piece(out, at, cut);
        vrnic::data::push_piece(out, at + u64::from(cut), total - cut);
        Ok::<(), ()>(())
    };
    let e = batch::gso::append_run(
        f,
        end,
        &first,
        &last,
        count as u16,
        stride as u16,
        total as usize,
        pieces,
    )
    .unwrap()
    .unwrap();
    (e, u64::from(count))
}

#[test]
fn fuzz_entry_points_run_on_the_exchange_frames() {
    let (_t, frames) = exchange();
    let mut records: Vec<(u8, &[u8])> = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        records.push(((i as u8 & 7) << fuzzing::REC_TIME_SHIFT, f));
    }
    let whole = fuzzing::encode_records(&records);
    fuzzing::fuzz_receive(&whole);
    // The same as from another function of the daemon, ICRC unchecked.
    let local: Vec<(u8, &[u8])> = records
        .iter()
        .map(|(flags, f)| (flags | fuzzing::REC_LOCAL, *f))
        .collect();
    fuzzing::fuzz_receive(&fuzzing::encode_records(&local));
    for f in &frames {
        fuzzing::fuzz_parse(f);
        let mut g = f.clone();
        g[f.len() / 2] ^= 0x10;
        fuzzing::fix_checksums(&mut g);
        fuzzing::fuzz_receive(&fuzzing::encode_records(&[(fuzzing::REC_FIX, &g)]));
        fuzzing::fuzz_parse(&g);
    }
    // fuzz_control records: [kind, len, bytes]; 0xDB is a doorbell.
    let mut input = Vec::new();
    for (op, body) in [
        (abi::CMD_QUERY_DEVICE, vec![0u8; 0]),
        (abi::CMD_ALLOC_PD, vec![0; 8]),
        (abi::CMD_QUERY_QP, 0x11u32.to_le_bytes().repeat(2)),
    ] {
        let mut req = abi::CmdHeader {
            opcode: op,
            ctx: 0,
            len: body.len() as u32,
        }
        .as_bytes()
        .to_vec();
        req.extend_from_slice(&body);
        input.extend_from_slice(&[0, req.len() as u8]);
        input.extend_from_slice(&req);
    }
    let db = abi::Doorbell {
        kind: abi::DB_SQ,
        handle: 0x11,
        index: 3,
        ..Default::default()
    };
    input.extend_from_slice(&[fuzzing::REC_DOORBELL, 16]);
    input.extend_from_slice(db.as_bytes());
    // A SEND of 16 bytes from MR 0 on the RC QP, as a WQE record.
    let wqe = abi::SendWqe {
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    input.extend_from_slice(&[fuzzing::REC_WQE, 81, qp::RC as u8]);
    input.extend_from_slice(wqe.as_bytes());
    input.extend_from_slice(abi::Sge::default().as_bytes());
    fuzzing::fuzz_control(&input);
    if let Ok(dir) = std::env::var("VRNIC_FUZZ_CORPUS") {
        let dir = std::path::Path::new(&dir);
        for sub in ["receive_frame", "parse_frame", "control"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("control/commands"), &input).unwrap();
        std::fs::write(dir.join("receive_frame/exchange"), &whole).unwrap();
        for (i, f) in frames.iter().enumerate() {
            std::fs::write(dir.join(format!("parse_frame/frame{i:03}")), f).unwrap();
            let rec = fuzzing::encode_records(&[(fuzzing::REC_FIX, f)]);
            std::fs::write(dir.join(format!("receive_frame/frame{i:03}")), rec).unwrap();
        }
    }
}

/// Arbitrary send WQEs in the fake guest memory (`fuzzing::REC_WQE`):
/// every opcode byte, random flags, lengths, addresses and keys, with the
/// SGE's key sometimes one of the target's own, on every QP of the target
/// in turn, mixed with arbitrary doorbells and doorbell record steps (indices
/// written to the QP records, polling begun, rounds, polling ended). Passing: no panic, the device
/// answers every later command (checked by the harness), and the seeded
/// inputs cover every opcode byte.
#[test]
fn arbitrary_wqes_and_doorbells() {
    let mut rng = Rng(0x5e5e);
    let mut opcodes = [false; 256];
    for round in 0..200u32 {
        let mut input = Vec::new();
        for i in 0..16u32 {
            if rng.below(8) == 0 {
                // A doorbell record step (SQ or RQ): sometimes a plausible
                // index, sometimes anything.
                let k = ((round + i) % 5) as u8;
                let index = if rng.below(2) == 0 {
                    rng.below(40) as u32
                } else {
                    rng.next() as u32
                };
                input.extend_from_slice(&[fuzzing::REC_DB_RECORD, 6, k]);
                input.extend_from_slice(&index.to_le_bytes());
                input.push(rng.below(3) as u8 | (rng.below(2) as u8) << 7);
                continue;
            }
            if rng.below(4) == 0 {
                let mut db = [0u8; 16];
                db.iter_mut().for_each(|b| *b = rng.next() as u8);
                db[0] = (rng.below(7)) as u8; // kinds 0..6, 1..5 valid
                input.extend_from_slice(&[fuzzing::REC_DOORBELL, 16]);
                input.extend_from_slice(&db);
                continue;
            }
            let mut w = [0u8; 81];
            w.iter_mut().for_each(|b| *b = rng.next() as u8);
            w[0] = ((round + i) % 5) as u8;
            let op = ((round * 16 + i) % 256) as u8;
            opcodes[usize::from(op)] = true;
            w[1 + 8] = op; // SendWqe.opcode, after the 8-byte wr_id
            input.extend_from_slice(&[fuzzing::REC_WQE, w.len() as u8]);
            input.extend_from_slice(&w);
        }
        fuzzing::fuzz_control(&input);
    }
    assert!(opcodes.iter().all(|&o| o), "every opcode byte was tried");
}
