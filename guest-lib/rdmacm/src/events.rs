//! Events: `rdma_get_cm_event(3)`, `rdma_ack_cm_event(3)`,
//! `rdma_migrate_id(3)`, and what the library does on each event before
//! the application sees it (rdma-core `librdmacm/cma.c`,
//! `rdma_get_cm_event` and the `ucma_process_*` functions).
//!
//! The agent keeps events until `GET_EVENT` fetches one; with none it
//! answers `-EAGAIN` at once. A blocking `rdma_get_cm_event` then waits,
//! without holding the channel's lock, until the channel's `fd` (the
//! agent's wake descriptor) is readable or the agent's socket hangs up,
//! and asks again; with `O_NONBLOCK` on the channel's `fd` it returns
//! `EAGAIN` instead. Events name the id by its `uid` (the id's address,
//! given in `CREATE_ID`; only live ids are accepted), or, with `uid` 0,
//! by the agent's handle (only `ESTABLISHED` is reported so, as rdma-core
//! works around old kernels).

use std::ffi::c_int;

use vrnic_guest::agent::ucma::abi as kabi;

use crate::boundary::{fail, ffi, say};
use crate::channel::{self, Channel};
use crate::connect::process_conn_resp;
use crate::ffi::*;
use crate::id::{self, cm, CmId};
use crate::qp::modify_qp_err;
use crate::route::{query_route, transport_ib};
use crate::verbs::*;

/// An event as allocated by this library (rdma-core's `struct cma_event`).
#[repr(C)]
struct CmaEvent {
    /// What the application sees.
    event: rdma_cm_event,
    /// The private data `event.param` points to.
    private_data: [u8; kabi::RDMA_MAX_PRIVATE_DATA as usize],
    /// The id the event is accounted to (the listener, for a request).
    owner: *mut CmId,
}

/// rdma-core's `ucma_copy_conn_event`.
fn copy_conn_event(evt: &mut CmaEvent, src: &kabi::rdma_ucm_conn_param) {
    let n = usize::from(src.private_data_len);
    // SAFETY: `conn` is the member for connected ids.
    let dst = unsafe { &mut evt.event.param.conn };
    dst.private_data_len = src.private_data_len;
    if n > 0 {
        evt.private_data[..n].copy_from_slice(&src.private_data[..n]);
        dst.private_data = evt.private_data.as_ptr().cast();
    }
    dst.responder_resources = src.responder_resources;
    dst.initiator_depth = src.initiator_depth;
    dst.flow_control = src.flow_control;
    dst.retry_count = src.retry_count;
    dst.rnr_retry_count = src.rnr_retry_count;
    dst.srq = src.srq;
    dst.qp_num = src.qp_num;
}

/// rdma-core's `ucma_copy_ud_event`.
fn copy_ud_event(evt: &mut CmaEvent, src: &kabi::rdma_ucm_ud_param) {
    let n = usize::from(src.private_data_len);
    // SAFETY: `ud` is the member for UD ids.
    let dst = unsafe { &mut evt.event.param.ud };
    dst.private_data_len = src.private_data_len;
    if n > 0 {
        evt.private_data[..n].copy_from_slice(&src.private_data[..n]);
        dst.private_data = evt.private_data.as_ptr().cast();
    }
    ah_attr_from_kern(&mut dst.ah_attr, &src.ah_attr);
    dst.qp_num = src.qp_num;
    dst.qkey = src.qkey;
}

/// Copies the event's parameters as the id's QP type wants them.
fn copy_params(evt: &mut CmaEvent, ud: bool, resp: &kabi::rdma_ucm_event_resp) {
    if ud {
        // SAFETY: the agent's answer; `ud` is read for UD ids.
        copy_ud_event(evt, unsafe { &resp.param.ud });
    } else {
        // SAFETY: as above, `conn` for connected ids.
        copy_conn_event(evt, unsafe { &resp.param.conn });
    }
}

/// rdma-core's `ucma_process_conn_req`: a new id for the request, on the
/// listener's channel with its context, port space and QP type, with the
/// agent's handle of it; moved to a channel of its own for a synchronous
/// listener; its addresses, route and device queried (`QUERY_ROUTE`), so
/// that it has the listener's device's `verbs` and PD.
fn process_conn_req(
    evt: &mut CmaEvent,
    listener: &mut CmId,
    handle: u32,
    ece: &kabi::rdma_ucm_ece,
) -> Result<(), c_int> {
    let new = match id::alloc(
        listener.id.channel,
        listener.id.context,
        listener.id.ps,
        listener.id.qp_type,
    ) {
        Ok(n) => n,
        Err(e) => {
            let _ = id::destroy_kern_id(listener.channel(), handle);
            listener.complete_event();
            return Err(e);
        }
    };
    // SAFETY: the id just allocated.
    let n = unsafe { &mut *new };
    evt.event.listen_id = &mut listener.id;
    evt.event.id = &mut n.id;
    n.handle = handle;
    id::insert(new);
    // SAFETY: rdma-core reads `conn` whatever the QP type.
    let conn = unsafe { &evt.event.param.conn };
    n.initiator_depth = conn.initiator_depth;
    n.responder_resources = conn.responder_resources;
    n.remote_ece = (ece.vendor_id, ece.attr_mod);
    let r = if listener.sync {
        migrate(n, std::ptr::null_mut())
    } else {
        Ok(())
    }
    .and_then(|()| query_route(n));
    if let Err(e) = r {
        say(&format!(
            "a connection request could not be given an id (errno {e}); it is dropped"
        ));
        // SAFETY: the new id, never handed out.
        let _ = unsafe { id::destroy(&mut n.id) };
        listener.complete_event();
        return Err(e);
    }
    Ok(())
}

/// rdma-core's `ucma_process_conn_resp_ece`: the peer's ECE onto the QP,
/// then [`process_conn_resp`].
fn process_conn_resp_ece(cm: &mut CmId, ece: &kabi::rdma_ucm_ece) -> Result<(), c_int> {
    let mut e = ibv_ece {
        vendor_id: ece.vendor_id,
        options: ece.attr_mod,
        comp_mask: 0,
    };
    if ece.vendor_id == 0 {
        e.vendor_id = cm.local_ece.0;
        e.options = 0;
    } else if ece.vendor_id != cm.local_ece.0 {
        let _ = modify_qp_err(&cm.id);
        return Err(libc::EINVAL);
    }
    cm.remote_ece.0 = ece.vendor_id;
    // SAFETY: the id's live QP (the caller checked it is there).
    let r = unsafe { ibv_set_ece(cm.id.qp, &mut e) };
    if r != 0 && r != libc::EOPNOTSUPP {
        return Err(r);
    }
    process_conn_resp(cm)?;
    // SAFETY: as above.
    let r = unsafe { ibv_query_ece(cm.id.qp, &mut e) };
    if r != 0 && r != libc::EOPNOTSUPP {
        let _ = modify_qp_err(&cm.id);
        return Err(r);
    }
    cm.local_ece.1 = if r == libc::EOPNOTSUPP { 0 } else { e.options };
    Ok(())
}

/// An error as an event status (negative errno, as the kernel's).
fn status(r: Result<(), c_int>) -> c_int {
    r.err().map_or(0, |e| -e)
}

/// Makes the application's event of the agent's answer, as rdma-core's
/// `rdma_get_cm_event` does; `None` for an event to drop (unknown id, a
/// request that could not be given an id, what follows a CONNECT_ERROR).
fn process(resp: &kabi::rdma_ucm_event_resp) -> Option<Box<CmaEvent>> {
    let mut evt = Box::new(CmaEvent {
        event: zeroed(),
        private_data: [0; kabi::RDMA_MAX_PRIVATE_DATA as usize],
        owner: std::ptr::null_mut(),
    });
    evt.event.event = resp.event;
    let owner = if resp.uid != 0 {
        let Some(c) = id::lookup_uid(resp.uid) else {
            say(&format!(
                "discarding event {} for uid {:#x}, not an id of this process",
                resp.event, resp.uid
            ));
            return None;
        };
        c
    } else {
        let Some(c) = id::lookup_handle(resp.id) else {
            say("discarding unmatched event - rdma_destroy_id may hang");
            return None;
        };
        if resp.event != RDMA_CM_EVENT_ESTABLISHED {
            // SAFETY: a live id.
            unsafe { &*c }.complete_event();
            return None;
        }
        c
    };
    // SAFETY: a live id of this library.
    let cm = unsafe { &mut *owner };
    evt.owner = owner;
    evt.event.id = &mut cm.id;
    evt.event.status = resp.status as c_int;
    let ud = cm.id.qp_type == IBV_QPT_UD;
    match resp.event {
        RDMA_CM_EVENT_ADDR_RESOLVED => {
            evt.event.status = status(query_route(cm));
            if evt.event.status != 0 {
                evt.event.event = RDMA_CM_EVENT_ADDR_ERROR;
            } else if cm.dev.is_null() {
                // As rdma-core: not an error, but the id has no device.
                say("ADDR_RESOLVED, but the agent named no device (node GUID 0)");
            }
        }
        RDMA_CM_EVENT_ROUTE_RESOLVED => {
            if transport_ib(&cm.id) {
                evt.event.status = status(query_route(cm));
                if evt.event.status != 0 {
                    evt.event.event = RDMA_CM_EVENT_ROUTE_ERROR;
                }
            }
        }
        RDMA_CM_EVENT_CONNECT_REQUEST => {
            copy_params(&mut evt, ud, resp);
            process_conn_req(&mut evt, cm, resp.id, &resp.ece).ok()?;
        }
        RDMA_CM_EVENT_CONNECT_RESPONSE => {
            // SAFETY: the agent's answer, connected parameters.
            copy_conn_event(&mut evt, unsafe { &resp.param.conn });
            if cm.id.qp.is_null() {
                cm.remote_ece = (resp.ece.vendor_id, resp.ece.attr_mod);
            } else {
                evt.event.status = status(process_conn_resp_ece(cm, &resp.ece));
                if evt.event.status == 0 {
                    evt.event.event = RDMA_CM_EVENT_ESTABLISHED;
                } else {
                    evt.event.event = RDMA_CM_EVENT_CONNECT_ERROR;
                    cm.connect_error = true;
                }
            }
        }
        RDMA_CM_EVENT_ESTABLISHED => copy_params(&mut evt, ud, resp),
        RDMA_CM_EVENT_REJECTED | RDMA_CM_EVENT_DISCONNECTED => {
            if cm.connect_error {
                cm.complete_event();
                return None;
            }
            // SAFETY: the agent's answer, connected parameters.
            copy_conn_event(&mut evt, unsafe { &resp.param.conn });
            if resp.event == RDMA_CM_EVENT_REJECTED {
                let _ = modify_qp_err(&cm.id);
            }
        }
        _ => copy_params(&mut evt, ud, resp),
    }
    Some(evt)
}

/// The next event of `ch` (see the module documentation).
pub(crate) fn get(ch: &Channel) -> Result<*mut rdma_cm_event, c_int> {
    // rdma_destroy_event_channel from another thread leaves the channel to
    // this one (channel::destroy).
    let _w = ch.waiting();
    let nonblock = ch.nonblocking();
    loop {
        let cmd: kabi::rdma_ucm_get_event = zeroed();
        let mut resp: kabi::rdma_ucm_event_resp = zeroed();
        match ch.exec_resp(kabi::RDMA_USER_CM_CMD_GET_EVENT, &cmd, &mut resp) {
            Err(libc::EAGAIN) if !nonblock => {
                ch.wait()?;
                continue;
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        if let Some(evt) = process(&resp) {
            return Ok(Box::into_raw(evt).cast());
        }
    }
}

/// `rdma_get_cm_event(3)`: the next event of `channel`, waiting for one
/// unless the channel's `fd` is non-blocking (`EAGAIN`); acknowledge it
/// with [`rdma_ack_cm_event`]. An agent gone is an error (its errno,
/// e.g. `ECONNRESET`), not a wait. NULL arguments: `EINVAL`.
pub(crate) extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    ffi("rdma_get_cm_event", || {
        if channel.is_null() || event.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a channel of this library.
        match get(unsafe { channel::of(channel) }) {
            Ok(e) => {
                // SAFETY: non-NULL, the caller's pointer.
                unsafe { *event = e };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// rdma-core's `rdma_ack_cm_event` on an event of this library: counts
/// it acknowledged for its id and frees it.
pub(crate) fn ack(event: *mut rdma_cm_event) {
    // SAFETY: events handed out are CmaEvent Boxes (the C struct first).
    let evt = unsafe { Box::from_raw(event.cast::<CmaEvent>()) };
    // SAFETY: the owner outlives its unacknowledged events (rdma_destroy_id
    // waits for them).
    unsafe { &*evt.owner }.complete_event();
}

/// `rdma_ack_cm_event(3)`: frees an event; every event must be
/// acknowledged before its id can be destroyed. NULL: `EINVAL`.
pub(crate) extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    ffi("rdma_ack_cm_event", || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        ack(event);
        0
    })
}

/// rdma-core's `ucma_complete`: a synchronous id waits for the event its
/// call caused, keeps it in `id->event`, and turns its status into the
/// call's error (`ECONNREFUSED` for a rejection). Other ids: nothing.
pub(crate) fn complete(cm: &mut CmId) -> Result<(), c_int> {
    if !cm.sync {
        return Ok(());
    }
    if !cm.id.event.is_null() {
        ack(cm.id.event);
        cm.id.event = std::ptr::null_mut();
    }
    let ev = get(cm.channel())?;
    cm.id.event = ev;
    // SAFETY: the event just fetched.
    let ev = unsafe { &*ev };
    match ev.status {
        0 => Ok(()),
        _ if ev.event == RDMA_CM_EVENT_REJECTED => Err(libc::ECONNREFUSED),
        s if s < 0 => Err(-s),
        s => Err(s),
    }
}

/// rdma-core's `rdma_migrate_id`: `MIGRATE_ID` on the new channel (a new
/// channel of the id's own for NULL), naming the old one by its number;
/// waits until the events the agent reported for the id are acknowledged.
pub(crate) fn migrate(cm: &mut CmId, channel: *mut rdma_event_channel) -> Result<(), c_int> {
    if cm.sync && channel.is_null() {
        return Err(libc::EINVAL);
    }
    let sync = channel.is_null();
    let channel = if sync {
        channel::create()?.cast::<rdma_event_channel>()
    } else {
        channel
    };
    // SAFETY: a channel of this library (the application's or ours).
    let new = unsafe { channel::of(channel) };
    let cmd = kabi::rdma_ucm_migrate_id {
        id: cm.handle,
        fd: cm.channel().number(),
        ..zeroed()
    };
    let mut resp: kabi::rdma_ucm_migrate_resp = zeroed();
    if let Err(e) = new.exec_resp(kabi::RDMA_USER_CM_CMD_MIGRATE_ID, &cmd, &mut resp) {
        if sync {
            // SAFETY: the channel just made, unused.
            unsafe { channel::destroy(channel.cast()) };
        }
        return Err(e);
    }
    if cm.sync {
        if !cm.id.event.is_null() {
            ack(cm.id.event);
            cm.id.event = std::ptr::null_mut();
        }
        // SAFETY: the id's own channel, no longer used.
        unsafe { channel::destroy(cm.id.channel.cast()) };
    }
    cm.sync = sync;
    cm.id.channel = channel;
    cm.wait_events(resp.events_reported);
    Ok(())
}

/// `rdma_migrate_id(3)`: moves the id to `channel` (NULL: a channel of its
/// own, making it synchronous; `EINVAL` for an id that is already so).
pub(crate) extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    ffi("rdma_migrate_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an id of this library.
        match migrate(unsafe { cm(id) }, channel) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}
