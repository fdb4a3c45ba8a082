//! Links: where the engine's Ethernet frames go and come from.
//!
//! One trait, [`Link`], implemented by a TAP device ([`tap`]), an AF_PACKET
//! raw socket bound to an existing interface ([`packet`]), an in-memory pair
//! for tests ([`mem`]) and a pcap-writing wrapper ([`pcap`]); [`txq`]
//! hands a device's frames to a link without losing them to a full one.
//!
//! A link sends ([`Link::send`] and its batching variants) and receives
//! through one primitive ([`Link::receive`], behind [`Link::recv`] and
//! [`Link::recv_with`]); what it is beyond that is one value
//! ([`Link::caps`]: its descriptor, the destinations it reaches within
//! the process), and what it is told of its device one method
//! ([`Link::set`]). A wrapper names its inner link ([`Link::inner`]) and
//! answers with it for the rest ([`LinkCaps::wrapped`],
//! [`LinkSetting::wrapped`]).

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
    /// caller keeps it and tries again, e.g. when [`LinkCaps::fd`] polls
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
    /// The one receive primitive: takes one frame without blocking, if
    /// one is waiting, where `rx` says ([`Rx::Copy`] for [`Link::recv`],
    /// [`Rx::Deliver`] for [`Link::recv_with`]); `Ok(None)` when none is.
    /// Returns the frame's length in bytes. A link that holds its frames
    /// in memory of its own (a kernel link's read-ahead, a queue) hands
    /// one over with [`Rx::hand`]; a link that reads into the caller's
    /// buffer (a wrapper of another link) does so through [`Rx::read`].
    /// A link whose frames may come without their ICRC (the embedded
    /// switch's ports, [`LinkCaps::local_macs`]) tells the two apart:
    /// [`Rx::Copy`] wants frames as on a wire.
    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>>;
    /// Receives one frame into `buf` without blocking; `Ok(None)` when none
    /// is waiting. Returns the frame length in bytes. Not to be
    /// implemented: [`Link::receive`] with [`Rx::Copy`].
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        self.receive(Rx::Copy(buf))
    }
    /// Receives one frame without blocking and hands it to `deliver`, with
    /// whether its ICRC must be checked ([`Icrc::Unneeded`]: built by
    /// another engine of this process, [`LinkCaps::local_macs`]);
    /// `Ok(false)` when none is waiting. A link that holds its frames in
    /// memory (a kernel link's read-ahead, the embedded switch) hands them
    /// from there, without copying them into `buf` first; `buf` then only
    /// bounds their length (but a port of the switch hands its batches
    /// whole, of any length). Not to be implemented: [`Link::receive`]
    /// with [`Rx::Deliver`].
    fn recv_with(
        &mut self,
        buf: &mut [u8],
        deliver: &mut dyn FnMut(&[u8], Icrc),
    ) -> io::Result<bool> {
        Ok(self.receive(Rx::Deliver(buf, deliver))?.is_some())
    }
    /// What the link is beyond its frames ([`LinkCaps`]): its descriptor
    /// and the destinations it reaches within the process. Constant for
    /// the link's life, so callers may keep it. The default: a wrapper's
    /// ([`Link::inner`]) is its inner link's, [`LinkCaps::wrapped`];
    /// another link's none.
    fn caps(&self) -> LinkCaps {
        self.inner().map(|l| l.caps().wrapped()).unwrap_or_default()
    }
    /// The link's frame counters, for reports; `None` for a link that
    /// keeps none. The default: a wrapper's ([`Link::inner`]) are its
    /// inner link's; another link keeps none.
    fn link_stats(&self) -> Option<LinkStats> {
        self.inner()?.link_stats()
    }
    /// Tells the link how the device on it is served ([`LinkSetting`]).
    /// Only the embedded switch's ports act on the settings. The default:
    /// a wrapper ([`Link::inner_mut`]) passes on what
    /// [`LinkSetting::wrapped`] keeps; other links ignore them.
    fn set(&mut self, setting: LinkSetting) {
        if let (Some(l), Some(s)) = (self.inner_mut(), setting.wrapped()) {
            l.set(s);
        }
    }
    /// The link a wrapper that sees or changes every frame (pcap, fault
    /// injection) sends and receives through: it answers for the rest
    /// ([`Link::caps`], [`Link::link_stats`]) without reaching another
    /// engine of the process itself. `None` (the default): not such a
    /// wrapper.
    fn inner(&self) -> Option<&dyn Link> {
        None
    }
    /// [`Link::inner`], to pass settings on ([`Link::set`]).
    fn inner_mut(&mut self) -> Option<&mut dyn Link> {
        None
    }
}

/// What a link is beyond sending and receiving ([`Link::caps`]). The
/// default: no descriptor, no destination within the process.
#[derive(Clone, Default)]
pub struct LinkCaps {
    /// A descriptor that polls readable while frames are waiting, for
    /// epoll; `None` for links that are polled by calling [`Link::recv`].
    /// A link may read ahead (AF_PACKET's `recvmmsg(2)`): the frames it
    /// holds do not make the descriptor readable, so a caller that stops
    /// calling [`Link::recv`] or [`Link::recv_with`] before it finds none
    /// comes back without waiting for the descriptor.
    pub fd: Option<RawFd>,
    /// The destinations this link delivers to another engine of this
    /// process without a wire between (the other functions of a daemon,
    /// through its embedded switch): a device may emit its RoCEv2 frames
    /// to them without the ICRC ([`Icrc::Unneeded`]), RC and UC packets
    /// of one flow batched into one frame ([`crate::batch::gso`]), and
    /// they are received with [`Icrc::Unneeded`] through
    /// [`Link::recv_with`]. A link that has some delivers such batches
    /// whole through `recv_with` (of any length) and splits them into
    /// sealed frames wherever a copy leaves the process ([`Link::recv`]
    /// included). `None`: every frame needs its ICRC — wires, and
    /// wrappers that copy frames out (pcap) or change them (fault
    /// injection), [`LinkCaps::wrapped`].
    pub local_macs: Option<LocalMacs>,
}

impl LinkCaps {
    /// What a wrapper that sees or changes every frame (pcap, fault
    /// injection) answers for its inner link's `self`: the same
    /// descriptor, and no destination within the process (its frames
    /// need their ICRC).
    pub fn wrapped(self) -> LinkCaps {
        LinkCaps {
            local_macs: None,
            ..self
        }
    }
}

impl std::fmt::Debug for LinkCaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkCaps")
            .field("fd", &self.fd)
            .field("local_macs", &self.local_macs.is_some())
            .finish()
    }
}

/// How the device on a link is served ([`Link::set`]).
#[derive(Clone)]
pub enum LinkSetting {
    /// Who polls the link's receive side for now ([`Polling`]): while
    /// someone does, its descriptor need not wake the link's reader for
    /// frames that arrive; back to [`Polling::Off`], the descriptor is
    /// readable again if frames wait. Only a link whose descriptor is its
    /// own signal acts on it (the embedded switch's ports).
    Polling(Polling),
    /// Whether a driver is there to drain the device's receive side (a
    /// frontend is connected): a link that queues frames for the device
    /// (the embedded switch's ports) drops, and counts, frames for an
    /// unattended device at once instead of letting them fill its queue,
    /// so that its senders are not held back by a queue nobody reads
    /// (issue 27).
    Attended(bool),
    /// Makes the device's memory readable by the other engines of this
    /// process the link reaches, so that packets to them may leave their
    /// payload there ([`LocalReach::by_reference`]); `None` withdraws it
    /// (the device was reset or its driver left). A link that reaches no
    /// other engine, or that must see every payload (pcap, fault
    /// injection), ignores it.
    Memory(Option<Arc<dyn PeerMemory>>),
}

impl LinkSetting {
    /// What a wrapper that sees or changes every frame (pcap, fault
    /// injection) passes on to its inner link: all but
    /// [`LinkSetting::Memory`] (it reaches no other engine,
    /// [`LinkCaps::wrapped`]).
    pub fn wrapped(self) -> Option<LinkSetting> {
        match self {
            LinkSetting::Memory(_) => None,
            s => Some(s),
        }
    }
}

impl std::fmt::Debug for LinkSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkSetting::Polling(p) => f.debug_tuple("Polling").field(p).finish(),
            LinkSetting::Attended(a) => f.debug_tuple("Attended").field(a).finish(),
            LinkSetting::Memory(m) => f.debug_tuple("Memory").field(&m.is_some()).finish(),
        }
    }
}

/// Where [`Link::receive`] puts a frame.
pub enum Rx<'a> {
    /// Copied into the buffer ([`Link::recv`]), as on a wire: a frame
    /// longer than the buffer is not taken.
    Copy(&'a mut [u8]),
    /// Handed to the callback with whether its ICRC must be checked
    /// ([`Link::recv_with`]). The buffer is for a link that reads into
    /// one; its length bounds the frames of a link that holds them in
    /// memory of its own.
    Deliver(&'a mut [u8], &'a mut dyn FnMut(&[u8], Icrc)),
}

impl Rx<'_> {
    /// The longest frame taken, bytes: the buffer's length.
    pub fn max_len(&self) -> usize {
        match self {
            Rx::Copy(b) | Rx::Deliver(b, _) => b.len(),
        }
    }

    /// Hands over `frame`, held in memory of the link's own: copies it
    /// into the buffer ([`Rx::Copy`]; `None` when it does not fit) or
    /// hands it to the callback in place ([`Rx::Deliver`], whatever its
    /// length). Returns its length.
    pub fn hand(self, frame: &[u8], icrc: Icrc) -> Option<usize> {
        match self {
            Rx::Copy(buf) => {
                buf.get_mut(..frame.len())?.copy_from_slice(frame);
                Some(frame.len())
            }
            Rx::Deliver(_, deliver) => {
                deliver(frame, icrc);
                Some(frame.len())
            }
        }
    }

    /// Receives with `read`, which reads one frame into the buffer and
    /// returns its length as [`Link::recv`] does (a wrapper: its inner
    /// link's `recv`); [`Rx::Deliver`] then hands that frame to the
    /// callback, its ICRC to be checked.
    pub fn read(
        self,
        read: impl FnOnce(&mut [u8]) -> io::Result<Option<usize>>,
    ) -> io::Result<Option<usize>> {
        match self {
            Rx::Copy(buf) => read(buf),
            Rx::Deliver(buf, deliver) => {
                let got = read(buf)?;
                if let Some(n) = got {
                    deliver(buf.get(..n).unwrap_or(buf), Icrc::Needed);
                }
                Ok(got)
            }
        }
    }
}

/// Who polls a link's receive side ([`LinkSetting::Polling`]).
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A link reaching MAC `[1; 6]` on descriptor 7 that records the
    /// settings it is given and hands `frame` over, without its ICRC.
    struct Probe {
        settings: Arc<Mutex<Vec<String>>>,
        frame: Option<Vec<u8>>,
    }

    impl Link for Probe {
        fn send(&mut self, _: &[u8]) -> io::Result<()> {
            Ok(())
        }
        fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
            Ok(self.frame.take().and_then(|f| rx.hand(&f, Icrc::Unneeded)))
        }
        fn caps(&self) -> LinkCaps {
            LinkCaps {
                fd: Some(7),
                local_macs: Some(LocalMacs::new(|m| *m == [1; 6])),
            }
        }
        fn link_stats(&self) -> Option<LinkStats> {
            Some(LinkStats {
                tx_frames: 3,
                ..LinkStats::default()
            })
        }
        fn set(&mut self, setting: LinkSetting) {
            self.settings.lock().unwrap().push(format!("{setting:?}"));
        }
    }

    fn probe(frame: &[u8]) -> (Probe, Arc<Mutex<Vec<String>>>) {
        let settings = Arc::new(Mutex::new(Vec::new()));
        let p = Probe {
            settings: settings.clone(),
            frame: Some(frame.to_vec()),
        };
        (p, settings)
    }

    /// A wrapper (fault injection) answers with its inner link's
    /// descriptor and counters and passes on its settings, but reaches no
    /// engine of the process: no local MACs, no shared memory.
    #[test]
    fn a_wrapper_answers_with_its_inner_link_but_reaches_nothing_itself() {
        let (p, settings) = probe(b"frame");
        let mut l = FaultLink::new(Box::new(p), FaultConfig::default()).unwrap();
        let caps = l.caps();
        assert_eq!(caps.fd, Some(7));
        assert!(caps.local_macs.is_none());
        assert_eq!(l.link_stats().map(|s| s.tx_frames), Some(3));
        l.set(LinkSetting::Polling(Polling::Own));
        l.set(LinkSetting::Memory(None));
        l.set(LinkSetting::Attended(true));
        assert_eq!(
            *settings.lock().unwrap(),
            ["Polling(Own)", "Attended(true)"]
        );
        // The wrapper reads into the caller's buffer: its frames need
        // their ICRC checked.
        let mut got = Vec::new();
        let took = l
            .recv_with(&mut [0; 16], &mut |f, icrc| got.push((f.to_vec(), icrc)))
            .unwrap();
        assert!(took);
        assert_eq!(got, [(b"frame".to_vec(), Icrc::Needed)]);
    }

    /// A frame held by the link is copied when it fits the buffer and
    /// handed over in place, whatever its length, with its ICRC mode.
    #[test]
    fn rx_copies_what_fits_and_hands_over_in_place() {
        let (mut p, _) = probe(b"frame");
        let mut buf = [0u8; 4];
        assert_eq!(p.recv(&mut buf).unwrap(), None, "longer than the buffer");
        let (mut p, _) = probe(b"frame");
        let mut got = Vec::new();
        assert!(p
            .recv_with(&mut buf, &mut |f, icrc| got.push((f.to_vec(), icrc)))
            .unwrap());
        assert_eq!(got, [(b"frame".to_vec(), Icrc::Unneeded)]);
        let (mut p, _) = probe(b"fr");
        assert_eq!(p.recv(&mut buf).unwrap(), Some(2));
        assert_eq!(&buf[..2], b"fr");
    }
}
