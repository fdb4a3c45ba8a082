//! Immediate Data (IBTA Vol 1 9.3.6) and Invalidate (9.3.7) extended
//! transport headers: 4 bytes each.

use super::{need, WireError};

/// The ImmDt header: 4 opaque bytes, copied to the receive completion as is
/// (IBTA 9.3.6). Kept as bytes because verbs hand it over in network order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Immdt(pub [u8; 4]);

impl Immdt {
    /// Length of the ImmDt on the wire, in bytes.
    pub const LEN: usize = 4;

    /// Parses `buf[..4]`; [`WireError::Truncated`] if `buf` is shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(Immdt([b[0], b[1], b[2], b[3]]))
    }

    /// Writes the 4 bytes into `buf[..4]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[..4].copy_from_slice(&self.0);
    }
}

big_endian_header! {
    /// The IETH: the R_Key to invalidate at the responder, big-endian (IBTA
    /// 9.3.7). Carried by SEND LAST/ONLY with Invalidate.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Ieth {
        /// The R_Key the responder invalidates.
        pub rkey: u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_truncation() {
        let mut b = [0u8; 4];
        Immdt([1, 2, 3, 4]).emit(&mut b);
        assert_eq!(b, [1, 2, 3, 4]);
        assert_eq!(Immdt::parse(&b), Ok(Immdt([1, 2, 3, 4])));
        Ieth { rkey: 0xdead_beef }.emit(&mut b);
        assert_eq!(b, [0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(Ieth::parse(&b), Ok(Ieth { rkey: 0xdead_beef }));
        for n in 0..4 {
            assert_eq!(Immdt::parse(&b[..n]), Err(WireError::Truncated));
            assert_eq!(Ieth::parse(&b[..n]), Err(WireError::Truncated));
        }
    }
}
