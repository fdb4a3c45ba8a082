//! Runs: consecutive packets of one SEND, RDMA WRITE or RDMA READ
//! response message carried as one entry of a batch ([`super::gso`]),
//! their payload by reference.
//!
//! Between two functions of one daemon the payload of a message need not
//! be cut into path-MTU packets at all: the receiver copies it straight
//! from the sender's memory ([`crate::data`]). A run stands for `count`
//! packets of one message — every one but the last `stride` bytes (the
//! sender's path MTU), the last the rest — by the headers of its first and
//! last packets; the packets between are MIDDLE packets with the first's
//! BTH fields and consecutive PSNs, no acknowledgement request and no
//! extension header.
//!
//! It is exactly those packets ([`Run::packets`]); a receiver that takes
//! it whole ([`Run::message`]: one check, one copy, one acknowledgement)
//! must end where handling its packets in order would. Nothing else
//! changes: PSNs, ACKs and counters are per packet as on a wire.

use super::{Packet, RUN_MAX_PACKETS};
use crate::wire::{Bth, Opcode, RoceHeaders, Transport, WireError};

/// Packets `first.bth.psn ..= last.bth.psn` of one message, as a batch
/// carries them ([`super::gso::append_run`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Run<'a> {
    /// The first packet's headers (a FIRST or MIDDLE; a WRITE's FIRST with
    /// its RETH, a READ response's FIRST with its AETH), with the payload
    /// of the whole run.
    pub first: Packet<'a>,
    /// The last packet's headers (a MIDDLE or LAST of the same kind, with
    /// its ImmDt, IETH or AETH and its acknowledgement request and
    /// solicited event bits).
    pub last: RoceHeaders,
    /// Packets, 2 ..= [`RUN_MAX_PACKETS`].
    pub count: u32,
    /// Payload of every packet but the last, bytes; a multiple of 4.
    pub stride: usize,
}

/// PSN `p` plus `n`, 24 bits (IBTA 9.7.1).
fn psn_add(p: u32, n: u32) -> u32 {
    p.wrapping_add(n) & 0x00ff_ffff
}

impl<'a> Run<'a> {
    /// The run of `count` packets from `first` (with the run's payload) to
    /// `last`, every one but the last `stride` bytes. Errors
    /// ([`WireError::BadLength`]) unless: 2 ≤ `count` ≤ [`RUN_MAX_PACKETS`];
    /// `stride` a positive multiple of 4; the payload longer than
    /// `(count - 1) * stride` and at most `count * stride` bytes; `first` a
    /// FIRST or MIDDLE and `last` a MIDDLE or LAST of the same RC or UC
    /// SEND or WRITE, or RC READ response; `last`'s PSN `count - 1` after
    /// `first`'s; the two
    /// BTHs alike but for opcode, PSN, acknowledgement request, solicited
    /// event and pad count; `first` without pad, `last` with its
    /// payload's.
    pub fn new(
        first: Packet<'a>,
        last: RoceHeaders,
        count: u32,
        stride: usize,
    ) -> Result<Self, WireError> {
        let bad = WireError::BadLength;
        let total = first.payload_len();
        let before_last = usize::try_from(count.saturating_sub(1))
            .ok()
            .and_then(|n| n.checked_mul(stride))
            .ok_or(bad)?;
        let (f, l) = (first.hdr.bth, last.bth);
        let kind = |op: Opcode| {
            (
                op.is_send(),
                op.is_write(),
                op.is_read_response(),
                op.transport(),
            )
        };
        let alike = |b: Bth| Bth {
            opcode: Opcode::RcSendMiddle,
            psn: 0,
            ack_req: false,
            solicited: false,
            pad_count: 0,
            ..b
        };
        let ok = (2..=RUN_MAX_PACKETS).contains(&count)
            && stride > 0
            && stride.is_multiple_of(4)
            && total > before_last
            && total - before_last <= stride
            && (f.opcode.is_send() || f.opcode.is_write() || f.opcode.is_read_response())
            && matches!(f.opcode.transport(), Transport::Rc | Transport::Uc)
            && !f.opcode.is_last()
            && !l.opcode.is_first()
            && kind(f.opcode) == kind(l.opcode)
            && l.psn == psn_add(f.psn, count - 1)
            && alike(f) == alike(l)
            && f.pad_count == 0
            && usize::from(l.pad_count) == (4 - (total - before_last) % 4) % 4
            && last.reth.is_none();
        if !ok {
            return Err(bad);
        }
        Ok(Run {
            first,
            last,
            count,
            stride,
        })
    }

    /// Packet `i` of the run (0: the first), as it would have come on its
    /// own; `None` past the last.
    pub fn packet(&self, i: u32) -> Option<Packet<'a>> {
        if i >= self.count {
            return None;
        }
        let off = self.stride * i as usize;
        let len = if i + 1 == self.count {
            self.first.payload_len() - off
        } else {
            self.stride
        };
        let hdr = match i {
            0 => RoceHeaders {
                bth: Bth {
                    pad_count: 0,
                    ..self.first.hdr.bth
                },
                ..self.first.hdr.clone()
            },
            _ if i + 1 == self.count => self.last.clone(),
            _ => self.first.hdr.of_flow(Bth {
                // `new` checked the opcode has a MIDDLE.
                opcode: self.first.hdr.bth.opcode.middle()?,
                psn: psn_add(self.first.hdr.bth.psn, i),
                ack_req: false,
                solicited: false,
                pad_count: 0,
                ..self.first.hdr.bth
            }),
        };
        Some(Packet::with_data(hdr, self.first.data().slice(off, len)?))
    }

    /// The run's packets in order.
    pub fn packets(&self) -> impl Iterator<Item = Packet<'a>> + '_ {
        (0..self.count).map_while(|i| self.packet(i))
    }

    /// The run as one packet of its whole payload, for a receiver that
    /// handles it in one step: the opcode a packet from the first's
    /// position to the last's would have (FIRST to LAST is ONLY, FIRST to
    /// MIDDLE is FIRST, MIDDLE to LAST is the LAST, MIDDLE to MIDDLE is
    /// MIDDLE), the first's PSN and RETH, the last's ImmDt, IETH,
    /// acknowledgement request, solicited event and pad count, and the
    /// AETH of the last, else of the first, when the opcode has one (a
    /// READ response's). It spans [`Run::count`] PSNs.
    pub fn message(&self) -> Packet<'a> {
        let (f, l) = (self.first.hdr.bth.opcode, self.last.bth.opcode);
        let opcode = match (f.is_first(), l.is_last()) {
            // `new` checked `l` is a LAST of a kind with an ONLY.
            (true, true) => l.only_of_last().unwrap_or(l),
            (true, false) => f,
            (false, _) => l,
        };
        let hdr = RoceHeaders {
            bth: Bth {
                opcode,
                ack_req: self.last.bth.ack_req,
                solicited: self.last.bth.solicited,
                pad_count: self.last.bth.pad_count,
                ..self.first.hdr.bth
            },
            immdt: self.last.immdt,
            ieth: self.last.ieth,
            aeth: if opcode.has_aeth() {
                self.last.aeth.or(self.first.hdr.aeth)
            } else {
                None
            },
            ..self.first.hdr.clone()
        };
        Packet::with_data(hdr, self.first.data())
    }

    /// PSN of the last packet.
    pub fn last_psn(&self) -> u32 {
        self.last.bth.psn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::gso::{self, Segment};
    use crate::data::{push_piece, PeerMemory};
    use crate::mem::{DmaMemory, VecMemory};
    use crate::wire::samples::sample_headers;
    use crate::wire::{parse_roce_with, Icrc};

    const BASE: u64 = 0x10_0000;

    /// The sender's memory: `len` patterned bytes at [`BASE`].
    fn memory(len: usize) -> (VecMemory, Vec<u8>) {
        let m = VecMemory::new(BASE, len);
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) ^ 0x5a).collect();
        m.write(BASE, &data).unwrap();
        (m, data)
    }

    /// A batch: a SEND ONLY of 8 bytes, then the run from packet headers
    /// `first` to `last` of `count` packets, `stride` bytes apart, over
    /// the `total` bytes at [`BASE`] (in two pieces).
    fn batch(
        first: &RoceHeaders,
        last: &RoceHeaders,
        count: u16,
        stride: u16,
        total: usize,
    ) -> Vec<u8> {
        let mut frame = Vec::new();
        let lead = sample_headers(Opcode::RcSendOnly, false);
        let end = gso::start(&mut frame, &lead, 8, |b| {
            b.fill(1);
            Ok::<(), ()>(())
        })
        .unwrap();
        let end = gso::append_run(&mut frame, end, first, last, count, stride, total, |out| {
            let cut = (total / 3) as u32;
            push_piece(out, BASE, cut);
            push_piece(out, BASE + u64::from(cut), total as u32 - cut);
            Ok::<(), ()>(())
        })
        .unwrap()
        .unwrap();
        frame.truncate(end);
        frame
    }

    fn headers(op: Opcode, psn: u32, ack_req: bool) -> RoceHeaders {
        let mut h = sample_headers(op, false);
        h.bth.psn = psn;
        h.bth.ack_req = ack_req;
        h.bth.solicited = ack_req;
        h
    }

    fn the_run<'a>(frame: &'a [u8], mem: &'a dyn PeerMemory) -> Result<Run<'a>, WireError> {
        let lead = parse_roce_with(frame, Icrc::Unneeded).unwrap();
        let mut rest = gso::rest(frame, &lead.hdr, Some(mem));
        match rest.next() {
            Some(Ok(Segment::Run(r))) => {
                assert!(rest.next().is_none());
                Ok(r)
            }
            Some(Ok(Segment::Packet(p))) => panic!("a packet, not a run: {p:?}"),
            Some(Err(e)) => Err(e),
            None => panic!("nothing after the first packet"),
        }
    }

    #[test]
    fn a_run_reads_back_as_the_packets_it_stands_for_and_as_one_message() {
        let total = 3 * 4096 + 5;
        let (mem, data) = memory(total);
        // A SEND with immediate of 4 packets, PSNs wrapping around 2^24.
        let first = headers(Opcode::RcSendFirst, 0xff_fffe, false);
        let last = headers(Opcode::RcSendLastImm, 0x00_0001, true);
        let frame = batch(&first, &last, 4, 4096, total);
        assert!(gso::is_batch(&frame));
        let run = the_run(&frame, &mem).unwrap();
        assert_eq!((run.count, run.stride, run.last_psn()), (4, 4096, 1));
        let pkts: Vec<_> = run.packets().collect();
        let ops: Vec<_> = pkts.iter().map(|p| p.hdr.bth.opcode).collect();
        use Opcode::*;
        assert_eq!(
            ops,
            [RcSendFirst, RcSendMiddle, RcSendMiddle, RcSendLastImm]
        );
        for (i, p) in pkts.iter().enumerate() {
            let psn = (0xff_fffe + i as u32) & 0xff_ffff;
            let last = i == 3;
            assert_eq!(p.hdr.bth.psn, psn);
            assert_eq!((p.hdr.bth.ack_req, p.hdr.bth.solicited), (last, last));
            assert_eq!(p.hdr.immdt.is_some(), last);
            assert_eq!(p.hdr.bth.pad_count, if last { 3 } else { 0 });
            assert_eq!(
                (p.hdr.bth.dest_qp, p.hdr.ip_dst),
                (first.bth.dest_qp, first.ip_dst)
            );
            let want = &data[i * 4096..(total).min((i + 1) * 4096)];
            assert_eq!(p.data().to_vec().unwrap(), want, "packet {i}");
        }
        let m = run.message();
        assert_eq!(m.hdr.bth.opcode, RcSendOnlyImm);
        assert_eq!(
            (m.hdr.bth.psn, m.hdr.bth.ack_req, m.hdr.immdt),
            (0xff_fffe, true, last.immdt)
        );
        assert_eq!(m.data().to_vec().unwrap(), data);

        // A WRITE's first packets: FIRST to MIDDLE is a FIRST with the
        // RETH; its middle to its end is a LAST.
        let (mem, data) = memory(2 * 4096);
        let first = headers(RcWriteFirst, 100, false);
        let last = headers(RcWriteMiddle, 101, false);
        let frame = batch(&first, &last, 2, 4096, 2 * 4096);
        let run = the_run(&frame, &mem).unwrap();
        let m = run.message();
        assert_eq!((m.hdr.bth.opcode, m.hdr.reth), (RcWriteFirst, first.reth));
        assert_eq!(m.data().to_vec().unwrap(), data);
        let first = headers(RcWriteMiddle, 7, false);
        let last = headers(RcWriteLast, 9, true);
        let frame = batch(&first, &last, 3, 4096, 2 * 4096 + 1);
        let (mem, _) = memory(2 * 4096 + 1);
        let run = the_run(&frame, &mem).unwrap();
        assert_eq!(run.message().hdr.bth.opcode, RcWriteLast);
        assert_eq!(run.message().hdr.reth, None);

        // READ responses: the AETH on the first and the last, none
        // between; FIRST to LAST is an ONLY with the last's AETH.
        let mut first = headers(RcReadResponseFirst, 50, false);
        first.aeth = Some(crate::wire::Aeth::ack(3, 31));
        let mut last = headers(RcReadResponseLast, 52, false);
        last.aeth = Some(crate::wire::Aeth::ack(4, 31));
        let frame = batch(&first, &last, 3, 4096, 2 * 4096 + 1);
        let run = the_run(&frame, &mem).unwrap();
        let aeths: Vec<_> = run.packets().map(|p| p.hdr.aeth).collect();
        assert_eq!(aeths, [first.aeth, None, last.aeth]);
        let ops: Vec<_> = run.packets().map(|p| p.hdr.bth.opcode).collect();
        assert_eq!(
            ops,
            [
                RcReadResponseFirst,
                RcReadResponseMiddle,
                RcReadResponseLast
            ]
        );
        let m = run.message();
        assert_eq!(
            (m.hdr.bth.opcode, m.hdr.aeth),
            (RcReadResponseOnly, last.aeth)
        );
        let frame = batch(
            &first,
            &headers(RcReadResponseMiddle, 51, false),
            2,
            4096,
            8192,
        );
        let m = the_run(&frame, &mem).unwrap().message();
        assert_eq!(
            (m.hdr.bth.opcode, m.hdr.aeth),
            (RcReadResponseFirst, first.aeth)
        );
    }

    #[test]
    fn only_runs_of_one_message_kind_and_consistent_lengths_and_psns_are_accepted() {
        let (mem, _) = memory(64 * 1024);
        let mem: &dyn PeerMemory = &mem;
        use Opcode::*;
        let f = headers(RcWriteFirst, 10, false);
        let l = headers(RcWriteLast, 13, true);
        let good = (f.clone(), l.clone(), 4u16, 4096u16, 3 * 4096 + 1);
        let bad_dest = RoceHeaders {
            bth: Bth {
                dest_qp: 0x99,
                ..l.bth
            },
            ..l.clone()
        };
        let cases = [
            (f.clone(), l.clone(), 1, 4096, 4096), // one packet
            (
                f.clone(),
                headers(RcWriteLast, 42, true),
                33,
                4096,
                33 * 4096,
            ), // too many
            (f.clone(), l.clone(), 4, 4094, 3 * 4094 + 1), // stride not a multiple of 4
            (f.clone(), l.clone(), 4, 0, 0),       // no stride
            (f.clone(), l.clone(), 4, 4096, 3 * 4096), // the last empty
            (f.clone(), l.clone(), 4, 4096, 4 * 4096 + 4), // the last too long
            (
                f.clone(),
                headers(RcSendLast, 13, true),
                4,
                4096,
                3 * 4096 + 1,
            ), // two kinds
            (
                f.clone(),
                headers(RcWriteLast, 14, true),
                4,
                4096,
                3 * 4096 + 1,
            ), // PSN gap
            (
                headers(RcWriteLast, 10, false),
                l.clone(),
                4,
                4096,
                3 * 4096 + 1,
            ), // starts at a LAST
            (
                f.clone(),
                headers(RcWriteFirst, 13, true),
                4,
                4096,
                3 * 4096 + 1,
            ), // ends at a FIRST
            (f.clone(), bad_dest, 4, 4096, 3 * 4096 + 1), // another QP
            (
                headers(UcWriteFirst, 10, false),
                l.clone(),
                4,
                4096,
                3 * 4096 + 1,
            ), // two transports
        ];
        let (gf, gl, gc, gs, gt) = good;
        assert!(the_run(&batch(&gf, &gl, gc, gs, gt), mem).is_ok());
        for (i, (f, l, c, s, t)) in cases.into_iter().enumerate() {
            let frame = batch(&f, &l, c, s, t);
            assert_eq!(
                the_run(&frame, mem).err(),
                Some(WireError::BadLength),
                "case {i}"
            );
        }
        // A run needs the sender's memory; a copy for a wire (split) stops
        // before it; every cut of the batch ends in an error, no panic.
        let frame = batch(&gf, &gl, gc, gs, gt);
        let lead = parse_roce_with(&frame, Icrc::Unneeded).unwrap().hdr;
        assert!(matches!(
            gso::rest(&frame, &lead, None).next(),
            Some(Err(_))
        ));
        let mut n = 0;
        gso::split(&frame, &mut Vec::new(), |_| n += 1);
        assert_eq!(n, 1, "only the first packet leaves");
        for cut in lead.frame_len(8) - 4..frame.len() {
            let got: Vec<_> = gso::rest(&frame[..cut], &lead, Some(mem)).collect();
            assert!(
                got.len() <= 1 && got.iter().all(Result::is_err),
                "cut {cut}"
            );
        }
    }
}
