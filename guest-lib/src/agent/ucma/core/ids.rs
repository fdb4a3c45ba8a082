//! Ids and their addresses: `CREATE_ID`, `BIND`, `RESOLVE_ADDR`, `LISTEN`,
//! `SET_OPTION`, `MIGRATE_ID`, `DESTROY_ID` (ucma.c, cma.c `rdma_bind_addr`,
//! `rdma_resolve_addr`, `rdma_listen`, `rdma_destroy_id`).

use super::*;

impl Ucma {
    pub(super) fn create_id(&mut self, chan: u32, uid: u64, ps: u16, qp_type: u8) -> Answer {
        let ps = PortSpace::from_u16(ps).ok_or(-libc::EINVAL)?;
        // ucma_create_id: IB_QPT_RC (2) or IB_QPT_UD (4) (ucma_get_qp_type).
        let ud = match (ps, qp_type) {
            (PortSpace::Tcp, _) => false,
            (PortSpace::Udp | PortSpace::Ipoib, _) => true,
            (PortSpace::Ib, 2) => false,
            (PortSpace::Ib, 4) => true,
            _ => return Err(-libc::EINVAL),
        };
        let c = self.channels.get_mut(&chan).ok_or(-libc::EBADF)?;
        if c.ids >= MAX_IDS_PER_CHANNEL {
            return Err(-libc::ENOMEM);
        }
        c.ids += 1;
        let id = self.alloc_id();
        let seq = self.random24();
        self.ids.insert(
            id,
            Id {
                chan,
                uid,
                ps,
                ud,
                state: IdState::Idle,
                src: None,
                dst: None,
                port: None,
                reuseaddr: false,
                afonly: None,
                tos: 0,
                ack_timeout: None,
                backlog: 0,
                routed: false,
                seq_num: seq,
                cm: None,
                conn: None,
                events_reported: 0,
                listening: None,
            },
        );
        Ok(id.to_ne_bytes().to_vec())
    }

    pub(super) fn alloc_id(&mut self) -> u32 {
        let mut id = self.next_id;
        while id == 0 || self.ids.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_id = id.wrapping_add(1);
        id
    }

    /// cma.c `rdma_bind_addr`: IDLE → ADDR_BOUND on one of the function's
    /// addresses or the wildcard, with a port (`cma_get_port`).
    pub(super) fn bind(&mut self, chan: u32, id: u32, a: SocketAddr) -> Result<(), i32> {
        let i = self.get(chan, id)?;
        if i.state != IdState::Idle {
            return Err(-libc::EINVAL);
        }
        if !sockaddr::is_any(&a) && self.dev.gid_index(a.ip()).is_none() {
            return Err(-libc::EADDRNOTAVAIL);
        }
        let afonly = i.afonly.unwrap_or(a.is_ipv4());
        let (ps, reuse) = (i.ps, i.reuseaddr);
        let port = self
            .ports
            .bind(ps, id, a, reuse, afonly)
            .map_err(|e| e.errno())?;
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        let mut a = a;
        a.set_port(port);
        i.src = Some(a);
        i.port = Some(port);
        i.afonly = Some(afonly);
        i.state = IdState::AddrBound;
        Ok(())
    }

    /// cma.c `rdma_resolve_addr`, resolved at once: the source is the
    /// function's address of the destination's family; ADDR_RESOLVED.
    pub(super) fn resolve_addr(
        &mut self,
        chan: u32,
        id: u32,
        src: Option<SocketAddr>,
        dst: SocketAddr,
    ) -> Answer {
        if self.get(chan, id)?.state == IdState::Idle {
            let s = src.unwrap_or_else(|| sockaddr::any_of(&dst, 0));
            self.bind(chan, id, s)?;
        }
        let i = self.get(chan, id)?;
        let bound = i.src.ok_or(-libc::EINVAL)?;
        if bound.is_ipv4() != dst.is_ipv4() || i.state != IdState::AddrBound {
            return Err(-libc::EINVAL);
        }
        // cma_resolve_loopback: a wildcard destination is the source.
        let src_ip = if sockaddr::is_any(&bound) {
            let want = if sockaddr::is_any(&dst) {
                bound.ip()
            } else {
                dst.ip()
            };
            self.dev.source_for(want).ok_or(-libc::ENETUNREACH)?
        } else {
            bound.ip()
        };
        let mut dst = dst;
        if sockaddr::is_any(&dst) {
            dst.set_ip(src_ip);
        }
        let (ps, port) = (i.ps, bound.port());
        let src = SocketAddr::new(src_ip, port);
        self.ports.rebind(ps, id, src);
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        i.src = Some(src);
        i.dst = Some(dst);
        i.state = IdState::AddrResolved;
        self.push_simple(id, event::ADDR_RESOLVED, 0);
        Ok(Vec::new())
    }

    /// cma.c `rdma_listen`: binds to the IPv4 wildcard from IDLE, then
    /// listens on the service ID of the port (shared with other listeners
    /// of the port at other addresses).
    pub(super) fn listen(&mut self, chan: u32, id: u32, backlog: i32) -> Result<(), i32> {
        if self.get(chan, id)?.state == IdState::Idle {
            self.bind(chan, id, "0.0.0.0:0".parse().expect("an address"))?;
        }
        let i = self.get(chan, id)?;
        if i.state != IdState::AddrBound {
            return Err(-libc::EINVAL);
        }
        let src = i.src.ok_or(-libc::EINVAL)?;
        if i.reuseaddr {
            self.ports
                .check_listen(i.ps, id, &src)
                .map_err(|e| e.errno())?;
        }
        let sid = service_id(i.ps, src.port());
        match self.cm.listen(sid) {
            Ok(()) | Err(vrnic_cm::CmError::Busy) => {}
            Err(_) => return Err(-libc::ENOMEM),
        }
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        i.listening = Some(sid);
        i.state = IdState::Listen;
        i.backlog = if backlog > 0 && (backlog as u32) < MAX_BACKLOG {
            backlog as u32
        } else {
            MAX_BACKLOG
        };
        Ok(())
    }

    pub(super) fn set_option(
        &mut self,
        chan: u32,
        id: u32,
        level: u32,
        name: u32,
        val: &[u8],
    ) -> Result<(), i32> {
        let int = || -> Result<i32, i32> {
            let b: [u8; 4] = val.try_into().map_err(|_| -libc::EINVAL)?;
            Ok(i32::from_ne_bytes(b))
        };
        let u8v = || -> Result<u8, i32> {
            match val {
                [v] => Ok(*v),
                _ => Err(-libc::EINVAL),
            }
        };
        match (level, name) {
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_TOS) => {
                let v = u8v()?;
                self.get_mut(chan, id)?.tos = v;
            }
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_REUSEADDR) => {
                let v = int()? != 0;
                let i = self.get_mut(chan, id)?;
                // rdma_set_reuseaddr.
                if !((v && i.state != IdState::Listen) || i.state == IdState::Idle) {
                    return Err(-libc::EINVAL);
                }
                i.reuseaddr = v;
            }
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_AFONLY) => {
                let v = int()? != 0;
                let i = self.get_mut(chan, id)?;
                if !matches!(i.state, IdState::Idle | IdState::AddrBound) {
                    return Err(-libc::EINVAL);
                }
                i.afonly = Some(v);
            }
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_ACK_TIMEOUT) => {
                let v = u8v()?;
                let i = self.get_mut(chan, id)?;
                if i.ud {
                    return Err(-libc::EINVAL);
                }
                i.ack_timeout = Some(v);
            }
            (abi::RDMA_OPTION_IB, abi::RDMA_OPTION_IB_PATH) => {
                if val.is_empty() || !val.len().is_multiple_of(PATH_DATA_LEN) {
                    return Err(-libc::EINVAL);
                }
                // rdma_set_ib_path: ADDR_RESOLVED → ROUTE_RESOLVED, and
                // ucma_set_ib_path's ROUTE_RESOLVED event. The path is
                // computed locally, as for RESOLVE_ROUTE.
                let i = self.get_mut(chan, id)?;
                if i.state != IdState::AddrResolved {
                    return Err(-libc::EINVAL);
                }
                i.state = IdState::RouteResolved;
                i.routed = true;
                self.push_simple(id, event::ROUTE_RESOLVED, 0);
            }
            _ => return Err(-libc::ENOSYS),
        }
        Ok(())
    }

    /// ucma.c `ucma_migrate_id`: id `id` of channel `from` moves, with its
    /// waiting events, to `chan`.
    pub(super) fn migrate(&mut self, chan: u32, id: u32, from: u32) -> Answer {
        if !self.channels.contains_key(&from) {
            return Err(-libc::ENOENT);
        }
        let n = self.get(from, id)?.events_reported;
        if from != chan {
            let Some(src) = self.channels.get_mut(&from) else {
                return Err(-libc::ENOENT);
            };
            let (moving, staying): (VecDeque<Event>, VecDeque<Event>) =
                src.events.drain(..).partition(|e| e.id == id);
            src.events = staying;
            src.ids = src.ids.saturating_sub(1);
            let dst = self.channels.get_mut(&chan).ok_or(-libc::EBADF)?;
            dst.ids += 1;
            dst.events.extend(moving);
            if let Some(i) = self.ids.get_mut(&id) {
                i.chan = chan;
            }
        }
        Ok(n.to_ne_bytes().to_vec())
    }

    /// cma.c `rdma_destroy_id` and ucma.c's cleanup: the CM connection is
    /// destroyed (REJ, DREQ or DREP as cm.c's `cm_destroy_id`), the port
    /// released, unreported events dropped (a CONNECT_REQUEST's new id
    /// destroyed with them).
    pub(super) fn destroy_id(&mut self, now: u64, id: u32) {
        let Some(i) = self.ids.remove(&id) else {
            return;
        };
        if let Some(cm) = i.cm {
            self.by_cm.remove(&cm);
            let _ = self.cm.destroy(now, cm);
        }
        if let Some(port) = i.port {
            self.ports.release(i.ps, id, port);
        }
        if let Some(sid) = i.listening {
            if !self.ids.values().any(|o| o.listening == Some(sid)) {
                let _ = self.cm.unlisten(sid);
            }
        }
        let mut orphans = Vec::new();
        if let Some(c) = self.channels.get_mut(&i.chan) {
            c.ids = c.ids.saturating_sub(1);
            c.events.retain(|e| {
                if e.id == id {
                    orphans.extend(e.new_id);
                    false
                } else {
                    true
                }
            });
        }
        for o in orphans {
            self.destroy_id(now, o);
        }
    }
}
