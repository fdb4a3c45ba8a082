//! Connections: the RoCE path of an id, `CONNECT`, `ACCEPT`, `DISCONNECT`
//! (cma.c `rdma_connect`, `rdma_accept`, `rdma_disconnect`; cm.c through
//! [`vrnic_cm::Cm`]).

use super::*;

impl Ucma {
    pub(super) fn path(&self, i: &Id) -> Option<(PathParams, u8)> {
        let (src, dst) = (i.src?, i.dst?);
        let sgid_index = self.dev.gid_index(src.ip())?;
        // cma_get_roce_udp_flow_label.
        let flow_label = (u32::from(src.port()) * 31 + u32::from(dst.port())) & 0xf_ffff;
        Some((
            PathParams {
                remote_gid: vrnic_wire::Gid(ip_to_gid(dst.ip())),
                mtu: self.dev.mtu,
                packet_life_time: CMA_IBOE_PACKET_LIFETIME,
                flow_label,
                hop_limit: HOP_LIMIT,
                traffic_class: i.tos,
                sl: 0,
                rate: 0,
            },
            sgid_index,
        ))
    }

    /// cma.c `cma_connect_ib`: a REQ with rdma_cm's header and the
    /// consumer's private data (≤ 56 bytes), the service ID of the
    /// destination port.
    pub(super) fn connect(
        &mut self,
        now: u64,
        chan: u32,
        id: u32,
        p: &ConnParam,
    ) -> Result<(), i32> {
        let i = self.get(chan, id)?;
        if i.state != IdState::RouteResolved {
            return Err(-libc::EINVAL);
        }
        let max = if i.ud {
            vrnic_wire::SIDR_REQ_USER_PRIVATE_DATA_MAX
        } else {
            vrnic_wire::REQ_USER_PRIVATE_DATA_MAX
        };
        if p.private_data.len() > max {
            return Err(-libc::EINVAL);
        }
        let (src, dst) = (i.src.ok_or(-libc::EINVAL)?, i.dst.ok_or(-libc::EINVAL)?);
        let (path, sgid_index) = self.path(i).ok_or(-libc::EINVAL)?;
        let addrs = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => CmaAddrs::V4 { src: s, dst: d },
            (IpAddr::V6(s), IpAddr::V6(d)) => CmaAddrs::V6 { src: s, dst: d },
            _ => return Err(-libc::EINVAL),
        };
        let mut pd = vec![0u8; CmaHdr::LEN];
        CmaHdr {
            src_port: src.port(),
            addrs,
        }
        .emit(&mut pd);
        pd.extend_from_slice(&p.private_data);
        let timeout = vrnic_cm::cm_ack_timeout(self.dev.ca_ack_delay, path.packet_life_time);
        let conn = ConnAttrs {
            dgid: path.remote_gid.0,
            sgid_index,
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
            flow_label: path.flow_label,
            path_mtu: path.mtu,
            remote_qpn: 0,
            rq_psn: i.seq_num,
            sq_psn: 0,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            timeout,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
        };
        if i.ud {
            // cma.c `cma_resolve_ib_udp`: a SIDR_REQ, retried every
            // 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
            let cm = self
                .cm
                .sidr_request(
                    now,
                    service_id(i.ps, dst.port()),
                    path.remote_gid,
                    1 << (CMA_CM_RESPONSE_TIMEOUT - 8),
                    CMA_MAX_CM_RETRIES,
                    &pd,
                )
                .map_err(|e| match e {
                    vrnic_cm::CmError::TableFull => -libc::ENOMEM,
                    _ => -libc::EINVAL,
                })?;
            self.by_cm.insert(cm, id);
            let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
            i.cm = Some(cm);
            i.conn = Some(conn);
            i.state = IdState::Connect;
            return Ok(());
        }
        let req = ReqParams {
            service_id: service_id(i.ps, dst.port()),
            qpn: p.qp_num,
            starting_psn: i.seq_num,
            uc: false,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            flow_control: p.flow_control,
            remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: CMA_MAX_CM_RETRIES,
            path,
            private_data: pd,
        };
        let cm = self.cm.connect(now, &req).map_err(|e| match e {
            vrnic_cm::CmError::TableFull => -libc::ENOMEM,
            _ => -libc::EINVAL,
        })?;
        self.by_cm.insert(cm, id);
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        i.cm = Some(cm);
        i.conn = Some(conn);
        i.state = IdState::Connect;
        Ok(())
    }

    /// cma.c `rdma_accept`: passive, a REP (`cma_accept_ib`); active after
    /// CONNECT_RESPONSE without parameters, the RTU (`cma_rep_recv`).
    pub(super) fn accept(
        &mut self,
        now: u64,
        chan: u32,
        id: u32,
        uid: u64,
        p: &ConnParam,
    ) -> Result<(), i32> {
        let i = self.get(chan, id)?;
        if i.state != IdState::Connect {
            return Err(-libc::EINVAL);
        }
        let cm = i.cm.ok_or(-libc::EINVAL)?;
        if i.ud {
            // cma.c `cma_send_sidr_rep(IB_SIDR_SUCCESS)`: the UD QP and
            // the id's Q_Key (RDMA_UDP_QKEY, `cma_set_qkey`).
            if p.private_data.len() > vrnic_wire::private_data_len::SIDR_REP {
                return Err(-libc::EINVAL);
            }
            let qpn = if p.valid { p.qp_num } else { 0 };
            self.cm
                .sidr_reply(
                    cm,
                    vrnic_wire::sidr_status::SUCCESS,
                    qpn,
                    qpattr::RDMA_UDP_QKEY,
                    &p.private_data,
                )
                .map_err(|_| -libc::EINVAL)?;
            self.by_cm.remove(&cm);
            let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
            i.cm = None;
            if p.valid {
                i.uid = uid;
            }
            return Ok(());
        }
        let seq = i.seq_num;
        match self.cm.state(cm) {
            Some(CmState::RepRcvd) if !p.valid => {
                self.cm.send_rtu(cm, &[]).map_err(|_| -libc::EINVAL)?;
                Ok(())
            }
            Some(CmState::ReqRcvd) if p.valid => {
                if p.private_data.len() > vrnic_wire::private_data_len::REP {
                    return Err(-libc::EINVAL);
                }
                self.cm
                    .accept(
                        now,
                        cm,
                        &RepParams {
                            qpn: p.qp_num,
                            starting_psn: seq,
                            responder_resources: p.responder_resources,
                            initiator_depth: p.initiator_depth,
                            failover_accepted: 0,
                            flow_control: p.flow_control,
                            rnr_retry_count: p.rnr_retry_count,
                            srq: p.srq,
                            private_data: p.private_data.clone(),
                        },
                    )
                    .map_err(|_| -libc::EINVAL)?;
                let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
                // ucma_accept: the id's uid is the accepting program's.
                i.uid = uid;
                if let Some(c) = &mut i.conn {
                    c.responder_resources = p.responder_resources;
                    c.initiator_depth = p.initiator_depth;
                }
                Ok(())
            }
            _ => Err(-libc::EINVAL),
        }
    }

    /// cma.c `rdma_disconnect`: DREQ, or DREP to a received DREQ; in any
    /// other state nothing is sent and, as in the kernel, the answer is
    /// still success. `-EINVAL` only without a CM id.
    pub(super) fn disconnect(&mut self, now: u64, chan: u32, id: u32) -> Result<(), i32> {
        let cm = self.get(chan, id)?.cm.ok_or(-libc::EINVAL)?;
        if self.cm.disconnect(now, cm, &[]).is_err() {
            let _ = self.cm.reply_disconnect(now, cm, &[]);
        }
        Ok(())
    }
}
