//! Routes: `rdma_resolve_route(3)`, and what the library learns of an id
//! from the agent after an address or route is resolved or a request
//! arrives (rdma-core `librdmacm/cma.c` `ucma_query_route`).

use std::ffi::c_int;

use vrnic_guest::agent::ucma::abi as kabi;

use crate::boundary::{fail, ffi};
use crate::device;
use crate::events::complete;
use crate::ffi::*;
use crate::id::{cm, CmId};
use crate::verbs::{path_rec_from_kern, zeroed};

/// rdma-core's `ucma_query_route` (`QUERY_ROUTE`): the id's path records
/// (`num_paths` of `ib_route`, at most 2), GIDs and P_Key (from
/// `ib_route[0]`), source and destination addresses, and, the first time
/// the agent names one (`node_guid` non-zero), its device (by node GUID
/// and `ibdev_index`, -1 when unknown) and `port_num`.
pub(crate) fn query_route(cm: &mut CmId) -> Result<(), c_int> {
    let cmd = kabi::rdma_ucm_query {
        id: cm.handle,
        ..zeroed()
    };
    let mut resp: kabi::rdma_ucm_query_route_resp = zeroed();
    resp.ibdev_index = u32::MAX;
    cm.channel()
        .exec_resp(kabi::RDMA_USER_CM_CMD_QUERY_ROUTE, &cmd, &mut resp)?;
    let n = (resp.num_paths as usize).min(resp.ib_route.len());
    if n > 0 {
        // SAFETY: malloc of n records (freed with the id); NULL checked.
        let recs =
            unsafe { libc::calloc(n, size_of::<ibv_sa_path_rec>()) }.cast::<ibv_sa_path_rec>();
        if recs.is_null() {
            return Err(libc::ENOMEM);
        }
        for (i, r) in resp.ib_route[..n].iter().enumerate() {
            // SAFETY: `recs` has n records.
            path_rec_from_kern(unsafe { &mut *recs.add(i) }, r);
        }
        // SAFETY: the previous records, malloc'd by this function (or NULL).
        unsafe { libc::free(cm.id.route.path_rec.cast()) };
        cm.id.route.path_rec = recs;
        cm.id.route.num_paths = n as c_int;
    }
    // SAFETY: `ibaddr` is the union's only member.
    let ib = unsafe { &mut cm.id.route.addr.addr.ibaddr };
    ib.sgid.raw = resp.ib_route[0].sgid;
    ib.dgid.raw = resp.ib_route[0].dgid;
    ib.pkey = resp.ib_route[0].pkey;
    let src: *mut u8 = std::ptr::addr_of_mut!(cm.id.route.addr.__bindgen_anon_1).cast();
    let dst: *mut u8 = std::ptr::addr_of_mut!(cm.id.route.addr.__bindgen_anon_2).cast();
    // SAFETY: the route's address unions hold a sockaddr_storage, more than
    // the 28 bytes of the ABI's sockaddr_in6 copied into each.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::from_ref(&resp.src_addr).cast::<u8>(),
            src,
            size_of::<kabi::sockaddr_in6>(),
        );
        std::ptr::copy_nonoverlapping(
            std::ptr::from_ref(&resp.dst_addr).cast::<u8>(),
            dst,
            size_of::<kabi::sockaddr_in6>(),
        );
    }
    if cm.dev.is_null() && resp.node_guid != 0 {
        let d = device::get(resp.node_guid, resp.ibdev_index)?;
        cm.dev = d;
        // SAFETY: device records are leaked, never freed.
        let d = unsafe { &*d };
        cm.id.verbs = d.verbs;
        cm.id.pd = d.pd;
        cm.id.port_num = resp.port_num;
    }
    Ok(())
}

/// True when the id's device is an InfiniBand-transport device (RoCE
/// included), as `id->verbs->device->transport_type == IBV_TRANSPORT_IB`.
pub(crate) fn transport_ib(id: &rdma_cm_id) -> bool {
    if id.verbs.is_null() {
        return false;
    }
    // SAFETY: an open context and its device (libibverbs objects).
    unsafe {
        let dev = (*id.verbs).device;
        !dev.is_null() && (*dev).transport_type == IBV_TRANSPORT_IB
    }
}

/// `rdma_resolve_route(3)`: asks the agent for the route to the resolved
/// destination (`RESOLVE_ROUTE`); the answer is an
/// `RDMA_CM_EVENT_ROUTE_RESOLVED` or `_ROUTE_ERROR` event (a synchronous
/// id waits for it here). rdma-core first asks ibacm for an IB path
/// (`ucma_set_ib_route`, through `rdma_getaddrinfo`'s `RAI_ROUTEONLY`) and
/// falls back to the kernel when it has none; vrnic has no ibacm, so the
/// agent always resolves. NULL id: `EINVAL`.
pub(crate) extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int {
    ffi("rdma_resolve_route", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        match resolve(id, timeout_ms) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_resolve_route`'s work, for `rdma_create_ep` too.
pub(crate) fn resolve(id: *mut rdma_cm_id, timeout_ms: c_int) -> Result<(), c_int> {
    // SAFETY: ids applications hold came from this library.
    let cm = unsafe { cm(id) };
    let cmd = kabi::rdma_ucm_resolve_route {
        id: cm.handle,
        timeout_ms: timeout_ms as u32,
    };
    cm.channel()
        .exec(kabi::RDMA_USER_CM_CMD_RESOLVE_ROUTE, &cmd, &[], &mut [])?;
    complete(cm)
}
