//! Whole RoCEv2 frames: Ethernet / IPv4 or IPv6 / UDP 4791 / BTH /
//! extension headers / payload / pad / ICRC (IBTA Vol 1 Annex A17.4).

use std::net::{IpAddr, Ipv6Addr};

use etherparse::{
    EtherType, Ethernet2Header, Ethernet2HeaderSlice, IpDscp, IpEcn, IpNumber, Ipv4Header,
    Ipv4HeaderSlice, Ipv6FlowLabel, Ipv6Header, Ipv6HeaderSlice, UdpHeader,
};

use super::{
    be16, be32, icrc, Aeth, ArpPacket, AtomicAckEth, AtomicEth, Bth, Deth, Ieth, Immdt, Reth,
    WireError, ICRC_LEN, ROCEV2_UDP_PORT,
};

const ETH_LEN: usize = 14;
const UDP_LEN: usize = UdpHeader::LEN;
const IPV4_LEN: usize = Ipv4Header::MIN_LEN;
const IPV6_LEN: usize = Ipv6Header::LEN;

/// Every header of a RoCEv2 frame, parsed (the "Repr" of a whole frame).
///
/// The extension headers present must be those `bth.opcode` requires
/// (see [`super::Opcode::has_reth`] etc.); [`parse_frame`] fills exactly
/// those and leaves the others `None`; [`emit_frame`] writes whichever are
/// `Some`.
#[derive(Debug, Clone, PartialEq)]
pub struct RoceHeaders {
    /// Ethernet source MAC.
    pub eth_src: [u8; 6],
    /// Ethernet destination MAC.
    pub eth_dst: [u8; 6],
    /// IP source; with `ip_dst` selects IPv4 (both V4) or IPv6.
    pub ip_src: IpAddr,
    /// IP destination.
    pub ip_dst: IpAddr,
    /// IPv4 identification (0 when parsed from IPv6; ignored for IPv6).
    pub ip_id: u16,
    /// IPv4 TTL or IPv6 hop limit (masked in the ICRC).
    pub ttl: u8,
    /// IPv4 TOS byte (DSCP << 2 | ECN) or IPv6 traffic class (masked in the
    /// ICRC).
    pub tclass: u8,
    /// IPv6 flow label, 20 bits (0 when parsed from IPv4; ignored for IPv4;
    /// masked in the ICRC).
    pub flow_label: u32,
    /// UDP source port (RoCEv2 lets the sender choose it, e.g. as an
    /// entropy/flow hash for ECMP); the destination port is always 4791.
    pub udp_src: u16,
    /// Base transport header.
    pub bth: Bth,
    /// RDMA extended transport header (9.3.3).
    pub reth: Option<Reth>,
    /// ACK extended transport header (9.3.5).
    pub aeth: Option<Aeth>,
    /// Atomic extended transport header (9.3.4).
    pub atomic_eth: Option<AtomicEth>,
    /// Atomic ACK extended transport header (9.3.5.3).
    pub atomic_ack_eth: Option<AtomicAckEth>,
    /// Datagram extended transport header (9.3.2).
    pub deth: Option<Deth>,
    /// Immediate data (9.3.6).
    pub immdt: Option<Immdt>,
    /// Invalidate extended transport header (9.3.7).
    pub ieth: Option<Ieth>,
}

impl RoceHeaders {
    /// The headers of another packet of this one's flow: the same
    /// Ethernet, IP and UDP fields, `bth`, and no extension headers.
    pub fn of_flow(&self, bth: Bth) -> RoceHeaders {
        RoceHeaders {
            bth,
            reth: None,
            aeth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
            deth: None,
            immdt: None,
            ieth: None,
            ..self.clone()
        }
    }

    /// Bytes of the extension headers that are `Some`.
    pub fn ext_len(&self) -> usize {
        [
            self.deth.map(|_| Deth::LEN),
            self.reth.map(|_| Reth::LEN),
            self.atomic_eth.map(|_| AtomicEth::LEN),
            self.aeth.map(|_| Aeth::LEN),
            self.atomic_ack_eth.map(|_| AtomicAckEth::LEN),
            self.immdt.map(|_| Immdt::LEN),
            self.ieth.map(|_| Ieth::LEN),
        ]
        .iter()
        .flatten()
        .sum()
    }

    /// Length in bytes of the frame [`emit_frame`] produces for a payload of
    /// `payload_len` bytes: Ethernet + IP + UDP + BTH + extension headers +
    /// payload + pad + ICRC.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        let ip_len = if self.is_ipv4() { IPV4_LEN } else { IPV6_LEN };
        ETH_LEN
            + ip_len
            + UDP_LEN
            + Bth::LEN
            + self.ext_len()
            + payload_len
            + pad_len(payload_len)
            + ICRC_LEN
    }

    fn is_ipv4(&self) -> bool {
        self.ip_src.is_ipv4() && self.ip_dst.is_ipv4()
    }
}

/// A parsed RoCEv2 frame borrowing its payload from the frame buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct RocePacket<'a> {
    /// All headers.
    pub hdr: RoceHeaders,
    /// The payload after the extension headers, without pad bytes and ICRC.
    pub payload: &'a [u8],
}

impl RocePacket<'_> {
    /// Length of the payload, bytes.
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }
}

/// What [`parse_frame`] found in an Ethernet frame.
// The RoCEv2 variant is the one nearly every frame is: boxing it would be
// an allocation per packet.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Frame<'a> {
    /// A valid RoCEv2 packet.
    Roce(RocePacket<'a>),
    /// An Ethernet/IPv4 ARP packet.
    Arp(ArpPacket),
    /// Anything else: other ethertypes (including VLAN-tagged frames), other
    /// IP protocols, UDP to other ports, non-first IPv4 fragments, IPv6
    /// packets with extension headers, other ARP hardware/protocol types.
    Other,
}

/// Largest packet after the first in a batch (`crate::batch::gso`),
/// bytes: its length field has 15 bits (the top one marks a packet by
/// reference). A path MTU (4096) and headers fit many times over.
pub const SEGMENT_MAX: usize = 0x7fff;

/// Largest packet by reference or run after the first in a batch, bytes:
/// 14 bits of the length field (the next one marks a run). Headers and the
/// piece entries of a run's 128 KiB in 4 KiB pages take under 1 KiB.
pub const PEER_SEGMENT_MAX: usize = 0x3fff;

/// Pad bytes needed after `payload_len` bytes to reach a multiple of 4
/// (IBTA 9.2 PadCnt).
pub fn pad_len(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

/// Parses and validates an Ethernet frame (no FCS).
///
/// - Ethertype ARP -> [`Frame::Arp`] (Ethernet/IPv4 ARP) or
///   [`Frame::Other`]; `Err(Truncated)` if the ARP packet is cut short.
/// - IPv4/IPv6 + UDP destination port 4791 -> [`Frame::Roce`] after
///   validating, in this order: the IP header ([`WireError::BadIpHeader`],
///   [`WireError::BadIpChecksum`] — checked for every IPv4 packet,
///   [`WireError::Truncated`] if the frame is shorter than the IP length),
///   no fragmentation ([`WireError::Fragmented`]), UDP length equal to the IP
///   payload length and room for BTH + ICRC ([`WireError::BadLength`]), the
///   ICRC ([`WireError::BadIcrc`]), the BTH ([`WireError::UnknownOpcode`],
///   [`WireError::BadTver`]), room for the extension headers the opcode
///   requires, payload + pad a multiple of 4 and empty for opcodes without
///   payload ([`WireError::BadLength`]), pad count ≤ payload
///   ([`WireError::BadPadCount`]). The UDP checksum is not checked (RoCEv2
///   relies on the ICRC; IPv4 senders send 0).
/// - Anything else -> [`Frame::Other`].
///
/// Trailing bytes beyond the IP length (Ethernet padding of short frames)
/// are ignored. Never panics and never allocates.
pub fn parse_frame(frame: &[u8]) -> Result<Frame<'_>, WireError> {
    parse_frame_with(frame, Icrc::Needed)
}

/// [`parse_frame`] with the ICRC checked or not: [`Icrc::Unneeded`] for a
/// frame another engine of this process built ([`Icrc`]).
pub fn parse_frame_with(frame: &[u8], icrc: Icrc) -> Result<Frame<'_>, WireError> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|_| WireError::Truncated)?;
    match eth.ether_type() {
        EtherType::ARP => Ok(match ArpPacket::parse(&frame[ETH_LEN..])? {
            Some(arp) => Frame::Arp(arp),
            None => Frame::Other,
        }),
        EtherType::IPV4 | EtherType::IPV6 => match parse_roce_with(frame, icrc) {
            Ok(p) => Ok(Frame::Roce(p)),
            Err(WireError::NotRoce) => Ok(Frame::Other),
            Err(e) => Err(e),
        },
        _ => Ok(Frame::Other),
    }
}

/// Parses an Ethernet frame that must be RoCEv2, like [`parse_frame`]:
/// [`WireError::NotIp`] for non-IP ethertypes and [`WireError::NotRoce`] for
/// IP packets that are not UDP to port 4791; every other error as there.
pub fn parse_roce(frame: &[u8]) -> Result<RocePacket<'_>, WireError> {
    parse_roce_with(frame, Icrc::Needed)
}

/// [`parse_roce`] with the ICRC checked or not ([`Icrc`]).
pub fn parse_roce_with(frame: &[u8], icrc_check: Icrc) -> Result<RocePacket<'_>, WireError> {
    let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|_| WireError::Truncated)?;
    let l3 = &frame[ETH_LEN..];
    let ip = match eth.ether_type() {
        EtherType::IPV4 => parse_ipv4(l3)?,
        EtherType::IPV6 => parse_ipv6(l3)?,
        _ => return Err(WireError::NotIp),
    };
    let udp = &ip.packet[ip.hdr_len..];
    if udp.len() < UDP_LEN {
        return Err(WireError::BadLength);
    }
    if be16(&udp[2..]) != ROCEV2_UDP_PORT {
        return Err(WireError::NotRoce);
    }
    if ip.more_fragments {
        return Err(WireError::Fragmented);
    }
    if usize::from(be16(&udp[4..])) != udp.len() || udp.len() < UDP_LEN + Bth::LEN + ICRC_LEN {
        return Err(WireError::BadLength);
    }
    let (covered, trailer) = ip.packet.split_at(ip.packet.len() - ICRC_LEN);
    if icrc_check == Icrc::Needed && icrc(covered) != be32(trailer) {
        return Err(WireError::BadIcrc);
    }
    let ib = &covered[ip.hdr_len + UDP_LEN..];
    parse_ib(ib, |bth| RoceHeaders {
        eth_src: eth.source(),
        eth_dst: eth.destination(),
        ip_src: ip.src,
        ip_dst: ip.dst,
        ip_id: ip.id,
        ttl: ip.ttl,
        tclass: ip.tclass,
        flow_label: ip.flow_label,
        udp_src: be16(udp),
        bth,
        reth: None,
        aeth: None,
        atomic_eth: None,
        atomic_ack_eth: None,
        deth: None,
        immdt: None,
        ieth: None,
    })
}

/// Parses the InfiniBand part of a RoCEv2 packet, `ib`: BTH, extension
/// headers, payload and pad, without the ICRC. `base` gives the headers
/// with the parsed BTH and every extension header `None` (the Ethernet,
/// IP and UDP fields come from the caller). The checks after the ICRC's
/// of [`parse_roce_with`], in its order.
pub fn parse_ib(
    ib: &[u8],
    base: impl FnOnce(Bth) -> RoceHeaders,
) -> Result<RocePacket<'_>, WireError> {
    let (hdr, hdr_len) = parse_ib_headers(ib, base)?;
    let op = hdr.bth.opcode;
    let padded = &ib[hdr_len..];
    if !padded.len().is_multiple_of(4) || (!op.has_payload() && !padded.is_empty()) {
        return Err(WireError::BadLength);
    }
    let pad = usize::from(hdr.bth.pad_count);
    if pad > padded.len() {
        return Err(WireError::BadPadCount);
    }
    Ok(RocePacket {
        hdr,
        payload: &padded[..padded.len() - pad],
    })
}

/// The BTH and extension headers at the start of `ib` ([`parse_ib`]) and
/// their length, bytes.
pub fn parse_ib_headers(
    ib: &[u8],
    base: impl FnOnce(Bth) -> RoceHeaders,
) -> Result<(RoceHeaders, usize), WireError> {
    let bth = Bth::parse(ib)?;
    if bth.tver != 0 {
        return Err(WireError::BadTver(bth.tver));
    }
    let op = bth.opcode;
    let hdr_len = op.header_len();
    if ib.len() < hdr_len {
        return Err(WireError::BadLength);
    }
    let mut hdr = base(bth);
    // Extension headers in IBTA order (9.2: BTH, RDETH, DETH, RETH,
    // AtomicETH, AETH, AtomicAckETH, ImmDt, IETH); `ib` holds them all.
    let mut off = Bth::LEN;
    macro_rules! ext {
        ($has:ident, $field:ident, $ty:ty) => {
            if op.$has() {
                hdr.$field = Some(<$ty>::parse(&ib[off..])?);
                off += <$ty>::LEN;
            }
        };
    }
    ext!(has_deth, deth, Deth);
    ext!(has_reth, reth, Reth);
    ext!(has_atomic_eth, atomic_eth, AtomicEth);
    ext!(has_aeth, aeth, Aeth);
    ext!(has_atomic_ack_eth, atomic_ack_eth, AtomicAckEth);
    ext!(has_immdt, immdt, Immdt);
    ext!(has_ieth, ieth, Ieth);
    debug_assert_eq!(off, hdr_len);
    Ok((hdr, hdr_len))
}

/// Whether a RoCEv2 frame carries a valid ICRC (IBTA Annex A17.4.3) that
/// its receiver checks.
///
/// [`Icrc::Unneeded`] is for frames between two engines of one process
/// (the functions of one daemon, through its embedded switch): the frame
/// never leaves the process's memory, so nothing can corrupt it on the
/// way, and computing and checking the ICRC would be two passes over the
/// payload for nothing — as Linux's veth hands packets on marked
/// `CHECKSUM_UNNECESSARY`. Such a frame is emitted with its ICRC field (and
/// over IPv6 the UDP checksum, which covers it) zero; a copy that leaves
/// the process (a pcap record) is completed by [`seal_icrc`]. Frames from
/// a wire are always [`Icrc::Needed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Icrc {
    /// Computed when emitted, checked when parsed.
    #[default]
    Needed,
    /// Left zero when emitted, not checked when parsed.
    Unneeded,
}

/// Writes the ICRC (and, over IPv6, the UDP checksum that covers it) of a
/// well-formed RoCEv2 frame emitted with [`Icrc::Unneeded`], in place, as
/// [`emit_frame`] would have. Errors: what [`parse_roce_with`] returns for
/// a frame that is not a well-formed RoCEv2 frame (which is left as it
/// was).
pub fn seal_icrc(frame: &mut [u8]) -> Result<(), WireError> {
    parse_roce_with(frame, Icrc::Unneeded)?;
    let v6 = frame.get(12..14) == Some(&[0x86, 0xdd][..]);
    let l3 = &frame[ETH_LEN..];
    let ip = if v6 { parse_ipv6(l3)? } else { parse_ipv4(l3)? };
    let (hdr_len, end) = (ip.hdr_len, ETH_LEN + ip.packet.len());
    let (src, dst) = (ip.src, ip.dst);
    let crc = icrc(&frame[ETH_LEN..end - ICRC_LEN]);
    frame[end - ICRC_LEN..end].copy_from_slice(&crc.to_be_bytes());
    if let (IpAddr::V6(s), IpAddr::V6(d)) = (src, dst) {
        let udp_off = ETH_LEN + hdr_len;
        frame[udp_off + 6..udp_off + 8].fill(0);
        let udp = etherparse::UdpHeaderSlice::from_slice(&frame[udp_off..end])
            .map_err(|_| WireError::BadLength)?
            .to_header();
        let sum = udp
            .calc_checksum_ipv6_raw(s.octets(), d.octets(), &frame[udp_off + UDP_LEN..end])
            .unwrap_or(0);
        frame[udp_off + 6..udp_off + 8].copy_from_slice(&sum.to_be_bytes());
    }
    Ok(())
}

/// The IP layer of a frame, validated.
struct IpInfo<'a> {
    /// From the IP header to the end given by the IP length field.
    packet: &'a [u8],
    hdr_len: usize,
    src: IpAddr,
    dst: IpAddr,
    id: u16,
    ttl: u8,
    tclass: u8,
    flow_label: u32,
    more_fragments: bool,
}

fn parse_ipv4(l3: &[u8]) -> Result<IpInfo<'_>, WireError> {
    use etherparse::err::ipv4::HeaderSliceError;
    let h = Ipv4HeaderSlice::from_slice(l3).map_err(|e| match e {
        HeaderSliceError::Len(_) => WireError::Truncated,
        HeaderSliceError::Content(_) => WireError::BadIpHeader,
    })?;
    let hdr_len = h.slice().len();
    let total = usize::from(h.total_len());
    if total < hdr_len {
        return Err(WireError::BadIpHeader);
    }
    let packet = l3.get(..total).ok_or(WireError::Truncated)?;
    if ones_complement_sum(h.slice()) != 0xffff {
        return Err(WireError::BadIpChecksum);
    }
    if h.protocol() != IpNumber::UDP || h.fragments_offset().value() != 0 {
        return Err(WireError::NotRoce);
    }
    Ok(IpInfo {
        packet,
        hdr_len,
        src: IpAddr::V4(h.source_addr()),
        dst: IpAddr::V4(h.destination_addr()),
        id: h.identification(),
        ttl: h.ttl(),
        tclass: l3[1],
        flow_label: 0,
        more_fragments: h.more_fragments(),
    })
}

fn parse_ipv6(l3: &[u8]) -> Result<IpInfo<'_>, WireError> {
    use etherparse::err::ipv6::HeaderSliceError;
    let h = Ipv6HeaderSlice::from_slice(l3).map_err(|e| match e {
        HeaderSliceError::Len(_) => WireError::Truncated,
        HeaderSliceError::Content(_) => WireError::BadIpHeader,
    })?;
    let total = IPV6_LEN + usize::from(h.payload_length());
    let packet = l3.get(..total).ok_or(WireError::Truncated)?;
    if h.next_header() != IpNumber::UDP {
        return Err(WireError::NotRoce);
    }
    Ok(IpInfo {
        packet,
        hdr_len: IPV6_LEN,
        src: IpAddr::V6(h.source_addr()),
        dst: IpAddr::V6(h.destination_addr()),
        id: 0,
        ttl: h.hop_limit(),
        tclass: h.traffic_class(),
        flow_label: h.flow_label().value(),
        more_fragments: false,
    })
}

/// The folded 16-bit one's complement sum of `data` (RFC 1071); 0xffff for
/// an IPv4 header with a correct checksum.
fn ones_complement_sum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Emits a complete RoCEv2 frame (no FCS) into `out`, which is cleared
/// first:
///
/// 1. Ethernet: `eth_dst`, `eth_src`, ethertype 0x0800 or 0x86dd;
/// 2. IPv4 (both addresses V4: 20 bytes, TOS `tclass`, ID `ip_id`, DF set,
///    TTL `ttl`, protocol 17, header checksum) or IPv6 (otherwise; a V4
///    address is written IPv4-mapped; traffic class `tclass`, flow label
///    `flow_label & 0xfffff`, hop limit `ttl`, next header 17);
/// 3. UDP: source `udp_src`, destination 4791, checksum 0 over IPv4,
///    computed (RFC 8200 8.1) over IPv6;
/// 4. BTH, with `pad_count` computed from `payload.len()` (the value in
///    `hdr.bth.pad_count` is ignored);
/// 5. the extension headers that are `Some`, in IBTA order: DETH, RETH,
///    AtomicETH, AETH, AtomicAckETH, ImmDt, IETH (IBTA 9.2);
/// 6. `payload`, zero pad to a multiple of 4, and the ICRC ([`icrc`]).
///
/// The frame is [`RoceHeaders::frame_len`] bytes long and is not padded to
/// the 60-byte Ethernet minimum. The caller keeps the IP packet within
/// 65535 bytes (MTU-sized payloads); longer payloads are a bug
/// (debug-asserted) and would get wrapped length fields.
pub fn emit_frame(hdr: &RoceHeaders, payload: &[u8], out: &mut Vec<u8>) {
    let copy = |b: &mut [u8]| {
        b.copy_from_slice(payload);
        Ok::<(), std::convert::Infallible>(())
    };
    match emit_frame_with(hdr, payload.len(), out, copy) {
        Ok(()) => {}
        Err(never) => match never {},
    }
}

/// [`emit_frame`] with the payload written in place: `fill` gets the
/// `payload_len` bytes of the frame where the payload goes and must write
/// every one of them (they hold what the buffer held before: `out` is
/// overwritten, not cleared, so a reused buffer costs no zeroing), e.g.
/// gathered straight from driver memory, so the payload is copied once
/// between driver memory and the frame. The ICRC is computed once, after
/// `fill`. When `fill` fails, its error is returned and `out` holds no
/// valid frame.
pub fn emit_frame_with<E>(
    hdr: &RoceHeaders,
    payload_len: usize,
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<(), E> {
    emit_frame_icrc(hdr, payload_len, out, Icrc::Needed, fill)
}

/// [`emit_frame_with`] with the ICRC computed or, for [`Icrc::Unneeded`],
/// left zero (with the UDP checksum over IPv6, which covers it).
pub fn emit_frame_icrc<E>(
    hdr: &RoceHeaders,
    payload_len: usize,
    out: &mut Vec<u8>,
    icrc_mode: Icrc,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<(), E> {
    let end = emit_frame_at(hdr, payload_len, out, icrc_mode, fill)?;
    out.truncate(end);
    Ok(())
}

/// [`emit_frame_icrc`] with [`Icrc::Unneeded`] that leaves the bytes
/// after the frame as they were (a batch's later packets go over them
/// without zeroing, the in-process batches, `crate::batch::gso`): returns where the frame ends.
pub fn emit_frame_open<E>(
    hdr: &RoceHeaders,
    payload_len: usize,
    out: &mut Vec<u8>,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, E> {
    emit_frame_at(hdr, payload_len, out, Icrc::Unneeded, fill)
}

/// Writes the frame of [`emit_frame_icrc`] from the start of `out`, over
/// its old bytes, and returns where it ends; bytes after it are left.
fn emit_frame_at<E>(
    hdr: &RoceHeaders,
    payload_len: usize,
    out: &mut Vec<u8>,
    icrc_mode: Icrc,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, E> {
    // The buffer's old bytes are overwritten, not cleared first: a pooled
    // buffer of the same frame size costs no zeroing of its payload.
    let total = hdr.frame_len(payload_len);
    if out.len() < total {
        out.resize(total, 0);
    }
    let mut w = Cursor { buf: out, pos: 0 };
    let pad = pad_len(payload_len);
    let udp_len = UDP_LEN + Bth::LEN + hdr.ext_len() + payload_len + pad + ICRC_LEN;
    debug_assert!(
        udp_len + IPV6_LEN <= usize::from(u16::MAX),
        "RoCE payload too long"
    );

    // Ethernet and IP.
    let ipv6_of = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let v6_addrs: Option<(Ipv6Addr, Ipv6Addr)> = match (hdr.ip_src, hdr.ip_dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let eth = Ethernet2Header {
                source: hdr.eth_src,
                destination: hdr.eth_dst,
                ether_type: EtherType::IPV4,
            };
            w.put(&eth.to_bytes());
            let mut ip = Ipv4Header {
                dscp: IpDscp::try_new(hdr.tclass >> 2).unwrap_or(IpDscp::ZERO),
                ecn: IpEcn::try_new(hdr.tclass & 0x3).unwrap_or(IpEcn::ZERO),
                total_len: (IPV4_LEN + udp_len) as u16,
                identification: hdr.ip_id,
                dont_fragment: true,
                time_to_live: hdr.ttl,
                protocol: IpNumber::UDP,
                source: s.octets(),
                destination: d.octets(),
                ..Default::default()
            };
            ip.header_checksum = ip.calc_header_checksum();
            w.put(&ip.to_bytes());
            None
        }
        (s, d) => {
            let eth = Ethernet2Header {
                source: hdr.eth_src,
                destination: hdr.eth_dst,
                ether_type: EtherType::IPV6,
            };
            w.put(&eth.to_bytes());
            let (s, d) = (ipv6_of(s), ipv6_of(d));
            let ip = Ipv6Header {
                traffic_class: hdr.tclass,
                flow_label: Ipv6FlowLabel::try_new(hdr.flow_label & Ipv6FlowLabel::MAX_U32)
                    .unwrap_or(Ipv6FlowLabel::ZERO),
                payload_length: udp_len as u16,
                next_header: IpNumber::UDP,
                hop_limit: hdr.ttl,
                source: s.octets(),
                destination: d.octets(),
            };
            w.put(&ip.to_bytes());
            Some((s, d))
        }
    };

    // UDP, checksum patched below for IPv6.
    let udp_off = w.pos;
    let udp = UdpHeader {
        source_port: hdr.udp_src,
        destination_port: ROCEV2_UDP_PORT,
        length: udp_len as u16,
        checksum: 0,
    };
    w.put(&udp.to_bytes());

    emit_ib_headers(&mut w, hdr, pad);
    let start = w.pos;
    w.push(payload_len, |_| {});
    fill(&mut w.buf[start..start + payload_len])?;
    w.put(&[0; 3][..pad]);
    let crc_at = w.pos;
    w.put(&[0; ICRC_LEN]);
    let Cursor { buf: out, pos: end } = w;
    debug_assert_eq!(end, total);
    if icrc_mode == Icrc::Unneeded {
        return Ok(end);
    }
    let crc = icrc(&out[ETH_LEN..crc_at]);
    out[crc_at..end].copy_from_slice(&crc.to_be_bytes());

    if let Some((s, d)) = v6_addrs {
        let sum = udp
            .calc_checksum_ipv6_raw(s.octets(), d.octets(), &out[udp_off + UDP_LEN..end])
            .unwrap_or(0);
        out[udp_off + 6..udp_off + 8].copy_from_slice(&sum.to_be_bytes());
    }
    Ok(end)
}

/// Writes the BTH, with `pad_count` `pad` (the value in `hdr.bth` is
/// ignored), and the extension headers that are `Some` in IBTA order
/// (9.2): DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
fn emit_ib_headers(w: &mut Cursor<'_>, hdr: &RoceHeaders, pad: usize) {
    let bth = Bth {
        pad_count: pad as u8,
        ..hdr.bth
    };
    w.push(Bth::LEN, |b| bth.emit(b));
    if let Some(h) = &hdr.deth {
        w.push(Deth::LEN, |b| h.emit(b));
    }
    if let Some(h) = &hdr.reth {
        w.push(Reth::LEN, |b| h.emit(b));
    }
    if let Some(h) = &hdr.atomic_eth {
        w.push(AtomicEth::LEN, |b| h.emit(b));
    }
    if let Some(h) = &hdr.aeth {
        w.push(Aeth::LEN, |b| h.emit(b));
    }
    if let Some(h) = &hdr.atomic_ack_eth {
        w.push(AtomicAckEth::LEN, |b| h.emit(b));
    }
    if let Some(h) = &hdr.immdt {
        w.push(Immdt::LEN, |b| h.emit(b));
    }
    if let Some(h) = &hdr.ieth {
        w.push(Ieth::LEN, |b| h.emit(b));
    }
}

/// Writes the InfiniBand part of one more packet at byte `at` of `out`,
/// over its old bytes: its length in bytes (16 bits, big-endian), then
/// BTH, extension headers, the `payload_len` bytes `fill` writes and the
/// pad, without an ICRC (a packet of a batch, the in-process batches, `crate::batch::gso`). Returns
/// where it ends; bytes after it are left as they were. When `fill`
/// fails, its error is returned.
pub fn emit_segment<E>(
    hdr: &RoceHeaders,
    payload_len: usize,
    out: &mut Vec<u8>,
    at: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, E> {
    let pad = pad_len(payload_len);
    let seg_len = Bth::LEN + hdr.ext_len() + payload_len + pad;
    // The caller keeps within SEGMENT_MAX.
    debug_assert!(seg_len <= SEGMENT_MAX, "segment too long");
    let mut w = Cursor { buf: out, pos: at };
    w.put(&(seg_len as u16).to_be_bytes());
    emit_ib_headers(&mut w, hdr, pad);
    let p = w.pos;
    w.push(payload_len, |_| {});
    fill(&mut w.buf[p..p + payload_len])?;
    w.put(&[0; 3][..pad]);
    Ok(w.pos)
}

/// [`emit_segment`] for a packet whose `payload_len` bytes stay in the
/// sending device's memory: after the headers, `pieces` appends their
/// piece entries (`crate::data::push_piece`) instead of the bytes, and
/// the length field has its top bit set. `out` is cut at `at` first (its
/// old bytes after are dropped). Returns where the packet ends; `Ok(None)`
/// (and `out` cut back to `at`) when it is longer than
/// [`PEER_SEGMENT_MAX`]; when `pieces` fails, `out` is cut
/// back to `at` and its error returned.
pub fn emit_segment_peer<E>(
    hdr: &RoceHeaders,
    payload_len: usize,
    out: &mut Vec<u8>,
    at: usize,
    pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<Option<usize>, E> {
    out.truncate(at);
    let mut w = Cursor { buf: out, pos: at };
    w.put(&[0, 0]);
    emit_ib_headers(&mut w, hdr, pad_len(payload_len));
    let end = w.pos;
    seal_peer_segment(out, at, end, 0x8000, pieces)
}

/// Ends a segment by reference whose length field is at `at` and whose
/// headers end at `end` of `out`: `pieces` appends its piece entries, and
/// the length field gets the bytes after it with `flags` (its top bits)
/// set. `Ok(None)`, and `out` cut back to `at`, when those bytes are more
/// than [`PEER_SEGMENT_MAX`]; `pieces`' error likewise.
fn seal_peer_segment<E>(
    out: &mut Vec<u8>,
    at: usize,
    end: usize,
    flags: u16,
    pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<Option<usize>, E> {
    out.truncate(end);
    if let Err(e) = pieces(out) {
        out.truncate(at);
        return Err(e);
    }
    let seg_len = out.len() - at - 2;
    if seg_len > PEER_SEGMENT_MAX {
        out.truncate(at);
        return Ok(None);
    }
    out[at..at + 2].copy_from_slice(&((seg_len as u16) | flags).to_be_bytes());
    Ok(Some(out.len()))
}

/// Writes a run (`crate::batch::Run`) at byte `at` of `out`, cutting `out` there
/// first: its length field (top two bits set: by reference, a run), the
/// packet count and the stride (16 bits each, big-endian), the InfiniBand
/// headers of its first packet (`first`, pad count 0) and of its last
/// (`last`, the pad of a last packet of `total - (count - 1) * stride`
/// bytes), then `pieces` appends the piece entries of all `total` bytes.
/// Returns where it ends; `Ok(None)` (and `out` cut back to `at`) when it
/// is longer than [`PEER_SEGMENT_MAX`]; `pieces`' error
/// likewise. The caller keeps to what `crate::batch::Run::new` accepts.
#[allow(clippy::too_many_arguments)]
pub fn emit_run_peer<E>(
    first: &RoceHeaders,
    last: &RoceHeaders,
    count: u16,
    stride: u16,
    total: usize,
    out: &mut Vec<u8>,
    at: usize,
    pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<Option<usize>, E> {
    let last_len = total.saturating_sub(usize::from(count.saturating_sub(1)) * usize::from(stride));
    out.truncate(at);
    let mut w = Cursor { buf: out, pos: at };
    w.put(&[0, 0]);
    w.put(&count.to_be_bytes());
    w.put(&stride.to_be_bytes());
    emit_ib_headers(&mut w, first, 0);
    emit_ib_headers(&mut w, last, pad_len(last_len));
    let end = w.pos;
    seal_peer_segment(out, at, end, 0xc000, pieces)
}

/// The parts of a run's segment after its length field
/// ([`emit_run_peer`]): the packet count, the stride, the first and last
/// packets' headers (from `base`, as [`parse_ib`]) and the piece entries.
pub fn parse_run_parts(
    seg: &[u8],
    base: impl Fn(Bth) -> RoceHeaders,
) -> Result<(u16, u16, RoceHeaders, RoceHeaders, &[u8]), WireError> {
    let [c0, c1, s0, s1, ib @ ..] = seg else {
        return Err(WireError::Truncated);
    };
    let (first, n) = parse_ib_headers(ib, &base)?;
    let ib = &ib[n..];
    let (last, n) = parse_ib_headers(ib, &base)?;
    Ok((
        u16::from_be_bytes([*c0, *c1]),
        u16::from_be_bytes([*s0, *s1]),
        first,
        last,
        &ib[n..],
    ))
}

/// Writes a frame over a buffer's old bytes from its start (the buffer is
/// at least as long as the frame: no bounds growth, no zeroing).
struct Cursor<'a> {
    buf: &'a mut Vec<u8>,
    pos: usize,
}

impl Cursor<'_> {
    /// Writes `bytes` at the cursor.
    fn put(&mut self, bytes: &[u8]) {
        self.push(bytes.len(), |b| b.copy_from_slice(bytes));
    }

    /// Lets `emit` write the `len` bytes at the cursor (their old contents
    /// are whatever the buffer held), growing the buffer if it is short.
    fn push(&mut self, len: usize, emit: impl FnOnce(&mut [u8])) {
        let end = self.pos + len;
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        emit(&mut self.buf[self.pos..end]);
        self.pos = end;
    }
}
