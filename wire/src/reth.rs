//! RDMA Extended Transport Header (IBTA Vol 1 9.3.3).

use super::{need, WireError};

big_endian_header! {
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
