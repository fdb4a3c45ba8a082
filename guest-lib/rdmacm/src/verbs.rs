//! The verbs this library uses, through the process's `libibverbs.so.1`
//! (linked dynamically, as rdma-core's librdmacm is: vrnic's library or
//! rdma-core's, whichever the process loads), and the conversions of the
//! kernel ABI's structures into verbs' (rdma-core `libibverbs/marshall.c`,
//! `ibv_copy_qp_attr_from_kern` and friends, done here in Rust).

use std::ffi::{c_int, c_void};

use crate::ffi::*;
use vrnic_guest::agent::ucma::abi as kabi;

extern "C" {
    pub(crate) fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    pub(crate) fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub(crate) fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    pub(crate) fn ibv_close_device(context: *mut ibv_context) -> c_int;
    pub(crate) fn ibv_get_device_guid(device: *mut ibv_device) -> u64;
    pub(crate) fn ibv_get_device_index(device: *mut ibv_device) -> c_int;
    pub(crate) fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    pub(crate) fn ibv_query_port(
        context: *mut ibv_context,
        port_num: u8,
        attr: *mut ibv_port_attr,
    ) -> c_int;
    pub(crate) fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    pub(crate) fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    pub(crate) fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    pub(crate) fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    pub(crate) fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int;
    pub(crate) fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    pub(crate) fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    pub(crate) fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub(crate) fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub(crate) fn ibv_create_srq(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq;
    pub(crate) fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int;
    pub(crate) fn ibv_query_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int;
    pub(crate) fn ibv_set_ece(qp: *mut ibv_qp, ece: *mut ibv_ece) -> c_int;
}

/// `ibv_copy_ah_attr_from_kern` (rdma-core `libibverbs/marshall.c`).
pub(crate) fn ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &kabi::ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

/// `ibv_copy_qp_attr_from_kern` (rdma-core `libibverbs/marshall.c`): every
/// field but `qp_state`, which stays what the caller asked for.
pub(crate) fn qp_attr_from_kern(dst: &mut ibv_qp_attr, src: &kabi::ib_uverbs_qp_attr) {
    dst.cur_qp_state = src.cur_qp_state;
    dst.path_mtu = src.path_mtu;
    dst.path_mig_state = src.path_mig_state;
    dst.qkey = src.qkey;
    dst.rq_psn = src.rq_psn;
    dst.sq_psn = src.sq_psn;
    dst.dest_qp_num = src.dest_qp_num;
    dst.qp_access_flags = src.qp_access_flags;
    dst.cap.max_send_wr = src.max_send_wr;
    dst.cap.max_recv_wr = src.max_recv_wr;
    dst.cap.max_send_sge = src.max_send_sge;
    dst.cap.max_recv_sge = src.max_recv_sge;
    dst.cap.max_inline_data = src.max_inline_data;
    ah_attr_from_kern(&mut dst.ah_attr, &src.ah_attr);
    ah_attr_from_kern(&mut dst.alt_ah_attr, &src.alt_ah_attr);
    dst.pkey_index = src.pkey_index;
    dst.alt_pkey_index = src.alt_pkey_index;
    dst.en_sqd_async_notify = src.en_sqd_async_notify;
    dst.sq_draining = src.sq_draining;
    dst.max_rd_atomic = src.max_rd_atomic;
    dst.max_dest_rd_atomic = src.max_dest_rd_atomic;
    dst.min_rnr_timer = src.min_rnr_timer;
    dst.port_num = src.port_num;
    dst.timeout = src.timeout;
    dst.retry_cnt = src.retry_cnt;
    dst.rnr_retry = src.rnr_retry;
    dst.alt_port_num = src.alt_port_num;
    dst.alt_timeout = src.alt_timeout;
}

/// `ibv_copy_path_rec_from_kern` (rdma-core `libibverbs/marshall.c`).
pub(crate) fn path_rec_from_kern(dst: &mut ibv_sa_path_rec, src: &kabi::ib_user_path_rec) {
    dst.dgid.raw = src.dgid;
    dst.sgid.raw = src.sgid;
    dst.dlid = src.dlid;
    dst.slid = src.slid;
    dst.raw_traffic = src.raw_traffic as _;
    dst.flow_label = src.flow_label;
    dst.hop_limit = src.hop_limit;
    dst.traffic_class = src.traffic_class;
    dst.reversible = src.reversible as _;
    dst.numb_path = src.numb_path;
    dst.pkey = src.pkey;
    dst.sl = src.sl;
    dst.mtu_selector = src.mtu_selector;
    dst.mtu = src.mtu as _;
    dst.rate_selector = src.rate_selector;
    dst.rate = src.rate;
    dst.packet_life_time = src.packet_life_time;
    dst.preference = src.preference;
    dst.packet_life_time_selector = src.packet_life_time_selector;
}

/// A zeroed value of a plain C structure (every type this library passes
/// to the ABIs: integers, arrays, pointers, unions of those).
pub(crate) fn zeroed<T>() -> T {
    // SAFETY: only used for the C structures of the bindings, for which
    // all-zero bytes are a valid value (NULL pointers, zero integers).
    unsafe { std::mem::zeroed() }
}

/// The bytes of a plain C structure (made by [`zeroed`] or from one, so
/// its padding is initialized).
pub(crate) fn bytes<T: Copy>(t: &T) -> &[u8] {
    // SAFETY: `t` is a live `T`; C structures of the bindings have no
    // uninitialized bytes when built from `zeroed`.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(t).cast::<u8>(), size_of::<T>()) }
}

/// The bytes of a plain C structure, to be written (any bytes are a
/// valid value of the bindings' structures).
pub(crate) fn bytes_mut<T: Copy>(t: &mut T) -> &mut [u8] {
    // SAFETY: `t` is a live, exclusively borrowed `T`; every byte pattern
    // is a valid value of the C structures this is used for.
    unsafe { std::slice::from_raw_parts_mut(std::ptr::from_mut(t).cast::<u8>(), size_of::<T>()) }
}
