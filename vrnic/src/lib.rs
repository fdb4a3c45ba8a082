//! vrnic: a software RDMA NIC speaking RoCEv2.
//!
//! - [`abi`]: the device ABI shared by the device and the driver (the
//!   `vrnic-abi` crate, re-exported).
//! - [`wire`]: typed views and parsed forms of Ethernet/IP/UDP/IBTA headers, ICRC, ARP.
//! - [`verbs`]: the verbs object model (PD, MR, CQ, QP).
//! - [`transport`]: the RC requester, responder and completer.
//! - [`device`]: the device model executing the ABI.
//! - [`link`]: TAP, AF_PACKET, in-memory and pcap links.
//! - [`mem`]: bounds-checked access to driver memory.
//! - [`data`]: a packet's payload, in a frame or in a peer device's memory.
//! - [`batch`]: batches and runs of packets between a daemon's functions.
//! - [`time`]: the engine's time, [`time::Nanos`].
//! - [`counters!`]: a struct of counters from one list of names.
#![deny(missing_docs)]

pub use vrnic_abi as abi;
pub mod batch;
mod counters;
pub mod data;
pub mod device;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod link;
pub mod mem;
pub mod time;
pub mod transport;
pub mod verbs;
pub use vrnic_wire as wire;
