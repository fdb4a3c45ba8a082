//! The requester: fetches send WQEs from the SQ, splits each message into
//! path-MTU packets with consecutive PSNs and sends them; retransmits
//! go-back-N from a given PSN (IBTA Vol 1 §9.7.4–§9.7.6, rxe_req.c).

use std::collections::VecDeque;

use crate::abi::{self, Sge, WrOpcode};
use crate::batch;
use crate::mem;
use crate::transport::stats::Counter;
use crate::transport::Qp;
use crate::transport::MAX_MSG_SZ;
use crate::transport::{peer_headers, psn, send_queue_error, Env, TX_BACKLOG_MAX};
use crate::verbs::mr::MrError;
use crate::wire::{self, AtomicEth, Ieth, Immdt, Opcode, Reth, RoceHeaders};

pub use crate::transport::cwnd::MAX_INFLIGHT_PKTS;
/// Most packets one call sends for one QP (fairness between QPs).
const BURST: u32 = 64;
/// Request an ACK at least every this many packets of a long message.
const ACK_REQ_EVERY: u32 = 32;

/// Where a message's bytes come from.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Gathered from these SGEs (validated at fetch).
    Sges(Vec<Sge>),
    /// Carried in the WQE.
    Inline(Vec<u8>),
}

/// One send WQE being executed.
#[derive(Debug, Clone)]
pub struct SendOp {
    /// SQ index (free-running).
    pub index: u32,
    /// The WQE header as posted.
    pub wqe: abi::SendWqe,
    /// Its opcode, typed: `wqe.opcode` converted at fetch. A WQE whose
    /// opcode names no operation fails at fetch with `WC_LOC_QP_OP_ERR`
    /// and keeps the default, [`WrOpcode::Send`] (its completion reports
    /// `WC_OP_SEND`).
    pub opcode: WrOpcode,
    /// Message bytes.
    pub payload: Payload,
    /// Message length, bytes.
    pub len: u32,
    /// PSN of the first packet.
    pub first_psn: u32,
    /// Number of packets (PSNs) of the message.
    pub npkts: u32,
    /// Packets sent in the current pass.
    pub sent: u32,
    /// A local error found at fetch (`ibv_wc_status`): the WQE completes with it.
    pub error: Option<abi::WcStatus>,
    /// READ: response packets received in order so far.
    pub resp_pkts: u32,
    /// READ: the response count at which the rest was last re-requested
    /// after a gap, so a burst of out-of-order responses asks only once.
    pub rerequested_at: Option<u32>,
    /// READ: packets (PSNs) one READ request asks for, fixed at the first
    /// request ([`read_chunk`]); 0 before it. Request `j` covers packets
    /// `j * chunk ..` up to `(j + 1) * chunk` or the message's end, and a
    /// re-request from inside it ends where it ends, so that the
    /// responder finds it inside a request it executed (IBTA §9.7.5.2.3;
    /// rxe's `duplicate_request` drops one that is not).
    pub chunk: u32,
}

impl SendOp {
    /// PSN of the last packet.
    pub fn last_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npkts.max(1) - 1)
    }

    /// True for operations that complete only on their responses (RDMA
    /// READ and atomics), never on a plain ACK (IBTA §9.7.5.1.5).
    pub fn needs_response(&self) -> bool {
        is_read_or_atomic(self.opcode)
    }

    /// The end (exclusive, a packet index of the message) of the request
    /// that asks for packet `k`: a READ's request ends at its chunk's end
    /// ([`SendOp::chunk`]) or the message's; an atomic's and one not
    /// chunked (yet) at the message's.
    pub fn request_end(&self, k: u32) -> u32 {
        if self.opcode != WrOpcode::RdmaRead || self.chunk == 0 {
            return self.npkts;
        }
        (k / self.chunk)
            .saturating_add(1)
            .saturating_mul(self.chunk)
            .min(self.npkts)
    }

    /// READ and atomic requests of this op sent and not yet answered in
    /// full: what `max_rd_atomic` bounds (IBTA §9.5, C9-28). A READ's
    /// requests are its chunks from the first not fully answered
    /// (`resp_pkts`) to the last sent; 0 for SEND and WRITE.
    fn requests_outstanding(&self) -> u32 {
        if !self.needs_response() || self.sent <= self.resp_pkts {
            return 0;
        }
        if self.opcode != WrOpcode::RdmaRead || self.chunk == 0 {
            return 1;
        }
        self.sent.div_ceil(self.chunk) - self.resp_pkts / self.chunk
    }
}

/// Bytes a device's RC QPs together may have in flight: SEND and WRITE
/// packets sent and not acknowledged, READ responses asked for and not
/// received (the PSNs past each QP's oldest unacknowledged one, times its
/// path MTU): 2 MiB, half of what the smallest receive queue in front of
/// a device holds (a TAP's 1000 frames of the path MTU 4096; an AF_PACKET
/// socket's 16 MiB buffer holds about twice that). Each QP's congestion
/// window finds its own share only by losing packets: with 64 QPs the
/// windows together held 32 MiB, the queues in front of the receiving
/// device overflowed again and again, QPs waited for ACK timeouts and
/// some moved far less than others (Jain's index 0.57-0.89), a READ's
/// responder sending all it was asked for at once (issue 28). It is a
/// shared window on top of the QPs' own (`window`), split equally
/// among the QPs with something in flight (`budget_window`); a QP with
/// nothing in flight may always send one packet or READ request, so none
/// starves, and each waits only for its own ACKs and responses. One QP's
/// full window (128 packets of 4096 bytes, 512 KiB) is well inside it.
pub const IN_FLIGHT_BUDGET_BYTES: u64 = 2 << 20;

/// PSNs an RC QP has in flight: from its oldest unacknowledged one up to
/// the next it will send (SEND and WRITE packets unacknowledged, READ
/// responses and atomic results asked for and not received). 0 for UC
/// and UD.
fn psns_in_flight(qp: &Qp) -> u32 {
    let r = &qp.req;
    // Nothing fetched is left (a flush leaves the PSNs unacknowledged).
    if r.inflight.is_empty() {
        return 0;
    }
    let next = match r.inflight.get(r.send_pos) {
        Some(op) => psn::add(op.first_psn, op.sent),
        None => r.psn,
    };
    u32::try_from(window_ahead(qp, next)).unwrap_or(0)
}

/// Brings the device's sum of bytes in flight
/// ([`crate::transport::Resources::bytes_in_flight`]) up to date with `qp`
/// after a step of it.
pub fn count_in_flight(qp: &mut Qp, res: &mut crate::transport::Resources) {
    // Another function of the daemon holds its sender back instead of
    // dropping (`link::txq`): its QPs need no budget and take none.
    qp.to_wire = match (&qp.req.peer_hdr, &res.out.local_macs) {
        (Some(h), Some(local)) => !local.contains(&h.hdr.eth_dst),
        _ => true,
    };
    let now = match qp.to_wire {
        true => u64::from(psns_in_flight(qp)) * u64::from(qp.mtu()),
        false => 0,
    };
    let was = qp.in_flight_counted;
    if now == was {
        return;
    }
    res.bytes_in_flight = res.bytes_in_flight.saturating_sub(was).saturating_add(now);
    match (was, now) {
        (0, _) => res.qps_in_flight = res.qps_in_flight.saturating_add(1),
        (_, 0) => res.qps_in_flight = res.qps_in_flight.saturating_sub(1),
        _ => {}
    }
    qp.in_flight_counted = now;
}

/// The most PSNs `qp` may have in flight for the device to stay inside
/// [`IN_FLIGHT_BUDGET_BYTES`] with what the other QPs have in flight, and
/// no more than an equal share of it among the QPs with something in
/// flight (this one counted): a QP whose ACKs come back first would
/// otherwise take again at once what it freed, and the others, held to
/// one packet each, would never grow. At least 1.
fn budget_window(qp: &Qp, env: &Env) -> u32 {
    if !qp.to_wire {
        return u32::MAX;
    }
    let others = env.res.bytes_in_flight.saturating_sub(qp.in_flight_counted);
    let room = IN_FLIGHT_BUDGET_BYTES.saturating_sub(others);
    let active = env.res.qps_in_flight + u32::from(qp.in_flight_counted == 0);
    let share = IN_FLIGHT_BUDGET_BYTES / u64::from(active.max(1));
    let pkts = room.min(share) / u64::from(qp.mtu());
    u32::try_from(pkts).unwrap_or(u32::MAX).max(1)
}

/// Packets one READ request asks for at most, given the QP's congestion
/// window now: a share of the window (a quarter, or all of it for
/// `max_rd_atomic` 1, a half for 2, a third for 3), at least
/// [`crate::transport::cwnd::CWND_MIN`]. A long READ is asked for in such
/// chunks as the window opens, each a READ request of its own (as a
/// requester may, IBTA §9.4.3: each READ request names its own virtual
/// address and length), so that the READ responses of a QP, like its SEND
/// and WRITE packets, are paced by the window and cut back on loss: a
/// responder sends each READ's responses as fast as it can, and many QPs
/// READing megabytes at once overflowed the receiving socket's queue until
/// their retries ran out (issue 28).
pub fn read_chunk(qp: &Qp) -> u32 {
    let share = u32::from(qp.attr.max_rd_atomic.clamp(1, 4));
    (qp.req.cwnd.window() / share).max(crate::transport::cwnd::CWND_MIN)
}

/// True for RDMA READ and the atomics.
pub fn is_read_or_atomic(wr: WrOpcode) -> bool {
    wr == WrOpcode::RdmaRead || wr.is_atomic()
}

/// Requester state of a QP.
#[derive(Debug, Default)]
pub struct ReqState {
    /// Producer index the driver rang.
    pub sq_pi: u32,
    /// Next SQ index to fetch.
    pub sq_next: u32,
    /// Oldest uncompleted SQ index.
    pub sq_ci: u32,
    /// PSN for the next new packet.
    pub psn: u32,
    /// Newest PSN acknowledged.
    pub acked_psn: u32,
    /// Fetched, uncompleted WQEs in order.
    pub inflight: VecDeque<SendOp>,
    /// Index in `inflight` of the first WQE not fully sent.
    pub send_pos: usize,
    /// Retries left (after timeouts and PSN sequence error NAKs).
    pub retry_left: u8,
    /// A retry started since the last progress (an ACK or READ response
    /// that moved the oldest unacknowledged PSN): a sequence NAK then
    /// starts none (rxe's `started_retry`).
    pub retry_started: bool,
    /// RNR retries left (7 = infinite).
    pub rnr_left: u8,
    /// When the local ACK timer expires.
    pub ack_deadline: Option<u64>,
    /// The congestion window of SEND and WRITE packets.
    pub cwnd: crate::transport::cwnd::Cwnd,
    /// The QP's round trip, for the tail loss probe.
    pub rtt: crate::transport::probe::Rtt,
    /// When a tail loss probe goes, if no progress comes first
    /// ([`crate::transport::probe`]).
    pub probe_deadline: Option<u64>,
    /// A probe went since the last progress: no other until then.
    pub probe_sent: bool,
    /// The device's frame count ([`crate::transport::Output::frames_queued`])
    /// after this QP's last request packet: until the frames before it
    /// have left the device ([`crate::transport::Output::departed`]), an
    /// expired ACK timer waits instead of retrying.
    pub tx_mark: u64,
    /// Sending is paused until this time (RNR NAK back-off).
    pub rnr_deadline: Option<u64>,
    /// Sending waits for ARP / neighbour discovery to resolve this GID.
    pub waiting_arp: Option<[u8; 16]>,
    /// UD: the unresolved destinations of the WQEs queued behind the one
    /// waiting (at most `datagram::RESOLVE_AHEAD`), whose resolutions the
    /// device starts at the same time, so that a send queue naming many
    /// unresolved destinations waits for them together, not in turn.
    pub resolve_ahead: Vec<[u8; 16]>,
    /// RTS→SQD asked for `EV_SQ_DRAINED` once every fetched WQE completes.
    pub drain_pending: bool,
    /// The last run stopped at its burst limit with work left: the next
    /// device poll runs the QP again (UC and UD get no ACKs to wake them).
    pub more: bool,
    /// The headers of the last request packet built
    /// ([`crate::transport::peer_headers`]).
    pub peer_hdr: Option<Box<crate::transport::PeerHeaders>>,
}

impl ReqState {
    /// Sets the initial PSN and retry counters (on RTR→RTS).
    pub fn start(&mut self, sq_psn: u32, retry_cnt: u8, rnr_retry: u8) {
        self.psn = sq_psn & psn::PSN_MASK;
        self.acked_psn = psn::add(sq_psn, psn::PSN_MASK);
        self.retry_left = retry_cnt;
        self.retry_started = false;
        self.rnr_left = rnr_retry;
        self.cwnd = Default::default();
        self.rtt = Default::default();
        self.probe_deadline = None;
        self.probe_sent = false;
    }
}

/// Local ACK timeout of a QP, ns: 4.096 µs × 2^timeout (IBTA §9.7.6.1.3),
/// `None` for 0 (infinite). At least 1 ms, so that a busy host does not
/// retransmit on every scheduling hiccup.
pub fn ack_timeout_ns(timeout: u8) -> Option<u64> {
    (timeout != 0).then(|| (4096u64 << timeout.min(31)).max(1_000_000))
}

/// The `ibv_wc_opcode` of a send completion for a WR of opcode `wr`.
fn wc_opcode(wr: WrOpcode) -> u8 {
    match wr {
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => abi::WC_OP_RDMA_WRITE,
        WrOpcode::RdmaRead => abi::WC_OP_RDMA_READ,
        WrOpcode::AtomicCmpAndSwp => abi::WC_OP_COMP_SWAP,
        WrOpcode::AtomicFetchAndAdd => abi::WC_OP_FETCH_ADD,
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => abi::WC_OP_SEND,
    }
}

/// Advances the SQ consumer index past `op` and then writes its send
/// completion (if signaled or failed). The QP record goes out first: an
/// application that polls the completion may post at once into the slot it
/// frees (perftest keeps exactly `max_send_wr` outstanding), so the driver
/// must see the slot free no later than the CQE.
pub fn complete_op(qp: &mut Qp, env: &mut Env, op: &SendOp, status: abi::WcStatus) {
    qp.req.sq_ci = op.index.wrapping_add(1);
    crate::transport::write_record(qp, env);
    let signaled = qp.sq_sig_all || op.wqe.send_flags & abi::SEND_SIGNALED != 0;
    if signaled || status != abi::WcStatus::Success {
        let cqe = abi::Cqe {
            wr_id: op.wqe.wr_id,
            byte_len: op.len,
            qp_num: qp.qpn,
            status: status.raw(),
            opcode: wc_opcode(op.opcode),
            ..Default::default()
        };
        env.complete(qp.send_cqn, cqe, false);
    }
    if qp.state == abi::QpState::Sqd && qp.req.drain_pending && qp.req.inflight.is_empty() {
        qp.req.drain_pending = false;
        env.res.out.event(abi::EV_SQ_DRAINED, qp.qpn, 0);
    }
}

/// Reads and validates the WQE at SQ index `index`.
pub(crate) fn fetch(qp: &Qp, env: &Env, index: u32) -> SendOp {
    let slot = qp.sq.slot(index);
    let mut op = SendOp {
        index,
        wqe: abi::SendWqe::default(),
        opcode: WrOpcode::default(),
        payload: Payload::Sges(Vec::new()),
        len: 0,
        first_psn: qp.req.psn,
        npkts: 0,
        sent: 0,
        error: None,
        resp_pkts: 0,
        rerequested_at: None,
        chunk: 0,
    };
    match mem::read_obj::<abi::SendWqe>(env.mem, slot) {
        Ok(w) => op.wqe = w,
        Err(_) => {
            op.error = Some(abi::WcStatus::LocQpOpErr);
            return op;
        }
    }
    match WrOpcode::try_from(op.wqe.opcode) {
        Ok(o) => op.opcode = o,
        Err(_) => {
            op.error = Some(abi::WcStatus::LocQpOpErr);
            return op;
        }
    }
    if let Err(status) = load_payload(qp, env, slot, &mut op) {
        op.error = Some(status);
        return op;
    }
    op.npkts = if op.opcode.is_atomic() {
        1
    } else {
        op.len.div_ceil(qp.mtu()).max(1)
    };
    op
}

fn load_payload(qp: &Qp, env: &Env, slot: u64, op: &mut SendOp) -> Result<(), abi::WcStatus> {
    let w = op.wqe;
    let wr = op.opcode;
    // Operations per transport (IBTA Table 38 "service types").
    let send = matches!(wr, WrOpcode::Send | WrOpcode::SendWithImm);
    let write = matches!(wr, WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm);
    let supported = match qp.qp_type {
        abi::QpType::Rc => send || write || wr == WrOpcode::SendWithInv || is_read_or_atomic(wr),
        abi::QpType::Uc => send || write,
        abi::QpType::Ud | abi::QpType::Gsi => send,
    };
    // READ and atomic results are written into the local buffers: their
    // SGEs need ACCESS_LOCAL_WRITE, the others only local read. rxe finds
    // out when the response arrives (rxe_comp.c do_read/do_atomic:
    // copy_data with IB_ACCESS_LOCAL_WRITE, else IB_WC_LOC_PROT_ERR); we
    // check at fetch, so nothing is asked of the peer, and again at the
    // write (scatter_sges).
    let local_access = if is_read_or_atomic(wr) {
        abi::ACCESS_LOCAL_WRITE
    } else {
        0
    };
    if !supported {
        return Err(abi::WcStatus::LocQpOpErr);
    }
    let body = slot + size_of::<abi::SendWqe>() as u64;
    if w.send_flags & abi::SEND_INLINE != 0 && local_access == 0 {
        if w.inline_len > qp.max_inline {
            return Err(abi::WcStatus::LocLenErr);
        }
        let mut data = vec![0u8; w.inline_len as usize];
        env.mem
            .read(body, &mut data)
            .map_err(|_| abi::WcStatus::LocQpOpErr)?;
        check_remote_range(wr, w.remote_addr, u64::from(w.inline_len))?;
        op.len = w.inline_len;
        op.payload = Payload::Inline(data);
        return Ok(());
    }
    if w.num_sge as u32 > qp.max_send_sge {
        return Err(abi::WcStatus::LocLenErr);
    }
    let mut sges = Vec::with_capacity(w.num_sge as usize);
    let mut total: u64 = 0;
    for i in 0..w.num_sge as u64 {
        let sge: Sge =
            mem::read_obj(env.mem, body + i * 16).map_err(|_| abi::WcStatus::LocQpOpErr)?;
        if sge.length == 0 {
            continue;
        }
        env.res
            .mrs
            .check(sge.lkey, qp.pdn, local_access, sge.addr, sge.length as u64)
            .map_err(|e| match e {
                MrError::Bounds => abi::WcStatus::LocLenErr,
                _ => abi::WcStatus::LocProtErr,
            })?;
        // At most max_send_sge (32) lengths below 2^32: no overflow.
        total += u64::from(sge.length);
        sges.push(sge);
    }
    // max_msg_sz (ibv_port_attr; rxe's validate_send_wr refuses it at post
    // time, the device cannot trust the driver to have done so).
    if total > u64::from(MAX_MSG_SZ) {
        return Err(abi::WcStatus::LocLenErr);
    }
    check_remote_range(wr, w.remote_addr, total)?;
    // An atomic returns the original 8 bytes into its one SGE (ibv_post_send(3)).
    if wr.is_atomic() {
        if total != 8 {
            return Err(abi::WcStatus::LocLenErr);
        }
        if !w.remote_addr.is_multiple_of(8) {
            return Err(abi::WcStatus::LocQpOpErr);
        }
    }
    op.len = total as u32;
    op.payload = Payload::Sges(sges);
    Ok(())
}

/// An RDMA WRITE, READ or atomic whose remote range `[remote_addr,
/// remote_addr + len)` does not fit below 2^64 (an atomic's is 8 bytes)
/// is a malformed work request: `WC_LOC_QP_OP_ERR`, before any packet.
/// Every later `remote_addr + offset` of the message is then below 2^64
/// (issue 9, item 4: a re-requested READ near `u64::MAX` overflowed).
/// guest-lib's `post_send` refuses such a WR with `EINVAL`.
fn check_remote_range(wr: WrOpcode, remote_addr: u64, len: u64) -> Result<(), abi::WcStatus> {
    let len = match wr {
        WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => len,
        WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => 8,
        WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => return Ok(()),
    };
    match remote_addr.checked_add(len) {
        Some(_) => Ok(()),
        None => Err(abi::WcStatus::LocQpOpErr),
    }
}

/// Gathers `buf.len()` message bytes starting at byte `offset` of `op`
/// from `mem` through the MR table `mrs` (not the whole `Env`, so the
/// caller can hold the output queue mutably meanwhile:
/// [`Output::send_with`] fills the frame with it).
///
/// [`Output::send_with`]: crate::transport::Output::send_with
pub(crate) fn gather(
    mem: &dyn crate::mem::DmaMemory,
    mrs: &crate::verbs::mr::MrTable,
    op: &SendOp,
    offset: u32,
    buf: &mut [u8],
) -> Result<(), abi::WcStatus> {
    match &op.payload {
        Payload::Inline(d) => {
            let o = offset as usize;
            let end = o.checked_add(buf.len()).ok_or(abi::WcStatus::LocLenErr)?;
            buf.copy_from_slice(d.get(o..end).ok_or(abi::WcStatus::LocLenErr)?);
        }
        Payload::Sges(sges) => {
            // Every byte of `buf` is written, or it is an error: it holds a
            // reused frame's old bytes (`wire::emit_frame_with`).
            let len = buf.len();
            super::for_each_sge_piece(sges, offset, len, |sge, va, done, n| {
                let mr = mrs.get(sge.lkey).map_err(|_| abi::WcStatus::LocProtErr)?;
                mr.read(mem, va, &mut buf[done..done + n])
                    .map_err(|_| abi::WcStatus::LocProtErr)
            })?;
        }
    }
    Ok(())
}

/// Appends to `out` the pieces of driver memory behind `len` message
/// bytes of `op` from byte `offset` ([`crate::verbs::mr::Mr::pieces`]):
/// [`gather`] by reference. Errors: as [`gather`]'s.
fn pieces(
    mrs: &crate::verbs::mr::MrTable,
    op: &SendOp,
    offset: u32,
    len: usize,
    out: &mut Vec<u8>,
) -> Result<(), abi::WcStatus> {
    let Payload::Sges(sges) = &op.payload else {
        return Err(abi::WcStatus::LocLenErr);
    };
    super::for_each_sge_piece(sges, offset, len, |sge, va, _, n| {
        let mr = mrs.get(sge.lkey).map_err(|_| abi::WcStatus::LocProtErr)?;
        mr.pieces(va, n, out).map_err(|_| abi::WcStatus::LocProtErr)
    })
}

/// Packet opcode for packet `k` of `npkts` of a message with WR opcode
/// `wr` on a QP of type `qp_type` (UC opcodes are the RC ones + 0x20,
/// IBTA Table 35).
fn packet_opcode(qp_type: abi::QpType, wr: WrOpcode, k: u32, npkts: u32) -> Opcode {
    let rc = rc_packet_opcode(wr, k, npkts);
    if qp_type == abi::QpType::Uc {
        Opcode::from_u8(rc as u8 | 0x20).unwrap_or(rc)
    } else {
        rc
    }
}

fn rc_packet_opcode(wr: WrOpcode, k: u32, npkts: u32) -> Opcode {
    use WrOpcode as W;
    let (first, last) = (k == 0, k + 1 == npkts);
    match (wr, first, last) {
        (W::RdmaRead, _, _) => Opcode::RcReadRequest,
        (W::AtomicCmpAndSwp, _, _) => Opcode::RcCompareSwap,
        (W::AtomicFetchAndAdd, _, _) => Opcode::RcFetchAdd,
        (W::RdmaWrite | W::RdmaWriteWithImm, true, false) => Opcode::RcWriteFirst,
        (W::RdmaWrite | W::RdmaWriteWithImm, false, false) => Opcode::RcWriteMiddle,
        (W::RdmaWrite, true, true) => Opcode::RcWriteOnly,
        (W::RdmaWrite, false, true) => Opcode::RcWriteLast,
        (W::RdmaWriteWithImm, true, true) => Opcode::RcWriteOnlyImm,
        (W::RdmaWriteWithImm, false, true) => Opcode::RcWriteLastImm,
        (W::Send | W::SendWithImm | W::SendWithInv, true, false) => Opcode::RcSendFirst,
        (W::Send | W::SendWithImm | W::SendWithInv, false, false) => Opcode::RcSendMiddle,
        (W::SendWithImm, true, true) => Opcode::RcSendOnlyImm,
        (W::SendWithImm, false, true) => Opcode::RcSendLastImm,
        (W::SendWithInv, true, true) => Opcode::RcSendOnlyInv,
        (W::SendWithInv, false, true) => Opcode::RcSendLastInv,
        (W::Send, true, true) => Opcode::RcSendOnly,
        (W::Send, false, true) => Opcode::RcSendLast,
    }
}

/// How far PSN `p` is beyond the oldest unacknowledged PSN of an RC QP
/// (0: it is that PSN); always 0 for UC, which has no acknowledgements.
fn window_ahead(qp: &Qp, p: u32) -> i32 {
    if qp.qp_type != abi::QpType::Rc {
        return 0;
    }
    psn::diff(p, psn::add(qp.req.acked_psn, 1))
}

/// How often a SEND or WRITE asks for an ACK, in packets of its message:
/// [`ACK_REQ_EVERY`], or a quarter of a smaller window (the congestion
/// window or the device's budget, [`window`]; at least 2), so that a
/// window cut by loss still gets several ACKs per round trip: any one of
/// them is progress, and progress is what resets the retry count.
fn ack_every(qp: &Qp, env: &Env) -> u32 {
    ack_interval(qp.req.cwnd.window().min(budget_window(qp, env)))
}

/// [`ack_every`] for a SEND or WRITE window of `wnd` packets.
fn ack_interval(wnd: u32) -> u32 {
    (wnd / 4).clamp(2, ACK_REQ_EVERY)
}

/// The window op `op` is sent within, packets: the congestion window for
/// SEND, WRITE and READ (a READ request goes when its whole chunk fits in
/// it, [`read_chunk`]), [`MAX_INFLIGHT_PKTS`] for an atomic (one PSN);
/// either no larger than the device's budget leaves it
/// ([`budget_window`]).
fn window(qp: &Qp, env: &Env, op: &SendOp) -> i32 {
    let w = if op.opcode.is_atomic() {
        MAX_INFLIGHT_PKTS
    } else {
        qp.req.cwnd.window()
    };
    w.min(budget_window(qp, env)) as i32
}

/// Sends packet `k` of inflight op `i`; `window_full` asks for an ACK (the
/// window closes behind this packet). Returns false when the packet could
/// not be built (peer MAC unknown).
fn send_packet(
    qp: &mut Qp,
    env: &mut Env,
    i: usize,
    k: u32,
    window_full: bool,
) -> Result<bool, abi::WcStatus> {
    let mtu = qp.mtu();
    let op = &qp.req.inflight[i];
    let opcode = packet_opcode(qp.qp_type, op.opcode, k, op.npkts);
    let psn = psn::add(op.first_psn, k);
    let Some(mut hdr) = peer_headers(qp, env, opcode, psn) else {
        return Ok(false);
    };
    let op = &qp.req.inflight[i];
    // k < npkts = ceil(len / mtu) and len <= MAX_MSG_SZ: below 2^32.
    let offset = k.checked_mul(mtu).ok_or(abi::WcStatus::LocLenErr)?;
    if op.needs_response() {
        // One request asks for packets k.. up to the end of its chunk
        // (a resent READ restarts at the first missing response, §9.7.5.1.5).
        hdr.bth.ack_req = true;
        let w = &op.wqe;
        if opcode == Opcode::RcReadRequest {
            // request_end <= npkts = ceil(len / mtu): below 2^32 bytes.
            let end = op.request_end(k).saturating_mul(mtu).min(op.len);
            let dma_len = end.saturating_sub(offset);
            // The remote range was checked at fetch (check_remote_range).
            let va = w
                .remote_addr
                .checked_add(u64::from(offset))
                .ok_or(abi::WcStatus::LocQpOpErr)?;
            hdr.reth = Some(Reth {
                va,
                rkey: w.rkey,
                dma_len,
            });
        } else {
            let swap_add = if opcode == Opcode::RcCompareSwap {
                w.swap
            } else {
                w.compare_add
            };
            hdr.atomic_eth = Some(AtomicEth {
                va: w.remote_addr,
                rkey: w.rkey,
                swap_add,
                compare: w.compare_add,
            });
        }
        env.res.out.send(&mut hdr, &[]);
        return Ok(true);
    }
    let n = op.len.saturating_sub(offset).min(mtu);
    let last = k + 1 == op.npkts;
    hdr.bth.ack_req = qp.qp_type == abi::QpType::Rc
        && (last || window_full || (k + 1).is_multiple_of(ack_every(qp, env)));
    hdr.bth.solicited = last && op.wqe.send_flags & abi::SEND_SOLICITED != 0;
    ext_headers(&mut hdr, op);
    let res = &mut *env.res;
    // To another function of the daemon, the payload may stay in driver
    // memory for the receiver to copy; else it goes from driver memory
    // straight into the frame.
    let fill = |buf: &mut [u8]| gather(env.mem, &res.mrs, op, offset, buf);
    if matches!(op.payload, Payload::Sges(_)) {
        let entries = |out: &mut Vec<u8>| pieces(&res.mrs, op, offset, n as usize, out);
        res.out.send_payload(&mut hdr, n as usize, entries, fill)?;
    } else {
        res.out.send_with(&mut hdr, n as usize, fill)?;
    }
    Ok(true)
}

/// How many packets of inflight op `i` from packet `k` may go as one run
/// ([`batch::Run`]): an RC or UC SEND or WRITE from driver memory, at most
/// `budget` packets, [`batch::RUN_MAX_PACKETS`] and what the window has
/// room for (`ahead`: how far packet `k` is beyond the oldest
/// unacknowledged PSN; `wnd`: the window, [`window`]), ending at the
/// first packet that asks for an ACK
/// ([`ack_every`]), so that only the run's last packet may ask.
fn run_len(qp: &Qp, i: usize, k: u32, ahead: i32, wnd: i32, budget: u32) -> u32 {
    let op = &qp.req.inflight[i];
    if !matches!(qp.qp_type, abi::QpType::Rc | abi::QpType::Uc)
        || op.needs_response()
        || !matches!(op.payload, Payload::Sges(_))
    {
        return 0;
    }
    let room = u32::try_from(wnd - ahead).unwrap_or(0);
    let n = (op.npkts - k)
        .min(budget)
        .min(batch::RUN_MAX_PACKETS)
        .min(room);
    // Packet j asks for an ACK every ack_every packets of the message.
    let every = ack_interval(u32::try_from(wnd).unwrap_or(0));
    let to_ack = every - k % every;
    n.min(to_ack)
}

/// Sends packets `k..` of inflight op `i` as one run to another function
/// of the daemon that reads this one's memory ([`Output::send_run_by_ref`]),
/// as many as [`run_len`] allows when that is at least 2. Returns how many
/// were sent: 0 when they go one by one instead ([`send_packet`]).
/// `ahead`: how far packet `k` is beyond the oldest unacknowledged PSN.
fn send_run(
    qp: &mut Qp,
    env: &mut Env,
    i: usize,
    k: u32,
    ahead: i32,
    budget: u32,
) -> Result<u32, abi::WcStatus> {
    let wnd = window(qp, env, &qp.req.inflight[i]);
    let n = run_len(qp, i, k, ahead, wnd, budget);
    if n < 2 || !env.res.out.may_send_run() {
        return Ok(0);
    }
    let mtu = qp.mtu();
    let op = &qp.req.inflight[i];
    let first_op = packet_opcode(qp.qp_type, op.opcode, k, op.npkts);
    let last_k = k + n - 1;
    let last_op = packet_opcode(qp.qp_type, op.opcode, last_k, op.npkts);
    let Some(mut hdr) = peer_headers(qp, env, first_op, psn::add(op.first_psn, k)) else {
        return Ok(0);
    };
    let op = &qp.req.inflight[i];
    // k < npkts = ceil(len / mtu) and len <= MAX_MSG_SZ: below 2^32.
    let offset = k.checked_mul(mtu).ok_or(abi::WcStatus::LocLenErr)?;
    let total = op.len.saturating_sub(offset).min(n.saturating_mul(mtu));
    let ends = last_k + 1 == op.npkts;
    hdr.bth.ack_req = false;
    hdr.bth.solicited = false;
    ext_headers(&mut hdr, op);
    let mut last = hdr.of_flow(wire::Bth {
        opcode: last_op,
        psn: psn::add(op.first_psn, last_k),
        // RC: the window closes behind it, or it ends the message or an
        // ACK interval (run_len ends runs there).
        ack_req: qp.qp_type == abi::QpType::Rc
            && (ends
                || ahead + n as i32 >= wnd
                || (last_k + 1).is_multiple_of(ack_interval(u32::try_from(wnd).unwrap_or(0)))),
        solicited: ends && op.wqe.send_flags & abi::SEND_SOLICITED != 0,
        ..hdr.bth
    });
    ext_headers(&mut last, op);
    let res = &mut *env.res;
    let sent = res
        .out
        .send_run_by_ref(&mut hdr, &last, n, mtu, total as usize, |out| {
            pieces(&res.mrs, op, offset, total as usize, out)
        })?;
    Ok(if sent { n } else { 0 })
}

/// The extension headers a SEND or WRITE packet with `hdr`'s opcode
/// carries, from its WQE `op` (IBTA 9.2): the RETH of a WRITE's first
/// packet, the ImmDt or IETH of a message's last.
fn ext_headers(hdr: &mut RoceHeaders, op: &SendOp) {
    let opcode = hdr.bth.opcode;
    if opcode.has_reth() {
        hdr.reth = Some(Reth {
            va: op.wqe.remote_addr,
            rkey: op.wqe.rkey,
            dma_len: op.len,
        });
    }
    if opcode.has_immdt() {
        hdr.immdt = Some(Immdt(op.wqe.imm_data));
    }
    if opcode.has_ieth() {
        hdr.ieth = Some(Ieth {
            rkey: u32::from_be_bytes(op.wqe.imm_data),
        });
    }
}

/// True when op `pos` of the in-flight list must wait before its next
/// packet: a fenced WQE waits before its first for every earlier READ and
/// atomic to complete (`IBV_SEND_FENCE`, IBTA §10.8.3.3), and a READ or
/// atomic request (each chunk of a READ is one) waits while
/// `max_rd_atomic` requests are outstanding (IBTA §9.5, C9-28).
fn must_wait(qp: &Qp, pos: usize) -> bool {
    let op = &qp.req.inflight[pos];
    if op.sent == 0
        && op.wqe.send_flags & abi::SEND_FENCE != 0
        && qp.req.inflight.iter().take(pos).any(|o| o.needs_response())
    {
        return true;
    }
    if !op.needs_response() {
        return false;
    }
    let outstanding: u32 = qp
        .req
        .inflight
        .iter()
        .take(pos + 1)
        .map(|o| o.requests_outstanding())
        .sum();
    // 0 would forbid READ and atomics outright; like rxe's requester, treat
    // it as 1 so a misconfigured QP is slow rather than stuck.
    outstanding >= u32::from(qp.attr.max_rd_atomic.max(1))
}

/// Sends what an RC or UC QP may send now: unsent packets of fetched
/// WQEs, then new WQEs, within the in-flight window. In SQD only WQEs
/// already fetched are sent (and retransmitted); nothing new is fetched.
/// A UD QP sends nothing here: [`crate::transport::datagram::run`] serves
/// it ([`crate::transport::send`] picks).
pub fn run(qp: &mut Qp, env: &mut Env) {
    if qp.qp_type.is_datagram()
        || !matches!(qp.state, abi::QpState::Rts | abi::QpState::Sqd)
        || qp.req.rnr_deadline.is_some()
    {
        return;
    }
    qp.req.waiting_arp = None;
    qp.req.more = false;
    let mut budget = BURST;
    let mut backlog = false;
    let mut sent_any = false;
    while budget > 0 {
        if env.res.out.backlog() >= TX_BACKLOG_MAX {
            backlog = true;
            break;
        }
        let pos = qp.req.send_pos;
        let step = if pos < qp.req.inflight.len() {
            send_next(qp, env, pos, &mut budget)
        } else {
            fetch_next(qp, env)
        };
        match step {
            Step::Next => {}
            Step::Sent => sent_any = true,
            Step::Stop => break,
        }
    }
    qp.req.more = budget == 0 || backlog;
    if (sent_any || qp.req.probe_deadline.is_none()) && !qp.req.probe_sent {
        arm_probe(qp, env);
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
pub fn fail_head(qp: &mut Qp, env: &mut Env, status: abi::WcStatus) {
    if let Some(op) = qp.req.inflight.pop_front() {
        qp.req.send_pos = qp.req.send_pos.saturating_sub(1);
        complete_op(qp, env, &op, status);
    }
    send_queue_error(qp, env, status);
}

/// What one step of [`run`]'s loop did.
enum Step {
    /// Go on: an op was passed, a WQE fetched, or a UC message sent.
    Next,
    /// Packets of an RC QP went: go on.
    Sent,
    /// Stop: the window, the neighbour, an error or the queue ends the
    /// burst.
    Stop,
}

/// [`run`]'s step for the fetched op at `pos` of `inflight`: sends its
/// next packets (a run, else one packet) when the window has room for
/// them, taking what they cost from `budget`.
fn send_next(qp: &mut Qp, env: &mut Env, pos: usize, budget: &mut u32) -> Step {
    let op = &qp.req.inflight[pos];
    if op.error.is_some() {
        return Step::Stop; // completes when it reaches the head
    }
    let k = op.sent;
    if k >= op.npkts {
        qp.req.send_pos += 1;
        return Step::Next;
    }
    if must_wait(qp, pos) {
        return Step::Stop;
    }
    if op.opcode == WrOpcode::RdmaRead && op.chunk == 0 {
        qp.req.inflight[pos].chunk = read_chunk(qp);
    }
    let op = &qp.req.inflight[pos];
    let ahead = window_ahead(qp, psn::add(op.first_psn, k));
    let wnd = window(qp, env, op);
    // A READ request goes when its whole chunk fits (its
    // responses come at once), or when nothing else is in flight.
    let need = match op.opcode {
        WrOpcode::RdmaRead if ahead > 0 => (op.request_end(k) - k) as i32,
        _ => 1,
    };
    if ahead + need > wnd {
        return Step::Stop; // resumed by the ACK that moves the window
    }
    let Some((psns, cost)) = send_some(qp, env, pos, k, ahead, ahead + 1 >= wnd, *budget) else {
        return Step::Stop;
    };
    qp.req.inflight[pos].sent += psns;
    *budget -= cost;
    if qp.qp_type == abi::QpType::Uc {
        // Unreliable: a message is complete once its last packet is
        // on the wire (IBTA §9.7.2 has no acknowledgement for UC).
        complete_sent(qp, env);
        return Step::Next;
    }
    if qp.req.ack_deadline.is_none() {
        qp.req.ack_deadline = ack_timeout_ns(qp.attr.timeout).map(|t| env.now + t);
    }
    qp.req.tx_mark = env.res.out.frames_queued();
    let op = &qp.req.inflight[pos];
    qp.req
        .rtt
        .on_send(psn::add(op.first_psn, op.sent - 1), env.now);
    Step::Sent
}

/// Sends packets `k..` of the op at `pos` (`ahead` PSNs past the oldest
/// unacknowledged one): a run when [`send_run`] makes one, else one packet
/// ([`send_packet`]; `window_full`: it fills the window). Returns the
/// PSNs sent and the burst budget they cost; `None` when nothing went:
/// the neighbour is being resolved (`waiting_arp` set) or the op failed
/// (its error set).
fn send_some(
    qp: &mut Qp,
    env: &mut Env,
    pos: usize,
    k: u32,
    ahead: i32,
    window_full: bool,
    budget: u32,
) -> Option<(u32, u32)> {
    match send_run(qp, env, pos, k, ahead, budget) {
        Ok(0) => {}
        Ok(n) => return Some((n, n)),
        Err(status) => {
            qp.req.inflight[pos].error = Some(status);
            return None;
        }
    }
    match send_packet(qp, env, pos, k, window_full) {
        Ok(true) => {
            let op = &qp.req.inflight[pos];
            // A READ or atomic request covers the PSNs up to its end.
            let psns = if op.needs_response() {
                op.request_end(op.sent) - op.sent
            } else {
                1
            };
            Some((psns, 1))
        }
        Ok(false) => {
            qp.req.waiting_arp = Some(qp.attr.dgid);
            None
        }
        Err(status) => {
            // The memory behind a validated SGE went away.
            qp.req.inflight[pos].error = Some(status);
            None
        }
    }
}

/// [`run`]'s step when every fetched op is sent: fetches the next WQE
/// when the window has room (not in SQD: IBTA §10.3.1.4).
fn fetch_next(qp: &mut Qp, env: &mut Env) -> Step {
    if qp.req.sq_next == qp.req.sq_pi || qp.state != abi::QpState::Rts {
        return Step::Stop;
    }
    if window_ahead(qp, qp.req.psn) >= qp.req.cwnd.window() as i32 {
        return Step::Stop;
    }
    let op = fetch(qp, env, qp.req.sq_next);
    qp.req.sq_next = qp.req.sq_next.wrapping_add(1);
    qp.req.psn = psn::add(qp.req.psn, op.npkts);
    let failed = op.error.is_some();
    qp.req.inflight.push_back(op);
    if failed {
        Step::Stop
    } else {
        Step::Next
    }
}

/// Arms the tail loss probe ([`crate::transport::probe`]) after [`run`]
/// sent or found none armed: about two round trips after the last packet
/// sent, longer while READ responses are awaited; none when nothing is
/// outstanding.
fn arm_probe(qp: &mut Qp, env: &Env) {
    let ack_timeout = ack_timeout_ns(qp.attr.timeout);
    let pto = qp.req.rtt.pto(ack_timeout);
    qp.req.probe_deadline = if last_sent(qp).is_some() {
        Some(env.now + pto)
    } else if head_awaits_responses(qp) {
        // READ responses come in the responder's bursts, one QP after
        // another (64 packets each, `responder::READ_BURST`): with
        // many QPs the gap between two bursts is many round trips, and
        // a probe then only asks for responses already on their way.
        // A quarter of the ACK timeout still finds a lost tail four
        // times sooner.
        Some(env.now + pto.max(ack_timeout.unwrap_or(0) / 4))
    } else {
        None
    };
}

/// The last SEND or WRITE packet an RC QP sent that is not acknowledged:
/// its op's index in `inflight` and its packet index there. `None` when
/// the last packet sent is acknowledged, or a READ or atomic request
/// (their responses are their acknowledgement,
/// [`crate::transport::completer`] re-requests).
fn last_sent(qp: &Qp) -> Option<(usize, u32)> {
    if qp.qp_type != abi::QpType::Rc {
        return None;
    }
    let r = &qp.req;
    let pos = (0..=r.send_pos.min(r.inflight.len().checked_sub(1)?))
        .rev()
        .find(|&i| r.inflight[i].sent > 0)?;
    let op = &r.inflight[pos];
    let k = op.sent - 1;
    let unacked = psn::diff(psn::add(op.first_psn, k), r.acked_psn) > 0;
    (unacked && !op.needs_response() && op.error.is_none()).then_some((pos, k))
}

/// True when the READ or atomic at the head of an RC QP waits for
/// responses to requests that went: what a tail loss probe asks for again
/// when the QP's last packets were such requests ([`probe`]).
fn head_awaits_responses(qp: &Qp) -> bool {
    qp.qp_type == abi::QpType::Rc
        && qp
            .req
            .inflight
            .front()
            .is_some_and(|op| op.needs_response() && op.error.is_none() && op.sent > op.resp_pkts)
}

/// Sends the tail loss probe ([`crate::transport::probe`]): the last
/// SEND or WRITE packet sent, again, asking for an ACK; the QP's other
/// state stays as it is. When the last packets were READ or atomic
/// requests, the head's missing responses are asked for again instead
/// (go-back-N from the first of them, as after a gap: a lost tail of
/// responses shows no gap, only silence). Counted in `tail_probes`.
pub fn probe(qp: &mut Qp, env: &mut Env) {
    let Some((pos, k)) = last_sent(qp) else {
        if head_awaits_responses(qp) {
            let Some(op) = qp.req.inflight.front_mut() else {
                return;
            };
            let from = psn::add(op.first_psn, op.resp_pkts);
            op.rerequested_at = Some(op.resp_pkts);
            env.res.out.stats.count(Counter::tail_probes, 1);
            rewind(qp, from);
            // Before run, so that it arms no other probe.
            qp.req.probe_sent = true;
            run(qp, env);
        }
        return;
    };
    if let Ok(true) = send_packet(qp, env, pos, k, true) {
        qp.req.probe_sent = true;
        qp.req.tx_mark = env.res.out.frames_queued();
        env.res.out.stats.count(Counter::tail_probes, 1);
    }
}

/// UC: completes, in order, the WQEs at the head whose packets are all sent.
fn complete_sent(qp: &mut Qp, env: &mut Env) {
    while let Some(op) = qp.req.inflight.front() {
        if op.error.is_some() || op.sent < op.npkts {
            break;
        }
        let op = qp.req.inflight.pop_front().expect("front exists");
        qp.req.send_pos = qp.req.send_pos.saturating_sub(1);
        qp.req.acked_psn = op.last_psn();
        complete_op(qp, env, &op, abi::WcStatus::Success);
    }
    crate::transport::write_record(qp, env);
}

/// Rewinds sending to `from` (go-back-N): the WQE holding that PSN resends
/// from it and every later WQE from its start.
pub fn rewind(qp: &mut Qp, from: u32) {
    qp.req.rtt.on_rewind();
    qp.req.probe_deadline = None;
    let r = &mut qp.req;
    let mut found = None;
    for (i, op) in r.inflight.iter_mut().enumerate() {
        if found.is_some() {
            op.sent = 0;
            continue;
        }
        let d = psn::diff(from, op.first_psn);
        if d >= 0 && d < op.npkts as i32 {
            let d = if op.needs_response() {
                op.resp_pkts
            } else {
                d as u32
            };
            op.sent = op.sent.min(d);
            found = Some(i);
        }
    }
    if let Some(i) = found {
        r.send_pos = r.send_pos.min(i);
    }
}

/// Flushes every outstanding send WQE (QP in ERR).
pub fn flush(qp: &mut Qp, env: &mut Env) {
    let ops: Vec<SendOp> = qp.req.inflight.drain(..).collect();
    for op in &ops {
        complete_op(qp, env, op, abi::WcStatus::WrFlushErr);
    }
    // Bounded by the ring size: the doorbell keeps sq_pi within a ring of
    // the fetch index (`device::producer_index_ok`); the bound holds even
    // if that were broken.
    for _ in 0..qp.sq.size {
        if qp.req.sq_next == qp.req.sq_pi {
            break;
        }
        let op = fetch_header_only(qp, env, qp.req.sq_next);
        qp.req.sq_next = qp.req.sq_next.wrapping_add(1);
        complete_op(qp, env, &op, abi::WcStatus::WrFlushErr);
    }
    qp.req.send_pos = 0;
    qp.req.ack_deadline = None;
    qp.req.probe_deadline = None;
    qp.req.rnr_deadline = None;
}

fn fetch_header_only(qp: &Qp, env: &Env, index: u32) -> SendOp {
    let wqe: abi::SendWqe = mem::read_obj(env.mem, qp.sq.slot(index)).unwrap_or_default();
    SendOp {
        index,
        wqe,
        opcode: WrOpcode::try_from(wqe.opcode).unwrap_or_default(),
        payload: Payload::Sges(Vec::new()),
        len: 0,
        first_psn: 0,
        npkts: 0,
        sent: 0,
        error: None,
        resp_pkts: 0,
        rerequested_at: None,
        chunk: 0,
    }
}

/// Scatters `data` into `op`'s local SGEs (of a QP in PD `pdn`) at message
/// byte `offset` (READ responses and atomic results).
pub fn scatter(
    env: &Env,
    pdn: u32,
    op: &SendOp,
    offset: u32,
    data: crate::data::Data<'_>,
) -> Result<(), abi::WcStatus> {
    let Payload::Sges(sges) = &op.payload else {
        return Err(abi::WcStatus::LocProtErr);
    };
    crate::transport::scatter_sges(env, pdn, sges, offset, data)
}
