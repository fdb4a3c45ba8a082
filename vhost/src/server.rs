//! Serving the backend on a vhost-user socket (vhost-user spec,
//! "Communication": the backend listens, the frontend connects), one
//! frontend connection at a time.
//!
//! Each connection gets a fresh vhost-user-backend `VhostUserDaemon` (its
//! protocol state, vrings and worker thread live exactly as long as the
//! connection); the [`VrnicBackend`] — device, link, counters — carries
//! over, reset between connections.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};
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
    #[error("{0} exists and is not a socket")]
    NotASocket(String),
    /// Binding the listening socket failed.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: String,
        /// The cause.
        #[source]
        source: VhostUserError,
    },
    /// Creating the vhost-user daemon or accepting a connection failed.
    #[error("vhost-user daemon: {0}")]
    Daemon(String),
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
}

/// Binds the vhost-user socket at `path`. A stale socket there is
/// replaced; any other file is an error. The socket file is removed when
/// the returned listener is dropped.
///
/// # Errors
/// [`ServeError::NotASocket`] or [`ServeError::Listen`].
pub fn bind(path: &Path) -> Result<Listener, ServeError> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::NotASocket(path.display().to_string()));
        }
    }
    Listener::new(path, true).map_err(|source| ServeError::Listen {
        path: path.display().to_string(),
        source,
    })
}

/// Waits for one frontend on `listener`, serves it until it disconnects
/// (or `stop` fires), then resets the device and gives the backend back.
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
    let link_fd = backend.link_fd();
    let timer_fd = backend.timer_fd();
    let backend = Arc::new(backend);
    let mut daemon = VhostUserDaemon::new(
        "vrnic-vhost-user".to_string(),
        backend.clone(),
        GuestMemoryAtomic::new(GuestMemoryMmap::new()),
    )
    .map_err(|e| ServeError::Daemon(e.to_string()))?;

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

    daemon
        .start(listener)
        .map_err(|e| ServeError::Daemon(e.to_string()))?;
    info!("frontend connected");
    stop.attach(daemon.shutdown_handle());
    let result = daemon.wait();
    stop.detach();
    // Dropping the daemon stops and joins its worker thread, which releases
    // the worker's references to the backend.
    drop(daemon);

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
    backend.reset();
    match &end {
        ConnectionEnd::Failed(e) => warn!("frontend connection failed: {e}"),
        end => info!("frontend connection ended: {end:?}"),
    }
    Ok((backend, end))
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

/// Waits until `listener` has a connection to accept (`true`) or `stop`
/// fired (`false`).
fn wait_for_connection(listener: &Listener, stop: &Stopper) -> Result<bool, ServeError> {
    loop {
        if stop.is_stopped() {
            return Ok(false);
        }
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.inner.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(ServeError::Poll(e));
        }
        if stop.is_stopped() {
            return Ok(false);
        }
        if fds[0].revents != 0 {
            return Ok(true);
        }
    }
}
