//! vrnic's guest tools: the application code of the `vrnic-*` binaries,
//! kept out of the driver library (`vrnic_guest`), which is the driver and
//! the verbs API and nothing else.
//!
//! - [`tools`]: what the guest tools share (rc_pingpong's out-of-band
//!   message, device opening, RC and UD QP bring-up, bounded CQ polling).
//! - [`pingpong`]: what the ports of rdma-core's ping-pong examples share
//!   (the TCP exchange, message checks, the `--loopback` run).
#![deny(missing_docs)]

pub mod pingpong;
pub mod tools;
