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
//! rxe's errno, and the process lives. And `tests/c/exhaust.c`, out of
//! resources: PDs, MRs, CQs, QPs, SRQs and AHs created until the device
//! has no more stop at exactly `ibv_query_device`'s count with NULL and
//! `ENOMEM` (the file says why ENOMEM: mlx5's; today's rxe says EINVAL),
//! one destroyed makes room for one, and so for the device's budget of
//! ring entries; the library's own DMA memory comes back as objects go
//! (more than all of it through CQs and QPs, every create succeeds); the
//! context, a second context of the device and the process live on, and a
//! second process on the same daemon finds every limit again; the same
//! through the guest agent, which then ends empty. Skipped, saying why,
//! without gcc or libibverbs-dev.
//!
//! Not driven to exhaustion here: the device's MR page budget
//! (`max_total_mr_pages`, 8 GiB of registered pages) — registering that
//! much under the C ABI remaps gigabytes of the program's memory onto the
//! shared file; `vrnic/tests/hostile_guest.rs` (`mr_page_budget_enforced`)
//! drives it at the device, with one page aliased.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{agent_bin, assert_c_test_ok, compile_c_test, lib_dir, run_bounded, which, AgentDir};
use vrnic::link::MemLink;
use vrnic_frontend::{test_device_config, TestDaemon};

/// True when gcc and libibverbs-dev are there; says why not otherwise.
fn have_compiler() -> bool {
    if which("gcc").is_none() || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: needs gcc and libibverbs-dev");
        return false;
    }
    true
}

/// A daemon serving one function whose link goes nowhere.
fn lone_function() -> TestDaemon {
    let (link, _peer) = MemLink::pair();
    TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts")
}

/// Runs the compiled C test `exe` (of `dir`) with `args` on `daemon`'s
/// function with `env` added, and asserts it passed.
fn run_c_on(
    daemon: &TestDaemon,
    name: &str,
    (dir, exe): (&Path, &Path),
    args: &[&str],
    env: &[(&str, String)],
) {
    let mut cmd = Command::new("timeout");
    cmd.arg("60")
        .arg(exe)
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("VRNIC_VHOST_USER", daemon.socket())
        .env("VRNIC_AGENT", "off")
        .env_remove("VRNIC_LOOPBACK")
        .env_remove("VRNIC_AGENT_SOCKET");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_bounded(&mut cmd, Duration::from_secs(70));
    assert_c_test_ok(name, dir, &out);
}

/// Runs C test `name` on a fresh function (its link goes nowhere).
fn run_c_test(name: &str) {
    if !have_compiler() {
        return;
    }
    let daemon = lone_function();
    let (dir, exe) = compile_c_test(name);
    run_c_on(&daemon, name, (&dir, &exe), &[], &[]);
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

/// `tests/c/exhaust.c`: every kind of object created until the device is
/// out of it (PDs, MRs, CQs, QPs, SRQs, AHs, and ring entries: the
/// device's `MAX_TOTAL_WR`, passed in `VRNIC_TEST_MAX_TOTAL_WR`) stops at
/// exactly the advertised maximum with NULL and `ENOMEM`, one destroyed
/// makes room for one, and the context, a second context and the process
/// live on. Run twice on one daemon: the second run finds the same limits,
/// so the daemon lived and freed everything the first process had.
#[test]
fn running_out_of_every_object_is_enomem_at_the_advertised_limit() {
    if !have_compiler() {
        return;
    }
    let daemon = lone_function();
    let env = exhaust_env();
    for args in [&[][..], &["again"][..]] {
        // assert_c_test_ok removes the program's directory: one each run.
        let (dir, exe) = compile_c_test("exhaust");
        run_c_on(&daemon, "exhaust", (&dir, &exe), args, &env);
    }
}

/// What `tests/c/exhaust.c` needs to know that `ibv_query_device` does not
/// say: the device's ring-entry budget and the library's DMA memory.
fn exhaust_env() -> Vec<(&'static str, String)> {
    vec![
        (
            "VRNIC_TEST_MAX_TOTAL_WR",
            vrnic::device::MAX_TOTAL_WR.to_string(),
        ),
        (
            "VRNIC_TEST_DMA_BYTES",
            vrnic_guest::vhost_user::RAM_SIZE.to_string(),
        ),
    ]
}

/// `tests/c/exhaust.c` through the guest agent (`VRNIC_AGENT`), which
/// holds the program's objects in a context of its own and reaches the
/// program's DMA memory in its memory file: the same limits and errnos,
/// the DMA memory comes back as objects go, and the agent ends empty.
#[test]
fn running_out_through_the_agent_is_enomem_too() {
    if !have_compiler() {
        return;
    }
    let daemon = lone_function();
    let agent = AgentDir::new("exhaust");
    let mut env = exhaust_env();
    env.push(("VRNIC_AGENT", agent_bin().display().to_string()));
    env.push(("TMPDIR", agent.tmp.display().to_string()));
    let (dir, exe) = compile_c_test("exhaust");
    run_c_on(&daemon, "exhaust", (&dir, &exe), &[], &env);
    AgentDir::wait_empty(&agent.socket(daemon.socket()));
}
