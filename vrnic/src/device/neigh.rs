//! The port's neighbour handling: answers ARP requests (RFC 826) and IPv6
//! neighbour solicitations (RFC 4861 §7) for the port's addresses, learns
//! neighbours from them and from the answers to its own requests, and
//! resolves a QP's or AH's destination GID to a MAC before its first packet.
//!
//! Everything here comes from the wire or from a guest, so the tables are
//! bounded and expire (issue 9, item 5):
//!
//! - at most [`NEIGH_MAX`] resolved neighbours; a new one evicts the least
//!   recently confirmed entry, preferring one no QP used since;
//! - at most [`NEIGH_PENDING_MAX`] resolutions in progress (a guest can
//!   name any number of destinations); more wait for a slot. Nothing is
//!   queued behind a resolution: a QP or UD send waits in the transport
//!   (`waiting_arp`) and the device polls it every millisecond, as before;
//! - a resolution sends at most [`NEIGH_MAX_PROBES`] requests,
//!   [`NEIGH_RETRANS_NS`] apart, then rests for [`NEIGH_FAILED_NS`] before
//!   a waiting sender may start another; an unresolved destination leaves
//!   its QP waiting, as before;
//! - an entry is reachable for [`NEIGH_REACHABLE_NS`] after it was last
//!   confirmed (Linux's `base_reachable_time`). Then, if a QP used it since,
//!   it stays in use while it is re-probed (up to [`NEIGH_MAX_PROBES`]
//!   requests, Linux's PROBE state) and is dropped if none is answered;
//!   an unused one is dropped at once.
//!
//! Learning follows RFC 826 and RFC 4861 §7.2: only from frames addressed
//! to the port (its MAC, broadcast, or for NDP the multicast groups it
//! listens to), never a sender with a multicast MAC or an address of the
//! port; ARP updates an existing entry from any ARP of that sender and
//! creates one only from a request for one of the port's addresses or the
//! reply to its own request; an NS creates or updates one only when its
//! target is the port's and its source is specified; an NA only updates
//! an entry or answers a resolution in progress. Time is the `now` of the
//! device entry point that handles the frame or poll.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};

use etherparse::{
    icmpv6::NeighborAdvertisementHeader, Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket,
    TransportSlice,
};

use super::{Counter, Device, Nanos};
use crate::wire::{self, ArpPacket, Gid};

/// Most resolved neighbours the port keeps.
pub const NEIGH_MAX: usize = 256;
/// Most neighbour resolutions in progress at once.
pub const NEIGH_PENDING_MAX: usize = 64;
/// How long an entry is used without re-confirmation, ns (Linux's
/// `base_reachable_time`, 30 s).
pub const NEIGH_REACHABLE_NS: Nanos = 30_000_000_000;
/// Interval between requests of one resolution or re-probe, ns.
pub const NEIGH_RETRANS_NS: Nanos = 200_000_000;
/// Requests one resolution or re-probe sends before it fails (Linux's
/// `mcast_solicit` / `ucast_solicit`, 3).
pub const NEIGH_MAX_PROBES: u8 = 3;
/// After a failed resolution, how long before a waiting sender may start
/// another, ns.
pub const NEIGH_FAILED_NS: Nanos = 1_000_000_000;

/// One resolved neighbour.
#[derive(Debug)]
struct Entry {
    mac: [u8; 6],
    /// When an answer or an ARP/NS from it last confirmed it.
    confirmed: Nanos,
    /// A packet was addressed with it since `confirmed` (set by lookups,
    /// which only borrow the table).
    used: Cell<bool>,
    /// Re-probe in progress: requests sent, the last one when.
    probes: u8,
    probe_sent: Nanos,
}

/// A resolution in progress: requests sent, the last one when.
#[derive(Debug, Clone, Copy)]
struct Pending {
    tries: u8,
    last: Nanos,
}

/// The port's neighbour table (IP → MAC), bounded and expiring; see the
/// module documentation for the rules.
#[derive(Debug, Default)]
pub struct NeighTable {
    entries: HashMap<IpAddr, Entry>,
    pending: HashMap<IpAddr, Pending>,
    /// No entry needs aging before this time (`None`: none needs it), so
    /// that a poll does not walk the tables for nothing.
    due: Option<Nanos>,
    /// The port's own addresses (its GIDs) and MAC: resolved without ARP
    /// or neighbour discovery, never aged, not counted in `len`. A QP
    /// addressing its own port sends to its own MAC, which a switch in
    /// front of the port (the daemon's, issue 10) loops back; the port
    /// never learns its own address from the wire (module documentation).
    own: Vec<(IpAddr, [u8; 6])>,
    /// Changes at every change of `entries` that a lookup's result or its
    /// marking depends on ([`NeighTable::generation`]).
    generation: u64,
}

impl NeighTable {
    /// An empty table that resolves each of `addrs` (the port's own) to
    /// `mac`.
    pub fn with_own(mac: [u8; 6], addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        Self {
            own: addrs.into_iter().map(|a| (a, mac)).collect(),
            ..Self::default()
        }
    }

    /// Whether `ip` resolves (one of the port's own addresses, or a
    /// resolved neighbour).
    fn resolved(&self, ip: &IpAddr) -> bool {
        self.own.iter().any(|(a, _)| a == ip) || self.entries.contains_key(ip)
    }

    /// The MAC of `ip` if it is resolved; marks the entry used (so that it
    /// is re-probed rather than dropped when its reachable time ends).
    /// The port's own addresses resolve to its own MAC.
    pub fn get(&self, ip: &IpAddr) -> Option<&[u8; 6]> {
        if let Some((_, mac)) = self.own.iter().find(|(a, _)| a == ip) {
            return Some(mac);
        }
        let e = self.entries.get(ip)?;
        e.used.set(true);
        Some(&e.mac)
    }

    /// A number that changes whenever an entry is added, changed,
    /// confirmed again (its `used` mark reset) or dropped: a lookup's
    /// result kept with it is still the table's answer, its entry still
    /// marked used, while it has not changed (headers kept per QP,
    /// [`crate::transport::peer_headers`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The MAC of `ip` if it is resolved, without marking it used.
    pub fn peek(&self, ip: &IpAddr) -> Option<[u8; 6]> {
        self.entries.get(ip).map(|e| e.mac)
    }

    /// Number of resolved neighbours.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no neighbour is resolved.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of resolutions in progress.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Confirms `ip` at `mac`: updates an existing entry; creates one when
    /// `create` (evicting one at [`NEIGH_MAX`]). Ends a resolution of `ip`.
    fn confirm(&mut self, ip: IpAddr, mac: [u8; 6], create: bool, now: Nanos) {
        self.pending.remove(&ip);
        self.wake_at(now.saturating_add(NEIGH_REACHABLE_NS));
        self.generation = self.generation.wrapping_add(1);
        if let Some(e) = self.entries.get_mut(&ip) {
            *e = Entry::new(mac, now);
            return;
        }
        if !create {
            return;
        }
        if self.entries.len() >= NEIGH_MAX {
            // Least recently confirmed, unused ones first.
            let victim = self
                .entries
                .iter()
                .min_by_key(|(_, e)| (e.used.get(), e.confirmed))
                .map(|(ip, _)| *ip);
            if let Some(v) = victim {
                self.entries.remove(&v);
            }
        }
        self.entries.insert(ip, Entry::new(mac, now));
    }

    /// Makes the next [`NeighTable::age`] run no later than `t`.
    fn wake_at(&mut self, t: Nanos) {
        self.due = Some(self.due.map_or(t, |d| d.min(t)));
    }

    /// Starts or continues the resolution of `ip`: true when a request
    /// should be sent now.
    fn want_request(&mut self, ip: IpAddr, now: Nanos) -> bool {
        self.wake_at(now.saturating_add(NEIGH_FAILED_NS));
        if let Some(p) = self.pending.get_mut(&ip) {
            if p.tries >= NEIGH_MAX_PROBES {
                if now < p.last.saturating_add(NEIGH_FAILED_NS) {
                    return false;
                }
                p.tries = 0;
            } else if now < p.last.saturating_add(NEIGH_RETRANS_NS) {
                return false;
            }
            p.tries += 1;
            p.last = now;
            return true;
        }
        if self.pending.len() >= NEIGH_PENDING_MAX {
            // Full: this one waits for a slot (a resolution ending or
            // resting past NEIGH_FAILED_NS). Evicting instead would let
            // many destinations restart each other's retries forever.
            return false;
        }
        self.pending.insert(
            ip,
            Pending {
                tries: 1,
                last: now,
            },
        );
        true
    }

    /// Ages the table at `now`: drops unused entries past their reachable
    /// time and probed ones whose probes went unanswered, forgets failed
    /// resolutions nobody retried. Returns the addresses to (re-)probe now
    /// and the next time the table needs aging.
    fn age(&mut self, now: Nanos) -> (Vec<IpAddr>, Option<Nanos>) {
        match self.due {
            Some(d) if now < d => return (Vec::new(), Some(d)),
            None => return (Vec::new(), None),
            _ => {}
        }
        let mut probe = Vec::new();
        let mut next: Option<Nanos> = None;
        let mut at = |t: Nanos| next = Some(next.map_or(t, |n: Nanos| n.min(t)));
        let before = self.entries.len();
        self.entries.retain(|ip, e| {
            let stale_at = e.confirmed.saturating_add(NEIGH_REACHABLE_NS);
            if now < stale_at {
                at(stale_at);
                return true;
            }
            if e.probes == 0 && !e.used.get() {
                return false;
            }
            let due = e.probe_sent.saturating_add(NEIGH_RETRANS_NS);
            if e.probes > 0 && now < due {
                at(due);
                return true;
            }
            if e.probes >= NEIGH_MAX_PROBES {
                return false;
            }
            e.probes += 1;
            e.probe_sent = now;
            probe.push(*ip);
            at(now.saturating_add(NEIGH_RETRANS_NS));
            true
        });
        if self.entries.len() != before {
            self.generation = self.generation.wrapping_add(1);
        }
        self.pending.retain(|_, p| {
            let end = p.last.saturating_add(NEIGH_FAILED_NS);
            if now >= end {
                return false;
            }
            at(end);
            true
        });
        self.due = next;
        (probe, next)
    }
}

impl Entry {
    fn new(mac: [u8; 6], now: Nanos) -> Entry {
        Entry {
            mac,
            confirmed: now,
            used: Cell::new(false),
            probes: 0,
            probe_sent: 0,
        }
    }
}

/// NDP option type of a source link-layer address (RFC 4861 §4.6.1).
const NDP_OPT_SOURCE_LLADDR: u8 = 1;
/// NDP option type of a target link-layer address (RFC 4861 §4.6.1).
const NDP_OPT_TARGET_LLADDR: u8 = 2;
/// Most options of one NDP message looked at: bounds the walk.
const NDP_OPTS_MAX: usize = 16;

/// The two neighbour discovery messages the port handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NdpKind {
    /// Neighbour solicitation (RFC 4861 §4.3).
    Solicitation,
    /// Neighbour advertisement (RFC 4861 §4.4).
    Advertisement,
}

/// A neighbour solicitation or advertisement that passed the checks of
/// RFC 4861 §7.1.1 and §7.1.2 the port makes (hop limit 255, valid
/// ICMPv6 checksum, a target address).
struct NdpMessage<'a> {
    kind: NdpKind,
    /// The Ethernet source.
    eth_src: [u8; 6],
    /// To the port: its MAC, or an IPv6 multicast MAC (RFC 2464 §7: the
    /// solicited-node and all-nodes groups it listens to).
    for_port: bool,
    /// The IPv6 source.
    src: Ipv6Addr,
    /// The target address.
    target: Ipv6Addr,
    /// The ICMPv6 message after its 8-byte header: the target address,
    /// then the options.
    body: &'a [u8],
}

impl<'a> NdpMessage<'a> {
    /// Parses `frame` (Ethernet onward) for a port of MAC `port_mac`;
    /// `None` for anything but a valid solicitation or advertisement.
    fn parse(frame: &'a [u8], port_mac: [u8; 6]) -> Option<NdpMessage<'a>> {
        let p = SlicedPacket::from_ethernet(frame).ok()?;
        let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(icmp))) = (&p.net, &p.transport)
        else {
            return None;
        };
        let etherparse::LinkHeader::Ethernet2(eth) = p.link.as_ref()?.to_header()? else {
            return None;
        };
        let h = ip.header();
        let (src, dst) = (h.source_addr(), h.destination_addr());
        if h.hop_limit() != 255 || !icmp.is_checksum_valid(src.octets(), dst.octets()) {
            return None;
        }
        let body = icmp.payload();
        let target = Ipv6Addr::from(<[u8; 16]>::try_from(body.get(..16)?).ok()?);
        let kind = match icmp.icmp_type() {
            Icmpv6Type::NeighborSolicitation => NdpKind::Solicitation,
            Icmpv6Type::NeighborAdvertisement(_) => NdpKind::Advertisement,
            _ => return None,
        };
        Some(NdpMessage {
            kind,
            eth_src: eth.source,
            for_port: eth.destination == port_mac || eth.destination[..2] == [0x33, 0x33],
            src,
            target,
            body,
        })
    }

    /// The unicast MAC of the first link-layer address option of type
    /// `kind` (RFC 4861 §4.6: type, length in 8-byte units, data), among
    /// the first [`NDP_OPTS_MAX`]; `None` at a malformed option.
    fn option_mac(&self, kind: u8) -> Option<[u8; 6]> {
        let mut opts = self.body.get(16..)?;
        for _ in 0..NDP_OPTS_MAX {
            let (&t, &len) = (opts.first()?, opts.get(1)?);
            let n = len as usize * 8;
            if n == 0 {
                return None;
            }
            if t == kind && n >= 8 {
                let mac: [u8; 6] = opts.get(2..8)?.try_into().ok()?;
                return Some(mac).filter(|m| unicast_mac(*m));
            }
            opts = opts.get(n..)?;
        }
        None
    }
}

/// A MAC a neighbour may have: unicast (I/G bit clear) and not zero.
fn unicast_mac(mac: [u8; 6]) -> bool {
    mac[0] & 1 == 0 && mac != [0; 6]
}

impl Device {
    /// Handles an ARP packet that came in an Ethernet frame to `eth_dst`
    /// (RFC 826; learning as the module documentation says). A request
    /// for the port's IPv4 address is answered.
    pub(super) fn on_arp(&mut self, arp: &ArpPacket, eth_dst: [u8; 6], now: Nanos) {
        if eth_dst != self.res.port.mac && eth_dst != [0xff; 6] {
            self.res.out.stats.count(Counter::rx_dropped, 1);
            return;
        }
        let for_us = arp.target_ip == self.res.port.ipv4;
        let sender = IpAddr::V4(arp.sender_ip);
        let s = arp.sender_ip;
        let plausible = !(s.is_unspecified()
            || s.is_broadcast()
            || s.is_multicast()
            || s.is_loopback()
            || self.res.port.owns(sender))
            && unicast_mac(arp.sender_mac);
        if plausible {
            // RFC 826: update the sender if known; add it only when we are
            // the target of its request, or of its reply to our request.
            let create = for_us
                && (arp.op == ArpPacket::REQUEST
                    || arp.op == ArpPacket::REPLY && self.res.neigh.pending.contains_key(&sender));
            self.res.neigh.confirm(sender, arp.sender_mac, create, now);
        }
        if arp.op == ArpPacket::REQUEST && for_us && unicast_mac(arp.sender_mac) {
            let reply = ArpPacket {
                op: ArpPacket::REPLY,
                sender_mac: self.res.port.mac,
                sender_ip: self.res.port.ipv4,
                target_mac: arp.sender_mac,
                target_ip: arp.sender_ip,
            };
            let mut frame = Vec::with_capacity(64);
            wire::emit_arp(self.res.port.mac, arp.sender_mac, &reply, &mut frame);
            // Within the reply bound (transport::TX_REPLY_MAX).
            if self.res.out.push_reply_frame(frame) {
                self.res.out.stats.count(Counter::tx_frames, 1);
            }
        }
    }

    /// Handles an IPv6 neighbour solicitation or advertisement (RFC 4861
    /// §7.1 validity: hop limit 255, valid checksum). Returns false for any
    /// other frame. Only frames to the port's MAC or an IPv6 multicast MAC
    /// (33:33:...) count. A solicitation for one of the port's addresses is
    /// answered (solicited, override) and its specified source learnt; an
    /// advertisement updates an entry or answers our own solicitation.
    pub(super) fn on_ndp(&mut self, frame: &[u8], now: Nanos) -> bool {
        let Some(msg) = NdpMessage::parse(frame, self.res.port.mac) else {
            return false;
        };
        match msg.kind {
            NdpKind::Solicitation => self.on_neighbour_solicitation(&msg, now),
            NdpKind::Advertisement => self.on_neighbour_advertisement(&msg, now),
        }
        true
    }

    /// A valid neighbour solicitation (RFC 4861 §7.2.3): for one of the
    /// port's addresses and to the port, its specified source is learnt
    /// from its source link-layer address option, and it is answered
    /// with an advertisement (solicited unless the source is
    /// unspecified, then to all nodes; override).
    fn on_neighbour_solicitation(&mut self, msg: &NdpMessage<'_>, now: Nanos) {
        let (src, target) = (msg.src, msg.target);
        if !self.res.port.owns(IpAddr::V6(target)) || !msg.for_port {
            return;
        }
        if !src.is_unspecified() && !self.res.port.owns(IpAddr::V6(src)) {
            if let Some(mac) = msg.option_mac(NDP_OPT_SOURCE_LLADDR) {
                self.res.neigh.confirm(IpAddr::V6(src), mac, true, now);
            }
        }
        let (reply_to, reply_mac) = if src.is_unspecified() {
            (
                Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                [0x33, 0x33, 0, 0, 0, 1],
            )
        } else {
            (src, msg.eth_src)
        };
        let na = NeighborAdvertisementHeader {
            router: false,
            solicited: !src.is_unspecified(),
            r#override: true,
        };
        let mut payload = target.octets().to_vec();
        payload.extend_from_slice(&[NDP_OPT_TARGET_LLADDR, 1]);
        payload.extend_from_slice(&self.res.port.mac);
        self.emit_icmpv6(
            target,
            reply_to,
            reply_mac,
            Icmpv6Type::NeighborAdvertisement(na),
            &payload,
            true,
        );
    }

    /// A valid neighbour advertisement to the port (RFC 4861 §7.2.5):
    /// its target link-layer address option updates an entry, or answers
    /// the resolution we started; it creates no other entry.
    fn on_neighbour_advertisement(&mut self, msg: &NdpMessage<'_>, now: Nanos) {
        if !msg.for_port {
            return;
        }
        let ip = IpAddr::V6(msg.target);
        if let Some(mac) = msg.option_mac(NDP_OPT_TARGET_LLADDR) {
            let create = self.res.neigh.pending.contains_key(&ip);
            self.res.neigh.confirm(ip, mac, create, now);
        }
    }

    /// Queues an ICMPv6 message `kind` with `payload` from `src` to `dst`
    /// (at `eth_dst`); a `reply` to a peer's solicitation within the
    /// reply bound (`Output::push_reply_frame`).
    fn emit_icmpv6(
        &mut self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        eth_dst: [u8; 6],
        kind: Icmpv6Type,
        payload: &[u8],
        reply: bool,
    ) {
        let b = PacketBuilder::ethernet2(self.res.port.mac, eth_dst)
            .ipv6(src.octets(), dst.octets(), 255)
            .icmpv6(kind);
        let mut frame = Vec::with_capacity(b.size(payload.len()));
        if b.write(&mut frame, payload).is_err() {
            return;
        }
        let queued = if reply {
            self.res.out.push_reply_frame(frame)
        } else {
            self.res.out.push_frame(frame);
            true
        };
        if queued {
            self.res.out.stats.count(Counter::tx_frames, 1);
        }
    }

    /// Sends a neighbour solicitation for `dst` to its solicited-node
    /// multicast address (RFC 4861 §7.2.2), from the port's link-local
    /// address (or the GID of the same scope when `dst` is global).
    fn solicit(&mut self, dst: Ipv6Addr) {
        let link_local = Ipv6Addr::from(Gid::link_local_from_mac(self.res.port.mac).0);
        let src = if dst.is_unicast_link_local() {
            link_local
        } else {
            self.res.port.ipv6.first().copied().unwrap_or(link_local)
        };
        let o = dst.octets();
        let group = Ipv6Addr::new(
            0xff02,
            0,
            0,
            0,
            0,
            1,
            0xff00 | o[13] as u16,
            u16::from_be_bytes([o[14], o[15]]),
        );
        let mac = [0x33, 0x33, 0xff, o[13], o[14], o[15]];
        let mut payload = dst.octets().to_vec();
        payload.extend_from_slice(&[1, 1]);
        payload.extend_from_slice(&self.res.port.mac);
        let kind = Icmpv6Type::NeighborSolicitation;
        self.emit_icmpv6(src, group, mac, kind, &payload, false);
    }

    /// Sends one ARP request (broadcast, or to `eth_dst` when re-probing a
    /// known neighbour) or neighbour solicitation for `dst`.
    fn request(&mut self, dst: IpAddr, eth_dst: [u8; 6]) {
        let IpAddr::V4(ip) = dst else {
            if let IpAddr::V6(v6) = dst {
                self.solicit(v6);
            }
            return;
        };
        let req = ArpPacket {
            op: ArpPacket::REQUEST,
            sender_mac: self.res.port.mac,
            sender_ip: self.res.port.ipv4,
            target_mac: [0; 6],
            target_ip: ip,
        };
        let mut frame = Vec::with_capacity(64);
        wire::emit_arp(self.res.port.mac, eth_dst, &req, &mut frame);
        self.res.out.stats.count(Counter::tx_frames, 1);
        self.res.out.push_frame(frame);
    }

    /// Resolves the IP of `dgid`: sends an ARP request or neighbour
    /// solicitation unless it is known or its resolution is waiting
    /// (retransmit interval, or resting after a failure).
    pub(super) fn resolve(&mut self, dgid: [u8; 16], now: Nanos) {
        let dst = Gid(dgid).to_ip();
        if self.res.neigh.resolved(&dst) || !self.res.neigh.want_request(dst, now) {
            return;
        }
        self.request(dst, [0xff; 6]);
    }

    /// Ages the neighbour table at `now` ([`NeighTable`]): re-probes the
    /// stale entries in use, drops the others. Returns when it next needs
    /// to run.
    pub(super) fn age_neighbours(&mut self, now: Nanos) -> Option<Nanos> {
        let (probe, next) = self.res.neigh.age(now);
        for ip in probe {
            let mac = self.res.neigh.entries.get(&ip).map_or([0xff; 6], |e| e.mac);
            self.request(ip, mac);
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn own_addresses_resolve_to_the_port_mac_without_being_learnt() {
        let mac = [2, 0x76, 10, 0, 0, 1];
        let me = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let t = NeighTable::with_own(mac, [me]);
        assert_eq!(t.get(&me), Some(&mac));
        assert!(t.resolved(&me));
        assert_eq!(t.get(&other), None);
        assert!(!t.resolved(&other));
        // Not a neighbour: not listed, counted or aged.
        assert_eq!((t.peek(&me), t.len()), (None, 0));
    }
}
