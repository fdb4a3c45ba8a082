//! The drop and answer counters.

/// Counters of what the CM dropped or answered without a connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs that were not 256 bytes, not CM MADs or unknown attributes.
    pub malformed: u64,
    /// Messages naming no connection of ours (or a connection whose peer
    /// comm ID or GID differ: a stranger's), dropped.
    pub unknown_id: u64,
    /// Messages for a connection in a state that ignores them.
    pub wrong_state: u64,
    /// Duplicate REQs (same remote comm ID and CA GUID).
    pub dup_req: u64,
    /// REQs rejected as stale (remote QPN and CA GUID of a live or
    /// timewait connection).
    pub stale_req: u64,
    /// REQs rejected for want of a listener.
    pub no_listener: u64,
    /// REQs rejected for a full table.
    pub no_resources: u64,
    /// DREQs for unknown connections, answered with a DREP.
    pub unknown_dreq: u64,
    /// LAP and APR messages, not implemented, dropped.
    pub unsupported: u64,
    /// MADs dropped at a full output queue.
    pub mads_dropped: u64,
    /// Events dropped at a full event queue.
    pub events_dropped: u64,
    /// Timewait entries evicted at a full timewait table.
    pub timewait_evicted: u64,
}
