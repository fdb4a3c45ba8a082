//! The daemon's counters for its user (`vrnic stats`): the engine's
//! [`DeviceStats`] and the backend's [`BackendStats`], served on a
//! management socket next to the vhost-user one.
//!
//! - [`StatsBoard`]: the latest [`Snapshot`], which the worker publishes
//!   after every wake-up. Publishing and reading are lock-free (a sequence
//!   lock over atomics), so a reader never holds up the data path. Per-QP
//!   counters ([`QpStats`]) are published next to it under a mutex the
//!   worker only ever `try_lock`s (a busy reader makes it skip one publish,
//!   never wait), and at most every
//!   [`QP_STATS_INTERVAL_NS`](crate::datapath::QP_STATS_INTERVAL_NS): the
//!   per-QP lines may lag the device lines by that much.
//! - [`StatsServer`]: a thread answering every connection on a Unix socket
//!   with the snapshot as `name value` lines, then the per-QP counters as
//!   `qp_<qpn>_<counter> value` lines ([`render_qps`]), then closing it;
//!   several clients at once, each within [`CLIENT_TIMEOUT`].
//! - [`query`] and [`parse`]: the client side.

use std::fmt::Write as _;
use std::io::{self, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vrnic::device::{DeviceStats, QpStats};

use crate::backend_stats::BackendStats;
use crate::sockserv::{write_all_by, SocketServer, StartError};

/// Where a daemon serving the vhost-user socket `socket` serves its
/// counters unless told otherwise: `<socket>.stats`.
pub fn default_socket(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".stats");
    PathBuf::from(p)
}

/// The stats socket's mode: its owner's only, as the control socket's
/// ([`crate::control::MODE`]). The counters tell about a guest's traffic
/// (the `link_*` ones about the whole daemon's), and every client costs the
/// server time.
pub const MODE: u32 = 0o600;

/// Number of counters in a [`Snapshot`].
pub const COUNTERS: usize = DeviceStats::COUNT + BackendStats::COUNT;

/// Counter names, in output order: the engine's ([`DeviceStats::NAMES`]),
/// then the backend's ([`BackendStats::NAMES`]).
pub const NAMES: [&str; COUNTERS] = {
    let mut names = [""; COUNTERS];
    let mut i = 0;
    while i < DeviceStats::COUNT {
        names[i] = DeviceStats::NAMES[i];
        i += 1;
    }
    while i < COUNTERS {
        names[i] = BackendStats::NAMES[i - DeviceStats::COUNT];
        i += 1;
    }
    names
};

/// Largest reply [`query`] accepts, bytes: room for the device counters
/// and the per-QP lines of [`vrnic::device::MAX_QP`] QPs (at most 64 bytes
/// a line, [`QpStats::iter`] lines a QP) several times over.
pub const MAX_REPLY: u64 = 4 << 20;

/// Attempts [`StatsBoard::read`] makes at a consistent snapshot.
const READ_ATTEMPTS: usize = 10_000;

/// Longest a client may take to read its reply, in all (not per read): a
/// client that reads slowly or not at all is cut off then.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// All counters at one moment, named by [`NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    values: [u64; COUNTERS],
}

impl Default for Snapshot {
    /// All counters zero.
    fn default() -> Self {
        Self {
            values: [0; COUNTERS],
        }
    }
}

impl Snapshot {
    /// The counters of `device` and `backend`.
    pub fn new(device: &DeviceStats, backend: &BackendStats) -> Self {
        let mut values = [0; COUNTERS];
        let (d, b) = values.split_at_mut(DeviceStats::COUNT);
        d.copy_from_slice(&device.values());
        b.copy_from_slice(&backend.values());
        Self { values }
    }

    /// The counter called `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| self.values[i])
    }

    /// `(name, value)` for every counter, in [`NAMES`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        NAMES.iter().copied().zip(self.values.iter().copied())
    }

    /// The wire format: one `name value` line per counter.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(COUNTERS * 24);
        for (name, value) in self.iter() {
            let _ = writeln!(s, "{name} {value}");
        }
        s
    }
}

/// The latest published [`Snapshot`], readable from any thread without
/// blocking the publisher.
///
/// A sequence lock: the publisher makes the sequence odd, stores the
/// counters and makes it even again; a reader retries while the sequence
/// is odd or changed under it.
#[derive(Debug)]
pub struct StatsBoard {
    seq: AtomicU64,
    values: [AtomicU64; COUNTERS],
    qps: std::sync::Mutex<Vec<(u32, QpStats)>>,
}

impl Default for StatsBoard {
    fn default() -> Self {
        Self::new()
    }
}

impl StatsBoard {
    /// A board holding all-zero counters.
    pub fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            values: std::array::from_fn(|_| AtomicU64::new(0)),
            qps: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Publishes the per-QP counters with `fill`, which replaces the
    /// vector's contents (QP numbers ascending). Never blocks: skipped
    /// while a reader holds them. Returns whether it published.
    pub fn publish_qps(&self, fill: impl FnOnce(&mut Vec<(u32, QpStats)>)) -> bool {
        match self.qps.try_lock() {
            Ok(mut g) => {
                fill(&mut g);
                true
            }
            Err(_) => false,
        }
    }

    /// [`StatsBoard::publish_qps`] that waits for a reader to finish (a
    /// copy of the table) instead of skipping: for threads other than the
    /// worker, such as a reset from the vhost-user message thread.
    pub fn replace_qps(&self, fill: impl FnOnce(&mut Vec<(u32, QpStats)>)) {
        let mut g = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        fill(&mut g);
    }

    /// The latest published per-QP counters, by QP number. Holds the
    /// lock only to copy them.
    pub fn read_qps(&self) -> Vec<(u32, QpStats)> {
        self.qps.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Publishes `snap`. Never blocks.
    ///
    /// Publishers must not run concurrently with each other (the backend
    /// publishes under its data-path lock); readers may run at any time.
    pub fn publish(&self, snap: &Snapshot) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (a, v) in self.values.iter().zip(snap.values) {
            a.store(v, Ordering::Relaxed);
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The latest snapshot, if no publish overlapped the read. Never
    /// blocks.
    pub fn try_read(&self) -> Option<Snapshot> {
        let mut snap = Snapshot::default();
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 % 2 == 1 {
            return None;
        }
        for (v, a) in snap.values.iter_mut().zip(&self.values) {
            *v = a.load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
        let s2 = self.seq.load(Ordering::Relaxed);
        (s1 == s2).then_some(snap)
    }

    /// The latest snapshot. Never blocks the publisher: retries a bounded
    /// number of times while publishes overlap the read, then settles for
    /// counters that may come from adjacent publishes (each one a value
    /// the counter really had).
    pub fn read(&self) -> Snapshot {
        for attempt in 0..READ_ATTEMPTS {
            if let Some(s) = self.try_read() {
                return s;
            }
            if attempt % 16 == 15 {
                thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        let mut snap = Snapshot::default();
        for (v, a) in snap.values.iter_mut().zip(&self.values) {
            *v = a.load(Ordering::Relaxed);
        }
        snap
    }
}

/// Errors starting the stats server or querying one.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The path exists and is not a socket (it is left alone).
    #[error("{path} exists and is not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A server already answers on the path.
    #[error("{path} is in use by a running server")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Binding, or setting up the server thread, failed.
    #[error("cannot serve stats on {path}: {source}")]
    Serve {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Connecting to or reading from a server failed.
    #[error("cannot read stats from {path}: {source}")]
    Query {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A server's reply is not `name value` lines.
    #[error("malformed stats reply, line {line}: {text:?}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// The line (truncated to 80 characters).
        text: String,
    },
}

/// Further counters a [`StatsServer`] serves after the board's, read at
/// each request: `(name, value)` pairs, names as [`parse`] accepts them
/// (the daemon's functions add their switch port's, `switch_*`).
pub type ExtraCounters = Arc<dyn Fn() -> Vec<(&'static str, u64)> + Send + Sync>;

/// Serves a [`StatsBoard`] on a Unix socket (mode [`MODE`] from the start,
/// whatever the umask) from a thread of its own, each client on a thread
/// of its own (at most 8 at once) and for at most [`CLIENT_TIMEOUT`]: a
/// client that does not read its reply cannot hold up the others. Dropping
/// it stops the threads and removes the socket file.
pub struct StatsServer {
    server: SocketServer,
}

impl StatsServer {
    /// Binds `path` and starts answering every connection with
    /// `board`'s latest snapshot ([`Snapshot::render`]). A stale socket at
    /// `path` is replaced; a socket a server still answers on, or any other
    /// file, is an error.
    ///
    /// # Errors
    /// [`StatsError::NotASocket`], [`StatsError::InUse`] or
    /// [`StatsError::Serve`].
    pub fn start(path: &Path, board: Arc<StatsBoard>) -> Result<Self, StatsError> {
        Self::start_with(path, board, None)
    }

    /// [`StatsServer::start`], also serving `extra`'s counters after the
    /// board's snapshot and before the per-QP lines.
    ///
    /// # Errors
    /// As [`StatsServer::start`].
    pub fn start_with(
        path: &Path,
        board: Arc<StatsBoard>,
        extra: Option<ExtraCounters>,
    ) -> Result<Self, StatsError> {
        let path_buf = || path.to_path_buf();
        let handle = move |stream| answer(stream, &board, extra.as_ref());
        match SocketServer::start(path, "vrnic-stats", MODE, handle) {
            Ok(server) => Ok(Self { server }),
            Err(StartError::NotASocket) => Err(StatsError::NotASocket { path: path_buf() }),
            Err(StartError::InUse) => Err(StatsError::InUse { path: path_buf() }),
            Err(StartError::Io(source)) => Err(StatsError::Serve {
                path: path_buf(),
                source,
            }),
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        self.server.path()
    }
}

/// Answers one connection, within [`CLIENT_TIMEOUT`].
fn answer(
    mut stream: UnixStream,
    board: &StatsBoard,
    extra: Option<&ExtraCounters>,
) -> io::Result<()> {
    let mut reply = board.read().render();
    for (name, value) in extra.map(|f| f()).unwrap_or_default() {
        let _ = writeln!(reply, "{name} {value}");
    }
    reply.push_str(&render_qps(&board.read_qps()));
    write_all_by(
        &mut stream,
        reply.as_bytes(),
        Instant::now() + CLIENT_TIMEOUT,
    )?;
    stream.shutdown(std::net::Shutdown::Both)
}

/// The per-QP wire format: for each QP (QP numbers ascending), one
/// `qp_<qpn>_<counter> value` line per [`QpStats`] counter, in
/// [`QpStats::iter`] order, with the QP number in decimal, e.g.
/// `qp_17_retransmits 3` or `qp_17_nak_rem_access_received 1`. The lines
/// follow the device counters and parse with [`parse`] like them; to pick
/// one QP, match the prefix `qp_<qpn>_`.
pub fn render_qps(qps: &[(u32, QpStats)]) -> String {
    let mut s = String::new();
    for (qpn, st) in qps {
        for (name, value) in st.iter() {
            let _ = writeln!(s, "qp_{qpn}_{name} {value}");
        }
    }
    s
}

/// Connects to the stats server at `path` and returns its reply; every
/// step is bounded by `timeout`, and the reply by [`MAX_REPLY`] bytes.
///
/// # Errors
/// [`StatsError::Query`], also for a reply longer than [`MAX_REPLY`]
/// (rather than a truncated one).
pub fn query(path: &Path, timeout: Duration) -> Result<String, StatsError> {
    let err = |source| StatsError::Query {
        path: path.to_path_buf(),
        source,
    };
    let stream = UnixStream::connect(path).map_err(err)?;
    stream.set_read_timeout(Some(timeout)).map_err(err)?;
    let mut reply = String::new();
    stream
        .take(MAX_REPLY + 1)
        .read_to_string(&mut reply)
        .map_err(err)?;
    if reply.len() as u64 > MAX_REPLY {
        return Err(err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("reply longer than {MAX_REPLY} bytes"),
        )));
    }
    Ok(reply)
}

/// Parses a reply into `(name, value)` pairs, in order. Names are
/// lower-case letters, digits and `_`; values are decimal `u64`.
///
/// # Errors
/// [`StatsError::Malformed`] for any other line.
pub fn parse(reply: &str) -> Result<Vec<(String, u64)>, StatsError> {
    reply
        .lines()
        .enumerate()
        .map(|(i, line)| {
            let bad = || StatsError::Malformed {
                line: i + 1,
                text: line.chars().take(80).collect(),
            };
            let (name, value) = line.split_once(' ').ok_or_else(bad)?;
            let name_ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            let value = value.parse::<u64>().map_err(|_| bad())?;
            if !name_ok {
                return Err(bad());
            }
            Ok((name.to_string(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    fn temp_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("vrnic-stats-{tag}-{}", std::process::id()))
    }

    #[test]
    fn a_snapshot_names_every_counter_once() {
        let d = DeviceStats {
            tx_frames: 1,
            duplicates: 11,
            doorbells_foreign: 7,
            ..Default::default()
        };
        let b = BackendStats {
            commands: 12,
            engine_panics: 23,
            lost_requests: 24,
            poll_idle_ns: 25,
            late_chains: 26,
            frontends_refused: 27,
            memory_tables_refused: 28,
            ..Default::default()
        };
        let s = Snapshot::new(&d, &b);
        assert_eq!(s.get("tx_frames"), Some(1));
        assert_eq!(s.get("duplicates"), Some(11));
        assert_eq!(s.get("doorbells_foreign"), Some(7));
        assert_eq!(s.get("doorbells_ignored"), Some(0));
        assert_eq!(s.get("commands"), Some(12));
        assert_eq!(s.get("engine_panics"), Some(23));
        assert_eq!(s.get("nope"), None);
        let mut names = NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), COUNTERS, "names are distinct");
        let parsed = parse(&s.render()).unwrap();
        assert_eq!(parsed.len(), COUNTERS);
        assert_eq!(parsed[0], ("tx_frames".to_string(), 1));
        assert_eq!(parsed[COUNTERS - 5], ("poll_idle_ns".to_string(), 25));
        assert_eq!(parsed[COUNTERS - 4], ("late_chains".to_string(), 26));
        assert_eq!(parsed[COUNTERS - 3], ("frontends_refused".to_string(), 27));
        assert_eq!(parsed[COUNTERS - 2], ("memory_faults".to_string(), 0));
        assert_eq!(
            parsed[COUNTERS - 1],
            ("memory_tables_refused".to_string(), 28)
        );
        assert_eq!(s.get("lost_requests"), Some(24));
    }

    #[test]
    fn per_qp_lines_parse_and_fit_a_reply_for_every_qp() {
        let one = QpStats {
            retransmits: 3,
            nak_rem_access_received: 1,
            ..Default::default()
        };
        let text = render_qps(&[(17, one), (0x12, QpStats::default())]);
        let lines = parse(&text).unwrap();
        let per_qp = QpStats::default().iter().count();
        assert_eq!(lines.len(), 2 * per_qp);
        assert_eq!(lines[0], ("qp_17_tx_packets".to_string(), 0));
        assert!(lines.contains(&("qp_17_retransmits".into(), 3)));
        assert!(lines.contains(&("qp_17_nak_rem_access_received".into(), 1)));
        assert!(lines.contains(&("qp_18_retransmits".into(), 0)));
        // The largest table a device can have (24-bit QP numbers), every
        // counter at its widest.
        let widest_qp: usize = QpStats::default()
            .iter()
            .map(|(name, _)| format!("qp_{}_{name} {}\n", 0xff_ffff, u64::MAX).len())
            .sum();
        let device = Snapshot::default().render().len() + COUNTERS * 20;
        let all = device + vrnic::device::MAX_QP * widest_qp;
        assert!((all as u64) * 2 < MAX_REPLY, "{all} bytes");
    }

    #[test]
    fn a_reply_longer_than_max_reply_is_an_error_not_truncated() {
        let path = temp_path("long");
        let _ = fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let server = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let line = b"x 1\n";
            let mut buf = Vec::with_capacity(MAX_REPLY as usize + line.len());
            while (buf.len() as u64) <= MAX_REPLY {
                buf.extend_from_slice(line);
            }
            // The client stops reading past MAX_REPLY: ignore EPIPE.
            let _ = s.write_all(&buf);
        });
        let e = query(&path, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("longer than"), "{e}");
        server.join().unwrap();
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn parse_rejects_what_is_not_name_value_lines() {
        for bad in ["x", "x 1 2", "X 1", "x -1", " 1", "x 18446744073709551616"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse("").unwrap(), vec![]);
    }

    #[test]
    fn readers_never_see_a_torn_snapshot() {
        let board = Arc::new(StatsBoard::new());
        let b = board.clone();
        let writer = thread::spawn(move || {
            for i in 1..=20_000u64 {
                let d = DeviceStats {
                    tx_frames: i,
                    rx_frames: i,
                    duplicates: i,
                    ..Default::default()
                };
                let be = BackendStats {
                    commands: i,
                    engine_panics: i,
                    ..Default::default()
                };
                b.publish(&Snapshot::new(&d, &be));
            }
        });
        // Whatever a read that succeeds returns comes from one publish.
        let check = |s: &Snapshot| {
            let tx = s.get("tx_frames").unwrap();
            for n in ["rx_frames", "duplicates", "commands", "engine_panics"] {
                assert_eq!(s.get(n), Some(tx), "{n} from the same publish");
            }
            tx
        };
        let mut last = 0;
        loop {
            let finished = writer.is_finished();
            if let Some(s) = board.try_read() {
                let tx = check(&s);
                assert!(tx >= last, "snapshots never go back");
                last = tx;
            }
            if finished {
                let s = board.try_read().expect("no publish under way");
                assert_eq!(check(&s), 20_000, "the last publish is seen");
                assert_eq!(board.read(), s);
                break;
            }
        }
        writer.join().unwrap();
    }

    #[test]
    fn the_server_answers_each_connection_and_cleans_up() {
        let path = temp_path("serve");
        let _ = fs::remove_file(&path);
        let board = Arc::new(StatsBoard::new());
        let server = StatsServer::start(&path, board.clone()).unwrap();
        assert_eq!(server.path(), path);
        let d = DeviceStats {
            naks_sent: 3,
            ..Default::default()
        };
        for round in 0..3u64 {
            board.publish(&Snapshot::new(
                &d,
                &BackendStats {
                    doorbells: round,
                    ..Default::default()
                },
            ));
            let reply = query(&path, Duration::from_secs(5)).unwrap();
            let got = parse(&reply).unwrap();
            assert!(got.contains(&("naks_sent".into(), 3)), "{reply}");
            assert!(got.contains(&("doorbells".into(), round)), "{reply}");
        }
        assert!(
            matches!(
                StatsServer::start(&path, board.clone()),
                Err(StatsError::InUse { .. })
            ),
            "a live server's socket is not taken over"
        );
        drop(server);
        assert!(!path.exists(), "the socket file is removed");
        assert!(matches!(
            query(&path, Duration::from_secs(1)),
            Err(StatsError::Query { .. })
        ));
    }

    #[test]
    fn a_client_that_never_reads_does_not_hold_up_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stats");
        let board = Arc::new(StatsBoard::new());
        // Every QP of a device, every counter at its widest: a reply
        // several times what a Unix socket buffers, so the server's write
        // to a client that does not read blocks.
        let wide = QpStats {
            tx_packets: u64::MAX,
            retransmits: u64::MAX,
            ..Default::default()
        };
        board.replace_qps(|v| {
            v.clear();
            v.extend((0..vrnic::device::MAX_QP as u32).map(|q| (0xff_0000 + q, wide)));
        });
        let server = StatsServer::start(&path, board).unwrap();
        let wait = Duration::from_secs(10);
        let mut stalled = UnixStream::connect(server.path()).unwrap();
        // Answered while the first client has read nothing.
        let reply = query(&path, wait).unwrap();
        assert!(reply.len() > 512 << 10, "{} bytes only", reply.len());
        // The server had not given up on the first client: its reply is
        // whole when it reads it now.
        stalled.set_read_timeout(Some(wait)).unwrap();
        let mut first = String::new();
        stalled.read_to_string(&mut first).unwrap();
        assert!(
            first == reply,
            "the first client got {} of {} bytes",
            first.len(),
            reply.len()
        );
    }

    #[test]
    fn a_stale_socket_is_replaced_and_other_files_left_alone() {
        let path = temp_path("stale");
        let _ = fs::remove_file(&path);
        // A socket nobody listens on any more.
        drop(UnixListener::bind(&path).unwrap());
        let board = Arc::new(StatsBoard::new());
        let server = StatsServer::start(&path, board.clone()).unwrap();
        assert!(query(&path, Duration::from_secs(5)).is_ok());
        drop(server);

        fs::write(&path, b"keep me").unwrap();
        assert!(matches!(
            StatsServer::start(&path, board),
            Err(StatsError::NotASocket { .. })
        ));
        assert_eq!(fs::read(&path).unwrap(), b"keep me");
        fs::remove_file(&path).unwrap();
    }
}
