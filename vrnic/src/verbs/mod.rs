//! The verbs object model: protection domains, memory regions, completion
//! queues and queue pairs (IBTA Vol 1 chapter 10; the `ibv_*` man pages).

pub mod cq;
pub mod mr;
pub mod qp;
