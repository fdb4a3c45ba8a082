//! Links: where the engine's Ethernet frames go and come from.
//!
//! One trait, [`Link`], implemented by a TAP device ([`tap`]), an AF_PACKET
//! raw socket bound to an existing interface ([`packet`]), an in-memory pair
//! for tests ([`mem`]) and a pcap-writing wrapper ([`pcap`]); [`txq`]
//! hands a device's frames to a link without losing them to a full one.

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::data::PeerMemory;
pub use crate::wire::Icrc;

pub use crate::data::{LocalMacs, LocalReach};

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
    /// Sends frames from the front of `frames`, in order, while the link
    /// takes them, in as few system calls as it can (`sendmmsg(2)` on an
    /// AF_PACKET socket); for each frame taken the link may leave another
    /// buffer in its place, as [`Link::try_send_buf`] does. `Ok(n)`: the
    /// first `n` frames were taken (or dropped for good, as by
    /// [`Link::try_send`]); `n < frames.len()` when the link is full
    /// (`n == 0`: full at the first frame, counted in
    /// [`LinkStats::tx_busy`]) or frame `n` failed (its error is returned
    /// by the next call, whose first frame it is). `Err`: the first frame
    /// failed with an error other than "full" and was not sent. The
    /// default sends one by one with [`Link::try_send_buf`].
    fn try_send_many(&mut self, frames: &mut [Vec<u8>]) -> io::Result<usize> {
        for (i, f) in frames.iter_mut().enumerate() {
            match self.try_send_buf(f) {
                Ok(true) => {}
                Ok(false) => return Ok(i),
                Err(e) if i == 0 => return Err(e),
                Err(_) => return Ok(i),
            }
        }
        Ok(frames.len())
    }
    /// Receives one frame into `buf` without blocking; `Ok(None)` when none
    /// is waiting. Returns the frame length in bytes.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    /// Receives one frame without blocking and hands it to `deliver`, with
    /// whether its ICRC must be checked ([`Icrc::Unneeded`]: built by
    /// another engine of this process, [`Link::local_macs`]); `Ok(false)`
    /// when none is waiting. A link that holds its frames in memory (the
    /// embedded switch) hands them from there, without copying them into
    /// `buf` first. The default reads into `buf` ([`Link::recv`]), a frame
    /// whose ICRC is checked.
    fn recv_with(
        &mut self,
        buf: &mut [u8],
        deliver: &mut dyn FnMut(&[u8], Icrc),
    ) -> io::Result<bool> {
        match self.recv(buf)? {
            Some(n) => {
                deliver(buf.get(..n).unwrap_or(buf), Icrc::Needed);
                Ok(true)
            }
            None => Ok(false),
        }
    }
    /// The destinations this link delivers to another engine of this
    /// process without a wire between (the other functions of a daemon,
    /// through its embedded switch): a device may emit its RoCEv2 frames
    /// to them without the ICRC ([`Icrc::Unneeded`]), RC and UC packets
    /// of one flow batched into one frame ([`crate::batch::gso`]), and they
    /// are received with [`Icrc::Unneeded`] through [`Link::recv_with`]. A
    /// link that returns `Some` delivers such batches whole through
    /// `recv_with` (of any length) and splits them into sealed frames
    /// wherever a copy leaves the process.
    /// `None` (the default): every frame needs its ICRC — wires, and
    /// wrappers that copy frames out (pcap) or change them (fault
    /// injection).
    fn local_macs(&self) -> Option<LocalMacs> {
        None
    }

    /// Makes the device's memory readable by the other engines of this
    /// process this link reaches, so that packets to them may leave their
    /// payload there ([`LocalReach::by_reference`]); `None` withdraws it
    /// (the device was reset or its driver left). A link that reaches no
    /// other engine, or that must see every payload (pcap, fault
    /// injection), ignores it (the default).
    fn share_memory(&mut self, _mem: Option<Arc<dyn PeerMemory>>) {}
    /// A descriptor that polls readable while frames are waiting, for epoll;
    /// `None` for links that are polled by calling [`Link::recv`]. A link
    /// may read ahead (AF_PACKET's `recvmmsg(2)`): the frames it holds do
    /// not make the descriptor readable, so a caller that stops calling
    /// [`Link::recv`] or [`Link::recv_with`] before it finds none comes
    /// back without waiting for the descriptor.
    fn raw_fd(&self) -> Option<RawFd>;
    /// The link's frame counters, for reports; `None` for a link that
    /// keeps none. Wrappers (fault injection, pcap) answer for their inner
    /// link.
    fn link_stats(&self) -> Option<LinkStats> {
        None
    }
    /// Who polls the link's receive side for now ([`Polling`]): while
    /// someone does, its descriptor need not wake the link's reader for
    /// frames that arrive; back to [`Polling::Off`], the descriptor is
    /// readable again if frames wait. Only a link whose descriptor is its
    /// own signal acts on it (the embedded switch's ports); wrappers pass
    /// it on; others ignore it (the default).
    fn set_polling(&mut self, _polling: Polling) {}
    /// Whether a driver is there to drain the device's receive side (a
    /// frontend is connected): a link that queues frames for the device
    /// (the embedded switch's ports) drops, and counts, frames for an
    /// unattended device at once instead of letting them fill its queue,
    /// so that its senders are not held back by a queue nobody reads
    /// (issue 27). Wrappers pass it on; others ignore it (the default).
    fn set_attended(&mut self, _attended: bool) {}
}

/// Who polls a link's receive side ([`Link::set_polling`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Polling {
    /// Nobody: the link's descriptor wakes its reader (`epoll_wait`).
    #[default]
    Off,
    /// Its own reader, every round (a worker's polling session): frames
    /// that arrive need wake nobody.
    Own,
    /// Another thread (a daemon's poller serving several devices): frames
    /// need wake nobody, and the link's reads leave what the devices share
    /// (the switch's uplink) to the poller's own link.
    Other,
}

/// [`Link::recv`] for a link that holds its received frames in buffers of
/// its own: copies `frame` (the next one, if any) into `buf` and returns
/// its length, as a link reading into `buf` would.
pub(crate) fn copy_frame(frame: Option<&[u8]>, buf: &mut [u8]) -> Option<usize> {
    let f = frame?;
    if let Some(dst) = buf.get_mut(..f.len()) {
        dst.copy_from_slice(f);
    }
    Some(f.len())
}

/// [`Link::recv_with`] for such a link: hands `frame`, if any, to
/// `deliver` in place, its ICRC to be checked (it came from a wire).
pub(crate) fn hand_frame(frame: Option<&[u8]>, deliver: &mut dyn FnMut(&[u8], Icrc)) -> bool {
    frame.map(|f| deliver(f, Icrc::Needed)).is_some()
}

pub mod fault;
pub mod mem;
pub mod packet;
pub mod pcap;
mod stats;
pub mod tap;
pub mod txq;
pub mod uso;

pub use fault::{FaultConfig, FaultConfigError, FaultLink, FaultRates, FaultStats};
pub use mem::MemLink;
pub use packet::PacketLink;
pub use pcap::PcapLink;
pub use stats::{LinkStats, OpenError};
pub use tap::TapLink;
pub use txq::{Flushed, FrameSource, TxFlush};

#[cfg(test)]
mod netns_tests;
