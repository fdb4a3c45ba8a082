//! ACK Extended Transport Header (IBTA Vol 1 9.3.5) and the RNR NAK timer
//! encoding (IBTA 9.7.5.2.8, Table 45).

use super::{be24, need, WireError};

/// The parsed AETH: 4 bytes, big-endian (IBTA 9.3.5, Figure 104).
///
/// ```text
/// byte 0      syndrome: reserved(7) kind(6..5) value(4..0)
/// bytes 1-3   MSN (24 bits)
/// ```
///
/// Carried by ACKNOWLEDGE, ATOMIC ACKNOWLEDGE and RDMA READ RESPONSE
/// FIRST/LAST/ONLY. Decode the syndrome with [`Aeth::kind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Aeth {
    /// The raw syndrome byte.
    pub syndrome: u8,
    /// Message sequence number, 24 bits (higher bits dropped on emit).
    pub msn: u32,
}

/// What an AETH syndrome says (IBTA 9.3.5, syndrome encoding): bits 6..5 are
/// 00 ACK, 01 RNR NAK, 11 NAK; the low 5 bits are the credit count, the RNR
/// timer or the NAK code. Bit 7 is reserved and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethKind {
    /// Positive acknowledgement; `credits` is the 5-bit encoded end-to-end
    /// credit count (31 = invalid / no flow control).
    Ack {
        /// Encoded credit count, 0-31.
        credits: u8,
    },
    /// Receiver not ready; retry after [`rnr_timer_ns`]`(timer)`.
    RnrNak {
        /// Encoded RNR timer, 0-31 (IBTA Table 45).
        timer: u8,
    },
    /// Negative acknowledgement with a defined code.
    Nak(NakCode),
    /// Reserved encodings (kind 10, or a NAK code above 4): the full
    /// syndrome byte.
    Reserved(u8),
}

/// NAK codes: the low 5 bits of a NAK syndrome (IBTA 9.3.5, NAK codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NakCode {
    /// The PSN was out of sequence; the requester retransmits from the
    /// AETH's PSN.
    PsnSequenceError = 0,
    /// Invalid request (unsupported opcode, bad length, ...).
    InvalidRequest = 1,
    /// Remote access error (R_Key, bounds, rights).
    RemoteAccessError = 2,
    /// Remote operational error (responder failure).
    RemoteOperationalError = 3,
    /// Invalid RD request (RD only).
    InvalidRdRequest = 4,
}

impl NakCode {
    /// The NAK code with value `v` (0-4), or `None` for reserved values.
    pub fn from_u8(v: u8) -> Option<NakCode> {
        Some(match v {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            _ => return None,
        })
    }
}

const KIND_ACK: u8 = 0b00 << 5;
const KIND_RNR: u8 = 0b01 << 5;
const KIND_NAK: u8 = 0b11 << 5;

impl Aeth {
    /// Length of the AETH on the wire, in bytes.
    pub const LEN: usize = 4;

    /// An ACK carrying `msn` and the 5-bit encoded credit count `credits`
    /// (bits above 4 are dropped).
    pub fn ack(msn: u32, credits: u8) -> Self {
        Aeth {
            syndrome: KIND_ACK | (credits & 0x1f),
            msn: msn & 0x00ff_ffff,
        }
    }

    /// An RNR NAK carrying `msn` and the 5-bit encoded RNR timer `timer`
    /// (IBTA Table 45; bits above 4 are dropped).
    pub fn rnr_nak(msn: u32, timer: u8) -> Self {
        Aeth {
            syndrome: KIND_RNR | (timer & 0x1f),
            msn: msn & 0x00ff_ffff,
        }
    }

    /// A NAK carrying `msn` and `code`.
    pub fn nak(msn: u32, code: NakCode) -> Self {
        Aeth {
            syndrome: KIND_NAK | code as u8,
            msn: msn & 0x00ff_ffff,
        }
    }

    /// Decodes the syndrome.
    pub fn kind(&self) -> AethKind {
        let value = self.syndrome & 0x1f;
        match self.syndrome & 0x60 {
            KIND_ACK => AethKind::Ack { credits: value },
            KIND_RNR => AethKind::RnrNak { timer: value },
            KIND_NAK => match NakCode::from_u8(value) {
                Some(code) => AethKind::Nak(code),
                None => AethKind::Reserved(self.syndrome),
            },
            _ => AethKind::Reserved(self.syndrome),
        }
    }

    /// Parses `buf[..4]`; [`WireError::Truncated`] if `buf` is shorter.
    /// Any syndrome is accepted (see [`Aeth::kind`]).
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(Aeth {
            syndrome: b[0],
            msn: be24(&b[1..]),
        })
    }

    /// Writes the header into `buf[..4]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[..4].copy_from_slice(&(self.msn & 0x00ff_ffff).to_be_bytes());
        buf[0] = self.syndrome;
    }
}

/// RNR NAK timer values of IBTA Table 45 in units of 10 us; index = the
/// 5-bit encoded timer. 0 means 655.36 ms, the largest value.
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The minimum RNR NAK timer delay encoded by `timer`, in nanoseconds
/// (IBTA 9.7.5.2.8, Table 45: 0 -> 655.36 ms, 1 -> 0.01 ms, 2 -> 0.02 ms,
/// ..., 31 -> 491.52 ms). Only the low 5 bits of `timer` are used.
pub fn rnr_timer_ns(timer: u8) -> u64 {
    u64::from(RNR_TIMER_10US[usize::from(timer & 0x1f)]) * 10_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_truncation() {
        let a = Aeth::nak(0x12_3456, NakCode::RemoteAccessError);
        let mut b = [0u8; 4];
        a.emit(&mut b);
        assert_eq!(b, [0x62, 0x12, 0x34, 0x56]);
        assert_eq!(Aeth::parse(&b), Ok(a));
        for n in 0..4 {
            assert_eq!(Aeth::parse(&b[..n]), Err(WireError::Truncated));
        }
    }

    #[test]
    fn syndromes() {
        assert_eq!(Aeth::ack(5, 31).syndrome, 0x1f);
        assert_eq!(Aeth::ack(5, 31).kind(), AethKind::Ack { credits: 31 });
        assert_eq!(Aeth::ack(0x0100_0005, 0).msn, 5);
        assert_eq!(Aeth::rnr_nak(1, 14).syndrome, 0x2e);
        assert_eq!(Aeth::rnr_nak(1, 14).kind(), AethKind::RnrNak { timer: 14 });
        assert_eq!(Aeth::nak(1, NakCode::PsnSequenceError).syndrome, 0x60);
        for code in 0..5 {
            let c = NakCode::from_u8(code).unwrap();
            assert_eq!(c as u8, code);
            assert_eq!(Aeth::nak(0, c).kind(), AethKind::Nak(c));
        }
        assert_eq!(NakCode::from_u8(5), None);
        assert_eq!(
            Aeth {
                syndrome: 0x65,
                msn: 0
            }
            .kind(),
            AethKind::Reserved(0x65)
        );
        assert_eq!(
            Aeth {
                syndrome: 0x41,
                msn: 0
            }
            .kind(),
            AethKind::Reserved(0x41)
        );
        // Reserved bit 7 does not change the meaning.
        assert_eq!(
            Aeth {
                syndrome: 0x83,
                msn: 0
            }
            .kind(),
            AethKind::Ack { credits: 3 }
        );
    }

    #[test]
    fn rnr_timer_table() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(5), 60_000);
        assert_eq!(rnr_timer_ns(14), 1_280_000);
        assert_eq!(rnr_timer_ns(18), 5_120_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        assert_eq!(rnr_timer_ns(32 + 1), rnr_timer_ns(1));
        // Strictly increasing from 1 to 31; 0 is the maximum.
        for t in 1..31 {
            assert!(rnr_timer_ns(t) < rnr_timer_ns(t + 1));
        }
        assert!(rnr_timer_ns(0) > rnr_timer_ns(31));
    }
}
