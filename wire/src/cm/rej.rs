//! ConnectReject (REJ): the message's layout, parse and emit.

use super::*;

/// ConnectReject, REJ (IBTA 12.6.7, Table 108; Linux `CM_REJ_*`).
///
/// ```text
/// bytes 0-3     Local Communication ID
/// bytes 4-7     Remote Communication ID
/// byte  8       Message REJected(7-6) reserved(5-0)
/// byte  9       Reject Info Length(7-1) reserved(0)
/// bytes 10-11   Reason
/// bytes 12-83   Additional Rejection Information (ARI, 72 bytes)
/// bytes 84-231  Private Data (148 bytes)
/// ```
///
/// The ARI length is the top 7 bits of byte 9: a length of 16 is the byte
/// 0x20.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmRej {
    /// Local Communication ID: the sender's (0 if it never had one).
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Message REJected, 2 bits ([`msg_response`]).
    pub message_rejected: u8,
    /// Reject Info Length, 7 bits: how many ARI bytes are meaningful
    /// (at most 72).
    pub ari_length: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional Rejection Information, 72 bytes.
    pub ari: [u8; private_data_len::ADDITIONAL_INFO],
    /// Private Data, 148 bytes.
    pub private_data: [u8; private_data_len::REJ],
}

impl CmRej {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmRej {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            message_rejected: hi(b[8], 2),
            ari_length: hi(b[9], 7),
            reason: be16(&b[10..]),
            ari: bytes(&b[12..]),
            private_data: bytes(&b[84..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8] = to_hi(self.message_rejected, 2);
        b[9] = to_hi(self.ari_length, 7);
        put16(&mut b[10..], self.reason);
        b[12..84].copy_from_slice(&self.ari);
        b[84..].copy_from_slice(&self.private_data);
    }
}
