//! `rdma_getaddrinfo(3)`, `rdma_freeaddrinfo(3)`: a port of rdma-core's
//! `librdmacm/addrinfo.c` (v44.0).
//!
//! As there, the name and service go through libc's `getaddrinfo(3)`
//! (numeric or not), with hints converted from the `rdma_addrinfo` hints
//! (`RAI_PASSIVE` → `AI_PASSIVE`, `RAI_NUMERICHOST` → `AI_NUMERICHOST`,
//! the QP type to a socket type, the port space to a protocol), and the
//! first result converted back: `ai_qp_type` and `ai_port_space` from the
//! hints when set, else from the socket type (stream: RC, datagram: UD) and
//! protocol (TCP: `RDMA_PS_TCP`, UDP: `RDMA_PS_UDP`); a passive result
//! carries its address as `ai_src_addr` with `ai_flags = RAI_PASSIVE`, an
//! active one as `ai_dst_addr` with `ai_flags = 0` (other flags are not
//! echoed). Without node and service the result copies the hints.
//! A hinted source address is copied when the result has none.
//!
//! Differences: rdma-core first runs `ucma_init`, which fails (`ENODEV`)
//! on a machine without an RDMA device; this library resolves addresses
//! without one. rdma-core then asks ibacm for a route (`ucma_ib_resolve`),
//! which does nothing without an ibacm daemon (never on RoCE/vrnic); here
//! it is not done. `AF_IB` hints (`RAI_FAMILY` with `ai_family = AF_IB`),
//! an InfiniBand-only address form, fail with `EAFNOSUPPORT`.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use crate::boundary::{fail, ffi};
use crate::ffi::*;

/// `AF_IB` (`<rdma/ib.h>` / the kernel's `AF_IB`, not in libc's headers).
const AF_IB: c_int = 27;

/// `ucma_convert_to_ai`: the `addrinfo` hints for libc.
fn to_ai(rai: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: an all-zero addrinfo is valid (NULL pointers, zero ints).
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if rai.ai_flags & RAI_PASSIVE as c_int != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if rai.ai_flags & RAI_NUMERICHOST as c_int != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if rai.ai_family != AF_IB {
        ai.ai_family = rai.ai_family;
    }
    match rai.ai_qp_type as u32 {
        IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => {
            ai.ai_socktype = libc::SOCK_STREAM
        }
        IBV_QPT_UD => ai.ai_socktype = libc::SOCK_DGRAM,
        _ => {}
    }
    match rai.ai_port_space as u32 {
        RDMA_PS_TCP => ai.ai_protocol = libc::IPPROTO_TCP,
        RDMA_PS_IPOIB | RDMA_PS_UDP => ai.ai_protocol = libc::IPPROTO_UDP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_STREAM => ai.ai_protocol = libc::IPPROTO_TCP,
        RDMA_PS_IB if ai.ai_socktype == libc::SOCK_DGRAM => ai.ai_protocol = libc::IPPROTO_UDP,
        _ => {}
    }
    if rai.ai_flags & RAI_PASSIVE as c_int != 0 {
        ai.ai_addrlen = rai.ai_src_len;
        ai.ai_addr = rai.ai_src_addr;
    } else {
        ai.ai_addrlen = rai.ai_dst_len;
        ai.ai_addr = rai.ai_dst_addr;
    }
    ai.ai_canonname = rai.ai_dst_canonname;
    ai
}

/// `ucma_copy_addr`: a malloc'd copy of `len` bytes at `src`; `ENOMEM`.
///
/// # Safety
/// `src` points to `len` readable bytes.
unsafe fn copy_addr(
    dst: &mut *mut libc::sockaddr,
    dst_len: &mut libc::socklen_t,
    src: *const libc::sockaddr,
    len: libc::socklen_t,
) -> c_int {
    // SAFETY: malloc of a size; checked for NULL below.
    let p = unsafe { libc::malloc(len as usize) };
    if p.is_null() {
        return fail(libc::ENOMEM);
    }
    // SAFETY: `src` has `len` bytes (the caller's contract), `p` room for them.
    unsafe { ptr::copy_nonoverlapping(src.cast::<u8>(), p.cast::<u8>(), len as usize) };
    *dst = p.cast();
    *dst_len = len;
    0
}

/// A malloc'd copy of a C string (NULL for NULL).
///
/// # Safety
/// `s` is NULL or a C string.
unsafe fn dup(s: *const c_char) -> *mut c_char {
    if s.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: a C string (the caller's contract).
    unsafe { libc::strdup(s) }
}

/// `ucma_convert_to_rai`: fills `rai` from libc's first result.
///
/// # Safety
/// `ai` is a result of libc's getaddrinfo.
unsafe fn to_rai(rai: &mut rdma_addrinfo, hints: &rdma_addrinfo, ai: &libc::addrinfo) -> c_int {
    if hints.ai_qp_type != 0 {
        rai.ai_qp_type = hints.ai_qp_type;
    } else if ai.ai_socktype == libc::SOCK_STREAM {
        rai.ai_qp_type = IBV_QPT_RC as c_int;
    } else if ai.ai_socktype == libc::SOCK_DGRAM {
        rai.ai_qp_type = IBV_QPT_UD as c_int;
    }
    if hints.ai_port_space != 0 {
        rai.ai_port_space = hints.ai_port_space;
    } else if ai.ai_protocol == libc::IPPROTO_TCP {
        rai.ai_port_space = RDMA_PS_TCP as c_int;
    } else if ai.ai_protocol == libc::IPPROTO_UDP {
        rai.ai_port_space = RDMA_PS_UDP as c_int;
    }
    rai.ai_family = ai.ai_family;
    if ai.ai_flags & libc::AI_PASSIVE != 0 {
        rai.ai_flags = RAI_PASSIVE as c_int;
        // SAFETY: libc's canonical name is NULL or a C string.
        rai.ai_src_canonname = unsafe { dup(ai.ai_canonname) };
        // SAFETY: libc's result has ai_addrlen bytes at ai_addr.
        unsafe {
            copy_addr(
                &mut rai.ai_src_addr,
                &mut rai.ai_src_len,
                ai.ai_addr,
                ai.ai_addrlen,
            )
        }
    } else {
        // SAFETY: as above.
        rai.ai_dst_canonname = unsafe { dup(ai.ai_canonname) };
        // SAFETY: as above.
        unsafe {
            copy_addr(
                &mut rai.ai_dst_addr,
                &mut rai.ai_dst_len,
                ai.ai_addr,
                ai.ai_addrlen,
            )
        }
    }
}

/// `rdma_getaddrinfo(3)`: resolves `node` and/or `service` into a list
/// (here always of one entry, as rdma-core's) of `struct rdma_addrinfo`
/// the application frees with [`rdma_freeaddrinfo`]. Returns 0, -1 with
/// `errno` (`EINVAL` with no node, service nor hints, or a NULL `res`;
/// `ENOMEM`), or libc's `EAI_*` code (negative) when `getaddrinfo(3)`
/// fails, as rdma-core returns it. See the module documentation for the
/// conversions and the differences from rdma-core.
pub(crate) extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    ffi("rdma_getaddrinfo", || {
        if (node.is_null() && service.is_null() && hints.is_null()) || res.is_null() {
            return fail(libc::EINVAL);
        }
        let nohints = rdma_addrinfo::default();
        // SAFETY: hints is NULL or the caller's rdma_addrinfo.
        let h = unsafe { hints.as_ref() }.unwrap_or(&nohints);
        if h.ai_flags & RAI_FAMILY as c_int != 0 && h.ai_family == AF_IB {
            return fail(libc::EAFNOSUPPORT);
        }
        // SAFETY: calloc of one zeroed rdma_addrinfo (all-zero is valid).
        let rai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if rai.is_null() {
            return fail(libc::ENOMEM);
        }
        // SAFETY: just allocated, zeroed, ours alone.
        let r = unsafe { &mut *rai };
        let mut ret = 0;
        if !node.is_null() || !service.is_null() {
            let ai_hints = to_ai(h);
            let mut ai: *mut libc::addrinfo = ptr::null_mut();
            let hp = if hints.is_null() {
                ptr::null()
            } else {
                &ai_hints as *const _
            };
            // SAFETY: node/service are NULL or C strings (the caller's),
            // hp NULL or our hints, ai receives libc's list.
            ret = unsafe { libc::getaddrinfo(node, service, hp, &mut ai) };
            if ret == 0 {
                // SAFETY: getaddrinfo succeeded: ai is a non-empty list.
                ret = unsafe { to_rai(r, h, &*ai) };
                // SAFETY: libc's list, freed once.
                unsafe { libc::freeaddrinfo(ai) };
            }
        } else {
            r.ai_flags = h.ai_flags;
            r.ai_family = h.ai_family;
            r.ai_qp_type = h.ai_qp_type;
            r.ai_port_space = h.ai_port_space;
            if h.ai_dst_len != 0 {
                // SAFETY: the hints' dst address has ai_dst_len bytes.
                ret = unsafe {
                    copy_addr(
                        &mut r.ai_dst_addr,
                        &mut r.ai_dst_len,
                        h.ai_dst_addr,
                        h.ai_dst_len,
                    )
                };
            }
        }
        if ret == 0 && r.ai_src_len == 0 && h.ai_src_len != 0 {
            // SAFETY: the hints' src address has ai_src_len bytes.
            ret = unsafe {
                copy_addr(
                    &mut r.ai_src_addr,
                    &mut r.ai_src_len,
                    h.ai_src_addr,
                    h.ai_src_len,
                )
            };
        }
        if ret != 0 {
            rdma_freeaddrinfo(rai);
            return ret;
        }
        // SAFETY: res is non-NULL, the caller's.
        unsafe { *res = rai };
        0
    })
}

/// `rdma_freeaddrinfo(3)`: frees a list [`rdma_getaddrinfo`] returned,
/// every entry with its addresses, names, route and connect data, as
/// rdma-core does (NULL: nothing).
pub(crate) extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    ffi("rdma_freeaddrinfo", || {
        let mut p = res;
        while !p.is_null() {
            // SAFETY: an entry of a list this library allocated with libc;
            // each pointer field is NULL or malloc'd, freed once here.
            unsafe {
                let e = &*p;
                let next = e.ai_next;
                for f in [
                    e.ai_connect,
                    e.ai_route,
                    e.ai_src_canonname.cast::<c_void>(),
                    e.ai_dst_canonname.cast(),
                    e.ai_src_addr.cast(),
                    e.ai_dst_addr.cast(),
                ] {
                    libc::free(f);
                }
                libc::free(p.cast());
                p = next;
            }
        }
    })
}
