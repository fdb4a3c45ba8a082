//! The connection manager service's state, without I/O: event channels,
//! rdma_cm ids, the port spaces, the IB CM ([`vrnic_cm::Cm`]) and the
//! rdma_ucm commands on them (Linux 6.1 `drivers/infiniband/core/ucma.c`
//! for the commands and events, `cma.c` for the ids' states and errnos).
//!
//! [`Ucma::command`] executes one command of a channel and gives the
//! answer's `ret` and response; [`Ucma::handle_mad`] and [`Ucma::poll`]
//! feed the CM; [`Ucma::pop_mad`] gives what to send on QP1. Events wait
//! in their channel's bounded queue until `GET_EVENT`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};

use vrnic_cm::{
    Cm, CmEventKind, CmId, CmState, Outgoing, PathParams, PortIdentity, RepParams, ReqParams,
    Source, CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME, CMA_MAX_CM_RETRIES,
};
use vrnic_wire::{rej_reason, service_id, CmaAddrs, CmaHdr, PortSpace};

use super::abi;
use super::ports::Ports;
use super::qpattr::{self, ConnAttrs, QpAttrInput};
use super::sockaddr::{self, ip_to_gid};

/// The most event channels (rdma_ucm connections) one agent serves;
/// beyond it a HELLO is refused with `EMFILE`.
pub const MAX_CHANNELS: usize = 256;
/// The most ids one channel holds; `CREATE_ID` beyond it: `-ENOMEM`. A
/// CONNECT_REQUEST beyond it is rejected (REJ consumer defined, as the
/// kernel's failing handler).
pub const MAX_IDS_PER_CHANNEL: usize = 1024;
/// The most events waiting in one channel; beyond it an event is dropped
/// and counted ([`Ucma::events_dropped`]); a dropped CONNECT_REQUEST's
/// new id is destroyed (its REQ rejected).
pub const MAX_EVENTS_PER_CHANNEL: usize = 1024;
/// rdma_cm's largest listen backlog (`ucma.c` `max_backlog`, 1024).
pub const MAX_BACKLOG: u32 = 1024;
/// The hop limit of a RoCEv2 route (the IP TTL `cma_resolve_iboe_route`
/// takes, 64).
pub const HOP_LIMIT: u8 = 64;
/// `sizeof(struct rdma_ucm_event_resp)`.
pub const EVENT_RESP_LEN: usize = 336;
/// `struct ib_path_rec_data` size.
const PATH_DATA_LEN: usize = 72;

/// librdmacm's `enum rdma_cm_event_type`.
#[allow(missing_docs)]
pub mod event {
    pub const ADDR_RESOLVED: u32 = 0;
    pub const ADDR_ERROR: u32 = 1;
    pub const ROUTE_RESOLVED: u32 = 2;
    pub const ROUTE_ERROR: u32 = 3;
    pub const CONNECT_REQUEST: u32 = 4;
    pub const CONNECT_RESPONSE: u32 = 5;
    pub const CONNECT_ERROR: u32 = 6;
    pub const UNREACHABLE: u32 = 7;
    pub const REJECTED: u32 = 8;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
    pub const DEVICE_REMOVAL: u32 = 11;
    pub const MULTICAST_JOIN: u32 = 12;
    pub const MULTICAST_ERROR: u32 = 13;
    pub const ADDR_CHANGE: u32 = 14;
    pub const TIMEWAIT_EXIT: u32 = 15;
}

/// What the service knows of its device function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The port's GIDs (index, GID); RoCEv2: IPv4-mapped or IPv6
    /// addresses, the function's addresses.
    pub gids: Vec<(u8, [u8; 16])>,
    /// The node GUID as `ibv_query_device` reports it (`node_guid`, big
    /// endian bytes: the EUI-64 of the MAC), which librdmacm compares with
    /// `ibv_get_device_guid`.
    pub node_guid: [u8; 8],
    /// The port's active MTU (IBA encoding).
    pub mtu: u8,
    /// The CA's ACK delay exponent (`cm_ack_timeout`'s).
    pub ca_ack_delay: u8,
}

impl DeviceInfo {
    /// The GID index of `ip`, `None` when it is not the function's.
    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        let g = ip_to_gid(ip);
        self.gids.iter().find(|(_, x)| *x == g).map(|(i, _)| *i)
    }

    /// The source address for reaching `dst` (cma.c: the GID of the
    /// source IP of the same family): the first IPv4 GID for IPv4, the
    /// first non-link-local IPv6 GID (else a link-local one) for IPv6.
    pub fn source_for(&self, dst: IpAddr) -> Option<IpAddr> {
        let ips = self.gids.iter().map(|(_, g)| sockaddr::gid_to_ip(g));
        match dst {
            IpAddr::V4(_) => ips.clone().find(|i| i.is_ipv4()),
            IpAddr::V6(_) => {
                let v6: Vec<IpAddr> = ips.filter(|i| i.is_ipv6()).collect();
                v6.iter()
                    .find(|i| !matches!(i, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80))
                    .or(v6.first())
                    .copied()
            }
        }
    }
}

/// An id's `enum rdma_cm_state` (cma.c; the query states are instant here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdState {
    /// `RDMA_CM_IDLE`.
    Idle,
    /// `RDMA_CM_ADDR_BOUND`.
    AddrBound,
    /// `RDMA_CM_ADDR_RESOLVED`.
    AddrResolved,
    /// `RDMA_CM_ROUTE_RESOLVED`.
    RouteResolved,
    /// `RDMA_CM_LISTEN`.
    Listen,
    /// `RDMA_CM_CONNECT`: connecting or connected.
    Connect,
    /// `RDMA_CM_DISCONNECT`.
    Disconnect,
}

/// One rdma_cm id.
#[derive(Debug, Clone)]
struct Id {
    chan: u32,
    uid: u64,
    ps: PortSpace,
    ud: bool,
    state: IdState,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    /// The port held in `Ports`, with its space.
    port: Option<u16>,
    reuseaddr: bool,
    afonly: Option<bool>,
    tos: u8,
    ack_timeout: Option<u8>,
    backlog: u32,
    /// Whether a route was resolved (`num_pri_alt_paths` 1).
    routed: bool,
    /// cma.c `seq_num`: the starting PSN this side advertises.
    seq_num: u32,
    cm: Option<CmId>,
    conn: Option<ConnAttrs>,
    events_reported: u32,
    /// A listener's service ID held in the CM.
    listening: Option<u64>,
}

/// A queued event.
#[derive(Clone)]
struct Event {
    /// The id it counts against (`events_reported`).
    id: u32,
    /// A CONNECT_REQUEST's new id.
    new_id: Option<u32>,
    resp: [u8; EVENT_RESP_LEN],
}

/// One event channel.
#[derive(Default)]
struct Channel {
    events: VecDeque<Event>,
    ids: usize,
}

/// The service's state (see the module documentation).
pub struct Ucma {
    dev: DeviceInfo,
    cm: Cm,
    ids: BTreeMap<u32, Id>,
    by_cm: HashMap<CmId, u32>,
    channels: BTreeMap<u32, Channel>,
    ports: Ports,
    next_id: u32,
    next_channel: u32,
    rng: u64,
    events_dropped: u64,
}

fn rd_u16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}
fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn wr_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// A command's result: the response bytes, or a negative errno.
type Answer = Result<Vec<u8>, i32>;

/// `struct rdma_ucm_conn_param`, decoded.
#[derive(Debug, Clone, Default)]
struct ConnParam {
    qp_num: u32,
    private_data: Vec<u8>,
    srq: bool,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: bool,
    retry_count: u8,
    rnr_retry_count: u8,
    valid: bool,
}

fn conn_param(b: &[u8]) -> ConnParam {
    let len = usize::from(b[264]).min(256);
    ConnParam {
        qp_num: rd_u32(b, 0) & 0xff_ffff,
        private_data: b[8..8 + len].to_vec(),
        srq: b[265] != 0,
        responder_resources: b[266],
        initiator_depth: b[267],
        flow_control: b[268] != 0,
        retry_count: b[269] & 7,
        rnr_retry_count: b[270] & 7,
        valid: b[271] != 0,
    }
}

/// Writes an `rdma_ucm_conn_param` at `b[20..]` of an event.
#[allow(clippy::too_many_arguments)]
fn put_conn(
    resp: &mut [u8; EVENT_RESP_LEN],
    qp_num: u32,
    pd: &[u8],
    srq: bool,
    rr: u8,
    id: u8,
    fc: bool,
    retry: u8,
    rnr: u8,
) {
    let p = &mut resp[20..20 + 272];
    p[0..4].copy_from_slice(&qp_num.to_ne_bytes());
    let n = pd.len().min(256);
    p[8..8 + n].copy_from_slice(&pd[..n]);
    p[264] = n.min(255) as u8;
    p[265] = srq.into();
    p[266] = rr;
    p[267] = id;
    p[268] = fc.into();
    p[269] = retry;
    p[270] = rnr;
}

/// Writes an `rdma_ucm_ud_param` at `resp[20..]` of an event: QPN,
/// Q_Key, the AH to the peer (`ib_init_ah_attr_from_path`) and private
/// data.
fn put_ud(
    resp: &mut [u8; EVENT_RESP_LEN],
    qp_num: u32,
    qkey: u32,
    path: Option<&ConnAttrs>,
    pd: &[u8],
) {
    let p = &mut resp[20..20 + 304];
    p[0..4].copy_from_slice(&qp_num.to_ne_bytes());
    p[4..8].copy_from_slice(&qkey.to_ne_bytes());
    if let Some(c) = path {
        let ah = &mut p[8..40];
        ah[0..16].copy_from_slice(&c.dgid);
        ah[16..20].copy_from_slice(&c.flow_label.to_ne_bytes());
        ah[20] = c.sgid_index;
        ah[21] = c.hop_limit;
        ah[22] = c.traffic_class;
        ah[29] = 1; // is_global
        ah[30] = 1; // port_num
    }
    let n = pd.len().min(255);
    p[40..40 + n].copy_from_slice(&pd[..n]);
    p[296] = n as u8;
}

/// A received connection request: REQ (RC) or SIDR_REQ (UD).
#[derive(Clone, Copy)]
enum Req<'a> {
    Rc(&'a vrnic_wire::CmReq),
    Sidr(&'a vrnic_wire::CmSidrReq),
}

impl Ucma {
    /// A service for a function with `dev`; `seed` randomises comm IDs,
    /// ephemeral ports and starting PSNs.
    pub fn new(dev: DeviceInfo, seed: u64) -> Ucma {
        let gid = dev
            .gids
            .iter()
            .find(|(_, g)| sockaddr::gid_to_ip(g).is_ipv4())
            .or(dev.gids.first())
            .map_or([0; 16], |(_, g)| *g);
        let cm = Cm::new(PortIdentity {
            gid: vrnic_wire::Gid(gid),
            ca_guid: u64::from_be_bytes(dev.node_guid),
            ca_ack_delay: dev.ca_ack_delay,
            seed,
        });
        Ucma {
            dev,
            cm,
            ids: BTreeMap::new(),
            by_cm: HashMap::new(),
            channels: BTreeMap::new(),
            ports: Ports::new(seed as u32),
            next_id: 1,
            next_channel: 1,
            rng: seed | 1,
            events_dropped: 0,
        }
    }

    fn random24(&mut self) -> u32 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        (self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as u32 & 0xff_ffff
    }

    /// Opens an event channel; its number (`MIGRATE_ID`'s `fd`). `None`
    /// when [`MAX_CHANNELS`] are open.
    pub fn open_channel(&mut self) -> Option<u32> {
        if self.channels.len() >= MAX_CHANNELS {
            return None;
        }
        let mut c = self.next_channel;
        while c == 0 || self.channels.contains_key(&c) {
            c = c.wrapping_add(1);
        }
        self.next_channel = c.wrapping_add(1);
        self.channels.insert(c, Channel::default());
        Some(c)
    }

    /// Closes channel `chan` as `ucma_close` does: every id of it is
    /// destroyed (connections get REJ or DREQ as cm.c `cm_destroy_id`
    /// sends them), and its events go.
    pub fn close_channel(&mut self, now_ns: u64, chan: u32) {
        let mine: Vec<u32> = self
            .ids
            .iter()
            .filter(|(_, i)| i.chan == chan)
            .map(|(k, _)| *k)
            .collect();
        for id in mine {
            self.destroy_id(now_ns, id);
        }
        self.channels.remove(&chan);
    }

    /// Whether channel `chan` has an event waiting (its wake descriptor is
    /// then readable).
    pub fn has_event(&self, chan: u32) -> bool {
        self.channels
            .get(&chan)
            .is_some_and(|c| !c.events.is_empty())
    }

    /// How many ids exist.
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    /// How many channels are open.
    pub fn channel_count(&self) -> usize {
        self.channels.len()
    }

    /// The CM's connections (timewait ones included).
    pub fn connection_count(&self) -> usize {
        self.cm.connection_count()
    }

    /// Events dropped because their channel's queue was full.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped
    }

    /// The CM (its counters, listeners).
    pub fn cm(&self) -> &Cm {
        &self.cm
    }

    /// The next MAD to send on QP1.
    pub fn pop_mad(&mut self) -> Option<Outgoing> {
        self.cm.pop_mad()
    }

    /// When [`Ucma::poll`] next has work (ns).
    pub fn next_timer(&self) -> Option<u64> {
        self.cm.next_timer()
    }

    /// Runs the CM's timers due at `now_ns` and maps its events.
    pub fn poll(&mut self, now_ns: u64) {
        self.cm.poll(now_ns);
        self.cm_events(now_ns);
    }

    /// A MAD received on QP1 from `from`.
    pub fn handle_mad(&mut self, now_ns: u64, from: Source, mad: &[u8]) {
        self.cm.handle_mad(now_ns, from, mad);
        self.cm_events(now_ns);
    }

    /// Executes one command of channel `chan` (`cmd`: its header's `cmd`;
    /// `body`: the `in` bytes; `extra`: SET_OPTION's value; `out`: the
    /// header's `out`). Returns `(ret, response)`: `ret` what the kernel
    /// device's `write(2)` returns, the write's length (8 + `in`) or a
    /// negative errno.
    pub fn command(
        &mut self,
        now_ns: u64,
        chan: u32,
        cmd: u32,
        body: &[u8],
        extra: &[u8],
        out: u16,
    ) -> (i32, Vec<u8>) {
        let r = self.dispatch(now_ns, chan, cmd, body, extra, usize::from(out));
        self.cm_events(now_ns);
        match r {
            Ok(resp) => (8 + body.len() as i32, resp),
            Err(e) => (e, Vec::new()),
        }
    }

    fn need(body: &[u8], n: usize) -> Result<(), i32> {
        if body.len() < n {
            Err(-libc::EINVAL)
        } else {
            Ok(())
        }
    }

    fn out_ok(out: usize, n: usize) -> Result<(), i32> {
        if out < n {
            Err(-libc::ENOSPC)
        } else {
            Ok(())
        }
    }

    /// `ucma_get_ctx`: `-ENOENT` for no such id, `-EINVAL` for another
    /// channel's.
    fn get(&self, chan: u32, id: u32) -> Result<&Id, i32> {
        match self.ids.get(&id) {
            None => Err(-libc::ENOENT),
            Some(i) if i.chan != chan => Err(-libc::EINVAL),
            Some(i) => Ok(i),
        }
    }

    fn get_mut(&mut self, chan: u32, id: u32) -> Result<&mut Id, i32> {
        match self.ids.get_mut(&id) {
            None => Err(-libc::ENOENT),
            Some(i) if i.chan != chan => Err(-libc::EINVAL),
            Some(i) => Ok(i),
        }
    }

    fn dispatch(
        &mut self,
        now: u64,
        chan: u32,
        cmd: u32,
        b: &[u8],
        extra: &[u8],
        out: usize,
    ) -> Answer {
        if !self.channels.contains_key(&chan) {
            return Err(-libc::EBADF);
        }
        match cmd {
            abi::RDMA_USER_CM_CMD_CREATE_ID => {
                Self::need(b, 24)?;
                Self::out_ok(out, 4)?;
                self.create_id(chan, rd_u64(b, 0), rd_u16(b, 16), b[18])
            }
            abi::RDMA_USER_CM_CMD_DESTROY_ID => {
                Self::need(b, 16)?;
                Self::out_ok(out, 4)?;
                let id = rd_u32(b, 8);
                let n = self.get(chan, id)?.events_reported;
                self.destroy_id(now, id);
                Ok(n.to_ne_bytes().to_vec())
            }
            abi::RDMA_USER_CM_CMD_BIND_IP => {
                Self::need(b, 40)?;
                let a = sockaddr::parse(&b[8..36]).map_err(|e| e.errno())?;
                self.bind(chan, rd_u32(b, 36), a).map(|_| Vec::new())
            }
            abi::RDMA_USER_CM_CMD_BIND => {
                Self::need(b, 136)?;
                let (id, size) = (rd_u32(b, 0), usize::from(rd_u16(b, 4)));
                if rd_u16(b, 6) != 0 || size == 0 {
                    return Err(-libc::EINVAL);
                }
                let a = sockaddr::parse(&b[8..136]).map_err(|e| e.errno())?;
                if sockaddr::size(&a) != size {
                    return Err(-libc::EINVAL);
                }
                self.bind(chan, id, a).map(|_| Vec::new())
            }
            abi::RDMA_USER_CM_CMD_RESOLVE_IP => {
                Self::need(b, 64)?;
                let src = if sockaddr::family(&b[0..28]) == 0 {
                    None
                } else {
                    Some(sockaddr::parse(&b[0..28]).map_err(|e| e.errno())?)
                };
                let dst = sockaddr::parse(&b[28..56]).map_err(|e| e.errno())?;
                self.resolve_addr(chan, rd_u32(b, 56), src, dst)
            }
            abi::RDMA_USER_CM_CMD_RESOLVE_ADDR => {
                Self::need(b, 272)?;
                let (src_size, dst_size) = (usize::from(rd_u16(b, 8)), usize::from(rd_u16(b, 10)));
                if rd_u32(b, 12) != 0 || dst_size == 0 {
                    return Err(-libc::EINVAL);
                }
                let src = if src_size == 0 {
                    None
                } else {
                    let s = sockaddr::parse(&b[16..144]).map_err(|e| e.errno())?;
                    if sockaddr::size(&s) != src_size {
                        return Err(-libc::EINVAL);
                    }
                    Some(s)
                };
                let dst = sockaddr::parse(&b[144..272]).map_err(|e| e.errno())?;
                if sockaddr::size(&dst) != dst_size {
                    return Err(-libc::EINVAL);
                }
                self.resolve_addr(chan, rd_u32(b, 0), src, dst)
            }
            abi::RDMA_USER_CM_CMD_RESOLVE_ROUTE => {
                Self::need(b, 8)?;
                let id = rd_u32(b, 0);
                let i = self.get_mut(chan, id)?;
                if i.state != IdState::AddrResolved {
                    return Err(-libc::EINVAL);
                }
                i.state = IdState::RouteResolved;
                i.routed = true;
                self.push_simple(id, event::ROUTE_RESOLVED, 0);
                Ok(Vec::new())
            }
            abi::RDMA_USER_CM_CMD_QUERY_ROUTE => {
                Self::need(b, 16)?;
                Self::out_ok(out, 208)?;
                let i = self.get(chan, rd_u32(b, 8))?;
                Ok(self.query_route(i))
            }
            abi::RDMA_USER_CM_CMD_QUERY => {
                Self::need(b, 16)?;
                let i = self.get(chan, rd_u32(b, 8))?;
                match rd_u32(b, 12) {
                    abi::RDMA_USER_CM_QUERY_ADDR => {
                        Self::out_ok(out, 280)?;
                        Ok(self.query_addr(i))
                    }
                    abi::RDMA_USER_CM_QUERY_PATH => {
                        Self::out_ok(out, 8)?;
                        Ok(self.query_path(i, out))
                    }
                    abi::RDMA_USER_CM_QUERY_GID => {
                        Self::out_ok(out, 280)?;
                        Ok(self.query_gid(i))
                    }
                    _ => Err(-libc::ENOSYS),
                }
            }
            abi::RDMA_USER_CM_CMD_LISTEN => {
                Self::need(b, 8)?;
                self.listen(chan, rd_u32(b, 0), rd_u32(b, 4) as i32)
                    .map(|_| Vec::new())
            }
            abi::RDMA_USER_CM_CMD_CONNECT => {
                Self::need(b, 288)?;
                let p = conn_param(&b[0..272]);
                if !p.valid {
                    return Err(-libc::EINVAL);
                }
                self.connect(now, chan, rd_u32(b, 272), &p)
                    .map(|_| Vec::new())
            }
            abi::RDMA_USER_CM_CMD_ACCEPT => {
                Self::need(b, 296)?;
                let p = conn_param(&b[8..280]);
                self.accept(now, chan, rd_u32(b, 280), rd_u64(b, 0), &p)
                    .map(|_| Vec::new())
            }
            abi::RDMA_USER_CM_CMD_REJECT => {
                Self::need(b, 264)?;
                let len = usize::from(b[4]);
                let reason = match b[5] {
                    0 | 28 => rej_reason::CONSUMER_DEFINED,
                    // IB_CM_REJ_VENDOR_OPTION_NOT_SUPPORTED
                    35 => 35,
                    _ => return Err(-libc::EINVAL),
                };
                if len > vrnic_wire::private_data_len::REJ {
                    return Err(-libc::EINVAL);
                }
                let id = rd_u32(b, 0);
                let i = self.get(chan, id)?;
                let (cm, ud) = (i.cm.ok_or(-libc::EINVAL)?, i.ud);
                if ud {
                    // cma.c: `cma_send_sidr_rep(IB_SIDR_REJECT)`.
                    let n = len.min(vrnic_wire::private_data_len::SIDR_REP);
                    self.cm
                        .sidr_reply(cm, vrnic_wire::sidr_status::REJECT, 0, 0, &b[8..8 + n])
                        .map_err(|_| -libc::EINVAL)?;
                    self.by_cm.remove(&cm);
                    if let Some(i) = self.ids.get_mut(&id) {
                        i.cm = None;
                    }
                } else {
                    self.cm
                        .reject(now, cm, reason, &b[8..8 + len])
                        .map_err(|_| -libc::EINVAL)?;
                }
                Ok(Vec::new())
            }
            abi::RDMA_USER_CM_CMD_DISCONNECT => {
                Self::need(b, 4)?;
                self.disconnect(now, chan, rd_u32(b, 0)).map(|_| Vec::new())
            }
            abi::RDMA_USER_CM_CMD_INIT_QP_ATTR => {
                Self::need(b, 16)?;
                Self::out_ok(out, size_of::<abi::ib_uverbs_qp_attr>())?;
                let i = self.get(chan, rd_u32(b, 8))?;
                let qp_state = rd_u32(b, 12);
                // cm.c `cm_init_qp_*_attr`: the CM id's state must have
                // the attributes (none before REP on the active side, none
                // once disconnecting or rejected).
                if let (Some(cm), false) = (i.cm, i.ud) {
                    let st = self.cm.state(cm);
                    let ok = match qp_state {
                        qpattr::QPS_INIT => matches!(
                            st,
                            Some(
                                CmState::ReqSent
                                    | CmState::ReqRcvd
                                    | CmState::RepRcvd
                                    | CmState::RepSent
                                    | CmState::Established
                            )
                        ),
                        qpattr::QPS_RTR | qpattr::QPS_RTS => matches!(
                            st,
                            Some(
                                CmState::ReqRcvd
                                    | CmState::RepRcvd
                                    | CmState::RepSent
                                    | CmState::Established
                            )
                        ),
                        _ => false,
                    };
                    if !ok {
                        return Err(-libc::EINVAL);
                    }
                }
                let input = QpAttrInput {
                    qp_state,
                    ud: i.ud,
                    qkey: qpattr::RDMA_UDP_QKEY,
                    conn: if i.cm.is_some() { i.conn } else { None },
                    ack_timeout: i.ack_timeout,
                };
                let a = qpattr::init_qp_attr(&input).map_err(|_| -libc::EINVAL)?;
                Ok(qpattr::to_bytes(&a))
            }
            abi::RDMA_USER_CM_CMD_GET_EVENT => {
                Self::need(b, 8)?;
                Self::out_ok(out, EVENT_RESP_LEN)?;
                self.get_event(chan)
            }
            abi::RDMA_USER_CM_CMD_SET_OPTION => {
                Self::need(b, 24)?;
                let (id, level, name, len) =
                    (rd_u32(b, 8), rd_u32(b, 12), rd_u32(b, 16), rd_u32(b, 20));
                let val = extra.get(..len as usize).ok_or(-libc::EFAULT)?;
                self.set_option(chan, id, level, name, val)
                    .map(|_| Vec::new())
            }
            abi::RDMA_USER_CM_CMD_NOTIFY => {
                Self::need(b, 8)?;
                let i = self.get(chan, rd_u32(b, 0))?;
                let cm = i.cm.ok_or(-libc::EINVAL)?;
                // IB_EVENT_COMM_EST (4): cm.c cm_establish.
                if rd_u32(b, 4) != 4 {
                    return Err(-libc::EINVAL);
                }
                if self.cm.state(cm) == Some(CmState::Established) {
                    return Err(-libc::EISCONN);
                }
                self.cm.establish(cm).map_err(|_| -libc::EINVAL)?;
                Ok(Vec::new())
            }
            abi::RDMA_USER_CM_CMD_MIGRATE_ID => {
                Self::need(b, 16)?;
                Self::out_ok(out, 4)?;
                self.migrate(chan, rd_u32(b, 8), rd_u32(b, 12))
            }
            abi::RDMA_USER_CM_CMD_JOIN_IP_MCAST
            | abi::RDMA_USER_CM_CMD_JOIN_MCAST
            | abi::RDMA_USER_CM_CMD_LEAVE_MCAST
            | abi::RDMA_USER_CM_CMD_GET_OPTION => Err(-libc::ENOSYS),
            _ => Err(-libc::EINVAL),
        }
    }

    fn create_id(&mut self, chan: u32, uid: u64, ps: u16, qp_type: u8) -> Answer {
        let ps = PortSpace::from_u16(ps).ok_or(-libc::EINVAL)?;
        // ucma_create_id: IB_QPT_RC (2) or IB_QPT_UD (4) (ucma_get_qp_type).
        let ud = match (ps, qp_type) {
            (PortSpace::Tcp, _) => false,
            (PortSpace::Udp | PortSpace::Ipoib, _) => true,
            (PortSpace::Ib, 2) => false,
            (PortSpace::Ib, 4) => true,
            _ => return Err(-libc::EINVAL),
        };
        let c = self.channels.get_mut(&chan).ok_or(-libc::EBADF)?;
        if c.ids >= MAX_IDS_PER_CHANNEL {
            return Err(-libc::ENOMEM);
        }
        c.ids += 1;
        let id = self.alloc_id();
        let seq = self.random24();
        self.ids.insert(
            id,
            Id {
                chan,
                uid,
                ps,
                ud,
                state: IdState::Idle,
                src: None,
                dst: None,
                port: None,
                reuseaddr: false,
                afonly: None,
                tos: 0,
                ack_timeout: None,
                backlog: 0,
                routed: false,
                seq_num: seq,
                cm: None,
                conn: None,
                events_reported: 0,
                listening: None,
            },
        );
        Ok(id.to_ne_bytes().to_vec())
    }

    fn alloc_id(&mut self) -> u32 {
        let mut id = self.next_id;
        while id == 0 || self.ids.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        self.next_id = id.wrapping_add(1);
        id
    }

    /// cma.c `rdma_bind_addr`: IDLE → ADDR_BOUND on one of the function's
    /// addresses or the wildcard, with a port (`cma_get_port`).
    fn bind(&mut self, chan: u32, id: u32, a: SocketAddr) -> Result<(), i32> {
        let i = self.get(chan, id)?;
        if i.state != IdState::Idle {
            return Err(-libc::EINVAL);
        }
        if !sockaddr::is_any(&a) && self.dev.gid_index(a.ip()).is_none() {
            return Err(-libc::EADDRNOTAVAIL);
        }
        let afonly = i.afonly.unwrap_or(a.is_ipv4());
        let (ps, reuse) = (i.ps, i.reuseaddr);
        let port = self
            .ports
            .bind(ps, id, a, reuse, afonly)
            .map_err(|e| e.errno())?;
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        let mut a = a;
        a.set_port(port);
        i.src = Some(a);
        i.port = Some(port);
        i.afonly = Some(afonly);
        i.state = IdState::AddrBound;
        Ok(())
    }

    /// cma.c `rdma_resolve_addr`, resolved at once: the source is the
    /// function's address of the destination's family; ADDR_RESOLVED.
    fn resolve_addr(
        &mut self,
        chan: u32,
        id: u32,
        src: Option<SocketAddr>,
        dst: SocketAddr,
    ) -> Answer {
        if self.get(chan, id)?.state == IdState::Idle {
            let s = src.unwrap_or_else(|| sockaddr::any_of(&dst, 0));
            self.bind(chan, id, s)?;
        }
        let i = self.get(chan, id)?;
        let bound = i.src.ok_or(-libc::EINVAL)?;
        if bound.is_ipv4() != dst.is_ipv4() || i.state != IdState::AddrBound {
            return Err(-libc::EINVAL);
        }
        // cma_resolve_loopback: a wildcard destination is the source.
        let src_ip = if sockaddr::is_any(&bound) {
            let want = if sockaddr::is_any(&dst) {
                bound.ip()
            } else {
                dst.ip()
            };
            self.dev.source_for(want).ok_or(-libc::ENETUNREACH)?
        } else {
            bound.ip()
        };
        let mut dst = dst;
        if sockaddr::is_any(&dst) {
            dst.set_ip(src_ip);
        }
        let (ps, port) = (i.ps, bound.port());
        let src = SocketAddr::new(src_ip, port);
        self.ports.rebind(ps, id, src);
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        i.src = Some(src);
        i.dst = Some(dst);
        i.state = IdState::AddrResolved;
        self.push_simple(id, event::ADDR_RESOLVED, 0);
        Ok(Vec::new())
    }

    /// cma.c `rdma_listen`: binds to the IPv4 wildcard from IDLE, then
    /// listens on the service ID of the port (shared with other listeners
    /// of the port at other addresses).
    fn listen(&mut self, chan: u32, id: u32, backlog: i32) -> Result<(), i32> {
        if self.get(chan, id)?.state == IdState::Idle {
            self.bind(chan, id, "0.0.0.0:0".parse().expect("an address"))?;
        }
        let i = self.get(chan, id)?;
        if i.state != IdState::AddrBound {
            return Err(-libc::EINVAL);
        }
        let src = i.src.ok_or(-libc::EINVAL)?;
        if i.reuseaddr {
            self.ports
                .check_listen(i.ps, id, &src)
                .map_err(|e| e.errno())?;
        }
        let sid = service_id(i.ps, src.port());
        match self.cm.listen(sid) {
            Ok(()) | Err(vrnic_cm::CmError::Busy) => {}
            Err(_) => return Err(-libc::ENOMEM),
        }
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        i.listening = Some(sid);
        i.state = IdState::Listen;
        i.backlog = if backlog > 0 && (backlog as u32) < MAX_BACKLOG {
            backlog as u32
        } else {
            MAX_BACKLOG
        };
        Ok(())
    }

    fn path(&self, i: &Id) -> Option<(PathParams, u8)> {
        let (src, dst) = (i.src?, i.dst?);
        let sgid_index = self.dev.gid_index(src.ip())?;
        // cma_get_roce_udp_flow_label.
        let flow_label = (u32::from(src.port()) * 31 + u32::from(dst.port())) & 0xf_ffff;
        Some((
            PathParams {
                remote_gid: vrnic_wire::Gid(ip_to_gid(dst.ip())),
                mtu: self.dev.mtu,
                packet_life_time: CMA_IBOE_PACKET_LIFETIME,
                flow_label,
                hop_limit: HOP_LIMIT,
                traffic_class: i.tos,
                sl: 0,
                rate: 0,
            },
            sgid_index,
        ))
    }

    /// cma.c `cma_connect_ib`: a REQ with rdma_cm's header and the
    /// consumer's private data (≤ 56 bytes), the service ID of the
    /// destination port.
    fn connect(&mut self, now: u64, chan: u32, id: u32, p: &ConnParam) -> Result<(), i32> {
        let i = self.get(chan, id)?;
        if i.state != IdState::RouteResolved {
            return Err(-libc::EINVAL);
        }
        let max = if i.ud {
            vrnic_wire::SIDR_REQ_USER_PRIVATE_DATA_MAX
        } else {
            vrnic_wire::REQ_USER_PRIVATE_DATA_MAX
        };
        if p.private_data.len() > max {
            return Err(-libc::EINVAL);
        }
        let (src, dst) = (i.src.ok_or(-libc::EINVAL)?, i.dst.ok_or(-libc::EINVAL)?);
        let (path, sgid_index) = self.path(i).ok_or(-libc::EINVAL)?;
        let addrs = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => CmaAddrs::V4 { src: s, dst: d },
            (IpAddr::V6(s), IpAddr::V6(d)) => CmaAddrs::V6 { src: s, dst: d },
            _ => return Err(-libc::EINVAL),
        };
        let mut pd = vec![0u8; CmaHdr::LEN];
        CmaHdr {
            src_port: src.port(),
            addrs,
        }
        .emit(&mut pd);
        pd.extend_from_slice(&p.private_data);
        let timeout = vrnic_cm::cm_ack_timeout(self.dev.ca_ack_delay, path.packet_life_time);
        let conn = ConnAttrs {
            dgid: path.remote_gid.0,
            sgid_index,
            hop_limit: path.hop_limit,
            traffic_class: path.traffic_class,
            flow_label: path.flow_label,
            path_mtu: path.mtu,
            remote_qpn: 0,
            rq_psn: i.seq_num,
            sq_psn: 0,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            timeout,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
        };
        if i.ud {
            // cma.c `cma_resolve_ib_udp`: a SIDR_REQ, retried every
            // 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
            let cm = self
                .cm
                .sidr_request(
                    now,
                    service_id(i.ps, dst.port()),
                    path.remote_gid,
                    1 << (CMA_CM_RESPONSE_TIMEOUT - 8),
                    CMA_MAX_CM_RETRIES,
                    &pd,
                )
                .map_err(|e| match e {
                    vrnic_cm::CmError::TableFull => -libc::ENOMEM,
                    _ => -libc::EINVAL,
                })?;
            self.by_cm.insert(cm, id);
            let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
            i.cm = Some(cm);
            i.conn = Some(conn);
            i.state = IdState::Connect;
            return Ok(());
        }
        let req = ReqParams {
            service_id: service_id(i.ps, dst.port()),
            qpn: p.qp_num,
            starting_psn: i.seq_num,
            uc: false,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            flow_control: p.flow_control,
            remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
            max_cm_retries: CMA_MAX_CM_RETRIES,
            path,
            private_data: pd,
        };
        let cm = self.cm.connect(now, &req).map_err(|e| match e {
            vrnic_cm::CmError::TableFull => -libc::ENOMEM,
            _ => -libc::EINVAL,
        })?;
        self.by_cm.insert(cm, id);
        let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
        i.cm = Some(cm);
        i.conn = Some(conn);
        i.state = IdState::Connect;
        Ok(())
    }

    /// cma.c `rdma_accept`: passive, a REP (`cma_accept_ib`); active after
    /// CONNECT_RESPONSE without parameters, the RTU (`cma_rep_recv`).
    fn accept(&mut self, now: u64, chan: u32, id: u32, uid: u64, p: &ConnParam) -> Result<(), i32> {
        let i = self.get(chan, id)?;
        if i.state != IdState::Connect {
            return Err(-libc::EINVAL);
        }
        let cm = i.cm.ok_or(-libc::EINVAL)?;
        if i.ud {
            // cma.c `cma_send_sidr_rep(IB_SIDR_SUCCESS)`: the UD QP and
            // the id's Q_Key (RDMA_UDP_QKEY, `cma_set_qkey`).
            if p.private_data.len() > vrnic_wire::private_data_len::SIDR_REP {
                return Err(-libc::EINVAL);
            }
            let qpn = if p.valid { p.qp_num } else { 0 };
            self.cm
                .sidr_reply(
                    cm,
                    vrnic_wire::sidr_status::SUCCESS,
                    qpn,
                    qpattr::RDMA_UDP_QKEY,
                    &p.private_data,
                )
                .map_err(|_| -libc::EINVAL)?;
            self.by_cm.remove(&cm);
            let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
            i.cm = None;
            if p.valid {
                i.uid = uid;
            }
            return Ok(());
        }
        let seq = i.seq_num;
        match self.cm.state(cm) {
            Some(CmState::RepRcvd) if !p.valid => {
                self.cm.send_rtu(cm, &[]).map_err(|_| -libc::EINVAL)?;
                Ok(())
            }
            Some(CmState::ReqRcvd) if p.valid => {
                if p.private_data.len() > vrnic_wire::private_data_len::REP {
                    return Err(-libc::EINVAL);
                }
                self.cm
                    .accept(
                        now,
                        cm,
                        &RepParams {
                            qpn: p.qp_num,
                            starting_psn: seq,
                            responder_resources: p.responder_resources,
                            initiator_depth: p.initiator_depth,
                            failover_accepted: 0,
                            flow_control: p.flow_control,
                            rnr_retry_count: p.rnr_retry_count,
                            srq: p.srq,
                            private_data: p.private_data.clone(),
                        },
                    )
                    .map_err(|_| -libc::EINVAL)?;
                let i = self.ids.get_mut(&id).ok_or(-libc::ENOENT)?;
                // ucma_accept: the id's uid is the accepting program's.
                i.uid = uid;
                if let Some(c) = &mut i.conn {
                    c.responder_resources = p.responder_resources;
                    c.initiator_depth = p.initiator_depth;
                }
                Ok(())
            }
            _ => Err(-libc::EINVAL),
        }
    }

    /// cma.c `rdma_disconnect`: DREQ, or DREP to a received DREQ; in any
    /// other state nothing is sent and, as in the kernel, the answer is
    /// still success. `-EINVAL` only without a CM id.
    fn disconnect(&mut self, now: u64, chan: u32, id: u32) -> Result<(), i32> {
        let cm = self.get(chan, id)?.cm.ok_or(-libc::EINVAL)?;
        if self.cm.disconnect(now, cm, &[]).is_err() {
            let _ = self.cm.reply_disconnect(now, cm, &[]);
        }
        Ok(())
    }

    fn set_option(
        &mut self,
        chan: u32,
        id: u32,
        level: u32,
        name: u32,
        val: &[u8],
    ) -> Result<(), i32> {
        let int = || -> Result<i32, i32> {
            let b: [u8; 4] = val.try_into().map_err(|_| -libc::EINVAL)?;
            Ok(i32::from_ne_bytes(b))
        };
        let u8v = || -> Result<u8, i32> {
            match val {
                [v] => Ok(*v),
                _ => Err(-libc::EINVAL),
            }
        };
        match (level, name) {
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_TOS) => {
                let v = u8v()?;
                self.get_mut(chan, id)?.tos = v;
            }
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_REUSEADDR) => {
                let v = int()? != 0;
                let i = self.get_mut(chan, id)?;
                // rdma_set_reuseaddr.
                if !((v && i.state != IdState::Listen) || i.state == IdState::Idle) {
                    return Err(-libc::EINVAL);
                }
                i.reuseaddr = v;
            }
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_AFONLY) => {
                let v = int()? != 0;
                let i = self.get_mut(chan, id)?;
                if !matches!(i.state, IdState::Idle | IdState::AddrBound) {
                    return Err(-libc::EINVAL);
                }
                i.afonly = Some(v);
            }
            (abi::RDMA_OPTION_ID, abi::RDMA_OPTION_ID_ACK_TIMEOUT) => {
                let v = u8v()?;
                let i = self.get_mut(chan, id)?;
                if i.ud {
                    return Err(-libc::EINVAL);
                }
                i.ack_timeout = Some(v);
            }
            (abi::RDMA_OPTION_IB, abi::RDMA_OPTION_IB_PATH) => {
                if val.is_empty() || !val.len().is_multiple_of(PATH_DATA_LEN) {
                    return Err(-libc::EINVAL);
                }
                // rdma_set_ib_path: ADDR_RESOLVED → ROUTE_RESOLVED, and
                // ucma_set_ib_path's ROUTE_RESOLVED event. The path is
                // computed locally, as for RESOLVE_ROUTE.
                let i = self.get_mut(chan, id)?;
                if i.state != IdState::AddrResolved {
                    return Err(-libc::EINVAL);
                }
                i.state = IdState::RouteResolved;
                i.routed = true;
                self.push_simple(id, event::ROUTE_RESOLVED, 0);
            }
            _ => return Err(-libc::ENOSYS),
        }
        Ok(())
    }

    fn get_event(&mut self, chan: u32) -> Answer {
        let c = self.channels.get_mut(&chan).ok_or(-libc::EBADF)?;
        let ev = c.events.pop_front().ok_or(-libc::EAGAIN)?;
        if let Some(i) = self.ids.get_mut(&ev.id) {
            i.events_reported = i.events_reported.wrapping_add(1);
            if rd_u32(&ev.resp, 12) == event::CONNECT_REQUEST {
                i.backlog += 1;
            }
        }
        Ok(ev.resp.to_vec())
    }

    /// ucma.c `ucma_migrate_id`: id `id` of channel `from` moves, with its
    /// waiting events, to `chan`.
    fn migrate(&mut self, chan: u32, id: u32, from: u32) -> Answer {
        if !self.channels.contains_key(&from) {
            return Err(-libc::ENOENT);
        }
        let n = self.get(from, id)?.events_reported;
        if from != chan {
            let Some(src) = self.channels.get_mut(&from) else {
                return Err(-libc::ENOENT);
            };
            let (moving, staying): (VecDeque<Event>, VecDeque<Event>) =
                src.events.drain(..).partition(|e| e.id == id);
            src.events = staying;
            src.ids = src.ids.saturating_sub(1);
            let dst = self.channels.get_mut(&chan).ok_or(-libc::EBADF)?;
            dst.ids += 1;
            dst.events.extend(moving);
            if let Some(i) = self.ids.get_mut(&id) {
                i.chan = chan;
            }
        }
        Ok(n.to_ne_bytes().to_vec())
    }

    /// cma.c `rdma_destroy_id` and ucma.c's cleanup: the CM connection is
    /// destroyed (REJ, DREQ or DREP as cm.c's `cm_destroy_id`), the port
    /// released, unreported events dropped (a CONNECT_REQUEST's new id
    /// destroyed with them).
    fn destroy_id(&mut self, now: u64, id: u32) {
        let Some(i) = self.ids.remove(&id) else {
            return;
        };
        if let Some(cm) = i.cm {
            self.by_cm.remove(&cm);
            let _ = self.cm.destroy(now, cm);
        }
        if let Some(port) = i.port {
            self.ports.release(i.ps, id, port);
        }
        if let Some(sid) = i.listening {
            if !self.ids.values().any(|o| o.listening == Some(sid)) {
                let _ = self.cm.unlisten(sid);
            }
        }
        let mut orphans = Vec::new();
        if let Some(c) = self.channels.get_mut(&i.chan) {
            c.ids = c.ids.saturating_sub(1);
            c.events.retain(|e| {
                if e.id == id {
                    orphans.extend(e.new_id);
                    false
                } else {
                    true
                }
            });
        }
        for o in orphans {
            self.destroy_id(now, o);
        }
    }

    fn push(&mut self, ev: Event) {
        let chan = match self.ids.get(&ev.id) {
            Some(i) => i.chan,
            None => return,
        };
        let Some(c) = self.channels.get_mut(&chan) else {
            return;
        };
        if c.events.len() >= MAX_EVENTS_PER_CHANNEL {
            self.events_dropped += 1;
            return;
        }
        c.events.push_back(ev);
    }

    fn new_event(&self, id: u32, ev: u32, status: i32) -> [u8; EVENT_RESP_LEN] {
        let mut r = [0u8; EVENT_RESP_LEN];
        let uid = self.ids.get(&id).map_or(0, |i| i.uid);
        r[0..8].copy_from_slice(&uid.to_ne_bytes());
        wr_u32(&mut r, 8, id);
        wr_u32(&mut r, 12, ev);
        wr_u32(&mut r, 16, status as u32);
        r
    }

    fn push_simple(&mut self, id: u32, ev: u32, status: i32) {
        let resp = self.new_event(id, ev, status);
        self.push(Event {
            id,
            new_id: None,
            resp,
        });
    }

    /// Maps the CM's events to rdma_cm events (cma.c `cma_ib_handler`,
    /// `cma_ib_req_handler`).
    fn cm_events(&mut self, now: u64) {
        while let Some(e) = self.cm.pop_event() {
            if let CmEventKind::ReqReceived {
                listener,
                req,
                source,
            } = &e.kind
            {
                self.on_req(now, e.id, *listener, Req::Rc(req), source);
                continue;
            }
            if let CmEventKind::SidrReqReceived {
                listener,
                req,
                source,
            } = &e.kind
            {
                self.on_req(now, e.id, *listener, Req::Sidr(req), source);
                continue;
            }
            let Some(&id) = self.by_cm.get(&e.id) else {
                // A destroyed id's connection (timewait exit and the like).
                if matches!(e.kind, CmEventKind::TimewaitExit) {
                    let _ = self.cm.destroy(now, e.id);
                }
                continue;
            };
            let Some(state) = self.ids.get(&id).map(|i| i.state) else {
                continue;
            };
            match e.kind {
                CmEventKind::RepReceived(rep) => {
                    if let Some(c) = self.ids.get_mut(&id).and_then(|i| i.conn.as_mut()) {
                        c.remote_qpn = rep.local_qpn;
                        c.sq_psn = rep.starting_psn;
                        // cm_rep_handler: the peer's resources mirrored.
                        c.initiator_depth = rep.responder_resources;
                        c.responder_resources = rep.initiator_depth;
                        c.rnr_retry_count = rep.rnr_retry_count;
                    }
                    let mut r = self.new_event(id, event::CONNECT_RESPONSE, 0);
                    put_conn(
                        &mut r,
                        rep.local_qpn,
                        &rep.private_data,
                        rep.srq,
                        rep.responder_resources,
                        rep.initiator_depth,
                        rep.end_to_end_flow_control,
                        0,
                        rep.rnr_retry_count,
                    );
                    self.push(Event {
                        id,
                        new_id: None,
                        resp: r,
                    });
                }
                CmEventKind::RtuReceived | CmEventKind::UserEstablished => {
                    if state == IdState::Connect {
                        self.push_simple(id, event::ESTABLISHED, 0);
                    }
                }
                CmEventKind::RejReceived {
                    reason,
                    private_data,
                } => {
                    let mut r = self.new_event(id, event::REJECTED, i32::from(reason));
                    put_conn(&mut r, 0, &private_data[..], false, 0, 0, false, 0, 0);
                    self.push(Event {
                        id,
                        new_id: None,
                        resp: r,
                    });
                }
                CmEventKind::ReqError | CmEventKind::RepError => {
                    self.push_simple(id, event::UNREACHABLE, -libc::ETIMEDOUT);
                }
                CmEventKind::DreqReceived { .. }
                | CmEventKind::DrepReceived
                | CmEventKind::DreqError => {
                    if state == IdState::Connect {
                        if let Some(i) = self.ids.get_mut(&id) {
                            i.state = IdState::Disconnect;
                        }
                        let st = if matches!(e.kind, CmEventKind::DreqError) {
                            -libc::ETIMEDOUT
                        } else {
                            0
                        };
                        self.push_simple(id, event::DISCONNECTED, st);
                    }
                }
                CmEventKind::TimewaitExit => {
                    if state == IdState::Disconnect {
                        self.push_simple(id, event::TIMEWAIT_EXIT, 0);
                    }
                }
                CmEventKind::SidrRepReceived(rep) => self.on_sidr_rep(id, &rep),
                CmEventKind::SidrReqError => {
                    // The CM's id is gone.
                    self.by_cm.remove(&e.id);
                    if let Some(i) = self.ids.get_mut(&id) {
                        i.cm = None;
                    }
                    self.push_simple(id, event::UNREACHABLE, -libc::ETIMEDOUT);
                }
                CmEventKind::MraReceived { .. }
                | CmEventKind::ReqReceived { .. }
                | CmEventKind::SidrReqReceived { .. } => {}
            }
        }
    }

    /// cma.c `cma_ib_req_handler`: the listener of the REQ's (or
    /// SIDR_REQ's) service ID whose address matches the rdma_cm header's
    /// destination (a specific address first, then a wildcard of the
    /// family) gets a new id and a CONNECT_REQUEST; no match, a bad header,
    /// a full backlog or channel: REJ consumer defined (the kernel's handler
    /// fails and `cm_destroy_id` rejects; for SIDR a SIDR_REP REJECT).
    fn on_req(&mut self, now: u64, cm: CmId, sid: u64, req: Req<'_>, source: &Source) {
        let private = match req {
            Req::Rc(r) => &r.private_data[..],
            Req::Sidr(r) => &r.private_data[..],
        };
        let hdr = CmaHdr::parse(private);
        let listener = hdr.ok().and_then(|h| {
            let dst = h.dst();
            let cands = self.ids.iter().filter(|(_, i)| {
                i.state == IdState::Listen && i.listening == Some(sid) && i.backlog > 0
            });
            let mut best = None;
            for (k, i) in cands {
                let Some(src) = i.src else { continue };
                if src.ip() == dst {
                    best = Some(*k);
                    break;
                }
                let fam_ok = src.is_ipv4() == dst.is_ipv4() || !i.afonly.unwrap_or(true);
                if sockaddr::is_any(&src) && fam_ok && best.is_none() {
                    best = Some(*k);
                }
            }
            best.map(|l| (l, h))
        });
        let refuse = |me: &mut Ucma| {
            let _ = match req {
                Req::Rc(_) => me.cm.reject(now, cm, rej_reason::CONSUMER_DEFINED, &[]),
                Req::Sidr(_) => me
                    .cm
                    .sidr_reply(cm, vrnic_wire::sidr_status::REJECT, 0, 0, &[]),
            };
            let _ = me.cm.destroy(now, cm);
        };
        let Some((lid, h)) = listener else {
            refuse(self);
            return;
        };
        let l = self.ids[&lid].clone();
        let full = self.channels.get(&l.chan).is_none_or(|c| {
            c.ids >= MAX_IDS_PER_CHANNEL || c.events.len() >= MAX_EVENTS_PER_CHANNEL
        });
        let local_ip = h.dst();
        let sgid_index = self.dev.gid_index(local_ip);
        if full || sgid_index.is_none() || matches!(req, Req::Sidr(_)) != l.ud {
            if full {
                self.events_dropped += 1;
            }
            refuse(self);
            return;
        }
        let new = self.alloc_id();
        let seq = self.random24();
        let src = SocketAddr::new(local_ip, vrnic_wire::service_id_port(sid));
        let dst = SocketAddr::new(h.src(), h.src_port);
        let conn = match req {
            Req::Rc(req) => Some(ConnAttrs {
                dgid: source.gid.0,
                sgid_index: sgid_index.unwrap_or(0),
                hop_limit: req.primary_path.hop_limit,
                traffic_class: req.primary_path.traffic_class,
                flow_label: req.primary_path.flow_label,
                path_mtu: req.path_mtu.min(self.dev.mtu),
                remote_qpn: req.local_qpn,
                rq_psn: seq,
                sq_psn: req.starting_psn,
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                timeout: req.primary_path.local_ack_timeout,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
            }),
            Req::Sidr(_) => None,
        };
        self.ids.insert(
            new,
            Id {
                chan: l.chan,
                uid: 0,
                ps: l.ps,
                ud: l.ud,
                state: IdState::Connect,
                src: Some(src),
                dst: Some(dst),
                port: None,
                reuseaddr: false,
                afonly: l.afonly,
                tos: l.tos,
                ack_timeout: None,
                backlog: 0,
                routed: true,
                seq_num: seq,
                cm: Some(cm),
                conn,
                events_reported: 0,
                listening: None,
            },
        );
        if let Some(c) = self.channels.get_mut(&l.chan) {
            c.ids += 1;
        }
        self.by_cm.insert(cm, new);
        if let Some(li) = self.ids.get_mut(&lid) {
            li.backlog -= 1;
        }
        // ucma: the listener's uid, the new id.
        let mut r = self.new_event(lid, event::CONNECT_REQUEST, 0);
        wr_u32(&mut r, 8, new);
        match req {
            // cma_set_req_event_data: the consumer's private data after
            // the header.
            Req::Rc(req) => put_conn(
                &mut r,
                req.local_qpn,
                &req.private_data[CmaHdr::LEN..],
                req.srq,
                req.responder_resources,
                req.initiator_depth,
                req.end_to_end_flow_control,
                req.retry_count,
                req.rnr_retry_count,
            ),
            // cma_ib_req_handler for SIDR: only the private data.
            Req::Sidr(req) => put_ud(&mut r, 0, 0, None, &req.private_data[CmaHdr::LEN..]),
        }
        self.push(Event {
            id: lid,
            new_id: Some(new),
            resp: r,
        });
    }

    /// cma.c `cma_sidr_rep_handler`: SUCCESS is ESTABLISHED with the
    /// service's QPN, Q_Key and an AH to it; any other status UNREACHABLE
    /// with that status.
    fn on_sidr_rep(&mut self, id: u32, rep: &vrnic_wire::CmSidrRep) {
        let conn = self.ids.get_mut(&id).and_then(|i| {
            let c = i.conn;
            if let Some(cm) = i.cm.take() {
                self.by_cm.remove(&cm);
            }
            c
        });
        if rep.status != vrnic_wire::sidr_status::SUCCESS {
            let mut r = self.new_event(id, event::UNREACHABLE, i32::from(rep.status));
            put_ud(&mut r, 0, 0, None, &rep.private_data);
            self.push(Event {
                id,
                new_id: None,
                resp: r,
            });
            return;
        }
        let mut r = self.new_event(id, event::ESTABLISHED, 0);
        put_ud(&mut r, rep.qpn, rep.qkey, conn.as_ref(), &rep.private_data);
        self.push(Event {
            id,
            new_id: None,
            resp: r,
        });
    }

    fn node_guid(&self, i: &Id) -> [u8; 8] {
        // The id has a device once bound to one of its addresses.
        match i.src {
            Some(s) if !sockaddr::is_any(&s) => self.dev.node_guid,
            _ => [0; 8],
        }
    }

    /// ucma.c `ucma_query_route` (RoCE: `ucma_copy_iboe_route`).
    fn query_route(&self, i: &Id) -> Vec<u8> {
        let mut r = vec![0u8; 208];
        r[0..8].copy_from_slice(&self.node_guid(i));
        if let Some(s) = i.src {
            sockaddr::emit(&s, &mut r[136..164]);
        }
        if let Some(d) = i.dst {
            sockaddr::emit(&d, &mut r[164..192]);
        }
        if r[0..8] == [0; 8] {
            return r;
        }
        let (sgid, dgid) = (
            i.src.map_or([0; 16], |s| ip_to_gid(s.ip())),
            i.dst.map_or([0; 16], |d| ip_to_gid(d.ip())),
        );
        let rec = &mut r[8..72];
        rec[0..16].copy_from_slice(&dgid);
        rec[16..32].copy_from_slice(&sgid);
        rec[52..54].copy_from_slice(&0xffffu16.to_be_bytes());
        if i.routed {
            if let Some((p, _)) = self.path(i) {
                rec[40..44].copy_from_slice(&p.flow_label.to_be_bytes());
                wr_u32(rec, 44, 1); // reversible
                wr_u32(rec, 48, u32::from(p.mtu));
                rec[54] = p.hop_limit;
                rec[55] = p.traffic_class;
                rec[56] = 1; // numb_path
                rec[58] = 2; // mtu_selector: exactly
                rec[59] = 2;
                rec[61] = 2;
                rec[62] = p.packet_life_time;
            }
            wr_u32(&mut r, 192, 1);
        }
        r[196] = 1; // port_num
        wr_u32(&mut r, 200, u32::MAX); // ibdev_index: match by GUID
        r
    }

    /// The device part of a `rdma_ucm_query_addr_resp`: node GUID, port
    /// and P_Key once the id has a device (ucma.c writes them only then).
    fn addr_resp_head(&self, i: &Id) -> Vec<u8> {
        let mut r = vec![0u8; 280];
        let guid = self.node_guid(i);
        if guid != [0; 8] {
            r[0..8].copy_from_slice(&guid);
            r[8] = 1;
            r[10..12].copy_from_slice(&0xffffu16.to_ne_bytes());
        }
        r
    }

    /// ucma.c `ucma_query_addr`.
    fn query_addr(&self, i: &Id) -> Vec<u8> {
        let mut r = self.addr_resp_head(i);
        if let Some(s) = i.src {
            let n = sockaddr::emit(&s, &mut r[16..144]);
            r[12..14].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        if let Some(d) = i.dst {
            let n = sockaddr::emit(&d, &mut r[144..272]);
            r[14..16].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        wr_u32(&mut r, 272, u32::MAX);
        r
    }

    /// ucma.c `ucma_query_gid`: the GIDs as `sockaddr_ib`s.
    fn query_gid(&self, i: &Id) -> Vec<u8> {
        let mut r = self.addr_resp_head(i);
        let sid = |a: Option<SocketAddr>| a.map_or(0, |a| service_id(i.ps, a.port()));
        if let Some(s) = i.src {
            let n = sockaddr::emit_ib(&ip_to_gid(s.ip()), 0xffff, sid(i.src), &mut r[16..144]);
            r[12..14].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        if let Some(d) = i.dst {
            let n = sockaddr::emit_ib(&ip_to_gid(d.ip()), 0xffff, sid(i.dst), &mut r[144..272]);
            r[14..16].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        wr_u32(&mut r, 272, u32::MAX);
        r
    }

    /// ucma.c `ucma_query_path`: the route as packed SA path records
    /// (`struct ib_path_rec_data`), at most as many as `out` holds.
    fn query_path(&self, i: &Id, out: usize) -> Vec<u8> {
        let mut r = vec![0u8; 8];
        let Some((p, _)) = (if i.routed { self.path(i) } else { None }) else {
            return r;
        };
        if out < 8 + PATH_DATA_LEN {
            return r;
        }
        wr_u32(&mut r, 0, 1);
        let mut d = [0u8; PATH_DATA_LEN];
        // IB_PATH_GMP | IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL.
        wr_u32(&mut d, 0, (1 << 0) | (1 << 1) | (1 << 4));
        let rec = &mut d[8..];
        let sid = i.dst.map_or(0, |a| service_id(i.ps, a.port()));
        rec[0..8].copy_from_slice(&sid.to_be_bytes());
        rec[8..24].copy_from_slice(&p.remote_gid.0);
        rec[24..40].copy_from_slice(&i.src.map_or([0; 16], |s| ip_to_gid(s.ip())));
        rec[44..48].copy_from_slice(&((p.flow_label << 8) | u32::from(p.hop_limit)).to_be_bytes());
        rec[48] = p.traffic_class;
        rec[49] = 0x80 | 1;
        rec[50..52].copy_from_slice(&0xffffu16.to_be_bytes());
        rec[54] = 0x80 | p.mtu;
        rec[55] = 0x80;
        rec[56] = 0x80 | p.packet_life_time;
        r.extend_from_slice(&d);
        r
    }
}

#[cfg(test)]
mod tests {
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
}
