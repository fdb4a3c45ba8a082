//! The port's neighbour handling: answers ARP requests (RFC 826) and IPv6
//! neighbour solicitations (RFC 4861 §7) for the port's addresses, learns
//! neighbours from them and from the answers to its own requests, and
//! resolves a QP's or AH's destination GID to a MAC before its first packet.
//!
//! The table it fills and the transport reads is
//! [`crate::transport::neigh_table`] (bounded and expiring: the rules are
//! there).
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

use std::net::{IpAddr, Ipv6Addr};

use etherparse::{
    icmpv6::NeighborAdvertisementHeader, Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket,
    TransportSlice,
};

use super::{Counter, Device, Nanos};
pub use crate::transport::neigh_table::{
    NeighTable, NEIGH_FAILED_NS, NEIGH_MAX, NEIGH_MAX_PROBES, NEIGH_PENDING_MAX,
    NEIGH_REACHABLE_NS, NEIGH_RETRANS_NS,
};
use crate::wire::{self, ArpPacket, Gid};

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
                    || arp.op == ArpPacket::REPLY && self.res.neigh.is_pending(&sender));
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
            let create = self.res.neigh.is_pending(&ip);
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
            let mac = self.res.neigh.peek(&ip).unwrap_or([0xff; 6]);
            self.request(ip, mac);
        }
        next
    }
}
