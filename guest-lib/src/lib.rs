//! vrnic guest library: the user-space driver and verbs API for the vrnic
//! paravirtual RDMA device. The tools built on it (the TCP exchange, option
//! parsing, the `vrnic-*` binaries) are the crate `vrnic-tools` (`tools/`).
//!
//! - [`transport`]: how the library reaches a device ([`transport::Transport`]).
//! - [`pci`], [`virtio`], [`dma`]: the virtio-pci user-space driver used in a VM.
//! - [`verbs`]: the verbs API (`ibv_*` semantics).
//! - [`loopback`]: an in-process device for tests.
#![deny(missing_docs)]

pub mod agent;
pub mod dbring;
pub mod dma;
pub mod loopback;
pub mod pci;
pub mod transport;
pub mod verbs;
pub mod virtio;
