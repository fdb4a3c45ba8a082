//! UDP segmentation offload on the kernel's links: a run of RoCEv2 frames
//! of one flow goes to the kernel as one "super-frame" with a virtio-net
//! header asking for UDP segmentation (`VIRTIO_NET_HDR_GSO_UDP_L4`, Linux
//! 4.18+ on AF_PACKET's `PACKET_VNET_HDR`, 6.2+ on a TAP's
//! `IFF_VNET_HDR` with `TUN_F_USO4 | TUN_F_USO6`), and a super-frame the
//! kernel hands over whole is cut back into its frames here.
//!
//! Why: on this kind of link the kernel's work per frame (a system call,
//! an skb, a bridge or veth hop, the receiver's wake-up) costs 2–5 µs, far
//! more than the engine's (issue 10). A super-frame crosses the kernel as
//! one skb: a 64 KiB WRITE at path MTU 1024 is three super-frames (its
//! FIRST alone, then runs of up to 32, as the device hands frames to the
//! link, [`super::txq::SEND_BATCH`]) instead of 64 frames. Where it must become frames (a device without the
//! offload: a NIC, a TAP whose reader did not ask for it, the kernel's
//! own UDP socket, e.g. rxe's), the kernel segments it (`__udp_gso_segment`).
//!
//! What keeps that exact for RoCEv2: the kernel cuts the UDP payload
//! every `gso_size` bytes and gives each piece the first frame's headers
//! with its own lengths, the IPv4 identification of the first plus the
//! piece's index, fresh IPv4 and UDP checksums. So a run is made only of
//! frames whose payload after the UDP header (BTH to ICRC) is `gso_size`
//! bytes — the last may be shorter — with identical Ethernet, IP and UDP
//! headers but for those fields ([`run_len`]). Each frame's ICRC, computed
//! over its own headers (IBTA A17.4.1, with TTL, TOS and the checksums
//! masked), then holds for the frame the kernel cuts, and for the one
//! [`Segments`] rebuilds. The frames' payloads are not copied: a
//! super-frame is sent as an `iovec` of the header [`super_header`] writes
//! and each frame's bytes after its headers.

use std::ops::Range;

use etherparse::checksum::Sum16BitWords;

use virtio_bindings::virtio_net::{
    VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_UDP_L4,
};

/// Bytes of the virtio-net header before every frame on a link with the
/// offload on (`struct virtio_net_hdr`, virtio 1.x 5.1.6, without
/// `num_buffers`: the size `PACKET_VNET_HDR` and a TAP's default
/// `TUNSETVNETHDRSZ` use). Its 16-bit fields are in the host's byte order
/// (the legacy layout both use on a little-endian host).
pub const VNET_HDR_LEN: usize = 10;

/// Most frames in one super-frame (the kernel takes up to 128,
/// `UDP_MAX_SEGMENTS`; 64 keeps within older kernels' limit).
pub const MAX_SEGMENTS: usize = 64;

/// Largest super-frame, bytes, Ethernet header included: the IP length
/// fields have 16 bits.
pub const MAX_SUPER_FRAME: usize = ETH_LEN + 40 + 65535;

/// Smallest `gso_size` taken from a received super-frame, bytes: a BTH and
/// an ICRC (IBTA 9.2, 9.10.1), the least a RoCEv2 packet has. Smaller
/// pieces could be nothing but malformed, and a peer could make a 64 KiB
/// super-frame tens of thousands of them.
pub const MIN_PIECE: usize = 16;

/// Longest Ethernet, IP and UDP headers of a frame in a run, bytes (IPv6).
pub const MAX_HDR_LEN: usize = ETH_LEN + 40 + UDP_LEN;

const ETH_LEN: usize = 14;
const UDP_LEN: usize = 8;
const IPPROTO_UDP: u8 = 17;

/// Where a frame's Ethernet, IP and UDP headers are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// IPv4 (20 bytes, no options) or IPv6 (40, UDP next).
    v4: bool,
    /// Bytes of the Ethernet, IP and UDP headers: 42 or 62.
    hdr_len: usize,
}

impl Layout {
    /// The layout of `frame` if it is one whole unfragmented UDP datagram
    /// over IPv4 without options or IPv6 without extension headers, its IP
    /// and UDP lengths matching the frame's (no Ethernet padding).
    fn of(frame: &[u8]) -> Option<Layout> {
        let be16 = |o: usize| -> Option<usize> {
            Some(usize::from(u16::from_be_bytes(
                frame.get(o..o + 2)?.try_into().ok()?,
            )))
        };
        let (v4, hdr_len, ip_len_ok) = match frame.get(12..14)? {
            [0x08, 0x00] => {
                let ip = frame.get(ETH_LEN..ETH_LEN + 20)?;
                // Version 4, IHL 5; UDP; neither MF nor a fragment offset.
                if ip[0] != 0x45 || ip[9] != IPPROTO_UDP || ip[6] & 0x3f != 0 || ip[7] != 0 {
                    return None;
                }
                (true, ETH_LEN + 20 + UDP_LEN, be16(ETH_LEN + 2)? + ETH_LEN)
            }
            [0x86, 0xdd] => {
                let ip = frame.get(ETH_LEN..ETH_LEN + 40)?;
                if ip[0] >> 4 != 6 || ip[6] != IPPROTO_UDP {
                    return None;
                }
                (
                    false,
                    ETH_LEN + 40 + UDP_LEN,
                    be16(ETH_LEN + 4)? + ETH_LEN + 40,
                )
            }
            _ => return None,
        };
        let udp_len = be16(hdr_len - UDP_LEN + 4)?;
        (ip_len_ok == frame.len() && udp_len + hdr_len - UDP_LEN == frame.len())
            .then_some(Layout { v4, hdr_len })
    }

    /// Most UDP payload bytes one datagram of this layout carries.
    fn max_payload(self) -> usize {
        if self.v4 {
            65535 - 20 - UDP_LEN
        } else {
            65535 - UDP_LEN
        }
    }
}

/// True when `b` may follow `a` in a run as its `index`-th frame: the
/// same Ethernet header, IP header but for lengths, checksum and (IPv4)
/// an identification `index` above `a`'s, and the same UDP ports.
fn same_flow(a: &[u8], b: &[u8], l: Layout, index: usize) -> bool {
    let eq = |r: Range<usize>| a.get(r.clone()) == b.get(r);
    let ip = ETH_LEN;
    let ports = l.hdr_len - UDP_LEN..l.hdr_len - UDP_LEN + 4;
    if !eq(0..ETH_LEN) || !eq(ports) {
        return false;
    }
    if l.v4 {
        let id = |f: &[u8]| u16::from_be_bytes([f[ip + 4], f[ip + 5]]);
        // Version/IHL/TOS; flags to protocol; addresses.
        eq(ip..ip + 2)
            && eq(ip + 6..ip + 10)
            && eq(ip + 12..ip + 20)
            && id(b) == id(a).wrapping_add(index as u16)
    } else {
        // Version, class, flow label; next header, hop limit, addresses.
        eq(ip..ip + 4) && eq(ip + 6..ip + 40)
    }
}

/// How many frames from the front of `frames` go as one super-frame (at
/// least 1, when `frames` is not empty; 1 means "send the first alone").
/// A run: up to [`MAX_SEGMENTS`] UDP frames of one flow (Ethernet, IP and
/// UDP headers equal but for lengths and checksums, IPv4 identifications
/// counting up by one), every frame's UDP payload as long as the first's
/// but the last one's, which may be shorter, all of it within the IP
/// length's 16 bits. A shorter second frame followed by one as long
/// starts the next run instead (a WRITE's first packet, longer by its
/// RETH, goes alone and its middle ones together).
pub fn run_len<F: AsRef<[u8]>>(frames: &[F]) -> usize {
    let Some(first) = frames.first().map(AsRef::as_ref) else {
        return 0;
    };
    let Some(l) = Layout::of(first) else {
        return 1;
    };
    let gso = first.len() - l.hdr_len;
    if gso < MIN_PIECE {
        return 1;
    }
    let mut total = gso;
    let mut n = 1;
    for f in frames
        .iter()
        .skip(1)
        .take(MAX_SEGMENTS - 1)
        .map(AsRef::as_ref)
    {
        if Layout::of(f) != Some(l) || !same_flow(first, f, l, n) {
            break;
        }
        let p = f.len() - l.hdr_len;
        if p == 0 || p > gso || total + p > l.max_payload() {
            break;
        }
        if p < gso {
            // A shorter frame ends a run. Right after the first, and with
            // more of its length behind it (a WRITE's first packet carries
            // a RETH its middle ones do not), it starts the next run
            // instead: the first goes alone.
            let next_is_like = frames
                .get(n + 1)
                .is_some_and(|g| g.as_ref().len() == f.len());
            if !(n == 1 && next_is_like) {
                n += 1;
            }
            break;
        }
        total += p;
        n += 1;
    }
    n
}

/// Writes to `out` the virtio-net header and the Ethernet, IP and UDP
/// headers of the super-frame of `run` (frames [`run_len`] accepted;
/// one frame: a plain header, `VIRTIO_NET_HDR_GSO_NONE`) and returns
/// their length, bytes; the super-frame is that, then each frame's bytes
/// from its header length on ([`payload_offset`]). The IP and UDP lengths
/// cover all the frames, the IPv4 checksum is recomputed and the UDP
/// checksum holds the pseudo-header's sum (`VIRTIO_NET_HDR_F_NEEDS_CSUM`:
/// the kernel completes it per segment).
pub fn super_header<F: AsRef<[u8]>>(
    run: &[F],
    out: &mut [u8; VNET_HDR_LEN + MAX_HDR_LEN],
) -> usize {
    out[..VNET_HDR_LEN].fill(0);
    let Some(first) = run.first().map(AsRef::as_ref) else {
        return VNET_HDR_LEN;
    };
    let layout = Layout::of(first);
    let (Some(l), true) = (layout, run.len() > 1) else {
        // Alone: no offload asked; the frame follows the header as it is.
        out[1] = VIRTIO_NET_HDR_GSO_NONE as u8;
        return VNET_HDR_LEN;
    };
    let hl = l.hdr_len;
    let payload: usize = run.iter().map(|f| f.as_ref().len() - hl).sum();
    let gso = first.len() - hl;
    let ne16 = |v: usize| (v as u16).to_ne_bytes();
    out[0] = VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
    out[1] = VIRTIO_NET_HDR_GSO_UDP_L4 as u8;
    out[2..4].copy_from_slice(&ne16(hl));
    out[4..6].copy_from_slice(&ne16(gso));
    out[6..8].copy_from_slice(&ne16(hl - UDP_LEN));
    out[8..10].copy_from_slice(&ne16(6));
    let h = &mut out[VNET_HDR_LEN..VNET_HDR_LEN + hl];
    h.copy_from_slice(&first[..hl]);
    set_lengths(h, l, payload);
    let udp_len = UDP_LEN + payload;
    let pseudo = pseudo_sum(h, l, udp_len);
    h[hl - 2..hl].copy_from_slice(&pseudo);
    VNET_HDR_LEN + hl
}

/// One message a link sends ([`next_message`]): how many frames it
/// carries, the length of the header written for it, and where each
/// frame's bytes start in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message {
    /// Frames from the front of the batch: a run, or 1.
    pub frames: usize,
    /// Bytes of the virtio-net (and, for a run, Ethernet, IP and UDP)
    /// header [`super_header`] wrote.
    pub hdr_len: usize,
    /// [`payload_offset`] of the run: each frame's bytes from there on
    /// follow the header.
    pub payload_offset: usize,
}

/// The next message of a non-empty batch `frames`: a run of them as one
/// super-frame ([`run_len`]) when `runs`, else the first frame alone (a
/// link whose offload is off), its header written to `hdr`.
pub fn next_message<F: AsRef<[u8]>>(
    frames: &[F],
    runs: bool,
    hdr: &mut [u8; VNET_HDR_LEN + MAX_HDR_LEN],
) -> Message {
    let n = if runs { run_len(frames).max(1) } else { 1 };
    let run = &frames[..n.min(frames.len())];
    Message {
        frames: run.len(),
        hdr_len: super_header(run, hdr),
        payload_offset: payload_offset(run),
    }
}

/// Where a frame of a run starts to belong to the super-frame's payload:
/// its header length (42 for IPv4, 62 for IPv6); 0 for a frame sent alone.
pub fn payload_offset<F: AsRef<[u8]>>(run: &[F]) -> usize {
    match (
        run.len() > 1,
        run.first().and_then(|f| Layout::of(f.as_ref())),
    ) {
        (true, Some(l)) => l.hdr_len,
        _ => 0,
    }
}

/// Sets the IP and UDP lengths of headers `h` for `payload` bytes after
/// the UDP header, the UDP checksum to zero, and (IPv4) the header
/// checksum.
fn set_lengths(h: &mut [u8], l: Layout, payload: usize) {
    let udp = l.hdr_len - UDP_LEN;
    let udp_len = (UDP_LEN + payload) as u16;
    h[udp + 4..udp + 6].copy_from_slice(&udp_len.to_be_bytes());
    h[udp + 6..udp + 8].fill(0);
    if l.v4 {
        let tot = 20 + udp_len;
        h[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&tot.to_be_bytes());
        ipv4_checksum(&mut h[ETH_LEN..ETH_LEN + 20]);
    } else {
        h[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&udp_len.to_be_bytes());
    }
}

/// Writes the UDP checksum of the IPv6 frame `f` (40-byte header, UDP
/// next), mandatory over IPv6 (RFC 8200 8.1): what the kernel's
/// segmentation gives each piece, and what the sender's engine put in its
/// frame ([`crate::wire::seal_icrc`]).
fn udp6_checksum(f: &mut [u8]) {
    let udp = ETH_LEN + 40;
    let addr = |o: usize| -> [u8; 16] { f[o..o + 16].try_into().unwrap_or([0; 16]) };
    let (src, dst) = (addr(ETH_LEN + 8), addr(ETH_LEN + 24));
    let Ok(h) = etherparse::UdpHeaderSlice::from_slice(&f[udp..]) else {
        return;
    };
    let sum = h
        .to_header()
        .calc_checksum_ipv6_raw(src, dst, &f[udp + UDP_LEN..])
        .unwrap_or(0);
    f[udp + 6..udp + 8].copy_from_slice(&sum.to_be_bytes());
}

/// Recomputes the checksum of the 20-byte IPv4 header `ip` (RFC 791).
fn ipv4_checksum(ip: &mut [u8]) {
    ip[10..12].fill(0);
    // Sum16BitWords sums in the host's byte order: its result's bytes in
    // that order are the field's.
    let s = Sum16BitWords::new().add_slice(ip).ones_complement();
    ip[10..12].copy_from_slice(&s.to_ne_bytes());
}

/// The one's-complement sum of the UDP pseudo-header (RFC 768, RFC 8200
/// 8.1) of headers `h`, folded and not complemented, as the field's two
/// bytes: what a UDP checksum field holds for
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM` (the kernel adds the header and payload).
fn pseudo_sum(h: &[u8], l: Layout, udp_len: usize) -> [u8; 2] {
    let addrs = if l.v4 {
        &h[ETH_LEN + 12..ETH_LEN + 20]
    } else {
        &h[ETH_LEN + 8..ETH_LEN + 40]
    };
    let len = u32::try_from(udp_len).unwrap_or(u32::MAX).to_be_bytes();
    (!Sum16BitWords::new()
        .add_slice(addrs)
        .add_2bytes([0, IPPROTO_UDP])
        .add_slice(&len)
        .ones_complement())
    .to_ne_bytes()
}

/// Why a received frame was not handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadFrame {
    /// The virtio-net header asks for a segmentation other than UDP's, or
    /// the frame under it is not one UDP datagram over IPv4 or IPv6, or
    /// its `gso_size` is 0: counted in `LinkStats::rx_malformed`.
    Malformed,
}

/// The frames of one received frame under its virtio-net header: the frame
/// itself, or, for a super-frame (`VIRTIO_NET_HDR_GSO_UDP_L4`), each
/// `gso_size` bytes of its UDP payload under a copy of its headers with
/// that piece's lengths, IPv4 identification (the first's plus the
/// piece's index) and checksum, and a UDP checksum of zero over IPv4 (as
/// vrnic and rxe send; RoCEv2 receivers ignore it, IBTA A17.4.1) or
/// computed over IPv6 (mandatory there) — the frames the kernel's
/// segmentation would have made (but for IPv4's UDP checksum) and so the
/// frames the sender's engine built.
///
/// The headers go in place, over the end of the piece before, which the
/// caller is done with when it asks for the next ([`Segments::next`]):
/// no payload is copied.
#[derive(Debug, Clone)]
pub struct Segments {
    hdr: [u8; MAX_HDR_LEN],
    layout: Option<Layout>,
    gso: usize,
    len: usize,
    index: usize,
    /// Where the next piece's payload starts; `len` when done.
    pos: usize,
}

impl Segments {
    /// The frames of `frame` as received after virtio-net header `vnet`.
    ///
    /// # Errors
    /// [`BadFrame::Malformed`] for a header asking for another kind of
    /// segmentation, a `gso_size` below [`MIN_PIECE`], or a super-frame
    /// that is not one UDP datagram over IPv4 (no options) or IPv6 (no
    /// extension headers).
    pub fn new(vnet: &[u8; VNET_HDR_LEN], frame: &[u8]) -> Result<Segments, BadFrame> {
        let mut s = Segments {
            hdr: [0; MAX_HDR_LEN],
            layout: None,
            gso: 0,
            len: frame.len(),
            index: 0,
            pos: 0,
        };
        match u32::from(vnet[1]) {
            VIRTIO_NET_HDR_GSO_NONE => return Ok(s),
            VIRTIO_NET_HDR_GSO_UDP_L4 => {}
            _ => return Err(BadFrame::Malformed),
        }
        let l = Layout::of(frame).ok_or(BadFrame::Malformed)?;
        let gso = usize::from(u16::from_ne_bytes([vnet[4], vnet[5]]));
        if gso < MIN_PIECE {
            return Err(BadFrame::Malformed);
        }
        s.hdr[..l.hdr_len].copy_from_slice(&frame[..l.hdr_len]);
        s.layout = Some(l);
        s.gso = gso;
        s.pos = l.hdr_len;
        Ok(s)
    }

    /// Whether the frame is a super-frame (more than one piece, or one
    /// whose headers get rewritten).
    pub fn is_super(&self) -> bool {
        self.layout.is_some()
    }

    /// The next frame, as the range of `buf` (the received frame, the one
    /// given to [`Segments::new`], with the pieces before already handed
    /// out) that holds it after this call rewrote its headers there;
    /// `None` when all were handed out.
    pub fn next(&mut self, buf: &mut [u8]) -> Option<Range<usize>> {
        let Some(l) = self.layout else {
            // A plain frame: itself, once.
            if self.index > 0 {
                return None;
            }
            self.index = 1;
            return Some(0..self.len.min(buf.len()));
        };
        if self.pos >= self.len || self.len > buf.len() {
            return None;
        }
        let hl = l.hdr_len;
        let piece = self.gso.min(self.len - self.pos);
        let start = self.pos - hl;
        let h = &mut buf[start..self.pos];
        h.copy_from_slice(&self.hdr[..hl]);
        if l.v4 {
            let id = u16::from_be_bytes([h[ETH_LEN + 4], h[ETH_LEN + 5]])
                .wrapping_add(self.index as u16);
            h[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&id.to_be_bytes());
        }
        set_lengths(h, l, piece);
        let end = self.pos + piece;
        if !l.v4 {
            udp6_checksum(&mut buf[start..end]);
        }
        self.index += 1;
        self.pos = end;
        Some(start..end)
    }
}

#[cfg(test)]
/// A RoCEv2-shaped frame: IPv4 (id `id`) or IPv6, UDP to 4791 from
/// port `sport`, `payload` bytes after the UDP header filled from
/// `seed`; IPv4 and (over IPv6) UDP checksums right, UDP checksum zero
/// over IPv4.
pub(crate) fn test_frame(v4: bool, id: u16, sport: u16, payload: usize, seed: u8) -> Vec<u8> {
    let l = Layout {
        v4,
        hdr_len: if v4 { 42 } else { 62 },
    };
    let mut f = vec![0u8; l.hdr_len + payload];
    f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
    if v4 {
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14..34].copy_from_slice(&[
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ]);
        f[18..20].copy_from_slice(&id.to_be_bytes());
    } else {
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[20] = 17;
        f[21] = 64;
        f[22..38].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f[38..54].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    }
    let u = l.hdr_len - 8;
    f[u..u + 2].copy_from_slice(&sport.to_be_bytes());
    f[u + 2..u + 4].copy_from_slice(&4791u16.to_be_bytes());
    for (i, b) in f[l.hdr_len..].iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
    set_lengths(&mut f[..l.hdr_len], l, payload);
    if !v4 {
        udp6_checksum(&mut f);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(v4: bool, id: u16, sport: u16, payload: usize, seed: u8) -> Vec<u8> {
        test_frame(v4, id, sport, payload, seed)
    }

    /// An independent one's-complement sum of big-endian 16-bit words
    /// (RFC 1071), for the tests' expectations.
    fn sum16(b: &[u8], mut s: u32) -> u32 {
        for c in b.chunks(2) {
            s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        s
    }

    fn fold(mut s: u32) -> u16 {
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// What the kernel receives and hands on whole: the super-frame of
    /// `run` in one buffer, its virtio-net header apart.
    fn super_frame(run: &[Vec<u8>]) -> ([u8; VNET_HDR_LEN], Vec<u8>) {
        let mut h = [0; VNET_HDR_LEN + MAX_HDR_LEN];
        let n = super_header(run, &mut h);
        let off = payload_offset(run);
        let mut f = h[VNET_HDR_LEN..n].to_vec();
        for r in run {
            f.extend_from_slice(&r[off..]);
        }
        (h[..VNET_HDR_LEN].try_into().unwrap(), f)
    }

    fn split(vnet: &[u8; VNET_HDR_LEN], mut f: Vec<u8>) -> Vec<Vec<u8>> {
        let mut s = Segments::new(vnet, &f).unwrap();
        let mut out = Vec::new();
        for _ in 0..=MAX_SEGMENTS {
            let Some(r) = s.next(&mut f) else { break };
            out.push(f[r].to_vec());
        }
        out
    }

    #[test]
    fn a_run_of_one_flow_goes_as_one_super_frame_and_comes_back_frame_for_frame() {
        for v4 in [true, false] {
            // A WRITE's shape: a longer first packet (RETH), middles, a
            // shorter last: the first alone, then one run of the rest.
            let mut frames = vec![frame(v4, 7, 0xc000, 1040, 0)];
            frames.extend((1..16).map(|i| frame(v4, 7 + i, 0xc000, 1024, i as u8)));
            frames.push(frame(v4, 23, 0xc000, 100, 99));
            frames.push(frame(v4, 24, 0xc000, 1024, 1));
            assert_eq!(run_len(&frames), 1, "a longer first packet goes alone");
            let n = run_len(&frames[1..]);
            assert_eq!(n, 16, "the middles and the shorter last one");
            let run = &frames[1..1 + n];
            let (vnet, f) = super_frame(run);
            assert_eq!(vnet[1] as u32, VIRTIO_NET_HDR_GSO_UDP_L4);
            assert_eq!(u16::from_ne_bytes([vnet[4], vnet[5]]), 1024);
            assert_eq!(
                f.len(),
                run.iter().map(|r| r.len() - run_len_hdr(v4)).sum::<usize>() + run_len_hdr(v4)
            );
            assert_eq!(split(&vnet, f), run, "every frame rebuilt byte for byte");
            // The last one starts a run of its own.
            assert_eq!(run_len(&frames[17..]), 1);
        }
    }

    fn run_len_hdr(v4: bool) -> usize {
        if v4 {
            42
        } else {
            62
        }
    }

    #[test]
    fn the_super_frame_has_whole_lengths_and_the_pseudo_header_sum() {
        let run: Vec<_> = (0..3).map(|i| frame(true, 0x100 + i, 1, 1000, 0)).collect();
        let (vnet, f) = super_frame(&run);
        assert_eq!(vnet, {
            let mut v = [1u8, 5, 0, 0, 0, 0, 0, 0, 0, 0];
            v[2..4].copy_from_slice(&42u16.to_ne_bytes());
            v[4..6].copy_from_slice(&1000u16.to_ne_bytes());
            v[6..8].copy_from_slice(&34u16.to_ne_bytes());
            v[8..10].copy_from_slice(&6u16.to_ne_bytes());
            v
        });
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 20 + 8 + 3000);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 8 + 3000);
        assert_eq!(fold(sum16(&f[14..34], 0)), 0xffff, "IPv4 checksum holds");
        // Pseudo-header: addresses, protocol 17, UDP length 3008.
        let want = fold(sum16(&f[26..34], 0) + 17 + 3008);
        assert_eq!(u16::from_be_bytes([f[40], f[41]]), want);
    }

    #[test]
    fn runs_stop_where_the_kernel_would_cut_differently() {
        let base = |i: u16| frame(true, 10 + i, 5, 512, 0);
        let mut other_flow = base(1);
        other_flow[41 - 8] ^= 1; // UDP source port
        let mut other_mac = base(1);
        other_mac[0] ^= 1;
        let mut other_ttl = base(1);
        other_ttl[22] = 1;
        ipv4_checksum(&mut other_ttl[14..34]);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("another UDP source port", other_flow),
            ("another destination MAC", other_mac),
            ("another TTL", other_ttl),
            ("an identification not one up", base(2)),
            ("a longer payload", frame(true, 11, 5, 600, 0)),
            ("IPv6", frame(false, 0, 5, 512, 0)),
            ("an empty payload", frame(true, 11, 5, 0, 0)),
        ];
        for (what, second) in cases {
            assert_eq!(run_len(&[base(0), second, base(2)]), 1, "{what}");
        }
        assert_eq!(run_len(&[base(0), base(1), base(2)]), 3);
        assert_eq!(run_len::<Vec<u8>>(&[]), 0);
        // Not UDP over IP: alone, and sent as it is.
        let arp = vec![0xffu8; 60];
        assert_eq!(run_len(&[arp.clone(), arp.clone()]), 1);
        assert_eq!(payload_offset(std::slice::from_ref(&arp)), 0);
        // Segment and size limits.
        let many: Vec<_> = (0..100).map(base).collect();
        assert_eq!(run_len(&many), MAX_SEGMENTS);
        let big: Vec<_> = (0..20).map(|i| frame(true, i, 5, 4096, 0)).collect();
        assert_eq!(
            run_len(&big),
            15,
            "15 x 4096 bytes fit the 16-bit IP length, 16 do not"
        );
    }

    #[test]
    fn a_wrapping_identification_continues_through_zero() {
        let run: Vec<_> = (0..4)
            .map(|i| frame(true, 0xfffe_u16.wrapping_add(i), 1, 64, 0))
            .collect();
        assert_eq!(run_len(&run), 4);
        let (vnet, f) = super_frame(&run);
        assert_eq!(split(&vnet, f), run);
    }

    #[test]
    fn plain_frames_pass_and_bad_super_frames_are_refused() {
        let plain = [0u8; VNET_HDR_LEN];
        let f = frame(true, 1, 1, 100, 3);
        assert_eq!(split(&plain, f.clone()), vec![f.clone()]);
        let mut tcp = [0u8; VNET_HDR_LEN];
        tcp[1] = 1; // VIRTIO_NET_HDR_GSO_TCPV4
        assert_eq!(Segments::new(&tcp, &f).unwrap_err(), BadFrame::Malformed);
        let mut udp = [0u8; VNET_HDR_LEN];
        udp[1] = VIRTIO_NET_HDR_GSO_UDP_L4 as u8;
        assert_eq!(
            Segments::new(&udp, &f).unwrap_err(),
            BadFrame::Malformed,
            "gso_size 0"
        );
        udp[4..6].copy_from_slice(&15u16.to_ne_bytes());
        assert_eq!(
            Segments::new(&udp, &f).unwrap_err(),
            BadFrame::Malformed,
            "pieces smaller than a BTH and an ICRC"
        );
        udp[4..6].copy_from_slice(&16u16.to_ne_bytes());
        assert!(Segments::new(&udp, &[0u8; 30]).is_err(), "too short");
        let mut lying = f.clone();
        lying[17] ^= 1; // IP length no longer the frame's
        assert!(Segments::new(&udp, &lying).is_err());
        // The smallest gso_size over a real frame: 6 pieces of 16 bytes and
        // one of 4, headers laid over the pieces before, none out of bounds.
        let mut s = Segments::new(&udp, &f).unwrap();
        let mut buf = f.clone();
        let mut pieces = Vec::new();
        while let Some(r) = s.next(&mut buf) {
            assert!(pieces.len() <= 100);
            pieces.push(r.len() - 42);
        }
        assert_eq!(pieces.iter().sum::<usize>(), 100);
        assert_eq!(pieces.len(), 7);
        // A buffer shorter than the frame it was made from: nothing.
        let mut s = Segments::new(&udp, &f).unwrap();
        assert_eq!(s.next(&mut buf[..50]), None);
    }

    mod props {
        use proptest::prelude::*;

        use super::*;
        use crate::wire::samples::sample_headers;
        use crate::wire::{emit_frame, parse_roce_with, Icrc, Opcode};

        /// The engine's frames of one RDMA WRITE of `len` bytes at path
        /// MTU `mtu`: FIRST (with its RETH) .. LAST, or ONLY; PSNs and
        /// IPv4 identifications counting up from `id`.
        fn write_frames(v6: bool, mtu: usize, len: usize, id: u16, seed: u8) -> Vec<Vec<u8>> {
            let n = len.div_ceil(mtu).max(1);
            (0..n)
                .map(|i| {
                    let op = match (i, n) {
                        (_, 1) => Opcode::RcWriteOnly,
                        (0, _) => Opcode::RcWriteFirst,
                        (i, n) if i + 1 == n => Opcode::RcWriteLast,
                        _ => Opcode::RcWriteMiddle,
                    };
                    let mut h = sample_headers(op, v6);
                    if !v6 {
                        h.ip_id = id.wrapping_add(i as u16);
                    }
                    h.bth.psn = (h.bth.psn + i as u32) & 0xff_ffff;
                    let piece = mtu.min(len - (i * mtu).min(len));
                    h.bth.pad_count = ((4 - piece % 4) % 4) as u8;
                    let payload: Vec<u8> = (0..piece)
                        .map(|k| seed.wrapping_add((i * 7 + k) as u8))
                        .collect();
                    let mut f = Vec::new();
                    emit_frame(&h, &payload, &mut f);
                    f
                })
                .collect()
        }

        proptest! {
            /// The engine's frames of a message, sent run by run as
            /// super-frames and cut back, come back byte for byte, each
            /// with its ICRC holding.
            #[test]
            fn a_message_through_super_frames_comes_back_as_its_frames(
                v6: bool,
                mtu in prop::sample::select(vec![256usize, 1024, 4096]),
                len in 0usize..70_000,
                id: u16,
                seed: u8,
            ) {
                let frames = write_frames(v6, mtu, len, id, seed);
                let mut i = 0;
                let mut supers = 0;
                while i < frames.len() {
                    let n = run_len(&frames[i..]);
                    prop_assert!(n >= 1);
                    let run = &frames[i..i + n];
                    let (vnet, f) = super_frame(run);
                    let back = split(&vnet, f);
                    prop_assert_eq!(&back[..], run);
                    for b in &back {
                        prop_assert!(parse_roce_with(b, Icrc::Needed).is_ok());
                    }
                    supers += 1;
                    i += n;
                }
                // A WRITE of more than two packets: its FIRST alone, the
                // rest in runs of up to 64 (within 64 KiB).
                let per_run = MAX_SEGMENTS.min(65_000 / (mtu + 100));
                if frames.len() > 2 {
                    prop_assert!(supers <= 1 + (frames.len() - 1).div_ceil(per_run));
                }
            }

            /// Whatever the header and frame, cutting never panics, stays
            /// in the buffer and ends.
            #[test]
            fn any_header_and_frame_are_cut_safely(
                vnet: [u8; VNET_HDR_LEN],
                gso_type in prop::sample::select(vec![0u8, 1, 3, 4, 5, 0x80]),
                mut frame in prop::collection::vec(any::<u8>(), 0..3000),
                v4_udp: bool,
            ) {
                let mut vnet = vnet;
                vnet[1] = gso_type;
                if v4_udp && frame.len() >= 42 {
                    // Often a plausible UDP/IPv4 frame, so cutting happens.
                    frame[12..14].copy_from_slice(&[0x08, 0x00]);
                    frame[14] = 0x45;
                    frame[23] = 17;
                    frame[20] &= 0x80;
                    frame[21] = 0;
                    let l = frame.len() - 14;
                    frame[16..18].copy_from_slice(&(l as u16).to_be_bytes());
                    frame[38..40].copy_from_slice(&((l - 20) as u16).to_be_bytes());
                }
                if let Ok(mut s) = Segments::new(&vnet, &frame) {
                    let len = frame.len();
                    let mut total = 0;
                    for _ in 0..=len + 1 {
                        let Some(r) = s.next(&mut frame) else { break };
                        prop_assert!(r.end <= len);
                        total += 1;
                    }
                    prop_assert!(total <= len + 1);
                    prop_assert!(s.next(&mut frame).is_none());
                }
                let frames = [frame.clone(), frame];
                let n = run_len(&frames);
                prop_assert!((1..=2).contains(&n));
                let mut h = [0; VNET_HDR_LEN + MAX_HDR_LEN];
                prop_assert!(super_header(&frames[..n], &mut h) <= h.len());
            }
        }
    }
}
