//! Address handles for UD (`ibv_create_ah(3)`, `ibv_destroy_ah(3)`).

use std::ffi::c_int;

use vrnic_guest::verbs::{Ah, AhAttr, Gid};

use crate::boundary::{ffi, set_errno};
use crate::ffi as c;
use crate::pd::VrnicPd;

/// An AH: the `struct ibv_ah` applications see, first.
#[repr(C)]
pub(crate) struct VrnicAh {
    pub(crate) ah: c::ibv_ah,
    pub(crate) inner: Ah,
}

/// The device handle of an application's `ibv_ah *` (NULL: `None`).
///
/// # Safety
/// A non-NULL `ah` must come from [`ibv_create_ah`] and be alive.
pub(crate) unsafe fn handle_of(ah: *mut c::ibv_ah) -> Option<u32> {
    // SAFETY: per the contract, `ah` is the start of a live VrnicAh.
    (!ah.is_null()).then(|| unsafe { (*ah.cast::<VrnicAh>()).inner.handle() })
}

/// `ibv_create_ah(3)`: an AH for `attr` (RoCE: `is_global` with the GRH's
/// destination GID); the AH, or NULL with errno.
pub(crate) extern "C" fn ibv_create_ah(
    pd: *mut c::ibv_pd,
    attr: *mut c::ibv_ah_attr,
) -> *mut c::ibv_ah {
    ffi("ibv_create_ah", std::ptr::null_mut(), || {
        // SAFETY: the application passes a live PD or NULL.
        let Some(vpd) = (unsafe { VrnicPd::from_ptr(pd) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: non-NULL (checked), the caller's attributes.
        let a = unsafe { &*attr };
        let aa = AhAttr {
            // SAFETY: every bit pattern of the GID union is a valid byte array.
            dgid: Gid {
                raw: unsafe { a.grh.dgid.raw },
            },
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
            sl: a.sl,
            is_global: a.is_global != 0,
            port_num: a.port_num,
        };
        match Ah::new(&vpd.inner, &aa) {
            Ok(inner) => {
                let ah = c::ibv_ah {
                    context: vpd.pd.context,
                    pd,
                    handle: inner.handle(),
                };
                Box::into_raw(Box::new(VrnicAh { ah, inner })).cast()
            }
            Err(e) => {
                set_errno(e.errno());
                std::ptr::null_mut()
            }
        }
    })
}

/// `ibv_destroy_ah(3)`: 0, or `EINVAL` for NULL.
pub(crate) extern "C" fn ibv_destroy_ah(ah: *mut c::ibv_ah) -> c_int {
    ffi("ibv_destroy_ah", libc::EIO, || {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `ah` is the start of a VrnicAh boxed by ibv_create_ah, freed once.
        drop(unsafe { Box::from_raw(ah.cast::<VrnicAh>()) });
        0
    })
}
