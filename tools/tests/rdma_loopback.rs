//! `vrnic-rdma --loopback`: the passive side (tagged `server`) and the
//! active side (tagged `client`) in one process over two in-process devices. Every RDMA READ (1 B, 4097 B and 1 MiB by
//! default) must land byte for byte between guards, every fetch-and-add
//! must return the previous value plus the addend, compare-and-swap must
//! swap once and then refuse, and the passive side's final counter must be
//! exact; a misbehaving side (hidden `--fault`) must make both sides fail
//! with status 1.
//!
//! Each child runs under a wall-clock bound ([`common::BOUND`]); it is
//! killed (by its PID) when it overruns.

mod common;

use std::process::Output;

use common::lines;

/// Runs `vrnic-rdma --loopback ARGS` to completion within [`common::BOUND`].
fn rdma(args: &[&str]) -> Output {
    common::run_loopback(env!("CARGO_BIN_EXE_vrnic-rdma"), "vrnic-rdma", args)
}

#[test]
fn reads_and_atomics_are_verified_at_each_path_mtu() {
    for mtu in ["256", "1024", "4096"] {
        let out = rdma(&["-m", mtu, "-r", "3", "-n", "50"]);
        let stdout = common::success_stdout(&out, &format!("-m {mtu}"));
        let active = lines(&stdout, "client");
        for size in [1, 4097, 1048576] {
            let want = format!("rdma-read verified: 3 reads of {size} bytes");
            assert!(
                active.contains(&want.as_str()),
                "-m {mtu}: no {want:?} in\n{stdout}"
            );
        }
        assert!(
            active
                .iter()
                .any(|l| l.starts_with("fetch-add verified: 50 ops, counter 0x")
                    && l.ends_with("(the responder agrees)")),
            "-m {mtu}: no fetch-add line in\n{stdout}"
        );
        assert!(
            active
                .iter()
                .any(|l| l.starts_with("cmp-swap verified: swapped 0x")
                    && l.ends_with("refused when stale")),
            "-m {mtu}: no cmp-swap line in\n{stdout}"
        );
        let passive = lines(&stdout, "server");
        assert!(
            passive
                .iter()
                .any(|l| l.starts_with("responder verified: 50 fetch-adds")
                    && l.ends_with("data intact")),
            "-m {mtu}: no responder line in\n{stdout}"
        );
    }
}

#[test]
fn odd_sizes_and_many_reads_are_verified() {
    let out = rdma(&["-s", "7,8,9,1023,1025,65537", "-r", "5", "-n", "1"]);
    let stdout = common::success_stdout(&out, "odd sizes");
    for size in [7, 8, 9, 1023, 1025, 65537] {
        let want = format!("rdma-read verified: 5 reads of {size} bytes");
        assert!(
            lines(&stdout, "client").contains(&want.as_str()),
            "no {want:?} in\n{stdout}"
        );
    }
}

#[test]
fn a_misbehaving_side_fails_both_sides_with_a_clear_error() {
    for (fault, active_says, passive_says) in [
        ("data", "data mismatch at byte 0", "the peer failed"),
        ("rkey", "remote access error", "the peer failed"),
        (
            "add",
            "the peer failed: counter is",
            "fetch-adds of 0x100000004",
        ),
    ] {
        let out = rdma(&["-s", "1,4097", "-n", "10", "--fault", fault]);
        let label = format!("--fault {fault}");
        let verified = ["responder verified", "cmp-swap verified"];
        let (active, passive) = common::both_sides_failed(&out, "vrnic-rdma", &label, &verified);
        assert!(active.contains(active_says), "--fault {fault}: {active}");
        assert!(passive.contains(passive_says), "--fault {fault}: {passive}");
    }
}

#[test]
fn bad_options_are_refused() {
    for bad in [
        &["-s", "0"][..],
        &["-s", "1,x"],
        &["-m", "1500"],
        &["-n", "0"],
        &["-r", "0"],
        &["--timeout", "0"],
    ] {
        let out = rdma(bad);
        assert!(!out.status.success(), "{bad:?} accepted");
    }
}
