//! RC over a lossy, reordering, duplicating, corrupting link: every SEND,
//! WRITE and WRITE with immediate completes exactly once with success, in
//! order, and every byte arrives (go-back-N, duplicate detection, ICRC).

mod common;

use common::*;
use vrnic::abi;
use vrnic::link::fault::FaultRates;

const ALL: u32 = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;
const SLOTS: u64 = 8;
const SLOT: u64 = 64 * 1024;

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
        self.next() % n
    }
}

fn run(seed: u64, mtu_enum: u32, ops: usize) {
    let rates = FaultRates {
        drop: 0.05,
        duplicate: 0.01,
        reorder: 0.05,
        corrupt: 0.01,
    };
    let link_mtu = if mtu_enum == 5 { 9000 } else { 1500 };
    let (mut a, mut b) = lossy_pair(link_mtu, seed, rates);
    let pda = a.alloc_pd();
    let pdb = b.alloc_pd();
    let mut ca = a.create_cq(256);
    let mut cb = b.create_cq(256);
    let mut qa = a.create_qp(pda, &ca, 64, 4);
    let mut qb = b.create_qp(pdb, &cb, 64, 4);
    let (ipa, ipb) = (a.ip, b.ip);
    let start_psn = 0xff_ff00; // wrap the 24-bit PSN early
    a.connect(&qa, ipb, qb.qpn, mtu_enum, start_psn, 7, 7, 7);
    b.connect(&qb, ipa, qa.qpn, mtu_enum, 7, start_psn, 7, 7);
    let src = a.alloc((SLOTS * SLOT) as usize);
    let dst = b.alloc((SLOTS * SLOT) as usize);
    let (lk_a, _) = a.reg_mr(pda, src, SLOTS * SLOT, ALL).unwrap();
    let (lk_b, rk_b) = b.reg_mr(pdb, dst, SLOTS * SLOT, ALL).unwrap();
    let mut rng = Rng(seed);
    let mut now = 1_000_000_000u64;
    let mut done = 0usize;
    let mut next_recv_id = 0u64;
    while done < ops {
        let batch = (ops - done).min(SLOTS as usize);
        let mut expect = Vec::new();
        for slot in 0..batch as u64 {
            let kind = rng.below(3) as u8;
            let len = match rng.below(4) {
                0 => rng.below(16),
                1 => rng.below(4096),
                _ => rng.below(SLOT + 1),
            } as u32;
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            a.fill(src + slot * SLOT, &data);
            let opcode = [
                abi::WR_SEND,
                abi::WR_RDMA_WRITE,
                abi::WR_RDMA_WRITE_WITH_IMM,
            ][kind as usize];
            if opcode != abi::WR_RDMA_WRITE {
                let sge = abi::Sge {
                    addr: dst + slot * SLOT,
                    length: SLOT as u32,
                    lkey: lk_b,
                };
                let sges: &[abi::Sge] = if opcode == abi::WR_SEND { &[sge] } else { &[] };
                b.post_recv(&mut qb, next_recv_id, sges, now);
                next_recv_id += 1;
            }
            let wqe = abi::SendWqe {
                wr_id: (done as u64) + slot,
                opcode,
                send_flags: abi::SEND_SIGNALED,
                imm_data: (slot as u32).to_be_bytes(),
                remote_addr: dst + slot * SLOT,
                rkey: rk_b,
                ..Default::default()
            };
            let sge = abi::Sge {
                addr: src + slot * SLOT,
                length: len,
                lkey: lk_a,
            };
            a.post_send(&mut qa, wqe, &[sge], now);
            expect.push((opcode, data));
        }
        let want_recv = expect
            .iter()
            .filter(|(op, _)| *op != abi::WR_RDMA_WRITE)
            .count();
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        run_until(&mut a, &mut b, &mut now, 400_000, |a, b| {
            while let Some(c) = a.poll_cq(&mut ca) {
                sends.push(c);
            }
            while let Some(c) = b.poll_cq(&mut cb) {
                recvs.push(c);
            }
            sends.len() >= batch && recvs.len() >= want_recv
        });
        assert_eq!(
            sends.len(),
            batch,
            "seed {seed}: each WQE completes exactly once"
        );
        assert_eq!(
            recvs.len(),
            want_recv,
            "seed {seed}: each receive completes exactly once"
        );
        for (i, c) in sends.iter().enumerate() {
            assert_eq!(
                (c.status, c.wr_id),
                (abi::WC_SUCCESS, (done + i) as u64),
                "seed {seed}: send CQE {i}"
            );
        }
        let first_recv = next_recv_id - want_recv as u64;
        for (i, c) in recvs.iter().enumerate() {
            assert_eq!(
                (c.status, c.wr_id),
                (abi::WC_SUCCESS, first_recv + i as u64),
                "seed {seed}: recv order"
            );
        }
        let mut r = recvs.iter();
        for (slot, (opcode, data)) in expect.iter().enumerate() {
            if *opcode != abi::WR_RDMA_WRITE {
                let c = r.next().unwrap();
                assert_eq!(
                    c.byte_len,
                    data.len() as u32,
                    "seed {seed} op {}",
                    done + slot
                );
                if *opcode == abi::WR_RDMA_WRITE_WITH_IMM {
                    assert_eq!(c.imm_data, (slot as u32).to_be_bytes());
                }
            }
            let got = b.read(dst + slot as u64 * SLOT, data.len());
            assert!(
                got == *data,
                "seed {seed} op {}: {} bytes differ",
                done + slot,
                data.len()
            );
        }
        done += batch;
    }
    let (sa, sb) = (a.dev.stats().clone(), b.dev.stats().clone());
    assert!(
        sa.retransmits + sa.naks_received > 0,
        "seed {seed}: the faults were exercised"
    );
    assert!(
        sa.icrc_errors + sb.icrc_errors > 0,
        "seed {seed}: corrupted frames were caught by the ICRC"
    );
    assert!(sb.duplicates > 0, "seed {seed}: duplicates were detected");
}

#[test]
fn mixed_operations_survive_loss_reorder_duplication_and_corruption() {
    for (seed, mtu) in [(1u64, 1u32), (2, 3), (3, 5), (4, 3)] {
        run(seed, mtu, 200);
    }
}
