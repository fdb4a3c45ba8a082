//! The port's neighbour handling: answers ARP requests (RFC 826) and IPv6
//! neighbour solicitations (RFC 4861 §7) for the port's addresses, learns
//! neighbours from the answers, and resolves a QP's or AH's destination GID
//! to a MAC before its first packet.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{
    icmpv6::NeighborAdvertisementHeader, Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket,
    TransportSlice,
};

use super::{Device, Nanos};
use crate::wire::{self, ArpPacket, Gid};

/// How long to wait before repeating an unanswered ARP request, ns.
const ARP_RETRY_NS: Nanos = 200_000_000;

impl Device {
    pub(super) fn on_arp(&mut self, arp: &ArpPacket) {
        let for_us = arp.target_ip == self.port.ipv4;
        let sender = IpAddr::V4(arp.sender_ip);
        if arp.sender_ip != Ipv4Addr::UNSPECIFIED && (for_us || self.neigh.contains_key(&sender)) {
            self.neigh.insert(sender, arp.sender_mac);
            self.arp_sent.remove(&sender);
        }
        if arp.op == 1 && for_us {
            let reply = ArpPacket {
                op: 2,
                sender_mac: self.port.mac,
                sender_ip: self.port.ipv4,
                target_mac: arp.sender_mac,
                target_ip: arp.sender_ip,
            };
            let mut frame = Vec::with_capacity(64);
            wire::emit_arp(self.port.mac, arp.sender_mac, &reply, &mut frame);
            self.out.stats.tx_frames += 1;
            self.out.tx.push_back(frame);
        }
    }

    /// Handles an IPv6 neighbour solicitation or advertisement (RFC 4861
    /// §7.1 validity: hop limit 255, valid checksum). Returns false for any
    /// other frame. A solicitation for one of the port's addresses is
    /// answered (solicited, override) and its sender learnt; an
    /// advertisement is learnt when we asked for it.
    pub(super) fn on_ndp(&mut self, frame: &[u8]) -> bool {
        let Ok(p) = SlicedPacket::from_ethernet(frame) else {
            return false;
        };
        let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(icmp))) = (&p.net, &p.transport)
        else {
            return false;
        };
        let h = ip.header();
        let (src, dst) = (h.source_addr(), h.destination_addr());
        if h.hop_limit() != 255 || !icmp.is_checksum_valid(src.octets(), dst.octets()) {
            return false;
        }
        let body = icmp.payload();
        let Some(target) = body.get(..16).and_then(|t| <[u8; 16]>::try_from(t).ok()) else {
            return false;
        };
        let target = Ipv6Addr::from(target);
        let option_mac = |kind: u8| -> Option<[u8; 6]> {
            // Options (RFC 4861 §4.6): type, length in 8-byte units, data.
            let mut opts = body.get(16..)?;
            for _ in 0..16 {
                let (&t, &len) = (opts.first()?, opts.get(1)?);
                let n = len as usize * 8;
                if n == 0 {
                    return None;
                }
                if t == kind && n >= 8 {
                    return opts.get(2..8)?.try_into().ok();
                }
                opts = opts.get(n..)?;
            }
            None
        };
        match icmp.icmp_type() {
            Icmpv6Type::NeighborSolicitation => {
                if !self.port.owns(IpAddr::V6(target)) {
                    return true;
                }
                let Some(eth) = &p.link else { return true };
                let Some(eth) = eth.to_header() else {
                    return true;
                };
                let eth = match eth {
                    etherparse::LinkHeader::Ethernet2(e) => e,
                    _ => return true,
                };
                if !src.is_unspecified() {
                    if let Some(mac) = option_mac(1) {
                        self.neigh.insert(IpAddr::V6(src), mac);
                    }
                }
                let (reply_to, reply_mac) = if src.is_unspecified() {
                    (
                        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                        [0x33, 0x33, 0, 0, 0, 1],
                    )
                } else {
                    (src, eth.source)
                };
                let na = NeighborAdvertisementHeader {
                    router: false,
                    solicited: !src.is_unspecified(),
                    r#override: true,
                };
                let mut payload = target.octets().to_vec();
                payload.extend_from_slice(&[2, 1]);
                payload.extend_from_slice(&self.port.mac);
                self.emit_icmpv6(
                    target,
                    reply_to,
                    reply_mac,
                    Icmpv6Type::NeighborAdvertisement(na),
                    &payload,
                );
            }
            Icmpv6Type::NeighborAdvertisement(_) => {
                let ip = IpAddr::V6(target);
                if self.arp_sent.contains_key(&ip) || self.neigh.contains_key(&ip) {
                    if let Some(mac) = option_mac(2) {
                        self.neigh.insert(ip, mac);
                        self.arp_sent.remove(&ip);
                    }
                }
            }
            _ => return false,
        }
        true
    }

    fn emit_icmpv6(
        &mut self,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        eth_dst: [u8; 6],
        kind: Icmpv6Type,
        payload: &[u8],
    ) {
        let b = PacketBuilder::ethernet2(self.port.mac, eth_dst)
            .ipv6(src.octets(), dst.octets(), 255)
            .icmpv6(kind);
        let mut frame = Vec::with_capacity(b.size(payload.len()));
        if b.write(&mut frame, payload).is_ok() {
            self.out.stats.tx_frames += 1;
            self.out.tx.push_back(frame);
        }
    }

    /// Sends a neighbour solicitation for `dst` to its solicited-node
    /// multicast address (RFC 4861 §7.2.2), from the port's link-local
    /// address (or the GID of the same scope when `dst` is global).
    fn solicit(&mut self, dst: IpAddr, _now: Nanos) {
        let IpAddr::V6(dst) = dst else { return };
        let link_local = Ipv6Addr::from(Gid::link_local_from_mac(self.port.mac).0);
        let src = if dst.is_unicast_link_local() {
            link_local
        } else {
            self.port.ipv6.first().copied().unwrap_or(link_local)
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
        payload.extend_from_slice(&self.port.mac);
        self.emit_icmpv6(src, group, mac, Icmpv6Type::NeighborSolicitation, &payload);
    }

    /// Sends an ARP request for the IPv4 address of `dgid` unless one was
    /// sent recently.
    pub(super) fn resolve(&mut self, dgid: [u8; 16], now: Nanos) {
        let dst = Gid(dgid).to_ip();
        if self.neigh.contains_key(&dst) {
            return;
        }
        if let Some(&t) = self.arp_sent.get(&dst) {
            if now < t + ARP_RETRY_NS {
                return;
            }
        }
        self.arp_sent.insert(dst, now);
        let IpAddr::V4(ip) = dst else {
            self.solicit(dst, now);
            return;
        };
        let req = ArpPacket {
            op: 1,
            sender_mac: self.port.mac,
            sender_ip: self.port.ipv4,
            target_mac: [0; 6],
            target_ip: ip,
        };
        let mut frame = Vec::with_capacity(64);
        wire::emit_arp(self.port.mac, [0xff; 6], &req, &mut frame);
        self.out.stats.tx_frames += 1;
        self.out.tx.push_back(frame);
    }
}
