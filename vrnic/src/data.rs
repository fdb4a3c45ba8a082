//! A packet's payload as the transport consumes it: bytes in a frame, or
//! bytes still in the memory of the device that sent it, when both devices
//! are functions of one daemon (a batch's packet "by reference",
//! [`crate::batch::gso`]). The receiver then copies them straight from the
//! sender's guest memory into its own: one copy instead of two, and none
//! through a frame.
//!
//! The sender's memory is a [`PeerMemory`]: shared between the daemon's
//! workers, bounds-checked like any [`DmaMemory`]. The references are the
//! guest-physical pieces the sender's MR translated its message into when
//! it sent the packet (its `lkey`, PD and bounds checked then, as for a
//! gather); the receiver reads them when it handles the packet. A sender
//! must not change or deregister a buffer before its work completes
//! (`ibv_post_send(3)`), and a completion comes only after the receiver's
//! ACK, so the bytes read are the ones sent.

use std::sync::Arc;

use crate::mem::{DmaMemory, MemError};

pub use crate::mem::PeerMemory;

/// Bytes of one piece entry: guest-physical address (8, big-endian) and
/// length (4, big-endian).
pub const PIECE_LEN: usize = 12;

/// Bytes of a payload in a [`PeerMemory`]: the concatenation of its
/// pieces, from byte `skip` on, `len` bytes.
#[derive(Clone, Copy)]
pub struct PeerData<'a> {
    mem: &'a dyn PeerMemory,
    /// Entries of [`PIECE_LEN`] bytes.
    pieces: &'a [u8],
    skip: usize,
    len: usize,
}

impl std::fmt::Debug for PeerData<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerData")
            .field("pieces", &(self.pieces.len() / PIECE_LEN))
            .field("skip", &self.skip)
            .field("len", &self.len)
            .finish()
    }
}

impl PartialEq for PeerData<'_> {
    fn eq(&self, o: &Self) -> bool {
        std::ptr::addr_eq(self.mem, o.mem)
            && (self.pieces, self.skip, self.len) == (o.pieces, o.skip, o.len)
    }
}

impl<'a> PeerData<'a> {
    /// The payload whose piece entries are `pieces` in `mem`; `None` when
    /// `pieces` is not whole entries or their lengths overflow.
    pub fn new(mem: &'a dyn PeerMemory, pieces: &'a [u8]) -> Option<Self> {
        if !pieces.len().is_multiple_of(PIECE_LEN) {
            return None;
        }
        let mut len = 0usize;
        for e in pieces.chunks_exact(PIECE_LEN) {
            len = len.checked_add(piece(e).1)?;
        }
        Some(PeerData {
            mem,
            pieces,
            skip: 0,
            len,
        })
    }

    /// Calls `f(gpa, offset, n)` for each piece of the payload, in order:
    /// `n` bytes at `gpa` of the peer's memory are payload bytes `offset..`.
    fn for_each(
        &self,
        mut f: impl FnMut(u64, usize, usize) -> Result<(), MemError>,
    ) -> Result<(), MemError> {
        let (mut skip, mut done) = (self.skip, 0usize);
        for e in self.pieces.chunks_exact(PIECE_LEN) {
            if done == self.len {
                break;
            }
            let (gpa, n) = piece(e);
            if skip >= n {
                skip -= n;
                continue;
            }
            let m = (n - skip).min(self.len - done);
            let err = MemError { addr: gpa, len: n };
            f(gpa.checked_add(skip as u64).ok_or(err)?, done, m)?;
            done += m;
            skip = 0;
        }
        // `new` summed the pieces; a slice stays within them.
        debug_assert_eq!(done, self.len);
        Ok(())
    }
}

/// The address and length of a piece entry.
fn piece(e: &[u8]) -> (u64, usize) {
    let mut a = [0u8; 8];
    let mut l = [0u8; 4];
    a.copy_from_slice(&e[..8]);
    l.copy_from_slice(&e[8..PIECE_LEN]);
    (u64::from_be_bytes(a), u32::from_be_bytes(l) as usize)
}

/// Appends the piece entry for `len` bytes at `gpa` to `out`.
pub fn push_piece(out: &mut Vec<u8>, gpa: u64, len: u32) {
    out.extend_from_slice(&gpa.to_be_bytes());
    out.extend_from_slice(&len.to_be_bytes());
}

/// A packet's payload ([`crate::batch::Packet::data`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Data<'a> {
    /// In the frame.
    Bytes(&'a [u8]),
    /// In the sending device's memory.
    Peer(PeerData<'a>),
}

impl<'a> Data<'a> {
    /// Length, bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::Bytes(b) => b.len(),
            Data::Peer(p) => p.len,
        }
    }

    /// True when there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes `off..off + n`; `None` past the end.
    pub fn slice(&self, off: usize, n: usize) -> Option<Data<'a>> {
        let end = off.checked_add(n).filter(|&e| e <= self.len())?;
        Some(match self {
            Data::Bytes(b) => Data::Bytes(&b[off..end]),
            Data::Peer(p) => Data::Peer(PeerData {
                skip: p.skip + off,
                len: n,
                ..*p
            }),
        })
    }

    /// Copies the bytes to `gpa` of `dst`: from the peer's memory straight
    /// into `dst` for [`Data::Peer`]. Errors: the first access out of
    /// either memory's bounds (bytes before it may have been written).
    pub fn write_to(&self, dst: &dyn DmaMemory, gpa: u64) -> Result<(), MemError> {
        match self {
            Data::Bytes(b) => dst.write(gpa, b),
            Data::Peer(p) => p.for_each(|src, off, n| {
                let at = gpa
                    .checked_add(off as u64)
                    .ok_or(MemError { addr: gpa, len: n })?;
                dst.copy_from_peer(at, p.mem, src, n)
            }),
        }
    }

    /// The bytes in a vector of their own (a copy out of the peer's
    /// memory for [`Data::Peer`]). Errors: an access out of the peer's
    /// bounds.
    pub fn to_vec(&self) -> Result<Vec<u8>, MemError> {
        match self {
            Data::Bytes(b) => Ok(b.to_vec()),
            Data::Peer(p) => {
                let mut v = vec![0; p.len];
                p.for_each(|src, off, n| p.mem.read(src, &mut v[off..off + n]))?;
                Ok(v)
            }
        }
    }
}

/// Which destination MACs a link delivers within the process
/// ([`crate::link::LinkCaps::local_macs`]): a predicate shared with the device, which asks
/// it once per RoCEv2 frame it emits. A destination that leaves between
/// the question and the delivery (a function deleted) gets one frame
/// without an ICRC on the wire, which its receiver drops as corrupt; RC
/// retransmits it with one. (A batch, [`crate::batch::gso`], is split into
/// sealed frames by the switch instead.)
#[derive(Clone)]
pub struct LocalMacs(Arc<dyn LocalReach>);

/// What a link knows of the destinations it reaches within the process
/// ([`LocalMacs`]).
pub trait LocalReach: Send + Sync {
    /// Whether frames to `mac` stay in the process.
    fn contains(&self, mac: &[u8; 6]) -> bool;
    /// Whether packets to `mac` may leave their payload in this device's
    /// memory ([`crate::batch::gso::append_peer`]): the destination reads
    /// it there ([`LocalReach::memory_of`] of this device's MAC, on its
    /// side). `false` by default.
    fn by_reference(&self, _mac: &[u8; 6]) -> bool {
        false
    }
    /// The memory of the device at `mac`, which packets from it may refer
    /// to; `None` by default.
    fn memory_of(&self, _mac: &[u8; 6]) -> Option<Arc<dyn PeerMemory>> {
        None
    }
}

/// A [`LocalReach`] that is a predicate on MACs and nothing more.
struct MacPredicate<F>(F);

impl<F: Fn(&[u8; 6]) -> bool + Send + Sync> LocalReach for MacPredicate<F> {
    fn contains(&self, mac: &[u8; 6]) -> bool {
        (self.0)(mac)
    }
}

impl LocalMacs {
    /// The MACs for which `f` is true (no payload by reference).
    pub fn new(f: impl Fn(&[u8; 6]) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(MacPredicate(f)))
    }

    /// What `reach` knows.
    pub fn with(reach: impl LocalReach + 'static) -> Self {
        Self(Arc::new(reach))
    }

    /// Whether frames to `mac` stay in the process.
    pub fn contains(&self, mac: &[u8; 6]) -> bool {
        self.0.contains(mac)
    }

    /// [`LocalReach::by_reference`].
    pub fn by_reference(&self, mac: &[u8; 6]) -> bool {
        self.0.by_reference(mac)
    }

    /// [`LocalReach::memory_of`].
    pub fn memory_of(&self, mac: &[u8; 6]) -> Option<Arc<dyn PeerMemory>> {
        self.0.memory_of(mac)
    }
}

impl std::fmt::Debug for LocalMacs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalMacs(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;

    #[test]
    fn peer_data_copies_its_pieces_in_order_and_slices() {
        let src = VecMemory::new(0, 0x3000);
        let bytes: Vec<u8> = (0..0x3000u32).map(|i| (i * 7) as u8).collect();
        src.write(0, &bytes).unwrap();
        // 100 bytes at 0x2f00, then 50 at 0x10, then 30 at 0x1000.
        let mut pieces = Vec::new();
        for (gpa, n) in [(0x2f00u64, 100u32), (0x10, 50), (0x1000, 30)] {
            push_piece(&mut pieces, gpa, n);
        }
        let d = Data::Peer(PeerData::new(&src, &pieces).unwrap());
        let want: Vec<u8> = [
            &bytes[0x2f00..0x2f64],
            &bytes[0x10..0x42],
            &bytes[0x1000..0x101e],
        ]
        .concat();
        assert_eq!(d.len(), 180);
        assert_eq!(d.to_vec().unwrap(), want);
        let dst = VecMemory::new(0x8000, 0x1000);
        d.write_to(&dst, 0x8100).unwrap();
        let mut got = vec![0; 180];
        DmaMemory::read(&dst, 0x8100, &mut got).unwrap();
        assert_eq!(got, want);
        // Every slice reads the same bytes as the slice of the whole.
        for (off, n) in [(0, 180), (99, 2), (100, 50), (120, 60), (179, 1), (180, 0)] {
            let s = d.slice(off, n).unwrap();
            assert_eq!(s.to_vec().unwrap(), want[off..off + n], "{off}+{n}");
        }
        assert!(d.slice(100, 81).is_none() && d.slice(usize::MAX, 2).is_none());
        // Out of the peer's bounds: an error, not a panic.
        let mut bad = Vec::new();
        push_piece(&mut bad, 0x2fff, 2);
        let b = Data::Peer(PeerData::new(&src, &bad).unwrap());
        assert!(b.to_vec().is_err() && b.write_to(&dst, 0x8000).is_err());
        // Not whole entries.
        assert!(PeerData::new(&src, &pieces[..13]).is_none());
    }
}
