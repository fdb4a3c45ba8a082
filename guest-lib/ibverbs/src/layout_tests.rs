//! ABI layout test: a C program compiled by gcc against Debian's
//! `<infiniband/verbs.h>` prints `sizeof`/`offsetof` of every structure and
//! field that applications, verbs.h's inline functions (`ibv_post_send`,
//! `ibv_poll_cq`, `verbs_get_ctx_op`, `ibv_wr_*`, ...) and this library
//! touch; each must equal what the Rust bindings (`crate::ffi`) give.
//! Independent of bindgen's own layout tests: gcc, not libclang, computes
//! the C side. (`struct verbs_device` lives in rdma-core's private
//! `driver.h`, not in the installed headers: no application sees it.)

use std::mem::{offset_of, size_of};
use std::process::Command;

use crate::ffi;

/// `[(C expression, Rust value)]`: for each struct its `sizeof` and the
/// `offsetof` of the listed fields (same name in C and Rust), then fields
/// whose Rust path differs (`"C path" => rust.path`: bindgen's names for
/// anonymous unions).
macro_rules! layouts {
    ($($s:ident [$($f:ident),* $(,)?] $({ $($c:literal => $($p:ident).+),* $(,)? })? ;)*) => {
        vec![$(
            (concat!("sizeof(struct ", stringify!($s), ")"), size_of::<ffi::$s>()),
            $((concat!("offsetof(struct ", stringify!($s), ", ", stringify!($f), ")"),
               offset_of!(ffi::$s, $f)),)*
            $($((concat!("offsetof(struct ", stringify!($s), ", ", $c, ")"),
                 offset_of!(ffi::$s, $($p).+)),)*)?
        )*]
    };
}

fn rust_layouts() -> Vec<(&'static str, usize)> {
    layouts! {
        ibv_device [_ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path];
        ibv_context [device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat];
        ibv_context_ops [alloc_mw, bind_mw, dealloc_mw, poll_cq, req_notify_cq, post_srq_recv,
            post_send, post_recv, _compat_async_event];
        verbs_context [query_port, advise_mr, alloc_null_mr, read_counters, create_counters,
            reg_dm_mr, alloc_dm, modify_cq, post_srq_ops, create_wq, query_rt_values,
            create_cq_ex, query_device_ex, ibv_destroy_flow, ibv_create_flow, open_qp,
            create_qp_ex, get_srq_num, create_srq_ex, open_xrcd, close_xrcd, sz, context] {
            "priv" => priv_,
        };
        ibv_pd [context, handle];
        ibv_mr [context, pd, addr, length, handle, lkey, rkey];
        ibv_comp_channel [context, fd, refcnt];
        ibv_cq [context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed];
        ibv_cq_ex [context, channel, cq_context, handle, cqe, mutex, cond,
            comp_events_completed, async_events_completed, comp_mask, status, wr_id,
            start_poll, next_poll, end_poll, read_opcode, read_vendor_err, read_byte_len,
            read_imm_data, read_qp_num, read_src_qp, read_wc_flags, read_slid, read_sl,
            read_dlid_path_bits, read_completion_ts, read_cvlan, read_flow_tag, read_tm_info,
            read_completion_wallclock_ns];
        ibv_srq [context, srq_context, pd, handle, mutex, cond, events_completed];
        ibv_qp [context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed];
        ibv_qp_ex [qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
            wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
            wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
            wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start,
            wr_complete, wr_abort, wr_atomic_write];
        ibv_qp_cap [max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data];
        ibv_qp_init_attr [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all];
        ibv_qp_attr [qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn,
            dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
            en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer,
            port_num, timeout, retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit];
        ibv_global_route [dgid, flow_label, sgid_index, hop_limit, traffic_class];
        ibv_ah_attr [grh, dlid, sl, src_path_bits, static_rate, is_global, port_num];
        ibv_sge [addr, length, lkey];
        ibv_recv_wr [wr_id, next, sg_list, num_sge];
        ibv_send_wr [wr_id, next, sg_list, num_sge, opcode, send_flags, wr, qp_type] {
            "imm_data" => __bindgen_anon_1.imm_data,
            "invalidate_rkey" => __bindgen_anon_1.invalidate_rkey,
            "wr.rdma.remote_addr" => wr.rdma.remote_addr,
            "wr.rdma.rkey" => wr.rdma.rkey,
            "wr.atomic.remote_addr" => wr.atomic.remote_addr,
            "wr.atomic.compare_add" => wr.atomic.compare_add,
            "wr.atomic.swap" => wr.atomic.swap,
            "wr.atomic.rkey" => wr.atomic.rkey,
            "wr.ud.ah" => wr.ud.ah,
            "wr.ud.remote_qpn" => wr.ud.remote_qpn,
            "wr.ud.remote_qkey" => wr.ud.remote_qkey,
            "bind_mw" => __bindgen_anon_2.bind_mw,
            "tso" => __bindgen_anon_2.tso,
        };
        ibv_wc [wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags,
            pkey_index, slid, sl, dlid_path_bits] {
            "imm_data" => __bindgen_anon_1.imm_data,
            "invalidated_rkey" => __bindgen_anon_1.invalidated_rkey,
        };
        ibv_device_attr [fw_ver, node_guid, sys_image_guid, max_mr_size, page_size_cap,
            vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge,
            max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom,
            max_res_rd_atom, max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee,
            max_rdd, max_mw, max_raw_ipv6_qp, max_raw_ethy_qp, max_mcast_grp,
            max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr, max_map_per_fmr,
            max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt];
        ibv_device_attr_ex [comp_mask, orig_attr, odp_caps, completion_timestamp_mask,
            hca_core_clock, device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq,
            packet_pacing_caps, raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps,
            xrc_odp_caps, phys_port_cnt_ex];
        ibv_port_attr [state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
            bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid, sm_lid, lmc, max_vl_num, sm_sl,
            subnet_timeout, init_type_reply, active_width, active_speed, phys_state, link_layer,
            flags, port_cap_flags2];
        ibv_gid_entry [gid, gid_index, port_num, gid_type, ndev_ifindex];
        ibv_async_event [element, event_type] {
            "element.cq" => element.cq,
            "element.qp" => element.qp,
            "element.srq" => element.srq,
            "element.port_num" => element.port_num,
        };
        ibv_cq_init_attr_ex [cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags,
            parent_domain];
        ibv_qp_init_attr_ex [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all,
            comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf,
            source_qpn, send_ops_flags];
        ibv_poll_cq_attr [comp_mask];
        ibv_srq_init_attr [srq_context, attr];
        ibv_srq_attr [max_wr, max_sge, srq_limit];
        ibv_ah [context, pd, handle];
    }
}

#[test]
fn layouts_match_gcc_and_debian_verbs_h() {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        // build.rs already needs it; this only guards a VRNIC_VERBS_H build.
        eprintln!(
            "skipping: {} absent (package libibverbs-dev)",
            header.display()
        );
        return;
    }
    let rust = rust_layouts();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (expr, _) in &rust {
        c.push_str(&format!("\tprintf(\"%s %zu\\n\", \"{expr}\", {expr});\n"));
    }
    c.push_str("\treturn 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("vrnic-ibverbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).expect("write layout.c");
    let cc = Command::new("gcc")
        .arg("-Wall")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output();
    let out = cc.and_then(|cc| {
        assert!(
            cc.status.success(),
            "gcc layout.c: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        Command::new(&exe).output()
    });
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("gcc and the layout program run");
    assert!(out.status.success(), "layout program failed");
    let text = String::from_utf8(out.stdout).expect("ASCII output");
    let c_values: std::collections::HashMap<&str, usize> = text
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k, v.parse().ok()?))
        })
        .collect();
    assert_eq!(c_values.len(), rust.len(), "one C value per Rust value");
    let wrong: Vec<String> = rust
        .iter()
        .filter(|(k, v)| c_values.get(k) != Some(v))
        .map(|(k, v)| format!("{k}: C {:?}, Rust {v}", c_values.get(k)))
        .collect();
    assert!(wrong.is_empty(), "layouts differ:\n{}", wrong.join("\n"));
    assert!(
        rust.len() > 300,
        "only {} layout values checked",
        rust.len()
    );
}
