//! The vrnic vhost-user device: serves a [`vrnic::device::Device`] to a
//! vhost-user frontend (QEMU's `vhost-user-test-device-pci`, the
//! containers' driver, or the test frontend of the crate `vrnic-frontend`)
//! over three virtqueues (see [`vrnic::abi`]).
//!
//! - [`memory`]: bounds-checked guest memory over the vhost-user memory table.
//! - [`fault`]: surviving a frontend memory that loses its backing (`SIGBUS`).
//! - [`chain`]: descriptor chains as readable/writable buffer lists.
//! - [`timer`]: the non-blocking timerfd behind the device's deadlines.
//! - [`datapath`]: queue, link and timer handling on the worker thread.
//! - [`vring`]: the vrings, whose accesses off the worker survive lost memory.
//! - [`backend`]: the `VhostUserBackend` (features, config, lifecycle).
//! - [`server`]: listening on a socket and serving frontends one at a time.
//! - [`stats`]: the counters' published snapshot and management socket.
//! - [`control`]: the control socket (`vrnic function add|del|list`).
//! - [`functions`]: many functions (devices) per daemon, added and removed while it runs.
//! - [`switch`]: the embedded switch between a daemon's functions and its uplink.
//! - [`addr`]: command-line address parsing and the default MAC.
#![deny(missing_docs)]

pub mod addr;
pub mod backend;
mod backend_stats;
mod backoff;
pub mod chain;
pub mod control;
pub mod datapath;
pub mod fault;
pub mod functions;
pub mod memory;
pub mod poll_group;
#[cfg(test)]
mod read_ahead;
pub mod server;
mod sockserv;
pub mod spin;
pub mod stats;
pub mod switch;
pub mod timer;
pub mod vring;

pub use backend::{BackendConfig, BackendError, VrnicBackend};
pub use backend_stats::BackendStats;
pub use memory::GuestMem;
