//! Address handles for UD (`ibv_create_ah(3)`, `ibv_destroy_ah(3)`,
//! `ibv_create_ah_from_wc(3)`, `ibv_init_ah_from_wc(3)`).

use std::ffi::c_int;

use vrnic_guest::verbs::{grh_sgid, Ah, AhAttr, Gid, GRH_LEN};

use crate::boundary::{fail_with_errno, ffi};
use crate::ffi as c;
use crate::pd::VrnicPd;

/// An AH: the `struct ibv_ah` applications see, first.
#[repr(C)]
pub(crate) struct VrnicAh {
    pub(crate) ah: c::ibv_ah,
    pub(crate) inner: Ah,
}

/// The device handle of an application's `ibv_ah *` (NULL: `None`).
///
/// # Safety
/// A non-NULL `ah` must come from [`ibv_create_ah`] and be alive.
pub(crate) unsafe fn handle_of(ah: *mut c::ibv_ah) -> Option<u32> {
    // SAFETY: per the contract, `ah` is the start of a live VrnicAh.
    (!ah.is_null()).then(|| unsafe { (*ah.cast::<VrnicAh>()).inner.handle() })
}

/// `ibv_create_ah(3)`: an AH for `attr` (RoCE: `is_global` with the GRH's
/// destination GID); the AH, or NULL with errno.
pub(crate) extern "C" fn ibv_create_ah(
    pd: *mut c::ibv_pd,
    attr: *mut c::ibv_ah_attr,
) -> *mut c::ibv_ah {
    ffi("ibv_create_ah", std::ptr::null_mut(), || {
        // SAFETY: the application passes a live PD or NULL.
        let Some(vpd) = (unsafe { VrnicPd::from_ptr(pd) }) else {
            return fail_with_errno(libc::EINVAL);
        };
        if attr.is_null() {
            return fail_with_errno(libc::EINVAL);
        }
        // SAFETY: non-NULL (checked), the caller's attributes.
        let a = unsafe { &*attr };
        let aa = AhAttr {
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
        };
        match Ah::new(&vpd.inner, &aa) {
            Ok(inner) => {
                let ah = c::ibv_ah {
                    context: vpd.pd.context,
                    pd,
                    handle: inner.handle(),
                };
                Box::into_raw(Box::new(VrnicAh { ah, inner })).cast()
            }
            Err(e) => fail_with_errno(e.errno()),
        }
    })
}

/// `ibv_destroy_ah(3)`: 0, or `EINVAL` for NULL.
pub(crate) extern "C" fn ibv_destroy_ah(ah: *mut c::ibv_ah) -> c_int {
    ffi("ibv_destroy_ah", libc::EIO, || {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `ah` is the start of a VrnicAh boxed by ibv_create_ah, freed once.
        drop(unsafe { Box::from_raw(ah.cast::<VrnicAh>()) });
        0
    })
}

/// The AH attributes that answer a UD receive, as rdma-core's
/// `ibv_init_ah_from_wc` for RoCE v2 (`libibverbs/verbs.c`): global, the
/// destination GID the sender's address in the GRH area (`wc_flags` must
/// have `IBV_WC_GRH`), the source GID index the entry of `port` holding the
/// address the packet was sent to, hop limit 0xff, the traffic class and
/// flow label of the packet (an IPv4 packet's TOS; flow label 0).
fn ah_attr_from_wc(
    context: *mut c::ibv_context,
    port_num: u8,
    wc: *const c::ibv_wc,
    grh: *const c::ibv_grh,
) -> Result<c::ibv_ah_attr, c_int> {
    // SAFETY: the application passes a live context or NULL.
    let ctx = unsafe { crate::context::VrnicContext::from_ptr(context) }.ok_or(libc::EINVAL)?;
    if wc.is_null() || grh.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL (checked), the application's completion.
    let wc = unsafe { &*wc };
    if wc.wc_flags & c::ibv_wc_flags_IBV_WC_GRH == 0 {
        // RoCE addresses by GID: without a GRH there is no return path.
        return Err(libc::EINVAL);
    }
    // SAFETY: non-NULL (checked): the GRH_LEN bytes at the start of the
    // receive buffer (ibv_init_ah_from_wc(3)).
    let area = unsafe { std::slice::from_raw_parts(grh.cast::<u8>(), GRH_LEN) };
    let sgid = grh_sgid(area).ok_or(libc::EINVAL)?;
    // The packet's destination and traffic class: IPv4 header at byte 20
    // of the area, or the IPv6 header at its start (see grh_sgid).
    let (dst, tclass, flow) = if area[0] >> 4 == 6 {
        let vtf = u32::from_be_bytes(area[..4].try_into().expect("4 bytes"));
        let d: [u8; 16] = area[24..40].try_into().expect("16 bytes");
        (Gid { raw: d }, (vtf >> 20) as u8, vtf & 0xf_ffff)
    } else {
        let d: [u8; 4] = area[36..40].try_into().expect("4 bytes");
        (Gid::from(std::net::Ipv4Addr::from(d)), area[21], 0)
    };
    let tbl = ctx
        .verbs
        .query_port(port_num)
        .map_err(|e| e.errno())?
        .gid_tbl_len;
    let index = (0..tbl)
        .find(|&i| ctx.verbs.query_gid(port_num, i).is_ok_and(|g| g == dst))
        .ok_or(libc::ENOENT)?;
    Ok(c::ibv_ah_attr {
        grh: c::ibv_global_route {
            dgid: c::ibv_gid { raw: sgid.raw },
            flow_label: flow,
            sgid_index: u8::try_from(index).map_err(|_| libc::EINVAL)?,
            hop_limit: 0xff,
            traffic_class: tclass,
        },
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        is_global: 1,
        port_num,
        ..Default::default()
    })
}

/// `ibv_init_ah_from_wc(3)`: fills `ah_attr` to reply to the UD receive
/// `wc` whose GRH area is `grh` (see [`ah_attr_from_wc`]); 0, or -1 with
/// errno (`EINVAL` for a NULL argument or a completion without
/// `IBV_WC_GRH`, `ENOENT` when no GID of the port is the packet's destination).
pub(crate) extern "C" fn ibv_init_ah_from_wc(
    context: *mut c::ibv_context,
    port_num: u8,
    wc: *mut c::ibv_wc,
    grh: *mut c::ibv_grh,
    ah_attr: *mut c::ibv_ah_attr,
) -> c_int {
    ffi("ibv_init_ah_from_wc", -1, || {
        if ah_attr.is_null() {
            return fail_with_errno(libc::EINVAL);
        }
        match ah_attr_from_wc(context, port_num, wc, grh) {
            Ok(a) => {
                // SAFETY: non-NULL (checked), the caller's attributes.
                unsafe { ah_attr.write(a) };
                0
            }
            Err(e) => fail_with_errno(e),
        }
    })
}

/// `ibv_create_ah_from_wc(3)`: an AH replying to the UD receive `wc`
/// (`ibv_init_ah_from_wc`, then `ibv_create_ah`); the AH, or NULL with errno.
pub(crate) extern "C" fn ibv_create_ah_from_wc(
    pd: *mut c::ibv_pd,
    wc: *mut c::ibv_wc,
    grh: *mut c::ibv_grh,
    port_num: u8,
) -> *mut c::ibv_ah {
    ffi("ibv_create_ah_from_wc", std::ptr::null_mut(), || {
        if pd.is_null() {
            return fail_with_errno(libc::EINVAL);
        }
        // SAFETY: a live PD (non-NULL, checked).
        let context = unsafe { (*pd).context };
        match ah_attr_from_wc(context, port_num, wc, grh) {
            Ok(mut a) => ibv_create_ah(pd, &mut a),
            Err(e) => fail_with_errno(e),
        }
    })
}
