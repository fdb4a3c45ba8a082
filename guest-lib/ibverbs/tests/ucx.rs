//! UCX sees a vrnic device (issue 30 point 3): Debian's `ucx_info -d`
//! (package ucx-utils), run on vrnic's libibverbs.so.1 with a function
//! served by an in-process daemon (`vrnic_frontend::TestDaemon`) behind
//! `VRNIC_VHOST_USER`, lists the `rc_verbs` and `ud_verbs` transports on
//! `vrnic0:1`.
//!
//! UCX skips a verbs device unless `/dev/infiniband/<dev_name>` is an
//! accessible character device (`uct_ib_device_is_accessible`); the
//! library names `vrnic-uverbs0`. When that node does not exist, the test
//! runs `ucx_info` in a mount namespace of its own whose `/dev` has it
//! (the host's `/dev` is left alone): that needs root. Skipped, saying
//! why, without `ucx_info` or, when the node is missing, without root or
//! `unshare`.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{lib_dir, run_bounded, which};
use vrnic::link::MemLink;
use vrnic_frontend::{test_device_config, TestDaemon};

/// The node UCX checks (the library's `UVERBS_NODE`).
const NODE: &str = "/dev/infiniband/vrnic-uverbs0";

/// A shell script run by `unshare --mount`: gives the namespace a `/dev`
/// made of links to the real one's entries (through a bind of it, so its
/// submounts, `/dev/shm` and `/dev/pts`, stay the same) plus
/// `infiniband/vrnic-uverbs0` → `/dev/null`, then runs its arguments.
/// Its first argument is an empty directory for the two mounts, which the
/// caller removes once the namespace is gone.
const PRIVATE_DEV: &str = r#"set -e
t=$1; shift
mkdir "$t/old" "$t/new"
mount --rbind /dev "$t/old"
mount -t tmpfs tmpfs "$t/new"
for e in "$t"/old/* "$t"/old/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  ln -s "$e" "$t/new/${e##*/}"
done
mkdir "$t/new/infiniband"
ln -s "$t/old/null" "$t/new/infiniband/vrnic-uverbs0"
mount --bind "$t/new" /dev
exec "$@"
"#;

#[test]
fn ucx_info_lists_rc_verbs_and_ud_verbs_on_vrnic() {
    let Some(ucx_info) = which("ucx_info") else {
        eprintln!("skipping: ucx_info not installed (ucx-utils, scripts/deps.sh)");
        return;
    };
    let scratch = std::env::temp_dir().join(format!("vrnic-ucx-dev-{}", std::process::id()));
    let mut cmd = if Path::new(NODE).exists() {
        Command::new(&ucx_info)
    } else {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || which("unshare").is_none() {
            eprintln!("skipping: {NODE} missing, and making it in a mount namespace needs root and unshare");
            return;
        }
        std::fs::create_dir_all(&scratch).expect("scratch directory");
        let mut c = Command::new("unshare");
        c.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            PRIVATE_DEV,
            "sh",
        ])
        .arg(&scratch)
        .arg(&ucx_info);
        c
    };
    let (link, _peer) = MemLink::pair();
    let daemon =
        TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts");
    cmd.arg("-d")
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("VRNIC_VHOST_USER", daemon.socket())
        .env("VRNIC_AGENT", "off")
        .env("UCX_NET_DEVICES", "vrnic0:1");
    let out = run_bounded(&mut cmd, Duration::from_secs(120));
    // Empty directories once the namespace (its mounts) is gone.
    let _ = std::fs::remove_dir_all(&scratch);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ucx_info -d failed ({}): {text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // Each transport's block: "#      Transport: NAME" then "#         Device: DEV".
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for tl in ["rc_verbs", "ud_verbs"] {
        let found = lines.windows(2).any(|w| {
            w[0] == format!("#      Transport: {tl}").trim() && w[1].ends_with("Device: vrnic0:1")
        });
        assert!(found, "ucx_info -d lists no {tl} on vrnic0:1:\n{text}");
    }
    assert!(text.contains("# Memory domain: vrnic0"), "{text}");
}
