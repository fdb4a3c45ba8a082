//! The completer: processes ACKs and NAKs for a QP's requests, completes
//! send WQEs in order, and drives retransmission on NAK, RNR NAK and the
//! local ACK timeout (IBTA Vol 1 §9.7.5.1, §9.7.6; rxe_comp.c).

use crate::abi;
use crate::batch::{self, Packet};
use crate::data::Data;
use crate::transport::requester::{self, ack_timeout_ns, complete_head_errors, fail_head};
use crate::transport::stats::Counter;
use crate::transport::Qp;
use crate::transport::{psn, write_record, Env};
use crate::wire::{rnr_timer_ns, AethKind, NakCode, Opcode};

/// Handles a response packet (ACK, NAK, READ response, atomic ACK)
/// addressed to `qp`: the driver of rxe's completer state machine
/// (`rxe_completer`): `check_psn`, `check_ack`, then for an ACK
/// `complete_ack`, for an RNR NAK `rnr_retry`, for a NAK `on_nak`,
/// and for a READ response or atomic ACK `on_read_or_atomic_response`
/// (`check_resp_psn`, `do_read` or `do_atomic`, `complete_wqe`).
pub fn on_response(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    if !takes_response(qp, pkt) {
        return;
    }
    let p = pkt.hdr.bth.psn;
    match check_ack(pkt) {
        AckKind::ReadOrAtomic => on_read_or_atomic_response(qp, env, pkt),
        AckKind::Ack => {
            complete_ack(qp, env, p);
            requester::run(qp, env);
        }
        AckKind::Rnr { timer } => rnr_retry(qp, env, p, timer),
        AckKind::Nak(code) => on_nak(qp, env, p, code),
        AckKind::Ignore => {}
    }
}

/// True when the completer looks at response `pkt` at all: the QP is RC
/// and in RTS or SQD, where its requester may have requests outstanding
/// (IBTA §10.3.1: the states [`check_type_state`] admits responses in,
/// asked again per packet since an earlier one, of a run or of a batch,
/// may have moved the QP to ERR), and the response's PSN is one the
/// requester sent ([`check_psn`]). Anything else is ignored.
///
/// [`check_type_state`]: crate::transport::hdr_check::check_type_state
fn takes_response(qp: &Qp, pkt: &Packet) -> bool {
    matches!(qp.state, abi::QpState::Rts | abi::QpState::Sqd)
        && qp.qp_type == abi::QpType::Rc
        && check_psn(qp, pkt)
}

/// rxe's `check_psn`, its first part: a response must be for a PSN the
/// requester sent, before the next PSN and not far (2^22) behind the
/// last acknowledged one; anything else is stale or bogus and dropped.
/// (The checks against the WQE a READ response or atomic ACK answers are
/// [`check_resp_psn`].)
fn check_psn(qp: &Qp, pkt: &Packet) -> bool {
    let p = pkt.hdr.bth.psn;
    psn::diff(p, qp.req.psn) < 0 && psn::diff(p, qp.req.acked_psn) >= -(1 << 22)
}

/// What a response asks of the completer ([`check_ack`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AckKind {
    /// A READ response or an atomic ACK: data for the WQE at the head.
    ReadOrAtomic,
    /// An ACK: every WQE up to its PSN is done.
    Ack,
    /// An RNR NAK with its encoded timer (IBTA Table 45).
    Rnr {
        /// Encoded RNR timer, 0-31.
        timer: u8,
    },
    /// A NAK with its code (IBTA Table 45; [`on_nak`]).
    Nak(NakCode),
    /// Nothing to do: no AETH, a reserved syndrome, or an ACK syndrome on
    /// an opcode that is not an acknowledgement.
    Ignore,
}

/// rxe's `check_ack`: classifies a response by its opcode and its AETH
/// syndrome (IBTA §9.3.5, Table 44).
fn check_ack(pkt: &Packet) -> AckKind {
    let op = pkt.hdr.bth.opcode;
    if op.is_read_response() || op == Opcode::RcAtomicAck {
        return AckKind::ReadOrAtomic;
    }
    let Some(aeth) = pkt.hdr.aeth else {
        return AckKind::Ignore;
    };
    match aeth.kind() {
        AethKind::Ack { .. } if op.is_ack() => AckKind::Ack,
        AethKind::Ack { .. } | AethKind::Reserved(_) => AckKind::Ignore,
        AethKind::RnrNak { timer } => AckKind::Rnr { timer },
        AethKind::Nak(code) => AckKind::Nak(code),
    }
}

/// An ACK for PSN `p`: completes every WQE up to it (rxe's
/// `COMPST_COMP_ACK` and `complete_ack`).
fn complete_ack(qp: &mut Qp, env: &mut Env, p: u32) {
    ack_up_to(qp, env, p);
}

/// An RNR NAK for PSN `p` (IBTA §9.7.5.1; rxe's `COMPST_RNR_RETRY`):
/// everything before it is acknowledged; with RNR retries left (7 is
/// infinite) the requester goes back to `p` after the timer, else the WQE
/// fails with `WC_RNR_RETRY_EXC_ERR`.
fn rnr_retry(qp: &mut Qp, env: &mut Env, p: u32, timer: u8) {
    ack_up_to(qp, env, psn::add(p, psn::PSN_MASK));
    env.res.out.stats.count(Counter::rnr_naks_received, 1);
    if qp.req.rnr_left == 0 {
        fail_head(qp, env, abi::WcStatus::RnrRetryExcErr);
        return;
    }
    if qp.attr.rnr_retry != 7 {
        qp.req.rnr_left -= 1;
    }
    requester::rewind(qp, p);
    qp.req.rnr_deadline = Some(env.now + rnr_timer_ns(timer));
    qp.req.ack_deadline = None;
}

/// A NAK for PSN `p`: everything before it is acknowledged; a PSN
/// sequence error goes back to `p` ([`retry_after_nak`]), any other
/// code fails the WQE with the matching remote error (rxe's
/// `COMPST_ERROR`; IBTA §9.7.5.1, Table 45).
fn on_nak(qp: &mut Qp, env: &mut Env, p: u32, code: NakCode) {
    ack_up_to(qp, env, psn::add(p, psn::PSN_MASK));
    env.res.out.stats.nak_received(code);
    match code {
        NakCode::PsnSequenceError => retry_after_nak(qp, env, p),
        NakCode::InvalidRequest | NakCode::InvalidRdRequest => {
            fail_head(qp, env, abi::WcStatus::RemInvReqErr)
        }
        NakCode::RemoteAccessError => fail_head(qp, env, abi::WcStatus::RemAccessErr),
        NakCode::RemoteOperationalError => fail_head(qp, env, abi::WcStatus::RemOpErr),
    }
}

/// A PSN sequence error NAK for `p` (rxe's `COMPST_ERROR_RETRY`): a
/// retry as after a timeout, from `p` — counted against the QP's
/// `retry_cnt`, the head WQE failed with `RETRY_EXC_ERR` when none is
/// left — unless a retry is under way already (one started since the
/// last progress, [`ReqState::retry_started`]): then the NAK starts none,
/// as in rxe, and a lost resend is the timer's. Without that, a peer
/// repeating its NAK (a duplicated frame, or a hostile peer) had the
/// window resent for every copy, without end.
///
/// [`ReqState::retry_started`]: crate::transport::requester::ReqState::retry_started
fn retry_after_nak(qp: &mut Qp, env: &mut Env, p: u32) {
    if qp.req.inflight.is_empty() || qp.req.retry_started {
        return;
    }
    if qp.req.retry_left == 0 {
        fail_head(qp, env, abi::WcStatus::RetryExcErr);
        return;
    }
    qp.req.retry_left -= 1;
    qp.req.retry_started = true;
    qp.req.cwnd.on_nak();
    requester::rewind(qp, p);
    requester::run(qp, env);
}

/// Completes, in order, every WQE whose last packet is at or before `p`.
fn ack_up_to(qp: &mut Qp, env: &mut Env, p: u32) {
    let mut progress = false;
    let acked = psn::diff(p, qp.req.acked_psn);
    if acked > 0 {
        qp.req.acked_psn = p;
        qp.req.cwnd.on_ack(acked as u32);
        qp.req.rtt.on_ack(p, env.now);
        qp.req.probe_deadline = None;
        qp.req.probe_sent = false;
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
        requester::complete_op(qp, env, &op, abi::WcStatus::Success);
        progress = true;
    }
    if progress {
        qp.req.retry_left = qp.attr.retry_cnt;
        qp.req.retry_started = false;
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

/// Runs the QP's timers at `env.now`: the end of an RNR back-off resumes
/// sending; an expired ACK timer retransmits from the oldest unacknowledged
/// PSN or, with no retries left, fails the WQE with `RETRY_EXC_ERR` —
/// unless the QP's last packets still wait in this device's queue or its
/// owner's hands ([`crate::transport::Output::departed`]): then it starts
/// again (`ack_timeouts_deferred`).
/// Returns the QP's next deadline.
pub fn on_timer(qp: &mut Qp, env: &mut Env) -> Option<u64> {
    if let Some(t) = qp.req.rnr_deadline {
        if env.now >= t {
            qp.req.rnr_deadline = None;
            env.res.out.stats.count(Counter::retransmits, 1);
            requester::run(qp, env);
        }
    }
    if let Some(t) = qp.req.ack_deadline {
        if env.now >= t && qp.req.rnr_deadline.is_none() {
            if qp.req.inflight.is_empty() {
                qp.req.ack_deadline = None;
            } else if sent_still_queued(qp, env) {
                // Its last packets have not left this device yet: the
                // peer cannot have answered them. The timer starts again
                // (rxe restarts it as each packet goes, rxe_req.c
                // update_state), so it measures the peer's silence.
                env.res.out.stats.count(Counter::ack_timeouts_deferred, 1);
                qp.req.ack_deadline = ack_timeout_ns(qp.attr.timeout).map(|t| env.now + t);
            } else if qp.req.retry_left == 0 {
                fail_head(qp, env, abi::WcStatus::RetryExcErr);
            } else {
                qp.req.retry_left -= 1;
                qp.req.retry_started = true;
                qp.req.cwnd.on_timeout();
                env.res.out.stats.count(Counter::retransmits, 1);
                qp.req.ack_deadline = ack_timeout_ns(qp.attr.timeout).map(|t| env.now + t);
                requester::rewind(qp, resume_psn(qp));
                requester::run(qp, env);
            }
        }
    }
    // After the ACK timer: a retry it starts makes the probe moot.
    if let Some(t) = qp.req.probe_deadline {
        if env.now >= t && qp.req.rnr_deadline.is_none() && qp.state == abi::QpState::Rts {
            qp.req.probe_deadline = None;
            if sent_still_queued(qp, env) {
                // Not gone yet: nothing can have come back.
                let pto = qp.req.rtt.pto(ack_timeout_ns(qp.attr.timeout));
                qp.req.probe_deadline = Some(env.now + pto);
            } else {
                requester::probe(qp, env);
            }
        }
    }
    if (qp.req.waiting_arp.is_some() || qp.req.more)
        && matches!(qp.state, abi::QpState::Rts | abi::QpState::Sqd)
    {
        requester::run(qp, env);
    }
    let arp = qp.req.waiting_arp.map(|_| env.now + 1_000_000);
    let more = qp.req.more.then_some(env.now);
    [
        qp.req.rnr_deadline,
        qp.req.ack_deadline,
        qp.req.probe_deadline,
        arp,
        more,
    ]
    .into_iter()
    .flatten()
    .min()
}

/// Whether the QP's last request packets are still in this device's queue
/// or its owner's hands ([`crate::transport::Output::departed`]): the
/// peer cannot have answered them, so neither the ACK timer nor the tail
/// probe blames it.
fn sent_still_queued(qp: &Qp, env: &Env) -> bool {
    env.res.out.departed() < qp.req.tx_mark
}

/// Where go-back-N resumes after a timeout: the first missing response of
/// a READ or atomic at the head, else the first unacknowledged PSN.
fn resume_psn(qp: &Qp) -> u32 {
    match qp.req.inflight.front() {
        Some(op) if op.needs_response() => psn::add(op.first_psn, op.resp_pkts),
        _ => psn::add(qp.req.acked_psn, 1),
    }
}

/// Where a READ response or atomic ACK falls against the WQE at the head
/// ([`check_resp_psn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RespPsn {
    /// Not for the head WQE: none, not a READ or atomic, failed already,
    /// or a response of the other kind. Ignored.
    NotForHead,
    /// A response already received. Counted and ignored.
    Duplicate,
    /// Responses before it were lost; `expected` is the first missing one.
    Gap {
        /// PSN of the first missing response.
        expected: u32,
    },
    /// The next response expected.
    InOrder,
}

/// rxe's `check_psn` (its part against the WQE) for a READ response or
/// atomic ACK: the head WQE must be a READ (for a READ response) or an
/// atomic (for an atomic ACK) still waiting, and the response its next one.
fn check_resp_psn(qp: &Qp, pkt: &Packet) -> RespPsn {
    let Some(op) = qp.req.inflight.front() else {
        return RespPsn::NotForHead;
    };
    if !op.needs_response() || op.error.is_some() {
        return RespPsn::NotForHead;
    }
    let atomic = op.opcode != abi::WrOpcode::RdmaRead;
    if atomic != (pkt.hdr.bth.opcode == Opcode::RcAtomicAck) {
        return RespPsn::NotForHead;
    }
    let expected = psn::add(op.first_psn, op.resp_pkts);
    match psn::diff(pkt.hdr.bth.psn, expected) {
        d if d < 0 => RespPsn::Duplicate,
        d if d > 0 => RespPsn::Gap { expected },
        _ => RespPsn::InOrder,
    }
}

/// Handles a READ response or an atomic ACK (IBTA §9.7.5.1.5–6): the
/// response implicitly acknowledges every earlier request; its payload
/// lands in the READ's local SGEs ([`do_read`]) or the atomic's original
/// value in its 8-byte SGE ([`do_atomic`]); the last response completes
/// the WQE ([`complete_wqe`]). A gap in the response PSNs re-requests from
/// the first missing one; repeats are ignored ([`check_resp_psn`]).
fn on_read_or_atomic_response(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    let p = pkt.hdr.bth.psn;
    // Everything before this response is implicitly acknowledged.
    ack_up_to(qp, env, psn::add(p, psn::PSN_MASK));
    match check_resp_psn(qp, pkt) {
        RespPsn::NotForHead => return,
        RespPsn::Duplicate => {
            env.res.out.stats.count(Counter::duplicates, 1);
            return;
        }
        RespPsn::Gap { expected } => {
            rerequest(qp, env, expected);
            return;
        }
        RespPsn::InOrder => {}
    }
    let Some(op) = qp.req.inflight.front() else {
        return;
    };
    let last = op.resp_pkts + 1 == op.npkts;
    let result = if pkt.hdr.bth.opcode == Opcode::RcAtomicAck {
        do_atomic(qp, env, pkt)
    } else {
        do_read(qp, env, pkt)
    };
    if let Err(status) = result {
        fail_head(qp, env, status);
        return;
    }
    responses_landed(qp, env, 1, last);
}

/// `n` responses of the head WQE landed (the `last` ones with them): they
/// count, the retries start afresh, the WQE completes after its last
/// response, the ACK timer restarts (or stops with nothing in flight),
/// and the requester goes on.
fn responses_landed(qp: &mut Qp, env: &mut Env, n: u32, last: bool) {
    let Some(op) = qp.req.inflight.front_mut() else {
        return;
    };
    op.resp_pkts += n;
    // The response answers the request that asked for it: a round trip
    // when it is the one timed.
    let p = psn::add(op.first_psn, op.resp_pkts - 1);
    // A response in order acknowledges its own PSN too, not only those
    // before it: nothing more is awaited for it. Else the window counts
    // it as unacknowledged, a re-request from the next one (after a gap,
    // a probe or a timeout) starts one PSN "ahead" and, when its chunk
    // does not fit in what the window has left, never goes: a READ then
    // waited out its retries (the soak's 8 MiB READs), and a chunked
    // READ waited for an ACK timeout between chunks.
    qp.req.rtt.on_ack(p, env.now);
    if !last {
        ack_up_to(qp, env, p);
    }
    qp.req.retry_left = qp.attr.retry_cnt;
    qp.req.retry_started = false;
    if last {
        complete_wqe(qp, env);
    }
    qp.req.ack_deadline = if qp.req.inflight.is_empty() {
        None
    } else {
        ack_timeout_ns(qp.attr.timeout).map(|t| env.now + t)
    };
    requester::run(qp, env);
}

/// A run of READ responses ([`batch::Run`]) to `qp`, whose header checks
/// its first packet passed. Taken whole when its packets would all land
/// in turn: the next responses of the READ at the head, the stride the
/// path MTU, the run ending the READ exactly when its last packet is a
/// LAST and its payload what those responses carry; then one scatter,
/// the responses counted, the WQE completed after its last. Anything
/// else is handled packet by packet ([`on_response`]), as it would have
/// come.
pub fn on_run(qp: &mut Qp, env: &mut Env, run: &batch::Run) {
    if !take_run(qp, env, run) {
        for p in run.packets() {
            on_response(qp, env, &p);
        }
    }
}

/// [`on_run`]'s whole case; false (nothing done) when it does not apply:
/// the questions [`on_response`] and [`on_read_or_atomic_response`] ask
/// of one packet ([`takes_response`], [`check_ack`], [`check_resp_psn`],
/// [`read_fits`]), asked of the run.
fn take_run(qp: &mut Qp, env: &mut Env, run: &batch::Run) -> bool {
    let first = &run.first;
    // A run's responses are READ responses (batch::Run::new): what
    // check_ack calls ReadOrAtomic.
    let ok = run.stride == qp.mtu() as usize
        && takes_response(qp, first)
        && check_ack(first) == AckKind::ReadOrAtomic;
    if !ok {
        return false;
    }
    // Everything before the run is implicitly acknowledged (as by its
    // first packet).
    let p = first.hdr.bth.psn;
    ack_up_to(qp, env, psn::add(p, psn::PSN_MASK));
    if check_resp_psn(qp, first) != RespPsn::InOrder {
        return false;
    }
    let Some(op) = qp.req.inflight.front() else {
        return false;
    };
    let ends = op.resp_pkts + run.count == op.npkts;
    let is_last = run.last.bth.opcode.is_last();
    let Some(offset) = read_fits(op, qp.mtu(), run.count, first.payload_len(), is_last) else {
        return false;
    };
    if let Err(status) = requester::scatter(env, qp.pdn, op, offset, first.data()) {
        fail_head(qp, env, status);
        return true;
    }
    responses_landed(qp, env, run.count, ends);
    true
}

/// Responses before PSN `p` were lost: asks again from the first missing
/// one, `expected`, once per gap (the ACK timer covers a lost re-request);
/// rxe's `COMPST_ERROR_RETRY` for a READ, also when `p` answers a later
/// request (rxe's `check_psn`: a response past the head READ's last PSN
/// while it waits): responses come in PSN order, so the head's missing
/// ones are lost, and waiting for the ACK timeout would stall the QP.
fn rerequest(qp: &mut Qp, env: &mut Env, expected: u32) {
    let Some(op) = qp.req.inflight.front_mut() else {
        return;
    };
    if op.rerequested_at != Some(op.resp_pkts) {
        op.rerequested_at = Some(op.resp_pkts);
        // Responses were lost on the way: as a sequence NAK for SEND and
        // WRITE, the window halves.
        qp.req.cwnd.on_nak();
        requester::rewind(qp, expected);
        requester::run(qp, env);
    }
}

/// rxe's `do_read`: the in-order READ response `pkt` for the head WQE
/// lands at its message offset. Its opcode must be LAST or ONLY exactly
/// when it is the last response of the request it answers (response
/// opcodes count from the (re-)request they answer, §9.7.5.1.5; a READ
/// is asked for in chunks, [`SendOp::request_end`]), and its payload the
/// path MTU, or the rest for the message's last ([`read_fits`]); else
/// `WC_BAD_RESP_ERR`.
/// A scatter error is the WQE's status.
///
/// [`SendOp::request_end`]: crate::transport::requester::SendOp::request_end
fn do_read(qp: &Qp, env: &Env, pkt: &Packet) -> Result<(), abi::WcStatus> {
    let op = qp.req.inflight.front().ok_or(abi::WcStatus::BadRespErr)?;
    // A READ response (check_ack, check_resp_psn): LAST or ONLY is_last,
    // FIRST or MIDDLE not.
    let is_last = pkt.hdr.bth.opcode.is_last();
    match read_fits(op, qp.mtu(), 1, pkt.payload_len(), is_last) {
        Some(offset) => requester::scatter(env, qp.pdn, op, offset, pkt.data()),
        None => Err(abi::WcStatus::BadRespErr),
    }
}

/// Where the next `count` READ responses of `op` (the head WQE, waiting
/// for its response `op.resp_pkts`), `payload_len` bytes together, land:
/// their byte offset in the message, when they fit (rxe's `do_read`
/// rule, IBTA §9.7.5.1.5, asked of one packet or of a run): they end
/// inside the (re-)request that asks for the first of them
/// ([`SendOp::request_end`]), the last of them is a LAST or ONLY
/// (`last_is_last`) exactly when it ends that request, and they carry
/// `count` path MTUs (`mtu`, bytes) or what is left of the message if
/// less. `None` otherwise, and when the offset overflows: the path MTU
/// changed since the request (`resp_pkts < npkts = ceil(len / mtu)`
/// keeps it below the length otherwise).
///
/// [`SendOp::request_end`]: crate::transport::requester::SendOp::request_end
fn read_fits(
    op: &requester::SendOp,
    mtu: u32,
    count: u32,
    payload_len: usize,
    last_is_last: bool,
) -> Option<u32> {
    let (end, upto) = (op.request_end(op.resp_pkts), op.resp_pkts + count);
    let offset = op.resp_pkts.checked_mul(mtu)?;
    let want = op.len.saturating_sub(offset).min(count * mtu);
    let fits = upto <= end && (upto == end) == last_is_last && want as usize == payload_len;
    fits.then_some(offset)
}

/// rxe's `do_atomic`: the atomic ACK's original value lands in the head
/// WQE's 8-byte SGE; an atomic ACK without an AtomicAckETH is
/// `WC_BAD_RESP_ERR`.
fn do_atomic(qp: &Qp, env: &Env, pkt: &Packet) -> Result<(), abi::WcStatus> {
    let op = qp.req.inflight.front().ok_or(abi::WcStatus::BadRespErr)?;
    match pkt.hdr.atomic_ack_eth {
        Some(a) => requester::scatter(env, qp.pdn, op, 0, Data::Bytes(&a.orig.to_le_bytes())),
        None => Err(abi::WcStatus::BadRespErr),
    }
}

/// rxe's `complete_wqe` for a READ or atomic whose last response arrived:
/// the head WQE completes successfully, its PSNs count as acknowledged,
/// and the WQEs behind it that were already acknowledged (or failed
/// locally) complete too.
fn complete_wqe(qp: &mut Qp, env: &mut Env) {
    let Some(op) = qp.req.inflight.pop_front() else {
        return;
    };
    qp.req.send_pos = qp.req.send_pos.saturating_sub(1);
    if psn::diff(op.last_psn(), qp.req.acked_psn) > 0 {
        qp.req.acked_psn = op.last_psn();
    }
    requester::complete_op(qp, env, &op, abi::WcStatus::Success);
    write_record(qp, env);
    complete_head_errors(qp, env);
    ack_up_to(qp, env, qp.req.acked_psn);
}
