//! MsgRcptAck (MRA): the message's layout, parse and emit.

use super::*;

/// MsgRcptAck, MRA (IBTA 12.6.6, Table 107; Linux `CM_MRA_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// byte  8      Message MRAed(7-6) reserved(5-0)
/// byte  9      Service Timeout(7-3) reserved(2-0)
/// bytes 10-231 Private Data (222 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmMra {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's (0 when MRAing a REQ).
    pub remote_comm_id: u32,
    /// Message MRAed, 2 bits ([`msg_response`]).
    pub message_mraed: u8,
    /// Service Timeout, 5 bits (4.096 µs × 2^value): how long the sender
    /// needs before it replies.
    pub service_timeout: u8,
    /// Private Data, 222 bytes.
    pub private_data: [u8; private_data_len::MRA],
}

impl CmMra {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmMra {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            message_mraed: hi(b[8], 2),
            service_timeout: hi(b[9], 5),
            private_data: bytes(&b[10..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8] = to_hi(self.message_mraed, 2);
        b[9] = to_hi(self.service_timeout, 5);
        b[10..].copy_from_slice(&self.private_data);
    }
}
