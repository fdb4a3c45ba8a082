use super::*;
use std::mem::{offset_of, size_of};

#[test]
fn offsets_are_the_kernel_headers() {
    use abi::*;
    assert_eq!(size_of::<rdma_ucm_create_id>(), 24);
    assert_eq!(offset_of!(rdma_ucm_create_id, ps), 16);
    assert_eq!(offset_of!(rdma_ucm_create_id, qp_type), 18);
    assert_eq!(offset_of!(rdma_ucm_destroy_id, id), 8);
    assert_eq!(
        (
            offset_of!(rdma_ucm_bind_ip, addr),
            offset_of!(rdma_ucm_bind_ip, id)
        ),
        (8, 36)
    );
    assert_eq!(size_of::<rdma_ucm_bind>(), 136);
    assert_eq!(offset_of!(rdma_ucm_bind, addr), 8);
    assert_eq!(
        (
            offset_of!(rdma_ucm_resolve_ip, dst_addr),
            offset_of!(rdma_ucm_resolve_ip, id)
        ),
        (28, 56)
    );
    assert_eq!(size_of::<rdma_ucm_resolve_addr>(), 272);
    assert_eq!(offset_of!(rdma_ucm_resolve_addr, src_addr), 16);
    assert_eq!(offset_of!(rdma_ucm_resolve_addr, dst_addr), 144);
    assert_eq!(offset_of!(rdma_ucm_query, option), 12);
    assert_eq!(size_of::<rdma_ucm_query_route_resp>(), 208);
    assert_eq!(offset_of!(rdma_ucm_query_route_resp, src_addr), 136);
    assert_eq!(offset_of!(rdma_ucm_query_route_resp, num_paths), 192);
    assert_eq!(offset_of!(rdma_ucm_query_route_resp, ibdev_index), 200);
    assert_eq!(size_of::<rdma_ucm_query_addr_resp>(), 280);
    assert_eq!(offset_of!(rdma_ucm_query_addr_resp, pkey), 10);
    assert_eq!(offset_of!(rdma_ucm_query_addr_resp, dst_addr), 144);
    assert_eq!(offset_of!(rdma_ucm_query_addr_resp, ibdev_index), 272);
    assert_eq!(size_of::<rdma_ucm_conn_param>(), 272);
    assert_eq!(offset_of!(rdma_ucm_conn_param, private_data_len), 264);
    assert_eq!(offset_of!(rdma_ucm_conn_param, valid), 271);
    assert_eq!(size_of::<rdma_ucm_ud_param>(), 304);
    assert_eq!(offset_of!(rdma_ucm_ud_param, ah_attr), 8);
    assert_eq!(offset_of!(rdma_ucm_ud_param, private_data), 40);
    assert_eq!(offset_of!(rdma_ucm_ud_param, private_data_len), 296);
    assert_eq!(offset_of!(rdma_ucm_connect, id), 272);
    assert_eq!(size_of::<rdma_ucm_connect>(), 288);
    assert_eq!(offset_of!(rdma_ucm_accept, conn_param), 8);
    assert_eq!(offset_of!(rdma_ucm_accept, id), 280);
    assert_eq!(size_of::<rdma_ucm_accept>(), 296);
    assert_eq!(offset_of!(rdma_ucm_reject, reason), 5);
    assert_eq!(offset_of!(rdma_ucm_reject, private_data), 8);
    assert_eq!(offset_of!(rdma_ucm_init_qp_attr, qp_state), 12);
    assert_eq!(size_of::<rdma_ucm_event_resp>(), EVENT_RESP_LEN);
    assert_eq!(offset_of!(rdma_ucm_event_resp, param), 20);
    assert_eq!(offset_of!(rdma_ucm_set_option, optlen), 20);
    assert_eq!(offset_of!(rdma_ucm_migrate_id, fd), 12);
    assert_eq!(size_of::<ib_user_path_rec>(), 64);
    assert_eq!(offset_of!(ib_user_path_rec, flow_label), 40);
    assert_eq!(offset_of!(ib_user_path_rec, pkey), 52);
    assert_eq!(offset_of!(ib_user_path_rec, packet_life_time), 62);
    assert_eq!(size_of::<ib_path_rec_data>(), PATH_DATA_LEN);
}

fn dev(n: u8) -> DeviceInfo {
    DeviceInfo {
        gids: vec![
            (0, ip_to_gid(format!("fe80::{n}").parse().unwrap())),
            (1, ip_to_gid(format!("10.0.0.{n}").parse().unwrap())),
        ],
        node_guid: [2, 0, 0, 0xff, 0xfe, 0, 0, n],
        mtu: 3,
        ca_ack_delay: 15,
    }
}

/// A tiny deterministic generator for the hostile inputs.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

#[test]
fn hostile_commands_never_panic_and_answer_errnos() {
    let sizes = [
        0usize, 3, 4, 8, 15, 16, 24, 40, 64, 136, 264, 272, 288, 296, 400,
    ];
    let mut u = Ucma::new(dev(1), 7);
    let chans = [u.open_channel().unwrap(), u.open_channel().unwrap()];
    let mut r = Lcg(42);
    for n in 0..20_000u64 {
        let chan = if r.next().is_multiple_of(50) {
            999
        } else {
            chans[(r.next() % 2) as usize]
        };
        let cmd = (r.next() % 26) as u32;
        let len = sizes[(r.next() as usize) % sizes.len()];
        let mut body: Vec<u8> = (0..len).map(|_| r.next() as u8).collect();
        // Small ids, real families and lengths often enough to reach
        // deep states.
        for at in [0usize, 8, 36, 56, 272, 280] {
            if body.len() >= at + 4 && r.next().is_multiple_of(2) {
                body[at..at + 4].copy_from_slice(&((r.next() % 8) as u32).to_ne_bytes());
            }
        }
        for at in [8usize, 16, 144] {
            if body.len() >= at + 16 && r.next().is_multiple_of(2) {
                body[at..at + 2].copy_from_slice(&sockaddr::AF_INET.to_ne_bytes());
                body[at + 4..at + 8].copy_from_slice(&[10, 0, 0, 1]);
            }
        }
        let extra: Vec<u8> = (0..(r.next() % 80)).map(|_| r.next() as u8).collect();
        let out = (r.next() % 400) as u16;
        let (ret, resp) = u.command(n, chan, cmd, &body, &extra, out);
        assert!(
            ret == 8 + body.len() as i32 || (-200..0).contains(&ret),
            "cmd {cmd} len {len}: {ret}"
        );
        if ret < 0 {
            assert!(resp.is_empty());
        }
        if chan == 999 {
            assert_eq!(ret, -libc::EBADF);
        }
        // Garbage MADs too.
        if n.is_multiple_of(7) {
            let mad: Vec<u8> = (0..256).map(|_| r.next() as u8).collect();
            let src = Source {
                gid: vrnic_wire::Gid(ip_to_gid("10.0.0.9".parse().unwrap())),
                qpn: 1,
                pkey_index: 0,
            };
            u.handle_mad(n, src, &mad);
        }
        while u.pop_mad().is_some() {}
    }
    u.poll(u64::MAX / 2);
    for c in chans {
        u.close_channel(u64::MAX / 2, c);
    }
    assert_eq!((u.id_count(), u.channel_count()), (0, 0));
}

fn create(u: &mut Ucma, chan: u32, uid: u64) -> u32 {
    let mut b = [0u8; 24];
    b[0..8].copy_from_slice(&uid.to_ne_bytes());
    b[16..18].copy_from_slice(&(PortSpace::Tcp as u16).to_ne_bytes());
    let (ret, r) = u.command(0, chan, abi::RDMA_USER_CM_CMD_CREATE_ID, &b, &[], 4);
    assert_eq!(ret, 32);
    rd_u32(&r, 0)
}

fn bind(u: &mut Ucma, chan: u32, id: u32, a: &str) -> i32 {
    let mut b = [0u8; 40];
    sockaddr::emit(&a.parse().unwrap(), &mut b[8..36]);
    b[36..40].copy_from_slice(&id.to_ne_bytes());
    u.command(0, chan, abi::RDMA_USER_CM_CMD_BIND_IP, &b, &[], 0)
        .0
}

/// Moves every MAD between `a` (10.0.0.1) and `b` (10.0.0.2).
fn pump(now: u64, a: &mut Ucma, b: &mut Ucma) {
    pump_gids(now, a, b, "10.0.0.1", "10.0.0.2");
}

/// Moves every MAD between `a` (at `ga`) and `b` (at `gb`), checking
/// each is addressed to the other.
fn pump_gids(now: u64, a: &mut Ucma, b: &mut Ucma, ga: &str, gb: &str) {
    fn one(now: u64, from: &mut Ucma, to: &mut Ucma, me: &str, peer: &str) -> bool {
        let mut moved = false;
        while let Some(m) = from.pop_mad() {
            moved = true;
            assert_eq!(m.to_gid.0, ip_to_gid(peer.parse().unwrap()));
            let src = Source {
                gid: vrnic_wire::Gid(ip_to_gid(me.parse().unwrap())),
                qpn: 1,
                pkey_index: 0,
            };
            to.handle_mad(now, src, &m.mad);
        }
        moved
    }
    for _ in 0..100 {
        let x = one(now, a, b, ga, gb);
        let y = one(now, b, a, gb, ga);
        if !x && !y {
            return;
        }
    }
    panic!("MADs ping-pong forever");
}

fn event_of(u: &mut Ucma, chan: u32) -> (u32, u32, i32) {
    let (ret, r) = u.command(0, chan, abi::RDMA_USER_CM_CMD_GET_EVENT, &[0; 8], &[], 336);
    assert_eq!(ret, 16, "an event");
    (rd_u32(&r, 8), rd_u32(&r, 12), rd_u32(&r, 16) as i32)
}

fn connect_to(u: &mut Ucma, chan: u32, id: u32, dst: &str) {
    // A QP number per id: cm.c rejects a second REQ of one remote QPN
    // as stale.
    let mut b = [0u8; 272];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    let a: SocketAddr = dst.parse().unwrap();
    let n = sockaddr::emit(&a, &mut b[144..]);
    b[10..12].copy_from_slice(&(n as u16).to_ne_bytes());
    assert_eq!(
        u.command(0, chan, abi::RDMA_USER_CM_CMD_RESOLVE_ADDR, &b, &[], 0)
            .0,
        280
    );
    assert_eq!(event_of(u, chan).1, event::ADDR_RESOLVED);
    assert_eq!(
        u.command(
            0,
            chan,
            abi::RDMA_USER_CM_CMD_RESOLVE_ROUTE,
            &b[..8],
            &[],
            0
        )
        .0,
        16
    );
    assert_eq!(event_of(u, chan).1, event::ROUTE_RESOLVED);
    let mut c = [0u8; 288];
    c[0..4].copy_from_slice(&(0x100 + id).to_ne_bytes());
    c[271] = 1;
    c[272..276].copy_from_slice(&id.to_ne_bytes());
    assert_eq!(
        u.command(0, chan, abi::RDMA_USER_CM_CMD_CONNECT, &c, &[], 0)
            .0,
        296
    );
}

#[test]
fn listener_destroyed_with_a_request_waiting_rejects_it_and_backlog_bounds() {
    let (mut a, mut b) = (Ucma::new(dev(1), 1), Ucma::new(dev(2), 2));
    let (ca, cb) = (a.open_channel().unwrap(), b.open_channel().unwrap());
    let l = create(&mut b, cb, 0xb);
    assert_eq!(bind(&mut b, cb, l, "10.0.0.2:80"), 48);
    let mut lb = [0u8; 8];
    lb[0..4].copy_from_slice(&l.to_ne_bytes());
    lb[4..8].copy_from_slice(&1u32.to_ne_bytes()); // backlog 1
    assert_eq!(
        b.command(0, cb, abi::RDMA_USER_CM_CMD_LISTEN, &lb, &[], 0)
            .0,
        16
    );
    // Two requests: the second exceeds the backlog and is rejected.
    let x = create(&mut a, ca, 1);
    let y = create(&mut a, ca, 2);
    connect_to(&mut a, ca, x, "10.0.0.2:80");
    pump(0, &mut a, &mut b);
    connect_to(&mut a, ca, y, "10.0.0.2:80");
    pump(0, &mut a, &mut b);
    assert_eq!(event_of(&mut a, ca), (y, event::REJECTED, 28));
    assert_eq!(b.id_count(), 2, "listener and one request");
    // The listener goes with the request unreported: REJ to x.
    let mut d = [0u8; 16];
    d[8..12].copy_from_slice(&l.to_ne_bytes());
    let (ret, r) = b.command(0, cb, abi::RDMA_USER_CM_CMD_DESTROY_ID, &d, &[], 4);
    assert_eq!((ret, rd_u32(&r, 0)), (24, 0));
    assert_eq!(b.id_count(), 0);
    pump(0, &mut a, &mut b);
    assert_eq!(event_of(&mut a, ca), (x, event::REJECTED, 28));
    assert_eq!(b.connection_count(), 0);
    a.close_channel(0, ca);
    assert_eq!((a.id_count(), a.connection_count()), (0, 0));
}

#[test]
fn full_event_queue_counts_drops() {
    let mut u = Ucma::new(dev(1), 3);
    let c = u.open_channel().unwrap();
    // Two events per id (ADDR_RESOLVED, ROUTE_RESOLVED).
    for _ in 0..MAX_EVENTS_PER_CHANNEL / 2 + 3 {
        let id = create(&mut u, c, 1);
        let mut r = [0u8; 272];
        r[0..4].copy_from_slice(&id.to_ne_bytes());
        let n = sockaddr::emit(&"10.0.0.2:1".parse().unwrap(), &mut r[144..]);
        r[10..12].copy_from_slice(&(n as u16).to_ne_bytes());
        assert_eq!(
            u.command(0, c, abi::RDMA_USER_CM_CMD_RESOLVE_ADDR, &r, &[], 0)
                .0,
            280
        );
        assert_eq!(
            u.command(0, c, abi::RDMA_USER_CM_CMD_RESOLVE_ROUTE, &r[..8], &[], 0)
                .0,
            16
        );
    }
    assert_eq!(u.events_dropped(), 6);
    let mut got = 0;
    while u
        .command(0, c, abi::RDMA_USER_CM_CMD_GET_EVENT, &[0; 8], &[], 336)
        .0
        == 16
    {
        got += 1;
    }
    assert_eq!(got, MAX_EVENTS_PER_CHANNEL);
    assert!(!u.has_event(c));
}

fn query(u: &mut Ucma, chan: u32, id: u32, option: u32, out: u16) -> Vec<u8> {
    let mut q = [0u8; 16];
    q[8..12].copy_from_slice(&id.to_ne_bytes());
    q[12..16].copy_from_slice(&option.to_ne_bytes());
    let (ret, r) = u.command(0, chan, abi::RDMA_USER_CM_CMD_QUERY, &q, &[], out);
    assert_eq!(ret, 24);
    r
}

#[test]
fn queries_name_the_device_only_once_bound_to_its_address() {
    let mut u = Ucma::new(dev(1), 5);
    let c = u.open_channel().unwrap();
    let w = create(&mut u, c, 1);
    assert_eq!(bind(&mut u, c, w, "0.0.0.0:7"), 48);
    let r = query(&mut u, c, w, abi::RDMA_USER_CM_QUERY_ADDR, 280);
    assert_eq!(
        (&r[0..8], r[8]),
        (&[0u8; 8][..], 0),
        "a wildcard has no device"
    );
    assert_eq!(
        sockaddr::parse(&r[16..]).unwrap(),
        "0.0.0.0:7".parse().unwrap()
    );
    let id = create(&mut u, c, 2);
    let mut b = [0u8; 272];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    let n = sockaddr::emit(&"10.0.0.2:9".parse().unwrap(), &mut b[144..]);
    b[10..12].copy_from_slice(&(n as u16).to_ne_bytes());
    assert_eq!(
        u.command(0, c, abi::RDMA_USER_CM_CMD_RESOLVE_ADDR, &b, &[], 0)
            .0,
        280
    );
    let r = query(&mut u, c, id, abi::RDMA_USER_CM_QUERY_ADDR, 280);
    assert_eq!(&r[0..8], &dev(1).node_guid);
    assert_eq!((r[8], u16::from_ne_bytes([r[10], r[11]])), (1, 0xffff));
    let src = sockaddr::parse(&r[16..]).unwrap();
    assert_eq!(src.ip(), "10.0.0.1".parse::<IpAddr>().unwrap());
    assert!(super::super::ports::EPHEMERAL.contains(&src.port()));
    // No path before the route, one after.
    let r = query(&mut u, c, id, abi::RDMA_USER_CM_QUERY_PATH, 8 + 72 * 6);
    assert_eq!(rd_u32(&r, 0), 0);
    assert_eq!(
        u.command(0, c, abi::RDMA_USER_CM_CMD_RESOLVE_ROUTE, &b[..8], &[], 0)
            .0,
        16
    );
    let r = query(&mut u, c, id, abi::RDMA_USER_CM_QUERY_PATH, 8 + 72 * 6);
    assert_eq!(rd_u32(&r, 0), 1);
    let rec = &r[16..80];
    assert_eq!(&rec[8..24], &ip_to_gid("10.0.0.2".parse().unwrap()), "dgid");
    assert_eq!(
        &rec[24..40],
        &ip_to_gid("10.0.0.1".parse().unwrap()),
        "sgid"
    );
    assert_eq!(rec[47], HOP_LIMIT);
    assert_eq!(rec[54] & 0x3f, 3, "the port's MTU");
    // GIDs as sockaddr_ib.
    let r = query(&mut u, c, id, abi::RDMA_USER_CM_QUERY_GID, 280);
    assert_eq!(sockaddr::family(&r[16..]), sockaddr::AF_IB);
    assert_eq!(&r[24..40], &ip_to_gid("10.0.0.1".parse().unwrap()));
    assert_eq!(&r[152..168], &ip_to_gid("10.0.0.2".parse().unwrap()));
    // Too small an answer: ENOSPC, as ucma.c.
    let mut q = [0u8; 16];
    q[8..12].copy_from_slice(&id.to_ne_bytes());
    assert_eq!(
        u.command(0, c, abi::RDMA_USER_CM_CMD_QUERY, &q, &[], 100).0,
        -libc::ENOSPC
    );
}

#[test]
fn ipv6_connection_request_and_response() {
    let dev6 = |n: u8| DeviceInfo {
        gids: vec![
            (0, ip_to_gid(format!("fe80::{n}").parse().unwrap())),
            (1, ip_to_gid(format!("10.0.0.{n}").parse().unwrap())),
            (2, ip_to_gid(format!("fd00::{n}").parse().unwrap())),
        ],
        ..dev(n)
    };
    let (mut a, mut b) = (Ucma::new(dev6(1), 1), Ucma::new(dev6(2), 2));
    let (ca, cb) = (a.open_channel().unwrap(), b.open_channel().unwrap());
    let l = create(&mut b, cb, 0xb);
    assert_eq!(bind(&mut b, cb, l, "[::]:80"), 48);
    let mut lb = [0u8; 8];
    lb[0..4].copy_from_slice(&l.to_ne_bytes());
    assert_eq!(
        b.command(0, cb, abi::RDMA_USER_CM_CMD_LISTEN, &lb, &[], 0)
            .0,
        16
    );
    let x = create(&mut a, ca, 1);
    connect_to(&mut a, ca, x, "[fd00::2]:80");
    pump_gids(0, &mut a, &mut b, "fd00::1", "fd00::2");
    let (ret, r) = b.command(0, cb, abi::RDMA_USER_CM_CMD_GET_EVENT, &[0; 8], &[], 336);
    assert_eq!((ret, rd_u32(&r, 12)), (16, event::CONNECT_REQUEST));
    let new = rd_u32(&r, 8);
    // The new id: its addresses from the rdma_cm header, its RTR AV
    // to the requester's GID from its own GID index.
    let mut q = [0u8; 16];
    q[8..12].copy_from_slice(&new.to_ne_bytes());
    q[12..16].copy_from_slice(&abi::RDMA_USER_CM_QUERY_ADDR.to_ne_bytes());
    let (_, qa) = b.command(0, cb, abi::RDMA_USER_CM_CMD_QUERY, &q, &[], 280);
    assert_eq!(
        sockaddr::parse(&qa[16..]).unwrap(),
        "[fd00::2]:80".parse().unwrap()
    );
    assert_eq!(
        sockaddr::parse(&qa[144..]).unwrap().ip(),
        "fd00::1".parse::<IpAddr>().unwrap()
    );
    let mut ia = [0u8; 16];
    ia[8..12].copy_from_slice(&new.to_ne_bytes());
    ia[12..16].copy_from_slice(&qpattr::QPS_RTR.to_ne_bytes());
    let (ret, at) = b.command(0, cb, abi::RDMA_USER_CM_CMD_INIT_QP_ATTR, &ia, &[], 144);
    assert_eq!(ret, 24);
    assert_eq!(&at[40..56], &ip_to_gid("fd00::1".parse().unwrap()));
    assert_eq!(at[60], 2, "sgid_index of fd00::2");
    a.close_channel(0, ca);
    b.close_channel(0, cb);
    pump_gids(0, &mut a, &mut b, "fd00::1", "fd00::2");
    assert_eq!((a.id_count(), b.id_count()), (0, 0));
}

#[test]
fn source_address_choice() {
    let d = dev(3);
    assert_eq!(
        d.source_for("10.9.9.9".parse().unwrap()),
        Some("10.0.0.3".parse().unwrap())
    );
    assert_eq!(
        d.source_for("fd00::1".parse().unwrap()),
        Some("fe80::3".parse().unwrap())
    );
    assert_eq!(d.gid_index("10.0.0.3".parse().unwrap()), Some(1));
    assert_eq!(d.gid_index("10.0.0.4".parse().unwrap()), None);
}
