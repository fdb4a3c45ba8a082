//! RC traffic between two vrnic daemons, in process: each daemon's link is
//! one end of a `MemLink` pair, and each is driven through its vhost-user
//! socket by a test frontend that builds PDs, MRs, CQs and QPs with
//! control commands and posts work requests with doorbells, as a guest
//! driver would. Every wait is bounded by wall-clock time.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use vrnic::abi;
use vrnic::device::DeviceConfig;
use vrnic::link::MemLink;
use vrnic_vhost::addr::Mac;
use vrnic_vhost::frontend::verbs::{Cq, Mr, Qp, QpSizes, RcPath};
use vrnic_vhost::frontend::{FrontendOptions, TestDaemon, TestFrontend};
use vrnic_vhost::VrnicBackend;

/// Bound on every wait for the device.
const WAIT: Duration = Duration::from_secs(10);
/// Path MTU 1024 bytes, as `ibv_mtu`.
const MTU_1024: u32 = 3;
/// First PSNs: A's close to the 24-bit wrap, so multi-packet messages
/// cross it.
const PSN_A: u32 = 0xff_fffd;
const PSN_B: u32 = 100;
const ALL_ACCESS: u32 =
    abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;

/// One daemon with a connected frontend and an RC QP whose send and
/// receive completions share one CQ.
struct Side {
    daemon: TestDaemon,
    fe: TestFrontend,
    ip: Ipv4Addr,
    pd: u32,
    cq: Cq,
    qp: Qp,
}

/// The counters of `s.qp` from its daemon's stats socket (names without
/// the `qp_<qpn>_` prefix), once `name` has reached `want`; panics after
/// [`WAIT`].
fn wait_for_qp_counter(s: &Side, name: &str, want: u64) -> Vec<(String, u64)> {
    let path = s.daemon.stats_socket().expect("stats server");
    let prefix = format!("qp_{}_", s.qp.qpn);
    let deadline = Instant::now() + WAIT;
    loop {
        let reply = vrnic_vhost::stats::query(path, WAIT).expect("stats reply");
        let counters: Vec<(String, u64)> = vrnic_vhost::stats::parse(&reply)
            .expect("name value lines")
            .into_iter()
            .filter_map(|(n, v)| Some((n.strip_prefix(&prefix)?.to_string(), v)))
            .collect();
        if counters.iter().any(|(n, v)| n == name && *v == want) {
            return counters;
        }
        assert!(
            Instant::now() < deadline,
            "{prefix}{name} never reached {want} within {WAIT:?}:\n{reply}"
        );
        // Pacing between queries, not synchronisation: the loop ends on
        // the counter's value.
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn device_config(last_octet: u8) -> DeviceConfig {
    let ip = Ipv4Addr::new(10, 0, 0, last_octet);
    DeviceConfig {
        mac: Mac::from_ipv4(ip).0,
        ipv4: ip,
        prefix_len: 24,
        ipv6: Vec::new(),
        link_mtu: 1500,
    }
}

fn side(last_octet: u8, link: MemLink) -> Side {
    let cfg = device_config(last_octet);
    let ip = cfg.ipv4;
    let daemon = TestDaemon::with_device_and_stats(cfg, Box::new(link)).expect("daemon starts");
    let mut fe = daemon
        .connect(&FrontendOptions::default())
        .expect("frontend connects");
    let pd = fe.alloc_pd().expect("ALLOC_PD");
    let cq = fe.create_cq(64).expect("CREATE_CQ");
    let qp = fe
        .create_rc_qp(pd, &cq, &cq, QpSizes::default())
        .expect("CREATE_QP");
    Side {
        daemon,
        fe,
        ip,
        pd,
        cq,
        qp,
    }
}

/// Two daemons, 10.0.0.1 (A) and 10.0.0.2 (B), on the two ends of a
/// `MemLink` pair, with their QPs connected to each other (RTS).
fn connected_pair() -> (Side, Side) {
    let (la, lb) = MemLink::pair();
    let mut a = side(1, la);
    let mut b = side(2, lb);
    assert_ne!(device_config(1).mac, device_config(2).mac, "distinct MACs");
    let to_b = RcPath {
        peer_ip: b.ip,
        peer_qpn: b.qp.qpn,
        peer_psn: PSN_B,
        my_psn: PSN_A,
        path_mtu: MTU_1024,
    };
    let to_a = RcPath {
        peer_ip: a.ip,
        peer_qpn: a.qp.qpn,
        peer_psn: PSN_A,
        my_psn: PSN_B,
        path_mtu: MTU_1024,
    };
    a.fe.connect_rc(&a.qp, &to_b)
        .expect("A: RESET→INIT→RTR→RTS");
    b.fe.connect_rc(&b.qp, &to_a)
        .expect("B: RESET→INIT→RTR→RTS");
    for s in [&mut a, &mut b] {
        let attr = s.fe.query_qp(&s.qp).expect("QUERY_QP");
        assert_eq!(attr.qp_state, abi::QPS_RTS, "QP {} in RTS", s.qp.qpn);
    }
    (a, b)
}

/// Disconnects both frontends and stops both daemons; gives back A's and
/// B's backends (their counters survive the end of the connection).
fn shut_down(a: Side, b: Side) -> (VrnicBackend, VrnicBackend) {
    drop(a.fe);
    drop(b.fe);
    let ba = a.daemon.stop(WAIT).expect("daemon A stops");
    let bb = b.daemon.stop(WAIT).expect("daemon B stops");
    (ba, bb)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A buffer of `len` bytes in `s`'s driver memory holding `data` (zeros
/// if empty), registered with every access right.
fn buffer(s: &mut Side, len: usize, data: &[u8]) -> Mr {
    let gpa = s.fe.alloc_buffer(len as u64).expect("driver memory");
    s.fe.write_bytes(gpa, data).expect("fill the buffer");
    s.fe.reg_mr(s.pd, gpa, len as u64, ALL_ACCESS)
        .expect("REG_MR")
}

fn cqe(s: &mut Side) -> abi::Cqe {
    s.fe.wait_cqe(&mut s.cq, WAIT)
        .unwrap_or_else(|e| panic!("QP {}: {e}", s.qp.qpn))
}

#[test]
fn send_of_5000_bytes_at_mtu_1024_arrives_byte_for_byte() {
    let (mut a, mut b) = connected_pair();
    let len = 5000;
    let data = pattern(len, 1);
    let src = buffer(&mut a, len, &data);
    // Room to spare, so a wrong length would show.
    let dst = buffer(&mut b, len + 1000, &[]);

    b.fe.post_recv(&mut b.qp, 77, &[dst.sge(0, (len + 1000) as u32)])
        .expect("post RECV");
    let wqe = abi::SendWqe {
        wr_id: 5,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    a.fe.post_send(&mut a.qp, wqe, &[src.sge(0, len as u32)])
        .expect("post SEND");

    let rc = cqe(&mut b);
    assert_eq!(
        (rc.status, rc.opcode, rc.wr_id, rc.byte_len, rc.qp_num),
        (abi::WC_SUCCESS, abi::WC_OP_RECV, 77, len as u32, b.qp.qpn),
        "receive completion: {rc:?}"
    );
    assert_eq!(
        b.fe.read_bytes(dst.gpa, len).unwrap(),
        data,
        "the payload, byte for byte"
    );
    assert_eq!(
        b.fe.read_bytes(dst.gpa + len as u64, 1000).unwrap(),
        vec![0; 1000],
        "nothing written past the message"
    );
    let sc = cqe(&mut a);
    assert_eq!(
        (sc.status, sc.opcode, sc.wr_id, sc.qp_num),
        (abi::WC_SUCCESS, abi::WC_OP_SEND, 5, a.qp.qpn),
        "send completion: {sc:?}"
    );

    let (ba, bb) = shut_down(a, b);
    let (da, db) = (ba.device_stats(), bb.device_stats());
    assert_eq!((da.naks_sent, db.naks_sent), (0, 0));
    assert!(
        db.rx_frames >= 5,
        "B received the 5 packets of the message: {db:?}"
    );
}

#[test]
fn rdma_write_with_immediate_of_3000_bytes_lands_byte_for_byte() {
    let (mut a, mut b) = connected_pair();
    let len = 3000;
    let data = pattern(len, 9);
    let src = buffer(&mut a, len, &data);
    let dst = buffer(&mut b, len + 200, &[]);
    let imm = [0xde, 0xad, 0xbe, 0xef];

    // The immediate consumes a receive WQE (no SGE needed).
    b.fe.post_recv(&mut b.qp, 31, &[]).expect("post RECV");
    let wqe = abi::SendWqe {
        wr_id: 6,
        opcode: abi::WR_RDMA_WRITE_WITH_IMM,
        send_flags: abi::SEND_SIGNALED,
        imm_data: imm,
        remote_addr: dst.va(100),
        rkey: dst.rkey,
        ..Default::default()
    };
    a.fe.post_send(&mut a.qp, wqe, &[src.sge(0, len as u32)])
        .expect("post WRITE_WITH_IMM");

    let rc = cqe(&mut b);
    assert_eq!(
        (rc.status, rc.opcode, rc.wr_id, rc.byte_len),
        (
            abi::WC_SUCCESS,
            abi::WC_OP_RECV_RDMA_WITH_IMM,
            31,
            len as u32
        ),
        "receive completion: {rc:?}"
    );
    assert_eq!(rc.imm_data, imm, "the immediate");
    assert_eq!(rc.wc_flags & abi::WC_WITH_IMM, abi::WC_WITH_IMM);
    assert_eq!(
        b.fe.read_bytes(dst.gpa + 100, len).unwrap(),
        data,
        "the payload, byte for byte"
    );
    assert_eq!(
        b.fe.read_bytes(dst.gpa, 100).unwrap(),
        vec![0; 100],
        "bytes before the target untouched"
    );
    assert_eq!(
        b.fe.read_bytes(dst.gpa + 100 + len as u64, 100).unwrap(),
        vec![0; 100],
        "bytes after the target untouched"
    );
    let sc = cqe(&mut a);
    assert_eq!(
        (sc.status, sc.opcode, sc.wr_id),
        (abi::WC_SUCCESS, abi::WC_OP_RDMA_WRITE, 6),
        "send completion: {sc:?}"
    );
    shut_down(a, b);
}

#[test]
fn rdma_write_with_a_bad_rkey_is_nakked_with_a_remote_access_error() {
    let (mut a, mut b) = connected_pair();
    let len = 2000;
    let src = buffer(&mut a, len, &pattern(len, 3));
    let dst = buffer(&mut b, 4096, &[]);

    let wqe = abi::SendWqe {
        wr_id: 8,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: dst.va(0),
        rkey: dst.rkey ^ 0x100,
        ..Default::default()
    };
    a.fe.post_send(&mut a.qp, wqe, &[src.sge(0, len as u32)])
        .expect("post WRITE");

    let c = cqe(&mut a);
    assert_eq!(
        (c.wr_id, c.status),
        (8, abi::WC_REM_ACCESS_ERR),
        "the requester completes with WC_REM_ACCESS_ERR: {c:?}"
    );
    assert_eq!(
        b.fe.read_bytes(dst.gpa, 4096).unwrap(),
        vec![0; 4096],
        "nothing written"
    );
    assert_eq!(
        a.fe.query_qp(&a.qp).unwrap().qp_state,
        abi::QPS_ERR,
        "the requester's QP moved to ERR"
    );
    // Per-QP counters reach the stats socket at most
    // QP_STATS_INTERVAL_NS after the wake-up that moved them, also once
    // both daemons are idle, as they are now.
    let b_qp = wait_for_qp_counter(&b, "nak_rem_access_sent", 1);
    let a_qp = wait_for_qp_counter(&a, "nak_rem_access_received", 1);
    let get = |c: &[(String, u64)], name: &str| {
        c.iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} missing from {c:?}"))
            .1
    };
    assert_eq!(get(&a_qp, "nak_psn_seq_received"), 0, "{a_qp:?}");
    assert_eq!(get(&a_qp, "retransmits"), 0, "{a_qp:?}");
    assert_eq!(get(&a_qp, "tx_packets"), 2, "the WRITE's 2 packets");
    assert_eq!(get(&a_qp, "tx_bytes"), len as u64, "its payload");
    assert_eq!(get(&a_qp, "rx_packets"), 1, "the NAK");
    assert!(get(&b_qp, "rx_packets") >= 1, "{b_qp:?}");
    assert_eq!(get(&b_qp, "tx_packets"), 1, "the NAK");
    assert_eq!(get(&b_qp, "nak_inv_req_sent"), 0, "{b_qp:?}");

    let (ba, bb) = shut_down(a, b);
    assert_eq!(bb.device_stats().naks_sent, 1, "the responder sent one NAK");
    assert_eq!(ba.device_stats().naks_received, 1, "the requester got it");
}

/// A guest killed in the middle of a transfer (issue 9): B sends A two
/// 256 KiB messages and A has posted one receive, so the first arrives and
/// the second waits at A (RNR NAKs) when A's guest dies: its QEMU goes
/// away and daemon A's connection ends. Daemon A destroys everything that
/// guest had and drops what B keeps sending (no NAK: no QP of that number
/// exists any more), so B's QP runs out of retries and completes the
/// second SEND with `IBV_WC_RETRY_EXC_ERR` within a bounded time (7
/// retries of the 67 ms ACK timeout); daemon A serves a new guest on the
/// same socket.
#[test]
fn a_guest_killed_mid_transfer_leaves_its_peer_with_retry_exceeded() {
    let (mut a, mut b) = connected_pair();
    let len = 256 << 10;
    let dst = buffer(&mut a, len, &[]);
    a.fe.post_recv(&mut a.qp, 1, &[dst.sge(0, len as u32)])
        .expect("post RECV");
    let src = buffer(&mut b, len, &pattern(len, 3));
    for wr_id in [8, 9] {
        let wqe = abi::SendWqe {
            wr_id,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        b.fe.post_send(&mut b.qp, wqe, &[src.sge(0, len as u32)])
            .expect("post SEND");
    }
    let first = cqe(&mut b);
    assert_eq!(
        (first.status, first.wr_id),
        (abi::WC_SUCCESS, 8),
        "the first SEND arrived: {first:?}"
    );
    let old_qpn = a.qp.qpn;
    // The guest dies: its connection ends with the second SEND under way.
    drop(a.fe);

    let t0 = Instant::now();
    let sc =
        b.fe.wait_cqe(&mut b.cq, WAIT)
            .expect("B's SEND completes, never hangs");
    assert_eq!(
        (sc.status, sc.wr_id, sc.qp_num),
        (abi::WC_RETRY_EXC_ERR, 9, b.qp.qpn),
        "B's SEND fails with RETRY_EXC_ERR: {sc:?}"
    );
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "RETRY_EXC_ERR after {took:?}"
    );

    // Daemon A serves a new guest on the same socket; the dead guest's QP
    // is gone.
    let mut fe = a
        .daemon
        .connect(&FrontendOptions::default())
        .expect("a new guest attaches to daemon A");
    let pd = fe.alloc_pd().expect("ALLOC_PD for the new guest");
    let cq = fe.create_cq(16).expect("CREATE_CQ");
    let qp = fe
        .create_rc_qp(pd, &cq, &cq, QpSizes::default())
        .expect("CREATE_QP");
    assert_ne!(qp.qpn, old_qpn, "QP numbers are not reused at once");
    let q = abi::Handle {
        handle: old_qpn,
        ..Default::default()
    };
    let (h, _) = fe
        .control_obj(abi::CMD_QUERY_QP, &q)
        .expect("QUERY_QP answered");
    assert_eq!(h.status, abi::STATUS_ENOENT, "the dead guest's QP is gone");
    drop(fe);
    let (ba, _bb) = shut_down_daemons(a.daemon, b);
    assert_eq!(ba.mapped_regions(), 0, "no guest memory kept mapped");
}

/// Stops daemon `a` (its frontend already gone) and side `b`.
fn shut_down_daemons(a: TestDaemon, b: Side) -> (VrnicBackend, VrnicBackend) {
    drop(b.fe);
    let ba = a.stop(WAIT).expect("daemon A stops");
    let bb = b.daemon.stop(WAIT).expect("daemon B stops");
    (ba, bb)
}

/// One thread driving two devices (as `vrnic-soak` does) sleeps on both
/// event queues at once: with both CQs armed, a SEND from A to B raises a
/// completion event on each side, and `verbs::wait_events` returns them.
#[test]
fn wait_events_wakes_on_either_of_two_frontends() {
    let (mut a, mut b) = connected_pair();
    let len = 100;
    let src = buffer(&mut a, len, &pattern(len, 5));
    let dst = buffer(&mut b, len, &[]);
    b.fe.post_recv(&mut b.qp, 1, &[dst.sge(0, len as u32)])
        .expect("post RECV");
    // Nothing is armed yet: nothing comes.
    let none = vrnic_vhost::frontend::verbs::wait_events(
        &mut [&mut a.fe, &mut b.fe],
        Duration::from_millis(50),
    )
    .expect("wait_events");
    assert!(none.is_empty(), "{none:?}");
    a.fe.arm_cq(&a.cq).expect("arm A");
    b.fe.arm_cq(&b.cq).expect("arm B");
    let wqe = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    a.fe.post_send(&mut a.qp, wqe, &[src.sge(0, len as u32)])
        .expect("post SEND");
    let mut sides = std::collections::BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while sides.len() < 2 && Instant::now() < deadline {
        for (i, ev) in vrnic_vhost::frontend::verbs::wait_events(&mut [&mut a.fe, &mut b.fe], WAIT)
            .expect("wait_events")
        {
            assert_eq!(ev.kind, abi::EV_COMP, "{ev:?}");
            sides.insert(i);
        }
    }
    assert_eq!(sides.len(), 2, "a completion event from each frontend");
    assert_eq!(cqe(&mut a).status, abi::WC_SUCCESS);
    assert_eq!(cqe(&mut b).status, abi::WC_SUCCESS);
    shut_down(a, b);
}
