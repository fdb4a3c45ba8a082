//! BTH opcodes and the one table that describes them (IBTA Vol 1 9.2,
//! Table 38 "OpCode Field"; modelled on Linux rxe's `rxe_opcode[]`).
//!
//! Every predicate on [`Opcode`] reads the same table entry, so the set of
//! headers an opcode carries, its packet position and its class can never
//! disagree with each other.

use super::{Aeth, AtomicAckEth, AtomicEth, Deth, Ieth, Immdt, Reth};

/// The transport service an opcode belongs to: the top three bits of the
/// opcode (IBTA 9.2, Table 38: 000 RC, 001 UC, 011 UD).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable Connected (opcodes 0x00-0x1f).
    Rc,
    /// Unreliable Connected (opcodes 0x20-0x3f).
    Uc,
    /// Unreliable Datagram (opcodes 0x60-0x7f).
    Ud,
}

/// A BTH opcode this NIC implements (IBTA 9.2, Table 38). The discriminant is
/// the 8-bit value on the wire. RD, XRC, CNP and vendor opcodes are absent:
/// [`Opcode::from_u8`] returns `None` for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[allow(missing_docs)] // the names are the IBTA Table 38 names
pub enum Opcode {
    RcSendFirst = 0x00,
    RcSendMiddle = 0x01,
    RcSendLast = 0x02,
    RcSendLastImm = 0x03,
    RcSendOnly = 0x04,
    RcSendOnlyImm = 0x05,
    RcWriteFirst = 0x06,
    RcWriteMiddle = 0x07,
    RcWriteLast = 0x08,
    RcWriteLastImm = 0x09,
    RcWriteOnly = 0x0a,
    RcWriteOnlyImm = 0x0b,
    RcReadRequest = 0x0c,
    RcReadResponseFirst = 0x0d,
    RcReadResponseMiddle = 0x0e,
    RcReadResponseLast = 0x0f,
    RcReadResponseOnly = 0x10,
    RcAck = 0x11,
    RcAtomicAck = 0x12,
    RcCompareSwap = 0x13,
    RcFetchAdd = 0x14,
    RcSendLastInv = 0x16,
    RcSendOnlyInv = 0x17,
    UcSendFirst = 0x20,
    UcSendMiddle = 0x21,
    UcSendLast = 0x22,
    UcSendLastImm = 0x23,
    UcSendOnly = 0x24,
    UcSendOnlyImm = 0x25,
    UcWriteFirst = 0x26,
    UcWriteMiddle = 0x27,
    UcWriteLast = 0x28,
    UcWriteLastImm = 0x29,
    UcWriteOnly = 0x2a,
    UcWriteOnlyImm = 0x2b,
    UdSendOnly = 0x64,
    UdSendOnlyImm = 0x65,
}

// Flag bits of a table entry (like rxe's enum rxe_hdr_mask).
const REQ: u32 = 1 << 0;
const RESP: u32 = 1 << 1;
const SEND: u32 = 1 << 2;
const WRITE: u32 = 1 << 3;
const READ_REQ: u32 = 1 << 4;
const READ_RESP: u32 = 1 << 5;
const ATOMIC: u32 = 1 << 6;
const ACK: u32 = 1 << 7;
const FIRST: u32 = 1 << 8;
const MIDDLE: u32 = 1 << 9;
const LAST: u32 = 1 << 10;
const ONLY: u32 = 1 << 11;
const PAYLOAD: u32 = 1 << 12;
const RETH: u32 = 1 << 13;
const AETH: u32 = 1 << 14;
const IMMDT: u32 = 1 << 15;
const IETH: u32 = 1 << 16;
const DETH: u32 = 1 << 17;
const ATMETH: u32 = 1 << 18;
const ATMACK: u32 = 1 << 19;

/// One row of the opcode table.
struct Info {
    op: Opcode,
    name: &'static str,
    transport: Transport,
    flags: u32,
}

const fn row(op: Opcode, name: &'static str, transport: Transport, flags: u32) -> Info {
    Info {
        op,
        name,
        transport,
        flags,
    }
}

use Opcode::*;
use Transport::{Rc, Uc, Ud};

const SEND_REQ: u32 = REQ | SEND | PAYLOAD;
const WRITE_REQ: u32 = REQ | WRITE | PAYLOAD;

/// Builds [`TABLE`] in wire-value order from its parts. The SEND and RDMA
/// WRITE rows that RC (0x00-0x0b) and UC (0x20-0x2b) both have are written
/// once, each with its name after the `RC_` / `UC_` prefix; then RC's other
/// rows and UD's rows, each with its full name.
macro_rules! opcode_table {
    (
        rc_and_uc: [$(($rc:ident, $uc:ident, $name:literal, $flags:expr)),* $(,)?],
        rc: [$(($rc_op:ident, $rc_name:literal, $rc_flags:expr)),* $(,)?],
        ud: [$(($ud_op:ident, $ud_name:literal, $ud_flags:expr)),* $(,)?] $(,)?
    ) => {
        [
            $(row($rc, concat!("RC_", $name), Rc, $flags),)*
            $(row($rc_op, $rc_name, Rc, $rc_flags),)*
            $(row($uc, concat!("UC_", $name), Uc, $flags),)*
            $(row($ud_op, $ud_name, Ud, $ud_flags),)*
        ]
    };
}

/// THE opcode table: IBTA 9.2 Table 38 and the header layouts of 9.2-9.3
/// (which extension headers follow the BTH), mirroring rxe_opcode.c.
/// Single-packet operations (read request, atomics, ACKs) are ONLY packets,
/// as rxe marks them RXE_START_MASK | RXE_END_MASK.
#[rustfmt::skip]
const TABLE: [Info; 37] = opcode_table! {
    rc_and_uc: [
        (RcSendFirst, UcSendFirst, "SEND_FIRST", SEND_REQ | FIRST),
        (RcSendMiddle, UcSendMiddle, "SEND_MIDDLE", SEND_REQ | MIDDLE),
        (RcSendLast, UcSendLast, "SEND_LAST", SEND_REQ | LAST),
        (RcSendLastImm, UcSendLastImm, "SEND_LAST_WITH_IMMEDIATE", SEND_REQ | LAST | IMMDT),
        (RcSendOnly, UcSendOnly, "SEND_ONLY", SEND_REQ | ONLY),
        (RcSendOnlyImm, UcSendOnlyImm, "SEND_ONLY_WITH_IMMEDIATE", SEND_REQ | ONLY | IMMDT),
        (RcWriteFirst, UcWriteFirst, "RDMA_WRITE_FIRST", WRITE_REQ | FIRST | RETH),
        (RcWriteMiddle, UcWriteMiddle, "RDMA_WRITE_MIDDLE", WRITE_REQ | MIDDLE),
        (RcWriteLast, UcWriteLast, "RDMA_WRITE_LAST", WRITE_REQ | LAST),
        (RcWriteLastImm, UcWriteLastImm, "RDMA_WRITE_LAST_WITH_IMMEDIATE", WRITE_REQ | LAST | IMMDT),
        (RcWriteOnly, UcWriteOnly, "RDMA_WRITE_ONLY", WRITE_REQ | ONLY | RETH),
        (RcWriteOnlyImm, UcWriteOnlyImm, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", WRITE_REQ | ONLY | RETH | IMMDT),
    ],
    rc: [
        (RcReadRequest, "RC_RDMA_READ_REQUEST", REQ | READ_REQ | ONLY | RETH),
        (RcReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", RESP | READ_RESP | PAYLOAD | FIRST | AETH),
        (RcReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", RESP | READ_RESP | PAYLOAD | MIDDLE),
        (RcReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", RESP | READ_RESP | PAYLOAD | LAST | AETH),
        (RcReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", RESP | READ_RESP | PAYLOAD | ONLY | AETH),
        (RcAck, "RC_ACKNOWLEDGE", RESP | ACK | ONLY | AETH),
        (RcAtomicAck, "RC_ATOMIC_ACKNOWLEDGE", RESP | ACK | ONLY | AETH | ATMACK),
        (RcCompareSwap, "RC_COMPARE_SWAP", REQ | ATOMIC | ONLY | ATMETH),
        (RcFetchAdd, "RC_FETCH_ADD", REQ | ATOMIC | ONLY | ATMETH),
        (RcSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE", SEND_REQ | LAST | IETH),
        (RcSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE", SEND_REQ | ONLY | IETH),
    ],
    ud: [
        (UdSendOnly, "UD_SEND_ONLY", SEND_REQ | ONLY | DETH),
        (UdSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE", SEND_REQ | ONLY | DETH | IMMDT),
    ],
};

/// Wire value -> index into `TABLE` (`NONE` if unknown), built from `TABLE`.
const NONE: u8 = u8::MAX;
const INDEX: [u8; 256] = {
    let mut index = [NONE; 256];
    let mut i = 0;
    while i < TABLE.len() {
        index[TABLE[i].op as usize] = i as u8;
        i += 1;
    }
    index
};

impl Opcode {
    /// Every implemented opcode, in wire-value order.
    pub const ALL: [Opcode; 37] = {
        let mut all = [RcSendFirst; 37];
        let mut i = 0;
        while i < TABLE.len() {
            all[i] = TABLE[i].op;
            i += 1;
        }
        all
    };

    /// The opcode with wire value `v` (IBTA 9.2 Table 38), or `None` for
    /// reserved, RD, XRC, CNP (0x81) and manufacturer-specific values.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        match INDEX[v as usize] {
            NONE => None,
            i => Some(TABLE[i as usize].op),
        }
    }

    fn info(self) -> &'static Info {
        // Every enum value has a row: the index is built from the table, and
        // the `table_is_complete` test checks that the row is this opcode.
        &TABLE[INDEX[self as usize] as usize]
    }

    fn has(self, flag: u32) -> bool {
        self.info().flags & flag != 0
    }

    /// The IBTA name, e.g. `"RC_SEND_FIRST"` (rxe spells it with an
    /// `IB_OPCODE_` prefix).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The transport service of this opcode (IBTA 9.2, Table 38).
    pub fn transport(self) -> Transport {
        self.info().transport
    }

    /// A request packet: send, RDMA write, RDMA read request, atomic.
    pub fn is_request(self) -> bool {
        self.has(REQ)
    }

    /// A response packet: ACK, atomic ACK, RDMA read response.
    pub fn is_response(self) -> bool {
        self.has(RESP)
    }

    /// A SEND packet (any position, with or without ImmDt/IETH).
    pub fn is_send(self) -> bool {
        self.has(SEND)
    }

    /// An RDMA WRITE packet (any position, with or without ImmDt).
    pub fn is_write(self) -> bool {
        self.has(WRITE)
    }

    /// `RcReadRequest`.
    pub fn is_read_request(self) -> bool {
        self.has(READ_REQ)
    }

    /// An RDMA READ response packet (first, middle, last or only).
    pub fn is_read_response(self) -> bool {
        self.has(READ_RESP)
    }

    /// An atomic request: `RcCompareSwap` or `RcFetchAdd`.
    pub fn is_atomic(self) -> bool {
        self.has(ATOMIC)
    }

    /// `RcAck` or `RcAtomicAck`.
    pub fn is_ack(self) -> bool {
        self.has(ACK)
    }

    /// First packet of a message; ONLY packets count as first too.
    pub fn is_first(self) -> bool {
        self.has(FIRST | ONLY)
    }

    /// Middle packet of a multi-packet message.
    pub fn is_middle(self) -> bool {
        self.has(MIDDLE)
    }

    /// Last packet of a message; ONLY packets count as last too.
    pub fn is_last(self) -> bool {
        self.has(LAST | ONLY)
    }

    /// The single packet of a one-packet message, including the
    /// single-packet operations (read request, atomics, ACKs).
    pub fn is_only(self) -> bool {
        self.has(ONLY)
    }

    /// The packet may carry a payload after its headers (sends, writes,
    /// read responses). A payload of 0 bytes is allowed.
    pub fn has_payload(self) -> bool {
        self.has(PAYLOAD)
    }

    /// Carries a RETH (IBTA 9.3.3).
    pub fn has_reth(self) -> bool {
        self.has(RETH)
    }

    /// Carries an AETH (IBTA 9.3.5).
    pub fn has_aeth(self) -> bool {
        self.has(AETH)
    }

    /// Carries an ImmDt (IBTA 9.3.6).
    pub fn has_immdt(self) -> bool {
        self.has(IMMDT)
    }

    /// Carries an IETH (IBTA 9.3.7).
    pub fn has_ieth(self) -> bool {
        self.has(IETH)
    }

    /// Carries a DETH (IBTA 9.3.2).
    pub fn has_deth(self) -> bool {
        self.has(DETH)
    }

    /// Carries an AtomicETH (IBTA 9.3.4).
    pub fn has_atomic_eth(self) -> bool {
        self.has(ATMETH)
    }

    /// Carries an AtomicAckETH (IBTA 9.3.5.3).
    pub fn has_atomic_ack_eth(self) -> bool {
        self.has(ATMACK)
    }

    /// Bytes of BTH plus all extension headers this opcode carries, i.e. the
    /// offset of the payload from the start of the BTH.
    pub fn header_len(self) -> usize {
        let f = self.info().flags;
        let mut len = super::Bth::LEN;
        for (flag, n) in [
            (DETH, Deth::LEN),
            (RETH, Reth::LEN),
            (ATMETH, AtomicEth::LEN),
            (AETH, Aeth::LEN),
            (ATMACK, AtomicAckEth::LEN),
            (IMMDT, Immdt::LEN),
            (IETH, Ieth::LEN),
        ] {
            if f & flag != 0 {
                len += n;
            }
        }
        len
    }

    /// The MIDDLE opcode of this SEND, RDMA WRITE or RDMA READ response
    /// opcode's message kind and transport (`RC_SEND_FIRST` →
    /// `RC_SEND_MIDDLE`); `None` for other opcodes (IBTA 9.2 Table 38:
    /// MIDDLE is the kind's base + 1).
    pub fn middle(self) -> Option<Opcode> {
        if self.is_read_response() {
            return Some(Opcode::RcReadResponseMiddle);
        }
        if !self.is_send() && !self.is_write() {
            return None;
        }
        let v = self as u8;
        let base = if self.is_write() {
            (v & 0xe0) | 0x06
        } else {
            v & 0xe0
        };
        Opcode::from_u8(base + 1)
    }

    /// The ONLY opcode of a message that is this LAST opcode's message in
    /// one packet (`RC_SEND_LAST_WITH_IMMEDIATE` →
    /// `RC_SEND_ONLY_WITH_IMMEDIATE`, `RC_SEND_LAST_WITH_INVALIDATE` →
    /// `RC_SEND_ONLY_WITH_INVALIDATE`, `RC_RDMA_READ_RESPONSE_LAST` →
    /// `RC_RDMA_READ_RESPONSE_ONLY`); `None` unless a SEND, RDMA WRITE or
    /// READ response LAST (IBTA 9.2 Table 38).
    pub fn only_of_last(self) -> Option<Opcode> {
        if self == Opcode::RcReadResponseLast {
            return Some(Opcode::RcReadResponseOnly);
        }
        if !(self.is_send() || self.is_write()) || !self.is_last() || self.is_only() {
            return None;
        }
        let v = self as u8;
        let only = if self == Opcode::RcSendLastInv {
            v + 1
        } else {
            v + 2
        };
        Opcode::from_u8(only)
    }
}

impl TryFrom<u8> for Opcode {
    type Error = super::WireError;

    /// [`Opcode::from_u8`], with [`super::WireError::UnknownOpcode`] for `None`.
    fn try_from(v: u8) -> Result<Self, Self::Error> {
        Opcode::from_u8(v).ok_or(super::WireError::UnknownOpcode(v))
    }
}

impl core::fmt::Display for Opcode {
    /// Writes [`Opcode::name`].
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_complete() {
        for (i, row) in TABLE.iter().enumerate() {
            assert_eq!(INDEX[row.op as usize] as usize, i);
            assert_eq!(Opcode::from_u8(row.op as u8), Some(row.op));
        }
        let known = (0..=255u8)
            .filter(|&v| Opcode::from_u8(v).is_some())
            .count();
        assert_eq!(known, 37);
        assert_eq!(Opcode::from_u8(0x15), None);
        assert_eq!(Opcode::from_u8(0x81), None);
        assert_eq!(Opcode::from_u8(0x40), None);
    }

    #[test]
    fn middle_and_only_keep_the_kind_transport_and_extension_headers() {
        use Opcode::*;
        for op in Opcode::ALL {
            match op.middle() {
                Some(m) => {
                    assert!(m.is_middle(), "{op:?}");
                    assert_eq!(
                        (
                            m.is_send(),
                            m.is_write(),
                            m.is_read_response(),
                            m.transport()
                        ),
                        (
                            op.is_send(),
                            op.is_write(),
                            op.is_read_response(),
                            op.transport()
                        ),
                        "{op:?}"
                    );
                }
                None => assert!(
                    (!op.is_send() && !op.is_write() && !op.is_read_response())
                        || op.transport() == Transport::Ud,
                    "{op:?}"
                ),
            }
            match op.only_of_last() {
                Some(o) => {
                    assert!(o.is_only() && op.is_last() && !op.is_only(), "{op:?}");
                    assert_eq!(
                        (
                            o.is_send(),
                            o.is_write(),
                            o.is_read_response(),
                            o.transport()
                        ),
                        (
                            op.is_send(),
                            op.is_write(),
                            op.is_read_response(),
                            op.transport()
                        ),
                        "{op:?}"
                    );
                    assert_eq!(
                        (o.has_immdt(), o.has_ieth()),
                        (op.has_immdt(), op.has_ieth())
                    );
                }
                None => assert!(op.is_only() || !op.is_last(), "{op:?}"),
            }
        }
        assert_eq!(RcSendLastInv.only_of_last(), Some(RcSendOnlyInv));
        assert_eq!(UcWriteLastImm.only_of_last(), Some(UcWriteOnlyImm));
        assert_eq!(RcWriteFirst.middle(), Some(RcWriteMiddle));
    }

    #[test]
    fn transport_matches_high_bits() {
        for op in Opcode::ALL {
            let want = match op as u8 >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                _ => unreachable!(),
            };
            assert_eq!(op.transport(), want, "{op}");
            let prefix = match want {
                Transport::Rc => "RC_",
                Transport::Uc => "UC_",
                Transport::Ud => "UD_",
            };
            assert!(op.name().starts_with(prefix));
        }
    }

    #[test]
    fn classes_are_exclusive() {
        for op in Opcode::ALL {
            assert_ne!(op.is_request(), op.is_response(), "{op}");
            let classes = [
                op.is_send(),
                op.is_write(),
                op.is_read_request(),
                op.is_read_response(),
                op.is_atomic(),
                op.is_ack(),
            ];
            assert_eq!(classes.iter().filter(|&&c| c).count(), 1, "{op}");
            let pos = [
                op.is_middle(),
                op.is_only(),
                op.is_first() && !op.is_only(),
                op.is_last() && !op.is_only(),
            ];
            assert_eq!(pos.iter().filter(|&&c| c).count(), 1, "{op}");
            // Immediate, invalidate and DETH names match the table.
            assert_eq!(op.has_immdt(), op.name().contains("IMMEDIATE"), "{op}");
            assert_eq!(op.has_ieth(), op.name().contains("INVALIDATE"), "{op}");
            assert_eq!(op.has_deth(), op.transport() == Transport::Ud, "{op}");
        }
    }

    #[test]
    fn header_lengths() {
        assert_eq!(RcSendMiddle.header_len(), 12);
        assert_eq!(RcWriteFirst.header_len(), 28);
        assert_eq!(RcWriteOnlyImm.header_len(), 32);
        assert_eq!(RcReadRequest.header_len(), 28);
        assert_eq!(RcReadResponseFirst.header_len(), 16);
        assert_eq!(RcReadResponseMiddle.header_len(), 12);
        assert_eq!(RcAck.header_len(), 16);
        assert_eq!(RcAtomicAck.header_len(), 24);
        assert_eq!(RcCompareSwap.header_len(), 40);
        assert_eq!(RcFetchAdd.header_len(), 40);
        assert_eq!(RcSendOnlyInv.header_len(), 16);
        assert_eq!(UdSendOnly.header_len(), 20);
        assert_eq!(UdSendOnlyImm.header_len(), 24);
    }

    #[test]
    fn predicates() {
        assert!(RcSendOnly.is_first() && RcSendOnly.is_last() && RcSendOnly.is_only());
        assert!(RcSendFirst.is_first() && !RcSendFirst.is_last());
        assert!(
            RcWriteLastImm.is_last() && RcWriteLastImm.is_write() && RcWriteLastImm.has_immdt()
        );
        assert!(RcAck.is_ack() && RcAck.is_response() && !RcAck.has_payload());
        assert!(RcAtomicAck.is_ack() && RcAtomicAck.has_atomic_ack_eth());
        assert!(
            RcCompareSwap.is_atomic()
                && RcCompareSwap.has_atomic_eth()
                && RcCompareSwap.is_request()
        );
        assert!(
            RcReadRequest.is_read_request()
                && RcReadRequest.has_reth()
                && !RcReadRequest.has_payload()
        );
        assert!(RcReadResponseMiddle.is_read_response() && !RcReadResponseMiddle.has_aeth());
        assert!(!UcWriteMiddle.has_reth() && UcWriteFirst.has_reth());
        assert_eq!(
            Opcode::try_from(0x15),
            Err(super::super::WireError::UnknownOpcode(0x15))
        );
        assert_eq!(RcFetchAdd.to_string(), "RC_FETCH_ADD");
    }
}
