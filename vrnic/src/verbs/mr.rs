//! Memory regions: a virtual address range backed by a list of driver pages
//! (`ibv_reg_mr(3)`; IBTA Vol 1 §10.6), and the keys that name them.

use crate::abi;
use crate::mem::{DmaMemory, MemError};
use crate::verbs::table::{HandleSpace, HandleTable, KeySource};
use crate::verbs::Invalid;

/// Why an access through an MR was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MrError {
    /// The key names no MR, or an MR that was deregistered (stale key bits).
    #[error("no memory region for key {0:#x}")]
    BadKey(u32),
    /// The MR belongs to another protection domain.
    #[error("memory region is in another protection domain")]
    WrongPd,
    /// The MR's access flags do not allow the access.
    #[error("memory region access flags do not allow this access")]
    Access,
    /// The range falls outside the MR.
    #[error("range outside the memory region")]
    Bounds,
    /// The rkey was invalidated by a SEND with invalidate.
    #[error("remote key was invalidated")]
    Invalidated,
    /// The driver memory behind the MR could not be accessed.
    #[error("driver memory: {0}")]
    Mem(#[from] MemError),
}

/// A registered memory region.
#[derive(Debug, Clone)]
pub struct Mr {
    /// Local key (also identifies the MR in commands).
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// Protection domain number.
    pub pdn: u32,
    /// `ibv_access_flags`.
    pub access: u32,
    /// First virtual address.
    pub iova: u64,
    /// Length, bytes.
    pub length: u64,
    /// log2 of the page size.
    pub page_shift: u32,
    /// Guest-physical address of each page.
    pub pages: Vec<u64>,
    /// The rkey was invalidated (SEND with invalidate, IBTA §9.4.1.3):
    /// remote accesses fail from then on; local ones still work.
    pub invalidated: bool,
}

impl Mr {
    /// Checks that `[va, va+len)` lies inside the MR.
    pub fn check_range(&self, va: u64, len: u64) -> Result<(), MrError> {
        let end = va.checked_add(len).ok_or(MrError::Bounds)?;
        let mr_end = self.iova + self.length;
        if va < self.iova || end > mr_end {
            return Err(MrError::Bounds);
        }
        Ok(())
    }

    /// Calls `f(gpa, offset, len)` for each physically contiguous piece of
    /// `[va, va+len)`, in order; `offset` counts bytes from `va`. Pages
    /// that follow each other in guest-physical memory are one piece (a
    /// copy of the bytes of many pages is one call). Errors: the range
    /// is outside the MR, or `f`'s.
    fn for_each_piece(
        &self,
        va: u64,
        len: usize,
        mut f: impl FnMut(u64, usize, usize) -> Result<(), MemError>,
    ) -> Result<(), MrError> {
        self.check_range(va, len as u64)?;
        let page = 1u64 << self.page_shift;
        let base = self.iova & !(page - 1);
        let mut done = 0usize;
        while done < len {
            let cur = va + done as u64;
            let idx = ((cur - base) >> self.page_shift) as usize;
            let in_page = cur & (page - 1);
            let mut n = ((page - in_page) as usize).min(len - done);
            let gpa = self.pages.get(idx).ok_or(MrError::Bounds)? + in_page;
            // The pages after it, while each starts where the piece ends.
            let mut next = idx + 1;
            while done + n < len {
                let end = gpa.checked_add(n as u64);
                match self.pages.get(next) {
                    Some(&p) if Some(p) == end => {
                        n += (page as usize).min(len - done - n);
                        next += 1;
                    }
                    _ => break,
                }
            }
            f(gpa, done, n)?;
            done += n;
        }
        Ok(())
    }

    /// Copies `buf.len()` bytes at `va` of the MR into `buf`.
    pub fn read(&self, mem: &dyn DmaMemory, va: u64, buf: &mut [u8]) -> Result<(), MrError> {
        self.for_each_piece(va, buf.len(), |gpa, off, n| {
            mem.read(gpa, &mut buf[off..off + n])
        })
    }

    /// Copies `data` to `va` of the MR.
    pub fn write(&self, mem: &dyn DmaMemory, va: u64, data: &[u8]) -> Result<(), MrError> {
        self.for_each_piece(va, data.len(), |gpa, off, n| {
            mem.write(gpa, &data[off..off + n])
        })
    }

    /// Copies `data` to `va` of the MR: for a payload in a peer's memory
    /// ([`crate::data::Data::Peer`]) straight from there.
    pub fn write_data(
        &self,
        mem: &dyn DmaMemory,
        va: u64,
        data: crate::data::Data<'_>,
    ) -> Result<(), MrError> {
        self.for_each_piece(va, data.len(), |gpa, off, n| {
            let err = MemError { addr: gpa, len: n };
            data.slice(off, n).ok_or(err)?.write_to(mem, gpa)
        })
    }

    /// Appends the pieces of guest memory behind `len` bytes at `va` of
    /// the MR to `out` ([`crate::data::push_piece`]): a packet by
    /// reference instead of a gather. Errors: the range is outside the MR.
    pub fn pieces(&self, va: u64, len: usize, out: &mut Vec<u8>) -> Result<(), MrError> {
        self.for_each_piece(va, len, |gpa, _, n| {
            crate::data::push_piece(out, gpa, n as u32);
            Ok(())
        })
    }
}

/// The MR table: MRs by key, in a [`HandleTable`] of 24 index bits and 8
/// key bits. A key is `index << 8 | key` as in rxe (`rxe_mr.c`:
/// `mr->lkey = mr->elem.index << 8 | key`): the index is allocated
/// cyclically over `[1, 2^24)`, so a deregistered key names no new MR
/// until 2^24 − 1 more have been registered, and the low byte is drawn
/// from the device's [`KeySource`], so it cannot be predicted from the
/// keys already seen. The lkey and the rkey of an MR are the same key.
#[derive(Debug)]
pub struct MrTable {
    table: HandleTable<Mr>,
    keys: KeySource,
    /// Page-list entries of all live MRs.
    pages: usize,
}

impl MrTable {
    /// An empty table of at most `max` MRs whose key bytes come from `keys`.
    pub fn new(max: usize, keys: KeySource) -> MrTable {
        MrTable {
            table: HandleTable::new(HandleSpace {
                first: 1,
                index_bits: 24,
                key_bits: 8,
                max,
                fixed: None,
            }),
            keys,
            pages: 0,
        }
    }

    /// Page-list entries of all live MRs together (what the device's
    /// page budget, `device::MAX_MR_PAGES_TOTAL`, counts).
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Number of live MRs.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no MR is registered.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Registers `mr` (its keys are assigned here); returns `(lkey, rkey)`.
    /// `None` when the table's maximum of MRs exist.
    pub fn insert(&mut self, mr: Mr) -> Option<(u32, u32)> {
        let key = self.keys.next_u32();
        let npages = mr.pages.len();
        let k = self.table.insert_with(key, |k| Mr {
            lkey: k,
            rkey: k,
            ..mr
        })?;
        self.pages += npages;
        Some((k, k))
    }

    /// The MR named by `key` (lkey or rkey).
    pub fn get(&self, key: u32) -> Result<&Mr, MrError> {
        self.table.get(key).ok_or(MrError::BadKey(key))
    }

    /// Removes the MR named by `lkey`.
    pub fn remove(&mut self, lkey: u32) -> Option<Mr> {
        let mr = self.table.remove(lkey)?;
        self.pages = self.pages.saturating_sub(mr.pages.len());
        Some(mr)
    }

    /// Continues the key allocation and the key source of `old` (the
    /// table a device reset replaces): keys handed out before the reset
    /// stay unused.
    pub fn continue_after(&mut self, old: &MrTable) {
        self.table.continue_after(&old.table);
        self.keys = old.keys.clone();
    }

    /// Invalidates the remote key `rkey` of an MR in `pdn` (the IETH of a
    /// SEND with invalidate, IBTA §9.4.1.3, §10.6.6): later remote accesses
    /// through it fail. `BadKey`/`WrongPd` when it names no MR of `pdn`.
    pub fn invalidate(&mut self, rkey: u32, pdn: u32) -> Result<(), MrError> {
        let mr = self.table.get_mut(rkey).ok_or(MrError::BadKey(rkey))?;
        if mr.pdn != pdn {
            return Err(MrError::WrongPd);
        }
        mr.invalidated = true;
        Ok(())
    }

    /// Removes every MR of `pdn` (a device context closing; device spec
    /// §5.x.6.13). O(MRs).
    pub fn remove_pd(&mut self, pdn: u32) {
        let keys: Vec<u32> = self
            .table
            .values()
            .filter(|m| m.pdn == pdn)
            .map(|m| m.lkey)
            .collect();
        for k in keys {
            self.remove(k);
        }
    }

    /// True when some MR belongs to `pdn`.
    pub fn uses_pd(&self, pdn: u32) -> bool {
        self.table.values().any(|m| m.pdn == pdn)
    }

    /// Looks up `key` for an access by a QP in `pdn` needing `access`
    /// (`abi::ACCESS_*`, 0 for a local read) over `[va, va+len)`.
    pub fn check(
        &self,
        key: u32,
        pdn: u32,
        access: u32,
        va: u64,
        len: u64,
    ) -> Result<&Mr, MrError> {
        let mr = self.get(key)?;
        if mr.pdn != pdn {
            return Err(MrError::WrongPd);
        }
        if mr.access & access != access {
            return Err(MrError::Access);
        }
        let remote = abi::ACCESS_REMOTE_READ | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_ATOMIC;
        if mr.invalidated && access & remote != 0 {
            return Err(MrError::Invalidated);
        }
        mr.check_range(va, len)?;
        Ok(mr)
    }
}

/// Validates a `CMD_REG_MR` request's shape (not its memory): access flag
/// rules of `ibv_reg_mr(3)` (remote write or atomic need local write) and
/// the page list length. Returns which check failed ([`Invalid`]).
pub fn validate_reg(req: &abi::RegMr, max_mr_size: u64) -> Result<(), Invalid> {
    let known = abi::ACCESS_LOCAL_WRITE
        | abi::ACCESS_REMOTE_WRITE
        | abi::ACCESS_REMOTE_READ
        | abi::ACCESS_REMOTE_ATOMIC;
    if req.access & !known != 0 {
        return Err(Invalid("access flags (unknown bits)"));
    }
    if req.access & (abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_ATOMIC) != 0
        && req.access & abi::ACCESS_LOCAL_WRITE == 0
    {
        return Err(Invalid(
            "access flags (remote write or atomic without local write)",
        ));
    }
    if !(12..=30).contains(&req.page_shift) {
        return Err(Invalid("MR page size"));
    }
    if req.length == 0 || req.length > max_mr_size {
        return Err(Invalid("MR length"));
    }
    let page = 1u64 << req.page_shift;
    let end = req
        .iova
        .checked_add(req.length)
        .ok_or(Invalid("MR range"))?;
    let first = req.iova & !(page - 1);
    let npages = (end - first).div_ceil(page);
    if npages != req.npages as u64 {
        return Err(Invalid("MR page count"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;

    fn mr(pages: Vec<u64>) -> Mr {
        Mr {
            lkey: 0,
            rkey: 0,
            pdn: 1,
            access: abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE,
            iova: 0x7000_0800,
            length: 0x1800,
            page_shift: 12,
            pages,
            invalidated: false,
        }
    }

    #[test]
    fn access_crosses_scattered_pages() {
        let mem = VecMemory::new(0, 0x10000);
        // Virtual pages 0x7000_0000 and 0x7000_1000 live at 0x5000 and 0x2000.
        let m = mr(vec![0x5000, 0x2000]);
        let data: Vec<u8> = (0..0x1800u32).map(|i| i as u8).collect();
        m.write(&mem, 0x7000_0800, &data).unwrap();
        let mut first = [0u8; 4];
        mem.read(0x5800, &mut first).unwrap();
        assert_eq!(first, [0, 1, 2, 3]);
        let mut second = [0u8; 1];
        mem.read(0x2000, &mut second).unwrap();
        assert_eq!(second[0], (0x800u32) as u8);
        let mut back = vec![0u8; 0x1800];
        m.read(&mem, 0x7000_0800, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn pages_that_follow_each_other_in_memory_are_one_piece() {
        let pieces = |m: &Mr, va: u64, len: usize| {
            let mut out = Vec::new();
            m.pieces(va, len, &mut out).unwrap();
            out.chunks(crate::data::PIECE_LEN)
                .map(|e| {
                    let gpa = u64::from_be_bytes(e[..8].try_into().unwrap());
                    (gpa, u32::from_be_bytes(e[8..].try_into().unwrap()))
                })
                .collect::<Vec<_>>()
        };
        // Pages at 0x5000, 0x6000 (contiguous), 0x2000, 0x3000 (contiguous).
        let m = Mr {
            length: 0x3800,
            ..mr(vec![0x5000, 0x6000, 0x2000, 0x3000])
        };
        assert_eq!(
            pieces(&m, 0x7000_0800, 0x3800),
            [(0x5800, 0x1800), (0x2000, 0x2000)]
        );
        assert_eq!(pieces(&m, 0x7000_0900, 0x1000), [(0x5900, 0x1000)]);
        assert_eq!(
            pieces(&m, 0x7000_1f00, 0x200),
            [(0x6f00, 0x100), (0x2000, 0x100)]
        );
        // The bytes land where the pages are.
        let mem = VecMemory::new(0, 0x10000);
        let data: Vec<u8> = (0..0x3800u32).map(|i| (i / 7) as u8).collect();
        m.write(&mem, 0x7000_0800, &data).unwrap();
        let mut back = vec![0u8; 0x3800];
        m.read(&mem, 0x7000_0800, &mut back).unwrap();
        assert_eq!(back, data);
        let mut at = vec![0u8; 0x1000];
        mem.read(0x2000, &mut at).unwrap();
        assert_eq!(at, data[0x1800..0x2800]);
    }

    #[test]
    fn out_of_bounds_and_stale_keys_are_rejected() {
        let mut t = MrTable::new(4, KeySource::seeded(7));
        let (lkey, _) = t.insert(mr(vec![0x5000, 0x2000])).unwrap();
        assert!(matches!(
            t.check(lkey, 1, 0, 0x7000_07ff, 1),
            Err(MrError::Bounds)
        ));
        assert!(matches!(
            t.check(lkey, 1, 0, 0x7000_1fff, 2),
            Err(MrError::Bounds)
        ));
        assert!(matches!(
            t.check(lkey, 1, 0, u64::MAX, 2),
            Err(MrError::Bounds)
        ));
        assert!(matches!(
            t.check(lkey, 2, 0, 0x7000_0800, 1),
            Err(MrError::WrongPd)
        ));
        assert!(matches!(
            t.check(lkey, 1, abi::ACCESS_REMOTE_READ, 0x7000_0800, 1),
            Err(MrError::Access)
        ));
        assert!(t
            .check(lkey, 1, abi::ACCESS_REMOTE_WRITE, 0x7000_0800, 0x1800)
            .is_ok());
        t.remove(lkey).unwrap();
        let (lkey2, _) = t.insert(mr(vec![0x5000, 0x2000])).unwrap();
        assert_ne!(lkey, lkey2);
        assert!(matches!(t.get(lkey), Err(MrError::BadKey(_))));
    }

    #[test]
    fn registration_shape_is_validated() {
        let ok = abi::RegMr {
            pdn: 1,
            access: abi::ACCESS_LOCAL_WRITE,
            iova: 0x1800,
            length: 0x1000,
            page_shift: 12,
            npages: 2,
            page_list: 0,
        };
        assert_eq!(validate_reg(&ok, 1 << 30), Ok(()));
        assert!(validate_reg(&abi::RegMr { npages: 1, ..ok }, 1 << 30).is_err());
        assert!(validate_reg(
            &abi::RegMr {
                access: abi::ACCESS_REMOTE_WRITE,
                ..ok
            },
            1 << 30
        )
        .is_err());
        assert!(validate_reg(
            &abi::RegMr {
                iova: u64::MAX,
                ..ok
            },
            1 << 30
        )
        .is_err());
        assert!(validate_reg(
            &abi::RegMr {
                page_shift: 63,
                ..ok
            },
            1 << 30
        )
        .is_err());
    }
}
