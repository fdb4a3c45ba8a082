//! The bounds on one [`Cm`]'s tables and queues.

#[cfg(doc)]
use crate::{counters::CmCounters, error::CmError, Cm};
#[cfg(doc)]
use vrnic_wire::rej_reason;

/// The most connections (every comm ID not in timewait, idle ones the
/// consumer has not destroyed included) one [`Cm`] holds. rdma_cm programs
/// use one per `rdma_cm_id`; 4096 is far above what a function's agent
/// serves and keeps a REQ flood's cost bounded. [`Cm::connect`] beyond it
/// fails with [`CmError::TableFull`]; a REQ beyond it is answered with REJ
/// reason [`rej_reason::NO_RESOURCES`].
pub const MAX_CONNECTIONS: usize = 4096;

/// The most listeners (service IDs) one [`Cm`] holds.
pub const MAX_LISTENERS: usize = 1024;

/// The most connections in timewait one [`Cm`] keeps. A connection entering
/// timewait when the table is full evicts the one whose timewait ends
/// first (the kernel has no bound; a peer's disconnect flood must not grow
/// memory here).
pub const MAX_TIMEWAIT: usize = 4096;

/// The most MADs waiting in [`Cm::pop_mad`]'s queue; beyond it a MAD is
/// dropped and counted ([`CmCounters::mads_dropped`]): retransmission
/// recovers, as from a lost MAD.
pub const MAX_OUT_MADS: usize = 1024;

/// The most events waiting in [`Cm::pop_event`]'s queue; beyond it an event
/// is dropped and counted ([`CmCounters::events_dropped`]).
pub const MAX_EVENTS: usize = 4096;
