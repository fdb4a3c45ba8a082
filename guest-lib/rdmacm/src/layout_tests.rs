//! ABI layout test: a C program compiled by gcc against Debian's
//! `<rdma/rdma_cma.h>` prints `sizeof`/`offsetof` of every structure and
//! field of the librdmacm ABI that applications and this library touch;
//! each must equal what the Rust bindings (`crate::ffi`) give. Independent
//! of bindgen's own (compile-time) layout checks: gcc, not libclang,
//! computes the C side.

use std::mem::{offset_of, size_of};
use std::process::Command;

use crate::ffi;

/// `[(C expression, Rust value)]`, as vrnic-ibverbs' `layout_tests`.
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
        rdma_event_channel [fd];
        rdma_ib_addr [sgid, dgid, pkey];
        rdma_addr [] {
            "src_addr" => __bindgen_anon_1,
            "dst_addr" => __bindgen_anon_2,
            "addr.ibaddr" => addr,
        };
        rdma_route [addr, path_rec, num_paths];
        rdma_cm_id [verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel,
            send_cq, recv_cq_channel, recv_cq, srq, pd, qp_type];
        rdma_conn_param [private_data, private_data_len, responder_resources, initiator_depth,
            flow_control, retry_count, rnr_retry_count, srq, qp_num];
        rdma_ud_param [private_data, private_data_len, ah_attr, qp_num, qkey];
        rdma_cm_event [id, listen_id, event, status, param];
        rdma_addrinfo [ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len,
            ai_src_addr, ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next];
        rdma_cm_join_mc_attr_ex [comp_mask, join_flags, addr];
        ibv_ece [vendor_id, options, comp_mask];
        ibv_path_data [flags, reserved, path];
    }
}

#[test]
fn layouts_match_gcc_and_debian_rdma_cma_h() {
    let header = std::path::Path::new("/usr/include/rdma/rdma_cma.h");
    if !header.exists() {
        // build.rs already needs it; this only guards a VRNIC_RDMA_INCLUDE build.
        eprintln!(
            "skipping: {} absent (package librdmacm-dev)",
            header.display()
        );
        return;
    }
    let rust = rust_layouts();
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <rdma/rdma_cma.h>\nint main(void) {\n",
    );
    for (expr, _) in &rust {
        c.push_str(&format!("\tprintf(\"%s %zu\\n\", \"{expr}\", {expr});\n"));
    }
    c.push_str("\treturn 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("vrnic-rdmacm-layout-{}", std::process::id()));
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
}
