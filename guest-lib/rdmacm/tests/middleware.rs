//! More of Debian's rdma_cm programs on vrnic's `librdmacm.so.1` and
//! `libibverbs.so.1` (issue 31 points 4 and 5): rdmacm-utils' `udaddy`
//! (UD, SIDR), `rdma_xserver`/`rdma_xclient`, `mckey` (multicast, which
//! vrnic does not support: a clean, fast failure saying so), perftest's
//! `-R` latency and READ tests, as two host processes on two functions of
//! one daemon served in this process (`common::pair`), each function
//! through the agent the library starts. Skipped, saying why, without the
//! tool.

mod common;

use std::time::{Duration, Instant};

use common::pair::{Pair, Side};
use vrnic_test_support::Reaped;

/// What a client rejected for want of a listener says: rdma_cm's event,
/// or `ECONNREFUSED` from a synchronous `rdma_connect`.
const EARLY: &[&str] = &["REJECTED", "Connection refused"];

#[test]
fn udaddy_exchanges_datagrams_after_sidr() {
    let Some(p) = Pair::new("udaddy", "udaddy") else {
        return;
    };
    // udaddy resolves the server's QPN and Q_Key by SIDR, then sends
    // datagrams; a client without a listener gets SIDR "unsupported",
    // which udaddy reports as an UNREACHABLE event.
    let (ct, st) = p.run(
        ("udaddy", &["-b", "10.0.0.1", "-c", "2", "-C", "10"]),
        ("udaddy", &["-s", "10.0.0.1", "-c", "2", "-C", "10"]),
        &["UNREACHABLE", "REJECTED", "unreachable"],
        false,
    );
    for (who, t) in [("client", &ct), ("server", &st)] {
        assert!(
            t.contains("test complete") && t.contains("return status 0"),
            "{who}:\n{t}"
        );
    }
}

#[test]
fn rdma_xserver_and_rdma_xclient_over_rc() {
    let Some(p) = Pair::new("rdma-x", "rdma_xserver") else {
        return;
    };
    let (ct, st) = p.run(
        ("rdma_xserver", &["-p", "7473", "-c", "r"]),
        ("rdma_xclient", &["-s", "10.0.0.1", "-p", "7473", "-c", "r"]),
        EARLY,
        false,
    );
    assert!(ct.contains("rdma_xclient: end 0"), "client:\n{ct}");
    assert!(st.contains("rdma_xserver: end 0"), "server:\n{st}");
}

#[test]
fn mckey_fails_fast_saying_multicast_is_not_supported() {
    let Some(p) = Pair::new("mckey", "mckey") else {
        return;
    };
    // Built before the clock starts (the first test of a run builds it).
    vrnic_test_support::agent_bin();
    let start = Instant::now();
    let out = Reaped(Some(
        p.command(Side::A, "mckey", &["-m", "239.1.2.3", "-b", "10.0.0.1"])
            .spawn()
            .expect("start mckey"),
    ))
    .wait_bounded(Duration::from_secs(30));
    let t = common::text(&out);
    assert!(
        !out.status.success() && out.status.code().is_some(),
        "mckey should fail with an exit status ({}):\n{t}",
        out.status
    );
    assert!(
        t.contains("multicast is not supported"),
        "mckey's output should say why:\n{t}"
    );
    assert!(start.elapsed() < Duration::from_secs(10), "{t}");
    p.wait_agent_empty(Side::A);
}

#[test]
fn perftest_write_lat_connects_through_rdma_cm() {
    let Some(p) = Pair::new("perftest-wl", "ib_write_lat") else {
        return;
    };
    let (ct, st) = p.run(
        ("ib_write_lat", &["-R", "-F", "-n", "200", "-s", "64"]),
        (
            "ib_write_lat",
            &["-R", "-F", "-n", "200", "-s", "64", "10.0.0.1"],
        ),
        &["REJECTED", "Unable to"],
        false,
    );
    // "#bytes #iterations t_min[usec] t_max ... t_typical ..."
    assert!(
        ct.lines().any(|l| l.trim_start().starts_with("64 ")),
        "client:\n{ct}\nserver:\n{st}"
    );
}

#[test]
fn perftest_read_bw_connects_through_rdma_cm() {
    let Some(p) = Pair::new("perftest-rb", "ib_read_bw") else {
        return;
    };
    // RDMA READ needs the responder resources and initiator depth to
    // travel in the CM's REQ and REP (perftest sets both through
    // rdma_conn_param) and reach the QPs' attributes.
    let (ct, st) = p.run(
        ("ib_read_bw", &["-R", "-F", "-n", "200", "-s", "65536"]),
        (
            "ib_read_bw",
            &["-R", "-F", "-n", "200", "-s", "65536", "10.0.0.1"],
        ),
        &["REJECTED", "Unable to"],
        false,
    );
    assert!(
        ct.lines().any(|l| l.trim_start().starts_with("65536")),
        "client:\n{ct}\nserver:\n{st}"
    );
}

#[test]
fn rdma_xserver_and_rdma_xclient_over_xrc_fail_cleanly() {
    let Some(p) = Pair::new("rdma-xrc", "rdma_xserver") else {
        return;
    };
    let start = Instant::now();
    let (cout, sout) = p.run_raw(
        ("rdma_xserver", &["-p", "7474", "-c", "x"]),
        ("rdma_xclient", &["-s", "10.0.0.1", "-p", "7474", "-c", "x"]),
        EARLY,
        false,
    );
    let (ct, st) = (common::text(&cout), common::text(&sout));
    // XRC is not supported (vrnic has no XRC domains or SRQs): both
    // fail at once at rdma_create_ep (EOPNOTSUPP), saying why; neither
    // hangs.
    for (who, out, t) in [("client", &cout, &ct), ("server", &sout, &st)] {
        assert!(
            !out.status.success()
                && t.contains("rdma_create_ep: Operation not supported")
                && t.contains("XRC is not supported by vrnic")
                && t.contains("end -1"),
            "{who} {}:\n{t}",
            out.status
        );
    }
    assert!(start.elapsed() < Duration::from_secs(30), "{ct}\n{st}");
    p.wait_agents_empty();
}

/// libfabric's verbs provider (Debian's libfabric1, `fi_info`,
/// `fi_pingpong`): its MSG endpoints exist only for a device that has an
/// up, non-loopback interface whose address `rdma_bind_addr` binds to it
/// (`vrb_getifaddrs`), and fi_pingpong exchanges its setup over TCP to
/// the server's address: so both run in network namespaces whose veth
/// ends carry the functions' addresses.
#[test]
fn fi_info_lists_vrnic_in_a_namespace_with_its_address() {
    let Some(mut p) = Pair::new("fi-info", "fi_info") else {
        return;
    };
    if !p.netns("fi") {
        return;
    }
    let out = Reaped(Some(
        p.command(Side::A, "fi_info", &["-p", "verbs"])
            .spawn()
            .expect("start fi_info"),
    ))
    .wait_bounded(Duration::from_secs(60));
    let t = common::text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("vrnic0") && t.contains("FI_EP_MSG"), "{t}");
    p.wait_agent_empty(Side::A);
}

/// fi_pingpong over libfabric's verbs provider, server on function a and
/// client on b (in the namespaces: its control connection is TCP to
/// 10.0.0.1), 100 round trips of 1 KiB with data checks (`-c`). Its
/// `fi_getinfo` (node and service NULL) makes the provider bind an
/// rdma_cm id to "localhost" (`vrb_get_rdmacm_rai`) and, finding no device
/// on it, use the devices' own addresses: the CM takes a loopback address
/// as the wildcard (`cma_any_addr`). RxM over MSG sizes its CQ for
/// `FI_UNIVERSE_SIZE` peers (default 256: `(rx + tx) · 256` entries, past
/// vrnic's `max_cqe`, and `ibv_create_cq` refuses): two peers here.
/// `VRNIC_TEST_FI_LOG=warn` shows libfabric's log.
fn fi_pingpong(tag: &str, prov: &str, ep: &str) {
    let Some(mut p) = Pair::new(tag, "fi_pingpong") else {
        return;
    };
    if !p.netns(tag) {
        return;
    }
    if let Ok(l) = std::env::var("VRNIC_TEST_FI_LOG") {
        p.env.push(("FI_LOG_LEVEL".into(), l));
    }
    p.env.push(("FI_UNIVERSE_SIZE".into(), "2".into()));
    let args = ["-p", prov, "-e", ep, "-I", "100", "-S", "1024", "-c"];
    let mut cargs = args.to_vec();
    cargs.push("10.0.0.1");
    let (ct, st) = p.run(
        ("fi_pingpong", &args),
        ("fi_pingpong", &cargs),
        &["Connection refused"],
        false,
    );
    // "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec", then
    // "1k 100 =100 200k ...".
    for (who, t) in [("client", &ct), ("server", &st)] {
        assert!(
            t.lines().any(|l| l.starts_with("1k") && l.contains("=100")),
            "{who}:\n{t}"
        );
    }
}

/// Flaky (about one run in two on this 2-core machine): both sides'
/// `fi_eq_sread` fail with `-4` (`EINTR` from the provider's
/// `epoll_wait`, which a signal with a handler interrupts even with
/// `SA_RESTART`), or the server waits past the bound; when it runs, 100
/// checked 1 KiB round trips at ~120 µs. Not understood yet: which signal,
/// from whom. `cargo test ... -- --ignored fi_pingpong_verbs_msg`.
#[test]
#[ignore = "flaky: fi_eq_sread -EINTR or a hang, about one run in two (see its comment)"]
fn fi_pingpong_verbs_msg() {
    fi_pingpong("fimsg", "verbs", "msg");
}

#[test]
fn fi_pingpong_verbs_rxm_rdm() {
    fi_pingpong("firdm", "verbs;ofi_rxm", "rdm");
}

/// qperf over rdma_cm (`-cm1`): its control connection is TCP to the
/// server's address (so the namespaces), the RDMA connections rdma_cm's.
#[test]
fn qperf_rc_tests_connect_through_rdma_cm() {
    let Some(mut p) = Pair::new("qperf", "qperf") else {
        return;
    };
    if !p.netns("qp") {
        return;
    }
    let (ct, st) = p.run(
        ("qperf", &[]),
        (
            "qperf",
            &[
                "-cm1",
                "-t",
                "1",
                "10.0.0.1",
                "rc_bw",
                "rc_lat",
                "rc_rdma_write_bw",
                "rc_rdma_read_lat",
            ],
        ),
        &["Connection refused", "failed to connect"],
        true,
    );
    for t in ["rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_read_lat"] {
        assert!(
            ct.contains(&format!("{t}:")),
            "{t}: client:\n{ct}\nserver:\n{st}"
        );
    }
}

/// `prog args` on function `side` where `/dev/infiniband/vrnic-uverbs0`
/// exists (UCX uses a verbs device only then; README "UCX"): in a mount
/// namespace of its own (`scripts/uverbs-node.sh`), as root; `None`,
/// saying why, otherwise. Returns the scratch directory to remove too.
fn with_uverbs_node(
    p: &Pair,
    side: Side,
    prog: &str,
    args: &[&str],
) -> Option<(std::process::Command, std::path::PathBuf)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 || vrnic_test_support::which("unshare").is_none() {
        eprintln!("skipping: the device node for UCX needs root and unshare");
        return None;
    }
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/uverbs-node.sh");
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = p.agents.tmp.join(format!("node-{n}"));
    let mut all = vec![
        "--mount",
        "--propagation",
        "private",
        "sh",
        script.to_str().expect("utf-8 path"),
        dir.to_str().expect("utf-8 path"),
        prog,
    ];
    all.extend_from_slice(args);
    Some((p.command(side, "unshare", &all), dir))
}

/// UCX's rdmacm connection manager (`uct_rdmacm`, UCX 1.13) on vrnic's
/// librdmacm: `ucx_info -d` lists it beside vrnic0, and `ucx_info -e -A
/// 10.0.0.1` makes a listener at the function's address (rdma_cm) and an
/// endpoint connected to it through that listener, whose lanes are the
/// CM's and `rc_verbs` on vrnic0. Debian's `ucx_perftest` (1.13) has no
/// client/server (listener) mode and UCX's client/server example is not
/// packaged: this is the CM path UCX's own tools reach (one process
/// connecting to itself; `VRNIC_TEST_UCX_LOG=info` shows UCX's log).
#[test]
fn ucx_rdmacm_connection_manager() {
    let Some(mut p) = Pair::new("ucx-cm", "ucx_info") else {
        return;
    };
    p.env.push(("UCX_NET_DEVICES".into(), "vrnic0:1".into()));
    p.env
        .push(("UCX_SOCKADDR_TLS_PRIORITY".into(), "rdmacm".into()));
    if let Ok(l) = std::env::var("VRNIC_TEST_UCX_LOG") {
        p.env.push(("UCX_LOG_LEVEL".into(), l));
    }
    let run = |args: &[&str]| {
        let (mut c, _dir) = with_uverbs_node(&p, Side::A, "ucx_info", args)?;
        let out = Reaped(Some(c.spawn().expect("ucx_info"))).wait_bounded(Duration::from_secs(60));
        let t = common::text(&out);
        assert!(
            out.status.success(),
            "ucx_info {args:?} {}:\n{t}",
            out.status
        );
        Some(t)
    };
    let Some(t) = run(&["-d"]) else {
        return;
    };
    assert!(t.contains("# Connection manager: rdmacm"), "{t}");
    assert!(t.contains("# Memory domain: vrnic0"), "{t}");
    let Some(t) = run(&["-u", "t", "-e", "-A", "10.0.0.1"]) else {
        return;
    };
    let lanes: Vec<&str> = t.lines().filter(|l| l.contains("lane[")).collect();
    assert!(
        lanes.iter().any(|l| l.contains("cm rdmacm"))
            && lanes.iter().any(|l| l.contains("rc_verbs/vrnic0:1")),
        "{t}"
    );
    p.wait_agent_empty(Side::A);
}

/// rdma-core's own rdma_cm tests (pyverbs, Debian's python3-pyverbs,
/// `test_rdmacm`), unmodified, on function a: the suite finds the
/// device's IP address through `/sys/class/infiniband/DEV/device/net/`
/// and `ip addr` (else every test skips, "doesn't have net interface"),
/// so it runs in a network namespace whose veth carries 10.0.0.1 and a
/// mount namespace whose `/sys/class` is a tmpfs holding just
/// `infiniband/vrnic0/device/net/VETH`. Its passive and active processes
/// both use function a (a connection to the function's own address).
#[test]
fn pyverbs_test_rdmacm() {
    let suite = std::path::Path::new("/usr/share/doc/rdma-core/tests");
    if !suite.join("run_tests.py").exists() || !std::path::Path::new("/usr/bin/python3").exists() {
        eprintln!("skipping: python3-pyverbs not installed");
        return;
    }
    let Some(mut p) = Pair::new("pyverbs-cm", "unshare") else {
        return;
    };
    if !p.netns("py") {
        return;
    }
    let veth = p.veth(Side::A).expect("netns").to_string();
    let copy = p.agents.tmp.join("tests");
    let script = format!(
        "set -e; cp -r {suite} {copy}; find {copy} -name '*.gz' -exec gunzip -f {{}} +; \
         mount -t tmpfs vrnic-sys /sys/class; mkdir -p /sys/class/infiniband/vrnic0/device/net/{veth}; \
         cd {copy}/..; exec /usr/bin/python3 tests/run_tests.py --dev vrnic0 --gid 1 -v test_rdmacm",
        suite = suite.display(),
        copy = copy.display(),
    );
    let out = Reaped(Some(
        p.command(
            Side::A,
            "unshare",
            &["--mount", "--propagation", "private", "sh", "-c", &script],
        )
        .spawn()
        .expect("start the suite"),
    ))
    .wait_bounded(Duration::from_secs(600));
    let t = common::text(&out);
    // unittest's verdict, and each test's line "NAME (...) ... ok" or
    // "... skipped 'REASON'": every test passes but the multicast ones,
    // which the suite itself skips (vrnic reports no multicast groups).
    assert!(out.status.success() && t.contains("\nOK"), "{t}");
    let results: Vec<&str> = t.lines().filter(|l| l.contains(") ... ")).collect();
    let passed = results.iter().filter(|l| l.ends_with("... ok")).count();
    let skipped: Vec<&&str> = results
        .iter()
        .filter(|l| l.contains("... skipped"))
        .collect();
    assert!(passed >= 7, "{passed} passed:\n{t}");
    assert!(
        skipped
            .iter()
            .all(|l| l.contains("multicast") && l.contains("Multicast is not supported")),
        "{t}"
    );
    p.wait_agent_empty(Side::A);
}

/// ucmatose `-m`: after the transfer, both sides move their ids to a new
/// event channel (`rdma_migrate_id(3)`) and disconnect through it.
#[test]
fn ucmatose_migrates_ids_to_a_new_channel() {
    let Some(p) = Pair::new("ucmatose-m", "ucmatose") else {
        return;
    };
    let (ct, st) = p.run(
        ("ucmatose", &["-b", "10.0.0.1", "-c", "2", "-C", "10", "-m"]),
        ("ucmatose", &["-s", "10.0.0.1", "-c", "2", "-C", "10", "-m"]),
        EARLY,
        false,
    );
    for (who, t) in [("client", &ct), ("server", &st)] {
        assert!(
            t.contains("migrating to new event channel")
                && t.contains("test complete")
                && t.contains("return status 0"),
            "{who}:\n{t}"
        );
    }
}
