//! The InfiniBand Communication Manager (IBTA Vol 1 chapter 12) for one
//! port, as a sans-IO state machine modelled on Linux's `ib_cm`
//! (`drivers/infiniband/core/cm.c`, Linux 6.1; "cm.c" below).
//!
//! The caller owns the port's GSI QP (QP1) and a clock. It feeds
//! [`Cm::handle_mad`] with every MAD received on QP1, calls [`Cm::poll`]
//! when [`Cm::next_timer`] is due, makes the consumer's calls
//! ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`],
//! [`Cm::send_rtu`], [`Cm::disconnect`], [`Cm::reply_disconnect`],
//! [`Cm::destroy`]) and drains [`Cm::pop_mad`] (MADs to send on QP1, to
//! QPN 1 of the given GID) and [`Cm::pop_event`] (the consumer's events,
//! cm.c's `ib_cm_event`s). Time is only what the caller passes (`now_ns`,
//! nanoseconds on any monotonic clock); there are no threads, sockets or
//! allocations beyond bounded tables and queues, and no input panics.
//!
//! Implemented: connection establishment (REQ/REP/RTU) in both roles,
//! rejection (REJ, the kernel's reasons for no listener, stale connection,
//! consumer reject, no resources), retransmission of REQ, REP and DREQ with
//! the kernel's timeouts and retry counts and the error events after the
//! last one, duplicate REQ/REP handling, disconnection (DREQ/DREP) and
//! timewait, SIDR for UD, received MRAs (the wait for a REP or RTU extended). Not yet:
//! sending MRA (Linux sends one only for a duplicate REQ/REP while the
//! consumer has not answered), LAP/APR (counted and dropped; rdma_cm
//! never sends LAP on RoCE).

#![deny(missing_docs)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use vrnic_wire::{
    msg_response, private_data_len, rej_reason, sidr_status, transport_type, CmDrep, CmDreq,
    CmMessage, CmMra, CmPath, CmRej, CmRep, CmReq, CmRtu, CmSidrRep, CmSidrReq,
};
use vrnic_wire::{Gid, Mad, MAD_LEN};

#[cfg(test)]
mod tests;

/// The most connections (every comm ID not in timewait, idle ones the
/// consumer has not destroyed included) one [`Cm`] holds. rdma_cm programs
/// use one per `rdma_cm_id`; 4096 is far above what a function's agent
/// serves and keeps a REQ flood's cost bounded. [`Cm::connect`] beyond it
/// fails with [`CmError::TableFull`]; a REQ beyond it is answered with REJ
/// reason [`rej_reason::NO_RESOURCES`].
pub const MAX_CONNECTIONS: usize = 4096;

/// The most listeners (service IDs) one [`Cm`] holds.
pub const MAX_LISTENERS: usize = 1024;

/// The most connections in timewait one [`Cm`] keeps. A connection entering
/// timewait when the table is full evicts the one whose timewait ends
/// first (the kernel has no bound; a peer's disconnect flood must not grow
/// memory here).
pub const MAX_TIMEWAIT: usize = 4096;

/// The most MADs waiting in [`Cm::pop_mad`]'s queue; beyond it a MAD is
/// dropped and counted ([`CmCounters::mads_dropped`]): retransmission
/// recovers, as from a lost MAD.
pub const MAX_OUT_MADS: usize = 1024;

/// The most events waiting in [`Cm::pop_event`]'s queue; beyond it an event
/// is dropped and counted ([`CmCounters::events_dropped`]).
pub const MAX_EVENTS: usize = 4096;

/// The RDMA CM's response timeout exponent, `CMA_CM_RESPONSE_TIMEOUT` (20,
/// cma.c:47): 4.096 µs · 2^20 ≈ 4.3 s, which cm.c rounds to 4096 ms.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;

/// The RDMA CM's retry count, `CMA_MAX_CM_RETRIES` (15, cma.c:48).
pub const CMA_MAX_CM_RETRIES: u8 = 15;

/// The packet life time rdma_cm puts in a RoCE path,
/// `CMA_IBOE_PACKET_LIFETIME` (18, cma.c).
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 18;

/// An IBA time exponent (4.096 µs · 2^t) in milliseconds as cm.c's
/// `cm_convert_to_ms` rounds it: `1 << max(t - 8, 0)`. `t` above 31 is
/// taken as 31.
pub fn cm_convert_to_ms(iba_time: u8) -> u64 {
    1u64 << (iba_time.min(31).saturating_sub(8))
}

/// The local ACK timeout exponent of a path, cm.c's `cm_ack_timeout`: the
/// packet life time + 1, corrected for the CA's ACK delay, at most 31.
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let ca = ca_ack_delay.min(31);
    let mut ack = packet_life_time.min(30) + 1;
    if ack >= ca {
        ack += u8::from(ca >= ack - 1);
    } else {
        ack = ca + u8::from(ack >= ca.saturating_sub(1));
    }
    ack.min(31)
}

/// A CA GUID derived from a MAC address as an EUI-64 (the universal/local
/// bit flipped, `ff:fe` in the middle), as RoCE devices derive theirs
/// (rxe's `rxe_init_device_param` takes the netdev's MAC the same way).
pub fn ca_guid_from_mac(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// The port a [`Cm`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortIdentity {
    /// The local GID the CM's connections use (RoCEv2: the IPv4-mapped or
    /// IPv6 address), put in REQs' primary path.
    pub gid: Gid,
    /// The CA GUID sent in REQ and REP ([`ca_guid_from_mac`]).
    pub ca_guid: u64,
    /// The device's local CA ACK delay exponent (rxe reports 15), used by
    /// [`cm_ack_timeout`].
    pub ca_ack_delay: u8,
    /// The seed of the comm ID allocator: the cyclic index's start and the
    /// XOR operand (cm.c's `cm.random_id_operand`). Give each start a
    /// different, random one.
    pub seed: u64,
}

/// Who a received MAD came from, as a GSI receive completion and its GRH
/// give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The sender's GID (the GRH's source, RoCEv2: its IP address).
    pub gid: Gid,
    /// The sender's QPN (1 for a CM agent).
    pub qpn: u32,
    /// The P_Key index the MAD arrived on.
    pub pkey_index: u16,
}

/// A MAD to send on QP1 (UD, Q_Key 0x80010000) to `dest_qpn` at `to_gid`.
#[derive(Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination GID.
    pub to_gid: Gid,
    /// The destination QPN: always 1, the GSI QP.
    pub dest_qpn: u32,
    /// The whole 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("to_gid", &self.to_gid)
            .field("attr_tid", &Mad::peek_attr_tid(&self.mad))
            .finish()
    }
}

/// A connection's handle: its local comm ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CmId(pub u32);

/// What the consumer is told (cm.c's `enum ib_cm_event_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// The connection it is about.
    pub id: CmId,
    /// What happened.
    pub kind: CmEventKind,
}

/// The kinds of [`CmEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEventKind {
    /// `IB_CM_REQ_RECEIVED`: a REQ for a listened service ID created
    /// connection `id`; answer with [`Cm::accept`] or [`Cm::reject`].
    ReqReceived {
        /// The service ID of the listener it matched.
        listener: u64,
        /// The REQ as received.
        req: Box<CmReq>,
        /// Who sent it.
        source: Source,
    },
    /// `IB_CM_REP_RECEIVED`: the passive side accepted; move the QP to
    /// RTR/RTS and call [`Cm::send_rtu`] (or [`Cm::reject`]).
    RepReceived(Box<CmRep>),
    /// `IB_CM_RTU_RECEIVED`: the passive side's connection is established.
    RtuReceived,
    /// `IB_CM_REJ_RECEIVED`: the peer rejected (reason: [`rej_reason`]).
    RejReceived {
        /// The REJ's reason.
        reason: u16,
        /// Its private data.
        private_data: Box<[u8; private_data_len::REJ]>,
    },
    /// `IB_CM_REQ_ERROR`: no REP after every REQ retry.
    ReqError,
    /// `IB_CM_REP_ERROR`: no RTU after every REP retry.
    RepError,
    /// `IB_CM_DREQ_ERROR`: no DREP after every DREQ retry; the connection
    /// is in timewait.
    DreqError,
    /// `IB_CM_DREQ_RECEIVED`: answer with [`Cm::reply_disconnect`].
    DreqReceived {
        /// The DREQ's private data.
        private_data: Box<[u8; private_data_len::DREQ]>,
    },
    /// `IB_CM_DREP_RECEIVED`: the disconnection is complete; timewait.
    DrepReceived,
    /// `IB_CM_MRA_RECEIVED`: the peer needs more time; the REQ's or REP's
    /// retransmission now waits `cm_convert_to_ms(service_timeout) +
    /// cm_convert_to_ms(ack timeout)` ms (cm.c `cm_mra_handler`).
    MraReceived {
        /// The MRA's service timeout (IBA exponent).
        service_timeout: u8,
    },
    /// `IB_CM_SIDR_REQ_RECEIVED`: a SIDR_REQ for a listened service ID;
    /// answer with [`Cm::sidr_reply`].
    SidrReqReceived {
        /// The service ID of the listener it matched.
        listener: u64,
        /// The SIDR_REQ as received.
        req: Box<CmSidrReq>,
        /// Who sent it.
        source: Source,
    },
    /// `IB_CM_SIDR_REP_RECEIVED`: the answer to [`Cm::sidr_request`]; the
    /// id is gone after it.
    SidrRepReceived(Box<CmSidrRep>),
    /// `IB_CM_SIDR_REQ_ERROR`: no SIDR_REP after every retry; the id is
    /// gone.
    SidrReqError,
    /// `IB_CM_USER_ESTABLISHED`: [`Cm::establish`] ended a REP's wait
    /// for its RTU.
    UserEstablished,
    /// `IB_CM_TIMEWAIT_EXIT`: the connection left timewait and is idle;
    /// destroy it.
    TimewaitExit,
}

/// Errors of the consumer's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No such connection.
    #[error("no such connection")]
    NoSuchId,
    /// The call is not valid in the connection's state (cm.c: `-EINVAL`).
    #[error("invalid in the connection's state")]
    BadState,
    /// A table is full ([`MAX_CONNECTIONS`], [`MAX_LISTENERS`]).
    #[error("table full")]
    TableFull,
    /// The service ID is already listened on (cm.c: `-EBUSY`).
    #[error("service ID busy")]
    Busy,
    /// The service ID is not listened on.
    #[error("not listening")]
    NotListening,
    /// Private data longer than the message carries.
    #[error("private data too long")]
    PrivateDataTooLong,
    /// A parameter out of its field's range.
    #[error("invalid parameter")]
    InvalidParam,
}

/// The path of a connection as [`Cm::connect`] takes it (cm.c: the
/// `sa_path_rec` rdma_cm builds for RoCE in `cma_resolve_iboe_route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParams {
    /// The remote GID (its CM agent is sent the REQ).
    pub remote_gid: Gid,
    /// The path MTU, IBA encoding (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// The packet life time exponent ([`CMA_IBOE_PACKET_LIFETIME`]).
    pub packet_life_time: u8,
    /// The flow label (20 bits).
    pub flow_label: u32,
    /// The hop limit (rdma_cm: the route's TTL, 64).
    pub hop_limit: u8,
    /// The traffic class.
    pub traffic_class: u8,
    /// The service level (4 bits).
    pub sl: u8,
    /// The static rate (6 bits; 0 for any).
    pub rate: u8,
}

/// A connection request ([`Cm::connect`]; cm.c's `ib_cm_req_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqParams {
    /// The service ID to connect to.
    pub service_id: u64,
    /// The local QP's number (24 bits).
    pub qpn: u32,
    /// The local QP's starting send PSN (24 bits).
    pub starting_psn: u32,
    /// RC (`false`) or UC (`true`).
    pub uc: bool,
    /// Responder resources offered (RDMA READ/atomic depth as target).
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// The transport retry count (3 bits).
    pub retry_count: u8,
    /// The RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Whether the local QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The response timeout asked of the remote CM (IBA exponent;
    /// [`CMA_CM_RESPONSE_TIMEOUT`]).
    pub remote_cm_response_timeout: u8,
    /// This CM's response timeout (IBA exponent).
    pub local_cm_response_timeout: u8,
    /// How often the REQ is retried (4 bits; [`CMA_MAX_CM_RETRIES`]).
    pub max_cm_retries: u8,
    /// The primary path.
    pub path: PathParams,
    /// Private data, at most 92 bytes (rdma_cm's header and the user's).
    pub private_data: Vec<u8>,
}

/// An acceptance ([`Cm::accept`]; cm.c's `ib_cm_rep_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepParams {
    /// The local QP's number.
    pub qpn: u32,
    /// The local QP's starting send PSN.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Whether a failover is accepted (0: accepted).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The RNR retry count.
    pub rnr_retry_count: u8,
    /// Whether the local QP uses an SRQ.
    pub srq: bool,
    /// Private data, at most 196 bytes.
    pub private_data: Vec<u8>,
}

/// Counters of what the CM dropped or answered without a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs that were not 256 bytes, not CM MADs or unknown attributes.
    pub malformed: u64,
    /// Messages naming no connection of ours (or a connection whose peer
    /// comm ID or GID differ: a stranger's), dropped.
    pub unknown_id: u64,
    /// Messages for a connection in a state that ignores them.
    pub wrong_state: u64,
    /// Duplicate REQs (same remote comm ID and CA GUID).
    pub dup_req: u64,
    /// REQs rejected as stale (remote QPN and CA GUID of a live or
    /// timewait connection).
    pub stale_req: u64,
    /// REQs rejected for want of a listener.
    pub no_listener: u64,
    /// REQs rejected for a full table.
    pub no_resources: u64,
    /// DREQs for unknown connections, answered with a DREP.
    pub unknown_dreq: u64,
    /// LAP and APR messages, not implemented, dropped.
    pub unsupported: u64,
    /// MADs dropped at a full output queue.
    pub mads_dropped: u64,
    /// Events dropped at a full event queue.
    pub events_dropped: u64,
    /// Timewait entries evicted at a full timewait table.
    pub timewait_evicted: u64,
}

/// A connection's state (IBTA Vol 1 fig. 12.9; cm.c's `ib_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// Reset to idle (after a REJ or a retry error); waiting to be
    /// destroyed.
    Idle,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Passive: REQ received, waiting for the consumer.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, waiting for the consumer's RTU.
    RepRcvd,
    /// Established.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, waiting for the consumer's DREP.
    DreqRcvd,
    /// Timewait.
    Timewait,
    /// SIDR: SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR: SIDR_REQ received, waiting for the consumer's
    /// [`Cm::sidr_reply`].
    SidrReqRcvd,
}

/// A MAD being retransmitted until answered.
#[derive(Clone)]
struct Retx {
    mad: [u8; MAD_LEN],
    deadline: u64,
    interval_ns: u64,
    left: u8,
}

#[derive(Clone)]
struct Conn {
    state: CmState,
    remote_id: u32,
    remote_ca_guid: u64,
    remote_qpn: u32,
    local_qpn: u32,
    peer_gid: Gid,
    /// The transaction ID of this connection's exchange (REQ's; cm.c
    /// `cm_id_priv->tid`).
    tid: u64,
    /// The per-try timeout of this side's retransmissions, ns.
    timeout_ns: u64,
    max_retries: u8,
    /// The ACK timeout exponent the timewait is derived from.
    ack_timeout: u8,
    retx: Option<Retx>,
    /// The last message sent without retransmission (REP, RTU, DREP), for
    /// duplicates.
    last: Option<[u8; MAD_LEN]>,
    timewait_until: u64,
    destroyed: bool,
    /// Whether remote_id/remote_ca_guid/remote_qpn are valid (after REQ
    /// received or REP received).
    remote_known: bool,
    /// An MRA was received for the REQ or REP in flight (cm.c's
    /// `IB_CM_MRA_REQ_RCVD`/`IB_CM_MRA_REP_RCVD`, kept as a flag on
    /// `ReqSent`/`RepSent`).
    mra_rcvd: bool,
    /// SIDR received: the service ID to echo in the SIDR_REP.
    sidr_service_id: u64,
}

/// The Communication Manager of one port.
pub struct Cm {
    port: PortIdentity,
    conns: BTreeMap<u32, Conn>,
    listeners: BTreeSet<u64>,
    out: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    next_index: u32,
    id_operand: u32,
    counters: CmCounters,
}

const NS_PER_MS: u64 = 1_000_000;

fn copy_private<const N: usize>(src: &[u8]) -> Result<[u8; N], CmError> {
    let mut b = [0u8; N];
    b.get_mut(..src.len())
        .ok_or(CmError::PrivateDataTooLong)?
        .copy_from_slice(src);
    Ok(b)
}

impl Cm {
    /// A CM for `port`, with empty tables.
    pub fn new(port: PortIdentity) -> Cm {
        let mix = port.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Cm {
            port,
            conns: BTreeMap::new(),
            listeners: BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            next_index: (mix >> 32) as u32,
            id_operand: mix as u32,
            counters: CmCounters::default(),
        }
    }

    /// The port's identity.
    pub fn port(&self) -> &PortIdentity {
        &self.port
    }

    /// The drop and answer counters.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// A connection's state, `None` if there is no such connection (or it
    /// was destroyed).
    pub fn state(&self, id: CmId) -> Option<CmState> {
        self.conns
            .get(&id.0)
            .filter(|c| !c.destroyed)
            .map(|c| c.state)
    }

    /// How many connections are held (timewait ones included).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// How many connections are in timewait.
    pub fn timewait_count(&self) -> usize {
        self.conns
            .values()
            .filter(|c| c.state == CmState::Timewait)
            .count()
    }

    fn live_count(&self) -> usize {
        self.conns.len() - self.timewait_count()
    }

    /// How many listeners there are.
    pub fn listener_count(&self) -> usize {
        self.listeners.len()
    }

    /// The next MAD to send, oldest first.
    pub fn pop_mad(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next event, oldest first.
    pub fn pop_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`Cm::poll`] next has work (ns, the caller's clock), `None` if
    /// no timer runs.
    pub fn next_timer(&self) -> Option<u64> {
        self.conns
            .values()
            .filter_map(|c| {
                if c.state == CmState::Timewait {
                    Some(c.timewait_until)
                } else {
                    c.retx.as_ref().map(|r| r.deadline)
                }
            })
            .min()
    }

    /// Listens on `service_id` (cm.c `ib_cm_listen`, exact match).
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.contains(&service_id) {
            return Err(CmError::Busy);
        }
        if self.listeners.len() >= MAX_LISTENERS {
            return Err(CmError::TableFull);
        }
        self.listeners.insert(service_id);
        Ok(())
    }

    /// Stops listening on `service_id`; connections it created stay.
    pub fn unlisten(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.remove(&service_id) {
            Ok(())
        } else {
            Err(CmError::NotListening)
        }
    }

    fn push_mad(&mut self, to_gid: Gid, mad: [u8; MAD_LEN]) {
        if self.out.len() >= MAX_OUT_MADS {
            self.counters.mads_dropped += 1;
            return;
        }
        self.out.push_back(Outgoing {
            to_gid,
            dest_qpn: vrnic_wire::GSI_QPN,
            mad,
        });
    }

    fn push_event(&mut self, id: u32, kind: CmEventKind) {
        if self.events.len() >= MAX_EVENTS {
            self.counters.events_dropped += 1;
            return;
        }
        self.events.push_back(CmEvent { id: CmId(id), kind });
    }

    /// A fresh local comm ID: cm.c's `cm_alloc_id_priv`, a cyclic index
    /// XORed with a random operand; never one in use or in timewait, never
    /// 0.
    fn alloc_id(&mut self) -> Option<u32> {
        for _ in 0..=MAX_CONNECTIONS + MAX_TIMEWAIT {
            let id = self.next_index ^ self.id_operand;
            self.next_index = self.next_index.wrapping_add(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// Requests a connection (cm.c `ib_send_cm_req`): sends a REQ and
    /// retransmits it every `2 · cm_convert_to_ms(packet_life_time) +
    /// cm_convert_to_ms(remote_cm_response_timeout)` ms up to
    /// `max_cm_retries` times; then [`CmEventKind::ReqError`]. `now_ns`:
    /// the caller's clock.
    pub fn connect(&mut self, now_ns: u64, p: &ReqParams) -> Result<CmId, CmError> {
        if p.qpn > 0xff_ffff
            || p.starting_psn > 0xff_ffff
            || p.max_cm_retries > 15
            || p.path.flow_label > 0xf_ffff
        {
            return Err(CmError::InvalidParam);
        }
        let private_data = copy_private::<{ private_data_len::REQ }>(&p.private_data)?;
        if self.live_count() >= MAX_CONNECTIONS {
            return Err(CmError::TableFull);
        }
        let id = self.alloc_id().ok_or(CmError::TableFull)?;
        let ack_timeout = cm_ack_timeout(self.port.ca_ack_delay, p.path.packet_life_time);
        // cm_format_req: on RoCE with hop_limit > 1 the LIDs are the
        // permissive LID and subnet_local is 0.
        let path = CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: self.port.gid,
            remote_gid: p.path.remote_gid,
            flow_label: p.path.flow_label,
            packet_rate: p.path.rate,
            traffic_class: p.path.traffic_class,
            hop_limit: p.path.hop_limit,
            sl: p.path.sl,
            subnet_local: p.path.hop_limit <= 1,
            local_ack_timeout: ack_timeout,
        };
        let req = CmReq {
            local_comm_id: id,
            vendor_id: 0,
            service_id: p.service_id,
            local_ca_guid: self.port.ca_guid,
            local_qkey: 0,
            local_qpn: p.qpn,
            responder_resources: p.responder_resources,
            local_eecn: 0,
            initiator_depth: p.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: p.remote_cm_response_timeout,
            transport_service_type: if p.uc {
                transport_type::UC
            } else {
                transport_type::RC
            },
            end_to_end_flow_control: p.flow_control,
            starting_psn: p.starting_psn,
            local_cm_response_timeout: p.local_cm_response_timeout,
            retry_count: p.retry_count,
            partition_key: vrnic_wire::DEFAULT_PKEY,
            path_mtu: p.path.mtu,
            rdc_exists: false,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: p.max_cm_retries,
            srq: p.srq,
            extended_transport_type: 0,
            primary_path: path,
            alternate_path: CmPath::default(),
            sap_supported: false,
            private_data,
        };
        // cm_form_tid: the low 32 bits are the local comm ID.
        let tid = u64::from(id);
        let mad = CmMessage::Req(req).to_mad(tid, 0).to_bytes();
        let timeout_ms = cm_convert_to_ms(p.path.packet_life_time)
            .saturating_mul(2)
            .saturating_add(cm_convert_to_ms(p.remote_cm_response_timeout));
        let timeout_ns = timeout_ms.saturating_mul(NS_PER_MS);
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqSent,
                remote_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: p.qpn,
                peer_gid: p.path.remote_gid,
                tid,
                timeout_ns,
                max_retries: p.max_cm_retries,
                ack_timeout,
                retx: Some(Retx {
                    mad,
                    deadline: now_ns.saturating_add(timeout_ns),
                    interval_ns: timeout_ns,
                    left: p.max_cm_retries,
                }),
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: false,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        self.push_mad(p.path.remote_gid, mad);
        Ok(CmId(id))
    }

    fn conn_mut(&mut self, id: CmId) -> Result<&mut Conn, CmError> {
        self.conns
            .get_mut(&id.0)
            .filter(|c| !c.destroyed)
            .ok_or(CmError::NoSuchId)
    }

    /// Accepts a received REQ (cm.c `ib_send_cm_rep`): sends a REP,
    /// retransmitted every `cm_convert_to_ms(REQ's local CM response
    /// timeout)` ms up to the REQ's max CM retries until RTU (or any later
    /// message); then [`CmEventKind::RepError`].
    pub fn accept(&mut self, now_ns: u64, id: CmId, p: &RepParams) -> Result<(), CmError> {
        if p.qpn > 0xff_ffff || p.starting_psn > 0xff_ffff {
            return Err(CmError::InvalidParam);
        }
        let private_data = copy_private::<{ private_data_len::REP }>(&p.private_data)?;
        let ca_guid = self.port.ca_guid;
        let ack_delay = self.port.ca_ack_delay;
        let c = self.conn_mut(id)?;
        if c.state != CmState::ReqRcvd {
            return Err(CmError::BadState);
        }
        let rep = CmRep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            local_qkey: 0,
            local_qpn: p.qpn,
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: p.starting_psn,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: ack_delay,
            failover_accepted: p.failover_accepted,
            end_to_end_flow_control: p.flow_control,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: ca_guid,
            private_data,
        };
        let mad = CmMessage::Rep(rep).to_mad(c.tid, 0).to_bytes();
        c.state = CmState::RepSent;
        c.local_qpn = p.qpn;
        c.retx = Some(Retx {
            mad,
            deadline: now_ns.saturating_add(c.timeout_ns),
            interval_ns: c.timeout_ns,
            left: c.max_retries,
        });
        let gid = c.peer_gid;
        self.push_mad(gid, mad);
        Ok(())
    }

    /// Sends the RTU after a REP (cm.c `ib_send_cm_rtu`; librdmacm's
    /// active side calls it once its QP is in RTS): the connection is
    /// established. The RTU is not retransmitted; a duplicate REP is
    /// answered with it again (cm.c `cm_dup_rep_handler`).
    pub fn send_rtu(&mut self, id: CmId, private_data: &[u8]) -> Result<(), CmError> {
        let private_data = copy_private::<{ private_data_len::RTU }>(private_data)?;
        let c = self.conn_mut(id)?;
        if c.state != CmState::RepRcvd {
            return Err(CmError::BadState);
        }
        let rtu = CmRtu {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            private_data,
        };
        let mad = CmMessage::Rtu(rtu).to_mad(c.tid, 0).to_bytes();
        c.state = CmState::Established;
        c.last = Some(mad);
        let gid = c.peer_gid;
        self.push_mad(gid, mad);
        Ok(())
    }

    fn rej_mad(
        local: u32,
        remote: u32,
        tid: u64,
        msg: u8,
        reason: u16,
        pd: [u8; private_data_len::REJ],
    ) -> [u8; MAD_LEN] {
        let rej = CmRej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: msg,
            ari_length: 0,
            reason,
            ari: [0; private_data_len::ADDITIONAL_INFO],
            private_data: pd,
        };
        CmMessage::Rej(rej).to_mad(tid, 0).to_bytes()
    }

    /// The consumer saw traffic on the QP before the RTU (cm.c
    /// `ib_cm_notify(IB_EVENT_COMM_EST)`, librdmacm's `rdma_establish`):
    /// in REP sent the connection is established, the REP no longer
    /// retransmitted, and [`CmEventKind::UserEstablished`] queued; in
    /// established nothing happens.
    pub fn establish(&mut self, id: CmId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        match c.state {
            CmState::Established => Ok(()),
            CmState::RepSent => {
                c.state = CmState::Established;
                c.retx = None;
                self.push_event(id.0, CmEventKind::UserEstablished);
                Ok(())
            }
            _ => Err(CmError::BadState),
        }
    }

    /// Rejects a received REQ or REP (cm.c `ib_send_cm_rej`): in REQ
    /// received or REP received the connection is reset to idle, in REP
    /// sent it enters timewait. `reason`: [`rej_reason`], usually
    /// [`rej_reason::CONSUMER_DEFINED`].
    pub fn reject(
        &mut self,
        now_ns: u64,
        id: CmId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = copy_private::<{ private_data_len::REJ }>(private_data)?;
        let c = self.conn_mut(id)?;
        let (msg, timewait) = match c.state {
            CmState::ReqRcvd => (msg_response::REQ, false),
            CmState::RepRcvd => (msg_response::REP, false),
            CmState::ReqSent => (msg_response::OTHER, false),
            CmState::RepSent => (msg_response::OTHER, true),
            _ => return Err(CmError::BadState),
        };
        // cm_format_rej: in REQ received the local comm ID is 0.
        let local = if c.state == CmState::ReqRcvd { 0 } else { id.0 };
        let mad = Self::rej_mad(local, c.remote_id, c.tid, msg, reason, pd);
        let gid = c.peer_gid;
        c.retx = None;
        if timewait {
            self.enter_timewait(now_ns, id.0);
        } else {
            c.state = CmState::Idle;
            c.remote_known = false;
        }
        self.push_mad(gid, mad);
        Ok(())
    }

    fn dreq_mad(id: u32, c: &Conn, pd: [u8; private_data_len::DREQ]) -> [u8; MAD_LEN] {
        let dreq = CmDreq {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            remote_qpn_eecn: c.remote_qpn,
            private_data: pd,
        };
        // cm_format_dreq: a new transaction.
        CmMessage::Dreq(dreq)
            .to_mad(u64::from(id) | (1 << 32), 0)
            .to_bytes()
    }

    /// Disconnects an established connection (cm.c `ib_send_cm_dreq`):
    /// sends a DREQ, retransmitted like the REQ/REP until DREP, then
    /// timewait ([`CmEventKind::DreqError`] after the last retry). A DREQ
    /// sent while the REP waits for its RTU counts as established, as in
    /// cm.c.
    pub fn disconnect(
        &mut self,
        now_ns: u64,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = copy_private::<{ private_data_len::DREQ }>(private_data)?;
        let c = self.conn_mut(id)?;
        if !matches!(c.state, CmState::Established | CmState::RepSent) {
            return Err(CmError::BadState);
        }
        let mad = Self::dreq_mad(id.0, c, pd);
        c.state = CmState::DreqSent;
        c.retx = Some(Retx {
            mad,
            deadline: now_ns.saturating_add(c.timeout_ns),
            interval_ns: c.timeout_ns,
            left: c.max_retries,
        });
        let gid = c.peer_gid;
        self.push_mad(gid, mad);
        Ok(())
    }

    fn drep_mad(id: u32, remote: u32, tid: u64) -> [u8; MAD_LEN] {
        let drep = CmDrep {
            local_comm_id: id,
            remote_comm_id: remote,
            private_data: [0; private_data_len::DREP],
        };
        CmMessage::Drep(drep).to_mad(tid, 0).to_bytes()
    }

    /// Answers a received DREQ (cm.c `ib_send_cm_drep`): sends a DREP and
    /// enters timewait; a duplicate DREQ in timewait is answered with it
    /// again.
    pub fn reply_disconnect(
        &mut self,
        now_ns: u64,
        id: CmId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = copy_private::<{ private_data_len::DREP }>(private_data)?;
        let c = self.conn_mut(id)?;
        if c.state != CmState::DreqRcvd {
            return Err(CmError::BadState);
        }
        let drep = CmDrep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_id,
            private_data: pd,
        };
        let mad = CmMessage::Drep(drep).to_mad(c.tid, 0).to_bytes();
        c.last = Some(mad);
        let gid = c.peer_gid;
        self.enter_timewait(now_ns, id.0);
        self.push_mad(gid, mad);
        Ok(())
    }

    /// Destroys a connection (cm.c `cm_destroy_id`): REQ sent → REJ
    /// timeout; REQ/REP received or REP sent → REJ consumer defined;
    /// established → DREQ, then timewait; DREQ sent → timewait; DREQ
    /// received → DREP, then timewait. A connection in timewait stays there
    /// (its comm ID and remote QPN reserved) but produces no more events.
    pub fn destroy(&mut self, now_ns: u64, id: CmId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        let gid = c.peer_gid;
        let nopd = [0; private_data_len::REJ];
        match c.state {
            CmState::Idle => {
                self.conns.remove(&id.0);
                return Ok(());
            }
            CmState::ReqSent => {
                let mad = Self::rej_mad(
                    id.0,
                    0,
                    c.tid,
                    msg_response::OTHER,
                    rej_reason::TIMEOUT,
                    nopd,
                );
                self.conns.remove(&id.0);
                self.push_mad(gid, mad);
                return Ok(());
            }
            CmState::ReqRcvd | CmState::RepRcvd => {
                let msg = if c.state == CmState::ReqRcvd {
                    msg_response::REQ
                } else {
                    msg_response::REP
                };
                let mad = Self::rej_mad(
                    if c.state == CmState::ReqRcvd { 0 } else { id.0 },
                    c.remote_id,
                    c.tid,
                    msg,
                    rej_reason::CONSUMER_DEFINED,
                    nopd,
                );
                self.conns.remove(&id.0);
                self.push_mad(gid, mad);
                return Ok(());
            }
            CmState::RepSent => {
                let mad = Self::rej_mad(
                    id.0,
                    c.remote_id,
                    c.tid,
                    msg_response::OTHER,
                    rej_reason::CONSUMER_DEFINED,
                    nopd,
                );
                self.conns.remove(&id.0);
                self.push_mad(gid, mad);
                return Ok(());
            }
            CmState::Established => {
                let mad = Self::dreq_mad(id.0, c, [0; private_data_len::DREQ]);
                self.push_mad(gid, mad);
                self.enter_timewait(now_ns, id.0);
            }
            CmState::DreqSent => self.enter_timewait(now_ns, id.0),
            CmState::DreqRcvd => {
                let mad = Self::drep_mad(id.0, c.remote_id, c.tid);
                c.last = Some(mad);
                self.push_mad(gid, mad);
                self.enter_timewait(now_ns, id.0);
            }
            CmState::Timewait => {}
            // cm_destroy_id: a pending SIDR_REQ is answered REJECT.
            CmState::SidrReqRcvd => {
                let _ = self.sidr_reply(id, sidr_status::REJECT, 0, 0, &[]);
                return Ok(());
            }
            CmState::SidrReqSent => {
                self.conns.remove(&id.0);
                return Ok(());
            }
        }
        if let Some(c) = self.conns.get_mut(&id.0) {
            c.destroyed = true;
        }
        Ok(())
    }

    /// cm.c `cm_enter_timewait`: the timewait lasts
    /// `cm_convert_to_ms(ack timeout)` ms, the ACK timeout being the
    /// path's (`cm_ack_timeout` of the packet life time; with rdma_cm's 18
    /// and rxe's ACK delay 15: 19, 2048 ms).
    fn enter_timewait(&mut self, now_ns: u64, id: u32) {
        let in_tw = self.timewait_count();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.state == CmState::Timewait {
            return;
        }
        c.state = CmState::Timewait;
        c.retx = None;
        c.timewait_until =
            now_ns.saturating_add(cm_convert_to_ms(c.ack_timeout).saturating_mul(NS_PER_MS));
        if in_tw >= MAX_TIMEWAIT {
            let oldest = self
                .conns
                .iter()
                .filter(|(k, c)| c.state == CmState::Timewait && **k != id)
                .min_by_key(|(_, c)| c.timewait_until)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.conns.remove(&k);
                self.counters.timewait_evicted += 1;
            }
        }
    }

    /// Runs the timers due at `now_ns`: retransmissions, retry errors and
    /// timewait exits.
    pub fn poll(&mut self, now_ns: u64) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                if c.state == CmState::Timewait {
                    c.timewait_until <= now_ns
                } else {
                    c.retx.as_ref().is_some_and(|r| r.deadline <= now_ns)
                }
            })
            .map(|(k, _)| *k)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.state == CmState::Timewait {
                // cm_timewait_handler: the entry goes; the id is idle.
                if c.destroyed {
                    self.conns.remove(&id);
                } else {
                    c.state = CmState::Idle;
                    c.remote_known = false;
                    self.push_event(id, CmEventKind::TimewaitExit);
                }
                continue;
            }
            let Some(r) = c.retx.as_mut() else {
                continue;
            };
            if r.left > 0 {
                r.left -= 1;
                r.deadline = now_ns.saturating_add(r.interval_ns);
                let (gid, mad) = (c.peer_gid, r.mad);
                self.push_mad(gid, mad);
                continue;
            }
            // cm_process_send_error.
            c.retx = None;
            match c.state {
                CmState::ReqSent => {
                    c.state = CmState::Idle;
                    self.push_event(id, CmEventKind::ReqError);
                }
                CmState::RepSent => {
                    c.state = CmState::Idle;
                    c.remote_known = false;
                    self.push_event(id, CmEventKind::RepError);
                }
                CmState::DreqSent => {
                    self.enter_timewait(now_ns, id);
                    self.push_event(id, CmEventKind::DreqError);
                }
                CmState::SidrReqSent => {
                    let destroyed = c.destroyed;
                    self.conns.remove(&id);
                    if !destroyed {
                        self.push_event(id, CmEventKind::SidrReqError);
                    }
                }
                _ => {}
            }
        }
    }

    /// A connection of ours named by a message's remote comm ID whose
    /// peer (comm ID when known, GID) is the sender.
    fn peer_conn(&self, local: u32, remote: u32, from: &Source) -> Option<u32> {
        let c = self.conns.get(&local)?;
        if c.peer_gid != from.gid {
            return None;
        }
        if c.remote_known && c.remote_id != remote {
            return None;
        }
        Some(local)
    }

    /// Handles a MAD received on QP1 at `now_ns` from `from`. Anything not
    /// a 256-byte CM MAD is counted and dropped.
    pub fn handle_mad(&mut self, now_ns: u64, from: Source, bytes: &[u8]) {
        let Ok(mad) = Mad::parse(bytes) else {
            self.counters.malformed += 1;
            return;
        };
        let Ok(msg) = CmMessage::parse(&mad) else {
            self.counters.malformed += 1;
            return;
        };
        let tid = mad.hdr.tid;
        match msg {
            CmMessage::Req(req) => self.on_req(now_ns, from, tid, req),
            CmMessage::Rep(rep) => self.on_rep(from, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(from, rtu),
            CmMessage::Rej(rej) => self.on_rej(now_ns, from, rej),
            CmMessage::Dreq(dreq) => self.on_dreq(from, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now_ns, from, drep),
            CmMessage::Mra(mra) => self.on_mra(now_ns, from, mra),
            CmMessage::SidrReq(r) => self.on_sidr_req(from, tid, r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(from, r),
            _ => self.counters.unsupported += 1,
        }
    }

    /// cm.c `cm_req_handler`/`cm_match_req`.
    fn on_req(&mut self, now_ns: u64, from: Source, tid: u64, req: CmReq) {
        let nopd = [0; private_data_len::REJ];
        let req_msg = msg_response::REQ;
        // Duplicate: same remote comm ID and CA GUID (cm_insert_remote_id).
        let dup = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.remote_known
                    && c.remote_id == req.local_comm_id
                    && c.remote_ca_guid == req.local_ca_guid
            })
            .map(|(k, c)| {
                (
                    *k,
                    c.state,
                    c.last,
                    c.retx.as_ref().map(|r| r.mad),
                    c.peer_gid,
                )
            });
        if let Some((id, state, _last, retx, gid)) = dup {
            self.counters.dup_req += 1;
            match state {
                // cm_dup_req_handler: in timewait, REJ stale connection.
                CmState::Timewait => {
                    let mad = Self::rej_mad(
                        id,
                        req.local_comm_id,
                        tid,
                        msg_response::OTHER,
                        rej_reason::STALE_CONN,
                        nopd,
                    );
                    self.push_mad(gid, mad);
                }
                // The REP we sent, again (cm.c leaves it to the MAD
                // layer's retransmission; answering at once shortens the
                // active side's wait).
                CmState::RepSent => {
                    if let Some(mad) = retx {
                        self.push_mad(gid, mad);
                    }
                }
                _ => {}
            }
            return;
        }
        // Stale: the remote QPN and CA GUID of a connection still held
        // (cm_insert_remote_qpn): REJ stale, and a DREQ on the old one.
        let stale = self
            .conns
            .iter()
            .find(|(_, c)| {
                c.remote_known
                    && c.remote_qpn == req.local_qpn
                    && c.remote_ca_guid == req.local_ca_guid
            })
            .map(|(k, c)| (*k, c.state));
        if let Some((old, state)) = stale {
            self.counters.stale_req += 1;
            let mad = Self::rej_mad(
                0,
                req.local_comm_id,
                tid,
                req_msg,
                rej_reason::STALE_CONN,
                nopd,
            );
            self.push_mad(from.gid, mad);
            if state == CmState::Established {
                let _ = self.disconnect(now_ns, CmId(old), &[]);
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.counters.no_listener += 1;
            let mad = Self::rej_mad(
                0,
                req.local_comm_id,
                tid,
                req_msg,
                rej_reason::INVALID_SERVICE_ID,
                nopd,
            );
            self.push_mad(from.gid, mad);
            return;
        }
        let id = if self.live_count() >= MAX_CONNECTIONS {
            None
        } else {
            self.alloc_id()
        };
        let Some(id) = id else {
            self.counters.no_resources += 1;
            let mad = Self::rej_mad(
                0,
                req.local_comm_id,
                tid,
                req_msg,
                rej_reason::NO_RESOURCES,
                nopd,
            );
            self.push_mad(from.gid, mad);
            return;
        };
        let timeout_ns = cm_convert_to_ms(req.local_cm_response_timeout).saturating_mul(NS_PER_MS);
        self.conns.insert(
            id,
            Conn {
                state: CmState::ReqRcvd,
                remote_id: req.local_comm_id,
                remote_ca_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                local_qpn: 0,
                peer_gid: from.gid,
                tid,
                timeout_ns,
                max_retries: req.max_cm_retries,
                // cm_format_paths_from_req + cm_init_av_by_path: the av's
                // timeout is the REQ's local ACK timeout.
                ack_timeout: req.primary_path.local_ack_timeout,
                retx: None,
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: true,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        self.push_event(
            id,
            CmEventKind::ReqReceived {
                listener: req.service_id,
                req: Box::new(req),
                source: from,
            },
        );
    }

    /// cm.c `cm_rep_handler`, `cm_dup_rep_handler`.
    fn on_rep(&mut self, from: Source, rep: CmRep) {
        let Some(id) = self.peer_conn(rep.remote_comm_id, rep.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            CmState::ReqSent => {
                c.state = CmState::RepRcvd;
                c.retx = None;
                c.remote_id = rep.local_comm_id;
                c.remote_ca_guid = rep.local_ca_guid;
                c.remote_qpn = rep.local_qpn;
                c.remote_known = true;
                self.push_event(id, CmEventKind::RepReceived(Box::new(rep)));
            }
            CmState::Established => {
                // A duplicate REP: our RTU was lost; send it again.
                if let Some(mad) = c.last {
                    let gid = c.peer_gid;
                    self.push_mad(gid, mad);
                }
            }
            _ => self.counters.wrong_state += 1,
        }
    }

    /// cm.c `cm_rtu_handler`.
    fn on_rtu(&mut self, from: Source, rtu: CmRtu) {
        let Some(id) = self.peer_conn(rtu.remote_comm_id, rtu.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.state != CmState::RepSent {
            self.counters.wrong_state += 1;
            return;
        }
        c.state = CmState::Established;
        c.retx = None;
        self.push_event(id, CmEventKind::RtuReceived);
    }

    /// cm.c `cm_rej_handler`. In REQ sent the peer's comm ID is not known
    /// yet: the REJ must name ours and come from the REQ's destination.
    fn on_rej(&mut self, now_ns: u64, from: Source, rej: CmRej) {
        let Some(id) = self.peer_conn(rej.remote_comm_id, rej.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let timewait = match c.state {
            CmState::ReqSent | CmState::RepSent | CmState::RepRcvd => {
                rej.reason == rej_reason::STALE_CONN
            }
            CmState::Established | CmState::DreqSent => true,
            _ => {
                self.counters.wrong_state += 1;
                return;
            }
        };
        c.retx = None;
        if timewait {
            self.enter_timewait(now_ns, id);
        } else if let Some(c) = self.conns.get_mut(&id) {
            c.state = CmState::Idle;
            c.remote_known = false;
        }
        if self.conns.get(&id).is_some_and(|c| !c.destroyed) {
            self.push_event(
                id,
                CmEventKind::RejReceived {
                    reason: rej.reason,
                    private_data: Box::new(rej.private_data),
                },
            );
        }
    }

    /// cm.c `cm_dreq_handler`: an unknown connection's DREQ gets a DREP
    /// (`cm_issue_drep`); in timewait the DREP is sent again.
    fn on_dreq(&mut self, from: Source, tid: u64, dreq: CmDreq) {
        let known = self.conns.contains_key(&dreq.remote_comm_id);
        let Some(id) = self.peer_conn(dreq.remote_comm_id, dreq.local_comm_id, &from) else {
            if known {
                // Our comm ID but another peer's: a stranger's, dropped.
                self.counters.unknown_id += 1;
            } else {
                self.counters.unknown_dreq += 1;
                let mad = Self::drep_mad(dreq.remote_comm_id, dreq.local_comm_id, tid);
                self.push_mad(from.gid, mad);
            }
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if !c.remote_known {
            self.counters.unknown_id += 1;
            return;
        }
        match c.state {
            CmState::RepSent | CmState::Established | CmState::DreqSent => {
                c.retx = None;
                c.state = CmState::DreqRcvd;
                c.tid = tid;
                if c.destroyed {
                    return;
                }
                self.push_event(
                    id,
                    CmEventKind::DreqReceived {
                        private_data: Box::new(dreq.private_data),
                    },
                );
            }
            CmState::Timewait => {
                let gid = c.peer_gid;
                let mad = c
                    .last
                    .unwrap_or_else(|| Self::drep_mad(id, dreq.local_comm_id, tid));
                self.push_mad(gid, mad);
            }
            _ => self.counters.wrong_state += 1,
        }
    }

    /// cm.c `cm_mra_handler`: only for the REQ (in REQ sent) or the REP
    /// (in REP sent) it names, once.
    fn on_mra(&mut self, now_ns: u64, from: Source, mra: CmMra) {
        let Some(id) = self.peer_conn(mra.remote_comm_id, mra.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let want = match c.state {
            CmState::ReqSent => msg_response::REQ,
            CmState::RepSent => msg_response::REP,
            _ => {
                self.counters.wrong_state += 1;
                return;
            }
        };
        if mra.message_mraed != want || c.mra_rcvd {
            self.counters.wrong_state += 1;
            return;
        }
        let Some(r) = c.retx.as_mut() else {
            return;
        };
        // ib_modify_mad: the send in flight and its retries wait this long.
        let timeout_ms =
            cm_convert_to_ms(mra.service_timeout).saturating_add(cm_convert_to_ms(c.ack_timeout));
        r.interval_ns = timeout_ms.saturating_mul(NS_PER_MS);
        r.deadline = now_ns.saturating_add(r.interval_ns);
        c.mra_rcvd = true;
        if c.destroyed {
            return;
        }
        self.push_event(
            id,
            CmEventKind::MraReceived {
                service_timeout: mra.service_timeout,
            },
        );
    }

    /// Resolves a service ID for UD (cm.c `ib_send_cm_sidr_req`): sends a
    /// SIDR_REQ to `remote_gid`, retransmitted every `timeout_ms` ms up to
    /// `max_cm_retries` times (rdma_cm: `1 << (CMA_CM_RESPONSE_TIMEOUT -
    /// 8)` = 4096 ms and [`CMA_MAX_CM_RETRIES`]); then
    /// [`CmEventKind::SidrReqError`]. The request ID is the local comm ID.
    pub fn sidr_request(
        &mut self,
        now_ns: u64,
        service_id: u64,
        remote_gid: Gid,
        timeout_ms: u64,
        max_cm_retries: u8,
        private_data: &[u8],
    ) -> Result<CmId, CmError> {
        let private_data = copy_private::<{ private_data_len::SIDR_REQ }>(private_data)?;
        if self.live_count() >= MAX_CONNECTIONS {
            return Err(CmError::TableFull);
        }
        let id = self.alloc_id().ok_or(CmError::TableFull)?;
        let req = CmSidrReq {
            request_id: id,
            partition_key: vrnic_wire::DEFAULT_PKEY,
            service_id,
            private_data,
        };
        let tid = u64::from(id);
        let mad = CmMessage::SidrReq(req).to_mad(tid, 0).to_bytes();
        let interval_ns = timeout_ms.saturating_mul(NS_PER_MS);
        self.conns.insert(
            id,
            Conn {
                state: CmState::SidrReqSent,
                remote_id: 0,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: 0,
                peer_gid: remote_gid,
                tid,
                timeout_ns: interval_ns,
                max_retries: max_cm_retries,
                ack_timeout: 0,
                retx: Some(Retx {
                    mad,
                    deadline: now_ns.saturating_add(interval_ns),
                    interval_ns,
                    left: max_cm_retries,
                }),
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: false,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        self.push_mad(remote_gid, mad);
        Ok(CmId(id))
    }

    /// Answers a received SIDR_REQ (cm.c `ib_send_cm_sidr_rep`): `status`
    /// ([`sidr_status`]), the UD QP's number and Q_Key; the id is gone
    /// after it.
    pub fn sidr_reply(
        &mut self,
        id: CmId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let private_data = copy_private::<{ private_data_len::SIDR_REP }>(private_data)?;
        if qpn > 0xff_ffff {
            return Err(CmError::InvalidParam);
        }
        let c = self.conns.get(&id.0).ok_or(CmError::NoSuchId)?;
        if c.state != CmState::SidrReqRcvd {
            return Err(CmError::BadState);
        }
        let rep = CmSidrRep {
            request_id: c.remote_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn,
            service_id: c.sidr_service_id,
            qkey,
            additional_info: [0; private_data_len::ADDITIONAL_INFO],
            private_data,
        };
        let mad = CmMessage::SidrRep(rep).to_mad(c.tid, 0).to_bytes();
        let gid = c.peer_gid;
        self.conns.remove(&id.0);
        self.push_mad(gid, mad);
        Ok(())
    }

    fn sidr_rep_mad(req: &CmSidrReq, tid: u64, status: u8) -> [u8; MAD_LEN] {
        let rep = CmSidrRep {
            request_id: req.request_id,
            status,
            additional_info_length: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: req.service_id,
            qkey: 0,
            additional_info: [0; private_data_len::ADDITIONAL_INFO],
            private_data: [0; private_data_len::SIDR_REP],
        };
        CmMessage::SidrRep(rep).to_mad(tid, 0).to_bytes()
    }

    /// cm.c `cm_sidr_req_handler`: a duplicate (same request ID from the
    /// same GID, still pending) is dropped; no listener → SIDR_REP
    /// UNSUPPORTED; a full table → SIDR_REP REJECT.
    fn on_sidr_req(&mut self, from: Source, tid: u64, req: CmSidrReq) {
        let dup = self.conns.values().any(|c| {
            c.state == CmState::SidrReqRcvd
                && c.remote_id == req.request_id
                && c.peer_gid == from.gid
        });
        if dup {
            self.counters.dup_req += 1;
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.counters.no_listener += 1;
            let mad = Self::sidr_rep_mad(&req, tid, sidr_status::UNSUPPORTED);
            self.push_mad(from.gid, mad);
            return;
        }
        let id = if self.live_count() >= MAX_CONNECTIONS {
            None
        } else {
            self.alloc_id()
        };
        let Some(id) = id else {
            self.counters.no_resources += 1;
            let mad = Self::sidr_rep_mad(&req, tid, sidr_status::REJECT);
            self.push_mad(from.gid, mad);
            return;
        };
        self.conns.insert(
            id,
            Conn {
                state: CmState::SidrReqRcvd,
                remote_id: req.request_id,
                remote_ca_guid: 0,
                remote_qpn: 0,
                local_qpn: 0,
                peer_gid: from.gid,
                tid,
                timeout_ns: 0,
                max_retries: 0,
                ack_timeout: 0,
                retx: None,
                last: None,
                timewait_until: 0,
                destroyed: false,
                remote_known: false,
                mra_rcvd: false,
                sidr_service_id: 0,
            },
        );
        if let Some(c) = self.conns.get_mut(&id) {
            c.sidr_service_id = req.service_id;
        }
        self.push_event(
            id,
            CmEventKind::SidrReqReceived {
                listener: req.service_id,
                req: Box::new(req),
                source: from,
            },
        );
    }

    /// cm.c `cm_sidr_rep_handler`: the request ID names a SIDR_REQ of ours
    /// sent to the sender's GID.
    fn on_sidr_rep(&mut self, from: Source, rep: CmSidrRep) {
        let ok = self
            .conns
            .get(&rep.request_id)
            .is_some_and(|c| c.state == CmState::SidrReqSent && c.peer_gid == from.gid);
        if !ok {
            self.counters.unknown_id += 1;
            return;
        }
        let destroyed = self
            .conns
            .remove(&rep.request_id)
            .is_some_and(|c| c.destroyed);
        if !destroyed {
            self.push_event(rep.request_id, CmEventKind::SidrRepReceived(Box::new(rep)));
        }
    }

    /// cm.c `cm_drep_handler`.
    fn on_drep(&mut self, now_ns: u64, from: Source, drep: CmDrep) {
        let Some(id) = self.peer_conn(drep.remote_comm_id, drep.local_comm_id, &from) else {
            self.counters.unknown_id += 1;
            return;
        };
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.state != CmState::DreqSent || !c.remote_known {
            self.counters.wrong_state += 1;
            return;
        }
        self.enter_timewait(now_ns, id);
        self.push_event(id, CmEventKind::DrepReceived);
    }
}
