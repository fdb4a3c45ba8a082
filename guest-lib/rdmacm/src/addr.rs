//! Addresses: `rdma_bind_addr(3)`, `rdma_resolve_addr(3)` (rdma-core
//! `librdmacm/cma.c`).
//!
//! vrnic's CM is RoCEv2 only, IP addressed: the library takes rdma-core's
//! path for a kernel without `AF_IB` support (`af_ib_support` false), so
//! it binds with `BIND_IP`, resolves with `RESOLVE_IP`, and learns the
//! result with `QUERY_ROUTE` ([`crate::route::query_route`]).

use std::ffi::c_int;

use vrnic_guest::agent::ucma::abi as kabi;

use crate::boundary::{fail, ffi};
use crate::events::complete;
use crate::ffi::*;
use crate::id::cm;
use crate::route::query_route;
use crate::verbs::zeroed;

/// rdma-core's `ucma_addrlen`: the length of an IPv4 or IPv6 address, 0
/// for NULL or another family (AF_IB is not supported: 0).
pub(crate) fn addrlen(addr: *const sockaddr) -> usize {
    if addr.is_null() {
        return 0;
    }
    // SAFETY: a non-NULL socket address has its family first.
    match c_int::from(unsafe { (*addr).sa_family }) {
        libc::AF_INET => size_of::<sockaddr_in>(),
        libc::AF_INET6 => size_of::<sockaddr_in6>(),
        _ => 0,
    }
}

/// Copies `len` bytes of `addr` into the kernel ABI's `sockaddr_in6`.
fn to_in6(addr: *const sockaddr, len: usize) -> kabi::sockaddr_in6 {
    let mut a: kabi::sockaddr_in6 = zeroed();
    if len > 0 {
        // SAFETY: `addr` holds `len` (<= 28) bytes; so does `a`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                addr.cast::<u8>(),
                std::ptr::from_mut(&mut a).cast::<u8>(),
                len.min(size_of::<kabi::sockaddr_in6>()),
            )
        };
    }
    a
}

/// Copies an address into the id's route (`dst`: the destination).
fn store(id: &mut rdma_cm_id, addr: *const sockaddr, len: usize, dst: bool) {
    let to: *mut u8 = if dst {
        std::ptr::addr_of_mut!(id.route.addr.__bindgen_anon_2).cast()
    } else {
        std::ptr::addr_of_mut!(id.route.addr.__bindgen_anon_1).cast()
    };
    // SAFETY: the route's address unions are sockaddr_storage-sized;
    // `addr` holds `len` <= 28 bytes. It may be the route's own address:
    // rsocket.c resolves `&id->route.addr.dst_addr` (cma.c's memcpy onto
    // itself), hence a copy that allows overlap.
    unsafe { std::ptr::copy(addr.cast::<u8>(), to, len) };
}

/// `rdma_bind_addr(3)`: binds the id to a local address (`BIND_IP`), then
/// learns its device and port from the agent (`QUERY_ROUTE`). `EINVAL`
/// for an address that is not IPv4 or IPv6, or a NULL id.
pub(crate) extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    ffi("rdma_bind_addr", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        match bind(id, addr) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_bind_addr`'s work, for `rdma_create_ep` too.
pub(crate) fn bind(id: *mut rdma_cm_id, addr: *const sockaddr) -> Result<(), c_int> {
    let len = addrlen(addr);
    if len == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: ids applications hold came from this library.
    let cm = unsafe { cm(id) };
    let cmd = kabi::rdma_ucm_bind_ip {
        addr: to_in6(addr, len),
        id: cm.handle,
        ..zeroed()
    };
    cm.channel()
        .exec(kabi::RDMA_USER_CM_CMD_BIND_IP, &cmd, &[], &mut [])?;
    query_route(cm)
}

/// `rdma_resolve_addr(3)`: asks the agent to resolve `dst_addr` (and bind
/// to `src_addr`, or a source of its choice) within `timeout_ms`
/// (`RESOLVE_IP`); the answer is an `RDMA_CM_EVENT_ADDR_RESOLVED` or
/// `_ADDR_ERROR` event (a synchronous id waits for it here). `EINVAL` for
/// a destination that is not IPv4/IPv6, a source of another family, or a
/// NULL id.
pub(crate) extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut sockaddr,
    dst_addr: *mut sockaddr,
    timeout_ms: c_int,
) -> c_int {
    ffi("rdma_resolve_addr", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        match resolve(id, src_addr, dst_addr, timeout_ms) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_resolve_addr`'s work, for `rdma_create_ep` too.
pub(crate) fn resolve(
    id: *mut rdma_cm_id,
    src_addr: *const sockaddr,
    dst_addr: *const sockaddr,
    timeout_ms: c_int,
) -> Result<(), c_int> {
    let dst_len = addrlen(dst_addr);
    if dst_len == 0 {
        return Err(libc::EINVAL);
    }
    let src_len = addrlen(src_addr);
    if !src_addr.is_null() && src_len == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: ids applications hold came from this library.
    let cm = unsafe { cm(id) };
    let cmd = kabi::rdma_ucm_resolve_ip {
        src_addr: to_in6(src_addr, src_len),
        dst_addr: to_in6(dst_addr, dst_len),
        id: cm.handle,
        timeout_ms: timeout_ms as u32,
    };
    cm.channel()
        .exec(kabi::RDMA_USER_CM_CMD_RESOLVE_IP, &cmd, &[], &mut [])?;
    store(&mut cm.id, dst_addr, dst_len, true);
    complete(cm)
}
