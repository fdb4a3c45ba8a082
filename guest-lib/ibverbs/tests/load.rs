//! Debian's unmodified rdma-core and perftest binaries load against this
//! library with every symbol bound (`LD_BIND_NOW=1`, `ldd -r`), and
//! `libibverbs.so.1` resolves to this library, not Debian's. perftest also
//! loads Debian's `libmlx5.so.1`, `libefa.so.1` and `librdmacm.so.1`, whose
//! imports of libibverbs' private symbols are checked the same way.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{built_lib, lib_dir, run_bounded, which};

/// The binaries of issue 8 (packages ibverbs-utils and perftest).
const BINARIES: &[&str] = &[
    "ibv_devices",
    "ibv_devinfo",
    "ibv_rc_pingpong",
    "ibv_uc_pingpong",
    "ibv_ud_pingpong",
    "ibv_srq_pingpong",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_atomic_bw",
    "ib_write_lat",
    "ib_read_lat",
    "ib_send_lat",
    "ib_atomic_lat",
];

#[test]
fn debian_binaries_bind_every_symbol() {
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|b| which(b).is_none())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "skipping: {missing:?} not installed (Debian packages ibverbs-utils and perftest; scripts/deps.sh)"
        );
        return;
    }
    let dir = lib_dir();
    let ours = std::fs::canonicalize(built_lib()).expect("canonicalize library");
    let mut failures = Vec::new();
    for b in BINARIES {
        let path = which(b).expect("checked above");
        let out = run_bounded(
            Command::new("ldd")
                .arg("-r")
                .arg(&path)
                .env("LD_LIBRARY_PATH", &dir)
                .env("LD_BIND_NOW", "1"),
            Duration::from_secs(30),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let bad: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.contains("symbol lookup error")
                    || l.contains("undefined symbol")
                    || (l.contains("version") && l.contains("not found"))
                    || l.contains("=> not found")
            })
            .collect();
        if !out.status.success() || !bad.is_empty() {
            failures.push(format!("{b}: status {}: {bad:?}", out.status));
            continue;
        }
        // libibverbs.so.1 => <dir>/libibverbs.so.1, which is our file.
        let resolved = text
            .lines()
            .find(|l| l.trim_start().starts_with("libibverbs.so.1 =>"))
            .and_then(|l| l.split("=>").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .map(|p| std::fs::canonicalize(p).unwrap_or_default());
        if resolved.as_ref() != Some(&ours) {
            failures.push(format!(
                "{b}: libibverbs.so.1 resolved to {resolved:?}, not {}",
                ours.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "binaries that do not load:\n{}",
        failures.join("\n")
    );
}
