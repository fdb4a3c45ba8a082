//! A refused `ibv_open_device` under the C ABI (issue 30):
//! `tests/c/open_fail.c`, compiled with gcc against Debian's
//! `<infiniband/verbs.h>` and run on vrnic's libibverbs.so.1 with a vrnic
//! function served by an in-process daemon (`vrnic_frontend::TestDaemon`
//! on a `MemLink`) behind `VRNIC_VHOST_USER`. The function takes one
//! frontend, one process, at a time: the program's second open is a
//! context of its own on its connection, a child's open is refused (NULL
//! with `ENODEV`), the first context keeps working, and deregistering that
//! context's MRs on small heap buffers afterwards (what pyverbs does next)
//! must leave the heap intact; the process must live. And
//! `tests/c/create_fail.c`: creates and calls with bad arguments fail with
//! rxe's errno, and the process lives. Skipped, saying why, without gcc or
//! libibverbs-dev.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{assert_c_test_ok, compile_c_test, lib_dir, run_bounded, which};
use vrnic::link::MemLink;
use vrnic_frontend::{test_device_config, TestDaemon};

/// Runs C test `name` on a fresh function (its link goes nowhere).
fn run_c_test(name: &str) {
    if which("gcc").is_none() || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: needs gcc and libibverbs-dev");
        return;
    }
    let (link, _peer) = MemLink::pair();
    let daemon =
        TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts");
    let (dir, exe) = compile_c_test(name);
    let out = run_bounded(
        Command::new("timeout")
            .arg("60")
            .arg(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("VRNIC_VHOST_USER", daemon.socket())
            .env("VRNIC_AGENT", "off")
            .env_remove("VRNIC_LOOPBACK")
            .env_remove("VRNIC_AGENT_SOCKET"),
        Duration::from_secs(70),
    );
    assert_c_test_ok(name, &dir, &out);
}

#[test]
fn a_second_process_is_refused_with_enodev_and_the_first_lives() {
    run_c_test("open_fail");
}

/// `tests/c/create_fail.c`: every create past the device's limits or with
/// bad arguments is NULL with rxe's errno, every failing call returning an
/// int returns it, and the process and its context live on.
#[test]
fn failing_creates_return_their_errno_and_the_process_lives() {
    run_c_test("create_fail");
}
