//! RC over a lossy, reordering, delaying, duplicating, corrupting link: every SEND,
//! WRITE, WRITE with immediate, READ and fetch-and-add completes exactly
//! once with success, in order, every byte arrives, and the fetch-and-add
//! counter ends exactly at the sum of its adds (go-back-N, duplicate
//! detection, READ re-generation, atomic replay, ICRC).

mod common;

use common::*;
use vrnic::abi;
use vrnic::link::fault::FaultRates;

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;
const SLOTS: u64 = 8;
/// Largest message, bytes (the 1 MiB).
const SLOT: u64 = 1024 * 1024;
/// Operations per seed (the 10,000).
const OPS: usize = 10_000;

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

    /// A message size in 0..=1 MiB: 10% under 16 bytes, 60% under 4 KiB,
    /// 25% under 64 KiB and 5% from 64 KiB to 1 MiB (log-uniform), so every
    /// seed moves many 1 MiB-class messages while the total stays bounded.
    fn size(&mut self) -> u64 {
        match self.below(20) {
            0..=1 => self.below(16),
            2..=13 => self.below(4096),
            14..=18 => self.below(64 * 1024),
            _ => {
                let shift = 16 + self.below(5); // 64 KiB .. 1 MiB
                ((1u64 << shift) + self.below(1 << shift)).min(SLOT)
            }
        }
    }
}

fn run(seed: u64, mtu_enum: u32, ops: usize) {
    let rates = FaultRates {
        drop: 0.05,
        duplicate: 0.01,
        reorder: 0.05,
        corrupt: 0.01,
        // Beyond the rates: 1% of frames arrive 2-8 frames late.
        delay: 0.01,
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
    let dst = b.alloc((SLOTS * SLOT + 4096) as usize);
    let counter = dst + SLOTS * SLOT;
    let (lk_a, _) = a.reg_mr(pda, src, SLOTS * SLOT, ALL).unwrap();
    let (lk_b, rk_b) = b.reg_mr(pdb, dst, SLOTS * SLOT + 4096, ALL).unwrap();
    let mut counter_sum = 0u64;
    let mut rng = Rng(seed);
    let mut now = 1_000_000_000u64;
    let mut done = 0usize;
    let mut next_recv_id = 0u64;
    while done < ops {
        let batch = (ops - done).min(SLOTS as usize);
        let mut expect = Vec::new();
        for slot in 0..batch as u64 {
            let kind = rng.below(5) as usize;
            let len = rng.size() as u32;
            let opcode = [
                abi::WR_SEND,
                abi::WR_RDMA_WRITE,
                abi::WR_RDMA_WRITE_WITH_IMM,
                abi::WR_RDMA_READ,
                abi::WR_ATOMIC_FETCH_AND_ADD,
            ][kind];
            let len = if opcode == abi::WR_ATOMIC_FETCH_AND_ADD {
                8
            } else {
                len
            };
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let add = rng.below(1000) + 1;
            match opcode {
                // READ: the data is on B and lands in A's slot.
                abi::WR_RDMA_READ => b.fill(dst + slot * SLOT, &data),
                abi::WR_ATOMIC_FETCH_AND_ADD => counter_sum += add,
                _ => a.fill(src + slot * SLOT, &data),
            }
            if matches!(opcode, abi::WR_SEND | abi::WR_RDMA_WRITE_WITH_IMM) {
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
                remote_addr: if opcode == abi::WR_ATOMIC_FETCH_AND_ADD {
                    counter
                } else {
                    dst + slot * SLOT
                },
                rkey: rk_b,
                compare_add: add,
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
            .filter(|(op, _)| matches!(*op, abi::WR_SEND | abi::WR_RDMA_WRITE_WITH_IMM))
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
        let mut last_orig = None;
        for (slot, (opcode, data)) in expect.iter().enumerate() {
            let here = src + slot as u64 * SLOT;
            if *opcode == abi::WR_RDMA_READ {
                let got = a.read(here, data.len());
                let first_bad = got.iter().zip(data).position(|(x, y)| x != y);
                assert!(
                    got == *data,
                    "seed {seed} op {}: READ of {} bytes differs at {first_bad:?}",
                    done + slot,
                    data.len()
                );
                continue;
            }
            if *opcode == abi::WR_ATOMIC_FETCH_AND_ADD {
                let orig = u64::from_le_bytes(a.read(here, 8).try_into().unwrap());
                // Fetch-and-adds execute once each, in order: originals increase.
                assert!(
                    last_orig.is_none_or(|l| orig > l),
                    "seed {seed}: atomic originals in order"
                );
                last_orig = Some(orig);
                continue;
            }
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
    let final_counter = u64::from_le_bytes(b.read(counter, 8).try_into().unwrap());
    assert_eq!(
        final_counter, counter_sum,
        "seed {seed}: every fetch-and-add executed exactly once"
    );
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

/// The run: 10,000 operations per seed, 0 B to 1 MiB, at path MTU
/// 256, 1024 and 4096, with 5% loss, 5% reordering, 1% duplication and 1%
/// corruption.
#[test]
fn ten_thousand_mixed_operations_survive_loss_reorder_duplication_and_corruption() {
    for (seed, mtu) in [(1u64, 1u32), (2, 3), (3, 5)] {
        run(seed, mtu, OPS);
    }
}

/// More seeds, fewer operations each (different fault patterns early in a
/// QP's life: first PSNs, ARP, the PSN wrap).
#[test]
fn mixed_operations_on_more_seeds() {
    for seed in 4..10u64 {
        run(seed, [1u32, 3, 5][seed as usize % 3], 500);
    }
}
