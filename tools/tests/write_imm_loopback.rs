//! `vrnic-write-imm --loopback`: a server and a client in one process over
//! two in-process devices; every RDMA WRITE with immediate must land byte
//! for byte between untouched guard bytes, and a misbehaving client
//! (hidden `--fault`) must make both sides fail with status 1.
//!
//! Each child runs under a wall-clock bound ([`common::BOUND`]); it is killed (by
//! its PID) when it overruns.

mod common;

use std::process::Output;

use common::lines;

/// Runs `vrnic-write-imm --loopback ARGS` to completion within [`common::BOUND`].
fn write_imm(args: &[&str]) -> Output {
    common::run_loopback(
        env!("CARGO_BIN_EXE_vrnic-write-imm"),
        "vrnic-write-imm",
        args,
    )
}

#[test]
fn loopback_writes_land_byte_for_byte_at_each_size() {
    const ITERS: u32 = 10;
    for size in [1u32, 4097, 65536] {
        let out = write_imm(&[
            "-s",
            &size.to_string(),
            "-n",
            &ITERS.to_string(),
            "-m",
            "1024",
        ]);
        let stdout = common::success_stdout(&out, &format!("size {size}"));
        let verified = format!("write-imm verified: {ITERS} writes of {size} bytes");
        for side in ["client", "server"] {
            let l = lines(&stdout, side);
            assert!(
                l.contains(&verified.as_str()),
                "{side}: no {verified:?} in\n{stdout}"
            );
            assert!(
                l.iter()
                    .any(|x| x.trim_start().starts_with("local address:")
                        && x.contains("GID ::ffff:10.0.0.")),
                "{side}: no local address line in\n{stdout}"
            );
        }
        let buf = lines(&stdout, "client")
            .into_iter()
            .find(|x| x.trim_start().starts_with("remote buffer:"))
            .unwrap_or_else(|| panic!("client: no remote buffer line in\n{stdout}"));
        assert!(buf.ends_with(&format!(", {} bytes", size + 128)), "{buf}");
    }
}

#[test]
fn a_misbehaving_client_fails_both_sides_with_a_clear_error() {
    for (fault, server_says, client_says) in [
        ("offset", "guard byte at offset 63", "the peer failed"),
        (
            "imm",
            "immediate Some(2147483648), expected Some(0)",
            "the peer failed",
        ),
        ("rkey", "the peer failed", "remote access error"),
    ] {
        let out = write_imm(&["-s", "4097", "-n", "3", "--fault", fault]);
        let label = format!("--fault {fault}");
        let verified = ["write-imm verified"];
        let (client, server) =
            common::both_sides_failed(&out, "vrnic-write-imm", &label, &verified);
        assert!(client.contains(client_says), "--fault {fault}: {client}");
        assert!(server.contains(server_says), "--fault {fault}: {server}");
    }
}

#[test]
fn bad_options_are_refused() {
    for bad in [
        &["-s", "0"][..],
        &["-m", "1500"],
        &["-n", "0"],
        &["--timeout", "0"],
    ] {
        let out = write_imm(bad);
        assert!(!out.status.success(), "{bad:?} accepted");
    }
}
