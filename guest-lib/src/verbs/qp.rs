//! Queue pairs (`ibv_create_qp(3)`, `ibv_modify_qp(3)`, `ibv_query_qp(3)`,
//! `ibv_post_send(3)`, `ibv_post_recv(3)`).

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use vrnic_abi::{self as abi, command, Pod};

use super::cq::CqShared;
use super::srq::{Srq, SrqShared};
use super::wq::{ring_bytes, ring_fits, ring_size, write_bytes, write_sges, RecvWr, WorkQueue};
use super::{AhAttr, ArgError, Context, Cq, Gid, Pd, ResponseError, Result, Sge, VerbsError};
use crate::transport::DmaBuf;

/// `ibv_qp_type`, `ibv_qp_state` and `ibv_wr_opcode`: the device ABI's
/// typed values ([`vrnic_abi`]), shared with the device, so the driver and
/// the device cannot disagree on a code. Their raw values are
/// [`QpType::raw`] etc.; `TryFrom` converts back (unknown values are an
/// error).
pub use vrnic_abi::{QpState, QpType, WrOpcode};

/// QP capacities (`struct ibv_qp_cap`): requested at creation, actual from
/// [`Qp::cap`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCap {
    /// Send work requests outstanding at once (rounded up to a power of two).
    pub max_send_wr: u32,
    /// Receive work requests outstanding at once (rounded up to a power of two).
    pub max_recv_wr: u32,
    /// SGEs per send work request (at least 1).
    pub max_send_sge: u32,
    /// SGEs per receive work request (at least 1).
    pub max_recv_sge: u32,
    /// Inline data per send work request, bytes.
    pub max_inline_data: u32,
}

/// QP creation attributes (`struct ibv_qp_init_attr`).
#[derive(Clone, Copy, Debug)]
pub struct QpInitAttr<'a> {
    /// Transport service.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions (may be the same as `send_cq`).
    pub recv_cq: &'a Cq,
    /// Shared receive queue (`ibv_qp_init_attr.srq`, RC and UD QPs): the QP
    /// takes its receive WQEs from it and has no receive queue of its own,
    /// so `cap.max_recv_wr` and `cap.max_recv_sge` are ignored and
    /// [`Qp::post_recv`] fails; post with [`Srq::post_recv`]. The SRQ must
    /// be of the QP's PD and context.
    pub srq: Option<&'a Srq>,
    /// Requested capacities.
    pub cap: QpCap,
    /// Every send work request completes with a CQE, signalled or not.
    pub sq_sig_all: bool,
}

/// QP attributes for [`Qp::modify`] and [`Qp::query`] (`struct
/// ibv_qp_attr`). Only the fields named by the mask (`QP_ATTR_*`,
/// `ibv_qp_attr_mask`) are applied; the required and allowed masks of each
/// transition are those of `ibv_modify_qp(3)` (IBTA Vol 1 Table 91), and
/// anything else fails with `EINVAL`.
///
/// RC (`ibv_rc_pingpong`'s transitions):
/// - INIT: `qp_state`, `pkey_index` 0, `port_num` 1, `qp_access_flags`;
///   mask `STATE | PKEY_INDEX | PORT | ACCESS_FLAGS`.
/// - RTR: `qp_state`, `path_mtu`, `dest_qp_num`, `rq_psn`,
///   `max_dest_rd_atomic` 1, `min_rnr_timer` 12, `ah_attr`; mask `STATE |
///   AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER`.
/// - RTS: `qp_state`, `timeout` 14, `retry_cnt` 7, `rnr_retry` 7, `sq_psn`,
///   `max_rd_atomic` 1; mask `STATE | TIMEOUT | RETRY_CNT | RNR_RETRY |
///   SQ_PSN | MAX_QP_RD_ATOMIC`.
///
/// UC: as RC without the RDMA READ/atomic, retry and RNR attributes —
/// INIT `STATE | PKEY_INDEX | PORT | ACCESS_FLAGS`; RTR `STATE | AV |
/// PATH_MTU | DEST_QPN | RQ_PSN`; RTS `STATE | SQ_PSN`.
///
/// UD (`ibv_ud_pingpong`'s transitions): INIT `STATE | PKEY_INDEX | PORT |
/// QKEY` (the Q_Key receives must carry, e.g. 0x11111111); RTR `STATE`;
/// RTS `STATE | SQ_PSN`. Destinations are per work request ([`UdWr`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: QpState,
    /// Path MTU as `ibv_mtu` (1 = 256 .. 5 = 4096 bytes; `abi::mtu_enum`).
    pub path_mtu: u32,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected PSN of the next incoming request, 24 bits.
    pub rq_psn: u32,
    /// PSN of the next request sent, 24 bits.
    pub sq_psn: u32,
    /// Remote QP number, 24 bits.
    pub dest_qp_num: u32,
    /// `ACCESS_REMOTE_*` flags allowed to incoming requests.
    pub qp_access_flags: u32,
    /// Address vector.
    pub ah_attr: AhAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port number (1).
    pub port_num: u8,
    /// Local ACK timeout: 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Retries on timeout (0..7).
    pub retry_cnt: u8,
    /// Retries on RNR NAK (0..6, 7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer field (IBTA Table 45; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READ/atomic as requester.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic as responder.
    pub max_dest_rd_atomic: u8,
}

/// What RC's RTR and RTS transitions need from the out-of-band exchange
/// (`ibv_rc_pingpong`'s `pp_dest`: the peer's QPN, PSN and GID) and the
/// attributes `ibv_rc_pingpong` sets beside them; [`Qp::connect_rc`] applies
/// it. [`RcPath::new`] fills in rc_pingpong's values; change fields before
/// use where a program differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcPath {
    /// Address vector to the peer (GRH with its GID for RoCE).
    pub ah: AhAttr,
    /// Path MTU as `ibv_mtu` (3 = 1024 bytes).
    pub path_mtu: u32,
    /// The peer's QP number.
    pub dest_qp_num: u32,
    /// The peer's initial send PSN (our receive PSN), 24 bits.
    pub rq_psn: u32,
    /// Our initial send PSN, 24 bits.
    pub sq_psn: u32,
    /// Local ACK timeout exponent (14: 4.096 µs × 2^14 ≈ 67 ms).
    pub timeout: u8,
    /// Retries on timeout (7).
    pub retry_cnt: u8,
    /// Retries on RNR NAK (7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer field (12 = 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READ/atomic as requester (1).
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic as responder (1).
    pub max_dest_rd_atomic: u8,
}

impl RcPath {
    /// rc_pingpong's path to the peer with GID `dgid` from our GID at
    /// `sgid_index` (hop limit 64), QP `dest_qp_num` whose first PSN is
    /// `rq_psn`, ours `sq_psn`, path MTU `path_mtu` (`ibv_mtu`).
    pub fn new(
        dgid: Gid,
        sgid_index: u8,
        dest_qp_num: u32,
        rq_psn: u32,
        sq_psn: u32,
        path_mtu: u32,
    ) -> Self {
        RcPath {
            ah: AhAttr {
                dgid,
                sgid_index,
                hop_limit: 64,
                is_global: true,
                port_num: 1,
                ..Default::default()
            },
            path_mtu,
            dest_qp_num,
            rq_psn,
            sq_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }
}

impl QpAttr {
    fn to_abi(self, qpn: u32, mask: u32) -> abi::QpAttr {
        let ah = self.ah_attr;
        abi::QpAttr {
            qpn,
            attr_mask: mask,
            qp_state: self.qp_state.raw(),
            path_mtu: self.path_mtu,
            qkey: self.qkey,
            rq_psn: self.rq_psn,
            sq_psn: self.sq_psn,
            dest_qp_num: self.dest_qp_num,
            qp_access_flags: self.qp_access_flags,
            flow_label: ah.flow_label,
            dgid: ah.dgid.raw,
            pkey_index: self.pkey_index,
            port_num: self.port_num,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            sgid_index: ah.sgid_index,
            hop_limit: ah.hop_limit,
            traffic_class: ah.traffic_class,
            sl: ah.sl,
            is_global: ah.is_global.into(),
            reserved: [0; 2],
        }
    }

    fn from_abi(a: &abi::QpAttr) -> Result<QpAttr> {
        let qp_state = QpState::try_from(a.qp_state)
            .map_err(|_| VerbsError::BadResponse(ResponseError::QpState(a.qp_state)))?;
        Ok(QpAttr {
            qp_state,
            path_mtu: a.path_mtu,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags,
            ah_attr: AhAttr {
                dgid: Gid { raw: a.dgid },
                flow_label: a.flow_label,
                sgid_index: a.sgid_index,
                hop_limit: a.hop_limit,
                traffic_class: a.traffic_class,
                sl: a.sl,
                is_global: a.is_global != 0,
                port_num: a.port_num,
            },
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
        })
    }
}

/// Remote side of an RDMA work request (`ibv_send_wr.wr.rdma`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RdmaWr {
    /// Remote virtual address (inside the peer's MR).
    pub remote_addr: u64,
    /// The peer MR's rkey.
    pub rkey: u32,
}

/// Remote side and operands of an atomic work request (`ibv_send_wr.wr.atomic`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AtomicWr {
    /// Remote virtual address, 8-byte aligned.
    pub remote_addr: u64,
    /// The peer MR's rkey.
    pub rkey: u32,
    /// Compare value (CAS) or addend (FAA).
    pub compare_add: u64,
    /// Swap value (CAS).
    pub swap: u64,
}

/// Destination of a UD send (`ibv_send_wr.wr.ud`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdWr {
    /// Address handle: [`super::Ah::handle`] of an AH of the QP's PD (a
    /// missing one completes with `WC_LOC_QP_OP_ERR`).
    pub ah: u32,
    /// Destination QP number (24 bits).
    pub remote_qpn: u32,
    /// Destination Q_Key. With its most significant bit set the QP's own
    /// Q_Key is sent instead (IBTA §10.2.5, "controlled Q_Key").
    pub remote_qkey: u32,
}

/// A send work request (`struct ibv_send_wr`, one element of its list).
#[derive(Clone, Copy, Debug, Default)]
pub struct SendWr<'a> {
    /// Returned in the work completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// `SEND_FENCE`, `SEND_SIGNALED`, `SEND_SOLICITED`. `SEND_INLINE` is set
    /// by [`SendWr::inline_data`], not here.
    pub send_flags: u8,
    /// Local buffers (addresses inside MRs of the QP's PD).
    pub sg_list: &'a [Sge],
    /// Data carried in the work request itself (`IBV_SEND_INLINE`): copied
    /// at post time, so the memory may be reused at once; needs no MR. At
    /// most [`QpCap::max_inline_data`] bytes; `sg_list` must then be empty.
    pub inline_data: Option<&'a [u8]>,
    /// Immediate data in host order (sent in network order), for the
    /// `*WithImm` opcodes; the rkey to invalidate for `SendWithInv`.
    pub imm_data: u32,
    /// Remote side of RDMA WRITE and READ.
    pub rdma: RdmaWr,
    /// Remote side and operands of atomics.
    pub atomic: AtomicWr,
    /// Destination of UD sends.
    pub ud: UdWr,
}

impl SendWr<'_> {
    /// The send WQE header of this work request (`abi::SendWqe`, without
    /// the SGEs or inline bytes that follow it in the ring): `imm_data` in
    /// network order, the remote address and rkey of [`SendWr::atomic`]
    /// for atomics and of [`SendWr::rdma`] otherwise, the UD destination
    /// of [`SendWr::ud`], and `SEND_INLINE` set exactly when there is
    /// inline data. Assumes the checks of [`Qp::post_send`] passed (at most
    /// 255 SGEs).
    fn to_wqe(self) -> abi::SendWqe {
        let (remote_addr, rkey) = if self.opcode.is_atomic() {
            (self.atomic.remote_addr, self.atomic.rkey)
        } else {
            (self.rdma.remote_addr, self.rdma.rkey)
        };
        let inline = self.inline_data.map_or(0, <[u8]>::len);
        abi::SendWqe {
            wr_id: self.wr_id,
            opcode: self.opcode.raw(),
            send_flags: self.send_flags
                | if self.inline_data.is_some() {
                    abi::SEND_INLINE
                } else {
                    0
                },
            num_sge: self.sg_list.len() as u8,
            reserved: 0,
            imm_data: self.imm_data.to_be_bytes(),
            remote_addr,
            rkey,
            inline_len: inline as u32,
            compare_add: self.atomic.compare_add,
            swap: self.atomic.swap,
            remote_qpn: self.ud.remote_qpn,
            remote_qkey: self.ud.remote_qkey,
            ah: self.ud.ah,
            reserved2: 0,
        }
    }
}

/// A queue pair (`struct ibv_qp`), destroyed (`ibv_destroy_qp(3)`,
/// `CMD_DESTROY_QP`) on drop. Created in RESET; take it to RTS with
/// [`Qp::modify`]. Posting writes WQEs into rings in DMA memory and rings
/// a doorbell; it never waits for the device.
#[derive(Debug)]
pub struct Qp {
    ctx: Context,
    pd: Pd,
    _send_cq: Arc<CqShared>,
    _recv_cq: Arc<CqShared>,
    /// The SRQ the QP receives from (kept alive: the device refuses to
    /// destroy an SRQ a QP uses).
    srq: Option<Arc<SrqShared>>,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    sq: WorkQueue,
    /// The QP's own receive queue; `None` on an SRQ.
    rq: Option<WorkQueue>,
    /// QP record: device-written SQ consumer index at 0, RQ at 4; with
    /// `sq_record`, the SQ producer index written here at 8; the device's
    /// flags at 12; with `rq_record` (32 bytes then), the RQ producer
    /// index at 16.
    record: DmaBuf,
    /// Created with [`abi::QP_F_SQ_RECORD`]: see [`Qp::announce`].
    sq_record: bool,
    /// Created with [`abi::QP_F_RQ_RECORD`] (QPs without an SRQ).
    rq_record: bool,
    /// The state the last successful [`Qp::modify`] moved it to (RESET at
    /// creation): what posting checks. The device may move it on to SQE
    /// or ERR by itself; both accept posts (they flush).
    state: QpState,
}

/// Whether QPs ask for doorbell records ([`abi::QP_F_SQ_RECORD`],
/// [`abi::QP_F_RQ_RECORD`]) where the transport uses them
/// ([`crate::transport::Transport::doorbell_records`]): unless
/// `VRNIC_DB_RECORDS=0` (for comparisons and diagnosis).
fn records_wanted() -> bool {
    std::env::var_os("VRNIC_DB_RECORDS").is_none_or(|v| v != "0")
}

// SAFETY: the rings and record are DMA memory owned by the transport (kept
// alive through `ctx`); posting takes &mut self.
unsafe impl Send for Qp {}

impl Qp {
    /// Creates a QP in RESET (`ibv_create_qp(3)`, `CMD_CREATE_QP`): SQ and RQ
    /// rings of `max_send_wr` / `max_recv_wr` slots rounded up to powers of
    /// two, slots of `abi::sq_stride` / `abi::rq_stride` bytes, and the QP
    /// record, all in DMA memory. With [`QpInitAttr::srq`] there is no RQ
    /// (`CreateQp.rq_size` 0, `srqn` the SRQ's number) and [`Qp::cap`]
    /// reports 0 receive work requests and SGEs. The device's answer (QP
    /// number, strides, inline size) is in [`Qp::qp_num`] and [`Qp::cap`].
    ///
    /// Errors: `EINVAL` for impossible sizes or an SRQ of another context;
    /// out of DMA memory; the device's status (`EINVAL` beyond `max_qp_wr`,
    /// `max_sge` or `max_inline`, for an SRQ of another PD; `ENOENT` for a
    /// CQ or SRQ
    /// the device does not know; `ENOMEM` at `max_qp` or when the rings
    /// would exceed the device's `max_total_wr` ring entries);
    /// [`VerbsError::BadResponse`] when the device's strides exceed the rings.
    pub fn new(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        let ctx = pd.context().clone();
        let cap = init.cap;
        let srq = init.srq.map(|s| s.shared.clone());
        if let Some(s) = &srq {
            if !s.ctx.same_device(&ctx) {
                return Err(VerbsError::InvalidArgument(ArgError::ForeignSrq));
            }
        }
        let send_sge = cap.max_send_sge.max(1);
        let recv_sge = if srq.is_some() {
            0
        } else {
            cap.max_recv_sge.max(1)
        };
        if send_sge > 255 || recv_sge > 255 {
            return Err(VerbsError::InvalidArgument(ArgError::QpSges {
                send: send_sge,
                recv: recv_sge,
            }));
        }
        let max_wr = ctx.config().max_qp_wr;
        let sq_size = ring_size(cap.max_send_wr, max_wr, "send queue")?;
        let rq_size = match srq {
            Some(_) => 0,
            None => ring_size(cap.max_recv_wr, max_wr, "receive queue")?,
        };
        let sq_stride = abi::sq_stride(send_sge, cap.max_inline_data);
        let rq_bytes = match srq {
            Some(_) => None,
            None => Some(ring_bytes(rq_size, abi::rq_stride(recv_sge))?),
        };
        let sq = ctx.alloc_dma(ring_bytes(sq_size, sq_stride)?, 4096)?;
        let rq = match rq_bytes {
            None => None,
            Some(bytes) => Some(
                ctx.alloc_dma(bytes, 4096)
                    .inspect_err(|_| ctx.release_dma(&[sq]))?,
            ),
        };
        // Doorbell records where the transport uses them; an RQ record
        // only with an RQ of its own.
        let flags = match (ctx.doorbell_records() && records_wanted(), srq.is_none()) {
            (false, _) => 0,
            (true, false) => abi::QP_F_SQ_RECORD,
            (true, true) => abi::QP_F_SQ_RECORD | abi::QP_F_RQ_RECORD,
        };
        let record = ctx
            .alloc_dma(abi::qp_record_len(flags) as usize, 64)
            .inspect_err(|_| {
                ctx.release_dma(&[Some(sq), rq].into_iter().flatten().collect::<Vec<_>>())
            })?;
        let body = abi::CreateQp {
            pdn: pd.pdn(),
            qp_type: init.qp_type.raw(),
            send_cqn: init.send_cq.cqn(),
            recv_cqn: init.recv_cq.cqn(),
            sq_size,
            rq_size,
            max_send_sge: send_sge,
            max_recv_sge: recv_sge,
            max_inline: cap.max_inline_data,
            sq_sig_all: init.sq_sig_all.into(),
            sq: sq.gpa,
            rq: rq.map_or(0, |b| b.gpa),
            db: record.gpa,
            srqn: srq.as_ref().map_or(0, |s| s.srqn),
            flags,
        };
        let resp: abi::CreateQpResp = ctx.execute::<command::CreateQp>(&body).inspect_err(|e| {
            let bufs: Vec<DmaBuf> = [Some(sq), rq, Some(record)].into_iter().flatten().collect();
            ctx.release_after_refusal(e, &bufs)
        })?;
        let qp = Qp {
            ctx: ctx.clone(),
            pd: pd.clone(),
            _send_cq: init.send_cq.shared.clone(),
            _recv_cq: init.recv_cq.shared.clone(),
            srq,
            qpn: resp.qpn,
            qp_type: init.qp_type,
            cap: QpCap {
                max_send_wr: sq_size,
                max_recv_wr: rq_size,
                max_send_sge: send_sge,
                max_recv_sge: recv_sge,
                max_inline_data: granted_inline(resp.max_inline, ctx.config().max_inline),
            },
            sq: WorkQueue {
                buf: sq,
                size: sq_size,
                stride: resp.sq_stride,
                pi: 0,
            },
            rq: rq.map(|buf| WorkQueue {
                buf,
                size: rq_size,
                stride: resp.rq_stride,
                pi: 0,
            }),
            record,
            sq_record: flags & abi::QP_F_SQ_RECORD != 0,
            rq_record: flags & abi::QP_F_RQ_RECORD != 0,
            state: QpState::Reset,
        };
        // From here on, dropping `qp` destroys the device's QP.
        let min_send = size_of::<abi::SendWqe>()
            + (resp.max_inline as usize).max(size_of::<Sge>() * send_sge as usize);
        let min_recv = size_of::<abi::RecvWqe>() + size_of::<Sge>() * recv_sge as usize;
        let rq_ok = qp
            .rq
            .as_ref()
            .is_none_or(|rq| ring_fits(resp.rq_stride, min_recv, rq_size, &rq.buf));
        if !ring_fits(resp.sq_stride, min_send, sq_size, &qp.sq.buf) || !rq_ok {
            return Err(VerbsError::BadResponse(ResponseError::QpStrides {
                sq_stride: resp.sq_stride,
                rq_stride: resp.rq_stride,
                max_inline: resp.max_inline,
                sq_size,
                rq_size,
            }));
        }
        Ok(qp)
    }

    /// The QP number (24 bits) the device assigned (`ibv_qp.qp_num`).
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The transport service.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Actual capacities (`ibv_query_qp(3)` with `IBV_QP_CAP`): queue depths
    /// after rounding and the inline size the device granted.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// The PD the QP belongs to.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The number of the SRQ the QP receives from ([`QpInitAttr::srq`]),
    /// `None` when it has its own receive queue.
    pub fn srq_num(&self) -> Option<u32> {
        self.srq.as_ref().map(|s| s.srqn)
    }

    /// Modifies the QP (`ibv_modify_qp(3)`, `CMD_MODIFY_QP`): applies the
    /// fields of `attr` named by `mask` (`QP_ATTR_*`). See [`QpAttr`] for the
    /// RESET→INIT→RTR→RTS sequence. A move to RESET discards every posted
    /// work request without a completion and restarts the rings: the
    /// producer indices go back to 0 here, the device's consumer indices
    /// (and the QP record) there.
    ///
    /// Errors: the device's status (`EINVAL` for a transition or attribute
    /// the QP state machine does not allow).
    pub fn modify(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        let body = attr.to_abi(self.qpn, mask);
        self.ctx.execute::<command::ModifyQp>(&body)?;
        if mask & abi::QP_ATTR_STATE != 0 {
            self.state = attr.qp_state;
            if attr.qp_state == QpState::Reset {
                self.sq.pi = 0;
                if let Some(rq) = self.rq.as_mut() {
                    rq.pi = 0;
                }
            }
        }
        Ok(())
    }

    /// INIT → RTR of an RC QP along `path`, with the mask `ibv_modify_qp(3)`
    /// requires (`STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN |
    /// MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER`). Errors: as [`Qp::modify`].
    pub fn modify_to_rtr(&mut self, path: &RcPath) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: path.path_mtu,
            dest_qp_num: path.dest_qp_num,
            rq_psn: path.rq_psn,
            max_dest_rd_atomic: path.max_dest_rd_atomic,
            min_rnr_timer: path.min_rnr_timer,
            ah_attr: path.ah,
            ..Default::default()
        };
        self.modify(
            &attr,
            abi::QP_ATTR_STATE
                | abi::QP_ATTR_AV
                | abi::QP_ATTR_PATH_MTU
                | abi::QP_ATTR_DEST_QPN
                | abi::QP_ATTR_RQ_PSN
                | abi::QP_ATTR_MAX_DEST_RD_ATOMIC
                | abi::QP_ATTR_MIN_RNR_TIMER,
        )
    }

    /// RTR → RTS of an RC QP along `path`, with the mask `ibv_modify_qp(3)`
    /// requires (`STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY |
    /// MAX_QP_RD_ATOMIC`). Errors: as [`Qp::modify`].
    pub fn modify_to_rts(&mut self, path: &RcPath) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: path.sq_psn,
            timeout: path.timeout,
            retry_cnt: path.retry_cnt,
            rnr_retry: path.rnr_retry,
            max_rd_atomic: path.max_rd_atomic,
            ..Default::default()
        };
        self.modify(
            &attr,
            abi::QP_ATTR_STATE
                | abi::QP_ATTR_SQ_PSN
                | abi::QP_ATTR_TIMEOUT
                | abi::QP_ATTR_RETRY_CNT
                | abi::QP_ATTR_RNR_RETRY
                | abi::QP_ATTR_MAX_QP_RD_ATOMIC,
        )
    }

    /// [`Qp::modify_to_rtr`] then [`Qp::modify_to_rts`]: an RC QP in INIT
    /// connected along `path`, as `ibv_rc_pingpong`'s `pp_connect_ctx`.
    pub fn connect_rc(&mut self, path: &RcPath) -> Result<()> {
        self.modify_to_rtr(path)?;
        self.modify_to_rts(path)
    }

    /// The QP's current attributes (`ibv_query_qp(3)`, `CMD_QUERY_QP`).
    /// Capacities are in [`Qp::cap`].
    pub fn query(&self) -> Result<QpAttr> {
        let body = abi::Handle {
            handle: self.qpn,
            reserved: 0,
        };
        let a: abi::QpAttr = self.ctx.execute::<command::QueryQp>(&body)?;
        QpAttr::from_abi(&a)
    }

    /// The device's consumer index of the SQ (`offset` 0) or RQ (4).
    fn consumer_index(&self, offset: usize) -> u32 {
        // SAFETY: the record is 16 bytes of 64-byte-aligned DMA memory kept
        // alive through `ctx`; the device writes it with 32-bit stores.
        // Acquire: slots the device consumed are free for reuse only after it
        // finished reading them.
        unsafe { (*self.record.ptr.add(offset).cast::<AtomicU32>()).load(Ordering::Acquire) }
    }

    /// Posts one send work request (`ibv_post_send(3)`): writes the WQE at
    /// slot `pi mod sq_size`, then rings `DB_SQ` with the new producer index.
    /// Every field the opcode uses goes into the WQE: `imm_data` (network
    /// order), [`SendWr::rdma`] or [`SendWr::atomic`], and [`SendWr::ud`]
    /// (AH number, remote QPN and Q_Key) for UD sends.
    ///
    /// What the device checks when it executes the WQE (completing with an
    /// error status, not here): the opcode against the QP type (UD: SEND
    /// and SEND with immediate; UC: SEND and RDMA WRITE, with or without
    /// immediate; else `WC_LOC_QP_OP_ERR`), a UD message longer than the
    /// path MTU (`WC_LOC_LEN_ERR`), a UD AH of another PD or none
    /// (`WC_LOC_QP_OP_ERR`). Errors on a UD or UC QP move it to SQE, on an
    /// RC QP to ERR.
    ///
    /// Errors: [`VerbsError::QueueFull`] (`ENOMEM`) when `max_send_wr`
    /// requests are outstanding; `EINVAL` before RTS (RESET, INIT, RTR:
    /// rxe's `rxe_post_send`), for more SGEs than
    /// `max_send_sge`, inline data beyond `max_inline_data` or with SGEs,
    /// `SEND_INLINE` in `send_flags`, an atomic whose `sg_list` is not one
    /// 8-byte SGE, a message longer than `max_msg_sz` (2^31 bytes, as
    /// rxe's `validate_send_wr`), an RDMA or atomic remote range that wraps
    /// past 2^64; the transport's doorbell error. Nothing is posted on
    /// error.
    pub fn post_send(&mut self, wr: &SendWr<'_>) -> Result<()> {
        self.post_send_list(std::slice::from_ref(wr))
    }

    /// Posts the work requests `wrs` in order with one doorbell, all or
    /// none: every request is checked as [`Qp::post_send`] checks it, and
    /// the send queue must have room for all of them, before the first WQE
    /// is written. This is what rdma-core's `ibv_wr_complete(3)` needs
    /// (rxe's `wr_complete` moves the producer index over the whole batch,
    /// or on an error over none of it). An empty list posts nothing and
    /// rings no doorbell.
    ///
    /// Errors: those of [`Qp::post_send`]; [`VerbsError::QueueFull`]
    /// (`ENOMEM`) when the batch does not fit beside the outstanding requests.
    pub fn post_send_list(&mut self, wrs: &[SendWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        // rxe's rxe_post_send: EINVAL before RTS (SQE and ERR flush).
        if matches!(self.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidArgument(ArgError::NotReady {
                queue: "send queue",
                state: self.state,
            }));
        }
        for wr in wrs {
            self.check_send(wr)?;
        }
        let ci = self.consumer_index(0);
        let outstanding = self.sq.pi.wrapping_sub(ci);
        if u64::from(outstanding) + wrs.len() as u64 > u64::from(self.sq.size) {
            return Err(VerbsError::QueueFull {
                queue: "send queue",
                outstanding,
                size: self.sq.size,
            });
        }
        for wr in wrs {
            let slot = self.sq.next_slot(ci, "send queue")?;
            let hdr = wr.to_wqe();
            // SAFETY: the slot holds `stride` bytes, checked at creation to
            // fit the header plus max_send_sge SGEs or max_inline_data
            // bytes, which check_send bounds the payload by.
            unsafe {
                write_bytes(slot, hdr.as_bytes());
                let body = slot.add(size_of::<abi::SendWqe>());
                match wr.inline_data {
                    Some(inline) => write_bytes(body, inline),
                    None => write_sges(body, wr.sg_list),
                }
            }
            self.sq.pi = self.sq.pi.wrapping_add(1);
        }
        self.announce(abi::DB_SQ, self.sq.pi)
    }

    /// The checks [`Qp::post_send`] documents, before anything is written.
    fn check_send(&self, wr: &SendWr<'_>) -> Result<()> {
        let inline = wr.inline_data.unwrap_or(&[]);
        if wr.send_flags & abi::SEND_INLINE != 0 {
            return Err(VerbsError::InvalidArgument(ArgError::InlineFlag));
        }
        if wr.inline_data.is_some() && !wr.sg_list.is_empty() {
            return Err(VerbsError::InvalidArgument(ArgError::InlineWithSges));
        }
        if inline.len() > self.cap.max_inline_data as usize {
            return Err(VerbsError::InvalidArgument(ArgError::InlineTooLong {
                len: inline.len(),
                max: self.cap.max_inline_data,
            }));
        }
        if wr.sg_list.len() > self.cap.max_send_sge as usize {
            return Err(VerbsError::InvalidArgument(ArgError::TooManySges {
                sges: wr.sg_list.len(),
                queue: "QP",
                max: self.cap.max_send_sge,
            }));
        }
        if wr.opcode.is_atomic() && (wr.sg_list.len() != 1 || wr.sg_list[0].length != 8) {
            return Err(VerbsError::InvalidArgument(ArgError::AtomicSge));
        }
        // rxe's validate_send_wr: the message is at most max_msg_sz.
        let len = match wr.inline_data {
            Some(d) => d.len() as u64,
            None => wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
        };
        if len > u64::from(abi::MAX_MSG_SZ) {
            return Err(VerbsError::InvalidArgument(ArgError::MessageTooLong {
                len,
                max: abi::MAX_MSG_SZ,
            }));
        }
        // The remote range must not wrap past 2^64 (the device completes
        // such a WQE with WC_LOC_QP_OP_ERR).
        let remote = match wr.opcode {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => {
                Some((wr.rdma.remote_addr, len))
            }
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                Some((wr.atomic.remote_addr, 8))
            }
            _ => None,
        };
        if let Some((addr, n)) = remote {
            if addr.checked_add(n).is_none() {
                return Err(VerbsError::InvalidArgument(ArgError::RemoteRangeWraps {
                    addr,
                    len: n,
                }));
            }
        }
        Ok(())
    }

    /// Posts one receive work request (`ibv_post_recv(3)`): writes the WQE
    /// at slot `pi mod rq_size`, then rings `DB_RQ` with the new producer
    /// index. Receives may be posted in INIT already, before the QP is
    /// connected (as `ibv_rc_pingpong` does). On a UD QP the first
    /// [`super::GRH_LEN`] bytes of the scatter list receive the GRH area and
    /// the payload follows (`ibv_post_recv(3)`).
    ///
    /// Errors: [`VerbsError::QueueFull`] (`ENOMEM`) when `max_recv_wr`
    /// requests are outstanding; `EINVAL` in RESET (rxe's `rxe_post_recv`,
    /// IBTA C10-97.2.1), for more SGEs than
    /// `max_recv_sge`, and on a QP that receives from an SRQ (as rxe
    /// answers); the transport's doorbell error.
    pub fn post_recv(&mut self, wr: &RecvWr<'_>) -> Result<()> {
        // rxe's rxe_post_recv: EINVAL in RESET (IBTA C10-97.2.1).
        if self.state == QpState::Reset {
            return Err(VerbsError::InvalidArgument(ArgError::NotReady {
                queue: "receive queue",
                state: self.state,
            }));
        }
        let ci = self.consumer_index(4);
        let max_sge = self.cap.max_recv_sge;
        let Some(rq) = self.rq.as_mut() else {
            return Err(VerbsError::InvalidArgument(ArgError::RecvOnSrqQp));
        };
        rq.push_recv(ci, "receive queue", max_sge, wr)?;
        let pi = rq.pi;
        self.announce(abi::DB_RQ, pi)
    }

    /// Announces producer index `pi` of the SQ or RQ (`kind`: `DB_SQ`,
    /// `DB_RQ`; device spec §5.x.6.9). With a doorbell record of that
    /// queue: writes the index to the QP record, then (after a full
    /// barrier, [`crate::barrier::mb`], which pairs with the device's when
    /// it stops polling) reads
    /// the device's flags there, and rings only when [`abi::QP_REC_POLLED`]
    /// is clear — while it is set the device reads the index from the
    /// record.
    fn announce(&mut self, kind: u16, pi: u32) -> Result<()> {
        let offset = match kind {
            abi::DB_SQ if self.sq_record => Some(abi::QP_REC_SQ_PI),
            abi::DB_RQ if self.rq_record => Some(abi::QP_REC_RQ_PI),
            _ => None,
        };
        if let Some(offset) = offset {
            // SAFETY: the record is 16 bytes (32 with an RQ record, which
            // `offset` 16 needs) of 64-byte-aligned DMA memory kept alive
            // through `ctx`; the driver's indices at 8 and 16 are written
            // only here, the device's flags at 12 only by the device, each
            // as one 32-bit access.
            let polled = unsafe {
                let rec = self.record.ptr;
                // Release: the device reads the WQEs after the index.
                (*rec.add(offset as usize).cast::<AtomicU32>())
                    .store(pi.to_le(), Ordering::Release);
                crate::barrier::mb();
                let flags = (*rec.add(abi::QP_REC_FLAGS as usize).cast::<AtomicU32>())
                    .load(Ordering::Relaxed);
                u32::from_le(flags) & abi::QP_REC_POLLED != 0
            };
            if polled {
                return Ok(());
            }
        }
        self.ring(kind, pi)
    }

    /// Rings a work queue doorbell after the WQE writes.
    fn ring(&mut self, kind: u16, index: u32) -> Result<()> {
        // The device must see the WQE before the producer index that covers it.
        fence(Ordering::Release);
        let db = abi::Doorbell {
            kind,
            handle: self.qpn,
            index,
            ..Default::default()
        };
        self.ctx.doorbell(&db)
    }
}

/// The inline bytes a QP reports (`ibv_qp_init_attr.cap.max_inline_data`
/// after `ibv_create_qp(3)`, [`Qp::cap`]): what its SQ stride holds
/// (`CreateQpResp.max_inline`), but at most the device's `max_inline`
/// (`device_max`, 0: none known). `ibv_create_qp(3)` writes the granted
/// capabilities back into the caller's attributes, and a program creating
/// its next QP with the same attributes must not be refused: a stride of
/// 32 SGEs holds 960 inline bytes, and a create asking 960 is `EINVAL`
/// (past `max_inline`, 512; `tests/c/exhaust.c` found it). rxe grants
/// `max(16 * max_send_sge, max_inline_data)` (`rxe_qp_init_req`), 512 for
/// 32 SGEs.
fn granted_inline(stride_holds: u32, device_max: u32) -> u32 {
    if device_max == 0 {
        stride_holds
    } else {
        stride_holds.min(device_max)
    }
}

impl Drop for Qp {
    /// Destroys the QP and, once the device has, gives its rings and
    /// record back.
    fn drop(&mut self) {
        if self.ctx.destroy::<command::DestroyQp>("QP", self.qpn) {
            let rq = self.rq.as_ref().map(|q| q.buf);
            let bufs: Vec<DmaBuf> = [Some(self.sq.buf), rq, Some(self.record)]
                .into_iter()
                .flatten()
                .collect();
            self.ctx.release_dma(&bufs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_attr_maps_every_field_to_the_abi_and_back() {
        let attr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: 3,
            qkey: 0x1111,
            rq_psn: 0xabcdef,
            sq_psn: 0x123456,
            dest_qp_num: 0x11,
            qp_access_flags: abi::ACCESS_REMOTE_WRITE,
            ah_attr: AhAttr {
                dgid: Gid { raw: [7; 16] },
                flow_label: 5,
                sgid_index: 1,
                hop_limit: 64,
                traffic_class: 2,
                sl: 3,
                is_global: true,
                port_num: 1,
            },
            pkey_index: 0,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 2,
        };
        let a = attr.to_abi(0x42, abi::QP_ATTR_STATE | abi::QP_ATTR_AV);
        assert_eq!(
            (a.qpn, a.attr_mask, a.qp_state),
            (0x42, abi::QP_ATTR_STATE | abi::QP_ATTR_AV, abi::QPS_RTR)
        );
        assert_eq!(
            (a.dgid, a.is_global, a.hop_limit, a.sgid_index),
            ([7; 16], 1, 64, 1)
        );
        assert_eq!(QpAttr::from_abi(&a).unwrap(), attr);
        let bad = abi::QpAttr { qp_state: 99, ..a };
        assert!(matches!(
            QpAttr::from_abi(&bad),
            Err(VerbsError::BadResponse(_))
        ));
    }

    #[test]
    fn send_wr_fields_reach_the_wqe() {
        let sge = [Sge {
            addr: 0x1000,
            length: 8,
            lkey: 7,
        }];
        // UD: the AH, destination QPN and Q_Key go into the WQE.
        let ud = SendWr {
            wr_id: 0xdead_beef,
            opcode: WrOpcode::SendWithImm,
            send_flags: abi::SEND_SIGNALED | abi::SEND_SOLICITED,
            sg_list: &sge,
            imm_data: 0x0102_0304,
            ud: UdWr {
                ah: 5,
                remote_qpn: 0xab_cdef,
                remote_qkey: 0x1111_1111,
            },
            ..Default::default()
        };
        let w = ud.to_wqe();
        assert_eq!(
            (w.wr_id, w.opcode, w.num_sge, w.inline_len),
            (0xdead_beef, abi::WR_SEND_WITH_IMM, 1, 0)
        );
        assert_eq!(w.send_flags, abi::SEND_SIGNALED | abi::SEND_SOLICITED);
        assert_eq!(w.imm_data, [1, 2, 3, 4], "network byte order");
        assert_eq!(
            (w.ah, w.remote_qpn, w.remote_qkey),
            (5, 0xab_cdef, 0x1111_1111)
        );
        // At the ABI's offsets: remote_qpn 48, remote_qkey 52, ah 56.
        let b = w.as_bytes();
        assert_eq!(b[48..52], 0xab_cdefu32.to_le_bytes());
        assert_eq!(b[52..56], 0x1111_1111u32.to_le_bytes());
        assert_eq!(b[56..60], 5u32.to_le_bytes());

        // Inline data sets SEND_INLINE and its length; no SGEs.
        let data = [9u8; 20];
        let inl = SendWr {
            opcode: WrOpcode::Send,
            inline_data: Some(&data),
            ..Default::default()
        };
        let w = inl.to_wqe();
        assert_eq!(
            (w.send_flags, w.inline_len, w.num_sge),
            (abi::SEND_INLINE, 20, 0)
        );

        // RDMA takes `rdma`, atomics take `atomic`; SEND with invalidate
        // carries the rkey in imm_data.
        let rdma = RdmaWr {
            remote_addr: 0x5000,
            rkey: 0x11,
        };
        let atomic = AtomicWr {
            remote_addr: 0x6000,
            rkey: 0x22,
            compare_add: 3,
            swap: 4,
        };
        let write = SendWr {
            opcode: WrOpcode::RdmaWriteWithImm,
            rdma,
            atomic,
            ..Default::default()
        }
        .to_wqe();
        assert_eq!((write.remote_addr, write.rkey), (0x5000, 0x11));
        let cas = SendWr {
            opcode: WrOpcode::AtomicCmpAndSwp,
            rdma,
            atomic,
            ..Default::default()
        }
        .to_wqe();
        assert_eq!(
            (cas.remote_addr, cas.rkey, cas.compare_add, cas.swap),
            (0x6000, 0x22, 3, 4)
        );
        let inv = SendWr {
            opcode: WrOpcode::SendWithInv,
            imm_data: 0x0000_1234,
            ..Default::default()
        }
        .to_wqe();
        assert_eq!(
            (inv.opcode, inv.imm_data),
            (abi::WR_SEND_WITH_INV, [0, 0, 0x12, 0x34])
        );
    }
}
