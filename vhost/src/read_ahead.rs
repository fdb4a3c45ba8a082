//! A test link that reads ahead, as AF_PACKET's `recvmmsg(2)` does
//! (`vrnic::link::PacketLink`): for the switch's and the data path's tests
//! of frames its descriptor no longer shows.

use std::collections::VecDeque;
use std::io;

use vrnic::link::{Link, LinkCaps, MemLink, Rx};

/// A [`MemLink`] whose first receive takes every frame waiting on it, so
/// its descriptor no longer polls readable for the frames it holds.
pub(crate) struct ReadAhead {
    inner: MemLink,
    held: VecDeque<Vec<u8>>,
}

impl ReadAhead {
    /// Reads ahead on `inner`.
    pub(crate) fn new(inner: MemLink) -> Self {
        Self {
            inner,
            held: VecDeque::new(),
        }
    }
}

impl Link for ReadAhead {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.inner.send(frame)
    }

    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
        rx.read(|buf| self.read(buf))
    }

    fn caps(&self) -> LinkCaps {
        self.inner.caps()
    }
}

impl ReadAhead {
    /// The next frame held, into `buf`; at the first with none held,
    /// every frame waiting on the inner link is taken.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        if self.held.is_empty() {
            let mut b = vec![0u8; buf.len()];
            while let Some(n) = self.inner.recv(&mut b)? {
                self.held.push_back(b[..n].to_vec());
            }
        }
        let Some(f) = self.held.pop_front() else {
            return Ok(None);
        };
        buf[..f.len()].copy_from_slice(&f);
        Ok(Some(f.len()))
    }
}
