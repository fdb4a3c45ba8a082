//! The RNIC device model: executes the device ABI ([`crate::abi`]) against
//! driver memory and the wire. Transport-agnostic: the vhost-user backend,
//! the in-process test harnesses and (later) the embedded switch all drive
//! a [`Device`] through these entry points.
//!
//! The device is single-threaded: its owner calls [`Device::control`],
//! [`Device::doorbell`], [`Device::receive`] and [`Device::poll`], then drains
//! [`Device::pop_tx`] to the link and [`Device::pop_event`] to the event queue.
//! Time is passed in by the caller as nanoseconds on a monotonic clock, so
//! tests can run on a simulated clock.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::abi;
use crate::mem::DmaMemory;

/// Static configuration of one device (one port).
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The port's MAC address.
    pub mac: [u8; 6],
    /// The port's IPv4 address; its IPv4-mapped GID is GID index 1.
    pub ipv4: Ipv4Addr,
    /// IPv4 prefix length (for ARP: on-link destinations only).
    pub prefix_len: u8,
    /// Further IPv6 addresses of the port (GID indices 2, 3, ...; the
    /// link-local GID, index 0, always exists).
    pub ipv6: Vec<Ipv6Addr>,
    /// Link MTU, bytes (IP packet size; 1500 gives path MTU 1024).
    pub link_mtu: u32,
}

pub use crate::time::Nanos;

mod contexts;
mod control;
mod db_records;
mod neigh;

pub use crate::transport::stats::{Counter, Counters, DeviceStats, QpStats};
pub use crate::transport::Resources;
pub use db_records::WATCH_MAX;
pub use neigh::{
    NeighTable, NEIGH_FAILED_NS, NEIGH_MAX, NEIGH_MAX_PROBES, NEIGH_PENDING_MAX,
    NEIGH_REACHABLE_NS, NEIGH_RETRANS_NS,
};

use crate::batch;
use crate::transport::hdr_check::{self, Refusal, Route};
use crate::transport::Qp;
use crate::transport::{completer, datagram, requester, responder, Env, Output, PortId};
use crate::verbs::cq::Cq;
use crate::verbs::mr::MrTable;
use crate::verbs::table::{HandleSpace, HandleTable, KeySource};
use crate::wire::{self, Frame, Icrc};

/// Builds the transport's [`Env`] from a device: its [`Resources`],
/// borrowed whole, so that a QP taken from `qps` can be borrowed alongside.
macro_rules! transport_env {
    ($d:expr, $mem:expr, $now:expr) => {
        Env {
            mem: $mem,
            res: &mut $d.res,
            now: $now,
        }
    };
}
pub(crate) use transport_env;

/// Runs one transport step for a QP: `$body` with `$env`, a transport
/// [`Env`] of device `$d` at time `$now`, between
/// `Counters::begin_step` and `Counters::end_step`, which give `$qp`
/// its share of the device counters the step counted: how every per-QP
/// counter is attributed. Evaluates to `$body`'s value.
macro_rules! qp_step {
    ($d:expr, $qp:expr, $mem:expr, $now:expr, |$env:ident| $body:block) => {{
        $d.res.out.stats.begin_step();
        let r = {
            #[allow(unused_mut)]
            let mut $env = transport_env!($d, $mem, $now);
            $body
        };
        $d.res.out.stats.end_step(&mut $qp.stats);
        $crate::transport::requester::count_in_flight($qp, &mut $d.res);
        r
    }};
}
pub(crate) use qp_step;

/// Device limits, reported by `CMD_QUERY_DEVICE` and the config space.
pub const MAX_QP: usize = 1024;
/// Maximum CQs.
pub const MAX_CQ: usize = 1024;
/// Maximum MRs.
pub const MAX_MR: usize = 4096;
/// Maximum PDs.
pub const MAX_PD: usize = 1024;
/// Maximum address handles.
pub const MAX_AH: usize = 4096;
/// Maximum SRQs.
pub const MAX_SRQ: usize = 1024;
/// QP numbers: 24 bits, from 0x11 up (0 and 1 are IBTA's QP0 and QP1),
/// allocated cyclically, at most [`MAX_QP`] alive; 1 ([`abi::GSI_QPN`])
/// is the GSI QP's alone, created with `QPT_GSI`.
pub const QPN_SPACE: HandleSpace = HandleSpace {
    first: 0x11,
    index_bits: 24,
    key_bits: 0,
    max: MAX_QP,
    fixed: Some(abi::GSI_QPN),
};
/// Maximum WQEs per SQ/RQ.
pub const MAX_QP_WR: u32 = 16384;
/// Maximum CQEs per CQ.
pub const MAX_CQE: u32 = 65536;
/// Maximum SGEs per WQE.
pub const MAX_SGE: u32 = 32;
/// The port's GID table length (`ibv_port_attr.gid_tbl_len`), in
/// entries: room for the port's addresses (the MAC's link-local GID, the
/// IPv4-mapped GID, each IPv6 address), the unused entries reading as
/// `NotFound` (rdma-core's `ENODATA` from `ibv_query_gid_ex`), as a real
/// RoCE port's table has unused entries (rxe's holds 1024). pyverbs'
/// `test_query_gid_ex_bad_flow` asks an unused entry for its error.
pub const GID_TBL_LEN: u32 = 16;
/// Maximum inline bytes per send WQE.
pub const MAX_INLINE: u32 = 512;
pub use crate::transport::MAX_MSG_SZ;
/// Largest MR, bytes.
pub const MAX_MR_SIZE: u64 = 1 << 40;
/// Largest page list of one MR, entries (`DeviceAttr::max_mr_pages`):
/// 2 GiB (`MAX_MSG_SZ`) in 4 KiB pages. `CMD_REG_MR` with more is
/// `STATUS_EINVAL`. It bounds one registration's work (reading and
/// checking every entry: about 17 ms of worker time at 2^19) and its copy
/// in the daemon (4 MiB).
pub const MAX_MR_PAGES: u32 = 1 << 19;
/// Page-list entries of all MRs of a device together
/// (`DeviceAttr::max_total_mr_pages`): 8 GiB registered in 4 KiB pages,
/// 16 MiB of page lists in the daemon. A registration past it is
/// `STATUS_ENOMEM` (rxe's pools answer a full pool so) until MRs are
/// deregistered.
pub const MAX_MR_PAGES_TOTAL: u32 = 1 << 21;
/// SQ, RQ and SRQ ring entries of all QPs and SRQs of a device together
/// (`DeviceAttr::max_total_wr`): `CMD_CREATE_QP` or `CMD_CREATE_SRQ` past
/// it is `STATUS_ENOMEM`. The rings live in driver memory; the budget
/// bounds the worker time of walking them all (flushes, resets).
pub const MAX_TOTAL_WR: u32 = 1 << 20;

/// True when `index`, a producer index a driver rang for a ring of `size`
/// slots, is within the queue's window: at or after the device's fetch
/// index `fetch` (the next WQE it would read) and at most `size` past its
/// consumer index `ci` (the oldest WQE not yet completed), in free-running
/// `u32` arithmetic (`ci <= fetch <= index <= ci + size`, modulo 2^32).
/// Keeping every producer index there bounds each loop over a queue's
/// WQEs by the ring size (device spec §5.x.6.9).
pub fn producer_index_ok(index: u32, fetch: u32, ci: u32, size: u32) -> bool {
    let posted = index.wrapping_sub(ci);
    let fetched = fetch.wrapping_sub(ci);
    fetched <= posted && posted <= size
}

/// One RNIC port: verbs objects, RoCEv2 transport and ARP.
pub struct Device {
    cfg: DeviceConfig,
    /// The QP table: what the transport runs on.
    qps: HandleTable<Qp>,
    /// Open device contexts (device spec §5.x.6.13).
    ctxs: contexts::Contexts,
    /// Everything else, which the transport borrows while it serves a QP.
    res: Resources,
    /// The QP table slot [`Device::poll`] serves first: the first QP that
    /// found the link backlog full in the previous poll, so that QPs
    /// resuming READ streams and long sends take turns.
    poll_from: usize,
    /// QPs whose producer indices are read from their record while the
    /// device polls ([`db_records`]).
    watch: db_records::Watch,
}

impl Device {
    /// A device with no objects, its MR key bytes from a secret drawn
    /// from the kernel's CSPRNG ([`KeySource::from_os`]).
    pub fn new(cfg: DeviceConfig) -> Self {
        Self::with_keys(cfg, KeySource::from_os())
    }

    /// A device whose MR keys come from `secret` ([`KeySource::seeded`]):
    /// the same keys for the same commands, for reproducible fuzzing.
    pub fn with_key_secret(cfg: DeviceConfig, secret: u64) -> Self {
        Self::with_keys(cfg, KeySource::seeded(secret))
    }

    fn with_keys(cfg: DeviceConfig, keys: KeySource) -> Self {
        let port = PortId {
            mac: cfg.mac,
            ipv4: cfg.ipv4,
            ipv6: cfg.ipv6.clone(),
            pkeys: vec![crate::transport::DEFAULT_PKEY],
        };
        let neigh = NeighTable::with_own(
            port.mac,
            (0..port.gid_count()).filter_map(|i| port.gid(i).map(|g| g.to_ip())),
        );
        Self {
            cfg,
            qps: HandleTable::new(QPN_SPACE),
            ctxs: contexts::Contexts::default(),
            res: Resources {
                port,
                pds: HandleTable::new(HandleSpace::numbers(MAX_PD)),
                mrs: MrTable::new(MAX_MR, keys),
                cqs: HandleTable::new(HandleSpace::numbers(MAX_CQ)),
                ahs: HandleTable::new(HandleSpace::numbers(MAX_AH)),
                srqs: HandleTable::new(HandleSpace::numbers(MAX_SRQ)),
                neigh,
                out: Output::default(),
                bytes_in_flight: 0,
                qps_in_flight: 0,
            },
            poll_from: 0,
            watch: Default::default(),
        }
    }

    /// Active path MTU as `ibv_mtu`: the largest IBTA MTU that fits the link
    /// MTU with IP/UDP/BTH/RETH/ICRC overhead (1500 gives 1024, 9000 gives 4096).
    pub fn active_mtu(&self) -> u32 {
        abi::mtu_enum(self.cfg.link_mtu.saturating_sub(20 + 8 + 12 + 16 + 4)).unwrap_or(1)
    }

    /// The configuration space the driver reads ([`abi::ConfigSpace`]).
    pub fn config_space(&self) -> abi::ConfigSpace {
        abi::ConfigSpace {
            signature: abi::SIGNATURE,
            abi_version: abi::ABI_VERSION,
            num_queues: abi::NUM_QUEUES as u16,
            phys_port_cnt: 1,
            active_mtu: self.active_mtu() as u8,
            mac: self.cfg.mac,
            reserved0: [0; 2],
            max_qp: MAX_QP as u32,
            max_cq: MAX_CQ as u32,
            max_mr: MAX_MR as u32,
            max_pd: MAX_PD as u32,
            max_qp_wr: MAX_QP_WR,
            max_cqe: MAX_CQE,
            max_sge: MAX_SGE,
            max_inline: MAX_INLINE,
            reserved1: [0; 8],
        }
    }

    /// Executes one control command at time `now` (ns on the caller's
    /// monotonic clock, as for every entry point: a `CMD_MODIFY_QP` that
    /// starts sending arms the ACK timer from it, address resolution
    /// stamps its requests with it). `req` holds an [`abi::CmdHeader`] and
    /// its body; the response ([`abi::RespHeader`] and body) is written to
    /// `resp`. Returns the number of response bytes written (at least 8 when
    /// `resp` can hold a header; 0 when it cannot). Errors are statuses in the
    /// response (`abi::STATUS_*`), never panics.
    pub fn control(
        &mut self,
        mem: &dyn DmaMemory,
        req: &[u8],
        resp: &mut [u8],
        now: Nanos,
    ) -> usize {
        use abi::Pod;
        let mut body = [0u8; abi::MAX_CMD_BODY];
        let (status, n) = match self.command(mem, req, &mut body, now) {
            Ok(n) => (abi::STATUS_OK, n),
            Err(s) => (s, 0),
        };
        if status != abi::STATUS_OK {
            self.res.out.stats.count(Counter::cmd_errors, 1);
        }
        if resp.len() < 8 {
            return 0;
        }
        let n = n.min(resp.len() - 8);
        let h = abi::RespHeader {
            status,
            len: n as u32,
        };
        resp[..8].copy_from_slice(h.as_bytes());
        resp[8..8 + n].copy_from_slice(&body[..n]);
        8 + n
    }

    /// Handles one doorbell from the doorbell queue. A doorbell naming no
    /// QP, CQ or SRQ of its context ([`abi::Doorbell::ctx`], device spec
    /// §5.x.6.13), of an unknown kind, or whose producer index is
    /// outside its queue's window ([`producer_index_ok`]) is ignored and
    /// counted in [`DeviceStats::doorbells_ignored`] (device spec
    /// §5.x.6.9): the queue keeps its previous producer index, a CQ its
    /// arming. One naming an object of another context is counted in
    /// [`DeviceStats::doorbells_foreign`] as well.
    pub fn doorbell(&mut self, mem: &dyn DmaMemory, db: &abi::Doorbell, now: Nanos) {
        let foreign = match self.doorbell_owner(db) {
            contexts::Owner::Ringer => {
                if self.try_doorbell(mem, db, now) {
                    return;
                }
                false
            }
            contexts::Owner::Other => true,
            contexts::Owner::None => false,
        };
        tracing::debug!(
            kind = db.kind,
            ctx = db.ctx,
            handle = db.handle,
            index = db.index,
            foreign,
            "doorbell ignored"
        );
        self.res.out.stats.count(Counter::doorbells_ignored, 1);
        if foreign {
            self.res.out.stats.count(Counter::doorbells_foreign, 1);
        }
    }

    /// [`Device::doorbell`] for a doorbell whose context owns the object
    /// it names; false when the doorbell was ignored.
    fn try_doorbell(&mut self, mem: &dyn DmaMemory, db: &abi::Doorbell, now: Nanos) -> bool {
        match db.kind {
            abi::DB_SQ | abi::DB_RQ => {
                if !self.queue_doorbell(mem, db.kind, db.handle, db.index, now) {
                    return false;
                }
                self.watch_queue(mem, db.kind, db.handle, db.index);
            }
            abi::DB_SRQ => {
                let Some(srq) = self.res.srqs.get_mut(db.handle) else {
                    return false;
                };
                if !producer_index_ok(db.index, srq.ci, srq.ci, srq.ring.size) {
                    return false;
                }
                srq.pi = db.index;
            }
            abi::DB_CQ_ARM | abi::DB_CQ_ARM_SOLICITED => {
                let Some(cq) = self.res.cqs.get_mut(db.handle) else {
                    return false;
                };
                if cq.pi != db.index {
                    // Completions the driver had not consumed when it
                    // armed were written before this doorbell was
                    // processed: without an event now, a driver that
                    // polled between posting the doorbell and our
                    // processing it would wait forever (doorbells are
                    // asynchronous). Fire at once, as mlx5 does with
                    // its arm's consumer index.
                    cq.armed = None;
                    self.res.out.event(abi::EV_COMP, db.handle, 0);
                } else {
                    cq.armed = Some(db.kind == abi::DB_CQ_ARM_SOLICITED);
                }
            }
            _ => return false,
        }
        true
    }

    /// Destinations the device's link reaches without a wire
    /// ([`crate::link::LinkCaps::local_macs`]): RoCEv2 frames to them are
    /// emitted without the ICRC ([`Icrc::Unneeded`]). `None` (the
    /// default): every frame carries it.
    pub fn set_local_macs(&mut self, local: Option<crate::link::LocalMacs>) {
        self.res.out.local_macs = local;
    }

    /// Handles one frame received from the link. Frames not for this port,
    /// malformed frames and frames with a bad ICRC are dropped and counted.
    pub fn receive(&mut self, mem: &dyn DmaMemory, frame: &[u8], now: Nanos) {
        self.receive_frame(mem, frame, Icrc::Needed, now);
    }

    /// [`Device::receive`] for a frame whose ICRC is checked or not:
    /// [`Icrc::Unneeded`] for a frame another engine of this process built
    /// ([`crate::link::Link::recv_with`]).
    pub fn receive_frame(&mut self, mem: &dyn DmaMemory, frame: &[u8], icrc: Icrc, now: Nanos) {
        self.res.out.stats.count(Counter::rx_frames, 1);
        let pkt = match wire::parse_frame_with(frame, icrc) {
            Ok(Frame::Roce(p)) => batch::Packet::from(p),
            Ok(Frame::Arp(arp)) => {
                // parse_frame accepted an Ethernet header.
                let eth_dst = frame
                    .get(..6)
                    .and_then(|d| <[u8; 6]>::try_from(d).ok())
                    .unwrap_or_default();
                self.on_arp(&arp, eth_dst, now);
                return;
            }
            Ok(Frame::Other) => {
                if !self.on_ndp(frame, now) {
                    self.res.out.stats.count(Counter::rx_dropped, 1);
                }
                return;
            }
            Err(e) => {
                if e == wire::WireError::BadIcrc {
                    self.res.out.stats.count(Counter::icrc_errors, 1);
                }
                self.res.out.stats.count(Counter::rx_dropped, 1);
                return;
            }
        };
        // parse_frame accepted an Ethernet header of 14 bytes.
        let ip = frame.get(14..).unwrap_or_default();
        self.receive_packet(mem, &pkt, Some(ip), now);
        if icrc == Icrc::Unneeded {
            // Its packets may leave their payload in the sender's memory.
            let peer = match &self.res.out.local_macs {
                Some(l) if batch::gso::is_batch(frame) => l.memory_of(&pkt.hdr.eth_src),
                _ => None,
            };
            for seg in batch::gso::rest(frame, &pkt.hdr, peer.as_deref()) {
                match seg {
                    Ok(batch::gso::Segment::Packet(p)) => {
                        self.res.out.stats.count(Counter::rx_frames, 1);
                        self.receive_packet(mem, &p, None, now);
                    }
                    Ok(batch::gso::Segment::Run(r)) => self.receive_run(mem, &r, now),
                    Err(_) => {
                        self.res.out.stats.count(Counter::rx_frames, 1);
                        self.res.out.stats.count(Counter::rx_dropped, 1);
                        break;
                    }
                }
            }
        }
    }

    /// Handles a run of a batch ([`batch::Run`]): when its first packet
    /// is admitted ([`hdr_check::admit`]) as an RC or UC request or
    /// response, the responder (SEND, WRITE: [`responder::on_run`]) or
    /// the completer (READ responses: [`completer::on_run`]) takes it
    /// whole when it can; anything else is handled packet by packet
    /// ([`Device::receive_packet`]), as the packets would have been.
    /// Counted as its packets.
    fn receive_run(&mut self, mem: &dyn DmaMemory, run: &batch::Run<'_>, now: Nanos) {
        let pkt = &run.first;
        let qp = self.qps.get_mut(pkt.hdr.bth.dest_qp);
        let route = hdr_check::admit(&self.res.port, qp.as_deref(), pkt);
        let (Some(qp), Ok(route @ (Route::Request | Route::Response))) = (qp, route) else {
            for p in run.packets() {
                self.res.out.stats.count(Counter::rx_frames, 1);
                self.receive_packet(mem, &p, None, now);
            }
            return;
        };
        self.res
            .out
            .stats
            .count(Counter::rx_frames, u64::from(run.count));
        qp.stats.rx_packets += u64::from(run.count);
        qp_step!(self, qp, mem, now, |env| {
            env.res
                .out
                .stats
                .count(Counter::rx_bytes, pkt.payload_len() as u64);
            if route == Route::Request {
                responder::on_run(qp, &mut env, run);
            } else {
                completer::on_run(qp, &mut env, run);
            }
        });
    }

    /// Handles one RoCEv2 packet: [`hdr_check::admit`] decides whether it
    /// is taken and by whom, the responder, the completer or the datagram
    /// receiver. A packet naming a QP is counted for it (`rx_packets`,
    /// `rx_bytes`, and a header check's drop); else it is counted in
    /// `rx_dropped`. `ip`: its IP header onward, for a UD request (the
    /// GRH of its completion); `None` for a packet of a batch
    /// ([`batch::gso`]), which is never UD: one that is is dropped.
    fn receive_packet(
        &mut self,
        mem: &dyn DmaMemory,
        pkt: &batch::Packet<'_>,
        ip: Option<&[u8]>,
        now: Nanos,
    ) {
        // Neighbours are learnt from ARP / neighbour discovery only, never
        // from RoCE packets: their Ethernet header is not covered by the
        // ICRC, so one corrupted or forged frame would misdirect every
        // later request of the QPs to that peer (replies go to the
        // request's source MAC and need no table).
        let qp = self.qps.get_mut(pkt.hdr.bth.dest_qp);
        let admitted = hdr_check::admit(&self.res.port, qp.as_deref(), pkt);
        let (qp, route) = match (qp, admitted) {
            (Some(qp), Ok(route)) => (qp, Ok(route)),
            (Some(qp), Err(Refusal::Header(why))) => (qp, Err(why)),
            (_, Err(Refusal::NoGsi)) => {
                self.res.out.stats.count(Counter::rx_dropped, 1);
                self.res.out.stats.count(Counter::rx_drop_no_gsi, 1);
                return;
            }
            _ => {
                self.res.out.stats.count(Counter::rx_dropped, 1);
                return;
            }
        };
        qp.stats.rx_packets += 1;
        qp_step!(self, qp, mem, now, |env| {
            env.res
                .out
                .stats
                .count(Counter::rx_bytes, pkt.payload_len() as u64);
            match (route, ip) {
                (Err(why), _) => env.res.out.stats.hdr_drop(why),
                (Ok(Route::Datagram), Some(ip)) => datagram::on_request(qp, &mut env, pkt, ip),
                (Ok(Route::Datagram), None) => env.res.out.stats.count(Counter::rx_dropped, 1),
                (Ok(Route::Request), _) => responder::on_request(qp, &mut env, pkt),
                (Ok(Route::Response), _) => completer::on_response(qp, &mut env, pkt),
            }
        });
    }

    /// Runs timers due at `now` (retransmission, RNR back-off, ARP retries,
    /// neighbour expiry) and resumes the work stopped at a burst limit or
    /// at the link backlog (`transport::TX_BACKLOG_MAX`): READ response
    /// streams and long sends, the QPs taking turns.
    /// Returns when it next needs to be polled, if ever (`now` while such
    /// work remains).
    pub fn poll(&mut self, mem: &dyn DmaMemory, now: Nanos) -> Option<Nanos> {
        let mut next: Option<Nanos> = None;
        let mut unresolved = Vec::new();
        // Round robin under the link backlog: start at the first QP the
        // last poll left without room (TX_BACKLOG_MAX), if any.
        let start = self.poll_from;
        let mut starved = None;
        for (slot, qp) in self.qps.values_mut_from(start) {
            if starved.is_none() && self.res.out.backlog() >= crate::transport::TX_BACKLOG_MAX {
                starved = Some(slot);
            }
            let t = qp_step!(self, qp, mem, now, |env| {
                if qp.qp_type.is_datagram() {
                    if qp.req.waiting_arp.is_some() || qp.req.more {
                        datagram::run(qp, &mut env);
                    }
                    let arp = qp.req.waiting_arp.map(|_| now + 1_000_000);
                    if qp.req.more {
                        Some(now)
                    } else {
                        arp
                    }
                } else {
                    // The READ response stream, resumed a burst at a time.
                    let more = responder::run(qp, &mut env).then_some(now);
                    let t = completer::on_timer(qp, &mut env);
                    [more, t].into_iter().flatten().min()
                }
            });
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            if let Some(dgid) = qp.req.waiting_arp {
                unresolved.push(dgid);
                unresolved.extend_from_slice(&qp.req.resolve_ahead);
            }
        }
        self.poll_from = starved.unwrap_or(start);
        for dgid in unresolved {
            self.resolve(dgid, now);
        }
        if let Some(t) = self.age_neighbours(now) {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        next
    }

    /// The MAC address of neighbour `ip`, if resolved (for tests and
    /// diagnostics; does not count as a use).
    pub fn neighbour(&self, ip: IpAddr) -> Option<[u8; 6]> {
        self.res.neigh.peek(&ip)
    }

    /// Number of resolved neighbours (at most [`NEIGH_MAX`]).
    pub fn neighbour_count(&self) -> usize {
        self.res.neigh.len()
    }

    /// Number of neighbour resolutions in progress (at most
    /// [`NEIGH_PENDING_MAX`]).
    pub fn neighbour_pending(&self) -> usize {
        self.res.neigh.pending_len()
    }

    /// Packets waiting for the link in the transmit queue ([`Device::pop_tx`]),
    /// a batch for another function counted by its packets: at most
    /// `transport::TX_REPLY_MAX` (plus the neighbour resolutions the
    /// device starts itself), whatever peers send while nothing is popped.
    pub fn tx_backlog(&self) -> usize {
        self.res.out.backlog()
    }

    /// Next frame to hand to the link. Give the buffer back with
    /// [`Device::recycle_tx`] once the link has taken the frame, so the
    /// next frames need no allocation.
    pub fn pop_tx(&mut self) -> Option<Vec<u8>> {
        self.res.out.pop_frame()
    }

    /// The sequence number of the frame the next [`Device::pop_tx`]
    /// returns (frames counted from 0 since the device was made or reset).
    pub fn tx_popped(&self) -> u64 {
        self.res.out.frames_popped()
    }

    /// The owner still holds frames it popped, from sequence number `seq`
    /// ([`Device::tx_popped`] before their pop) on, for a full link; `None`
    /// when it holds none. Until they go, the ACK timers of the QPs that
    /// sent them wait for them instead of blaming the peer: the local ACK
    /// timeout measures the peer's silence, not the device's queue
    /// (issue 28).
    pub fn set_tx_held_from(&mut self, seq: Option<u64>) {
        self.res.out.set_held_from(seq);
    }

    /// Returns a buffer [`Device::pop_tx`] gave out, for reuse by a later
    /// frame (bounded pool: `transport::TX_POOL_MAX` buffers).
    pub fn recycle_tx(&mut self, frame: Vec<u8>) {
        self.res.out.recycle(frame);
    }

    /// Next asynchronous event for the event queue, its
    /// [`abi::Event::ctx`] naming the context owning the object it is
    /// about. Events about objects destroyed since are dropped.
    pub fn pop_event(&mut self) -> Option<abi::Event> {
        while let Some(mut ev) = self.res.out.events.pop_front() {
            if let Some(ctx) = self.event_ctx(&ev) {
                ev.ctx = ctx;
                return Some(ev);
            }
        }
        None
    }

    /// A `DB_SQ` or `DB_RQ` (`kind`) with producer index `index` for QP
    /// `qpn`, its context already checked (or the QP's own record's,
    /// [`Device::poll_records`]): the new index recorded and the QP's
    /// work run. False (ignored) for an index outside the queue's window
    /// ([`producer_index_ok`]); an index at most a ring behind the one
    /// the device has, on a queue with a doorbell record
    /// ([`abi::QP_F_SQ_RECORD`], [`abi::QP_F_RQ_RECORD`]: the record
    /// overtook the doorbell), is accepted and changes nothing.
    fn queue_doorbell(
        &mut self,
        mem: &dyn DmaMemory,
        kind: u16,
        qpn: u32,
        index: u32,
        now: Nanos,
    ) -> bool {
        let Some(qp) = self.qps.get_mut(qpn) else {
            return false;
        };
        let sq = kind == abi::DB_SQ;
        // At most a ring behind the index the device has: a doorbell its
        // record overtook (the WQEs may have completed since).
        let overtaken = if sq {
            qp.sq_record && qp.req.sq_pi.wrapping_sub(index) <= qp.sq.size
        } else {
            qp.rq_record && qp.resp.rq_pi.wrapping_sub(index) <= qp.rq.size
        };
        if overtaken {
            return true;
        }
        let ok = if sq {
            // The requester has fetched up to sq_next: a producer
            // index behind it would make it fetch (or flush) from
            // sq_next round 2^32 to reach it.
            producer_index_ok(index, qp.req.sq_next, qp.req.sq_ci, qp.sq.size)
        } else {
            producer_index_ok(index, qp.resp.rq_ci, qp.resp.rq_ci, qp.rq.size)
        };
        if !ok {
            tracing::debug!(
                kind,
                qpn,
                index,
                sq_pi = qp.req.sq_pi,
                sq_next = qp.req.sq_next,
                sq_ci = qp.req.sq_ci,
                sq_size = qp.sq.size,
                rq_pi = qp.resp.rq_pi,
                rq_ci = qp.resp.rq_ci,
                rq_size = qp.rq.size,
                "producer index outside the queue's window"
            );
            return false;
        }
        if sq {
            qp.req.sq_pi = index;
        } else {
            qp.resp.rq_pi = index;
        }
        qp_step!(self, qp, mem, now, |env| {
            if qp.state == abi::QpState::Err {
                crate::transport::flush(qp, &mut env);
            } else if sq && qp.state == abi::QpState::Sqe {
                // SQE flushes new send WQEs too (IBTA §10.3.1.6).
                requester::flush(qp, &mut env);
                crate::transport::write_record(qp, &env);
            } else if sq {
                crate::transport::send(qp, &mut env);
            }
        });
        if let Some(dgid) = qp.req.waiting_arp {
            let ahead = std::mem::take(&mut qp.req.resolve_ahead);
            self.resolve(dgid, now);
            for d in &ahead {
                self.resolve(*d, now);
            }
        }
        true
    }

    /// Device reset (virtio 1.2 §2.4): destroys every object. Handle
    /// allocation and the MR key source carry on where they were, so keys
    /// and QP numbers held from before the reset, by the guest or by
    /// peers, name nothing for a long time.
    pub fn reset(&mut self) {
        let fresh = Self::new(self.cfg.clone());
        let old = std::mem::replace(self, fresh);
        self.res.out.continue_after(&old.res.out);
        self.res.out.stats = old.res.out.stats;
        // The link stays: so does what it reaches without a wire.
        self.res.out.local_macs = old.res.out.local_macs;
        self.res.pds.continue_after(&old.res.pds);
        self.ctxs.continue_after(&old.ctxs);
        self.res.mrs.continue_after(&old.res.mrs);
        self.res.cqs.continue_after(&old.res.cqs);
        self.qps.continue_after(&old.qps);
        self.res.ahs.continue_after(&old.res.ahs);
        self.res.srqs.continue_after(&old.res.srqs);
    }

    /// Counters.
    pub fn stats(&self) -> &DeviceStats {
        self.res.out.stats.stats()
    }

    /// Per-QP counters of every QP, by QP number (ascending). A QP's
    /// counters go with it when it is destroyed, and all of them at a
    /// [`Device::reset`]; [`Device::stats`] keeps the device-wide totals.
    pub fn qp_stats(&self) -> Vec<(u32, QpStats)> {
        let mut v = Vec::with_capacity(self.qps.len());
        self.qp_stats_into(&mut v);
        v
    }

    /// [`Device::qp_stats`] into `out` (replacing its contents), reusing
    /// its allocation.
    pub fn qp_stats_into(&self, out: &mut Vec<(u32, QpStats)>) {
        out.clear();
        out.extend(self.qps.values().map(|q| (q.qpn, q.stats)));
        out.sort_unstable_by_key(|(n, _)| *n);
    }
}

/// The link's transmit flusher takes the device's frames in order
/// ([`crate::link::txq::TxFlush`]).
impl crate::link::txq::FrameSource for Device {
    fn next_frame(&mut self) -> Option<Vec<u8>> {
        self.pop_tx()
    }

    fn recycle(&mut self, frame: Vec<u8>) {
        self.recycle_tx(frame);
    }

    fn next_seq(&self) -> u64 {
        self.tx_popped()
    }

    fn set_held_from(&mut self, seq: Option<u64>) {
        self.set_tx_held_from(seq);
    }
}

#[cfg(test)]
mod tests {
    use super::producer_index_ok;

    #[test]
    fn producer_index_window_wraps_with_the_indices() {
        // ci 10, fetched up to 14, ring of 8: 14..=18 are good.
        assert!(producer_index_ok(14, 14, 10, 8));
        assert!(producer_index_ok(18, 14, 10, 8));
        assert!(!producer_index_ok(13, 14, 10, 8), "behind the fetch index");
        assert!(!producer_index_ok(19, 14, 10, 8), "past the ring");
        assert!(
            !producer_index_ok(9, 10, 10, 8),
            "behind the consumer index"
        );
        // Across 2^32.
        let ci = u32::MAX - 2;
        assert!(producer_index_ok(4, ci.wrapping_add(1), ci, 8));
        assert!(!producer_index_ok(6, ci, ci, 8));
        assert!(!producer_index_ok(ci - 1, ci, ci, 8));
    }
}
