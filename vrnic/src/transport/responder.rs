//! The responder: checks each incoming request's PSN and opcode sequence,
//! executes SEND and RDMA WRITE into driver memory, completes receive WQEs,
//! and answers with ACK, NAK or RNR NAK (IBTA Vol 1 §9.7.4.1, §9.7.5.2,
//! §9.9; rxe_resp.c). Every error is answered: a requester never hangs.

use crate::abi;
use crate::device::MAX_MSG_SZ;
use crate::transport::recv_queue::{self, RecvCtx};
use crate::transport::{
    psn, qp_to_error, reply_headers, write_record, Env, Output, TX_BACKLOG_MAX,
};
use crate::verbs::qp::Qp;
use crate::wire::{
    self, Aeth, AtomicAckEth, Frame, NakCode, Opcode, RoceHeaders, RocePacket, Transport,
};

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
    /// The rkey of the first packet's RETH.
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
    /// SEND in progress (its receive WQE already taken).
    pub recv: Option<RecvCtx>,
    /// UC: a receive WQE taken for a message that was abandoned after a
    /// lost packet; the next SEND uses it (it was never completed).
    pub spare: Option<RecvCtx>,
    /// UC: dropping the rest of a message after a lost packet, until the
    /// next FIRST or ONLY (IBTA §9.7.5.2, UC responder).
    pub uc_drop: bool,
    /// WRITE in progress.
    pub write: Option<WriteCtx>,
    /// A PSN sequence error NAK was sent and not yet cleared by the expected PSN.
    pub nak_sent: bool,
    /// The most recent RDMA READ and atomic requests executed, oldest
    /// first, at most `max_dest_rd_atomic` of them: the responder
    /// resources of IBTA §9.5 (rxe's `resources`). A duplicate READ or
    /// atomic is answered again only if it falls in one of them.
    pub rd_atomic: std::collections::VecDeque<RdAtomicRes>,
    /// The READ response stream in progress, if any (at most one per QP).
    pub read: Option<ReadStream>,
    /// Request frames received while `read` was in progress, in arrival
    /// order, each at most [`HELD_FRAME_MAX`] bytes, at most
    /// [`RESP_HOLD_MAX`] of them: processed once the stream has ended.
    pub held: std::collections::VecDeque<Vec<u8>>,
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
    fn replays_read(&self, pkt: &RocePacket, mtu: u32) -> bool {
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

/// Why a request failed at the responder: the NAK to send and the receive
/// completion status, if a receive WQE was consumed.
struct Fail {
    nak: NakCode,
    recv_status: Option<u8>,
}

fn fail(nak: NakCode) -> Fail {
    Fail {
        nak,
        recv_status: None,
    }
}

/// Handles a request packet addressed to `qp` (RC or UC; UD requests go
/// to [`crate::transport::datagram::on_request`]); `frame` is the whole
/// frame it was parsed from. Packets of another transport than the QP's
/// are dropped. While an RC QP's READ response stream is in progress a
/// request is held (bounded: [`RESP_HOLD_MAX`]) until the stream ends,
/// except a duplicate READ, which restarts the stream at once (rxe's
/// `duplicate_request`). Then sends what the stream has to send, within
/// [`READ_BURST`].
pub fn on_request(qp: &mut Qp, env: &mut Env, pkt: &RocePacket, frame: &[u8]) {
    let busy = qp.resp.read.is_some() || !qp.resp.held.is_empty();
    let dup_read =
        pkt.hdr.bth.opcode == Opcode::RcReadRequest && psn::diff(pkt.hdr.bth.psn, qp.resp.epsn) < 0;
    if busy && qp.qp_type == abi::QPT_RC && !dup_read {
        hold(qp, env, frame);
        return;
    }
    process(qp, env, pkt);
    run(qp, env);
}

/// Keeps `frame` for after the READ stream, within the bounds.
fn hold(qp: &mut Qp, env: &mut Env, frame: &[u8]) {
    if qp.resp.held.len() < RESP_HOLD_MAX
        && env.out.held_frames < RESP_HOLD_DEVICE_MAX
        && frame.len() <= HELD_FRAME_MAX
    {
        qp.resp.held.push_back(frame.to_vec());
        env.out.held_frames += 1;
    } else {
        env.out.stats.rx_dropped += 1;
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
        let Some(frame) = qp.resp.held.pop_front() else {
            return false;
        };
        env.out.held_frames = env.out.held_frames.saturating_sub(1);
        // It parsed when it arrived; parsed again, it borrows this copy.
        if let Ok(Frame::Roce(pkt)) = wire::parse_frame(&frame) {
            process(qp, env, &pkt);
        }
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
    let mut buf = [0u8; 4096];
    loop {
        if *budget == 0 || env.out.tx.len() >= TX_BACKLOG_MAX {
            qp.resp.read = Some(st);
            return false;
        }
        let last = st.resid <= mtu;
        let len = st.resid.min(mtu);
        let opcode = match (st.first, last) {
            (true, true) => Opcode::RcReadResponseOnly,
            (true, false) => Opcode::RcReadResponseFirst,
            (false, true) => Opcode::RcReadResponseLast,
            (false, false) => Opcode::RcReadResponseMiddle,
        };
        let data = buf.get_mut(..len as usize).unwrap_or_default();
        if len > 0 {
            let read = env
                .mrs
                .check(
                    st.rkey,
                    qp.pdn,
                    abi::ACCESS_REMOTE_READ,
                    st.va,
                    u64::from(len),
                )
                .map_err(|_| ())
                .and_then(|mr| mr.read(env.mem, st.va, data).map_err(|_| ()));
            if read.is_err() {
                env.out.stats.nak_sent(NakCode::RemoteAccessError);
                let aeth = Aeth::nak(qp.resp.msn, NakCode::RemoteAccessError);
                let mut hdr = reply_headers(qp, env.port, &st.req, Opcode::RcAck, st.psn, aeth);
                env.out.send(&mut hdr, &[]);
                qp_to_error(qp, env, abi::WC_REM_ACCESS_ERR);
                return true;
            }
        }
        let aeth = Aeth::ack(st.msn, CREDITS_UNLIMITED);
        let mut hdr = reply_headers(qp, env.port, &st.req, opcode, st.psn, aeth);
        if opcode == Opcode::RcReadResponseMiddle {
            hdr.aeth = None;
        }
        env.out.send(&mut hdr, data);
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

/// [`on_request`] without holding and without the stream: checks and
/// executes one request.
fn process(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) {
    if !matches!(
        qp.state,
        abi::QPS_RTR | abi::QPS_RTS | abi::QPS_SQD | abi::QPS_SQE
    ) {
        return;
    }
    let bth = pkt.hdr.bth;
    match (qp.qp_type, bth.opcode.transport()) {
        (abi::QPT_RC, Transport::Rc) if qp.state != abi::QPS_SQE => {}
        (abi::QPT_UC, Transport::Uc) => return on_uc_request(qp, env, pkt),
        _ => {
            env.out.stats.rx_dropped += 1;
            return;
        }
    }
    let d = psn::diff(bth.psn, qp.resp.epsn);
    if d > 0 {
        // Missing packets: ask once for a resend from the expected PSN.
        if !qp.resp.nak_sent {
            qp.resp.nak_sent = true;
            send_aeth(
                qp,
                env,
                pkt,
                qp.resp.epsn,
                Aeth::nak(qp.resp.msn, NakCode::PsnSequenceError),
            );
            env.out.stats.nak_sent(NakCode::PsnSequenceError);
        }
        return;
    }
    if d < 0 {
        env.out.stats.duplicates += 1;
        if bth.opcode == Opcode::RcReadRequest || bth.opcode.is_atomic() {
            // Only a request within one of the responder resources is
            // answered again (IBTA §9.7.5.2.3, §9.7.5.2.5; rxe drops the
            // others): READ responses re-generated from the requested PSN
            // (a resent READ may start inside the original one) if it asks
            // for part of the original's bytes with its R_Key, an atomic
            // from its remembered result, never executed twice.
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
                _ => env.out.stats.rx_dropped += 1,
            }
            return;
        }
        // SEND/WRITE: already executed; acknowledge what we have (rxe does the same).
        let last = psn::add(qp.resp.epsn, psn::PSN_MASK);
        send_aeth(
            qp,
            env,
            pkt,
            last,
            Aeth::ack(qp.resp.msn, CREDITS_UNLIMITED),
        );
        return;
    }
    qp.resp.nak_sent = false;
    match execute(qp, env, pkt) {
        Ok(Some(())) if bth.opcode == Opcode::RcReadRequest || bth.opcode.is_atomic() => {
            // A READ's responses stream from qp.resp.read (an atomic's ACK
            // was sent by execute); a READ consumes one PSN per response.
            let n = match pkt.hdr.reth {
                Some(r) if bth.opcode == Opcode::RcReadRequest => {
                    r.dma_len.div_ceil(qp.mtu()).max(1)
                }
                _ => 1,
            };
            if let (Opcode::RcReadRequest, Some(reth)) = (bth.opcode, pkt.hdr.reth) {
                let res = RdAtomicRes {
                    psn: bth.psn,
                    npsn: n,
                    kind: RdAtomicKind::Read {
                        rkey: reth.rkey,
                        va: reth.va,
                        len: reth.dma_len,
                    },
                };
                qp.resp.push_rd_atomic(res, qp.attr.max_dest_rd_atomic);
            }
            qp.resp.epsn = psn::add(qp.resp.epsn, n);
        }
        Ok(Some(())) => {
            qp.resp.epsn = psn::add(qp.resp.epsn, 1);
            if bth.ack_req {
                send_aeth(
                    qp,
                    env,
                    pkt,
                    bth.psn,
                    Aeth::ack(qp.resp.msn, CREDITS_UNLIMITED),
                );
            }
        }
        Ok(None) => {
            // RNR: nothing consumed, the requester retries this PSN later.
            env.out.stats.rnr_naks_sent += 1;
            send_aeth(
                qp,
                env,
                pkt,
                bth.psn,
                Aeth::rnr_nak(qp.resp.msn, qp.attr.min_rnr_timer),
            );
        }
        Err(f) => {
            env.out.stats.nak_sent(f.nak);
            send_aeth(qp, env, pkt, bth.psn, Aeth::nak(qp.resp.msn, f.nak));
            if let Some(status) = f.recv_status {
                complete_recv(qp, env, status, 0, None, abi::WC_OP_RECV, false);
            }
            let status = match f.nak {
                NakCode::RemoteAccessError => abi::WC_REM_ACCESS_ERR,
                NakCode::RemoteOperationalError => abi::WC_REM_OP_ERR,
                _ => abi::WC_REM_INV_REQ_ERR,
            };
            qp_to_error(qp, env, status);
        }
    }
}

/// UC responder (IBTA §9.7.5.2, §9.8.4): no acknowledgements, no
/// retransmission. A PSN gap abandons the message in progress (its receive
/// WQE is kept for the next SEND) and the rest of it is dropped until the
/// next FIRST or ONLY; a message that cannot be executed (no receive WQE,
/// bad R_Key, too long) is silently dropped and the QP carries on.
fn on_uc_request(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) {
    let bth = pkt.hdr.bth;
    let op = bth.opcode;
    let starts = op.is_first() || op.is_only();
    if bth.psn != qp.resp.epsn {
        abandon_uc_message(qp);
        qp.resp.uc_drop = !starts;
    }
    qp.resp.epsn = psn::add(bth.psn, 1);
    if qp.resp.uc_drop && !starts {
        env.out.stats.rx_dropped += 1;
        return;
    }
    qp.resp.uc_drop = false;
    let dropped = match execute(qp, env, pkt) {
        Ok(Some(())) => false,
        Ok(None) => true,
        Err(f) => {
            if let Some(status) = f.recv_status {
                complete_recv(qp, env, status, 0, None, abi::WC_OP_RECV, false);
            }
            true
        }
    };
    if dropped {
        env.out.stats.rx_dropped += 1;
        abandon_uc_message(qp);
        qp.resp.uc_drop = !op.is_last() && !op.is_only();
    }
}

/// UC: forgets the message in progress, keeping its receive WQE.
fn abandon_uc_message(qp: &mut Qp) {
    qp.resp.write = None;
    if let Some(mut ctx) = qp.resp.recv.take() {
        ctx.offset = 0;
        qp.resp.spare = Some(ctx);
    }
}

fn send_aeth(qp: &Qp, env: &mut Env, pkt: &RocePacket, p: u32, aeth: Aeth) {
    let mut hdr = reply_headers(qp, env.port, &pkt.hdr, Opcode::RcAck, p, aeth);
    env.out.send(&mut hdr, &[]);
}

/// Executes one in-sequence request. `Ok(None)` asks for an RNR NAK.
fn execute(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) -> Result<Option<()>, Fail> {
    let op = pkt.hdr.bth.opcode;
    let mtu = qp.mtu();
    // Opcode sequence (IBTA §9.8.3.1): a FIRST/ONLY may not interrupt a
    // message, a MIDDLE/LAST must continue one of the same kind.
    let in_send = qp.resp.recv.is_some();
    let in_write = qp.resp.write.is_some();
    let ok_seq = if op.is_first() {
        !in_send && !in_write
    } else if op.is_send() {
        in_send
    } else if op.is_write() {
        in_write
    } else {
        true
    };
    if !ok_seq {
        return Err(fail(NakCode::InvalidRequest));
    }
    check_length(pkt, mtu)?;
    if op.is_send() {
        return execute_send(qp, env, pkt);
    }
    if op.is_write() {
        return execute_write(qp, env, pkt);
    }
    if (op == Opcode::RcReadRequest || op.is_atomic()) && qp.attr.max_dest_rd_atomic == 0 {
        // No responder resources for READ or atomics: NAK invalid request,
        // as rxe_resp.c's check_resource (RESPST_ERR_TOO_MANY_RDMA_ATM_REQ).
        return Err(fail(NakCode::InvalidRequest));
    }
    if op == Opcode::RcReadRequest {
        let st = read_stream(qp, env, pkt)?;
        // C9-148: the MSN counts the READ at once (rxe's execute).
        qp.resp.msn = psn::add(qp.resp.msn, 1);
        qp.resp.read = Some(ReadStream {
            msn: qp.resp.msn,
            ..st
        });
        return Ok(Some(()));
    }
    if op.is_atomic() {
        return execute_atomic(qp, env, pkt);
    }
    Err(fail(NakCode::InvalidRequest))
}

/// rxe's `check_length` (IBTA §9.7.4.1.2, C9-26): a packet's payload is
/// at most the path MTU (`mtu`, bytes), exactly it for FIRST and MIDDLE
/// packets; a READ or WRITE asks for at most [`MAX_MSG_SZ`] bytes in its
/// RETH. Anything else is an invalid request. (A SEND growing past
/// `MAX_MSG_SZ` or its receive WQE is caught as it is scattered.)
fn check_length(pkt: &RocePacket, mtu: u32) -> Result<(), Fail> {
    let op = pkt.hdr.bth.opcode;
    let len = pkt.payload.len();
    let mtu = mtu as usize;
    if op.has_payload() && (len > mtu || (!op.is_last() && len != mtu)) {
        return Err(fail(NakCode::InvalidRequest));
    }
    if let Some(reth) = pkt.hdr.reth {
        if reth.dma_len > MAX_MSG_SZ {
            return Err(fail(NakCode::InvalidRequest));
        }
    }
    Ok(())
}

/// Validates a READ request (IBTA §9.7.4.1.4; rxe's `check_rkey` for a
/// READ) and returns the response stream that answers it, starting at the
/// request's PSN (its `msn` to be filled in by the caller). Nothing is
/// sent here: [`run`] sends the responses, a burst at a time.
fn read_stream(qp: &Qp, env: &mut Env, pkt: &RocePacket) -> Result<ReadStream, Fail> {
    let Some(reth) = pkt.hdr.reth else {
        return Err(fail(NakCode::InvalidRequest));
    };
    // Also checked by check_length, which a duplicate READ skips.
    if reth.dma_len > MAX_MSG_SZ {
        return Err(fail(NakCode::InvalidRequest));
    }
    if reth.dma_len > 0 {
        if qp.attr.qp_access_flags & abi::ACCESS_REMOTE_READ == 0 {
            return Err(fail(NakCode::RemoteAccessError));
        }
        env.mrs
            .check(
                reth.rkey,
                qp.pdn,
                abi::ACCESS_REMOTE_READ,
                reth.va,
                reth.dma_len as u64,
            )
            .map_err(|_| fail(NakCode::RemoteAccessError))?;
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

/// Executes a compare-and-swap or fetch-and-add on an aligned 8-byte
/// operand (IBTA §9.4.5) and answers with its original value.
fn execute_atomic(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) -> Result<Option<()>, Fail> {
    let Some(a) = pkt.hdr.atomic_eth else {
        return Err(fail(NakCode::InvalidRequest));
    };
    if !a.va.is_multiple_of(8) {
        return Err(fail(NakCode::InvalidRequest));
    }
    if qp.attr.qp_access_flags & abi::ACCESS_REMOTE_ATOMIC == 0 {
        return Err(fail(NakCode::RemoteAccessError));
    }
    let mr = env
        .mrs
        .check(a.rkey, qp.pdn, abi::ACCESS_REMOTE_ATOMIC, a.va, 8)
        .map_err(|_| fail(NakCode::RemoteAccessError))?;
    let mut cur = [0u8; 8];
    mr.read(env.mem, a.va, &mut cur)
        .map_err(|_| fail(NakCode::RemoteAccessError))?;
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
        .map_err(|_| fail(NakCode::RemoteAccessError))?;
    let res = RdAtomicRes {
        psn: pkt.hdr.bth.psn,
        npsn: 1,
        kind: RdAtomicKind::Atomic { orig },
    };
    qp.resp.push_rd_atomic(res, qp.attr.max_dest_rd_atomic);
    qp.resp.msn = psn::add(qp.resp.msn, 1);
    send_atomic_ack(qp, env, pkt, orig);
    Ok(Some(()))
}

fn send_atomic_ack(qp: &Qp, env: &mut Env, pkt: &RocePacket, orig: u64) {
    let aeth = Aeth::ack(qp.resp.msn, CREDITS_UNLIMITED);
    let mut hdr = reply_headers(
        qp,
        env.port,
        &pkt.hdr,
        Opcode::RcAtomicAck,
        pkt.hdr.bth.psn,
        aeth,
    );
    hdr.atomic_ack_eth = Some(AtomicAckEth { orig });
    env.out.send(&mut hdr, &[]);
}

/// Takes the next receive WQE (a UC spare first, then the RQ or SRQ), or
/// `None` when none is posted. A WQE that fails validation is still
/// consumed: it is left in `qp.resp.recv` to complete with the error.
fn take_recv(qp: &mut Qp, env: &mut Env) -> Result<Option<RecvCtx>, Fail> {
    if let Some(ctx) = qp.resp.spare.take() {
        return Ok(Some(ctx));
    }
    match recv_queue::take(qp, env) {
        None => Ok(None),
        Some(Ok(ctx)) => Ok(Some(ctx)),
        Some(Err((wr_id, status))) => {
            qp.resp.recv = Some(RecvCtx {
                wr_id,
                sges: Vec::new(),
                offset: 0,
            });
            Err(Fail {
                nak: NakCode::RemoteOperationalError,
                recv_status: Some(status),
            })
        }
    }
}

/// Scatters `data` at byte `offset` of the receive WQE's SGEs.
fn scatter(env: &Env, pdn: u32, ctx: &RecvCtx, data: &[u8]) -> Result<(), u8> {
    crate::transport::scatter_sges(env, pdn, &ctx.sges, ctx.offset, data)
}

fn execute_send(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) -> Result<Option<()>, Fail> {
    let op = pkt.hdr.bth.opcode;
    if op.is_first() {
        match take_recv(qp, env)? {
            Some(ctx) => qp.resp.recv = Some(ctx),
            None => return Ok(None),
        }
    }
    let Some(ctx) = qp.resp.recv.as_ref() else {
        return Err(fail(NakCode::InvalidRequest));
    };
    // The message so far plus this packet: at most max_msg_sz, else the
    // receive WQE completes with a length error and the request is
    // invalid (rxe's send_data_in / check_length answer the same).
    let offset = u32::try_from(pkt.payload.len())
        .ok()
        .and_then(|n| ctx.offset.checked_add(n))
        .filter(|&end| end <= MAX_MSG_SZ);
    let Some(offset) = offset else {
        return Err(Fail {
            nak: NakCode::InvalidRequest,
            recv_status: Some(abi::WC_LOC_LEN_ERR),
        });
    };
    if let Err(status) = scatter(env, qp.pdn, ctx, pkt.payload) {
        let nak = if status == abi::WC_LOC_LEN_ERR {
            NakCode::InvalidRequest
        } else {
            NakCode::RemoteOperationalError
        };
        return Err(Fail {
            nak,
            recv_status: Some(status),
        });
    }
    let ctx = qp.resp.recv.as_mut().expect("checked above");
    ctx.offset = offset;
    if let (true, Some(ieth)) = (op.is_last(), pkt.hdr.ieth) {
        // SEND with invalidate: the named rkey stops working for remote
        // access (IBTA §9.4.1.3, §10.6.6). One not of this PD is an
        // invalid request, as rxe answers it.
        if env.mrs.invalidate(ieth.rkey, qp.pdn).is_err() {
            return Err(Fail {
                nak: NakCode::InvalidRequest,
                recv_status: Some(abi::WC_REM_INV_REQ_ERR),
            });
        }
    }
    if op.is_last() {
        let imm = pkt.hdr.immdt.map(|i| i.0);
        let (imm, flags) = match (imm, pkt.hdr.ieth) {
            (Some(i), _) => (Some(i), abi::WC_WITH_IMM),
            (None, Some(ieth)) => (Some(ieth.rkey.to_be_bytes()), abi::WC_WITH_INV),
            _ => (None, 0),
        };
        let len = ctx.offset;
        complete_recv_flags(
            qp,
            env,
            abi::WC_SUCCESS,
            len,
            imm,
            abi::WC_OP_RECV,
            pkt.hdr.bth.solicited,
            flags,
        );
        qp.resp.msn = psn::add(qp.resp.msn, 1);
    }
    Ok(Some(()))
}

fn execute_write(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) -> Result<Option<()>, Fail> {
    let op = pkt.hdr.bth.opcode;
    // WRITE with immediate consumes a receive WQE: make sure one exists
    // before touching memory, so an RNR retry re-executes cleanly.
    if op.has_immdt() && qp.resp.spare.is_none() && !recv_queue::available(qp, env) {
        return Ok(None);
    }
    if op.is_first() {
        let Some(reth) = pkt.hdr.reth else {
            return Err(fail(NakCode::InvalidRequest));
        };
        if reth.dma_len > 0 {
            if qp.attr.qp_access_flags & abi::ACCESS_REMOTE_WRITE == 0 {
                return Err(fail(NakCode::RemoteAccessError));
            }
            env.mrs
                .check(
                    reth.rkey,
                    qp.pdn,
                    abi::ACCESS_REMOTE_WRITE,
                    reth.va,
                    reth.dma_len as u64,
                )
                .map_err(|_| fail(NakCode::RemoteAccessError))?;
        }
        qp.resp.write = Some(WriteCtx {
            rkey: reth.rkey,
            va: reth.va,
            remaining: reth.dma_len,
            total: reth.dma_len,
        });
    }
    let Some(w) = qp.resp.write else {
        return Err(fail(NakCode::InvalidRequest));
    };
    let len = pkt.payload.len() as u32;
    if len > w.remaining || (op.is_last() && len != w.remaining) {
        qp.resp.write = None;
        return Err(fail(NakCode::InvalidRequest));
    }
    if len > 0 {
        let mr = env
            .mrs
            .get(w.rkey)
            .map_err(|_| fail(NakCode::RemoteAccessError))?;
        mr.write(env.mem, w.va, pkt.payload)
            .map_err(|_| fail(NakCode::RemoteAccessError))?;
    }
    // len <= remaining (checked above), and va + total was checked
    // against the MR at the FIRST packet.
    let w = WriteCtx {
        va: w
            .va
            .checked_add(u64::from(len))
            .ok_or(fail(NakCode::RemoteAccessError))?,
        remaining: w.remaining - len,
        ..w
    };
    qp.resp.write = Some(w);
    if op.is_last() {
        qp.resp.write = None;
        if let Some(imm) = pkt.hdr.immdt {
            match take_recv(qp, env)? {
                Some(ctx) => qp.resp.recv = Some(ctx),
                None => return Ok(None),
            }
            complete_recv_flags(
                qp,
                env,
                abi::WC_SUCCESS,
                w.total,
                Some(imm.0),
                abi::WC_OP_RECV_RDMA_WITH_IMM,
                pkt.hdr.bth.solicited,
                abi::WC_WITH_IMM,
            );
        }
        qp.resp.msn = psn::add(qp.resp.msn, 1);
    }
    Ok(Some(()))
}

fn complete_recv(
    qp: &mut Qp,
    env: &mut Env,
    status: u8,
    len: u32,
    imm: Option<[u8; 4]>,
    opcode: u8,
    solicited: bool,
) {
    complete_recv_flags(qp, env, status, len, imm, opcode, solicited, 0)
}

/// Completes the receive WQE in `qp.resp.recv` (already consumed from its
/// RQ or SRQ when it was taken).
#[allow(clippy::too_many_arguments)]
fn complete_recv_flags(
    qp: &mut Qp,
    env: &mut Env,
    status: u8,
    len: u32,
    imm: Option<[u8; 4]>,
    opcode: u8,
    solicited: bool,
    wc_flags: u8,
) {
    let Some(ctx) = qp.resp.recv.take() else {
        return;
    };
    let cqe = abi::Cqe {
        wr_id: ctx.wr_id,
        byte_len: len,
        imm_data: imm.unwrap_or_default(),
        qp_num: qp.qpn,
        src_qp: qp.attr.dest_qp_num,
        status,
        opcode,
        wc_flags,
        ..Default::default()
    };
    env.complete(qp.recv_cqn, cqe, solicited);
}

/// Flushes every posted receive WQE (QP in ERR): the ones taken for a
/// message in progress, then the QP's own RQ. WQEs on an SRQ stay there for
/// the other QPs (IBTA §10.2.9.5; the driver gets `EV_QP_LAST_WQE_REACHED`).
pub fn flush(qp: &mut Qp, env: &mut Env) {
    qp.resp.write = None;
    qp.resp.release(env.out);
    for ctx in [qp.resp.recv.take(), qp.resp.spare.take()]
        .into_iter()
        .flatten()
    {
        qp.resp.recv = Some(ctx);
        complete_recv(
            qp,
            env,
            abi::WC_WR_FLUSH_ERR,
            0,
            None,
            abi::WC_OP_RECV,
            false,
        );
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
        qp.resp.recv = Some(RecvCtx {
            wr_id,
            sges: Vec::new(),
            offset: 0,
        });
        complete_recv(
            qp,
            env,
            abi::WC_WR_FLUSH_ERR,
            0,
            None,
            abi::WC_OP_RECV,
            false,
        );
    }
    write_record(qp, env);
}
