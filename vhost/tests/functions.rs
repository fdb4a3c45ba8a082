//! Several functions of one daemon (issue 10), in process: a
//! [`Functions`] on a `MemLink` uplink whose other end the tests watch,
//! each function driven through its own vhost-user socket by a program
//! on guest-lib's verbs over `VhostUserTransport` (`common`). Traffic
//! between functions goes through the embedded switch; only group frames
//! (ARP) may reach the uplink. Every wait is bounded.

mod common;

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use common::{connect_rc, gid, pattern, rc_qp, recv, wait_cq, Conn, Peer, TempDir, WAIT};
use vrnic::abi;
use vrnic::link::{Link, MemLink};
use vrnic_guest::verbs::{
    Context, Cq, Mr, Pd, Qp, QpState, RdmaWr, SendWr, WorkCompletion, WrOpcode, SEND_SIGNALED,
};
use vrnic_guest::vhost_user::VhostUserTransport;
use vrnic_vhost::addr::Ipv4Prefix;
use vrnic_vhost::functions::{
    FunctionError, FunctionSpec, Functions, FunctionsConfig, MAX_FUNCTIONS,
};

fn ip(last: u8) -> Ipv4Prefix {
    Ipv4Prefix {
        addr: Ipv4Addr::new(10, 0, 0, last),
        len: 24,
    }
}

fn spec(dir: &Path, name: &str, last: u8) -> FunctionSpec {
    let mut s = FunctionSpec::new(dir.join(format!("{name}.sock")), ip(last));
    s.name = Some(name.to_string());
    s
}

/// A daemon's functions on an uplink whose other end is returned.
fn daemon() -> (Functions, MemLink) {
    let (uplink, outside) = MemLink::pair();
    (
        Functions::new(Box::new(uplink), FunctionsConfig::default()),
        outside,
    )
}

/// A connected program with one PD and CQ. Field order is drop order.
struct Side {
    cq: Cq,
    pd: Pd,
    ctx: Context,
    conn: Conn,
    ip: Ipv4Addr,
}

fn attach(socket: &Path, last: u8) -> Side {
    let (ctx, conn) = common::open(socket);
    let pd = Pd::alloc(&ctx).expect("ALLOC_PD");
    let cq = Cq::new(&ctx, 64).expect("CREATE_CQ");
    Side {
        cq,
        pd,
        ctx,
        conn,
        ip: ip(last).addr,
    }
}

fn qp(s: &Side) -> Qp {
    rc_qp(&s.pd, &s.cq)
}

/// Connects `qa` of `a` and `qb` of `b` to each other (RTS).
fn connect(a: &Side, qa: &mut Qp, b: &Side, qb: &mut Qp) {
    let to_b = Peer {
        gid: gid(&b.ctx),
        qpn: qb.qp_num(),
        psn: 2000,
    };
    let to_a = Peer {
        gid: gid(&a.ctx),
        qpn: qa.qp_num(),
        psn: 10,
    };
    connect_rc(qa, to_b, 10);
    connect_rc(qb, to_a, 2000);
}

/// Functions a (10.0.0.1) and b (10.0.0.2) of `fns`, their sockets in
/// `dir`, each with a program attached, and an RC QP of each connected to
/// the other's.
fn pair(fns: &Functions, dir: &Path) -> (FunctionSpec, FunctionSpec, Side, Side, Qp, Qp) {
    let sa = spec(dir, "a", 1);
    let sb = spec(dir, "b", 2);
    fns.add(&sa).expect("function a");
    fns.add(&sb).expect("function b");
    let a = attach(&sa.socket, 1);
    let b = attach(&sb.socket, 2);
    let mut qa = qp(&a);
    let mut qb = qp(&b);
    connect(&a, &mut qa, &b, &mut qb);
    (sa, sb, a, b, qa, qb)
}

/// A function's counters from its stats socket (bounded wait): the reply,
/// for messages, and a lookup by name.
fn counters(spec: &FunctionSpec) -> (String, impl Fn(&str) -> Option<u64>) {
    let reply = vrnic_vhost::stats::query(&spec.stats_path(), WAIT).expect("counters");
    let counters = vrnic_vhost::stats::parse(&reply).expect("name value lines");
    let get = move |n: &str| counters.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
    (reply, get)
}

fn buffer(s: &Side, len: usize, data: &[u8]) -> Mr<'static> {
    common::buffer(&s.pd, len, data)
}

fn cqe(s: &mut Side) -> WorkCompletion {
    let what = s.ip.to_string();
    wait_cq(&mut s.cq, &what)
}

fn send(q: &mut Qp, wr_id: u64, mr: &Mr, len: usize) {
    common::send(q, wr_id, mr.sge(0, len));
}

/// Every frame the uplink's other end got; each must be a broadcast ARP
/// frame (a function resolving another's address), never unicast and
/// never RoCEv2.
fn assert_only_arp_reached_the_uplink(outside: &mut MemLink) -> usize {
    let mut buf = vec![0u8; 16 * 1024];
    let mut n_arp = 0;
    while let Some(n) = outside.recv(&mut buf).unwrap() {
        let f = &buf[..n];
        assert_eq!(
            &f[..6],
            &[0xff; 6],
            "only broadcast reaches the uplink: {f:02x?}"
        );
        assert_eq!(
            &f[12..14],
            &[0x08, 0x06],
            "only ARP reaches the uplink: {f:02x?}"
        );
        n_arp += 1;
    }
    n_arp
}

/// (a) Two functions of one daemon run SEND and RDMA WRITE between each
/// other through the switch; the payloads arrive byte for byte and no
/// frame but the ARP broadcasts touched the uplink.
#[test]
fn two_functions_of_one_daemon_talk_through_the_switch_not_the_uplink() {
    let dir = TempDir::new("ab");
    let (fns, mut outside) = daemon();
    let mut sa = spec(&dir.0, "a", 1);
    let pcap = dir.0.join("a.pcap");
    sa.pcap = Some(pcap.clone());
    let sb = spec(&dir.0, "b", 2);
    fns.add(&sa).expect("function a");
    fns.add(&sb).expect("function b");
    let mut a = attach(&sa.socket, 1);
    let mut b = attach(&sb.socket, 2);
    let mut qa = qp(&a);
    let mut qb = qp(&b);
    connect(&a, &mut qa, &b, &mut qb);

    // SEND of 5000 bytes at path MTU 1024: 5 packets.
    let len = 5000;
    let data = pattern(len, 1);
    let src = buffer(&a, len, &data);
    let dst = buffer(&b, len + 100, &[]);
    recv(&mut qb, 7, Some(dst.sge(0, len + 100)));
    send(&mut qa, 1, &src, len);
    let rc = cqe(&mut b);
    assert_eq!(
        (rc.status, rc.opcode, rc.wr_id, rc.byte_len),
        (abi::WC_SUCCESS, abi::WC_OP_RECV, 7, len as u32),
        "{rc:?}"
    );
    assert_eq!(&dst.to_vec()[..len], &data[..]);
    let sc = cqe(&mut a);
    assert_eq!((sc.status, sc.wr_id), (abi::WC_SUCCESS, 1), "{sc:?}");

    // RDMA WRITE of 3000 bytes from B into A's buffer.
    let wlen = 3000;
    let wdata = pattern(wlen, 9);
    let wsrc = buffer(&b, wlen, &wdata);
    let wdst = buffer(&a, wlen, &[]);
    qb.post_send(&SendWr {
        wr_id: 2,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SEND_SIGNALED,
        sg_list: &[wsrc.sge(0, wlen)],
        rdma: RdmaWr {
            remote_addr: wdst.addr(),
            rkey: wdst.rkey(),
        },
        ..Default::default()
    })
    .expect("post WRITE");
    let wc = cqe(&mut b);
    assert_eq!((wc.status, wc.wr_id), (abi::WC_SUCCESS, 2), "{wc:?}");
    assert_eq!(wdst.to_vec(), wdata);

    let n_arp = assert_only_arp_reached_the_uplink(&mut outside);
    let up = fns.switch().uplink_stats();
    assert_eq!(up.tx_frames as usize, n_arp, "{up:?}");
    let list = fns.list();
    assert_eq!(list.len(), 2);
    for f in &list {
        assert!(f.connected, "{f}");
        assert!(f.port.rx_local >= 3, "frames came through the switch: {f}");
        assert_eq!(f.port.rx_queue_dropped, 0, "{f}");
    }
    // Each function's stats socket has its switch port's counters.
    let (reply, get) = counters(&sb);
    assert!(get("switch_rx_local").is_some_and(|v| v >= 5), "{reply}");
    assert_eq!(get("switch_rx_dropped"), Some(0), "{reply}");
    // And the daemon's uplink's own: the ARP requests were all it sent.
    assert_eq!(get("link_tx_frames"), Some(n_arp as u64), "{reply}");
    assert_eq!(get("link_rx_malformed"), Some(0), "{reply}");

    // A's pcap file shows the RoCEv2 frames it exchanged with B, packet
    // by packet: B's WRITE came to A as one batch (`vrnic::batch::gso`).
    let ops = roce_opcodes_in_pcap(&pcap);
    let of = |o: Opcode| ops.iter().filter(|&&x| x == o).count();
    use vrnic::wire::Opcode;
    assert_eq!(
        (
            of(Opcode::RcSendFirst),
            of(Opcode::RcSendMiddle),
            of(Opcode::RcSendLast)
        ),
        (1, 3, 1),
        "{ops:?}"
    );
    assert_eq!(
        (
            of(Opcode::RcWriteFirst),
            of(Opcode::RcWriteMiddle),
            of(Opcode::RcWriteLast)
        ),
        (1, 1, 1),
        "{ops:?}"
    );

    drop((src, dst, wsrc, wdst, qa, qb, a, b));
    assert!(fns.shutdown().is_empty());
    assert!(
        !sa.socket.exists() && !sb.socket.exists(),
        "sockets removed"
    );
}

/// Two functions without pcap or fault injection: SEND, WRITE and READ
/// payloads go straight from one guest's memory to the other's (by
/// reference, `vrnic::data`: `tx_by_ref` in both functions' counters),
/// byte for byte.
#[test]
fn payloads_go_straight_from_one_functions_memory_to_the_others() {
    let dir = TempDir::new("byref");
    let (fns, _outside) = daemon();
    let (sa, sb, mut a, mut b, mut qa, mut qb) = pair(&fns, &dir.0);

    // SEND A -> B, 40 packets at path MTU 1024.
    let len = 40_000;
    let data = pattern(len, 4);
    let src = buffer(&a, len, &data);
    let dst = buffer(&b, len, &[]);
    recv(&mut qb, 7, Some(dst.sge(0, len)));
    send(&mut qa, 1, &src, len);
    let rc = cqe(&mut b);
    assert_eq!(
        (rc.status, rc.wr_id, rc.byte_len),
        (abi::WC_SUCCESS, 7, len as u32),
        "{rc:?}"
    );
    assert_eq!(cqe(&mut a).status, abi::WC_SUCCESS);
    assert_eq!(dst.to_vec(), data, "SEND");

    // WRITE A -> B over the SEND's bytes, then READ them back into A.
    let wdata = pattern(len, 5);
    let wsrc = buffer(&a, len, &wdata);
    let rdst = buffer(&a, len, &[]);
    for (wr_id, opcode, sge) in [
        (2, WrOpcode::RdmaWrite, wsrc.sge(0, len)),
        (3, WrOpcode::RdmaRead, rdst.sge(0, len)),
    ] {
        qa.post_send(&SendWr {
            wr_id,
            opcode,
            send_flags: SEND_SIGNALED,
            sg_list: &[sge],
            rdma: RdmaWr {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            ..Default::default()
        })
        .expect("post");
        let wc = cqe(&mut a);
        assert_eq!((wc.status, wc.wr_id), (abi::WC_SUCCESS, wr_id), "{wc:?}");
    }
    assert_eq!(dst.to_vec(), wdata, "WRITE");
    assert_eq!(rdst.to_vec(), wdata, "READ");

    for (spec, what) in [(&sa, "SEND and WRITE"), (&sb, "READ responses")] {
        let (reply, get) = counters(spec);
        assert!(
            get("tx_by_ref").is_some_and(|v| v >= 30),
            "{what} by reference: {reply}"
        );
        assert_eq!(get("retransmits"), Some(0), "{reply}");
    }
    drop((src, dst, wsrc, rdst, qa, qb, a, b));
    assert!(fns.shutdown().is_empty());
}

/// One message from `from` to `to`: `data` SENT from `src`, received into
/// `dst` intact, both completions successful.
fn exchange(from: (&mut Side, &mut Qp, &Mr), to: (&mut Side, &mut Qp, &Mr), data: &[u8]) {
    let (fs, fq, src) = from;
    let (ts, tq, dst) = to;
    let what = format!("{} to {}", fs.ip, ts.ip);
    src.write(0, data);
    recv(tq, 1, Some(dst.sge(0, data.len())));
    send(fq, 2, src, data.len());
    let rc = cqe(ts);
    assert_eq!(
        (rc.status, rc.wr_id),
        (abi::WC_SUCCESS, 1),
        "{what}: {rc:?}"
    );
    assert_eq!(dst.to_vec(), data, "{what}");
    let sc = cqe(fs);
    assert_eq!(
        (sc.status, sc.wr_id),
        (abi::WC_SUCCESS, 2),
        "{what}: {sc:?}"
    );
}

/// One worker polls both functions of a daemon (`vrnic_vhost::poll_group`):
/// a ping-pong of SENDs between them is served with one function adopted
/// by the other's worker (`poll_adopted`), every message intact. After
/// each pause — long enough for the poller's session to end and give the
/// adopted function back — one side, then the other, sends first: each
/// function's program must find its doorbell served while the other's
/// worker no longer polls it, i.e. with its notifications on again (else
/// the doorbell waits for a kick that never comes and the bounded wait
/// fails). The pauses are stimuli, not synchronisation: the messages must
/// complete whenever the sessions end. Polling never pauses after a long
/// yield here (`backoff_ns` 0: other tests share the cores), and the
/// ping-pong goes on, bounded, until 80 rounds after the counters first
/// show an adoption.
#[test]
fn one_worker_polls_both_functions_and_gives_them_back() {
    let dir = TempDir::new("group");
    let (uplink, _outside) = MemLink::pair();
    let mut cfg = FunctionsConfig::default();
    cfg.backend.poll.backoff_ns = 0;
    let fns = Functions::new(Box::new(uplink), cfg);
    let (sa, sb, mut a, mut b, mut qa, mut qb) = pair(&fns, &dir.0);

    let len = 64;
    let (a_src, a_dst) = (buffer(&a, len, &[]), buffer(&a, len, &[]));
    let (b_src, b_dst) = (buffer(&b, len, &[]), buffer(&b, len, &[]));
    // Longer than a session's idle budget and its longest run
    // (vrnic_vhost::spin::DEFAULT_POLL_NS, SESSION_MAX_NS).
    let pause = Duration::from_nanos(2 * vrnic_vhost::spin::SESSION_MAX_NS);
    // Both functions' counters: retransmissions, RNR NAKs received and
    // adoptions, summed.
    let summed = || {
        let mut sum = (0, 0, 0);
        for s in [&sa, &sb] {
            let (reply, get) = counters(s);
            let get = |n: &str| get(n).unwrap_or_else(|| panic!("no {n}: {reply}"));
            sum.0 += get("retransmits");
            sum.1 += get("rnr_naks_received");
            sum.2 += get("poll_adopted");
        }
        sum
    };
    let mut seen = None;
    for i in 0..2000u32 {
        let ping = pattern(len, i as u8);
        let pong = pattern(len, (i as u8).wrapping_add(100));
        if (i / 10) % 2 == 0 {
            exchange((&mut a, &mut qa, &a_src), (&mut b, &mut qb, &b_dst), &ping);
            exchange((&mut b, &mut qb, &b_src), (&mut a, &mut qa, &a_dst), &pong);
        } else {
            exchange((&mut b, &mut qb, &b_src), (&mut a, &mut qa, &a_dst), &ping);
            exchange((&mut a, &mut qa, &a_src), (&mut b, &mut qb, &b_dst), &pong);
        }
        if i % 10 == 9 {
            std::thread::sleep(pause);
        }
        // Until 80 rounds (8 pauses, each side first after 4) after the
        // first adoption seen, and 160 at least.
        if i % 20 == 19 {
            if seen.is_none() && summed().2 > 0 {
                seen = Some(i);
            }
            if seen.is_some_and(|s| i >= 160 && i >= s + 80) {
                break;
            }
        }
    }
    let (retx, rnr, adopted) = summed();
    // A SEND may beat the other function's RECV doorbell to its device: an
    // RNR NAK and a retransmission answering it, never one after an ACK
    // timeout.
    assert!(retx <= rnr, "retransmits {retx}, RNR NAKs {rnr}");
    assert!(adopted >= 1, "one function's worker polled the other's");
    drop((a_src, a_dst, b_src, b_dst, qa, qb, a, b));
    assert!(fns.shutdown().is_empty());
}

/// The BTH opcodes of the frames to UDP port 4791 (RoCEv2) over IPv4 in a
/// classic pcap file (`pcap-savefile(5)`, host byte order, as `PcapLink`
/// writes it), each checked to be a valid RoCEv2 frame, ICRC included.
fn roce_opcodes_in_pcap(path: &Path) -> Vec<vrnic::wire::Opcode> {
    let bytes = std::fs::read(path).expect("pcap file");
    assert_eq!(&bytes[..4], &0xa1b2c3d4u32.to_ne_bytes(), "pcap magic");
    let mut at = 24;
    let mut n = 0;
    let mut ops = Vec::new();
    while at + 16 <= bytes.len() {
        let incl = u32::from_ne_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &bytes[at + 16..at + 16 + incl];
        if frame.len() >= 38 && frame[12..14] == [0x08, 0x00] && frame[23] == 17 {
            let ihl = usize::from(frame[14] & 0x0f) * 4;
            let dport = &frame[14 + ihl + 2..14 + ihl + 4];
            if dport == 4791u16.to_be_bytes() {
                // B's frames came without their ICRC (functions of one
                // daemon leave it out); the record has it all the same.
                let p = vrnic::wire::parse_roce(frame);
                let Ok(p) = p else {
                    panic!("frame {n} recorded as on a wire: {p:?}");
                };
                ops.push(p.hdr.bth.opcode);
                n += 1;
            }
        }
        at += 16 + incl;
    }
    ops
}

/// (b) A WRITE with a bad R_Key through the switch: the responder NAKs
/// and the requester completes with REM_ACCESS_ERR, as between daemons.
#[test]
fn a_bad_rkey_through_the_switch_is_a_remote_access_error() {
    let dir = TempDir::new("rkey");
    let (fns, mut outside) = daemon();
    let sa = spec(&dir.0, "a", 1);
    let sb = spec(&dir.0, "b", 2);
    fns.add(&sa).unwrap();
    fns.add(&sb).unwrap();
    let mut a = attach(&sa.socket, 1);
    let b = attach(&sb.socket, 2);
    let mut qa = qp(&a);
    let mut qb = qp(&b);
    connect(&a, &mut qa, &b, &mut qb);
    let src = buffer(&a, 2000, &pattern(2000, 3));
    let dst = buffer(&b, 4096, &[]);
    qa.post_send(&SendWr {
        wr_id: 8,
        opcode: WrOpcode::RdmaWrite,
        send_flags: SEND_SIGNALED,
        sg_list: &[src.sge(0, 2000)],
        rdma: RdmaWr {
            remote_addr: dst.addr(),
            rkey: dst.rkey() ^ 0x100,
        },
        ..Default::default()
    })
    .expect("post WRITE");
    let c = cqe(&mut a);
    assert_eq!((c.wr_id, c.status), (8, abi::WC_REM_ACCESS_ERR), "{c:?}");
    assert_eq!(dst.to_vec(), vec![0; 4096]);
    assert_eq!(qa.query().unwrap().qp_state, QpState::Err);
    assert_only_arp_reached_the_uplink(&mut outside);
}

/// (c) Functions come and go while the daemon runs: a third is added
/// beside two connected ones; deleting one with a connected frontend
/// closes its connection and frees its sockets, its peer QP fails with
/// RETRY_EXC_ERR, and traffic between the others goes on. Duplicates and
/// unknown names are refused, and the number of functions is bounded.
#[test]
fn functions_are_added_listed_and_deleted_while_running() {
    let dir = TempDir::new("adddel");
    let (fns, mut outside) = daemon();
    let (sa, sb, sc) = (
        spec(&dir.0, "a", 1),
        spec(&dir.0, "b", 2),
        spec(&dir.0, "c", 3),
    );
    fns.add(&sa).unwrap();
    fns.add(&sb).unwrap();
    let mut a = attach(&sa.socket, 1);
    let b = attach(&sb.socket, 2);
    let mut qa = qp(&a);
    let mut qb = qp(&b);
    connect(&a, &mut qa, &b, &mut qb);

    // Added while A and B are connected.
    let info = fns.add(&sc).expect("function c added while running");
    assert!(!info.connected);
    let mut c = attach(&sc.socket, 3);
    let mut qa2 = qp(&a);
    let mut qc = qp(&c);
    connect(&a, &mut qa2, &c, &mut qc);
    let connected: Vec<(String, bool)> = fns
        .list()
        .into_iter()
        .map(|f| (f.name, f.connected))
        .collect();
    assert_eq!(
        connected,
        [("a".into(), true), ("b".into(), true), ("c".into(), true)]
    );

    // Refused: duplicates of name, socket, MAC, IPv4, and unknown names.
    let mut dup_name = spec(&dir.0, "x", 9);
    dup_name.name = Some("a".into());
    let mut dup_mac = spec(&dir.0, "y", 9);
    dup_mac.mac = Some(vrnic_vhost::addr::Mac::from_ipv4(ip(2).addr));
    let mut dup_socket = spec(&dir.0, "z", 9);
    dup_socket.socket = sa.socket.clone();
    let mut dup_ip = spec(&dir.0, "w", 3);
    dup_ip.mac = Some("02:00:00:00:00:77".parse().unwrap());
    for (s, what) in [
        (&dup_name, "name"),
        (&dup_mac, "MAC"),
        (&dup_socket, "socket"),
        (&dup_ip, "IPv4 address"),
    ] {
        match fns.add(s) {
            Err(FunctionError::Duplicate { what: w, .. }) => assert_eq!(w, what),
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(matches!(fns.del("nope"), Err(FunctionError::NotFound(_))));
    assert_eq!(fns.len(), 3);

    // B goes while its frontend is connected, by socket path.
    assert!(b.conn.is_connected(), "b's program is connected");
    let b_socket = sb.socket.to_str().unwrap().to_string();
    fns.del(&b_socket).expect("b deleted");
    assert!(!sb.socket.exists(), "b's socket removed");
    assert!(!sb.stats_path().exists(), "b's stats socket removed");
    assert_eq!(fns.switch().ports(), 2, "b's switch port freed");
    assert!(
        !b.conn.is_connected(),
        "b's vhost-user connection is closed"
    );
    // B's program can do nothing more; it ends as a killed one does (its
    // objects cannot be destroyed on a deleted function).
    // SAFETY: B's objects are only dropped from now on; it has no MR.
    unsafe { b.conn.kill() };
    drop((qb, b));

    // A's QP to B runs out of retries.
    let src = buffer(&a, 1000, &pattern(1000, 5));
    send(&mut qa, 11, &src, 1000);
    let fail = cqe(&mut a);
    assert_eq!(
        (fail.wr_id, fail.status),
        (11, abi::WC_RETRY_EXC_ERR),
        "{fail:?}"
    );

    // A and C carry on.
    let dst = buffer(&c, 1000, &[]);
    recv(&mut qc, 12, Some(dst.sge(0, 1000)));
    send(&mut qa2, 13, &src, 1000);
    let rc = cqe(&mut c);
    assert_eq!((rc.wr_id, rc.status), (12, abi::WC_SUCCESS), "{rc:?}");
    assert_eq!(dst.to_vec(), pattern(1000, 5));
    assert_eq!(cqe(&mut a).status, abi::WC_SUCCESS);
    let names: Vec<String> = fns.list().into_iter().map(|f| f.name).collect();
    assert_eq!(names, ["a", "c"]);

    // B's frames after the delete went to the uplink (its MAC is nobody's
    // now): the retries of A's SEND. Nothing else did.
    let mut buf = vec![0u8; 16 * 1024];
    while let Some(n) = outside.recv(&mut buf).unwrap() {
        let f = &buf[..n];
        let to_b = f[..6] == vrnic_vhost::addr::Mac::from_ipv4(ip(2).addr).0;
        assert!(to_b || f[..6] == [0xff; 6], "{f:02x?}");
    }

    // A function with the deleted one's name, socket and addresses can
    // come back.
    fns.add(&sb).expect("b again");
    drop((src, dst, qa, qa2, qc, a, c));
    assert!(fns.shutdown().is_empty());
}

#[test]
fn the_number_of_functions_is_bounded() {
    let dir = TempDir::new("max");
    let (fns, _outside) = daemon();
    for i in 0..MAX_FUNCTIONS {
        let mut s = FunctionSpec::new(
            dir.0.join(format!("f{i}.sock")),
            Ipv4Prefix {
                addr: Ipv4Addr::new(10, 1, 0, i as u8 + 1),
                len: 16,
            },
        );
        s.name = Some(format!("f{i}"));
        fns.add(&s).unwrap();
    }
    let over = spec(&dir.0, "over", 200);
    // Unnamed functions whose sockets have one file name get distinct names.
    fns.del("f1").unwrap();
    fns.del("f2").unwrap();
    let sub = dir.0.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let mut names = Vec::new();
    for (d, last) in [(&dir.0, 201), (&sub, 202)] {
        let s = FunctionSpec::new(d.join("vrnic.sock"), ip(last));
        names.push(fns.add(&s).unwrap().name);
    }
    assert_eq!(names, ["vrnic.sock", "vrnic.sock-2"]);
    assert!(matches!(fns.add(&over), Err(FunctionError::TooMany)));
    fns.del("f0").unwrap();
    fns.add(&over).expect("room again after a delete");
    assert!(fns.shutdown().is_empty());
    assert!(fns.is_empty());
}

/// Deleting a connected function does not wait for the frontend to go
/// away: its connection is shut down (`del` fails after STOP_TIMEOUT).
#[test]
fn deleting_a_connected_function_does_not_wait_for_its_frontend() {
    let dir = TempDir::new("delconn");
    let (fns, _outside) = daemon();
    let sa = spec(&dir.0, "a", 1);
    fns.add(&sa).unwrap();
    let a = attach(&sa.socket, 1);
    fns.del("a").expect("stopped within STOP_TIMEOUT");
    assert!(fns.is_empty());
    // SAFETY: A's objects are only dropped from now on; it has no MR.
    unsafe { a.conn.kill() };
    drop(a);
}

/// (c, d) The control socket: add, list and delete over the protocol;
/// garbage, over-long and non-UTF-8 requests are answered with an error
/// and the server keeps serving.
#[test]
fn the_control_socket_adds_lists_deletes_and_refuses_garbage() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use vrnic_vhost::control::{self, ControlError, ControlServer, Request};

    let dir = TempDir::new("control");
    let (fns, _outside) = daemon();
    let fns = Arc::new(fns);
    let path = dir.0.join("vrnic.control");
    let server = ControlServer::start(&path, fns.clone()).expect("control server");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the owner's only");
    let t = Duration::from_secs(30);

    let sa = spec(&dir.0, "a", 1);
    let added = control::request(&path, &Request::Add(sa.clone()), t).expect("add a");
    assert_eq!(added.len(), 2, "{added:?}");
    assert!(
        added[0].starts_with("# 1 of at most 64 functions"),
        "{added:?}"
    );
    assert!(
        added[1].starts_with(&format!(
            "name=a socket={} mac=02:76:0a:00:00:01 ip=10.0.0.1/24 connected=no",
            sa.socket.display()
        )),
        "{added:?}"
    );
    let sb = spec(&dir.0, "b", 2);
    control::request(&path, &Request::Add(sb.clone()), t).expect("add b");
    let fe = VhostUserTransport::open(&sb.socket).unwrap();
    let list = control::request(&path, &Request::List, t).expect("list");
    assert_eq!(list.len(), 3, "{list:?}");
    assert!(list[1].starts_with("name=a ") && list[1].contains(" connected=no "));
    assert!(list[2].starts_with("name=b ") && list[2].contains(" connected=yes "));
    assert!(list[2].contains(" rx_frames=0 "), "{list:?}");

    match control::request(&path, &Request::Add(sa.clone()), t) {
        Err(ControlError::Refused(m)) => assert!(m.contains("already used"), "{m}"),
        other => panic!("{other:?}"),
    }
    for garbage in ["", "hello", "add x=y", "del", "list please", "del a b"] {
        match control::request_line(&path, garbage, t) {
            Err(ControlError::Refused(m)) => assert!(m.starts_with("bad request"), "{m}"),
            other => panic!("{garbage:?}: {other:?}"),
        }
    }
    // Not UTF-8, and longer than MAX_REQUEST without a newline.
    for raw in [
        vec![0xff, 0xfe, b'\n'],
        vec![b'a'; control::MAX_REQUEST * 4],
    ] {
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(t)).unwrap();
        // The server may close before reading everything: ignore EPIPE.
        let _ = s.write_all(&raw);
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(reply.starts_with("error bad request"), "{reply:?}");
    }

    control::request(&path, &Request::Del("b".into()), t).expect("del b");
    drop(fe);
    match control::request(&path, &Request::Del("b".into()), t) {
        Err(ControlError::Refused(m)) => assert!(m.contains("no function b"), "{m}"),
        other => panic!("{other:?}"),
    }
    let list = control::request(&path, &Request::List, t).unwrap();
    assert_eq!(list.len(), 2, "{list:?}");
    drop(server);
    assert!(!path.exists(), "the control socket is removed");
}

/// A QP addressing its own function's IP: the device resolves its own
/// address to its own MAC, the switch loops the frames back, and a SEND
/// between two QPs of one function completes without touching the uplink.
#[test]
fn a_qp_can_send_to_a_qp_of_its_own_function() {
    let dir = TempDir::new("self");
    let (fns, outside) = daemon();
    let sa = spec(&dir.0, "a", 1);
    fns.add(&sa).unwrap();
    let mut a = attach(&sa.socket, 1);
    let mut q1 = qp(&a);
    let mut q2 = qp(&a);
    let own = gid(&a.ctx);
    let peer = |q: &Qp| Peer {
        gid: own,
        qpn: q.qp_num(),
        psn: 5,
    };
    let (to_q2, to_q1) = (peer(&q2), peer(&q1));
    connect_rc(&mut q1, to_q2, 5);
    connect_rc(&mut q2, to_q1, 5);
    let data = pattern(3000, 4);
    let src = buffer(&a, 3000, &data);
    let dst = buffer(&a, 3000, &[]);
    recv(&mut q2, 3, Some(dst.sge(0, 3000)));
    send(&mut q1, 4, &src, 3000);
    let mut got = [cqe(&mut a), cqe(&mut a)];
    got.sort_by_key(|c| c.wr_id);
    assert_eq!(
        got.map(|c| (c.wr_id, c.status)),
        [(3, abi::WC_SUCCESS), (4, abi::WC_SUCCESS)]
    );
    assert_eq!(dst.to_vec(), data);
    assert_eq!(outside.pending(), 0, "nothing reached the uplink");
    assert_eq!(fns.switch().uplink_stats().tx_frames, 0);
}

/// Through the uplink: a device outside the daemon (another daemon on the
/// uplink's other end) runs RC with one of two connected functions; the
/// uplink's frames reach the function whichever function's worker reads
/// the uplink.
#[test]
fn a_function_talks_to_a_device_beyond_the_uplink() {
    use vrnic_frontend::TestDaemon;
    let dir = TempDir::new("uplink");
    let (fns, outside) = daemon();
    let sa = spec(&dir.0, "a", 1);
    let sb = spec(&dir.0, "b", 2);
    fns.add(&sa).unwrap();
    fns.add(&sb).unwrap();
    let mut cfg = vrnic_frontend::test_device_config();
    cfg.ipv4 = ip(3).addr;
    cfg.mac = vrnic_vhost::addr::Mac::from_ipv4(cfg.ipv4).0;
    let far = TestDaemon::with_device(cfg, Box::new(outside)).expect("the far daemon");
    let _a = attach(&sa.socket, 1);
    let mut b = attach(&sb.socket, 2);
    let mut c = attach(far.socket(), 3);
    let mut qb = qp(&b);
    let mut qc = qp(&c);
    connect(&b, &mut qb, &c, &mut qc);
    for (from_b, len) in [(true, 5000), (false, 7000)] {
        let data = pattern(len, len as u8);
        let (tx, q_tx, rx, q_rx) = if from_b {
            (&mut b, &mut qb, &mut c, &mut qc)
        } else {
            (&mut c, &mut qc, &mut b, &mut qb)
        };
        let src = buffer(tx, len, &data);
        let dst = buffer(rx, len, &[]);
        recv(q_rx, 1, Some(dst.sge(0, len)));
        send(q_tx, 2, &src, len);
        let rc = cqe(rx);
        assert_eq!((rc.wr_id, rc.status), (1, abi::WC_SUCCESS), "{rc:?}");
        assert_eq!(dst.to_vec(), data);
        assert_eq!(cqe(tx).status, abi::WC_SUCCESS);
    }
    let port = fns
        .switch()
        .port_stats(vrnic_vhost::addr::Mac::from_ipv4(ip(2).addr).0);
    assert!(
        port.is_some_and(|p| p.rx_uplink >= 7 && p.tx_uplink >= 5),
        "{port:?}"
    );
    drop((qb, qc, b, c));
    far.stop(WAIT).expect("the far daemon stops");
}

/// Functions the daemon connects to (`connect=PATH`: QEMU listens,
/// `server=on`), several in one daemon: each waits for its frontend's
/// socket, connects, is served, is listed as `connect=`, connects again
/// after its connection ends (a guest outlives a restart of the daemon
/// this way), and is deleted while it waits.
#[test]
fn several_functions_connect_to_their_frontends_and_come_back() {
    use std::os::unix::net::UnixListener;
    use vrnic_frontend::{FrontendOptions, TestFrontend};

    let dir = TempDir::new("connectfns");
    let (fns, _outside) = daemon();
    let specs: Vec<FunctionSpec> = (1..=2u8)
        .map(|i| {
            format!("connect={}/qemu{i}.sock,ip=10.0.0.{i}/24", dir.0.display())
                .parse()
                .unwrap()
        })
        .collect();
    for s in &specs {
        // Added before QEMU listens: the function keeps trying.
        let info = fns.add(s).expect("a connecting function is added");
        assert!(!info.connected);
        assert!(info.to_string().contains(" connect="), "{info}");
    }
    let opts = FrontendOptions::default();
    let listeners: Vec<UnixListener> = specs
        .iter()
        .map(|s| UnixListener::bind(&s.socket).unwrap())
        .collect();
    let pd_of = |fe: &mut TestFrontend| {
        let (h, body) = fe.control(abi::CMD_ALLOC_PD, &[]).unwrap();
        assert_eq!(h.status, abi::STATUS_OK, "{h:?}");
        body
    };
    for (s, l) in specs.iter().zip(&listeners) {
        let mut fe = TestFrontend::accept(l, &opts).expect("the function connects");
        let old = pd_of(&mut fe);
        let info = fns
            .list()
            .into_iter()
            .find(|f| f.socket == s.socket)
            .unwrap();
        assert!(info.connected && info.connect, "{info}");
        drop(fe);
        // The connection ended: the function connects again, to a device
        // reset in between (its objects are gone).
        let mut fe = TestFrontend::accept(l, &opts).expect("the function comes back");
        let (h, _) = fe.control(abi::CMD_DEALLOC_PD, &old).unwrap();
        assert_eq!(h.status, abi::STATUS_ENOENT, "the old PD is gone: {h:?}");
        let pd = pd_of(&mut fe);
        let (h, _) = fe.control(abi::CMD_DEALLOC_PD, &pd).unwrap();
        assert_eq!(h.status, abi::STATUS_OK, "{h:?}");
    }
    // Deleted while its frontend's socket is gone: the function stops
    // trying; the other one stays.
    drop(listeners);
    for s in &specs {
        let _ = std::fs::remove_file(&s.socket);
    }
    fns.del(specs[0].socket.to_str().unwrap())
        .expect("a waiting connecting function is deleted");
    assert_eq!(fns.len(), 1);
    assert!(!specs[0].stats_path().exists(), "its stats socket removed");
}
