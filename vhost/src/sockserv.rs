//! A Unix stream socket served by a thread of its own, one connection at
//! a time: what the stats socket ([`crate::stats::StatsServer`]) and the
//! control socket ([`crate::control::ControlServer`]) share.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread;

use tracing::debug;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Why a socket could not be served.
#[derive(Debug)]
pub(crate) enum StartError {
    /// The path exists and is not a socket (it is left alone).
    NotASocket,
    /// A server already answers on the path.
    InUse,
    /// Binding, or setting up the thread, failed.
    Io(io::Error),
}

/// A socket served by a thread; dropping it stops the thread (after the
/// connection being answered, which the handler must bound) and removes
/// the socket file.
pub(crate) struct SocketServer {
    path: PathBuf,
    stop: EventFd,
    thread: Option<thread::JoinHandle<()>>,
}

impl SocketServer {
    /// Binds `path` (mode `mode`, when given) and calls `handle` for each
    /// connection, from a thread called `name`. A stale socket at `path`
    /// is replaced; a socket a server still answers on, or any other file,
    /// is an error.
    pub(crate) fn start(
        path: &Path,
        name: &str,
        mode: Option<u32>,
        handle: impl Fn(UnixStream) -> io::Result<()> + Send + 'static,
    ) -> Result<Self, StartError> {
        if let Ok(meta) = fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(StartError::NotASocket);
            }
            if UnixStream::connect(path).is_ok() {
                return Err(StartError::InUse);
            }
            fs::remove_file(path).map_err(StartError::Io)?;
        }
        let listener = UnixListener::bind(path).map_err(StartError::Io)?;
        let setup = (|| {
            if let Some(m) = mode {
                fs::set_permissions(path, fs::Permissions::from_mode(m))?;
            }
            let stop = EventFd::new(EFD_NONBLOCK)?;
            listener.set_nonblocking(true)?;
            let stop_rx = stop.try_clone()?;
            let thread = thread::Builder::new()
                .name(name.into())
                .spawn(move || serve_loop(&listener, &stop_rx, &handle))?;
            Ok((stop, thread))
        })();
        match setup {
            Ok((stop, thread)) => Ok(Self {
                path: path.to_path_buf(),
                stop,
                thread: Some(thread),
            }),
            Err(e) => {
                let _ = fs::remove_file(path);
                Err(StartError::Io(e))
            }
        }
    }

    /// The socket path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketServer {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(t) = self.thread.take() {
            // The thread waits on the stop event and each handler is
            // bounded, so this join is bounded.
            let _ = t.join();
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// Accepts connections until `stop` is signalled; hands each to `handle`.
fn serve_loop(
    listener: &UnixListener,
    stop: &EventFd,
    handle: &impl Fn(UnixStream) -> io::Result<()>,
) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
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
            debug!("socket server: poll failed: {e}");
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = handle(stream) {
                    debug!("socket client: {e}");
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => debug!("socket server: accept failed: {e}"),
        }
    }
}
