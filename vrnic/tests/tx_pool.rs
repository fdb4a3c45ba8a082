//! Issue 10's engine target: once warm, the RC data path allocates nothing
//! per packet. Frame buffers come from the output pool the owner refills
//! with `Device::recycle_tx`, and payloads are gathered straight into them.
//! Allocations are counted per thread by this test binary's global
//! allocator (the test drives both devices from its own thread).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use common::{pool_pair, sge, ConnOpts, RcPair};
use vrnic::abi;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: nothing is counted while the thread is being torn down.
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|n| n.get())
}

/// `n` messages of `op` (64 KiB: 16 packets each at path MTU 4096), 8 at a
/// time; returns (allocations, frames both devices sent) over the run.
fn run(s: &mut RcPair, op: u8, n: u64, a_buf: u64, lk_a: u32, b_buf: u64, rk_b: u32) -> (u64, u64) {
    let frames0 = s.a.dev.stats().tx_frames + s.b.dev.stats().tx_frames;
    let allocs0 = allocs();
    let wqe = abi::SendWqe {
        opcode: op,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: b_buf,
        rkey: rk_b,
        ..Default::default()
    };
    let (mut posted, mut done) = (0, 0);
    for _ in 0..100_000 {
        if done == n {
            break;
        }
        while posted < n && posted - done < 8 {
            let w = abi::SendWqe {
                wr_id: posted,
                ..wqe
            };
            s.post(w, &[sge(a_buf, 65536, lk_a)]);
            posted += 1;
        }
        let now = s.now;
        s.a.pump(now);
        s.b.pump(now);
        while let Some(c) = s.a.poll_cq(&mut s.ca) {
            assert_eq!(c.status, abi::WC_SUCCESS, "message {}", c.wr_id);
            done += 1;
        }
    }
    assert_eq!(done, n, "messages completed");
    let frames = s.a.dev.stats().tx_frames + s.b.dev.stats().tx_frames - frames0;
    (allocs() - allocs0, frames)
}

#[test]
fn rc_write_and_read_allocate_less_than_once_per_four_frames_once_warm() {
    let (la, lb) = pool_pair();
    let o = ConnOpts {
        mtu: 5,
        max_rd_atomic: 8,
        ..ConnOpts::default()
    };
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), o, true);
    let all = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;
    let a_buf = s.a.alloc(65536);
    let b_buf = s.b.alloc(65536);
    let (lk_a, _) = s.a.reg_mr(s.pda, a_buf, 65536, all).expect("MR A");
    let (_, rk_b) = s.b.reg_mr(s.pdb, b_buf, 65536, all).expect("MR B");
    for (op, name) in [(abi::WR_RDMA_WRITE, "WRITE"), (abi::WR_RDMA_READ, "READ")] {
        run(&mut s, op, 50, a_buf, lk_a, b_buf, rk_b); // warm-up
        let (allocs, frames) = run(&mut s, op, 200, a_buf, lk_a, b_buf, rk_b);
        assert!(frames >= 200 * 16, "{name}: {frames} frames");
        // What is left is per message (its SGE list, the test's pumping),
        // not per packet: 16 data packets per message.
        assert!(
            allocs * 4 < frames,
            "{name}: {allocs} allocations for {frames} frames"
        );
    }
}
