//! Shared receive queues: `CMD_CREATE_SRQ`, `CMD_MODIFY_SRQ`,
//! `CMD_QUERY_SRQ`, `CMD_DESTROY_SRQ` (`ibv_create_srq(3)`,
//! `ibv_modify_srq(3)`, `ibv_query_srq(3)`, `ibv_destroy_srq(3)`).

use super::*;
use crate::verbs::qp::Ring;
use crate::verbs::srq::Srq;

impl Device {
    /// `CMD_CREATE_SRQ`: an SRQ of `c.max_wr` entries (a power of two up
    /// to [`MAX_QP_WR`]) in PD `c.pdn`, its ring probed and its doorbell
    /// record zeroed.
    pub(super) fn create_srq(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        c: abi::CreateSrq,
    ) -> Result<abi::CreateSrqResp, CommandError> {
        if !self.owns_pd(ctx, c.pdn) {
            return Err(CommandError::NotFound(Object::Pd(c.pdn)));
        }
        if c.max_wr == 0 || !c.max_wr.is_power_of_two() || c.max_wr > MAX_QP_WR {
            return Err(CommandError::invalid("SRQ size"));
        }
        if c.max_sge > MAX_SGE {
            return Err(CommandError::invalid("SRQ max_sge"));
        }
        if c.srq_limit > c.max_wr {
            return Err(CommandError::invalid("SRQ limit"));
        }
        if self.res.srqs.len() >= MAX_SRQ {
            return Err(CommandError::no_resources("SRQs"));
        }
        if !self.ring_entries_fit(c.max_wr, 0) {
            return Err(CommandError::no_resources("ring entries"));
        }
        let stride = abi::rq_stride(c.max_sge);
        probe(mem, c.ring, c.max_wr as u64 * stride as u64)?;
        probe(mem, c.db, 8)?;
        zero_record(mem, c.db, 8)?;
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
            .ok_or(CommandError::no_resources("SRQ numbers"))?;
        Ok(abi::CreateSrqResp {
            srqn,
            stride,
            max_wr: c.max_wr,
            reserved: 0,
        })
    }

    /// `CMD_MODIFY_SRQ`: only the limit (`SRQ_ATTR_LIMIT`, at most the
    /// ring size) can change; resizing (`SRQ_ATTR_MAX_WR`) is not
    /// supported.
    pub(super) fn modify_srq(&mut self, ctx: u16, a: abi::SrqAttr) -> Result<(), CommandError> {
        if !self.owns_srq(ctx, a.srqn) {
            return Err(CommandError::NotFound(Object::Srq(a.srqn)));
        }
        let srq = self
            .res
            .srqs
            .get_mut(a.srqn)
            .ok_or(CommandError::NotFound(Object::Srq(a.srqn)))?;
        if a.attr_mask & !(abi::SRQ_ATTR_MAX_WR | abi::SRQ_ATTR_LIMIT) != 0 {
            return Err(CommandError::invalid("SRQ attribute mask"));
        }
        if a.attr_mask & abi::SRQ_ATTR_MAX_WR != 0 {
            return Err(CommandError::NotSupported {
                what: "resizing an SRQ",
            });
        }
        if a.attr_mask & abi::SRQ_ATTR_LIMIT != 0 {
            if a.srq_limit > srq.ring.size {
                return Err(CommandError::invalid("SRQ limit"));
            }
            srq.limit = a.srq_limit;
        }
        Ok(())
    }

    /// `CMD_QUERY_SRQ` of SRQ `srqn`: its size, SGE count and limit.
    pub(super) fn query_srq(&self, ctx: u16, srqn: u32) -> Result<abi::SrqAttr, CommandError> {
        if !self.owns_srq(ctx, srqn) {
            return Err(CommandError::NotFound(Object::Srq(srqn)));
        }
        let srq = self
            .res
            .srqs
            .get(srqn)
            .ok_or(CommandError::NotFound(Object::Srq(srqn)))?;
        Ok(abi::SrqAttr {
            srqn: srq.srqn,
            attr_mask: 0,
            max_wr: srq.ring.size,
            max_sge: srq.max_sge,
            srq_limit: srq.limit,
            reserved: 0,
        })
    }

    /// `CMD_DESTROY_SRQ`: fails while a QP receives from the SRQ
    /// (`ibv_destroy_srq(3)`: `EBUSY`).
    pub(super) fn destroy_srq(&mut self, ctx: u16, srqn: u32) -> Result<(), CommandError> {
        if !self.owns_srq(ctx, srqn) {
            return Err(CommandError::NotFound(Object::Srq(srqn)));
        }
        if self.qps.values().any(|q| q.srqn == srqn) {
            return Err(CommandError::InUse(Object::Srq(srqn)));
        }
        self.res.srqs.remove(srqn);
        Ok(())
    }
}
