//! Long-term page pins that outlive a killed program: an `io_uring`
//! (io_uring_register(2)) whose registered buffers pin the pages of every
//! range the device may write (DMA rings, registered MRs) with the
//! kernel's `FOLL_LONGTERM` pins. Pinned pages are neither freed nor
//! migrated (compaction skips them), unlike merely `mlock`ed ones.
//!
//! The agent takes a duplicate of the ring's descriptor
//! (`pidfd_getfd(2)`: `SCM_RIGHTS` refuses io_uring descriptors) and keeps
//! it until the program's device context is closed: if the program dies, its pages
//! stay pinned (and unused by anyone else) until the device has forgotten
//! them. The table holds [`MAX_SLOTS`] ranges of at most [`MAX_SLOT_LEN`]
//! bytes each (the kernel's limits); a longer range takes several slots.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Registered-buffer slots (the kernel's `IORING_MAX_REG_BUFFERS`).
pub const MAX_SLOTS: u32 = 1 << 14;
/// Longest range one slot pins, bytes (the kernel's 1 GiB per buffer).
pub const MAX_SLOT_LEN: usize = 1 << 30;

/// A table of pinned ranges. See the [module documentation](self).
pub struct Pins {
    ring: io_uring::IoUring,
    /// `(start, len)` per slot in use.
    slots: Vec<Option<(usize, usize)>>,
    free: Vec<u32>,
}

impl std::fmt::Debug for Pins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pins")
            .field("in_use", &(self.slots.len() - self.free.len()))
            .finish()
    }
}

impl Pins {
    /// An empty table. Errors: `io_uring` unavailable (kernel without it,
    /// `kernel.io_uring_disabled`), or its buffer table cannot be made.
    pub fn new() -> io::Result<Pins> {
        let ring = io_uring::IoUring::new(1)?;
        ring.submitter().register_buffers_sparse(MAX_SLOTS)?;
        Ok(Pins {
            ring,
            slots: vec![None; MAX_SLOTS as usize],
            free: (0..MAX_SLOTS).rev().collect(),
        })
    }

    /// The descriptor holding the pins (hand a duplicate to the agent).
    pub fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    fn update(&self, slot: u32, start: usize, len: usize) -> io::Result<()> {
        let iov = libc::iovec {
            iov_base: start as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: a registered buffer is only used by io_uring I/O naming
        // it, and this ring submits none; registering pins the pages
        // (failing cleanly on a bad range), and an empty iovec unpins.
        unsafe {
            self.ring
                .submitter()
                .register_buffers_update(slot, &[iov], None)
        }
    }

    /// Pins `[va, va + len)`. Errors: out of slots (`ENOSPC`), or the
    /// kernel refuses the range (e.g. `EFAULT` for a read-only mapping,
    /// `EOPNOTSUPP` for a file mapping that is not shmem/hugetlbfs); what
    /// was pinned of it is unpinned again.
    pub fn pin(&mut self, va: usize, len: usize) -> io::Result<()> {
        let mut done = Vec::new();
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MAX_SLOT_LEN);
            let Some(slot) = self.free.pop() else {
                self.release(&done);
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            };
            if let Err(e) = self.update(slot, va + off, n) {
                self.free.push(slot);
                self.release(&done);
                return Err(e);
            }
            self.slots[slot as usize] = Some((va + off, n));
            done.push(slot);
            off += n;
        }
        Ok(())
    }

    fn release(&mut self, slots: &[u32]) {
        for &s in slots {
            let _ = self.update(s, 0, 0);
            self.slots[s as usize] = None;
            self.free.push(s);
        }
    }

    /// Unpins what one [`Pins::pin`] of the same range pinned.
    pub fn unpin(&mut self, va: usize, len: usize) {
        let mut found = Vec::new();
        let mut off = 0;
        while off < len {
            let n = (len - off).min(MAX_SLOT_LEN);
            let want = Some((va + off, n));
            if let Some(s) = self.slots.iter().position(|x| *x == want) {
                found.push(s as u32);
            }
            off += n;
        }
        self.release(&found);
    }

    /// Number of slots in use.
    pub fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// Duplicates descriptor `fd` of process `pid` into this process
/// (`pidfd_open(2)` + `pidfd_getfd(2)`; needs `PTRACE_MODE_ATTACH` over
/// it, e.g. root). How the agent takes a program's [`Pins`].
pub fn take_fd(pid: i32, fd: RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: plain syscalls; results checked, and each descriptor owned once.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let pidfd = std::os::fd::OwnedFd::from_raw_fd(pidfd as RawFd);
        let dup = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(std::os::fd::OwnedFd::from_raw_fd(dup as RawFd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_and_unpins_ranges() {
        let Ok(mut p) = Pins::new() else {
            eprintln!("io_uring unavailable here; skipping");
            return;
        };
        let buf = vec![0u8; 3 * 4096];
        p.pin(buf.as_ptr() as usize, buf.len()).unwrap();
        assert_eq!(p.in_use(), 1);
        p.unpin(buf.as_ptr() as usize, buf.len());
        assert_eq!(p.in_use(), 0);
        // A range the process does not have is refused, nothing kept.
        assert!(p.pin(0x1000, 4096).is_err());
        assert_eq!(p.in_use(), 0);
        // Another process (here: ourselves) can take the ring's descriptor.
        let dup = take_fd(std::process::id() as i32, p.fd()).unwrap();
        assert_ne!(dup.as_raw_fd(), p.fd());
    }
}
