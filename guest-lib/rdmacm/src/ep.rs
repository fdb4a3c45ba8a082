//! Endpoints, the synchronous interface of `<rdma/rdma_verbs.h>`:
//! `rdma_create_ep(3)`, `rdma_destroy_ep(3)`, `rdma_get_request(3)`
//! (rdma-core `librdmacm/cma.c`).

use std::ffi::c_int;

use crate::boundary::{fail, ffi};
use crate::ffi::*;
use crate::id::{self, cm};
use crate::qp::{create_qp, rdma_destroy_qp, rdma_destroy_srq};
use crate::{addr, events, route};

/// `rdma_getaddrinfo`'s resolution timeout of rdma-core's `rdma_create_ep`.
const EP_TIMEOUT_MS: c_int = 2000;

/// `rdma_create_ep(3)`'s work.
fn create_ep(
    res: &rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> Result<*mut rdma_cm_id, c_int> {
    let cm = id::create(
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        res.ai_port_space as rdma_port_space,
        res.ai_qp_type as ibv_qp_type,
    )?;
    // SAFETY: the id just made.
    let idp = unsafe { &mut (*cm).id as *mut rdma_cm_id };
    let r = (|| {
        // SAFETY: the id just made.
        let c = unsafe { &mut *cm };
        if res.ai_flags & RAI_PASSIVE as c_int != 0 {
            // rdma-core's ucma_passive_ep.
            addr::bind(idp, res.ai_src_addr)?;
            if !pd.is_null() {
                c.id.pd = pd;
            }
            if !qp_init_attr.is_null() {
                // SAFETY: the application's attributes.
                let mut a = unsafe { *qp_init_attr };
                a.qp_type = res.ai_qp_type as ibv_qp_type;
                c.qp_init_attr = Some(a);
            }
            return Ok(());
        }
        addr::resolve(idp, res.ai_src_addr, res.ai_dst_addr, EP_TIMEOUT_MS)?;
        if res.ai_route_len > 0 {
            let r = crate::id::rdma_set_option(
                idp,
                RDMA_OPTION_IB as c_int,
                RDMA_OPTION_IB_PATH as c_int,
                res.ai_route,
                res.ai_route_len,
            );
            if r != 0 {
                return Err(crate::boundary::errno_or(libc::EINVAL));
            }
            events::complete(c)?;
        } else {
            route::resolve(idp, EP_TIMEOUT_MS)?;
        }
        if !qp_init_attr.is_null() {
            // SAFETY: the application's attributes.
            let a = unsafe { &mut *qp_init_attr };
            a.qp_type = res.ai_qp_type as ibv_qp_type;
            create_qp(idp, pd, a)?;
        }
        if res.ai_connect_len > 0 && !res.ai_connect.is_null() {
            // SAFETY: ai_connect holds ai_connect_len bytes.
            c.connect = unsafe {
                std::slice::from_raw_parts(res.ai_connect.cast::<u8>(), res.ai_connect_len)
            }
            .to_vec();
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(idp),
        Err(e) => {
            rdma_destroy_ep(idp);
            Err(e)
        }
    }
}

/// `rdma_create_ep(3)`: a synchronous id for `res` (from
/// `rdma_getaddrinfo(3)`): passive (`RAI_PASSIVE`): bound to the source,
/// the QP attributes kept for `rdma_get_request(3)`; active: address and
/// route resolved (2 s each) and, with `qp_init_attr`, a QP created.
/// NULL `id` or `res`: `EINVAL`.
pub(crate) extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi("rdma_create_ep", || {
        if id.is_null() || res.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's address information.
        match create_ep(unsafe { &*res }, pd, qp_init_attr) {
            Ok(i) => {
                // SAFETY: non-NULL, the caller's pointer.
                unsafe { *id = i };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_ep(3)`: destroys an endpoint's QP and SRQ, then the id.
/// NULL: `EINVAL`, nothing done.
pub(crate) extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    ffi("rdma_destroy_ep", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an id of this library.
        let c = unsafe { cm(id) };
        if !c.id.qp.is_null() {
            rdma_destroy_qp(id);
        }
        if !c.id.srq.is_null() {
            rdma_destroy_srq(id);
        }
        c.qp_init_attr = None;
        crate::id::rdma_destroy_id(id);
    })
}

/// `rdma_get_request(3)`: the next connection request of a synchronous
/// listener, as a new id (with a QP when the listener was made by
/// `rdma_create_ep` with QP attributes). `EINVAL` for an asynchronous
/// listener or an event other than a request; `ECONNREFUSED` for a
/// rejection; the event's status otherwise.
pub(crate) extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    ffi("rdma_get_request", || {
        if listen.is_null() || id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an id of this library.
        let l = unsafe { cm(listen) };
        if !l.sync {
            return fail(libc::EINVAL);
        }
        if !l.id.event.is_null() {
            events::ack(l.id.event);
            l.id.event = std::ptr::null_mut();
        }
        let ev = match events::get(l.channel()) {
            Ok(e) => e,
            Err(e) => return fail(e),
        };
        // SAFETY: the event just fetched.
        let e = unsafe { &*ev };
        let r = if e.event == RDMA_CM_EVENT_REJECTED {
            Err(libc::ECONNREFUSED)
        } else if e.status != 0 {
            Err(-e.status)
        } else if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            Err(libc::EINVAL)
        } else if let Some(mut attr) = l.qp_init_attr {
            create_qp(e.id, l.id.pd, &mut attr)
        } else {
            Ok(())
        };
        match r {
            Ok(()) => {
                // SAFETY: the new id of the request; the caller's pointer.
                unsafe {
                    (*e.id).event = ev;
                    *id = e.id;
                }
                0
            }
            Err(err) => {
                l.id.event = ev;
                fail(err)
            }
        }
    })
}
