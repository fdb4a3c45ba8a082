//! The responder: checks each incoming request's PSN and opcode sequence,
//! executes SEND and RDMA WRITE into driver memory, completes receive WQEs,
//! and answers with ACK, NAK or RNR NAK (IBTA Vol 1 §9.7.4.1, §9.7.5.2,
//! §9.9; rxe_resp.c). Every error is answered: a requester never hangs.

use crate::abi;
use crate::device::MAX_MSG_SZ;
use crate::transport::recv_queue::{self, RecvCtx};
use crate::transport::{psn, qp_to_error, reply_headers, write_record, Env};
use crate::verbs::qp::Qp;
use crate::wire::{Aeth, AtomicAckEth, NakCode, Opcode, RocePacket, Transport};

/// "Unlimited" credit count in an ACK's AETH (IBTA Table 44: 0x1F is
/// "invalid/no credit information", which end-to-end flow control ignores).
const CREDITS_UNLIMITED: u8 = 0x1f;

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
    /// `max_dest_rd_atomic` (at least 1) resources: at most 16 entries
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
/// to [`crate::transport::datagram::on_request`]). Packets of another
/// transport than the QP's are dropped.
pub fn on_request(qp: &mut Qp, env: &mut Env, pkt: &RocePacket) {
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
                    let _ = read_responses(qp, env, pkt);
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
            // Responses were sent by execute; a READ consumes one PSN per response.
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
        read_responses(qp, env, pkt)?;
        qp.resp.msn = psn::add(qp.resp.msn, 1);
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

/// Validates a READ request and sends its responses, starting at the
/// request's PSN (IBTA §9.7.4.1.4): FIRST/ONLY and LAST carry an AETH.
fn read_responses(qp: &Qp, env: &mut Env, pkt: &RocePacket) -> Result<(), Fail> {
    let Some(reth) = pkt.hdr.reth else {
        return Err(fail(NakCode::InvalidRequest));
    };
    // Also checked by check_length, which a duplicate READ skips.
    if reth.dma_len > MAX_MSG_SZ {
        return Err(fail(NakCode::InvalidRequest));
    }
    let mr = if reth.dma_len > 0 {
        if qp.attr.qp_access_flags & abi::ACCESS_REMOTE_READ == 0 {
            return Err(fail(NakCode::RemoteAccessError));
        }
        Some(
            env.mrs
                .check(
                    reth.rkey,
                    qp.pdn,
                    abi::ACCESS_REMOTE_READ,
                    reth.va,
                    reth.dma_len as u64,
                )
                .map_err(|_| fail(NakCode::RemoteAccessError))?,
        )
    } else {
        None
    };
    let mtu = qp.mtu();
    let n = reth.dma_len.div_ceil(mtu).max(1);
    let mut buf = vec![0u8; mtu as usize];
    for k in 0..n {
        let opcode = match (k == 0, k + 1 == n) {
            (true, true) => Opcode::RcReadResponseOnly,
            (true, false) => Opcode::RcReadResponseFirst,
            (false, true) => Opcode::RcReadResponseLast,
            (false, false) => Opcode::RcReadResponseMiddle,
        };
        // k < n = ceil(dma_len / mtu): off < dma_len <= MAX_MSG_SZ, and
        // va + dma_len was checked against the MR.
        let off = k * mtu;
        let len = (reth.dma_len - off).min(mtu) as usize;
        if let Some(mr) = mr {
            let va = reth
                .va
                .checked_add(u64::from(off))
                .ok_or(fail(NakCode::RemoteAccessError))?;
            mr.read(env.mem, va, &mut buf[..len])
                .map_err(|_| fail(NakCode::RemoteAccessError))?;
        }
        let aeth = Aeth::ack(psn::add(qp.resp.msn, 1), CREDITS_UNLIMITED);
        let mut hdr = reply_headers(
            qp,
            env.port,
            &pkt.hdr,
            opcode,
            psn::add(pkt.hdr.bth.psn, k),
            aeth,
        );
        if opcode == Opcode::RcReadResponseMiddle {
            hdr.aeth = None;
        }
        env.out.send(&mut hdr, &buf[..len]);
    }
    Ok(())
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
