//! `vrnic-srq-pingpong --loopback`: a server and a client in one process
//! over two in-process devices, several RC QPs per side sharing one SRQ,
//! each side verifying every message; with `--emulate-stock SIDE` one side
//! handles its buffer as `ibv_srq_pingpong` does (one zero-filled buffer
//! for every send and receive), so the other side's checks meet the stock
//! tool's data.
//!
//! The child runs under a wall-clock bound ([`common::BOUND`]); it is killed (by
//! its PID) when it overruns.

mod common;

use std::process::Output;

use common::lines;

/// Runs `vrnic-srq-pingpong --loopback ARGS` to completion within [`common::BOUND`].
fn srq_pingpong(args: &[&str]) -> Output {
    common::run_loopback(
        env!("CARGO_BIN_EXE_vrnic-srq-pingpong"),
        "vrnic-srq-pingpong",
        args,
    )
}

/// Checks one side's lines against srq_pingpong's formats: one address
/// line per QP each way, the result lines and (unless the side emulates
/// the stock tool) at least `iters` verified messages.
fn check_side(stdout: &str, side: &str, size: u64, iters: u64, qps: usize, verified: bool) {
    let l = lines(stdout, side);
    let count = |prefix: &str| {
        l.iter()
            .filter(|x| x.trim_start().starts_with(prefix))
            .count()
    };
    assert_eq!(
        count("local address:  LID 0x0000, QPN 0x"),
        qps,
        "{side}:\n{stdout}"
    );
    assert_eq!(
        count("remote address: LID 0x0000, QPN 0x"),
        qps,
        "{side}:\n{stdout}"
    );
    assert_eq!(
        count(&format!("{} bytes in ", size * iters * 2)),
        1,
        "{stdout}"
    );
    assert_eq!(count(&format!("{iters} iters in ")), 1, "{stdout}");
    let v: Vec<u64> = l
        .iter()
        .filter_map(|x| x.strip_prefix("data verified: "))
        .filter_map(|x| x.strip_suffix(" messages"))
        .map(|n| n.parse().unwrap())
        .collect();
    if verified {
        // -n counts over all QPs; a side may receive a few more.
        assert!(v.len() == 1 && v[0] >= iters, "{side}: {v:?}\n{stdout}");
    } else {
        assert!(v.is_empty(), "{side}: the stock tool verifies nothing");
    }
}

#[test]
fn loopback_run_verifies_every_message_on_every_qp() {
    for (args, size, qps) in [
        (&["-n", "400", "-c"][..], 4096, 16),
        (&["-q", "1", "-r", "1", "-s", "1", "-n", "30"], 1, 1),
        (
            &[
                "-q", "5", "-r", "8", "-s", "65536", "-m", "4096", "-n", "40",
            ],
            65536,
            5,
        ),
        (&["-q", "40", "-r", "64", "-s", "100", "-n", "600"], 100, 40),
    ] {
        let out = srq_pingpong(args);
        let stdout = common::success_stdout(&out, &format!("{args:?}"));
        let iters: u64 = args[args.iter().position(|&a| a == "-n").unwrap() + 1]
            .parse()
            .unwrap();
        check_side(&stdout, "client", size, iters, qps, true);
        check_side(&stdout, "server", size, iters, qps, true);
        assert!(!stdout.contains("invalid data in page"), "{stdout}");
    }
}

#[test]
fn each_side_verifies_the_stock_tools_data() {
    for side in ["server", "client"] {
        let out = srq_pingpong(&[
            "-n",
            "300",
            "-q",
            "8",
            "-r",
            "32",
            "-c",
            "--emulate-stock",
            side,
        ]);
        let stdout = common::success_stdout(&out, &format!("stock {side}"));
        let ours = if side == "server" { "client" } else { "server" };
        check_side(&stdout, ours, 4096, 300, 8, true);
        check_side(&stdout, side, 4096, 300, 8, false);
    }
}

#[test]
fn bad_options_are_refused_like_srq_pingpong() {
    let refused = |args: &[&str], text: &str| {
        let out = srq_pingpong(args);
        assert!(!out.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(text), "{args:?}: {stderr}");
    };
    refused(
        &["-q", "17", "-r", "16"],
        "rx_depth 16 is too small for 17 QPs",
    );
    refused(
        &["-q", "256", "-r", "300"],
        "num_qp 256 must be less than 255",
    );
    refused(&["-o"], "isn't ODP capable");
    refused(&["-m", "1500"], "path MTU");
    refused(&["-q", "0"], "at least 1");
}
