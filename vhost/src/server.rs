//! Serving the backend on a vhost-user socket (vhost-user spec,
//! "Communication"), one frontend connection at a time: either the backend
//! listens and the frontend connects ([`run`]), or the frontend (QEMU with
//! `server=on`) listens and the backend connects, and connects again when
//! the connection ends ([`run_client`]; a restarted daemon finds its guest
//! again this way).
//!
//! A frontend that connects to a listening backend while another is served
//! is refused: its connection is closed after [`BUSY_GRACE`] (time for the
//! one served to be leaving, as a program that closes the device and opens
//! it again is), so a second program on the same function learns at once
//! that it is in use instead of waiting for answers that never come.
//!
//! Each connection gets a fresh vhost-user-backend `VhostUserDaemon` (its
//! protocol state, vrings and worker thread live exactly as long as the
//! connection); the [`VrnicBackend`] — device, link, counters — carries
//! over, reset between connections, without the memory table of the
//! frontend that left (its guest's RAM is unmapped and its fds closed).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{Error as DaemonError, ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::backend::{VrnicBackend, LINK_EVENT, TIMER_EVENT};

/// Errors that end serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket path exists and is not a socket (it is left alone).
    #[error("{path} exists and is not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Binding the listening socket failed.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: VhostUserError,
    },
    /// Creating the vhost-user daemon or accepting a connection failed.
    /// (Not a `#[source]`: `vhost_user_backend::Error` is no
    /// `std::error::Error`; its text is in this one's.)
    #[error("vhost-user daemon: {0}")]
    Daemon(DaemonError),
    /// Registering the link or the timer with the worker failed.
    #[error("cannot register the {what} with the worker: {source}")]
    Register {
        /// "link" or "timer".
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Waiting for a connection failed.
    #[error("cannot wait for a connection: {0}")]
    Poll(#[source] io::Error),
    /// The daemon kept a reference to the backend after the connection
    /// ended (a bug).
    #[error("the backend was not released after the connection ended")]
    BackendHeld,
}

/// How a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectionEnd {
    /// The frontend closed the connection.
    Disconnected,
    /// [`Stopper::stop`] was called (before or during the connection).
    Stopped,
    /// The frontend broke the protocol; the connection was dropped.
    Failed(String),
}

/// Stops a server from another thread: wakes a wait for a connection and
/// shuts an open connection down. Cheap to clone.
#[derive(Clone)]
pub struct Stopper {
    inner: Arc<StopInner>,
}

struct StopInner {
    stopped: AtomicBool,
    wake: EventFd,
    conn: Mutex<Option<ShutdownHandle>>,
}

impl Stopper {
    /// A stopper that has not fired.
    ///
    /// # Errors
    /// The eventfd could not be created.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            inner: Arc::new(StopInner {
                stopped: AtomicBool::new(false),
                wake: EventFd::new(EFD_NONBLOCK)?,
                conn: Mutex::new(None),
            }),
        })
    }

    /// Stops the server: the current connection (if any) is shut down and
    /// no further connection is accepted. Idempotent. Not for use in a
    /// signal handler (use a signal-handling thread).
    pub fn stop(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let _ = self.inner.wake.write(1);
        if let Some(h) = self.conn().as_ref() {
            h.shutdown();
        }
    }

    /// Whether [`Stopper::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// Whether a frontend is connected to the server this stopper
    /// controls (between accepting it and the end of its connection).
    pub fn connected(&self) -> bool {
        self.conn().is_some()
    }

    /// Blocks until [`Stopper::stop`] is called, waking at most every
    /// `tick` to check (the wake eventfd is shared with the servers, which
    /// may consume its count first).
    ///
    /// # Errors
    /// `poll(2)` failed.
    pub fn wait(&self, tick: Duration) -> io::Result<()> {
        while !self.is_stopped() {
            poll_in(&[self.inner.wake.as_raw_fd()], Some(tick.max(MIN_WAIT)))?;
        }
        Ok(())
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Option<ShutdownHandle>> {
        self.inner.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn attach(&self, h: Option<ShutdownHandle>) {
        *self.conn() = h;
        // A stop between accepting and attaching is not lost.
        if self.is_stopped() {
            if let Some(h) = self.conn().as_ref() {
                h.shutdown();
            }
        }
    }

    fn detach(&self) {
        *self.conn() = None;
    }

    /// Waits `d`, or less if the stopper fires: `Ok(false)` then.
    fn sleep(&self, d: Duration) -> Result<bool, ServeError> {
        let deadline = Instant::now() + d;
        loop {
            if self.is_stopped() {
                return Ok(false);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(true);
            }
            poll_in(&[self.inner.wake.as_raw_fd()], Some(left.max(MIN_WAIT)))
                .map_err(ServeError::Poll)?;
        }
    }
}

/// Binds the vhost-user socket at `path`. A stale socket there is
/// replaced; any other file is an error. The socket file is removed when
/// the returned listener is dropped.
///
/// Its mode is 0777 less the daemon's umask, as QEMU's and DPDK's own
/// vhost-user sockets: who may attach a guest or a program to the function
/// (QEMU running as another user, a container's user) is the operator's
/// choice, made with the umask (e.g. `umask 007` and a group) or the
/// directory's permissions. There is no chmod after the bind, so the socket
/// has that mode from the moment it exists.
///
/// # Errors
/// [`ServeError::NotASocket`] or [`ServeError::Listen`].
pub fn bind(path: &Path) -> Result<Listener, ServeError> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::NotASocket {
                path: path.to_path_buf(),
            });
        }
    }
    Listener::new(path, true).map_err(|source| ServeError::Listen {
        path: path.to_path_buf(),
        source,
    })
}

/// Waits for one frontend on `listener`, serves it until it disconnects
/// (or `stop` fires), then resets the device, drops the frontend's memory
/// table and gives the backend back.
///
/// # Errors
/// [`ServeError`] when the daemon cannot be set up or accept fails; the
/// backend is lost then. A frontend that breaks the protocol is not an
/// error: see [`ConnectionEnd::Failed`].
pub fn serve_connection(
    listener: &mut Listener,
    backend: VrnicBackend,
    stop: &Stopper,
) -> Result<(VrnicBackend, ConnectionEnd), ServeError> {
    if !wait_for_connection(listener, stop)? {
        return Ok((backend, ConnectionEnd::Stopped));
    }
    match serve_with(backend, stop, Connect::Listen(listener))? {
        Served::Ended(b, end) => Ok((b, end)),
        Served::NotStarted(_, e) => Err(ServeError::Daemon(e)),
    }
}

/// Connects to the frontend listening at `path` (QEMU with
/// `-chardev socket,path=PATH,server=on`), retrying while the socket is
/// missing or refuses (waits of [`CONNECT_RETRY_MIN`] doubling up to
/// [`CONNECT_RETRY_MAX`]) until `stop` fires; serves the frontend until it
/// disconnects, then resets the device, drops the frontend's memory table
/// and gives the backend back. vhost-user spec, "Communication": either
/// side may be the socket's server.
///
/// # Errors
/// [`ServeError`] when the daemon cannot be set up; the backend is lost
/// then.
pub fn serve_client_connection(
    path: &Path,
    mut backend: VrnicBackend,
    stop: &Stopper,
) -> Result<(VrnicBackend, ConnectionEnd), ServeError> {
    let target = path.to_string_lossy().into_owned();
    let mut wait = CONNECT_RETRY_MIN;
    let mut said = false;
    loop {
        if stop.is_stopped() {
            return Ok((backend, ConnectionEnd::Stopped));
        }
        match serve_with(backend, stop, Connect::Client(&target))? {
            Served::Ended(b, end) => return Ok((b, end)),
            Served::NotStarted(b, e) => {
                backend = b;
                if !said {
                    info!("cannot connect to {target} ({e}); retrying");
                    said = true;
                }
                debug!("connecting to {target}: {e}; next try in {wait:?}");
                if !stop.sleep(wait)? {
                    return Ok((backend, ConnectionEnd::Stopped));
                }
                wait = (wait * 2).min(CONNECT_RETRY_MAX);
            }
        }
    }
}

/// First wait between two connection attempts of
/// [`serve_client_connection`].
pub const CONNECT_RETRY_MIN: Duration = Duration::from_millis(50);
/// Longest wait between two connection attempts of
/// [`serve_client_connection`]: a frontend that comes back is served at
/// most this late.
pub const CONNECT_RETRY_MAX: Duration = Duration::from_millis(500);

/// How long a frontend that connects to a listening backend while another
/// is served waits before its connection is closed: if the one served
/// leaves meanwhile (a program that closes the device and opens it again),
/// the new one is served instead.
pub const BUSY_GRACE: Duration = Duration::from_secs(1);

/// How [`serve_with`] gets its frontend.
enum Connect<'a> {
    /// Accepts it on the backend's listening socket.
    Listen(&'a mut Listener),
    /// Connects to the frontend listening at this path.
    Client(&'a str),
}

enum Served {
    /// A connection was served and ended.
    Ended(VrnicBackend, ConnectionEnd),
    /// No connection was made (`start` failed); the backend is untouched.
    NotStarted(VrnicBackend, DaemonError),
}

/// Makes a vhost-user daemon for `backend` with the link and timer
/// registered, connects it as `how` says, serves until the connection ends
/// (refusing other frontends on a listening socket meanwhile,
/// [`refusing`]), then resets the device and drops the memory table.
fn serve_with(
    backend: VrnicBackend,
    stop: &Stopper,
    mut how: Connect<'_>,
) -> Result<Served, ServeError> {
    let link_fd = backend.link_fd();
    let timer_fd = backend.timer_fd();
    let backend = Arc::new(backend);
    let mut daemon = VhostUserDaemon::new(
        "vrnic-vhost-user".to_string(),
        backend.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(ServeError::Daemon)?;

    let handlers = daemon.get_epoll_handlers();
    let worker = handlers.first().ok_or(ServeError::Register {
        what: "link",
        source: io::Error::other("the daemon has no worker"),
    })?;
    if let Some(fd) = link_fd {
        worker
            .register_listener(fd, EventSet::IN, u64::from(LINK_EVENT))
            .map_err(|source| ServeError::Register {
                what: "link",
                source,
            })?;
    }
    worker
        .register_listener(timer_fd, EventSet::IN, u64::from(TIMER_EVENT))
        .map_err(|source| ServeError::Register {
            what: "timer",
            source,
        })?;
    drop(handlers);

    let started = match &mut how {
        Connect::Listen(l) => daemon.start(l),
        Connect::Client(path) => daemon.start_client(path),
    };
    if let Err(e) = started {
        drop(daemon);
        backend.close_exit_events();
        let backend = Arc::try_unwrap(backend).map_err(|_| ServeError::BackendHeld)?;
        return Ok(Served::NotStarted(backend, e));
    }
    info!("frontend connected");
    stop.attach(daemon.shutdown_handle());
    backend.set_connection(daemon.shutdown_handle());
    let result = match how {
        Connect::Listen(l) => refusing(l, || backend.refused(), || daemon.wait()),
        Connect::Client(_) => daemon.wait(),
    };
    stop.detach();
    // Dropping the daemon stops and joins its worker thread, which releases
    // the worker's references to the backend (and its vrings, with their
    // eventfds, and its copy of the memory table).
    drop(daemon);
    backend.close_exit_events();

    let end = if stop.is_stopped() {
        ConnectionEnd::Stopped
    } else {
        match result {
            Ok(())
            | Err(DaemonError::HandleRequest(
                VhostUserError::Disconnected
                | VhostUserError::PartialMessage
                | VhostUserError::SocketBroken(_),
            )) => ConnectionEnd::Disconnected,
            Err(e) => ConnectionEnd::Failed(e.to_string()),
        }
    };
    let backend = Arc::try_unwrap(backend).map_err(|_| ServeError::BackendHeld)?;
    backend.disconnected();
    match &end {
        ConnectionEnd::Failed(e) => warn!("frontend connection failed: {e}"),
        end => info!("frontend connection ended: {end:?}"),
    }
    Ok(Served::Ended(backend, end))
}

/// Serves frontends one after another until `stop` fires, or, with
/// `once`, until the first connection ends. Gives the backend back.
///
/// # Errors
/// As [`serve_connection`].
pub fn run(
    listener: &mut Listener,
    mut backend: VrnicBackend,
    stop: &Stopper,
    once: bool,
) -> Result<VrnicBackend, ServeError> {
    loop {
        let (b, end) = serve_connection(listener, backend, stop)?;
        backend = b;
        if once || end == ConnectionEnd::Stopped {
            return Ok(backend);
        }
    }
}

/// [`run`] as the socket's client: connects to the frontend at `path`
/// ([`serve_client_connection`]), and after each connection ends connects
/// again, until `stop` fires or, with `once`, the first connection ends.
///
/// # Errors
/// As [`serve_client_connection`].
pub fn run_client(
    path: &Path,
    mut backend: VrnicBackend,
    stop: &Stopper,
    once: bool,
) -> Result<VrnicBackend, ServeError> {
    loop {
        let (b, end) = serve_client_connection(path, backend, stop)?;
        backend = b;
        if once || end == ConnectionEnd::Stopped {
            return Ok(backend);
        }
    }
}

/// Runs `serve` (a connection being served) while refusing the frontends
/// that connect to `listener` meanwhile: one still waiting after
/// [`BUSY_GRACE`] is accepted and its connection closed at once (its
/// first request fails; guest-lib says the function may be serving
/// another program), and `counted` is called. One that comes within the
/// grace of the served connection's end is left for the next
/// [`serve_connection`].
fn refusing<R>(listener: &Listener, counted: impl Fn() + Sync, serve: impl FnOnce() -> R) -> R {
    let Ok(done) = EventFd::new(EFD_NONBLOCK) else {
        return serve();
    };
    // Its lines carry the caller's span (the function's name).
    let span = tracing::Span::current();
    std::thread::scope(|s| {
        let refuser = std::thread::Builder::new()
            .name("vrnic-refuser".into())
            .spawn_scoped(s, || {
                let _in = span.enter();
                refuse_until(listener, &done, &counted)
            });
        let r = serve();
        let _ = done.write(1);
        if let Ok(t) = refuser {
            let _ = t.join();
        }
        r
    })
}

/// [`refusing`]'s thread: until `done` is readable.
fn refuse_until(listener: &Listener, done: &EventFd, counted: &(impl Fn() + Sync)) {
    loop {
        match poll_in(&[listener.as_raw_fd(), done.as_raw_fd()], None) {
            Ok(r) if r[1] => return,
            Ok(r) if r[0] => {}
            Ok(_) => continue,
            Err(e) => {
                debug!("refusing frontends: {e}");
                return;
            }
        }
        // The one served may be leaving: give it the grace.
        match poll_in(&[done.as_raw_fd()], Some(BUSY_GRACE)) {
            Ok(r) if r[0] => return,
            Ok(_) => {}
            Err(e) => {
                debug!("refusing frontends: {e}");
                return;
            }
        }
        // Not blocking: the frontend may have given up meanwhile, and a
        // blocking accept would then wait for the next one, past `done`.
        let accepted = listener
            .set_nonblocking(true)
            .and_then(|()| listener.accept());
        let _ = listener.set_nonblocking(false);
        match accepted {
            Ok(Some(conn)) => {
                drop(conn);
                warn!("refused a frontend: this function serves another one (one at a time)");
                counted();
            }
            Ok(None) => {}
            Err(e) => {
                debug!("refusing frontends: {e}");
                return;
            }
        }
    }
}

/// Shortest wait of [`Stopper::wait`] and [`Stopper::sleep`] (`poll(2)`
/// counts milliseconds: a shorter one would not wait at all).
const MIN_WAIT: Duration = Duration::from_millis(1);

/// Waits until one of `fds` is readable or `timeout` passes (`None`:
/// forever; at most 60 s a call); which are readable. Retries after a
/// signal.
fn poll_in<const N: usize>(fds: &[RawFd; N], timeout: Option<Duration>) -> io::Result<[bool; N]> {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = timeout.map_or(-1, |t| t.as_millis().clamp(0, 60_000) as libc::c_int);
    loop {
        // SAFETY: `p` is a valid array of N pollfds.
        let n = unsafe { libc::poll(p.as_mut_ptr(), N as libc::nfds_t, ms) };
        if n >= 0 {
            return Ok(p.map(|f| f.revents != 0));
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Waits until `listener` has a connection to accept (`true`) or `stop`
/// fired (`false`).
fn wait_for_connection(listener: &Listener, stop: &Stopper) -> Result<bool, ServeError> {
    loop {
        if stop.is_stopped() {
            return Ok(false);
        }
        let ready = poll_in(&[listener.as_raw_fd(), stop.inner.wake.as_raw_fd()], None)
            .map_err(ServeError::Poll)?;
        if stop.is_stopped() {
            return Ok(false);
        }
        if ready[0] {
            return Ok(true);
        }
    }
}
