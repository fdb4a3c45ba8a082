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
