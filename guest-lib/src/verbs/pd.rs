//! Protection domains (`ibv_alloc_pd(3)`).

use std::sync::Arc;

use vrnic_abi::{self as abi, command};

use super::{Context, Result};

/// A protection domain (`struct ibv_pd`). Clones share it; the device's PD
/// is deallocated (`ibv_dealloc_pd(3)`, `CMD_DEALLOC_PD`) when the last
/// clone, [`super::Mr`] and [`super::Qp`] using it are dropped.
#[derive(Clone, Debug)]
pub struct Pd {
    inner: Arc<PdInner>,
}

#[derive(Debug)]
struct PdInner {
    ctx: Context,
    pdn: u32,
}

impl Pd {
    /// Allocates a PD (`ibv_alloc_pd(3)`, `CMD_ALLOC_PD`).
    ///
    /// Errors: the device's status, `ENOMEM` when it has `max_pd` PDs.
    pub fn alloc(ctx: &Context) -> Result<Pd> {
        let h: abi::Handle = ctx.execute::<command::AllocPd>(&())?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                ctx: ctx.clone(),
                pdn: h.handle,
            }),
        })
    }

    /// The PD number the device assigned.
    pub fn pdn(&self) -> u32 {
        self.inner.pdn
    }

    /// How many objects (MRs, QPs, SRQs, AHs) still use this PD: each holds
    /// its handle, and the device's PD goes when the last holder does.
    pub fn users(&self) -> usize {
        Arc::strong_count(&self.inner) - 1
    }

    /// The context the PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        self.ctx.destroy::<command::DeallocPd>("PD", self.pdn);
    }
}
