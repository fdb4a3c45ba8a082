//! The completer: processes ACKs and NAKs for a QP's requests, completes
//! send WQEs in order, and drives retransmission on NAK, RNR NAK and the
//! local ACK timeout (IBTA Vol 1 §9.7.5.1, §9.7.6; rxe_comp.c).

use crate::abi;
use crate::transport::requester::{self, ack_timeout_ns};
use crate::transport::{psn, send_queue_error, write_record, Env};
use crate::verbs::qp::Qp;
use crate::wire::{rnr_timer_ns, AethKind, NakCode, Opcode, RocePacket};

/// Handles a response packet (ACK, NAK) addressed to `qp`.
pub fn on_response(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) {
    if !matches!(qp.state, abi::QPS_RTS | abi::QPS_SQD) || qp.qp_type != abi::QPT_RC {
        return;
    }
    let p = pkt.hdr.bth.psn;
    // A response for a PSN we never sent is stale or bogus.
    if psn::diff(p, qp.req.psn) >= 0 || psn::diff(p, qp.req.acked_psn) < -(1 << 22) {
        return;
    }
    let op = pkt.hdr.bth.opcode;
    if op.is_read_response() || op == Opcode::RcAtomicAck {
        on_read_or_atomic_response(qp, env, pkt);
        return;
    }
    let Some(aeth) = pkt.hdr.aeth else { return };
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
            env.out.stats.nak_received(code);
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
        // READ and atomics complete only with their responses.
        if op.error.is_some()
            || op.sent < op.npkts
            || op.needs_response()
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

/// Completes the oldest WQE with `status` and moves the QP to ERR (RC) or
/// SQE (UC, UD).
fn fail_head(qp: &mut Qp, env: &mut Env, status: u8) {
    if let Some(op) = qp.req.inflight.pop_front() {
        qp.req.send_pos = qp.req.send_pos.saturating_sub(1);
        requester::complete_op(qp, env, &op, status);
    }
    send_queue_error(qp, env, status);
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
                requester::rewind(qp, resume_psn(qp));
                requester::run(qp, env);
            }
        }
    }
    if (qp.req.waiting_arp.is_some() || qp.req.more)
        && matches!(qp.state, abi::QPS_RTS | abi::QPS_SQD)
    {
        requester::run(qp, env);
    }
    let arp = qp.req.waiting_arp.map(|_| env.now + 1_000_000);
    let more = qp.req.more.then_some(env.now);
    [qp.req.rnr_deadline, qp.req.ack_deadline, arp, more]
        .into_iter()
        .flatten()
        .min()
}

/// Where go-back-N resumes after a timeout: the first missing response of
/// a READ or atomic at the head, else the first unacknowledged PSN.
fn resume_psn(qp: &Qp) -> u32 {
    match qp.req.inflight.front() {
        Some(op) if op.needs_response() => psn::add(op.first_psn, op.resp_pkts),
        _ => psn::add(qp.req.acked_psn, 1),
    }
}

/// Handles a READ response or an atomic ACK (IBTA §9.7.5.1.5–6): the
/// response implicitly acknowledges every earlier request; its payload
/// lands in the READ's local SGEs (or the atomic's original value in its
/// 8-byte SGE); the last response completes the WQE. A gap in the response
/// PSNs re-requests from the first missing one; repeats are ignored.
fn on_read_or_atomic_response(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) {
    let p = pkt.hdr.bth.psn;
    let opcode = pkt.hdr.bth.opcode;
    // Everything before this response is implicitly acknowledged.
    ack_up_to(qp, env, psn::add(p, psn::PSN_MASK));
    let mtu = qp.mtu();
    let Some(op) = qp.req.inflight.front() else {
        return;
    };
    if !op.needs_response() || op.error.is_some() {
        return;
    }
    let atomic = op.wqe.opcode != abi::WR_RDMA_READ;
    if atomic != (opcode == Opcode::RcAtomicAck) {
        return;
    }
    let expected = psn::add(op.first_psn, op.resp_pkts);
    let d = psn::diff(p, expected);
    if d < 0 {
        env.out.stats.duplicates += 1;
        return;
    }
    if d > 0 {
        // Responses were lost: ask again from the first missing one, once
        // per gap (the ACK timer covers a lost re-request).
        if psn::diff(p, op.last_psn()) <= 0 && op.rerequested_at != Some(op.resp_pkts) {
            let n = op.resp_pkts;
            qp.req
                .inflight
                .front_mut()
                .expect("checked above")
                .rerequested_at = Some(n);
            requester::rewind(qp, expected);
            requester::run(qp, env);
        }
        return;
    }
    let last = op.resp_pkts + 1 == op.npkts;
    let result = if atomic {
        match pkt.hdr.atomic_ack_eth {
            Some(a) => requester::scatter(env, qp.pdn, op, 0, &a.orig.to_le_bytes()),
            None => Err(abi::WC_BAD_RESP_ERR),
        }
    } else {
        let len = pkt.payload.len() as u32;
        // resp_pkts < npkts = ceil(len / mtu) keeps this below len, unless
        // the path MTU changed since the request: then it is a bad response.
        let offset = op.resp_pkts.checked_mul(mtu);
        let want = offset.map(|o| op.len.saturating_sub(o).min(mtu));
        // Response opcodes count from the (re-)request they answer
        // (§9.7.5.1.5): only the final one must be LAST or ONLY.
        let kind_ok = if last {
            matches!(
                opcode,
                Opcode::RcReadResponseLast | Opcode::RcReadResponseOnly
            )
        } else {
            matches!(
                opcode,
                Opcode::RcReadResponseFirst | Opcode::RcReadResponseMiddle
            )
        };
        match offset {
            Some(offset) if kind_ok && Some(len) == want => {
                requester::scatter(env, qp.pdn, op, offset, pkt.payload)
            }
            _ => Err(abi::WC_BAD_RESP_ERR),
        }
    };
    if let Err(status) = result {
        fail_head(qp, env, status);
        return;
    }
    let op = qp.req.inflight.front_mut().expect("checked above");
    op.resp_pkts += 1;
    qp.req.retry_left = qp.attr.retry_cnt;
    if last {
        let op = qp.req.inflight.pop_front().expect("checked above");
        qp.req.send_pos = qp.req.send_pos.saturating_sub(1);
        if psn::diff(op.last_psn(), qp.req.acked_psn) > 0 {
            qp.req.acked_psn = op.last_psn();
        }
        requester::complete_op(qp, env, &op, abi::WC_SUCCESS);
        write_record(qp, env);
        complete_head_errors(qp, env);
        ack_up_to(qp, env, qp.req.acked_psn);
    }
    qp.req.ack_deadline = if qp.req.inflight.is_empty() {
        None
    } else {
        ack_timeout_ns(qp.attr.timeout).map(|t| env.now + t)
    };
    requester::run(qp, env);
}
