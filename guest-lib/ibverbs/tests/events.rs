//! Completion channels and asynchronous events as an rdma-core application
//! sees them: `tests/c/events.c`, compiled with gcc against Debian's
//! `<infiniband/verbs.h>` and run on vrnic's libibverbs.so.1 with an
//! in-process device on the loopback interface of a network namespace this
//! test creates and deletes. The channel fd and `async_fd` must be quiet
//! before, and readable for `poll(2)` after, a send that fails with a local
//! protection error; `ibv_get_cq_event` and `ibv_get_async_event`
//! (`IBV_EVENT_QP_FATAL`) must name the CQ and the QP. Skipped, saying why,
//! without root, `ip`, gcc or libibverbs-dev.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_c_test_ok, c_test_netns, compile_c_test, lib_dir, run_bounded};

#[test]
fn channel_and_async_fds_wake_poll_and_name_their_objects() {
    let Some(ns) = c_test_netns("events") else {
        return;
    };

    let (dir, exe) = compile_c_test("events");
    let out = run_bounded(
        Command::new("ip")
            .args(["netns", "exec", &ns.0, "timeout", "60"])
            .arg(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("VRNIC_LOOPBACK", "netdev=lo,ip=10.9.44.11/24,mtu=1500"),
        Duration::from_secs(70),
    );
    assert_c_test_ok("events", &dir, &out);
}
