//! The extended post-send API of `ibv_wr_post(3)`: the functions behind
//! `struct ibv_qp_ex`'s pointers, which verbs.h's inline `ibv_wr_start`,
//! `ibv_wr_send`, `ibv_wr_set_sge`, `ibv_wr_complete`, ... call.
//!
//! As rdma-core's rxe provider (`providers/rxe/rxe.c`): `ibv_wr_start`
//! opens a batch; each operation (`ibv_wr_send`, `ibv_wr_rdma_write`, ...)
//! starts a new work request with the `wr_id` and `wr_flags` the
//! application wrote into `qp_ex` just before; the setters
//! (`ibv_wr_set_sge`, `ibv_wr_set_sge_list`, `ibv_wr_set_inline_data(_list)`,
//! `ibv_wr_set_ud_addr`) complete the last one. The first error (a setter
//! without an operation, inline data beyond `max_inline_data`: rxe's
//! `ENOSPC`, a NULL AH) is kept and returned by `ibv_wr_complete`, which
//! then posts nothing, as rxe's `wr_complete` (which moves the producer
//! index over none of the batch on an error); otherwise `ibv_wr_complete`
//! posts the whole batch with one doorbell, or nothing
//! (`Qp::post_send_list`: every request checked and room for all of them
//! first; a full send queue is `ENOSPC` as in rxe's `check_qp_queue_full`).
//! `ibv_wr_abort` discards the batch.

use std::ffi::{c_int, c_void};

use vrnic_abi::Sge;
use vrnic_guest::verbs::{AtomicWr, RdmaWr, SendWr, UdWr, VerbsError, WrOpcode};

use crate::boundary::ffi;
use crate::events::lock;
use crate::ffi as c;
use crate::qp::VrnicQp;

/// One work request being built.
struct Pending {
    wr_id: u64,
    opcode: WrOpcode,
    /// `IBV_SEND_FENCE`, `_SIGNALED`, `_SOLICITED` of `qp_ex->wr_flags`.
    flags: u8,
    sges: Vec<Sge>,
    inline: Option<Vec<u8>>,
    imm: u32,
    rdma: RdmaWr,
    atomic: AtomicWr,
    /// `ibv_wr_set_ud_addr`'s destination (UD).
    ud: Option<UdWr>,
}

/// The work requests built since `ibv_wr_start`, and the first error.
#[derive(Default)]
pub(crate) struct Batch {
    wrs: Vec<Pending>,
    err: c_int,
}

impl Batch {
    /// Records `e` unless an earlier error is kept.
    fn fail(&mut self, e: c_int) {
        if self.err == 0 {
            self.err = e;
        }
    }
}

/// The `IBV_QP_EX_WITH_*` operations vrnic posts on a QP of type `t` (as
/// rxe's `map_send_flags`, without memory windows and local invalidate,
/// which vrnic does not have).
pub(crate) fn supported_send_ops(t: c::ibv_qp_type) -> u64 {
    let write = c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE
        | c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
    let send = c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND
        | c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_IMM;
    let rc_only = c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ
        | c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
        | c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD
        | c::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND_WITH_INV;
    u64::from(match t {
        c::ibv_qp_type_IBV_QPT_RC => write | send | rc_only,
        c::ibv_qp_type_IBV_QPT_UC => write | send,
        c::ibv_qp_type_IBV_QPT_UD => send,
        _ => 0,
    })
}

/// Fills `qp`'s post-send function pointers. What vrnic does not have
/// (`wr_bind_mw`, `wr_local_inv`, `wr_send_tso`, `wr_set_xrc_srqn`,
/// `wr_atomic_write`) stays NULL: `ibv_create_qp_ex` refuses their
/// `IBV_QP_EX_WITH_*` flags, and an application may only call what it asked for.
pub(crate) fn install(qp: &mut c::ibv_qp_ex) {
    qp.wr_atomic_cmp_swp = Some(wr_atomic_cmp_swp);
    qp.wr_atomic_fetch_add = Some(wr_atomic_fetch_add);
    qp.wr_rdma_read = Some(wr_rdma_read);
    qp.wr_rdma_write = Some(wr_rdma_write);
    qp.wr_rdma_write_imm = Some(wr_rdma_write_imm);
    qp.wr_send = Some(wr_send);
    qp.wr_send_imm = Some(wr_send_imm);
    qp.wr_send_inv = Some(wr_send_inv);
    qp.wr_set_ud_addr = Some(wr_set_ud_addr);
    qp.wr_set_inline_data = Some(wr_set_inline_data);
    qp.wr_set_inline_data_list = Some(wr_set_inline_data_list);
    qp.wr_set_sge = Some(wr_set_sge);
    qp.wr_set_sge_list = Some(wr_set_sge_list);
    qp.wr_start = Some(wr_start);
    qp.wr_complete = Some(wr_complete);
    qp.wr_abort = Some(wr_abort);
}

/// Runs `f` on the batch of `qp` (nothing for NULL: these functions return
/// nothing, and `ibv_wr_complete` reports a NULL QP).
fn with_batch(name: &str, qp: *mut c::ibv_qp_ex, f: impl FnOnce(&mut Batch, &VrnicQp)) {
    ffi(name, (), || {
        // SAFETY: the application passes a QP from ibv_qp_to_qp_ex (a
        // VrnicQp starts with its ibv_qp_ex) or NULL.
        if let Some(v) = unsafe { VrnicQp::from_ptr(qp.cast()) } {
            f(&mut lock(&v.batch), v);
        }
    });
}

/// Starts a new work request of `opcode` with the `wr_id` and `wr_flags`
/// the application wrote into `qp`.
fn push(name: &str, qp: *mut c::ibv_qp_ex, opcode: WrOpcode, fill: impl FnOnce(&mut Pending)) {
    // SAFETY: `qp` is live or NULL; wr_id and wr_flags are plain fields the
    // application set before this call (ibv_wr_post(3)).
    let (wr_id, wr_flags) = match unsafe { qp.as_ref() } {
        Some(q) => (q.wr_id, q.wr_flags),
        None => return,
    };
    let flags = (wr_flags
        & (c::ibv_send_flags_IBV_SEND_FENCE
            | c::ibv_send_flags_IBV_SEND_SIGNALED
            | c::ibv_send_flags_IBV_SEND_SOLICITED)) as u8;
    with_batch(name, qp, |b, _| {
        let mut p = Pending {
            wr_id,
            opcode,
            flags,
            sges: Vec::new(),
            inline: None,
            imm: 0,
            rdma: RdmaWr::default(),
            atomic: AtomicWr::default(),
            ud: None,
        };
        fill(&mut p);
        b.wrs.push(p);
    });
}

/// Applies a setter to the last work request (`EINVAL` kept when there is none).
fn set_last(name: &str, qp: *mut c::ibv_qp_ex, f: impl FnOnce(&mut Pending, &VrnicQp) -> c_int) {
    with_batch(name, qp, |b, v| {
        let e = match b.wrs.last_mut() {
            Some(p) => f(p, v),
            None => libc::EINVAL,
        };
        if e != 0 {
            b.fail(e);
        }
    });
}

/// `ibv_wr_atomic_cmp_swp`: compare `compare` and swap in `swap` at
/// `remote_addr` (the 8-byte SGE given next receives the old value).
unsafe extern "C" fn wr_atomic_cmp_swp(
    qp: *mut c::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let atomic = AtomicWr {
        remote_addr,
        rkey,
        compare_add: compare,
        swap,
    };
    push(
        "ibv_wr_atomic_cmp_swp",
        qp,
        WrOpcode::AtomicCmpAndSwp,
        |p| p.atomic = atomic,
    );
}

/// `ibv_wr_atomic_fetch_add`: add `add` at `remote_addr`.
unsafe extern "C" fn wr_atomic_fetch_add(
    qp: *mut c::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let atomic = AtomicWr {
        remote_addr,
        rkey,
        compare_add: add,
        swap: 0,
    };
    push(
        "ibv_wr_atomic_fetch_add",
        qp,
        WrOpcode::AtomicFetchAndAdd,
        |p| p.atomic = atomic,
    );
}

/// `ibv_wr_rdma_read`.
unsafe extern "C" fn wr_rdma_read(qp: *mut c::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push("ibv_wr_rdma_read", qp, WrOpcode::RdmaRead, |p| {
        p.rdma = RdmaWr { remote_addr, rkey };
    });
}

/// `ibv_wr_rdma_write`.
unsafe extern "C" fn wr_rdma_write(qp: *mut c::ibv_qp_ex, rkey: u32, remote_addr: u64) {
    push("ibv_wr_rdma_write", qp, WrOpcode::RdmaWrite, |p| {
        p.rdma = RdmaWr { remote_addr, rkey };
    });
}

/// `ibv_wr_rdma_write_imm` (`imm_data` in network order, as `__be32`).
unsafe extern "C" fn wr_rdma_write_imm(
    qp: *mut c::ibv_qp_ex,
    rkey: u32,
    remote_addr: u64,
    imm_data: u32,
) {
    push(
        "ibv_wr_rdma_write_imm",
        qp,
        WrOpcode::RdmaWriteWithImm,
        |p| {
            p.rdma = RdmaWr { remote_addr, rkey };
            p.imm = u32::from_be(imm_data);
        },
    );
}

/// `ibv_wr_send`.
unsafe extern "C" fn wr_send(qp: *mut c::ibv_qp_ex) {
    push("ibv_wr_send", qp, WrOpcode::Send, |_| {});
}

/// `ibv_wr_send_imm` (`imm_data` in network order).
unsafe extern "C" fn wr_send_imm(qp: *mut c::ibv_qp_ex, imm_data: u32) {
    push("ibv_wr_send_imm", qp, WrOpcode::SendWithImm, |p| {
        p.imm = u32::from_be(imm_data);
    });
}

/// `ibv_wr_send_inv`: a SEND that invalidates `invalidate_rkey` at the responder.
unsafe extern "C" fn wr_send_inv(qp: *mut c::ibv_qp_ex, invalidate_rkey: u32) {
    push("ibv_wr_send_inv", qp, WrOpcode::SendWithInv, |p| {
        p.imm = invalidate_rkey;
    });
}

/// `ibv_wr_set_ud_addr`: the destination of the last UD send (`EINVAL`
/// kept for a NULL AH).
unsafe extern "C" fn wr_set_ud_addr(
    qp: *mut c::ibv_qp_ex,
    ah: *mut c::ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    set_last("ibv_wr_set_ud_addr", qp, |p, _| {
        // SAFETY: the application passes a live AH or NULL.
        match unsafe { crate::ah::handle_of(ah) } {
            Some(h) => {
                p.ud = Some(UdWr {
                    ah: h,
                    remote_qpn,
                    remote_qkey,
                });
                0
            }
            None => libc::EINVAL,
        }
    });
}

/// Copies `len` bytes at `addr` (NULL only with 0 bytes).
///
/// # Safety
/// A non-NULL `addr` names `len` readable bytes.
unsafe fn bytes<'a>(addr: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    // SAFETY: per the contract.
    (!addr.is_null()).then(|| unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) })
}

/// Sets the last request's inline data to the buffers of `bufs` (copied
/// now, as ibv_wr_post(3) says); `ENOSPC` beyond the QP's
/// `max_inline_data` (rxe's `wr_set_inline_data`), `EINVAL` for a NULL buffer.
fn set_inline(p: &mut Pending, v: &VrnicQp, bufs: &[(*const c_void, usize)]) -> c_int {
    let max = lock(&v.inner).cap().max_inline_data as usize;
    let total = bufs.iter().fold(0usize, |a, b| a.saturating_add(b.1));
    if total > max {
        return libc::ENOSPC;
    }
    let mut data = Vec::with_capacity(total);
    for &(addr, len) in bufs {
        // SAFETY: the application's buffer of `len` bytes (ibv_wr_post(3)).
        match unsafe { bytes(addr, len) } {
            Some(b) => data.extend_from_slice(b),
            None => return libc::EINVAL,
        }
    }
    p.sges.clear();
    p.inline = Some(data);
    0
}

/// `ibv_wr_set_inline_data`.
unsafe extern "C" fn wr_set_inline_data(qp: *mut c::ibv_qp_ex, addr: *mut c_void, length: usize) {
    set_last("ibv_wr_set_inline_data", qp, |p, v| {
        set_inline(p, v, &[(addr.cast_const(), length)])
    });
}

/// `ibv_wr_set_inline_data_list`.
unsafe extern "C" fn wr_set_inline_data_list(
    qp: *mut c::ibv_qp_ex,
    num_buf: usize,
    buf_list: *const c::ibv_data_buf,
) {
    set_last("ibv_wr_set_inline_data_list", qp, |p, v| {
        if num_buf > 0 && buf_list.is_null() {
            return libc::EINVAL;
        }
        let list = if num_buf == 0 {
            &[][..]
        } else {
            // SAFETY: the application's list of num_buf buffers (non-NULL, checked).
            unsafe { std::slice::from_raw_parts(buf_list, num_buf) }
        };
        let bufs: Vec<_> = list
            .iter()
            .map(|b| (b.addr.cast_const(), b.length))
            .collect();
        set_inline(p, v, &bufs)
    });
}

/// `ibv_wr_set_sge`: the last request's one SGE (a zero `length` means no
/// data, as rxe's `wr_set_sge`).
unsafe extern "C" fn wr_set_sge(qp: *mut c::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    set_last("ibv_wr_set_sge", qp, |p, _| {
        p.inline = None;
        p.sges.clear();
        if length != 0 {
            p.sges.push(Sge { addr, length, lkey });
        }
        0
    });
}

/// `ibv_wr_set_sge_list`: the last request's SGEs (more than the QP's
/// `max_send_sge` fails at `ibv_wr_complete` with `EINVAL`).
unsafe extern "C" fn wr_set_sge_list(
    qp: *mut c::ibv_qp_ex,
    num_sge: usize,
    sg_list: *const c::ibv_sge,
) {
    set_last("ibv_wr_set_sge_list", qp, |p, _| {
        let Ok(n) = c_int::try_from(num_sge) else {
            return libc::EINVAL;
        };
        // SAFETY: the application's list of num_sge SGEs (ibv_wr_post(3)).
        match unsafe { crate::qp::sges(sg_list, n) } {
            Ok(sg) => {
                p.inline = None;
                p.sges = sg;
                0
            }
            Err(e) => e,
        }
    });
}

/// `ibv_wr_start`: opens a new batch (an unfinished one is discarded).
unsafe extern "C" fn wr_start(qp: *mut c::ibv_qp_ex) {
    with_batch("ibv_wr_start", qp, |b, _| *b = Batch::default());
}

/// `ibv_wr_abort`: discards the batch; nothing is posted.
unsafe extern "C" fn wr_abort(qp: *mut c::ibv_qp_ex) {
    with_batch("ibv_wr_abort", qp, |b, _| *b = Batch::default());
}

/// `ibv_wr_complete`: posts the batch with one doorbell and returns 0, or
/// returns the first error and posts nothing (`EINVAL` for a NULL QP).
unsafe extern "C" fn wr_complete(qp: *mut c::ibv_qp_ex) -> c_int {
    ffi("ibv_wr_complete", libc::EIO, || {
        // SAFETY: the application passes a QP from ibv_qp_to_qp_ex or NULL.
        let Some(v) = (unsafe { VrnicQp::from_ptr(qp.cast()) }) else {
            return libc::EINVAL;
        };
        let b = std::mem::take(&mut *lock(&v.batch));
        if b.err != 0 {
            return b.err;
        }
        let mut inner = lock(&v.inner);
        let is_ud = inner.qp_type() == vrnic_guest::verbs::QpType::Ud;
        if is_ud && b.wrs.iter().any(|p| p.ud.is_none()) {
            // A UD send needs ibv_wr_set_ud_addr.
            return libc::EINVAL;
        }
        let wrs: Vec<SendWr<'_>> = b
            .wrs
            .iter()
            .map(|p| SendWr {
                wr_id: p.wr_id,
                opcode: p.opcode,
                send_flags: p.flags,
                sg_list: &p.sges,
                inline_data: p.inline.as_deref(),
                imm_data: p.imm,
                rdma: p.rdma,
                atomic: p.atomic,
                ud: p.ud.unwrap_or_default(),
            })
            .collect();
        match inner.post_send_list(&wrs) {
            Ok(()) => 0,
            Err(VerbsError::QueueFull { .. }) => libc::ENOSPC,
            Err(e) => e.errno(),
        }
    })
}
