//! Device contexts (device spec §5.x.6.13): several programs share one
//! device, each through a context of its own, the way the kernel's
//! `uverbs` gives every open file its own objects.
//!
//! Ownership follows the objects' own links: a PD and a CQ record the
//! context that created them; an MR, QP, AH or SRQ belongs to the context
//! of its PD. A command or doorbell may name only objects of its context
//! (others answer `STATUS_ENOENT` or are ignored, as if they did not
//! exist), and [`abi::CMD_CLOSE_CTX`] destroys everything a context owns.

use super::control::{CommandError, Object};
use super::*;

/// Which device contexts are open: [`abi::DEFAULT_CTX`] always, others
/// from [`abi::CMD_OPEN_CTX`] to [`abi::CMD_CLOSE_CTX`]. Numbers are
/// handed out cyclically, so a closed context's number is not reused
/// until the other [`abi::MAX_CTX`]` - 2` have been.
#[derive(Debug, Clone)]
pub struct Contexts {
    open: Vec<bool>,
    next: usize,
}

impl Default for Contexts {
    fn default() -> Self {
        let mut open = vec![false; abi::MAX_CTX];
        open[usize::from(abi::DEFAULT_CTX)] = true;
        Contexts { open, next: 1 }
    }
}

impl Contexts {
    /// True when `ctx` is open.
    pub(super) fn is_open(&self, ctx: u16) -> bool {
        self.open.get(usize::from(ctx)).copied().unwrap_or(false)
    }

    /// Number of open contexts, [`abi::DEFAULT_CTX`] included.
    pub(super) fn count(&self) -> usize {
        self.open.iter().filter(|o| **o).count()
    }

    /// Opens the next free context; `None` when all [`abi::MAX_CTX`] are open.
    fn open(&mut self) -> Option<u16> {
        for i in 0..abi::MAX_CTX {
            let c = (self.next + i) % abi::MAX_CTX;
            if c != usize::from(abi::DEFAULT_CTX) && !self.open[c] {
                self.open[c] = true;
                self.next = (c + 1) % abi::MAX_CTX;
                return u16::try_from(c).ok();
            }
        }
        None
    }

    /// Keeps the cyclic position of `old` (across a device reset).
    pub(super) fn continue_after(&mut self, old: &Contexts) {
        self.next = old.next;
    }
}

/// Who owns the object a doorbell names ([`Device::doorbell_owner`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// The doorbell's own context.
    Ringer,
    /// Another context: the doorbell is foreign.
    Other,
    /// Nobody: no such object, or a kind the device does not know.
    None,
}

impl Device {
    /// Who owns the QP (`DB_SQ`, `DB_RQ`), SRQ (`DB_SRQ`) or CQ
    /// (`DB_CQ_ARM*`) that doorbell `db` names, relative to its
    /// [`abi::Doorbell::ctx`].
    pub(super) fn doorbell_owner(&self, db: &abi::Doorbell) -> Owner {
        let owner = match db.kind {
            abi::DB_SQ | abi::DB_RQ => self.qps.get(db.handle).and_then(|q| self.pd_ctx(q.pdn)),
            abi::DB_SRQ => self
                .res
                .srqs
                .get(db.handle)
                .and_then(|s| self.pd_ctx(s.pdn)),
            abi::DB_CQ_ARM | abi::DB_CQ_ARM_SOLICITED => self.res.cqs.get(db.handle).map(|c| c.ctx),
            _ => None,
        };
        match owner {
            Some(c) if c == db.ctx => Owner::Ringer,
            Some(_) => Owner::Other,
            None => Owner::None,
        }
    }

    /// The context owning PD `pdn`, if it exists.
    pub(super) fn pd_ctx(&self, pdn: u32) -> Option<u16> {
        self.res.pds.get(pdn).copied()
    }

    /// True when PD `pdn` exists and `ctx` owns it.
    pub(super) fn owns_pd(&self, ctx: u16, pdn: u32) -> bool {
        self.pd_ctx(pdn) == Some(ctx)
    }

    /// True when CQ `cqn` exists and `ctx` owns it.
    pub(super) fn owns_cq(&self, ctx: u16, cqn: u32) -> bool {
        self.res.cqs.get(cqn).is_some_and(|c| c.ctx == ctx)
    }

    /// True when QP `qpn` exists and `ctx` owns it (through its PD).
    pub(super) fn owns_qp(&self, ctx: u16, qpn: u32) -> bool {
        self.qps.get(qpn).is_some_and(|q| self.owns_pd(ctx, q.pdn))
    }

    /// True when SRQ `srqn` exists and `ctx` owns it (through its PD).
    pub(super) fn owns_srq(&self, ctx: u16, srqn: u32) -> bool {
        self.res
            .srqs
            .get(srqn)
            .is_some_and(|s| self.owns_pd(ctx, s.pdn))
    }

    /// True when AH `ahn` exists and `ctx` owns it (through its PD).
    pub(super) fn owns_ah(&self, ctx: u16, ahn: u32) -> bool {
        self.res
            .ahs
            .get(ahn)
            .is_some_and(|a| self.owns_pd(ctx, a.pdn))
    }

    /// True when the MR with local key `lkey` exists and `ctx` owns it
    /// (through its PD).
    pub(super) fn owns_mr(&self, ctx: u16, lkey: u32) -> bool {
        self.res
            .mrs
            .get(lkey)
            .is_ok_and(|m| self.owns_pd(ctx, m.pdn))
    }

    /// The context an event is for: the owner of the CQ, QP or SRQ it
    /// names; [`abi::ALL_CTX`] for a device event; `None` when the object
    /// is gone (the event is then dropped: nobody can act on it).
    pub(super) fn event_ctx(&self, ev: &abi::Event) -> Option<u16> {
        match ev.kind {
            abi::EV_COMP | abi::EV_CQ_ERR => self.res.cqs.get(ev.handle).map(|c| c.ctx),
            abi::EV_SRQ_LIMIT => self
                .res
                .srqs
                .get(ev.handle)
                .and_then(|s| self.pd_ctx(s.pdn)),
            abi::EV_DEVICE_FATAL => Some(abi::ALL_CTX),
            _ => self.qps.get(ev.handle).and_then(|q| self.pd_ctx(q.pdn)),
        }
    }

    /// Number of open device contexts, [`abi::DEFAULT_CTX`] included.
    pub fn context_count(&self) -> usize {
        self.ctxs.count()
    }

    /// Numbers of live objects `(PDs, MRs, CQs, QPs, AHs, SRQs)`, over all
    /// contexts: what a closed context must give back.
    pub fn object_counts(&self) -> [usize; 6] {
        [
            self.res.pds.len(),
            self.res.mrs.len(),
            self.res.cqs.len(),
            self.qps.len(),
            self.res.ahs.len(),
            self.res.srqs.len(),
        ]
    }

    /// `CMD_OPEN_CTX` from context `ctx`.
    pub(super) fn open_ctx(&mut self, ctx: u16) -> Result<u32, CommandError> {
        if ctx != abi::DEFAULT_CTX {
            return Err(CommandError::NotDefaultContext { ctx });
        }
        self.ctxs
            .open()
            .map(u32::from)
            .ok_or(CommandError::no_resources("contexts"))
    }

    /// `CMD_CLOSE_CTX` of `target` from context `ctx`: destroys the
    /// target's QPs (releasing their responder resources and ending the
    /// watch of their doorbell records), SRQs, CQs, AHs,
    /// MRs and PDs, in that order, then frees its number. Bounded by the
    /// device's object limits.
    pub(super) fn close_ctx(&mut self, ctx: u16, target: u32) -> Result<(), CommandError> {
        if ctx != abi::DEFAULT_CTX {
            return Err(CommandError::NotDefaultContext { ctx });
        }
        let Ok(target) = u16::try_from(target) else {
            return Err(CommandError::invalid("context number"));
        };
        if target == abi::DEFAULT_CTX {
            return Err(CommandError::invalid("context (the default one)"));
        }
        if !self.ctxs.is_open(target) {
            return Err(CommandError::NotFound(Object::Context(target.into())));
        }
        let qpns: Vec<u32> = self
            .qps
            .values()
            .filter(|q| self.owns_pd(target, q.pdn))
            .map(|q| q.qpn)
            .collect();
        for qpn in qpns {
            self.remove_qp(qpn);
        }
        let pds = &self.res.pds;
        let owns_pd = |pdn: u32| pds.get(pdn) == Some(&target);
        self.res.srqs.remove_where(|s| owns_pd(s.pdn));
        self.res.cqs.remove_where(|c| c.ctx == target);
        self.res.ahs.remove_where(|a| owns_pd(a.pdn));
        let pdns: Vec<u32> = self
            .res
            .pds
            .iter()
            .filter(|(_, c)| **c == target)
            .map(|(pdn, _)| pdn)
            .collect();
        for pdn in &pdns {
            self.res.mrs.remove_pd(*pdn);
            self.res.pds.remove(*pdn);
        }
        self.ctxs.open[usize::from(target)] = false;
        Ok(())
    }
}
