//! vrnic guest library: the user-space driver and verbs API for the vrnic
//! paravirtual RDMA device.
//!
//! - [`transport`]: how the library reaches a device ([`transport::Transport`]).
//! - [`pci`], [`virtio`], [`dma`]: the virtio-pci user-space driver used in a VM.
//! - [`verbs`]: the verbs API (`ibv_*` semantics).
//! - [`loopback`]: an in-process device for tests.
//! - [`tools`]: what the guest tools share (rc_pingpong's out-of-band
//!   message, device opening, RC QP bring-up, bounded CQ polling).
#![deny(missing_docs)]

pub mod dma;
pub mod loopback;
pub mod pci;
pub mod tools;
pub mod transport;
pub mod verbs;
pub mod virtio;
