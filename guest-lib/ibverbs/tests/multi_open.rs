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

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{agent_bin, assert_c_test_ok, compile_c_test, lib_dir, run_bounded, which};
use vrnic::link::{Link, MemLink};
use vrnic_frontend::{test_device_config, TestDaemon};
use vrnic_guest::agent::{self, client::AgentTransport, proto};

/// Sends every frame arriving on its end of the link back, until dropped:
/// the function then receives what it sends to itself.
struct Reflector {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reflector {
    fn start(mut end: MemLink) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let fd = end.caps().fd.expect("a MemLink end has an eventfd");
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd; bounded wait, so the stop flag
                // is seen within 50 ms.
                unsafe { libc::poll(&mut p, 1, 50) };
                while let Ok(Some(n)) = end.recv(&mut buf) {
                    let _ = end.send(&buf[..n]);
                }
            }
        });
        Reflector {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How the test's programs reach the function.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// Each process is the function's vhost-user frontend itself.
    Direct,
    /// Through `vrnic-agent --vhost-user`, started by the library.
    Agent,
}

/// The agent a test's programs started (through the library), in a
/// temporary directory of the test's own (`TMPDIR`): on drop, stopped with
/// SIGTERM (its PID from the socket's peer credentials; bounded, then
/// SIGKILL) and the directory removed.
struct AgentDir {
    tmp: std::path::PathBuf,
}

impl AgentDir {
    fn new(tag: &str) -> Self {
        // One per test, even for two tests of one program.
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = std::env::temp_dir().join(format!("vrnic-mp-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("agent temp dir");
        AgentDir { tmp }
    }

    /// The agent's socket for the function behind `vhost_user`, as the
    /// library computes it under this `TMPDIR`.
    fn socket(&self, vhost_user: &Path) -> std::path::PathBuf {
        agent::vhost_user_socket_in(&self.tmp, vhost_user)
    }

    /// Sets `cmd` up to reach the function behind `vhost_user` through the
    /// agent.
    fn env(&self, cmd: &mut Command) {
        cmd.env("VRNIC_AGENT", agent_bin()).env("TMPDIR", &self.tmp);
    }

    /// Waits (bounded) until the agent at `socket` serves no program and
    /// its device holds nothing but the default context.
    fn wait_empty(socket: &Path) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let st = AgentTransport::status(socket).unwrap_or_else(|e| {
                let log = std::fs::read_to_string(format!("{}.log", socket.display()));
                panic!("the agent does not answer its status: {e}; its log:\n{log:?}")
            });
            let u = st.usage;
            let left = [u.pds, u.mrs, u.cqs, u.qps, u.ahs, u.srqs, u.mr_pages];
            if st.programs == 0 && u.ctxs == 1 && left == [0; 7] {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent still serves {} programs: {u:?}",
                st.programs
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AgentDir {
    fn drop(&mut self) {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let dir = self.tmp.join(format!("vrnic-{uid}"));
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "sock") {
                continue;
            }
            let Ok(sock) = proto::connect(&path) else {
                continue;
            };
            let Ok(pid) = proto::peer_pid(&sock) else {
                continue;
            };
            drop(sock);
            // SAFETY: signalling the agent this test's programs started
            // (the peer of its own socket in the test's own directory).
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let alive = || {
                // SAFETY: signal 0 only checks that the process exists.
                unsafe { libc::kill(pid, 0) == 0 }
            };
            while alive() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if alive() {
                // SAFETY: as above; the agent did not stop within 10 s.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// A fresh function whose link reflects every frame, served in this
/// process; `None` (saying why) without gcc or libibverbs-dev.
fn reflecting_function() -> Option<(TestDaemon, Reflector)> {
    if which("gcc").is_none() || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: needs gcc and libibverbs-dev");
        return None;
    }
    let (link, peer) = MemLink::pair();
    let reflector = Reflector::start(peer);
    let daemon =
        TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts");
    Some((daemon, reflector))
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
