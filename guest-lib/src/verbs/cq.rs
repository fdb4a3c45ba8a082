//! Completion queues (`ibv_create_cq(3)`, `ibv_poll_cq(3)`, `ibv_req_notify_cq(3)`).

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrnic_abi::{self as abi, command};

use super::{ArgError, Context, Result, VerbsError, WorkCompletion};
use crate::transport::DmaBuf;

/// A completion queue (`struct ibv_cq`), destroyed (`ibv_destroy_cq(3)`,
/// `CMD_DESTROY_CQ`) when it and every [`super::Qp`] using it are dropped.
///
/// The ring of [`abi::Cqe`] and the doorbell record (the driver's consumer
/// index) are in DMA memory; [`Cq::poll`] reads CQEs by the owner-bit rule
/// without calling the device.
#[derive(Debug)]
pub struct Cq {
    pub(crate) shared: Arc<CqShared>,
    ring: CqRing,
}

/// What a QP needs of its CQs: the number, and the CQ kept alive.
#[derive(Debug)]
pub(crate) struct CqShared {
    ctx: Context,
    pub(crate) cqn: u32,
    /// The ring and the doorbell record, given back once the device
    /// destroyed the CQ.
    dma: [DmaBuf; 2],
}

impl Drop for CqShared {
    fn drop(&mut self) {
        if self.ctx.destroy::<command::DestroyCq>("CQ", self.cqn) {
            self.ctx.release_dma(&self.dma);
        }
    }
}

impl Cq {
    /// Creates a CQ of at least `cqe` entries (`ibv_create_cq(3)`,
    /// `CMD_CREATE_CQ`): the size is rounded up to a power of two, so
    /// [`Cq::capacity`] may exceed `cqe`.
    ///
    /// Errors: `EINVAL` for 0 or more than 2^31 entries, and above the
    /// device's `max_cqe` (its configuration space) before the ring is
    /// allocated, as rxe's `rxe_cq_chk_attr` (allocating first failed with
    /// `ENOMEM` in a guest, where DMA memory is scarcer: pyverbs'
    /// `test_create_cq_bad_flow`); out of DMA memory; the device's status
    /// (`EINVAL` above `max_cqe`, `ENOMEM` at `max_cq`).
    pub fn new(ctx: &Context, cqe: u32) -> Result<Cq> {
        let max = ctx.config().max_cqe;
        if cqe == 0 || cqe > 1 << 31 || (max != 0 && cqe > max) {
            return Err(VerbsError::InvalidArgument(ArgError::CqSize { cqe }));
        }
        let size = cqe.next_power_of_two();
        let ring = ctx.alloc_dma(size as usize * size_of::<abi::Cqe>(), 4096)?;
        let db = ctx
            .alloc_dma(8, 64)
            .inspect_err(|_| ctx.release_dma(&[ring]))?;
        let body = abi::CreateCq {
            cqe: size,
            reserved: 0,
            ring: ring.gpa,
            db: db.gpa,
        };
        let h: abi::Handle = ctx
            .execute::<command::CreateCq>(&body)
            .inspect_err(|e| ctx.release_after_refusal(e, &[ring, db]))?;
        Ok(Cq {
            shared: Arc::new(CqShared {
                ctx: ctx.clone(),
                cqn: h.handle,
                dma: [ring, db],
            }),
            // SAFETY: `ring` holds `size` CQEs and `db` 8 bytes, both 64-byte
            // aligned DMA memory alive as long as the context's transport,
            // which `shared` keeps alive.
            ring: unsafe { CqRing::new(ring, db, size) },
        })
    }

    /// The CQ number the device assigned.
    pub fn cqn(&self) -> u32 {
        self.shared.cqn
    }

    /// The context the CQ belongs to.
    pub fn context(&self) -> &Context {
        &self.shared.ctx
    }

    /// Number of CQEs in the ring.
    pub fn capacity(&self) -> u32 {
        self.ring.size
    }

    /// Polls up to `wc.len()` completions into `wc`, oldest first
    /// (`ibv_poll_cq(3)`); returns how many were written, 0 when the CQ is
    /// empty. Never blocks and never calls the device.
    pub fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        self.ring.poll(wc)
    }

    /// Polls until `n` completions have come or `timeout` has passed,
    /// yielding the CPU between empty polls; returns those that came,
    /// oldest first (fewer than `n` only when `timeout` passed). A loop of
    /// [`Cq::poll`] (`ibv_poll_cq(3)`) for callers that wait for a known
    /// number of completions (tools, tests); it never calls the device.
    pub fn poll_wait(&mut self, n: usize, timeout: Duration) -> Vec<WorkCompletion> {
        poll_wait_with(|wc| self.ring.poll(wc), n, timeout)
    }

    /// Requests a completion event for the next completion, or the next
    /// solicited one (`ibv_req_notify_cq(3)`, doorbell `DB_CQ_ARM` /
    /// `DB_CQ_ARM_SOLICITED`). Events arrive through
    /// [`Context::poll_event`] as `abi::EV_COMP`.
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<()> {
        let kind = if solicited_only {
            abi::DB_CQ_ARM_SOLICITED
        } else {
            abi::DB_CQ_ARM
        };
        let db = abi::Doorbell {
            kind,
            handle: self.shared.cqn,
            index: self.ring.ci,
            ..Default::default()
        };
        self.shared.ctx.doorbell(&db)
    }
}

/// [`Cq::poll_wait`] over any poll function.
fn poll_wait_with(
    mut poll: impl FnMut(&mut [WorkCompletion]) -> usize,
    n: usize,
    timeout: Duration,
) -> Vec<WorkCompletion> {
    let start = Instant::now();
    let mut got = Vec::with_capacity(n);
    let mut wc = [WorkCompletion::default(); 8];
    while got.len() < n {
        let k = poll(&mut wc[..(n - got.len()).min(8)]);
        got.extend_from_slice(&wc[..k]);
        if k == 0 {
            if start.elapsed() >= timeout {
                break;
            }
            std::thread::yield_now();
        }
    }
    got
}

/// The driver side of a CQ ring: the owner-bit rule and the consumer index.
#[derive(Debug)]
struct CqRing {
    ring: *const abi::Cqe,
    db: *const AtomicU32,
    size: u32,
    /// Free-running consumer index.
    ci: u32,
}

// SAFETY: the ring and record pointers refer to DMA memory owned by the
// transport; a CqRing is used by one thread at a time (&mut self).
unsafe impl Send for CqRing {}
// SAFETY: as Send.
unsafe impl Sync for CqRing {}

impl CqRing {
    /// # Safety
    /// `ring` holds `size` (a power of two) 32-byte-aligned CQEs and `db` at
    /// least 8 bytes, 4-byte aligned, both alive as long as the `CqRing`.
    unsafe fn new(ring: DmaBuf, db: DmaBuf, size: u32) -> CqRing {
        debug_assert!(size.is_power_of_two());
        debug_assert!(ring.len >= size as usize * size_of::<abi::Cqe>() && db.len >= 8);
        CqRing {
            ring: ring.ptr.cast(),
            db: db.ptr.cast(),
            size,
            ci: 0,
        }
    }

    /// The owner value a valid CQE at consumer index `ci` carries: 1 on the
    /// first pass through the ring, 0 on the second, and so on.
    fn expected_owner(&self, ci: u32) -> u8 {
        (((ci / self.size) & 1) ^ 1) as u8
    }

    fn poll(&mut self, wc: &mut [WorkCompletion]) -> usize {
        let mut n = 0;
        while n < wc.len() {
            let slot = (self.ci & (self.size - 1)) as usize;
            // SAFETY: slot < size; the ring is valid (constructor contract).
            let cqe = unsafe { self.ring.add(slot) };
            // SAFETY: in bounds and aligned; the device writes `owner` last,
            // so a volatile read sees either the old or the new value.
            let owner = unsafe { std::ptr::addr_of!((*cqe).owner).read_volatile() };
            if owner != self.expected_owner(self.ci) {
                break;
            }
            // Nothing of the CQE body may be read before its owner byte.
            fence(Ordering::Acquire);
            // SAFETY: as above; the device does not rewrite a CQE the driver
            // has not consumed.
            let c = unsafe { cqe.read_volatile() };
            wc[n] = WorkCompletion::from_cqe(&c);
            n += 1;
            self.ci = self.ci.wrapping_add(1);
        }
        if n > 0 {
            // Release: the CQEs were read before the device may reuse their slots.
            // SAFETY: `db` is valid and aligned (constructor contract).
            unsafe { (*self.db).store(self.ci, Ordering::Release) };
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring the test fills by hand, as the device would.
    struct HandRing {
        cqes: Vec<abi::Cqe>,
        db: Box<AtomicU32>,
        ring: CqRing,
    }

    impl HandRing {
        fn new(size: u32) -> HandRing {
            let mut cqes = vec![abi::Cqe::default(); size as usize];
            let db = Box::new(AtomicU32::new(0));
            let rb = DmaBuf {
                ptr: cqes.as_mut_ptr().cast(),
                len: cqes.len() * 32,
                gpa: 0,
            };
            let dbb = DmaBuf {
                ptr: (&*db as *const AtomicU32).cast_mut().cast(),
                len: 8,
                gpa: 0,
            };
            // SAFETY: the Vec and Box outlive the ring (same struct, never
            // reallocated) and are aligned for their types.
            let ring = unsafe { CqRing::new(rb, dbb, size) };
            HandRing { cqes, db, ring }
        }

        /// Writes CQE number `pi` (free-running producer index) as the device does.
        fn produce(&mut self, pi: u32, wr_id: u64) {
            let size = self.cqes.len() as u32;
            let owner = (((pi / size) & 1) ^ 1) as u8;
            let slot = (pi % size) as usize;
            self.cqes[slot] = abi::Cqe {
                wr_id,
                byte_len: pi,
                owner,
                ..Default::default()
            };
        }

        fn consumer_index(&self) -> u32 {
            self.db.load(Ordering::Acquire)
        }
    }

    #[test]
    fn owner_bit_separates_new_cqes_from_stale_ones_across_passes() {
        let mut h = HandRing::new(4);
        let mut wc = [WorkCompletion::default(); 8];

        // Empty ring: all owner bits 0, and pass 0 expects 1.
        assert_eq!(h.ring.poll(&mut wc), 0);
        assert_eq!(h.consumer_index(), 0, "no CQE consumed, no record update");

        // Three CQEs of the first pass; poll two, then the rest.
        for pi in 0..3 {
            h.produce(pi, 100 + u64::from(pi));
        }
        assert_eq!(h.ring.poll(&mut wc[..2]), 2);
        assert_eq!((wc[0].wr_id, wc[1].wr_id), (100, 101));
        assert_eq!(h.consumer_index(), 2);
        assert_eq!(h.ring.poll(&mut wc), 1);
        assert_eq!(wc[0].wr_id, 102);
        assert_eq!(
            h.ring.poll(&mut wc),
            0,
            "slot 3 still holds a stale owner 0"
        );

        // Fill up to the wrap: slot 3 (pass 0, owner 1), then slots 0 and 1
        // of the second pass (owner 0). Slot 2 still carries pass 0's owner 1
        // and must not be taken for a second-pass CQE.
        for pi in 3..6 {
            h.produce(pi, 100 + u64::from(pi));
        }
        assert_eq!(h.ring.poll(&mut wc), 3);
        assert_eq!([wc[0].wr_id, wc[1].wr_id, wc[2].wr_id], [103, 104, 105]);
        assert_eq!([wc[0].byte_len, wc[1].byte_len, wc[2].byte_len], [3, 4, 5]);
        assert_eq!(h.consumer_index(), 6);
        assert_eq!(h.ring.poll(&mut wc), 0, "slot 2 holds a first-pass CQE");

        // Third pass (owner 1 again) after the second completes.
        for pi in 6..9 {
            h.produce(pi, 100 + u64::from(pi));
        }
        assert_eq!(h.ring.poll(&mut wc), 3);
        assert_eq!(wc[2].wr_id, 108);
        assert_eq!(h.consumer_index(), 9);
        assert_eq!(h.ring.poll(&mut wc), 0);
    }

    #[test]
    fn poll_wait_takes_what_is_asked_and_stops_at_its_timeout() {
        let mut h = HandRing::new(16);
        for pi in 0..12 {
            h.produce(pi, u64::from(pi));
        }
        // More than one poll's batch of 8, and no more than asked.
        let got = poll_wait_with(|wc| h.ring.poll(wc), 10, Duration::from_secs(10));
        assert_eq!(
            got.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            (0..10).collect::<Vec<_>>()
        );
        // Two are left: asking for five gives those two once the timeout passed.
        let t0 = Instant::now();
        let got = poll_wait_with(|wc| h.ring.poll(wc), 5, Duration::from_millis(20));
        assert_eq!(
            got.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            vec![10, 11]
        );
        assert!(t0.elapsed() >= Duration::from_millis(20));
        assert_eq!(h.consumer_index(), 12);
    }

    #[test]
    fn consumer_index_wraps_at_u32_without_losing_the_pass_parity() {
        let mut h = HandRing::new(4);
        let start = u32::MAX - 1; // pass (2^32 - 2) / 4: odd, so owner 0
        h.ring.ci = start;
        let mut wc = [WorkCompletion::default(); 4];
        h.produce(start, 1);
        h.produce(start.wrapping_add(1), 2);
        h.produce(start.wrapping_add(2), 3); // index 0 again: pass 0, owner 1
        assert_eq!(h.ring.poll(&mut wc), 3);
        assert_eq!([wc[0].wr_id, wc[1].wr_id, wc[2].wr_id], [1, 2, 3]);
        assert_eq!(h.consumer_index(), 1);
    }
}
