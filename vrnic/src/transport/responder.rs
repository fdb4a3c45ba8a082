//! The responder: checks each incoming request's PSN and opcode sequence,
//! executes SEND and RDMA WRITE into driver memory, completes receive WQEs,
//! and answers with ACK, NAK or RNR NAK (IBTA Vol 1 §9.7.4.1, §9.7.5.2,
//! §9.9; rxe_resp.c). Every error is answered: a requester never hangs.

use crate::abi;
use crate::batch::{self, Packet};
use crate::transport::recv_queue::{self, RecvCtx};
use crate::transport::stats::Counter;
use crate::transport::Qp;
use crate::transport::MAX_MSG_SZ;
use crate::transport::{
    psn, qp_to_error, reply_headers, write_record, Env, Output, TX_BACKLOG_MAX,
};
use crate::wire::{Aeth, AtomicAckEth, AtomicEth, NakCode, Opcode, RoceHeaders, Transport};

/// "Unlimited" credit count in an ACK's AETH (IBTA Table 44: 0x1F is
/// "invalid/no credit information", which end-to-end flow control ignores).
const CREDITS_UNLIMITED: u8 = 0x1f;

/// Most READ response packets one QP's response stream sends in one step
/// (one [`on_request`] or [`run`] call), as the requester's burst limit
/// for long sends: a READ of any size is answered incrementally, resumed
/// by [`crate::device::Device::poll`] (rxe's `read_reply` sends one packet
/// per call and its responder task reschedules itself).
pub const READ_BURST: u32 = 64;

/// Request frames one RC QP holds while its READ response stream is in
/// progress (responses must leave in PSN order, IBTA §9.7.5.1.5: a later
/// request is answered only after the READ's last response; rxe keeps
/// them in the QP's `req_pkts` queue). The requester's window
/// ([`crate::transport::requester::MAX_INFLIGHT_PKTS`], rxe's
/// `RXE_MAX_UNACKED_PSNS`, both 128): what a conforming requester can
/// send behind a READ fits. Past it, and past [`RESP_HOLD_DEVICE_MAX`],
/// such frames are dropped (counted in `rx_dropped`) and the requester's
/// retransmission brings them again.
pub const RESP_HOLD_MAX: usize = crate::transport::requester::MAX_INFLIGHT_PKTS as usize;

/// Request frames held by all QPs of a device together
/// ([`RESP_HOLD_MAX`]): at most 1024 × [`HELD_FRAME_MAX`], 4.3 MiB.
pub const RESP_HOLD_DEVICE_MAX: usize = 1024;

/// Largest frame held, bytes: a RoCEv2 request over IPv6 with RETH,
/// ImmDt and a 4096-byte payload fits (14 + 40 + 8 + 12 + 16 + 4 + 4096
/// + 4 = 4194). A longer frame cannot be a valid request.
pub const HELD_FRAME_MAX: usize = 4352;

/// The READ response stream of a QP: the responses of one READ request
/// (or of a duplicate that restarted it) still to send. rxe's
/// `qp->resp.res` with its `read.va`, `read.resid` and `cur_psn`.
#[derive(Debug, Clone)]
pub struct ReadStream {
    /// PSN of the next response.
    pub psn: u32,
    /// Virtual address of the next byte to read.
    pub va: u64,
    /// Bytes still to send.
    pub resid: u32,
    /// R_Key of the request, checked again for every response (rxe's
    /// `rxe_recheck_mr`): an MR deregistered meanwhile ends the stream
    /// with a remote access error NAK.
    pub rkey: u32,
    /// No response sent yet: the next is FIRST (or ONLY).
    pub first: bool,
    /// MSN carried in the AETH of FIRST, LAST and ONLY responses.
    pub msn: u32,
    /// Headers of the request being answered: responses go to its source,
    /// which the header checks proved is the QP's peer.
    pub req: RoceHeaders,
}

/// An RDMA WRITE in progress.
#[derive(Debug, Clone, Copy)]
pub struct WriteCtx {
    /// The rkey of the first packet's RETH, checked again for every
    /// packet (`check_rkey`, as rxe does): an MR invalidated or
    /// deregistered meanwhile fails the rest of the WRITE with a remote
    /// access error NAK.
    pub rkey: u32,
    /// Next virtual address to write.
    pub va: u64,
    /// Bytes still expected.
    pub remaining: u32,
    /// Total DMA length.
    pub total: u32,
}

/// Responder state of a QP.
#[derive(Debug, Default)]
pub struct RespState {
    /// Expected PSN of the next request.
    pub epsn: u32,
    /// Message sequence number: completed requests (24 bits).
    pub msn: u32,
    /// Producer index the driver rang.
    pub rq_pi: u32,
    /// Oldest unconsumed RQ index.
    pub rq_ci: u32,
    /// The message in progress, if any ([`InboundMsg`]).
    pub msg: InboundMsg,
    /// UC: a receive WQE taken for a message that was abandoned after a
    /// lost packet; the next SEND uses it (it was never completed).
    pub spare: Option<RecvCtx>,
    /// A PSN sequence error NAK was sent and not yet cleared by the expected PSN.
    pub nak_sent: bool,
    /// The most recent RDMA READ and atomic requests executed, oldest
    /// first, at most `max_dest_rd_atomic` of them: the responder
    /// resources of IBTA §9.5 (rxe's `resources`). A duplicate READ or
    /// atomic is answered again only if it falls in one of them.
    pub rd_atomic: std::collections::VecDeque<RdAtomicRes>,
    /// The READ response stream in progress, if any (at most one per QP).
    pub read: Option<ReadStream>,
    /// Requests received while `read` was in progress, in arrival order,
    /// each at most [`HELD_FRAME_MAX`] bytes as a frame, at most
    /// [`RESP_HOLD_MAX`] of them: processed once the stream has ended.
    pub held: std::collections::VecDeque<HeldRequest>,
}

/// A request packet kept while a READ response stream is in progress
/// ([`RespState::held`]), as it was parsed.
#[derive(Debug, Clone)]
pub struct HeldRequest {
    /// Its headers.
    pub hdr: RoceHeaders,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// One responder resource: an executed RDMA READ or atomic request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdAtomicRes {
    /// PSN of the request (= of its first response).
    pub psn: u32,
    /// PSNs its responses use: READ response packets, 1 for an atomic.
    pub npsn: u32,
    /// What was executed.
    pub kind: RdAtomicKind,
}

/// What a responder resource remembers of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdAtomicKind {
    /// An RDMA READ: its RETH, so that a duplicate is answered only for
    /// the same R_Key and a part of the same bytes (rxe's
    /// `duplicate_request`).
    Read {
        /// R_Key of the request.
        rkey: u32,
        /// Virtual address of the first byte read.
        va: u64,
        /// DMA length, bytes.
        len: u32,
    },
    /// An atomic: its original value, returned again to a duplicate
    /// without executing twice (IBTA §9.7.5.2.5 C9-96).
    Atomic {
        /// The 8 bytes at the target before the operation.
        orig: u64,
    },
}

impl RdAtomicRes {
    /// True when the duplicate READ request `pkt` (its PSN inside this
    /// resource) may be answered again (IBTA §9.7.5.2.3): this is a READ
    /// resource, same R_Key, the requested bytes within the original ones,
    /// and its responses within the original PSNs, so a resend from the
    /// first missing response (`psn + k`, `va + k × MTU`) qualifies and a
    /// forged or stale one reads nothing more. `mtu` in bytes.
    fn replays_read(&self, pkt: &Packet, mtu: u32) -> bool {
        let (RdAtomicKind::Read { rkey, va, len }, Some(reth)) = (self.kind, pkt.hdr.reth) else {
            return false;
        };
        let Some(offset) = reth.va.checked_sub(va) else {
            return false;
        };
        let d = psn::diff(pkt.hdr.bth.psn, self.psn) as u32;
        reth.rkey == rkey
            && u64::from(len)
                .checked_sub(offset)
                .is_some_and(|rest| u64::from(reth.dma_len) <= rest)
            && u64::from(d) + u64::from(reth.dma_len.div_ceil(mtu).max(1)) <= u64::from(self.npsn)
    }
}

impl RespState {
    /// Ends the READ response stream and forgets the held request frames,
    /// returning them to the device's count ([`Output::held_frames`]):
    /// when the QP goes to ERR or RESET or is destroyed.
    pub fn release(&mut self, out: &mut Output) {
        self.read = None;
        out.held_frames = out.held_frames.saturating_sub(self.held.len());
        self.held.clear();
    }

    /// The resource whose responses include `p`, newest first.
    fn rd_atomic_res(&self, p: u32) -> Option<RdAtomicRes> {
        self.rd_atomic
            .iter()
            .rev()
            .find(|r| {
                let d = psn::diff(p, r.psn);
                d >= 0 && (d as u32) < r.npsn
            })
            .copied()
    }

    /// Remembers an executed READ or atomic, forgetting the oldest beyond
    /// `max_dest_rd_atomic` (at least 1) resources: at most 128 entries
    /// (`MAX_QP_RD_ATOM`, the most `modify_qp` accepts).
    fn push_rd_atomic(&mut self, res: RdAtomicRes, max_dest_rd_atomic: u8) {
        let cap = usize::from(max_dest_rd_atomic.max(1));
        while self.rd_atomic.len() >= cap {
            self.rd_atomic.pop_front();
        }
        self.rd_atomic.push_back(res);
    }
}

/// Handles a request packet addressed to `qp` (RC or UC; UD requests go
/// to [`crate::transport::datagram::on_request`]). Packets of another
/// transport than the QP's are dropped. While an RC QP's READ response
/// stream is in progress a request is held (bounded: [`RESP_HOLD_MAX`])
/// until the stream ends, except a duplicate READ, which restarts the
/// stream at once (rxe's `duplicate_request`). Then sends what the stream
/// has to send, within [`READ_BURST`].
pub fn on_request(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    if held_back(qp, pkt) {
        hold(qp, env, pkt);
        return;
    }
    process(qp, env, pkt);
    run(qp, env);
}

/// True while the QP's READ response stream is in progress or requests
/// wait behind it ([`RespState::held`]): responses leave in PSN order
/// (IBTA §9.7.5.1.5), so the requests that come meanwhile wait too
/// (rxe's `req_pkts` queue). Only an RC QP has a READ stream.
fn busy(qp: &Qp) -> bool {
    qp.resp.read.is_some() || !qp.resp.held.is_empty()
}

/// True when request `pkt` must wait behind the READ response stream
/// ([`hold`]): the QP is RC and [`busy`], and `pkt` is not a duplicate
/// READ ([`check_psn`]), which restarts the stream at once (rxe's
/// `duplicate_request`).
fn held_back(qp: &Qp, pkt: &Packet) -> bool {
    let dup_read =
        pkt.hdr.bth.opcode == Opcode::RcReadRequest && check_psn(qp, pkt) == PsnCheck::Duplicate;
    busy(qp) && qp.qp_type == abi::QpType::Rc && !dup_read
}

/// Keeps `pkt` for after the READ stream, within the bounds.
fn hold(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    if qp.resp.held.len() < RESP_HOLD_MAX
        && env.res.out.held_frames < RESP_HOLD_DEVICE_MAX
        && pkt.hdr.frame_len(pkt.payload_len()) <= HELD_FRAME_MAX
    {
        // Out of the sender's memory now, for a packet by reference.
        let Ok(payload) = pkt.data().to_vec() else {
            env.res.out.stats.count(Counter::rx_dropped, 1);
            return;
        };
        qp.resp.held.push_back(HeldRequest {
            hdr: pkt.hdr.clone(),
            payload,
        });
        env.res.out.held_frames += 1;
    } else {
        env.res.out.stats.count(Counter::rx_dropped, 1);
    }
}

/// Continues the QP's responder work: the READ response stream, at most
/// [`READ_BURST`] packets and none while [`TX_BACKLOG_MAX`] frames wait
/// for the link; once it has ended, the held requests in order (one of
/// which may start another stream). Returns true when work remains, for
/// the next [`crate::device::Device::poll`] ("now"). Bounded: at most
/// `READ_BURST` responses and [`RESP_HOLD_MAX`] held frames per call.
pub fn run(qp: &mut Qp, env: &mut Env) -> bool {
    let mut budget = READ_BURST;
    for _ in 0..=RESP_HOLD_MAX {
        if !read_reply(qp, env, &mut budget) {
            return true;
        }
        let Some(held) = qp.resp.held.pop_front() else {
            return false;
        };
        env.res.out.held_frames = env.res.out.held_frames.saturating_sub(1);
        let pkt = Packet {
            hdr: held.hdr,
            payload: &held.payload,
            peer: None,
        };
        process(qp, env, &pkt);
    }
    qp.resp.read.is_some() || !qp.resp.held.is_empty()
}

/// Sends the next responses of the QP's READ stream (IBTA §9.7.4.1.4;
/// rxe's `read_reply`), decrementing `budget` per packet. True when no
/// stream is left in progress (ended, or none); false when it stopped for
/// the budget or the link backlog.
fn read_reply(qp: &mut Qp, env: &mut Env, budget: &mut u32) -> bool {
    let Some(mut st) = qp.resp.read.take() else {
        return true;
    };
    let mtu = qp.mtu();
    loop {
        if *budget == 0 || env.res.out.backlog() >= TX_BACKLOG_MAX {
            qp.resp.read = Some(st);
            return false;
        }
        match read_run(qp, env, &st, *budget) {
            Ok(None) => {}
            Ok(Some((n, next))) => {
                *budget -= n;
                match next {
                    Some(next) => {
                        st = next;
                        continue;
                    }
                    None => return true,
                }
            }
            Err(()) => {
                read_access_error(qp, env, &st);
                return true;
            }
        }
        let last = st.resid <= mtu;
        let len = st.resid.min(mtu);
        if send_read_packet(qp, env, &st, len, last).is_err() {
            read_access_error(qp, env, &st);
            return true;
        }
        *budget -= 1;
        if last {
            return true;
        }
        // va + resid was checked against the MR when the stream started.
        let Some(va) = st.va.checked_add(u64::from(len)) else {
            return true;
        };
        st = ReadStream {
            psn: psn::add(st.psn, 1),
            va,
            resid: st.resid - len,
            first: false,
            ..st
        };
    }
}

/// Sends one response packet of the READ stream `st`: its next `len`
/// bytes (`last`: the stream's last packet), by reference to another
/// function of the daemon or copied from driver memory into the frame.
/// `Err` when the MR no longer allows the read.
fn send_read_packet(
    qp: &Qp,
    env: &mut Env,
    st: &ReadStream,
    len: u32,
    last: bool,
) -> Result<(), ()> {
    let opcode = match (st.first, last) {
        (true, true) => Opcode::RcReadResponseOnly,
        (true, false) => Opcode::RcReadResponseFirst,
        (false, true) => Opcode::RcReadResponseLast,
        (false, false) => Opcode::RcReadResponseMiddle,
    };
    let aeth = Aeth::ack(st.msn, CREDITS_UNLIMITED);
    let mut hdr = reply_headers(qp, &env.res.port, &st.req, opcode, st.psn, aeth);
    if opcode == Opcode::RcReadResponseMiddle {
        hdr.aeth = None;
    }
    // To another function of the daemon, the payload may stay in driver
    // memory for the requester to copy; else it goes from driver memory
    // straight into the frame.
    let res = &mut *env.res;
    let (mem, pdn, va) = (env.mem, qp.pdn, st.va);
    let mrs = &res.mrs;
    let checked = || {
        mrs.check(st.rkey, pdn, abi::ACCESS_REMOTE_READ, va, u64::from(len))
            .map_err(|_| ())
    };
    res.out.send_payload(
        &mut hdr,
        len as usize,
        |out| checked()?.pieces(va, len as usize, out).map_err(|_| ()),
        |data| {
            if data.is_empty() {
                return Ok(());
            }
            checked()?.read(mem, va, data).map_err(|_| ())
        },
    )
}

/// The READ's MR failed as its responses were read (it went away or
/// changed since the request was checked): a remote access error NAK at
/// the stream's PSN, and the QP to ERR.
fn read_access_error(qp: &mut Qp, env: &mut Env, st: &ReadStream) {
    let aeth = Aeth::nak(qp.resp.msn, NakCode::RemoteAccessError);
    let mut hdr = reply_headers(qp, &env.res.port, &st.req, Opcode::RcAck, st.psn, aeth);
    if env.res.out.send_reply(&mut hdr) {
        env.res.out.stats.nak_sent(NakCode::RemoteAccessError);
    }
    qp_to_error(qp, env, abi::WcStatus::RemAccessErr);
}

/// Sends the next responses of the READ stream `st` as one run to another
/// function of the daemon that reads this one's memory
/// ([`Output::send_run_by_ref`]): as many as `budget` and
/// [`batch::RUN_MAX_PACKETS`] allow, when that is at least 2. `Ok(None)`
/// when they go one by one instead; else how many were sent and the
/// stream after them (`None`: it ended). `Err` when the MR fails.
fn read_run(
    qp: &Qp,
    env: &mut Env,
    st: &ReadStream,
    budget: u32,
) -> Result<Option<(u32, Option<ReadStream>)>, ()> {
    let mtu = qp.mtu();
    let left = st.resid.div_ceil(mtu);
    let n = left.min(budget).min(batch::RUN_MAX_PACKETS);
    if n < 2 || !env.res.out.may_send_run() {
        return Ok(None);
    }
    let ends = n == left;
    let total = st.resid.min(n * mtu);
    let aeth = Aeth::ack(st.msn, CREDITS_UNLIMITED);
    let first_op = if st.first {
        Opcode::RcReadResponseFirst
    } else {
        Opcode::RcReadResponseMiddle
    };
    let last_op = if ends {
        Opcode::RcReadResponseLast
    } else {
        Opcode::RcReadResponseMiddle
    };
    let last_psn = psn::add(st.psn, n - 1);
    let mut first = reply_headers(qp, &env.res.port, &st.req, first_op, st.psn, aeth);
    let mut last = reply_headers(qp, &env.res.port, &st.req, last_op, last_psn, aeth);
    for h in [&mut first, &mut last] {
        if h.bth.opcode == Opcode::RcReadResponseMiddle {
            h.aeth = None;
        }
    }
    let res = &mut *env.res;
    let (mrs, pdn, va) = (&res.mrs, qp.pdn, st.va);
    let pieces = |out: &mut Vec<u8>| {
        mrs.check(st.rkey, pdn, abi::ACCESS_REMOTE_READ, va, u64::from(total))
            .and_then(|mr| mr.pieces(va, total as usize, out))
            .map_err(|_| ())
    };
    if !res
        .out
        .send_run_by_ref(&mut first, &last, n, mtu, total as usize, pieces)?
    {
        return Ok(None);
    }
    if ends {
        return Ok(Some((n, None)));
    }
    // va + resid was checked against the MR when the stream started.
    let Some(va) = st.va.checked_add(u64::from(total)) else {
        return Ok(Some((n, None)));
    };
    let next = ReadStream {
        psn: psn::add(st.psn, n),
        va,
        resid: st.resid - total,
        first: false,
        ..st.clone()
    };
    Ok(Some((n, Some(next))))
}

/// [`on_request`] without holding and without the stream: checks and
/// executes one request. The driver of rxe's responder state machine
/// (`rxe_responder`): its [`Turn`] first, then for a request in turn
/// [`check_request`] ([`check_op_seq`], [`check_op_valid`],
/// [`check_resource`], [`check_length`], [`check_rkey`]) and [`execute`],
/// then [`end_turn`]. A duplicate goes to [`duplicate_request`], a PSN
/// beyond the expected one to [`nak_psn_out_of_seq`], a UC request out
/// of turn to [`uc_resync`]. The header checks
/// ([`crate::transport::hdr_check`]: type, state, addresses, keys) ran
/// before, as rxe's `hdr_check`.
fn process(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    match turn(qp, pkt) {
        Turn::Now => take_turn(qp, env, pkt),
        Turn::UcResync => uc_resync(qp, env, pkt),
        Turn::Duplicate => duplicate_request(qp, env, pkt),
        Turn::OutOfSequence => nak_psn_out_of_seq(qp, env, pkt),
        Turn::Dropped => env.res.out.stats.count(Counter::rx_dropped, 1),
        Turn::Closed => {}
    }
}

/// What [`process`] does with a request, from the QP's state, type,
/// expected PSN and message in progress: the decision rxe's responder
/// makes before `RESPST_CHK_OP_SEQ` (its QP state check, `check_psn`,
/// and for UC its `drop_msg`; IBTA §9.7.5.2, §9.8.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// In turn: checked ([`check_request`]) and executed now.
    Now,
    /// RC: before the expected PSN, [`duplicate_request`].
    Duplicate,
    /// RC: after the expected PSN (packets were lost),
    /// [`nak_psn_out_of_seq`].
    OutOfSequence,
    /// UC: after a PSN gap, or inside a message being dropped
    /// ([`InboundMsg::UcDrop`]): [`uc_resync`].
    UcResync,
    /// Not the QP's transport, or an RC QP in SQE: dropped, counted in
    /// `rx_dropped`.
    Dropped,
    /// The QP's state receives no requests (not RTR, RTS, SQD or SQE,
    /// IBTA §10.3.1): ignored.
    Closed,
}

/// The [`Turn`] of request `pkt` at `qp` now.
fn turn(qp: &Qp, pkt: &Packet) -> Turn {
    if !matches!(
        qp.state,
        abi::QpState::Rtr | abi::QpState::Rts | abi::QpState::Sqd | abi::QpState::Sqe
    ) {
        return Turn::Closed;
    }
    match (qp.qp_type, pkt.hdr.bth.opcode.transport()) {
        (abi::QpType::Rc, Transport::Rc) if qp.state != abi::QpState::Sqe => {
            match check_psn(qp, pkt) {
                PsnCheck::Expected => Turn::Now,
                PsnCheck::Duplicate => Turn::Duplicate,
                PsnCheck::OutOfSequence => Turn::OutOfSequence,
            }
        }
        (abi::QpType::Uc, Transport::Uc)
            if pkt.hdr.bth.psn == qp.resp.epsn && !matches!(qp.resp.msg, InboundMsg::UcDrop) =>
        {
            Turn::Now
        }
        (abi::QpType::Uc, Transport::Uc) => Turn::UcResync,
        _ => Turn::Dropped,
    }
}

/// True when request `pkt` would be executed now were it processed
/// ([`process`]): its [`Turn`] is [`Turn::Now`].
fn in_turn(qp: &Qp, pkt: &Packet) -> bool {
    turn(qp, pkt) == Turn::Now
}

/// Checks and executes request `pkt`, in turn, then [`end_turn`].
fn take_turn(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    let done = check_request(qp, env, pkt, 1).and_then(|target| execute(qp, env, pkt, target));
    end_turn(qp, env, pkt, done, 1);
}

/// After request `pkt` was executed in turn (`done`), spanning `psns`
/// PSNs (a run's packets, [`on_run`]; else 1): UC moves the expected PSN
/// past it and drops it silently if it failed ([`uc_drop`]); RC clears
/// the sequence NAK (the expected PSN came) and answers it ([`answer`],
/// which moves the expected PSN).
fn end_turn(qp: &mut Qp, env: &mut Env, pkt: &Packet, done: Result<Reply, RespError>, psns: u32) {
    if qp.qp_type == abi::QpType::Uc {
        qp.resp.epsn = psn::add(pkt.hdr.bth.psn, psns);
        if let Err(e) = done {
            // Dropped silently, as its packets would have been.
            uc_drop(qp, env, e, pkt.hdr.bth.opcode, psns);
        }
        return;
    }
    qp.resp.nak_sent = false;
    answer(qp, env, pkt, done, psns);
}

/// A run of packets ([`batch::Run`]) to `qp`, whose header checks its first
/// packet passed. Taken whole when its packets would all be executed in
/// turn: its stride the path MTU; its first packet neither
/// `held_back` nor out of turn (`in_turn`: the questions
/// [`on_request`] asks of it); and the checks passing for the run as one
/// packet ([`batch::Run::message`], spanning its PSNs): then one copy,
/// the expected PSN moved past it, one answer (RC: an ACK of its last
/// PSN when that packet asks for one; `end_turn`). Anything else is
/// handled packet by packet ([`on_request`]), as it would have come. An
/// error in the execution itself (memory that went away, a SEND longer
/// than its receive WQE) is answered for the run's first PSN, as for
/// one packet (UC: the message is dropped); the message fails either
/// way.
pub fn on_run(qp: &mut Qp, env: &mut Env, run: &batch::Run) {
    let whole =
        run.stride == qp.mtu() as usize && !held_back(qp, &run.first) && in_turn(qp, &run.first);
    let msg = whole.then(|| run.message());
    let (msg, target) = match msg.map(|m| (check_request(qp, env, &m, run.count), m)) {
        Some((Ok(target), m)) => (m, target),
        _ => {
            for p in run.packets() {
                on_request(qp, env, &p);
            }
            return;
        }
    };
    let done = execute(qp, env, &msg, target);
    end_turn(qp, env, &msg, done, run.count);
}

/// Answers the executed request `pkt`, spanning `psns` PSNs (a run's
/// packets, [`on_run`]; else 1): [`acknowledge`], an RNR NAK, or
/// [`nak_error`].
fn answer(qp: &mut Qp, env: &mut Env, pkt: &Packet, done: Result<Reply, RespError>, psns: u32) {
    match done {
        Ok(reply) => acknowledge(qp, env, pkt, reply, psns),
        Err(RespError::Rnr) => {
            // RNR: nothing consumed, the requester retries this PSN later.
            let aeth = Aeth::rnr_nak(qp.resp.msn, qp.attr.min_rnr_timer);
            if send_aeth(qp, env, pkt, pkt.hdr.bth.psn, aeth) {
                env.res.out.stats.count(Counter::rnr_naks_sent, 1);
            }
        }
        Err(RespError::Nak { code, wqe }) => nak_error(qp, env, pkt, code, wqe),
    }
}

/// Where a request's PSN falls against the expected PSN (rxe's
/// `check_psn`, RC; IBTA §9.7.5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PsnCheck {
    /// The expected PSN: the request is checked and executed.
    Expected,
    /// Before it: a duplicate, answered by [`duplicate_request`].
    Duplicate,
    /// After it: packets were lost, [`nak_psn_out_of_seq`].
    OutOfSequence,
}

/// rxe's `check_psn` for an RC request: compares its PSN with the
/// expected one (24-bit serial arithmetic, [`psn::diff`]).
fn check_psn(qp: &Qp, pkt: &Packet) -> PsnCheck {
    match psn::diff(pkt.hdr.bth.psn, qp.resp.epsn) {
        d if d > 0 => PsnCheck::OutOfSequence,
        d if d < 0 => PsnCheck::Duplicate,
        _ => PsnCheck::Expected,
    }
}

/// Missing packets: asks once for a resend from the expected PSN with a
/// PSN sequence error NAK (IBTA §9.7.5.2; rxe's
/// `RESPST_ERR_PSN_OUT_OF_SEQ`, sent once per gap as its `sent_psn_nak`).
/// One dropped for the link backlog ([`Output::send_reply`]) is asked
/// again at the next packet of the gap.
fn nak_psn_out_of_seq(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    if qp.resp.nak_sent {
        return;
    }
    let aeth = Aeth::nak(qp.resp.msn, NakCode::PsnSequenceError);
    if send_aeth(qp, env, pkt, qp.resp.epsn, aeth) {
        qp.resp.nak_sent = true;
        env.res.out.stats.nak_sent(NakCode::PsnSequenceError);
    }
}

/// A duplicate request (rxe's `duplicate_request`). Only a READ or
/// atomic within one of the responder resources is answered again (IBTA
/// §9.7.5.2.3, §9.7.5.2.5; rxe drops the others): READ responses
/// re-generated from the requested PSN (a resent READ may start inside the
/// original one) if it asks for part of the original's bytes with its
/// R_Key, an atomic from its remembered result, never executed twice. A
/// SEND or WRITE was already executed: it is acknowledged with the last
/// PSN executed, as rxe does.
fn duplicate_request(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    env.res.out.stats.count(Counter::duplicates, 1);
    let bth = pkt.hdr.bth;
    if bth.opcode == Opcode::RcReadRequest || bth.opcode.is_atomic() {
        match qp.resp.rd_atomic_res(bth.psn) {
            Some(r) if bth.opcode == Opcode::RcReadRequest && r.replays_read(pkt, qp.mtu()) => {
                // The stream restarts here, replacing any other in
                // progress (the requester goes back N: it re-requests
                // what followed too); never a second stream.
                if let Ok(st) = read_stream(qp, env, pkt) {
                    qp.resp.read = Some(ReadStream {
                        msn: qp.resp.msn,
                        ..st
                    });
                }
            }
            Some(RdAtomicRes {
                psn,
                kind: RdAtomicKind::Atomic { orig },
                ..
            }) if bth.opcode.is_atomic() && psn == bth.psn => {
                send_atomic_ack(qp, env, pkt, orig);
            }
            _ => env.res.out.stats.count(Counter::rx_dropped, 1),
        }
        return;
    }
    let last = psn::add(qp.resp.epsn, psn::PSN_MASK);
    send_aeth(
        qp,
        env,
        pkt,
        last,
        Aeth::ack(qp.resp.msn, CREDITS_UNLIMITED),
    );
}

/// The inbound message the responder is in the middle of: the one state
/// the opcode sequence check (`check_op_seq`) and the execution of
/// MIDDLE and LAST packets work from (rxe keeps it as `resp.opcode`, the
/// last opcode seen, with `resp.wqe`, `resp.va`/`resid` and `drop_msg`).
#[derive(Debug, Default)]
pub enum InboundMsg {
    /// No message in progress: the next request must be a FIRST or ONLY
    /// (or a READ or atomic).
    #[default]
    Idle,
    /// A SEND in progress, its receive WQE already taken (and counted
    /// off its RQ or SRQ): the next packet must be a SEND MIDDLE or LAST.
    Send(RecvCtx),
    /// An RDMA WRITE in progress: the next packet must be a WRITE MIDDLE
    /// or LAST.
    Write(WriteCtx),
    /// UC: the rest of a message is being dropped after a lost packet,
    /// until the next FIRST or ONLY (IBTA §9.7.5.2, UC responder; rxe's
    /// `drop_msg`).
    UcDrop,
}

/// Why the responder does not execute a request (rxe's `RESPST_ERR_*`
/// states): the answer to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RespError {
    /// No receive WQE posted: RNR NAK, nothing consumed (rxe's
    /// `RESPST_ERR_RNR`).
    Rnr,
    /// A NAK with `code`; `wqe` is the receive WQE consumed for the
    /// request (its wr_id) and the status it completes with, if any. An
    /// RC QP then moves to ERR; a UC QP drops the message.
    Nak {
        /// The NAK code (IBTA Table 45).
        code: NakCode,
        /// wr_id and `WC_*` status of a consumed receive WQE.
        wqe: Option<(u64, abi::WcStatus)>,
    },
}

/// A NAK with `code` and no receive WQE to complete.
fn nak(code: NakCode) -> RespError {
    RespError::Nak { code, wqe: None }
}

/// Where [`check_rkey`] found the request's bytes go or come from: what
/// [`execute`] works on (rxe's `resp.va`, `resp.resid`, `resp.mr`).
#[derive(Debug, Clone)]
enum Target {
    /// A SEND: its receive WQE, taken by [`execute`].
    Recv,
    /// An RDMA WRITE packet: the WRITE's position before this packet's
    /// payload.
    Write(WriteCtx),
    /// An RDMA READ: its response stream (boxed: it carries the
    /// request's headers).
    Read(Box<ReadStream>),
    /// An atomic: its AtomicETH, checked.
    Atomic(AtomicEth),
}

/// What [`acknowledge`] answers an executed request with.
#[derive(Debug, Clone)]
enum Reply {
    /// A SEND or WRITE packet: an ACK if it asked for one.
    Ack,
    /// An RDMA READ: its response stream, sent by [`run`] (boxed: it
    /// carries the request's headers).
    Read(Box<ReadStream>),
    /// An atomic: the original value at the target.
    Atomic(u64),
}

/// The checks of a request in sequence, in rxe's order (`rxe_responder`'s
/// states `RESPST_CHK_OP_SEQ` to `RESPST_CHK_RKEY`); the first that fails
/// decides the answer. `Ok` with what [`execute`] works on.
fn check_request(qp: &Qp, env: &Env, pkt: &Packet, psns: u32) -> Result<Target, RespError> {
    check_op_seq(qp, pkt)?;
    check_op_valid(qp, pkt)?;
    check_resource(qp, env, pkt)?;
    check_length(pkt, qp.mtu(), psns)?;
    check_rkey(qp, env, pkt)
}

/// Opcode sequence (IBTA §9.8.3.1; rxe's `check_op_seq`): a FIRST or ONLY
/// (READ and atomics are ONLY) may not interrupt a message, a MIDDLE or
/// LAST must continue one of the same kind ([`InboundMsg`]). Else an
/// invalid request.
fn check_op_seq(qp: &Qp, pkt: &Packet) -> Result<(), RespError> {
    let op = pkt.hdr.bth.opcode;
    let ok = match &qp.resp.msg {
        _ if op.is_first() => matches!(qp.resp.msg, InboundMsg::Idle | InboundMsg::UcDrop),
        InboundMsg::Send(_) => op.is_send(),
        InboundMsg::Write(_) => op.is_write(),
        InboundMsg::Idle | InboundMsg::UcDrop => !op.is_send() && !op.is_write(),
    };
    if ok {
        Ok(())
    } else {
        Err(nak(NakCode::InvalidRequest))
    }
}

/// The operation is allowed on this QP (rxe's `check_op_valid`; IBTA
/// §9.7.4.1.3, §10.2.4 remote access rights): a READ needs
/// `ACCESS_REMOTE_READ` in the QP's access flags, every packet of a WRITE
/// `ACCESS_REMOTE_WRITE`, an atomic `ACCESS_REMOTE_ATOMIC`, whatever the
/// length (else a remote access error); the RETH or AtomicETH they need
/// must be there (else an invalid request).
fn check_op_valid(qp: &Qp, pkt: &Packet) -> Result<(), RespError> {
    let op = pkt.hdr.bth.opcode;
    // As rxe's check_op_valid: the QP's access flags gate every READ,
    // every packet of a WRITE and every atomic, whatever its length (a
    // zero-length transfer skips only the rkey check, C9-88).
    let need = if op == Opcode::RcReadRequest {
        pkt.hdr.reth.ok_or(nak(NakCode::InvalidRequest))?;
        abi::ACCESS_REMOTE_READ
    } else if op.is_write() {
        if op.is_first() {
            pkt.hdr.reth.ok_or(nak(NakCode::InvalidRequest))?;
        }
        abi::ACCESS_REMOTE_WRITE
    } else if op.is_atomic() {
        pkt.hdr.atomic_eth.ok_or(nak(NakCode::InvalidRequest))?;
        abi::ACCESS_REMOTE_ATOMIC
    } else {
        0
    };
    if qp.attr.qp_access_flags & need != need {
        return Err(nak(NakCode::RemoteAccessError));
    }
    Ok(())
}

/// The responder has what the request consumes (rxe's `check_resource`):
/// a SEND's FIRST or ONLY packet and an RDMA WRITE with immediate's LAST
/// or ONLY packet need a receive WQE (a UC spare, or one posted on the RQ
/// or SRQ), else RNR; a READ or atomic needs responder resources
/// (`max_dest_rd_atomic` > 0, IBTA §9.5), else an invalid request
/// (`RESPST_ERR_TOO_MANY_RDMA_ATM_REQ`).
fn check_resource(qp: &Qp, env: &Env, pkt: &Packet) -> Result<(), RespError> {
    let op = pkt.hdr.bth.opcode;
    let needs_wqe = (op.is_send() && op.is_first()) || (op.is_write() && op.has_immdt());
    if needs_wqe && qp.resp.spare.is_none() && !recv_queue::available(qp, env) {
        return Err(RespError::Rnr);
    }
    if (op == Opcode::RcReadRequest || op.is_atomic()) && qp.attr.max_dest_rd_atomic == 0 {
        return Err(nak(NakCode::InvalidRequest));
    }
    Ok(())
}

/// rxe's `check_length` (IBTA §9.7.4.1.2, C9-26): a packet's payload is
/// at most the path MTU (`mtu`, bytes), exactly it for FIRST and MIDDLE
/// packets; a READ or WRITE asks for at most [`MAX_MSG_SZ`] bytes in its
/// RETH. Anything else is an invalid request. (A SEND growing past
/// `MAX_MSG_SZ` or its receive WQE is caught as it is scattered, in
/// [`execute`]; a WRITE packet beyond its RETH's length in [`check_rkey`].)
/// A run taken as one packet ([`on_run`]) spans `psns` packets, every one
/// but the last a path MTU ([`batch::Run::new`]): at most `psns` MTUs,
/// exactly that unless it ends the message.
fn check_length(pkt: &Packet, mtu: u32, psns: u32) -> Result<(), RespError> {
    let op = pkt.hdr.bth.opcode;
    let len = pkt.payload_len();
    let mtu = (mtu as usize).saturating_mul(psns as usize);
    if op.has_payload() && (len > mtu || (!op.is_last() && len != mtu)) {
        return Err(nak(NakCode::InvalidRequest));
    }
    if let Some(reth) = pkt.hdr.reth {
        if reth.dma_len > MAX_MSG_SZ {
            return Err(nak(NakCode::InvalidRequest));
        }
    }
    Ok(())
}

/// The remote address and key (rxe's `check_rkey`; IBTA §9.7.4.1.3,
/// §10.6.3.1): every packet of a WRITE and a READ that move bytes, and
/// an atomic, need their R_Key to name an MR of the QP's PD, not
/// invalidated, with the remote access right covering `[va, va + len)`
/// (a WRITE's MIDDLE or LAST packet: the rest of the WRITE, from where it
/// has got to; [`write_target`]) (else a remote access error);
/// an atomic's address must be 8-byte aligned, a WRITE packet's payload
/// within what its RETH announced and its LAST packet end it exactly
/// (else an invalid request). Returns what [`execute`] works on.
fn check_rkey(qp: &Qp, env: &Env, pkt: &Packet) -> Result<Target, RespError> {
    let op = pkt.hdr.bth.opcode;
    if op == Opcode::RcReadRequest {
        return read_stream(qp, env, pkt).map(|st| Target::Read(Box::new(st)));
    }
    if op.is_atomic() {
        let a = pkt.hdr.atomic_eth.ok_or(nak(NakCode::InvalidRequest))?;
        if !a.va.is_multiple_of(8) {
            return Err(nak(NakCode::InvalidRequest));
        }
        env.res
            .mrs
            .check(a.rkey, qp.pdn, abi::ACCESS_REMOTE_ATOMIC, a.va, 8)
            .map_err(|_| nak(NakCode::RemoteAccessError))?;
        return Ok(Target::Atomic(a));
    }
    if !op.is_write() {
        return Ok(Target::Recv);
    }
    let w = if op.is_first() {
        let reth = pkt.hdr.reth.ok_or(nak(NakCode::InvalidRequest))?;
        WriteCtx {
            rkey: reth.rkey,
            va: reth.va,
            remaining: reth.dma_len,
            total: reth.dma_len,
        }
    } else if let InboundMsg::Write(w) = qp.resp.msg {
        w
    } else {
        return Err(nak(NakCode::InvalidRequest));
    };
    // Every packet, not only the FIRST: the key may have been invalidated
    // (a SEND with invalidate on another QP) or its MR deregistered since
    // the previous one, and the rest of the WRITE must not land then
    // (rxe's check_rkey runs for every WRITE packet, its lookup_mr
    // refusing an MR that is not valid any more; IBTA §10.6.6). A WRITE
    // whose RETH announced no bytes checks no key (C9-88); a run
    // (`on_run`) is checked as one packet, over all its bytes.
    if w.total > 0 {
        write_target(qp, env, &w, w.remaining)?;
    }
    let len = u32::try_from(pkt.payload_len()).unwrap_or(u32::MAX);
    if len > w.remaining || (op.is_last() && len != w.remaining) {
        return Err(nak(NakCode::InvalidRequest));
    }
    Ok(Target::Write(w))
}

/// The MR an RDMA WRITE writes `len` bytes at `w.va` through: `w.rkey`
/// must name an MR of the QP's PD with `ACCESS_REMOTE_WRITE`, not
/// invalidated, covering `[w.va, w.va + len)` (what [`MrTable::check`]
/// checks). Else a remote access error: the QP moves to ERR
/// ([`nak_error`]) as for a bad key in the FIRST packet.
///
/// [`MrTable::check`]: crate::verbs::mr::MrTable::check
fn write_target<'e>(
    qp: &Qp,
    env: &'e Env,
    w: &WriteCtx,
    len: u32,
) -> Result<&'e crate::verbs::mr::Mr, RespError> {
    env.res
        .mrs
        .check(
            w.rkey,
            qp.pdn,
            abi::ACCESS_REMOTE_WRITE,
            w.va,
            u64::from(len),
        )
        .map_err(|_| nak(NakCode::RemoteAccessError))
}

/// A READ request's RETH checked (IBTA §9.7.4.1.4; rxe's `check_rkey` for
/// a READ) and the response stream that answers it, starting at the
/// request's PSN (its `msn` to be filled in by the caller). Checks on its
/// own what [`check_op_valid`] and [`check_length`] check too, for
/// [`duplicate_request`], which skips them. Nothing is sent here: [`run`]
/// sends the responses, a burst at a time.
fn read_stream(qp: &Qp, env: &Env, pkt: &Packet) -> Result<ReadStream, RespError> {
    let Some(reth) = pkt.hdr.reth else {
        return Err(nak(NakCode::InvalidRequest));
    };
    if reth.dma_len > MAX_MSG_SZ {
        return Err(nak(NakCode::InvalidRequest));
    }
    if reth.dma_len > 0 {
        if qp.attr.qp_access_flags & abi::ACCESS_REMOTE_READ == 0 {
            return Err(nak(NakCode::RemoteAccessError));
        }
        env.res
            .mrs
            .check(
                reth.rkey,
                qp.pdn,
                abi::ACCESS_REMOTE_READ,
                reth.va,
                u64::from(reth.dma_len),
            )
            .map_err(|_| nak(NakCode::RemoteAccessError))?;
    }
    Ok(ReadStream {
        psn: pkt.hdr.bth.psn,
        va: reth.va,
        resid: reth.dma_len,
        rkey: reth.rkey,
        first: true,
        msn: 0,
        req: pkt.hdr.clone(),
    })
}

/// Executes a checked request (rxe's `execute`, with its `send_data_in`,
/// `write_data_in`, `do_atomic` and `do_complete`): scatters a SEND into
/// its receive WQE, writes a WRITE's payload, executes an atomic, and
/// completes the receive WQE of a SEND or WRITE with immediate on its last
/// packet; a READ only starts its stream, in [`acknowledge`].
fn execute(qp: &mut Qp, env: &mut Env, pkt: &Packet, target: Target) -> Result<Reply, RespError> {
    match target {
        Target::Recv => execute_send(qp, env, pkt),
        Target::Write(w) => execute_write(qp, env, pkt, w),
        Target::Read(st) => Ok(Reply::Read(st)),
        Target::Atomic(a) => execute_atomic(qp, env, pkt, a),
    }
}

/// Answers an executed RC request and moves the expected PSN past it
/// (rxe's `acknowledge`, `read_reply` set-up and `atomic_reply`): an ACK
/// when a SEND or WRITE packet asked for one; a READ's response stream
/// (counted by the MSN at once, C9-148, and remembered as a responder
/// resource, it consumes one PSN per response); an atomic's ACK with its
/// original value (remembered for a duplicate).
fn acknowledge(qp: &mut Qp, env: &mut Env, pkt: &Packet, reply: Reply, psns: u32) {
    let bth = pkt.hdr.bth;
    match reply {
        Reply::Ack => {
            qp.resp.epsn = psn::add(qp.resp.epsn, psns);
            if bth.ack_req {
                send_aeth(
                    qp,
                    env,
                    pkt,
                    psn::add(bth.psn, psns - 1),
                    Aeth::ack(qp.resp.msn, CREDITS_UNLIMITED),
                );
            }
        }
        Reply::Read(st) => {
            let n = st.resid.div_ceil(qp.mtu()).max(1);
            let res = RdAtomicRes {
                psn: bth.psn,
                npsn: n,
                kind: RdAtomicKind::Read {
                    rkey: st.rkey,
                    va: st.va,
                    len: st.resid,
                },
            };
            qp.resp.msn = psn::add(qp.resp.msn, 1);
            qp.resp.read = Some(ReadStream {
                msn: qp.resp.msn,
                ..*st
            });
            qp.resp.push_rd_atomic(res, qp.attr.max_dest_rd_atomic);
            qp.resp.epsn = psn::add(qp.resp.epsn, n);
        }
        Reply::Atomic(orig) => {
            let res = RdAtomicRes {
                psn: bth.psn,
                npsn: 1,
                kind: RdAtomicKind::Atomic { orig },
            };
            qp.resp.push_rd_atomic(res, qp.attr.max_dest_rd_atomic);
            qp.resp.msn = psn::add(qp.resp.msn, 1);
            send_atomic_ack(qp, env, pkt, orig);
            qp.resp.epsn = psn::add(qp.resp.epsn, 1);
        }
    }
}

/// An RC request that cannot be executed (rxe's `RESPST_ERR_*` with
/// `do_class_ac_error`): NAK with `code`, complete the consumed receive
/// WQE `wqe` with its status, and move the QP to ERR with the matching
/// status (an RC responder error is fatal to the QP, IBTA §10.3.1, as
/// rxe's `rxe_qp_error`).
fn nak_error(
    qp: &mut Qp,
    env: &mut Env,
    pkt: &Packet,
    code: NakCode,
    wqe: Option<(u64, abi::WcStatus)>,
) {
    if send_aeth(qp, env, pkt, pkt.hdr.bth.psn, Aeth::nak(qp.resp.msn, code)) {
        env.res.out.stats.nak_sent(code);
    }
    if let Some((wr_id, status)) = wqe {
        complete_recv_error(qp, env, wr_id, status);
    }
    let status = match code {
        NakCode::RemoteAccessError => abi::WcStatus::RemAccessErr,
        NakCode::RemoteOperationalError => abi::WcStatus::RemOpErr,
        _ => abi::WcStatus::RemInvReqErr,
    };
    qp_to_error(qp, env, status);
}

/// UC responder (IBTA §9.7.5.2, §9.8.4): no acknowledgements, no
/// retransmission. A request out of turn ([`Turn::UcResync`]): a PSN gap
/// abandons the message in progress (its receive WQE is kept for the
/// next SEND) and the rest of it is dropped until the next FIRST or ONLY
/// ([`InboundMsg::UcDrop`]), which starts afresh in turn ([`take_turn`]);
/// the expected PSN follows the request either way. A message that
/// cannot be executed (no receive WQE, bad R_Key, too long) is silently
/// dropped and the QP carries on ([`end_turn`]). The checks and
/// execution are the RC ones.
fn uc_resync(qp: &mut Qp, env: &mut Env, pkt: &Packet) {
    let bth = pkt.hdr.bth;
    if bth.psn != qp.resp.epsn {
        abandon_uc_message(qp);
    }
    qp.resp.epsn = psn::add(bth.psn, 1);
    if bth.opcode.is_first() {
        qp.resp.msg = InboundMsg::Idle;
        take_turn(qp, env, pkt);
    } else {
        qp.resp.msg = InboundMsg::UcDrop;
        env.res.out.stats.count(Counter::rx_dropped, 1);
    }
}

/// UC: a request that could not be executed (`e`) is dropped silently,
/// counted as `packets` packets; a receive WQE it consumed completes with
/// its error, the message in progress is abandoned, and the rest of it is
/// dropped unless `op` ended it.
fn uc_drop(qp: &mut Qp, env: &mut Env, e: RespError, op: Opcode, packets: u32) {
    if let RespError::Nak {
        wqe: Some((wr_id, status)),
        ..
    } = e
    {
        complete_recv_error(qp, env, wr_id, status);
    }
    env.res
        .out
        .stats
        .count(Counter::rx_dropped, u64::from(packets));
    abandon_uc_message(qp);
    if !op.is_last() {
        qp.resp.msg = InboundMsg::UcDrop;
    }
}

/// UC: forgets the message in progress, keeping its receive WQE as the
/// spare for the next SEND (it was never completed).
fn abandon_uc_message(qp: &mut Qp) {
    if let InboundMsg::Send(mut ctx) = std::mem::take(&mut qp.resp.msg) {
        ctx.offset = 0;
        qp.resp.spare = Some(ctx);
    }
}

/// Answers `pkt` with an ACK, NAK or RNR NAK (`aeth`) at PSN `p`, within
/// the reply bound ([`Output::send_reply`]): whether it was queued.
fn send_aeth(qp: &Qp, env: &mut Env, pkt: &Packet, p: u32, aeth: Aeth) -> bool {
    let mut hdr = reply_headers(qp, &env.res.port, &pkt.hdr, Opcode::RcAck, p, aeth);
    env.res.out.send_reply(&mut hdr)
}

/// Executes a compare-and-swap or fetch-and-add on the aligned 8-byte
/// operand [`check_rkey`] checked (IBTA §9.4.5; rxe's `do_atomic`):
/// returns its original value for the atomic ACK.
fn execute_atomic(
    qp: &mut Qp,
    env: &mut Env,
    pkt: &Packet,
    a: AtomicEth,
) -> Result<Reply, RespError> {
    let mr = env
        .res
        .mrs
        .check(a.rkey, qp.pdn, abi::ACCESS_REMOTE_ATOMIC, a.va, 8)
        .map_err(|_| nak(NakCode::RemoteAccessError))?;
    let mut cur = [0u8; 8];
    mr.read(env.mem, a.va, &mut cur)
        .map_err(|_| nak(NakCode::RemoteAccessError))?;
    let orig = u64::from_le_bytes(cur);
    let new = if pkt.hdr.bth.opcode == Opcode::RcCompareSwap {
        if orig == a.compare {
            a.swap_add
        } else {
            orig
        }
    } else {
        orig.wrapping_add(a.swap_add)
    };
    mr.write(env.mem, a.va, &new.to_le_bytes())
        .map_err(|_| nak(NakCode::RemoteAccessError))?;
    Ok(Reply::Atomic(orig))
}

fn send_atomic_ack(qp: &Qp, env: &mut Env, pkt: &Packet, orig: u64) {
    let aeth = Aeth::ack(qp.resp.msn, CREDITS_UNLIMITED);
    let mut hdr = reply_headers(
        qp,
        &env.res.port,
        &pkt.hdr,
        Opcode::RcAtomicAck,
        pkt.hdr.bth.psn,
        aeth,
    );
    hdr.atomic_ack_eth = Some(AtomicAckEth { orig });
    // Dropped at the reply bound: the requester resends the atomic and
    // the duplicate is answered from the resource (never re-executed).
    env.res.out.send_reply(&mut hdr);
}

/// Takes the next receive WQE (a UC spare first, then the RQ or SRQ), or
/// `None` when none is posted. A WQE that fails validation is still
/// consumed: the error names it, to complete with its status.
fn take_recv(qp: &mut Qp, env: &mut Env) -> Result<Option<RecvCtx>, RespError> {
    if let Some(ctx) = qp.resp.spare.take() {
        return Ok(Some(ctx));
    }
    match recv_queue::take(qp, env) {
        None => Ok(None),
        Some(Ok(ctx)) => Ok(Some(ctx)),
        Some(Err((wr_id, status))) => Err(RespError::Nak {
            code: NakCode::RemoteOperationalError,
            wqe: Some((wr_id, status)),
        }),
    }
}

/// A SEND packet (rxe's `send_data_in` and, on the last packet,
/// `do_complete`): the FIRST or ONLY takes a receive WQE, every packet
/// scatters its payload at the message offset, the LAST (or ONLY)
/// invalidates an IETH's R_Key and completes the WQE.
fn execute_send(qp: &mut Qp, env: &mut Env, pkt: &Packet) -> Result<Reply, RespError> {
    let op = pkt.hdr.bth.opcode;
    let mut ctx = if op.is_first() {
        // check_resource found one; none now is RNR all the same.
        take_recv(qp, env)?.ok_or(RespError::Rnr)?
    } else {
        match std::mem::take(&mut qp.resp.msg) {
            InboundMsg::Send(ctx) => ctx,
            other => {
                // check_op_seq let only a SEND in progress through.
                qp.resp.msg = other;
                return Err(nak(NakCode::InvalidRequest));
            }
        }
    };
    // The message so far plus this packet: at most max_msg_sz, else the
    // receive WQE completes with a length error and the request is
    // invalid (rxe's send_data_in / check_length answer the same).
    let offset = u32::try_from(pkt.payload_len())
        .ok()
        .and_then(|n| ctx.offset.checked_add(n))
        .filter(|&end| end <= MAX_MSG_SZ);
    let Some(offset) = offset else {
        return Err(RespError::Nak {
            code: NakCode::InvalidRequest,
            wqe: Some((ctx.wr_id, abi::WcStatus::LocLenErr)),
        });
    };
    if let Err(status) =
        crate::transport::scatter_sges(env, qp.pdn, &ctx.sges, ctx.offset, pkt.data())
    {
        let code = if status == abi::WcStatus::LocLenErr {
            NakCode::InvalidRequest
        } else {
            NakCode::RemoteOperationalError
        };
        return Err(RespError::Nak {
            code,
            wqe: Some((ctx.wr_id, status)),
        });
    }
    ctx.offset = offset;
    if !op.is_last() {
        qp.resp.msg = InboundMsg::Send(ctx);
        return Ok(Reply::Ack);
    }
    if let Some(ieth) = pkt.hdr.ieth {
        // SEND with invalidate: the named rkey stops working for remote
        // access (IBTA §9.4.1.3, §10.6.6). One not of this PD is an
        // invalid request, as rxe answers it.
        if env.res.mrs.invalidate(ieth.rkey, qp.pdn).is_err() {
            return Err(RespError::Nak {
                code: NakCode::InvalidRequest,
                wqe: Some((ctx.wr_id, abi::WcStatus::RemInvReqErr)),
            });
        }
    }
    let (imm, flags) = match (pkt.hdr.immdt, pkt.hdr.ieth) {
        (Some(i), _) => (i.0, abi::WC_WITH_IMM),
        (None, Some(ieth)) => (ieth.rkey.to_be_bytes(), abi::WC_WITH_INV),
        _ => ([0; 4], 0),
    };
    let cqe = abi::Cqe {
        wr_id: ctx.wr_id,
        byte_len: ctx.offset,
        imm_data: imm,
        status: abi::WcStatus::Success.raw(),
        opcode: abi::WC_OP_RECV,
        wc_flags: flags,
        ..Default::default()
    };
    complete_recv(qp, env, cqe, pkt.hdr.bth.solicited);
    qp.resp.msn = psn::add(qp.resp.msn, 1);
    Ok(Reply::Ack)
}

/// An RDMA WRITE packet (rxe's `write_data_in` and, for a WRITE with
/// immediate's last packet, `do_complete`): writes the payload at the
/// WRITE's position `w` ([`check_rkey`] checked it), then either keeps the
/// WRITE in progress or, on its LAST packet, ends it, taking and
/// completing a receive WQE for the immediate data.
fn execute_write(
    qp: &mut Qp,
    env: &mut Env,
    pkt: &Packet,
    w: WriteCtx,
) -> Result<Reply, RespError> {
    let op = pkt.hdr.bth.opcode;
    // check_rkey: len <= w.remaining.
    let len = u32::try_from(pkt.payload_len()).map_err(|_| nak(NakCode::InvalidRequest))?;
    if len > 0 {
        // Looked up as check_rkey did (nothing ran between), so that no
        // path writes through an MR the checks would refuse.
        write_target(qp, env, &w, len)?
            .write_data(env.mem, w.va, pkt.data())
            .map_err(|_| nak(NakCode::RemoteAccessError))?;
    }
    // va + total was checked against the MR at the FIRST packet.
    let w = WriteCtx {
        va: w
            .va
            .checked_add(u64::from(len))
            .ok_or(nak(NakCode::RemoteAccessError))?,
        remaining: w.remaining.saturating_sub(len),
        ..w
    };
    if !op.is_last() {
        qp.resp.msg = InboundMsg::Write(w);
        return Ok(Reply::Ack);
    }
    qp.resp.msg = InboundMsg::Idle;
    if let Some(imm) = pkt.hdr.immdt {
        // check_resource found one; none now is RNR all the same.
        let ctx = take_recv(qp, env)?.ok_or(RespError::Rnr)?;
        let cqe = abi::Cqe {
            wr_id: ctx.wr_id,
            byte_len: w.total,
            imm_data: imm.0,
            status: abi::WcStatus::Success.raw(),
            opcode: abi::WC_OP_RECV_RDMA_WITH_IMM,
            wc_flags: abi::WC_WITH_IMM,
            ..Default::default()
        };
        complete_recv(qp, env, cqe, pkt.hdr.bth.solicited);
    }
    qp.resp.msn = psn::add(qp.resp.msn, 1);
    Ok(Reply::Ack)
}

/// Writes the receive completion `cqe` of this QP (its `qp_num` and
/// `src_qp` filled in) to the receive CQ; the WQE was consumed from its
/// RQ or SRQ when it was taken.
fn complete_recv(qp: &Qp, env: &mut Env, cqe: abi::Cqe, solicited: bool) {
    let cqe = abi::Cqe {
        qp_num: qp.qpn,
        src_qp: qp.attr.dest_qp_num,
        ..cqe
    };
    env.complete(qp.recv_cqn, cqe, solicited);
}

/// Completes the consumed receive WQE `wr_id` with the error `status`
/// (a flush, or a failed request).
fn complete_recv_error(qp: &Qp, env: &mut Env, wr_id: u64, status: abi::WcStatus) {
    let cqe = abi::Cqe {
        wr_id,
        status: status.raw(),
        opcode: abi::WC_OP_RECV,
        ..Default::default()
    };
    complete_recv(qp, env, cqe, false);
}

/// Flushes every posted receive WQE (QP in ERR): the ones taken for a
/// message in progress, then the QP's own RQ. WQEs on an SRQ stay there for
/// the other QPs (IBTA §10.2.9.5; the driver gets `EV_QP_LAST_WQE_REACHED`).
pub fn flush(qp: &mut Qp, env: &mut Env) {
    let msg = std::mem::take(&mut qp.resp.msg);
    qp.resp.release(&mut env.res.out);
    let taken = match msg {
        InboundMsg::Send(ctx) => Some(ctx),
        _ => None,
    };
    for ctx in [taken, qp.resp.spare.take()].into_iter().flatten() {
        complete_recv_error(qp, env, ctx.wr_id, abi::WcStatus::WrFlushErr);
    }
    if qp.srqn != 0 {
        return;
    }
    // Bounded by the ring size: the doorbell keeps rq_pi within a ring of
    // rq_ci (`device::producer_index_ok`); the bound holds even if that
    // were broken.
    for _ in 0..qp.rq.size {
        if qp.resp.rq_ci == qp.resp.rq_pi {
            break;
        }
        let wr_id = recv_queue::wr_id_at(qp, env, qp.resp.rq_ci);
        qp.resp.rq_ci = qp.resp.rq_ci.wrapping_add(1);
        complete_recv_error(qp, env, wr_id, abi::WcStatus::WrFlushErr);
    }
    write_record(qp, env);
}
