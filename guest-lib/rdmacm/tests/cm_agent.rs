//! The library against a scripted fake agent (`common/fake_agent.rs`),
//! driven through its C ABI by `tests/c/cm_agent.c`: the rdma_ucm commands
//! it sends, in order and with their fields, and what it makes of the
//! answers and events. `active` and `passive` need a device for their
//! QPs: vrnic's libibverbs with `VRNIC_LOOPBACK` (root, for AF_PACKET).

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::fake_agent::{bytes, event, read, zeroed, Ctx, FakeAgent, Rec, Script};
use common::{
    assert_c_test_ok, compile_c_test, lib_dir, run_bounded, text, vrnic_lib_dir, wait_bounded,
};
use vrnic_guest::agent::ucma::abi as kabi;
use vrnic_rdmacm::ffi as cm;

const LOOPBACK: &str = "netdev=lo,ip=127.0.0.1/8";
const LIMIT: Duration = Duration::from_secs(60);

const QP_STATE: u32 = 1;
const QP_ACCESS_FLAGS: u32 = 8;
const QP_PKEY_INDEX: u32 = 16;
const QP_PORT: u32 = 32;
const QP_AV: u32 = 128;
const QP_PATH_MTU: u32 = 256;
const QP_TIMEOUT: u32 = 512;
const QP_RETRY_CNT: u32 = 1024;
const QP_RNR_RETRY: u32 = 2048;
const QP_RQ_PSN: u32 = 4096;
const QP_MAX_QP_RD_ATOMIC: u32 = 8192;
const QP_MIN_RNR_TIMER: u32 = 32768;
const QP_SQ_PSN: u32 = 65536;
const QP_MAX_DEST_RD_ATOMIC: u32 = 131072;

fn run(exe: &Path, mode: &str, env: &[(&str, &OsStr)]) -> Output {
    let mut c = Command::new(exe);
    c.arg(mode)
        .env_remove("VRNIC_LOOPBACK")
        .env("VRNIC_RDMACM_DEBUG", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    run_bounded(&mut c, LIMIT)
}

/// `::ffff:127.0.0.1`, the RoCEv2 GID of 127.0.0.1.
fn gid_v4(a: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&a);
    g
}

/// An IPv4 address in the ABI's `sockaddr_in6` slot.
fn sin(a: [u8; 4], port: u16) -> kabi::sockaddr_in6 {
    let s = libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(a),
        },
        sin_zero: [0; 8],
    };
    read(&bytes(&s))
}

/// `QUERY_ROUTE`'s answer: device `guid`, port 1, `paths` path records.
fn route(guid: u64, paths: u32) -> Vec<u8> {
    let mut r: kabi::rdma_ucm_query_route_resp = zeroed();
    r.node_guid = guid;
    r.port_num = 1;
    r.num_paths = paths;
    r.ibdev_index = u32::MAX;
    r.src_addr = sin([127, 0, 0, 1], 40000);
    r.dst_addr = sin([127, 0, 0, 1], 7471);
    r.ib_route[0].sgid = gid_v4([127, 0, 0, 1]);
    r.ib_route[0].dgid = gid_v4([127, 0, 0, 1]);
    r.ib_route[0].pkey = 0xffffu16.to_be();
    r.ib_route[0].mtu = 3;
    r.ib_route[0].hop_limit = 64;
    bytes(&r)
}

/// `INIT_QP_ATTR`'s answer for an RC QP in the asked state, as the
/// kernel's `cm_init_qp_*_attr` gives it; `dest_qpn` the peer's QP.
fn qp_attr(rec: &Rec, dest_qpn: u32) -> Vec<u8> {
    let c: kabi::rdma_ucm_init_qp_attr = rec.as_();
    let mut a: kabi::ib_uverbs_qp_attr = zeroed();
    a.qp_state = c.qp_state;
    match c.qp_state {
        1 => {
            a.qp_attr_mask = QP_STATE | QP_ACCESS_FLAGS | QP_PKEY_INDEX | QP_PORT;
            a.qp_access_flags = 2 | 4; // REMOTE_WRITE | REMOTE_READ
            a.port_num = 1;
        }
        2 => {
            a.qp_attr_mask = QP_STATE
                | QP_AV
                | QP_PATH_MTU
                | QP_DEST_QPN
                | QP_RQ_PSN
                | QP_MAX_DEST_RD_ATOMIC
                | QP_MIN_RNR_TIMER;
            a.ah_attr.grh.dgid = gid_v4([127, 0, 0, 1]);
            a.ah_attr.grh.sgid_index = 1;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.path_mtu = 3;
            a.dest_qp_num = dest_qpn;
            a.rq_psn = 100;
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 12;
        }
        3 => {
            a.qp_attr_mask = QP_STATE
                | QP_SQ_PSN
                | QP_TIMEOUT
                | QP_RETRY_CNT
                | QP_RNR_RETRY
                | QP_MAX_QP_RD_ATOMIC;
            a.sq_psn = 200;
            a.timeout = 14;
            a.retry_cnt = 7;
            a.rnr_retry = 7;
            a.max_rd_atomic = 1;
        }
        _ => {}
    }
    bytes(&a)
}
const QP_DEST_QPN: u32 = 1 << 20;

/// An event whose connection parameters carry `private` and `qp_num`.
fn conn_event(handle: u32, ev: u32, private: &[u8], qp_num: u32) -> kabi::rdma_ucm_event_resp {
    let mut e = event(handle, ev, 0);
    let mut p: kabi::rdma_ucm_conn_param = zeroed();
    p.private_data[..private.len()].copy_from_slice(private);
    p.private_data_len = private.len() as u8;
    p.qp_num = qp_num;
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p.valid = 1;
    e.param.conn = p;
    e
}

/// The handle a command names (`id` at the offset of its structure).
fn handle_of(rec: &Rec) -> u32 {
    match rec.cmd {
        kabi::RDMA_USER_CM_CMD_RESOLVE_IP => rec.as_::<kabi::rdma_ucm_resolve_ip>().id,
        kabi::RDMA_USER_CM_CMD_BIND_IP => rec.as_::<kabi::rdma_ucm_bind_ip>().id,
        kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => rec.as_::<kabi::rdma_ucm_query>().id,
        kabi::RDMA_USER_CM_CMD_CONNECT => rec.as_::<kabi::rdma_ucm_connect>().id,
        kabi::RDMA_USER_CM_CMD_ACCEPT => rec.as_::<kabi::rdma_ucm_accept>().id,
        kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR => rec.as_::<kabi::rdma_ucm_init_qp_attr>().id,
        _ => read::<u32>(&rec.body),
    }
}

/// The first device's node GUID as `cm_agent guid` prints it.
fn loopback_guid(exe: &Path, dir: &Path) -> u64 {
    let out = run(
        exe,
        "guid",
        &[
            ("LD_LIBRARY_PATH", dir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
        ],
    );
    assert_c_test_ok("cm_agent", &out);
    let t = text(&out);
    let g = t
        .lines()
        .find_map(|l| l.strip_prefix("guid 0x"))
        .unwrap_or_else(|| panic!("no guid in:\n{t}"));
    u64::from_str_radix(g.trim(), 16).expect("hex guid")
}

/// The commands' names in order, without GET_EVENTs.
fn names(log: &[Rec]) -> Vec<String> {
    log.iter()
        .filter(|r| r.cmd != kabi::RDMA_USER_CM_CMD_GET_EVENT)
        .map(|r| match r.cmd {
            kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR => format!(
                "INIT_QP_ATTR({})",
                r.as_::<kabi::rdma_ucm_init_qp_attr>().qp_state
            ),
            c => cmd_name(c).to_string(),
        })
        .collect()
}

fn cmd_name(c: u32) -> &'static str {
    match c {
        kabi::RDMA_USER_CM_CMD_CREATE_ID => "CREATE_ID",
        kabi::RDMA_USER_CM_CMD_DESTROY_ID => "DESTROY_ID",
        kabi::RDMA_USER_CM_CMD_BIND_IP => "BIND_IP",
        kabi::RDMA_USER_CM_CMD_RESOLVE_IP => "RESOLVE_IP",
        kabi::RDMA_USER_CM_CMD_RESOLVE_ROUTE => "RESOLVE_ROUTE",
        kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => "QUERY_ROUTE",
        kabi::RDMA_USER_CM_CMD_CONNECT => "CONNECT",
        kabi::RDMA_USER_CM_CMD_LISTEN => "LISTEN",
        kabi::RDMA_USER_CM_CMD_ACCEPT => "ACCEPT",
        kabi::RDMA_USER_CM_CMD_REJECT => "REJECT",
        kabi::RDMA_USER_CM_CMD_DISCONNECT => "DISCONNECT",
        kabi::RDMA_USER_CM_CMD_GET_EVENT => "GET_EVENT",
        kabi::RDMA_USER_CM_CMD_SET_OPTION => "SET_OPTION",
        kabi::RDMA_USER_CM_CMD_MIGRATE_ID => "MIGRATE_ID",
        _ => "OTHER",
    }
}

/// The vrnic libraries and the device's GUID, or `None` (saying why)
/// where the in-process device cannot be used.
fn loopback_setup(exe: &Path) -> Option<(std::path::PathBuf, u64)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: the in-process device needs root (AF_PACKET)");
        return None;
    }
    let Some(vdir) = vrnic_lib_dir(true) else {
        eprintln!("skipping: vrnic's libibverbs.so.1 could not be built");
        return None;
    };
    let guid = loopback_guid(exe, &vdir);
    assert_ne!(guid, 0, "the loopback device has a node GUID");
    Some((vdir, guid))
}

#[test]
fn active_side_connects_with_rtr_rts_and_accept_after_the_response() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let Some((vdir, guid)) = loopback_setup(&exe) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let mut routed = false;
    let mut qpn = 0;
    let script: Script = Box::new(move |ctx: &mut Ctx, r: &Rec| {
        let h = handle_of(r);
        match r.cmd {
            kabi::RDMA_USER_CM_CMD_RESOLVE_IP => {
                ctx.push(event(h, cm::RDMA_CM_EVENT_ADDR_RESOLVED, 0), false);
                Ok(vec![])
            }
            kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => Ok(route(guid, u32::from(routed))),
            kabi::RDMA_USER_CM_CMD_RESOLVE_ROUTE => {
                routed = true;
                ctx.push(event(h, cm::RDMA_CM_EVENT_ROUTE_RESOLVED, 0), false);
                Ok(vec![])
            }
            kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR => Ok(qp_attr(r, qpn)),
            kabi::RDMA_USER_CM_CMD_CONNECT => {
                // The QP connects to itself.
                qpn = r.as_::<kabi::rdma_ucm_connect>().conn_param.qp_num;
                let e = conn_event(h, cm::RDMA_CM_EVENT_CONNECT_RESPONSE, b"world\0", qpn);
                ctx.push(e, false);
                Ok(vec![])
            }
            kabi::RDMA_USER_CM_CMD_ACCEPT => Ok(vec![]),
            kabi::RDMA_USER_CM_CMD_DISCONNECT => {
                ctx.push(event(h, cm::RDMA_CM_EVENT_DISCONNECTED, 0), false);
                Ok(vec![])
            }
            _ => Err(libc::EOPNOTSUPP),
        }
    });
    let agent = FakeAgent::start(script);
    let out = run(
        &exe,
        "active",
        &[
            ("LD_LIBRARY_PATH", vdir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    let log = agent.log();
    assert_eq!(
        names(&log),
        [
            "CREATE_ID",
            "RESOLVE_IP",
            "QUERY_ROUTE",
            "RESOLVE_ROUTE",
            "QUERY_ROUTE",
            "INIT_QP_ATTR(1)",
            "CONNECT",
            "INIT_QP_ATTR(1)",
            "INIT_QP_ATTR(2)",
            "INIT_QP_ATTR(3)",
            "ACCEPT",
            "DISCONNECT",
            "DESTROY_ID",
        ],
        "{}",
        text(&out)
    );
    let c: kabi::rdma_ucm_connect = log
        .iter()
        .find(|r| r.cmd == kabi::RDMA_USER_CM_CMD_CONNECT)
        .unwrap()
        .as_();
    let t = text(&out);
    let qpn: u32 = t
        .lines()
        .find_map(|l| l.strip_prefix("qpn "))
        .and_then(|q| q.trim().parse().ok())
        .expect("qpn line");
    assert_eq!(c.conn_param.qp_num, qpn, "CONNECT names the id's QP");
    assert_eq!(&c.conn_param.private_data[..6], b"hello\0");
    assert_eq!(c.conn_param.private_data_len, 6);
    assert_eq!(
        (
            c.conn_param.responder_resources,
            c.conn_param.initiator_depth
        ),
        (1, 1)
    );
    assert_eq!(
        (c.conn_param.retry_count, c.conn_param.rnr_retry_count),
        (7, 7)
    );
    assert_eq!(c.conn_param.valid, 1);
    // ACCEPT comes after the GET_EVENT that delivered CONNECT_RESPONSE.
    let pos = |n: &str| log.iter().position(|r| cmd_name(r.cmd) == n).unwrap();
    let connect = pos("CONNECT");
    let accept = pos("ACCEPT");
    assert!(
        log[connect..accept]
            .iter()
            .any(|r| r.cmd == kabi::RDMA_USER_CM_CMD_GET_EVENT),
        "ACCEPT before the CONNECT_RESPONSE was fetched"
    );
    let a: kabi::rdma_ucm_accept = log[accept].as_();
    assert_eq!(
        a.uid, 0,
        "the active side's ACCEPT (RTU) carries no uid, as rdma-core's"
    );
    let r: kabi::rdma_ucm_resolve_ip = log[pos("RESOLVE_IP")].as_();
    assert_eq!(
        bytes(&r.dst_addr)[..8],
        bytes(&sin([127, 0, 0, 1], 7471))[..8],
        "RESOLVE_IP's destination"
    );
    assert_eq!(r.timeout_ms, 2000);
}

#[test]
fn passive_side_gets_a_new_id_on_the_listeners_device_and_accepts() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let Some((vdir, guid)) = loopback_setup(&exe) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let mut new_handle = 0;
    let script: Script = Box::new(move |ctx: &mut Ctx, r: &Rec| {
        let h = handle_of(r);
        match r.cmd {
            kabi::RDMA_USER_CM_CMD_BIND_IP => Ok(vec![]),
            kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => Ok(route(guid, u32::from(h == new_handle))),
            kabi::RDMA_USER_CM_CMD_LISTEN => {
                new_handle = ctx.new_handle(h);
                let e = conn_event(new_handle, cm::RDMA_CM_EVENT_CONNECT_REQUEST, b"hi\0", 0x77);
                ctx.push_request(h, e);
                Ok(vec![])
            }
            kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR => Ok(qp_attr(r, 0x77)),
            kabi::RDMA_USER_CM_CMD_ACCEPT => {
                // The RTU arrives: ESTABLISHED, to the uid ACCEPT gave.
                ctx.push(event(h, cm::RDMA_CM_EVENT_ESTABLISHED, 0), false);
                Ok(vec![])
            }
            _ => Err(libc::EOPNOTSUPP),
        }
    });
    let agent = FakeAgent::start(script);
    let out = run(
        &exe,
        "passive",
        &[
            ("LD_LIBRARY_PATH", vdir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    let log = agent.log();
    assert_eq!(
        names(&log),
        [
            "CREATE_ID",
            "BIND_IP",
            "QUERY_ROUTE",
            "LISTEN",
            "QUERY_ROUTE",
            "QUERY_ROUTE",
            "INIT_QP_ATTR(1)",
            "INIT_QP_ATTR(1)",
            "INIT_QP_ATTR(2)",
            "INIT_QP_ATTR(3)",
            "ACCEPT",
            "DESTROY_ID",
            "DESTROY_ID",
        ],
        "{}",
        text(&out)
    );
    let a = log
        .iter()
        .find(|r| r.cmd == kabi::RDMA_USER_CM_CMD_ACCEPT)
        .unwrap();
    let a: kabi::rdma_ucm_accept = a.as_();
    assert_eq!(a.id, 2, "ACCEPT names the request's new id");
    assert_ne!(a.uid, 0, "ACCEPT gives the new id's uid");
    assert_eq!(a.conn_param.valid, 1);
    let destroyed: Vec<u32> = log
        .iter()
        .filter(|r| r.cmd == kabi::RDMA_USER_CM_CMD_DESTROY_ID)
        .map(|r| r.as_::<kabi::rdma_ucm_destroy_id>().id)
        .collect();
    assert_eq!(destroyed, [2, 1]);
}

#[test]
fn agent_errors_become_errno_and_event_status() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let mut n = 0;
    let script: Script = Box::new(move |ctx: &mut Ctx, r: &Rec| {
        let h = handle_of(r);
        match r.cmd {
            kabi::RDMA_USER_CM_CMD_RESOLVE_IP => {
                n += 1;
                match n {
                    1 => Err(libc::EHOSTUNREACH),
                    3 => {
                        ctx.push(event(h, cm::RDMA_CM_EVENT_ADDR_RESOLVED, 0), false);
                        Ok(vec![])
                    }
                    _ => {
                        let e = event(h, cm::RDMA_CM_EVENT_ADDR_ERROR, -libc::ETIMEDOUT);
                        ctx.push(e, false);
                        Ok(vec![])
                    }
                }
            }
            // A device no process has.
            kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => Ok(route(0xdead_beef_0bad_cafe, 0)),
            _ => Err(libc::EOPNOTSUPP),
        }
    });
    let agent = FakeAgent::start(script);
    let out = run(
        &exe,
        "errors",
        &[
            ("LD_LIBRARY_PATH", lib_dir().as_os_str()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    let t = text(&out);
    assert!(
        t.contains("node GUID") && t.contains("multicast is not supported"),
        "VRNIC_RDMACM_DEBUG says why:\n{t}"
    );
}

#[test]
fn nonblocking_channel_gives_eagain_and_wakes_on_an_event() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let script: Script = Box::new(move |ctx: &mut Ctx, r: &Rec| match r.cmd {
        kabi::RDMA_USER_CM_CMD_RESOLVE_IP => {
            ctx.push(
                event(handle_of(r), cm::RDMA_CM_EVENT_ADDR_RESOLVED, 0),
                false,
            );
            Ok(vec![])
        }
        kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => Ok(route(0, 0)),
        _ => Err(libc::EOPNOTSUPP),
    });
    let agent = FakeAgent::start(script);
    let out = run(
        &exe,
        "nonblock",
        &[
            ("LD_LIBRARY_PATH", lib_dir().as_os_str()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    let gets = agent
        .log()
        .iter()
        .filter(|r| r.cmd == kabi::RDMA_USER_CM_CMD_GET_EVENT)
        .count();
    assert_eq!(
        gets, 3,
        "one GET_EVENT per rdma_get_cm_event, no retry loop"
    );
}

#[test]
fn a_vanished_agent_ends_a_blocked_get_cm_event_with_an_error() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let agent = FakeAgent::start(Box::new(|_: &mut Ctx, _: &Rec| Err(libc::EOPNOTSUPP)));
    let path = agent.path.clone();
    let libs = lib_dir();
    let child = std::thread::spawn(move || {
        run(
            &exe,
            "vanish",
            &[
                ("LD_LIBRARY_PATH", libs.as_os_str()),
                ("VRNIC_AGENT_SOCKET", path.as_os_str()),
            ],
        )
    });
    assert!(
        agent.wait_for(LIMIT, |l| l
            .iter()
            .any(|r| r.cmd == kabi::RDMA_USER_CM_CMD_GET_EVENT)),
        "the program never asked for an event"
    );
    agent.vanish();
    let out = child.join().expect("runner thread");
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    assert!(text(&out).contains("gone errno"), "{}", text(&out));
}

#[test]
fn no_agent_is_enodev_saying_why() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let missing = dir.join("no-agent.sock");
    let out = run(
        &exe,
        "noagent",
        &[
            ("LD_LIBRARY_PATH", lib_dir().as_os_str()),
            ("VRNIC_AGENT_SOCKET", missing.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    let t = text(&out);
    assert!(
        t.contains("no connection manager") && t.contains("no-agent.sock"),
        "VRNIC_RDMACM_DEBUG says why:\n{t}"
    );
}

/// Whether a thread of process `pid` is in poll(2) (or ppoll), waiting up
/// to [`LIMIT`] for one to be.
fn wait_in_poll(pid: u32) -> bool {
    let in_poll = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("syscall")).is_ok_and(|s| {
                    let nr = s.split_whitespace().next().unwrap_or("");
                    [libc::SYS_ppoll, poll_syscall()]
                        .iter()
                        .any(|n| nr == n.to_string())
                })
            })
    };
    let deadline = std::time::Instant::now() + LIMIT;
    while !in_poll() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    in_poll()
}

/// rping's client destroys its event channel while its CM thread waits in
/// `rdma_get_cm_event`, then returns from `main`. With the kernel the
/// waiter stays blocked (its `read(2)` holds the file); here the channel
/// was freed under it and it returned `EBADF`, so rping exited 255 (e2e
/// `software`, vrnic-vrnic). The waiter must stay blocked.
#[test]
fn destroying_a_channel_leaves_its_blocked_waiter_blocked() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let agent = FakeAgent::start(Box::new(|_: &mut Ctx, _: &Rec| Err(libc::EOPNOTSUPP)));
    let mut child = Command::new(&exe)
        .arg("closed")
        .env_remove("VRNIC_LOOPBACK")
        .env("VRNIC_RDMACM_DEBUG", "1")
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("VRNIC_AGENT_SOCKET", &agent.path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cm_agent closed");
    let waiting = agent.wait_for(LIMIT, |l| {
        l.iter().any(|r| r.cmd == kabi::RDMA_USER_CM_CMD_GET_EVENT)
    });
    let polling = waiting && wait_in_poll(child.id());
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        let _ = stdin.write_all(b"go\n");
    }
    let out = wait_bounded(child, "cm_agent closed", LIMIT);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(polling, "the thread never waited in poll(2)");
    assert_c_test_ok("cm_agent", &out);
    assert!(text(&out).contains("still waiting"), "{}", text(&out));
}

#[test]
fn a_thread_waiting_for_events_does_not_hold_up_commands() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let agent = FakeAgent::start(Box::new(|ctx: &mut Ctx, r: &Rec| match r.cmd {
        kabi::RDMA_USER_CM_CMD_RESOLVE_IP => {
            ctx.push(
                event(handle_of(r), cm::RDMA_CM_EVENT_ADDR_RESOLVED, 0),
                false,
            );
            Ok(vec![])
        }
        kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => Ok(route(0, 0)),
        _ => Err(libc::EOPNOTSUPP),
    }));
    let mut child = Command::new(&exe)
        .arg("threads")
        .env_remove("VRNIC_LOOPBACK")
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("VRNIC_AGENT_SOCKET", &agent.path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn cm_agent threads");
    // The waiting thread has had its -EAGAIN: it waits on the wake fd.
    let waiting = agent.wait_for(LIMIT, |l| {
        l.iter().any(|r| r.cmd == kabi::RDMA_USER_CM_CMD_GET_EVENT)
    });
    // ... and is in poll(2) (or ppoll) in the library, not about to enter it.
    let polling = waiting && wait_in_poll(child.id());
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        let _ = stdin.write_all(b"go\n");
    }
    let out = wait_bounded(child, "cm_agent threads", LIMIT);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(waiting, "the thread never asked for an event");
    assert!(polling, "the thread never waited in poll(2)");
    assert_c_test_ok("cm_agent", &out);
    let n = names(&agent.log());
    assert_eq!(n[..3], ["CREATE_ID", "RESOLVE_IP", "QUERY_ROUTE"], "{n:?}");
}

#[test]
fn synchronous_endpoints_get_requests_with_qps() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let Some((vdir, guid)) = loopback_setup(&exe) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let script: Script = Box::new(move |ctx: &mut Ctx, r: &Rec| {
        let h = handle_of(r);
        match r.cmd {
            kabi::RDMA_USER_CM_CMD_BIND_IP => Ok(vec![]),
            kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => Ok(route(guid, 1)),
            kabi::RDMA_USER_CM_CMD_LISTEN => {
                let new = ctx.new_handle(h);
                let e = conn_event(new, cm::RDMA_CM_EVENT_CONNECT_REQUEST, b"", 0x77);
                ctx.push_request(h, e);
                Ok(vec![])
            }
            kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR => Ok(qp_attr(r, 0x77)),
            kabi::RDMA_USER_CM_CMD_ACCEPT => {
                ctx.push(event(h, cm::RDMA_CM_EVENT_ESTABLISHED, 0), false);
                Ok(vec![])
            }
            kabi::RDMA_USER_CM_CMD_DISCONNECT => {
                ctx.push(event(h, cm::RDMA_CM_EVENT_DISCONNECTED, 0), false);
                Ok(vec![])
            }
            _ => Err(libc::EOPNOTSUPP),
        }
    });
    let agent = FakeAgent::start(script);
    let out = run(
        &exe,
        "ep",
        &[
            ("LD_LIBRARY_PATH", vdir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    let log = agent.log();
    assert_eq!(
        names(&log),
        [
            "CREATE_ID",
            "BIND_IP",
            "QUERY_ROUTE",
            "LISTEN",
            "QUERY_ROUTE",
            "MIGRATE_ID",
            "QUERY_ROUTE",
            "INIT_QP_ATTR(1)",
            "INIT_QP_ATTR(1)",
            "INIT_QP_ATTR(2)",
            "INIT_QP_ATTR(3)",
            "ACCEPT",
            "DISCONNECT",
            "DESTROY_ID",
            "DESTROY_ID",
        ],
        "{}",
        text(&out)
    );
    // The request's id moved to a channel of its own, named the old one.
    let m = log
        .iter()
        .find(|r| r.cmd == kabi::RDMA_USER_CM_CMD_MIGRATE_ID)
        .unwrap();
    let c: kabi::rdma_ucm_migrate_id = m.as_();
    assert_eq!((c.id, c.fd), (2, 1));
    assert_ne!(m.chan, 1);
}

/// `poll(2)`'s system call number (-1 where only `ppoll` exists).
fn poll_syscall() -> libc::c_long {
    #[cfg(target_arch = "x86_64")]
    return libc::SYS_poll;
    #[cfg(not(target_arch = "x86_64"))]
    return -1;
}

/// The script's answers for resolving an address and a route to device `guid`.
fn resolving(ctx: &mut Ctx, r: &Rec, guid: u64) -> Option<Result<Vec<u8>, i32>> {
    let h = handle_of(r);
    Some(match r.cmd {
        kabi::RDMA_USER_CM_CMD_RESOLVE_IP => {
            ctx.push(event(h, cm::RDMA_CM_EVENT_ADDR_RESOLVED, 0), false);
            Ok(vec![])
        }
        kabi::RDMA_USER_CM_CMD_QUERY_ROUTE => Ok(route(guid, 1)),
        kabi::RDMA_USER_CM_CMD_RESOLVE_ROUTE => {
            ctx.push(event(h, cm::RDMA_CM_EVENT_ROUTE_RESOLVED, 0), false);
            Ok(vec![])
        }
        _ => return None,
    })
}

#[test]
fn ud_established_gives_the_peers_qpn_qkey_and_address() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let Some((vdir, guid)) = loopback_setup(&exe) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let script: Script = Box::new(move |ctx: &mut Ctx, r: &Rec| {
        if let Some(a) = resolving(ctx, r, guid) {
            return a;
        }
        match r.cmd {
            kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR => {
                // cm_init_qp_init_attr for UD: Q_Key, no access flags.
                let mut a: kabi::ib_uverbs_qp_attr = zeroed();
                a.qp_attr_mask = QP_STATE | QP_PKEY_INDEX | QP_PORT | 64;
                a.qp_state = 1;
                a.port_num = 1;
                a.qkey = 0x0123_4567;
                Ok(bytes(&a))
            }
            kabi::RDMA_USER_CM_CMD_CONNECT => {
                let mut e = event(handle_of(r), cm::RDMA_CM_EVENT_ESTABLISHED, 0);
                let mut u: kabi::rdma_ucm_ud_param = zeroed();
                u.qp_num = 0x99;
                u.qkey = 0x0123_4567;
                u.ah_attr.grh.dgid = gid_v4([127, 0, 0, 1]);
                u.ah_attr.grh.sgid_index = 1;
                u.ah_attr.is_global = 1;
                u.ah_attr.port_num = 1;
                u.private_data[..5].copy_from_slice(b"sidr\0");
                u.private_data_len = 5;
                e.param.ud = u;
                ctx.push(e, false);
                Ok(vec![])
            }
            _ => Err(libc::EOPNOTSUPP),
        }
    });
    let agent = FakeAgent::start(script);
    let out = run(
        &exe,
        "ud",
        &[
            ("LD_LIBRARY_PATH", vdir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    let log = agent.log();
    let c: kabi::rdma_ucm_create_id = log[0].as_();
    assert_eq!((c.ps, c.qp_type), (0x0111, 4), "CREATE_ID: PS_UDP, UD");
    assert_eq!(
        names(&log)[5..],
        ["INIT_QP_ATTR(1)", "CONNECT", "DESTROY_ID"],
        "{}",
        text(&out)
    );
}

#[test]
fn a_rejected_connection_reports_the_reason_and_errors_the_qp() {
    let Some((dir, exe)) = compile_c_test("cm_agent") else {
        return;
    };
    let Some((vdir, guid)) = loopback_setup(&exe) else {
        let _ = std::fs::remove_dir_all(&dir);
        return;
    };
    let script: Script = Box::new(move |ctx: &mut Ctx, r: &Rec| {
        if let Some(a) = resolving(ctx, r, guid) {
            return a;
        }
        match r.cmd {
            kabi::RDMA_USER_CM_CMD_INIT_QP_ATTR => Ok(qp_attr(r, 0x77)),
            kabi::RDMA_USER_CM_CMD_CONNECT => {
                let mut e = conn_event(handle_of(r), cm::RDMA_CM_EVENT_REJECTED, b"no\0", 0);
                e.status = 28;
                ctx.push(e, false);
                Ok(vec![])
            }
            _ => Err(libc::EOPNOTSUPP),
        }
    });
    let agent = FakeAgent::start(script);
    let out = run(
        &exe,
        "rejected",
        &[
            ("LD_LIBRARY_PATH", vdir.as_os_str()),
            ("VRNIC_LOOPBACK", LOOPBACK.as_ref()),
            ("VRNIC_AGENT_SOCKET", agent.path.as_os_str()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_c_test_ok("cm_agent", &out);
    assert!(
        !agent
            .log()
            .iter()
            .any(|r| r.cmd == kabi::RDMA_USER_CM_CMD_ACCEPT),
        "no ACCEPT after a rejection"
    );
}
