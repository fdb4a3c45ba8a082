//! Event channels: `rdma_create_event_channel(3)`,
//! `rdma_destroy_event_channel(3)`, and how commands reach the agent.
//!
//! rdma-core's channel is an open `/dev/infiniband/rdma_cm` (the kernel's
//! `rdma_ucm`): commands are `write(2)`s on it, its `fd` is what
//! applications `poll(2)`. Here a channel is one connection to the agent's
//! connection manager ([`UcmaConn`], `vrnic_guest::agent::ucma::proto`):
//! commands travel on it in the same ABI, one at a time (a mutex per
//! channel), and the channel's `fd` is the agent's wake descriptor, an
//! `eventfd(2)` readable exactly while an event waits at the agent, so
//! applications poll it as they poll rdma-core's.

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use vrnic_guest::agent::ucma::proto::UcmaConn;

use crate::boundary::{errno, fail, ffi, say};
use crate::ffi::rdma_event_channel;
use crate::verbs::{bytes, bytes_mut};

/// A channel as allocated by this library: the C structure applications
/// see first, then the agent connection.
#[repr(C)]
pub(crate) struct Channel {
    /// `struct rdma_event_channel` (`fd`: the agent's wake descriptor).
    pub(crate) c: rdma_event_channel,
    /// The connection; `lock` serialises commands on it.
    conn: UcmaConn,
    lock: Mutex<()>,
    /// Threads inside [`Channel::wait`] (see [`destroy`]).
    waiters: AtomicUsize,
}

/// Counts a thread in `rdma_get_cm_event` ([`Channel::waiting`]) or
/// [`Channel::wait`] while it lives.
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Channel {
    /// This channel's number at the agent (`MIGRATE_ID`'s `fd`).
    pub(crate) fn number(&self) -> u32 {
        self.conn.channel
    }

    /// Executes rdma_ucm command `cmd` with structure `body` (and `extra`
    /// bytes after it), filling `resp`; as rdma-core's `write(2)` on the
    /// device: `Err(errno)` when the agent answers a negative errno,
    /// `ENODATA` for a short "write", the connection's error when the
    /// agent is gone.
    pub(crate) fn exec<C: Copy>(
        &self,
        cmd: u32,
        body: &C,
        extra: &[u8],
        resp: &mut [u8],
    ) -> Result<(), c_int> {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        match self.conn.call(cmd, bytes(body), extra, resp) {
            Ok(r) if r < 0 => Err(-r),
            Ok(r)
                if r as usize
                    == size_of::<vrnic_guest::agent::ucma::proto::CmdHdr>() + size_of::<C>() =>
            {
                Ok(())
            }
            Ok(_) => Err(libc::ENODATA),
            Err(e) => {
                say(&format!("the agent's connection manager: {e}"));
                Err(e.raw_os_error().unwrap_or(libc::EIO))
            }
        }
    }

    /// [`Channel::exec`] with a response structure `R`.
    pub(crate) fn exec_resp<C: Copy, R: Copy>(
        &self,
        cmd: u32,
        body: &C,
        resp: &mut R,
    ) -> Result<(), c_int> {
        self.exec(cmd, body, &[], bytes_mut(resp))
    }

    /// Counts the calling thread as one inside `rdma_get_cm_event` (asking
    /// the agent or waiting) until the guard goes: [`destroy`] then leaves
    /// the channel open under it.
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Waiting(&self.waiters)
    }

    /// Waits until an event may wait at the agent (the wake descriptor is
    /// readable) or the agent went away (its socket hung up): the caller
    /// then asks with `GET_EVENT`. Holds no lock, so other threads'
    /// commands go on meanwhile.
    pub(crate) fn wait(&self) -> Result<(), c_int> {
        let _w = self.waiting();
        let mut p = [
            libc::pollfd {
                fd: self.c.fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.conn.socket(),
                events: libc::POLLRDHUP,
                revents: 0,
            },
        ];
        loop {
            // SAFETY: two live pollfds.
            let r = unsafe { libc::poll(p.as_mut_ptr(), 2, -1) };
            if r > 0 {
                return Ok(());
            }
            if r < 0 && errno() != libc::EINTR {
                return Err(errno());
            }
        }
    }

    /// True when the application made the channel's `fd` non-blocking.
    pub(crate) fn nonblocking(&self) -> bool {
        // SAFETY: F_GETFL on the channel's own descriptor.
        let fl = unsafe { libc::fcntl(self.c.fd, libc::F_GETFL) };
        fl >= 0 && fl & libc::O_NONBLOCK != 0
    }
}

/// Connects to the agent (`vrnic_guest::agent::socket_from_env`, the
/// socket vrnic's libibverbs uses). When no agent answers, opens the first
/// device through libibverbs (vrnic's starts the agent then) and tries
/// once more; `ENODEV` if that fails too (`VRNIC_RDMACM_DEBUG` says why).
fn connect() -> Result<UcmaConn, c_int> {
    let path = vrnic_guest::agent::socket_from_env();
    let first = match UcmaConn::connect(&path) {
        Ok(c) => return Ok(c),
        Err(e) => e,
    };
    let opened = crate::device::open_first();
    match UcmaConn::connect(&path) {
        Ok(c) => Ok(c),
        Err(e) => {
            say(&format!(
                "no connection manager: the agent at {} does not answer ({first}; after \
                 opening the first device{}: {e})",
                path.display(),
                match opened {
                    Ok(()) => String::new(),
                    Err(o) => format!(", which failed with errno {o}"),
                }
            ));
            Err(libc::ENODEV)
        }
    }
}

/// Creates a channel (as [`rdma_create_event_channel`]), returning the
/// `Box` as a raw pointer, or the errno.
pub(crate) fn create() -> Result<*mut Channel, c_int> {
    let conn = connect()?;
    Ok(Box::into_raw(Box::new(Channel {
        c: rdma_event_channel {
            fd: conn.wake.as_raw_fd(),
        },
        conn,
        lock: Mutex::new(()),
        waiters: AtomicUsize::new(0),
    })))
}

/// Closes the connection and frees a channel [`create`] made.
///
/// # Safety
/// `ch` came from [`create`] and is not used afterwards.
///
/// A channel another thread is in `rdma_get_cm_event` on is left open
/// and allocated, its waiter blocked, as with the kernel: there the
/// waiter's `read(2)` holds the file, so `close(2)` of the channel's `fd`
/// neither ends that read nor releases the file. rping's client destroys
/// its channel while its CM thread waits in `rdma_get_cm_event` and exits
/// just after; freeing the channel then woke that thread with `EBADF` (and
/// memory no longer its own), and rping exited 255 before `main` returned 0.
/// The whole call counts, not only its wait: a thread between asking the
/// agent and waiting (e2e, a second time) met a closed socket just the same.
pub(crate) unsafe fn destroy(ch: *mut Channel) {
    // SAFETY: the caller's contract: `ch` is a live Box of ours; dropping
    // it closes the socket and the wake descriptor.
    let ch = unsafe { Box::from_raw(ch) };
    if ch.waiters.load(Ordering::SeqCst) > 0 {
        say("rdma_destroy_event_channel: a thread waits in rdma_get_cm_event on it: left open");
        std::mem::forget(ch);
        return;
    }
    drop(ch);
}

/// The channel behind an application's channel pointer.
///
/// # Safety
/// `ch` came from [`rdma_create_event_channel`] (or an id's own channel)
/// and is live.
pub(crate) unsafe fn of<'a>(ch: *mut rdma_event_channel) -> &'a Channel {
    // SAFETY: the caller's contract; the C struct is the head of a Channel.
    unsafe { &*ch.cast::<Channel>() }
}

/// `rdma_create_event_channel(3)`: opens a channel that reports
/// asynchronous events, one connection to the agent's connection manager;
/// NULL with `errno` on failure (`ENODEV`: no agent). Its `fd` can be
/// polled and made non-blocking (`rdma_get_cm_event(3)` then returns
/// `EAGAIN` instead of waiting).
pub(crate) extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ffi("rdma_create_event_channel", || match create() {
        Ok(ch) => ch.cast(),
        Err(e) => fail(e),
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
