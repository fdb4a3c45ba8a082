//! `vrnic-ud-pingpong --loopback`: a server and a client in one process over
//! two in-process devices, each verifying every message (payload, GRH flag,
//! source QP and the GRH's source address); with `--emulate-stock SIDE` one
//! side handles its buffer as `ibv_ud_pingpong` does, so the other side's
//! checks meet the stock tool's data.
//!
//! The child runs under a wall-clock bound ([`common::BOUND`]); it is killed (by
//! its PID) when it overruns.

mod common;

use std::process::Output;

use common::lines;

/// Runs `vrnic-ud-pingpong --loopback ARGS` to completion within [`common::BOUND`].
fn ud_pingpong(args: &[&str]) -> Output {
    common::run_loopback(
        env!("CARGO_BIN_EXE_vrnic-ud-pingpong"),
        "vrnic-ud-pingpong",
        args,
    )
}

/// Checks one side's lines against ud_pingpong's formats; `verified` is
/// false for a side emulating the stock tool (which prints no such line).
fn check_side(stdout: &str, side: &str, size: u64, iters: u64, verified: bool) {
    let l = lines(stdout, side);
    let find = |prefix: &str| {
        l.iter()
            .find(|x| x.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("{side}: no line starting {prefix:?} in\n{stdout}"))
            .to_string()
    };
    // ud_pingpong's local line has ": GID", its remote line ", GID".
    let local = find("local address:");
    assert!(
        local.contains("LID 0x0000, QPN 0x") && local.contains(": GID ::ffff:10.0.0."),
        "{local}"
    );
    let remote = find("remote address:");
    assert!(remote.contains(", GID ::ffff:10.0.0."), "{remote}");
    let bytes = find(&format!("{} bytes in ", size * iters * 2));
    assert!(bytes.ends_with(" Mbit/sec"), "{bytes}");
    let it = find(&format!("{iters} iters in "));
    assert!(it.ends_with(" usec/iter"), "{it}");
    let v = l.iter().find(|x| x.starts_with("data verified:"));
    if verified {
        assert_eq!(
            v.map(|s| s.to_string()),
            Some(format!("data verified: {iters} messages")),
            "{side}:\n{stdout}"
        );
    } else {
        assert_eq!(v, None, "{side}: the stock tool verifies nothing");
    }
}

#[test]
fn loopback_run_verifies_every_datagram_both_ways() {
    // 1 byte; 64 bytes is sent inline (the QP's inline size); 1024 is the
    // port MTU of a 1500-byte link.
    for size in ["1", "64", "65", "1024"] {
        let out = ud_pingpong(&["-n", "60", "-s", size, "-r", "8", "-c"]);
        let stdout = common::success_stdout(&out, &format!("size {size}"));
        let size: u64 = size.parse().unwrap();
        check_side(&stdout, "client", size, 60, true);
        check_side(&stdout, "server", size, 60, true);
        assert!(!stdout.contains("invalid data in page"), "{stdout}");
    }
}

#[test]
fn each_side_verifies_the_stock_tools_data() {
    for side in ["server", "client"] {
        for chk in [&["-c"][..], &[]] {
            let mut args = vec!["-n", "40", "--emulate-stock", side];
            args.extend_from_slice(chk);
            let out = ud_pingpong(&args);
            let stdout = common::success_stdout(&out, &format!("stock {side} {chk:?}"));
            let ours = if side == "server" { "client" } else { "server" };
            check_side(&stdout, ours, 1024, 40, true);
            check_side(&stdout, side, 1024, 40, false);
        }
    }
}

#[test]
fn bad_options_are_refused_like_ud_pingpong() {
    for bad in [
        &["-s", "2048"][..],
        &["-i", "0"],
        &["-s", "0"],
        &["-n", "0"],
    ] {
        let out = ud_pingpong(bad);
        assert!(!out.status.success(), "{bad:?} accepted");
    }
    let out = ud_pingpong(&["-s", "1025"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Requested size larger than port MTU (1024)"),
        "{stderr}"
    );
}
