//! An in-memory full-duplex link for tests: two ends, frames sent on one
//! arrive on the other in order. Each direction is a bounded FIFO; a frame
//! sent while the peer's queue is full is dropped and counted, like a NIC
//! with a full ring. Both ends are `Send` and can live on different threads.
//!
//! Each end's [`LinkCaps::fd`] is an `eventfd(2)` that polls readable exactly
//! while that end has frames waiting, so an epoll loop can wait on it like
//! on a TAP or AF_PACKET descriptor.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use super::stats::LinkStats;
use super::{Icrc, Link, LinkCaps, Rx};

/// Default queue depth of each direction, frames.
pub const DEFAULT_DEPTH: usize = 1024;

/// One direction: a bounded FIFO and the eventfd mirroring "non-empty".
#[derive(Debug)]
struct Direction {
    queue: Mutex<VecDeque<Vec<u8>>>,
    depth: usize,
    /// Readable while `queue` is non-empty; `None` when eventfd failed.
    efd: Option<OwnedFd>,
}

impl Direction {
    fn new(depth: usize) -> Self {
        // SAFETY: plain syscall; the result is checked and then owned.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let efd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
        Self {
            queue: Mutex::new(VecDeque::new()),
            depth,
            efd,
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Vec<u8>>> {
        // A panicking peer thread cannot leave the deque inconsistent.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the eventfd readable (counter > 0). Called with the lock held.
    fn signal(&self) {
        if let Some(fd) = &self.efd {
            // SAFETY: eventfd_write on our own descriptor; EAGAIN only when
            // the counter would overflow, in which case it is readable anyway.
            unsafe { libc::eventfd_write(fd.as_raw_fd(), 1) };
        }
    }

    /// Resets the eventfd to not readable. Called with the lock held.
    fn clear(&self) {
        if let Some(fd) = &self.efd {
            let mut v: libc::eventfd_t = 0;
            // SAFETY: eventfd_read into a live u64; EAGAIN when already zero.
            unsafe { libc::eventfd_read(fd.as_raw_fd(), &mut v) };
        }
    }
}

/// One end of an in-memory link; see [`MemLink::pair`].
#[derive(Debug)]
pub struct MemLink {
    tx: Arc<Direction>,
    rx: Arc<Direction>,
    stats: LinkStats,
}

impl MemLink {
    /// Two connected ends, each direction holding up to [`DEFAULT_DEPTH`] frames.
    pub fn pair() -> (MemLink, MemLink) {
        Self::pair_with_depth(DEFAULT_DEPTH)
    }

    /// Two connected ends, each direction holding up to `depth` frames
    /// (`depth` 0 drops every frame).
    pub fn pair_with_depth(depth: usize) -> (MemLink, MemLink) {
        let a_to_b = Arc::new(Direction::new(depth));
        let b_to_a = Arc::new(Direction::new(depth));
        let a = MemLink {
            tx: a_to_b.clone(),
            rx: b_to_a.clone(),
            stats: LinkStats::default(),
        };
        let b = MemLink {
            tx: b_to_a,
            rx: a_to_b,
            stats: LinkStats::default(),
        };
        (a, b)
    }

    /// Frame counters of this end. [`LinkStats::tx_dropped`] counts frames
    /// this end sent while the peer's queue was full.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// Frames waiting to be received on this end.
    pub fn pending(&self) -> usize {
        self.rx.lock().len()
    }
}

impl Link for MemLink {
    /// Queues a copy of the frame for the peer; drops it when the peer's
    /// queue holds `depth` frames. Never fails.
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let mut q = self.tx.lock();
        if q.len() >= self.tx.depth {
            self.stats.tx_dropped += 1;
            return Ok(());
        }
        q.push_back(frame.to_vec());
        self.tx.signal();
        self.stats.tx_frames += 1;
        Ok(())
    }

    /// Queues a copy of the frame for the peer, or hands it back
    /// (`Ok(false)`, [`LinkStats::tx_busy`]) while the peer's queue holds
    /// `depth` frames.
    fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
        let mut q = self.tx.lock();
        if q.len() >= self.tx.depth {
            self.stats.tx_busy += 1;
            return Ok(false);
        }
        q.push_back(frame.to_vec());
        self.tx.signal();
        self.stats.tx_frames += 1;
        Ok(true)
    }

    /// Takes the oldest waiting frame. A frame longer than the caller's
    /// buffer is discarded ([`LinkStats::rx_oversize`]) and the next one
    /// is tried.
    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
        let mut q = self.rx.lock();
        let mut got = None;
        while let Some(frame) = q.pop_front() {
            if frame.len() <= rx.max_len() {
                self.stats.rx_frames += 1;
                got = Some(frame);
                break;
            }
            self.stats.rx_oversize += 1;
        }
        if q.is_empty() {
            self.rx.clear();
        }
        drop(q);
        Ok(got.and_then(|f| rx.hand(&f, Icrc::Needed)))
    }

    fn caps(&self) -> LinkCaps {
        LinkCaps {
            fd: self.rx.efd.as_ref().map(|fd| fd.as_raw_fd()),
            ..LinkCaps::default()
        }
    }

    fn link_stats(&self) -> Option<LinkStats> {
        Some(self.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::RawFd;

    fn recv_all(l: &mut MemLink) -> Vec<Vec<u8>> {
        let mut buf = [0u8; 64];
        let mut out = Vec::new();
        while let Some(n) = l.recv(&mut buf).unwrap() {
            out.push(buf[..n].to_vec());
        }
        out
    }

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd; timeout 0 never blocks.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 1 && p.revents & libc::POLLIN != 0
    }

    #[test]
    fn mem_pair_delivers_in_order_both_ways() {
        let (mut a, mut b) = MemLink::pair();
        for i in 0..10u8 {
            a.send(&[i; 3]).unwrap();
        }
        b.send(b"back").unwrap();
        assert_eq!(
            recv_all(&mut b),
            (0..10u8).map(|i| vec![i; 3]).collect::<Vec<_>>()
        );
        assert_eq!(recv_all(&mut a), vec![b"back".to_vec()]);
        assert_eq!(
            a.stats(),
            LinkStats {
                tx_frames: 10,
                rx_frames: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn mem_pair_drops_and_counts_when_full() {
        let (mut a, mut b) = MemLink::pair_with_depth(4);
        for i in 0..7u8 {
            a.send(&[i]).unwrap();
        }
        assert_eq!(a.stats().tx_frames, 4);
        assert_eq!(a.stats().tx_dropped, 3);
        assert_eq!(b.pending(), 4);
        // The first four survive, in order; room frees up after receiving.
        assert_eq!(recv_all(&mut b), vec![vec![0], vec![1], vec![2], vec![3]]);
        a.send(&[9]).unwrap();
        assert_eq!(recv_all(&mut b), vec![vec![9]]);
    }

    #[test]
    fn mem_recv_skips_frames_larger_than_the_buffer() {
        let (mut a, mut b) = MemLink::pair();
        a.send(&[1; 100]).unwrap();
        a.send(&[2; 10]).unwrap();
        let mut small = [0u8; 64];
        assert_eq!(b.recv(&mut small).unwrap(), Some(10));
        assert_eq!(b.stats().rx_oversize, 1);
        assert_eq!(b.recv(&mut small).unwrap(), None);
    }

    #[test]
    fn mem_eventfd_is_readable_exactly_while_frames_wait() {
        let (mut a, mut b) = MemLink::pair();
        let fd = b.caps().fd.expect("eventfd");
        assert!(!readable(fd));
        a.send(b"x").unwrap();
        a.send(b"y").unwrap();
        assert!(readable(fd));
        let mut buf = [0u8; 8];
        assert_eq!(b.recv(&mut buf).unwrap(), Some(1));
        assert!(readable(fd), "one frame still waiting");
        assert_eq!(b.recv(&mut buf).unwrap(), Some(1));
        assert!(!readable(fd));
        assert!(a.caps().fd.is_some_and(|f| !readable(f)));
    }

    #[test]
    fn mem_pair_works_across_threads() {
        let (mut a, mut b) = MemLink::pair_with_depth(100_000);
        let t = std::thread::spawn(move || {
            for i in 0..1000u32 {
                a.send(&i.to_le_bytes()).unwrap();
            }
            a
        });
        let a = t.join().unwrap();
        assert_eq!(a.stats().tx_frames, 1000);
        let got: Vec<u32> = recv_all(&mut b)
            .iter()
            .map(|f| u32::from_le_bytes(f[..4].try_into().unwrap()))
            .collect();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }
}
