//! Received MADs: the dispatch, and REQ, REP, RTU, REJ and MRA received.

use crate::{
    conn::Conn, event::CmEventKind, limits::MAX_CONNECTIONS, qp1::Source, state::CmId,
    state::CmState, timing::cm_convert_to_ms, timing::NS_PER_MS, Cm,
};
use vrnic_wire::{
    msg_response, private_data_len, rej_reason, CmMessage, CmMra, CmRej, CmRep, CmReq, CmRtu, Mad,
};

impl Cm {
    /// Handles a MAD received on QP1 at `now_ns` from `from`. Anything not
    /// a 256-byte CM MAD is counted and dropped.
    pub fn handle_mad(&mut self, now_ns: u64, from: Source, bytes: &[u8]) {
        let Ok(mad) = Mad::parse(bytes) else {
            self.counters.malformed += 1;
            return;
        };
        let Ok(msg) = CmMessage::parse(&mad) else {
            self.counters.malformed += 1;
            return;
        };
        let tid = mad.hdr.tid;
        match msg {
            CmMessage::Req(req) => self.on_req(now_ns, from, tid, req),
            CmMessage::Rep(rep) => self.on_rep(from, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(from, rtu),
            CmMessage::Rej(rej) => self.on_rej(now_ns, from, rej),
            CmMessage::Dreq(dreq) => self.on_dreq(from, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now_ns, from, drep),
            CmMessage::Mra(mra) => self.on_mra(now_ns, from, mra),
            CmMessage::SidrReq(r) => self.on_sidr_req(from, tid, r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(from, r),
            _ => self.counters.unsupported += 1,
        }
    }

    /// cm.c `cm_req_handler`/`cm_match_req`.
    pub(crate) fn on_req(&mut self, now_ns: u64, from: Source, tid: u64, req: CmReq) {
        let nopd = [0; private_data_len::REJ];
        let req_msg = msg_response::REQ;
        // Duplicate: same remote comm ID and CA GUID (cm_insert_remote_id).
        let dup = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.remote_known
                    && c.remote_id == req.local_comm_id
                    && c.remote_ca_guid == req.local_ca_guid
            })
            .map(|(k, c)| (*k, c.state, c.peer_gid));
        if let Some((id, state, gid)) = dup {
            self.counters.dup_req += 1;
            // cm_dup_req_handler: in timewait, REJ stale connection. Every
            // other state drops it, REP sent included: the REP's own
            // retransmission answers (the kernel answers only in
            // MRA_REQ_SENT, which this CM never enters, and in timewait).
            if state == CmState::Timewait {
                let mad = Self::rej_mad(
                    id,
                    req.local_comm_id,
                    tid,
                    msg_response::OTHER,
                    rej_reason::STALE_CONN,
                    nopd,
                );
                self.push_mad(gid, mad);
            }
            return;
        }
        // Stale: the remote QPN and CA GUID of a connection still held
        // (cm_insert_remote_qpn): REJ stale, and a DREQ on the old one, but
        // only when the REQ comes from that connection's peer GID. Both
        // fields are on the wire in the old REQ, so Linux's rule (a DREQ
        // whoever asks) would let any host on the link tear it down.
        let stale = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.remote_known
                    && c.remote_qpn == req.local_qpn
                    && c.remote_ca_guid == req.local_ca_guid
            })
            .map(|(k, c)| (*k, c.state, c.peer_gid));
        if let Some((old, state, peer_gid)) = stale {
            self.counters.stale_req += 1;
            let mad = Self::rej_mad(
                0,
                req.local_comm_id,
                tid,
                req_msg,
                rej_reason::STALE_CONN,
                nopd,
            );
            self.push_mad(from.gid, mad);
            if state == CmState::Established && peer_gid == from.gid {
                let _ = self.disconnect(now_ns, CmId(old), &[]);
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.counters.no_listener += 1;
            let mad = Self::rej_mad(
                0,
                req.local_comm_id,
                tid,
                req_msg,
                rej_reason::INVALID_SERVICE_ID,
                nopd,
            );
            self.push_mad(from.gid, mad);
            return;
        }
        let id = if self.live_count() >= MAX_CONNECTIONS {
            None
        } else {
            self.alloc_id()
        };
        let Some(id) = id else {
            self.counters.no_resources += 1;
            let mad = Self::rej_mad(
                0,
                req.local_comm_id,
                tid,
                req_msg,
                rej_reason::NO_RESOURCES,
                nopd,
            );
            self.push_mad(from.gid, mad);
            return;
        };
        let timeout_ns = cm_convert_to_ms(req.local_cm_response_timeout).saturating_mul(NS_PER_MS);
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqRcvd,
                remote_id: req.local_comm_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                local_qpn: 0,
                peer_gid: from.gid,
                tid,
                timeout_ns,
                max_retries: req.max_cm_retries,
                // cm_format_paths_from_req + cm_init_av_by_path: the av's
                // timeout is the REQ's local ACK timeout.
                ack_timeout: req.primary_path.local_ack_timeout,
                retx: None,
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: true,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        self.push_event(
            id,
            CmEventKind::ReqReceived {
                listener: req.service_id,
                req: Box::new(req),
                source: from,
            },
        );
    }

    /// cm.c `cm_rep_handler`, `cm_dup_rep_handler`.
    pub(crate) fn on_rep(&mut self, from: Source, rep: CmRep) {
        let Some(id) = self.peer_conn(rep.remote_comm_id, rep.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            CmState::ReqSent => {
                c.state = CmState::RepRcvd;
                c.retx = None;
                c.remote_id = rep.local_comm_id;
                c.remote_ca_guid = rep.local_ca_guid;
                c.remote_qpn = rep.local_qpn;
                c.remote_known = true;
                self.push_event(id, CmEventKind::RepReceived(Box::new(rep)));
            }
            CmState::Established => {
                // A duplicate REP: our RTU was lost; send it again.
                if let Some(mad) = c.last {
                    let gid = c.peer_gid;
                    self.push_mad(gid, mad);
                }
            }
            _ => self.counters.wrong_state += 1,
        }
    }

    /// cm.c `cm_rtu_handler`.
    pub(crate) fn on_rtu(&mut self, from: Source, rtu: CmRtu) {
        let Some(id) = self.peer_conn(rtu.remote_comm_id, rtu.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.state != CmState::RepSent {
            self.counters.wrong_state += 1;
            return;
        }
        c.state = CmState::Established;
        c.retx = None;
        self.push_event(id, CmEventKind::RtuReceived);
    }

    /// cm.c `cm_rej_handler`. In REQ sent the peer's comm ID is not known
    /// yet: the REJ must name ours and come from the REQ's destination.
    pub(crate) fn on_rej(&mut self, now_ns: u64, from: Source, rej: CmRej) {
        let Some(id) = self.peer_conn(rej.remote_comm_id, rej.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let timewait = match c.state {
            CmState::ReqSent | CmState::RepSent | CmState::RepRcvd => {
                rej.reason == rej_reason::STALE_CONN
            }
            CmState::Established | CmState::DreqSent => true,
            _ => {
                self.counters.wrong_state += 1;
                return;
            }
        };
        c.retx = None;
        if timewait {
            self.enter_timewait(now_ns, id);
        } else if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::Idle;
            c.remote_known = false;
        }
        if self.conns.get(&id).is_some_and(|c| !c.destroyed) {
            self.push_event(
                id,
                CmEventKind::RejReceived {
                    reason: rej.reason,
                    private_data: Box::new(rej.private_data),
                },
            );
        }
    }

    /// cm.c `cm_mra_handler`: only for the REQ (in REQ sent) or the REP
    /// (in REP sent) it names, once.
    pub(crate) fn on_mra(&mut self, now_ns: u64, from: Source, mra: CmMra) {
        let Some(id) = self.peer_conn(mra.remote_comm_id, mra.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let want = match c.state {
            CmState::ReqSent => msg_response::REQ,
            CmState::RepSent => msg_response::REP,
            _ => {
                self.counters.wrong_state += 1;
                return;
            }
        };
        if mra.message_mraed != want || c.mra_rcvd {
            self.counters.wrong_state += 1;
            return;
        }
        let Some(r) = c.retx.as_mut() else {
            return;
        };
        // ib_modify_mad: the send in flight and its retries wait this long.
        let timeout_ms =
            cm_convert_to_ms(mra.service_timeout).saturating_add(cm_convert_to_ms(c.ack_timeout));
        r.interval_ns = timeout_ms.saturating_mul(NS_PER_MS);
        r.deadline = now_ns.saturating_add(r.interval_ns);
        c.mra_rcvd = true;
        if c.destroyed {
            return;
        }
        self.push_event(
            id,
            CmEventKind::MraReceived {
                service_timeout: mra.service_timeout,
            },
        );
    }
}
