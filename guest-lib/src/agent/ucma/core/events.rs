//! Events: the channels' bounded queues, `GET_EVENT`, and the IB CM's events
//! mapped to rdma_cm's (cma.c `cma_ib_handler`, `cma_ib_req_handler`,
//! `cma_sidr_rep_handler`).

use super::*;

impl Ucma {
    pub(super) fn get_event(&mut self, chan: u32) -> Answer {
        let c = self.channels.get_mut(&chan).ok_or(-libc::EBADF)?;
        let ev = c.events.pop_front().ok_or(-libc::EAGAIN)?;
        if let Some(i) = self.ids.get_mut(&ev.id) {
            i.events_reported = i.events_reported.wrapping_add(1);
            if rd_u32(&ev.resp, 12) == event::CONNECT_REQUEST {
                i.backlog += 1;
            }
        }
        Ok(ev.resp.to_vec())
    }

    pub(super) fn push(&mut self, ev: Event) {
        let chan = match self.ids.get(&ev.id) {
            Some(i) => i.chan,
            None => return,
        };
        let Some(c) = self.channels.get_mut(&chan) else {
            return;
        };
        if c.events.len() >= MAX_EVENTS_PER_CHANNEL {
            self.events_dropped += 1;
            return;
        }
        c.events.push_back(ev);
    }

    pub(super) fn new_event(&self, id: u32, ev: u32, status: i32) -> [u8; EVENT_RESP_LEN] {
        let mut r = [0u8; EVENT_RESP_LEN];
        let uid = self.ids.get(&id).map_or(0, |i| i.uid);
        r[0..8].copy_from_slice(&uid.to_ne_bytes());
        wr_u32(&mut r, 8, id);
        wr_u32(&mut r, 12, ev);
        wr_u32(&mut r, 16, status as u32);
        r
    }

    pub(super) fn push_simple(&mut self, id: u32, ev: u32, status: i32) {
        let resp = self.new_event(id, ev, status);
        self.push(Event {
            id,
            new_id: None,
            resp,
        });
    }

    /// Maps the CM's events to rdma_cm events (cma.c `cma_ib_handler`,
    /// `cma_ib_req_handler`).
    pub(super) fn cm_events(&mut self, now: u64) {
        while let Some(e) = self.cm.pop_event() {
            if let CmEventKind::ReqReceived {
                listener,
                req,
                source,
            } = &e.kind
            {
                self.on_req(now, e.id, *listener, Req::Rc(req), source);
                continue;
            }
            if let CmEventKind::SidrReqReceived {
                listener,
                req,
                source,
            } = &e.kind
            {
                self.on_req(now, e.id, *listener, Req::Sidr(req), source);
                continue;
            }
            let Some(&id) = self.by_cm.get(&e.id) else {
                // A destroyed id's connection (timewait exit and the like).
                if matches!(e.kind, CmEventKind::TimewaitExit) {
                    let _ = self.cm.destroy(now, e.id);
                }
                continue;
            };
            let Some(state) = self.ids.get(&id).map(|i| i.state) else {
                continue;
            };
            match e.kind {
                CmEventKind::RepReceived(rep) => {
                    if let Some(c) = self.ids.get_mut(&id).and_then(|i| i.conn.as_mut()) {
                        c.remote_qpn = rep.local_qpn;
                        c.sq_psn = rep.starting_psn;
                        // cm_rep_handler: the peer's resources mirrored.
                        c.initiator_depth = rep.responder_resources;
                        c.responder_resources = rep.initiator_depth;
                        c.rnr_retry_count = rep.rnr_retry_count;
                    }
                    let mut r = self.new_event(id, event::CONNECT_RESPONSE, 0);
                    put_conn(
                        &mut r,
                        rep.local_qpn,
                        &rep.private_data,
                        rep.srq,
                        rep.responder_resources,
                        rep.initiator_depth,
                        rep.end_to_end_flow_control,
                        0,
                        rep.rnr_retry_count,
                    );
                    self.push(Event {
                        id,
                        new_id: None,
                        resp: r,
                    });
                }
                CmEventKind::RtuReceived | CmEventKind::UserEstablished => {
                    if state == IdState::Connect {
                        self.push_simple(id, event::ESTABLISHED, 0);
                    }
                }
                CmEventKind::RejReceived {
                    reason,
                    private_data,
                } => {
                    let mut r = self.new_event(id, event::REJECTED, i32::from(reason));
                    put_conn(&mut r, 0, &private_data[..], false, 0, 0, false, 0, 0);
                    self.push(Event {
                        id,
                        new_id: None,
                        resp: r,
                    });
                }
                CmEventKind::ReqError | CmEventKind::RepError => {
                    self.push_simple(id, event::UNREACHABLE, -libc::ETIMEDOUT);
                }
                CmEventKind::DreqReceived { .. }
                | CmEventKind::DrepReceived
                | CmEventKind::DreqError => {
                    if state == IdState::Connect {
                        if let Some(i) = self.ids.get_mut(&id) {
                            i.state = IdState::Disconnect;
                        }
                        let st = if matches!(e.kind, CmEventKind::DreqError) {
                            -libc::ETIMEDOUT
                        } else {
                            0
                        };
                        self.push_simple(id, event::DISCONNECTED, st);
                    }
                }
                CmEventKind::TimewaitExit => {
                    if state == IdState::Disconnect {
                        self.push_simple(id, event::TIMEWAIT_EXIT, 0);
                    }
                }
                CmEventKind::SidrRepReceived(rep) => self.on_sidr_rep(id, &rep),
                CmEventKind::SidrReqError => {
                    // The CM's id is gone.
                    self.by_cm.remove(&e.id);
                    if let Some(i) = self.ids.get_mut(&id) {
                        i.cm = None;
                    }
                    self.push_simple(id, event::UNREACHABLE, -libc::ETIMEDOUT);
                }
                CmEventKind::MraReceived { .. }
                | CmEventKind::ReqReceived { .. }
                | CmEventKind::SidrReqReceived { .. } => {}
            }
        }
    }

    /// cma.c `cma_ib_req_handler`: the listener of the REQ's (or
    /// SIDR_REQ's) service ID whose address matches the rdma_cm header's
    /// destination (a specific address first, then a wildcard of the
    /// family) gets a new id and a CONNECT_REQUEST; no match, a bad header,
    /// a full backlog or channel: REJ consumer defined (the kernel's handler
    /// fails and `cm_destroy_id` rejects; for SIDR a SIDR_REP REJECT).
    pub(super) fn on_req(&mut self, now: u64, cm: CmId, sid: u64, req: Req<'_>, source: &Source) {
        let private = match req {
            Req::Rc(r) => &r.private_data[..],
            Req::Sidr(r) => &r.private_data[..],
        };
        let hdr = CmaHdr::parse(private);
        let listener = hdr.ok().and_then(|h| {
            let dst = h.dst();
            let cands = self.ids.iter().filter(|(_, i)| {
                i.state == IdState::Listen && i.listening == Some(sid) && i.backlog > 0
            });
            let mut best = None;
            for (k, i) in cands {
                let Some(src) = i.src else { continue };
                if src.ip() == dst {
                    best = Some(*k);
                    break;
                }
                let fam_ok = src.is_ipv4() == dst.is_ipv4() || !i.afonly.unwrap_or(true);
                if sockaddr::is_any(&src) && fam_ok && best.is_none() {
                    best = Some(*k);
                }
            }
            best.map(|l| (l, h))
        });
        let refuse = |me: &mut Ucma| {
            let _ = match req {
                Req::Rc(_) => me.cm.reject(now, cm, rej_reason::CONSUMER_DEFINED, &[]),
                Req::Sidr(_) => me
                    .cm
                    .sidr_reply(cm, vrnic_wire::sidr_status::REJECT, 0, 0, &[]),
            };
            let _ = me.cm.destroy(now, cm);
        };
        let Some((lid, h)) = listener else {
            refuse(self);
            return;
        };
        let l = self.ids[&lid].clone();
        let full = self.channels.get(&l.chan).is_none_or(|c| {
            c.ids >= MAX_IDS_PER_CHANNEL || c.events.len() >= MAX_EVENTS_PER_CHANNEL
        });
        let local_ip = h.dst();
        let sgid_index = self.dev.gid_index(local_ip);
        if full || sgid_index.is_none() || matches!(req, Req::Sidr(_)) != l.ud {
            if full {
                self.events_dropped += 1;
            }
            refuse(self);
            return;
        }
        let new = self.alloc_id();
        let seq = self.random24();
        let src = SocketAddr::new(local_ip, vrnic_wire::service_id_port(sid));
        let dst = SocketAddr::new(h.src(), h.src_port);
        let conn = match req {
            Req::Rc(req) => Some(ConnAttrs {
                dgid: source.gid.0,
                sgid_index: sgid_index.unwrap_or(0),
                hop_limit: req.primary_path.hop_limit,
                traffic_class: req.primary_path.traffic_class,
                flow_label: req.primary_path.flow_label,
                path_mtu: req.path_mtu.min(self.dev.mtu),
                remote_qpn: req.local_qpn,
                rq_psn: seq,
                sq_psn: req.starting_psn,
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                timeout: req.primary_path.local_ack_timeout,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
            }),
            Req::Sidr(_) => None,
        };
        self.ids.insert(
            new,
            Id {
                chan: l.chan,
                uid: 0,
                ps: l.ps,
                ud: l.ud,
                state: IdState::Connect,
                src: Some(src),
                dst: Some(dst),
                port: None,
                reuseaddr: false,
                afonly: l.afonly,
                tos: l.tos,
                ack_timeout: None,
                backlog: 0,
                routed: true,
                seq_num: seq,
                cm: Some(cm),
                conn,
                events_reported: 0,
                listening: None,
            },
        );
        if let Some(c) = self.channels.get_mut(&l.chan) {
            c.ids += 1;
        }
        self.by_cm.insert(cm, new);
        if let Some(li) = self.ids.get_mut(&lid) {
            li.backlog -= 1;
        }
        // ucma: the listener's uid, the new id.
        let mut r = self.new_event(lid, event::CONNECT_REQUEST, 0);
        wr_u32(&mut r, 8, new);
        match req {
            // cma_set_req_event_data: the consumer's private data after
            // the header.
            Req::Rc(req) => put_conn(
                &mut r,
                req.local_qpn,
                &req.private_data[CmaHdr::LEN..],
                req.srq,
                req.responder_resources,
                req.initiator_depth,
                req.end_to_end_flow_control,
                req.retry_count,
                req.rnr_retry_count,
            ),
            // cma_ib_req_handler for SIDR: only the private data.
            Req::Sidr(req) => put_ud(&mut r, 0, 0, None, &req.private_data[CmaHdr::LEN..]),
        }
        self.push(Event {
            id: lid,
            new_id: Some(new),
            resp: r,
        });
    }

    /// cma.c `cma_sidr_rep_handler`: SUCCESS is ESTABLISHED with the
    /// service's QPN, Q_Key and an AH to it; any other status UNREACHABLE
    /// with that status.
    pub(super) fn on_sidr_rep(&mut self, id: u32, rep: &vrnic_wire::CmSidrRep) {
        let conn = self.ids.get_mut(&id).and_then(|i| {
            let c = i.conn;
            if let Some(cm) = i.cm.take() {
                self.by_cm.remove(&cm);
            }
            c
        });
        if rep.status != vrnic_wire::sidr_status::SUCCESS {
            let mut r = self.new_event(id, event::UNREACHABLE, i32::from(rep.status));
            put_ud(&mut r, 0, 0, None, &rep.private_data);
            self.push(Event {
                id,
                new_id: None,
                resp: r,
            });
            return;
        }
        let mut r = self.new_event(id, event::ESTABLISHED, 0);
        put_ud(&mut r, rep.qpn, rep.qkey, conn.as_ref(), &rep.private_data);
        self.push(Event {
            id,
            new_id: None,
            resp: r,
        });
    }
}
