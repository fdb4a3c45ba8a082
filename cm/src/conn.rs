//! One connection's record in a [`Cm`]'s table, and a MAD being retransmitted.

use crate::state::CmState;
#[cfg(doc)]
use crate::Cm;
use vrnic_wire::{Gid, MAD_LEN};

/// A MAD being retransmitted until answered.
#[derive(Clone)]
pub(crate) struct Retx {
    pub(crate) mad: [u8; MAD_LEN],
    pub(crate) deadline: u64,
    pub(crate) interval_ns: u64,
    pub(crate) left: u8,
}

impl Retx {
    /// `mad` sent at `now_ns`, sent again every `interval_ns` until
    /// answered, at most `left` more times.
    pub(crate) fn new(mad: [u8; MAD_LEN], now_ns: u64, interval_ns: u64, left: u8) -> Retx {
        Retx {
            mad,
            deadline: now_ns.saturating_add(interval_ns),
            interval_ns,
            left,
        }
    }
}

#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) state: CmState,
    pub(crate) remote_id: u32,
    pub(crate) remote_ca_guid: u64,
    pub(crate) remote_qpn: u32,
    pub(crate) local_qpn: u32,
    pub(crate) peer_gid: Gid,
    /// The transaction ID of this connection's exchange (REQ's; cm.c
    /// `cm_id_priv->tid`).
    pub(crate) tid: u64,
    /// The per-try timeout of this side's retransmissions, ns.
    pub(crate) timeout_ns: u64,
    pub(crate) max_retries: u8,
    /// The ACK timeout exponent the timewait is derived from.
    pub(crate) ack_timeout: u8,
    pub(crate) retx: Option<Retx>,
    /// The last message sent without retransmission (REP, RTU, DREP), for
    /// duplicates.
    pub(crate) last: Option<[u8; MAD_LEN]>,
    pub(crate) timewait_until: u64,
    pub(crate) destroyed: bool,
    /// Whether remote_id/remote_ca_guid/remote_qpn are valid (after REQ
    /// received or REP received).
    pub(crate) remote_known: bool,
    /// An MRA was received for the REQ or REP in flight (cm.c's
    /// `IB_CM_MRA_REQ_RCVD`/`IB_CM_MRA_REP_RCVD`, kept as a flag on
    /// `ReqSent`/`RepSent`).
    pub(crate) mra_rcvd: bool,
    /// SIDR received: the service ID to echo in the SIDR_REP.
    pub(crate) sidr_service_id: u64,
}
