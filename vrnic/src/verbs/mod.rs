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

/// A verb's argument that its checks refuse: `what` names the value or
/// rule (e.g. "retry_cnt above 7"). The device answers it with
/// `STATUS_EINVAL` (`EINVAL` in `ibv_modify_qp(3)`, `ibv_reg_mr(3)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid(pub &'static str);

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid {}", self.0)
    }
}

impl std::error::Error for Invalid {}
