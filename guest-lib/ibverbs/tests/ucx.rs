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

use std::time::Duration;

use common::{lib_dir, run_bounded, which};
use vrnic::link::MemLink;
use vrnic_frontend::{test_device_config, TestDaemon};

#[test]
fn ucx_info_lists_rc_verbs_and_ud_verbs_on_vrnic() {
    let Some(ucx_info) = which("ucx_info") else {
        eprintln!("skipping: ucx_info not installed (ucx-utils, scripts/deps.sh)");
        return;
    };
    let scratch = std::env::temp_dir().join(format!("vrnic-ucx-dev-{}", std::process::id()));
    let Some(mut cmd) = common::with_node(&ucx_info, &scratch) else {
        return;
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

/// `ucx_perftest` (ucx-utils) between two processes on ONE function, each
/// through the agent the library starts (how MPI ranks in one container
/// run): `tag_lat` and `tag_bw` 64 KiB over `rc_verbs` (`UCX_TLS=rc_v`:
/// UCX wires RC up over UD), the function's link reflecting its frames.
/// Judged: both sides exit 0 and the client prints its `Final:` line; then
/// the agent serves nobody and the device holds nothing. Skipped, saying
/// why, without ucx_perftest or a way to make the node.
#[test]
fn ucx_perftest_between_two_processes_of_one_function() {
    let Some(perftest) = which("ucx_perftest") else {
        eprintln!("skipping: ucx_perftest not installed (ucx-utils, scripts/deps.sh)");
        return;
    };
    let Some((daemon, _reflector)) = common::reflecting_function() else {
        return;
    };
    let agent = common::AgentDir::new("ucx");
    let port = (30000 + std::process::id() % 20000).to_string();
    for (test, args) in [
        ("tag_lat", vec!["-n", "200"]),
        ("tag_bw", vec!["-s", "65536", "-n", "100"]),
    ] {
        let scratch = agent.tmp.join(format!("dev-{test}"));
        let run = |client: bool, n: u32| {
            let dir = scratch.join(format!("{}-{n}", if client { "c" } else { "s" }));
            let mut c = common::with_node(&perftest, &dir)?;
            c.args(["-p", &port])
                .env("LD_LIBRARY_PATH", lib_dir())
                .env("VRNIC_VHOST_USER", daemon.socket())
                .env("UCX_TLS", "rc_v")
                .env("UCX_NET_DEVICES", "vrnic0:1")
                .env_remove("VRNIC_LOOPBACK")
                .env_remove("VRNIC_AGENT_SOCKET");
            if client {
                c.args(["127.0.0.1", "-t", test]).args(&args);
            }
            agent.env(&mut c);
            Some(c)
        };
        let Some(mut server) = run(false, 0) else {
            return;
        };
        let server = server
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("ucx_perftest server starts");
        // Killed (and reaped) on every way out of this round, the test's
        // panics included: a server whose client failed would wait forever.
        let server = common::Reaped(Some(server));
        // The client retries while the server does not listen yet (bounded).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut n = 0;
        let client = loop {
            n += 1;
            let mut c = run(true, n).expect("the server's command was made");
            let out = run_bounded(&mut c, Duration::from_secs(120));
            // UCX logs to stdout.
            let err = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .to_lowercase();
            if out.status.success()
                || !(err.contains("connect") || err.contains("refused"))
                || std::time::Instant::now() > deadline
            {
                break out;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        if !client.status.success() {
            // The server waits for a client that will not come: say why now
            // (dropping it kills it).
            panic!(
                "{test} client: {}\n{}{}",
                client.status,
                String::from_utf8_lossy(&client.stdout),
                String::from_utf8_lossy(&client.stderr)
            );
        }
        let server = server.wait_bounded(Duration::from_secs(60));
        let text = |o: &std::process::Output| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        assert!(
            client.status.success(),
            "{test} client: {}\n{}",
            client.status,
            text(&client)
        );
        assert!(
            server.status.success(),
            "{test} server: {}\n{}",
            server.status,
            text(&server)
        );
        assert!(
            text(&client).contains("Final:"),
            "{test}: no result\n{}",
            text(&client)
        );
        eprintln!(
            "{test}: {}",
            text(&client)
                .lines()
                .filter(|l| l.starts_with("Final:"))
                .collect::<String>()
        );
    }
    common::AgentDir::wait_empty(&agent.socket(daemon.socket()));
}
