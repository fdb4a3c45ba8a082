//! RC traffic between two vrnic daemons, in process: each daemon's link is
//! one end of a `MemLink` pair, and each is driven through its vhost-user
//! socket by a program using guest-lib's verbs over `VhostUserTransport`
//! (`common`), as a container's program drives a daemon. Every wait is
//! bounded by wall-clock time.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::{buffer, connect_rc, gid, pattern, rc_qp, recv, send, wait_cq, Conn, Peer, WAIT};
use vrnic::abi::{self, Pod};
use vrnic::device::DeviceConfig;
use vrnic::link::MemLink;
use vrnic_frontend::TestDaemon;
use vrnic_guest::transport::TransportError;
use vrnic_guest::verbs::{Context, Cq, Pd, Qp, QpState, RdmaWr, SendWr, WrOpcode, SEND_SIGNALED};
use vrnic_vhost::addr::Mac;
use vrnic_vhost::VrnicBackend;

/// First PSNs: A's close to the 24-bit wrap, so multi-packet messages
/// cross it.
const PSN_A: u32 = 0xff_fffd;
const PSN_B: u32 = 100;

/// One daemon with a connected program and an RC QP whose send and
/// receive completions share one CQ. Field order is drop order.
struct Side {
    qp: Qp,
    cq: Cq,
    pd: Pd,
    ctx: Context,
    conn: Conn,
    daemon: TestDaemon,
}

impl Side {
    /// The program ends (its objects destroyed, its connection closed);
    /// the daemon is left.
    fn close(self) -> TestDaemon {
        let Side {
            qp,
            cq,
            pd,
            ctx,
            conn,
            daemon,
        } = self;
        drop((qp, cq, pd, ctx, conn));
        daemon
    }
}

/// The counters of `s.qp` from its daemon's stats socket (names without
/// the `qp_<qpn>_` prefix), once `name` has reached `want`; panics after
/// [`WAIT`].
fn wait_for_qp_counter(s: &Side, name: &str, want: u64) -> Vec<(String, u64)> {
    let path = s.daemon.stats_socket().expect("stats server");
    let prefix = format!("qp_{}_", s.qp.qp_num());
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
    let daemon = TestDaemon::with_device_and_stats(cfg, Box::new(link)).expect("daemon starts");
    let (ctx, conn) = common::open(daemon.socket());
    let pd = Pd::alloc(&ctx).expect("ALLOC_PD");
    let cq = Cq::new(&ctx, 64).expect("CREATE_CQ");
    let qp = rc_qp(&pd, &cq);
    Side {
        qp,
        cq,
        pd,
        ctx,
        conn,
        daemon,
    }
}

/// Two daemons, 10.0.0.1 (A) and 10.0.0.2 (B), on the two ends of a
/// `MemLink` pair, with their QPs connected to each other (RTS).
fn connected_pair() -> (Side, Side) {
    let (la, lb) = MemLink::pair();
    let mut a = side(1, la);
    let mut b = side(2, lb);
    assert_ne!(device_config(1).mac, device_config(2).mac, "distinct MACs");
    let to_b = Peer {
        gid: gid(&b.ctx),
        qpn: b.qp.qp_num(),
        psn: PSN_B,
    };
    let to_a = Peer {
        gid: gid(&a.ctx),
        qpn: a.qp.qp_num(),
        psn: PSN_A,
    };
    connect_rc(&mut a.qp, to_b, PSN_A);
    connect_rc(&mut b.qp, to_a, PSN_B);
    for s in [&a, &b] {
        let attr = s.qp.query().expect("QUERY_QP");
        assert_eq!(attr.qp_state, QpState::Rts, "QP {} in RTS", s.qp.qp_num());
    }
    (a, b)
}

/// Ends both programs and stops both daemons; gives back A's and B's
/// backends (their counters survive the end of the connection).
fn shut_down(a: Side, b: Side) -> (VrnicBackend, VrnicBackend) {
    let (da, db) = (a.close(), b.close());
    let ba = da.stop(WAIT).expect("daemon A stops");
    let bb = db.stop(WAIT).expect("daemon B stops");
    (ba, bb)
}

fn cqe(s: &mut Side) -> vrnic_guest::verbs::WorkCompletion {
    let what = format!("QP {}", s.qp.qp_num());
    wait_cq(&mut s.cq, &what)
}

#[test]
fn send_of_5000_bytes_at_mtu_1024_arrives_byte_for_byte() {
    let (mut a, mut b) = connected_pair();
    let len = 5000;
    let data = pattern(len, 1);
    let src = buffer(&a.pd, len, &data);
    // Room to spare, so a wrong length would show.
    let dst = buffer(&b.pd, len + 1000, &[]);

    recv(&mut b.qp, 77, Some(dst.sge(0, len + 1000)));
    send(&mut a.qp, 5, src.sge(0, len));

    let rc = cqe(&mut b);
    assert_eq!(
        (rc.status, rc.opcode, rc.wr_id, rc.byte_len, rc.qp_num),
        (
            abi::WC_SUCCESS,
            abi::WC_OP_RECV,
            77,
            len as u32,
            b.qp.qp_num()
        ),
        "receive completion: {rc:?}"
    );
    let got = dst.to_vec();
    assert_eq!(&got[..len], &data[..], "the payload, byte for byte");
    assert_eq!(
        &got[len..],
        &[0; 1000][..],
        "nothing written past the message"
    );
    let sc = cqe(&mut a);
    assert_eq!(
        (sc.status, sc.opcode, sc.wr_id, sc.qp_num),
        (abi::WC_SUCCESS, abi::WC_OP_SEND, 5, a.qp.qp_num()),
        "send completion: {sc:?}"
    );

    drop((src, dst));
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
    let src = buffer(&a.pd, len, &data);
    let dst = buffer(&b.pd, len + 200, &[]);
    let imm = 0xdead_beef;

    // The immediate consumes a receive WQE (no SGE needed).
    recv(&mut b.qp, 31, None);
    a.qp.post_send(&SendWr {
        wr_id: 6,
        opcode: WrOpcode::RdmaWriteWithImm,
        send_flags: SEND_SIGNALED,
        sg_list: &[src.sge(0, len)],
        imm_data: imm,
        rdma: RdmaWr {
            remote_addr: dst.addr() + 100,
            rkey: dst.rkey(),
        },
        ..Default::default()
    })
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
    assert_eq!(rc.imm_data, Some(imm), "the immediate");
    assert_eq!(rc.wc_flags & abi::WC_WITH_IMM, abi::WC_WITH_IMM);
    let got = dst.to_vec();
    assert_eq!(
        &got[100..100 + len],
        &data[..],
        "the payload, byte for byte"
    );
    assert_eq!(
        &got[..100],
        &[0; 100][..],
        "bytes before the target untouched"
    );
    assert_eq!(
        &got[100 + len..],
        &[0; 100][..],
        "bytes after the target untouched"
    );
    let sc = cqe(&mut a);
    assert_eq!(
        (sc.status, sc.opcode, sc.wr_id),
        (abi::WC_SUCCESS, abi::WC_OP_RDMA_WRITE, 6),
        "send completion: {sc:?}"
    );
    drop((src, dst));
    shut_down(a, b);
}

#[test]
fn rdma_write_with_a_bad_rkey_is_nakked_with_a_remote_access_error() {
    let (mut a, b) = connected_pair();
    let len = 2000;
    let src = buffer(&a.pd, len, &pattern(len, 3));
    let dst = buffer(&b.pd, 4096, &[]);

    a.qp.post_send(&SendWr {
        wr_id: 8,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SEND_SIGNALED,
        sg_list: &[src.sge(0, len)],
        rdma: RdmaWr {
            remote_addr: dst.addr(),
            rkey: dst.rkey() ^ 0x100,
        },
        ..Default::default()
    })
    .expect("post WRITE");

    let c = cqe(&mut a);
    assert_eq!(
        (c.wr_id, c.status),
        (8, abi::WC_REM_ACCESS_ERR),
        "the requester completes with WC_REM_ACCESS_ERR: {c:?}"
    );
    assert_eq!(dst.to_vec(), vec![0; 4096], "nothing written");
    assert_eq!(
        a.qp.query().unwrap().qp_state,
        QpState::Err,
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

    drop((src, dst));
    let (ba, bb) = shut_down(a, b);
    assert_eq!(bb.device_stats().naks_sent, 1, "the responder sent one NAK");
    assert_eq!(ba.device_stats().naks_received, 1, "the requester got it");
}

/// A guest killed in the middle of a transfer (issue 9): B sends A two
/// 256 KiB messages and A has posted one receive, so the first arrives and
/// the second waits at A (RNR NAKs) when A's program dies: its connection
/// ends with every object it had (nothing destroyed). Daemon A destroys
/// everything that program had and drops what B keeps sending (no NAK: no
/// QP of that number exists any more), so B's QP runs out of retries and
/// completes the second SEND with `IBV_WC_RETRY_EXC_ERR` within a bounded
/// time (7 retries of the 67 ms ACK timeout); daemon A serves a new program
/// on the same socket.
#[test]
fn a_guest_killed_mid_transfer_leaves_its_peer_with_retry_exceeded() {
    let (mut a, mut b) = connected_pair();
    let len = 256 << 10;
    let dst = buffer(&a.pd, len, &[]);
    recv(&mut a.qp, 1, Some(dst.sge(0, len)));
    let src = buffer(&b.pd, len, &pattern(len, 3));
    for wr_id in [8, 9] {
        send(&mut b.qp, wr_id, src.sge(0, len));
    }
    let first = cqe(&mut b);
    assert_eq!(
        (first.status, first.wr_id),
        (abi::WC_SUCCESS, 8),
        "the first SEND arrived: {first:?}"
    );
    let old_qpn = a.qp.qp_num();
    // The program dies: its connection ends with the second SEND under
    // way and its QP, CQ, PD and MR alive.
    // SAFETY: A's objects are only dropped from now on; its MR is
    // `Mr::alloc`'s.
    unsafe { a.conn.kill() };
    drop(dst);
    let daemon_a = a.close();

    let t0 = Instant::now();
    let sc = cqe(&mut b);
    assert_eq!(
        (sc.status, sc.wr_id, sc.qp_num),
        (abi::WC_RETRY_EXC_ERR, 9, b.qp.qp_num()),
        "B's SEND fails with RETRY_EXC_ERR: {sc:?}"
    );
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "RETRY_EXC_ERR after {took:?}"
    );

    // Daemon A serves a new program on the same socket; the dead
    // program's QP is gone.
    let (ctx, conn) = common::open(daemon_a.socket());
    let pd = Pd::alloc(&ctx).expect("ALLOC_PD for the new program");
    let cq = Cq::new(&ctx, 16).expect("CREATE_CQ");
    let qp = rc_qp(&pd, &cq);
    assert_ne!(qp.qp_num(), old_qpn, "QP numbers are not reused at once");
    let q = abi::Handle {
        handle: old_qpn,
        ..Default::default()
    };
    match conn.command(abi::CMD_QUERY_QP, q.as_bytes()) {
        Err(TransportError::Status { status, .. }) => {
            assert_eq!(status, abi::STATUS_ENOENT, "the dead program's QP is gone")
        }
        other => panic!("QUERY_QP of the dead program's QP: {other:?}"),
    }
    drop((qp, cq, pd, ctx, conn, src));
    let ba = daemon_a.stop(WAIT).expect("daemon A stops");
    b.close().stop(WAIT).expect("daemon B stops");
    assert_eq!(ba.mapped_regions(), 0, "no guest memory kept mapped");
}

/// One thread driving two devices (as `vrnic-soak` does) sleeps on both
/// contexts' event descriptors at once: with both CQs armed, a SEND from
/// A to B raises a completion event on each side, and
/// `common::wait_events` returns them.
#[test]
fn wait_events_wakes_on_either_of_two_programs() {
    let (mut a, mut b) = connected_pair();
    let len = 100;
    let src = buffer(&a.pd, len, &pattern(len, 5));
    let dst = buffer(&b.pd, len, &[]);
    recv(&mut b.qp, 1, Some(dst.sge(0, len)));
    // Nothing is armed yet: nothing comes.
    let none = common::wait_events(&[&a.ctx, &b.ctx], Duration::from_millis(50));
    assert!(none.is_empty(), "{none:?}");
    a.cq.req_notify(false).expect("arm A");
    b.cq.req_notify(false).expect("arm B");
    send(&mut a.qp, 2, src.sge(0, len));
    let mut sides = std::collections::BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while sides.len() < 2 && Instant::now() < deadline {
        for (i, ev) in common::wait_events(&[&a.ctx, &b.ctx], WAIT) {
            assert_eq!(ev.kind, abi::EV_COMP, "{ev:?}");
            sides.insert(i);
        }
    }
    assert_eq!(sides.len(), 2, "a completion event from each program");
    assert_eq!(cqe(&mut a).status, abi::WC_SUCCESS);
    assert_eq!(cqe(&mut b).status, abi::WC_SUCCESS);
    drop((src, dst));
    shut_down(a, b);
}
