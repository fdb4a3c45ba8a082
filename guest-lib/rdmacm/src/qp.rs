//! QPs and SRQs of ids: `rdma_init_qp_attr(3)`, `rdma_create_qp(3)`,
//! `rdma_create_qp_ex(3)`, `rdma_destroy_qp(3)`, `rdma_create_srq(3)`,
//! `rdma_create_srq_ex(3)`, `rdma_destroy_srq(3)`, and the QP transitions
//! the library makes for the application (rdma-core `librdmacm/cma.c`:
//! `ucma_init_conn_qp`, `ucma_init_ud_qp`, `ucma_modify_qp_rtr`/`_rts`/
//! `_err`), all on the process's libibverbs.
//!
//! `ibv_create_qp_ex` and `ibv_create_srq_ex` are inline functions of
//! `<infiniband/verbs.h>` that reach a provider's extended entry points;
//! this library takes their fallback: the basic call, for the attributes
//! it can carry (a PD; a basic SRQ), `EOPNOTSUPP` otherwise (XRC).

use std::ffi::c_int;

use vrnic_guest::agent::ucma::abi as kabi;

use crate::boundary::{errno_or, fail, ffi};
use crate::device::LINK_LAYER_INFINIBAND;
use crate::ffi::*;
use crate::id::{cm, CmId};
use crate::verbs::*;

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` (`<rdma/rdma_cma.h>`):
/// "the device's maximum".
pub(crate) const MAX_RESP_RES: u8 = 0xFF;
/// See [`MAX_RESP_RES`].
pub(crate) const MAX_INIT_DEPTH: u8 = 0xFF;

/// rdma-core's `rdma_init_qp_attr`: `INIT_QP_ATTR` for `attr.qp_state`,
/// the answer copied as `ibv_copy_qp_attr_from_kern` copies it.
pub(crate) fn init_qp_attr(cm: &CmId, attr: &mut ibv_qp_attr) -> Result<c_int, c_int> {
    let cmd = kabi::rdma_ucm_init_qp_attr {
        id: cm.handle,
        qp_state: attr.qp_state,
        ..zeroed()
    };
    let mut resp: kabi::ib_uverbs_qp_attr = zeroed();
    cm.channel()
        .exec_resp(kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR, &cmd, &mut resp)?;
    qp_attr_from_kern(attr, &resp);
    Ok(resp.qp_attr_mask as c_int)
}

/// `rdma_init_qp_attr(3)`: the attributes (and mask) for moving the id's
/// QP to `qp_attr->qp_state`, from the agent's connection state, for
/// applications that move their QP themselves (`rdma_establish(3)`).
pub(crate) extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    ffi("rdma_init_qp_attr", || {
        if id.is_null() || qp_attr.is_null() || qp_attr_mask.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's id and structures, non-NULL.
        let (cm, attr) = unsafe { (cm(id), &mut *qp_attr) };
        match init_qp_attr(cm, attr) {
            Ok(m) => {
                // SAFETY: non-NULL, the caller's int.
                unsafe { *qp_attr_mask = m };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `ibv_modify_qp` with errno as the error (`rdma_seterrno`).
fn modify(qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: c_int) -> Result<(), c_int> {
    // SAFETY: a live QP of the id; the attributes are ours.
    match unsafe { ibv_modify_qp(qp, attr, mask) } {
        0 => Ok(()),
        r if r > 0 => Err(r),
        _ => Err(errno_or(libc::EINVAL)),
    }
}

/// rdma-core's `ucma_modify_qp_rtr`: INIT (refreshed) then RTR from the
/// agent's attributes, `resp_res` overriding `max_dest_rd_atomic` unless
/// [`MAX_RESP_RES`]. No QP: nothing.
pub(crate) fn modify_qp_rtr(cm: &CmId, resp_res: u8) -> Result<(), c_int> {
    let qp = cm.id.qp;
    if qp.is_null() {
        return Ok(());
    }
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = IBV_QPS_INIT;
    let mask = init_qp_attr(cm, &mut attr)?;
    modify(qp, &mut attr, mask)?;
    attr.qp_state = IBV_QPS_RTR;
    let mut mask = init_qp_attr(cm, &mut attr)?;
    // rdma-core's workaround of an rdma_ucm bug: bits 21-24 are RoCE's.
    let port = usize::from(cm.id.port_num).wrapping_sub(1);
    if cm
        .device()
        .and_then(|d| d.link_layer.get(port))
        .is_some_and(|&l| l == LINK_LAYER_INFINIBAND)
    {
        mask &= !0xe0_0000;
    }
    if resp_res != MAX_RESP_RES {
        attr.max_dest_rd_atomic = resp_res;
    }
    modify(qp, &mut attr, mask)
}

/// rdma-core's `ucma_modify_qp_rts`: RTS from the agent's attributes,
/// `init_depth` overriding `max_rd_atomic` unless [`MAX_INIT_DEPTH`].
pub(crate) fn modify_qp_rts(cm: &CmId, init_depth: u8) -> Result<(), c_int> {
    let qp = cm.id.qp;
    if qp.is_null() {
        return Ok(());
    }
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = IBV_QPS_RTS;
    let mask = init_qp_attr(cm, &mut attr)?;
    if init_depth != MAX_INIT_DEPTH {
        attr.max_rd_atomic = init_depth;
    }
    modify(qp, &mut attr, mask)
}

/// rdma-core's `ucma_modify_qp_err`: the QP (if any) to ERROR.
pub(crate) fn modify_qp_err(id: &rdma_cm_id) -> Result<(), c_int> {
    if id.qp.is_null() {
        return Ok(());
    }
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = IBV_QPS_ERR;
    modify(id.qp, &mut attr, IBV_QP_STATE as c_int)
}

/// rdma-core's `ucma_modify_qp_sqd`: the QP (if any) to SQD (iWARP's
/// `ucma_shutdown`).
pub(crate) fn modify_qp_sqd(id: &rdma_cm_id) -> Result<(), c_int> {
    if id.qp.is_null() {
        return Ok(());
    }
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = IBV_QPS_SQD;
    modify(id.qp, &mut attr, IBV_QP_STATE as c_int)
}

/// rdma-core's `ucma_init_conn_qp`: a connected QP to INIT with the
/// agent's attributes.
fn init_conn_qp(cm: &CmId, qp: *mut ibv_qp) -> Result<(), c_int> {
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = IBV_QPS_INIT;
    let mask = init_qp_attr(cm, &mut attr)?;
    modify(qp, &mut attr, mask)
}

/// rdma-core's `ucma_init_ud_qp`: a UD QP to INIT (agent's attributes),
/// RTR, and RTS with SQ PSN 0.
fn init_ud_qp(cm: &CmId, qp: *mut ibv_qp) -> Result<(), c_int> {
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = IBV_QPS_INIT;
    let mask = init_qp_attr(cm, &mut attr)?;
    modify(qp, &mut attr, mask)?;
    attr.qp_state = IBV_QPS_RTR;
    modify(qp, &mut attr, IBV_QP_STATE as c_int)?;
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = 0;
    modify(qp, &mut attr, (IBV_QP_STATE | IBV_QP_SQ_PSN) as c_int)
}

/// rdma-core's `ucma_destroy_cqs`: the CQs and completion channels the
/// library made for the id.
fn destroy_cqs(id: &mut rdma_cm_id) {
    if !id.recv_cq.is_null() {
        // SAFETY: a CQ this library created for the id.
        unsafe { ibv_destroy_cq(id.recv_cq) };
        if !id.send_cq.is_null() && id.send_cq != id.recv_cq {
            // SAFETY: as above.
            unsafe { ibv_destroy_cq(id.send_cq) };
            id.send_cq = std::ptr::null_mut();
        }
        id.recv_cq = std::ptr::null_mut();
    }
    if !id.recv_cq_channel.is_null() {
        // SAFETY: a completion channel this library created for the id.
        unsafe { ibv_destroy_comp_channel(id.recv_cq_channel) };
        if !id.send_cq_channel.is_null() && id.send_cq_channel != id.recv_cq_channel {
            // SAFETY: as above.
            unsafe { ibv_destroy_comp_channel(id.send_cq_channel) };
            id.send_cq_channel = std::ptr::null_mut();
        }
        id.recv_cq_channel = std::ptr::null_mut();
    }
}

/// rdma-core's `ucma_create_cqs`: a CQ (with its own completion channel)
/// of `recv_size` and of `send_size` entries, for each that is non-zero.
fn create_cqs(id: &mut rdma_cm_id, send_size: u32, recv_size: u32) -> Result<(), c_int> {
    let ctx = std::ptr::from_mut(id).cast();
    let make = |size: u32, ch: &mut *mut ibv_comp_channel, cq: &mut *mut ibv_cq| {
        // SAFETY: the id's open context.
        *ch = unsafe { ibv_create_comp_channel(id_verbs(ctx)) };
        if ch.is_null() {
            return Err(errno_or(libc::ENOMEM));
        }
        // SAFETY: as above, with the channel just made.
        *cq = unsafe { ibv_create_cq(id_verbs(ctx), size as c_int, ctx, *ch, 0) };
        if cq.is_null() {
            return Err(errno_or(libc::ENOMEM));
        }
        Ok(())
    };
    let mut r = Ok(());
    if recv_size != 0 {
        let (mut ch, mut cq) = (std::ptr::null_mut(), std::ptr::null_mut());
        r = make(recv_size, &mut ch, &mut cq);
        id.recv_cq_channel = ch;
        id.recv_cq = cq;
    }
    if r.is_ok() && send_size != 0 {
        let (mut ch, mut cq) = (std::ptr::null_mut(), std::ptr::null_mut());
        r = make(send_size, &mut ch, &mut cq);
        id.send_cq_channel = ch;
        id.send_cq = cq;
    }
    if r.is_err() {
        destroy_cqs(id);
    }
    r
}

/// The `verbs` of the id at `ctx` (the id's address as CQ context).
fn id_verbs(ctx: *mut std::ffi::c_void) -> *mut ibv_context {
    // SAFETY: `ctx` is a live id of this library.
    unsafe { (*ctx.cast::<rdma_cm_id>()).verbs }
}

/// rdma-core's `init_ece`: records the QP's ECE, and for a QP made for a
/// request with ECE, offers the peer's options (or none for another vendor).
fn init_ece(cm: &mut CmId, qp: *mut ibv_qp) -> Result<(), c_int> {
    let mut ece: ibv_ece = zeroed();
    // SAFETY: a live QP.
    let r = unsafe { ibv_query_ece(qp, &mut ece) };
    if r != 0 && r != libc::EOPNOTSUPP {
        return Err(r);
    }
    cm.local_ece = (ece.vendor_id, ece.options);
    if cm.remote_ece.0 == 0 {
        return Ok(());
    }
    ece.vendor_id = cm.local_ece.0;
    ece.options = if cm.remote_ece.0 != cm.local_ece.0 {
        0
    } else {
        ece.vendor_id = cm.remote_ece.0;
        cm.remote_ece.1
    };
    // SAFETY: as above.
    let r = unsafe { ibv_set_ece(qp, &mut ece) };
    if r != 0 && r != libc::EOPNOTSUPP {
        return Err(r);
    }
    Ok(())
}

/// rdma-core's `set_local_ece`: after INIT, the options the QP accepted.
fn set_local_ece(cm: &mut CmId, qp: *mut ibv_qp) -> Result<(), c_int> {
    if cm.remote_ece.0 == 0 {
        return Ok(());
    }
    let mut ece: ibv_ece = zeroed();
    // SAFETY: a live QP.
    let r = unsafe { ibv_query_ece(qp, &mut ece) };
    if r != 0 && r != libc::EOPNOTSUPP {
        return Err(r);
    }
    cm.local_ece.1 = ece.options;
    Ok(())
}

/// `rdma_create_qp_ex`'s work.
fn create_qp_ex(cm: &mut CmId, attr: &mut ibv_qp_init_attr_ex) -> Result<(), c_int> {
    if !cm.id.qp.is_null() || cm.id.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & IBV_QP_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.comp_mask |= IBV_QP_INIT_ATTR_PD;
        attr.pd = cm.id.pd;
    // SAFETY: the application's PD.
    } else if cm.id.verbs != unsafe { (*attr.pd).context } {
        return Err(libc::EINVAL);
    }
    if (!cm.id.recv_cq.is_null() && !attr.recv_cq.is_null() && cm.id.recv_cq != attr.recv_cq)
        || (!cm.id.send_cq.is_null() && !attr.send_cq.is_null() && cm.id.send_cq != attr.send_cq)
    {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 || cm.id.qp_type == IBV_QPT_XRC_RECV {
        // ibv_create_qp_ex's fallback without a provider's create_qp_ex.
        return Err(libc::EOPNOTSUPP);
    }
    let send = if !attr.send_cq.is_null() || !cm.id.send_cq.is_null() {
        0
    } else {
        attr.cap.max_send_wr
    };
    let recv = if !attr.recv_cq.is_null() || !cm.id.recv_cq.is_null() {
        0
    } else {
        attr.cap.max_recv_wr
    };
    create_cqs(&mut cm.id, send, recv)?;
    if attr.send_cq.is_null() {
        attr.send_cq = cm.id.send_cq;
    }
    if attr.recv_cq.is_null() {
        attr.recv_cq = cm.id.recv_cq;
    }
    if !cm.id.srq.is_null() && attr.srq.is_null() {
        attr.srq = cm.id.srq;
    }
    // SAFETY: ibv_qp_init_attr_ex begins with the fields of
    // ibv_qp_init_attr (what ibv_create_qp_ex's fallback passes).
    let qp = unsafe { ibv_create_qp(attr.pd, std::ptr::from_mut(attr).cast()) };
    if qp.is_null() {
        let e = errno_or(libc::ENOMEM);
        destroy_cqs(&mut cm.id);
        return Err(e);
    }
    let r = init_ece(cm, qp)
        .and_then(|()| {
            if cm.id.qp_type == IBV_QPT_UD {
                init_ud_qp(cm, qp)
            } else {
                init_conn_qp(cm, qp)
            }
        })
        .and_then(|()| set_local_ece(cm, qp));
    if let Err(e) = r {
        // SAFETY: the QP just created.
        unsafe { ibv_destroy_qp(qp) };
        destroy_cqs(&mut cm.id);
        return Err(e);
    }
    // SAFETY: a live QP.
    cm.id.pd = unsafe { (*qp).pd };
    cm.id.qp = qp;
    Ok(())
}

/// `rdma_create_qp_ex(3)`: a QP for the id on its device (the id's PD
/// unless `attr` names one of the same device; CQs made for it unless
/// given), moved to INIT with the agent's attributes (UD: to RTS).
/// `EINVAL` for an id with a QP or no device; `EOPNOTSUPP` for extended
/// attributes beyond a PD.
pub(crate) extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    ffi("rdma_create_qp_ex", || {
        if id.is_null() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's id and attributes, non-NULL.
        match create_qp_ex(unsafe { cm(id) }, unsafe { &mut *attr }) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_create_qp`'s work, for `rdma_create_ep`/`rdma_get_request` too.
pub(crate) fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: &mut ibv_qp_init_attr,
) -> Result<(), c_int> {
    // SAFETY: the application's id.
    let cm = unsafe { cm(id) };
    let mut ex: ibv_qp_init_attr_ex = zeroed();
    // SAFETY: ibv_qp_init_attr_ex begins with ibv_qp_init_attr's fields.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::from_ref(qp_init_attr).cast::<u8>(),
            std::ptr::from_mut(&mut ex).cast::<u8>(),
            size_of::<ibv_qp_init_attr>(),
        )
    };
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = if pd.is_null() { cm.id.pd } else { pd };
    let r = create_qp_ex(cm, &mut ex);
    // SAFETY: as above, back into the caller's structure.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::from_ref(&ex).cast::<u8>(),
            std::ptr::from_mut(qp_init_attr).cast::<u8>(),
            size_of::<ibv_qp_init_attr>(),
        )
    };
    r
}

/// `rdma_create_qp(3)`: [`rdma_create_qp_ex`] with a PD (NULL: the id's).
pub(crate) extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    ffi("rdma_create_qp", || {
        if id.is_null() || qp_init_attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's attributes, non-NULL.
        match create_qp(id, pd, unsafe { &mut *qp_init_attr }) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_qp(3)`: destroys the id's QP and the CQs the library
/// made for it. NULL id: `EINVAL`.
pub(crate) extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    ffi("rdma_destroy_qp", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's id.
        let cm = unsafe { cm(id) };
        if !cm.id.qp.is_null() {
            // SAFETY: the id's QP.
            unsafe { ibv_destroy_qp(cm.id.qp) };
        }
        cm.id.qp = std::ptr::null_mut();
        destroy_cqs(&mut cm.id);
    })
}

/// `rdma_create_srq_ex`'s work.
fn create_srq_ex(cm: &mut CmId, attr: &mut ibv_srq_init_attr_ex) -> Result<(), c_int> {
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || cm.id.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    if attr.comp_mask & IBV_SRQ_INIT_ATTR_PD == 0 || attr.pd.is_null() {
        attr.pd = cm.id.pd;
        attr.comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    }
    if attr.srq_type != IBV_SRQT_BASIC
        || attr.comp_mask & !(IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD) != 0
    {
        // ibv_create_srq_ex's fallback without a provider's create_srq_ex.
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: ibv_srq_init_attr_ex begins with ibv_srq_init_attr's fields.
    let srq = unsafe { ibv_create_srq(attr.pd, std::ptr::from_mut(attr).cast()) };
    if srq.is_null() {
        return Err(errno_or(libc::ENOMEM));
    }
    if cm.id.pd.is_null() {
        cm.id.pd = attr.pd;
    }
    cm.id.srq = srq;
    Ok(())
}

/// `rdma_create_srq_ex(3)`: an SRQ for the id (basic SRQs; XRC is
/// `EOPNOTSUPP`). `EINVAL` without `IBV_SRQ_INIT_ATTR_TYPE` or a device.
pub(crate) extern "C" fn rdma_create_srq_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    ffi("rdma_create_srq_ex", || {
        if id.is_null() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's id and attributes, non-NULL.
        match create_srq_ex(unsafe { cm(id) }, unsafe { &mut *attr }) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_create_srq(3)`: a basic SRQ on `pd` (NULL: the id's).
pub(crate) extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    ffi("rdma_create_srq", || {
        if id.is_null() || attr.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's id.
        let cm = unsafe { cm(id) };
        let mut ex: ibv_srq_init_attr_ex = zeroed();
        // SAFETY: ibv_srq_init_attr_ex begins with ibv_srq_init_attr's fields.
        unsafe {
            std::ptr::copy_nonoverlapping(
                attr.cast::<u8>(),
                std::ptr::from_mut(&mut ex).cast::<u8>(),
                size_of::<ibv_srq_init_attr>(),
            )
        };
        ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
        ex.srq_type = if cm.id.qp_type == IBV_QPT_XRC_RECV {
            IBV_SRQT_XRC
        } else {
            IBV_SRQT_BASIC
        };
        ex.pd = pd;
        let r = create_srq_ex(cm, &mut ex);
        // SAFETY: back into the caller's structure.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::from_ref(&ex).cast::<u8>(),
                attr.cast::<u8>(),
                size_of::<ibv_srq_init_attr>(),
            )
        };
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_destroy_srq(3)`: destroys the id's SRQ (and CQs the library made).
pub(crate) extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    ffi("rdma_destroy_srq", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: the application's id.
        let cm = unsafe { cm(id) };
        if !cm.id.srq.is_null() {
            // SAFETY: the id's SRQ.
            unsafe { ibv_destroy_srq(cm.id.srq) };
        }
        cm.id.srq = std::ptr::null_mut();
        destroy_cqs(&mut cm.id);
    })
}
