//! Completion queues: `CMD_CREATE_CQ`, `CMD_DESTROY_CQ`
//! (`ibv_create_cq(3)`, `ibv_destroy_cq(3)`).

use super::*;

impl Device {
    /// `CMD_CREATE_CQ`: a CQ of `c.cqe` entries (a power of two up to
    /// [`MAX_CQE`]) owned by context `ctx`, its ring and doorbell record
    /// probed.
    pub(super) fn create_cq(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        c: abi::CreateCq,
    ) -> Result<abi::Handle, CommandError> {
        if c.cqe == 0 || !c.cqe.is_power_of_two() || c.cqe > MAX_CQE {
            return Err(CommandError::invalid("CQ size"));
        }
        if self.res.cqs.len() >= MAX_CQ {
            return Err(CommandError::no_resources("CQs"));
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
            .ok_or(CommandError::no_resources("CQ numbers"))?;
        Ok(handle_of(cqn))
    }

    /// `CMD_DESTROY_CQ`: fails while a QP completes to the CQ
    /// (`ibv_destroy_cq(3)`: `EBUSY`).
    pub(super) fn destroy_cq(&mut self, ctx: u16, cqn: u32) -> Result<(), CommandError> {
        if !self.owns_cq(ctx, cqn) {
            return Err(CommandError::NotFound(Object::Cq(cqn)));
        }
        if self
            .qps
            .values()
            .any(|q| q.send_cqn == cqn || q.recv_cqn == cqn)
        {
            return Err(CommandError::InUse(Object::Cq(cqn)));
        }
        self.res.cqs.remove(cqn);
        Ok(())
    }
}
