//! The InfiniBand Communication Manager (IBTA Vol 1 chapter 12) for one
//! port, as a sans-IO state machine modelled on Linux's `ib_cm`
//! (`drivers/infiniband/core/cm.c`, Linux 6.1; "cm.c" below).
//!
//! The caller owns the port's GSI QP (QP1) and a clock. It feeds
//! [`Cm::handle_mad`] with every MAD received on QP1, calls [`Cm::poll`]
//! when [`Cm::next_timer`] is due, makes the consumer's calls
//! ([`Cm::listen`], [`Cm::connect`], [`Cm::accept`], [`Cm::reject`],
//! [`Cm::send_rtu`], [`Cm::disconnect`], [`Cm::reply_disconnect`],
//! [`Cm::destroy`]) and drains [`Cm::pop_mad`] (MADs to send on QP1, to
//! QPN 1 of the given GID) and [`Cm::pop_event`] (the consumer's events,
//! cm.c's `ib_cm_event`s). Time is only what the caller passes (`now_ns`,
//! nanoseconds on any monotonic clock); there are no threads, sockets or
//! allocations beyond bounded tables and queues, and no input panics.
//!
//! Implemented: connection establishment (REQ/REP/RTU) in both roles,
//! rejection (REJ, the kernel's reasons for no listener, stale connection,
//! consumer reject, no resources), retransmission of REQ, REP and DREQ with
//! the kernel's timeouts and retry counts and the error events after the
//! last one, duplicate REQ/REP handling, disconnection (DREQ/DREP) and
//! timewait, SIDR for UD, received MRAs (the wait for a REP or RTU extended). Not yet:
//! sending MRA (Linux sends one only for a duplicate REQ/REP while the
//! consumer has not answered), LAP/APR (counted and dropped; rdma_cm
//! never sends LAP on RoCE).

#![deny(missing_docs)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use conn::Conn;

mod conn;
mod connect;
mod counters;
mod disconnect;
mod error;
mod event;
mod handlers;
mod limits;
mod listen;
mod params;
mod port;
mod qp1;
mod queues;
mod reject;
mod sidr;
mod state;
mod tables;
mod timers;
mod timing;

#[cfg(test)]
mod tests;

pub use counters::CmCounters;
pub use error::CmError;
pub use event::{CmEvent, CmEventKind};
pub use limits::{MAX_CONNECTIONS, MAX_EVENTS, MAX_LISTENERS, MAX_OUT_MADS, MAX_TIMEWAIT};
pub use params::{PathParams, RepParams, ReqParams};
pub use port::{ca_guid_from_mac, PortIdentity};
pub use qp1::{Outgoing, Source};
pub use state::{CmId, CmState};
pub use timing::{
    cm_ack_timeout, cm_convert_to_ms, CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME,
    CMA_MAX_CM_RETRIES,
};

/// The Communication Manager of one port.
pub struct Cm {
    port: PortIdentity,
    conns: BTreeMap<u32, Conn>,
    listeners: BTreeSet<u64>,
    out: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    next_index: u32,
    id_operand: u32,
    counters: CmCounters,
}
