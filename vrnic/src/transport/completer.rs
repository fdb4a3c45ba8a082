//! The completer: processes ACKs and NAKs for a QP's requests, completes
//! send WQEs in order, and drives retransmission on NAK, RNR NAK and the
//! local ACK timeout (IBTA Vol 1 §9.7.5.1, §9.7.6; rxe_comp.c).

use crate::abi;
use crate::transport::requester::{self, ack_timeout_ns};
use crate::transport::{psn, qp_to_error, write_record, Env};
use crate::verbs::qp::Qp;
use crate::wire::{rnr_timer_ns, AethKind, NakCode, RocePacket};

/// Handles a response packet (ACK, NAK) addressed to `qp`.
pub fn on_response(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) {
    if !matches!(qp.state, abi::QPS_RTS | abi::QPS_SQD) || qp.qp_type != abi::QPT_RC {
        return;
    }
    let Some(aeth) = pkt.hdr.aeth else { return };
    let p = pkt.hdr.bth.psn;
    // A response for a PSN we never sent is stale or bogus.
    if psn::diff(p, qp.req.psn) >= 0 || psn::diff(p, qp.req.acked_psn) < -(1 << 22) {
        return;
    }
    match aeth.kind() {
        AethKind::Ack { .. } => {
            if pkt.hdr.bth.opcode.is_ack() {
                ack_up_to(qp, env, p);
                requester::run(qp, env);
            }
        }
        AethKind::RnrNak { timer } => {
            ack_up_to(qp, env, psn::add(p, psn::PSN_MASK));
            env.out.stats.rnr_naks_received += 1;
            if qp.req.rnr_left == 0 {
                fail_head(qp, env, abi::WC_RNR_RETRY_EXC_ERR);
                return;
            }
            if qp.attr.rnr_retry != 7 {
                qp.req.rnr_left -= 1;
            }
            requester::rewind(qp, p);
            qp.req.rnr_deadline = Some(env.now + rnr_timer_ns(timer));
            qp.req.ack_deadline = None;
        }
        AethKind::Nak(code) => {
            ack_up_to(qp, env, psn::add(p, psn::PSN_MASK));
            env.out.stats.naks_received += 1;
            match code {
                NakCode::PsnSequenceError => {
                    requester::rewind(qp, p);
                    requester::run(qp, env);
                }
                NakCode::InvalidRequest | NakCode::InvalidRdRequest => {
                    fail_head(qp, env, abi::WC_REM_INV_REQ_ERR)
                }
                NakCode::RemoteAccessError => fail_head(qp, env, abi::WC_REM_ACCESS_ERR),
                NakCode::RemoteOperationalError => fail_head(qp, env, abi::WC_REM_OP_ERR),
            }
        }
        AethKind::Reserved(_) => {}
    }
}

/// Completes, in order, every WQE whose last packet is at or before `p`.
fn ack_up_to(qp: &mut Qp, env: &mut Env, p: u32) {
    let mut progress = false;
    if psn::diff(p, qp.req.acked_psn) > 0 {
        qp.req.acked_psn = p;
        progress = true;
    }
    while let Some(op) = qp.req.inflight.front() {
        if op.error.is_some()
            || op.sent < op.npkts
            || psn::diff(op.last_psn(), qp.req.acked_psn) > 0
        {
            break;
        }
        let op = qp.req.inflight.pop_front().expect("front exists");
        qp.req.send_pos = qp.req.send_pos.saturating_sub(1);
        requester::complete_op(qp, env, &op, abi::WC_SUCCESS);
        progress = true;
    }
    if progress {
        qp.req.retry_left = qp.attr.retry_cnt;
        qp.req.rnr_left = qp.attr.rnr_retry;
        qp.req.ack_deadline = if qp.req.inflight.is_empty() {
            None
        } else {
            ack_timeout_ns(qp.attr.timeout).map(|t| env.now + t)
        };
        write_record(qp, env);
    }
    complete_head_errors(qp, env);
}

/// If the oldest WQE failed locally, completes it with its error and moves
/// the QP to ERR (IBTA §10.8.3: a local error is fatal to the QP).
pub fn complete_head_errors(qp: &mut Qp, env: &mut Env) {
    let Some(status) = qp.req.inflight.front().and_then(|op| op.error) else {
        return;
    };
    fail_head(qp, env, status);
}

/// Completes the oldest WQE with `status` and moves the QP to ERR.
fn fail_head(qp: &mut Qp, env: &mut Env, status: u8) {
    if let Some(op) = qp.req.inflight.pop_front() {
        requester::complete_op(qp, env, &op, status);
    }
    qp_to_error(qp, env, status);
}

/// Runs the QP's timers at `env.now`: the end of an RNR back-off resumes
/// sending; an expired ACK timer retransmits from the oldest unacknowledged
/// PSN or, with no retries left, fails the WQE with `RETRY_EXC_ERR`.
/// Returns the QP's next deadline.
pub fn on_timer(qp: &mut Qp, env: &mut Env) -> Option<u64> {
    if let Some(t) = qp.req.rnr_deadline {
        if env.now >= t {
            qp.req.rnr_deadline = None;
            env.out.stats.retransmits += 1;
            requester::run(qp, env);
        }
    }
    if let Some(t) = qp.req.ack_deadline {
        if env.now >= t && qp.req.rnr_deadline.is_none() {
            if qp.req.inflight.is_empty() {
                qp.req.ack_deadline = None;
            } else if qp.req.retry_left == 0 {
                fail_head(qp, env, abi::WC_RETRY_EXC_ERR);
            } else {
                qp.req.retry_left -= 1;
                env.out.stats.retransmits += 1;
                qp.req.ack_deadline = ack_timeout_ns(qp.attr.timeout).map(|t| env.now + t);
                let from = psn::add(qp.req.acked_psn, 1);
                requester::rewind(qp, from);
                requester::run(qp, env);
            }
        }
    }
    if qp.req.waiting_arp && qp.state == abi::QPS_RTS {
        requester::run(qp, env);
    }
    let arp = qp.req.waiting_arp.then_some(env.now + 1_000_000);
    [qp.req.rnr_deadline, qp.req.ack_deadline, arp]
        .into_iter()
        .flatten()
        .min()
}
