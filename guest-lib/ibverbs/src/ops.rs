//! The data-path operations verbs.h's inline functions call through
//! `ibv_context.ops`: `ibv_poll_cq` → `ops.poll_cq`, `ibv_req_notify_cq` →
//! `ops.req_notify_cq`, `ibv_post_send` → `ops.post_send`, `ibv_post_recv`
//! → `ops.post_recv`, `ibv_post_srq_recv` → `ops.post_srq_recv`.

use crate::ffi as c;

/// Fills the ops table of a new context.
pub(crate) fn install(ops: &mut c::ibv_context_ops) {
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::qp::post_send);
    ops.post_recv = Some(crate::qp::post_recv);
    ops.post_srq_recv = Some(crate::srq::post_srq_recv);
}
