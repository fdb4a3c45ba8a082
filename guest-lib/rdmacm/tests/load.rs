//! Debian's programs that import librdmacm load on this library: perftest's
//! `ib_*` (which take rdma_cm with `-R`) and, where rdmacm-utils is
//! installed, rping, ucmatose, udaddy, mckey, cmtime, rdma_server/client,
//! rstream and riostream. Each runs under `ldd -r` with `LD_BIND_NOW=1`:
//! no unresolved symbol or version, and `librdmacm.so.1` resolved to the
//! built library.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{built_lib, lib_dir, run_bounded, which};

const PROGRAMS: &[&str] = &[
    "ib_send_bw",
    "ib_send_lat",
    "ib_write_bw",
    "ib_write_lat",
    "ib_read_bw",
    "ib_read_lat",
    "ib_atomic_bw",
    "ib_atomic_lat",
    "rping",
    "ucmatose",
    "udaddy",
    "mckey",
    "cmtime",
    "rdma_server",
    "rdma_client",
    "rdma_xserver",
    "rdma_xclient",
    "rstream",
    "riostream",
];

#[test]
fn debian_programs_load_on_this_library() {
    let found: Vec<_> = PROGRAMS.iter().filter_map(|p| which(p)).collect();
    if found.is_empty() || which("ldd").is_none() {
        eprintln!("skipping: neither perftest nor rdmacm-utils is installed");
        return;
    }
    let dir = lib_dir();
    let ours = built_lib().canonicalize().expect("built library");
    for prog in found {
        let out = run_bounded(
            Command::new("ldd")
                .arg("-r")
                .arg(&prog)
                .env("LD_LIBRARY_PATH", &dir)
                .env("LD_BIND_NOW", "1"),
            Duration::from_secs(30),
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success()
                && !text.contains("undefined symbol")
                && !text.contains("not found"),
            "{} does not load:\n{text}",
            prog.display()
        );
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("librdmacm.so.1 =>"))
            .unwrap_or_else(|| panic!("{} does not need librdmacm.so.1:\n{text}", prog.display()));
        let path = line.split_whitespace().nth(2).expect("ldd's path");
        let resolved = std::path::Path::new(path)
            .canonicalize()
            .expect("resolved path");
        assert_eq!(
            resolved,
            ours,
            "{}: librdmacm.so.1 is {path}",
            prog.display()
        );
    }
}
