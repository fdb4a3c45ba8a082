//! The agent's connection manager in the vhost-user memory mode
//! (`MODE_FILE`, issue 31): `vrnic-agent --vhost-user` serves a function of
//! an in-process daemon whose link reflects every frame, so the function
//! reaches itself. The agent's connection manager thread opens its own
//! context (with QP1) through the agent as a program with a memory file;
//! this process connects to itself through it with raw rdma_ucm commands
//! (rping's sequence, listener and client on one function), a SEND crosses,
//! and both ends disconnect.

mod common;
#[path = "../../tests/ucma_common/mod.rs"]
mod ucma_common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::{agent_bin, AgentDir, Reaped, Reflector};
use ucma_common::*;
use vrnic::link::MemLink;
use vrnic_frontend::{test_device_config, TestDaemon};
use vrnic_guest::agent::client::AgentTransport;
use vrnic_guest::agent::ucma::abi as u;
use vrnic_guest::agent::ucma::core::event;
use vrnic_guest::agent::ucma::proto::UcmaConn;
use vrnic_guest::verbs::*;

const PORT: u16 = 7174;

#[test]
fn rping_sequence_to_itself_through_an_agent_over_vhost_user() {
    let (link, peer) = MemLink::pair();
    let _reflector = Reflector::start(peer);
    let daemon =
        TestDaemon::with_device(test_device_config(), Box::new(link)).expect("the daemon starts");
    let dir = AgentDir::new("ucma");
    let sock = dir.tmp.join("agent.sock");
    let log = std::fs::File::create(dir.tmp.join("agent.log")).unwrap();
    let child = Command::new(agent_bin())
        .arg("--vhost-user")
        .arg(daemon.socket())
        .arg("--socket")
        .arg(&sock)
        .args(["--rt", "0", "--linger", "0"])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("vrnic-agent starts");
    let _agent = Reaped(Some(child));
    // The agent listens once it holds the function (bounded).
    let deadline = Instant::now() + DEADLINE;
    let server = loop {
        match UcmaConn::connect(&sock) {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "no agent at {sock:?}: {e}");
                std::thread::yield_now();
            }
        }
    };
    let client = UcmaConn::connect(&sock).expect("a second channel");
    let t = AgentTransport::connect(&sock).expect("verbs through the agent");
    let ctx = Context::open(Box::new(t)).expect("context");
    let pd = Pd::alloc(&ctx).unwrap();
    let mr = Mr::alloc(&pd, 8192, ACCESS_LOCAL_WRITE).unwrap();
    let mut cq = Cq::new(&ctx, 16).unwrap();
    let ip = ctx
        .query_gid(1, 1)
        .unwrap()
        .to_ipv4_mapped()
        .expect("an IPv4 GID");
    let qp = |pd: &Pd, cq: &Cq| {
        Qp::new(
            pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
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
    };

    let lid = create_id(&server, 0x5);
    ok(
        &server,
        u::RDMA_USER_CM_CMD_BIND,
        &bind_body(lid, format!("0.0.0.0:{PORT}").parse().unwrap()),
        0,
    );
    listen(&server, lid, 1);
    let cid = create_id(&client, 0xc);
    let dst: SocketAddr = format!("{ip}:{PORT}").parse().unwrap();
    resolve_addr(&client, cid, dst);
    assert_eq!(get_event(&client).event, event::ADDR_RESOLVED);
    resolve_route(&client, cid);
    assert_eq!(get_event(&client).event, event::ROUTE_RESOLVED);
    let mut qa = qp(&pd, &cq);
    modify(&client, cid, &mut qa, QpState::Init);
    assert_eq!(connect(&client, cid, qa.qp_num(), b"self"), 296);
    let e = get_event(&server);
    assert_eq!(
        (e.event, e.uid, e.qp_num),
        (event::CONNECT_REQUEST, 0x5, qa.qp_num())
    );
    assert_eq!(&e.private_data[..4], b"self");
    let sid = e.id;
    let mut qb = qp(&pd, &cq);
    for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
        modify(&server, sid, &mut qb, st);
    }
    accept(&server, sid, 0x6, Some((qb.qp_num(), &[])));
    let e = get_event(&client);
    assert_eq!((e.event, e.qp_num), (event::CONNECT_RESPONSE, qb.qp_num()));
    modify(&client, cid, &mut qa, QpState::Rtr);
    modify(&client, cid, &mut qa, QpState::Rts);
    accept(&client, cid, 0, None);
    let e = get_event(&server);
    assert_eq!((e.event, e.id, e.uid), (event::ESTABLISHED, sid, 0x6));

    // A SEND from one QP to the other.
    let msg: Vec<u8> = (0..300).map(|i| (i * 7 + 5) as u8).collect();
    mr.write(0, &msg);
    mr.write(4096, &[0; 300]);
    qb.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: &[mr.sge(4096, 300)],
    })
    .unwrap();
    qa.post_send(&SendWr {
        wr_id: 2,
        opcode: WrOpcode::Send,
        send_flags: SEND_SIGNALED,
        sg_list: &[mr.sge(0, 300)],
        ..Default::default()
    })
    .unwrap();
    let wc = cq.poll_wait(2, DEADLINE);
    assert!(wc.len() == 2 && wc.iter().all(|w| w.is_success()), "{wc:?}");
    assert_eq!(&mr.to_vec()[4096..4096 + 300], &msg[..]);

    assert_eq!(simple(&client, u::RDMA_USER_CM_CMD_DISCONNECT, cid), 12);
    assert_eq!(get_event(&server).event, event::DISCONNECTED);
    assert_eq!(simple(&server, u::RDMA_USER_CM_CMD_DISCONNECT, sid), 12);
    assert_eq!(get_event(&client).event, event::DISCONNECTED);
    destroy_id(&client, cid);
    destroy_id(&server, sid);
    destroy_id(&server, lid);
    no_event(&client);
    no_event(&server);
}
