//! Shared receive queues (`ibv_create_srq(3)`, `ibv_modify_srq(3)`,
//! `ibv_query_srq(3)`, `ibv_post_srq_recv(3)`, `ibv_destroy_srq(3)`).

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use vrnic_abi::{self as abi, command};

use super::wq::{ring_bytes, ring_fits, ring_size, RecvWr, WorkQueue};
use super::{ArgError, Context, Pd, ResponseError, Result, Sge, VerbsError};
use crate::transport::DmaBuf;

/// SRQ creation attributes (`struct ibv_srq_init_attr`'s `attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqInitAttr {
    /// Receive work requests outstanding at once (rounded up to a power of
    /// two, at most the device's `max_qp_wr`).
    pub max_wr: u32,
    /// SGEs per receive work request (at least 1, at most `max_sge`).
    pub max_sge: u32,
    /// Limit armed at creation: `EV_SRQ_LIMIT` fires once when fewer than
    /// this many receive WQEs remain posted (0 = not armed; at most
    /// `max_wr`). `ibv_create_srq(3)` calls this field irrelevant; vrnic,
    /// like rxe, arms it.
    pub srq_limit: u32,
}

/// SRQ attributes (`struct ibv_srq_attr`) for [`Srq::modify`] and from
/// [`Srq::query`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqAttr {
    /// Ring slots (receive work requests outstanding at once).
    pub max_wr: u32,
    /// SGEs per receive work request.
    pub max_sge: u32,
    /// The armed limit; 0 when disarmed (it disarms when it fires).
    pub srq_limit: u32,
}

/// What QPs need of their SRQ: the number, and the SRQ kept alive. The
/// device's SRQ is destroyed when the last holder goes.
#[derive(Debug)]
pub(crate) struct SrqShared {
    pub(crate) ctx: Context,
    _pd: Pd,
    pub(crate) srqn: u32,
    /// The ring and the record, given back once the device destroyed the
    /// SRQ.
    dma: [DmaBuf; 2],
}

impl Drop for SrqShared {
    fn drop(&mut self) {
        if self.ctx.destroy::<command::DestroySrq>("SRQ", self.srqn) {
            self.ctx.release_dma(&self.dma);
        }
    }
}

/// A shared receive queue (`struct ibv_srq`): one ring of receive WQEs that
/// the QPs created with [`super::QpInitAttr::srq`] take from in arrival
/// order (IBTA Vol 1 §10.2.9). It is destroyed (`ibv_destroy_srq(3)`,
/// `CMD_DESTROY_SRQ`) when it and every QP using it are dropped, and keeps
/// its [`Pd`] alive.
///
/// The ring (`max_wr` slots of `abi::rq_stride(max_sge)` bytes) and the
/// 8-byte SRQ record (the device-written consumer index at offset 0) live
/// in DMA memory; [`Srq::post_recv`] writes a WQE and rings `DB_SRQ`.
///
/// A completion for a receive taken from the SRQ names the QP the message
/// arrived on in [`super::WorkCompletion::qp_num`], on that QP's receive
/// CQ. When a QP on the SRQ moves to ERR its messages in progress are
/// flushed, the WQEs still on the SRQ stay for the other QPs, and
/// `EV_QP_LAST_WQE_REACHED` names the QP ([`Context::poll_event`]).
#[derive(Debug)]
pub struct Srq {
    pub(crate) shared: Arc<SrqShared>,
    ring: WorkQueue,
    max_sge: u32,
    /// SRQ record: device-written consumer index at 0.
    record: DmaBuf,
}

// SAFETY: the ring and record are DMA memory owned by the transport (kept
// alive through `shared.ctx`); posting takes &mut self.
unsafe impl Send for Srq {}

impl Srq {
    /// Creates an SRQ in `pd` (`ibv_create_srq(3)`, `CMD_CREATE_SRQ`): a
    /// ring of `max_wr` slots rounded up to a power of two and the SRQ
    /// record, in DMA memory. The actual sizes are [`Srq::max_wr`] and
    /// [`Srq::max_sge`].
    ///
    /// Errors: `EINVAL` for more than 255 SGEs or impossible sizes; out of
    /// DMA memory; the device's status (`EINVAL` beyond `max_qp_wr` or
    /// `max_sge`, or for a `srq_limit` above the ring size; `ENOMEM` at
    /// `max_srq` or when the ring would exceed the device's `max_total_wr`
    /// ring entries); [`VerbsError::BadResponse`] when the
    /// device's stride or size does not fit the ring.
    pub fn new(pd: &Pd, init: &SrqInitAttr) -> Result<Srq> {
        let ctx = pd.context().clone();
        let max_sge = init.max_sge.max(1);
        if max_sge > 255 {
            return Err(VerbsError::InvalidArgument(ArgError::SrqSges {
                sges: max_sge,
            }));
        }
        let size = ring_size(init.max_wr, ctx.config().max_qp_wr, "shared receive queue")?;
        let ring = ctx.alloc_dma(ring_bytes(size, abi::rq_stride(max_sge))?, 4096)?;
        let record = ctx
            .alloc_dma(8, 64)
            .inspect_err(|_| ctx.release_dma(&[ring]))?;
        let body = abi::CreateSrq {
            pdn: pd.pdn(),
            max_wr: size,
            max_sge,
            srq_limit: init.srq_limit,
            ring: ring.gpa,
            db: record.gpa,
        };
        let resp: abi::CreateSrqResp = ctx
            .execute::<command::CreateSrq>(&body)
            .inspect_err(|e| ctx.release_after_refusal(e, &[ring, record]))?;
        let srq = Srq {
            shared: Arc::new(SrqShared {
                ctx,
                _pd: pd.clone(),
                srqn: resp.srqn,
                dma: [ring, record],
            }),
            ring: WorkQueue {
                buf: ring,
                size,
                stride: resp.stride,
                pi: 0,
            },
            max_sge,
            record,
        };
        // From here on, dropping `srq` destroys the device's SRQ.
        let min = size_of::<abi::RecvWqe>() + size_of::<Sge>() * max_sge as usize;
        if resp.max_wr != size || !ring_fits(resp.stride, min, size, &srq.ring.buf) {
            return Err(VerbsError::BadResponse(ResponseError::SrqRing {
                max_wr: resp.max_wr,
                stride: resp.stride,
                size,
                max_sge,
            }));
        }
        Ok(srq)
    }

    /// The SRQ number the device assigned.
    pub fn srq_num(&self) -> u32 {
        self.shared.srqn
    }

    /// Ring slots: `max_wr` after rounding up to a power of two.
    pub fn max_wr(&self) -> u32 {
        self.ring.size
    }

    /// SGEs per receive work request.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The device's consumer index, from the SRQ record.
    fn consumer_index(&self) -> u32 {
        // SAFETY: the record is 8 bytes of 64-byte-aligned DMA memory kept
        // alive through `shared.ctx`; the device writes it with 32-bit
        // stores. Acquire: a consumed slot is free only after the device
        // finished reading it.
        unsafe { (*self.record.ptr.cast::<AtomicU32>()).load(Ordering::Acquire) }
    }

    /// Posts one receive work request (`ibv_post_srq_recv(3)`): writes the
    /// WQE at slot `pi mod max_wr`, then rings `DB_SRQ` with the new
    /// producer index. Any QP on the SRQ may consume it; a UD QP's receive
    /// starts with the [`super::GRH_LEN`]-byte GRH area.
    ///
    /// Errors: [`VerbsError::QueueFull`] (`ENOMEM`) when `max_wr` requests
    /// are posted and not consumed; `EINVAL` for more SGEs than `max_sge`;
    /// the transport's doorbell error. Nothing is posted on error.
    pub fn post_recv(&mut self, wr: &RecvWr<'_>) -> Result<()> {
        let ci = self.consumer_index();
        self.ring
            .push_recv(ci, "shared receive queue", self.max_sge, wr)?;
        // The device must see the WQE before the producer index that covers it.
        fence(Ordering::Release);
        let db = abi::Doorbell {
            kind: abi::DB_SRQ,
            handle: self.shared.srqn,
            index: self.ring.pi,
            ..Default::default()
        };
        self.shared.ctx.doorbell(&db)
    }

    /// Receive work requests posted and not yet taken by the device (as far
    /// as the SRQ record tells).
    pub fn outstanding(&self) -> u32 {
        self.ring.pi.wrapping_sub(self.consumer_index())
    }

    /// Modifies the SRQ (`ibv_modify_srq(3)`, `CMD_MODIFY_SRQ`): applies the
    /// fields of `attr` named by `mask` (`SRQ_ATTR_*`). With
    /// `SRQ_ATTR_LIMIT` it arms the limit: `EV_SRQ_LIMIT` (with the SRQ
    /// number) fires once when fewer than `attr.srq_limit` receive WQEs
    /// remain posted, and the limit disarms; 0 disarms.
    ///
    /// Errors: `EOPNOTSUPP` for `SRQ_ATTR_MAX_WR` (vrnic does not resize
    /// SRQs, as `IBV_DEVICE_SRQ_RESIZE` would announce); `EINVAL` for other
    /// mask bits or a limit above `max_wr`.
    pub fn modify(&mut self, attr: &SrqAttr, mask: u32) -> Result<()> {
        let body = abi::SrqAttr {
            srqn: self.shared.srqn,
            attr_mask: mask,
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            srq_limit: attr.srq_limit,
            reserved: 0,
        };
        self.shared.ctx.execute::<command::ModifySrq>(&body)
    }

    /// Arms the limit event at `limit` WQEs: [`Srq::modify`] with
    /// `SRQ_ATTR_LIMIT` (`ibv_modify_srq(srq, {.srq_limit = limit},
    /// IBV_SRQ_LIMIT)`).
    pub fn arm_limit(&mut self, limit: u32) -> Result<()> {
        let attr = SrqAttr {
            srq_limit: limit,
            ..Default::default()
        };
        self.modify(&attr, abi::SRQ_ATTR_LIMIT)
    }

    /// The SRQ's current attributes (`ibv_query_srq(3)`, `CMD_QUERY_SRQ`):
    /// ring slots, SGEs per WQE and the armed limit (0 once it fired).
    pub fn query(&self) -> Result<SrqAttr> {
        let body = abi::Handle {
            handle: self.shared.srqn,
            reserved: 0,
        };
        let a: abi::SrqAttr = self.shared.ctx.execute::<command::QuerySrq>(&body)?;
        Ok(SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        })
    }
}
