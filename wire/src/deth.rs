//! Datagram Extended Transport Header (IBTA Vol 1 9.3.2).

use super::{be24, be32, need, WireError};

/// The parsed DETH: 8 bytes, big-endian (IBTA 9.3.2, Figure 101).
///
/// ```text
/// bytes 0-3  Q_Key
/// byte  4    reserved
/// bytes 5-7  source QP (24 bits)
/// ```
///
/// Carried by UD SEND packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Queue key the destination QP checks.
    pub qkey: u32,
    /// Source QP number, 24 bits (higher bits are dropped on emit).
    pub src_qp: u32,
}

impl Deth {
    /// Length of the DETH on the wire, in bytes.
    pub const LEN: usize = 8;

    /// Parses `buf[..8]`; [`WireError::Truncated`] if `buf` is shorter.
    /// The reserved byte is ignored.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(Deth {
            qkey: be32(b),
            src_qp: be24(&b[5..]),
        })
    }

    /// Writes the header into `buf[..8]` (reserved byte 0). Panics if `buf`
    /// is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[..4].copy_from_slice(&self.qkey.to_be_bytes());
        buf[4..8].copy_from_slice(&(self.src_qp & 0x00ff_ffff).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_truncation() {
        let d = Deth {
            qkey: 0x8001_0000,
            src_qp: 0xab_cdef,
        };
        let mut b = [0xffu8; 8];
        d.emit(&mut b);
        assert_eq!(b, [0x80, 1, 0, 0, 0, 0xab, 0xcd, 0xef]);
        assert_eq!(Deth::parse(&b), Ok(d));
        b[4] = 0x77;
        assert_eq!(Deth::parse(&b), Ok(d));
        for n in 0..8 {
            assert_eq!(Deth::parse(&b[..n]), Err(WireError::Truncated));
        }
    }
}
