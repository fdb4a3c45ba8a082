//! Access to the memory the driver shares with the device ("guest-physical"
//! memory: a VM's RAM through the vhost-user memory table, a container's
//! shared regions, or a test's buffer).
//!
//! Every address and length that comes from a driver is untrusted: an access
//! outside the memory returns [`MemError`], never panics.

use std::sync::Mutex;

use crate::abi::Pod;

/// An access fell outside the shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("guest memory access out of range: address {addr:#x}, length {len} bytes")]
pub struct MemError {
    /// First guest-physical address of the access.
    pub addr: u64,
    /// Length of the access, bytes.
    pub len: usize,
}

/// Memory of another device of this process, read by this one (a
/// payload by reference, `crate::data`): its guest
/// memory, which outlives every packet that refers to it (the reference
/// is counted). Bounds-checked as [`DmaMemory`].
pub trait PeerMemory: Send + Sync + std::fmt::Debug {
    /// Copies `buf.len()` bytes at `gpa` into `buf`.
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// The implementation, for a [`DmaMemory`] that copies from it
    /// directly ([`DmaMemory::copy_from_peer`]).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Memory shared by a driver with the device, addressed by guest-physical
/// address (bytes). Implementations bounds-check every access.
pub trait DmaMemory {
    /// Copies `buf.len()` bytes at `gpa` into `buf`.
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// Copies `buf` to `gpa`.
    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError>;

    /// Copies `len` bytes at `src_gpa` of another device's memory `src` to
    /// `gpa` ([`crate::data::Data::Peer`]). The default goes through a
    /// buffer on the stack, 4 KiB at a time; a memory that knows `src`'s
    /// kind copies directly. Errors: the first access out of either's
    /// bounds.
    fn copy_from_peer(
        &self,
        gpa: u64,
        src: &dyn PeerMemory,
        src_gpa: u64,
        len: usize,
    ) -> Result<(), MemError> {
        bounce_copy(self, gpa, src, src_gpa, len)
    }

    /// Reads the little-endian u32 at `gpa` in one access, so a value the
    /// driver stores meanwhile is seen whole, old or new (a doorbell
    /// record's producer index, device spec §5.x.6.9). Errors: out of
    /// range, or `gpa` not 4-byte aligned. The default reads through
    /// [`DmaMemory::read`], for memories no other thread writes (tests).
    fn load_u32(&self, gpa: u64) -> Result<u32, MemError> {
        let mut b = [0u8; 4];
        if !gpa.is_multiple_of(4) {
            return Err(MemError { addr: gpa, len: 4 });
        }
        self.read(gpa, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Writes `v` as the little-endian u32 at `gpa` in one access
    /// ([`DmaMemory::load_u32`]'s counterpart: a doorbell record's flags).
    /// Errors: as `load_u32`.
    fn store_u32(&self, gpa: u64, v: u32) -> Result<(), MemError> {
        if !gpa.is_multiple_of(4) {
            return Err(MemError { addr: gpa, len: 4 });
        }
        self.write(gpa, &v.to_le_bytes())
    }

    /// Reads one ABI structure at `gpa`.
    fn read_obj<T: Pod>(&self, gpa: u64) -> Result<T, MemError>
    where
        Self: Sized,
    {
        let mut v = T::default();
        self.read(gpa, v.as_bytes_mut())?;
        Ok(v)
    }
}

/// [`DmaMemory::copy_from_peer`] through a buffer on the stack, 4 KiB at
/// a time: for memories that cannot copy from `src` directly.
pub fn bounce_copy<M: DmaMemory + ?Sized>(
    dst: &M,
    gpa: u64,
    src: &dyn PeerMemory,
    src_gpa: u64,
    len: usize,
) -> Result<(), MemError> {
    let mut buf = [0u8; 4096];
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(buf.len());
        let err = MemError { addr: gpa, len };
        let off = done as u64;
        src.read(src_gpa.checked_add(off).ok_or(err)?, &mut buf[..n])?;
        dst.write(gpa.checked_add(off).ok_or(err)?, &buf[..n])?;
        done += n;
    }
    Ok(())
}

/// Reads one ABI structure at `gpa` through a trait object.
pub fn read_obj<T: Pod>(mem: &dyn DmaMemory, gpa: u64) -> Result<T, MemError> {
    let mut v = T::default();
    mem.read(gpa, v.as_bytes_mut())?;
    Ok(v)
}

/// Writes one ABI structure at `gpa` through a trait object.
pub fn write_obj<T: Pod>(mem: &dyn DmaMemory, gpa: u64, v: &T) -> Result<(), MemError> {
    mem.write(gpa, v.as_bytes())
}

/// A flat test memory: guest-physical addresses `[base, base + size)`.
#[derive(Debug)]
pub struct VecMemory {
    base: u64,
    bytes: Mutex<Vec<u8>>,
}

impl VecMemory {
    /// `size` zeroed bytes starting at guest-physical address `base`.
    pub fn new(base: u64, size: usize) -> Self {
        Self {
            base,
            bytes: Mutex::new(vec![0; size]),
        }
    }

    fn range(
        &self,
        gpa: u64,
        len: usize,
        total: usize,
    ) -> Result<std::ops::Range<usize>, MemError> {
        let err = MemError { addr: gpa, len };
        let off = gpa.checked_sub(self.base).ok_or(err)?;
        let off = usize::try_from(off).map_err(|_| err)?;
        let end = off.checked_add(len).ok_or(err)?;
        if end > total {
            return Err(err);
        }
        Ok(off..end)
    }
}

impl DmaMemory for VecMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.range(gpa, buf.len(), bytes.len())?;
        buf.copy_from_slice(&bytes[r]);
        Ok(())
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let mut bytes = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        let r = self.range(gpa, buf.len(), bytes.len())?;
        bytes[r].copy_from_slice(buf);
        Ok(())
    }
}

/// A shared memory is a memory: `Arc<VecMemory>` for a test's device
/// whose memory another device reads ([`PeerMemory`]).
impl<T: DmaMemory + ?Sized> DmaMemory for std::sync::Arc<T> {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        (**self).read(gpa, buf)
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        (**self).write(gpa, buf)
    }

    fn copy_from_peer(
        &self,
        gpa: u64,
        src: &dyn PeerMemory,
        src_gpa: u64,
        len: usize,
    ) -> Result<(), MemError> {
        (**self).copy_from_peer(gpa, src, src_gpa, len)
    }
}

/// A test's memory read by another device of the process (through a
/// buffer: [`bounce_copy`]).
impl PeerMemory for VecMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        DmaMemory::read(self, gpa, buf)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::{DmaMemory, MemError, VecMemory};

    #[test]
    fn vec_memory_rejects_out_of_range() {
        let m = VecMemory::new(0x1000, 0x100);
        assert!(m.write(0x1000, &[1, 2, 3]).is_ok());
        let mut b = [0u8; 3];
        m.read(0x1000, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3]);
        assert_eq!(
            m.read(0xfff, &mut b),
            Err(MemError {
                addr: 0xfff,
                len: 3
            })
        );
        assert!(m.read(0x10fe, &mut b).is_err());
        assert!(m.write(u64::MAX, &[0]).is_err());
    }
}
