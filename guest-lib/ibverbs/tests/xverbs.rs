//! The extended verbs as an rdma-core application uses them:
//! `tests/c/xverbs.c`, compiled with gcc against Debian's
//! `<infiniband/verbs.h>` and run on vrnic's libibverbs.so.1 as two
//! processes (it forks), each with an in-process device on one end of a
//! veth pair in a network namespace this test creates and deletes:
//! `ibv_query_device_ex`, `ibv_create_cq_ex` polled with
//! `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` and the `ibv_wc_read_*`
//! readers, `ibv_create_qp_ex` + `ibv_qp_to_qp_ex` and `ibv_wr_*` with each
//! opcode (data and completions checked on both sides), a batch in one
//! `ibv_wr_complete`, `ibv_wr_abort`, `ibv_wr_complete` failing without
//! posting, and a UD reply through `ibv_create_ah_from_wc` and
//! `ibv_wr_set_ud_addr`. Skipped, saying why, without root, `ip`, gcc or
//! libibverbs-dev.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_c_test_ok, c_test_netns, compile_c_test, lib_dir, run_bounded};

#[test]
fn extended_cq_and_qp_post_and_poll_every_opcode() {
    let Some(ns) = c_test_netns("xverbs") else {
        return;
    };
    for args in [
        &["link", "add", "xa", "type", "veth", "peer", "name", "xb"][..],
        &["link", "set", "xa", "up"],
        &["link", "set", "xb", "up"],
    ] {
        let ok = Command::new("ip")
            .args(["-n", &ns.0])
            .args(args)
            .status()
            .expect("ip runs");
        assert!(ok.success(), "ip {args:?}");
    }

    let (dir, exe) = compile_c_test("xverbs");
    let out = run_bounded(
        Command::new("ip")
            .args(["netns", "exec", &ns.0, "timeout", "60"])
            .arg(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("VRNIC_LOOPBACK", "netdev=xa,ip=10.9.45.11/24")
            .env("XVERBS_PEER", "netdev=xb,ip=10.9.45.12/24"),
        Duration::from_secs(70),
    );
    assert_c_test_ok("xverbs", &dir, &out);
}
