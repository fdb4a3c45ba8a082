//! What a transport step borrows beside the one QP it serves: the device's
//! other objects, its port identity, neighbour table and output queues.

use super::neigh_table::NeighTable;
use super::{Output, PortId};
use crate::verbs::ah::Ah;
use crate::verbs::cq::Cq;
use crate::verbs::mr::MrTable;
use crate::verbs::srq::Srq;
use crate::verbs::table::HandleTable;

/// A device's objects other than its QPs, its port identity, neighbour
/// table and output queues: what a transport step ([`Env`](super::Env))
/// borrows beside the one QP it serves. Fields are public to the crate's
/// transport; the device (`crate::device::Device`) owns the only instance.
#[derive(Debug)]
pub struct Resources {
    /// The port's addresses and P_Key table.
    pub port: PortId,
    /// PDs and the context owning each (device spec §5.x.6.13).
    pub pds: HandleTable<u16>,
    /// Memory regions (mutable for SEND with invalidate).
    pub mrs: MrTable,
    /// Completion queues.
    pub cqs: HandleTable<Cq>,
    /// Address handles.
    pub ahs: HandleTable<Ah>,
    /// Shared receive queues.
    pub srqs: HandleTable<Srq>,
    /// Known neighbours (IP → MAC).
    pub neigh: NeighTable,
    /// Output queues (frames, events) and counters.
    pub out: Output,
    /// Bytes the device's RC QPs have in flight, as of each QP's last step
    /// ([`crate::transport::requester::IN_FLIGHT_BUDGET_BYTES`]).
    pub bytes_in_flight: u64,
    /// RC QPs with something in flight, as of each one's last step.
    pub qps_in_flight: u32,
}
