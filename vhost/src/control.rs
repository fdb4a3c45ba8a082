//! The daemon's control socket: adds, deletes and lists functions
//! ([`crate::functions`]) while the daemon runs (`vrnic function ...`).
//!
//! The protocol is line-based over a Unix stream socket: the client sends
//! one request line (at most [`MAX_REQUEST`] bytes with its `\n`), the
//! server answers and closes the connection. Requests:
//!
//! - `add <spec>`: adds a function; `<spec>` is a
//!   [`FunctionSpec`] in its text form
//!   (`socket=PATH,ip=A/N[,mac=M][,ipv6=A]...[,name=N][,stats=PATH][,pcap=PATH]`);
//! - `del <name-or-socket>`: deletes a function (by name, or by its
//!   vhost-user socket path), waiting up to
//!   [`STOP_TIMEOUT`](crate::functions::STOP_TIMEOUT) for it to stop;
//! - `list`: lists the functions.
//!
//! A reply's first line is `ok` or `error <message>`; `add` and `list`
//! follow an `ok` with a `#` comment line (the limits) and one line per
//! function ([`FunctionInfo`]'s `Display`). Requests are untrusted: a
//! request longer than [`MAX_REQUEST`], not UTF-8, or not one of the above
//! is answered with an error. A client has [`CLIENT_TIMEOUT`] in all to
//! send its request, and again to read the reply (a request not complete
//! by then is answered with an error, if the client still reads); clients
//! are served concurrently (at most 8 at once), so one that stalls holds up
//! no other, and a `del` waiting for its function to stop holds up no
//! `list`. The
//! socket is the owner's only ([`MODE`] 0600, from the moment it exists,
//! whatever the umask): a client makes the daemon create sockets and files
//! (`pcap=`) wherever the daemon may.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::functions::{FunctionError, FunctionInfo, FunctionSpec, Functions, MAX_FUNCTIONS};
use crate::sockserv::{read_by, write_all_by, SocketServer, StartError};

/// Longest request line, bytes, `\n` included.
pub const MAX_REQUEST: usize = 8192;
/// Longest reply [`request`] accepts, bytes.
pub const MAX_REPLY: u64 = 1 << 20;
/// Longest a client may take to send its request, in all (not per read),
/// and again to read the reply.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The control socket's mode: its owner's only. Whoever may connect makes
/// the daemon create sockets and (`pcap=`) files where it may, and deletes
/// functions.
pub const MODE: u32 = 0o600;

/// Where a daemon whose first function listens on `socket` serves its
/// control socket unless told otherwise: `<socket>.control`.
pub fn default_socket(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".control");
    PathBuf::from(p)
}

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `add <spec>`.
    Add(FunctionSpec),
    /// `del <name-or-socket>`.
    Del(String),
    /// `list`.
    List,
}

impl Request {
    /// The request line (without `\n`).
    pub fn line(&self) -> String {
        match self {
            Request::Add(s) => format!("add {s}"),
            Request::Del(k) => format!("del {k}"),
            Request::List => "list".to_string(),
        }
    }
}

/// Errors of the control socket, on either side.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// A request that is not one of the protocol's.
    #[error("bad request: {0}")]
    BadRequest(RequestError),
    /// The daemon refused the request; its message.
    #[error("{0}")]
    Refused(String),
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
    /// Serving, connecting, reading or writing failed.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A reply whose first line is not `ok` or `error <message>`.
    #[error("malformed reply: {line:?}")]
    Malformed {
        /// The first line (truncated to 80 characters).
        line: String,
    },
    /// A reply longer than [`MAX_REPLY`] bytes.
    #[error("malformed reply: reply longer than {max} bytes")]
    ReplyTooLong {
        /// [`MAX_REPLY`].
        max: u64,
    },
}

/// Why a request line is not one of the protocol's
/// ([`ControlError::BadRequest`]).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Longer than [`MAX_REQUEST`] bytes.
    #[error("longer than {max} bytes")]
    TooLong {
        /// [`MAX_REQUEST`].
        max: usize,
    },
    /// Control characters (other than the final `\n`).
    #[error("control characters")]
    ControlCharacters,
    /// `add` with a specification that does not parse.
    #[error("{0}")]
    Spec(FunctionError),
    /// `list` with an argument.
    #[error("list takes no argument")]
    ListArgument,
    /// `add` or `del` without its one argument.
    #[error("{verb} needs one argument")]
    NeedsArgument {
        /// `add` or `del`.
        verb: &'static str,
    },
    /// Not `add`, `del` or `list`.
    #[error("unknown request {verb:?} (add, del or list)")]
    Unknown {
        /// The request's first word (truncated to 32 characters).
        verb: String,
    },
}

fn bad(e: RequestError) -> ControlError {
    ControlError::BadRequest(e)
}

/// Parses one request line (a trailing `\n` is allowed).
///
/// # Errors
/// [`ControlError::BadRequest`] for anything but the requests of the
/// module documentation.
pub fn parse_request(line: &str) -> Result<Request, ControlError> {
    if line.len() > MAX_REQUEST {
        return Err(bad(RequestError::TooLong { max: MAX_REQUEST }));
    }
    let line = line.strip_suffix('\n').unwrap_or(line);
    if line.chars().any(|c| c.is_control()) {
        return Err(bad(RequestError::ControlCharacters));
    }
    let (verb, arg) = match line.split_once(' ') {
        Some((v, a)) => (v, Some(a)),
        None => (line, None),
    };
    match (verb, arg) {
        ("list", None) => Ok(Request::List),
        ("add", Some(spec)) => spec
            .parse()
            .map(Request::Add)
            .map_err(|e| bad(RequestError::Spec(e))),
        ("del", Some(key)) if !key.is_empty() && !key.contains(char::is_whitespace) => {
            Ok(Request::Del(key.to_string()))
        }
        ("list", Some(_)) => Err(bad(RequestError::ListArgument)),
        ("add", _) => Err(bad(RequestError::NeedsArgument { verb: "add" })),
        ("del", _) => Err(bad(RequestError::NeedsArgument { verb: "del" })),
        _ => Err(bad(RequestError::Unknown {
            verb: verb.chars().take(32).collect(),
        })),
    }
}

/// The `#` line before the function lines of `add` and `list` replies:
/// the function count, the limits and where fairness comes from.
pub fn limits_line(functions: usize) -> String {
    use vrnic::device as d;
    format!(
        "# {functions} of at most {MAX_FUNCTIONS} functions; each has its own worker thread \
         and the per-device limits (QPs {}, MRs {}, CQs {}, PDs {}, SRQs {}, AHs {})",
        d::MAX_QP,
        d::MAX_MR,
        d::MAX_CQ,
        d::MAX_PD,
        d::MAX_SRQ,
        d::MAX_AH
    )
}

/// Executes `req` on `functions`; the reply text (ending in `\n`).
pub fn execute(functions: &Functions, req: &Request) -> String {
    let listing = |infos: &[FunctionInfo]| {
        let mut s = format!("ok\n{}\n", limits_line(functions.len()));
        for i in infos {
            s.push_str(&format!("{i}\n"));
        }
        s
    };
    match req {
        Request::List => listing(&functions.list()),
        Request::Add(spec) => match functions.add(spec) {
            Ok(info) => listing(&[info]),
            Err(e) => error_reply(&e.to_string()),
        },
        Request::Del(key) => match functions.del(key) {
            Ok(()) => "ok\n".to_string(),
            Err(e) => error_reply(&e.to_string()),
        },
    }
}

fn error_reply(msg: &str) -> String {
    // One line: a message never breaks the framing.
    let one: String = msg
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!("error {one}\n")
}

/// Serves a daemon's [`Functions`] on a Unix socket from a thread of its
/// own, each client on a thread of its own (see the module
/// documentation). Dropping it stops the threads (after the requests being
/// served, if any) and removes the socket file.
pub struct ControlServer {
    server: SocketServer,
}

impl ControlServer {
    /// Binds `path` and starts answering requests. A stale socket at
    /// `path` is replaced; a socket a server still answers on, or any other
    /// file, is an error.
    ///
    /// # Errors
    /// [`ControlError::NotASocket`], [`ControlError::InUse`] or
    /// [`ControlError::Io`].
    pub fn start(path: &Path, functions: Arc<Functions>) -> Result<Self, ControlError> {
        let path_buf = || path.to_path_buf();
        let handle = move |stream| answer(stream, &functions);
        match SocketServer::start(path, "vrnic-control", MODE, handle) {
            Ok(server) => Ok(Self { server }),
            Err(StartError::NotASocket) => Err(ControlError::NotASocket { path: path_buf() }),
            Err(StartError::InUse) => Err(ControlError::InUse { path: path_buf() }),
            Err(StartError::Io(source)) => Err(ControlError::Io {
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

/// Reads one request line by `deadline`: up to `\n`, end of stream, or
/// [`MAX_REQUEST`] + 1 bytes (which the parser refuses).
fn read_request(stream: &mut UnixStream, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut buf = Vec::with_capacity(256);
    let mut chunk = [0u8; 1024];
    while buf.len() <= MAX_REQUEST && !buf.contains(&b'\n') {
        let n = read_by(stream, &mut chunk, deadline)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    if let Some(i) = buf.iter().position(|&b| b == b'\n') {
        buf.truncate(i + 1);
    }
    Ok(buf)
}

/// Answers one connection: [`CLIENT_TIMEOUT`] to read the request, then
/// (after executing it) as long again to write the reply.
fn answer(mut stream: UnixStream, functions: &Functions) -> io::Result<()> {
    let reply = match read_request(&mut stream, Instant::now() + CLIENT_TIMEOUT) {
        Ok(raw) => match std::str::from_utf8(&raw) {
            Ok(line) => match parse_request(line) {
                Ok(req) => execute(functions, &req),
                Err(e) => error_reply(&e.to_string()),
            },
            Err(_) => error_reply("bad request: not UTF-8"),
        },
        Err(e) if e.kind() == io::ErrorKind::TimedOut => error_reply(&format!(
            "bad request: not complete within {CLIENT_TIMEOUT:?}"
        )),
        Err(e) => return Err(e),
    };
    write_all_by(
        &mut stream,
        reply.as_bytes(),
        Instant::now() + CLIENT_TIMEOUT,
    )?;
    stream.shutdown(std::net::Shutdown::Both)
}

/// Sends `req` to the control socket at `path`; returns the lines after
/// `ok`. Every read and write is bounded by `timeout`, the reply by
/// [`MAX_REPLY`] bytes.
///
/// # Errors
/// [`ControlError::Refused`] with the daemon's message,
/// [`ControlError::Io`], or [`ControlError::Malformed`].
pub fn request(path: &Path, req: &Request, timeout: Duration) -> Result<Vec<String>, ControlError> {
    request_line(path, &req.line(), timeout)
}

/// [`request`] with a raw line (tests send garbage this way).
///
/// # Errors
/// As [`request`].
pub fn request_line(
    path: &Path,
    line: &str,
    timeout: Duration,
) -> Result<Vec<String>, ControlError> {
    let io_err = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(path).map_err(io_err)?;
    stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
    let mut msg = line.as_bytes().to_vec();
    msg.push(b'\n');
    stream.write_all(&msg).map_err(io_err)?;
    let mut reply = String::new();
    (&mut stream)
        .take(MAX_REPLY + 1)
        .read_to_string(&mut reply)
        .map_err(io_err)?;
    if reply.len() as u64 > MAX_REPLY {
        return Err(ControlError::ReplyTooLong { max: MAX_REPLY });
    }
    let mut lines = reply.lines();
    match lines.next() {
        Some("ok") => Ok(lines.map(str::to_string).collect()),
        Some(l) if l.starts_with("error ") => Err(ControlError::Refused(l[6..].to_string())),
        other => Err(ControlError::Malformed {
            line: other.unwrap_or("").chars().take(80).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!(parse_request("list").unwrap(), Request::List);
        assert_eq!(parse_request("list\n").unwrap(), Request::List);
        assert_eq!(
            parse_request("del f1").unwrap(),
            Request::Del("f1".to_string())
        );
        let add = parse_request("add socket=/run/a.sock,ip=10.0.0.1/24,name=a\n").unwrap();
        let Request::Add(spec) = &add else {
            panic!("{add:?}");
        };
        assert_eq!(spec.name(), "a");
        assert_eq!(parse_request(&add.line()).unwrap(), add);
    }

    #[test]
    fn garbage_is_refused() {
        let long = format!("del {}", "x".repeat(MAX_REQUEST));
        for bad in [
            "",
            "\n",
            " ",
            "LIST",
            "list x",
            "list ",
            "del",
            "del ",
            "del a b",
            "del a\tb",
            "add",
            "add ",
            "add socket=/s",
            "add socket=/s,ip=10.0.0.1/24 extra",
            "add  socket=/s,ip=10.0.0.1/24",
            "frobnicate",
            "list\r",
            "list\n\n",
            "\u{0}list",
            "del \u{7f}",
            long.as_str(),
        ] {
            assert!(
                matches!(parse_request(bad), Err(ControlError::BadRequest(_))),
                "{bad:?} refused"
            );
        }
    }

    #[test]
    fn an_error_reply_is_one_line() {
        assert_eq!(error_reply("a\nb\rc"), "error a b c\n");
    }

    /// A control server on a fresh daemon's functions, in a directory
    /// removed on drop.
    fn serve() -> (ControlServer, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let (uplink, _outside) = vrnic::link::MemLink::pair();
        let fns = Functions::new(
            Box::new(uplink),
            crate::functions::FunctionsConfig::default(),
        );
        let server = ControlServer::start(&dir.path().join("ctl"), Arc::new(fns)).unwrap();
        (server, dir)
    }

    /// Bound on any wait in these tests: far more than a client's time.
    const WAIT: Duration = Duration::from_secs(10);

    #[test]
    fn a_client_that_stalls_mid_request_does_not_hold_up_the_next() {
        let (server, _dir) = serve();
        let mut slow = UnixStream::connect(server.path()).unwrap();
        slow.set_read_timeout(Some(WAIT)).unwrap();
        slow.write_all(b"li").unwrap();
        // Answered while the first client's request is still incomplete
        // (the server has not given up on it: see below).
        let lines = request(server.path(), &Request::List, WAIT).unwrap();
        assert!(lines[0].starts_with("# 0 of"), "{lines:?}");
        // The first client finishes its request and gets its answer: the
        // server was still waiting for it, not done with it first.
        slow.write_all(b"st\n")
            .expect("the server still has the first client");
        let mut reply = String::new();
        slow.read_to_string(&mut reply)
            .expect("the server still has the first client");
        assert!(reply.starts_with("ok\n# 0 of"), "{reply:?}");
    }

    #[test]
    fn a_client_that_trickles_its_request_is_cut_off_in_bounded_time() {
        let (server, _dir) = serve();
        let mut c = UnixStream::connect(server.path()).unwrap();
        // Each read waits at most this long for the server: the pace of
        // the trickle.
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let start = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        // One byte (never a `\n`) per read timeout, as long as the server
        // keeps the connection, which a per-read timeout would do.
        let closed = loop {
            if start.elapsed() > CLIENT_TIMEOUT + WAIT {
                break false;
            }
            if c.write_all(b"x").is_err() {
                break true;
            }
            match c.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break true,
            }
        };
        let took = start.elapsed();
        assert!(closed, "still connected after {took:?}");
        // Less a little: the server's clock started at its accept, which
        // may come before `start`.
        let early = Duration::from_millis(500);
        assert!(
            took + early >= CLIENT_TIMEOUT,
            "cut off after {took:?} only"
        );
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.is_empty() || got.starts_with("error bad request: not complete"),
            "{got:?}"
        );
    }
}
