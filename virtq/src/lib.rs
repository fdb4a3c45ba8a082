//! The driver side of a split virtqueue (virtio 1.2 §2.7), one
//! implementation for every driver of vrnic:
//!
//! - the virtio-pci user-space driver (`vrnic_guest::pci`: rings in DMA
//!   memory) and the containers' vhost-user driver
//!   (`vrnic_guest::vhost_user`: rings in a shared memfd), through
//!   [`SplitQueue`];
//! - the guest agent's shared doorbell ring (`vrnic_guest::dbring`: one
//!   ring several processes post to, in order, under a lock in the shared
//!   memory), through the stateless [`Ring`] view, since its producers
//!   cannot share a private free list;
//! - the daemon's test vhost-user frontend (`vrnic_frontend`: rings in
//!   its memfd guest RAM, `VIRTIO_F_EVENT_IDX` negotiated or not), through
//!   [`SplitQueue`], and [`Ring`] for its hostile writes.
//!
//! The parts:
//!
//! - [`QueueLayout`]: where the descriptor table, available ring and used
//!   ring lie in one allocation (§2.7, alignments of §2.7.1 table).
//! - [`RingMemory`]: how the rings' memory is reached; [`RawMemory`] is
//!   memory mapped in this process (DMA memory, a shared mapping).
//! - [`Ring`]: every access to the rings' fields, with the memory orders
//!   of §2.7.13 and §2.7.14 and the kick decision of §2.7.10
//!   ([`need_event`]).
//! - [`SplitQueue`]: the driver's private state over a [`Ring`]: the free
//!   list, chains in flight, the avail index it published and the used
//!   index it has reached. Nothing the device writes is trusted: a used id
//!   that is not the head of a chain in flight, or a used index more than a
//!   queue ahead, is an error ([`VirtqError`]), never a panic.
//! - [`barrier`]: the full barrier between the driver's index write and
//!   its read of the device's suppression field.
//!
//! No dependency on the engine: the crate knows virtio rings, nothing of
//! what travels in them.
#![deny(missing_docs)]

pub mod barrier;
mod layout;
mod memory;
mod queue;
mod ring;
#[cfg(any(test, feature = "sim"))]
pub mod sim;

pub use layout::QueueLayout;
pub use memory::{RawMemory, RingMemory};
pub use queue::{QueueConfig, SplitQueue};
pub use ring::Ring;

/// Descriptor flag (§2.7.5, `VIRTQ_DESC_F_NEXT`): the buffer continues in
/// the descriptor named by `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag (`VIRTQ_DESC_F_WRITE`): the buffer is device-writable
/// (otherwise device-readable).
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Available ring flag (§2.7.6, `VIRTQ_AVAIL_F_NO_INTERRUPT`): the driver
/// does not want interrupts (used only without `VIRTIO_F_EVENT_IDX`).
pub const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used ring flag (§2.7.8, `VIRTQ_USED_F_NO_NOTIFY`): the device does not
/// want notifications (used only without `VIRTIO_F_EVENT_IDX`).
pub const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Largest split virtqueue size, descriptors (§2.7).
pub const MAX_SPLIT_QUEUE_SIZE: u16 = 32768;

/// The event-index test of §2.7.10 (`vring_need_event`): whether moving an
/// index from `old` to `new` passes `event`, i.e. whether `event` lies in
/// `[old, new)` in the 16-bit circular index space. The driver kicks when
/// the avail index passes the device's `avail_event`; a device interrupts
/// when the used index passes the driver's `used_event`.
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// One buffer of a descriptor chain (`struct virtq_desc` without its
/// `flags` and `next`, which the queue fills in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufDesc {
    /// Guest-physical address (the device's address of the buffer).
    pub addr: u64,
    /// Length, bytes.
    pub len: u32,
    /// Device-writable (otherwise device-readable).
    pub writable: bool,
}

impl BufDesc {
    /// A device-readable buffer of `len` bytes at `addr`.
    pub fn readable(addr: u64, len: u32) -> Self {
        BufDesc {
            addr,
            len,
            writable: false,
        }
    }

    /// A device-writable buffer of `len` bytes at `addr`.
    pub fn writable(addr: u64, len: u32) -> Self {
        BufDesc {
            addr,
            len,
            writable: true,
        }
    }
}

/// A chain the device has finished with (`struct virtq_used_elem`, §2.7.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index of the chain, as [`SplitQueue::add`] returned it.
    pub id: u16,
    /// Bytes the device says it wrote into the chain's writable buffers
    /// (untrusted: the device's word).
    pub len: u32,
}

/// Errors of a [`SplitQueue`] or [`Ring`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VirtqError {
    /// The queue size is not a power of two in 1..=32768.
    #[error("invalid split virtqueue size {0}")]
    BadSize(u32),
    /// The ring memory is shorter than the layout needs.
    #[error("ring memory of {len} bytes, the layout needs {needed}")]
    TooSmall {
        /// Bytes of memory.
        len: usize,
        /// Bytes the layout needs ([`QueueLayout::len`]).
        needed: usize,
    },
    /// The ring memory is not aligned to [`QueueLayout::ALIGN`].
    #[error("ring memory at {0:#x} is not {align}-byte aligned", align = QueueLayout::ALIGN)]
    Misaligned(usize),
    /// `add` of a chain with no buffers.
    #[error("empty descriptor chain")]
    EmptyChain,
    /// Not enough free descriptors for the chain.
    #[error("virtqueue full: chain needs {needed} descriptors, {free} free")]
    Full {
        /// Descriptors the chain needs.
        needed: usize,
        /// Descriptors free.
        free: u16,
    },
    /// A device-readable buffer after a device-writable one (§2.7.4.2).
    #[error("device-readable buffer after a device-writable one")]
    ReadableAfterWritable,
    /// The device returned an id that is not the head of a chain in flight.
    #[error("device returned descriptor id {0}, which is not in flight")]
    BadUsedId(u32),
    /// The device's used index ran more than a queue size ahead.
    #[error("device used index {used} is {ahead} entries ahead (queue size {size})")]
    BadUsedIdx {
        /// The device's `used.idx`.
        used: u16,
        /// How far ahead of the driver it is.
        ahead: u16,
        /// Queue size.
        size: u16,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn need_event_is_the_specs_window_test() {
        // Moving 10 -> 13 passes 10, 11 and 12, not 13 or 9.
        assert!(need_event(10, 13, 10));
        assert!(need_event(12, 13, 10));
        assert!(!need_event(13, 13, 10));
        assert!(!need_event(9, 13, 10));
        // Nothing moved: never.
        assert!(!need_event(5, 5, 5));
        // Across the 16-bit wrap: 65534 -> 2 passes 65534, 65535, 0, 1.
        for e in [65534, 65535, 0, 1] {
            assert!(need_event(e, 2, 65534), "event {e}");
        }
        for e in [2, 3, 65533, 32768] {
            assert!(!need_event(e, 2, 65534), "event {e}");
        }
        // A whole 65535-entry move passes everything but `new`.
        assert!(need_event(7, 6, 7));
        assert!(!need_event(6, 6, 7));
    }
}
