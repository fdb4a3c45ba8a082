//! Event channels: `rdma_create_event_channel(3)`, `rdma_destroy_event_channel(3)`.
//!
//! rdma-core's channel is an open `/dev/infiniband/rdma_cm` (the kernel's
//! `rdma_ucm`): its `fd` is what applications `poll(2)` and what
//! `rdma_get_cm_event(3)` reads events from. vrnic has no kernel CM; the
//! connection manager will live in the agent, which owns the function's
//! GSI QP1 (docs/ARCHITECTURE.md, "librdmacm.so.1"). Until then a
//! channel's `fd` is one end of a `socketpair(2)` whose other end the
//! library keeps: pollable, never readable while no event is queued, and
//! the place where a later agent connection (a socket too) takes over —
//! the events it delivers will make that `fd` readable, so applications
//! that poll it need not change.

use std::ffi::c_int;

use crate::boundary::{errno, fail, ffi};
use crate::ffi::rdma_event_channel;

/// A channel as allocated by this library: the C structure applications
/// see first, then what the library keeps.
#[repr(C)]
pub(crate) struct Channel {
    /// `struct rdma_event_channel` (`fd`: the application's end).
    pub(crate) c: rdma_event_channel,
    /// The library's end of the socket pair (the future event source).
    pub(crate) peer: c_int,
}

/// Creates a channel (as [`rdma_create_event_channel`]), returning the
/// `Box` as a raw pointer, or `None` with `errno` set.
pub(crate) fn create() -> Option<*mut Channel> {
    let mut fds = [-1 as c_int; 2];
    // SAFETY: `fds` has room for the two descriptors socketpair writes.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return None;
    }
    Some(Box::into_raw(Box::new(Channel {
        c: rdma_event_channel { fd: fds[0] },
        peer: fds[1],
    })))
}

/// Closes both ends and frees a channel [`create`] made.
///
/// # Safety
/// `ch` came from [`create`] and is not used afterwards.
pub(crate) unsafe fn destroy(ch: *mut Channel) {
    // SAFETY: the caller's contract: `ch` is a live Box of ours.
    let ch = unsafe { Box::from_raw(ch) };
    // SAFETY: closing the two descriptors this channel owns.
    unsafe {
        libc::close(ch.c.fd);
        libc::close(ch.peer);
    }
}

/// `rdma_create_event_channel(3)`: opens a channel that reports
/// asynchronous events; NULL with `errno` on failure (rdma-core:
/// `librdmacm/cma.c`). Its `fd` can be polled and made non-blocking.
pub(crate) extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ffi("rdma_create_event_channel", || match create() {
        Some(ch) => ch.cast(),
        None => fail(errno()),
    })
}

/// `rdma_destroy_event_channel(3)`: closes a channel. librdmacm does not
/// check its argument; here NULL sets `errno = EINVAL` and returns.
/// The channel must have been made by [`rdma_create_event_channel`] (all
/// ids on it destroyed first, as the man page requires).
pub(crate) extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    ffi("rdma_destroy_event_channel", || {
        if channel.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: a channel pointer applications hold came from
        // rdma_create_event_channel (a `Channel`, the C struct first).
        unsafe { destroy(channel.cast()) }
    })
}
