//! Hostile CM traffic (issue 31, point 6): two agents with an established
//! rdma_cm connection over in-process devices, and a stranger on the same
//! link (a hub of three `MemLink` ports; the stranger also sees every frame,
//! so it knows the connection's comm IDs, CA GUIDs and QPNs) injecting
//! RoCEv2 frames that carry CM MADs to QP 1: forged REJ, DREQ, RTU, DREP,
//! REP, MRA and a stale REQ with guessed and with the right comm IDs from
//! its own GID; a REQ flood from many addresses; truncated, oversized and
//! garbage MADs; MADs with a wrong Q_Key or P_Key spoofed from the peer.
//! After each class the connection still carries a SEND intact, a new
//! connection is made where the class targets the listener, DISCONNECT
//! works, and both agents' tables drain to empty.

mod ucma_agents;
mod ucma_common;
mod verbs_common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ucma_agents::{agent, prog, AgentThread, Prog};
use ucma_common::*;
use vrnic::link::mem::MemLink;
use vrnic::link::Link;
use vrnic_guest::agent::ucma::abi as u;
use vrnic_guest::agent::ucma::core::event;
use vrnic_guest::agent::ucma::service::UcmaStats;
use vrnic_guest::verbs::*;
use vrnic_wire::{
    private_data_len, rej_reason, Bth, CmDrep, CmDreq, CmMessage, CmMra, CmRej, CmRep, CmReq,
    CmRtu, Deth, Frame, Mad, Opcode, RoceHeaders,
};

const PORT: u16 = 7174;
const STRANGER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 77];
const STRANGER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 77);

fn mac(n: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, n]
}

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

/// A hub of three ports (A, B, the stranger): frames go to the port that
/// sent from their destination MAC, floods otherwise, and the stranger
/// also gets a copy of everything (it sniffs).
struct Hub {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn hub(mut ports: [MemLink; 3]) -> Hub {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut learned: Vec<([u8; 6], usize)> = Vec::new();
        let mut buf = vec![0u8; 16384];
        while !s.load(Ordering::Relaxed) {
            let mut idle = true;
            for i in 0..3 {
                for _ in 0..64 {
                    let Ok(Some(n)) = ports[i].recv(&mut buf) else {
                        break;
                    };
                    idle = false;
                    let f = &buf[..n];
                    if n < 14 {
                        continue;
                    }
                    let src: [u8; 6] = f[6..12].try_into().unwrap();
                    if i != 2 && !learned.iter().any(|(m, _)| *m == src) {
                        learned.push((src, i));
                    }
                    let dst: [u8; 6] = f[0..6].try_into().unwrap();
                    let to = learned.iter().find(|(m, _)| *m == dst).map(|(_, p)| *p);
                    for (j, p) in ports.iter_mut().enumerate() {
                        let fwd = match to {
                            Some(t) => j == t || j == 2,
                            None => true,
                        };
                        if j != i && fwd {
                            let _ = p.send(f);
                        }
                    }
                }
            }
            if idle {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    });
    Hub {
        stop,
        thread: Some(thread),
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "vrnic-ucma-hostile-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn rc_qp(p: &Prog) -> Qp {
    Qp::new(
        &p.pd,
        &QpInitAttr {
            qp_type: QpType::Rc,
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

/// The stranger's end of the hub.
struct Stranger {
    link: MemLink,
    /// CM MADs seen on the wire: (IP source, MAD).
    seen: Vec<(IpAddr, Mad)>,
}

impl Stranger {
    /// Takes what reached the stranger, keeping the CM MADs to QP 1.
    fn sniff(&mut self) {
        let mut buf = vec![0u8; 16384];
        while let Ok(Some(n)) = self.link.recv(&mut buf) {
            if let Ok(Frame::Roce(p)) = vrnic_wire::parse_frame(&buf[..n]) {
                if p.hdr.bth.dest_qp == 1 {
                    if let Ok(m) = Mad::parse(p.payload) {
                        self.seen.push((p.hdr.ip_src, m));
                    }
                }
            }
        }
    }

    fn find(&self, f: impl Fn(&CmMessage) -> bool) -> Option<CmMessage> {
        self.seen.iter().rev().find_map(|(_, m)| {
            let msg = CmMessage::parse(m).ok()?;
            f(&msg).then_some(msg)
        })
    }

    /// A UD SEND to QP 1 of device `to` from `from` (IP, MAC), with the
    /// given keys and payload.
    fn send_raw(&mut self, from: Ipv4Addr, to: u8, pkey: u16, qkey: u32, payload: &[u8]) {
        let h = RoceHeaders {
            eth_src: STRANGER_MAC,
            eth_dst: mac(to),
            ip_src: IpAddr::V4(from),
            ip_dst: IpAddr::V4(ip(to)),
            ip_id: 0,
            ttl: 64,
            tclass: 0,
            flow_label: 0,
            udp_src: vrnic_abi::GSI_UDP_SPORT,
            bth: Bth {
                opcode: Opcode::UdSendOnly,
                solicited: false,
                mig_req: true,
                pad_count: 0,
                tver: 0,
                pkey,
                fecn: false,
                becn: false,
                dest_qp: 1,
                ack_req: false,
                psn: 0,
            },
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            deth: Some(Deth { qkey, src_qp: 1 }),
            immdt: None,
            ieth: None,
        };
        let mut f = Vec::new();
        vrnic_wire::emit_frame(&h, payload, &mut f);
        // The hub drains at its pace; a full queue is a lost frame, not
        // what a class tests: wait for room (bounded).
        let deadline = Instant::now() + DEADLINE;
        while !self.link.try_send(&f).unwrap() {
            assert!(Instant::now() < deadline, "the hub takes no frames");
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// A CM message as a MAD to QP 1 of device `to`, from `from`, with
    /// the GSI's keys.
    fn send(&mut self, from: Ipv4Addr, to: u8, msg: &CmMessage) {
        let mad = msg.to_mad(0x1234, 0).to_bytes();
        self.send_raw(from, to, vrnic_abi::GSI_PKEY, vrnic_abi::GSI_QKEY, &mad[..]);
    }
}

/// Two agents on a hub with a stranger, and an established connection
/// from A's `cid` to B's `sid` (listener `lid` on B, port [`PORT`]).
struct Scene {
    a: Prog,
    b: Prog,
    qa: Qp,
    qb: Qp,
    lid: u32,
    cid: u32,
    sid: u32,
    /// The REQ and REP of the connection, as the stranger saw them.
    req: CmReq,
    rep: CmRep,
    s: Stranger,
    aa: AgentThread,
    ab: AgentThread,
    _hub: Hub,
    _dir: TempDir,
}

/// Resolves `cid` on A to B's PORT, connects it with a new QP, accepts on
/// B: returns (A's QP, B's QP, B's new id).
fn connect_pair(a: &Prog, b: &Prog, cid: u32, uid: u64) -> (Qp, Qp, u32) {
    resolve_addr(&a.ch, cid, format!("10.0.0.2:{PORT}").parse().unwrap());
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.status, e.id), (event::ADDR_RESOLVED, 0, cid));
    resolve_route(&a.ch, cid);
    assert_eq!(get_event(&a.ch).event, event::ROUTE_RESOLVED);
    let mut qa = rc_qp(a);
    modify(&a.ch, cid, &mut qa, QpState::Init);
    assert_eq!(connect(&a.ch, cid, qa.qp_num(), b"hello"), 288 + 8);
    let e = get_event(&b.ch);
    assert_eq!((e.event, e.status), (event::CONNECT_REQUEST, 0), "{e:?}");
    assert_eq!(e.qp_num, qa.qp_num());
    let sid = e.id;
    let mut qb = rc_qp(b);
    modify(&b.ch, sid, &mut qb, QpState::Init);
    modify(&b.ch, sid, &mut qb, QpState::Rtr);
    modify(&b.ch, sid, &mut qb, QpState::Rts);
    accept(&b.ch, sid, uid, Some((qb.qp_num(), b"welcome")));
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.status, e.id), (event::CONNECT_RESPONSE, 0, cid));
    modify(&a.ch, cid, &mut qa, QpState::Rtr);
    modify(&a.ch, cid, &mut qa, QpState::Rts);
    accept(&a.ch, cid, 0, None);
    let e = get_event(&b.ch);
    assert_eq!((e.event, e.status, e.id), (event::ESTABLISHED, 0, sid));
    (qa, qb, sid)
}

fn scene() -> Scene {
    let dir = TempDir::new();
    let (la, ha) = MemLink::pair();
    let (lb, hb) = MemLink::pair();
    let (ls, hs) = MemLink::pair();
    let h = hub([ha, hb, hs]);
    let aa = agent(&dir.0, 1, la);
    let ab = agent(&dir.0, 2, lb);
    let (a, b) = (prog(&aa), prog(&ab));
    let lid = create_id(&b.ch, 0xb0);
    ok(
        &b.ch,
        u::RDMA_USER_CM_CMD_BIND,
        &bind_body(lid, format!("0.0.0.0:{PORT}").parse().unwrap()),
        0,
    );
    listen(&b.ch, lid, 4);
    let cid = create_id(&a.ch, 0xa0);
    let (qa, qb, sid) = connect_pair(&a, &b, cid, 0xb1);
    let mut s = Stranger {
        link: ls,
        seen: Vec::new(),
    };
    // The RTU may still be on its way past the stranger.
    std::thread::sleep(Duration::from_millis(20));
    s.sniff();
    let Some(CmMessage::Req(req)) = s.find(|m| matches!(m, CmMessage::Req(_))) else {
        panic!("the stranger saw no REQ: {:?}", s.seen.len())
    };
    let Some(CmMessage::Rep(rep)) = s.find(|m| matches!(m, CmMessage::Rep(_))) else {
        panic!("the stranger saw no REP")
    };
    assert_eq!(rep.remote_comm_id, req.local_comm_id);
    Scene {
        a,
        b,
        qa,
        qb,
        lid,
        cid,
        sid,
        req,
        rep,
        s,
        aa,
        ab,
        _hub: h,
        _dir: dir,
    }
}

/// A SEND crosses `qa` → `qb` intact.
fn send_crosses(a: &mut Prog, b: &mut Prog, qa: &mut Qp, qb: &mut Qp, seed: u8) {
    let msg: Vec<u8> = (0..512)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect();
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
}

/// Lets the agents take what was injected (the hub, the devices and the
/// services run on their own threads), then: no event on either side, and
/// the connection carries a SEND.
fn still_connected(sc: &mut Scene, seed: u8) {
    std::thread::sleep(Duration::from_millis(300));
    no_event(&sc.a.ch);
    no_event(&sc.b.ch);
    send_crosses(&mut sc.a, &mut sc.b, &mut sc.qa, &mut sc.qb, seed);
    sc.s.sniff();
}

/// DISCONNECT from A, both sides' events, timewait, every id destroyed,
/// and both agents' tables empty.
fn finish(sc: Scene) {
    let Scene {
        a,
        b,
        qa,
        qb,
        lid,
        cid,
        sid,
        aa,
        ab,
        ..
    } = sc;
    assert_eq!(simple(&a.ch, u::RDMA_USER_CM_CMD_DISCONNECT, cid), 12);
    let e = get_event(&b.ch);
    assert_eq!((e.event, e.id), (event::DISCONNECTED, sid));
    assert_eq!(simple(&b.ch, u::RDMA_USER_CM_CMD_DISCONNECT, sid), 12);
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.id), (event::DISCONNECTED, cid));
    let e = get_event(&a.ch);
    assert_eq!((e.event, e.id), (event::TIMEWAIT_EXIT, cid));
    let e = get_event(&b.ch);
    assert_eq!((e.event, e.id), (event::TIMEWAIT_EXIT, sid));
    destroy_id(&a.ch, cid);
    destroy_id(&b.ch, sid);
    destroy_id(&b.ch, lid);
    no_event(&a.ch);
    no_event(&b.ch);
    drop((qa, qb, a, b));
    wait_service_empty(&aa);
    wait_service_empty(&ab);
}

/// Waits (bounded) until agent `a`'s service holds nothing.
fn wait_service_empty(a: &AgentThread) {
    wait_stats(a, "empty", |s| {
        s == UcmaStats {
            events_dropped: s.events_dropped,
            bad_connections: s.bad_connections,
            ..Default::default()
        }
    });
}

fn wait_stats(a: &AgentThread, what: &str, f: impl Fn(UcmaStats) -> bool) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let s = *a.ucma.lock().unwrap();
        if f(s) {
            return;
        }
        assert!(Instant::now() < deadline, "not {what}: {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn rej(local: u32, remote: u32) -> CmMessage {
    CmMessage::Rej(CmRej {
        local_comm_id: local,
        remote_comm_id: remote,
        message_rejected: 2,
        ari_length: 0,
        reason: rej_reason::CONSUMER_DEFINED,
        ari: [0; private_data_len::ADDITIONAL_INFO],
        private_data: [0; private_data_len::REJ],
    })
}

fn dreq(local: u32, remote: u32, qpn: u32) -> CmMessage {
    CmMessage::Dreq(CmDreq {
        local_comm_id: local,
        remote_comm_id: remote,
        remote_qpn_eecn: qpn,
        private_data: [0; private_data_len::DREQ],
    })
}

fn drep(local: u32, remote: u32) -> CmMessage {
    CmMessage::Drep(CmDrep {
        local_comm_id: local,
        remote_comm_id: remote,
        private_data: [0; private_data_len::DREP],
    })
}

fn rtu(local: u32, remote: u32) -> CmMessage {
    CmMessage::Rtu(CmRtu {
        local_comm_id: local,
        remote_comm_id: remote,
        private_data: [0; private_data_len::RTU],
    })
}

fn mra(local: u32, remote: u32) -> CmMessage {
    CmMessage::Mra(CmMra {
        local_comm_id: local,
        remote_comm_id: remote,
        message_mraed: 0,
        service_timeout: 31,
        private_data: [0; private_data_len::MRA],
    })
}

/// Every message that could end or disturb a connection, addressed to
/// side `to` (1 = A, 2 = B) with comm IDs (`local` the sender's, `remote`
/// the receiver's) and the receiver's QPN.
fn forgeries(local: u32, remote: u32, qpn: u32) -> Vec<CmMessage> {
    vec![
        rej(local, remote),
        rej(0, remote),
        dreq(local, remote, qpn),
        drep(local, remote),
        rtu(local, remote),
        mra(local, remote),
    ]
}

#[test]
fn forged_rej_dreq_drep_rtu_mra_with_guessed_comm_ids_change_nothing() {
    let mut sc = scene();
    let (a_id, b_id) = (sc.req.local_comm_id, sc.rep.local_comm_id);
    let (qa, qb) = (sc.qa.qp_num(), sc.qb.qp_num());
    // Guesses near the real IDs (the CM's IDs are random, but a stranger
    // may try neighbours), from the stranger's own address.
    for g in 1..=16u32 {
        for m in forgeries(b_id ^ g, a_id.wrapping_add(g), qa) {
            sc.s.send(STRANGER_IP, 1, &m);
        }
        for m in forgeries(a_id.wrapping_sub(g), b_id ^ (g << 8), qb) {
            sc.s.send(STRANGER_IP, 2, &m);
        }
    }
    still_connected(&mut sc, 1);
    finish(sc);
}

#[test]
fn forged_rej_dreq_drep_rtu_mra_rep_with_the_right_comm_ids_from_a_stranger_change_nothing() {
    let mut sc = scene();
    let (a_id, b_id) = (sc.req.local_comm_id, sc.rep.local_comm_id);
    let (qa, qb) = (sc.qa.qp_num(), sc.qb.qp_num());
    for m in forgeries(b_id, a_id, qa) {
        sc.s.send(STRANGER_IP, 1, &m);
    }
    // A duplicate REP: at most the RTU again, to B.
    sc.s.send(STRANGER_IP, 1, &CmMessage::Rep(sc.rep.clone()));
    for m in forgeries(a_id, b_id, qb) {
        sc.s.send(STRANGER_IP, 2, &m);
    }
    // The REQ again (a duplicate: same comm ID and CA GUID), and the REQ
    // with another comm ID (stale: same QPN and CA GUID), from the
    // stranger's address: neither may end the connection.
    sc.s.send(STRANGER_IP, 2, &CmMessage::Req(sc.req.clone()));
    let mut stale = sc.req.clone();
    stale.local_comm_id ^= 0x5555;
    sc.s.send(STRANGER_IP, 2, &CmMessage::Req(stale));
    still_connected(&mut sc, 2);
    finish(sc);
}

#[test]
fn a_req_flood_is_bounded_by_the_backlog_and_its_entries_go() {
    let mut sc = scene();
    const FLOOD: u32 = 600;
    for i in 0..FLOOD {
        let mut r = sc.req.clone();
        r.local_comm_id = 0x5eed_0000 + i;
        r.local_ca_guid = 0xdead_beef_0000_0000 + u64::from(i);
        r.local_qpn = 0x100 + i;
        sc.s.send(ip(100 + (i % 150) as u8), 2, &CmMessage::Req(r));
    }
    std::thread::sleep(Duration::from_millis(500));
    // The connection is untouched.
    send_crosses(&mut sc.a, &mut sc.b, &mut sc.qa, &mut sc.qb, 3);
    no_event(&sc.a.ch);
    // The listener's backlog (4) bounds what waits for the program; the
    // rest were rejected at once: B holds the connection and at most 4
    // requests.
    let s = *sc.ab.ucma.lock().unwrap();
    assert!(s.connections <= 1 + 4, "{s:?}");
    // The program takes them and destroys each (REJ): they go.
    let mut taken = 0;
    loop {
        let (ret, r) = call(&sc.b.ch, u::RDMA_USER_CM_CMD_GET_EVENT, &[0; 8], &[], 336);
        if ret == -libc::EAGAIN {
            break;
        }
        assert_eq!(ret, 16);
        assert_eq!(u32_at(&r, 12), event::CONNECT_REQUEST);
        destroy_id(&sc.b.ch, u32_at(&r, 8));
        taken += 1;
        assert!(taken <= 4, "more requests than the backlog");
    }
    assert!(taken >= 1, "no request of the flood reached the listener");
    wait_stats(&sc.ab, "back to one connection", |s| {
        s.connections == 1 && s.ids == 2
    });
    // A new connection from A is made, and both carry SENDs.
    let c2 = create_id(&sc.a.ch, 0xa2);
    let (mut qa2, mut qb2, sid2) = connect_pair(&sc.a, &sc.b, c2, 0xb2);
    send_crosses(&mut sc.a, &mut sc.b, &mut qa2, &mut qb2, 4);
    send_crosses(&mut sc.a, &mut sc.b, &mut sc.qa, &mut sc.qb, 5);
    assert_eq!(simple(&sc.a.ch, u::RDMA_USER_CM_CMD_DISCONNECT, c2), 12);
    let e = get_event(&sc.b.ch);
    assert_eq!((e.event, e.id), (event::DISCONNECTED, sid2));
    assert_eq!(simple(&sc.b.ch, u::RDMA_USER_CM_CMD_DISCONNECT, sid2), 12);
    let e = get_event(&sc.a.ch);
    assert_eq!((e.event, e.id), (event::DISCONNECTED, c2));
    let e = get_event(&sc.a.ch);
    assert_eq!((e.event, e.id), (event::TIMEWAIT_EXIT, c2));
    let e = get_event(&sc.b.ch);
    assert_eq!((e.event, e.id), (event::TIMEWAIT_EXIT, sid2));
    destroy_id(&sc.a.ch, c2);
    destroy_id(&sc.b.ch, sid2);
    drop((qa2, qb2));
    finish(sc);
}

/// A REQ for the listener from `from` (a new comm ID, QPN and CA GUID
/// from `n`), as a MAD.
fn new_req(sc: &Scene, n: u32) -> [u8; 256] {
    let mut r = sc.req.clone();
    r.local_comm_id = 0x0c0f_f000 + n;
    r.local_qpn = 0x800 + n;
    r.local_ca_guid = 0x0c0f_fee0_0000_0000 + u64::from(n);
    CmMessage::Req(r)
        .to_mad(0x0c0f_f000 + u64::from(n), 0)
        .to_bytes()
}

/// The control of a class: the same REQ as a whole 256-byte MAD with the
/// GSI's keys reaches the listener; B's program destroys the request.
fn control_req_reaches_the_listener(sc: &mut Scene, req: &[u8; 256]) {
    sc.s.send_raw(
        STRANGER_IP,
        2,
        vrnic_abi::GSI_PKEY,
        vrnic_abi::GSI_QKEY,
        req,
    );
    let e = get_event(&sc.b.ch);
    assert_eq!(e.event, event::CONNECT_REQUEST, "{e:?}");
    destroy_id(&sc.b.ch, e.id);
    wait_stats(&sc.ab, "back to one connection", |s| s.connections == 1);
}

#[test]
fn truncated_oversized_and_garbage_mads_change_nothing() {
    let mut sc = scene();
    // A REQ the listener would take and a DREQ that would end the
    // connection (spoofed from A's own address), cut short or carried in
    // a longer datagram: not a 256-byte MAD, so never a MAD (Linux's MAD
    // layer takes exactly GRH + 256 bytes).
    let (a_id, b_id) = (sc.req.local_comm_id, sc.rep.local_comm_id);
    let dreq = dreq(a_id, b_id, sc.qb.qp_num()).to_mad(7, 0).to_bytes();
    let req = new_req(&sc, 1);
    for (from, good) in [(STRANGER_IP, req), (ip(1), dreq)] {
        for len in [0usize, 1, 23, 24, 25, 100, 231, 255] {
            sc.s.send_raw(
                from,
                2,
                vrnic_abi::GSI_PKEY,
                vrnic_abi::GSI_QKEY,
                &good[..len],
            );
        }
        for len in [257usize, 260, 300, 472, 473, 512, 1024, 1400] {
            let mut big = good.to_vec();
            big.resize(len, 0xee);
            sc.s.send_raw(from, 2, vrnic_abi::GSI_PKEY, vrnic_abi::GSI_QKEY, &big);
        }
    }
    // Garbage 256-byte MADs: other base versions, classes, class
    // versions, methods, attributes.
    for (at, v) in [(0usize, 2u8), (1, 0x04), (2, 1), (3, 0x81), (17, 0x99)] {
        let mut g = req;
        g[at] = v;
        sc.s.send_raw(STRANGER_IP, 2, vrnic_abi::GSI_PKEY, vrnic_abi::GSI_QKEY, &g);
    }
    let mut noise = [0u8; 256];
    for (i, b) in noise.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151) ^ 0x5a;
    }
    for _ in 0..64 {
        sc.s.send_raw(
            STRANGER_IP,
            2,
            vrnic_abi::GSI_PKEY,
            vrnic_abi::GSI_QKEY,
            &noise,
        );
    }
    still_connected(&mut sc, 6);
    control_req_reaches_the_listener(&mut sc, &req);
    finish(sc);
}

#[test]
fn wrong_qkey_or_pkey_mads_are_dropped_by_the_device() {
    let mut sc = scene();
    let (a_id, b_id) = (sc.req.local_comm_id, sc.rep.local_comm_id);
    let qb = sc.qb.qp_num();
    // The peer's own DREQ, spoofed from A's address: with the GSI's keys
    // it would end the connection; with any other Q_Key or P_Key the
    // device drops it before QP 1 (rxe's check_keys). P_Key 0x7fff, the
    // limited member of the default partition, is a match (IBTA 10.9.3).
    let m = dreq(a_id, b_id, qb).to_mad(7, 0).to_bytes();
    let req = new_req(&sc, 2);
    for mad in [m, req] {
        for qkey in [0u32, 0x8001_0001, 0x0123_4567, 0xffff_ffff] {
            sc.s.send_raw(ip(1), 2, vrnic_abi::GSI_PKEY, qkey, &mad);
        }
        for pkey in [0u16, 0x7ffe, 0x8001, 0x1234] {
            sc.s.send_raw(ip(1), 2, pkey, vrnic_abi::GSI_QKEY, &mad);
        }
    }
    still_connected(&mut sc, 7);
    control_req_reaches_the_listener(&mut sc, &req);
    finish(sc);
}
