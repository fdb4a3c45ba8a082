//! Control command execution (`abi::CMD_*`): creates, modifies, queries and
//! destroys verbs objects. Every argument is untrusted.
//!
//! A command is decoded once into a [`Command`] ([`command`]), then
//! dispatched to one handler per command, grouped by object in the
//! submodules; handlers fail with a [`CommandError`] ([`error`]), which
//! [`Device::command`] turns into the driver's status (`abi::STATUS_*`) in
//! that one place.

use super::*;
use crate::abi::{Pod, Status};
use crate::wire::Gid;

mod ah;
mod command;
mod cq;
mod error;
mod modify_qp;
mod pd_mr;
mod qp;
mod query;
mod srq;
#[cfg(test)]
mod tests;

use command::Command;
pub(super) use error::{CommandError, Object};

/// Writes `v` to the start of `out` (a command's response body, at least
/// `abi::MAX_CMD_BODY` bytes); returns its length.
fn put<T: Pod>(out: &mut [u8], v: &T) -> usize {
    let b = v.as_bytes();
    out[..b.len()].copy_from_slice(b);
    b.len()
}

/// A response body of one object number ([`abi::Handle`]).
fn handle_of(handle: u32) -> abi::Handle {
    abi::Handle {
        handle,
        reserved: 0,
    }
}

/// Checks that `[gpa, gpa+len)` is readable driver memory (cheap probe of
/// both ends; every later access is checked again).
fn probe(mem: &dyn DmaMemory, gpa: u64, len: u64) -> Result<(), CommandError> {
    let last = gpa
        .checked_add(len.max(1) - 1)
        .ok_or(CommandError::BadAddress { gpa })?;
    let mut b = [0u8; 1];
    for at in [gpa, last] {
        mem.read(at, &mut b)
            .map_err(|_| CommandError::BadAddress { gpa: at })?;
    }
    Ok(())
}

/// Writes zeros to the doorbell record of `len` bytes at `gpa` (a new
/// QP's or SRQ's indices start at 0).
fn zero_record(mem: &dyn DmaMemory, gpa: u64, len: usize) -> Result<(), CommandError> {
    let zeros = [0u8; abi::QP_RECORD_RQ_LEN as usize];
    let z = zeros.get(..len).ok_or(CommandError::BadAddress { gpa })?;
    mem.write(gpa, z)
        .map_err(|_| CommandError::BadAddress { gpa })
}

impl Device {
    /// The GID table: index 0 the link-local GID from the MAC, index 1 the
    /// IPv4-mapped RoCEv2 GID (as Linux rxe lays it out), then the port's
    /// further IPv6 addresses ([`crate::transport::PortId::gid`]).
    pub fn gid(&self, index: u32) -> Option<Gid> {
        self.res.port.gid(index)
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

    /// Executes the command in `req`, an [`abi::CmdHeader`] and its body,
    /// for the header's context (device spec §5.x.6.13: objects of other
    /// contexts answer `STATUS_ENOENT`, as if they did not exist); the
    /// response body goes to `out`, its length is returned. A failure (a
    /// header shorter than 8 bytes included) is the status
    /// [`CommandError::status`] gives, logged at debug level.
    pub(super) fn command(
        &mut self,
        mem: &dyn DmaMemory,
        req: &[u8],
        out: &mut [u8],
        now: Nanos,
    ) -> Result<usize, Status> {
        let Some(h) = abi::CmdHeader::read_from(req) else {
            let e = CommandError::invalid("command header (shorter than 8 bytes)");
            tracing::debug!(len = req.len(), error = %e, "command failed");
            return Err(e.status());
        };
        let (ctx, opcode) = (h.ctx, h.opcode);
        let args = req.get(8..).unwrap_or_default();
        self.execute(mem, ctx, opcode, args, out, now).map_err(|e| {
            tracing::debug!(ctx, opcode, error = %e, "command failed");
            e.status()
        })
    }

    /// [`Device::command`] before its failure becomes a status: the
    /// context checked, the command decoded, then dispatched.
    fn execute(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        opcode: u16,
        args: &[u8],
        out: &mut [u8],
        now: Nanos,
    ) -> Result<usize, CommandError> {
        if !self.ctxs.is_open(ctx) {
            return Err(CommandError::NotFound(Object::Context(ctx.into())));
        }
        let cmd = Command::decode(opcode, args)?;
        self.dispatch(mem, ctx, cmd, out, now)
    }

    /// Runs `cmd`'s handler for context `ctx`; writes its response body
    /// to `out` and returns its length (0 for commands without one).
    fn dispatch(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        cmd: Command,
        out: &mut [u8],
        now: Nanos,
    ) -> Result<usize, CommandError> {
        let done = |()| 0;
        match cmd {
            Command::QueryDevice => Ok(put(out, &self.query_device())),
            Command::QueryPort(q) => Ok(put(out, &self.query_port(q)?)),
            Command::QueryGid(q) => Ok(put(out, &self.query_gid(q)?)),
            Command::QueryPkey(q) => Ok(put(out, &self.query_pkey(q)?)),
            Command::AllocPd => Ok(put(out, &self.alloc_pd(ctx)?)),
            Command::DeallocPd { pdn } => self.dealloc_pd(ctx, pdn).map(done),
            Command::RegMr(r) => Ok(put(out, &self.reg_mr(mem, ctx, r)?)),
            Command::DeregMr { lkey } => self.dereg_mr(ctx, lkey).map(done),
            Command::CreateCq(c) => Ok(put(out, &self.create_cq(mem, ctx, c)?)),
            Command::DestroyCq { cqn } => self.destroy_cq(ctx, cqn).map(done),
            Command::CreateQp(c) => Ok(put(out, &self.create_qp(mem, ctx, c)?)),
            Command::ModifyQp(a) => self.modify_qp(mem, ctx, a, now).map(done),
            Command::QueryQp { qpn } => Ok(put(out, &self.query_qp(ctx, qpn)?)),
            Command::DestroyQp { qpn } => self.destroy_qp(ctx, qpn).map(done),
            Command::CreateAh(c) => Ok(put(out, &self.create_ah(ctx, c, now)?)),
            Command::DestroyAh { ahn } => self.destroy_ah(ctx, ahn).map(done),
            Command::CreateSrq(c) => Ok(put(out, &self.create_srq(mem, ctx, c)?)),
            Command::ModifySrq(a) => self.modify_srq(ctx, a).map(done),
            Command::QuerySrq { srqn } => Ok(put(out, &self.query_srq(ctx, srqn)?)),
            Command::DestroySrq { srqn } => self.destroy_srq(ctx, srqn).map(done),
            Command::OpenCtx => Ok(put(out, &handle_of(self.open_ctx(ctx)?))),
            Command::CloseCtx { target } => self.close_ctx(ctx, target).map(done),
            Command::QueryUsage => Ok(put(out, &self.query_usage(ctx)?)),
        }
    }
}
