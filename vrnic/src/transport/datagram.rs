//! Unreliable Datagram (IBTA Vol 1 §9.8.2 "UD", §10.2.5 Q_Keys; RoCEv2
//! Annex A17.4.5.1 for the GRH): one packet per message, addressed by an
//! address handle, the destination QPN and a Q_Key carried in the DETH; no
//! acknowledgements. The receiver checks the Q_Key, takes a receive WQE
//! (RQ or SRQ) and puts the 40-byte GRH area in front of the payload.

use std::net::IpAddr;

use crate::abi;
use crate::batch::Packet;
use crate::data::Data;
use crate::transport::recv_queue;
use crate::transport::requester::{self, complete_op, fetch};
use crate::transport::stats::Counter;
use crate::transport::Qp;
use crate::transport::{headers_to, psn, scatter_sges, send_queue_error, write_record, Env};
use crate::wire::{Deth, Gid, Immdt, Opcode};

/// Bytes of the GRH area at the start of every UD receive buffer
/// (`sizeof(struct ibv_grh)`).
pub const GRH_LEN: usize = 40;

/// Most WQEs one call sends for one QP.
const BURST: u32 = 64;

/// The Q_Key a UD send carries: the WQE's, or the QP's own when the WQE's
/// has its most significant bit set (IBTA §10.2.5, C10-15). The GSI QP's
/// always carry [`abi::GSI_QKEY`]: the kernel's MAD layer asks for the
/// QP's own (`IB_QP_SET_QKEY`), which for QP1 is that one.
pub fn send_qkey(qp: &Qp, wqe_qkey: u32) -> u32 {
    if qp.qp_type == abi::QpType::Gsi {
        abi::GSI_QKEY
    } else if wqe_qkey & 0x8000_0000 != 0 {
        qp.attr.qkey
    } else {
        wqe_qkey
    }
}

/// The QP a UD send goes to: the WQE's, and for the GSI QP always the
/// peer's GSI QP, [`abi::GSI_QPN`] (MADs go from QP1 to QP1; vrnic does
/// not redirect GSI traffic, the class redirection of IBTA chapter 13).
fn dest_qpn(qp: &Qp, wqe_qpn: u32) -> u32 {
    if qp.qp_type == abi::QpType::Gsi {
        abi::GSI_QPN
    } else {
        wqe_qpn
    }
}

/// How many WQEs behind one waiting for its destination's resolution
/// have theirs started at the same time.
pub const RESOLVE_AHEAD: u32 = 32;

/// Notes the unresolved destinations of the WQEs after the head one (which
/// waits), up to [`RESOLVE_AHEAD`] WQEs, in `qp.req.resolve_ahead`.
fn resolve_ahead(qp: &mut Qp, env: &Env) {
    let mut i = qp.req.sq_next.wrapping_add(1);
    for _ in 0..RESOLVE_AHEAD {
        if i == qp.req.sq_pi {
            break;
        }
        let Ok(w) = crate::mem::read_obj::<abi::SendWqe>(env.mem, qp.sq.slot(i)) else {
            break;
        };
        i = i.wrapping_add(1);
        let Some(ah) = env.res.ahs.get(w.ah).filter(|a| a.pdn == qp.pdn) else {
            continue;
        };
        let dgid = ah.av.dgid;
        if !env.res.neigh.resolved(&Gid(dgid).to_ip())
            && Some(dgid) != qp.req.waiting_arp
            && !qp.req.resolve_ahead.contains(&dgid)
        {
            qp.req.resolve_ahead.push(dgid);
        }
    }
}

/// Sends the UD QP's posted WQEs, in order, one packet each. A WQE whose
/// AH is missing or of another PD completes with `WC_LOC_QP_OP_ERR`, one
/// longer than the path MTU with `WC_LOC_LEN_ERR` (IBTA C10-9); either
/// moves the QP to SQE. A WQE whose destination MAC is still being
/// resolved waits at the head (the resolutions of the WQEs behind it start
/// too: [`RESOLVE_AHEAD`]); one whose resolution failed completes
/// successfully unsent, counted `tx_drop_unresolved`.
pub fn run(qp: &mut Qp, env: &mut Env) {
    if qp.state != abi::QpState::Rts {
        return;
    }
    qp.req.waiting_arp = None;
    qp.req.resolve_ahead.clear();
    qp.req.more = false;
    for n in 0..=BURST {
        if qp.req.sq_next == qp.req.sq_pi {
            break;
        }
        if n == BURST || env.res.out.backlog() >= crate::transport::TX_BACKLOG_MAX {
            qp.req.more = true;
            break;
        }
        let mut op = fetch(qp, env, qp.req.sq_next);
        let ah = env
            .res
            .ahs
            .get(op.wqe.ah)
            .filter(|a| a.pdn == qp.pdn)
            .copied();
        if op.error.is_none() {
            if ah.is_none() {
                op.error = Some(abi::WcStatus::LocQpOpErr);
            } else if op.len > qp.mtu() {
                op.error = Some(abi::WcStatus::LocLenErr);
            }
        }
        if let Some(status) = op.error {
            qp.req.sq_next = qp.req.sq_next.wrapping_add(1);
            complete_op(qp, env, &op, status);
            send_queue_error(qp, env, status);
            return;
        }
        let ah = ah.expect("checked above");
        let opcode = if op.opcode == abi::WrOpcode::SendWithImm {
            Opcode::UdSendOnlyImm
        } else {
            Opcode::UdSendOnly
        };
        let Some(mut hdr) = headers_to(
            env,
            &ah.av,
            qp.qpn,
            dest_qpn(qp, op.wqe.remote_qpn),
            opcode,
            qp.req.psn,
        ) else {
            if env.res.neigh.failed(&Gid(ah.av.dgid).to_ip(), env.now) {
                // Nobody answers for that address: the datagram is lost
                // (UD is unreliable) and the queue goes on.
                env.res.out.stats.count(Counter::tx_drop_unresolved, 1);
                qp.req.psn = psn::add(qp.req.psn, 1);
                qp.req.sq_next = qp.req.sq_next.wrapping_add(1);
                complete_op(qp, env, &op, abi::WcStatus::Success);
                continue;
            }
            qp.req.waiting_arp = Some(ah.av.dgid);
            resolve_ahead(qp, env);
            break;
        };
        hdr.bth.solicited = op.wqe.send_flags & abi::SEND_SOLICITED != 0;
        hdr.deth = Some(Deth {
            qkey: send_qkey(qp, op.wqe.remote_qkey),
            src_qp: qp.qpn,
        });
        if opcode == Opcode::UdSendOnlyImm {
            hdr.immdt = Some(Immdt(op.wqe.imm_data));
        }
        // The payload goes from driver memory straight into the frame.
        let res = &mut *env.res;
        let sent = res.out.send_with(&mut hdr, op.len as usize, |buf| {
            requester::gather(env.mem, &res.mrs, &op, 0, buf)
        });
        if let Err(status) = sent {
            qp.req.sq_next = qp.req.sq_next.wrapping_add(1);
            complete_op(qp, env, &op, status);
            send_queue_error(qp, env, status);
            return;
        }
        qp.req.psn = psn::add(qp.req.psn, 1);
        qp.req.sq_next = qp.req.sq_next.wrapping_add(1);
        complete_op(qp, env, &op, abi::WcStatus::Success);
    }
    write_record(qp, env);
}

/// The GRH area of a UD receive (as Linux rxe and RoCE hardware fill it):
/// for IPv4 20 zero bytes then the 20-byte IPv4 header, for IPv6 the
/// 40-byte IPv6 header. `net_hdr` is the frame from the IP header on.
fn grh_area(pkt: &Packet, net_hdr: &[u8]) -> [u8; GRH_LEN] {
    let mut grh = [0u8; GRH_LEN];
    match pkt.hdr.ip_src {
        IpAddr::V4(_) => {
            if let Some(h) = net_hdr.get(..20) {
                grh[20..].copy_from_slice(h);
            }
        }
        IpAddr::V6(_) => {
            if let Some(h) = net_hdr.get(..GRH_LEN) {
                grh.copy_from_slice(h);
            }
        }
    }
    grh
}

/// Handles a UD request addressed to `qp`. Silently dropped (counted in
/// `rx_dropped`): a Q_Key mismatch (IBTA C10-16), no posted receive WQE (UD
/// has no RNR), a QP not yet in RTR. A receive buffer too short for GRH +
/// payload completes with `WC_LOC_LEN_ERR` and the QP carries on.
pub fn on_request(qp: &mut Qp, env: &mut Env, pkt: &Packet, net_hdr: &[u8]) {
    let ok_state = matches!(
        qp.state,
        abi::QpState::Rtr | abi::QpState::Rts | abi::QpState::Sqd | abi::QpState::Sqe
    );
    let Some(deth) = pkt.hdr.deth else {
        env.res.out.stats.count(Counter::rx_dropped, 1);
        return;
    };
    if !ok_state || !pkt.hdr.bth.opcode.has_deth() || deth.qkey != qp.rx_qkey() {
        env.res.out.stats.count(Counter::rx_dropped, 1);
        return;
    }
    let ctx = match recv_queue::take(qp, env) {
        None => {
            env.res.out.stats.count(Counter::rx_dropped, 1);
            return;
        }
        Some(Err((wr_id, status))) => {
            complete(qp, env, wr_id, status, 0, pkt, deth.src_qp);
            return;
        }
        Some(Ok(ctx)) => ctx,
    };
    let grh = grh_area(pkt, net_hdr);
    let total = GRH_LEN + pkt.payload_len();
    let result = scatter_sges(env, qp.pdn, &ctx.sges, 0, Data::Bytes(&grh))
        .and_then(|_| scatter_sges(env, qp.pdn, &ctx.sges, GRH_LEN as u32, pkt.data()));
    let status = match result {
        Ok(()) => abi::WcStatus::Success,
        Err(s) => s,
    };
    complete(qp, env, ctx.wr_id, status, total as u32, pkt, deth.src_qp);
}

fn complete(
    qp: &Qp,
    env: &mut Env,
    wr_id: u64,
    status: abi::WcStatus,
    len: u32,
    pkt: &Packet,
    src_qp: u32,
) {
    let imm = pkt.hdr.immdt.map(|i| i.0);
    let mut flags = abi::WC_GRH;
    if imm.is_some() {
        flags |= abi::WC_WITH_IMM;
    }
    let cqe = abi::Cqe {
        wr_id,
        byte_len: if status == abi::WcStatus::Success {
            len
        } else {
            0
        },
        imm_data: imm.unwrap_or_default(),
        qp_num: qp.qpn,
        src_qp,
        status: status.raw(),
        opcode: abi::WC_OP_RECV,
        wc_flags: if status == abi::WcStatus::Success {
            flags
        } else {
            0
        },
        ..Default::default()
    };
    env.complete(qp.recv_cqn, cqe, pkt.hdr.bth.solicited);
}
