//! The port's IPv4 neighbour handling: answers ARP requests for the port's
//! address, learns neighbours from ARP and RoCEv2 traffic, and resolves a
//! QP's destination GID to a MAC before its first packet (RFC 826).

use std::net::{IpAddr, Ipv4Addr};

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

    /// IPv6 destinations: neighbour discovery (not yet: see `solicit`).
    fn solicit(&mut self, _dst: IpAddr, _now: Nanos) {}

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
