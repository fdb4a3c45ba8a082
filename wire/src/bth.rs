//! Base Transport Header (IBTA Vol 1 9.2, Figure 98 / Table 39).

use super::{be16, be24, need, Opcode, WireError};

/// The parsed Base Transport Header: 12 bytes, big-endian (IBTA 9.2).
///
/// ```text
/// byte 0      opcode
/// byte 1      SE(7) M(6) PadCnt(5..4) TVer(3..0)
/// bytes 2-3   P_Key
/// byte 4      FECN(7) BECN(6) reserved(5..0)
/// bytes 5-7   DestQP (24 bits)
/// byte 8      AckReq(7) reserved(6..0)
/// bytes 9-11  PSN (24 bits)
/// ```
///
/// Reserved bits are ignored on parse and written as 0 on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// The operation (IBTA Table 38).
    pub opcode: Opcode,
    /// SE: Solicited Event; the responder should raise a completion event.
    pub solicited: bool,
    /// M: migration request/state (APM); 0 unless migrating paths.
    pub mig_req: bool,
    /// PadCnt: 0-3 pad bytes appended to the payload to reach a multiple of
    /// 4 bytes. Only the low 2 bits are emitted.
    pub pad_count: u8,
    /// TVer: transport header version, 0 (low 4 bits emitted). `parse`
    /// returns any value; [`super::parse_frame`] rejects non-zero ones.
    pub tver: u8,
    /// P_Key: partition key (0xffff is the default full-member key).
    pub pkey: u16,
    /// FECN: forward explicit congestion notification (masked in the ICRC).
    pub fecn: bool,
    /// BECN: backward explicit congestion notification (masked in the ICRC).
    pub becn: bool,
    /// Destination QP number, 24 bits (higher bits are dropped on emit).
    pub dest_qp: u32,
    /// AckReq: the requester asks for an acknowledgement of this packet.
    pub ack_req: bool,
    /// Packet sequence number, 24 bits (higher bits are dropped on emit).
    pub psn: u32,
}

impl Bth {
    /// Length of the BTH on the wire, in bytes.
    pub const LEN: usize = 12;

    /// Parses `buf[..12]`.
    ///
    /// Errors: [`WireError::Truncated`] if `buf` is shorter than 12 bytes,
    /// [`WireError::UnknownOpcode`] for opcodes outside [`Opcode`].
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        let opcode = Opcode::from_u8(b[0]).ok_or(WireError::UnknownOpcode(b[0]))?;
        Ok(Bth {
            opcode,
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad_count: (b[1] >> 4) & 0x3,
            tver: b[1] & 0xf,
            pkey: be16(&b[2..]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: be24(&b[5..]),
            ack_req: b[8] & 0x80 != 0,
            psn: be24(&b[9..]),
        })
    }

    /// Writes the header into `buf[..12]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..Self::LEN];
        b[0] = self.opcode as u8;
        b[1] = (u8::from(self.solicited) << 7)
            | (u8::from(self.mig_req) << 6)
            | ((self.pad_count & 0x3) << 4)
            | (self.tver & 0xf);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4..8].copy_from_slice(&(self.dest_qp & 0x00ff_ffff).to_be_bytes());
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        b[8..12].copy_from_slice(&(self.psn & 0x00ff_ffff).to_be_bytes());
        b[8] = u8::from(self.ack_req) << 7;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Bth {
        Bth {
            opcode: Opcode::RcWriteOnlyImm,
            solicited: true,
            mig_req: false,
            pad_count: 3,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: true,
            dest_qp: 0x12_3456,
            ack_req: true,
            psn: 0xab_cdef,
        }
    }

    #[test]
    fn layout() {
        let mut b = [0u8; 12];
        sample().emit(&mut b);
        assert_eq!(
            b,
            [0x0b, 0xb0, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef]
        );
        assert_eq!(Bth::parse(&b), Ok(sample()));
    }

    #[test]
    fn reserved_bits_ignored_and_24_bit_fields_masked() {
        let mut b = [0u8; 12];
        Bth {
            dest_qp: 0xff00_0001,
            psn: 0x0100_0002,
            ..sample()
        }
        .emit(&mut b);
        let p = Bth::parse(&b).unwrap();
        assert_eq!((p.dest_qp, p.psn), (1, 2));
        b[4] |= 0x3f;
        b[8] |= 0x7f;
        assert_eq!(
            Bth::parse(&b).unwrap(),
            Bth {
                dest_qp: 1,
                psn: 2,
                ..sample()
            }
        );
    }

    #[test]
    fn errors() {
        let mut b = [0u8; 12];
        sample().emit(&mut b);
        for n in 0..12 {
            assert_eq!(Bth::parse(&b[..n]), Err(WireError::Truncated));
        }
        b[0] = 0x15;
        assert_eq!(Bth::parse(&b), Err(WireError::UnknownOpcode(0x15)));
    }
}
