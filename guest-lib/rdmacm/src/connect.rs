//! Connections: `rdma_connect(3)`, `rdma_listen(3)`, `rdma_accept(3)`,
//! `rdma_reject(3)`, `rdma_reject_ece(3)`, `rdma_notify(3)`,
//! `rdma_disconnect(3)`, `rdma_establish(3)` (rdma-core
//! `librdmacm/cma.c`), each a command to the agent's CM with the QP
//! transitions the library makes around it.

use std::ffi::{c_int, c_void};

use vrnic_guest::agent::ucma::abi as kabi;

use crate::boundary::{fail, ffi};
use crate::events::complete;
use crate::ffi::*;
use crate::id::{cm, CmId};
use crate::qp::{modify_qp_err, modify_qp_rtr, modify_qp_rts, MAX_INIT_DEPTH, MAX_RESP_RES};
use crate::route::{query_route, transport_ib};
use crate::verbs::zeroed;

/// IBTA's REJ reason `CM_REJ_VENDOR_OPTION_NOT_SUPPORTED` (35), as
/// `rdma_reject_ece` sends it.
const REJ_VENDOR_OPTION_NOT_SUPPORTED: u8 = 35;

/// rdma-core's `ucma_valid_param`: for `RDMA_PS_TCP`, a QP or parameters,
/// and depths within the device's (`EINVAL`).
fn valid_param(cm: &CmId, param: Option<&rdma_conn_param>) -> Result<(), c_int> {
    if cm.id.ps != RDMA_PS_TCP {
        return Ok(());
    }
    let Some(p) = param else {
        return if cm.id.qp.is_null() {
            Err(libc::EINVAL)
        } else {
            Ok(())
        };
    };
    let dev = cm.device().ok_or(libc::EINVAL)?;
    if (p.responder_resources != MAX_RESP_RES
        && p.responder_resources > dev.max_responder_resources)
        || (p.initiator_depth != MAX_INIT_DEPTH && p.initiator_depth > dev.max_initiator_depth)
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// rdma-core's `ucma_copy_conn_param_to_kern`.
fn conn_param_to_kern(
    cm: &CmId,
    src: Option<&rdma_conn_param>,
    qp_num: u32,
    srq: u8,
) -> kabi::rdma_ucm_conn_param {
    let mut dst: kabi::rdma_ucm_conn_param = zeroed();
    dst.qp_num = qp_num;
    dst.srq = srq;
    dst.responder_resources = cm.responder_resources;
    dst.initiator_depth = cm.initiator_depth;
    dst.valid = 1;
    let mut len = cm.connect.len().min(dst.private_data.len());
    dst.private_data[..len].copy_from_slice(&cm.connect[..len]);
    match src {
        Some(s) => {
            dst.flow_control = s.flow_control;
            dst.retry_count = s.retry_count;
            dst.rnr_retry_count = s.rnr_retry_count;
            if !s.private_data.is_null() && s.private_data_len > 0 {
                let n = usize::from(s.private_data_len).min(dst.private_data.len() - len);
                // SAFETY: the application's private data of private_data_len bytes.
                let pd = unsafe { std::slice::from_raw_parts(s.private_data.cast::<u8>(), n) };
                dst.private_data[len..len + n].copy_from_slice(pd);
                len += n;
            }
        }
        None => {
            dst.retry_count = 7;
            dst.rnr_retry_count = 7;
        }
    }
    dst.private_data_len = len as u8;
    dst
}

/// The QP number and SRQ flag to send: the id's QP's, else the parameters'.
fn qp_num_srq(id: &rdma_cm_id, param: Option<&rdma_conn_param>) -> (u32, u8) {
    if !id.qp.is_null() {
        // SAFETY: the id's live QP.
        let qp = unsafe { &*id.qp };
        return (qp.qp_num, u8::from(!qp.srq.is_null()));
    }
    param.map_or((0, 0), |p| (p.qp_num, p.srq))
}

/// Runs `f` on the id behind `id` with the parameters, as the C calls do.
fn with_id(
    name: &str,
    id: *mut rdma_cm_id,
    f: impl FnOnce(&mut CmId) -> Result<(), c_int>,
) -> c_int {
    ffi(name, || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: ids applications hold came from this library.
        match f(unsafe { cm(id) }) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `rdma_connect(3)`: asks the agent to connect (`CONNECT`: IB CM REQ, or
/// SIDR for UD) with the id's QP (or `conn_param`'s `qp_num`); the answer
/// is an event (`ESTABLISHED` once the library has moved the QP to RTS on
/// the agent's `CONNECT_RESPONSE` and sent `ACCEPT`, which makes the RTU;
/// or `REJECTED`, `UNREACHABLE`, `CONNECT_ERROR`). A synchronous id waits
/// for it. `EINVAL`: an `RDMA_PS_TCP` id with neither QP nor parameters,
/// depths beyond the device's, an id without a device, a NULL id.
pub(crate) extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    with_id("rdma_connect", id, |cm| {
        // SAFETY: NULL or the application's parameters.
        let param = unsafe { conn_param.as_ref() };
        valid_param(cm, param)?;
        let dev = cm.device().ok_or(libc::EINVAL)?;
        let (max_init, max_resp) = (dev.max_initiator_depth, dev.max_responder_resources);
        cm.initiator_depth = match param {
            Some(p) if p.initiator_depth != MAX_INIT_DEPTH => p.initiator_depth,
            _ => max_init,
        };
        cm.responder_resources = match param {
            Some(p) if p.responder_resources != MAX_RESP_RES => p.responder_resources,
            _ => max_resp,
        };
        let (qp_num, srq) = qp_num_srq(&cm.id, param);
        let cmd = kabi::rdma_ucm_connect {
            conn_param: conn_param_to_kern(cm, param, qp_num, srq),
            id: cm.handle,
            reserved: 0,
            ece: kabi::rdma_ucm_ece {
                vendor_id: cm.local_ece.0,
                attr_mod: cm.local_ece.1,
            },
        };
        cm.channel()
            .exec(kabi::RDMA_USER_CM_CMD_CONNECT, &cmd, &[], &mut [])?;
        cm.connect.clear();
        complete(cm)
    })
}

/// `rdma_listen(3)`: listens for connection requests on the id's bound
/// address (`LISTEN`, then `QUERY_ROUTE` for the address and device);
/// requests arrive as `RDMA_CM_EVENT_CONNECT_REQUEST` events.
pub(crate) extern "C" fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int {
    with_id("rdma_listen", id, |cm| {
        let cmd = kabi::rdma_ucm_listen {
            id: cm.handle,
            backlog: backlog as u32,
        };
        cm.channel()
            .exec(kabi::RDMA_USER_CM_CMD_LISTEN, &cmd, &[], &mut [])?;
        query_route(cm)
    })
}

/// `rdma_accept(3)`: accepts a connection request: the id's QP to RTR and
/// RTS (connected QPs), then `ACCEPT` (the REP); `ESTABLISHED` follows as
/// an event when the RTU arrives (a synchronous id waits for it). If the
/// agent refuses, the QP goes to ERROR. `EINVAL`: no QP and no
/// parameters (rdma-core would crash), depths beyond the device's.
pub(crate) extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    with_id("rdma_accept", id, |cm| {
        // SAFETY: NULL or the application's parameters.
        let param = unsafe { conn_param.as_ref() };
        if cm.id.qp.is_null() && param.is_none() {
            return Err(libc::EINVAL);
        }
        valid_param(cm, param)?;
        let dev = cm.device().ok_or(libc::EINVAL)?;
        let (max_init, max_resp) = (dev.max_initiator_depth, dev.max_responder_resources);
        cm.initiator_depth = match param {
            Some(p) if p.initiator_depth != MAX_INIT_DEPTH => p.initiator_depth,
            _ => cm.initiator_depth.min(max_init),
        };
        cm.responder_resources = match param {
            Some(p) if p.responder_resources != MAX_RESP_RES => p.responder_resources,
            _ => cm.responder_resources.min(max_resp),
        };
        let ud = cm.id.qp_type == IBV_QPT_UD;
        if !ud {
            modify_qp_rtr(cm, cm.responder_resources)?;
            modify_qp_rts(cm, cm.initiator_depth)?;
        }
        let (qp_num, srq) = qp_num_srq(&cm.id, param);
        let cmd = kabi::rdma_ucm_accept {
            uid: std::ptr::from_mut(cm) as u64,
            conn_param: conn_param_to_kern(cm, param, qp_num, srq),
            id: cm.handle,
            reserved: 0,
            ece: kabi::rdma_ucm_ece {
                vendor_id: cm.remote_ece.0,
                attr_mod: cm.local_ece.1,
            },
        };
        if let Err(e) = cm
            .channel()
            .exec(kabi::RDMA_USER_CM_CMD_ACCEPT, &cmd, &[], &mut [])
        {
            let _ = modify_qp_err(&cm.id);
            return Err(e);
        }
        if ud {
            return Ok(());
        }
        complete(cm)
    })
}

/// rdma-core's `reject_with_reason` (`REJECT`).
fn reject(
    name: &str,
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
    reason: u8,
) -> c_int {
    with_id(name, id, |cm| {
        let mut cmd = kabi::rdma_ucm_reject {
            id: cm.handle,
            reason,
            ..zeroed()
        };
        if !private_data.is_null() && len > 0 {
            // SAFETY: the application's private data of `len` bytes.
            let pd = unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), len.into()) };
            cmd.private_data[..pd.len()].copy_from_slice(pd);
            cmd.private_data_len = len;
        }
        cm.channel()
            .exec(kabi::RDMA_USER_CM_CMD_REJECT, &cmd, &[], &mut [])
    })
}

/// `rdma_reject(3)`: rejects a connection request (REJ, reason 0: the
/// agent's CM picks the consumer reason), with up to 255 bytes of private data.
pub(crate) extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    reject("rdma_reject", id, private_data, private_data_len, 0)
}

/// `rdma_reject_ece(3)`: rejects for unsupported ECE options (reason 35).
pub(crate) extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    reject(
        "rdma_reject_ece",
        id,
        private_data,
        private_data_len,
        REJ_VENDOR_OPTION_NOT_SUPPORTED,
    )
}

/// `rdma_notify(3)`: tells the agent of a QP event (`NOTIFY`), e.g.
/// `IBV_EVENT_COMM_EST` when data arrived before the RTU.
pub(crate) extern "C" fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int {
    with_id("rdma_notify", id, |cm| {
        let cmd = kabi::rdma_ucm_notify {
            id: cm.handle,
            event,
        };
        cm.channel()
            .exec(kabi::RDMA_USER_CM_CMD_NOTIFY, &cmd, &[], &mut [])
    })
}

/// `rdma_disconnect(3)`: the QP to ERROR (rdma-core's `ucma_shutdown` for
/// an InfiniBand-transport device, RoCE included), then `DISCONNECT` (the
/// DREQ); `DISCONNECTED` follows as an event (a synchronous id waits).
/// `EINVAL` for an id without a device (or of another transport).
pub(crate) extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    with_id("rdma_disconnect", id, |cm| {
        if !transport_ib(&cm.id) {
            return Err(libc::EINVAL);
        }
        modify_qp_err(&cm.id)?;
        let cmd = kabi::rdma_ucm_disconnect { id: cm.handle };
        cm.channel()
            .exec(kabi::RDMA_USER_CM_CMD_DISCONNECT, &cmd, &[], &mut [])?;
        complete(cm)
    })
}

/// rdma-core's `ucma_process_conn_resp`: on the agent's
/// `CONNECT_RESPONSE` (the REP), the QP (if any) to RTR and RTS, then
/// `ACCEPT` (the agent sends the RTU); on failure the QP goes to ERROR.
pub(crate) fn process_conn_resp(cm: &mut CmId) -> Result<(), c_int> {
    let r = modify_qp_rtr(cm, MAX_RESP_RES)
        .and_then(|()| modify_qp_rts(cm, MAX_INIT_DEPTH))
        .and_then(|()| {
            let cmd = kabi::rdma_ucm_accept {
                id: cm.handle,
                ..zeroed()
            };
            cm.channel()
                .exec(kabi::RDMA_USER_CM_CMD_ACCEPT, &cmd, &[], &mut [])
        });
    if r.is_err() {
        let _ = modify_qp_err(&cm.id);
    }
    r
}

/// `rdma_establish(3)`: completes an active connection whose QP the
/// application moves itself (no QP on the id: `EINVAL`): after
/// `RDMA_CM_EVENT_CONNECT_RESPONSE`, sends the agent `ACCEPT` (the RTU).
pub(crate) extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    with_id("rdma_establish", id, |cm| {
        if !cm.id.qp.is_null() {
            return Err(libc::EINVAL);
        }
        process_conn_resp(cm)
    })
}
