//! Completion queues: `ibv_create_cq(3)`, `ibv_create_cq_ex(3)`
//! (`verbs_context.create_cq_ex`), `ibv_destroy_cq(3)`, the inline fast
//! path's `ops.poll_cq` (`ibv_poll_cq(3)`) and `ops.req_notify_cq`
//! (`ibv_req_notify_cq(3)`), and the extended CQ's polling functions
//! (`ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and the
//! `ibv_wc_read_*` readers, verbs.h's inline functions calling through
//! `struct ibv_cq_ex`), as rdma-core's rxe provider (`rxe_create_cq_ex`,
//! `rxe_start_poll`, `rxe_next_poll`, `rxe_end_poll`, `rxe_wc_read_*`).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use vrnic_guest::verbs::{Cq, WorkCompletion};

use crate::boundary::{fail_with_errno, ffi};
use crate::context::VrnicContext;
use crate::events::{channel_of, lock, Events};
use crate::ffi as c;
use crate::udrx::UdRx;

/// A CQ: the `struct ibv_cq_ex` applications see, first. Its leading
/// fields are `struct ibv_cq` (verbs.h's `ibv_cq_ex_to_cq` is a cast), so
/// every CQ, whether made by `ibv_create_cq` or `ibv_create_cq_ex`, is both.
#[repr(C)]
pub(crate) struct VrnicCq {
    pub(crate) cq: c::ibv_cq_ex,
    pub(crate) inner: Mutex<Cq>,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current, which
    /// the `ibv_wc_read_*` readers return fields of.
    current: Mutex<WorkCompletion>,
    /// The device shares this machine's CPUs (in-process, or a daemon
    /// reached over vhost-user): give the CPU back on an empty poll.
    yield_when_empty: bool,
    /// When the CQ was first polled empty in a row, ns since [`epoch`]; 0
    /// while the last poll found completions ([`idle_poll`]).
    empty_since: AtomicU64,
    /// The context's event tables (kept by the CQ: destroying it must not
    /// need the context, which a careless application may have closed).
    events: Arc<Events>,
    /// The receives posted to the UD QPs completing here, to report each
    /// UD receive's RoCE packet type in `sl` ([`crate::udrx`]).
    pub(crate) ud_rx: Arc<UdRx>,
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
        let r = u32::try_from(cqe)
            .map_err(|_| libc::EINVAL)
            .and_then(|n| create(context, n, cq_context, channel, comp_vector));
        match r {
            Ok(p) => p.cast(),
            Err(e) => fail_with_errno(e),
        }
    })
}

/// The CQ both constructors make; its `ibv_cq_ex`, or an errno.
fn create(
    context: *mut c::ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut c::ibv_comp_channel,
    comp_vector: c_int,
) -> Result<*mut c::ibv_cq_ex, c_int> {
    // SAFETY: the application passes a context from ibv_open_device or NULL.
    let ctx = unsafe { VrnicContext::from_ptr(context) }.ok_or(libc::EINVAL)?;
    if comp_vector != 0 || c_int::try_from(cqe).is_err() {
        return Err(libc::EINVAL);
    }
    let inner = Cq::new(&ctx.verbs, cqe).map_err(|e| e.errno())?;
    let cqn = inner.cqn();
    let mut cq = c::ibv_cq_ex {
        context,
        channel,
        cq_context,
        handle: cqn,
        cqe: c_int::try_from(inner.capacity()).unwrap_or(c_int::MAX),
        ..Default::default()
    };
    install_poll_ops(&mut cq);
    let p = Box::into_raw(Box::new(VrnicCq {
        cq,
        inner: Mutex::new(inner),
        current: Mutex::new(WorkCompletion::default()),
        yield_when_empty: ctx.verbs.yield_when_idle(),
        empty_since: AtomicU64::new(0),
        events: ctx.events.events.clone(),
        ud_rx: UdRx::new(),
    }))
    .cast::<c::ibv_cq_ex>();
    // SAFETY: the application passes a live channel or NULL.
    let ch = unsafe { channel_of(channel) };
    ctx.events.events.add_cq(cqn, p.cast(), ch);
    Ok(p)
}

/// The `wc_flags` an extended CQ can report: rdma-core's
/// `IBV_WC_STANDARD_FLAGS` (byte_len, imm, qp_num, src_qp, slid, sl,
/// dlid_path_bits), as rxe's `RXE_SUPPORTED_WC_FLAGS`. No completion
/// timestamp: the device's CQE carries none (and `ibv_query_device_ex`
/// reports `completion_timestamp_mask` 0).
const SUPPORTED_WC_FLAGS: u64 = c::IBV_WC_STANDARD_FLAGS as u64;

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex(3)`): a CQ as
/// [`ibv_create_cq`] whose completions can also be read with
/// `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`. As rxe's
/// `rxe_create_cq_ex`: `wc_flags` beyond [`SUPPORTED_WC_FLAGS`] (e.g.
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`) fail with `EOPNOTSUPP`; a
/// `comp_mask` naming a parent domain or `flags` (`IBV_CREATE_CQ_ATTR_*`)
/// other than 0 with `EOPNOTSUPP` too. The CQ, or NULL with errno.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut c::ibv_context,
    attr: *mut c::ibv_cq_init_attr_ex,
) -> *mut c::ibv_cq_ex {
    ffi("ibv_create_cq_ex", std::ptr::null_mut(), || {
        if attr.is_null() {
            return fail_with_errno(libc::EINVAL);
        }
        // SAFETY: non-NULL (checked), the caller's attributes.
        let a = unsafe { &*attr };
        let known = c::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS
            | c::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD;
        let r = if a.comp_mask & !known != 0 {
            Err(libc::EINVAL)
        } else if a.wc_flags & !SUPPORTED_WC_FLAGS != 0
            || (a.comp_mask & c::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_PD != 0
                && !a.parent_domain.is_null())
            || (a.comp_mask & c::ibv_cq_init_attr_mask_IBV_CQ_INIT_ATTR_MASK_FLAGS != 0
                && a.flags != 0)
        {
            Err(libc::EOPNOTSUPP)
        } else {
            c_int::try_from(a.comp_vector)
                .map_err(|_| libc::EINVAL)
                .and_then(|v| create(context, a.cqe, a.cq_context, a.channel, v))
        };
        match r {
            Ok(p) => p,
            Err(e) => fail_with_errno(e),
        }
    })
}

/// `ibv_destroy_cq(3)`: 0, or `EINVAL` for NULL. The device's CQ goes when
/// the last QP using it is gone.
pub(crate) extern "C" fn ibv_destroy_cq(cq: *mut c::ibv_cq) -> c_int {
    ffi("ibv_destroy_cq", libc::EIO, || {
        if cq.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `cq` is the start of a VrnicCq boxed by `create`.
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

/// How long a CQ is polled empty with a yield after each poll before
/// each empty poll naps instead, ns (50 µs: longer than a 64-byte
/// ping-pong's round trip through a daemon here, 10–25 µs, so latency
/// runs never nap). `VRNIC_CQ_SPIN_US` sets it; `VRNIC_CQ_SPIN_US=off`
/// never naps.
pub(crate) const SPIN_NS: u64 = 50_000;
/// One nap of an empty poll past [`SPIN_NS`], ns (the kernel adds the
/// thread's timer slack, 50 µs by default).
pub(crate) const NAP_NS: u64 = 20_000;

/// The process's clock origin for [`VrnicCq::empty_since`].
fn epoch() -> &'static Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now)
}

/// [`SPIN_NS`], or `VRNIC_CQ_SPIN_US` (µs; `off`: `None`, never nap).
fn spin_ns() -> Option<u64> {
    static SPIN: OnceLock<Option<u64>> = OnceLock::new();
    *SPIN.get_or_init(|| match std::env::var("VRNIC_CQ_SPIN_US") {
        Ok(v) if v == "off" => None,
        Ok(v) => Some(
            v.parse::<u64>()
                .map_or(SPIN_NS, |us| us.saturating_mul(1000)),
        ),
        Err(_) => Some(SPIN_NS),
    })
}

/// What an empty poll of a CQ whose device shares this machine's CPUs does
/// (the device runs on an engine thread of this process, or on a daemon's
/// worker: `Transport::yield_when_idle`): it gives the CPU back, so an
/// application spinning on its CQ does not keep the device's thread from
/// running. For [`SPIN_NS`] after the CQ went empty each poll yields
/// (`sched_yield(2)`: on a loaded machine a busy-polling ping-pong is
/// otherwise ~100x slower); after that each sleeps [`NAP_NS`]. A
/// bandwidth run whose completions come further apart than that (a deep
/// send queue of large messages over a wire) then leaves the CPU to the
/// daemon's workers, which move the data: `ib_write_bw` 64 KiB between two
/// daemons over AF_PACKET went from 0.80 to 1.06–1.09 GB/s on this 2-core
/// machine (issue 10). `empty_since` is the CQ's [`VrnicCq::empty_since`].
fn idle_poll(empty_since: &AtomicU64) {
    let now = u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX);
    if naps(empty_since, now, spin_ns()) {
        std::thread::sleep(Duration::from_nanos(NAP_NS));
    } else {
        std::thread::yield_now();
    }
}

/// Whether an empty poll at `now` (ns since [`epoch`]) naps rather than
/// yields, after `spin` ns of empty polls (`None`: never); records the
/// first empty poll of a row in `empty_since`.
fn naps(empty_since: &AtomicU64, now: u64, spin: Option<u64>) -> bool {
    let now = now.max(1);
    let since = match empty_since.load(Ordering::Relaxed) {
        0 => {
            empty_since.store(now, Ordering::Relaxed);
            now
        }
        t => t,
    };
    spin.is_some_and(|spin| now.saturating_sub(since) >= spin)
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
            vcq.ud_rx.mark(&mut buf[..n]);
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
        if done > 0 {
            vcq.empty_since.store(0, Ordering::Relaxed);
        } else if vcq.yield_when_empty {
            idle_poll(&vcq.empty_since);
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

/// Fills the extended CQ's function pointers (verbs.h's `ibv_start_poll`,
/// `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*` call through them).
/// What vrnic cannot report (`read_completion_ts`, `read_cvlan`,
/// `read_flow_tag`, `read_tm_info`, `read_completion_wallclock_ns`) stays
/// NULL, as in rxe: an application may only call a reader whose
/// `IBV_WC_EX_WITH_*` flag it asked for, and those flags are refused.
fn install_poll_ops(cq: &mut c::ibv_cq_ex) {
    cq.start_poll = Some(start_poll);
    cq.next_poll = Some(next_poll);
    cq.end_poll = Some(end_poll);
    cq.read_opcode = Some(read_opcode);
    cq.read_vendor_err = Some(read_vendor_err);
    cq.read_byte_len = Some(read_byte_len);
    cq.read_imm_data = Some(read_imm_data);
    cq.read_qp_num = Some(read_qp_num);
    cq.read_src_qp = Some(read_src_qp);
    cq.read_wc_flags = Some(read_wc_flags);
    cq.read_slid = Some(read_slid);
    cq.read_sl = Some(read_sl);
    cq.read_dlid_path_bits = Some(read_dlid_path_bits);
}

/// Takes the next completion into `current`, `cq->status` and
/// `cq->wr_id`: 0, or `ENOENT` when the CQ is empty (rxe's
/// `rxe_start_poll`/`rxe_next_poll`), `EINVAL` for NULL.
fn advance(cq: *mut c::ibv_cq_ex) -> c_int {
    // SAFETY: the application passes a live CQ (from create) or NULL.
    let Some(vcq) = (unsafe { VrnicCq::from_ptr(cq.cast()) }) else {
        return libc::EINVAL;
    };
    let mut one = [WorkCompletion::default()];
    let n = {
        let mut inner = lock(&vcq.inner);
        let n = inner.poll(&mut one);
        vcq.ud_rx.mark(&mut one[..n]);
        n
    };
    if n == 0 {
        if vcq.yield_when_empty {
            // As in poll_cq: let the in-process device's engine run.
            std::thread::yield_now();
        }
        return libc::ENOENT;
    }
    let w = one[0];
    *lock(&vcq.current) = w;
    // SAFETY: `cq` is live; `status` and `wr_id` are the application's to
    // read between start_poll and end_poll (ibv_create_cq_ex(3)), written
    // only here, by the polling thread.
    unsafe {
        (*cq).status = c::ibv_wc_status::from(w.status);
        (*cq).wr_id = w.wr_id;
    }
    0
}

/// `ibv_start_poll` (`ibv_create_cq_ex(3)`): makes the oldest completion
/// current; 0, or `ENOENT` when there is none (then no `ibv_end_poll`).
/// `attr->comp_mask` must be 0 (`EINVAL`).
unsafe extern "C" fn start_poll(cq: *mut c::ibv_cq_ex, attr: *mut c::ibv_poll_cq_attr) -> c_int {
    ffi("ibv_start_poll", libc::EIO, || {
        // SAFETY: the application passes its attributes or NULL.
        if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
            return libc::EINVAL;
        }
        advance(cq)
    })
}

/// `ibv_next_poll`: makes the next completion current; 0 or `ENOENT`.
unsafe extern "C" fn next_poll(cq: *mut c::ibv_cq_ex) -> c_int {
    ffi("ibv_next_poll", libc::EIO, || advance(cq))
}

/// `ibv_end_poll`: ends a polling batch. The completions read are already
/// consumed (each `start_poll`/`next_poll` took one), so nothing is left to do.
unsafe extern "C" fn end_poll(_cq: *mut c::ibv_cq_ex) {}

/// The current completion of `cq` (default for NULL: readers cannot fail).
fn current(cq: *mut c::ibv_cq_ex) -> WorkCompletion {
    // SAFETY: the application passes a live CQ (from create) or NULL.
    match unsafe { VrnicCq::from_ptr(cq.cast()) } {
        Some(vcq) => *lock(&vcq.current),
        None => WorkCompletion::default(),
    }
}

macro_rules! reader {
    ($(#[$doc:meta])* $name:ident -> $t:ty, |$w:ident| $e:expr) => {
        $(#[$doc])*
        unsafe extern "C" fn $name(cq: *mut c::ibv_cq_ex) -> $t {
            ffi(stringify!($name), Default::default(), || {
                let $w = current(cq);
                $e
            })
        }
    };
}

reader!(
    /// `ibv_wc_read_opcode`: the current completion's `ibv_wc_opcode`.
    read_opcode -> c::ibv_wc_opcode, |w| c::ibv_wc_opcode::from(w.opcode)
);
reader!(
    /// `ibv_wc_read_vendor_err`.
    read_vendor_err -> u32, |w| u32::from(w.vendor_err)
);
reader!(
    /// `ibv_wc_read_byte_len`.
    read_byte_len -> u32, |w| w.byte_len
);
reader!(
    /// `ibv_wc_read_imm_data` (also `ibv_wc_read_invalidated_rkey`):
    /// immediate data in network order, or the invalidated rkey, as
    /// `ibv_wc`'s union.
    read_imm_data -> u32, |w| match (w.imm_data, w.invalidated_rkey) {
        (Some(imm), _) => imm.to_be(),
        (None, Some(rkey)) => rkey,
        (None, None) => 0,
    }
);
reader!(
    /// `ibv_wc_read_qp_num`.
    read_qp_num -> u32, |w| w.qp_num
);
reader!(
    /// `ibv_wc_read_src_qp`.
    read_src_qp -> u32, |w| w.src_qp
);
reader!(
    /// `ibv_wc_read_wc_flags`: `IBV_WC_GRH`, `IBV_WC_WITH_IMM`, `IBV_WC_WITH_INV`.
    read_wc_flags -> u32, |w| u32::from(w.wc_flags)
);
reader!(
    /// `ibv_wc_read_slid`: 0 (RoCE has no LIDs).
    read_slid -> u32, |_w| 0
);
reader!(
    /// `ibv_wc_read_sl`.
    read_sl -> u8, |w| w.sl
);
reader!(
    /// `ibv_wc_read_dlid_path_bits`: 0 (RoCE has no LIDs).
    read_dlid_path_bits -> u8, |_w| 0
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Empty polls yield for the spin time after the first, then nap; a
    /// poll that finds completions (`empty_since` reset) starts over; with
    /// napping off they always yield.
    #[test]
    fn empty_polls_yield_for_the_spin_time_then_nap() {
        let since = AtomicU64::new(0);
        let spin = Some(SPIN_NS);
        let t0 = 1_000_000;
        assert!(!naps(&since, t0, spin));
        assert!(!naps(&since, t0 + SPIN_NS - 1, spin));
        assert!(naps(&since, t0 + SPIN_NS, spin));
        assert!(naps(&since, t0 + 10 * SPIN_NS, spin));
        since.store(0, Ordering::Relaxed);
        assert!(!naps(&since, t0 + 10 * SPIN_NS + 1, spin));
        assert!(!naps(&since, t0 + 100 * SPIN_NS, None));
    }
}
