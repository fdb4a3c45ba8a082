//! DisconnectRequest (DREQ) and DisconnectReply (DREP): the message's layout, parse and emit.

use super::*;

/// DisconnectRequest, DREQ (IBTA 12.6.10, Table 112; Linux `CM_DREQ_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// bytes 8-10   Remote QPN/EECN          byte 11 reserved
/// bytes 12-231 Private Data (220 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmDreq {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN, 24 bits: the receiver's QP of the connection.
    pub remote_qpn_eecn: u32,
    /// Private Data, 220 bytes.
    pub private_data: [u8; private_data_len::DREQ],
}

impl CmDreq {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmDreq {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            remote_qpn_eecn: be24(&b[8..]),
            private_data: bytes(&b[12..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        put24(&mut b[8..], self.remote_qpn_eecn);
        b[12..].copy_from_slice(&self.private_data);
    }
}

/// DisconnectReply, DREP (IBTA 12.6.11, Table 113; Linux `CM_DREP_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// bytes 8-231  Private Data (224 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmDrep {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the DREQ's Local Communication ID.
    pub remote_comm_id: u32,
    /// Private Data, 224 bytes.
    pub private_data: [u8; private_data_len::DREP],
}

impl CmDrep {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmDrep {
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
