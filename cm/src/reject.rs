//! Rejecting a connection: REJ sent.

use crate::{error::CmError, params::copy_private, state::CmId, state::CmState, Cm};
#[cfg(doc)]
use vrnic_wire::rej_reason;
use vrnic_wire::{msg_response, private_data_len, CmMessage, CmRej, MAD_LEN};

impl Cm {
    pub(crate) fn rej_mad(
        local: u32,
        remote: u32,
        tid: u64,
        msg: u8,
        reason: u16,
        pd: [u8; private_data_len::REJ],
    ) -> [u8; MAD_LEN] {
        let rej = CmRej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: msg,
            ari_length: 0,
            reason,
            ari: [0; private_data_len::ADDITIONAL_INFO],
            private_data: pd,
        };
        CmMessage::Rej(rej).to_mad(tid, 0).to_bytes()
    }

    /// Rejects a received REQ or REP (cm.c `ib_send_cm_rej`): in REQ
    /// received or REP received the connection is reset to idle, in REP
    /// sent it enters timewait. `reason`: [`rej_reason`], usually
    /// [`rej_reason::CONSUMER_DEFINED`].
    pub fn reject(
        &mut self,
        now_ns: u64,
        id: CmId,
        reason: u16,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let pd = copy_private::<{ private_data_len::REJ }>(private_data)?;
        let c = self.conn_mut(id)?;
        let (msg, timewait) = match c.state {
            CmState::ReqRcvd => (msg_response::REQ, false),
            CmState::RepRcvd => (msg_response::REP, false),
            CmState::ReqSent => (msg_response::OTHER, false),
            CmState::RepSent => (msg_response::OTHER, true),
            _ => return Err(CmError::BadState),
        };
        // cm_format_rej: in REQ received the local comm ID is 0.
        let local = if c.state == CmState::ReqRcvd { 0 } else { id.0 };
        let mad = Self::rej_mad(local, c.remote_id, c.tid, msg, reason, pd);
        let gid = c.peer_gid;
        c.retx = None;
        if timewait {
            self.enter_timewait(now_ns, id.0);
        } else {
            c.state = CmState::Idle;
            c.remote_known = false;
        }
        self.push_mad(gid, mad);
        Ok(())
    }
}
