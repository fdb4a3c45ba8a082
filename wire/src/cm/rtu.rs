//! ReadyToUse (RTU): the message's layout, parse and emit.

use super::*;

/// ReadyToUse, RTU (IBTA 12.6.9, Table 111; Linux `CM_RTU_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// bytes 8-231  Private Data (224 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmRtu {
    /// Local Communication ID: the sender's (the active side's).
    pub local_comm_id: u32,
    /// Remote Communication ID: the REP's Local Communication ID.
    pub remote_comm_id: u32,
    /// Private Data, 224 bytes.
    pub private_data: [u8; private_data_len::RTU],
}

impl CmRtu {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmRtu {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            private_data: bytes(&b[8..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8..].copy_from_slice(&self.private_data);
    }
}
