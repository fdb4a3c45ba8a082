//! The in-process fast path between the functions of one daemon: batches
//! of packets in one frame ([`gso`]), runs of packets of one message as
//! one batch entry ([`Run`]), and the received packet whose payload may be
//! by reference in the sending function's memory ([`Packet`]).
//!
//! Not a wire format: these frames never leave the process (what does is
//! [`gso::split`] into sealed RoCEv2 frames first). They sit above
//! [`crate::wire`], which knows only bytes, and [`crate::data`], the
//! payload by reference, and below the transport that makes and consumes
//! them.

pub mod gso;
mod run;

pub use run::Run;

/// Most packets in one batch ([`gso`]; 32: one ACK request interval of a
/// long message, [`crate::transport::requester`]).
pub const BATCH_MAX_PACKETS: usize = 32;
/// Most packets in one run ([`Run`]): a batch's.
pub const RUN_MAX_PACKETS: u32 = BATCH_MAX_PACKETS as u32;

use crate::data::{Data, PeerData};
use crate::wire::{RoceHeaders, RocePacket};

/// A received RoCEv2 packet as the transport handles it: a frame's
/// [`RocePacket`], or a batch's packet whose payload stays in the sending
/// device's memory ([`gso`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Packet<'a> {
    /// All headers.
    pub hdr: RoceHeaders,
    /// The payload after the extension headers, without pad bytes and ICRC
    /// (empty when the payload is in `peer`).
    pub payload: &'a [u8],
    /// The payload in the sending device's memory instead: a batch's
    /// packet by reference ([`gso`]).
    pub peer: Option<PeerData<'a>>,
}

impl<'a> Packet<'a> {
    /// The packet with headers `hdr` and payload `data`, wherever it is.
    pub fn with_data(hdr: RoceHeaders, data: Data<'a>) -> Self {
        match data {
            Data::Bytes(payload) => Packet {
                hdr,
                payload,
                peer: None,
            },
            Data::Peer(p) => Packet {
                hdr,
                payload: &[],
                peer: Some(p),
            },
        }
    }

    /// The payload, wherever it is.
    pub fn data(&self) -> Data<'a> {
        match self.peer {
            Some(p) => Data::Peer(p),
            None => Data::Bytes(self.payload),
        }
    }

    /// Length of the payload, bytes.
    pub fn payload_len(&self) -> usize {
        self.data().len()
    }
}

impl<'a> From<RocePacket<'a>> for Packet<'a> {
    /// A frame's packet: its payload in the frame.
    fn from(p: RocePacket<'a>) -> Self {
        Packet {
            hdr: p.hdr,
            payload: p.payload,
            peer: None,
        }
    }
}
