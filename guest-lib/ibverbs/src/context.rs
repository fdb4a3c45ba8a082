//! Open devices: `ibv_open_device(3)`, `ibv_close_device(3)` and the
//! queries `ibv_devinfo` makes (`ibv_query_device(3)`, `ibv_query_port(3)`,
//! `ibv_query_gid(3)`, `ibv_query_gid_ex(3)`, `ibv_query_pkey(3)`).
//!
//! As in rdma-core (`libibverbs/device.c`, `_verbs_init_and_alloc_context`),
//! the context is a `struct verbs_context` whose last member is the
//! `struct ibv_context` applications see; `context.abi_compat` is
//! `__VERBS_ABI_IS_EXTENDED` and `sz` the size of `verbs_context`, so
//! verbs.h's `verbs_get_ctx_op(ctx, op)` finds the extended ops (here
//! `query_port`, which the `ibv_query_port` macro calls) and the inline fast
//! path calls through `context.ops` (`poll_cq`, `post_send`, ...).

use std::ffi::{c_char, c_int, CStr};
use vrnic_abi as abi;
use vrnic_guest::verbs::Context;

use crate::boundary::{copy_cstr, fail_with_errno, ffi};
use crate::device::{self, VrnicDevice};
use crate::events::EventThread;
use crate::ffi as c;

/// An open device. `#[repr(C)]` with the `verbs_context` first, so the
/// application's `ibv_context *` (the end of `verbs_context`) converts back
/// with a constant offset ([`VrnicContext::from_ptr`]).
#[repr(C)]
pub struct VrnicContext {
    /// What applications and verbs.h's inline functions see.
    pub vctx: c::verbs_context,
    /// The device it was opened from.
    pub dev: &'static VrnicDevice,
    /// guest-lib's context (the transport).
    pub verbs: Context,
    /// Device attributes, read at open.
    pub attr: abi::DeviceAttr,
    /// The event thread and the tables it routes events with.
    pub(crate) events: EventThread,
    /// What `ibv_context.cmd_fd` holds: `/dev/null`, opened read-write per
    /// context (`None`, and -1 there, when it cannot be opened). A kernel
    /// provider's is its `/dev/infiniband/uverbsN`; programs `dup(2)` it
    /// to share the context with another process (`ibv_import_device(3)`,
    /// which vrnic answers `EOPNOTSUPP`, so that pyverbs' shared-PD tests
    /// skip instead of failing on `dup(-1)`). Nothing reads or writes it.
    _cmd_fd: Option<std::os::fd::OwnedFd>,
}

impl VrnicContext {
    /// The context of an application's `ibv_context *`, or `None` for NULL.
    ///
    /// # Safety
    /// A non-NULL `ctx` must come from [`ibv_open_device`] and not be closed.
    pub unsafe fn from_ptr<'a>(ctx: *mut c::ibv_context) -> Option<&'a VrnicContext> {
        if ctx.is_null() {
            return None;
        }
        let off = std::mem::offset_of!(VrnicContext, vctx)
            + std::mem::offset_of!(c::verbs_context, context);
        // SAFETY: per the contract, `ctx` points at `vctx.context` inside a live VrnicContext.
        Some(unsafe { &*ctx.cast::<u8>().sub(off).cast::<VrnicContext>() })
    }

    /// The `ibv_context *` applications use.
    pub fn as_ptr(&self) -> *mut c::ibv_context {
        std::ptr::from_ref(&self.vctx.context).cast_mut()
    }
}

/// `ibv_open_device(3)`: opens `device` (a transport to it: the in-process
/// loopback device or the virtio-pci function) and returns its context, or
/// NULL with errno (`EINVAL` for an unknown device, `ENODEV` when it cannot
/// be reached, with the reason on stderr).
pub(crate) extern "C" fn ibv_open_device(device: *mut c::ibv_device) -> *mut c::ibv_context {
    ffi("ibv_open_device", std::ptr::null_mut(), || {
        let Some(dev) = device::from_ptr(device) else {
            return fail_with_errno(libc::EINVAL);
        };
        let fail = |errno: c_int, why: String| {
            device::eprintln_ignore(&format!(
                "libibverbs (vrnic): cannot open {}: {why}",
                device::name(dev)
            ));
            fail_with_errno(errno)
        };
        let transport = match device::open_transport(dev) {
            Ok(t) => t,
            Err((e, why)) => return fail(e, why),
        };
        let verbs = match Context::open(transport) {
            Ok(v) => v,
            Err(e) => return fail(e.errno(), e.to_string()),
        };
        let attr = match verbs.query_device() {
            Ok(a) => a,
            Err(e) => return fail(e.errno(), e.to_string()),
        };
        let events = match EventThread::start(&verbs) {
            Ok(e) => e,
            Err(e) => return fail(e.raw_os_error().unwrap_or(libc::ENOMEM), e.to_string()),
        };
        let mut vctx = c::verbs_context {
            sz: size_of::<c::verbs_context>(),
            query_port: Some(query_port_op),
            query_device_ex: Some(query_device_ex),
            create_cq_ex: Some(crate::cq::create_cq_ex),
            create_qp_ex: Some(crate::qp::create_qp_ex),
            ..Default::default()
        };
        let ctx = &mut vctx.context;
        ctx.device = device;
        let cmd_fd = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .ok()
            .map(std::os::fd::OwnedFd::from);
        ctx.cmd_fd = cmd_fd.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd);
        ctx.async_fd = std::os::fd::AsRawFd::as_raw_fd(&events.events.async_fd);
        ctx.num_comp_vectors = 1;
        // verbs.h: __VERBS_ABI_IS_EXTENDED, ((void *)UINTPTR_MAX).
        ctx.abi_compat = usize::MAX as *mut libc::c_void;
        crate::ops::install(&mut ctx.ops);
        let boxed = Box::new(VrnicContext {
            vctx,
            dev,
            verbs,
            attr,
            events,
            _cmd_fd: cmd_fd,
        });
        // The mutex in ibv_context is zeroed: PTHREAD_MUTEX_INITIALIZER on glibc.
        let p = Box::into_raw(boxed);
        // SAFETY: `p` is the live box just leaked; freed by ibv_close_device.
        unsafe { (*p).as_ptr() }
    })
}

/// `ibv_close_device(3)`: frees the context; 0, or `EINVAL` for NULL.
/// The device is closed when the last of its objects is gone (guest-lib's
/// objects keep the transport alive).
pub(crate) extern "C" fn ibv_close_device(context: *mut c::ibv_context) -> c_int {
    ffi("ibv_close_device", libc::EIO, || {
        // SAFETY: the application passes a context from ibv_open_device.
        let Some(ctx) = (unsafe { VrnicContext::from_ptr(context) }) else {
            return libc::EINVAL;
        };
        let p = std::ptr::from_ref(ctx).cast_mut();
        // SAFETY: `p` came from Box::into_raw in ibv_open_device, freed once here.
        drop(unsafe { Box::from_raw(p) });
        0
    })
}

/// The context of `context` for a query, or the errno to return.
fn ctx_of<'a>(context: *mut c::ibv_context) -> Result<&'a VrnicContext, c_int> {
    // SAFETY: the application passes a context from ibv_open_device or NULL.
    unsafe { VrnicContext::from_ptr(context) }.ok_or(libc::EINVAL)
}

/// `ibv_query_device(3)`: the device's attributes (from `CMD_QUERY_DEVICE`;
/// what vrnic has no notion of, e.g. multicast, is 0). 0 or an errno.
pub(crate) extern "C" fn ibv_query_device(
    context: *mut c::ibv_context,
    device_attr: *mut c::ibv_device_attr,
) -> c_int {
    ffi("ibv_query_device", libc::EIO, || {
        let ctx = match ctx_of(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if device_attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: non-NULL (checked), points at the caller's ibv_device_attr.
        unsafe { device_attr.write(device_attr_of(ctx)) };
        0
    })
}

/// `struct ibv_device_attr` of the device (from `CMD_QUERY_DEVICE`; what
/// vrnic has no notion of, e.g. multicast, is 0). Every count is the
/// device's own: the number of objects a program can create before the
/// next is `ENOMEM` (`tests/c/exhaust.c`; `max_ah` and `max_srq` were once
/// `max_qp`: 1024 AHs advertised of the device's 4096).
fn device_attr_of(ctx: &VrnicContext) -> c::ibv_device_attr {
    let a = &ctx.attr;
    let cfg = ctx.verbs.config();
    let i = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    let mut d = c::ibv_device_attr {
        node_guid: u64::from_ne_bytes(a.node_guid),
        sys_image_guid: u64::from_ne_bytes(a.node_guid),
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: u32::from(abi::PCI_VENDOR_ID),
        vendor_part_id: u32::from(abi::PCI_DEVICE_ID_BASE) + abi::DEFAULT_VIRTIO_ID,
        hw_ver: cfg.abi_version,
        max_qp: i(a.max_qp),
        max_qp_wr: i(a.max_qp_wr),
        device_cap_flags: c::ibv_device_cap_flags_IBV_DEVICE_RC_RNR_NAK_GEN
            | c::ibv_device_cap_flags_IBV_DEVICE_SYS_IMAGE_GUID,
        max_sge: i(a.max_sge),
        max_sge_rd: i(a.max_sge),
        max_cq: i(a.max_cq),
        max_cqe: i(a.max_cqe),
        max_mr: i(a.max_mr),
        max_pd: i(a.max_pd),
        max_qp_rd_atom: i(a.max_qp_rd_atom),
        max_res_rd_atom: i(a.max_qp_rd_atom.saturating_mul(a.max_qp)),
        max_qp_init_rd_atom: i(a.max_qp_init_rd_atom),
        atomic_cap: c::ibv_atomic_cap_IBV_ATOMIC_HCA,
        max_ah: i(a.max_ah),
        max_srq: i(a.max_srq),
        max_srq_wr: i(a.max_srq_wr),
        max_srq_sge: i(a.max_srq_sge),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: cfg.phys_port_cnt,
        ..Default::default()
    };
    copy_cstr(&mut d.fw_ver, concat!("vrnic ", env!("CARGO_PKG_VERSION")));
    d
}

/// `verbs_context.query_device_ex` (`ibv_query_device_ex(3)`, whose inline
/// wrapper refuses a non-zero `input->comp_mask` itself): `orig_attr` as
/// [`ibv_query_device`], `phys_port_cnt_ex`, and 0 for every extended
/// capability — no ODP, TSO, RSS, packet pacing, tag matching, CQ
/// moderation, device memory, and `completion_timestamp_mask` 0 with
/// `hca_core_clock` 0 (the CQE carries no timestamp; rxe reports none
/// either, so `ibv_rc_pingpong -t` says "The device isn't completion
/// timestamp capable" on both). Writes the first `attr_size` bytes (an
/// older application's shorter structure, as rdma-core's
/// `ibv_cmd_query_device_any`); 0 or an errno.
unsafe extern "C" fn query_device_ex(
    context: *mut c::ibv_context,
    input: *const c::ibv_query_device_ex_input,
    attr: *mut c::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    ffi("ibv_query_device_ex", libc::EIO, || {
        let ctx = match ctx_of(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        // SAFETY: the application passes its input or NULL.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        if attr.is_null() || attr_size < size_of::<c::ibv_device_attr>() {
            return libc::EINVAL;
        }
        let orig_attr = device_attr_of(ctx);
        let x = c::ibv_device_attr_ex {
            phys_port_cnt_ex: u32::from(orig_attr.phys_port_cnt),
            orig_attr,
            ..Default::default()
        };
        // SAFETY: the caller's structure holds attr_size bytes.
        unsafe { write_prefix(attr, &x, attr_size) };
        0
    })
}

/// The port attributes of `port` as `struct ibv_port_attr`.
fn port_attr(ctx: &VrnicContext, port: u8) -> Result<c::ibv_port_attr, c_int> {
    let p = ctx.verbs.query_port(port).map_err(|e| e.errno())?;
    Ok(c::ibv_port_attr {
        state: p.state,
        max_mtu: p.max_mtu,
        active_mtu: p.active_mtu,
        gid_tbl_len: c_int::try_from(p.gid_tbl_len).unwrap_or(c_int::MAX),
        port_cap_flags: c::ibv_port_cap_flags_IBV_PORT_CM_SUP,
        max_msg_sz: p.max_msg_sz,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        // IB_WIDTH_1X and IB_SPEED_EDR (25 Gb/s): a nominal rate for a software device.
        active_width: 1,
        active_speed: 32,
        // 5 = LinkUp when active, else 3 = Disabled.
        phys_state: if p.state == c::ibv_port_state_IBV_PORT_ACTIVE {
            5
        } else {
            3
        },
        link_layer: u8::try_from(p.link_layer).unwrap_or(0),
        ..Default::default()
    })
}

/// Copies the first `len` bytes of `v` to `dst` (an application structure
/// that may be an older, shorter version, as rdma-core's `port_attr_len`).
///
/// # Safety
/// `dst` must be valid for `len` bytes.
unsafe fn write_prefix<T>(dst: *mut T, v: &T, len: usize) {
    let n = len.min(size_of::<T>());
    // SAFETY: `v` has size_of::<T>() >= n bytes; `dst` is valid for `len` >= n.
    unsafe {
        std::ptr::copy_nonoverlapping(std::ptr::from_ref(v).cast::<u8>(), dst.cast::<u8>(), n)
    };
}

/// `verbs_context.query_port`, which verbs.h's `ibv_query_port` macro calls
/// with the size of its `struct ibv_port_attr`. 0 or an errno.
unsafe extern "C" fn query_port_op(
    context: *mut c::ibv_context,
    port_num: u8,
    port_attr_out: *mut c::ibv_port_attr,
    port_attr_len: usize,
) -> c_int {
    ffi("ibv_query_port", libc::EIO, || {
        let ctx = match ctx_of(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if port_attr_out.is_null() {
            return libc::EINVAL;
        }
        match port_attr(ctx, port_num) {
            Ok(a) => {
                // SAFETY: the caller's structure holds port_attr_len bytes.
                unsafe { write_prefix(port_attr_out, &a, port_attr_len) };
                0
            }
            Err(e) => e,
        }
    })
}

/// `ibv_query_port@IBVERBS_1.1`, the exported function behind the
/// `ibv_query_port` macro for contexts without `query_port` (rdma-core's
/// `__lib_ibv_query_port`): fills the older `struct _compat_ibv_port_attr`.
pub(crate) extern "C" fn ibv_query_port(
    context: *mut c::ibv_context,
    port_num: u8,
    port_attr_out: *mut c::_compat_ibv_port_attr,
) -> c_int {
    // SAFETY: the caller's structure is a _compat_ibv_port_attr.
    unsafe {
        query_port_op(
            context,
            port_num,
            port_attr_out.cast(),
            size_of::<c::_compat_ibv_port_attr>(),
        )
    }
}

/// GID `index` of `port`: `Ok(None)` for an unused entry inside the table.
fn gid(ctx: &VrnicContext, port: u8, index: u32) -> Result<Option<[u8; 16]>, c_int> {
    let tbl = ctx
        .verbs
        .query_port(port)
        .map_err(|e| e.errno())?
        .gid_tbl_len;
    if index >= tbl {
        return Err(libc::EINVAL);
    }
    match ctx.verbs.query_gid(port, index) {
        Ok(g) if g.is_zero() => Ok(None),
        Ok(g) => Ok(Some(g.raw)),
        Err(_) => Ok(None),
    }
}

/// `ibv_query_gid(3)`: 0 and the GID (all zero for an unused entry, as
/// rdma-core), or -1 with errno.
pub(crate) extern "C" fn ibv_query_gid(
    context: *mut c::ibv_context,
    port_num: u8,
    index: c_int,
    gid_out: *mut c::ibv_gid,
) -> c_int {
    ffi("ibv_query_gid", -1, || {
        let r = ctx_of(context).and_then(|ctx| {
            if gid_out.is_null() {
                return Err(libc::EINVAL);
            }
            gid(
                ctx,
                port_num,
                u32::try_from(index).map_err(|_| libc::EINVAL)?,
            )
        });
        match r {
            Ok(g) => {
                // SAFETY: non-NULL (checked), the caller's union ibv_gid.
                unsafe {
                    gid_out.write(c::ibv_gid {
                        raw: g.unwrap_or_default(),
                    })
                };
                0
            }
            Err(e) => fail_with_errno(e),
        }
    })
}

/// `ibv_query_gid_ex(3)` (`_ibv_query_gid_ex`): the GID entry, with type
/// RoCE v2 (the only type vrnic sends); `ENODATA` for an unused entry, as
/// rdma-core; 0 or an errno.
pub(crate) extern "C" fn _ibv_query_gid_ex(
    context: *mut c::ibv_context,
    port_num: u32,
    gid_index: u32,
    entry: *mut c::ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    ffi("ibv_query_gid_ex", libc::EIO, || {
        let ctx = match ctx_of(context) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if entry.is_null() || flags != 0 {
            return libc::EINVAL;
        }
        let Ok(port) = u8::try_from(port_num) else {
            return libc::EINVAL;
        };
        match gid(ctx, port, gid_index) {
            Ok(Some(raw)) => {
                let e = c::ibv_gid_entry {
                    gid: c::ibv_gid { raw },
                    gid_index,
                    port_num,
                    gid_type: c::ibv_gid_type_IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                };
                // SAFETY: the caller's entry holds entry_size bytes.
                unsafe { write_prefix(entry, &e, entry_size) };
                0
            }
            Ok(None) => libc::ENODATA,
            Err(e) => e,
        }
    })
}

/// `ibv_query_gid_table(3)` (`_ibv_query_gid_table`): the used GID entries
/// of every port, in port and index order, each as [`_ibv_query_gid_ex`]
/// gives it, written `entry_size` bytes apart; their number, or a negative
/// errno: `-EINVAL` for no room (`max_entries` 0, or fewer than the used
/// entries: the man page's "the call will fail"), a NULL `entries` or
/// `flags` other than 0.
pub(crate) extern "C" fn _ibv_query_gid_table(
    context: *mut c::ibv_context,
    entries: *mut c::ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    ffi("ibv_query_gid_table", -(libc::EIO as isize), || {
        let ctx = match ctx_of(context) {
            Ok(c) => c,
            Err(e) => return -(e as isize),
        };
        if entries.is_null() || flags != 0 || max_entries == 0 || entry_size == 0 {
            return -(libc::EINVAL as isize);
        }
        let ports = ctx.verbs.config().phys_port_cnt;
        let mut n = 0usize;
        for port in 1..=ports {
            let tbl = match ctx.verbs.query_port(port) {
                Ok(p) => p.gid_tbl_len,
                Err(e) => return -(e.errno() as isize),
            };
            for index in 0..tbl {
                let raw = match gid(ctx, port, index) {
                    Ok(Some(raw)) => raw,
                    Ok(None) => continue,
                    Err(e) => return -(e as isize),
                };
                if n >= max_entries {
                    return -(libc::EINVAL as isize);
                }
                let e = c::ibv_gid_entry {
                    gid: c::ibv_gid { raw },
                    gid_index: index,
                    port_num: u32::from(port),
                    gid_type: c::ibv_gid_type_IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: 0,
                };
                // SAFETY: the caller's array holds max_entries entries of
                // entry_size bytes, and n < max_entries.
                unsafe {
                    let at = entries
                        .cast::<u8>()
                        .add(n * entry_size)
                        .cast::<c::ibv_gid_entry>();
                    write_prefix(at, &e, entry_size)
                };
                n += 1;
            }
        }
        n as isize
    })
}

/// `ibv_query_gid_type` (rdma-core's provider-private `driver.h`, called by
/// `ibv_devinfo`): `IBV_GID_TYPE_SYSFS_ROCE_V2` (1) for every used entry;
/// 0, or -1 with errno.
pub(crate) extern "C" fn ibv_query_gid_type(
    context: *mut c::ibv_context,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    ffi("ibv_query_gid_type", -1, || {
        let r = ctx_of(context).and_then(|ctx| {
            if gid_type.is_null() {
                return Err(libc::EINVAL);
            }
            gid(ctx, port_num, index)?.ok_or(libc::EINVAL)
        });
        match r {
            Ok(_) => {
                // SAFETY: non-NULL (checked), the caller's enum ibv_gid_type_sysfs.
                unsafe { gid_type.write(1) };
                0
            }
            Err(e) => fail_with_errno(e),
        }
    })
}

/// `ibv_query_pkey(3)`: the default P_Key 0xffff at index 0 (RoCE has only
/// that one); 0, or -1 with errno `EINVAL`.
pub(crate) extern "C" fn ibv_query_pkey(
    context: *mut c::ibv_context,
    _port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    ffi("ibv_query_pkey", -1, || {
        if ctx_of(context).is_err() || pkey.is_null() || index != 0 {
            return fail_with_errno(libc::EINVAL);
        }
        // SAFETY: non-NULL (checked), the caller's __be16.
        unsafe { pkey.write(0xffffu16.to_be()) };
        0
    })
}

/// `ibv_get_pkey_index(3)`: 0 for the default P_Key, else -1 with `EINVAL`.
pub(crate) extern "C" fn ibv_get_pkey_index(
    _context: *mut c::ibv_context,
    _port_num: u8,
    pkey: u16,
) -> c_int {
    if u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        fail_with_errno(libc::EINVAL)
    }
}

/// `ibv_read_sysfs_file` (verbs.h): reads `dir/file` into `buf` (at most
/// `size` bytes, NUL-terminated, one trailing newline removed); its length,
/// or -1 (errno from the open or read). As rdma-core's `sysfs.c`.
pub(crate) extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    ffi("ibv_read_sysfs_file", -1, || {
        if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
            return fail_with_errno(libc::EINVAL);
        }
        // SAFETY: the caller passes NUL-terminated strings (non-NULL, checked).
        let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
        match std::fs::read(&path) {
            Ok(mut data) => {
                data.truncate(size - 1);
                if data.last() == Some(&b'\n') {
                    data.pop();
                }
                // SAFETY: `buf` holds `size` bytes; we write data.len() + 1 <= size.
                unsafe {
                    std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len());
                    *buf.add(data.len()) = 0;
                }
                data.len() as c_int
            }
            Err(e) => fail_with_errno(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    })
}
