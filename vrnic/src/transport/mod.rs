//! The RoCEv2 reliable transport, split like Linux rxe: the [`requester`]
//! turns send WQEs into request packets, the [`responder`] executes incoming
//! requests and answers with ACK/NAK, the [`completer`] processes ACKs and
//! NAKs and writes send completions. IBTA Vol 1 chapter 9.
//!
//! All three work on one QP at a time with an [`Env`]: the driver memory, the
//! MR and CQ tables, the port identity and the output queues.

pub mod completer;
pub mod psn;
pub mod requester;
pub mod responder;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};

use crate::abi;
use crate::device::{DeviceStats, Nanos};
use crate::mem::{self, DmaMemory};
use crate::verbs::cq::Cq;
use crate::verbs::mr::MrTable;
use crate::verbs::qp::Qp;
use crate::wire::{self, Aeth, Bth, Opcode, RoceHeaders};

/// The port's identity: addresses used in packets.
#[derive(Debug, Clone)]
pub struct PortId {
    /// MAC address.
    pub mac: [u8; 6],
    /// IPv4 address (GID index 1).
    pub ipv4: Ipv4Addr,
}

/// What the transport produces besides memory writes.
#[derive(Debug, Default)]
pub struct Output {
    /// Frames for the link.
    pub tx: VecDeque<Vec<u8>>,
    /// Events for the event queue.
    pub events: VecDeque<abi::Event>,
    /// Counters.
    pub stats: DeviceStats,
    /// Next IPv4 identification value.
    pub ip_id: u16,
}

/// Largest number of queued events kept for a driver that posts no event
/// buffers; older events beyond it are dropped.
const MAX_EVENTS: usize = 1024;

impl Output {
    /// Queues an event (bounded).
    pub fn event(&mut self, kind: u16, handle: u32, info: u32) {
        if self.events.len() < MAX_EVENTS {
            self.events.push_back(abi::Event {
                kind,
                handle,
                info,
                ..Default::default()
            });
        }
    }

    /// Emits one RoCEv2 frame.
    pub fn send(&mut self, hdr: &mut RoceHeaders, payload: &[u8]) {
        hdr.ip_id = self.ip_id;
        self.ip_id = self.ip_id.wrapping_add(1);
        let mut frame = Vec::with_capacity(payload.len() + 96);
        wire::emit_frame(hdr, payload, &mut frame);
        self.stats.tx_frames += 1;
        self.tx.push_back(frame);
    }
}

/// Everything a transport step needs besides the QP.
pub struct Env<'a> {
    /// Driver memory.
    pub mem: &'a dyn DmaMemory,
    /// Memory regions.
    pub mrs: &'a MrTable,
    /// Completion queues.
    pub cqs: &'a mut HashMap<u32, Cq>,
    /// The port's addresses.
    pub port: &'a PortId,
    /// Known neighbours (IPv4 → MAC).
    pub neigh: &'a HashMap<Ipv4Addr, [u8; 6]>,
    /// Output queues.
    pub out: &'a mut Output,
    /// Current time.
    pub now: Nanos,
}

impl Env<'_> {
    /// Writes a CQE to CQ `cqn`, raising `EV_COMP` when the CQ was armed and
    /// `EV_CQ_ERR` on overrun.
    pub fn complete(&mut self, cqn: u32, cqe: abi::Cqe, solicited: bool) {
        let Some(cq) = self.cqs.get_mut(&cqn) else {
            return;
        };
        match cq.push(self.mem, cqe, solicited) {
            Ok(true) => self.out.event(abi::EV_COMP, cqn, 0),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(cqn, "CQ error: {e}");
                self.out.event(abi::EV_CQ_ERR, cqn, 0);
            }
        }
    }
}

/// UDP source port of a QP's packets (a per-QP flow, like rxe).
pub fn udp_src_port(qpn: u32) -> u16 {
    0xc000 | (qpn as u16 & 0x3fff)
}

/// Headers of a packet from `qp` to its connected peer, or `None` while the
/// peer's MAC is unknown (ARP pending).
pub fn peer_headers(qp: &Qp, env: &Env, opcode: Opcode, psn: u32) -> Option<RoceHeaders> {
    let dgid = wire::Gid(qp.attr.dgid);
    let IpAddr::V4(dst) = dgid.to_ip() else {
        return None;
    };
    let eth_dst = *env.neigh.get(&dst)?;
    let bth = Bth {
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
    };
    Some(RoceHeaders {
        eth_src: env.port.mac,
        eth_dst,
        ip_src: IpAddr::V4(env.port.ipv4),
        ip_dst: IpAddr::V4(dst),
        ip_id: 0,
        ttl: if qp.attr.hop_limit == 0 {
            64
        } else {
            qp.attr.hop_limit
        },
        tclass: qp.attr.traffic_class,
        flow_label: 0,
        udp_src: udp_src_port(qp.qpn),
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

/// Writes the QP record's consumer indices (SQ at 0, RQ at 4).
pub fn write_record(qp: &Qp, env: &Env) {
    let rec = abi::Handle {
        handle: qp.req.sq_ci,
        reserved: qp.resp.rq_ci,
    };
    if let Err(e) = mem::write_obj(env.mem, qp.record, &rec) {
        tracing::warn!(qpn = qp.qpn, "QP record: {e}");
    }
}

/// Moves `qp` to ERR (IBTA §10.3.1): every outstanding send and receive WQE
/// completes with `IBV_WC_WR_FLUSH_ERR`, and `EV_QP_FATAL` carries `status`
/// when the move was caused by an error (`status != WC_SUCCESS`).
pub fn qp_to_error(qp: &mut Qp, env: &mut Env, status: u8) {
    if qp.state == abi::QPS_ERR {
        return;
    }
    qp.state = abi::QPS_ERR;
    qp.attr.qp_state = abi::QPS_ERR;
    if status != abi::WC_SUCCESS {
        env.out.event(abi::EV_QP_FATAL, qp.qpn, status as u32);
    }
    flush(qp, env);
}

/// Completes every outstanding WQE of a QP in ERR with `WR_FLUSH_ERR`.
pub fn flush(qp: &mut Qp, env: &mut Env) {
    requester::flush(qp, env);
    responder::flush(qp, env);
    write_record(qp, env);
}

/// Scatters `data` into an SGE list starting at message byte `offset`
/// (receive WQEs, READ responses, atomic results). `WC_LOC_PROT_ERR` when an
/// SGE's MR is gone or its memory is unreachable, `WC_LOC_LEN_ERR` when the
/// SGEs are too short.
pub fn scatter_sges(env: &Env, sges: &[abi::Sge], offset: u32, data: &[u8]) -> Result<(), u8> {
    let mut skip = offset as u64;
    let mut done = 0usize;
    for sge in sges {
        if done == data.len() {
            break;
        }
        let l = sge.length as u64;
        if skip >= l {
            skip -= l;
            continue;
        }
        let n = ((l - skip) as usize).min(data.len() - done);
        let mr = env.mrs.get(sge.lkey).map_err(|_| abi::WC_LOC_PROT_ERR)?;
        mr.write(env.mem, sge.addr + skip, &data[done..done + n])
            .map_err(|_| abi::WC_LOC_PROT_ERR)?;
        done += n;
        skip = 0;
    }
    if done < data.len() {
        return Err(abi::WC_LOC_LEN_ERR);
    }
    Ok(())
}
