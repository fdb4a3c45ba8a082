//! A one-shot, non-blocking timerfd (`timerfd_create(2)`) on
//! `CLOCK_MONOTONIC`, for the device's next deadline.
//!
//! vmm-sys-util's `TimerFd` reads blocking; a worker that re-arms the timer
//! while an expiry is already reported by epoll must not block on the read,
//! so this one is created with `TFD_NONBLOCK`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A one-shot monotonic timer that polls readable once it expires.
#[derive(Debug)]
pub struct Timer {
    fd: OwnedFd,
}

impl Timer {
    /// A disarmed timer.
    ///
    /// # Errors
    /// The `timerfd_create(2)` error.
    pub fn new() -> io::Result<Self> {
        // SAFETY: no pointers; the return value is checked.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Arms the timer to expire once, `after` from now (rounded up to 1 ns:
    /// a zero duration would disarm it). Replaces any earlier setting.
    ///
    /// # Errors
    /// The `timerfd_settime(2)` error.
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        let after = after.max(Duration::from_nanos(1));
        self.set(libc::timespec {
            tv_sec: after.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: after.subsec_nanos() as libc::c_long,
        })
    }

    /// Disarms the timer.
    ///
    /// # Errors
    /// The `timerfd_settime(2)` error.
    pub fn disarm(&self) -> io::Result<()> {
        self.set(libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        })
    }

    /// Consumes a pending expiry, if any, so the descriptor stops polling
    /// readable. Returns whether the timer had expired.
    pub fn clear(&self) -> bool {
        let mut count = 0u64;
        // SAFETY: reads at most 8 bytes into `count`.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut count as *mut u64).cast(),
                size_of::<u64>(),
            )
        };
        n == size_of::<u64>() as isize
    }

    fn set(&self, value: libc::timespec) -> io::Result<()> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: `spec` is a valid itimerspec; the old value is not requested.
        let r =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl AsRawFd for Timer {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(t: &Timer, timeout_ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd: t.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout_ms) == 1 }
    }

    #[test]
    fn expires_once_and_clears_without_blocking() {
        let t = Timer::new().unwrap();
        assert!(!t.clear(), "a fresh timer has not expired");
        t.arm(Duration::from_micros(10)).unwrap();
        assert!(readable(&t, 5_000), "timer did not expire within 5 s");
        assert!(t.clear());
        assert!(!t.clear(), "one-shot: no second expiry");
    }

    #[test]
    fn disarm_cancels() {
        let t = Timer::new().unwrap();
        t.arm(Duration::from_secs(3600)).unwrap();
        t.disarm().unwrap();
        assert!(!readable(&t, 0));
        t.arm(Duration::ZERO).unwrap();
        assert!(readable(&t, 5_000), "zero duration still fires");
    }
}
