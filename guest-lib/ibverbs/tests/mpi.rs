//! Open MPI over UCX on vrnic (issue 30 point 5): Debian's `mpirun` (package
//! openmpi-bin) runs two ranks of `tests/c/mpi_pingpong.c` (built with
//! `mpicc`, libopenmpi-dev) with `--mca pml ucx` and `UCX_TLS=rc_v,self`
//! (so the ranks' messages go over vrnic's `rc_verbs`, not shared memory),
//! both on ONE vrnic function (the function's link reflecting its frames),
//! each through the agent vrnic's library starts: two MPI ranks in one
//! container. The program checks every ping-pong message from 1 B to
//! 4 MiB (eager and rendezvous protocols: UCX reads the large ones with
//! RDMA READ into registered buffers) and an `MPI_Allreduce`. Then the
//! agent serves nobody and the device holds nothing. Skipped, saying why,
//! without mpicc/mpirun, or without a way to make UCX's device node
//! (`common::with_node`).

mod common;

use std::time::Duration;

use common::{
    compile_c_test_with, lib_dir, reflecting_function, run_bounded, which, with_node, AgentDir,
};

#[test]
fn two_mpi_ranks_on_one_function_ping_pong_and_allreduce() {
    let (Some(mpicc), Some(mpirun)) = (which("mpicc"), which("mpirun")) else {
        eprintln!(
            "skipping: needs mpicc and mpirun (libopenmpi-dev, openmpi-bin: scripts/deps.sh)"
        );
        return;
    };
    let Some((daemon, _reflector)) = reflecting_function() else {
        return;
    };
    let agent = AgentDir::new("mpi");
    let (dir, exe) = compile_c_test_with(&mpicc, "mpi_pingpong", &[]);
    let Some(mut cmd) = with_node(&mpirun, &agent.tmp.join("dev")) else {
        return;
    };
    let env = |k: &str, v: &std::ffi::OsStr| {
        let mut s = std::ffi::OsString::from(format!("{k}="));
        s.push(v);
        s
    };
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .args(["--mca", "pml", "ucx", "--mca", "btl", "^openib,uct"]);
    let agent_bin = common::agent_bin();
    for (k, v) in [
        ("LD_LIBRARY_PATH", lib_dir().into_os_string()),
        ("VRNIC_VHOST_USER", daemon.socket().as_os_str().to_owned()),
        ("VRNIC_AGENT", agent_bin.into_os_string()),
        ("TMPDIR", agent.tmp.clone().into_os_string()),
        ("UCX_TLS", "rc_v,self".into()),
        ("UCX_NET_DEVICES", "vrnic0:1".into()),
    ] {
        cmd.arg("-x").arg(env(k, &v));
    }
    cmd.arg(&exe)
        .env_remove("VRNIC_LOOPBACK")
        .env_remove("VRNIC_AGENT_SOCKET");
    let out = run_bounded(&mut cmd, Duration::from_secs(300));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mpirun: {}\n{text}", out.status);
    assert!(text.contains("mpi_pingpong: ok"), "{text}");
    assert!(
        text.contains("pingpong 4194304 "),
        "no 4 MiB round:\n{text}"
    );
    eprintln!("{text}");
    AgentDir::wait_empty(&agent.socket(daemon.socket()));
}
