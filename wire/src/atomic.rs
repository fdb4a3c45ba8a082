//! Atomic Extended Transport Header (IBTA Vol 1 9.3.4) and Atomic
//! Acknowledge Extended Transport Header (9.3.5.3).

use super::{need, WireError};

big_endian_header! {
    /// The parsed AtomicETH: 28 bytes, big-endian (IBTA 9.3.4, Figure 103).
    ///
    /// ```text
    /// bytes 0-7    virtual address (8-byte aligned)
    /// bytes 8-11   R_Key
    /// bytes 12-19  swap (CmpSwap) or add (FetchAdd) data
    /// bytes 20-27  compare data (CmpSwap; ignored by FetchAdd)
    /// ```
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AtomicEth {
        /// Remote virtual address of the 8-byte operand.
        pub va: u64,
        /// Remote key of the memory region.
        pub rkey: u32,
        /// Value to swap in (CmpSwap) or to add (FetchAdd).
        pub swap_add: u64,
        /// Value to compare against (CmpSwap only).
        pub compare: u64,
    }
}

big_endian_header! {
    /// The parsed AtomicAckETH: the original remote value, 8 bytes, big-endian
    /// (IBTA 9.3.5.3). Follows the AETH in an ATOMIC ACKNOWLEDGE.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AtomicAckEth {
        /// The value at the remote address before the atomic operation.
        pub orig: u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_layout_and_truncation() {
        let a = AtomicEth {
            va: 0x1122_3344_5566_7788,
            rkey: 0x99aa_bbcc,
            swap_add: 0x0102_0304_0506_0708,
            compare: 0xf0f1_f2f3_f4f5_f6f7,
        };
        let mut b = [0u8; 28];
        a.emit(&mut b);
        assert_eq!(&b[..8], &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
        assert_eq!(&b[8..12], &[0x99, 0xaa, 0xbb, 0xcc]);
        assert_eq!(&b[12..20], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&b[20..], &[0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7]);
        assert_eq!(AtomicEth::parse(&b), Ok(a));
        for n in 0..28 {
            assert_eq!(AtomicEth::parse(&b[..n]), Err(WireError::Truncated));
        }
    }

    #[test]
    fn atomic_ack_eth_layout_and_truncation() {
        let a = AtomicAckEth {
            orig: 0x0102_0304_0506_0708,
        };
        let mut b = [0u8; 8];
        a.emit(&mut b);
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(AtomicAckEth::parse(&b), Ok(a));
        for n in 0..8 {
            assert_eq!(AtomicAckEth::parse(&b[..n]), Err(WireError::Truncated));
        }
    }
}
