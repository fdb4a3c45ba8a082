//! Queue pairs: `ibv_create_qp(3)`, `ibv_create_qp_ex(3)`
//! (`verbs_context.create_qp_ex`), `ibv_modify_qp(3)`, `ibv_query_qp(3)`,
//! `ibv_destroy_qp(3)`, the inline fast path's `ops.post_send`
//! (`ibv_post_send(3)`) and `ops.post_recv` (`ibv_post_recv(3)`), and the
//! extended post-send API of `ibv_wr_post(3)` (`ibv_qp_to_qp_ex`, the
//! `ibv_wr_*` inline functions calling through `struct ibv_qp_ex`), as
//! rdma-core's rxe provider (`rxe_create_qp_ex`, `wr_start`,
//! `wr_complete`, `wr_abort`, `wr_send`, ... in `providers/rxe/rxe.c`).

use std::ffi::c_int;
use std::sync::{Arc, Mutex};

use vrnic_abi::Sge;
use vrnic_guest::verbs::{
    AhAttr, AtomicWr, Gid, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RdmaWr, RecvWr, SendWr,
    UdWr, WrOpcode,
};

use crate::boundary::{fail_with_errno, ffi};
use crate::context::VrnicContext;
use crate::cq::VrnicCq;
use crate::events::{lock, Events};
use crate::ffi as c;
use crate::pd::VrnicPd;
use crate::udrx::UdRx;
use crate::wr::Batch;

/// A QP: the `struct ibv_qp_ex` applications see, first (its first member
/// is the `struct ibv_qp`, as in rdma-core's `struct verbs_qp`).
#[repr(C)]
pub(crate) struct VrnicQp {
    pub(crate) qp: c::ibv_qp_ex,
    pub(crate) inner: Mutex<Qp>,
    sq_sig_all: c_int,
    /// Created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`: `ibv_qp_to_qp_ex`
    /// answers (rdma-core's `VERBS_QP_EX`).
    is_ex: bool,
    /// The work requests built since `ibv_wr_start`.
    pub(crate) batch: Mutex<Batch>,
    /// The context's event tables (see `VrnicCq::events`).
    events: Arc<Events>,
    /// A UD QP with a receive queue of its own: its receive CQ's table of
    /// posted receives ([`crate::udrx`]).
    ud_rx: Option<Arc<UdRx>>,
}

impl VrnicQp {
    /// The QP of an application's `ibv_qp *` (NULL: `None`).
    ///
    /// # Safety
    /// A non-NULL `qp` must come from [`ibv_create_qp`] and be alive.
    pub(crate) unsafe fn from_ptr<'a>(qp: *mut c::ibv_qp) -> Option<&'a VrnicQp> {
        // SAFETY: per the contract, `qp` is the start of a live VrnicQp.
        (!qp.is_null()).then(|| unsafe { &*qp.cast::<VrnicQp>() })
    }
}

fn qp_type(t: c::ibv_qp_type) -> Option<QpType> {
    match t {
        c::ibv_qp_type_IBV_QPT_RC => Some(QpType::Rc),
        c::ibv_qp_type_IBV_QPT_UC => Some(QpType::Uc),
        c::ibv_qp_type_IBV_QPT_UD => Some(QpType::Ud),
        _ => None,
    }
}

fn to_cap(c: &QpCap) -> c::ibv_qp_cap {
    c::ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// `ibv_create_qp(3)`: an RC, UC or UD QP in RESET on `pd` with the CQs of
/// `init` (and its SRQ, if any); the capabilities obtained are written back
/// to `init->cap`. The QP, or NULL with errno.
pub(crate) extern "C" fn ibv_create_qp(
    pd: *mut c::ibv_pd,
    init: *mut c::ibv_qp_init_attr,
) -> *mut c::ibv_qp {
    ffi("ibv_create_qp", std::ptr::null_mut(), || {
        match create(pd, init) {
            Ok(p) => p,
            Err(e) => fail_with_errno(e),
        }
    })
}

fn create(pd: *mut c::ibv_pd, init: *mut c::ibv_qp_init_attr) -> Result<*mut c::ibv_qp, c_int> {
    create_with(pd, init, false)
}

/// Creates the QP of `init` on `pd`; `is_ex` makes it an extended QP
/// whose `ibv_wr_*` function pointers are filled.
fn create_with(
    pd: *mut c::ibv_pd,
    init: *mut c::ibv_qp_init_attr,
    is_ex: bool,
) -> Result<*mut c::ibv_qp, c_int> {
    // SAFETY: the application passes a live PD or NULL.
    let vpd = unsafe { VrnicPd::from_ptr(pd) }.ok_or(libc::EINVAL)?;
    if init.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL (checked), the caller's init attributes.
    let ia = unsafe { &mut *init };
    // SAFETY: the application passes a live SRQ or NULL.
    let vsrq = unsafe { crate::srq::VrnicSrq::from_ptr(ia.srq) };
    let t = qp_type(ia.qp_type).ok_or(libc::EOPNOTSUPP)?;
    // SAFETY: the PD's context is open (objects are created on open contexts).
    let ctx = unsafe { VrnicContext::from_ptr(vpd.pd.context) }.ok_or(libc::EINVAL)?;
    // SAFETY: the application passes live CQs (or NULL, refused).
    let scq = unsafe { VrnicCq::from_ptr(ia.send_cq) }.ok_or(libc::EINVAL)?;
    // SAFETY: as above.
    let rcq = unsafe { VrnicCq::from_ptr(ia.recv_cq) }.ok_or(libc::EINVAL)?;
    let cap = QpCap {
        max_send_wr: ia.cap.max_send_wr,
        max_recv_wr: ia.cap.max_recv_wr,
        max_send_sge: ia.cap.max_send_sge,
        max_recv_sge: ia.cap.max_recv_sge,
        max_inline_data: ia.cap.max_inline_data,
    };
    let sg = lock(&scq.inner);
    let rg = (!std::ptr::eq(scq, rcq)).then(|| lock(&rcq.inner));
    let srq_guard = vsrq.map(|s| lock(&s.inner));
    let attr = QpInitAttr {
        qp_type: t,
        send_cq: &sg,
        recv_cq: rg.as_deref().unwrap_or(&sg),
        srq: srq_guard.as_deref(),
        cap,
        sq_sig_all: ia.sq_sig_all != 0,
    };
    let inner = Qp::new(&vpd.inner, &attr).map_err(|e| e.errno())?;
    drop((srq_guard, rg, sg));
    ia.cap = to_cap(&inner.cap());
    let qpn = inner.qp_num();
    let context = vpd.pd.context;
    let qp_base = c::ibv_qp {
        context,
        qp_context: ia.qp_context,
        pd,
        send_cq: ia.send_cq,
        recv_cq: ia.recv_cq,
        srq: ia.srq,
        handle: qpn,
        qp_num: qpn,
        state: c::ibv_qp_state_IBV_QPS_RESET,
        qp_type: ia.qp_type,
        ..Default::default()
    };
    let mut qp = c::ibv_qp_ex {
        qp_base,
        ..Default::default()
    };
    if is_ex {
        crate::wr::install(&mut qp);
    }
    let p = Box::into_raw(Box::new(VrnicQp {
        qp,
        inner: Mutex::new(inner),
        sq_sig_all: ia.sq_sig_all,
        is_ex,
        batch: Mutex::new(Batch::default()),
        events: ctx.events.events.clone(),
        ud_rx: (t == QpType::Ud && vsrq.is_none()).then(|| rcq.ud_rx.clone()),
    }))
    .cast::<c::ibv_qp>();
    ctx.events.events.add_qp(qpn, p);
    Ok(p)
}

/// The `IBV_QP_INIT_ATTR_*` bits [`create_qp_ex`] accepts.
const QP_INIT_ATTR_SUPPORTED: u32 = c::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD
    | c::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS
    | c::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex(3)`; verbs.h's inline
/// wrapper calls `ibv_create_qp` itself when `comp_mask` is only
/// `IBV_QP_INIT_ATTR_PD`). The PD is required; `create_flags` must be 0
/// and no XRC domain, TSO, RSS or source QPN may be asked
/// (`EOPNOTSUPP`). With `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` the QP is an
/// extended one for `ibv_qp_to_qp_ex` and `ibv_wr_*`; `send_ops_flags` may
/// name only what the QP type can post (as rxe's `map_send_flags`: RC every
/// operation but memory windows, local invalidate and TSO; UC RDMA WRITE
/// (with immediate) and SEND (with immediate); UD SEND (with immediate)),
/// else `EOPNOTSUPP`. The QP, or NULL with errno.
pub(crate) unsafe extern "C" fn create_qp_ex(
    context: *mut c::ibv_context,
    attr: *mut c::ibv_qp_init_attr_ex,
) -> *mut c::ibv_qp {
    ffi(
        "ibv_create_qp_ex",
        std::ptr::null_mut(),
        || match create_ex(context, attr) {
            Ok(p) => p,
            Err(e) => fail_with_errno(e),
        },
    )
}

fn create_ex(
    context: *mut c::ibv_context,
    attr: *mut c::ibv_qp_init_attr_ex,
) -> Result<*mut c::ibv_qp, c_int> {
    if attr.is_null() || context.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL (checked), the caller's attributes.
    let a = unsafe { &mut *attr };
    if a.comp_mask & !QP_INIT_ATTR_SUPPORTED != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if a.comp_mask & c::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & c::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_CREATE_FLAGS != 0
        && a.create_flags != 0
    {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: a live PD (the application's contract).
    if unsafe { (*a.pd).context } != context {
        return Err(libc::EINVAL);
    }
    let is_ex = a.comp_mask & c::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0;
    if is_ex && a.send_ops_flags & !crate::wr::supported_send_ops(a.qp_type) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let mut init = c::ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    let p = create_with(a.pd, &mut init, is_ex)?;
    a.cap = init.cap;
    Ok(p)
}

/// `ibv_qp_to_qp_ex(3)` (IBVERBS_1.6): the `struct ibv_qp_ex` of a QP made
/// by `ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, else NULL
/// (as rdma-core's, which checks `VERBS_QP_EX`; errno untouched).
pub(crate) extern "C" fn ibv_qp_to_qp_ex(qp: *mut c::ibv_qp) -> *mut c::ibv_qp_ex {
    ffi("ibv_qp_to_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: the application passes a live QP or NULL.
        match unsafe { VrnicQp::from_ptr(qp) } {
            Some(v) if v.is_ex => qp.cast(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// `ibv_destroy_qp(3)`: 0, or `EINVAL` for NULL.
pub(crate) extern "C" fn ibv_destroy_qp(qp: *mut c::ibv_qp) -> c_int {
    ffi("ibv_destroy_qp", libc::EIO, || {
        if qp.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `qp` is the start of a VrnicQp boxed by ibv_create_qp, freed once.
        let b = unsafe { Box::from_raw(qp.cast::<VrnicQp>()) };
        b.events.remove_qp(b.qp.qp_base.qp_num, qp);
        if let Some(u) = &b.ud_rx {
            u.remove(b.qp.qp_base.qp_num);
        }
        drop(b);
        0
    })
}

fn ah_from_c(a: &c::ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: Gid {
            // SAFETY: every bit pattern of the GID union is a valid byte array.
            raw: unsafe { a.grh.dgid.raw },
        },
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        sl: a.sl,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

fn ah_to_c(a: &AhAttr) -> c::ibv_ah_attr {
    c::ibv_ah_attr {
        grh: c::ibv_global_route {
            dgid: c::ibv_gid { raw: a.dgid.raw },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        sl: a.sl,
        is_global: a.is_global.into(),
        port_num: a.port_num,
        ..Default::default()
    }
}

/// `ibv_modify_qp(3)`: applies the attributes `attr_mask` selects
/// (`IBV_QP_*`, the same bits as the device's); 0 or an errno.
pub(crate) extern "C" fn ibv_modify_qp(
    qp: *mut c::ibv_qp,
    attr: *mut c::ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    ffi("ibv_modify_qp", libc::EIO, || {
        // SAFETY: the application passes a live QP or NULL.
        let Some(vqp) = (unsafe { VrnicQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL (checked), the caller's attributes.
        let a = unsafe { &*attr };
        let mask = attr_mask as u32;
        let state = if mask & c::ibv_qp_attr_mask_IBV_QP_STATE != 0 {
            match QpState::try_from(a.qp_state) {
                Ok(s) => s,
                Err(_) => return libc::EINVAL,
            }
        } else {
            QpState::Reset
        };
        let q = QpAttr {
            qp_state: state,
            path_mtu: a.path_mtu,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags,
            ah_attr: ah_from_c(&a.ah_attr),
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            min_rnr_timer: a.min_rnr_timer,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
        };
        match lock(&vqp.inner).modify(&q, mask) {
            Ok(()) => {
                if mask & c::ibv_qp_attr_mask_IBV_QP_STATE != 0 {
                    // SAFETY: `qp` is live; the application serialises
                    // modify_qp with its own reads of qp->state.
                    unsafe { (*qp).state = a.qp_state };
                    // RESET drops the posted receives without completions.
                    if let (QpState::Reset, Some(u)) = (state, &vqp.ud_rx) {
                        u.remove(vqp.qp.qp_base.qp_num);
                    }
                }
                0
            }
            Err(e) => e.errno(),
        }
    })
}

/// `ibv_query_qp(3)`: the QP's attributes (all of them, whatever
/// `attr_mask` asks) and its creation attributes; 0 or an errno.
pub(crate) extern "C" fn ibv_query_qp(
    qp: *mut c::ibv_qp,
    attr: *mut c::ibv_qp_attr,
    _attr_mask: c_int,
    init_attr: *mut c::ibv_qp_init_attr,
) -> c_int {
    ffi("ibv_query_qp", libc::EIO, || {
        // SAFETY: the application passes a live QP or NULL.
        let Some(vqp) = (unsafe { VrnicQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() || init_attr.is_null() {
            return libc::EINVAL;
        }
        let inner = lock(&vqp.inner);
        let q = match inner.query() {
            Ok(q) => q,
            Err(e) => return e.errno(),
        };
        let cap = to_cap(&inner.cap());
        let a = c::ibv_qp_attr {
            qp_state: q.qp_state.raw(),
            cur_qp_state: q.qp_state.raw(),
            path_mtu: q.path_mtu,
            qkey: q.qkey,
            rq_psn: q.rq_psn,
            sq_psn: q.sq_psn,
            dest_qp_num: q.dest_qp_num,
            qp_access_flags: q.qp_access_flags,
            cap,
            ah_attr: ah_to_c(&q.ah_attr),
            pkey_index: q.pkey_index,
            port_num: q.port_num,
            timeout: q.timeout,
            retry_cnt: q.retry_cnt,
            rnr_retry: q.rnr_retry,
            min_rnr_timer: q.min_rnr_timer,
            max_rd_atomic: q.max_rd_atomic,
            max_dest_rd_atomic: q.max_dest_rd_atomic,
            ..Default::default()
        };
        let q0 = &vqp.qp.qp_base;
        let ia = c::ibv_qp_init_attr {
            qp_context: q0.qp_context,
            send_cq: q0.send_cq,
            recv_cq: q0.recv_cq,
            srq: q0.srq,
            cap,
            qp_type: q0.qp_type,
            sq_sig_all: vqp.sq_sig_all,
        };
        // SAFETY: both non-NULL (checked), the caller's structures.
        unsafe {
            attr.write(a);
            init_attr.write(ia);
        }
        0
    })
}

/// The SGEs of a work request.
///
/// # Safety
/// `sg_list` must hold `num_sge` entries when `num_sge > 0`.
pub(crate) unsafe fn sges(sg_list: *const c::ibv_sge, num_sge: c_int) -> Result<Vec<Sge>, c_int> {
    let n = usize::try_from(num_sge).map_err(|_| libc::EINVAL)?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if sg_list.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    let list = unsafe { std::slice::from_raw_parts(sg_list, n) };
    Ok(list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect())
}

pub(crate) fn opcode(op: c::ibv_wr_opcode) -> Option<WrOpcode> {
    Some(match op {
        c::ibv_wr_opcode_IBV_WR_RDMA_WRITE => WrOpcode::RdmaWrite,
        c::ibv_wr_opcode_IBV_WR_RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        c::ibv_wr_opcode_IBV_WR_SEND => WrOpcode::Send,
        c::ibv_wr_opcode_IBV_WR_SEND_WITH_IMM => WrOpcode::SendWithImm,
        c::ibv_wr_opcode_IBV_WR_RDMA_READ => WrOpcode::RdmaRead,
        c::ibv_wr_opcode_IBV_WR_ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpAndSwp,
        c::ibv_wr_opcode_IBV_WR_ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAndAdd,
        c::ibv_wr_opcode_IBV_WR_SEND_WITH_INV => WrOpcode::SendWithInv,
        _ => return None,
    })
}

/// Posts one send work request.
///
/// # Safety
/// `w`'s SGE list and, with `IBV_SEND_INLINE`, the memory its SGEs name
/// must be valid (the application's contract with `ibv_post_send(3)`).
unsafe fn post_one(qp: &mut Qp, w: &c::ibv_send_wr) -> Result<(), c_int> {
    // SAFETY: per the contract.
    let sg = unsafe { sges(w.sg_list, w.num_sge) }?;
    let op = opcode(w.opcode).ok_or(libc::EINVAL)?;
    let flags = w.send_flags;
    let inline = flags & c::ibv_send_flags_IBV_SEND_INLINE != 0;
    let mut data = Vec::new();
    if inline {
        for s in &sg {
            // SAFETY: an inline SGE names `length` readable bytes at `addr`
            // (ibv_post_send(3): the data is copied at post time).
            data.extend_from_slice(unsafe {
                std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
            });
        }
    }
    // SAFETY: the union members are plain integers and pointers.
    let (imm, rdma, atomic, ud) = unsafe {
        let imm = if op == WrOpcode::SendWithInv {
            w.__bindgen_anon_1.invalidate_rkey
        } else {
            u32::from_be(w.__bindgen_anon_1.imm_data)
        };
        (imm, w.wr.rdma, w.wr.atomic, w.wr.ud)
    };
    let ah = if qp.qp_type() == QpType::Ud {
        // SAFETY: on a UD QP the application passes a live AH.
        unsafe { crate::ah::handle_of(ud.ah) }.ok_or(libc::EINVAL)?
    } else {
        0
    };
    let swr = SendWr {
        wr_id: w.wr_id,
        opcode: op,
        send_flags: (flags
            & (c::ibv_send_flags_IBV_SEND_FENCE
                | c::ibv_send_flags_IBV_SEND_SIGNALED
                | c::ibv_send_flags_IBV_SEND_SOLICITED)) as u8,
        sg_list: if inline { &[] } else { &sg },
        inline_data: inline.then_some(&data[..]),
        imm_data: imm,
        rdma: RdmaWr {
            remote_addr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        atomic: AtomicWr {
            remote_addr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare_add: atomic.compare_add,
            swap: atomic.swap,
        },
        ud: UdWr {
            ah,
            remote_qpn: ud.remote_qpn,
            remote_qkey: ud.remote_qkey,
        },
    };
    qp.post_send(&swr).map_err(|e| e.errno())
}

/// `ops.post_send` (`ibv_post_send(3)`): posts the list `wr`; 0, or an
/// errno with `*bad_wr` the first work request not posted.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut c::ibv_qp,
    wr: *mut c::ibv_send_wr,
    bad_wr: *mut *mut c::ibv_send_wr,
) -> c_int {
    ffi("ibv_post_send", libc::EIO, || {
        // SAFETY: the application passes a live QP.
        let Some(vqp) = (unsafe { VrnicQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        let mut inner = lock(&vqp.inner);
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: a non-NULL element of the application's list.
            let w = unsafe { &*cur };
            // SAFETY: the application's contract with ibv_post_send(3).
            if let Err(e) = unsafe { post_one(&mut inner, w) } {
                if !bad_wr.is_null() {
                    // SAFETY: non-NULL (checked).
                    unsafe { *bad_wr = cur };
                }
                return e;
            }
            cur = w.next;
        }
        0
    })
}

/// `ops.post_recv` (`ibv_post_recv(3)`): posts the list `wr`; 0, or an
/// errno with `*bad_wr` the first work request not posted.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut c::ibv_qp,
    wr: *mut c::ibv_recv_wr,
    bad_wr: *mut *mut c::ibv_recv_wr,
) -> c_int {
    ffi("ibv_post_recv", libc::EIO, || {
        // SAFETY: the application passes a live QP.
        let Some(vqp) = (unsafe { VrnicQp::from_ptr(qp) }) else {
            return libc::EINVAL;
        };
        let mut inner = lock(&vqp.inner);
        let qpn = vqp.qp.qp_base.qp_num;
        // SAFETY: the application's list and bad_wr (ibv_post_recv(3)).
        unsafe {
            post_recv_list(wr, bad_wr, |r| {
                // Queued before the device can complete it (crate::udrx).
                if let Some(u) = &vqp.ud_rx {
                    u.push(qpn, r.sg_list.first().map(|s| (s.addr, s.length)));
                }
                let res = inner.post_recv(r).map_err(|e| e.errno());
                if let (Err(_), Some(u)) = (&res, &vqp.ud_rx) {
                    u.unpush(qpn);
                }
                res
            })
        }
    })
}

/// Walks an application's `ibv_recv_wr` list, posting each request through
/// `post`: 0, or the errno of the first request not posted with `*bad_wr`
/// set to it (`ibv_post_recv(3)`, `ibv_post_srq_recv(3)`).
///
/// # Safety
/// `wr` is NULL or a list of valid `ibv_recv_wr`, each with `num_sge`
/// valid SGEs; `bad_wr` is NULL or writable.
pub(crate) unsafe fn post_recv_list(
    wr: *mut c::ibv_recv_wr,
    bad_wr: *mut *mut c::ibv_recv_wr,
    mut post: impl FnMut(&RecvWr<'_>) -> Result<(), c_int>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: a non-NULL element of the application's list.
        let w = unsafe { &*cur };
        // SAFETY: the list holds num_sge SGEs (per the contract).
        let r = unsafe { sges(w.sg_list, w.num_sge) }.and_then(|sg| {
            post(&RecvWr {
                wr_id: w.wr_id,
                sg_list: &sg,
            })
        });
        if let Err(e) = r {
            if !bad_wr.is_null() {
                // SAFETY: non-NULL (checked).
                unsafe { *bad_wr = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}
