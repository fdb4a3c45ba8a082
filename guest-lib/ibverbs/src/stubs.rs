//! Every exported function that vrnic does not implement, in one table.
//!
//! Debian's `libibverbs.so.1` exports them and the binaries that must load
//! against this library (perftest, which also loads Debian's `libmlx5.so.1`,
//! `libefa.so.1` and `librdmacm.so.1`) import them, so each must exist with
//! its version node (`libibverbs.map`). A vrnic process never reaches the
//! provider-private ones (`ibv_cmd_*`, `verbs_*`, `execute_ioctl`: vrnic
//! has no kernel uverbs device, so no provider is ever bound); the others
//! fail with rdma-core's convention for their return type, `errno =
//! EOPNOTSUPP`, and a line on stderr when `VRNIC_IBVERBS_DEBUG` is set.
//!
//! Each stub is declared without parameters. On the C ABIs this library
//! targets (x86-64 SysV, AArch64 AAPCS) arguments live in registers or in
//! the caller's frame and the caller cleans up, so a callee that ignores
//! them is sound; only the return type must match, hence the kinds:
//! - `errno`: returns `EOPNOTSUPP` (functions that return an errno, e.g. `ibv_destroy_qp(3)`);
//! - `minus_one`: returns -1 (functions that return -1 and set errno, e.g. `ibv_query_gid(3)`);
//! - `neg_errno`: returns `-EOPNOTSUPP` as `ssize_t` (none today; `_ibv_query_gid_table` was one);
//! - `null`: returns NULL (constructors, e.g. `ibv_import_pd(3)`);
//! - `void`: returns nothing (`verbs_*` provider hooks, `ibv_unimport_*`).

use std::ffi::{c_int, c_void};
use std::io::Write as _;

use crate::boundary::{debug, set_errno};

/// Records a call of an unsupported function: `errno = EOPNOTSUPP`, and a
/// line on stderr with `VRNIC_IBVERBS_DEBUG`.
fn unsupported(name: &str) {
    if debug() {
        let _ = writeln!(
            std::io::stderr(),
            "libibverbs (vrnic): {name} is not supported"
        );
    }
    set_errno(libc::EOPNOTSUPP);
}

macro_rules! stub {
    (errno, $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: not supported, returns `EOPNOTSUPP`.")]
        pub(crate) extern "C" fn $name() -> c_int {
            unsupported(stringify!($name));
            libc::EOPNOTSUPP
        }
    };
    (minus_one, $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: not supported, returns -1 with `errno = EOPNOTSUPP`.")]
        pub(crate) extern "C" fn $name() -> c_int {
            unsupported(stringify!($name));
            -1
        }
    };
    (neg_errno, $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: not supported, returns `-EOPNOTSUPP`.")]
        pub(crate) extern "C" fn $name() -> isize {
            unsupported(stringify!($name));
            -(libc::EOPNOTSUPP as isize)
        }
    };
    (null, $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: not supported, returns NULL with `errno = EOPNOTSUPP`.")]
        pub(crate) extern "C" fn $name() -> *mut c_void {
            unsupported(stringify!($name));
            std::ptr::null_mut()
        }
    };
    (void, $name:ident) => {
        #[doc = concat!("`", stringify!($name), "`: not supported, does nothing.")]
        pub(crate) extern "C" fn $name() {
            unsupported(stringify!($name));
        }
    };
}

macro_rules! stubs {
    ($($kind:ident: [$($name:ident),* $(,)?])*) => {
        $($(stub!($kind, $name);)*)*
    };
}

stubs! {
    errno: [
        // Public verbs vrnic does not offer (yet).
        ibv_attach_mcast, ibv_detach_mcast, ibv_resize_cq, ibv_query_ece, ibv_set_ece,
        ibv_resolve_eth_l2_from_gid, ibv_rereg_mr,




        // Provider (driver) interface: vrnic binds no rdma-core provider.
        execute_ioctl, ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw, ibv_cmd_alloc_pd,
        ibv_cmd_attach_mcast, ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters,
        ibv_cmd_create_cq, ibv_cmd_create_cq_ex, ibv_cmd_create_flow,
        ibv_cmd_create_flow_action_esp, ibv_cmd_create_qp, ibv_cmd_create_qp_ex2,
        ibv_cmd_create_qp_ex, ibv_cmd_create_rwq_ind_table, ibv_cmd_create_srq,
        ibv_cmd_create_srq_ex, ibv_cmd_create_wq, ibv_cmd_dealloc_mw, ibv_cmd_dealloc_pd,
        ibv_cmd_dereg_mr, ibv_cmd_destroy_ah, ibv_cmd_destroy_counters, ibv_cmd_destroy_cq,
        ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action, ibv_cmd_destroy_qp,
        ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq, ibv_cmd_destroy_wq,
        ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context, ibv_cmd_modify_cq,
        ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp, ibv_cmd_modify_qp_ex,
        ibv_cmd_modify_srq, ibv_cmd_modify_wq, ibv_cmd_open_qp, ibv_cmd_open_xrcd,
        ibv_cmd_poll_cq, ibv_cmd_post_recv, ibv_cmd_post_send, ibv_cmd_post_srq_recv,
        ibv_cmd_query_context, ibv_cmd_query_device_any, ibv_cmd_query_mr, ibv_cmd_query_port,
        ibv_cmd_query_qp, ibv_cmd_query_srq, ibv_cmd_read_counters, ibv_cmd_reg_dm_mr,
        ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr, ibv_cmd_req_notify_cq, ibv_cmd_rereg_mr,
        ibv_cmd_resize_cq,
    ]
    minus_one: [

        ibv_read_ibdev_sysfs_file,
    ]
    neg_errno: []
    null: [
        ibv_get_sysfs_path,
        ibv_reg_dmabuf_mr,
        ibv_import_device, ibv_import_dm, ibv_import_mr, ibv_import_pd,
        verbs_open_device, _verbs_init_and_alloc_context, __ioctl_final_num_attrs,
    ]
    void: [
        ibv_unimport_dm,
        ibv_unimport_mr, ibv_unimport_pd, ibv_copy_ah_attr_from_kern,
        ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern, ibv_copy_qp_attr_from_kern,
        verbs_init_cq, verbs_register_driver_34, verbs_set_ops, verbs_uninit_context,
        __verbs_log,
    ]
}

/// `ibv_query_qp_data_in_order(3)`: vrnic promises no in-order placement
/// beyond what the verbs guarantee, so 0 (as rdma-core without a provider
/// hook).
pub(crate) extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}

/// The IBVERBS_1.0 entry points (rdma-core's `__ibv_*_1_0` compatibility
/// layer for applications built against libibverbs 1.0, which used other
/// structures) and `ibv_register_driver@IBVERBS_1.1` (the pre-provider-ABI
/// driver hook): exported so the version nodes are complete, never
/// implemented (`EOPNOTSUPP`).
pub(crate) mod compat {
    use super::*;

    stubs! {
        errno: [
            ibv_attach_mcast, ibv_close_device, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_ah,
            ibv_destroy_cq, ibv_destroy_qp, ibv_destroy_srq, ibv_detach_mcast, ibv_modify_qp,
            ibv_modify_srq, ibv_query_device, ibv_query_port, ibv_query_qp, ibv_query_srq,
            ibv_resize_cq,
        ]
        minus_one: [ibv_get_async_event, ibv_get_cq_event, ibv_query_gid, ibv_query_pkey]
        null: [
            ibv_alloc_pd, ibv_create_ah, ibv_create_cq, ibv_create_qp, ibv_create_srq,
            ibv_get_device_list, ibv_get_device_name, ibv_open_device, ibv_reg_mr,
        ]
        void: [ibv_ack_async_event, ibv_ack_cq_events, ibv_free_device_list, ibv_register_driver]
    }

    /// `ibv_get_device_guid@IBVERBS_1.0`: not supported, returns GUID 0.
    pub(crate) extern "C" fn ibv_get_device_guid() -> u64 {
        unsupported("ibv_get_device_guid@IBVERBS_1.0");
        0
    }
}
