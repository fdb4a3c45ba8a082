//! What the tools' `--loopback` tests share: running a tool under a
//! wall-clock bound and splitting its output by side.

use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Longest a run may take.
pub const BOUND: Duration = Duration::from_secs(60);

/// Runs the tool at `exe` (named `name` in messages) as `exe --loopback
/// ARGS` to completion, capturing stdout and stderr. Panics when it cannot
/// start, or when it runs longer than [`BOUND`]: it is then killed by its
/// PID.
pub fn run_loopback(exe: &str, name: &str, args: &[&str]) -> Output {
    let child = Command::new(exe)
        .arg("--loopback")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e:?}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(BOUND) {
        Ok(out) => out.unwrap_or_else(|e| panic!("wait for {name}: {e:?}")),
        Err(_) => {
            // SAFETY: kill(2) on the child we started, which has not been reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("{name} {args:?} ran longer than {BOUND:?}");
        }
    }
}

/// The lines of `side` ("client" or "server") without their tag.
pub fn lines<'a>(stdout: &'a str, side: &str) -> Vec<&'a str> {
    let tag = format!("{side}: ");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(tag.as_str()))
        .collect()
}

/// `out`'s stdout, after asserting the run succeeded; the panic names
/// `label`, the exit status, stdout and stderr.
pub fn success_stdout(out: &Output, label: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{label}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    stdout.into_owned()
}

/// Asserts that the `--loopback` run `out` of tool `name` failed with
/// status 1, that its stdout has none of `not_verified` (the tool's
/// success lines), and that its error line (`NAME: client: ...; server:
/// ...`) names a failure of both sides; returns the client's and the
/// server's parts. Panics name `label`.
// Used by the two-sided tools' tests only (each test file compiles its own copy).
#[allow(dead_code)]
pub fn both_sides_failed(
    out: &Output,
    name: &str,
    label: &str,
    not_verified: &[&str],
) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{label}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    for v in not_verified {
        assert!(!stdout.contains(v), "{label}: {v:?} anyway\n{stdout}");
    }
    let err = stderr
        .lines()
        .find(|l| l.starts_with(&format!("{name}: ")))
        .unwrap_or_else(|| panic!("{label}: no error line in\n{stderr}"));
    let (client, server) = err
        .split_once("; server: ")
        .unwrap_or_else(|| panic!("{label}: not both sides failed: {err}"));
    (client.to_string(), server.to_string())
}
