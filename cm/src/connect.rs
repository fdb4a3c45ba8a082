//! The user calls that establish a connection: REQ, REP, RTU, COMM_EST.

use crate::{
    conn::Conn, conn::Retx, error::CmError, event::CmEventKind, limits::MAX_CONNECTIONS,
    params::copy_private, params::RepParams, params::ReqParams, state::CmId, state::CmState,
    timing::cm_ack_timeout, timing::cm_convert_to_ms, timing::NS_PER_MS, Cm,
};
use vrnic_wire::{private_data_len, transport_type, CmMessage, CmPath, CmRep, CmReq, CmRtu};

impl Cm {
    /// Requests a connection (cm.c `ib_send_cm_req`): sends a REQ and
    /// retransmits it every `2 · cm_convert_to_ms(packet_life_time) +
    /// cm_convert_to_ms(remote_cm_response_timeout)` ms up to
    /// `max_cm_retries` times; then [`CmEventKind::ReqError`]. `now_ns`:
    /// the caller's clock.
    pub fn connect(&mut self, now_ns: u64, p: &ReqParams) -> Result<CmId, CmError> {
        if p.qpn > 0xff_ffff
            || p.starting_psn > 0xff_ffff
            || p.max_cm_retries > 15
            || p.path.flow_label > 0xf_ffff
        {
            return Err(CmError::InvalidParam);
        }
        let private_data = copy_private::<{ private_data_len::REQ }>(&p.private_data)?;
        if self.live_count() >= MAX_CONNECTIONS {
            return Err(CmError::TableFull);
        }
        let id = self.alloc_id().ok_or(CmError::TableFull)?;
        let ack_timeout = cm_ack_timeout(self.port.ca_ack_delay, p.path.packet_life_time);
        // cm_format_req: on RoCE with hop_limit > 1 the LIDs are the
        // permissive LID and subnet_local is 0.
        let path = CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: self.port.gid,
            remote_gid: p.path.remote_gid,
            flow_label: p.path.flow_label,
            packet_rate: p.path.rate,
            traffic_class: p.path.traffic_class,
            hop_limit: p.path.hop_limit,
            sl: p.path.sl,
            subnet_local: p.path.hop_limit <= 1,
            local_ack_timeout: ack_timeout,
        };
        let req = CmReq {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.port.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport_service_type: if p.uc {
                transport_type::UC
            } else {
                transport_type::RC
            },
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            partition_key: vrnic_wire::DEFAULT_PKEY,
            path_mtu: p.path.mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: path,
            alternate_path: CmPath::default(),
            sap_supported: false,
            private_data,
        };
        // cm_form_tid: the low 32 bits are the local comm ID.
        let tid = u64::from(id);
        let mad = CmMessage::Req(req).to_mad(tid, 0).to_bytes();
        let timeout_ms = cm_convert_to_ms(p.path.packet_life_time)
            .saturating_mul(2)
            .saturating_add(cm_convert_to_ms(p.remote_cm_response_timeout));
        let timeout_ns = timeout_ms.saturating_mul(NS_PER_MS);
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqSent,
                remote_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: p.qpn,
                peer_gid: p.path.remote_gid,
                tid,
                timeout_ns,
                max_retries: p.max_cm_retries,
                ack_timeout,
                retx: Some(Retx::new(mad, now_ns, timeout_ns, p.max_cm_retries)),
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: false,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        self.push_mad(p.path.remote_gid, mad);
        Ok(CmId(id))
    }

    /// Accepts a received REQ (cm.c `ib_send_cm_rep`): sends a REP,
    /// retransmitted every `cm_convert_to_ms(REQ's local CM response
    /// timeout)` ms up to the REQ's max CM retries until RTU (or any later
    /// message); then [`CmEventKind::RepError`].
    pub fn accept(&mut self, now_ns: u64, id: CmId, p: &RepParams) -> Result<(), CmError> {
        if p.qpn > 0xff_ffff || p.starting_psn > 0xff_ffff {
            return Err(CmError::InvalidParam);
        }
        let private_data = copy_private::<{ private_data_len::REP }>(&p.private_data)?;
        let ca_guid = self.port.ca_guid;
        let ack_delay = self.port.ca_ack_delay;
        let c = self.conn_mut(id)?;
        if c.state != CmState::ReqRcvd {
            return Err(CmError::BadState);
        }
        let rep = CmRep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: ack_delay,
            failover_accepted: p.failover_accepted,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data,
        };
        let mad = CmMessage::Rep(rep).to_mad(c.tid, 0).to_bytes();
        c.state = CmState::RepSent;
        c.local_qpn = p.qpn;
        c.retx = Some(Retx::new(mad, now_ns, c.timeout_ns, c.max_retries));
        let gid = c.peer_gid;
        self.push_mad(gid, mad);
        Ok(())
    }

    /// Sends the RTU after a REP (cm.c `ib_send_cm_rtu`; librdmacm's
    /// active side calls it once its QP is in RTS): the connection is
    /// established. The RTU is not retransmitted; a duplicate REP is
    /// answered with it again (cm.c `cm_dup_rep_handler`).
    pub fn send_rtu(&mut self, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        let private_data = copy_private::<{ private_data_len::RTU }>(private_data)?;
        let c = self.conn_mut(id)?;
        if c.state != CmState::RepRcvd {
            return Err(CmError::BadState);
        }
        let rtu = CmRtu {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            private_data,
        };
        let mad = CmMessage::Rtu(rtu).to_mad(c.tid, 0).to_bytes();
        c.state = CmState::Established;
        c.last = Some(mad);
        let gid = c.peer_gid;
        self.push_mad(gid, mad);
        Ok(())
    }

    /// The consumer saw traffic on the QP before the RTU (cm.c
    /// `ib_cm_notify(IB_EVENT_COMM_EST)`, librdmacm's `rdma_establish`):
    /// in REP sent the connection is established, the REP no longer
    /// retransmitted, and [`CmEventKind::UserEstablished`] queued; in
    /// established nothing happens.
    pub fn establish(&mut self, id: CmId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        match c.state {
            CmState::Established => Ok(()),
            CmState::RepSent => {
                c.state = CmState::Established;
                c.retx = None;
                self.push_event(id.0, CmEventKind::UserEstablished);
                Ok(())
            }
            _ => Err(CmError::BadState),
        }
    }
}
