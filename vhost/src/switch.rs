//! The embedded switch: the functions of one daemon share one uplink
//! ([`Link`]: TAP, AF_PACKET, ...) and reach each other without it.
//!
//! Each function's device gets a [`SwitchPort`], itself a [`Link`]. What a
//! port sends is forwarded by its destination MAC address (IEEE 802.1Q
//! forwarding with a static table: the ports' own MACs):
//!
//! - a group address (broadcast or multicast: ARP requests, IPv6 neighbour
//!   discovery) goes to every *other* port and to the uplink;
//! - a port's MAC (the sender's own too: a QP that addresses its own
//!   device's IP is looped back) goes into that port's receive queue;
//! - anything else goes to the uplink.
//!
//! Frames from the uplink go to the port whose MAC they are addressed to
//! (a group address: to every port); others are dropped and counted
//! ([`UplinkStats::rx_unknown`]), as a NIC drops frames for another MAC.
//!
//! **Receive queues.** Each port has a bounded FIFO of
//! [`PORT_QUEUE_DEPTH`] frames. A device offering a frame for a full queue
//! with [`Link::try_send`] (what its `TxFlush` does) gets it back and sends
//! it again later, counted in [`PortStats::tx_busy`]: local traffic is held
//! back, not lost, as behind a NIC's full TX ring. A frame pushed by
//! [`Link::send`] or from the uplink into a full queue is dropped and
//! counted ([`PortStats::rx_queue_dropped`]), as a NIC with a full receive
//! ring (or rxe with a full `skb` queue) drops; RC retransmits. The queue
//! is lock-free (crossbeam's `ArrayQueue`); a frame between two ports
//! travels in the buffer its sender built it in ([`Link::try_send_buf`],
//! [`Link::recv_with`]), without its ICRC ([`LinkCaps::local_macs`]). The
//! receiving port takes all queued frames at once, so a port holds at
//! most twice [`PORT_QUEUE_DEPTH`] frames: those taken and not yet
//! returned by its `recv`, and a full queue behind them. An `eventfd(2)`
//! polls readable while the port has frames.
//!
//! **The uplink has no reader thread.** A port's [`Link::recv`] first takes
//! its own queue's frames, then reads the uplink itself (under the uplink's
//! lock, at most [`UPLINK_PULL_MAX`] frames per call): a frame for the
//! caller is returned directly (no copy more than a device alone on the
//! uplink makes), one for another port goes into that port's queue. A
//! port's [`LinkCaps::fd`] is an `epoll(7)` descriptor watching both its
//! eventfd and the uplink's descriptor, so the port's worker wakes for
//! either. With one function this is today's path: the worker reads the
//! uplink. With several, a frame on the uplink may wake every connected
//! function's worker; the first to take the lock reads it, the others find
//! the uplink empty. An uplink without a descriptor (a polled link) gives
//! ports without one: their workers poll every
//! [`crate::datapath::LINK_POLL_INTERVAL_NS`].
//!
//! A port's frames for the uplink go to it in runs (the device's `TxFlush`
//! hands several at once, [`Link::try_send_many`]: one `sendmmsg(2)` on
//! AF_PACKET); a frame from the uplink for the reading port goes to its
//! device in the uplink's own buffer ([`Link::recv_with`], filled by
//! `recvmmsg(2)` on AF_PACKET), under the uplink's lock. Such an uplink
//! reads ahead, so a pull that stops at its bound makes its port readable
//! again (frames read ahead do not make the uplink's descriptor readable).
//!
//! Locks: the port table (read for every frame, written when a port comes
//! or goes) and the uplink (held for one send of a run, or one pull of at
//! most [`UPLINK_PULL_MAX`] frames and the delivery of the puller's own
//! frame to its device, which does not touch the switch); the queues take
//! none. A sender never holds the table while it waits for the uplink, so
//! there is no cycle.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crossbeam_queue::ArrayQueue;

use vrnic::batch::gso;
use vrnic::data::PeerMemory;
use vrnic::link::{
    Icrc, Link, LinkCaps, LinkSetting, LinkStats, LocalMacs, LocalReach, Polling, Rx,
};

/// Receive queue depth of a port, frames.
pub const PORT_QUEUE_DEPTH: usize = 1024;
/// Most ports one switch has (the daemon's function limit).
pub const MAX_PORTS: usize = 64;
/// Frames one [`Link::recv`] of a port reads from the uplink, at most,
/// before it returns without a frame for itself (the others went to their
/// ports' queues); the uplink stays readable, so its worker comes back.
pub const UPLINK_PULL_MAX: usize = 64;
/// Reads of the uplink in a row that found no frame, after which a port
/// its own worker polls ([`Polling::Own`]) reads the uplink only one round
/// in [`UPLINK_IDLE_EVERY`]: an empty read is a system call, about half of
/// an idle polling round, and cost 0.6 µs of a 64 B round trip between two
/// functions (ib_send_lat typical 4.5 against 5.1 µs, measured here). The
/// first read that finds a frame makes the port read every round again,
/// so a flow on the wire pays at most [`UPLINK_IDLE_EVERY`] − 1 rounds
/// (a few µs) once, after the uplink was idle. A switch of one port reads
/// it every round: there the uplink is the only source of frames.
pub const UPLINK_IDLE_PULLS: u32 = 64;
/// See [`UPLINK_IDLE_PULLS`].
pub const UPLINK_IDLE_EVERY: u32 = 4;
/// Length of an Ethernet header, bytes: a shorter frame is dropped.
const ETH_HLEN: usize = 14;

/// Errors adding a port.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    /// Another port has this MAC address.
    #[error("MAC {0} is already a port of this switch")]
    DuplicateMac(crate::addr::Mac),
    /// The MAC address is a group (multicast or broadcast) address.
    #[error("MAC {0} is a group address")]
    GroupMac(crate::addr::Mac),
    /// The switch has [`MAX_PORTS`] ports.
    #[error("the switch has its maximum of {MAX_PORTS} ports")]
    Full,
    /// The port's eventfd or epoll descriptor could not be made.
    #[error("cannot make the port's descriptors: {0}")]
    Fd(#[source] io::Error),
}

/// Counters of one port, in frames, since the port was added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames this port sent to local ports (itself included).
    pub tx_local: u64,
    /// Frames this port sent to the uplink (group frames counted here and,
    /// once per other port, in `tx_local`).
    pub tx_uplink: u64,
    /// Frames this port sent that were shorter than an Ethernet header.
    pub tx_runt: u64,
    /// Frames received from local ports.
    pub rx_local: u64,
    /// Frames received from the uplink.
    pub rx_uplink: u64,
    /// Frames for this port dropped because its receive queue held
    /// [`PORT_QUEUE_DEPTH`] frames.
    pub rx_queue_dropped: u64,
    /// Times this port's device offered a frame ([`Link::try_send`]) that
    /// the destination (a full port queue, a full uplink) could not take
    /// yet: the device kept it and sent it again later, nothing was lost.
    pub tx_busy: u64,
    /// Frames for this port dropped because no driver was there to read
    /// them ([`LinkSetting::Attended`]): sent to it, or queued when its
    /// driver left.
    pub rx_unattended: u64,
    /// Batches for this port dropped because their payload referred to
    /// a sender's memory that changed since they were sent (the sender's
    /// driver left, or set another memory table).
    pub rx_stale_refs: u64,
}

/// Counters of the uplink, in frames, since the switch was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UplinkStats {
    /// Frames handed to the uplink's `send`.
    pub tx_frames: u64,
    /// Frames the uplink's `send` refused with an error.
    pub tx_errors: u64,
    /// Frames read from the uplink.
    pub rx_frames: u64,
    /// Frames read from the uplink for no port's MAC, or shorter than an
    /// Ethernet header; dropped.
    pub rx_unknown: u64,
}

#[derive(Debug, Default)]
struct PortCounters {
    tx_local: AtomicU64,
    tx_uplink: AtomicU64,
    tx_runt: AtomicU64,
    rx_local: AtomicU64,
    rx_uplink: AtomicU64,
    rx_queue_dropped: AtomicU64,
    tx_busy: AtomicU64,
    rx_unattended: AtomicU64,
    rx_stale_refs: AtomicU64,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

impl PortCounters {
    fn get(&self) -> PortStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PortStats {
            tx_local: g(&self.tx_local),
            tx_uplink: g(&self.tx_uplink),
            tx_runt: g(&self.tx_runt),
            rx_local: g(&self.rx_local),
            rx_uplink: g(&self.rx_uplink),
            rx_queue_dropped: g(&self.rx_queue_dropped),
            tx_busy: g(&self.tx_busy),
            rx_unattended: g(&self.rx_unattended),
            rx_stale_refs: g(&self.rx_stale_refs),
        }
    }
}

/// Frame buffers a port's queue keeps for reuse, at most: a frame costs
/// no allocation once the queue has carried this many. Senders that hand
/// their buffers over ([`Link::try_send_buf`]) take one each in exchange,
/// so it covers an RC window in flight (128 frames) and the answers
/// beside it: about 2.3 MiB a port at most with 9 KiB frames.
const SPARE_BUFFERS: usize = 256;
/// Spare buffers longer than a jumbo frame ([`BIG_BUFFER`]: they held
/// batches, `vrnic::batch::gso`) a port keeps, at most (plus one per
/// sender racing to give one back): 16 × 80 KiB, 1.3 MiB.
const SPARE_BIG_MAX: usize = 16;
/// Capacity above which a buffer counts as big, bytes.
const BIG_BUFFER: usize = 16 * 1024;
/// Bytes of frames a port's queue holds at most (besides the frame
/// count, [`PORT_QUEUE_DEPTH`]): 8 MiB, about what 1024 jumbo frames
/// took before batches; more is held back at the sender (or dropped, from
/// the uplink) as for a full queue.
pub const PORT_QUEUE_BYTES: usize = 8 * 1024 * 1024;

/// What the switch keeps of a port: its MAC, receive queue and counters.
///
/// The queue is lock-free (crossbeam's bounded [`ArrayQueue`]): senders on
/// other workers and the port's own worker never wait for each other, even
/// when the scheduler preempts one of them mid-operation (two workers on
/// one core made the former mutex a convoy).
#[derive(Debug)]
struct PortShared {
    id: u64,
    mac: [u8; 6],
    /// Frames, each with whether its ICRC is checked: not for frames from
    /// the daemon's own ports, whose engines may leave it out
    /// ([`LinkCaps::local_macs`]).
    frames: ArrayQueue<Queued>,
    /// Bytes of the frames in `frames` (at most [`PORT_QUEUE_BYTES`]).
    bytes: AtomicUsize,
    /// Buffers of frames the port's worker has read, for senders to copy
    /// into or to take in exchange for theirs.
    spare: ArrayQueue<Vec<u8>>,
    /// Big buffers among `spare` (about [`SPARE_BIG_MAX`] at most).
    big_spares: AtomicUsize,
    /// The eventfd has been written since the receiver last reset it: a
    /// sender finding it set saves the system call (one write per burst).
    signalled: AtomicBool,
    /// Someone polls the port for now ([`LinkSetting::Polling`]: its own
    /// worker or another): the receiver keeps `signalled` set, so senders
    /// write nothing.
    polled: AtomicBool,
    /// Another thread polls the port ([`Polling::Other`]): the port's
    /// reads leave the uplink to the poller's own port.
    adopted: AtomicBool,
    /// The eventfd may have been written since the receiver last emptied
    /// it ([`PortShared::wake`] sets it after each write): a polled port
    /// empties it only then, and a port whose flag is clear resets (empties)
    /// it then too ([`SwitchPort::take_batch`]: a sender slow to write).
    written: AtomicBool,
    /// Readable while the port has frames (see [`SwitchPort::take_batch`]).
    efd: OwnedFd,
    counters: PortCounters,
    /// The memory of the port's device, shared with the other ports'
    /// devices while its driver is there ([`LinkSetting::Memory`]): packets
    /// between two ports that both share theirs leave their payload in the
    /// sender's memory, and the receiver copies it from there. With its
    /// generation: a new one (from [`NEXT_GENERATION`]) at every change.
    memory: RwLock<(u64, Option<Arc<dyn PeerMemory>>)>,
    /// `memory`'s generation, read by senders without the lock: the tag of
    /// the frames they queue ([`Queued::gen`]).
    mem_gen: AtomicU64,
    /// The generation of the sender's memory the frame being delivered to
    /// this port's device was sent with (0: none): the only memory its
    /// references may be read from (`Reach::memory_of`).
    delivering: AtomicU64,
    /// A driver is there to read the port's frames ([`LinkSetting::Attended`]).
    attended: AtomicBool,
}

/// A frame in a port's queue: its bytes, whether its ICRC is checked, and
/// the generation of its sender's memory when it was queued (0 for frames
/// from the uplink): a batch whose payload stays in the sender's memory is
/// read only if that memory is still the one it was sent with.
type Queued = (Vec<u8>, Icrc, u64);

/// Memory generations: unique in the process, so that a function added
/// again with the same MAC does not take up its predecessor's.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

impl PortShared {
    /// The memory the port's device shares, if any.
    fn memory(&self) -> Option<Arc<dyn PeerMemory>> {
        self.memory
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// The memory the port's device shares, if it is still generation
    /// `gen`.
    fn memory_if(&self, gen: u64) -> Option<Arc<dyn PeerMemory>> {
        let m = self.memory.read().unwrap_or_else(|e| e.into_inner());
        (m.0 == gen).then(|| m.1.clone()).flatten()
    }

    /// Whether a driver reads the port's frames.
    fn attended(&self) -> bool {
        self.attended.load(Ordering::Relaxed)
    }

    /// Queues a copy of `frame`; drops and counts it when the queue is full.
    /// Returns whether it was queued.
    fn push(&self, frame: &[u8], icrc: Icrc, gen: u64) -> bool {
        if !self.attended() {
            inc(&self.counters.rx_unattended);
            return false;
        }
        let queued = self.try_push(frame, icrc, gen);
        if !queued {
            inc(&self.counters.rx_queue_dropped);
        }
        queued
    }

    /// Queues a copy of `frame` (in a spare buffer) if the queue has room;
    /// returns whether it was queued (a full queue counts nothing: the
    /// sender keeps the frame).
    fn try_push(&self, frame: &[u8], icrc: Icrc, gen: u64) -> bool {
        if self.frames.is_full() {
            return false;
        }
        let mut buf = self.take_spare();
        buf.clear();
        buf.extend_from_slice(frame);
        match self.enqueue(buf, icrc, gen) {
            Ok(()) => true,
            Err(buf) => {
                self.give_spare(buf);
                false
            }
        }
    }

    /// A spare buffer, or a new empty one.
    fn take_spare(&self) -> Vec<u8> {
        let b = self.spare.pop().unwrap_or_default();
        if b.capacity() > BIG_BUFFER {
            self.big_spares.fetch_sub(1, Ordering::Relaxed);
        }
        b
    }

    /// Keeps `b` as a spare, unless the spares are full or, for a big
    /// buffer, hold [`SPARE_BIG_MAX`] big ones already; returns false when
    /// the spares are full.
    fn give_spare(&self, b: Vec<u8>) -> bool {
        let big = b.capacity() > BIG_BUFFER;
        if big && self.big_spares.load(Ordering::Relaxed) >= SPARE_BIG_MAX {
            return true;
        }
        if self.spare.push(b).is_err() {
            return false;
        }
        if big {
            self.big_spares.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// Queues the frame in `frame` itself, leaving a spare buffer (or an
    /// empty one) in its place, if the queue has room; returns whether it
    /// was queued (a full queue counts nothing and leaves `frame` as it
    /// was). No copy: the receiver reads the sender's buffer, and the
    /// buffers circulate between the senders' pools and the queue's spares.
    fn try_push_buf(&self, frame: &mut Vec<u8>, gen: u64) -> bool {
        if self.frames.is_full() {
            return false;
        }
        let spare = self.take_spare();
        let buf = std::mem::replace(frame, spare);
        // From a port of the switch: its ICRC may be left out.
        match self.enqueue(buf, Icrc::Unneeded, gen) {
            Ok(()) => true,
            Err(buf) => {
                let spare = std::mem::replace(frame, buf);
                self.give_spare(spare);
                false
            }
        }
    }

    /// Queues `buf` and makes the port readable ([`PortShared::signal`]);
    /// gives `buf` back when the queue is full, in frames or in
    /// [`PORT_QUEUE_BYTES`] (other senders may have filled it since the
    /// caller looked).
    fn enqueue(&self, buf: Vec<u8>, icrc: Icrc, gen: u64) -> Result<(), Vec<u8>> {
        self.queue_from(buf, icrc, gen)?;
        self.signal();
        Ok(())
    }

    /// `queue_from` of a frame from the uplink (for tests).
    #[cfg(test)]
    fn queue(&self, buf: Vec<u8>, icrc: Icrc) -> Result<(), Vec<u8>> {
        self.queue_from(buf, icrc, 0)
    }

    /// [`PortShared::enqueue`] without the signal: the frame, whose
    /// sender's memory was generation `gen`, is in the queue, the port not
    /// yet made readable for it.
    fn queue_from(&self, buf: Vec<u8>, icrc: Icrc, gen: u64) -> Result<(), Vec<u8>> {
        let len = buf.len();
        if self.bytes.fetch_add(len, Ordering::Relaxed) + len > PORT_QUEUE_BYTES {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            return Err(buf);
        }
        if let Err((buf, _, _)) = self.frames.push((buf, icrc, gen)) {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            return Err(buf);
        }
        Ok(())
    }

    /// Makes the port readable after a frame was queued. Only a frame
    /// finding the eventfd reset writes it (a system call saved per frame
    /// of a burst). The fence orders the frame's queueing before the flag's
    /// read, against the receiver's reset-then-look ([`SwitchPort::take_batch`]):
    /// either this sender sees the flag reset and writes, or the receiver
    /// sees the frame.
    fn signal(&self) {
        fence(Ordering::SeqCst);
        if !self.signalled.swap(true, Ordering::SeqCst) {
            self.wake();
        }
    }

    /// Makes the port readable whatever the flag said (it holds frames the
    /// eventfd may not show): flag set, eventfd written.
    fn stay_readable(&self) {
        self.signalled.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// Empties the port's eventfd: not readable until written again.
    fn drain(&self) {
        let mut v: libc::eventfd_t = 0;
        // SAFETY: eventfd_read into a live u64 on our own (non-blocking)
        // descriptor.
        unsafe { libc::eventfd_read(self.efd.as_raw_fd(), &mut v) };
    }

    /// Writes the port's eventfd: readable until the receiver resets it.
    fn wake(&self) {
        // SAFETY: eventfd_write on our own descriptor; EAGAIN only when the
        // counter would overflow, when it is readable anyway.
        unsafe { libc::eventfd_write(self.efd.as_raw_fd(), 1) };
        // After the write: a polled receiver that clears the flag before
        // it is set finds it set at its next look and empties the eventfd.
        self.written.store(true, Ordering::SeqCst);
    }
}

struct Inner {
    uplink: Mutex<Box<dyn Link>>,
    uplink_fd: Option<RawFd>,
    ports: RwLock<Vec<Arc<PortShared>>>,
    next_id: AtomicU64,
    uplink_tx: AtomicU64,
    uplink_tx_errors: AtomicU64,
    uplink_rx: AtomicU64,
    uplink_rx_unknown: AtomicU64,
}

impl Inner {
    fn ports(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<PortShared>>> {
        self.ports.read().unwrap_or_else(|e| e.into_inner())
    }

    fn uplink(&self) -> MutexGuard<'_, Box<dyn Link>> {
        self.uplink.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends `frame` on the uplink. Errors are counted, not returned: the
    /// sender's `send` succeeded as far as the switch is concerned (a
    /// switch does not tell a port that its uplink dropped a frame).
    ///
    /// With `hold`, a frame the uplink is too full to take now is not
    /// taken (`false`, not counted) instead of dropped.
    fn to_uplink(&self, frame: &[u8], hold: bool) -> bool {
        let sent = if hold {
            self.uplink().try_send(frame)
        } else {
            self.uplink().send(frame).map(|()| true)
        };
        match sent {
            Ok(false) => return false,
            Ok(true) => {}
            Err(e) => {
                inc(&self.uplink_tx_errors);
                tracing::debug!("uplink send failed: {e}");
            }
        }
        inc(&self.uplink_tx);
        true
    }

    /// Sends the frames on the uplink in one [`Link::try_send_many`]
    /// (one `sendmmsg(2)` on AF_PACKET) under one lock; returns how many
    /// it took: fewer when it is full (not counted) or a frame failed (the
    /// failed frame counts as taken, as in [`Inner::to_uplink`]).
    fn to_uplink_many(&self, frames: &mut [Vec<u8>]) -> usize {
        let sent = self.uplink().try_send_many(frames);
        let n = match sent {
            Ok(n) => n.min(frames.len()),
            Err(e) => {
                inc(&self.uplink_tx_errors);
                tracing::debug!("uplink send failed: {e}");
                1
            }
        };
        add(&self.uplink_tx, n);
        n
    }
}

/// The switch: an uplink and up to [`MAX_PORTS`] ports. Cheap to clone
/// (all clones are the same switch).
#[derive(Clone)]
pub struct Switch {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Switch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Switch")
            .field("ports", &self.inner.ports().len())
            .finish()
    }
}

fn is_group(mac: &[u8]) -> bool {
    mac.first().is_some_and(|b| b & 1 != 0)
}

fn show_mac(m: &[u8; 6]) -> String {
    crate::addr::Mac(*m).to_string()
}

impl Switch {
    /// A switch with no port yet on `uplink`.
    pub fn new(uplink: Box<dyn Link>) -> Self {
        let uplink_fd = uplink.caps().fd;
        Self {
            inner: Arc::new(Inner {
                uplink: Mutex::new(uplink),
                uplink_fd,
                ports: RwLock::new(Vec::new()),
                next_id: AtomicU64::new(0),
                uplink_tx: AtomicU64::new(0),
                uplink_tx_errors: AtomicU64::new(0),
                uplink_rx: AtomicU64::new(0),
                uplink_rx_unknown: AtomicU64::new(0),
            }),
        }
    }

    /// Adds a port with MAC address `mac`. The port leaves the switch when
    /// it is dropped (frames waiting in its queue are dropped with it).
    ///
    /// # Errors
    /// [`SwitchError::DuplicateMac`], [`SwitchError::GroupMac`],
    /// [`SwitchError::Full`], or [`SwitchError::Fd`].
    pub fn add_port(&self, mac: [u8; 6]) -> Result<SwitchPort, SwitchError> {
        if is_group(&mac) {
            return Err(SwitchError::GroupMac(crate::addr::Mac(mac)));
        }
        // SAFETY: plain syscall; the result is checked and then owned.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(SwitchError::Fd(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let efd = unsafe { OwnedFd::from_raw_fd(raw) };
        let epfd = match self.inner.uplink_fd {
            Some(up) => Some(port_epoll(efd.as_raw_fd(), up).map_err(SwitchError::Fd)?),
            None => None,
        };
        let shared = Arc::new(PortShared {
            id: self.inner.next_id.fetch_add(1, Ordering::Relaxed),
            mac,
            frames: ArrayQueue::new(PORT_QUEUE_DEPTH),
            bytes: AtomicUsize::new(0),
            spare: ArrayQueue::new(SPARE_BUFFERS),
            big_spares: AtomicUsize::new(0),
            memory: RwLock::new((0, None)),
            mem_gen: AtomicU64::new(0),
            delivering: AtomicU64::new(0),
            attended: AtomicBool::new(true),
            signalled: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            adopted: AtomicBool::new(false),
            written: AtomicBool::new(false),
            efd,
            counters: PortCounters::default(),
        });
        let mut ports = self.inner.ports.write().unwrap_or_else(|e| e.into_inner());
        if ports.iter().any(|p| p.mac == mac) {
            return Err(SwitchError::DuplicateMac(crate::addr::Mac(mac)));
        }
        if ports.len() >= MAX_PORTS {
            return Err(SwitchError::Full);
        }
        ports.push(shared.clone());
        Ok(SwitchPort {
            shared,
            sw: self.inner.clone(),
            epfd,
            taken: VecDeque::new(),
            used: Vec::new(),
            scratch: Vec::new(),
            uplink_empty: 0,
            uplink_skipped: 0,
        })
    }

    /// Number of ports.
    pub fn ports(&self) -> usize {
        self.inner.ports().len()
    }

    /// The counters of the port with MAC `mac`, if there is one.
    pub fn port_stats(&self, mac: [u8; 6]) -> Option<PortStats> {
        self.inner
            .ports()
            .iter()
            .find(|p| p.mac == mac)
            .map(|p| p.counters.get())
    }

    /// The uplink link's own counters ([`Link::link_stats`]: frames,
    /// super-frames, the kernel's drops), `None` for a link without. Takes
    /// the uplink's lock for a moment.
    pub fn uplink_link_stats(&self) -> Option<LinkStats> {
        self.inner.uplink().link_stats()
    }

    /// The uplink's counters.
    pub fn uplink_stats(&self) -> UplinkStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        UplinkStats {
            tx_frames: g(&self.inner.uplink_tx),
            tx_errors: g(&self.inner.uplink_tx_errors),
            rx_frames: g(&self.inner.uplink_rx),
            rx_unknown: g(&self.inner.uplink_rx_unknown),
        }
    }
}

/// An epoll descriptor readable while `efd` or `uplink` is.
fn port_epoll(efd: RawFd, uplink: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked and then owned.
    let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let ep = unsafe { OwnedFd::from_raw_fd(raw) };
    for fd in [efd, uplink] {
        epoll_ctl(&ep, libc::EPOLL_CTL_ADD, fd)?;
    }
    Ok(ep)
}

/// Adds `fd` to the epoll set `ep` (readable: `EPOLLIN`) or deletes it
/// (`op`: `EPOLL_CTL_ADD` or `EPOLL_CTL_DEL`).
fn epoll_ctl(ep: &OwnedFd, op: libc::c_int, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: valid epoll and target descriptors; `ev` is live.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Moves what `q`'s queue holds now to `taken` (at most
/// [`PORT_QUEUE_DEPTH`] frames); whether there was any.
fn pull_queue(q: &PortShared, taken: &mut VecDeque<Queued>) -> bool {
    let mut any = false;
    for _ in 0..PORT_QUEUE_DEPTH {
        let Some(f) = q.frames.pop() else {
            break;
        };
        q.bytes.fetch_sub(f.0.len(), Ordering::Relaxed);
        taken.push_back(f);
        any = true;
    }
    any
}

/// What a port knows of the other ports ([`SwitchPort::local_macs`]).
struct Reach {
    sw: std::sync::Weak<Inner>,
    own: std::sync::Weak<PortShared>,
}

impl Reach {
    /// The port with MAC `mac`, if the switch and such a port still exist.
    fn port(&self, mac: &[u8; 6]) -> Option<Arc<PortShared>> {
        let sw = self.sw.upgrade()?;
        let ports = sw.ports();
        ports.iter().find(|p| p.mac == *mac).cloned()
    }
}

impl LocalReach for Reach {
    fn contains(&self, mac: &[u8; 6]) -> bool {
        self.port(mac).is_some()
    }

    fn by_reference(&self, mac: &[u8; 6]) -> bool {
        let own = self.own.upgrade().is_some_and(|p| p.memory().is_some());
        own && self.port(mac).is_some_and(|p| p.memory().is_some())
    }

    /// The memory of the port at `mac` if it is still the one the frame
    /// being delivered to this port was sent with (issue 27: a sender whose
    /// driver left, or a function added again with its MAC, has another
    /// now, and the frame's references are not read).
    fn memory_of(&self, mac: &[u8; 6]) -> Option<Arc<dyn PeerMemory>> {
        let own = self.own.upgrade()?;
        let gen = own.delivering.load(Ordering::Relaxed);
        let mem = self.port(mac)?.memory_if(gen).filter(|_| gen != 0);
        if mem.is_none() {
            inc(&own.counters.rx_stale_refs);
        }
        mem
    }
}

/// One port of a [`Switch`]: the [`Link`] of one function's device.
pub struct SwitchPort {
    shared: Arc<PortShared>,
    sw: Arc<Inner>,
    /// Readable while the queue or the uplink is (none for a polled uplink).
    epfd: Option<OwnedFd>,
    /// Frames taken from the queue in one go, oldest first, that
    /// [`Link::recv`] has not returned yet (at most [`PORT_QUEUE_DEPTH`]).
    taken: VecDeque<Queued>,
    /// Buffers of frames returned, for the queue's spares (at most
    /// [`SPARE_BUFFERS`]).
    used: Vec<Vec<u8>>,
    /// The uplink's receive buffer for [`Link::recv`] (which copies out).
    scratch: Vec<u8>,
    /// Reads of the uplink in a row that found no frame
    /// ([`UPLINK_IDLE_PULLS`]).
    uplink_empty: u32,
    /// Rounds whose uplink read was skipped since the last read.
    uplink_skipped: u32,
}

impl std::fmt::Debug for SwitchPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwitchPort")
            .field("mac", &show_mac(&self.shared.mac))
            .finish()
    }
}

impl SwitchPort {
    /// The port's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.shared.mac
    }

    /// The port's counters.
    pub fn stats(&self) -> PortStats {
        self.shared.counters.get()
    }

    /// Forwards `frame` by its destination MAC (see the module); returns
    /// whether the switch took it. With `hold`, a unicast frame whose
    /// destination cannot take it now (a full port queue, a full uplink)
    /// is not taken and is counted in [`PortStats::tx_busy`]; without, and
    /// for group frames (they may already sit in some queues), it is
    /// dropped and counted where it could not go.
    fn forward(&self, frame: &[u8], hold: bool) -> bool {
        let c = &self.shared.counters;
        let Some(dst) = frame.get(..6).filter(|_| frame.len() >= ETH_HLEN) else {
            inc(&c.tx_runt);
            return true;
        };
        let hold = hold && !is_group(dst);
        let gen = self.shared.mem_gen.load(Ordering::Relaxed);
        {
            let ports = self.sw.ports();
            if is_group(dst) {
                for p in ports.iter().filter(|p| p.id != self.shared.id) {
                    inc(&c.tx_local);
                    if p.push(frame, Icrc::Unneeded, gen) {
                        inc(&p.counters.rx_local);
                    }
                }
            } else if let Some(p) = ports.iter().find(|p| p.mac == dst) {
                // Nobody reads an unattended port: its frames cost only
                // themselves, never the sender's other traffic.
                if !p.attended() {
                    inc(&c.tx_local);
                    inc(&p.counters.rx_unattended);
                    return true;
                }
                let queued = if hold {
                    p.try_push(frame, Icrc::Unneeded, gen)
                } else {
                    p.push(frame, Icrc::Unneeded, gen)
                };
                if hold && !queued {
                    inc(&c.tx_busy);
                    return false;
                }
                inc(&c.tx_local);
                if queued {
                    inc(&p.counters.rx_local);
                }
                return true;
            }
        }
        if gso::is_batch(frame) {
            // Its destination left since the batch was made: its packets
            // go on the wire one by one, sealed.
            let mut sent = true;
            gso::split(frame, &mut Vec::new(), |f| {
                sent &= self.sw.to_uplink(f, false)
            });
            inc(if sent { &c.tx_uplink } else { &c.tx_busy });
            return true;
        }
        if !self.sw.to_uplink(frame, hold) {
            inc(&c.tx_busy);
            return false;
        }
        inc(&c.tx_uplink);
        true
    }

    /// Forwards the unicast frame in `frame` to a port's queue without
    /// copying it ([`PortShared::try_push_buf`]), holding it back when the
    /// queue is full; group frames and frames for the uplink go through
    /// [`SwitchPort::forward`]. Returns whether the switch took the frame.
    fn forward_buf(&self, frame: &mut Vec<u8>) -> bool {
        let c = &self.shared.counters;
        if let Some(dst) = frame
            .get(..6)
            .filter(|d| frame.len() >= ETH_HLEN && !is_group(d))
        {
            let ports = self.sw.ports();
            if let Some(p) = ports.iter().find(|p| p.mac == dst) {
                if !p.attended() {
                    inc(&c.tx_local);
                    inc(&p.counters.rx_unattended);
                    return true;
                }
                let gen = self.shared.mem_gen.load(Ordering::Relaxed);
                if !p.try_push_buf(frame, gen) {
                    inc(&c.tx_busy);
                    return false;
                }
                inc(&c.tx_local);
                inc(&p.counters.rx_local);
                return true;
            }
        }
        self.forward(frame, true)
    }

    /// Whether [`SwitchPort::forward`] sends `frame` to the uplink as it
    /// is: a unicast frame, not a batch, for no port's MAC.
    fn goes_to_uplink(&self, frame: &[u8]) -> bool {
        frame
            .get(..6)
            .filter(|d| frame.len() >= ETH_HLEN && !is_group(d) && !gso::is_batch(frame))
            .is_some_and(|dst| !self.sw.ports().iter().any(|p| p.mac == dst))
    }

    /// Hands the oldest frame of the port's own queue to `deliver`, from
    /// the queue's buffer (no copy); false when the port has none.
    fn deliver_own(&mut self, deliver: &mut dyn FnMut(&[u8], Icrc)) -> bool {
        if self.taken.is_empty() && !self.take_batch() {
            return false;
        }
        let Some((frame, icrc, gen)) = self.taken.pop_front() else {
            return false;
        };
        // The references of a batch are read from its sender's memory
        // only if that is still the one it was sent with (`Reach`).
        self.shared.delivering.store(gen, Ordering::Relaxed);
        deliver(&frame, icrc);
        self.shared.delivering.store(0, Ordering::Relaxed);
        if self.used.len() < SPARE_BUFFERS {
            self.used.push(frame);
        }
        true
    }

    /// Takes the oldest frame of the port's own queue into `buf`, as on a
    /// wire: a RoCEv2 frame from another port gets its ICRC
    /// ([`vrnic::wire::seal_icrc`]). Frames longer than `buf` are dropped
    /// (counted as queue drops).
    fn pop_own(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            if self.taken.is_empty() && !self.take_batch() {
                return None;
            }
            let (frame, icrc, _) = self.taken.pop_front()?;
            if icrc == Icrc::Unneeded && gso::is_batch(&frame) {
                // Its packets, sealed, first in line (at most
                // `BATCH_MAX_PACKETS` frames more than the queue's depth).
                let mut packets = Vec::new();
                gso::split(&frame, &mut Vec::new(), |f| packets.push(f.to_vec()));
                for f in packets.into_iter().rev() {
                    self.taken.push_front((f, Icrc::Needed, 0));
                }
                continue;
            }
            let fits = buf.get_mut(..frame.len()).map(|dst| {
                dst.copy_from_slice(&frame);
                if icrc == Icrc::Unneeded {
                    // Not RoCEv2 (ARP, neighbour discovery): nothing to seal.
                    let _ = vrnic::wire::seal_icrc(dst);
                }
                frame.len()
            });
            if self.used.len() < SPARE_BUFFERS {
                self.used.push(frame);
            }
            if fits.is_some() {
                return fits;
            }
            inc(&self.shared.counters.rx_queue_dropped);
        }
    }

    /// Moves the frames of the shared queue to `taken` (a sender's burst
    /// is taken in one go), and gives the used buffers back as spares.
    /// Returns false when the queue was empty: the port then has no frame
    /// at all and its eventfd is reset, so that it is readable exactly
    /// while the port has frames (queued or taken) or a frame came after
    /// this reset. An empty queue costs no system call when the eventfd was
    /// already reset and nothing wrote it since: a lone function's path to
    /// the uplink stays as cheap as a device on the uplink itself.
    ///
    /// The reset clears the flag, then empties the eventfd, then looks at
    /// the queue again. A sender slow to signal (preempted between queueing
    /// its frame and [`PortShared::signal`]) may set the flag after the
    /// clear and write before the emptying, for a frame this port took
    /// before the reset: the look finds nothing, and its write is gone
    /// with the flag set, so the next sender, seeing it set, would write
    /// nothing and its frame would wait unseen. So a flag found set again
    /// after the look writes the eventfd once more (a spare wake-up at
    /// worst). A late write after the emptying sets `written`, and the next
    /// call empties it, so the port does not stay readable without frames
    /// (its worker would wake for nothing until the next frame).
    fn take_batch(&mut self) -> bool {
        let (q, taken) = (&*self.shared, &mut self.taken);
        for b in self.used.drain(..) {
            // A full spare queue: the rest are freed with the drain.
            if !q.give_spare(b) {
                break;
            }
        }
        if pull_queue(q, taken) {
            return true;
        }
        if !q.signalled.load(Ordering::Relaxed) && !q.written.load(Ordering::Relaxed) {
            return false;
        }
        if q.polled.load(Ordering::Relaxed) {
            // Polled: the flag stays set (senders write nothing), the
            // eventfd is emptied so it wakes nobody ([`LinkSetting::Polling`]),
            // if anything wrote it since it was last emptied (else a
            // system call a polling round for nothing).
            if q.written.swap(false, Ordering::SeqCst) {
                q.drain();
            }
            return false;
        }
        // Reset, then look again: a frame whose sender still saw the flag
        // set (and so wrote nothing) is found now; a sender after the reset
        // writes the eventfd anew (`PortShared::signal`).
        q.signalled.store(false, Ordering::SeqCst);
        q.written.store(false, Ordering::SeqCst);
        q.drain();
        fence(Ordering::SeqCst);
        if pull_queue(q, taken) {
            // Frames after all (their senders saw the flag still set), and
            // the emptying may have taken a later sender's write: set it
            // again, so the port stays readable while it holds frames, for
            // a worker that takes fewer than all before it sleeps.
            q.stay_readable();
            return true;
        }
        if q.signalled.load(Ordering::SeqCst) {
            // A sender set the flag after the clear; the emptying may have
            // taken its write (see above).
            q.wake();
        }
        false
    }

    /// Reads the uplink (at most [`UPLINK_PULL_MAX`] frames) until a frame
    /// for this port arrives, which goes to `deliver` (still under the
    /// uplink's lock, in the uplink's buffer where it has one); frames for
    /// other ports go to their queues. `buf` is the uplink's receive
    /// buffer (its length the largest frame taken). Returns whether a
    /// frame was delivered.
    ///
    /// A link may read ahead (AF_PACKET's `recvmmsg(2)`): its descriptor
    /// then need not poll readable for frames it holds. So the caller
    /// comes back until this returns false (as the data path does), and a
    /// pull that stops at [`UPLINK_PULL_MAX`] makes its own port readable.
    fn pull_uplink(
        &self,
        buf: &mut [u8],
        deliver: &mut dyn FnMut(&[u8], Icrc),
        read_any: &mut bool,
    ) -> io::Result<bool> {
        // Another port reading or sending on the uplink: do not wait for
        // it. A reader forwards this port's frames to its queue and reads
        // on until the uplink is empty; after a sender, the uplink's
        // descriptor is still readable, so this port comes back. (Polling
        // workers call this on every empty round; waiting here made the
        // lock the switch's hottest spot.)
        let mut uplink = match self.sw.uplink.try_lock() {
            Ok(u) => u,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
        };
        for _ in 0..UPLINK_PULL_MAX {
            let mut mine = false;
            let got = uplink.recv_with(buf, &mut |frame, _| {
                *read_any = true;
                mine = self.route_from_uplink(frame);
                if mine {
                    deliver(frame, Icrc::Needed);
                }
            });
            match got {
                Ok(true) if mine => return Ok(true),
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        self.shared.stay_readable();
        Ok(false)
    }

    /// Whether this read of the uplink is skipped: only while the port's
    /// own worker polls it and the uplink was idle for
    /// [`UPLINK_IDLE_PULLS`] reads, then all but one in
    /// [`UPLINK_IDLE_EVERY`], if other ports share the switch. A worker
    /// woken by `epoll_wait` always reads.
    fn skip_uplink(&mut self) -> bool {
        if !self.shared.polled.load(Ordering::Relaxed)
            || self.uplink_empty < UPLINK_IDLE_PULLS
            || self.sw.ports().len() < 2
        {
            return false;
        }
        self.uplink_skipped += 1;
        if self.uplink_skipped < UPLINK_IDLE_EVERY {
            return true;
        }
        self.uplink_skipped = 0;
        false
    }

    /// [`SwitchPort::pull_uplink`] for [`Link::recv`] and
    /// [`Link::recv_with`], unless another thread polls the port (the
    /// poller's own port reads the uplink, `LinkSetting::Polling`) or this
    /// round's read of an idle uplink is skipped
    /// ([`SwitchPort::skip_uplink`]); counts reads that found no frame
    /// for any port.
    fn read_uplink(
        &mut self,
        buf: &mut [u8],
        deliver: &mut dyn FnMut(&[u8], Icrc),
    ) -> io::Result<bool> {
        if self.shared.adopted.load(Ordering::Relaxed) || self.skip_uplink() {
            return Ok(false);
        }
        let mut read_any = false;
        let r = self.pull_uplink(buf, deliver, &mut read_any);
        self.uplink_empty = if read_any {
            0
        } else {
            self.uplink_empty.saturating_add(1)
        };
        r
    }

    /// Forwards a frame read from the uplink: to the other ports' queues
    /// (a group frame to all of them); true when it is (also) this port's.
    fn route_from_uplink(&self, frame: &[u8]) -> bool {
        inc(&self.sw.uplink_rx);
        let Some(dst) = frame.get(..6).filter(|_| frame.len() >= ETH_HLEN) else {
            inc(&self.sw.uplink_rx_unknown);
            return false;
        };
        let ports = self.sw.ports();
        if is_group(dst) {
            for p in ports.iter().filter(|p| p.id != self.shared.id) {
                if p.push(frame, Icrc::Needed, 0) {
                    inc(&p.counters.rx_uplink);
                }
            }
            inc(&self.shared.counters.rx_uplink);
            return true;
        }
        if dst == self.shared.mac {
            inc(&self.shared.counters.rx_uplink);
            return true;
        }
        match ports.iter().find(|p| p.mac == dst) {
            Some(p) => {
                if p.push(frame, Icrc::Needed, 0) {
                    inc(&p.counters.rx_uplink);
                }
            }
            None => inc(&self.sw.uplink_rx_unknown),
        }
        false
    }
    /// While polled ([`Polling::Own`] or [`Polling::Other`]), frames
    /// queued for the port write nothing (the flag that saves senders the
    /// system call stays set): the poller reads the queue every round
    /// anyway. Polled by another thread, frames on the uplink do not make
    /// the port readable either, and the port's reads do not read the
    /// uplink: the poller's own port does, once a round, and queues this
    /// port's frames (one system call a round, not one a function). Back
    /// to [`Polling::Off`], the flag is reset and the queue looked at
    /// again, the port readable if frames wait there or on the uplink (as
    /// in `SwitchPort::take_batch`).
    pub fn set_polling(&mut self, polling: Polling) {
        let q = &*self.shared;
        let adopted = polling == Polling::Other;
        if q.adopted.swap(adopted, Ordering::SeqCst) != adopted {
            // The uplink leaves the port's epoll set while another thread
            // polls the port (its frames would wake the port's worker for
            // the poller's reads) and comes back after (level-triggered:
            // readable at once if frames wait there).
            if let (Some(ep), Some(up)) = (&self.epfd, self.sw.uplink_fd) {
                let op = if adopted {
                    libc::EPOLL_CTL_DEL
                } else {
                    libc::EPOLL_CTL_ADD
                };
                if let Err(e) = epoll_ctl(ep, op, up) {
                    tracing::debug!("epoll_ctl on a port's uplink: {e}");
                }
            }
        }
        let polled = polling != Polling::Off;
        if q.polled.swap(polled, Ordering::SeqCst) == polled {
            return;
        }
        if polled {
            // Senders see the flag set and write nothing; what the eventfd
            // held is emptied (the poller reads the queue every round).
            q.signalled.store(true, Ordering::SeqCst);
            q.written.store(false, Ordering::SeqCst);
            q.drain();
            return;
        }
        q.signalled.store(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.taken.is_empty() || !q.frames.is_empty() {
            q.stay_readable();
        }
    }

    /// Shares the device's memory with the other ports' devices (see
    /// [`SwitchPort::caps`]).
    /// Frames queued with the previous memory's generation are not read
    /// by reference any more (`Reach::memory_of`).
    pub fn share_memory(&mut self, mem: Option<Arc<dyn PeerMemory>>) {
        let gen = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        let mut m = self
            .shared
            .memory
            .write()
            .unwrap_or_else(|e| e.into_inner());
        *m = (gen, mem);
        self.shared.mem_gen.store(gen, Ordering::Relaxed);
    }

    /// An unattended port takes no frames (they are dropped and counted,
    /// [`PortStats::rx_unattended`]); what it held when its driver came or
    /// went is dropped too.
    pub fn set_attended(&mut self, attended: bool) {
        let q = &*self.shared;
        // Also when it becomes attended: a sender racing with the last
        // change may have queued a frame for nobody.
        if q.attended.swap(attended, Ordering::SeqCst) == attended {
            return;
        }
        let mut n = self.taken.len();
        self.taken.clear();
        while let Some(f) = q.frames.pop() {
            q.bytes.fetch_sub(f.0.len(), Ordering::Relaxed);
            n += 1;
        }
        add(&q.counters.rx_unattended, n);
    }

    /// [`Link::recv`]: a frame from the port's queue, else from the
    /// uplink, copied into `buf` as on a wire ([`SwitchPort::pop_own`]).
    fn recv_copy(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if let Some(n) = self.pop_own(buf) {
            return Ok(Some(n));
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(buf.len(), 0);
        let mut got = None;
        let r = self.read_uplink(&mut scratch, &mut |frame, _| {
            if let Some(dst) = buf.get_mut(..frame.len()) {
                dst.copy_from_slice(frame);
                got = Some(frame.len());
            }
        });
        self.scratch = scratch;
        r?;
        Ok(got)
    }
}

impl Link for SwitchPort {
    /// Its descriptor (an epoll set of the port's eventfd and the
    /// uplink's), and the MACs of the switch's ports (this one's too):
    /// frames to them stay in the daemon and need no ICRC; packets may
    /// leave their payload in this port's device's memory for a port that
    /// shares its memory too (both devices are plain functions, no pcap
    /// or fault injection between: [`LinkSetting::Memory`]).
    fn caps(&self) -> LinkCaps {
        LinkCaps {
            fd: self.epfd.as_ref().map(|fd| fd.as_raw_fd()),
            local_macs: Some(LocalMacs::with(Reach {
                sw: Arc::downgrade(&self.sw),
                own: Arc::downgrade(&self.shared),
            })),
        }
    }

    /// Acts on every setting ([`SwitchPort::set_polling`],
    /// [`SwitchPort::share_memory`], [`SwitchPort::set_attended`]).
    fn set(&mut self, setting: LinkSetting) {
        match setting {
            LinkSetting::Polling(p) => self.set_polling(p),
            LinkSetting::Attended(a) => self.set_attended(a),
            LinkSetting::Memory(m) => self.share_memory(m),
        }
    }

    /// Forwards `frame` by its destination MAC (see the module). Never
    /// fails: a frame a queue or the uplink cannot take is dropped and
    /// counted, like a switch does.
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.forward(frame, false);
        Ok(())
    }

    /// As [`Link::send`], but a unicast frame the destination cannot take
    /// now (a full port queue, a full uplink) is handed back (`Ok(false)`,
    /// counted in [`PortStats::tx_busy`]) for the device to send again
    /// later ([`vrnic::link::txq::TxFlush`]), as a NIC's full TX ring
    /// holds the host back instead of losing frames. Group frames are sent
    /// as by [`Link::send`].
    fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
        Ok(self.forward(frame, true))
    }

    /// As [`Link::try_send`], without copying a frame for another port:
    /// the queue takes the buffer ([`Link::try_send_buf`]).
    fn try_send_buf(&mut self, frame: &mut Vec<u8>) -> io::Result<bool> {
        Ok(self.forward_buf(frame))
    }

    /// As [`Link::try_send_buf`] for each frame, but a run of frames for
    /// the uplink goes to it in one [`Link::try_send_many`] (one
    /// `sendmmsg(2)` on AF_PACKET) under one lock.
    fn try_send_many(&mut self, frames: &mut [Vec<u8>]) -> io::Result<usize> {
        let c = &self.shared.counters;
        let mut i = 0;
        while let Some(rest) = frames.get_mut(i..).filter(|r| !r.is_empty()) {
            let run = rest.iter().take_while(|f| self.goes_to_uplink(f)).count();
            let Some(run) = rest.get_mut(..run).filter(|r| !r.is_empty()) else {
                if !self.forward_buf(&mut rest[0]) {
                    return Ok(i);
                }
                i += 1;
                continue;
            };
            let len = run.len();
            let took = self.sw.to_uplink_many(run);
            add(&c.tx_uplink, took);
            i += took;
            if took < len {
                inc(&c.tx_busy);
                return Ok(i);
            }
        }
        Ok(frames.len())
    }

    /// A frame from the port's queue, else from the uplink (see the
    /// module); `Ok(None)` when neither has one for this port.
    /// [`Rx::Copy`]: as on a wire (`SwitchPort::pop_own`: a batch split
    /// into sealed frames, a frame without its ICRC sealed).
    /// [`Rx::Deliver`]: a frame from the port's queue handed over in place
    /// (a batch whole); frames from the uplink are read into the buffer.
    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
        let (buf, deliver) = match rx {
            Rx::Copy(buf) => return self.recv_copy(buf),
            Rx::Deliver(buf, deliver) => (buf, deliver),
        };
        let mut len = 0;
        let mut deliver = |f: &[u8], icrc: Icrc| {
            len = f.len();
            deliver(f, icrc);
        };
        let got = self.deliver_own(&mut deliver) || self.read_uplink(buf, &mut deliver)?;
        Ok(got.then_some(len))
    }
}

impl Drop for SwitchPort {
    fn drop(&mut self) {
        let mut ports = self.sw.ports.write().unwrap_or_else(|e| e.into_inner());
        ports.retain(|p| p.id != self.shared.id);
    }
}

#[cfg(test)]
#[path = "switch_tests.rs"]
mod tests;
