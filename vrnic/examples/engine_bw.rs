//! The engine's own throughput, without a kernel link: two devices driven
//! from one thread over an in-memory link that recycles its buffers, RDMA
//! WRITE then RDMA READ of `SIZE`-byte messages at path MTU 4096, up to 32
//! outstanding. Prints, per operation, Gb/s of payload (both devices' work
//! on one core: requester and responder), the frames and the heap
//! allocations per frame (counted by a global allocator; the link itself
//! allocates nothing once warm).
//!
//!     cargo run --release -p vrnic --example engine_bw [-- SIZE COUNT]
//!
//! Defaults: 65536 bytes, 4000 messages. Issue 10's engine targets (no
//! allocation per packet, one payload copy per direction) show here.

#[path = "../tests/common/mod.rs"]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::{pool_pair, sge, ConnOpts, RcPair};
use vrnic::abi;

/// Counts every allocation and reallocation.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn run(op: u8, size: usize, count: u64) {
    let (la, lb) = pool_pair();
    let o = ConnOpts {
        mtu: 5,
        max_rd_atomic: 16,
        ..ConnOpts::default()
    };
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), o, true);
    let all = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;
    let a_buf = s.a.alloc(size);
    let b_buf = s.b.alloc(size);
    s.a.fill(a_buf, &vec![0xa5; size]);
    s.b.fill(b_buf, &vec![0x5a; size]);
    let (lk_a, _) = s.a.reg_mr(s.pda, a_buf, size as u64, all).expect("MR A");
    let (_, rk_b) = s.b.reg_mr(s.pdb, b_buf, size as u64, all).expect("MR B");
    let wqe = abi::SendWqe {
        opcode: op,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: b_buf,
        rkey: rk_b,
        ..Default::default()
    };
    let frames0 = s.a.dev.stats().tx_frames + s.b.dev.stats().tx_frames;
    let (mut posted, mut done) = (0u64, 0u64);
    // Warm up (buffers, pools) before counting.
    let mut t0 = Instant::now();
    let mut allocs0 = ALLOCS.load(Ordering::Relaxed);
    let mut frames_start = frames0;
    let warm = count / 10;
    let now = s.now;
    while done < count {
        while posted < count && posted - done < 32 {
            s.post(
                abi::SendWqe {
                    wr_id: posted,
                    ..wqe
                },
                &[sge(a_buf, size as u32, lk_a)],
            );
            posted += 1;
        }
        s.a.pump(now);
        s.b.pump(now);
        while let Some(c) = s.a.poll_cq(&mut s.ca) {
            assert_eq!(c.status, abi::WC_SUCCESS, "message {}", c.wr_id);
            done += 1;
            if done == warm {
                t0 = Instant::now();
                allocs0 = ALLOCS.load(Ordering::Relaxed);
                frames_start = s.a.dev.stats().tx_frames + s.b.dev.stats().tx_frames;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let allocs = ALLOCS.load(Ordering::Relaxed) - allocs0;
    let frames = s.a.dev.stats().tx_frames + s.b.dev.stats().tx_frames - frames_start;
    let msgs = count - warm;
    let gbps = (msgs * size as u64 * 8) as f64 / secs / 1e9;
    let name = if op == abi::WR_RDMA_WRITE {
        "write"
    } else {
        "read"
    };
    println!(
        "engine_{name}_{size}_gbps={gbps:.2} frames={frames} allocs_per_frame={:.2} retransmits={}",
        allocs as f64 / frames.max(1) as f64,
        s.a.dev.stats().retransmits
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let size = args.next().and_then(|a| a.parse().ok()).unwrap_or(65536);
    let count = args.next().and_then(|a| a.parse().ok()).unwrap_or(4000);
    for op in [abi::WR_RDMA_WRITE, abi::WR_RDMA_READ] {
        run(op, size, count);
    }
}
