//! Service ID resolution (SIDR) for UD, both roles.

use crate::{
    conn::Conn, conn::Retx, error::CmError, event::CmEventKind, limits::MAX_CONNECTIONS,
    params::copy_private, qp1::Source, state::CmId, state::CmState, timing::NS_PER_MS, Cm,
};
#[cfg(doc)]
use crate::{timing::CMA_CM_RESPONSE_TIMEOUT, timing::CMA_MAX_CM_RETRIES};
use vrnic_wire::{private_data_len, sidr_status, CmMessage, CmSidrRep, CmSidrReq, Gid, MAD_LEN};

impl Cm {
    /// Resolves a service ID for UD (cm.c `ib_send_cm_sidr_req`): sends a
    /// SIDR_REQ to `remote_gid`, retransmitted every `timeout_ms` ms up to
    /// `max_cm_retries` times (rdma_cm: `1 << (CMA_CM_RESPONSE_TIMEOUT -
    /// 8)` = 4096 ms and [`CMA_MAX_CM_RETRIES`]); then
    /// [`CmEventKind::SidrReqError`]. The request ID is the local comm ID.
    pub fn sidr_request(
        &mut self,
        now_ns: u64,
        service_id: u64,
        remote_gid: Gid,
        timeout_ms: u64,
        max_cm_retries: u8,
        private_data: &[u8],
    ) -> Result<CmId, CmError> {
        let private_data = copy_private::<{ private_data_len::SIDR_REQ }>(private_data)?;
        if self.live_count() >= MAX_CONNECTIONS {
            return Err(CmError::TableFull);
        }
        let id = self.alloc_id().ok_or(CmError::TableFull)?;
        let req = CmSidrReq {
            request_id: id,
            partition_key: vrnic_wire::DEFAULT_PKEY,
            service_id,
            private_data,
        };
        let tid = u64::from(id);
        let mad = CmMessage::SidrReq(req).to_mad(tid, 0).to_bytes();
        let interval_ns = timeout_ms.saturating_mul(NS_PER_MS);
        self.conns.insert(
            id,
            Conn {
                state: CmState::SidrReqSent,
                remote_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: 0,
                peer_gid: remote_gid,
                tid,
                timeout_ns: interval_ns,
                max_retries: max_cm_retries,
                ack_timeout: 0,
                retx: Some(Retx::new(mad, now_ns, interval_ns, max_cm_retries)),
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: false,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        self.push_mad(remote_gid, mad);
        Ok(CmId(id))
    }

    /// Answers a received SIDR_REQ (cm.c `ib_send_cm_sidr_rep`): `status`
    /// ([`sidr_status`]), the UD QP's number and Q_Key; the id is gone
    /// after it.
    pub fn sidr_reply(
        &mut self,
        id: CmId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = copy_private::<{ private_data_len::SIDR_REP }>(private_data)?;
        if qpn > 0xff_ffff {
            return Err(CmError::InvalidParam);
        }
        let c = self.conns.get(&id.0).ok_or(CmError::NoSuchId)?;
        if c.state != CmState::SidrReqRcvd {
            return Err(CmError::BadState);
        }
        let rep = CmSidrRep {
            request_id: c.remote_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn,
            service_id: c.sidr_service_id,
            qkey,
            additional_info: [0; private_data_len::ADDITIONAL_INFO],
            private_data,
        };
        let mad = CmMessage::SidrRep(rep).to_mad(c.tid, 0).to_bytes();
        let gid = c.peer_gid;
        self.conns.remove(&id.0);
        self.push_mad(gid, mad);
        Ok(())
    }

    pub(crate) fn sidr_rep_mad(req: &CmSidrReq, tid: u64, status: u8) -> [u8; MAD_LEN] {
        let rep = CmSidrRep {
            request_id: req.request_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: req.service_id,
            qkey: 0,
            additional_info: [0; private_data_len::ADDITIONAL_INFO],
            private_data: [0; private_data_len::SIDR_REP],
        };
        CmMessage::SidrRep(rep).to_mad(tid, 0).to_bytes()
    }

    /// cm.c `cm_sidr_req_handler`: a duplicate (same request ID from the
    /// same GID, still pending) is dropped; no listener → SIDR_REP
    /// UNSUPPORTED; a full table → SIDR_REP REJECT.
    pub(crate) fn on_sidr_req(&mut self, from: Source, tid: u64, req: CmSidrReq) {
        let dup = self.conns.values().any(|c| {
            c.state == CmState::SidrReqRcvd
                && c.remote_id == req.request_id
                && c.peer_gid == from.gid
        });
        if dup {
            self.counters.dup_req += 1;
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.counters.no_listener += 1;
            let mad = Self::sidr_rep_mad(&req, tid, sidr_status::UNSUPPORTED);
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
            let mad = Self::sidr_rep_mad(&req, tid, sidr_status::REJECT);
            self.push_mad(from.gid, mad);
            return;
        };
        self.conns.insert(
            id,
            Conn {
                state: CmState::SidrReqRcvd,
                remote_id: req.request_id,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: 0,
                peer_gid: from.gid,
                tid,
                timeout_ns: 0,
                max_retries: 0,
                ack_timeout: 0,
                retx: None,
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: false,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        if let Some(c) = self.conns.get_mut(&id) {
            c.sidr_service_id = req.service_id;
        }
        self.push_event(
            id,
            CmEventKind::SidrReqReceived {
                listener: req.service_id,
                req: Box::new(req),
                source: from,
            },
        );
    }

    /// cm.c `cm_sidr_rep_handler`: the request ID names a SIDR_REQ of ours
    /// sent to the sender's GID.
    pub(crate) fn on_sidr_rep(&mut self, from: Source, rep: CmSidrRep) {
        let ok = self
            .conns
            .get(&rep.request_id)
            .is_some_and(|c| c.state == CmState::SidrReqSent && c.peer_gid == from.gid);
        if !ok {
            self.counters.unknown_id += 1;
            return;
        }
        let destroyed = self
            .conns
            .remove(&rep.request_id)
            .is_some_and(|c| c.destroyed);
        if !destroyed {
            self.push_event(rep.request_id, CmEventKind::SidrRepReceived(Box::new(rep)));
        }
    }
}
