//! Queue pairs: rings, attributes and the state machine of
//! `ibv_modify_qp(3)` (IBTA Vol 1 §10.3, §11.2.5 "Modify QP" with the
//! required/optional attribute tables).

use crate::abi::{self, QpState, QpType};
use crate::verbs::Invalid;

/// A work queue ring in driver memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ring {
    /// Guest-physical address of slot 0.
    pub gpa: u64,
    /// Number of slots (power of two; 0 for none).
    pub size: u32,
    /// Bytes per slot.
    pub stride: u32,
}

impl Ring {
    /// Guest-physical address of the slot for free-running index `idx`
    /// (slot 0 of an empty ring, which has no slots to read).
    pub fn slot(&self, idx: u32) -> u64 {
        self.gpa + (idx & self.size.saturating_sub(1)) as u64 * self.stride as u64
    }
}

/// What the layers above a QP keep in it beside its verbs state: the
/// transport's requester and responder state and the QP's counters
/// (`crate::transport::TransportParts`). The verbs layer only stores them.
pub trait QpParts {
    /// Requester (send side) state.
    type Req: std::fmt::Debug;
    /// Responder (receive side) state.
    type Resp: std::fmt::Debug;
    /// Counters.
    type Stats: std::fmt::Debug;
}

/// A queue pair, with the parts `P` of the layers above.
#[derive(Debug)]
pub struct Qp<P: QpParts> {
    /// QP number.
    pub qpn: u32,
    /// Protection domain.
    pub pdn: u32,
    /// Transport service.
    pub qp_type: abi::QpType,
    /// The QP's state: the one copy (`attr.qp_state` is not kept; a query
    /// answers with this).
    pub state: abi::QpState,
    /// CQ for send completions.
    pub send_cqn: u32,
    /// CQ for receive completions.
    pub recv_cqn: u32,
    /// Every send WQE completes with a CQE.
    pub sq_sig_all: bool,
    /// Shared receive queue, or 0 when the QP has its own RQ.
    pub srqn: u32,
    /// Send queue.
    pub sq: Ring,
    /// Receive queue.
    pub rq: Ring,
    /// Maximum SGEs per send / receive WQE, inline bytes.
    pub max_send_sge: u32,
    /// Maximum SGEs per receive WQE.
    pub max_recv_sge: u32,
    /// Maximum inline bytes per send WQE.
    pub max_inline: u32,
    /// Guest-physical address of the QP record (device-written consumer indices).
    pub record: u64,
    /// The driver writes the SQ producer index to the record
    /// ([`abi::QP_F_SQ_RECORD`], `crate::device` reads it while polling).
    pub sq_record: bool,
    /// Likewise the RQ producer index ([`abi::QP_F_RQ_RECORD`]).
    pub rq_record: bool,
    /// Current attributes (as returned by `CMD_QUERY_QP`).
    pub attr: abi::QpAttr,
    /// Requester (send side) state.
    pub req: P::Req,
    /// Responder (receive side) state.
    pub resp: P::Resp,
    /// Counters (see `crate::device::QpStats`).
    pub stats: P::Stats,
    /// Bytes this QP had in flight when the device last added them to its
    /// sum ([`crate::transport::Resources::bytes_in_flight`]), so that the
    /// device can take them out again.
    pub in_flight_counted: u64,
    /// The QP's packets go to the wire, not to another function of the
    /// daemon (as of its last step): only then does the device's budget
    /// of bytes in flight hold it
    /// ([`crate::transport::requester::IN_FLIGHT_BUDGET_BYTES`]).
    pub to_wire: bool,
}

impl<P: QpParts> Qp<P> {
    /// Path MTU in bytes (1024 until set).
    pub fn mtu(&self) -> u32 {
        abi::mtu_bytes(self.attr.path_mtu).unwrap_or(1024)
    }

    /// The Q_Key a datagram for this QP must carry (IBTA C10-16): the
    /// GSI QP's is [`abi::GSI_QKEY`] whatever its `qkey` attribute says,
    /// as on Linux rxe (`check_keys`); a UD QP's is its `qkey`.
    pub fn rx_qkey(&self) -> u32 {
        if self.qp_type == QpType::Gsi {
            abi::GSI_QKEY
        } else {
            self.attr.qkey
        }
    }
}

use abi::{
    QP_ATTR_ACCESS_FLAGS as ACCESS, QP_ATTR_AV as AV, QP_ATTR_CUR_STATE as CUR,
    QP_ATTR_DEST_QPN as DEST_QPN, QP_ATTR_MAX_DEST_RD_ATOMIC as MAX_DEST_RD,
    QP_ATTR_MAX_QP_RD_ATOMIC as MAX_RD, QP_ATTR_MIN_RNR_TIMER as MIN_RNR,
    QP_ATTR_PATH_MTU as PATH_MTU, QP_ATTR_PKEY_INDEX as PKEY, QP_ATTR_PORT as PORT,
    QP_ATTR_QKEY as QKEY, QP_ATTR_RETRY_CNT as RETRY, QP_ATTR_RNR_RETRY as RNR_RETRY,
    QP_ATTR_RQ_PSN as RQ_PSN, QP_ATTR_SQ_PSN as SQ_PSN, QP_ATTR_STATE as STATE,
    QP_ATTR_TIMEOUT as TIMEOUT,
};

/// Required and optional attribute masks for a transition of a QP type, per
/// IBTA Vol 1 Table 91 / `ibv_modify_qp(3)`; `None` when the transition is
/// not allowed.
pub fn transition_masks(qp_type: QpType, cur: QpState, next: QpState) -> Option<(u32, u32)> {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    let ud = qp_type.is_datagram();
    let uc = qp_type == QpType::Uc;
    let m = match (cur, next) {
        (_, Reset) | (_, Err) => (STATE, 0),
        // The GSI QP's port is its device's (the kernel's MAD layer sets
        // PKEY_INDEX and QKEY alone, as `ib_modify_qp_is_ok` requires).
        (Reset, Init) if qp_type == QpType::Gsi => (STATE | PKEY | QKEY, PORT),
        (Reset, Init) if ud => (STATE | PKEY | PORT | QKEY, 0),
        (Reset, Init) => (STATE | PKEY | PORT | ACCESS, 0),
        (Init, Init) if ud => (STATE, PKEY | PORT | QKEY),
        (Init, Init) => (STATE, PKEY | PORT | ACCESS),
        (Init, Rtr) if ud => (STATE, PKEY | QKEY),
        (Init, Rtr) if uc => (STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN, ACCESS | PKEY),
        (Init, Rtr) => (
            STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD | MIN_RNR,
            ACCESS | PKEY,
        ),
        (Rtr, Rts) if ud => (STATE | SQ_PSN, CUR | QKEY),
        (Rtr, Rts) if uc => (STATE | SQ_PSN, CUR | ACCESS),
        (Rtr, Rts) => (
            STATE | SQ_PSN | TIMEOUT | RETRY | RNR_RETRY | MAX_RD,
            CUR | ACCESS | MIN_RNR,
        ),
        (Rts, Rts) if ud => (STATE, CUR | QKEY),
        (Rts, Rts) => (STATE, CUR | ACCESS | MIN_RNR),
        (Rts, Sqd) => (STATE, 0),
        (Sqd, Rts) => (STATE, CUR | ACCESS | MIN_RNR | QKEY),
        (Sqd, Sqd) => (STATE, ACCESS | MIN_RNR | TIMEOUT | RETRY | RNR_RETRY | QKEY),
        (Sqe, Rts) => (STATE, CUR | QKEY | ACCESS),
        _ => return None,
    };
    Some(m)
}

/// Outstanding RDMA READ and atomic requests a QP may have as requester
/// (`max_rd_atomic`) or as responder (`max_dest_rd_atomic`): the device's
/// `max_qp_init_rd_atom` and `max_qp_rd_atom` (`ibv_query_device(3)`).
/// 128, as rxe (`RXE_MAX_QP_RD_ATOM`, `RXE_MAX_QP_INIT_RD_ATOM`): perftest's
/// READ and atomic tests set a QP's `max_rd_atomic` to the peer's
/// `max_qp_rd_atom`, so against rxe a smaller device fails `ibv_modify_qp`.
pub const MAX_QP_RD_ATOM: u32 = 128;

/// Validates a modify request against the transition table and value
/// ranges (`ibv_modify_qp(3)`, IBTA §10.3.1 Table 91; rxe's
/// `rxe_qp_chk_attr`); returns the state to move to, or which check
/// failed ([`Invalid`]; also for a `qp_state` that names no state).
pub fn validate_modify<P: QpParts>(qp: &Qp<P>, a: &abi::QpAttr) -> Result<QpState, Invalid> {
    let next = if a.attr_mask & STATE != 0 {
        QpState::try_from(a.qp_state).map_err(|_| Invalid("qp_state"))?
    } else {
        qp.state
    };
    if a.attr_mask & CUR != 0 && a.qp_state != u32::from(qp.state) && a.attr_mask & STATE == 0 {
        return Err(Invalid("cur_qp_state"));
    }
    let (req, opt) =
        transition_masks(qp.qp_type, qp.state, next).ok_or(Invalid("QP state transition"))?;
    let mask = a.attr_mask | STATE;
    if mask & req != req || mask & !(req | opt) != 0 {
        return Err(Invalid("attribute mask for the transition"));
    }
    if mask & PATH_MTU != 0 && abi::mtu_bytes(a.path_mtu).is_none() {
        return Err(Invalid("path_mtu"));
    }
    if mask & PORT != 0 && a.port_num != 1 {
        return Err(Invalid("port_num"));
    }
    if mask & RETRY != 0 && a.retry_cnt > 7 || mask & RNR_RETRY != 0 && a.rnr_retry > 7 {
        return Err(Invalid("retry_cnt or rnr_retry (at most 7)"));
    }
    if mask & (TIMEOUT) != 0 && a.timeout > 31 || mask & MIN_RNR != 0 && a.min_rnr_timer > 31 {
        return Err(Invalid("timeout or min_rnr_timer (at most 31)"));
    }
    // ibv_modify_qp(3): EINVAL beyond the device's max_qp_rd_atom /
    // max_qp_init_rd_atom.
    if mask & MAX_RD != 0 && u32::from(a.max_rd_atomic) > MAX_QP_RD_ATOM
        || mask & MAX_DEST_RD != 0 && u32::from(a.max_dest_rd_atomic) > MAX_QP_RD_ATOM
    {
        return Err(Invalid("max_rd_atomic or max_dest_rd_atomic"));
    }
    if mask & (SQ_PSN | RQ_PSN | DEST_QPN) != 0
        && (a.sq_psn > 0xff_ffff || a.rq_psn > 0xff_ffff || a.dest_qp_num > 0xff_ffff)
    {
        return Err(Invalid("sq_psn, rq_psn or dest_qp_num (24 bits)"));
    }
    Ok(next)
}

/// For each `MASK => [field, ...]`, copies the fields from `$from` to `$to`
/// when `MASK` is set in `$mask`.
macro_rules! copy_masked_fields {
    ($mask:expr, $to:ident <- $from:ident, { $($bit:expr => [$($field:ident),+ $(,)?]),+ $(,)? }) => {
        $(
            if $mask & $bit != 0 {
                $($to.$field = $from.$field;)+
            }
        )+
    };
}

/// Copies the attributes named by `a.attr_mask` into `cur`, except the
/// state, which lives in [`Qp::state`] alone.
pub fn apply_attrs(cur: &mut abi::QpAttr, a: &abi::QpAttr) {
    copy_masked_fields!(a.attr_mask, cur <- a, {
        ACCESS => [qp_access_flags],
        PKEY => [pkey_index],
        PORT => [port_num],
        QKEY => [qkey],
        AV => [dgid, sgid_index, hop_limit, traffic_class, flow_label, sl, is_global],
        PATH_MTU => [path_mtu],
        TIMEOUT => [timeout],
        RETRY => [retry_cnt],
        RNR_RETRY => [rnr_retry],
        RQ_PSN => [rq_psn],
        MAX_RD => [max_rd_atomic],
        MIN_RNR => [min_rnr_timer],
        SQ_PSN => [sq_psn],
        MAX_DEST_RD => [max_dest_rd_atomic],
        DEST_QPN => [dest_qp_num],
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rc_transitions_require_ibv_attributes() {
        let (req, _) = transition_masks(QpType::Rc, QpState::Reset, QpState::Init).unwrap();
        assert_eq!(req, STATE | PKEY | PORT | ACCESS);
        assert!(transition_masks(QpType::Rc, QpState::Reset, QpState::Rts).is_none());
        assert!(transition_masks(QpType::Rc, QpState::Init, QpState::Rts).is_none());
        assert!(transition_masks(QpType::Rc, QpState::Rts, QpState::Err).is_some());
    }
}
