//! Where a split virtqueue's three parts lie in one allocation.

use crate::{VirtqError, MAX_SPLIT_QUEUE_SIZE};

/// Placement of a split virtqueue's three parts in one contiguous
/// allocation (§2.7: descriptor table aligned 16, available ring 2, used
/// ring 4). Offsets and lengths in bytes from the allocation's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    /// Queue size (descriptors), a power of two.
    pub size: u16,
    /// Offset of the descriptor table (16 bytes per descriptor), 0.
    pub desc: usize,
    /// Offset of the available ring (`flags, idx, ring[size], used_event`).
    pub avail: usize,
    /// Offset of the used ring (`flags, idx, ring[size] of {id, len}, avail_event`).
    pub used: usize,
    /// Total length; the allocation must be [`QueueLayout::ALIGN`]-aligned.
    pub len: usize,
}

impl QueueLayout {
    /// Required alignment of the allocation, bytes (the descriptor table's, §2.7).
    pub const ALIGN: usize = 16;

    /// The layout for `size` descriptors: the table, the available ring
    /// right after it, the used ring at the next multiple of 4. Errors:
    /// `size` not a power of two in 1..=32768 ([`VirtqError::BadSize`]).
    pub fn new(size: u16) -> Result<Self, VirtqError> {
        if size == 0 || !size.is_power_of_two() || size > MAX_SPLIT_QUEUE_SIZE {
            return Err(VirtqError::BadSize(size.into()));
        }
        let n = size as usize;
        let avail = 16 * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        Ok(QueueLayout {
            size,
            desc: 0,
            avail,
            used,
            len: used + 6 + 8 * n,
        })
    }

    /// Offset of `used_event` (the available ring's last field, §2.7.6).
    pub fn used_event(&self) -> usize {
        self.avail + 4 + 2 * self.size as usize
    }

    /// Offset of `avail_event` (the used ring's last field, §2.7.8).
    pub fn avail_event(&self) -> usize {
        self.used + 4 + 8 * self.size as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_spec_alignment() {
        let l = QueueLayout::new(256).unwrap();
        assert_eq!((l.desc, l.avail, l.used), (0, 4096, 4096 + 520));
        assert_eq!(l.len, 4096 + 520 + 6 + 8 * 256);
        assert_eq!(l.used_event(), 4096 + 4 + 512);
        assert_eq!(l.avail_event(), 4096 + 520 + 4 + 2048);
        let l = QueueLayout::new(1).unwrap();
        assert_eq!(l.used % 4, 0);
        assert!(QueueLayout::new(32768).is_ok());
        assert_eq!(QueueLayout::new(0), Err(VirtqError::BadSize(0)));
        assert!(QueueLayout::new(3).is_err());
        assert!(QueueLayout::new(65535).is_err());
    }
}
