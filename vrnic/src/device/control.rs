//! Control command execution (`abi::CMD_*`): creates, modifies, queries and
//! destroys verbs objects. Every argument is untrusted; errors are `abi::Status`.

use super::*;
use crate::abi::{Pod, Status};
use crate::transport::requester::ReqState;
use crate::transport::responder::RespState;
use crate::verbs::ah::{Ah, Av};
use crate::verbs::mr::{validate_reg, Mr};
use crate::verbs::qp::{apply_attrs, validate_modify, Ring};
use crate::verbs::srq::Srq;
use crate::wire::Gid;

fn arg<T: Pod>(args: &[u8]) -> Result<T, Status> {
    T::read_from(args).ok_or(abi::STATUS_EINVAL)
}

fn put<T: Pod>(out: &mut [u8], v: &T) -> usize {
    let b = v.as_bytes();
    out[..b.len()].copy_from_slice(b);
    b.len()
}

fn handle(args: &[u8]) -> Result<u32, Status> {
    Ok(arg::<abi::Handle>(args)?.handle)
}

/// Checks that `[gpa, gpa+len)` is readable driver memory (cheap probe of
/// both ends; every later access is checked again).
fn probe(mem: &dyn DmaMemory, gpa: u64, len: u64) -> Result<(), Status> {
    let last = gpa.checked_add(len.max(1) - 1).ok_or(abi::STATUS_EFAULT)?;
    let mut b = [0u8; 1];
    mem.read(gpa, &mut b).map_err(|_| abi::STATUS_EFAULT)?;
    mem.read(last, &mut b).map_err(|_| abi::STATUS_EFAULT)?;
    Ok(())
}

impl Device {
    /// Removes QP `qpn` (`CMD_DESTROY_QP`, `CMD_CLOSE_CTX`): its responder
    /// resources released and the watch of its record ended (the record
    /// may be gone). `None` when there is no such QP.
    pub(super) fn remove_qp(&mut self, qpn: u32) -> Option<()> {
        let mut qp = self.qps.remove(qpn)?;
        qp.resp.release(&mut self.res.out);
        self.res.read_bytes_asked = self
            .res
            .read_bytes_asked
            .saturating_sub(qp.read_bytes_counted);
        self.watch.forget(qpn);
        Some(())
    }

    /// The GID table: index 0 the link-local GID from the MAC, index 1 the
    /// IPv4-mapped RoCEv2 GID (as Linux rxe lays it out), then the port's
    /// further IPv6 addresses ([`crate::transport::PortId::gid`]).
    pub fn gid(&self, index: u32) -> Option<Gid> {
        self.res.port.gid(index)
    }

    /// Checks an address vector against the GID table: the source GID
    /// index must exist and be of the destination's family (IPv4-mapped
    /// GIDs for IPv4, the others for IPv6), as the kernel's RoCE
    /// `ib_resolve_eth_dmac` requires.
    fn check_av(&self, av: &Av) -> Result<(), Status> {
        let sgid = self.gid(av.sgid_index as u32).ok_or(abi::STATUS_EINVAL)?;
        let dst = Gid(av.dgid).to_ip();
        if sgid.to_ip().is_ipv4() != dst.is_ipv4() {
            return Err(abi::STATUS_EINVAL);
        }
        if dst.is_unspecified() || dst.is_multicast() {
            return Err(abi::STATUS_EINVAL);
        }
        Ok(())
    }

    /// True when rings of `a` and `b` more entries fit the device's
    /// budget of ring entries ([`MAX_TOTAL_WR`]) beside every QP's SQ and
    /// RQ and every SRQ's ring. O(QPs + SRQs), at most 2,048 objects.
    fn ring_entries_fit(&self, a: u32, b: u32) -> bool {
        let qps = self
            .qps
            .values()
            .map(|q| u64::from(q.sq.size) + u64::from(q.rq.size));
        let srqs = self.res.srqs.values().map(|s| u64::from(s.ring.size));
        let used: u64 = qps.chain(srqs).sum();
        used + u64::from(a) + u64::from(b) <= u64::from(MAX_TOTAL_WR)
    }

    /// Executes command `opcode` with body `args` for context `ctx`
    /// (device spec §5.x.6.13: objects of other contexts answer
    /// `STATUS_ENOENT`, as if they did not exist); the response body goes
    /// to `out`, its length is returned.
    pub(super) fn command(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        opcode: u16,
        args: &[u8],
        out: &mut [u8],
        now: Nanos,
    ) -> Result<usize, Status> {
        if !self.res.ctxs.is_open(ctx) {
            return Err(abi::STATUS_ENOENT);
        }
        match opcode {
            abi::CMD_QUERY_DEVICE => {
                let mac = self.res.port.mac;
                let attr = abi::DeviceAttr {
                    node_guid: [
                        mac[0] ^ 2,
                        mac[1],
                        mac[2],
                        0xff,
                        0xfe,
                        mac[3],
                        mac[4],
                        mac[5],
                    ],
                    max_mr_size: MAX_MR_SIZE,
                    page_size_cap: 0x1000 | 0x20_0000,
                    max_qp: MAX_QP as u32,
                    max_qp_wr: MAX_QP_WR,
                    max_sge: MAX_SGE,
                    max_cq: MAX_CQ as u32,
                    max_cqe: MAX_CQE,
                    max_mr: MAX_MR as u32,
                    max_pd: MAX_PD as u32,
                    max_qp_rd_atom: crate::verbs::qp::MAX_QP_RD_ATOM,
                    max_qp_init_rd_atom: crate::verbs::qp::MAX_QP_RD_ATOM,
                    max_inline: MAX_INLINE,
                    max_srq: MAX_SRQ as u32,
                    max_srq_wr: MAX_QP_WR,
                    max_srq_sge: MAX_SGE,
                    max_ah: MAX_AH as u32,
                    max_mr_pages: MAX_MR_PAGES,
                    max_total_mr_pages: MAX_MR_PAGES_TOTAL,
                    max_total_wr: MAX_TOTAL_WR,
                    reserved: 0,
                };
                Ok(put(out, &attr))
            }
            abi::CMD_QUERY_PORT => {
                let q: abi::QueryPort = arg(args)?;
                if q.port != 1 {
                    return Err(abi::STATUS_EINVAL);
                }
                let attr = abi::PortAttr {
                    state: 4,
                    max_mtu: 5,
                    active_mtu: self.active_mtu(),
                    gid_tbl_len: self.res.port.gid_count(),
                    max_msg_sz: MAX_MSG_SZ,
                    link_layer: 2,
                };
                Ok(put(out, &attr))
            }
            abi::CMD_QUERY_GID => {
                let q: abi::QueryGid = arg(args)?;
                if q.port != 1 {
                    return Err(abi::STATUS_EINVAL);
                }
                let gid = self.gid(q.index).ok_or(abi::STATUS_ENOENT)?;
                Ok(put(
                    out,
                    &abi::GidEntry {
                        gid: gid.0,
                        gid_type: abi::GID_TYPE_ROCE_V2,
                        reserved: 0,
                    },
                ))
            }
            abi::CMD_QUERY_PKEY => {
                let q: abi::QueryPkey = arg(args)?;
                if q.port != 1 {
                    return Err(abi::STATUS_EINVAL);
                }
                let pkey = self.res.port.pkey(q.index).ok_or(abi::STATUS_ENOENT)?;
                Ok(put(
                    out,
                    &abi::PkeyEntry {
                        pkey,
                        ..Default::default()
                    },
                ))
            }
            abi::CMD_ALLOC_PD => {
                if self.res.pds.len() >= MAX_PD {
                    return Err(abi::STATUS_ENOMEM);
                }
                let pdn = self
                    .res
                    .pds
                    .insert_with(0, |_| ctx)
                    .ok_or(abi::STATUS_ENOMEM)?;
                Ok(put(
                    out,
                    &abi::Handle {
                        handle: pdn,
                        reserved: 0,
                    },
                ))
            }
            abi::CMD_DEALLOC_PD => {
                let pdn = handle(args)?;
                if !self.owns_pd(ctx, pdn) {
                    return Err(abi::STATUS_ENOENT);
                }
                if self.res.mrs.uses_pd(pdn)
                    || self.qps.values().any(|q| q.pdn == pdn)
                    || self.res.ahs.values().any(|a| a.pdn == pdn)
                    || self.res.srqs.values().any(|s| s.pdn == pdn)
                {
                    return Err(abi::STATUS_EBUSY);
                }
                self.res.pds.remove(pdn);
                Ok(0)
            }
            abi::CMD_REG_MR => self.reg_mr(mem, ctx, arg(args)?, out),
            abi::CMD_DEREG_MR => {
                let lkey = handle(args)?;
                if !self.owns_mr(ctx, lkey) {
                    return Err(abi::STATUS_ENOENT);
                }
                self.res.mrs.remove(lkey).ok_or(abi::STATUS_ENOENT)?;
                Ok(0)
            }
            abi::CMD_CREATE_CQ => self.create_cq(mem, ctx, arg(args)?, out),
            abi::CMD_DESTROY_CQ => {
                let cqn = handle(args)?;
                if !self.owns_cq(ctx, cqn) {
                    return Err(abi::STATUS_ENOENT);
                }
                if self
                    .qps
                    .values()
                    .any(|q| q.send_cqn == cqn || q.recv_cqn == cqn)
                {
                    return Err(abi::STATUS_EBUSY);
                }
                self.res.cqs.remove(cqn);
                Ok(0)
            }
            abi::CMD_CREATE_QP => self.create_qp(mem, ctx, arg(args)?, out),
            abi::CMD_MODIFY_QP => {
                let a: abi::QpAttr = arg(args)?;
                if !self.owns_qp(ctx, a.qpn) {
                    return Err(abi::STATUS_ENOENT);
                }
                self.modify_qp(mem, a, now)
            }
            abi::CMD_QUERY_QP => {
                let qpn = handle(args)?;
                if !self.owns_qp(ctx, qpn) {
                    return Err(abi::STATUS_ENOENT);
                }
                let qp = self.qps.get(qpn).ok_or(abi::STATUS_ENOENT)?;
                let mut a = qp.attr;
                a.qpn = qp.qpn;
                a.qp_state = qp.state.into();
                Ok(put(out, &a))
            }
            abi::CMD_DESTROY_QP => {
                let qpn = handle(args)?;
                if !self.owns_qp(ctx, qpn) {
                    return Err(abi::STATUS_ENOENT);
                }
                self.remove_qp(qpn).ok_or(abi::STATUS_ENOENT)?;
                Ok(0)
            }
            abi::CMD_CREATE_AH => {
                let c: abi::CreateAh = arg(args)?;
                if !self.owns_pd(ctx, c.pdn) {
                    return Err(abi::STATUS_ENOENT);
                }
                if c.port_num != 1 || c.is_global == 0 {
                    return Err(abi::STATUS_EINVAL);
                }
                let av = Av::of_ah(&c);
                self.check_av(&av)?;
                if self.res.ahs.len() >= MAX_AH {
                    return Err(abi::STATUS_ENOMEM);
                }
                let ahn = self
                    .res
                    .ahs
                    .insert_with(0, |ahn| Ah {
                        ahn,
                        pdn: c.pdn,
                        av,
                    })
                    .ok_or(abi::STATUS_ENOMEM)?;
                // Resolve early so the first send does not wait for ARP.
                self.resolve(av.dgid, now);
                Ok(put(
                    out,
                    &abi::Handle {
                        handle: ahn,
                        reserved: 0,
                    },
                ))
            }
            abi::CMD_DESTROY_AH => {
                let ahn = handle(args)?;
                if !self.owns_ah(ctx, ahn) {
                    return Err(abi::STATUS_ENOENT);
                }
                self.res.ahs.remove(ahn).ok_or(abi::STATUS_ENOENT)?;
                Ok(0)
            }
            abi::CMD_CREATE_SRQ => self.create_srq(mem, ctx, arg(args)?, out),
            abi::CMD_MODIFY_SRQ => {
                let a: abi::SrqAttr = arg(args)?;
                if !self.owns_srq(ctx, a.srqn) {
                    return Err(abi::STATUS_ENOENT);
                }
                let srq = self.res.srqs.get_mut(a.srqn).ok_or(abi::STATUS_ENOENT)?;
                if a.attr_mask & !(abi::SRQ_ATTR_MAX_WR | abi::SRQ_ATTR_LIMIT) != 0 {
                    return Err(abi::STATUS_EINVAL);
                }
                if a.attr_mask & abi::SRQ_ATTR_MAX_WR != 0 {
                    return Err(abi::STATUS_EOPNOTSUPP);
                }
                if a.attr_mask & abi::SRQ_ATTR_LIMIT != 0 {
                    if a.srq_limit > srq.ring.size {
                        return Err(abi::STATUS_EINVAL);
                    }
                    srq.limit = a.srq_limit;
                }
                Ok(0)
            }
            abi::CMD_QUERY_SRQ => {
                let srqn = handle(args)?;
                if !self.owns_srq(ctx, srqn) {
                    return Err(abi::STATUS_ENOENT);
                }
                let srq = self.res.srqs.get(srqn).ok_or(abi::STATUS_ENOENT)?;
                Ok(put(
                    out,
                    &abi::SrqAttr {
                        srqn: srq.srqn,
                        attr_mask: 0,
                        max_wr: srq.ring.size,
                        max_sge: srq.max_sge,
                        srq_limit: srq.limit,
                        reserved: 0,
                    },
                ))
            }
            abi::CMD_DESTROY_SRQ => {
                let srqn = handle(args)?;
                if !self.owns_srq(ctx, srqn) {
                    return Err(abi::STATUS_ENOENT);
                }
                if self.qps.values().any(|q| q.srqn == srqn) {
                    return Err(abi::STATUS_EBUSY);
                }
                self.res.srqs.remove(srqn);
                Ok(0)
            }
            abi::CMD_OPEN_CTX => {
                let c = self.open_ctx(ctx)?;
                Ok(put(
                    out,
                    &abi::Handle {
                        handle: c,
                        reserved: 0,
                    },
                ))
            }
            abi::CMD_QUERY_USAGE => {
                if ctx != abi::DEFAULT_CTX {
                    return Err(abi::STATUS_EPERM);
                }
                let [pds, mrs, cqs, qps, ahs, srqs] = self.object_counts().map(|n| n as u32);
                Ok(put(
                    out,
                    &abi::Usage {
                        ctxs: self.context_count() as u32,
                        pds,
                        mrs,
                        cqs,
                        qps,
                        ahs,
                        srqs,
                        mr_pages: self.res.mrs.pages() as u32,
                    },
                ))
            }
            abi::CMD_CLOSE_CTX => {
                self.close_ctx(ctx, handle(args)?)?;
                Ok(0)
            }
            _ => Err(abi::STATUS_ENOSYS),
        }
    }

    fn reg_mr(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        r: abi::RegMr,
        out: &mut [u8],
    ) -> Result<usize, Status> {
        if !self.owns_pd(ctx, r.pdn) {
            return Err(abi::STATUS_ENOENT);
        }
        validate_reg(&r, MAX_MR_SIZE)?;
        // One MR beyond the per-MR maximum is invalid; past the device's
        // count or page budget the device is out of resources (rxe: a
        // full pool is -ENOMEM). Both before any work on the page list.
        if r.npages > MAX_MR_PAGES {
            return Err(abi::STATUS_EINVAL);
        }
        let npages = r.npages as usize;
        if self.res.mrs.len() >= MAX_MR
            || self.res.mrs.pages().saturating_add(npages) > MAX_MR_PAGES_TOTAL as usize
        {
            return Err(abi::STATUS_ENOMEM);
        }
        let page = 1u64 << r.page_shift;
        probe(mem, r.page_list, r.npages as u64 * 8)?;
        // Read a page of entries at a time: the only copy of the list the
        // daemon keeps is `pages` (8 bytes an entry).
        let mut pages = Vec::with_capacity(npages);
        let mut chunk = [0u8; 4096];
        let mut gpa = r.page_list;
        while pages.len() < npages {
            let n = (npages - pages.len()).min(chunk.len() / 8);
            let raw = &mut chunk[..n * 8];
            mem.read(gpa, raw).map_err(|_| abi::STATUS_EFAULT)?;
            gpa = gpa
                .checked_add(raw.len() as u64)
                .ok_or(abi::STATUS_EFAULT)?;
            for entry in raw.chunks_exact(8) {
                let p = u64::from_le_bytes(entry.try_into().expect("8-byte chunk"));
                if p & (page - 1) != 0 {
                    return Err(abi::STATUS_EINVAL);
                }
                // Every page must be driver memory: checked now, so a bad
                // page list is rejected at registration rather than at
                // first use.
                probe(mem, p, page)?;
                pages.push(p);
            }
        }
        let mr = Mr {
            lkey: 0,
            rkey: 0,
            pdn: r.pdn,
            access: r.access,
            iova: r.iova,
            length: r.length,
            page_shift: r.page_shift,
            pages,
            invalidated: false,
        };
        let (lkey, rkey) = self.res.mrs.insert(mr).ok_or(abi::STATUS_ENOMEM)?;
        Ok(put(out, &abi::MrKeys { lkey, rkey }))
    }

    fn create_cq(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        c: abi::CreateCq,
        out: &mut [u8],
    ) -> Result<usize, Status> {
        if c.cqe == 0 || !c.cqe.is_power_of_two() || c.cqe > MAX_CQE {
            return Err(abi::STATUS_EINVAL);
        }
        if self.res.cqs.len() >= MAX_CQ {
            return Err(abi::STATUS_ENOMEM);
        }
        probe(mem, c.ring, c.cqe as u64 * size_of::<abi::Cqe>() as u64)?;
        probe(mem, c.db, 8)?;
        let cqn = self
            .res
            .cqs
            .insert_with(0, |cqn| Cq {
                cqn,
                ctx,
                ring: c.ring,
                size: c.cqe,
                db: c.db,
                pi: 0,
                armed: None,
                broken: false,
            })
            .ok_or(abi::STATUS_ENOMEM)?;
        Ok(put(
            out,
            &abi::Handle {
                handle: cqn,
                reserved: 0,
            },
        ))
    }

    fn create_qp(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        c: abi::CreateQp,
        out: &mut [u8],
    ) -> Result<usize, Status> {
        let Ok(qp_type) = abi::QpType::try_from(c.qp_type) else {
            return Err(abi::STATUS_EOPNOTSUPP);
        };
        if !self.owns_pd(ctx, c.pdn)
            || !self.owns_cq(ctx, c.send_cqn)
            || !self.owns_cq(ctx, c.recv_cqn)
        {
            return Err(abi::STATUS_ENOENT);
        }
        if c.srqn != 0 {
            if !self.owns_srq(ctx, c.srqn) {
                return Err(abi::STATUS_ENOENT);
            }
            let srq = self.res.srqs.get(c.srqn).ok_or(abi::STATUS_ENOENT)?;
            if srq.pdn != c.pdn {
                return Err(abi::STATUS_EINVAL);
            }
        }
        let sizes_ok = |n: u32| n > 0 && n.is_power_of_two() && n <= MAX_QP_WR;
        // With an SRQ the QP has no receive ring of its own.
        let rq_ok = if c.srqn != 0 {
            c.rq_size == 0
        } else {
            sizes_ok(c.rq_size)
        };
        if !sizes_ok(c.sq_size) || !rq_ok {
            return Err(abi::STATUS_EINVAL);
        }
        if c.max_send_sge > MAX_SGE
            || c.max_recv_sge > MAX_SGE
            || c.max_inline > MAX_INLINE
            || c.flags & !abi::QP_F_ALL != 0
            || (c.flags & abi::QP_F_RQ_RECORD != 0 && c.srqn != 0)
        {
            return Err(abi::STATUS_EINVAL);
        }
        if self.qps.len() >= MAX_QP || !self.ring_entries_fit(c.sq_size, c.rq_size) {
            return Err(abi::STATUS_ENOMEM);
        }
        let sq_stride = abi::sq_stride(c.max_send_sge, c.max_inline);
        let rq_stride = abi::rq_stride(c.max_recv_sge);
        let max_inline = sq_stride - size_of::<abi::SendWqe>() as u32;
        probe(mem, c.sq, c.sq_size as u64 * sq_stride as u64)?;
        if c.srqn == 0 {
            probe(mem, c.rq, c.rq_size as u64 * rq_stride as u64)?;
        }
        let record_len = abi::qp_record_len(c.flags);
        probe(mem, c.db, record_len)?;
        mem.write(
            c.db,
            &[0u8; abi::QP_RECORD_RQ_LEN as usize][..record_len as usize],
        )
        .map_err(|_| abi::STATUS_EFAULT)?;
        // UD has no PATH_MTU attribute: its messages may fill the port's
        // active MTU, as on rxe and hardware RNICs.
        let path_mtu = if c.qp_type == abi::QPT_UD {
            self.active_mtu()
        } else {
            3
        };
        let make = |qpn| Qp {
            qpn,
            pdn: c.pdn,
            qp_type,
            state: abi::QpState::Reset,
            send_cqn: c.send_cqn,
            recv_cqn: c.recv_cqn,
            sq_sig_all: c.sq_sig_all != 0,
            srqn: c.srqn,
            sq: Ring {
                gpa: c.sq,
                size: c.sq_size,
                stride: sq_stride,
            },
            rq: Ring {
                gpa: if c.srqn == 0 { c.rq } else { 0 },
                size: c.rq_size,
                stride: rq_stride,
            },
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: c.max_recv_sge.max(1),
            max_inline,
            record: c.db,
            sq_record: c.flags & abi::QP_F_SQ_RECORD != 0,
            rq_record: c.flags & abi::QP_F_RQ_RECORD != 0,
            attr: abi::QpAttr {
                qpn,
                path_mtu,
                port_num: 1,
                ..Default::default()
            },
            req: ReqState::default(),
            resp: RespState::default(),
            stats: Default::default(),
            read_bytes_counted: 0,
        };
        let qpn = self.qps.insert_with(0, make).ok_or(abi::STATUS_ENOMEM)?;
        let r = abi::CreateQpResp {
            qpn,
            sq_stride,
            rq_stride,
            max_inline,
        };
        Ok(put(out, &r))
    }

    fn create_srq(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        c: abi::CreateSrq,
        out: &mut [u8],
    ) -> Result<usize, Status> {
        if !self.owns_pd(ctx, c.pdn) {
            return Err(abi::STATUS_ENOENT);
        }
        if c.max_wr == 0 || !c.max_wr.is_power_of_two() || c.max_wr > MAX_QP_WR {
            return Err(abi::STATUS_EINVAL);
        }
        if c.max_sge > MAX_SGE || c.srq_limit > c.max_wr {
            return Err(abi::STATUS_EINVAL);
        }
        if self.res.srqs.len() >= MAX_SRQ || !self.ring_entries_fit(c.max_wr, 0) {
            return Err(abi::STATUS_ENOMEM);
        }
        let stride = abi::rq_stride(c.max_sge);
        probe(mem, c.ring, c.max_wr as u64 * stride as u64)?;
        probe(mem, c.db, 8)?;
        mem.write(c.db, &[0u8; 8]).map_err(|_| abi::STATUS_EFAULT)?;
        let srqn = self
            .res
            .srqs
            .insert_with(0, |srqn| Srq {
                srqn,
                pdn: c.pdn,
                ring: Ring {
                    gpa: c.ring,
                    size: c.max_wr,
                    stride,
                },
                max_sge: c.max_sge.max(1),
                limit: c.srq_limit,
                pi: 0,
                ci: 0,
                record: c.db,
            })
            .ok_or(abi::STATUS_ENOMEM)?;
        Ok(put(
            out,
            &abi::CreateSrqResp {
                srqn,
                stride,
                max_wr: c.max_wr,
                reserved: 0,
            },
        ))
    }

    /// `CMD_MODIFY_QP` at time `now`: the transport steps a transition
    /// runs (SQD → RTS sending what was posted meanwhile, arming the ACK
    /// timer) use the caller's clock.
    fn modify_qp(
        &mut self,
        mem: &dyn DmaMemory,
        a: abi::QpAttr,
        now: Nanos,
    ) -> Result<usize, Status> {
        let qp = self.qps.get_mut(a.qpn).ok_or(abi::STATUS_ENOENT)?;
        let next = validate_modify(qp, &a)?;
        // rxe_qp_chk_attr: the P_Key index must name a table entry.
        if a.attr_mask & abi::QP_ATTR_PKEY_INDEX != 0
            && self.res.port.pkey(a.pkey_index.into()).is_none()
        {
            return Err(abi::STATUS_EINVAL);
        }
        if a.attr_mask & abi::QP_ATTR_AV != 0 {
            let av = Av::of_qp(&a);
            // check_av borrows the device; the QP is looked up again below.
            let _ = qp;
            self.check_av(&av)?;
        }
        let qp = self.qps.get_mut(a.qpn).ok_or(abi::STATUS_ENOENT)?;
        let prev = qp.state;
        apply_attrs(&mut qp.attr, &a);
        qp.state = next;
        qp_step!(self, qp, mem, now, |env| {
            match next {
                abi::QpState::Reset => {
                    qp.req = ReqState::default();
                    qp.resp.release(&mut env.res.out);
                    qp.resp = RespState::default();
                    // The rings restart empty: publish consumer indices 0.
                    crate::transport::write_record(qp, &env);
                }
                abi::QpState::Rtr if prev == abi::QpState::Init => {
                    qp.resp.epsn = qp.attr.rq_psn;
                }
                abi::QpState::Rts if prev == abi::QpState::Rtr => {
                    qp.req
                        .start(qp.attr.sq_psn, qp.attr.retry_cnt, qp.attr.rnr_retry);
                }
                abi::QpState::Sqd if prev == abi::QpState::Rts => {
                    // EV_SQ_DRAINED once every fetched WQE completed (IBTA
                    // §10.3.1.4, `IBV_EVENT_SQ_DRAINED`).
                    if qp.req.inflight.is_empty() {
                        env.res.out.event(abi::EV_SQ_DRAINED, qp.qpn, 0);
                    } else {
                        qp.req.drain_pending = true;
                    }
                }
                abi::QpState::Rts if prev == abi::QpState::Sqd || prev == abi::QpState::Sqe => {
                    qp.req.drain_pending = false;
                    requester::run(qp, &mut env);
                }
                abi::QpState::Err => {
                    qp.state = prev;
                    crate::transport::qp_to_error(qp, &mut env, abi::WcStatus::Success);
                }
                _ => {}
            }
        });
        let connected = qp.qp_type != abi::QpType::Ud;
        let dgid = (connected && (next == abi::QpState::Rtr || next == abi::QpState::Rts))
            .then_some(qp.attr.dgid);
        if let Some(dgid) = dgid {
            // Resolve the peer early so the first send does not wait for ARP.
            self.resolve(dgid, now);
        }
        if next == abi::QpState::Reset {
            // The driver's producer index in the record restarts at 0.
            self.unwatch(mem, a.qpn);
        }
        Ok(0)
    }
}
