//! `vrnic-pingpong --loopback`: a server and a client in one process over
//! two in-process devices, each verifying every message.
//!
//! The child runs under a wall-clock bound ([`common::BOUND`]); it is killed (by
//! its PID) when it overruns.

mod common;

use std::process::Output;

use common::lines;

/// Runs `vrnic-pingpong --loopback ARGS` to completion within [`common::BOUND`].
fn pingpong(args: &[&str]) -> Output {
    common::run_loopback(env!("CARGO_BIN_EXE_vrnic-pingpong"), "vrnic-pingpong", args)
}

/// Checks one side's result lines against rc_pingpong's formats.
fn check_side(stdout: &str, side: &str, size: u64, iters: u64) {
    let l = lines(stdout, side);
    let find = |prefix: &str| {
        l.iter()
            .find(|x| x.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("{side}: no line starting {prefix:?} in\n{stdout}"))
            .to_string()
    };
    let local = find("local address:");
    assert!(
        local.contains("LID 0x0000, QPN 0x") && local.contains("GID ::ffff:10.0.0."),
        "{local}"
    );
    find("remote address:");
    let bytes = find(&format!("{} bytes in ", size * iters * 2));
    assert!(
        bytes.ends_with(" Mbit/sec") && bytes.contains(" seconds = "),
        "{bytes}"
    );
    let it = find(&format!("{iters} iters in "));
    assert!(it.ends_with(" usec/iter"), "{it}");
    assert_eq!(
        find("data verified:"),
        format!("data verified: {iters} messages")
    );
}

#[test]
fn loopback_run_verifies_every_message_both_ways() {
    for (size, mtu) in [("1", "1024"), ("4096", "1024"), ("65536", "4096")] {
        let out = pingpong(&["-n", "40", "-s", size, "-m", mtu, "-r", "16", "-c"]);
        let stdout = common::success_stdout(&out, &format!("size {size}"));
        let size: u64 = size.parse().unwrap();
        check_side(&stdout, "client", size, 40);
        check_side(&stdout, "server", size, 40);
        assert!(!stdout.contains("invalid data in page"), "{stdout}");
    }
}

#[test]
fn bad_options_are_refused_like_rc_pingpong() {
    for bad in [&["-m", "1500"][..], &["-i", "0"], &["-s", "0"]] {
        let out = pingpong(bad);
        assert!(!out.status.success(), "{bad:?} accepted");
    }
}
