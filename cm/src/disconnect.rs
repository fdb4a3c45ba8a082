//! Disconnection: DREQ/DREP sent and received, and destroying a connection.

use crate::{
    conn::Conn, conn::Retx, error::CmError, event::CmEventKind, params::copy_private, qp1::Source,
    state::CmId, state::CmState, Cm,
};
use vrnic_wire::{
    msg_response, private_data_len, rej_reason, sidr_status, CmAttrId, CmDrep, CmDreq, CmMessage,
    Mad, MAD_LEN,
};

impl Cm {
    pub(crate) fn dreq_mad(id: u32, c: &Conn, pd: [u8; private_data_len::DREQ]) -> [u8; MAD_LEN] {
        let dreq = CmDreq {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            remote_qpn_eecn: c.remote_qpn,
            private_data: pd,
        };
        // cm_format_dreq: a new transaction.
        CmMessage::Dreq(dreq)
            .to_mad(u64::from(id) | (1 << 32), 0)
            .to_bytes()
    }

    /// Disconnects an established connection (cm.c `ib_send_cm_dreq`):
    /// sends a DREQ, retransmitted like the REQ/REP until DREP, then
    /// timewait ([`CmEventKind::DreqError`] after the last retry). A DREQ
    /// sent while the REP waits for its RTU counts as established, as in
    /// cm.c.
    pub fn disconnect(
        &mut self,
        now_ns: u64,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = copy_private::<{ private_data_len::DREQ }>(private_data)?;
        let c = self.conn_mut(id)?;
        if !matches!(c.state, CmState::Established | CmState::RepSent) {
            return Err(CmError::BadState);
        }
        let mad = Self::dreq_mad(id.0, c, pd);
        c.state = CmState::DreqSent;
        c.retx = Some(Retx::new(mad, now_ns, c.timeout_ns, c.max_retries));
        let gid = c.peer_gid;
        self.push_mad(gid, mad);
        Ok(())
    }

    pub(crate) fn drep_mad(id: u32, remote: u32, tid: u64) -> [u8; MAD_LEN] {
        let drep = CmDrep {
            local_comm_id: id,
            remote_comm_id: remote,
            private_data: [0; private_data_len::DREP],
        };
        CmMessage::Drep(drep).to_mad(tid, 0).to_bytes()
    }

    /// Answers a received DREQ (cm.c `ib_send_cm_drep`): sends a DREP and
    /// enters timewait; a duplicate DREQ in timewait is answered with it
    /// again.
    pub fn reply_disconnect(
        &mut self,
        now_ns: u64,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = copy_private::<{ private_data_len::DREP }>(private_data)?;
        let c = self.conn_mut(id)?;
        if c.state != CmState::DreqRcvd {
            return Err(CmError::BadState);
        }
        let drep = CmDrep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            private_data: pd,
        };
        let mad = CmMessage::Drep(drep).to_mad(c.tid, 0).to_bytes();
        c.last = Some(mad);
        let gid = c.peer_gid;
        self.enter_timewait(now_ns, id.0);
        self.push_mad(gid, mad);
        Ok(())
    }

    /// Destroys a connection (cm.c `cm_destroy_id`): REQ sent → REJ
    /// timeout; REQ/REP received or REP sent → REJ consumer defined;
    /// established → DREQ, then timewait; DREQ sent → timewait; DREQ
    /// received → DREP, then timewait. A connection in timewait stays there
    /// (its comm ID and remote QPN reserved) but produces no more events.
    pub fn destroy(&mut self, now_ns: u64, id: CmId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        let gid = c.peer_gid;
        let nopd = [0; private_data_len::REJ];
        match c.state {
            CmState::Idle => {
                self.conns.remove(&id.0);
                return Ok(());
            }
            CmState::ReqSent => {
                let mad = Self::rej_mad(
                    id.0,
                    0,
                    c.tid,
                    msg_response::OTHER,
                    rej_reason::TIMEOUT,
                    nopd,
                );
                self.conns.remove(&id.0);
                self.push_mad(gid, mad);
                return Ok(());
            }
            CmState::ReqRcvd | CmState::RepRcvd => {
                let msg = if c.state == CmState::ReqRcvd {
                    msg_response::REQ
                } else {
                    msg_response::REP
                };
                let mad = Self::rej_mad(
                    if c.state == CmState::ReqRcvd { 0 } else { id.0 },
                    c.remote_id,
                    c.tid,
                    msg,
                    rej_reason::CONSUMER_DEFINED,
                    nopd,
                );
                self.conns.remove(&id.0);
                self.push_mad(gid, mad);
                return Ok(());
            }
            CmState::RepSent => {
                let mad = Self::rej_mad(
                    id.0,
                    c.remote_id,
                    c.tid,
                    msg_response::OTHER,
                    rej_reason::CONSUMER_DEFINED,
                    nopd,
                );
                self.conns.remove(&id.0);
                self.push_mad(gid, mad);
                return Ok(());
            }
            CmState::Established => {
                let mad = Self::dreq_mad(id.0, c, [0; private_data_len::DREQ]);
                self.push_mad(gid, mad);
                self.enter_timewait(now_ns, id.0);
            }
            CmState::DreqSent => self.enter_timewait(now_ns, id.0),
            CmState::DreqRcvd => {
                let mad = Self::drep_mad(id.0, c.remote_id, c.tid);
                c.last = Some(mad);
                self.push_mad(gid, mad);
                self.enter_timewait(now_ns, id.0);
            }
            CmState::Timewait => {}
            // cm_destroy_id: a pending SIDR_REQ is answered REJECT.
            CmState::SidrReqRcvd => {
                let _ = self.sidr_reply(id, sidr_status::REJECT, 0, 0, &[]);
                return Ok(());
            }
            CmState::SidrReqSent => {
                self.conns.remove(&id.0);
                return Ok(());
            }
        }
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.destroyed = true;
        }
        Ok(())
    }

    /// cm.c `cm_dreq_handler`: an unknown connection's DREQ gets a DREP
    /// (`cm_issue_drep`); in timewait the DREP is sent again.
    pub(crate) fn on_dreq(&mut self, from: Source, tid: u64, dreq: CmDreq) {
        let known = self.conns.contains_key(&dreq.remote_comm_id);
        let Some(id) = self.peer_conn(dreq.remote_comm_id, dreq.local_comm_id, &from) else {
            if known {
                // Our comm ID but another peer's: a stranger's, dropped.
                self.counters.unknown_id += 1;
            } else {
                self.counters.unknown_dreq += 1;
                let mad = Self::drep_mad(dreq.remote_comm_id, dreq.local_comm_id, tid);
                self.push_mad(from.gid, mad);
            }
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !c.remote_known {
            self.counters.unknown_id += 1;
            return;
        }
        match c.state {
            CmState::RepSent | CmState::Established | CmState::DreqSent => {
                c.retx = None;
                c.state = CmState::DreqRcvd;
                c.tid = tid;
                if c.destroyed {
                    return;
                }
                self.push_event(
                    id,
                    CmEventKind::DreqReceived {
                        private_data: Box::new(dreq.private_data),
                    },
                );
            }
            CmState::Timewait => {
                // cm.c answers with a DREP formatted anew: what `last` holds
                // is a DREP only if this side replied to a DREQ; an active
                // side that destroyed its established id (DREQ, straight to
                // timewait) has its RTU there, which it sent back to the
                // peer's crossing DREQ (e2e software, perftest -R).
                let gid = c.peer_gid;
                let drep = CmAttrId::Drep as u16;
                let mad = match c.last {
                    Some(m) if Mad::peek_attr_tid(&m).is_some_and(|(a, _)| a == drep) => m,
                    _ => Self::drep_mad(id, dreq.local_comm_id, tid),
                };
                self.push_mad(gid, mad);
            }
            _ => self.counters.wrong_state += 1,
        }
    }

    /// cm.c `cm_drep_handler`.
    pub(crate) fn on_drep(&mut self, now_ns: u64, from: Source, drep: CmDrep) {
        let Some(id) = self.peer_conn(drep.remote_comm_id, drep.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.state != CmState::DreqSent || !c.remote_known {
            self.counters.wrong_state += 1;
            return;
        }
        self.enter_timewait(now_ns, id);
        self.push_event(id, CmEventKind::DrepReceived);
    }
}
