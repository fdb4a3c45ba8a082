//! Completion queues: `ibv_create_cq(3)`, `ibv_destroy_cq(3)`, and the
//! inline fast path's `ops.poll_cq` (`ibv_poll_cq(3)`) and
//! `ops.req_notify_cq` (`ibv_req_notify_cq(3)`).

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use vrnic_guest::verbs::{Cq, WorkCompletion};

use crate::boundary::{ffi, set_errno};
use crate::context::VrnicContext;
use crate::events::{channel_of, lock, Events};
use crate::ffi as c;

/// A CQ: the `struct ibv_cq` applications see, first.
#[repr(C)]
pub(crate) struct VrnicCq {
    pub(crate) cq: c::ibv_cq,
    pub(crate) inner: Mutex<Cq>,
    /// The device is in-process (loopback): yield on an empty poll.
    yield_when_empty: bool,
    /// The context's event tables (kept by the CQ: destroying it must not
    /// need the context, which a careless application may have closed).
    events: Arc<Events>,
}

impl VrnicCq {
    /// The CQ of an application's `ibv_cq *` (NULL: `None`).
    ///
    /// # Safety
    /// A non-NULL `cq` must come from [`ibv_create_cq`] and be alive.
    pub(crate) unsafe fn from_ptr<'a>(cq: *mut c::ibv_cq) -> Option<&'a VrnicCq> {
        // SAFETY: per the contract, `cq` is the start of a live VrnicCq.
        (!cq.is_null()).then(|| unsafe { &*cq.cast::<VrnicCq>() })
    }
}

/// `ibv_create_cq(3)`: a CQ of at least `cqe` entries whose completion
/// events go to `channel` (may be NULL); `comp_vector` must be 0 (one
/// vector). The CQ, or NULL with errno.
pub(crate) extern "C" fn ibv_create_cq(
    context: *mut c::ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut c::ibv_comp_channel,
    comp_vector: c_int,
) -> *mut c::ibv_cq {
    ffi("ibv_create_cq", std::ptr::null_mut(), || {
        // SAFETY: the application passes a context from ibv_open_device or NULL.
        let Some(ctx) = (unsafe { VrnicContext::from_ptr(context) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let Ok(n) = u32::try_from(cqe) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        if comp_vector != 0 {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let inner = match Cq::new(&ctx.verbs, n) {
            Ok(cq) => cq,
            Err(e) => {
                set_errno(e.errno());
                return std::ptr::null_mut();
            }
        };
        let cqn = inner.cqn();
        let cq = c::ibv_cq {
            context,
            channel,
            cq_context,
            handle: cqn,
            cqe: c_int::try_from(inner.capacity()).unwrap_or(c_int::MAX),
            ..Default::default()
        };
        let p = Box::into_raw(Box::new(VrnicCq {
            cq,
            inner: Mutex::new(inner),
            yield_when_empty: matches!(ctx.dev.kind, crate::device::DeviceKind::Loopback { .. }),
            events: ctx.events.events.clone(),
        }))
        .cast::<c::ibv_cq>();
        // SAFETY: the application passes a live channel or NULL.
        let ch = unsafe { channel_of(channel) };
        ctx.events.events.add_cq(cqn, p, ch);
        p
    })
}

/// `ibv_destroy_cq(3)`: 0, or `EINVAL` for NULL. The device's CQ goes when
/// the last QP using it is gone.
pub(crate) extern "C" fn ibv_destroy_cq(cq: *mut c::ibv_cq) -> c_int {
    ffi("ibv_destroy_cq", libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `cq` is the start of a VrnicCq boxed by ibv_create_cq.
        let b = unsafe { Box::from_raw(cq.cast::<VrnicCq>()) };
        b.events.remove_cq(b.cq.handle, cq);
        drop(b);
        0
    })
}

/// Converts a guest-lib completion to `struct ibv_wc` (immediate data in
/// network byte order, as `ibv_wc.imm_data` is `__be32`).
fn to_wc(w: &WorkCompletion) -> c::ibv_wc {
    let mut wc = c::ibv_wc {
        wr_id: w.wr_id,
        status: c::ibv_wc_status::from(w.status),
        opcode: c::ibv_wc_opcode::from(w.opcode),
        vendor_err: u32::from(w.vendor_err),
        byte_len: w.byte_len,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: u32::from(w.wc_flags),
        sl: w.sl,
        ..Default::default()
    };
    if let Some(imm) = w.imm_data {
        wc.__bindgen_anon_1.imm_data = imm.to_be();
    } else if let Some(rkey) = w.invalidated_rkey {
        wc.__bindgen_anon_1.invalidated_rkey = rkey;
    }
    wc
}

/// `ops.poll_cq` (`ibv_poll_cq(3)`): up to `num_entries` completions into
/// `wc`; their number, or -1 for a NULL argument.
pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut c::ibv_cq,
    num_entries: c_int,
    wc: *mut c::ibv_wc,
) -> c_int {
    ffi("ibv_poll_cq", -1, || {
        // SAFETY: the application passes a live CQ.
        let Some(vcq) = (unsafe { VrnicCq::from_ptr(cq) }) else {
            return -1;
        };
        let Ok(want) = usize::try_from(num_entries) else {
            return -1;
        };
        if want > 0 && wc.is_null() {
            return -1;
        }
        let mut inner = lock(&vcq.inner);
        let mut buf = [WorkCompletion::default(); 16];
        let mut done = 0usize;
        while done < want {
            let n = inner.poll(&mut buf[..(want - done).min(16)]);
            for w in &buf[..n] {
                // SAFETY: `wc` holds num_entries entries; done < want = num_entries.
                unsafe { wc.add(done).write(to_wc(w)) };
                done += 1;
            }
            if n < 16 {
                break;
            }
        }
        drop(inner);
        if done == 0 && vcq.yield_when_empty {
            // The device runs on an engine thread of this process: an
            // application spinning on an empty CQ lets it run (on a loaded
            // machine a busy-polling ping-pong is otherwise ~100x slower).
            std::thread::yield_now();
        }
        done as c_int
    })
}

/// `ops.req_notify_cq` (`ibv_req_notify_cq(3)`): arms the CQ for one
/// completion event (only a solicited one with `solicited_only`); 0 or an errno.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut c::ibv_cq, solicited_only: c_int) -> c_int {
    ffi("ibv_req_notify_cq", libc::EIO, || {
        // SAFETY: the application passes a live CQ.
        let Some(vcq) = (unsafe { VrnicCq::from_ptr(cq) }) else {
            return libc::EINVAL;
        };
        match lock(&vcq.inner).req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => e.errno(),
        }
    })
}
