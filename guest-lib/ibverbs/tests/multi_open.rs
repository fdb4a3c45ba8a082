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

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{assert_c_test_ok, compile_c_test, lib_dir, run_bounded, which};
use vrnic::link::{Link, MemLink};
use vrnic_frontend::{test_device_config, TestDaemon};

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

/// Runs C test `name` against a fresh function whose link reflects.
fn run_c_test(name: &str) {
    if which("gcc").is_none() || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: needs gcc and libibverbs-dev");
        return;
    }
    let (link, peer) = MemLink::pair();
    let _reflector = Reflector::start(peer);
    let daemon =
        TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts");
    let (dir, exe) = compile_c_test(name);
    let out = run_bounded(
        Command::new("timeout")
            .arg("60")
            .arg(&exe)
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("VRNIC_VHOST_USER", daemon.socket())
            .env_remove("VRNIC_LOOPBACK")
            .env_remove("VRNIC_AGENT_SOCKET"),
        Duration::from_secs(70),
    );
    assert_c_test_ok(name, &dir, &out);
}

#[test]
fn four_opens_in_one_process_move_data_and_keep_their_objects_apart() {
    run_c_test("multi_open");
}

#[test]
fn each_context_s_completion_channel_gets_only_its_own_events() {
    run_c_test("multi_events");
}
