//! Work queue rings in DMA memory, shared by queue pairs ([`super::Qp`]:
//! SQ and RQ) and shared receive queues ([`super::Srq`]): ring sizing,
//! slots, and receive WQEs (`struct ibv_recv_wr`, `ibv_post_recv(3)`,
//! `ibv_post_srq_recv(3)`).

use vrnic_abi::{self as abi, Pod};

use super::{ArgError, Result, Sge, VerbsError};
use crate::transport::DmaBuf;

/// A receive work request (`struct ibv_recv_wr`, one element of its list).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvWr<'a> {
    /// Returned in the work completion.
    pub wr_id: u64,
    /// Buffers the incoming message is scattered into, in order.
    pub sg_list: &'a [Sge],
}

/// One work queue ring in DMA memory (a QP's SQ or RQ, or an SRQ).
#[derive(Debug)]
pub(super) struct WorkQueue {
    pub(super) buf: DmaBuf,
    pub(super) size: u32,
    pub(super) stride: u32,
    /// Free-running producer index.
    pub(super) pi: u32,
}

impl WorkQueue {
    /// Pointer to the slot of the producer index after checking for room
    /// against the device's consumer index `ci`.
    pub(super) fn next_slot(&self, ci: u32, queue: &'static str) -> Result<*mut u8> {
        let outstanding = self.pi.wrapping_sub(ci);
        if outstanding >= self.size {
            return Err(VerbsError::QueueFull {
                queue,
                outstanding,
                size: self.size,
            });
        }
        let slot = (self.pi & (self.size - 1)) as usize;
        // SAFETY: slot < size and the buffer holds size * stride bytes.
        Ok(unsafe { self.buf.ptr.add(slot * self.stride as usize) })
    }

    /// Writes receive WQE `wr` at the producer index (room checked against
    /// the consumer index `ci`) and advances the producer index; the caller
    /// rings the doorbell. `max_sge` is the ring's SGE capacity, which the
    /// stride was checked to hold.
    pub(super) fn push_recv(
        &mut self,
        ci: u32,
        queue: &'static str,
        max_sge: u32,
        wr: &RecvWr<'_>,
    ) -> Result<()> {
        if wr.sg_list.len() > max_sge as usize {
            return Err(VerbsError::InvalidArgument(ArgError::TooManySges {
                sges: wr.sg_list.len(),
                queue,
                max: max_sge,
            }));
        }
        let slot = self.next_slot(ci, queue)?;
        let hdr = abi::RecvWqe {
            wr_id: wr.wr_id,
            num_sge: wr.sg_list.len() as u32,
            reserved: 0,
        };
        // SAFETY: the slot holds `stride` bytes, checked at creation to fit
        // the header plus max_sge SGEs.
        unsafe {
            write_bytes(slot, hdr.as_bytes());
            write_sges(slot.add(size_of::<abi::RecvWqe>()), wr.sg_list);
        }
        self.pi = self.pi.wrapping_add(1);
        Ok(())
    }
}

/// Whether `stride`-byte slots hold at least `min` bytes and `size` of
/// them fit in `buf`: the device's strides checked against the ring.
pub(super) fn ring_fits(stride: u32, min: usize, size: u32, buf: &DmaBuf) -> bool {
    stride as usize >= min
        && (stride as usize)
            .checked_mul(size as usize)
            .is_some_and(|b| b <= buf.len)
}

/// Rounds a requested queue depth up to a power of two (at least 1).
/// `EINVAL` beyond `max`, the device's `max_qp_wr` from its configuration
/// space (0: not stated, the device judges), before any ring is allocated:
/// rxe's `rxe_qp_chk_cap` and `rxe_srq_chk_init` refuse such a depth with
/// `EINVAL`, where allocating its ring first could fail with `ENOMEM`.
pub(super) fn ring_size(wr: u32, max: u32, what: &'static str) -> Result<u32> {
    let too_large = VerbsError::InvalidArgument(ArgError::QueueTooLarge { queue: what, wr });
    if max != 0 && wr > max {
        return Err(too_large);
    }
    wr.max(1).checked_next_power_of_two().ok_or(too_large)
}

/// Bytes of a ring of `size` slots of `stride` bytes; `EINVAL` on overflow.
pub(super) fn ring_bytes(size: u32, stride: u32) -> Result<usize> {
    (size as usize)
        .checked_mul(stride as usize)
        .ok_or(VerbsError::InvalidArgument(ArgError::RingTooLarge {
            size,
            stride,
        }))
}

/// Copies `src` to ring memory at `dst`.
///
/// # Safety
/// `dst` is valid for `src.len()` bytes of writes.
pub(super) unsafe fn write_bytes(dst: *mut u8, src: &[u8]) {
    // SAFETY: `dst` is valid for `src.len()` bytes of writes (the
    // caller's contract), and ring memory is no Rust object `src` borrows.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
}

/// Writes `sges` back to back at `dst`.
///
/// # Safety
/// `dst` is valid for `16 * sges.len()` bytes of writes.
pub(super) unsafe fn write_sges(dst: *mut u8, sges: &[Sge]) {
    for (i, s) in sges.iter().enumerate() {
        // SAFETY: SGE `i` of `sges` lies within the `16 * sges.len()` bytes
        // the caller vouches for (an Sge is 16 bytes).
        unsafe { write_bytes(dst.add(i * size_of::<Sge>()), s.as_bytes()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_queue_refuses_a_slot_when_full_and_wraps_slots() {
        let mut mem = vec![0u8; 4 * 64];
        let mut wq = WorkQueue {
            buf: DmaBuf {
                ptr: mem.as_mut_ptr(),
                len: mem.len(),
                gpa: 0,
            },
            size: 4,
            stride: 64,
            pi: 0,
        };
        let base = mem.as_mut_ptr() as usize;
        for i in 0..4u32 {
            let p = wq.next_slot(0, "send queue").unwrap() as usize;
            assert_eq!(p - base, i as usize * 64);
            wq.pi += 1;
        }
        assert!(matches!(
            wq.next_slot(0, "send queue"),
            Err(VerbsError::QueueFull {
                outstanding: 4,
                size: 4,
                ..
            })
        ));
        // The device consumed one: slot 0 again, for producer index 4.
        assert_eq!(wq.next_slot(1, "send queue").unwrap() as usize, base);
        // Free-running indices wrap at 2^32.
        wq.pi = 2;
        assert!(wq.next_slot(u32::MAX - 1, "send queue").is_err());
        assert!(wq.next_slot(u32::MAX, "send queue").is_ok());
    }
}
