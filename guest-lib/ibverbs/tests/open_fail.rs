//! A refused `ibv_open_device` under the C ABI (issue 30):
//! `tests/c/open_fail.c`, compiled with gcc against Debian's
//! `<infiniband/verbs.h>` and run on vrnic's libibverbs.so.1 with a vrnic
//! function served by an in-process daemon (`vrnic_frontend::TestDaemon`
//! on a `MemLink`) behind `VRNIC_VHOST_USER`. The function takes one
//! frontend, one process, at a time: the program's second open is a
//! context of its own on its connection, a child's open is refused (NULL
//! with `ENODEV`), the first context keeps working, and deregistering that
//! context's MRs on small heap buffers afterwards (what pyverbs does next)
//! must leave the heap intact; the process must live. Skipped, saying why,
//! without gcc or libibverbs-dev.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{assert_c_test_ok, compile_c_test, lib_dir, run_bounded, which};
use vrnic::link::MemLink;
use vrnic_frontend::{test_device_config, TestDaemon};

#[test]
fn a_second_process_is_refused_with_enodev_and_the_first_lives() {
    if which("gcc").is_none() || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: needs gcc and libibverbs-dev");
        return;
    }
    let (link, _peer) = MemLink::pair();
    let daemon =
        TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts");
    let (dir, exe) = compile_c_test("open_fail");
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
    assert_c_test_ok("open_fail", &dir, &out);
}
