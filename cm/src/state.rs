//! A connection's ID and its state.

#[cfg(doc)]
use crate::Cm;

/// A connection's handle: its local comm ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CmId(pub u32);

/// A connection's state (IBTA Vol 1 fig. 12.9; cm.c's `ib_cm_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmState {
    /// Reset to idle (after a REJ or a retry error); waiting to be
    /// destroyed.
    Idle,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Passive: REQ received, waiting for the consumer.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received, waiting for the consumer's RTU.
    RepRcvd,
    /// Established.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, waiting for the consumer's DREP.
    DreqRcvd,
    /// Timewait.
    Timewait,
    /// SIDR: SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR: SIDR_REQ received, waiting for the consumer's
    /// [`Cm::sidr_reply`].
    SidrReqRcvd,
}
