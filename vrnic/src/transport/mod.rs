//! The RoCEv2 reliable transport, split like Linux rxe: the [`requester`]
//! turns send WQEs into request packets, the [`responder`] executes incoming
//! requests and answers with ACK/NAK, the [`completer`] processes ACKs and
//! NAKs and writes send completions. IBTA Vol 1 chapter 9.
//!
//! All three work on one QP at a time with an [`Env`]: the driver memory, the
//! MR and CQ tables, the port identity and the output queues.
//!
//! Beside them: `port` (the port's identity, [`PortId`]), `output`
//! (what a step produces: frames, batched and ACK-coalesced, payloads by
//! reference, events: [`Output`]), `headers` (the packets' headers) and
//! [`stats`] (the device's and each QP's counters); this module keeps the
//! step's environment ([`Env`]), the QP record, error handling and the
//! scatter of a payload into receive SGEs.

pub mod completer;
pub mod cwnd;
pub mod datagram;
pub mod hdr_check;
pub mod neigh_table;
pub mod probe;
pub mod psn;
pub mod recv_queue;
pub mod requester;
mod resources;
pub mod responder;
pub mod stats;

mod headers;
mod output;
mod port;

pub use headers::{headers_to, peer_headers, reply_headers, source_ip, udp_src_port, PeerHeaders};
pub use output::{
    Batch, Output, BIG_BUFFER, TX_BACKLOG_MAX, TX_POOL_BIG_MAX, TX_POOL_MAX, TX_REPLY_MAX,
};
pub use port::{PortId, DEFAULT_PKEY};
pub use resources::Resources;

/// Largest message, bytes (`ibv_port_attr.max_msg_sz`, rxe's
/// `RXE_MAX_MSG_SIZE`): enforced by the requester (a longer WQE completes
/// with `WC_LOC_LEN_ERR`) and the responder (a SEND growing past it, a
/// READ or WRITE asking for more, is NAKed invalid request). The ABI's
/// limit, which drivers check too.
pub use crate::abi::MAX_MSG_SZ;

/// The transport's parts of a QP ([`QpParts`]): its requester and
/// responder state and its counters.
#[derive(Debug)]
pub enum TransportParts {}

impl QpParts for TransportParts {
    type Req = requester::ReqState;
    type Resp = responder::RespState;
    type Stats = stats::QpStats;
}

/// A QP as the transport and the device keep it: its verbs state
/// ([`crate::verbs::qp::Qp`]) with the transport's parts.
pub type Qp = crate::verbs::qp::Qp<TransportParts>;

use crate::abi;
use crate::mem::{self, DmaMemory};
use crate::time::Nanos;
use crate::verbs::qp::QpParts;

/// Everything a transport step needs besides the QP.
pub struct Env<'a> {
    /// Driver memory.
    pub mem: &'a dyn DmaMemory,
    /// The device's objects other than QPs, its port, neighbours and
    /// output queues, borrowed whole beside the QP being served.
    pub res: &'a mut Resources,
    /// Current time.
    pub now: Nanos,
}

impl Env<'_> {
    /// Writes a CQE to CQ `cqn`, raising `EV_COMP` when the CQ was armed and
    /// `EV_CQ_ERR` on overrun.
    pub fn complete(&mut self, cqn: u32, cqe: abi::Cqe, solicited: bool) {
        let Some(cq) = self.res.cqs.get_mut(cqn) else {
            return;
        };
        match cq.push(self.mem, cqe, solicited) {
            Ok(true) => self.res.out.event(abi::EV_COMP, cqn, 0),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(cqn, "CQ error: {e}");
                self.res.out.event(abi::EV_CQ_ERR, cqn, 0);
            }
        }
    }
}

/// Writes the QP record's consumer indices (SQ at 0, RQ at 4).
pub fn write_record(qp: &Qp, env: &Env) {
    let rec = abi::Handle {
        handle: qp.req.sq_ci,
        reserved: qp.resp.rq_ci,
    };
    if let Err(e) = mem::write_obj(env.mem, qp.record, &rec) {
        tracing::warn!(qpn = qp.qpn, "QP record: {e}");
    }
}

/// Sends what the QP may send now (a doorbell, a resumed send queue): a
/// UD or GSI QP's datagrams ([`datagram::run`]), an RC or UC QP's packets
/// ([`requester::run`]).
pub fn send(qp: &mut Qp, env: &mut Env) {
    if qp.qp_type.is_datagram() {
        datagram::run(qp, env);
    } else {
        requester::run(qp, env);
    }
}

/// Moves `qp` to ERR (IBTA §10.3.1): every outstanding send and receive WQE
/// completes with `IBV_WC_WR_FLUSH_ERR`, and `EV_QP_FATAL` carries `status`
/// when the move was caused by an error (`status != WC_SUCCESS`).
pub fn qp_to_error(qp: &mut Qp, env: &mut Env, status: abi::WcStatus) {
    if qp.state == abi::QpState::Err {
        return;
    }
    qp.state = abi::QpState::Err;
    if status != abi::WcStatus::Success {
        env.res
            .out
            .event(abi::EV_QP_FATAL, qp.qpn, u32::from(status.raw()));
    }
    flush(qp, env);
    if qp.srqn != 0 {
        env.res.out.event(abi::EV_QP_LAST_WQE_REACHED, qp.qpn, 0);
    }
}

/// A send-side error: for RC the QP moves to ERR (IBTA §10.8.3); UC and UD
/// QPs move to SQE, where the SQ is flushed with `IBV_WC_WR_FLUSH_ERR`
/// while the receive side keeps working (IBTA §10.3.1.6, Table 93).
pub fn send_queue_error(qp: &mut Qp, env: &mut Env, status: abi::WcStatus) {
    if qp.qp_type == abi::QpType::Rc {
        qp_to_error(qp, env, status);
        return;
    }
    if matches!(qp.state, abi::QpState::Err | abi::QpState::Sqe) {
        return;
    }
    qp.state = abi::QpState::Sqe;
    requester::flush(qp, env);
    write_record(qp, env);
}

/// Completes every outstanding WQE of a QP in ERR with `WR_FLUSH_ERR`.
pub fn flush(qp: &mut Qp, env: &mut Env) {
    requester::flush(qp, env);
    responder::flush(qp, env);
    write_record(qp, env);
}

/// Scatters `data` into an SGE list of a QP in PD `pdn`, starting at
/// message byte `offset` (receive WQEs, READ responses, atomic results).
/// Each piece is checked again at the time of the write, as the device
/// spec (§5.x.6.8) requires: its lkey must still name an MR of `pdn` with
/// `ACCESS_LOCAL_WRITE` covering it (rxe's `copy_data` with
/// `IB_ACCESS_LOCAL_WRITE`). `WC_LOC_PROT_ERR` when it does not or the
/// memory is unreachable, `WC_LOC_LEN_ERR` when the SGEs are too short.
pub fn scatter_sges(
    env: &Env,
    pdn: u32,
    sges: &[abi::Sge],
    offset: u32,
    data: crate::data::Data<'_>,
) -> Result<(), abi::WcStatus> {
    for_each_sge_piece(sges, offset, data.len(), |sge, va, done, n| {
        let mr = env
            .res
            .mrs
            .check(sge.lkey, pdn, abi::ACCESS_LOCAL_WRITE, va, n as u64)
            .map_err(|_| abi::WcStatus::LocProtErr)?;
        let part = data.slice(done, n).ok_or(abi::WcStatus::LocLenErr)?;
        mr.write_data(env.mem, va, part)
            .map_err(|_| abi::WcStatus::LocProtErr)
    })
}

/// Walks the pieces of the SGEs `sges` that hold message bytes `offset ..
/// offset + len`, in order: `piece(sge, va, done, n)` for `n` bytes at
/// address `va` of `sge`, which are bytes `done .. done + n` of the `len`.
/// Stops at the first error `piece` returns. `WC_LOC_PROT_ERR` when an
/// address overflows, `WC_LOC_LEN_ERR` when the SGEs end before `len` bytes.
pub(crate) fn for_each_sge_piece(
    sges: &[abi::Sge],
    offset: u32,
    len: usize,
    mut piece: impl FnMut(&abi::Sge, u64, usize, usize) -> Result<(), abi::WcStatus>,
) -> Result<(), abi::WcStatus> {
    let mut skip = offset as u64;
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let l = sge.length as u64;
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(len - done);
        let va = sge
            .addr
            .checked_add(skip)
            .ok_or(abi::WcStatus::LocProtErr)?;
        piece(sge, va, done, n)?;
        done += n;
        skip = 0;
    }
    if done < len {
        return Err(abi::WcStatus::LocLenErr);
    }
    Ok(())
}
