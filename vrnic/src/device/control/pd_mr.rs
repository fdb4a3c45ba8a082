//! Protection domains and memory regions: `CMD_ALLOC_PD`,
//! `CMD_DEALLOC_PD` (`ibv_alloc_pd(3)`), `CMD_REG_MR`, `CMD_DEREG_MR`
//! (`ibv_reg_mr(3)`).

use super::*;
use crate::verbs::mr::{validate_reg, Mr};

impl Device {
    /// `CMD_ALLOC_PD`: a PD owned by context `ctx`.
    pub(super) fn alloc_pd(&mut self, ctx: u16) -> Result<abi::Handle, CommandError> {
        if self.res.pds.len() >= MAX_PD {
            return Err(CommandError::no_resources("PDs"));
        }
        let pdn = self
            .res
            .pds
            .insert_with(0, |_| ctx)
            .ok_or(CommandError::no_resources("PD numbers"))?;
        Ok(handle_of(pdn))
    }

    /// `CMD_DEALLOC_PD`: fails while an MR, QP, AH or SRQ uses the PD
    /// (`ibv_dealloc_pd(3)`: `EBUSY`).
    pub(super) fn dealloc_pd(&mut self, ctx: u16, pdn: u32) -> Result<(), CommandError> {
        if !self.owns_pd(ctx, pdn) {
            return Err(CommandError::NotFound(Object::Pd(pdn)));
        }
        if self.res.mrs.uses_pd(pdn)
            || self.qps.values().any(|q| q.pdn == pdn)
            || self.res.ahs.values().any(|a| a.pdn == pdn)
            || self.res.srqs.values().any(|s| s.pdn == pdn)
        {
            return Err(CommandError::InUse(Object::Pd(pdn)));
        }
        self.res.pds.remove(pdn);
        Ok(())
    }

    /// `CMD_REG_MR`: checks the request ([`validate_reg`]), the device's
    /// MR limits, then reads and checks the page list.
    pub(super) fn reg_mr(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        r: abi::RegMr,
    ) -> Result<abi::MrKeys, CommandError> {
        if !self.owns_pd(ctx, r.pdn) {
            return Err(CommandError::NotFound(Object::Pd(r.pdn)));
        }
        validate_reg(&r, MAX_MR_SIZE).map_err(|e| CommandError::invalid(e.0))?;
        self.check_mr_limits(&r)?;
        let pages = read_page_list(mem, &r)?;
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
        let (lkey, rkey) = self
            .res
            .mrs
            .insert(mr)
            .ok_or(CommandError::no_resources("MR keys"))?;
        Ok(abi::MrKeys { lkey, rkey })
    }

    /// One MR beyond the per-MR maximum ([`MAX_MR_PAGES`]) is invalid;
    /// past the device's count ([`MAX_MR`]) or page budget
    /// ([`MAX_MR_PAGES_TOTAL`]) the device is out of resources
    /// (`ENOMEM`, [`CommandError::NoResources`]). Both before any work on
    /// the page list.
    fn check_mr_limits(&self, r: &abi::RegMr) -> Result<(), CommandError> {
        if r.npages > MAX_MR_PAGES {
            return Err(CommandError::invalid("MR page count"));
        }
        if self.res.mrs.len() >= MAX_MR {
            return Err(CommandError::no_resources("MRs"));
        }
        let npages = r.npages as usize;
        if self.res.mrs.pages().saturating_add(npages) > MAX_MR_PAGES_TOTAL as usize {
            return Err(CommandError::no_resources("MR pages"));
        }
        Ok(())
    }

    /// `CMD_DEREG_MR` of the MR with local key `lkey`.
    pub(super) fn dereg_mr(&mut self, ctx: u16, lkey: u32) -> Result<(), CommandError> {
        if !self.owns_mr(ctx, lkey) {
            return Err(CommandError::NotFound(Object::Mr(lkey)));
        }
        self.res
            .mrs
            .remove(lkey)
            .ok_or(CommandError::NotFound(Object::Mr(lkey)))?;
        Ok(())
    }
}

/// Reads `r`'s page list (`r.npages` little-endian addresses at
/// `r.page_list`), a page of entries at a time: the only copy of the list
/// the daemon keeps is the result (8 bytes an entry). Every entry must be
/// page-aligned and name driver memory: checked now, so a bad page list is
/// rejected at registration rather than at first use.
fn read_page_list(mem: &dyn DmaMemory, r: &abi::RegMr) -> Result<Vec<u64>, CommandError> {
    let npages = r.npages as usize;
    let page = 1u64 << r.page_shift;
    probe(mem, r.page_list, r.npages as u64 * 8)?;
    let mut pages = Vec::with_capacity(npages);
    let mut chunk = [0u8; 4096];
    let mut gpa = r.page_list;
    while pages.len() < npages {
        let n = (npages - pages.len()).min(chunk.len() / 8);
        let raw = &mut chunk[..n * 8];
        mem.read(gpa, raw)
            .map_err(|_| CommandError::BadAddress { gpa })?;
        gpa = gpa
            .checked_add(raw.len() as u64)
            .ok_or(CommandError::BadAddress { gpa })?;
        for entry in raw.chunks_exact(8) {
            let p = u64::from_le_bytes(entry.try_into().expect("8-byte chunk"));
            if p & (page - 1) != 0 {
                return Err(CommandError::invalid("MR page address (unaligned)"));
            }
            probe(mem, p, page)?;
            pages.push(p);
        }
    }
    Ok(pages)
}
