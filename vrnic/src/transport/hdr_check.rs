//! The checks every packet for a QP passes before the responder, the
//! completer or the datagram receiver sees it, in the order of rxe's
//! `hdr_check` (`rxe_recv.c`): [`check_type_state`], [`check_addr`],
//! [`check_keys`]. A packet that fails one is dropped silently (no NAK:
//! it may come from anyone) and counted by class
//! ([`crate::device::Counters::hdr_drop`]). [`admit`] runs them, after
//! the port's own address checks, and says where a packet goes
//! ([`Route`]): the one decision for a packet on its own and for a run
//! of a batch.
//!
//! Without them an off-path host that knows a QP number could write into
//! a connected QP's memory, complete its WQEs with a forged ACK or move it
//! to ERR with a forged NAK (issue 9, item 1).

use std::net::IpAddr;

use crate::abi;
use crate::batch::Packet;
use crate::transport::Qp;
use crate::transport::{source_ip, PortId};
use crate::verbs::ah::Av;
use crate::wire::{Gid, Transport};

/// Where [`admit`] sends a packet it lets in: rxe's `rxe_rcv_pkt`, which
/// queues requests to the responder and responses to the completer
/// (IBTA §9.6: the OpCode says which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// An RC or UC request (SEND, WRITE, READ request, atomic): the
    /// responder ([`crate::transport::responder`]).
    Request,
    /// An RC response (ACK, NAK, READ response, atomic ACK): the
    /// completer ([`crate::transport::completer`]).
    Response,
    /// A UD request (UD has no responses): the datagram receiver
    /// ([`crate::transport::datagram`]).
    Datagram,
}

/// Why [`admit`] refused a packet: whom its drop is counted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not this port's: its destination IP is none of the port's
    /// addresses (rxe's `rxe_chk_dgid`), its destination MAC not the
    /// port's, or it names no QP (rxe's `hdr_check` finds none).
    /// Counted in `rx_dropped`, against no QP.
    Stray,
    /// Addressed to the port's QP1 while it has no GSI QP (none was
    /// created, or it was destroyed): counted in `rx_dropped` and
    /// `rx_drop_no_gsi`, against no QP.
    NoGsi,
    /// Its QP's header checks ([`hdr_check`]) failed: counted against
    /// the QP, by class ([`crate::device::Counters::hdr_drop`]).
    Header(HdrDrop),
}

/// Decides what a received RoCEv2 packet may do (rxe's `rxe_rcv`: the
/// destination checks, `hdr_check`, then `rxe_rcv_pkt`; IBTA §9.6,
/// packet header validation): it must be addressed to `port` (an IP
/// address of its GID table, its MAC) and name a QP, `qp` (the QP of its
/// BTH's destination QP number, if there is one), pass that QP's checks
/// ([`hdr_check`]: transport, state, addresses, keys), and then goes
/// where its OpCode says ([`Route`]). Nothing is counted here; the
/// caller counts the packet for the QP it names, or as a drop.
pub fn admit(port: &PortId, qp: Option<&Qp>, pkt: &Packet) -> Result<Route, Refusal> {
    if !port.owns(pkt.hdr.ip_dst) || pkt.hdr.eth_dst != port.mac {
        return Err(Refusal::Stray);
    }
    let qp = qp.ok_or(if pkt.hdr.bth.dest_qp == abi::GSI_QPN {
        Refusal::NoGsi
    } else {
        Refusal::Stray
    })?;
    hdr_check(qp, port, pkt).map_err(Refusal::Header)?;
    let op = pkt.hdr.bth.opcode;
    // hdr_check made the OpCode's transport the QP's.
    Ok(match op.transport() {
        Transport::Ud => Route::Datagram,
        _ if op.is_request() => Route::Request,
        _ => Route::Response,
    })
}

/// Why [`hdr_check`] dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HdrDrop {
    /// The opcode is of another transport than the QP's.
    QpType,
    /// The QP's state does not receive this packet.
    QpState,
    /// RC/UC: the IP addresses are not the QP's address vector.
    BadAddr,
    /// The BTH P_Key does not match the QP's P_Key.
    BadPkey,
    /// UD: the DETH Q_Key is not the QP's.
    BadQkey,
}

/// Runs the checks of rxe's `hdr_check` on a packet for `qp`, in its
/// order. `Ok` when the packet may go on to the transport.
pub fn hdr_check(qp: &Qp, port: &PortId, pkt: &Packet) -> Result<(), HdrDrop> {
    check_type_state(qp, pkt)?;
    check_addr(qp, port, pkt)?;
    check_keys(qp, port, pkt)
}

/// The opcode's transport must be the QP's (IBTA §9.6, transport header
/// validation: the OpCode's transport is the QP's service type); a request needs
/// the QP in RTR, RTS, SQD or SQE (IBTA §10.3.1: a QP receives from RTR
/// on), a response (RC only) in RTS or SQD, where the requester has
/// packets outstanding. rxe's `check_type_state`; rxe lets ERR through
/// to drain in the responder, vrnic drops it here.
pub fn check_type_state(qp: &Qp, pkt: &Packet) -> Result<(), HdrDrop> {
    let want = match qp.qp_type {
        abi::QpType::Rc => Transport::Rc,
        abi::QpType::Uc => Transport::Uc,
        abi::QpType::Ud | abi::QpType::Gsi => Transport::Ud,
    };
    if pkt.hdr.bth.opcode.transport() != want {
        return Err(HdrDrop::QpType);
    }
    let ok = if pkt.hdr.bth.opcode.is_request() {
        matches!(
            qp.state,
            abi::QpState::Rtr | abi::QpState::Rts | abi::QpState::Sqd | abi::QpState::Sqe
        )
    } else {
        matches!(qp.state, abi::QpState::Rts | abi::QpState::Sqd)
    };
    if !ok {
        return Err(HdrDrop::QpState);
    }
    Ok(())
}

/// RC and UC (connected) QPs: the packet's source IP must be the QP's
/// destination GID and its destination IP the port address the QP sends
/// from (its source GID, [`source_ip`]): IBTA §9.6 validates the GRH's
/// SGID and DGID of a connected QP's packets, and RoCEv2 carries them as
/// the IP addresses (Annex A17.4). rxe's `check_addr`. UD QPs accept any
/// source.
pub fn check_addr(qp: &Qp, port: &PortId, pkt: &Packet) -> Result<(), HdrDrop> {
    if qp.qp_type != abi::QpType::Rc && qp.qp_type != abi::QpType::Uc {
        return Ok(());
    }
    let av = Av::of_qp(&qp.attr);
    let peer: IpAddr = Gid(av.dgid).to_ip();
    if pkt.hdr.ip_src != peer || Some(pkt.hdr.ip_dst) != source_ip(port, &av) {
        return Err(HdrDrop::BadAddr);
    }
    Ok(())
}

/// The BTH P_Key must match the port's P_Key at the QP's `pkey_index`
/// ([`pkey_match`]; the GSI QP's: [`abi::GSI_PKEY`], whatever its
/// `pkey_index`); a UD packet's DETH Q_Key must be the QP's (IBTA
/// C10-16), a GSI packet's [`abi::GSI_QKEY`] ([`Qp::rx_qkey`]). rxe's
/// `check_keys` (which compares with its one default P_Key, and with
/// `GSI_QKEY` for QP 1).
pub fn check_keys(qp: &Qp, port: &PortId, pkt: &Packet) -> Result<(), HdrDrop> {
    let own = if qp.qp_type == abi::QpType::Gsi {
        Some(abi::GSI_PKEY)
    } else {
        port.pkey(u32::from(qp.attr.pkey_index))
    };
    if !own.is_some_and(|k| pkey_match(pkt.hdr.bth.pkey, k)) {
        return Err(HdrDrop::BadPkey);
    }
    if qp.qp_type.is_datagram() && pkt.hdr.deth.is_some_and(|d| d.qkey != qp.rx_qkey()) {
        return Err(HdrDrop::BadQkey);
    }
    Ok(())
}

/// P_Key matching (IBTA §10.9.3): the partition numbers (low 15 bits) are
/// equal and not 0 (the invalid P_Key), and at least one of the two is a
/// full member (bit 15). rxe's `pkey_match`.
pub fn pkey_match(a: u16, b: u16) -> bool {
    let (pa, pb) = (a & 0x7fff, b & 0x7fff);
    pa != 0 && pa == pb && (a | b) & 0x8000 != 0
}

#[cfg(test)]
mod tests {
    use super::pkey_match;

    #[test]
    fn pkey_match_follows_ibta_10_9_3() {
        assert!(pkey_match(0xffff, 0xffff));
        assert!(pkey_match(0x7fff, 0xffff));
        assert!(pkey_match(0xffff, 0x7fff));
        assert!(!pkey_match(0x7fff, 0x7fff), "two limited members");
        assert!(!pkey_match(0x1234, 0xffff));
        assert!(!pkey_match(0x8000, 0x8000), "partition 0 is invalid");
        assert!(!pkey_match(0x0000, 0xffff));
    }
}
