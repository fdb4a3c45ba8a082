//! Batches: several RoCEv2 packets of one flow in one frame, between the
//! functions of one daemon (Linux's "generic segmentation offload", with
//! each packet's InfiniBand headers kept, as in UDP GRO's fraglist).
//!
//! A frame that never leaves the process ([`Icrc::Unneeded`]) need not be
//! one packet: a batch hands a burst over (a 64 KiB WRITE is 16 packets
//! at path MTU 4096) with one queue hand-off and one wake-up instead of
//! one per packet, and the receiver still handles every packet on its
//! own, with all its checks, in order. Nothing about the transport
//! changes: PSNs, ACKs, NAKs and counters are per packet as on a wire.
//!
//! Layout: the first packet is a whole RoCEv2 frame emitted without its
//! ICRC ([`emit_frame_icrc`]), whose ICRC field holds
//! [`BATCH_MAGIC`]; after the end its IP length gives, each further packet
//! is its length in bytes (15 bits, big-endian) and its InfiniBand part:
//! BTH, extension headers, payload and pad, without an ICRC — or, with the
//! length's top bit set (14 bits of length), BTH, extension headers and
//! the payload's pieces of the sender's guest memory ([`crate::data`]):
//! the receiver copies them straight from there ("by reference") — or,
//! with its top two bits set, a run of packets of one message by
//! reference ([`Run`], [`append_run`]): packet count and stride (16 bits
//! each), the first and the last packet's BTH and extension headers, the
//! pieces of all their payload. Its
//! Ethernet, IP and UDP headers are the first packet's (the same flow,
//! [`same_flow`]), its IPv4 identification the first's plus its index
//! (a run counting as its packets).
//!
//! A batch is only ever made for a destination that is local
//! ([`crate::link::LinkCaps::local_macs`]) and only read as one when it came
//! [`Icrc::Unneeded`]; a copy that leaves the process (a pcap record, a
//! frame that finds its destination gone and takes the uplink) is
//! [`split`] into sealed frames first. RC and UC only: a UD packet's
//! receiver needs its own IP header (the GRH of its completion).

use super::{Packet, Run};
use crate::data::PeerMemory;
use crate::wire::{
    emit_frame_icrc, emit_frame_open, emit_run_peer, emit_segment, emit_segment_peer, pad_len,
    parse_ib, parse_ib_headers, parse_run_parts, seal_icrc, Aeth, Bth, Icrc, RoceHeaders,
    WireError, ICRC_LEN,
};
pub use crate::wire::{PEER_SEGMENT_MAX, SEGMENT_MAX};

/// The ICRC field of a batch's first packet ("VRBA"): frames with their
/// ICRC unneeded carry zero there.
pub const BATCH_MAGIC: u32 = 0x5652_4241;
/// Largest batch, bytes: a 64 KiB message at path MTU 4096 (16 packets)
/// and their headers fit.
pub const BATCH_MAX_BYTES: usize = 80 * 1024;
/// Most packets a batch stands for with runs ([`Run`]) in it, whose
/// payloads stay in the sender's memory: 64, one requester burst
/// (`crate::transport::requester`), 256 KiB at path MTU 4096 — the
/// receiver's work for one frame stays bounded, and a 64 KiB message
/// costs a quarter of a batch, not half.
pub const BATCH_MAX_PSNS: usize = 64;

const ETH_LEN: usize = 14;
const UDP_LEN: usize = 8;

/// Where the first packet of `frame` ends: the end its IP length gives,
/// if `frame` is IPv4 or IPv6 and that long.
fn first_end(frame: &[u8]) -> Option<usize> {
    let be16 = |o: usize| -> Option<usize> {
        Some(usize::from(u16::from_be_bytes(
            frame.get(o..o + 2)?.try_into().ok()?,
        )))
    };
    let end = match frame.get(12..14)? {
        [0x08, 0x00] => ETH_LEN + be16(ETH_LEN + 2)?,
        [0x86, 0xdd] => ETH_LEN + 40 + be16(ETH_LEN + 4)?,
        _ => return None,
    };
    (end >= ETH_LEN + ICRC_LEN && end <= frame.len()).then_some(end)
}

/// True when `frame` is a batch: its first packet's ICRC field holds
/// [`BATCH_MAGIC`] and packets follow it. Only meaningful for a frame that
/// came [`Icrc::Unneeded`].
pub fn is_batch(frame: &[u8]) -> bool {
    first_end(frame).is_some_and(|end| {
        end < frame.len() && frame[end - ICRC_LEN..end] == BATCH_MAGIC.to_be_bytes()
    })
}

/// True when packets with headers `a` and `b` may share a batch: the same
/// Ethernet, IP and UDP headers but for length and identification.
pub fn same_flow(a: &RoceHeaders, b: &RoceHeaders) -> bool {
    a.eth_dst == b.eth_dst
        && a.eth_src == b.eth_src
        && a.ip_src == b.ip_src
        && a.ip_dst == b.ip_dst
        && a.ttl == b.ttl
        && a.tclass == b.tclass
        && a.flow_label == b.flow_label
        && a.udp_src == b.udp_src
}

/// Starts a batch in `frame`: emits the packet with headers `hdr` and the
/// `payload_len` bytes `fill` writes as a frame without its ICRC, over
/// the buffer's old bytes, and returns where it ends. The bytes after
/// that are left (later packets go over them, [`append`]): the caller
/// cuts `frame` at the end the last call returned before it sends it.
pub fn start<E>(
    frame: &mut Vec<u8>,
    hdr: &RoceHeaders,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, E> {
    emit_frame_open(hdr, payload_len, frame, fill)
}

/// Appends the packet with headers `hdr` (of the first packet's flow,
/// [`same_flow`]) and the `payload_len` bytes `fill` writes at `end` of
/// `frame`, a batch [`start`] made, marking it a batch; returns the new
/// end (bytes after it left as they were). When `fill` fails, the batch
/// still ends at `end` and the error is returned. The caller keeps within
/// [`BATCH_MAX_BYTES`] and [`super::BATCH_MAX_PACKETS`].
pub fn append<E>(
    frame: &mut Vec<u8>,
    end: usize,
    hdr: &RoceHeaders,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
) -> Result<usize, E> {
    let new_end = emit_segment(hdr, payload_len, frame, end, fill)?;
    mark(frame);
    Ok(new_end)
}

/// [`append`] of a packet whose `payload_len` bytes stay in the sending
/// device's memory: `pieces` appends their piece entries
/// ([`crate::data::push_piece`]); the receiver copies from there
/// ([`rest`] with that memory). Only for a destination that reads the
/// sender's memory (`LinkCaps::local_macs`). `Ok(None)` (the batch unchanged)
/// when the entry would be longer than [`PEER_SEGMENT_MAX`].
pub fn append_peer<E>(
    frame: &mut Vec<u8>,
    end: usize,
    hdr: &RoceHeaders,
    payload_len: usize,
    pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<Option<usize>, E> {
    let new_end = emit_segment_peer(hdr, payload_len, frame, end, pieces)?;
    if new_end.is_some() {
        mark(frame);
    }
    Ok(new_end)
}

/// [`append_peer`] of a run ([`Run`]): `count` packets of one message
/// from the one with headers `first` to the one with headers `last`, every
/// one but the last `stride` bytes, `total` bytes in all, whose piece
/// entries `pieces` appends. The caller keeps to what [`Run::new`]
/// accepts and counts the run as `count` packets against
/// [`BATCH_MAX_PSNS`]. `Ok(None)` (the batch unchanged) when the entry
/// would be longer than [`PEER_SEGMENT_MAX`].
#[allow(clippy::too_many_arguments)]
pub fn append_run<E>(
    frame: &mut Vec<u8>,
    end: usize,
    first: &RoceHeaders,
    last: &RoceHeaders,
    count: u16,
    stride: u16,
    total: usize,
    pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<Option<usize>, E> {
    let new_end = emit_run_peer(first, last, count, stride, total, frame, end, pieces)?;
    if new_end.is_some() {
        mark(frame);
    }
    Ok(new_end)
}

/// Writes the BTH and AETH of `hdr`, a plain ACK, over those of the ACK
/// at `at` of the batch `frame` (0: its first packet, else where [`append`]
/// put it), leaving every other byte as it was: the same packet with a
/// later PSN and MSN, without emitting its Ethernet, IP and UDP headers
/// again (a batch carries no ICRC, and over IPv6 no UDP checksum, that
/// would cover them). False, and `frame` unchanged, when `hdr` has no AETH or the
/// packet there is not an ACK's length.
pub fn rewrite_ack(frame: &mut [u8], at: usize, hdr: &RoceHeaders) -> bool {
    const ACK_LEN: usize = Bth::LEN + Aeth::LEN;
    let Some(aeth) = hdr.aeth else {
        return false;
    };
    let bth_at = if at == 0 {
        let ip_len = match frame.get(12..15) {
            Some([0x08, 0x00, v]) => usize::from(v & 0x0f) * 4,
            Some([0x86, 0xdd, _]) => 40,
            _ => return false,
        };
        // The first packet's UDP payload is BTH, AETH and the ICRC field.
        if first_end(frame) != Some(ETH_LEN + ip_len + UDP_LEN + ACK_LEN + ICRC_LEN) {
            return false;
        }
        ETH_LEN + ip_len + UDP_LEN
    } else {
        // A packet after the first: its 16-bit length, then BTH and AETH.
        match frame.get(at..at + 2) {
            Some(l) if usize::from(u16::from_be_bytes([l[0], l[1]])) == ACK_LEN => at + 2,
            _ => return false,
        }
    };
    let Some(b) = frame.get_mut(bth_at..bth_at + ACK_LEN) else {
        return false;
    };
    Bth {
        pad_count: 0,
        ..hdr.bth
    }
    .emit(&mut b[..Bth::LEN]);
    aeth.emit(&mut b[Bth::LEN..]);
    true
}

/// Marks `frame`, a frame with packets appended, as a batch: its first
/// packet's ICRC field gets [`BATCH_MAGIC`].
fn mark(frame: &mut [u8]) {
    if let Some(first) = first_end(frame) {
        frame[first - ICRC_LEN..first].copy_from_slice(&BATCH_MAGIC.to_be_bytes());
    }
}

/// What a batch holds after its first packet ([`rest`]).
// Boxing the run would be an allocation per message; both live on the
// stack for one step.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Segment<'a> {
    /// One packet.
    Packet(Packet<'a>),
    /// Several packets of one message ([`Run`]).
    Run(Run<'a>),
}

/// The packets and runs of the batch `frame` after its first packet,
/// whose headers are `first` (as [`crate::wire::parse_roce_with`] gave them), in
/// order. Each is parsed like a frame's InfiniBand part (its errors); a
/// packet by reference or a run needs `peer`, the sending device's memory
/// (without it, or with entries that are not whole, it is an error), and a
/// run must be one [`Run::new`] accepts; the iteration ends at the first
/// error. Empty when `frame` is not a batch.
pub fn rest<'a>(
    frame: &'a [u8],
    first: &RoceHeaders,
    peer: Option<&'a dyn PeerMemory>,
) -> Rest<'a> {
    let tail = match first_end(frame) {
        Some(end) if is_batch(frame) => &frame[end..],
        _ => &[],
    };
    Rest {
        tail,
        peer,
        base: first.clone(),
    }
}

/// Iterator of [`rest`].
pub struct Rest<'a> {
    tail: &'a [u8],
    peer: Option<&'a dyn PeerMemory>,
    base: RoceHeaders,
}

impl std::fmt::Debug for Rest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rest")
            .field("tail", &self.tail.len())
            .field("peer", &self.peer.is_some())
            .finish()
    }
}

impl<'a> Iterator for Rest<'a> {
    type Item = Result<Segment<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        let tail = std::mem::take(&mut self.tail);
        let (len, after) = match tail {
            [] => return None,
            [a, b, after @ ..] => (u16::from_be_bytes([*a, *b]), after),
            _ => return Some(Err(WireError::Truncated)),
        };
        let (by_ref, run) = (len & 0x8000 != 0, len & 0xc000 == 0xc000);
        let len = usize::from(len & if by_ref { 0x3fff } else { 0x7fff });
        let Some((seg, more)) = after.split_at_checked(len) else {
            return Some(Err(WireError::Truncated));
        };
        self.base.ip_id = self.base.ip_id.wrapping_add(1);
        let base = &self.base;
        let with = |bth| base.of_flow(bth);
        let got = match (by_ref, run, self.peer) {
            (false, _, _) => parse_ib(seg, with).map(|p| Segment::Packet(p.into())),
            (true, false, Some(mem)) => parse_ib_peer(seg, mem, with).map(Segment::Packet),
            (true, true, Some(mem)) => parse_run(seg, mem, with).map(Segment::Run),
            (true, _, None) => Err(WireError::BadLength),
        };
        if let Ok(Segment::Run(r)) = &got {
            // The packets after the first of a run.
            self.base.ip_id = self.base.ip_id.wrapping_add(r.count as u16 - 1);
        }
        if got.is_ok() {
            self.tail = more;
        }
        Some(got)
    }
}

/// [`parse_ib`] for a packet whose payload is in the sending device's
/// memory `mem`: after the headers, `ib` holds the payload's piece
/// entries ([`crate::data::PIECE_LEN`] bytes each), and the BTH's pad
/// count is the one of the payload's length. Errors as [`parse_ib`]'s,
/// and [`WireError::BadLength`] for entries that are not whole.
fn parse_ib_peer<'a>(
    ib: &'a [u8],
    mem: &'a dyn PeerMemory,
    base: impl FnOnce(Bth) -> RoceHeaders,
) -> Result<Packet<'a>, WireError> {
    let (hdr, hdr_len) = parse_ib_headers(ib, base)?;
    let op = hdr.bth.opcode;
    let data = crate::data::PeerData::new(mem, &ib[hdr_len..]).ok_or(WireError::BadLength)?;
    let len = crate::data::Data::Peer(data).len();
    if !op.has_payload() && len != 0 {
        return Err(WireError::BadLength);
    }
    if usize::from(hdr.bth.pad_count) != pad_len(len) {
        return Err(WireError::BadPadCount);
    }
    Ok(Packet {
        hdr,
        payload: &[],
        peer: Some(data),
    })
}

/// A run's segment ([`emit_run_peer`]) whose payload is in `mem`.
fn parse_run<'a>(
    seg: &'a [u8],
    mem: &'a dyn PeerMemory,
    base: impl Fn(Bth) -> RoceHeaders,
) -> Result<Run<'a>, WireError> {
    let (count, stride, first, last, pieces) = parse_run_parts(seg, base)?;
    let data = crate::data::PeerData::new(mem, pieces).ok_or(WireError::BadLength)?;
    let first = Packet {
        hdr: first,
        payload: &[],
        peer: Some(data),
    };
    Run::new(first, last, u32::from(count), usize::from(stride))
}

/// Hands each packet of `frame` to `each` as a frame of its own with its
/// ICRC, in order, built in `scratch`; a frame that is not a batch is
/// handed over once, sealed if it is RoCEv2 (what leaves the process has
/// its ICRC, [`seal_icrc`]). Stops at a packet that does not parse, and
/// at a packet by reference (its bytes are not at hand: RC retransmits
/// it).
pub fn split(frame: &[u8], scratch: &mut Vec<u8>, mut each: impl FnMut(&[u8])) {
    let end = match first_end(frame) {
        Some(end) if is_batch(frame) => end,
        _ => frame.len(),
    };
    scratch.clear();
    scratch.extend_from_slice(&frame[..end]);
    let first = match crate::wire::parse_roce_with(scratch, Icrc::Unneeded) {
        Ok(p) => Some(p.hdr),
        Err(_) => None,
    };
    // Not RoCEv2 (ARP, neighbour discovery): nothing to seal.
    let _ = seal_icrc(scratch);
    each(scratch);
    let Some(first) = first.filter(|_| end < frame.len()) else {
        return;
    };
    for seg in rest(frame, &first, None) {
        let Ok(Segment::Packet(pkt)) = seg else {
            return;
        };
        let copy = |b: &mut [u8]| {
            b.copy_from_slice(pkt.payload);
            Ok::<(), std::convert::Infallible>(())
        };
        let Ok(()) = emit_frame_icrc(&pkt.hdr, pkt.payload.len(), scratch, Icrc::Needed, copy);
        each(scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::samples::sample_headers;
    use crate::wire::{emit_frame, parse_roce, parse_roce_with, Opcode};

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    fn copy(data: &[u8]) -> impl FnOnce(&mut [u8]) -> Result<(), ()> + '_ {
        |b: &mut [u8]| {
            b.copy_from_slice(data);
            Ok(())
        }
    }

    /// A WRITE of 3 packets and an ACK-requesting SEND behind it, as one
    /// batch over the buffer `buf`; the headers and payloads of its packets.
    fn batch(v6: bool, mut buf: Vec<u8>) -> (Vec<u8>, Vec<(RoceHeaders, Vec<u8>)>) {
        let ops = [
            (Opcode::RcWriteFirst, 4096),
            (Opcode::RcWriteMiddle, 4096),
            (Opcode::RcWriteLast, 1001),
            (Opcode::RcSendOnlyImm, 7),
        ];
        let mut want = Vec::new();
        let mut end = 0;
        for (k, (op, len)) in ops.into_iter().enumerate() {
            let mut h = sample_headers(op, v6);
            h.bth.psn += k as u32;
            h.ip_id = h.ip_id.wrapping_add(k as u16);
            let data = bytes(len, k as u8);
            end = if k == 0 {
                start(&mut buf, &h, len, copy(&data)).unwrap()
            } else {
                append(&mut buf, end, &h, len, copy(&data)).unwrap()
            };
            want.push((h, data));
        }
        buf.truncate(end);
        (buf, want)
    }

    #[test]
    fn a_batch_reads_back_packet_by_packet_and_splits_into_the_frames_a_wire_carries() {
        for v6 in [false, true] {
            // Over a fresh buffer and over an old, longer one full of junk.
            for old in [Vec::new(), vec![0xee; 3 * BATCH_MAX_BYTES]] {
                let (frame, want) = batch(v6, old);
                assert!(is_batch(&frame));
                let first = parse_roce_with(&frame, Icrc::Unneeded).unwrap();
                assert_eq!((&first.hdr, first.payload), (&want[0].0, &want[0].1[..]));
                let got: Vec<_> = rest(&frame, &first.hdr, None)
                    .map(|s| match s.unwrap() {
                        Segment::Packet(p) => p,
                        Segment::Run(r) => panic!("no runs here: {r:?}"),
                    })
                    .collect();
                assert_eq!(got.len(), 3, "v6 {v6}");
                for (p, (h, data)) in got.iter().zip(&want[1..]) {
                    let h = RoceHeaders {
                        bth: crate::wire::Bth {
                            pad_count: p.hdr.bth.pad_count,
                            ..h.bth
                        },
                        ..h.clone()
                    };
                    assert_eq!((&p.hdr, p.payload), (&h, &data[..]), "v6 {v6}");
                }
                let mut frames = Vec::new();
                split(&frame, &mut Vec::new(), |f| frames.push(f.to_vec()));
                let wire: Vec<_> = want
                    .iter()
                    .map(|(h, data)| {
                        let mut f = Vec::new();
                        emit_frame(h, data, &mut f);
                        f
                    })
                    .collect();
                assert_eq!(frames, wire, "split = what emit_frame makes (v6 {v6})");
                assert!(frames.iter().all(|f| parse_roce(f).is_ok()));
            }
        }
    }

    #[test]
    fn plain_frames_are_not_batches() {
        let h = sample_headers(Opcode::RcSendOnly, false);
        let mut bare = Vec::new();
        emit_frame_icrc(&h, 100, &mut bare, Icrc::Unneeded, copy(&bytes(100, 1))).unwrap();
        let mut sealed = Vec::new();
        emit_frame(&h, &bytes(100, 1), &mut sealed);
        // A first packet alone, one with Ethernet padding after it, one
        // with the magic but nothing after it.
        let mut padded = bare.clone();
        padded.extend_from_slice(&[0; 8]);
        let mut magic_alone = bare.clone();
        let n = magic_alone.len();
        magic_alone[n - 4..].copy_from_slice(&BATCH_MAGIC.to_be_bytes());
        for f in [&bare, &sealed, &padded, &magic_alone] {
            assert!(!is_batch(f));
            let p = parse_roce_with(f, Icrc::Unneeded).unwrap();
            assert_eq!(rest(f, &p.hdr, None).count(), 0);
            let mut out = Vec::new();
            split(f, &mut out, |_| {});
        }
        let mut frames = Vec::new();
        split(&bare, &mut Vec::new(), |f| frames.push(f.to_vec()));
        assert_eq!(frames, vec![sealed], "a plain frame is sealed, once");
    }

    #[test]
    fn a_damaged_batch_ends_with_an_error_and_never_panics() {
        let (frame, _) = batch(false, Vec::new());
        let first = parse_roce_with(&frame, Icrc::Unneeded).unwrap().hdr;
        // Every cut: the whole packets before the cut, then at most one
        // error, and it is last.
        for cut in 0..frame.len() {
            let f = &frame[..cut];
            let got: Vec<_> = rest(f, &first, None).collect();
            assert!(
                got.len() <= 3 && got.iter().rev().skip(1).all(Result::is_ok),
                "cut {cut}"
            );
            split(f, &mut Vec::new(), |_| {});
        }
        // A length past the end, and one too short for a BTH.
        let end = first_end(&frame).unwrap();
        for len in [u16::MAX, 3] {
            let mut f = frame.clone();
            f[end..end + 2].copy_from_slice(&len.to_be_bytes());
            let got: Vec<_> = rest(&f, &first, None).collect();
            assert_eq!(got.len(), 1);
            assert!(got[0].is_err());
        }
    }
}
