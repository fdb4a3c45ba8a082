//! The driver's full memory barrier against the device.
//!
//! Notification suppression on both sides of the device is a two-sided
//! pattern (virtio 1.2 §2.7.10 and §2.7.13.3; doorbell records, device
//! spec §5.x.6.9): the driver writes (an avail index, a producer index),
//! then reads what the device wrote (`VIRTQ_USED_F_NO_NOTIFY`,
//! `QP_REC_POLLED`); the device writes that flag, then reads the index.
//! Each side needs a full barrier between its write and its read, or both
//! may read the old values: the driver leaves its doorbell or kick out
//! and the device never looks.
//!
//! [`mb`] is that barrier. On x86-64 it is an `mfence`, not Rust's
//! `fence(SeqCst)`, which LLVM emits as a `lock or` to the stack there.
//! Both are full barriers on a real CPU, but QEMU's TCG translates a
//! locked instruction of a guest with one vCPU (`-smp 1`: no
//! `CF_PARALLEL`) as a plain load and store, with no host barrier, so the
//! guest's write could still sit in the host CPU's store buffer when the
//! guest read the device's flag. `mfence` always becomes a host barrier
//! under TCG (`tcg_gen_mb`: "even with a single cpu we have i/o threads
//! running in parallel"). Between two TCG guests this lost doorbell-record
//! updates (an `ib_read_lat` hang, 2 runs of 7) and virtqueue kicks (the
//! worker's `serve_late`, vhost `spin.rs`). The Linux kernel's `mb()` is an
//! `mfence` too.

/// A full memory barrier between this driver's accesses to memory the
/// device also reads and writes: no load after it is performed before a
/// store before it is visible to the device (on the host's CPUs, also
/// under QEMU's TCG; see the module). Also a compiler barrier.
#[inline]
pub fn mb() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `mfence` (SSE2, part of x86-64) has no operands and touches
    // no register or flag; it orders memory accesses, which the asm block
    // may do as far as the compiler knows (no `nomem`): a compiler barrier.
    unsafe {
        std::arch::asm!("mfence", options(nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// The store-buffering litmus test: each round, this thread writes x
    /// then, after [`mb`], reads y, while another writes y then, after
    /// `fence(SeqCst)`, reads x. Without a full barrier on this side, x86
    /// lets both read the old value now and then; with one, never.
    #[test]
    fn a_store_before_mb_is_seen_or_sees_the_other_side() {
        const ROUNDS: u32 = 100_000;
        let shared = Arc::new([const { AtomicU32::new(0) }; 5]);
        let [x, y, go, done, seen_x] = [0, 1, 2, 3, 4];
        let s = shared.clone();
        let other = std::thread::spawn(move || {
            for r in 1..=ROUNDS {
                let t0 = std::time::Instant::now();
                while s[go].load(Ordering::Acquire) != r {
                    assert!(t0.elapsed().as_secs() < 10, "the test thread stalled");
                    std::hint::spin_loop();
                }
                s[y].store(r, Ordering::Relaxed);
                std::sync::atomic::fence(Ordering::SeqCst);
                s[seen_x].store(s[x].load(Ordering::Relaxed), Ordering::Relaxed);
                s[done].store(r, Ordering::Release);
            }
        });
        let mut both_old = 0;
        for r in 1..=ROUNDS {
            shared[go].store(r, Ordering::Release);
            shared[x].store(r, Ordering::Relaxed);
            mb();
            let saw_y = shared[y].load(Ordering::Relaxed);
            let t0 = std::time::Instant::now();
            while shared[done].load(Ordering::Acquire) != r {
                assert!(t0.elapsed().as_secs() < 10, "the other thread stalled");
                std::hint::spin_loop();
            }
            if saw_y != r && shared[seen_x].load(Ordering::Relaxed) != r {
                both_old += 1;
            }
        }
        other.join().unwrap();
        assert_eq!(
            both_old, 0,
            "rounds in which neither side saw the other's write"
        );
    }
}
