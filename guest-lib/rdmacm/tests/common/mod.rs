//! What the library's tests share: where the built `librdmacm.so.1` is,
//! where Debian's is, vrnic's `libibverbs.so.1` beside it, and running
//! commands with a bound. (The same helpers as vrnic-ibverbs'
//! `tests/common`, which also carries that crate's daemon and agent
//! harness and its dev-dependencies; these tests need none of them.)
#![allow(dead_code)]

pub mod fake_agent;
pub mod pair;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Debian's `librdmacm.so.1` (package librdmacm1), if installed.
pub fn debian_lib() -> Option<PathBuf> {
    ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"]
        .iter()
        .map(|d| Path::new(d).join("librdmacm.so.1"))
        .find(|p| p.exists())
}

/// The cdylib cargo built for this test run,
/// `target/<profile>/deps/libvrnic_rdmacm.so`, beside the test binary.
pub fn built_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary in target/<profile>/deps");
    let so = deps.join("libvrnic_rdmacm.so");
    assert!(
        so.exists(),
        "{} not built (cargo builds the cdylib before the integration tests)",
        so.display()
    );
    so
}

/// `target/<profile>`.
pub fn profile_dir() -> PathBuf {
    built_lib()
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// Makes `dir/name` a symbolic link to `target`, atomically (tests run in
/// parallel: a link under a name of our own, renamed over the shared name).
fn link(dir: &Path, name: &str, target: &Path) {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{name}.{}.{n}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
}

/// A directory for `LD_LIBRARY_PATH` holding `librdmacm.so.1` → the built
/// library (Debian's `libibverbs.so.1` is then the one loaded).
pub fn lib_dir() -> PathBuf {
    let dir = profile_dir().join("rdmacm-test");
    std::fs::create_dir_all(&dir).expect("create lib dir");
    link(&dir, "librdmacm.so.1", &built_lib());
    dir
}

/// vrnic's `libibverbs.so.1` of this tree: built here (cargo's lock on the
/// target directory is free while tests run), once per test process, in
/// the test's profile; `None`, saying why, if that fails.
pub fn vrnic_ibverbs() -> Option<PathBuf> {
    static BUILT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let dir = profile_dir();
    let ok = *BUILT.get_or_init(|| {
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-p", "vrnic-ibverbs"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            c.arg("--release");
        }
        let out = run_bounded(&mut c, Duration::from_secs(1800));
        if !out.status.success() {
            eprintln!(
                "building vrnic-ibverbs failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        out.status.success()
    });
    let so = dir.join("libvrnic_ibverbs.so");
    (ok && so.exists()).then_some(so)
}

/// A directory holding `libibverbs.so.1` → vrnic's (and, with `ours`,
/// `librdmacm.so.1` → the built library), for `LD_LIBRARY_PATH`.
pub fn vrnic_lib_dir(ours: bool) -> Option<PathBuf> {
    let verbs = vrnic_ibverbs()?;
    let dir = profile_dir().join(if ours {
        "rdmacm-test-vrnic"
    } else {
        "rdmacm-test-debian"
    });
    std::fs::create_dir_all(&dir).expect("create lib dir");
    link(&dir, "libibverbs.so.1", &verbs);
    if ours {
        link(&dir, "librdmacm.so.1", &built_lib());
    }
    Some(dir)
}

/// Path of an executable on `PATH`, if any.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `cmd` to completion or kills it after `limit`. Panics on timeout.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    wait_bounded(child, &format!("{cmd:?}"), limit)
}

/// Waits for `child` (spawned with piped stdout and stderr) or kills it
/// after `limit`. Panics on timeout, naming it `what`.
pub fn wait_bounded(mut child: std::process::Child, what: &str, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("wait_with_output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait_with_output");
            panic!(
                "{what} did not finish within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
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

/// Compiles `tests/c/NAME.c` with gcc (`-Wall -Werror`, against Debian's
/// `<rdma/rdma_cma.h>`, linked with `-lrdmacm -libverbs`) into a temporary
/// directory of its own; returns that directory (the caller removes it)
/// and the executable; `None`, saying why, without gcc or librdmacm-dev.
pub fn compile_c_test(name: &str) -> Option<(PathBuf, PathBuf)> {
    if which("gcc").is_none() || !Path::new("/usr/include/rdma/rdma_cma.h").exists() {
        eprintln!("skipping: needs gcc and librdmacm-dev");
        return None;
    }
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("vrnic-rdmacm-{name}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = Command::new("gcc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("gcc runs");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some((dir, exe))
}

/// Stdout and stderr of `out`, for messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts that a C test `NAME` exited 0 and printed `NAME: ok`.
pub fn assert_c_test_ok(name: &str, out: &Output) {
    let t = text(out);
    assert!(
        out.status.success() && t.contains(&format!("{name}: ok")),
        "{name}.c failed ({}):\n{t}",
        out.status
    );
}
