//! The headers of the transport's packets: to a QP's peer (kept in the
//! QP while its address stays), to an address vector, and replies to a
//! request.

use std::net::{IpAddr, Ipv6Addr};

use super::{Env, PortId, Qp};
use crate::verbs::ah::Av;
use crate::wire::{Aeth, Bth, Gid, Opcode, RoceHeaders};

/// UDP source port of a QP's packets (a per-QP flow, like rxe): the
/// GSI QP's is rxe's for QP 1, [`crate::abi::GSI_UDP_SPORT`].
pub fn udp_src_port(qpn: u32) -> u16 {
    if qpn == crate::abi::GSI_QPN {
        return crate::abi::GSI_UDP_SPORT;
    }
    0xc000 | (qpn as u16 & 0x3fff)
}

/// Headers of a packet from `qp` to its connected peer, or `None` while the
/// peer's MAC is unknown (ARP or neighbour discovery pending). Built once
/// and kept in the QP ([`PeerHeaders`]) for as long as its address
/// vector, its destination QP and the neighbour table stay as they were
/// (building them, with the neighbour lookup, was ≈ 9 % of a daemon's
/// poller at 64 KiB WRITEs, one packet in 16 needing it).
pub fn peer_headers(qp: &mut Qp, env: &Env, opcode: Opcode, psn: u32) -> Option<RoceHeaders> {
    let av = Av::of_qp(&qp.attr);
    let dest_qp = qp.attr.dest_qp_num;
    let neigh = env.res.neigh.generation();
    let mut hdr = match &qp.req.peer_hdr {
        Some(c) if c.av == av && c.dest_qp == dest_qp && c.neigh == neigh => c.hdr.clone(),
        _ => {
            let hdr = headers_to(env, &av, qp.qpn, dest_qp, opcode, psn)?;
            qp.req.peer_hdr = Some(Box::new(PeerHeaders {
                av,
                dest_qp,
                neigh,
                hdr: hdr.clone(),
            }));
            return Some(hdr);
        }
    };
    hdr.bth.opcode = opcode;
    hdr.bth.psn = psn;
    Some(hdr)
}

/// The headers [`peer_headers`] last built for a QP, and what they were
/// built from: the QP's address vector and destination QP and the
/// neighbour table's [`crate::device::NeighTable::generation`] (so
/// a neighbour that changes or expires, or is confirmed again and must be
/// marked used once more, is looked up anew). Only the opcode and PSN
/// differ between packets; the extension headers are left out.
#[derive(Debug, Clone)]
pub struct PeerHeaders {
    av: Av,
    dest_qp: u32,
    neigh: u64,
    pub(super) hdr: RoceHeaders,
}

/// Headers of a packet from QP `src_qpn` to QP `dest_qp` at the address
/// vector `av` (RoCEv2, IBTA A17.4: the GRH fields become the IP header),
/// or `None` while the destination's MAC is unknown or the source GID
/// index names no address of the destination's family.
pub fn headers_to(
    env: &Env,
    av: &Av,
    src_qpn: u32,
    dest_qp: u32,
    opcode: Opcode,
    psn: u32,
) -> Option<RoceHeaders> {
    let dst = Gid(av.dgid).to_ip();
    let src = source_ip(&env.res.port, av)?;
    let eth_dst = *env.res.neigh.get(&dst)?;
    let bth = Bth {
        opcode,
        solicited: false,
        mig_req: true,
        pad_count: 0,
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: false,
        psn,
    };
    Some(RoceHeaders {
        eth_src: env.res.port.mac,
        eth_dst,
        ip_src: src,
        ip_dst: dst,
        ip_id: 0,
        ttl: if av.hop_limit == 0 { 64 } else { av.hop_limit },
        tclass: av.traffic_class,
        flow_label: av.flow_label,
        udp_src: udp_src_port(src_qpn),
        bth,
        reth: None,
        aeth: None,
        atomic_eth: None,
        atomic_ack_eth: None,
        deth: None,
        immdt: None,
        ieth: None,
    })
}

/// The port address packets to `av` are sent from (and packets from `av`'s
/// destination must be addressed to, rxe's `check_addr`): the IPv4 address
/// for an IPv4-mapped destination GID, else the IPv6 GID at `av.sgid_index`
/// (the link-local one if that index names the IPv4 GID). `None` when the
/// index names no GID.
pub fn source_ip(port: &PortId, av: &Av) -> Option<IpAddr> {
    Some(match Gid(av.dgid).to_ip() {
        IpAddr::V4(_) => IpAddr::V4(port.ipv4),
        IpAddr::V6(_) => match port.gid(av.sgid_index as u32)?.to_ip() {
            IpAddr::V6(a) => IpAddr::V6(a),
            IpAddr::V4(_) => IpAddr::V6(Ipv6Addr::from(port.gid(0)?.0)),
        },
    })
}

/// Headers of a response (ACK/NAK, READ response) from `qp` back to the
/// sender of `req`.
pub fn reply_headers(
    qp: &Qp,
    port: &PortId,
    req: &RoceHeaders,
    opcode: Opcode,
    psn: u32,
    aeth: Aeth,
) -> RoceHeaders {
    RoceHeaders {
        eth_src: port.mac,
        eth_dst: req.eth_src,
        ip_src: req.ip_dst,
        ip_dst: req.ip_src,
        ip_id: 0,
        ttl: 64,
        tclass: 0,
        flow_label: 0,
        udp_src: udp_src_port(qp.qpn),
        bth: Bth {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: qp.attr.dest_qp_num,
            ack_req: false,
            psn,
        },
        reth: None,
        aeth: Some(aeth),
        atomic_eth: None,
        atomic_ack_eth: None,
        deth: None,
        immdt: None,
        ieth: None,
    }
}
