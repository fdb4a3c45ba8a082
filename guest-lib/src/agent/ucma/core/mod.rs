//! The connection manager service's state, without I/O: event channels,
//! rdma_cm ids, the port spaces, the IB CM ([`vrnic_cm::Cm`]) and the
//! rdma_ucm commands on them (Linux 6.1 `drivers/infiniband/core/ucma.c`
//! for the commands and events, `cma.c` for the ids' states and errnos).
//!
//! [`Ucma::command`] executes one command of a channel and gives the
//! answer's `ret` and response; [`Ucma::handle_mad`] and [`Ucma::poll`]
//! feed the CM; [`Ucma::pop_mad`] gives what to send on QP1. Events wait
//! in their channel's bounded queue until `GET_EVENT`.
//!
//! Here: the state, the channels and the dispatch of a command; `ids`
//! (create, bind, resolve, listen, options, migrate, destroy), `connect`
//! (the path, connect, accept, disconnect), `events` (the queues and the
//! IB CM's events as rdma_cm's), `query` (the route and address answers),
//! `param` (the structures' bytes).

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

mod connect;
mod events;
mod ids;
mod param;
mod query;
#[cfg(test)]
mod tests;

use param::*;

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
}
