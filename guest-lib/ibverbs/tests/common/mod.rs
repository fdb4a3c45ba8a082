//! What the library's tests share: where the built `libibverbs.so.1` is,
//! where Debian's is, and running commands with a bound.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use vrnic::link::{Link, MemLink};
use vrnic_frontend::{test_device_config, TestDaemon};
// Each test binary uses some of them.
#[allow(unused_imports)]
pub use vrnic_test_support::{agent_bin, run_bounded, which, AgentDir, Reaped};

/// Debian's `libibverbs.so.1` (package libibverbs1), if installed.
pub fn debian_lib() -> Option<PathBuf> {
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
        .iter()
        .map(|d| Path::new(d).join("libibverbs.so.1"))
        .find(|p| p.exists())
}

/// The cdylib cargo built for this test run:
/// `target/<profile>/deps/libvrnic_ibverbs.so`, beside the test binary
/// (`cargo test` builds it there and, unlike `cargo build`, does not copy
/// it to `target/<profile>/`).
pub fn built_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary in target/<profile>/deps");
    let so = deps.join("libvrnic_ibverbs.so");
    assert!(
        so.exists(),
        "{} not built (cargo builds the cdylib before the integration tests)",
        so.display()
    );
    so
}

/// A directory holding `libibverbs.so.1` → the built library, for
/// `LD_LIBRARY_PATH` (what `scripts/ibverbs-lib.sh` makes for users).
pub fn lib_dir() -> PathBuf {
    let so = built_lib();
    let dir = so
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("ibverbs-test");
    std::fs::create_dir_all(&dir).expect("create lib dir");
    // Tests run in parallel: make the link under a name of our own, then
    // rename it over the shared name (atomic), instead of remove + create.
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("libibverbs.so.1.{}.{n}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&so, &tmp).expect("symlink libibverbs.so.1");
    std::fs::rename(&tmp, dir.join("libibverbs.so.1")).expect("rename libibverbs.so.1");
    dir
}

/// The defined, versioned dynamic symbols of `lib` as readelf shows them
/// (`name@@NODE` default, `name@NODE` compatibility), sorted.
pub fn versioned_exports(lib: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(lib)
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "readelf {}", lib.display());
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[6] != "UND" && f[4] != "LOCAL" && f[7].contains('@'))
                .then(|| f[7].to_string())
        })
        .collect();
    v.sort();
    v
}

/// A network namespace, deleted on drop.
pub struct Netns(pub String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A new network namespace `vrnic-ibv-PID-TAG` with `lo` up for a test
/// that compiles a C program against verbs.h and runs it there; `None`,
/// with the reason printed, where that cannot run (not root, no
/// libibverbs-dev, no namespaces).
pub fn c_test_netns(tag: &str) -> Option<Netns> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: needs root (network namespace)");
        return None;
    }
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: libibverbs-dev not installed");
        return None;
    }
    let name = format!("vrnic-ibv-{}-{tag}", std::process::id());
    let ok = Command::new("ip")
        .args(["netns", "add", &name])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipping: cannot create a network namespace");
        return None;
    }
    let ns = Netns(name);
    let up = Command::new("ip")
        .args(["-n", &ns.0, "link", "set", "lo", "up"])
        .status()
        .expect("ip runs");
    assert!(up.success(), "lo up");
    Some(ns)
}

/// Compiles `tests/c/NAME.c` with gcc (`-Wall -Werror`, against Debian's
/// `<infiniband/verbs.h>`, linked with `-libverbs`) into a temporary
/// directory of its own; returns that directory (the caller removes it)
/// and the executable. Panics with gcc's messages if it fails.
pub fn compile_c_test(name: &str) -> (PathBuf, PathBuf) {
    compile_c_test_with(Path::new("gcc"), name, &["-libverbs"])
}

/// [`compile_c_test`] with compiler `cc` (e.g. Open MPI's `mpicc`) and
/// `libs` after the source.
pub fn compile_c_test_with(cc: &Path, name: &str, libs: &[&str]) -> (PathBuf, PathBuf) {
    // A directory per call: two tests of one process may build one program.
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vrnic-ibverbs-{name}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = Command::new(cc)
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(libs)
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", cc.display()));
    assert!(
        out.status.success(),
        "{}: {}",
        cc.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    (dir, exe)
}

/// Removes `dir` (from [`compile_c_test`]) and asserts that the C test
/// `NAME` exited 0 and printed `NAME: ok`, showing its stdout and stderr
/// when it did not.
pub fn assert_c_test_ok(name: &str, dir: &Path, out: &Output) {
    let _ = std::fs::remove_dir_all(dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(&format!("{name}: ok")),
        "{name}.c failed ({}):\n{text}",
        out.status
    );
}

/// Sends every frame arriving on its end of the link back, until dropped:
/// the function then receives what it sends to itself.
pub struct Reflector {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Reflector {
    pub fn start(mut end: MemLink) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let fd = end.caps().fd.expect("a MemLink end has an eventfd");
            let mut buf = vec![0u8; 65536];
            while !s.load(Ordering::Relaxed) {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd; bounded wait, so the stop flag
                // is seen within 50 ms.
                unsafe { libc::poll(&mut p, 1, 50) };
                while let Ok(Some(n)) = end.recv(&mut buf) {
                    let _ = end.send(&buf[..n]);
                }
            }
        });
        Reflector {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fresh function whose link reflects every frame, served in this
/// process; `None` (saying why) without gcc or libibverbs-dev.
pub fn reflecting_function() -> Option<(TestDaemon, Reflector)> {
    if which("gcc").is_none() || !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("skipping: needs gcc and libibverbs-dev");
        return None;
    }
    let (link, peer) = MemLink::pair();
    let reflector = Reflector::start(peer);
    let daemon =
        TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts");
    Some((daemon, reflector))
}

/// The node UCX checks (the library's `UVERBS_NODE`).
pub const NODE: &str = "/dev/infiniband/vrnic-uverbs0";

/// The shell script run by `unshare --mount` (`scripts/uverbs-node.sh`,
/// which `scripts/bench.sh` runs too): gives the namespace a `/dev` made
/// of links to the real one's entries (through a bind of it, so its
/// submounts, `/dev/shm` and `/dev/pts`, stay the same) plus
/// `infiniband/vrnic-uverbs0` → `/dev/null`, then runs its arguments.
/// Its first argument is a directory for the two mounts, which the caller
/// removes once the namespace is gone.
const PRIVATE_DEV: &str = include_str!("../../../../scripts/uverbs-node.sh");

/// A command running `prog` where the node exists: directly when the host
/// has it, else in a mount namespace of its own (root and `unshare`
/// needed), its scratch directory `scratch` (the caller removes it once
/// the command ended). `None`, saying why, where neither can be.
pub fn with_node(prog: &Path, scratch: &Path) -> Option<Command> {
    if Path::new(NODE).exists() {
        return Some(Command::new(prog));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || which("unshare").is_none() {
        eprintln!(
            "skipping: {NODE} missing, and making it in a mount namespace needs root and unshare"
        );
        return None;
    }
    std::fs::create_dir_all(scratch).expect("scratch directory");
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
    .arg(scratch)
    .arg(prog);
    Some(c)
}
