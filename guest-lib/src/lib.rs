//! vrnic guest library: the user-space driver and verbs API for the vrnic
//! paravirtual RDMA device.
//!
//! - [`transport`]: how the library reaches a device ([`transport::Transport`]).
//! - [`pci`], [`virtio`], [`dma`]: the virtio-pci user-space driver used in a VM.
//! - [`verbs`]: the verbs API (`ibv_*` semantics).
//! - [`loopback`]: an in-process device for tests.
//! - [`tools`]: what the guest tools share (rc_pingpong's out-of-band
//!   message, device opening, RC and UD QP bring-up, bounded CQ polling).
//! - [`pingpong`]: what the ports of rdma-core's ping-pong examples share
//!   (the TCP exchange, message checks, the `--loopback` run).
#![deny(missing_docs)]

pub mod agent;
pub mod dma;
pub mod loopback;
pub mod pci;
pub mod pingpong;
pub mod tools;
pub mod transport;
pub mod verbs;
pub mod virtio;
