//! Shared receive queues: `ibv_create_srq(3)`, `ibv_modify_srq(3)`,
//! `ibv_query_srq(3)`, `ibv_destroy_srq(3)` and the inline fast path's
//! `ops.post_srq_recv` (`ibv_post_srq_recv(3)`).

use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use vrnic_guest::verbs::{Srq, SrqAttr, SrqInitAttr};

use crate::boundary::{fail_with_errno, ffi};
use crate::context::VrnicContext;
use crate::events::{lock, Events};
use crate::ffi as c;
use crate::pd::VrnicPd;
use crate::qp::post_recv_list;

/// An SRQ: the `struct ibv_srq` applications see, first.
#[repr(C)]
pub(crate) struct VrnicSrq {
    pub(crate) srq: c::ibv_srq,
    pub(crate) inner: Mutex<Srq>,
    /// The context's event tables (see `VrnicCq::events`).
    events: Arc<Events>,
}

impl VrnicSrq {
    /// The SRQ of an application's `ibv_srq *` (NULL: `None`).
    ///
    /// # Safety
    /// A non-NULL `srq` must come from [`ibv_create_srq`] and be alive.
    pub(crate) unsafe fn from_ptr<'a>(srq: *mut c::ibv_srq) -> Option<&'a VrnicSrq> {
        // SAFETY: per the contract, `srq` is the start of a live VrnicSrq.
        (!srq.is_null()).then(|| unsafe { &*srq.cast::<VrnicSrq>() })
    }
}

/// `ibv_create_srq(3)`: an SRQ on `pd`; the sizes obtained are written back
/// to `init->attr`. The SRQ, or NULL with errno.
pub(crate) extern "C" fn ibv_create_srq(
    pd: *mut c::ibv_pd,
    init: *mut c::ibv_srq_init_attr,
) -> *mut c::ibv_srq {
    ffi("ibv_create_srq", std::ptr::null_mut(), || {
        // SAFETY: the application passes a live PD or NULL.
        let Some(vpd) = (unsafe { VrnicPd::from_ptr(pd) }) else {
            return fail_with_errno(libc::EINVAL);
        };
        if init.is_null() {
            return fail_with_errno(libc::EINVAL);
        }
        // SAFETY: the PD's context is open (objects are created on open contexts).
        let Some(ctx) = (unsafe { VrnicContext::from_ptr(vpd.pd.context) }) else {
            return fail_with_errno(libc::EINVAL);
        };
        // SAFETY: non-NULL (checked), the caller's init attributes.
        let ia = unsafe { &mut *init };
        let attr = SrqInitAttr {
            max_wr: ia.attr.max_wr,
            max_sge: ia.attr.max_sge,
            srq_limit: ia.attr.srq_limit,
        };
        let inner = match Srq::new(&vpd.inner, &attr) {
            Ok(s) => s,
            Err(e) => {
                return fail_with_errno(e.errno());
            }
        };
        ia.attr.max_wr = inner.max_wr();
        ia.attr.max_sge = inner.max_sge();
        let srqn = inner.srq_num();
        let context = vpd.pd.context;
        let srq = c::ibv_srq {
            context,
            srq_context: ia.srq_context,
            pd,
            handle: srqn,
            ..Default::default()
        };
        let p = Box::into_raw(Box::new(VrnicSrq {
            srq,
            inner: Mutex::new(inner),
            events: ctx.events.events.clone(),
        }))
        .cast::<c::ibv_srq>();
        ctx.events.events.add_srq(srqn, p);
        p
    })
}

/// `ibv_modify_srq(3)`: arms the limit (`IBV_SRQ_LIMIT`); resizing
/// (`IBV_SRQ_MAX_WR`) is refused by the device. 0 or an errno.
pub(crate) extern "C" fn ibv_modify_srq(
    srq: *mut c::ibv_srq,
    attr: *mut c::ibv_srq_attr,
    mask: c_int,
) -> c_int {
    ffi("ibv_modify_srq", libc::EIO, || {
        // SAFETY: the application passes a live SRQ or NULL.
        let Some(v) = (unsafe { VrnicSrq::from_ptr(srq) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL (checked), the caller's attributes.
        let a = unsafe { &*attr };
        let sa = SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        match lock(&v.inner).modify(&sa, mask as u32) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_query_srq(3)`: the SRQ's sizes and limit; 0 or an errno.
pub(crate) extern "C" fn ibv_query_srq(srq: *mut c::ibv_srq, attr: *mut c::ibv_srq_attr) -> c_int {
    ffi("ibv_query_srq", libc::EIO, || {
        // SAFETY: the application passes a live SRQ or NULL.
        let Some(v) = (unsafe { VrnicSrq::from_ptr(srq) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        match lock(&v.inner).query() {
            Ok(a) => {
                let out = c::ibv_srq_attr {
                    max_wr: a.max_wr,
                    max_sge: a.max_sge,
                    srq_limit: a.srq_limit,
                };
                // SAFETY: non-NULL (checked), the caller's structure.
                unsafe { attr.write(out) };
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_destroy_srq(3)`: 0, or `EINVAL` for NULL. The device's SRQ goes
/// when the last QP using it is gone.
pub(crate) extern "C" fn ibv_destroy_srq(srq: *mut c::ibv_srq) -> c_int {
    ffi("ibv_destroy_srq", libc::EIO, || {
        if srq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `srq` is the start of a VrnicSrq boxed by ibv_create_srq, freed once.
        let b = unsafe { Box::from_raw(srq.cast::<VrnicSrq>()) };
        b.events.remove_srq(b.srq.handle, srq);
        drop(b);
        0
    })
}

/// `ops.post_srq_recv` (`ibv_post_srq_recv(3)`): posts the list `wr`; 0,
/// or an errno with `*bad_wr` the first work request not posted.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut c::ibv_srq,
    wr: *mut c::ibv_recv_wr,
    bad_wr: *mut *mut c::ibv_recv_wr,
) -> c_int {
    ffi("ibv_post_srq_recv", libc::EIO, || {
        // SAFETY: the application passes a live SRQ.
        let Some(v) = (unsafe { VrnicSrq::from_ptr(srq) }) else {
            return libc::EINVAL;
        };
        let mut inner = lock(&v.inner);
        // SAFETY: the application's list and bad_wr (ibv_post_srq_recv(3)).
        unsafe { post_recv_list(wr, bad_wr, |r| inner.post_recv(r).map_err(|e| e.errno())) }
    })
}
