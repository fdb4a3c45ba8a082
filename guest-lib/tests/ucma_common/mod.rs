//! Raw rdma_ucm commands and events, laid out as
//! `<rdma/rdma_user_cm.h>`, for the tests of the agent's connection
//! manager (`guest-lib/tests/ucma_agent.rs`, and the vhost-user one in
//! `guest-lib/ibverbs/tests/ucma_file.rs`): what vrnic's `librdmacm.so.1`
//! sends, over [`UcmaConn`].
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use vrnic_guest::agent::ucma::abi as u;
use vrnic_guest::agent::ucma::proto::UcmaConn;
use vrnic_guest::agent::ucma::sockaddr;
use vrnic_guest::verbs::*;

/// Longest any wait for an event lasts.
pub const DEADLINE: Duration = Duration::from_secs(10);

pub fn call(c: &UcmaConn, cmd: u32, body: &[u8], extra: &[u8], out: usize) -> (i32, Vec<u8>) {
    let mut resp = vec![0u8; out];
    let ret = c.call(cmd, body, extra, &mut resp).expect("agent answers");
    (ret, resp)
}

pub fn ok(c: &UcmaConn, cmd: u32, body: &[u8], out: usize) -> Vec<u8> {
    let (ret, resp) = call(c, cmd, body, &[], out);
    assert_eq!(ret, 8 + body.len() as i32, "command {cmd}");
    resp
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn create_id(c: &UcmaConn, uid: u64) -> u32 {
    create_id_ps(c, uid, u::RDMA_PS_TCP as u16, 2)
}

/// CREATE_ID in port space `ps` for a QP of `qp_type` (IBV_QPT_RC 2, UD 4).
pub fn create_id_ps(c: &UcmaConn, uid: u64, ps: u16, qp_type: u8) -> u32 {
    let mut b = [0u8; 24];
    b[0..8].copy_from_slice(&uid.to_ne_bytes());
    b[16..18].copy_from_slice(&ps.to_ne_bytes());
    b[18] = qp_type;
    u32_at(&ok(c, u::RDMA_USER_CM_CMD_CREATE_ID, &b, 4), 0)
}

pub fn destroy_id(c: &UcmaConn, id: u32) -> u32 {
    let mut b = [0u8; 16];
    b[8..12].copy_from_slice(&id.to_ne_bytes());
    u32_at(&ok(c, u::RDMA_USER_CM_CMD_DESTROY_ID, &b, 4), 0)
}

pub fn bind_body(id: u32, a: SocketAddr) -> [u8; 136] {
    let mut b = [0u8; 136];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    let n = sockaddr::emit(&a, &mut b[8..]);
    b[4..6].copy_from_slice(&(n as u16).to_ne_bytes());
    b
}

pub fn listen(c: &UcmaConn, id: u32, backlog: u32) {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    b[4..8].copy_from_slice(&backlog.to_ne_bytes());
    ok(c, u::RDMA_USER_CM_CMD_LISTEN, &b, 0);
}

pub fn resolve_addr(c: &UcmaConn, id: u32, dst: SocketAddr) {
    let mut b = [0u8; 272];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    b[4..8].copy_from_slice(&2000u32.to_ne_bytes());
    let n = sockaddr::emit(&dst, &mut b[144..]);
    b[10..12].copy_from_slice(&(n as u16).to_ne_bytes());
    ok(c, u::RDMA_USER_CM_CMD_RESOLVE_ADDR, &b, 0);
}

pub fn resolve_route(c: &UcmaConn, id: u32) {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    ok(c, u::RDMA_USER_CM_CMD_RESOLVE_ROUTE, &b, 0);
}

pub fn conn_param(qpn: u32, pd: &[u8], valid: bool) -> [u8; 272] {
    let mut p = [0u8; 272];
    p[0..4].copy_from_slice(&qpn.to_ne_bytes());
    p[8..8 + pd.len()].copy_from_slice(pd);
    p[264] = pd.len() as u8;
    p[266] = 1; // responder_resources
    p[267] = 1; // initiator_depth
    p[269] = 7; // retry_count
    p[270] = 7; // rnr_retry_count
    p[271] = valid.into();
    p
}

pub fn connect(c: &UcmaConn, id: u32, qpn: u32, pd: &[u8]) -> i32 {
    let mut b = [0u8; 288];
    b[..272].copy_from_slice(&conn_param(qpn, pd, true));
    b[272..276].copy_from_slice(&id.to_ne_bytes());
    call(c, u::RDMA_USER_CM_CMD_CONNECT, &b, &[], 0).0
}

pub fn accept(c: &UcmaConn, id: u32, uid: u64, param: Option<(u32, &[u8])>) {
    let mut b = [0u8; 296];
    b[0..8].copy_from_slice(&uid.to_ne_bytes());
    if let Some((qpn, pd)) = param {
        b[8..280].copy_from_slice(&conn_param(qpn, pd, true));
    }
    b[280..284].copy_from_slice(&id.to_ne_bytes());
    ok(c, u::RDMA_USER_CM_CMD_ACCEPT, &b, 0);
}

pub fn simple(c: &UcmaConn, cmd: u32, id: u32) -> i32 {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&id.to_ne_bytes());
    call(
        c,
        cmd,
        &b[..if cmd == u::RDMA_USER_CM_CMD_DISCONNECT {
            4
        } else {
            8
        }],
        &[],
        0,
    )
    .0
}

/// An event as GET_EVENT answers it.
#[derive(Debug)]
pub struct Ev {
    pub uid: u64,
    pub id: u32,
    pub event: u32,
    pub status: i32,
    pub qp_num: u32,
    pub private_data: Vec<u8>,
    /// The whole `param` union (UD: `rdma_ucm_ud_param`).
    pub param: Vec<u8>,
}

/// Waits (poll on the wake descriptor, bounded) for the next event.
pub fn get_event(c: &UcmaConn) -> Ev {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut b = [0u8; 8];
        b[0..8].copy_from_slice(&0u64.to_ne_bytes());
        let (ret, r) = call(c, u::RDMA_USER_CM_CMD_GET_EVENT, &b, &[], 336);
        if ret == -libc::EAGAIN {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no event within {DEADLINE:?}");
            let mut p = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&c.wake),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one live pollfd.
            unsafe { libc::poll(&mut p, 1, left.as_millis() as i32) };
            continue;
        }
        assert_eq!(ret, 16);
        let len = r[20 + 264] as usize;
        return Ev {
            uid: u64::from_ne_bytes(r[0..8].try_into().unwrap()),
            id: u32_at(&r, 8),
            event: u32_at(&r, 12),
            status: u32_at(&r, 16) as i32,
            qp_num: u32_at(&r, 20),
            private_data: r[28..28 + len].to_vec(),
            param: r[20..324].to_vec(),
        };
    }
}

pub fn no_event(c: &UcmaConn) {
    let (ret, _) = call(c, u::RDMA_USER_CM_CMD_GET_EVENT, &[0; 8], &[], 336);
    assert_eq!(ret, -libc::EAGAIN);
}

/// INIT_QP_ATTR → ibv_modify_qp, as librdmacm's rdma_init_qp_attr users do.
pub fn modify(c: &UcmaConn, id: u32, qp: &mut Qp, state: QpState) {
    let mut b = [0u8; 16];
    b[8..12].copy_from_slice(&id.to_ne_bytes());
    let st = match state {
        QpState::Init => 1u32,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        _ => unreachable!(),
    };
    b[12..16].copy_from_slice(&st.to_ne_bytes());
    let r = ok(c, u::RDMA_USER_CM_CMD_INIT_QP_ATTR, &b, 144);
    let mask = u32_at(&r, 0);
    let ah = &r[40..72];
    let attr = QpAttr {
        qp_state: state,
        path_mtu: u32_at(&r, 12),
        qkey: u32_at(&r, 20),
        rq_psn: u32_at(&r, 24),
        sq_psn: u32_at(&r, 28),
        dest_qp_num: u32_at(&r, 32),
        qp_access_flags: u32_at(&r, 36) | ACCESS_LOCAL_WRITE,
        ah_attr: AhAttr {
            dgid: Gid {
                raw: ah[0..16].try_into().unwrap(),
            },
            flow_label: u32_at(ah, 16),
            sgid_index: ah[20],
            hop_limit: ah[21],
            traffic_class: ah[22],
            is_global: ah[29] != 0,
            port_num: ah[30],
            ..Default::default()
        },
        pkey_index: u16::from_ne_bytes([r[124], r[125]]),
        max_rd_atomic: r[130],
        max_dest_rd_atomic: r[131],
        min_rnr_timer: r[132],
        port_num: r[133],
        timeout: r[134],
        retry_cnt: r[135],
        rnr_retry: r[136],
    };
    qp.modify(&attr, mask)
        .unwrap_or_else(|e| panic!("modify to {state:?}: {e}"));
}
