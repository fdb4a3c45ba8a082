//! vrnic guest library: the user-space driver and verbs API for the vrnic
//! paravirtual RDMA device. The tools built on it (the TCP exchange, option
//! parsing, the `vrnic-*` binaries) are the crate `vrnic-tools` (`tools/`).
//!
//! - [`transport`]: how the library reaches a device ([`transport::Transport`]).
//! - [`pci`], [`virtio`], [`dma`]: the virtio-pci user-space driver used in a VM
//!   (its split virtqueues, and [`barrier`], are the crate `vrnic-virtq`'s).
//! - [`verbs`]: the verbs API (`ibv_*` semantics).
//! - [`vhost_user`]: the device from a container or host process, over the
//!   daemon's vhost-user socket.
//! - `driver`: the queue handling both drivers share.
//! - `loopback` (feature `loopback`): an in-process device for tests.
#![deny(missing_docs)]

pub mod agent;
pub use vrnic_virtq::barrier;
pub mod dbring;
pub mod dma;
pub(crate) mod driver;
#[cfg(feature = "loopback")]
pub mod loopback;
pub mod pci;
pub mod transport;
pub mod verbs;
pub mod vhost_user;
pub mod virtio;
