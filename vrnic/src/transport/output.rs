//! What the transport produces besides memory writes ([`Output`]):
//! frames for the link, batched between a daemon's functions
//! ([`crate::batch::gso`]), ACKs coalesced, payloads sent by reference,
//! and events for the driver.

use std::collections::VecDeque;

use super::psn;
use super::stats::{Counter, Counters};
use crate::abi;
use crate::batch;
use crate::wire::{self, RoceHeaders};

/// What the transport produces besides memory writes.
#[derive(Debug, Default)]
pub struct Output {
    /// Frames for the link.
    pub tx: VecDeque<Vec<u8>>,
    /// Events for the event queue.
    pub events: VecDeque<abi::Event>,
    /// Counters ([`Counters::count`]).
    pub stats: Counters,
    /// Next IPv4 identification value.
    pub ip_id: u16,
    /// Request frames held by the QPs' responders while their READ
    /// streams are in progress, all QPs together (at most
    /// [`super::responder::RESP_HOLD_DEVICE_MAX`]).
    pub held_frames: usize,
    /// Frame buffers handed back by the owner after the link took them
    /// ([`Output::recycle`]), reused by [`Output::send_with`] so that a
    /// frame costs no heap allocation once the pool is warm (at most
    /// [`TX_POOL_MAX`]).
    pub spare: Vec<Vec<u8>>,
    /// Destinations reached without a wire ([`crate::link::LinkCaps::local_macs`]):
    /// RoCEv2 frames to them are emitted without the ICRC.
    pub local_macs: Option<crate::data::LocalMacs>,
    /// The last frame of [`Output::tx`] while more packets may join it
    /// ([`batch::gso`]): a frame to a local destination, RC or UC.
    pub batch: Option<Batch>,
    /// Packets in each frame of [`Output::tx`], in the same order.
    tx_counts: VecDeque<usize>,
    /// Packets in [`Output::tx`] ([`Output::backlog`]).
    tx_packets: usize,
    /// Big buffers (that held batches) among [`Output::spare`], at most
    /// [`TX_POOL_BIG_MAX`].
    spare_big: usize,
    /// Frames queued into [`Output::tx`] so far: the next frame's sequence
    /// number ([`Output::frames_queued`]).
    queued: u64,
    /// Frames taken from [`Output::tx`] so far ([`Output::pop_frame`]).
    popped: u64,
    /// The oldest frame taken from [`Output::tx`] that its owner still
    /// holds for a full link ([`Output::set_held_from`]), if any.
    held_from: Option<u64>,
    /// The last frame queued when it is a plain ACK for the wire (not a
    /// batch): its sequence number and headers. A later ACK of the same
    /// QP and flow takes its place while it is still queued
    /// ([`Output::replace_wire_ack`]).
    wire_ack: Option<(u64, Box<RoceHeaders>)>,
}

/// Big buffers (longer than [`BIG_BUFFER`]: they held batches,
/// [`batch::gso`]) kept for reuse at most: 16 × 80 KiB, 1.3 MiB.
pub const TX_POOL_BIG_MAX: usize = 16;
/// Capacity above which a frame buffer counts as big, bytes.
pub const BIG_BUFFER: usize = 16 * 1024;

/// The open batch at the back of [`Output::tx`] ([`batch::gso`]).
#[derive(Debug, Clone)]
pub struct Batch {
    /// Headers of its first packet.
    pub first: RoceHeaders,
    /// Packets in it.
    pub packets: usize,
    /// Where it ends: the frame's bytes after are stale until
    /// `Output::close_batch` cuts them.
    pub end: usize,
    /// Its destination reads payloads in this device's memory
    /// ([`crate::link::LocalMacs::by_reference`]).
    pub by_ref: bool,
    /// When its last packet is a plain ACK: where that packet starts (0:
    /// it is the first), its destination QP and PSN. A later ACK of the
    /// same QP takes its place ([`Output::send_with`]).
    pub last_ack: Option<(usize, u32, u32)>,
}

/// True for a plain RC ACK (an AETH of kind ACK; not a NAK, an RNR NAK or
/// an atomic ACK).
fn is_plain_ack(hdr: &RoceHeaders) -> bool {
    hdr.bth.opcode == wire::Opcode::RcAck
        && hdr
            .aeth
            .is_some_and(|a| matches!(a.kind(), wire::AethKind::Ack { .. }))
}

/// Most frame buffers kept for reuse ([`Output::recycle`]): the frames of
/// a full backlog ([`TX_BACKLOG_MAX`]) plus the answers one input makes.
pub const TX_POOL_MAX: usize = TX_BACKLOG_MAX + 64;

/// Packets queued for the link (device-wide, [`Output::backlog`]: a
/// batch, [`batch::gso`], counts its packets) at or above which the
/// transport produces no more data packets: READ responses
/// ([`super::responder::run`]), RC/UC request packets
/// ([`super::requester::run`]) and UD datagrams ([`super::datagram::run`]) wait for the owner to drain
/// `Device::pop_tx`, and the next `Device::poll` resumes them. With the
/// answers one received frame or command produces (an ACK, a NAK), it
/// bounds the frames waiting for the link: about 1.1 MiB at path MTU
/// 4096. The pacing is the owner's: it drains to the link between calls.
pub const TX_BACKLOG_MAX: usize = 256;

/// Packets queued for the link ([`Output::backlog`]) at or above which a
/// reply to a peer is dropped instead of queued ([`Output::send_reply`],
/// [`Output::push_reply_frame`]; counted in `DeviceStats::replies_dropped`):
/// twice [`TX_BACKLOG_MAX`]. Data packets stop at `TX_BACKLOG_MAX` (one
/// run or burst may pass it by less than [`batch::RUN_MAX_PACKETS`]), so
/// replies always have room for as many again beyond them: an owner that
/// drains the queue between inputs (the daemon's worker every 64 frames
/// received, each answered with at most one reply or one coalesced ACK)
/// never comes near the bound. A peer that floods requests while the link
/// takes no frames (full, or held by `link::txq::TxFlush`) cannot grow the
/// queue past it: 512 packets in all, ≈ 2.2 MiB at path MTU 4096.
pub const TX_REPLY_MAX: usize = 2 * TX_BACKLOG_MAX;

/// Largest number of queued events kept for a driver that posts no event
/// buffers; older events beyond it are dropped.
const MAX_EVENTS: usize = 1024;

impl Output {
    /// Queues an event (bounded).
    pub fn event(&mut self, kind: u16, handle: u32, info: u32) {
        if self.events.len() < MAX_EVENTS {
            self.events.push_back(abi::Event {
                kind,
                handle,
                info,
                ..Default::default()
            });
        }
    }

    /// Emits one RoCEv2 frame with `payload`.
    pub fn send(&mut self, hdr: &mut RoceHeaders, payload: &[u8]) {
        let copy = |b: &mut [u8]| {
            b.copy_from_slice(payload);
            Ok::<(), std::convert::Infallible>(())
        };
        match self.send_with(hdr, payload.len(), copy) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// Emits a reply to a peer's request, without payload: an ACK, a NAK,
    /// an RNR NAK or an atomic ACK (IBTA §9.7.5.1), unless
    /// [`TX_REPLY_MAX`] packets already wait for the link; then it is
    /// dropped and counted (`DeviceStats::replies_dropped`), except a
    /// plain ACK that takes an earlier one's place ([`Output::send_with`],
    /// between functions and to the wire), which adds nothing. Returns whether it was queued.
    ///
    /// Dropping a reply is what a lossy link would do, and RC recovers
    /// from it (IBTA §9.7.5, go-back-N): an ACK is cumulative, so a later
    /// one covers it, or the requester's ACK timeout resends the
    /// unacknowledged requests and their duplicates are acknowledged again
    /// (rxe's `duplicate_request`); a lost RNR NAK or PSN sequence error
    /// NAK likewise ends in a resend (the responder asks again at its next
    /// out-of-sequence packet); a lost error NAK leaves the requester to
    /// its retry count, the responder QP being in ERR already.
    pub fn send_reply(&mut self, hdr: &mut RoceHeaders) -> bool {
        if self.backlog() >= TX_REPLY_MAX {
            hdr.ip_id = self.ip_id;
            if self.replace_last_ack(hdr) || self.replace_wire_ack(hdr) {
                return true;
            }
            self.stats.count(Counter::replies_dropped, 1);
            return false;
        }
        self.send(hdr, &[]);
        true
    }

    /// Queues `frame`, an answer to a peer that is not RoCEv2 (an ARP
    /// reply, a neighbour advertisement), within [`TX_REPLY_MAX`] as
    /// [`Output::send_reply`]: dropped and counted past it (the peer asks
    /// again). Returns whether it was queued.
    pub fn push_reply_frame(&mut self, frame: Vec<u8>) -> bool {
        if self.backlog() >= TX_REPLY_MAX {
            self.stats.count(Counter::replies_dropped, 1);
            return false;
        }
        self.push_frame(frame);
        true
    }

    /// Emits one RoCEv2 frame whose `len`-byte payload `fill` writes in
    /// place ([`wire::emit_frame_with`]): from driver memory straight into
    /// the frame, a buffer of the pool ([`Output::recycle`]). When `fill`
    /// fails nothing is sent (the buffer goes back to the pool) and its
    /// error is returned.
    ///
    /// A plain ACK to the QP whose plain ACK ends the open batch, for a
    /// later PSN, takes that ACK's place (counted once): an ACK
    /// acknowledges every PSN up to its own (IBTA §9.7.5.1.1, coalesced
    /// acknowledgements), so the requester learns the same from one.
    pub fn send_with<E>(
        &mut self,
        hdr: &mut RoceHeaders,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        hdr.ip_id = self.ip_id;
        if self.replace_last_ack(hdr) || self.replace_wire_ack(hdr) {
            return Ok(());
        }
        let ack = is_plain_ack(hdr);
        if self.batch_has_room(hdr, len) {
            if let Some((at, frame)) = self.batch_frame() {
                let end = batch::gso::append(frame, at, hdr, len, fill)?;
                let last_ack = ack.then_some((at, hdr.bth.dest_qp, hdr.bth.psn));
                self.batch_grew(end, 1, len, last_ack);
                return Ok(());
            }
        }
        self.close_batch();
        let local = match &self.local_macs {
            Some(local) => local.contains(&hdr.eth_dst),
            None => false,
        };
        let mut frame = self.take_spare();
        let emitted = if local && hdr.bth.opcode.transport() != wire::Transport::Ud {
            let by_ref = self
                .local_macs
                .as_ref()
                .is_some_and(|l| l.by_reference(&hdr.eth_dst));
            batch::gso::start(&mut frame, hdr, len, fill).map(|end| {
                self.batch = Some(Batch {
                    first: hdr.clone(),
                    packets: 1,
                    end,
                    by_ref,
                    last_ack: ack.then_some((0, hdr.bth.dest_qp, hdr.bth.psn)),
                });
            })
        } else {
            let icrc = if local {
                wire::Icrc::Unneeded
            } else {
                wire::Icrc::Needed
            };
            wire::emit_frame_icrc(hdr, len, &mut frame, icrc, fill)
        };
        if let Err(e) = emitted {
            self.recycle(frame);
            return Err(e);
        }
        self.queue(frame);
        self.sent_many(1, len);
        if ack && !local {
            self.wire_ack = Some((self.queued.wrapping_sub(1), Box::new(hdr.clone())));
        }
        Ok(())
    }

    /// Puts the plain ACK `hdr` for the wire in the place of the frame
    /// queued last, when that is a plain ACK to the same QP of the same
    /// flow for an earlier PSN still in the queue: an ACK acknowledges
    /// every PSN up to its own (IBTA §9.7.5.1.1, coalesced
    /// acknowledgements), so the requester learns the same from one
    /// packet, and no later: the ACK it replaces had not left either.
    /// Whether it did (counted in `acks_coalesced`).
    fn replace_wire_ack(&mut self, hdr: &RoceHeaders) -> bool {
        if !is_plain_ack(hdr) {
            return false;
        }
        let Some((seq, old)) = &self.wire_ack else {
            return false;
        };
        let last_queued = seq.wrapping_add(1) == self.queued && *seq >= self.popped;
        if !last_queued
            || self.batch.is_some()
            || old.bth.dest_qp != hdr.bth.dest_qp
            || psn::diff(hdr.bth.psn, old.bth.psn) <= 0
            || !batch::gso::same_flow(old, hdr)
        {
            return false;
        }
        let Some(frame) = self.tx.back_mut() else {
            return false;
        };
        // Over the old one, with its IPv4 identification.
        let mut h = hdr.clone();
        h.ip_id = old.ip_id;
        let no_payload = |_: &mut [u8]| Ok::<(), std::convert::Infallible>(());
        match wire::emit_frame_icrc(&h, 0, frame, wire::Icrc::Needed, no_payload) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        self.wire_ack = Some((*seq, Box::new(h)));
        self.stats.count(Counter::acks_coalesced, 1);
        true
    }

    /// Puts the plain ACK `hdr` in the place of the plain ACK that ends the
    /// open batch, when that one is to the same QP of the same flow for an
    /// earlier PSN ([`Output::send_with`]). Whether it did.
    fn replace_last_ack(&mut self, hdr: &RoceHeaders) -> bool {
        if !is_plain_ack(hdr) {
            return false;
        }
        let (Some(b), Some(frame)) = (&mut self.batch, self.tx.back_mut()) else {
            return false;
        };
        let Some((at, qp, p)) = b.last_ack else {
            return false;
        };
        if qp != hdr.bth.dest_qp
            || psn::diff(hdr.bth.psn, p) <= 0
            || !batch::gso::same_flow(&b.first, hdr)
        {
            return false;
        }
        // Its BTH and AETH over the old one's: the same packet otherwise.
        if !batch::gso::rewrite_ack(frame, at, hdr) {
            return false;
        }
        if at == 0 {
            b.first.bth = hdr.bth;
            b.first.aeth = hdr.aeth;
        }
        b.last_ack = Some((at, qp, hdr.bth.psn));
        self.stats.count(Counter::acks_coalesced, 1);
        true
    }

    /// Emits one packet whose `len` payload bytes stay in this device's
    /// memory (an MR's pages): the one way a payload from memory is sent.
    /// When the packet joins an open batch whose destination reads this
    /// device's memory ([`crate::data::LocalMacs::by_reference`]),
    /// `pieces` appends the payload's piece entries
    /// ([`crate::data::push_piece`], [`batch::gso::append_peer`]): one
    /// copy of the payload, by the receiver, instead of two. Else `fill`
    /// copies it into the frame ([`Output::send_with`]). Either's error
    /// is returned, nothing sent.
    pub fn send_payload<E>(
        &mut self,
        hdr: &mut RoceHeaders,
        len: usize,
        pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if len > 0 && self.send_by_ref(hdr, len, pieces)? {
            return Ok(());
        }
        self.send_with(hdr, len, fill)
    }

    /// [`Output::send_payload`]'s by-reference case: `Ok(false)` when the
    /// packet cannot join the open batch by reference.
    fn send_by_ref<E>(
        &mut self,
        hdr: &mut RoceHeaders,
        len: usize,
        pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<bool, E> {
        hdr.ip_id = self.ip_id;
        if !self.may_send_run() || !self.batch_has_room(hdr, len) {
            return Ok(false);
        }
        let Some((at, frame)) = self.batch_frame() else {
            return Ok(false);
        };
        let Some(end) = batch::gso::append_peer(frame, at, hdr, len, pieces)? else {
            return Ok(false);
        };
        self.batch_grew(end, 1, len, None);
        self.stats.count(Counter::tx_by_ref, 1);
        Ok(true)
    }

    /// Whether the open batch's destination reads this device's memory,
    /// so that packets and runs may join it by reference
    /// ([`Output::send_run_by_ref`], [`Output::send_payload`]): a cheap
    /// test before a run's headers are built.
    pub fn may_send_run(&self) -> bool {
        self.batch.as_ref().is_some_and(|b| b.by_ref)
    }

    /// [`Output::send_payload`] of a run ([`batch::Run`]), by reference
    /// only: `count` packets of
    /// one message from the one with headers `first` to the one with
    /// headers `last`, every one but the last `stride` bytes, `total`
    /// bytes in all, whose pieces `pieces` appends
    /// ([`batch::gso::append_run`]). The caller keeps to what
    /// [`batch::Run::new`] accepts. Counted as `count` packets, here and
    /// against [`batch::gso::BATCH_MAX_PSNS`]. `Ok(false)` when it
    /// cannot (the caller sends the packets one by one).
    pub fn send_run_by_ref<E>(
        &mut self,
        first: &mut RoceHeaders,
        last: &RoceHeaders,
        count: u32,
        stride: u32,
        total: usize,
        pieces: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<bool, E> {
        first.ip_id = self.ip_id;
        let (Ok(count16), Ok(stride16)) = (u16::try_from(count), u16::try_from(stride)) else {
            return Ok(false);
        };
        let fits = self.may_send_run()
            && self.continues_batch(first)
            && self
                .batch
                .as_ref()
                .is_some_and(|b| b.packets + usize::from(count16) <= batch::gso::BATCH_MAX_PSNS);
        if !fits {
            return Ok(false);
        }
        let Some((at, frame)) = self.batch_frame() else {
            return Ok(false);
        };
        let Some(end) =
            batch::gso::append_run(frame, at, first, last, count16, stride16, total, pieces)?
        else {
            return Ok(false);
        };
        self.batch_grew(end, count16, total, None);
        self.stats.count(Counter::tx_by_ref, u64::from(count));
        Ok(true)
    }

    /// Where the open batch ends and its frame (the back of
    /// [`Output::tx`]), if a batch is open.
    fn batch_frame(&mut self) -> Option<(usize, &mut Vec<u8>)> {
        let end = self.batch.as_ref()?.end;
        Some((end, self.tx.back_mut()?))
    }

    /// Records that `packets` packets of `len` payload bytes in all joined
    /// the open batch, which now ends at `end`; `last_ack`: where its new
    /// last packet starts, its QP and PSN, when that is a plain ACK
    /// ([`Output::replace_last_ack`]). The one bookkeeping of every way a
    /// packet joins a batch (bytes, by reference, a run).
    fn batch_grew(
        &mut self,
        end: usize,
        packets: u16,
        len: usize,
        last_ack: Option<(usize, u32, u32)>,
    ) {
        let (Some(b), Some(n)) = (&mut self.batch, self.tx_counts.back_mut()) else {
            return;
        };
        b.end = end;
        b.packets += usize::from(packets);
        b.last_ack = last_ack;
        *n += usize::from(packets);
        self.tx_packets += usize::from(packets);
        self.sent_many(packets, len);
        self.stats.count(Counter::tx_batched, u64::from(packets));
    }

    /// Counts `packets` packets of `len` payload bytes in all sent (each
    /// takes an IPv4 identification).
    fn sent_many(&mut self, packets: u16, len: usize) {
        self.ip_id = self.ip_id.wrapping_add(packets);
        self.stats.count(Counter::tx_frames, u64::from(packets));
        self.stats.count(Counter::tx_bytes, len as u64);
    }

    /// True when a packet with headers `hdr` and `len` payload bytes joins
    /// the open batch at the back of `tx` ([`batch::gso`]): RC or UC, the
    /// same flow, at most [`batch::gso::SEGMENT_MAX`] bytes, within
    /// [`batch::BATCH_MAX_PACKETS`] and [`batch::gso::BATCH_MAX_BYTES`].
    fn batch_has_room(&self, hdr: &RoceHeaders, len: usize) -> bool {
        let Some(b) = &self.batch else {
            return false;
        };
        self.continues_batch(hdr)
            && hdr.frame_len(len) <= batch::gso::SEGMENT_MAX
            && b.packets < batch::BATCH_MAX_PACKETS
            && b.end + hdr.frame_len(len) <= batch::gso::BATCH_MAX_BYTES
    }

    /// True when a packet with headers `hdr` continues the open batch's
    /// flow: RC or UC (a UD datagram's frame carries its own GRH for the
    /// receiver, [`batch::gso`]) and [`batch::gso::same_flow`]. What
    /// every way of joining a batch asks first; the bounds are each
    /// one's.
    fn continues_batch(&self, hdr: &RoceHeaders) -> bool {
        self.batch.as_ref().is_some_and(|b| {
            hdr.bth.opcode.transport() != wire::Transport::Ud
                && batch::gso::same_flow(&b.first, hdr)
        })
    }

    /// Closes the open batch, if any: no more packets join it, and its
    /// frame is cut where it ends.
    fn close_batch(&mut self) {
        if let (Some(b), Some(frame)) = (self.batch.take(), self.tx.back_mut()) {
            frame.truncate(b.end);
        }
    }

    /// Queues a frame that no packet may join (ARP, neighbour discovery).
    pub fn push_frame(&mut self, frame: Vec<u8>) {
        self.close_batch();
        self.queue(frame);
    }

    /// Queues a frame of one packet (more may join it while it is the open
    /// batch).
    fn queue(&mut self, frame: Vec<u8>) {
        self.queued = self.queued.wrapping_add(1);
        self.tx.push_back(frame);
        self.tx_counts.push_back(1);
        self.tx_packets += 1;
    }

    /// Takes the oldest frame for the link; the open batch closes when it
    /// is this frame.
    pub fn pop_frame(&mut self) -> Option<Vec<u8>> {
        if self.tx.len() <= 1 {
            self.close_batch();
        }
        let n = self.tx_counts.pop_front().unwrap_or(0);
        self.tx_packets = self.tx_packets.saturating_sub(n);
        let frame = self.tx.pop_front()?;
        self.popped = self.popped.wrapping_add(1);
        Some(frame)
    }

    /// Frames queued so far, the sequence number the next frame gets
    /// (frame `n` is the `n`-th queued, from 0; a packet that joins the
    /// open batch is in frame `frames_queued() - 1`). A QP that notes it
    /// after sending knows its packets left the device once
    /// [`Output::departed`] reaches it.
    pub fn frames_queued(&self) -> u64 {
        self.queued
    }

    /// Frame numbering carries on after `old`'s (a device reset drops
    /// the queue, not its owner's held frames, whose numbers must stay
    /// older than the new frames').
    pub fn continue_after(&mut self, old: &Output) {
        self.queued = old.queued;
        self.popped = old.queued;
    }

    /// Frames taken from the queue so far: the sequence number of the
    /// next frame [`Output::pop_frame`] returns.
    pub fn frames_popped(&self) -> u64 {
        self.popped
    }

    /// The owner still holds the frames it took from sequence number
    /// `seq` on, or some of them, for a full link (`link::txq::TxFlush`);
    /// `None`: every frame it took has gone to the link.
    pub fn set_held_from(&mut self, seq: Option<u64>) {
        self.held_from = seq;
    }

    /// Frames before this sequence number have left the device: handed
    /// to the link (or lost there), none waits in the queue or in its
    /// owner's hands. What the ACK timer asks before blaming the peer
    /// (`completer::on_timer`).
    pub fn departed(&self) -> u64 {
        self.held_from.map_or(self.popped, |h| h.min(self.popped))
    }

    /// Packets waiting for the link (in [`Output::tx`], batches counted
    /// packet by packet): what [`TX_BACKLOG_MAX`] bounds.
    pub fn backlog(&self) -> usize {
        self.tx_packets
    }

    /// A buffer of the pool, or a new empty one.
    fn take_spare(&mut self) -> Vec<u8> {
        let b = self.spare.pop().unwrap_or_default();
        if b.capacity() > BIG_BUFFER {
            self.spare_big = self.spare_big.saturating_sub(1);
        }
        b
    }

    /// Takes back a frame buffer the owner has handed to the link, for
    /// reuse by the next frame (dropped when [`TX_POOL_MAX`] are kept, or
    /// [`TX_POOL_BIG_MAX`] big ones).
    pub fn recycle(&mut self, frame: Vec<u8>) {
        let big = frame.capacity() > BIG_BUFFER;
        if self.spare.len() >= TX_POOL_MAX || (big && self.spare_big >= TX_POOL_BIG_MAX) {
            return;
        }
        self.spare_big += usize::from(big);
        self.spare.push(frame);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::{LocalMacs, LocalReach};
    use crate::wire::samples::sample_headers;
    use crate::wire::Opcode;

    /// Every destination is local; payloads by reference when `by_ref`.
    struct Local(bool);

    impl LocalReach for Local {
        fn contains(&self, _: &[u8; 6]) -> bool {
            true
        }
        fn by_reference(&self, _: &[u8; 6]) -> bool {
            self.0
        }
    }

    /// Packets of 4096 payload bytes in the first frame of an output that
    /// sends 40 of them to one local flow, by reference after the first
    /// where it can.
    fn first_batch(by_ref: bool) -> usize {
        let mut out = Output {
            local_macs: Some(LocalMacs::with(Local(by_ref))),
            ..Output::default()
        };
        let payload = vec![0x5a; 4096];
        for k in 0..40u32 {
            let mut h = sample_headers(Opcode::RcWriteMiddle, false);
            h.bth.psn += k;
            let taken = out
                .send_by_ref(&mut h, payload.len(), |o| {
                    crate::data::push_piece(o, 0x10_0000 + u64::from(k) * 4096, 4096);
                    Ok::<(), ()>(())
                })
                .unwrap();
            if !taken {
                out.send(&mut h, &payload);
            }
        }
        assert_eq!(out.backlog(), 40);
        out.tx_counts[0]
    }

    /// A batch of packets by reference holds their headers and piece
    /// entries, not their payloads (its room counts its own bytes): it
    /// fills up to the packet bound, where a batch of bytes stops at its
    /// byte bound.
    #[test]
    fn a_batch_by_reference_is_bounded_by_packets_not_by_payload_bytes() {
        assert_eq!(first_batch(true), batch::BATCH_MAX_PACKETS);
        let bytes = first_batch(false);
        assert!(bytes < batch::BATCH_MAX_PACKETS, "{bytes}");
        // 80 KiB: the first packet's frame and 18 segments of 4110 bytes.
        assert_eq!(bytes, 19);
    }

    /// A later plain ACK of the same QP takes the place of the one that
    /// ends the open batch, counted once; a NAK, an ACK of another QP or
    /// of an earlier PSN, or an ACK behind another packet joins as
    /// itself.
    #[test]
    fn acks_of_one_qp_at_the_end_of_a_batch_coalesce() {
        for v6 in [false, true] {
            acks_coalesce_over(v6);
        }
    }

    /// [`acks_of_one_qp_at_the_end_of_a_batch_coalesce`] over IPv4 or IPv6
    /// (`v6`): the replaced ACKs are rewritten in place, at the batch's
    /// start and after other packets.
    fn acks_coalesce_over(v6: bool) {
        let mut out = Output {
            local_macs: Some(LocalMacs::with(Local(false))),
            ..Output::default()
        };
        let ack = |qp, p, aeth| ack_headers(v6, qp, p, aeth);
        let plain = |msn| wire::Aeth::ack(msn, 31);
        for h in [
            ack(7, 10, plain(1)),
            ack(7, 20, plain(2)), // replaces the first
            ack(7, 30, plain(3)), // replaces it again
            ack(7, 25, plain(4)), // earlier PSN: joins
            ack(8, 40, plain(5)), // another QP: joins
            ack(8, 41, wire::Aeth::nak(5, wire::NakCode::PsnSequenceError)),
            ack(8, 42, plain(6)), // behind a NAK: joins
            ack(8, 50, plain(7)), // replaces it
        ] {
            out.send(&mut h.clone(), &[]);
        }
        assert_eq!(out.stats.acks_coalesced, 3);
        assert_eq!(out.stats.tx_frames, 5);
        let frame = out.pop_frame().unwrap();
        assert!(out.pop_frame().is_none(), "one batch");
        let first = wire::parse_roce_with(&frame, wire::Icrc::Unneeded).unwrap();
        let mut got = vec![(
            first.hdr.bth.dest_qp,
            first.hdr.bth.psn,
            first.hdr.aeth.unwrap(),
        )];
        for seg in batch::gso::rest(&frame, &first.hdr, None) {
            let Ok(batch::gso::Segment::Packet(p)) = seg else {
                panic!("{seg:?}");
            };
            got.push((p.hdr.bth.dest_qp, p.hdr.bth.psn, p.hdr.aeth.unwrap()));
        }
        let nak = wire::Aeth::nak(5, wire::NakCode::PsnSequenceError);
        assert_eq!(
            got,
            [
                (7, 30, plain(3)),
                (7, 25, plain(4)),
                (8, 40, plain(5)),
                (8, 41, nak),
                (8, 50, plain(7))
            ]
        );
    }

    /// An ACK-opcode packet (`aeth`: ACK, NAK, ...) to QP `qp` for PSN `p`,
    /// over IPv6 when `v6`.
    fn ack_headers(v6: bool, qp: u32, p: u32, aeth: wire::Aeth) -> RoceHeaders {
        let mut h = sample_headers(Opcode::RcAck, v6);
        h.bth.dest_qp = qp;
        h.bth.psn = p;
        h.aeth = Some(aeth);
        h
    }

    /// To the wire, a plain ACK takes the place of the frame queued last
    /// when that is a plain ACK of the same QP and flow for an earlier
    /// PSN, still queued: one frame leaves, with the newest PSN and MSN
    /// and a valid ICRC. A NAK, another QP or an earlier PSN goes as
    /// itself, and so does an ACK after the last one left.
    #[test]
    fn acks_of_one_qp_for_the_wire_coalesce_while_queued() {
        let mut out = Output::default();
        let ack = |qp, p, aeth| ack_headers(false, qp, p, aeth);
        let plain = |msn| wire::Aeth::ack(msn, 31);
        let nak = wire::Aeth::nak(5, wire::NakCode::PsnSequenceError);
        for h in [
            ack(7, 10, plain(1)),
            ack(7, 20, plain(2)), // replaces the first
            ack(7, 30, plain(3)), // replaces it again
            ack(7, 25, plain(4)), // earlier PSN: goes as itself
            ack(8, 40, plain(5)), // another QP
            ack(8, 41, nak),      // a NAK
            ack(8, 42, plain(6)), // behind a NAK: itself
            ack(8, 50, plain(7)), // replaces it
        ] {
            out.send(&mut h.clone(), &[]);
        }
        assert_eq!(out.stats.acks_coalesced, 3);
        let mut got = Vec::new();
        while let Some(f) = out.pop_frame() {
            let p = wire::parse_roce_with(&f, wire::Icrc::Needed).expect("valid, ICRC too");
            got.push((p.hdr.bth.dest_qp, p.hdr.bth.psn, p.hdr.aeth.unwrap()));
        }
        assert_eq!(
            got,
            [
                (7, 30, plain(3)),
                (7, 25, plain(4)),
                (8, 40, plain(5)),
                (8, 41, nak),
                (8, 50, plain(7))
            ]
        );
        // The last ACK left: the next goes as itself.
        out.send(&mut ack(8, 60, plain(8)), &[]);
        assert_eq!(out.stats.acks_coalesced, 3);
        assert!(out.pop_frame().is_some());
    }

    /// Replies stop at [`TX_REPLY_MAX`] packets waiting for the link,
    /// data packets included, each one past it counted as dropped; a
    /// plain ACK that takes the place of the one ending the open batch
    /// still goes (it adds nothing); once the link has taken frames,
    /// replies are queued again.
    #[test]
    fn replies_stop_at_the_reply_bound() {
        let ack = |qp, p, aeth| ack_headers(false, qp, p, aeth);
        let plain = |msn| wire::Aeth::ack(msn, 31);
        let nak = wire::Aeth::nak(1, wire::NakCode::PsnSequenceError);
        // To a wire: data up to TX_BACKLOG_MAX, then replies to the bound.
        let mut out = Output::default();
        for k in 0..TX_BACKLOG_MAX as u32 {
            let mut h = sample_headers(Opcode::RcWriteOnly, false);
            h.bth.psn = k;
            out.send(&mut h, &[0; 64]);
        }
        let extra = 100;
        let mut queued = 0;
        for k in 0..(TX_REPLY_MAX - TX_BACKLOG_MAX + extra) as u32 {
            // Two QPs in turn, then others: no ACK takes its neighbour's
            // place.
            let qp = if k < (TX_REPLY_MAX - TX_BACKLOG_MAX) as u32 {
                7 + k % 2
            } else {
                100 + k
            };
            queued += usize::from(out.send_reply(&mut ack(qp, k, plain(k))));
            assert!(out.backlog() <= TX_REPLY_MAX, "{}", out.backlog());
        }
        assert_eq!(queued, TX_REPLY_MAX - TX_BACKLOG_MAX);
        assert_eq!(out.backlog(), TX_REPLY_MAX);
        assert_eq!(out.stats.replies_dropped, extra as u64);
        assert!(!out.push_reply_frame(vec![0; 60]), "an ARP reply too");
        assert_eq!(out.stats.replies_dropped, extra as u64 + 1);
        assert!(out.pop_frame().is_some());
        assert!(out.send_reply(&mut ack(7, 1000, plain(1))), "room again");
        assert!(!out.send_reply(&mut ack(9, 1001, plain(1))));
        assert!(out.send_reply(&mut ack(7, 1002, plain(2))), "coalesced");
        assert_eq!(out.backlog(), TX_REPLY_MAX);

        // To another function: NAKs in batches to the bound, then a plain
        // ACK ends the batch; a later one of the same QP replaces it.
        let mut out = Output {
            local_macs: Some(LocalMacs::with(Local(false))),
            ..Output::default()
        };
        for k in 0..(TX_REPLY_MAX - 1) as u32 {
            assert!(out.send_reply(&mut ack(8, k, nak)));
        }
        assert!(out.send_reply(&mut ack(8, 5000, plain(2))));
        assert_eq!(out.backlog(), TX_REPLY_MAX);
        assert!(out.send_reply(&mut ack(8, 5001, plain(3))), "coalesced");
        assert!(!out.send_reply(&mut ack(8, 5002, nak)));
        assert!(!out.send_reply(&mut ack(9, 5003, plain(3))), "another QP");
        assert_eq!(out.stats.acks_coalesced, 1);
        assert_eq!(out.stats.replies_dropped, 2);
        assert_eq!(out.backlog(), TX_REPLY_MAX);
    }

    /// Runs of 16 packets join a batch by reference up to
    /// [`batch::gso::BATCH_MAX_PSNS`] packets in all, counted as packets;
    /// not a batch of bytes.
    #[test]
    fn runs_join_a_batch_by_reference_up_to_its_psn_bound() {
        for by_ref in [true, false] {
            let mut out = Output {
                local_macs: Some(LocalMacs::with(Local(by_ref))),
                ..Output::default()
            };
            let mut h = sample_headers(Opcode::RcWriteOnly, false);
            out.send(&mut h, &[1; 64]);
            let mut taken = 0;
            for k in 0..8u32 {
                let mut first = sample_headers(Opcode::RcWriteFirst, false);
                first.bth.psn = 1 + 16 * k;
                let mut last = sample_headers(Opcode::RcWriteLast, false);
                last.bth.psn = 16 + 16 * k;
                let pieces = |o: &mut Vec<u8>| {
                    crate::data::push_piece(o, 0x10_0000, 16 * 4096);
                    Ok::<(), ()>(())
                };
                if out
                    .send_run_by_ref(&mut first, &last, 16, 4096, 16 * 4096, pieces)
                    .unwrap()
                {
                    taken += 1;
                }
            }
            let want = if by_ref {
                (batch::gso::BATCH_MAX_PSNS - 1) / 16
            } else {
                0
            };
            assert_eq!(taken, want, "by reference: {by_ref}");
            assert_eq!(out.tx_counts[0], 1 + 16 * want);
            assert_eq!(out.backlog(), 1 + 16 * want);
            assert_eq!(out.stats.tx_frames, 1 + 16 * want as u64);
        }
    }
}
