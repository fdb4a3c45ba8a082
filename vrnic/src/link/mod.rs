//! Links: where the engine's Ethernet frames go and come from.
//!
//! One trait, [`Link`], implemented by a TAP device ([`tap`]), an AF_PACKET
//! raw socket bound to an existing interface ([`packet`]), an in-memory pair
//! for tests ([`mem`]) and a pcap-writing wrapper ([`pcap`]); [`txq`]
//! hands a device's frames to a link without losing them to a full one.

use std::io;
use std::os::fd::RawFd;

/// A full-duplex Ethernet link carrying whole frames (no FCS).
pub trait Link: Send {
    /// Sends one frame. Frames the link cannot take now are dropped (like a
    /// NIC with a full TX ring): the RC transport retransmits.
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// Sends one frame if the link can take it now. `Ok(true)`: handed on
    /// (or dropped for good, as [`Link::send`] does for an interface that
    /// is down); `Ok(false)`: the link is full right now (`EAGAIN` or
    /// `ENOBUFS` from the kernel, the peer's queue of a [`MemLink`]) and
    /// did not take the frame, counted in [`LinkStats::tx_busy`]: the
    /// caller keeps it and tries again, e.g. when [`Link::raw_fd`] polls
    /// writable. The default is [`Link::send`] (which drops on a full link).
    fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
        self.send(frame).map(|()| true)
    }
    /// [`Link::try_send`] for a frame in a buffer the link may keep: a link
    /// that queues frames in memory (the embedded switch) takes the buffer
    /// itself instead of copying the frame, and leaves another buffer in
    /// `frame` (contents unspecified, possibly empty) for the caller to
    /// reuse. `Ok(false)` leaves `frame` untouched. The default copies
    /// ([`Link::try_send`]).
    fn try_send_buf(&mut self, frame: &mut Vec<u8>) -> io::Result<bool> {
        self.try_send(frame)
    }
    /// Receives one frame into `buf` without blocking; `Ok(None)` when none
    /// is waiting. Returns the frame length in bytes.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    /// Receives one frame without blocking and hands it to `deliver`;
    /// `Ok(false)` when none is waiting. A link that holds its frames in
    /// memory (the embedded switch) hands them from there, without copying
    /// them into `buf` first. The default reads into `buf`
    /// ([`Link::recv`]).
    fn recv_with(&mut self, buf: &mut [u8], deliver: &mut dyn FnMut(&[u8])) -> io::Result<bool> {
        match self.recv(buf)? {
            Some(n) => {
                deliver(buf.get(..n).unwrap_or(buf));
                Ok(true)
            }
            None => Ok(false),
        }
    }
    /// A descriptor that polls readable while frames are waiting, for epoll;
    /// `None` for links that are polled by calling [`Link::recv`].
    fn raw_fd(&self) -> Option<RawFd>;
    /// The link's frame counters, for reports; `None` for a link that
    /// keeps none. Wrappers (fault injection, pcap) answer for their inner
    /// link.
    fn link_stats(&self) -> Option<LinkStats> {
        None
    }
}

pub mod fault;
pub mod mem;
pub mod packet;
pub mod pcap;
mod stats;
pub mod tap;
pub mod txq;

pub use fault::{FaultConfig, FaultConfigError, FaultLink, FaultRates, FaultStats};
pub use mem::MemLink;
pub use packet::PacketLink;
pub use pcap::PcapLink;
pub use stats::{LinkStats, OpenError};
pub use tap::TapLink;
pub use txq::{Flushed, FrameSource, TxFlush};

#[cfg(test)]
mod netns_tests;
