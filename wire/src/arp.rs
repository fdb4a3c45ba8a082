//! Ethernet/IPv4 ARP (RFC 826), parsed and built with etherparse.

use std::net::Ipv4Addr;

use etherparse::{
    ArpEthIpv4Packet, ArpHardwareId, ArpOperation, ArpPacketSlice, EtherType, Ethernet2Header,
};

use super::WireError;

/// An Ethernet/IPv4 ARP packet (RFC 826: hardware type 1, protocol type
/// 0x0800, address lengths 6 and 4): 28 bytes after the Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpPacket {
    /// Operation: 1 request, 2 reply.
    pub op: u16,
    /// Sender hardware (MAC) address.
    pub sender_mac: [u8; 6],
    /// Sender protocol (IPv4) address.
    pub sender_ip: Ipv4Addr,
    /// Target hardware address (zero in a request).
    pub target_mac: [u8; 6],
    /// Target protocol address.
    pub target_ip: Ipv4Addr,
}

impl ArpPacket {
    /// ARP operation code of a request (RFC 826).
    pub const REQUEST: u16 = 1;
    /// ARP operation code of a reply (RFC 826).
    pub const REPLY: u16 = 2;
    /// Length of an Ethernet/IPv4 ARP packet, in bytes.
    pub const LEN: usize = ArpEthIpv4Packet::LEN;

    /// Parses the ARP packet at the start of `buf` (the Ethernet payload).
    ///
    /// Returns `Ok(None)` for well-formed ARP packets of other hardware or
    /// protocol types, [`WireError::Truncated`] if `buf` ends inside the
    /// packet. Trailing bytes (Ethernet padding) are ignored.
    pub fn parse(buf: &[u8]) -> Result<Option<ArpPacket>, WireError> {
        let arp = ArpPacketSlice::from_slice(buf).map_err(|_| WireError::Truncated)?;
        if arp.hw_addr_type() != ArpHardwareId::ETHERNET
            || arp.proto_addr_type() != EtherType::IPV4
            || arp.hw_addr_size() != 6
            || arp.proto_addr_size() != 4
        {
            return Ok(None);
        }
        let mac = |s: &[u8]| -> [u8; 6] {
            let mut m = [0u8; 6];
            m.copy_from_slice(&s[..6]);
            m
        };
        let ip = |s: &[u8]| Ipv4Addr::new(s[0], s[1], s[2], s[3]);
        Ok(Some(ArpPacket {
            op: arp.operation().0,
            sender_mac: mac(arp.sender_hw_addr()),
            sender_ip: ip(arp.sender_protocol_addr()),
            target_mac: mac(arp.target_hw_addr()),
            target_ip: ip(arp.target_protocol_addr()),
        }))
    }

    /// The 28 bytes of this packet.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        ArpEthIpv4Packet {
            operation: ArpOperation(self.op),
            sender_mac: self.sender_mac,
            sender_ipv4: self.sender_ip.octets(),
            target_mac: self.target_mac,
            target_ipv4: self.target_ip.octets(),
        }
        .to_bytes()
    }
}

/// Minimum Ethernet frame length without FCS (IEEE 802.3: 64 with FCS).
pub(crate) const ETH_MIN_FRAME: usize = 60;

/// Writes a complete Ethernet frame (no FCS) carrying `arp` into `out`
/// (cleared first): Ethernet header with ethertype 0x0806, the 28-byte
/// Ethernet/IPv4 ARP packet (RFC 826), zero padding to 60 bytes.
pub fn emit_arp(eth_src: [u8; 6], eth_dst: [u8; 6], arp: &ArpPacket, out: &mut Vec<u8>) {
    out.clear();
    let eth = Ethernet2Header {
        source: eth_src,
        destination: eth_dst,
        ether_type: EtherType::ARP,
    };
    out.extend_from_slice(&eth.to_bytes());
    out.extend_from_slice(&arp.to_bytes());
    out.resize(ETH_MIN_FRAME, 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_frame, Frame};

    fn sample() -> ArpPacket {
        ArpPacket {
            op: ArpPacket::REQUEST,
            sender_mac: [2, 0, 0, 0, 0, 1],
            sender_ip: Ipv4Addr::new(10, 0, 0, 1),
            target_mac: [0; 6],
            target_ip: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    #[test]
    fn layout() {
        let mut out = Vec::new();
        emit_arp([2, 0, 0, 0, 0, 1], [0xff; 6], &sample(), &mut out);
        assert_eq!(out.len(), 60);
        assert_eq!(&out[12..14], &[0x08, 0x06]);
        assert_eq!(&out[14..22], &[0, 1, 8, 0, 6, 4, 0, 1]);
        assert_eq!(&out[22..28], &[2, 0, 0, 0, 0, 1]);
        assert_eq!(&out[28..32], &[10, 0, 0, 1]);
        assert_eq!(&out[38..42], &[10, 0, 0, 2]);
        assert!(out[42..].iter().all(|&b| b == 0));
    }

    #[test]
    fn round_trip_and_truncation() {
        let mut out = Vec::new();
        let reply = ArpPacket {
            op: ArpPacket::REPLY,
            target_mac: [2, 0, 0, 0, 0, 2],
            ..sample()
        };
        emit_arp([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], &reply, &mut out);
        assert!(matches!(parse_frame(&out), Ok(Frame::Arp(a)) if a == reply));
        for n in 0..42 {
            assert!(parse_frame(&out[..n]).is_err(), "len {n}");
        }
        assert!(matches!(parse_frame(&out[..42]), Ok(Frame::Arp(a)) if a == reply));
    }

    #[test]
    fn other_arp_types_are_other() {
        let mut out = Vec::new();
        emit_arp([2; 6], [0xff; 6], &sample(), &mut out);
        out[15] = 6; // hardware type IEEE 802
        assert!(matches!(parse_frame(&out), Ok(Frame::Other)));
    }
}
