//! The conversions that need no device (`ibv_wc_status_str(3)` and the
//! other `*_str`, `ibv_rate_to_mult(3)`, `ibv_rate_to_mbps(3)` and their
//! inverses) answer exactly as Debian's library for every value in and
//! around their enums: one C program, linked with `-libverbs`, run once
//! against Debian's library and once against ours.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{debian_lib, lib_dir, run_bounded};

const PROGRAM: &str = r#"
#include <stdio.h>
#include <infiniband/verbs.h>
int main(void) {
    for (int i = -1; i < 40; i++) {
        printf("wc %d %s\n", i, ibv_wc_status_str(i));
        printf("ev %d %s\n", i, ibv_event_type_str(i));
        printf("node %d %s\n", i, ibv_node_type_str(i));
        printf("port %d %s\n", i, ibv_port_state_str(i));
        printf("rate %d %d %d\n", i, ibv_rate_to_mult(i), ibv_rate_to_mbps(i));
    }
    int mults[] = {0, 1, 2, 4, 8, 11, 12, 16, 20, 24, 32, 48, 160, 240, 320, 480, 3};
    for (unsigned i = 0; i < sizeof(mults) / sizeof(mults[0]); i++)
        printf("mult %d %d\n", mults[i], mult_to_ibv_rate(mults[i]));
    int mbps[] = {0, 2500, 5000, 10000, 14062, 25781, 28125, 53125, 56250, 103125,
                  112500, 168750, 206250, 309375, 425000, 637500, 850000, 1275000, 1};
    for (unsigned i = 0; i < sizeof(mbps) / sizeof(mbps[0]); i++)
        printf("mbps %d %d\n", mbps[i], mbps_to_ibv_rate(mbps[i]));
    return 0;
}
"#;

#[test]
fn strings_match_debian() {
    if debian_lib().is_none() || !std::path::Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: Debian's libibverbs1/libibverbs-dev are not installed");
        return;
    }
    let dir = std::env::temp_dir().join(format!("vrnic-ibverbs-strings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let src = dir.join("strings.c");
    let exe = dir.join("strings");
    std::fs::write(&src, PROGRAM).expect("write strings.c");
    let cc = Command::new("gcc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("gcc runs");
    assert!(
        cc.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let debian = run_bounded(&mut Command::new(&exe), Duration::from_secs(10));
    let ours = run_bounded(
        Command::new(&exe).env("LD_LIBRARY_PATH", lib_dir()),
        Duration::from_secs(10),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(debian.status.success() && ours.status.success());
    let (d, o) = (
        String::from_utf8_lossy(&debian.stdout),
        String::from_utf8_lossy(&ours.stdout),
    );
    let diff: Vec<String> = d
        .lines()
        .zip(o.lines())
        .filter(|(a, b)| a != b)
        .map(|(a, b)| format!("Debian: {a}\nvrnic:  {b}"))
        .collect();
    assert!(diff.is_empty(), "answers differ:\n{}", diff.join("\n"));
    assert_eq!(d.lines().count(), o.lines().count());
}
