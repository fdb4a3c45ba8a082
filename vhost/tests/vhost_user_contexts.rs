//! Several device opens in one process over its one vhost-user connection
//! ([`VhostUserContext`]: a device context per open, issue 30 point 1),
//! against real daemons: two daemons on the ends of a `MemLink` pair, two
//! contexts on daemon A, one on daemon B. The contexts on A share the
//! connection, name only their own objects, get only their own events, and
//! one closes while the other goes on; the last close ends the connection,
//! and the next open connects anew. Every wait is bounded
//! (`common::WAIT`).

mod common;

use std::net::Ipv4Addr;

use common::{buffer, connect_rc, gid, pattern, rc_qp, recv, send, wait_cq, wait_events, Peer};
use vrnic::abi::{self, command};
use vrnic::device::DeviceConfig;
use vrnic::link::MemLink;
use vrnic_frontend::TestDaemon;
use vrnic_guest::transport::{Transport, TransportError};
use vrnic_guest::verbs::*;
use vrnic_guest::vhost_user::VhostUserContext;
use vrnic_vhost::addr::Mac;

fn config(n: u8) -> DeviceConfig {
    let ip = Ipv4Addr::new(10, 0, 0, n);
    DeviceConfig {
        mac: Mac::from_ipv4(ip).0,
        ipv4: ip,
        prefix_len: 24,
        ipv6: Vec::new(),
        link_mtu: 1500,
    }
}

fn open(daemon: &TestDaemon) -> VhostUserContext {
    VhostUserContext::open(daemon.socket())
        .unwrap_or_else(|e| panic!("a context on {}: {e}", daemon.socket().display()))
}

#[test]
fn contexts_share_the_connection_and_name_only_their_own_objects() {
    let (la, _lb) = MemLink::pair();
    let da = TestDaemon::with_device(config(1), Box::new(la)).expect("daemon A");
    let mut a1 = open(&da);
    let mut a2 = open(&da);
    assert_ne!(a1.ctx(), a2.ctx(), "two opens, two contexts");
    assert_ne!(a1.ctx(), abi::DEFAULT_CTX);
    assert_eq!(a1.contexts(), 2, "one connection carries both");
    assert_ne!(a1.event_fd(), a2.event_fd(), "an event descriptor each");

    let t1: &mut dyn Transport = &mut a1;
    let (pd, _) = t1
        .execute::<command::AllocPd>(&())
        .expect("ALLOC_PD in context 1");
    let t2: &mut dyn Transport = &mut a2;
    match t2.execute::<command::DeallocPd>(&pd) {
        Err(TransportError::Status { status, .. }) => {
            assert_eq!(status, abi::STATUS_ENOENT, "context 1's PD in context 2")
        }
        other => panic!("context 2 freed context 1's PD: {other:?}"),
    }
    // A context names only itself.
    let mut resp = [0u8; abi::MAX_CMD_BODY];
    assert!(matches!(
        a2.command_in(a1.ctx(), abi::CMD_QUERY_DEVICE, &[], &mut resp),
        Err(TransportError::Status {
            status: abi::STATUS_EOPNOTSUPP,
            ..
        })
    ));

    // Context 2 goes (with a PD of its own: closing destroys it); 1 goes on.
    let t2: &mut dyn Transport = &mut a2;
    t2.execute::<command::AllocPd>(&())
        .expect("ALLOC_PD in context 2");
    drop(a2);
    assert_eq!(a1.contexts(), 1);
    let t1: &mut dyn Transport = &mut a1;
    t1.execute::<command::DeallocPd>(&pd)
        .expect("context 1's PD after context 2 closed");
    t1.execute::<command::QueryDevice>(&())
        .expect("QUERY_DEVICE");
    assert!(a1.is_connected());

    // The last close ends the connection; the next open connects anew.
    drop(a1);
    let a3 = open(&da);
    assert_eq!(a3.contexts(), 1);
    assert!(a3.is_connected());
}

#[test]
fn each_context_gets_only_its_own_events_and_data() {
    let (la, lb) = MemLink::pair();
    let da = TestDaemon::with_device(config(1), Box::new(la)).expect("daemon A");
    let db = TestDaemon::with_device(config(2), Box::new(lb)).expect("daemon B");
    let a1 = Context::open(Box::new(open(&da))).expect("context A1");
    let a2 = Context::open(Box::new(open(&da))).expect("context A2");
    let b = Context::open(Box::new(open(&db))).expect("context B");

    let (pd1, pd2, pdb) = (
        Pd::alloc(&a1).expect("PD"),
        Pd::alloc(&a2).expect("PD"),
        Pd::alloc(&b).expect("PD"),
    );
    let (mut cq1, mut cq2, mut cqb) = (
        Cq::new(&a1, 16).expect("CQ"),
        Cq::new(&a2, 16).expect("CQ"),
        Cq::new(&b, 16).expect("CQ"),
    );
    let (mut q1, mut q2) = (rc_qp(&pd1, &cq1), rc_qp(&pd2, &cq2));
    let (mut qb1, mut qb2) = (rc_qp(&pdb, &cqb), rc_qp(&pdb, &cqb));
    let peer = |ctx: &Context, qp: &Qp, psn: u32| Peer {
        gid: gid(ctx),
        qpn: qp.qp_num(),
        psn,
    };
    connect_rc(&mut q1, peer(&b, &qb1, 100), 1);
    connect_rc(&mut qb1, peer(&a1, &q1, 1), 100);
    connect_rc(&mut q2, peer(&b, &qb2, 200), 2);
    connect_rc(&mut qb2, peer(&a2, &q2, 2), 200);

    let m1 = buffer(&pd1, 4096, &[]);
    let m2 = buffer(&pd2, 4096, &[]);
    let mb = buffer(&pdb, 8192, &pattern(8192, 9));
    for (round, (mr, q, qb, cq)) in [
        (&m1, &mut q1, &mut qb1, &mut cq1),
        (&m2, &mut q2, &mut qb2, &mut cq2),
    ]
    .into_iter()
    .enumerate()
    {
        cq.req_notify(false).expect("arm");
        recv(q, 1, Some(mr.sge(0, 4096)));
        send(qb, 2, mb.sge(round * 4096, 4096));
        assert_eq!(wait_cq(&mut cqb, "B's SEND").status_str(), "success");
        let wc = wait_cq(cq, "the receive");
        assert_eq!(wc.status_str(), "success", "{wc:?}");
        assert_eq!(
            mr.to_vec(),
            pattern(8192, 9)[round * 4096..][..4096].to_vec()
        );
    }
    // Each receive's completion event went to its own context only.
    let mut got = Vec::new();
    while got.len() < 2 {
        let evs = wait_events(&[&a1, &a2], common::WAIT);
        assert!(!evs.is_empty(), "events so far: {got:?}");
        got.extend(evs);
    }
    assert_eq!(
        got,
        vec![
            (
                0,
                abi::Event {
                    kind: abi::EV_COMP,
                    ctx: got[0].1.ctx,
                    handle: cq1.cqn(),
                    ..Default::default()
                }
            ),
            (
                1,
                abi::Event {
                    kind: abi::EV_COMP,
                    ctx: got[1].1.ctx,
                    handle: cq2.cqn(),
                    ..Default::default()
                }
            ),
        ],
        "one completion event each, on its own context"
    );
    assert_ne!(got[0].1.ctx, got[1].1.ctx);
}
