//! Hostile input on stable Rust: thousands of seeded mutations of real
//! RoCEv2 frames, and arbitrary control commands, fed to a device with RC,
//! UC and UD QPs, an SRQ and MRs. Passing means: no panic, bounded output
//! per input, and the device still works afterwards. (The cargo-fuzz
//! targets in `fuzz/` run the same kind of input under libFuzzer.)

mod common;

use common::*;
use vrnic::abi::{self, Pod};
use vrnic::wire::{self, Frame, Opcode, RoceHeaders};

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;

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

/// A connected RC pair plus extra QPs of every type on B, and the frames
/// of a real exchange (SEND, WRITE, WRITE-imm, READ, atomics) in both
/// directions.
fn setup() -> (Node, Node, Vec<Vec<u8>>, Vec<u32>) {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (mut cqa, cqb) = (a.create_cq(256), b.create_cq(256));
    let mut qa = a.create_qp(pa, &cqa, 64, 4);
    let mut qb = b.create_qp(pb, &cqb, 64, 4);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect(&qa, ipb, qb.qpn, 3, 0xff_fff0, 5, 7, 7);
    b.connect(&qb, ipa, qa.qpn, 3, 5, 0xff_fff0, 7, 7);
    let la = a.alloc(65536);
    let (lka, _) = a.reg_mr(pa, la, 65536, ALL).unwrap();
    let lb = b.alloc(65536);
    let (lkb, rkb) = b.reg_mr(pb, lb, 65536, ALL).unwrap();
    for i in 0..16 {
        let sge = abi::Sge {
            addr: lb + 4096 * (i % 8),
            length: 4096,
            lkey: lkb,
        };
        b.post_recv(&mut qb, i, &[sge], 0);
    }
    let ops = [
        (abi::WR_SEND, 3000u32),
        (abi::WR_RDMA_WRITE, 5000),
        (abi::WR_RDMA_WRITE_WITH_IMM, 100),
        (abi::WR_RDMA_READ, 2500),
        (abi::WR_ATOMIC_FETCH_AND_ADD, 8),
        (abi::WR_ATOMIC_CMP_AND_SWP, 8),
        (abi::WR_SEND_WITH_IMM, 0),
    ];
    for (i, (op, len)) in ops.iter().enumerate() {
        let w = abi::SendWqe {
            wr_id: i as u64,
            opcode: *op,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: lb + 32768,
            rkey: rkb,
            compare_add: 1,
            ..Default::default()
        };
        let sge = abi::Sge {
            addr: la,
            length: *len,
            lkey: lka,
        };
        a.post_send(&mut qa, w, &[sge], 0);
    }
    // Shuttle frames by hand, recording every one.
    let mut frames = Vec::new();
    for t in 0..200u64 {
        a.dev.poll(&a.mem, t * 2_000_000);
        b.dev.poll(&b.mem, t * 2_000_000);
        let mut moved = t < 5;
        for f in std::iter::from_fn(|| a.dev.pop_tx()).collect::<Vec<_>>() {
            b.dev.receive(&b.mem, &f, 0);
            frames.push(f);
            moved = true;
        }
        for f in std::iter::from_fn(|| b.dev.pop_tx()).collect::<Vec<_>>() {
            a.dev.receive(&a.mem, &f, 0);
            frames.push(f);
            moved = true;
        }
        if !moved {
            break;
        }
    }
    let mut done = 0;
    while a.poll_cq(&mut cqa).is_some() {
        done += 1;
    }
    assert_eq!(done, ops.len(), "the seed exchange completed");
    // More targets on B: UC and UD QPs, one on an SRQ.
    let srq_ring = b.alloc(64 * 32);
    let srq_db = b.alloc(8);
    let srq = abi::CreateSrq {
        pdn: pb,
        max_wr: 64,
        max_sge: 1,
        srq_limit: 4,
        ring: srq_ring,
        db: srq_db,
    };
    let srqn = abi::CreateSrqResp::read_from(&b.cmd(abi::CMD_CREATE_SRQ, &srq).unwrap())
        .unwrap()
        .srqn;
    let mut qpns = vec![qa.qpn, qb.qpn];
    for (qp_type, srqn) in [(abi::QPT_UC, 0), (abi::QPT_UD, 0), (abi::QPT_UD, srqn)] {
        let sq = b.alloc(64 * 128);
        let rq = b.alloc(64 * 32);
        let rec = b.alloc(16);
        let c = abi::CreateQp {
            pdn: pb,
            qp_type,
            send_cqn: cqb.cqn,
            recv_cqn: cqb.cqn,
            sq_size: 64,
            rq_size: if srqn == 0 { 64 } else { 0 },
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
            sq_sig_all: 0,
            sq,
            rq,
            db: rec,
            srqn,
            reserved: 0,
        };
        let r = abi::CreateQpResp::read_from(&b.cmd(abi::CMD_CREATE_QP, &c).unwrap()).unwrap();
        qpns.push(r.qpn);
    }
    (a, b, frames, qpns)
}

/// Field-level mutation of a parsed frame, re-emitted with a valid ICRC so
/// that it reaches the transport.
fn mutate_headers(rng: &mut Rng, hdr: &mut RoceHeaders, payload: &mut Vec<u8>, qpns: &[u32]) {
    match rng.below(12) {
        0 => hdr.bth.psn = rng.next() as u32 & 0xff_ffff,
        1 => hdr.bth.psn = hdr.bth.psn.wrapping_add(rng.below(5) as u32) & 0xff_ffff,
        2 => hdr.bth.dest_qp = qpns[rng.below(qpns.len() as u64) as usize],
        3 => {
            if let Some(r) = hdr.reth.as_mut() {
                r.va = rng.next();
                r.dma_len = rng.next() as u32;
                r.rkey = rng.next() as u32;
            }
        }
        4 => payload.truncate(rng.below(payload.len() as u64 + 1) as usize),
        5 => payload.extend((0..rng.below(5000)).map(|_| rng.next() as u8)),
        6 => {
            if let Some(a) = hdr.aeth.as_mut() {
                a.syndrome = rng.next() as u8;
                a.msn = rng.next() as u32;
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
            }
        }
        _ => {
            // Another opcode of the table: its extension headers may now
            // be missing or extra; emit writes what is there, and the
            // parser then sees a malformed or different packet.
            let all: Vec<Opcode> = (0..=255u8).filter_map(Opcode::from_u8).collect();
            hdr.bth.opcode = all[rng.below(all.len() as u64) as usize];
        }
    }
}

/// A driver-side handle for an existing QP (only its number is used to
/// connect it).
fn b_qp(qpn: u32) -> Qp {
    Qp {
        qpn,
        sq: 0,
        rq: 0,
        rec: 0,
        sq_stride: 0,
        rq_stride: 0,
        sq_size: 0,
        rq_size: 0,
        sq_pi: 0,
        rq_pi: 0,
    }
}

fn feed(b: &mut Node, frame: &[u8], now: u64) {
    b.dev.receive(&b.mem, frame, now);
    b.dev.poll(&b.mem, now);
    let out = std::iter::from_fn(|| b.dev.pop_tx()).count();
    // A READ request may ask for up to 2 GiB; the device answers what the MR
    // allows, bounded by the MR (here 64 KiB = 64 packets at MTU 1024) plus
    // retransmissions of what is in flight.
    assert!(out <= 2048, "one input made {out} frames");
    while b.dev.pop_event().is_some() {}
}

#[test]
fn mutated_frames_never_panic_and_the_device_keeps_working() {
    let (a, mut b, frames, qpns) = setup();
    assert!(frames.len() > 10);
    let mut rng = Rng(0x5eed);
    let mut now = 0u64;
    // The responder's expected PSN, tracked from what the device did: a
    // request that was neither a duplicate nor out of sequence moved it on.
    let mut epsn = frames
        .iter()
        .filter_map(|f| match wire::parse_frame(f) {
            Ok(Frame::Roce(p)) if p.hdr.bth.opcode.is_request() => Some(p.hdr.bth.psn),
            _ => None,
        })
        .max()
        .map_or(0, |p| (p + 1) & 0xff_ffff);
    let (mac_a, mac_b) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let (qpn_a, qpn_b) = (qpns[0], qpns[1]);
    let mut revived = 0;
    for i in 0..20_000u64 {
        // An error moves B's RC QP to ERR (as it must); bring it back so
        // later inputs reach a live responder again.
        let q = abi::Handle {
            handle: qpn_b,
            reserved: 0,
        };
        let state = abi::QpAttr::read_from(&b.cmd(abi::CMD_QUERY_QP, &q).unwrap())
            .unwrap()
            .qp_state;
        if state == abi::QPS_ERR {
            let reset = abi::QpAttr {
                qpn: qpn_b,
                attr_mask: abi::QP_ATTR_STATE,
                qp_state: abi::QPS_RESET,
                ..Default::default()
            };
            b.cmd(abi::CMD_MODIFY_QP, &reset).unwrap();
            let qp = b_qp(qpn_b);
            b.connect(&qp, a.ip, qpn_a, 3, 5, epsn, 7, 7);
            revived += 1;
        }
        now += 1_000_000;
        let base = &frames[rng.below(frames.len() as u64) as usize];
        let mut f = base.clone();
        match i % 4 {
            // Raw bit flips and truncation: mostly caught by the ICRC.
            0 => {
                for _ in 0..=rng.below(4) {
                    let at = rng.below(f.len() as u64) as usize;
                    f[at] ^= 1 << rng.below(8);
                }
            }
            1 => f.truncate(rng.below(f.len() as u64 + 1) as usize),
            // Structure-aware: reaches the transport with a valid ICRC.
            _ => {
                let Ok(Frame::Roce(p)) = wire::parse_frame(base) else {
                    continue;
                };
                let mut hdr = p.hdr.clone();
                // Always addressed to B, from A.
                (hdr.eth_src, hdr.eth_dst) = (mac_a, mac_b);
                (hdr.ip_src, hdr.ip_dst) = (a.ip.into(), b.ip.into());
                let mut payload = p.payload.to_vec();
                for _ in 0..=rng.below(3) {
                    mutate_headers(&mut rng, &mut hdr, &mut payload, &qpns);
                }
                if i % 4 == 3 && hdr.bth.opcode.is_request() {
                    // In sequence, so the responder executes it.
                    hdr.bth.psn = epsn;
                    let before = b.dev.stats().clone();
                    f.clear();
                    wire::emit_frame(&hdr, &payload, &mut f);
                    feed(&mut b, &f, now);
                    let after = b.dev.stats();
                    if after.duplicates == before.duplicates
                        && after.nak_psn_seq_sent == before.nak_psn_seq_sent
                        && after.rx_dropped == before.rx_dropped
                    {
                        epsn = (epsn + 1) & 0xff_ffff;
                    }
                    continue;
                }
                f.clear();
                wire::emit_frame(&hdr, &payload, &mut f);
            }
        }
        feed(&mut b, &f, now);
    }
    // Pure noise too.
    for _ in 0..2_000 {
        let n = rng.below(200) as usize;
        let f: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        feed(&mut b, &f, now);
    }
    let st = b.dev.stats();
    assert!(st.icrc_errors > 0 && st.rx_dropped > 0, "{st:?}");
    // The structure-aware half reached the transport: requests were NAKed
    // and duplicates recognised.
    assert!(st.naks_sent > 0 && st.duplicates > 0, "{st:?}");
    assert!(
        st.nak_inv_req_sent + st.nak_rem_access_sent + st.nak_rem_op_sent > 0,
        "requests were executed and refused: {st:?}"
    );
    assert!(revived > 0, "the responder QP was revived {revived} times");
    // The device still serves commands.
    let pd = b.alloc_pd();
    assert!(pd > 0);
}

#[test]
fn arbitrary_control_commands_are_answered_without_panic() {
    let (_a, mut b, _frames, _qpns) = setup();
    let mut rng = Rng(7);
    let mut resp = vec![0u8; 256];
    for i in 0..20_000u32 {
        let opcode = (rng.below(24)) as u16;
        let len = rng.below(abi::MAX_CMD_BODY as u64 + 16) as usize;
        let mut req = abi::CmdHeader {
            opcode,
            flags: 0,
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
            let gpa = MEM_BASE + rng.below(MEM_SIZE as u64);
            req[16..24].copy_from_slice(&gpa.to_le_bytes());
        }
        let n = b.dev.control(&b.mem, &req, &mut resp);
        assert!((8..=resp.len()).contains(&n));
        while b.dev.pop_tx().is_some() {}
        while b.dev.pop_event().is_some() {}
    }
    assert!(b.alloc_pd() > 0, "the device still serves commands");
}
