//! What the integration tests of vrnic's C-ABI libraries (`vrnic-ibverbs`,
//! `vrnic-rdmacm`) share: finding programs, running them with a bound,
//! the tree's own `vrnic-agent`, and the agents a test's programs start,
//! stopped when the test ends. Test code only (`publish = false`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use vrnic_guest::agent::{self, client::AgentTransport, proto};

/// `target/<profile>` of the running test binary (which cargo puts in its
/// `deps/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary in target/<profile>/deps")
        .to_path_buf()
}

/// A command's stdout and stderr, as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Path of an executable on `PATH`, if any.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// Runs `cmd` to completion or kills it after `limit` (polling its exit
/// status; the child is killed and reaped on timeout). Panics on timeout.
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let start = Instant::now();
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("wait_with_output");
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait_with_output");
            panic!(
                "{cmd:?} did not finish within {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The `vrnic-agent` binary of this tree: built here (cargo's lock on
/// the target directory is free while tests run), so a test never runs a
/// stale agent. Built once per test process.
pub fn agent_bin() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let dir = profile_dir();
    BUILT.call_once(|| {
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-p", "vrnic-tools", "--bin", "vrnic-agent"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            c.arg("--release");
        }
        let out = run_bounded(&mut c, Duration::from_secs(900));
        assert!(
            out.status.success(),
            "building vrnic-agent failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    dir.join("vrnic-agent")
}

/// The agent a test's programs started (through the library), in a
/// temporary directory of the test's own (`TMPDIR`): on drop, stopped with
/// SIGTERM (its PID from the socket's peer credentials; bounded, then
/// SIGKILL) and the directory removed.
pub struct AgentDir {
    /// The directory (the programs' `TMPDIR`).
    pub tmp: std::path::PathBuf,
}

impl AgentDir {
    /// A fresh directory, `vrnic-mp-PID-TAG-N` in the test's own
    /// temporary directory.
    pub fn new(tag: &str) -> Self {
        // One per test, even for two tests of one program.
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = std::env::temp_dir().join(format!("vrnic-mp-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).expect("agent temp dir");
        AgentDir { tmp }
    }

    /// The agent's socket for the function behind `vhost_user`, as the
    /// library computes it under this `TMPDIR`.
    pub fn socket(&self, vhost_user: &Path) -> std::path::PathBuf {
        agent::vhost_user_socket_in(&self.tmp, vhost_user)
    }

    /// Sets `cmd` up to reach the function behind `vhost_user` through the
    /// agent.
    pub fn env(&self, cmd: &mut Command) {
        cmd.env("VRNIC_AGENT", agent_bin()).env("TMPDIR", &self.tmp);
    }

    /// Waits (bounded) until the agent at `socket` serves no program and
    /// its device holds nothing but the default context.
    pub fn wait_empty(socket: &Path) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let st = AgentTransport::status(socket).unwrap_or_else(|e| {
                let log = std::fs::read_to_string(format!("{}.log", socket.display()));
                panic!("the agent does not answer its status: {e}; its log:\n{log:?}")
            });
            let u = st.usage;
            let left = [u.pds, u.mrs, u.cqs, u.qps, u.ahs, u.srqs, u.mr_pages];
            if st.programs == 0 && u.ctxs == 1 && left == [0; 7] {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the agent still serves {} programs: {u:?}",
                st.programs
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AgentDir {
    fn drop(&mut self) {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let dir = self.tmp.join(format!("vrnic-{uid}"));
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "sock") {
                continue;
            }
            let Ok(sock) = proto::connect(&path) else {
                continue;
            };
            let Ok(pid) = proto::peer_pid(&sock) else {
                continue;
            };
            drop(sock);
            // SAFETY: signalling the agent this test's programs started
            // (the peer of its own socket in the test's own directory).
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let alive = || {
                // SAFETY: signal 0 only checks that the process exists.
                unsafe { libc::kill(pid, 0) == 0 }
            };
            while alive() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if alive() {
                // SAFETY: as above; the agent did not stop within 10 s.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

/// A child killed (and reaped) if still running when dropped: a test that
/// fails while a server waits leaves nothing behind.
pub struct Reaped(pub Option<std::process::Child>);

impl Reaped {
    /// Kills it (if still running) and returns what it printed.
    pub fn kill(mut self) -> Output {
        let mut child = self.0.take().expect("child");
        let _ = child.kill();
        child.wait_with_output().expect("wait_with_output")
    }

    /// Its output once it exits, within `limit`; past it, killed, and the
    /// test fails showing what it printed.
    pub fn wait_bounded(mut self, limit: Duration) -> Output {
        let mut child = self.0.take().expect("child");
        let start = Instant::now();
        while child.try_wait().expect("try_wait").is_none() {
            if start.elapsed() > limit {
                let _ = child.kill();
                let out = child.wait_with_output().expect("wait");
                panic!(
                    "did not finish within {limit:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait_with_output().expect("wait_with_output")
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
