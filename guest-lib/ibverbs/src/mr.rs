//! Memory regions (`ibv_reg_mr(3)`, `ibv_reg_mr_iova2(3)`, `ibv_dereg_mr(3)`)
//! over the application's own memory (guest-lib's `Mr::register_raw`: the
//! pages are locked and, on the loopback transport, made reachable by the
//! in-process device until deregistration).

use std::ffi::{c_int, c_uint, c_void};

use vrnic_guest::verbs::Mr;

use crate::boundary::{fail_with_errno, ffi};
use crate::ffi as c;
use crate::pd::VrnicPd;

/// An MR: the `struct ibv_mr` applications see, first.
#[repr(C)]
pub(crate) struct VrnicMr {
    pub(crate) mr: c::ibv_mr,
    pub(crate) inner: Mr<'static>,
}

/// The access flags vrnic implements (`IBV_ACCESS_LOCAL_WRITE`,
/// `REMOTE_WRITE`, `REMOTE_READ`, `REMOTE_ATOMIC`).
const SUPPORTED: u32 = 0xf;
/// Flags accepted and ignored: `IBV_ACCESS_MW_BIND` (no memory windows to
/// bind), `IBV_ACCESS_HUGETLB` (a hint), and the optional range
/// (`IBV_ACCESS_OPTIONAL_RANGE`: `IBV_ACCESS_RELAXED_ORDERING` and the
/// like, which a device may ignore by definition).
const IGNORED: u32 = c::ibv_access_flags_IBV_ACCESS_MW_BIND
    | c::ibv_access_flags_IBV_ACCESS_HUGETLB
    | c::ib_uverbs_access_flags_IB_UVERBS_ACCESS_OPTIONAL_RANGE;

fn reg(
    pd: *mut c::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut c::ibv_mr {
    // SAFETY: the application passes a PD from ibv_alloc_pd or NULL.
    let Some(vpd) = (unsafe { VrnicPd::from_ptr(pd) }) else {
        return fail_with_errno(libc::EINVAL);
    };
    if addr.is_null() || length == 0 {
        return fail_with_errno(libc::EINVAL);
    }
    if access & !(SUPPORTED | IGNORED) != 0 || iova != addr as u64 {
        // On-demand paging, zero-based and other-than-VA iovas: not in vrnic.
        return fail_with_errno(libc::EOPNOTSUPP);
    }
    // SAFETY: the application keeps [addr, addr + length) mapped while the
    // MR exists (ibv_reg_mr(3)); guest-lib locks the pages.
    match unsafe { Mr::register_raw(&vpd.inner, addr.cast(), length, access & SUPPORTED) } {
        Ok(inner) => {
            let mr = c::ibv_mr {
                context: vpd.pd.context,
                pd,
                addr,
                length,
                handle: inner.lkey(),
                lkey: inner.lkey(),
                rkey: inner.rkey(),
            };
            Box::into_raw(Box::new(VrnicMr { mr, inner })).cast()
        }
        Err(e) => fail_with_errno(e.errno()),
    }
}

/// `ibv_reg_mr(3)` (the exported function behind verbs.h's `ibv_reg_mr`
/// macro): registers `[addr, addr + length)`; the MR, or NULL with errno.
pub(crate) extern "C" fn ibv_reg_mr(
    pd: *mut c::ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut c::ibv_mr {
    ffi("ibv_reg_mr", std::ptr::null_mut(), || {
        reg(pd, addr, length, addr as u64, access as u32)
    })
}

/// `ibv_reg_mr_iova2(3)`: as [`ibv_reg_mr`] with an iova, which on vrnic
/// must equal `addr` (`EOPNOTSUPP` otherwise).
pub(crate) extern "C" fn ibv_reg_mr_iova2(
    pd: *mut c::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut c::ibv_mr {
    ffi("ibv_reg_mr_iova2", std::ptr::null_mut(), || {
        reg(pd, addr, length, iova, access)
    })
}

/// `ibv_reg_mr_iova(3)`: [`ibv_reg_mr_iova2`] with `int` access flags.
pub(crate) extern "C" fn ibv_reg_mr_iova(
    pd: *mut c::ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut c::ibv_mr {
    ffi("ibv_reg_mr_iova", std::ptr::null_mut(), || {
        reg(pd, addr, length, iova, access as u32)
    })
}

/// `ibv_dereg_mr(3)`: deregisters (`CMD_DEREG_MR`), unlocks the pages; 0,
/// or `EINVAL` for NULL.
pub(crate) extern "C" fn ibv_dereg_mr(mr: *mut c::ibv_mr) -> c_int {
    ffi("ibv_dereg_mr", libc::EIO, || {
        if mr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `mr` is the start of a VrnicMr boxed by reg, freed once.
        drop(unsafe { Box::from_raw(mr.cast::<VrnicMr>()) });
        0
    })
}
