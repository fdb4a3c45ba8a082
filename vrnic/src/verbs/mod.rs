//! The verbs object model: protection domains, memory regions, completion
//! queues, queue pairs, shared receive queues and address handles (IBTA
//! Vol 1 chapter 10; the `ibv_*` man pages), and the handle table they
//! all live in.

pub mod ah;
pub mod cq;
pub mod mr;
pub mod qp;
pub mod srq;
pub mod table;
