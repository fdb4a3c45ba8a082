//! A Unix stream socket served by a thread of its own, one connection at
//! a time: what the stats socket ([`crate::stats::StatsServer`]) and the
//! control socket ([`crate::control::ControlServer`]) share.
//!
//! A socket has its final mode from the moment its path exists
//! ([`listen`]): it is bound in a private directory (mode 0700) next to
//! its path, given its mode there, and renamed into place, which is
//! atomic. Not with the umask set around the bind: the umask is the
//! process's, and the daemon's other threads create files meanwhile
//! (another function's vhost-user socket, whose mode is the umask's, or
//! its pcap file), so they would get the narrowed umask, and two servers
//! starting at once could leave it narrowed for good.

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
    /// Listens on `path` with mode `mode` ([`listen`]) and calls `handle`
    /// for each connection, from a thread called `name`.
    pub(crate) fn start(
        path: &Path,
        name: &str,
        mode: u32,
        handle: impl Fn(UnixStream) -> io::Result<()> + Send + 'static,
    ) -> Result<Self, StartError> {
        let listener = listen(path, mode)?;
        let setup = (|| {
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

/// Longest socket path `bind(2)` takes, bytes (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Binds a listening socket at `path` whose mode is `mode` from the moment
/// the path exists, whatever the umask (see the module documentation). A
/// stale socket at `path` is replaced (atomically, by the rename); a socket
/// a server still answers on, or any other file, is an error.
pub(crate) fn listen(path: &Path, mode: u32) -> Result<UnixListener, StartError> {
    if let Ok(meta) = fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(StartError::NotASocket);
        }
        if UnixStream::connect(path).is_ok() {
            return Err(StartError::InUse);
        }
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let io = StartError::Io;
    // Next to `path`, so the rename stays on one file system. Created with
    // mode 0700 less the umask (never more), then set to 0700 exactly so
    // that an odd umask cannot keep the owner out: no one else can reach
    // what is inside, so nobody can connect before the rename.
    let private = tempfile::Builder::new()
        .prefix(".vrnic-")
        .permissions(fs::Permissions::from_mode(0o700))
        .tempdir_in(dir)
        .map_err(io)?;
    fs::set_permissions(private.path(), fs::Permissions::from_mode(0o700)).map_err(io)?;
    let inner = private.path().join("s");
    let listener = if inner.as_os_str().len() <= MAX_SOCKET_PATH {
        UnixListener::bind(&inner)
    } else {
        // `path` fits in sun_path but the private directory's longer name
        // does not: bind through the directory's descriptor instead.
        let d = fs::File::open(private.path()).map_err(io)?;
        UnixListener::bind(format!("/proc/self/fd/{}/s", d.as_raw_fd()))
    }
    .map_err(io)?;
    fs::set_permissions(&inner, fs::Permissions::from_mode(mode)).map_err(io)?;
    fs::rename(&inner, path).map_err(io)?;
    // Dropping `private` removes the directory, empty now.
    Ok(listener)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// `listen` at `path`: the socket answers there with `mode`, and no
    /// private directory is left next to it.
    fn check_listen(path: &Path, mode_wanted: u32) {
        let listener = listen(path, mode_wanted).unwrap();
        assert_eq!(mode(path), mode_wanted);
        let mut c = UnixStream::connect(path).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"hi").unwrap();
        drop(s);
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hi");
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [path.file_name().unwrap()], "only the socket");
    }

    #[test]
    fn listen_gives_the_mode_and_replaces_a_stale_socket_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        check_listen(&path, 0o600);
        // Stale now (its listener is gone): replaced.
        check_listen(&path, 0o640);
        let live = listen(&path, 0o600).unwrap();
        assert!(matches!(listen(&path, 0o600), Err(StartError::InUse)));
        drop(live);
        fs::remove_file(&path).unwrap();
        fs::write(&path, b"keep").unwrap();
        assert!(matches!(listen(&path, 0o600), Err(StartError::NotASocket)));
        assert_eq!(fs::read(&path).unwrap(), b"keep");
    }

    #[test]
    fn a_path_that_fits_sun_path_is_served_even_if_the_private_one_does_not() {
        let top = tempfile::tempdir().unwrap();
        let name = "s";
        // A directory such that `<dir>/s` is exactly as long as bind takes,
        // so `<dir>/.vrnic-XXXXXX/s` is longer.
        let base = top.path().as_os_str().len() + 1;
        let want = MAX_SOCKET_PATH - name.len() - 1;
        assert!(want > base + 2, "temporary directory too deep");
        let dir = top.path().join("d".repeat(want - base));
        fs::create_dir(&dir).unwrap();
        let path = dir.join(name);
        assert_eq!(path.as_os_str().len(), MAX_SOCKET_PATH);
        check_listen(&path, 0o600);
    }
}
