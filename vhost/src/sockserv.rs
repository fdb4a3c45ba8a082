//! A Unix stream socket served by a thread of its own: what the stats
//! socket ([`crate::stats::StatsServer`]) and the control socket
//! ([`crate::control::ControlServer`]) share.
//!
//! Each connection is answered on a thread of its own, at most
//! [`MAX_CLIENTS`] at once (further ones wait in the listen backlog until
//! one ends), and each handler bounds the whole of its client's time with
//! a deadline ([`read_by`], [`write_all_by`]), not each read or write: a
//! client that never reads, never sends, or trickles a byte at a time
//! holds one slot for a bounded time and never holds up the others.
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

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

/// Most connections a [`SocketServer`] answers at once.
pub(crate) const MAX_CLIENTS: usize = 8;

/// A socket served by a thread; dropping it stops the thread (after the
/// connections being answered, which the handler must bound) and removes
/// the socket file.
pub(crate) struct SocketServer {
    path: PathBuf,
    stop: EventFd,
    thread: Option<thread::JoinHandle<()>>,
}

impl SocketServer {
    /// Listens on `path` with mode `mode` ([`listen`]) and calls `handle`
    /// for each connection (a blocking stream), from threads called
    /// `name`, at most [`MAX_CLIENTS`] at once. `handle` must bound the
    /// time its client takes (a deadline: [`read_by`], [`write_all_by`]).
    pub(crate) fn start(
        path: &Path,
        name: &str,
        mode: u32,
        handle: impl Fn(UnixStream) -> io::Result<()> + Send + Sync + 'static,
    ) -> Result<Self, StartError> {
        let listener = listen(path, mode)?;
        let setup = (|| {
            let stop = EventFd::new(EFD_NONBLOCK)?;
            listener.set_nonblocking(true)?;
            let stop_rx = stop.try_clone()?;
            let clients = Clients {
                name: name.into(),
                active: Arc::new(AtomicUsize::new(0)),
                ended: Arc::new(EventFd::new(EFD_NONBLOCK)?),
                handle: Arc::new(handle),
            };
            let thread = thread::Builder::new()
                .name(name.into())
                .spawn(move || serve_loop(&listener, &stop_rx, &clients))?;
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
            // The thread waits on the stop event, then joins its clients,
            // each bounded by its handler: this join is bounded.
            let _ = t.join();
        }
        let _ = fs::remove_file(&self.path);
    }
}

/// What a server's client threads share with it.
struct Clients<H> {
    /// The threads' name.
    name: String,
    /// Client threads running (or about to).
    active: Arc<AtomicUsize>,
    /// Signalled by each client thread as it ends.
    ended: Arc<EventFd>,
    handle: Arc<H>,
}

/// Held by a client thread: counts it out and wakes the accepting thread
/// when dropped, also if the handler panics or the thread never started.
struct Slot {
    active: Arc<AtomicUsize>,
    ended: Arc<EventFd>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::AcqRel);
        let _ = self.ended.write(1);
    }
}

/// Accepts connections until `stop` is signalled, handing each to a
/// thread of its own while fewer than [`MAX_CLIENTS`] run; then joins
/// them.
fn serve_loop<H>(listener: &UnixListener, stop: &EventFd, clients: &Clients<H>)
where
    H: Fn(UnixStream) -> io::Result<()> + Send + Sync + 'static,
{
    let mut threads: Vec<thread::JoinHandle<()>> = Vec::new();
    loop {
        let (done, running): (Vec<_>, Vec<_>) = threads.into_iter().partition(|t| t.is_finished());
        threads = running;
        for t in done {
            let _ = t.join();
        }
        // A slot freed after this load wakes the poll through `ended`,
        // which its thread signals after counting itself out.
        let room = clients.active.load(Ordering::Acquire) < MAX_CLIENTS;
        let mut fds = [
            libc::pollfd {
                // poll(2) skips a negative fd: no accepting while full.
                fd: if room { listener.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: clients.ended.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of three pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            debug!("socket server: poll failed: {e}");
            break;
        }
        if fds[1].revents != 0 {
            break;
        }
        if fds[2].revents != 0 {
            let _ = clients.ended.read();
        }
        if fds[0].revents == 0 {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                clients.active.fetch_add(1, Ordering::AcqRel);
                let slot = Slot {
                    active: clients.active.clone(),
                    ended: clients.ended.clone(),
                };
                let handle = clients.handle.clone();
                let spawned = thread::Builder::new()
                    .name(clients.name.clone())
                    .spawn(move || {
                        let _slot = slot;
                        let r = stream.set_nonblocking(false).and_then(|()| handle(stream));
                        if let Err(e) = r {
                            debug!("socket client: {e}");
                        }
                    });
                match spawned {
                    Ok(t) => threads.push(t),
                    // The closure, its slot and the stream are dropped:
                    // the client sees the connection closed.
                    Err(e) => debug!("socket server: no thread for a client: {e}"),
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
    for t in threads {
        let _ = t.join();
    }
}

/// What is left of the time to `deadline`; an error once it has passed.
fn left(deadline: Instant) -> io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "client's time is up",
        ));
    }
    Ok(d)
}

/// Reads what `stream` has (at most `buf.len()` bytes) as [`Read::read`]
/// does, waiting no later than `deadline`.
///
/// # Errors
/// [`io::ErrorKind::TimedOut`] once the deadline has passed, or the read's.
///
/// [`Read::read`]: std::io::Read::read
pub(crate) fn read_by(
    stream: &mut UnixStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<usize> {
    use std::io::Read;
    loop {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(buf) {
            Err(e) if again(&e) => {}
            r => return r,
        }
    }
}

/// Writes all of `buf` to `stream` by `deadline`, however slowly the peer
/// reads: the deadline bounds the whole, not each write.
///
/// # Errors
/// [`io::ErrorKind::TimedOut`] once the deadline has passed, or the
/// Whether a read or write that failed with `e` is to be tried again
/// (until the deadline): a timeout of the socket's own, or a signal.
fn again(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// write's.
pub(crate) fn write_all_by(
    stream: &mut UnixStream,
    mut buf: &[u8],
    deadline: Instant,
) -> io::Result<()> {
    use std::io::Write;
    while !buf.is_empty() {
        stream.set_write_timeout(Some(left(deadline)?))?;
        match stream.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if again(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
    fn at_most_max_clients_are_served_at_once_and_the_rest_wait_their_turn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (n, m) = (now.clone(), most.clone());
        // Echoes one read, waiting at most 300 ms for it.
        let server = SocketServer::start(&path, "t", 0o600, move |mut s| {
            let k = n.fetch_add(1, Ordering::AcqRel) + 1;
            m.fetch_max(k, Ordering::AcqRel);
            let mut buf = [0u8; 64];
            let r = read_by(
                &mut s,
                &mut buf,
                Instant::now() + Duration::from_millis(300),
            )
            .and_then(|len| {
                write_all_by(&mut s, &buf[..len], Instant::now() + Duration::from_secs(1))
            });
            n.fetch_sub(1, Ordering::AcqRel);
            r
        })
        .unwrap();
        // More clients than slots, none sending.
        let stalled: Vec<UnixStream> = (0..MAX_CLIENTS + 2)
            .map(|_| UnixStream::connect(&path).unwrap())
            .collect();
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(b"hello").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = String::new();
        c.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello", "served once the stalled ones timed out");
        assert!(most.load(Ordering::Acquire) <= MAX_CLIENTS);
        drop(stalled);
        drop(server);
        assert!(!path.exists());
    }

    #[test]
    fn write_all_by_bounds_the_whole_write_to_a_slow_reader() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        // A reader taking 512 bytes every 10 ms: each of the writer's
        // writes makes progress, so only a bound on the whole ends it.
        let reader = thread::spawn(move || {
            let mut buf = [0u8; 512];
            let mut total = 0usize;
            while !d.load(Ordering::Acquire) {
                match b.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => total += n,
                }
                // The slow reader's pace (not a synchronisation).
                thread::sleep(Duration::from_millis(10));
            }
            total
        });
        let big = vec![b'x'; 64 << 20];
        let start = Instant::now();
        let e = write_all_by(&mut a, &big, start + Duration::from_millis(500)).unwrap_err();
        let took = start.elapsed();
        done.store(true, Ordering::Release);
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(took < Duration::from_secs(5), "{took:?}");
        let read = reader.join().unwrap();
        assert!(read > 0 && read < big.len(), "{read}");
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
