//! Protection domains (`ibv_alloc_pd(3)`, `ibv_dealloc_pd(3)`).

use std::ffi::c_int;

use vrnic_guest::verbs::Pd;

use crate::boundary::{fail_with_errno, ffi};
use crate::context::VrnicContext;
use crate::ffi as c;

/// A PD: the `struct ibv_pd` applications see, first.
#[repr(C)]
pub(crate) struct VrnicPd {
    pub(crate) pd: c::ibv_pd,
    pub(crate) inner: Pd,
}

impl VrnicPd {
    /// The PD of an application's `ibv_pd *` (NULL: `None`).
    ///
    /// # Safety
    /// A non-NULL `pd` must come from [`ibv_alloc_pd`] and be alive.
    pub(crate) unsafe fn from_ptr<'a>(pd: *mut c::ibv_pd) -> Option<&'a VrnicPd> {
        // SAFETY: per the contract, `pd` is the start of a live VrnicPd.
        (!pd.is_null()).then(|| unsafe { &*pd.cast::<VrnicPd>() })
    }
}

/// `ibv_alloc_pd(3)`: a PD (`CMD_ALLOC_PD`), or NULL with errno.
pub(crate) extern "C" fn ibv_alloc_pd(context: *mut c::ibv_context) -> *mut c::ibv_pd {
    ffi("ibv_alloc_pd", std::ptr::null_mut(), || {
        // SAFETY: the application passes a context from ibv_open_device or NULL.
        let Some(ctx) = (unsafe { VrnicContext::from_ptr(context) }) else {
            return fail_with_errno(libc::EINVAL);
        };
        match Pd::alloc(&ctx.verbs) {
            Ok(inner) => {
                let pd = c::ibv_pd {
                    context,
                    handle: inner.pdn(),
                };
                Box::into_raw(Box::new(VrnicPd { pd, inner })).cast()
            }
            Err(e) => fail_with_errno(e.errno()),
        }
    })
}

/// `ibv_dealloc_pd(3)`: 0; `EINVAL` for NULL; `EBUSY`, the PD kept, while
/// an MR, QP, SRQ or AH still uses it (as the kernel's uverbs answers,
/// `ib_destroy_usecnt`, and the device's `CMD_DEALLOC_PD` would).
pub(crate) extern "C" fn ibv_dealloc_pd(pd: *mut c::ibv_pd) -> c_int {
    ffi("ibv_dealloc_pd", libc::EIO, || {
        // SAFETY: the application passes a PD from ibv_alloc_pd or NULL.
        let Some(p) = (unsafe { VrnicPd::from_ptr(pd) }) else {
            return libc::EINVAL;
        };
        if p.inner.users() > 0 {
            return libc::EBUSY;
        }
        // SAFETY: `pd` is the start of a VrnicPd boxed by ibv_alloc_pd, freed once.
        drop(unsafe { Box::from_raw(pd.cast::<VrnicPd>()) });
        0
    })
}
