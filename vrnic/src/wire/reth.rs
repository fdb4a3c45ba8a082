//! RDMA Extended Transport Header (IBTA Vol 1 9.3.3).

use super::{be32, be64, need, WireError};

/// The parsed RETH: 16 bytes, big-endian (IBTA 9.3.3, Figure 102).
///
/// ```text
/// bytes 0-7    virtual address
/// bytes 8-11   R_Key
/// bytes 12-15  DMA length (bytes)
/// ```
///
/// Carried by RDMA WRITE FIRST/ONLY and RDMA READ REQUEST.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Remote virtual address of the first byte to access.
    pub va: u64,
    /// Remote key of the memory region.
    pub rkey: u32,
    /// Length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

impl Reth {
    /// Length of the RETH on the wire, in bytes.
    pub const LEN: usize = 16;

    /// Parses `buf[..16]`; [`WireError::Truncated`] if `buf` is shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(Reth {
            va: be64(b),
            rkey: be32(&b[8..]),
            dma_len: be32(&b[12..]),
        })
    }

    /// Writes the header into `buf[..16]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[..8].copy_from_slice(&self.va.to_be_bytes());
        buf[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        buf[12..16].copy_from_slice(&self.dma_len.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_truncation() {
        let r = Reth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            dma_len: 0x1000,
        };
        let mut b = [0u8; 16];
        r.emit(&mut b);
        assert_eq!(
            b,
            [1, 2, 3, 4, 5, 6, 7, 8, 0xa, 0xb, 0xc, 0xd, 0, 0, 0x10, 0]
        );
        assert_eq!(Reth::parse(&b), Ok(r));
        for n in 0..16 {
            assert_eq!(Reth::parse(&b[..n]), Err(WireError::Truncated));
        }
    }
}
