//! `CMD_MODIFY_QP` (`ibv_modify_qp(3)`, IBTA §10.3.1 QP states): the
//! request checked, the attributes applied, then the transport steps the
//! state transition runs.

use super::*;
use crate::transport::requester::ReqState;
use crate::transport::responder::RespState;
use crate::transport::Env;
use crate::verbs::ah::Av;
use crate::verbs::qp::{apply_attrs, validate_modify};

impl Device {
    /// `CMD_MODIFY_QP` of QP `a.qpn` at time `now`: the transport steps a
    /// transition runs (SQD → RTS sending what was posted meanwhile,
    /// arming the ACK timer) use the caller's clock.
    pub(super) fn modify_qp(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        a: abi::QpAttr,
        now: Nanos,
    ) -> Result<(), CommandError> {
        if !self.owns_qp(ctx, a.qpn) {
            return Err(CommandError::NotFound(Object::Qp(a.qpn)));
        }
        let next = self.check_modify(&a)?;
        let qp = self
            .qps
            .get_mut(a.qpn)
            .ok_or(CommandError::NotFound(Object::Qp(a.qpn)))?;
        let prev = qp.state;
        apply_attrs(&mut qp.attr, &a);
        qp.state = next;
        qp_step!(self, qp, mem, now, |env| {
            enter_state(qp, &mut env, prev, next)
        });
        let connected = !qp.qp_type.is_datagram();
        let dgid = (connected && (next == abi::QpState::Rtr || next == abi::QpState::Rts))
            .then_some(qp.attr.dgid);
        if let Some(dgid) = dgid {
            // Resolve the peer early so the first send does not wait for ARP.
            self.resolve(dgid, now);
        }
        if next == abi::QpState::Reset {
            // The driver's producer index in the record restarts at 0.
            self.unwatch(mem, a.qpn);
        }
        Ok(())
    }

    /// Checks a modify request: the transition and value ranges
    /// ([`validate_modify`]), the P_Key index (rxe_qp_chk_attr: it must
    /// name a table entry) and the address vector ([`Device::check_av`]).
    /// Returns the state to move to.
    fn check_modify(&self, a: &abi::QpAttr) -> Result<abi::QpState, CommandError> {
        let qp = self
            .qps
            .get(a.qpn)
            .ok_or(CommandError::NotFound(Object::Qp(a.qpn)))?;
        let next = validate_modify(qp, a).map_err(|e| CommandError::invalid(e.0))?;
        if a.attr_mask & abi::QP_ATTR_PKEY_INDEX != 0
            && self.res.port.pkey(a.pkey_index.into()).is_none()
        {
            return Err(CommandError::invalid("P_Key index"));
        }
        if a.attr_mask & abi::QP_ATTR_AV != 0 {
            self.check_av(&Av::of_qp(a))?;
        }
        Ok(next)
    }
}

/// The transport side of QP `qp`'s move from `prev` to `next` (its
/// attributes and `Qp::state` already set): a reset clears the requester
/// and responder, RTR takes the expected PSN, RTS starts the requester,
/// SQD drains (IBTA §10.3.1.4: `EV_SQ_DRAINED` once every fetched WQE
/// completed), leaving SQD or SQE resumes sending, and ERR flushes.
fn enter_state(qp: &mut Qp, env: &mut Env, prev: abi::QpState, next: abi::QpState) {
    match next {
        abi::QpState::Reset => {
            qp.req = ReqState::default();
            qp.resp.release(&mut env.res.out);
            qp.resp = RespState::default();
            // The rings restart empty: publish consumer indices 0.
            crate::transport::write_record(qp, env);
        }
        abi::QpState::Rtr if prev == abi::QpState::Init => {
            qp.resp.epsn = qp.attr.rq_psn;
        }
        abi::QpState::Rts if prev == abi::QpState::Rtr => {
            qp.req
                .start(qp.attr.sq_psn, qp.attr.retry_cnt, qp.attr.rnr_retry);
        }
        abi::QpState::Sqd if prev == abi::QpState::Rts => {
            // IBV_EVENT_SQ_DRAINED at once when nothing is in flight.
            if qp.req.inflight.is_empty() {
                env.res.out.event(abi::EV_SQ_DRAINED, qp.qpn, 0);
            } else {
                qp.req.drain_pending = true;
            }
        }
        abi::QpState::Rts if prev == abi::QpState::Sqd || prev == abi::QpState::Sqe => {
            qp.req.drain_pending = false;
            crate::transport::send(qp, env);
        }
        abi::QpState::Err => {
            qp.state = prev;
            crate::transport::qp_to_error(qp, env, abi::WcStatus::Success);
        }
        _ => {}
    }
}
