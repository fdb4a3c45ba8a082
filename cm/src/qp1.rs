//! What crosses QP1: where a received MAD came from, and a MAD to send.

use vrnic_wire::{Gid, Mad, MAD_LEN};

/// Who a received MAD came from, as a GSI receive completion and its GRH
/// give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The sender's GID (the GRH's source, RoCEv2: its IP address).
    pub gid: Gid,
    /// The sender's QPN (1 for a CM agent).
    pub qpn: u32,
    /// The P_Key index the MAD arrived on.
    pub pkey_index: u16,
}

/// A MAD to send on QP1 (UD, Q_Key 0x80010000) to `dest_qpn` at `to_gid`.
#[derive(Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The destination GID.
    pub to_gid: Gid,
    /// The destination QPN: always 1, the GSI QP.
    pub dest_qpn: u32,
    /// The whole 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing")
            .field("to_gid", &self.to_gid)
            .field("attr_tid", &Mad::peek_attr_tid(&self.mad))
            .finish()
    }
}
