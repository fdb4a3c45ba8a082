//! What needs no working connection manager, from C (`tests/c/cm_basic.c`):
//! - `checks`: event channel (a pollable fd), ids, options (sent to the
//!   agent with their values), ports, ECE, and the CM's calls against a
//!   fake agent that refuses every command (`EOPNOTSUPP`: the calls fail
//!   with it, or with the library's own `EINVAL`), never crashing;
//! - `compare`: `rdma_event_str(3)` of every event and `rdma_getaddrinfo(3)`
//!   of numeric, passive and hint-only cases print the same lines with this
//!   library as with Debian's. Debian's resolves nothing on a machine
//!   without an RDMA device (`ucma_init`: `ENODEV`), so it runs on vrnic's
//!   `libibverbs.so.1` with `VRNIC_LOOPBACK` on `lo` (a device to list;
//!   nothing is opened);
//! - `devices`: `rdma_get_devices(3)` through the process's libibverbs:
//!   none on Debian's (here), `vrnic0` on vrnic's with `VRNIC_LOOPBACK`
//!   (opening it needs root: an AF_PACKET socket).

mod common;

use std::process::Command;
use std::time::Duration;

use common::fake_agent::{FakeAgent, Rec};
use common::{
    assert_c_test_ok, compile_c_test, debian_lib, lib_dir, run_bounded, text, vrnic_lib_dir,
};
use vrnic_guest::agent::ucma::abi as kabi;

const LOOPBACK: &str = "netdev=lo,ip=127.0.0.1/8";

fn run(
    exe: &std::path::Path,
    mode: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> std::process::Output {
    let mut c = Command::new(exe);
    c.arg(mode).env_remove("VRNIC_LOOPBACK");
    for (k, v) in env {
        c.env(k, v);
    }
    run_bounded(&mut c, Duration::from_secs(30))
}

#[test]
fn implemented_calls_and_agent_errors() {
    let Some((dir, exe)) = compile_c_test("cm_basic") else {
        return;
    };
    let agent = FakeAgent::start(Box::new(|_, _| Err(libc::EOPNOTSUPP)));
    let out = run(
        &exe,
        "checks",
        &[
            ("LD_LIBRARY_PATH", lib_dir().as_os_str()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_basic", &out);
    // The four valid options reached the agent, each with its value.
    let opts: Vec<(u32, u32, Vec<u8>)> = agent
        .log()
        .iter()
        .filter(|r| r.cmd == kabi::RDMA_USER_CM_CMD_SET_OPTION)
        .map(|r: &Rec| {
            let c: kabi::rdma_ucm_set_option = r.as_();
            assert_eq!(c.optlen as usize, r.extra.len());
            (c.level, c.optname, r.extra.clone())
        })
        .collect();
    assert_eq!(
        opts,
        [
            (0, 0, vec![32]),
            (0, 3, vec![14]),
            (0, 1, 1i32.to_ne_bytes().to_vec()),
            (0, 2, 1i32.to_ne_bytes().to_vec()),
        ]
    );
}

/// The `= ` lines of a `compare` run.
fn compared(out: &std::process::Output) -> Vec<String> {
    assert_c_test_ok("cm_basic", out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("= "))
        .map(str::to_string)
        .collect()
}

#[test]
fn event_str_and_getaddrinfo_match_debian() {
    let Some((dir, exe)) = compile_c_test("cm_basic") else {
        return;
    };
    let ours = compared(&run(
        &exe,
        "compare",
        &[("LD_LIBRARY_PATH", lib_dir().as_os_str())],
    ));
    // What rdma-core's addrinfo.c gives, whatever Debian's does here.
    for want in [
        "= event 9 RDMA_CM_EVENT_ESTABLISHED",
        "= event 16 UNKNOWN EVENT",
        "= gai passive-v4 ret 0 flags 0x1 family 2 qp_type 2 ps 0x106 src 127.0.0.1:7471 (16) dst - (0)",
        "= gai active-ud ret 0 flags 0 family 2 qp_type 4 ps 0x111 src - (0) dst 10.0.0.9:4791 (16)",
        "= gai active-name-numeric ret -2 errno 0",
        "= gai nothing ret -1 errno 22",
        "= gai hints-only ret 0 flags 0x6 family 2 qp_type 2 ps 0x106 src 10.0.0.1:1234 (16) dst 10.0.0.2:5678 (16)",
    ] {
        assert!(
            ours.iter().any(|l| l.starts_with(want)),
            "no line {want:?} in:\n{}",
            ours.join("\n")
        );
    }
    if debian_lib().is_none() {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("skipping the comparison: Debian's librdmacm1 is not installed");
        return;
    }
    let Some(vdir) = vrnic_lib_dir(false) else {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("skipping the comparison: vrnic's libibverbs.so.1 could not be built");
        return;
    };
    let debian = compared(&run(
        &exe,
        "compare",
        &[
            ("LD_LIBRARY_PATH", vdir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
        ],
    ));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(debian.len(), ours.len());
    let events = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|l| l.starts_with("= event"))
            .cloned()
            .collect()
    };
    assert_eq!(events(&debian), events(&ours), "rdma_event_str differs");
    if debian
        .iter()
        .any(|l| l.starts_with("= gai passive-v4 ret -1"))
    {
        eprintln!(
            "skipping the getaddrinfo comparison: Debian's librdmacm cannot initialise here \
             (no kernel rdma_cm ABI?): {:?}",
            debian.iter().find(|l| l.starts_with("= gai passive-v4"))
        );
        return;
    }
    let diff: Vec<String> = debian
        .iter()
        .zip(&ours)
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("Debian: {a}\nvrnic:  {b}"))
        .collect();
    assert!(diff.is_empty(), "answers differ:\n{}", diff.join("\n"));
}

#[test]
fn get_devices_through_the_process_libibverbs() {
    let Some((dir, exe)) = compile_c_test("cm_basic") else {
        return;
    };
    // Debian's libibverbs on this host: whatever it lists, consistently.
    let out = run(
        &exe,
        "devices",
        &[("LD_LIBRARY_PATH", lib_dir().as_os_str())],
    );
    assert_c_test_ok("cm_basic", &out);
    let t = text(&out);
    assert!(
        t.contains("devices 0 errno 19") || !t.contains("devices 0"),
        "no device must be ENODEV:\n{t}"
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("skipping vrnic's device: opening it needs root (AF_PACKET)");
        return;
    }
    let Some(vdir) = vrnic_lib_dir(true) else {
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("skipping vrnic's device: vrnic's libibverbs.so.1 could not be built");
        return;
    };
    let out = run(
        &exe,
        "devices",
        &[
            ("LD_LIBRARY_PATH", vdir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_basic", &out);
    let t = text(&out);
    assert!(
        t.contains("devices 1 errno 0") && t.contains("dev vrnic0"),
        "vrnic's device not listed:\n{t}"
    );
}
