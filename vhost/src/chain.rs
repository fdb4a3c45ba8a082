//! Descriptor chains as lists of buffers (virtio 1.2 §2.7.4 "Message
//! Framing", §2.7.5 "The Virtqueue Descriptor Table"): splitting a chain
//! into its device-readable and device-writable parts, gathering from and
//! scattering into them through bounds-checked memory.

use vrnic::mem::{DmaMemory, MemError};

use crate::memory::GuestMem;

/// One descriptor of a chain: a guest-physical buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest-physical address of the buffer.
    pub addr: u64,
    /// Length, bytes.
    pub len: u32,
    /// Device-writable (`VIRTQ_DESC_F_WRITE`).
    pub writable: bool,
}

/// Why a chain cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// A device-readable descriptor follows a device-writable one
    /// (virtio 1.2 §2.7.4.2: the driver MUST place writable descriptors
    /// after readable ones).
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
}

/// Splits `segs` into its device-readable prefix and device-writable
/// suffix.
///
/// # Errors
/// [`ChainError::ReadableAfterWritable`] when the two are interleaved.
pub fn split(segs: &[Segment]) -> Result<(&[Segment], &[Segment]), ChainError> {
    let first_w = segs.iter().position(|s| s.writable).unwrap_or(segs.len());
    let (r, w) = segs.split_at(first_w);
    if w.iter().any(|s| !s.writable) {
        return Err(ChainError::ReadableAfterWritable);
    }
    Ok((r, w))
}

/// Total length of `segs`, bytes (saturating; a chain holds at most 2^32
/// bytes, virtio 1.2 §2.7.5.2).
pub fn total_len(segs: &[Segment]) -> u64 {
    segs.iter().map(|s| u64::from(s.len)).sum()
}

/// Copies the first `out.len()` bytes held by `segs` (or all of them, if
/// fewer) into `out`. Returns the number of bytes copied.
///
/// # Errors
/// [`MemError`] when a buffer that is needed lies outside guest memory.
pub fn gather(mem: &dyn DmaMemory, segs: &[Segment], out: &mut [u8]) -> Result<usize, MemError> {
    let mut done = 0;
    for s in segs {
        if done == out.len() {
            break;
        }
        let n = (s.len as usize).min(out.len() - done);
        mem.read(s.addr, &mut out[done..done + n])?;
        done += n;
    }
    Ok(done)
}

/// Copies `data` into the buffers of `segs`, in order. Returns the number of
/// bytes copied (less than `data.len()` when the buffers are shorter).
///
/// # Errors
/// [`MemError`] when a buffer that is needed lies outside guest memory.
pub fn scatter(mem: &dyn DmaMemory, segs: &[Segment], data: &[u8]) -> Result<usize, MemError> {
    let mut done = 0;
    for s in segs {
        if done == data.len() {
            break;
        }
        let n = (s.len as usize).min(data.len() - done);
        mem.write(s.addr, &data[done..done + n])?;
        done += n;
    }
    Ok(done)
}

/// Whether the first `len` bytes held by `segs` all lie in guest memory.
pub fn in_memory(mem: &GuestMem<'_>, segs: &[Segment], len: usize) -> bool {
    let mut left = len;
    for s in segs {
        if left == 0 {
            break;
        }
        let n = (s.len as usize).min(left);
        if !mem.contains(s.addr, n) {
            return false;
        }
        left -= n;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrnic::mem::VecMemory;

    fn r(addr: u64, len: u32) -> Segment {
        Segment {
            addr,
            len,
            writable: false,
        }
    }
    fn w(addr: u64, len: u32) -> Segment {
        Segment {
            addr,
            len,
            writable: true,
        }
    }

    #[test]
    fn split_orders_readable_before_writable() {
        let segs = [r(0, 8), r(8, 8), w(16, 8)];
        let (rd, wr) = split(&segs).unwrap();
        assert_eq!(rd.len(), 2);
        assert_eq!(wr.len(), 1);
        assert_eq!(split(&[r(0, 1)]).unwrap().1.len(), 0);
        assert_eq!(split(&[w(0, 1)]).unwrap().0.len(), 0);
        assert_eq!(
            split(&[w(0, 1), r(1, 1)]),
            Err(ChainError::ReadableAfterWritable)
        );
    }

    #[test]
    fn gather_and_scatter_cross_segments_and_stop_at_bounds() {
        let m = VecMemory::new(0x1000, 0x100);
        m.write(0x1000, &[1, 2, 3]).unwrap();
        m.write(0x1080, &[4, 5, 6]).unwrap();
        let segs = [r(0x1000, 3), r(0x1080, 3)];
        let mut out = [0u8; 5];
        assert_eq!(gather(&m, &segs, &mut out), Ok(5));
        assert_eq!(out, [1, 2, 3, 4, 5]);
        let mut big = [0u8; 10];
        assert_eq!(gather(&m, &segs, &mut big), Ok(6));

        let ws = [w(0x1010, 2), w(0x1020, 2)];
        assert_eq!(scatter(&m, &ws, &[7, 8, 9]), Ok(3));
        let mut b = [0u8; 2];
        m.read(0x1020, &mut b).unwrap();
        assert_eq!(b, [9, 0]);
        assert_eq!(scatter(&m, &ws, &[1; 8]), Ok(4));

        // A bad buffer is reported, but only when it is needed.
        let bad = [r(0x1000, 3), r(0xdead_0000, 3)];
        assert_eq!(gather(&m, &bad, &mut [0u8; 3]), Ok(3));
        assert!(gather(&m, &bad, &mut [0u8; 4]).is_err());
    }
}
