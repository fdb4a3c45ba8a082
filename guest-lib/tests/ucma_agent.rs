//! The agent's connection manager service (issue 31) end to end: two
//! in-process devices on one link, an agent serving each, and on each side
//! a program that speaks rdma_ucm to its agent with raw commands
//! ([`UcmaConn`], what vrnic's `librdmacm.so.1` sends) and does its verbs
//! through the same agent (`AgentTransport`): rping's sequence, a SEND
//! over the connection, the disconnect; a connect to a port nobody
//! listens on, a rejected request, a channel closed mid-connection, and
//! hostile commands.

mod ucma_agents;
mod ucma_common;
mod verbs_common;

use std::net::SocketAddr;
use std::time::Instant;

use ucma_agents::{agent, prog, AgentThread, Prog};
use ucma_common::*;
use vrnic::link::mem::MemLink;
use vrnic_guest::agent::ucma::abi as u;
use vrnic_guest::agent::ucma::core::event;
use vrnic_guest::agent::ucma::proto::UcmaConn;
use vrnic_guest::agent::ucma::service::UcmaStats;
use vrnic_guest::agent::ucma::sockaddr;
use vrnic_guest::verbs::*;

fn two_agents() -> (tempdir::Dir, AgentThread, AgentThread) {
    let dir = tempdir::Dir::new();
    let (la, lb) = MemLink::pair();
    let a = agent(&dir.0, 1, la);
    let b = agent(&dir.0, 2, lb);
    (dir, a, b)
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!(
                "vrnic-ucma-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn rc_qp(p: &Prog) -> Qp {
    new_qp(p, QpType::Rc)
}

fn new_qp(p: &Prog, qp_type: QpType) -> Qp {
    Qp::new(
        &p.pd,
        &QpInitAttr {
            qp_type,
            send_cq: &p.cq,
            recv_cq: &p.cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        },
    )
    .expect("RC QP")
}

const PORT: u16 = 7174;

/// Waits (bounded) until agent `a`'s service holds nothing: no channel, id
/// or connection, and its device context closed.
fn wait_service_empty(a: &AgentThread) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = *a.ucma.lock().unwrap();
        if s == (UcmaStats {
            events_dropped: s.events_dropped,
            bad_connections: s.bad_connections,
            ..Default::default()
        }) {
            return;
        }
        assert!(Instant::now() < deadline, "the service still holds {s:?}");
        std::thread::yield_now();
    }
}

/// Server listening on 10.0.0.2:PORT (B), client resolved to it (A):
/// returns the listener and the client's id.
fn listen_and_resolve(a: &Prog, b: &Prog) -> (u32, u32) {
    let lid = create_id(&b.ch, 0xb0);
    ok(
        &b.ch,
        u::RDMA_USER_CM_CMD_BIND,
        &bind_body(lid, format!("0.0.0.0:{PORT}").parse().unwrap()),
        0,
    );
    listen(&b.ch, lid, 4);
    let cid = create_id(&a.ch, 0xa0);
    resolve_addr(&a.ch, cid, format!("10.0.0.2:{PORT}").parse().unwrap());
    let e = get_event(&a.ch);
    assert_eq!(
        (e.event, e.status, e.id, e.uid),
        (event::ADDR_RESOLVED, 0, cid, 0xa0)
    );
    resolve_route(&a.ch, cid);
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.status), (event::ROUTE_RESOLVED, 0));
    (lid, cid)
}

#[test]
fn rping_sequence_over_two_agents() {
    let (_dir, aa, ab) = two_agents();
    let (mut a, mut b) = (prog(&aa), prog(&ab));
    let (lid, cid) = listen_and_resolve(&a, &b);

    // QUERY_ROUTE after the route: the device, the path, the addresses.
    let mut q = [0u8; 16];
    q[8..12].copy_from_slice(&cid.to_ne_bytes());
    let r = ok(&a.ch, u::RDMA_USER_CM_CMD_QUERY_ROUTE, &q, 208);
    let dev = a.ctx.query_device().unwrap();
    assert_eq!(&r[0..8], &dev.node_guid, "node GUID as ibv_query_device");
    assert_eq!(u32_at(&r, 192), 1, "one path");
    assert_eq!(
        &r[8 + 16..8 + 32],
        &a.ctx.query_gid(1, 1).unwrap().raw,
        "sgid"
    );
    assert_eq!(
        sockaddr::parse(&r[164..192]).unwrap(),
        format!("10.0.0.2:{PORT}").parse::<SocketAddr>().unwrap()
    );

    // Active: QP, INIT from the agent, CONNECT with private data.
    let mut qa = rc_qp(&a);
    modify(&a.ch, cid, &mut qa, QpState::Init);
    assert_eq!(connect(&a.ch, cid, qa.qp_num(), b"hello"), 288 + 8);
    // No RTR attributes before the REP (cm.c: -EINVAL in REQ sent).
    let mut q = [0u8; 16];
    q[8..12].copy_from_slice(&cid.to_ne_bytes());
    q[12..16].copy_from_slice(&2u32.to_ne_bytes());
    assert_eq!(
        call(&a.ch, u::RDMA_USER_CM_CMD_INIT_QP_ATTR, &q, &[], 144).0,
        -libc::EINVAL
    );

    // Passive: CONNECT_REQUEST with a new id, the listener's uid.
    let e = get_event(&b.ch);
    assert_eq!(
        (e.event, e.status, e.uid),
        (event::CONNECT_REQUEST, 0, 0xb0)
    );
    assert_ne!(e.id, lid);
    assert_eq!(e.qp_num, qa.qp_num());
    assert_eq!(&e.private_data[..5], b"hello");
    assert_eq!(e.private_data.len(), 56);
    let sid = e.id;
    let mut qb = rc_qp(&b);
    modify(&b.ch, sid, &mut qb, QpState::Init);
    modify(&b.ch, sid, &mut qb, QpState::Rtr);
    modify(&b.ch, sid, &mut qb, QpState::Rts);
    accept(&b.ch, sid, 0xb1, Some((qb.qp_num(), b"welcome")));

    // Active: CONNECT_RESPONSE, RTR/RTS from the agent, ACCEPT → RTU.
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.status, e.id), (event::CONNECT_RESPONSE, 0, cid));
    assert_eq!(e.qp_num, qb.qp_num());
    assert_eq!(&e.private_data[..7], b"welcome");
    modify(&a.ch, cid, &mut qa, QpState::Rtr);
    modify(&a.ch, cid, &mut qa, QpState::Rts);
    accept(&a.ch, cid, 0, None);
    let e = get_event(&b.ch);
    assert_eq!(
        (e.event, e.status, e.id, e.uid),
        (event::ESTABLISHED, 0, sid, 0xb1)
    );

    // A SEND crosses intact.
    let msg: Vec<u8> = (0..512).map(|i| (i * 13 + 1) as u8).collect();
    a.mr.write(0, &msg);
    b.mr.fill(0);
    qb.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[b.mr.sge(0, 512)],
    })
    .unwrap();
    qa.post_send(&SendWr {
        wr_id: 2,
        opcode: WrOpcode::Send,
        send_flags: SEND_SIGNALED,
        sg_list: &[a.mr.sge(0, 512)],
        ..Default::default()
    })
    .unwrap();
    let s = a.cq.poll_wait(1, DEADLINE);
    assert!(s.len() == 1 && s[0].is_success(), "{s:?}");
    let r = b.cq.poll_wait(1, DEADLINE);
    assert!(r.len() == 1 && r[0].is_success(), "{r:?}");
    assert_eq!(&b.mr.to_vec()[..512], &msg[..]);

    // DISCONNECT from A: DREQ; B: DISCONNECTED, its DISCONNECT → DREP; A:
    // DISCONNECTED.
    assert_eq!(simple(&a.ch, u::RDMA_USER_CM_CMD_DISCONNECT, cid), 12);
    let e = get_event(&b.ch);
    assert_eq!((e.event, e.id), (event::DISCONNECTED, sid));
    assert_eq!(simple(&b.ch, u::RDMA_USER_CM_CMD_DISCONNECT, sid), 12);
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.id), (event::DISCONNECTED, cid));
    // Timewait ends on both sides (cm.c: 2 · 4.096 µs · 2^19 ≈ 2 s).
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.id), (event::TIMEWAIT_EXIT, cid));
    let e = get_event(&b.ch);
    assert_eq!((e.event, e.id), (event::TIMEWAIT_EXIT, sid));

    // DESTROY_ID reports the events each id had.
    assert_eq!(destroy_id(&a.ch, cid), 5);
    assert_eq!(destroy_id(&b.ch, sid), 3);
    assert_eq!(destroy_id(&b.ch, lid), 1);
    no_event(&a.ch);
    no_event(&b.ch);
    let s = *aa.ucma.lock().unwrap();
    assert!(s.device_open && s.events_dropped == 0, "{s:?}");
    drop(qa);
    drop(qb);
    drop(a);
    drop(b);
    // Nothing left: ids, connections, channels, and the QP1 context.
    wait_service_empty(&aa);
    wait_service_empty(&ab);
}

#[test]
fn connect_to_a_port_nobody_listens_on_is_rejected() {
    let (_dir, aa, ab) = two_agents();
    let (a, b) = (prog(&aa), prog(&ab));
    let (lid, cid) = listen_and_resolve(&a, &b);
    // Another port: no IB CM listener for its service ID → REJ 8.
    let c2 = create_id(&a.ch, 0xa2);
    resolve_addr(&a.ch, c2, "10.0.0.2:9999".parse().unwrap());
    assert_eq!(get_event(&a.ch).event, event::ADDR_RESOLVED);
    resolve_route(&a.ch, c2);
    assert_eq!(get_event(&a.ch).event, event::ROUTE_RESOLVED);
    let qa = rc_qp(&a);
    assert_eq!(connect(&a.ch, c2, qa.qp_num(), &[]), 296);
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.status, e.id), (event::REJECTED, 8, c2));

    // The listened port, but the consumer rejects: REJ 28 with its data.
    assert_eq!(connect(&a.ch, cid, qa.qp_num(), &[]), 296);
    let e = get_event(&b.ch);
    assert_eq!(e.event, event::CONNECT_REQUEST);
    let mut rej = [0u8; 264];
    rej[0..4].copy_from_slice(&e.id.to_ne_bytes());
    rej[4] = 3;
    rej[8..11].copy_from_slice(b"no!");
    ok(&b.ch, u::RDMA_USER_CM_CMD_REJECT, &rej, 0);
    let e2 = get_event(&a.ch);
    assert_eq!((e2.event, e2.status, e2.id), (event::REJECTED, 28, cid));
    assert_eq!(&e2.private_data[..3], b"no!");
    for id in [c2, cid] {
        destroy_id(&a.ch, id);
    }
    destroy_id(&b.ch, e.id);
    destroy_id(&b.ch, lid);
}

#[test]
fn a_channel_closed_mid_connection_is_cleaned_up() {
    let (_dir, aa, ab) = two_agents();
    let (a, b) = (prog(&aa), prog(&ab));
    let (_lid, cid) = listen_and_resolve(&a, &b);
    let qa = rc_qp(&a);
    assert_eq!(connect(&a.ch, cid, qa.qp_num(), &[]), 296);
    let e = get_event(&b.ch);
    assert_eq!(e.event, event::CONNECT_REQUEST);
    // B's program goes away with the request unanswered: its ids are
    // destroyed, the REQ rejected (cm_destroy_id: REJ consumer defined).
    let Prog { ch, .. } = b;
    drop(ch);
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.status, e.id), (event::REJECTED, 28, cid));
    destroy_id(&a.ch, cid);
    drop(a);
    wait_service_empty(&aa);
    wait_service_empty(&ab);
}

#[test]
fn hostile_commands_get_errnos_and_garbage_closes() {
    let (_dir, aa, _ab) = two_agents();
    let a = prog(&aa);
    let c = &a.ch;
    // Unknown command, truncated bodies, unknown id, bad family.
    assert_eq!(call(c, 99, &[0; 8], &[], 0).0, -libc::EINVAL);
    assert_eq!(
        call(c, u::RDMA_USER_CM_CMD_CREATE_ID, &[0; 3], &[], 4).0,
        -libc::EINVAL
    );
    assert_eq!(
        call(c, u::RDMA_USER_CM_CMD_DESTROY_ID, &[0; 16], &[], 4).0,
        -libc::ENOENT
    );
    assert_eq!(
        call(c, u::RDMA_USER_CM_CMD_JOIN_MCAST, &[0; 8], &[], 0).0,
        -libc::ENOSYS
    );
    let id = create_id(c, 1);
    let mut b = bind_body(id, "10.0.0.1:1".parse().unwrap());
    b[8..10].copy_from_slice(&27u16.to_ne_bytes());
    assert_eq!(
        call(c, u::RDMA_USER_CM_CMD_BIND, &b, &[], 0).0,
        -libc::EAFNOSUPPORT
    );
    // Not the function's address.
    let b = bind_body(id, "10.9.9.9:1".parse().unwrap());
    assert_eq!(
        call(c, u::RDMA_USER_CM_CMD_BIND, &b, &[], 0).0,
        -libc::EADDRNOTAVAIL
    );
    // Port in use.
    let b = bind_body(id, "10.0.0.1:5000".parse().unwrap());
    ok(c, u::RDMA_USER_CM_CMD_BIND, &b, 0);
    let id2 = create_id(c, 2);
    let b = bind_body(id2, "10.0.0.1:5000".parse().unwrap());
    assert_eq!(
        call(c, u::RDMA_USER_CM_CMD_BIND, &b, &[], 0).0,
        -libc::EADDRINUSE
    );
    // RESOLVE_ROUTE before the address: EINVAL.
    assert_eq!(
        simple(c, u::RDMA_USER_CM_CMD_RESOLVE_ROUTE, id2),
        -libc::EINVAL
    );
    // Another channel's id: EINVAL.
    let c2 = UcmaConn::connect(&aa.path).unwrap();
    let mut d = [0u8; 16];
    d[8..12].copy_from_slice(&id.to_ne_bytes());
    assert_eq!(
        call(&c2, u::RDMA_USER_CM_CMD_DESTROY_ID, &d, &[], 4).0,
        -libc::EINVAL
    );
    // MIGRATE_ID moves it; then it is c2's.
    let mut m = [0u8; 16];
    m[8..12].copy_from_slice(&id.to_ne_bytes());
    m[12..16].copy_from_slice(&c.channel.to_ne_bytes());
    assert_eq!(call(&c2, u::RDMA_USER_CM_CMD_MIGRATE_ID, &m, &[], 4).0, 24);
    assert_eq!(call(&c2, u::RDMA_USER_CM_CMD_DESTROY_ID, &d, &[], 4).0, 24);
    // Garbage closes the connection.
    let raw = vrnic_guest::agent::proto::connect(&aa.path).unwrap();
    vrnic_guest::agent::proto::send(
        std::os::fd::AsRawFd::as_raw_fd(&raw),
        &vrnic_guest::agent::ucma::proto::hello(),
        &[],
        0,
    )
    .unwrap();
    let mut buf = [0u8; 64];
    assert!(vrnic_guest::agent::proto::wait_readable(
        std::os::fd::AsRawFd::as_raw_fd(&raw),
        DEADLINE
    )
    .unwrap());
    let _ = vrnic_guest::agent::proto::recv(std::os::fd::AsRawFd::as_raw_fd(&raw), &mut buf, 0);
    vrnic_guest::agent::proto::send(std::os::fd::AsRawFd::as_raw_fd(&raw), &[0xee; 7], &[], 0)
        .unwrap();
    assert!(vrnic_guest::agent::proto::wait_readable(
        std::os::fd::AsRawFd::as_raw_fd(&raw),
        DEADLINE
    )
    .unwrap());
    let (n, _) =
        vrnic_guest::agent::proto::recv(std::os::fd::AsRawFd::as_raw_fd(&raw), &mut buf, 0)
            .unwrap();
    assert_eq!(n, 0, "closed");
    // Counted once the service's round ends (bounded wait).
    let deadline = Instant::now() + DEADLINE;
    while aa.ucma.lock().unwrap().bad_connections != 1 {
        assert!(Instant::now() < deadline, "the garbage was not counted");
        std::thread::yield_now();
    }
    // The channel still works.
    destroy_id(c, id2);
}

#[test]
fn ud_service_resolved_by_sidr_carries_a_datagram() {
    let (_dir, aa, ab) = two_agents();
    let (mut a, mut b) = (prog(&aa), prog(&ab));
    let ps = u::RDMA_PS_UDP as u16;
    let lid = create_id_ps(&b.ch, 0xb0, ps, 4);
    ok(
        &b.ch,
        u::RDMA_USER_CM_CMD_BIND,
        &bind_body(lid, "10.0.0.2:7000".parse().unwrap()),
        0,
    );
    listen(&b.ch, lid, 0);
    let cid = create_id_ps(&a.ch, 0xa0, ps, 4);
    resolve_addr(&a.ch, cid, "10.0.0.2:7000".parse().unwrap());
    assert_eq!(get_event(&a.ch).event, event::ADDR_RESOLVED);
    resolve_route(&a.ch, cid);
    assert_eq!(get_event(&a.ch).event, event::ROUTE_RESOLVED);

    // Both UD QPs to RTS: INIT from the agent (RDMA_UDP_QKEY), as
    // librdmacm's ucma_init_ud_qp.
    let mut qa = new_qp(&a, QpType::Ud);
    let mut qb = new_qp(&b, QpType::Ud);
    for (c, id, q) in [(&a.ch, cid, &mut qa), (&b.ch, lid, &mut qb)] {
        modify(c, id, q, QpState::Init);
        let mut at = QpAttr {
            qp_state: QpState::Rtr,
            ..Default::default()
        };
        q.modify(&at, QP_ATTR_STATE).unwrap();
        at.qp_state = QpState::Rts;
        q.modify(&at, QP_ATTR_STATE | QP_ATTR_SQ_PSN).unwrap();
    }

    // SIDR_REQ → CONNECT_REQUEST (UD) → ACCEPT → SIDR_REP → ESTABLISHED.
    assert_eq!(connect(&a.ch, cid, qa.qp_num(), b"ud?"), 296);
    let e = get_event(&b.ch);
    assert_eq!((e.event, e.uid), (event::CONNECT_REQUEST, 0xb0));
    assert_eq!(e.param[296], 180, "SIDR_REQ private data after the header");
    assert_eq!(&e.param[40..43], b"ud?");
    accept(&b.ch, e.id, 0xb1, Some((qb.qp_num(), b"ud!")));
    let e2 = get_event(&a.ch);
    assert_eq!((e2.event, e2.status, e2.id), (event::ESTABLISHED, 0, cid));
    assert_eq!(u32_at(&e2.param, 0), qb.qp_num());
    let qkey = u32_at(&e2.param, 4);
    assert_eq!(qkey, 0x0123_4567);
    assert_eq!(&e2.param[40..43], b"ud!");
    let ah = &e2.param[8..40];
    assert_eq!(&ah[0..16], &b.ctx.query_gid(1, 1).unwrap().raw, "AH to B");

    // A datagram crosses with that AH, QPN and Q_Key.
    let ah = Ah::new(
        &a.pd,
        &AhAttr {
            dgid: Gid {
                raw: ah[0..16].try_into().unwrap(),
            },
            sgid_index: ah[20],
            hop_limit: ah[21],
            is_global: true,
            port_num: 1,
            ..Default::default()
        },
    )
    .unwrap();
    a.mr.write(0, b"datagram");
    b.mr.fill(0);
    qb.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[b.mr.sge(0, GRH_LEN + 8)],
    })
    .unwrap();
    qa.post_send(&SendWr {
        wr_id: 2,
        opcode: WrOpcode::Send,
        send_flags: SEND_SIGNALED,
        sg_list: &[a.mr.sge(0, 8)],
        ud: UdWr {
            ah: ah.handle(),
            remote_qpn: u32_at(&e2.param, 0),
            remote_qkey: qkey,
        },
        ..Default::default()
    })
    .unwrap();
    let s = a.cq.poll_wait(1, DEADLINE);
    assert!(s.len() == 1 && s[0].is_success(), "{s:?}");
    let r = b.cq.poll_wait(1, DEADLINE);
    assert!(r.len() == 1 && r[0].is_success(), "{r:?}");
    assert_eq!(&b.mr.to_vec()[GRH_LEN..GRH_LEN + 8], b"datagram");

    // A SIDR_REQ to a UDP port nobody listens on: UNREACHABLE with the
    // SIDR_REP's status (IB_SIDR_UNSUPPORTED, 1).
    let c2 = create_id_ps(&a.ch, 0xa2, ps, 4);
    resolve_addr(&a.ch, c2, "10.0.0.2:7001".parse().unwrap());
    assert_eq!(get_event(&a.ch).event, event::ADDR_RESOLVED);
    resolve_route(&a.ch, c2);
    assert_eq!(get_event(&a.ch).event, event::ROUTE_RESOLVED);
    assert_eq!(connect(&a.ch, c2, qa.qp_num(), &[]), 296);
    let e3 = get_event(&a.ch);
    assert_eq!((e3.event, e3.status, e3.id), (event::UNREACHABLE, 1, c2));
    drop(ah);
    drop(qa);
    drop(qb);
    drop(a);
    drop(b);
    wait_service_empty(&aa);
    wait_service_empty(&ab);
}
