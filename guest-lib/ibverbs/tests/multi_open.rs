//! Several `ibv_open_device` of one function in one process (issue 30
//! point 1: pyverbs and UCX open the device several times): the C programs
//! `tests/c/multi_open.c` (four contexts, data between them, another
//! context's lkey refused, one context closed while the others go on) and
//! `tests/c/multi_events.c` (each context's completion channel gets only
//! its own events), compiled with gcc against Debian's
//! `<infiniband/verbs.h>` and run on vrnic's libibverbs.so.1 with a vrnic
//! function served by an in-process daemon (`vrnic_frontend::TestDaemon`)
//! behind `VRNIC_VHOST_USER`. The function's link reflects every frame it
//! sends back to it, so its QPs reach each other. Skipped, saying why,
//! without gcc or libibverbs-dev.
//!
//! The same programs run again through `vrnic-agent --vhost-user` (the
//! library starts it, as in a container with the agent installed): each
//! open is then a program of the agent with a memory file of its own added
//! to the daemon's memory table. And several processes share one function
//! through it (issue 30 point 1): Debian's `ibv_rc_pingpong` server and
//! client, two processes on one function, then everything they had gone.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{
    assert_c_test_ok, compile_c_test, lib_dir, reflecting_function, run_bounded, which, AgentDir,
};

/// How the test's programs reach the function.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// Each process is the function's vhost-user frontend itself.
    Direct,
    /// Through `vrnic-agent --vhost-user`, started by the library.
    Agent,
}

/// Runs C test `name` against a fresh function whose link reflects.
fn run_c_test(name: &str, via: Via) {
    let Some((daemon, _reflector)) = reflecting_function() else {
        return;
    };
    let (dir, exe) = compile_c_test(name);
    let mut cmd = Command::new("timeout");
    cmd.arg("60")
        .arg(&exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("VRNIC_VHOST_USER", daemon.socket())
        .env("VRNIC_AGENT", "off")
        .env_remove("VRNIC_LOOPBACK")
        .env_remove("VRNIC_AGENT_SOCKET");
    let agent = (via == Via::Agent).then(|| AgentDir::new(name));
    if let Some(a) = &agent {
        a.env(&mut cmd);
    }
    let out = run_bounded(&mut cmd, Duration::from_secs(70));
    assert_c_test_ok(name, &dir, &out);
    if let Some(a) = &agent {
        AgentDir::wait_empty(&a.socket(daemon.socket()));
    }
}

#[test]
fn four_opens_in_one_process_move_data_and_keep_their_objects_apart() {
    run_c_test("multi_open", Via::Direct);
}

#[test]
fn each_context_s_completion_channel_gets_only_its_own_events() {
    run_c_test("multi_events", Via::Direct);
}

#[test]
fn four_opens_through_the_agent_each_with_its_memory_file() {
    run_c_test("multi_open", Via::Agent);
}

#[test]
fn completion_channels_through_the_agent_get_only_their_own_events() {
    run_c_test("multi_events", Via::Agent);
}

/// Registered memory across `fork(2)` (`tests/c/fork_copy.c`): the child
/// gets a private copy of the parent's registered pages (as rdma-core's
/// `IBV_FORK_UNNEEDED` promises), and the parent's MRs go on working.
#[test]
fn a_forked_child_gets_a_copy_of_registered_memory() {
    run_c_test("fork_copy", Via::Direct);
}

#[test]
fn a_forked_child_gets_a_copy_through_the_agent_too() {
    run_c_test("fork_copy", Via::Agent);
}

/// Debian's `ibv_rc_pingpong` server and client: two processes on one
/// function, through the agent the first of them starts; both move their
/// data (the tool checks nothing itself, but exits non-zero on any error
/// completion or a short run), then the agent serves nobody and the device
/// holds nothing.
#[test]
fn two_processes_share_one_function_through_the_agent() {
    let Some(pingpong) = which("ibv_rc_pingpong") else {
        eprintln!("skipping: needs ibv_rc_pingpong (ibverbs-utils)");
        return;
    };
    let Some((daemon, _reflector)) = reflecting_function() else {
        return;
    };
    let agent = AgentDir::new("pingpong");
    // A port of its own per test process: tests of other runs may listen too.
    let port = (20000 + std::process::id() % 20000).to_string();
    let run = |client: bool| {
        let mut cmd = Command::new("timeout");
        cmd.arg("60")
            .arg(&pingpong)
            .args(["-g", "1", "-s", "4096", "-n", "200", "-p", &port])
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("VRNIC_VHOST_USER", daemon.socket())
            .env_remove("VRNIC_LOOPBACK")
            .env_remove("VRNIC_AGENT_SOCKET");
        if client {
            cmd.arg("127.0.0.1");
        }
        agent.env(&mut cmd);
        cmd
    };
    let mut server = run(false);
    let server = std::thread::spawn(move || run_bounded(&mut server, Duration::from_secs(70)));
    // The client retries while the server does not listen yet (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let client = loop {
        let out = run_bounded(&mut run(true), Duration::from_secs(70));
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if out.status.success()
            || !err.contains("Couldn't connect")
            || std::time::Instant::now() > deadline
        {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let server = server.join().expect("the server thread");
    for (who, out) in [("server", &server), ("client", &client)] {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{who}: {}\n{text}", out.status);
        // ibv_rc_pingpong counts both directions: 2 x 200 x 4096 bytes.
        assert!(
            text.contains("1638400 bytes in"),
            "{who}: 200 x 4096 bytes each way not moved:\n{text}"
        );
    }
    AgentDir::wait_empty(&agent.socket(daemon.socket()));
}
