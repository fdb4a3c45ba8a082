//! Taking receive WQEs for incoming SENDs (and RDMA WRITE with immediate)
//! from a QP's own RQ or from its shared receive queue (IBTA Vol 1
//! §10.2.9, §10.8.2). A WQE is consumed when taken: its SGEs are copied
//! and validated, the consumer index moves on and the driver may reuse the
//! slot, while the completion comes when the message is done.

use crate::abi::{self, Sge};
use crate::mem;
use crate::transport::Qp;
use crate::transport::{write_record, Env};
use crate::verbs::qp::Ring;

/// A receive WQE taken for a message.
#[derive(Debug, Clone)]
pub struct RecvCtx {
    /// The receive WQE's wr_id.
    pub wr_id: u64,
    /// Its SGEs (validated for local write in the owning PD).
    pub sges: Vec<Sge>,
    /// Message bytes received into it so far.
    pub offset: u32,
}

/// True when a receive WQE is posted for `qp` (on its RQ or its SRQ).
pub fn available(qp: &Qp, env: &Env) -> bool {
    if qp.srqn != 0 {
        return env.res.srqs.get(qp.srqn).is_some_and(|s| s.available() > 0);
    }
    qp.resp.rq_ci != qp.resp.rq_pi
}

/// Takes the next receive WQE of `qp`: `None` when none is posted;
/// `Some(Err((wr_id, status)))` when the WQE is malformed (too many SGEs:
/// `WC_LOC_LEN_ERR`; an SGE outside a local-write MR of the PD:
/// `WC_LOC_PROT_ERR`) — it is consumed all the same and completes with
/// that status.
pub fn take(qp: &mut Qp, env: &mut Env) -> Option<Result<RecvCtx, (u64, abi::WcStatus)>> {
    if qp.srqn != 0 {
        let srq = env.res.srqs.get_mut(qp.srqn)?;
        if srq.available() == 0 {
            return None;
        }
        let (ring, ci, pdn, max_sge, record) = (srq.ring, srq.ci, srq.pdn, srq.max_sge, srq.record);
        srq.ci = srq.ci.wrapping_add(1);
        let (srqn, new_ci) = (srq.srqn, srq.ci);
        let limit = srq.limit_reached();
        if let Err(e) = mem::write_obj(
            env.mem,
            record,
            &abi::Handle {
                handle: new_ci,
                reserved: 0,
            },
        ) {
            tracing::warn!(srqn, "SRQ record: {e}");
        }
        if limit {
            env.res.out.event(abi::EV_SRQ_LIMIT, srqn, 0);
        }
        return Some(read_wqe(env, ring, ci, pdn, max_sge));
    }
    if qp.resp.rq_ci == qp.resp.rq_pi {
        return None;
    }
    let ci = qp.resp.rq_ci;
    qp.resp.rq_ci = ci.wrapping_add(1);
    write_record(qp, env);
    Some(read_wqe(env, qp.rq, ci, qp.pdn, qp.max_recv_sge))
}

/// Reads the receive WQE at index `ci` of `ring` and validates its SGEs.
fn read_wqe(
    env: &Env,
    ring: Ring,
    ci: u32,
    pdn: u32,
    max_sge: u32,
) -> Result<RecvCtx, (u64, abi::WcStatus)> {
    let slot = ring.slot(ci);
    let wqe: abi::RecvWqe =
        mem::read_obj(env.mem, slot).map_err(|_| (0, abi::WcStatus::LocProtErr))?;
    let bad = |status| (wqe.wr_id, status);
    if wqe.num_sge > max_sge {
        return Err(bad(abi::WcStatus::LocLenErr));
    }
    let mut sges = Vec::with_capacity(wqe.num_sge as usize);
    for i in 0..wqe.num_sge as u64 {
        let sge: Sge = mem::read_obj(env.mem, slot + 16 + i * 16)
            .map_err(|_| bad(abi::WcStatus::LocProtErr))?;
        if sge.length == 0 {
            continue;
        }
        env.res
            .mrs
            .check(
                sge.lkey,
                pdn,
                abi::ACCESS_LOCAL_WRITE,
                sge.addr,
                sge.length as u64,
            )
            .map_err(|_| bad(abi::WcStatus::LocProtErr))?;
        sges.push(sge);
    }
    Ok(RecvCtx {
        wr_id: wqe.wr_id,
        sges,
        offset: 0,
    })
}

/// The wr_id of the RQ WQE at index `ci` (for flushing), 0 if unreadable.
pub fn wr_id_at(qp: &Qp, env: &Env, ci: u32) -> u64 {
    mem::read_obj::<abi::RecvWqe>(env.mem, qp.rq.slot(ci))
        .map(|w| w.wr_id)
        .unwrap_or(0)
}
