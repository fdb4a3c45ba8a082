//! Shared receive queues (`ibv_create_srq(3)`, `ibv_modify_srq(3)`; IBTA
//! Vol 1 §10.2.9): one ring of receive WQEs that several QPs consume in
//! arrival order, with the limit event (`IBV_EVENT_SRQ_LIMIT_REACHED`).

use crate::verbs::qp::Ring;

/// A shared receive queue.
#[derive(Debug, Clone)]
pub struct Srq {
    /// SRQ number.
    pub srqn: u32,
    /// Protection domain (the SGEs' MRs must belong to it).
    pub pdn: u32,
    /// The ring of receive WQEs in driver memory.
    pub ring: Ring,
    /// Maximum SGEs per WQE.
    pub max_sge: u32,
    /// Armed limit: when fewer WQEs than this remain, `EV_SRQ_LIMIT` fires
    /// once and the limit disarms (0 = disarmed).
    pub limit: u32,
    /// Producer index the driver rang (free-running).
    pub pi: u32,
    /// Consumer index (free-running), written to `record`.
    pub ci: u32,
    /// Guest-physical address of the SRQ record (consumer index at 0).
    pub record: u64,
}

impl Srq {
    /// WQEs posted and not yet consumed.
    pub fn available(&self) -> u32 {
        self.pi.wrapping_sub(self.ci)
    }

    /// After a WQE was consumed: true (and the limit disarmed) when the
    /// limit event is due.
    pub fn limit_reached(&mut self) -> bool {
        if self.limit != 0 && self.available() < self.limit {
            self.limit = 0;
            return true;
        }
        false
    }
}
