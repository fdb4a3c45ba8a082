//! `vrnic-write-imm`: proves that an RDMA WRITE with immediate from one
//! vrnic guest lands byte for byte in the other's memory.
//!
//! Roles as with `vrnic-pingpong`: without a host argument it is the
//! *server*, which owns the target buffer; with one it is the *client*,
//! which writes into it.
//!
//! # Buffers
//! The server registers `GUARD + size + GUARD` bytes (`GUARD` = 64) with
//! remote write access; the client writes `size` bytes at offset `GUARD`,
//! so the server can check that the guard bytes before and after the target
//! stay untouched. The client registers `size` bytes it writes from.
//!
//! # Out-of-band protocol (TCP, port 18516 by default, `-p`)
//! Every message is one line of ASCII text ending in `\n`, at most 256
//! bytes. Numbers in the address exchange are lower-case hex, zero-padded:
//!
//! 1. client → server: `LID:QPN:PSN:GID` as `%04x:%06x:%06x:%s`, GID as 32
//!    hex digits in rdma-core's `gid_to_wire_gid` form (the
//!    `ibv_rc_pingpong` message, newline-terminated instead of NUL-padded);
//! 2. the server connects its QP, then answers `LID:QPN:PSN:GID:ADDR:RKEY:LEN`
//!    as `%04x:%06x:%06x:%s:%016x:%08x:%08x`: its QP details plus the remote
//!    address (iova), rkey and length in bytes of its whole buffer (guards
//!    included); the client checks the length matches its `-s`, then connects
//!    its QP;
//! 3. per iteration `i` (decimal, from 0):
//!    - server: fills its whole buffer with 0xA5, posts one receive (without
//!      buffers: the immediate consumes it), sends `ready i`;
//!    - client: fills its buffer with [`fill_pattern`]`(i, size)`, posts a
//!      signalled `RDMA_WRITE_WITH_IMM` of it to the server's address + 64
//!      with immediate `i`, waits for its completion (success,
//!      `RDMA_WRITE`), sends `sent i`;
//!    - server: waits for the receive completion (success,
//!      `RECV_RDMA_WITH_IMM`, immediate `i`, `byte_len` == size), checks
//!      every target byte against the same pattern and every guard byte,
//!      answers `ok i HASH` with the 64-bit FNV-1a hash of the target bytes
//!      as 16 hex digits;
//!    - client: checks `HASH` equals the hash of what it wrote.
//!
//! Either side that fails after connecting sends `fail MESSAGE` before
//! closing, so its peer stops at once with the reason.
//!
//! Both sides end with `write-imm verified: N writes of S bytes` and exit
//! status 0. Any mismatch, error completion (named as `ibv_wc_status_str`
//! names it), protocol error or wait longer than `--timeout` seconds
//! (accepting, connecting, each TCP read, each completion) prints the
//! error and exits with status 1.
//!
//! The device is the vrnic PCI function (`--pci BDF`, default the first
//! found). The hidden `--loopback` option runs both roles in this process
//! over two in-process devices joined by a memory link, for tests; the
//! hidden `--fault` option makes the client misbehave so tests can see each
//! check fail.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use clap::{Parser, ValueEnum};
use vrnic::abi;
use vrnic_guest::tools::{
    self, parse_c_int, parse_mtu, random_psn, say, Dest, PollPacer, LINK_LAYER_ETHERNET,
};
use vrnic_guest::transport::Transport;
use vrnic_guest::verbs::*;

/// Bytes of guard before (and at least after) the target in the server's buffer.
const GUARD: usize = 64;
/// What the server fills its whole buffer with before every write.
const GUARD_FILL: u8 = 0xa5;
/// Longest out-of-band line accepted, bytes (newline excluded).
const MAX_LINE: usize = 256;
/// The port the device's verbs use (vrnic has one).
const IB_PORT: u8 = 1;
/// Hop limit (IP TTL) of the GRH.
const HOP_LIMIT: u8 = 64;

/// Parses a positive count.
fn parse_positive(s: &str) -> Result<u32, String> {
    match parse_c_int::<u32>(s)? {
        0 => Err("must be at least 1".into()),
        v => Ok(v),
    }
}

/// Parses a buffer size: 1 byte up to what a work request carries with the guards.
fn parse_size(s: &str) -> Result<u32, String> {
    let v = parse_positive(s)?;
    if v as usize > u32::MAX as usize - 2 * GUARD {
        return Err(format!(
            "{v}: at most {} bytes",
            u32::MAX as usize - 2 * GUARD
        ));
    }
    Ok(v)
}

/// How the client misbehaves (hidden `--fault`, for tests of the checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Fault {
    /// Write one byte before the target (into the leading guard).
    Offset,
    /// Send the wrong immediate value.
    Imm,
    /// Use a wrong rkey (the write completes with an error).
    Rkey,
}

/// RDMA WRITE with immediate into a peer's buffer, verified byte for byte:
/// without HOST be the server (owner of the target buffer) and wait for a
/// client, with HOST connect to the server there and write.
#[derive(Parser, Debug, Clone)]
#[command(name = "vrnic-write-imm", version)]
struct Args {
    /// Server to connect to; none: be the server.
    host: Option<String>,
    /// Listen on/connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18516", value_parser = parse_c_int::<u16>)]
    port: u16,
    /// Bytes per write.
    #[arg(short = 's', long = "size", default_value = "65536", value_parser = parse_size)]
    size: u32,
    /// Number of writes.
    #[arg(short = 'n', long = "iters", default_value = "10", value_parser = parse_positive)]
    iters: u32,
    /// Path MTU, bytes (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = parse_mtu)]
    mtu: u32,
    /// Local GID index (1 is the IPv4-mapped RoCEv2 GID).
    #[arg(short = 'g', long = "gid-idx", default_value = "1", value_parser = parse_c_int::<u8>)]
    gid_idx: u8,
    /// PCI address of the vrnic device (e.g. 0000:00:04.0); default: the first found.
    #[arg(long)]
    pci: Option<String>,
    /// Give up on any single wait (accept, connect, TCP read, completion)
    /// longer than this many seconds.
    #[arg(long, default_value = "60", value_parser = parse_positive)]
    timeout: u32,
    /// Run a server and a client in this process over two in-process devices
    /// (10.0.0.1 and 10.0.0.2).
    #[arg(long, hide = true)]
    loopback: bool,
    /// Make the client misbehave, to test that the checks fail.
    #[arg(long, hide = true, value_enum)]
    fault: Option<Fault>,
}

impl Args {
    /// The bound of every single wait.
    fn wait(&self) -> Duration {
        Duration::from_secs(self.timeout.into())
    }
}

// ---------------------------------------------------------------------------
// Data: pattern and checksum
// ---------------------------------------------------------------------------

/// splitmix64's finaliser: spreads a seed over all 64 bits.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the bytes of write `iter` of `buf.len()` bytes: an
/// xorshift64 stream (little-endian words) seeded from `(iter, len)`, so
/// every iteration and size has its own pattern.
fn fill_pattern(iter: u32, buf: &mut [u8]) {
    let seed = (u64::from(iter) << 32) ^ buf.len() as u64;
    let mut s = splitmix64(seed) | 1;
    for chunk in buf.chunks_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        chunk.copy_from_slice(&s.to_le_bytes()[..chunk.len()]);
    }
}

/// 64-bit FNV-1a of `data`.
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Checks the server's whole buffer after write `iter`: the guard bytes
/// before and after the target are [`GUARD_FILL`], the `expected.len()`
/// bytes at [`GUARD`] equal `expected`. Names the first bad byte.
fn check_buffer(iter: u32, buf: &[u8], expected: &[u8]) -> Result<()> {
    let end = GUARD + expected.len();
    ensure!(
        buf.len() >= end + GUARD,
        "write {iter}: buffer of {} bytes cannot hold {} bytes between guards",
        buf.len(),
        expected.len()
    );
    if let Some(j) = buf[..GUARD].iter().position(|&b| b != GUARD_FILL) {
        bail!(
            "write {iter}: guard byte at offset {j} ({} before the target) is {:#04x}, expected {GUARD_FILL:#04x}",
            GUARD - j,
            buf[j]
        );
    }
    let target = &buf[GUARD..end];
    if let Some(j) = target.iter().zip(expected).position(|(a, b)| a != b) {
        let bad = target.iter().zip(expected).filter(|(a, b)| a != b).count();
        bail!(
            "write {iter}: data mismatch at target byte {j}: {:#04x}, expected {:#04x} ({bad} of {} bytes differ)",
            target[j],
            expected[j],
            expected.len()
        );
    }
    if let Some(j) = buf[end..].iter().position(|&b| b != GUARD_FILL) {
        bail!(
            "write {iter}: guard byte at offset {} ({j} after the target) is {:#04x}, expected {GUARD_FILL:#04x}",
            end + j,
            buf[end + j]
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Address exchange
// ---------------------------------------------------------------------------

/// The server's buffer as the client addresses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RemoteBuf {
    /// Remote address (iova) of its first byte.
    addr: u64,
    rkey: u32,
    /// Length, bytes, guards included.
    len: u32,
}

/// rdma-core's `wire_gid_to_gid`, strictly: exactly 32 hex digits.
fn wire_to_gid(s: &str) -> Result<Gid> {
    ensure!(
        s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        "GID {s:?} is not 32 hex digits"
    );
    tools::wire_to_gid(s)
}

/// Parses a hex field of at most `bits` bits.
fn hex_field(line: &str, name: &str, s: &str, bits: u32) -> Result<u64> {
    let v = u64::from_str_radix(s, 16).map_err(|e| anyhow!("{name} in {line:?}: {e}"))?;
    ensure!(
        bits >= 64 || v >> bits == 0,
        "{name} in {line:?} exceeds {bits} bits"
    );
    Ok(v)
}

/// The address message (without its newline): the client's, or the
/// server's when `buf` is given.
fn dest_msg(d: &Dest, buf: Option<&RemoteBuf>) -> String {
    let mut s = d.wire();
    if let Some(b) = buf {
        s += &format!(":{:016x}:{:08x}:{:08x}", b.addr, b.rkey, b.len);
    }
    s
}

/// Parses an address message: the client's (4 fields) when `with_buf` is
/// false, the server's (7 fields) when true.
fn parse_dest_msg(line: &str, with_buf: bool) -> Result<(Dest, Option<RemoteBuf>)> {
    let f: Vec<&str> = line.split(':').collect();
    let want = if with_buf { 7 } else { 4 };
    ensure!(
        f.len() == want,
        "malformed address message {line:?}: {} fields, expected {want}",
        f.len()
    );
    let d = Dest {
        lid: hex_field(line, "LID", f[0], 16)? as u32,
        qpn: hex_field(line, "QPN", f[1], 24)? as u32,
        psn: hex_field(line, "PSN", f[2], 24)? as u32,
        gid: wire_to_gid(f[3]).with_context(|| format!("address message {line:?}"))?,
    };
    let buf = if with_buf {
        Some(RemoteBuf {
            addr: hex_field(line, "address", f[4], 64)?,
            rkey: hex_field(line, "rkey", f[5], 32)? as u32,
            len: hex_field(line, "length", f[6], 32)? as u32,
        })
    } else {
        None
    };
    Ok((d, buf))
}

// ---------------------------------------------------------------------------
// Out-of-band connection
// ---------------------------------------------------------------------------

/// A line-oriented TCP connection whose every read is bounded.
struct Oob {
    sock: TcpStream,
    /// Bytes read beyond the last line returned.
    pending: Vec<u8>,
    wait: Duration,
}

impl Oob {
    fn new(sock: TcpStream, wait: Duration) -> Result<Oob> {
        sock.set_nodelay(true)?;
        sock.set_write_timeout(Some(wait))?;
        Ok(Oob {
            sock,
            pending: Vec::new(),
            wait,
        })
    }

    /// Sends `line` and its newline.
    fn send(&mut self, line: &str) -> Result<()> {
        let mut m = Vec::with_capacity(line.len() + 1);
        m.extend_from_slice(line.as_bytes());
        m.push(b'\n');
        self.sock
            .write_all(&m)
            .with_context(|| format!("sending {line:?} to the peer"))
    }

    /// Tells the peer this side failed (best effort: it may be gone).
    fn send_fail(&mut self, e: &anyhow::Error) {
        let text: String = format!("{e:#}")
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(MAX_LINE - 5)
            .collect();
        let _ = self.send(&format!("fail {text}"));
    }

    /// Receives one line (without its newline), waiting at most the
    /// connection's bound; `what` names the expected message in errors. A
    /// `fail ...` line from the peer becomes an error.
    fn recv(&mut self, what: &str) -> Result<String> {
        let deadline = Instant::now() + self.wait;
        loop {
            if let Some(nl) = self.pending.iter().position(|&b| b == b'\n') {
                let rest = self.pending.split_off(nl + 1);
                let mut line = std::mem::replace(&mut self.pending, rest);
                line.pop();
                let line = String::from_utf8(line)
                    .map_err(|_| anyhow!("waiting for {what}: the peer sent non-text bytes"))?;
                if let Some(reason) = line.strip_prefix("fail ") {
                    bail!("the peer failed: {reason}");
                }
                return Ok(line);
            }
            ensure!(
                self.pending.len() <= MAX_LINE,
                "waiting for {what}: the peer sent a line longer than {MAX_LINE} bytes"
            );
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "waiting for {what}: nothing from the peer for {} s (--timeout)",
                    self.wait.as_secs()
                );
            }
            self.sock.set_read_timeout(Some(left))?;
            let mut chunk = [0u8; 512];
            match self.sock.read(&mut chunk) {
                Ok(0) => bail!("waiting for {what}: the peer closed the connection"),
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e).with_context(|| format!("waiting for {what}")),
            }
        }
    }

    /// Receives a line that must be exactly `want`.
    fn expect(&mut self, want: &str) -> Result<()> {
        let got = self.recv(&format!("{want:?}"))?;
        ensure!(
            got == want,
            "protocol error: expected {want:?}, got {got:?}"
        );
        Ok(())
    }
}

/// Accepts one connection on `listener`, waiting at most `wait`.
fn accept_bounded(listener: &TcpListener, wait: Duration) -> Result<TcpStream> {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "no client connected within {} s (--timeout)",
                wait.as_secs()
            );
        }
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("poll() on the listening socket");
        }
        if n > 0 {
            let (sock, _) = listener.accept().context("accept() failed")?;
            sock.set_nonblocking(false)?;
            return Ok(sock);
        }
    }
}

/// Connects to `host:port` within `wait`. With `retry`, a refused
/// connection (no server yet) is retried every 100 ms until then.
fn connect_bounded(host: &str, port: u16, wait: Duration, retry: bool) -> Result<TcpStream> {
    let deadline = Instant::now() + wait;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}:{port}"))?
        .collect();
    ensure!(!addrs.is_empty(), "{host}:{port} resolves to no address");
    loop {
        let mut last = None;
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        let refused = last
            .as_ref()
            .is_some_and(|e| e.kind() == ErrorKind::ConnectionRefused);
        let left = deadline.saturating_duration_since(Instant::now());
        if !(retry && refused) || left.is_zero() {
            let why = last.map_or_else(|| "timed out".to_string(), |e| e.to_string());
            bail!(
                "couldn't connect to {host}:{port} within {} s (--timeout): {why}",
                wait.as_secs()
            );
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

// ---------------------------------------------------------------------------
// Device side
// ---------------------------------------------------------------------------

/// INIT → RTR → RTS with `ibv_rc_pingpong`'s attributes and a GRH to the peer's GID.
fn connect_qp(qp: &mut Qp, a: &Args, my_psn: u32, rem: &Dest) -> Result<()> {
    ensure!(
        rem.gid.interface_id() != 0,
        "the peer's GID {} is empty: RoCE needs a GID (-g)",
        rem.gid
    );
    let ah = AhAttr {
        is_global: true,
        hop_limit: HOP_LIMIT,
        dgid: rem.gid,
        sgid_index: a.gid_idx,
        ..Default::default()
    };
    tools::rc_qp_connect(qp, a.mtu, ah, my_psn, rem)
}

/// Waits at most `wait` for exactly one completion on `cq`; `what` names
/// it in errors. More than one completion at once is an error.
fn wait_one(cq: &mut Cq, wait: Duration, what: &str) -> Result<WorkCompletion> {
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 2];
    let mut pacer = PollPacer::new();
    loop {
        match cq.poll(&mut wc) {
            0 => {}
            1 => return Ok(wc[0]),
            _ => bail!(
                "{what}: unexpected extra completion {:?} after {:?}",
                wc[1],
                wc[0]
            ),
        }
        if pacer.idle(start, wait) {
            bail!(
                "{what}: no completion within {} s (--timeout)",
                wait.as_secs()
            );
        }
    }
}

/// Describes a failed completion as `ibv_wc_status_str` names its status.
fn wc_error(what: &str, w: &WorkCompletion) -> anyhow::Error {
    anyhow!(
        "{what} failed: status {} ({}), vendor error {:#x}, wr_id {}",
        w.status_str(),
        w.status,
        w.vendor_err,
        w.wr_id
    )
}

/// How a side reaches its peer.
enum Role {
    Server(TcpListener),
    /// Host, port, and whether to retry a refused connection.
    Client(String, u16, bool),
}

/// The device objects of one side.
struct Side {
    cq: Cq,
    qp: Qp,
    mr: Mr<'static>,
    me: Dest,
    // Dropped last: every object above keeps it alive anyway.
    _pd: Pd,
}

/// Opens the device and creates the PD, the MR of `len` bytes (remotely
/// writable on the `server`), a CQ and an RC QP in INIT (accepting remote
/// writes on the `server`), and reads the GID at `-g`.
fn open_side(a: &Args, transport: Box<dyn Transport>, len: usize, server: bool) -> Result<Side> {
    let ctx = Context::open(transport).context("Couldn't get context")?;
    let pd = Pd::alloc(&ctx).context("Couldn't allocate PD")?;
    let access = if server {
        ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE
    } else {
        ACCESS_LOCAL_WRITE
    };
    let mr = Mr::alloc(&pd, len, access).context("Couldn't register MR")?;
    let cq = Cq::new(&ctx, 4).context("Couldn't create CQ")?;
    let qp_access = if server { ACCESS_REMOTE_WRITE } else { 0 };
    let qp = tools::rc_qp_init(&pd, &cq, 1, IB_PORT, qp_access)?;
    let port = ctx.query_port(IB_PORT).context("Couldn't get port info")?;
    ensure!(
        port.link_layer == LINK_LAYER_ETHERNET,
        "port {IB_PORT} is not a RoCE (Ethernet) port"
    );
    let gid = ctx
        .query_gid(IB_PORT, a.gid_idx.into())
        .with_context(|| format!("can't read sgid of index {}", a.gid_idx))?;
    ensure!(
        gid.interface_id() != 0,
        "GID index {} is empty: RoCE needs a GID (-g)",
        a.gid_idx
    );
    let me = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid,
    };
    Ok(Side {
        cq,
        qp,
        mr,
        me,
        _pd: pd,
    })
}

/// Prints a side's QP details as `ibv_rc_pingpong` does.
fn say_dest(tag: &str, which: &str, d: &Dest) {
    say(tag, format_args!("  {which} {}", d.describe()));
}

/// One side of the run; returns the number of writes verified.
fn run(a: &Args, transport: Box<dyn Transport>, role: Role, tag: &str) -> Result<u32> {
    let size = a.size as usize;
    let wait = a.wait();
    match role {
        Role::Server(listener) => {
            let len = GUARD + size + GUARD;
            let mut side = open_side(a, transport, len, true)?;
            let buf = RemoteBuf {
                addr: side.mr.addr(),
                rkey: side.mr.rkey(),
                len: u32::try_from(len).context("buffer too large")?,
            };
            say_dest(tag, "local address: ", &side.me);
            say(
                tag,
                format_args!(
                    "  local buffer:   addr 0x{:016x}, rkey 0x{:08x}, {} bytes (target at offset {GUARD})",
                    buf.addr, buf.rkey, buf.len
                ),
            );
            let sock = accept_bounded(&listener, wait)?;
            drop(listener);
            let mut oob = Oob::new(sock, wait)?;
            let r = server_session(a, &mut side, &mut oob, &buf, tag);
            if let Err(e) = &r {
                oob.send_fail(e);
            }
            r
        }
        Role::Client(host, port, retry) => {
            let mut side = open_side(a, transport, size, false)?;
            say_dest(tag, "local address: ", &side.me);
            let sock = connect_bounded(&host, port, wait, retry)?;
            let mut oob = Oob::new(sock, wait)?;
            let r = client_session(a, &mut side, &mut oob, tag);
            if let Err(e) = &r {
                oob.send_fail(e);
            }
            r
        }
    }
}

/// The server after accepting: exchange, then per write arm, wait, verify.
fn server_session(
    a: &Args,
    side: &mut Side,
    oob: &mut Oob,
    buf: &RemoteBuf,
    tag: &str,
) -> Result<u32> {
    let size = a.size as usize;
    let wait = a.wait();
    let line = oob.recv("the client's address")?;
    let (rem, _) = parse_dest_msg(&line, false)?;
    say_dest(tag, "remote address:", &rem);
    connect_qp(&mut side.qp, a, side.me.psn, &rem).context("Couldn't connect to remote QP")?;
    oob.send(&dest_msg(&side.me, Some(buf)))?;

    let mut expected = vec![0u8; size];
    let mut got = vec![0u8; buf.len as usize];
    for i in 0..a.iters {
        side.mr.fill(GUARD_FILL);
        side.qp
            .post_recv(&RecvWr {
                wr_id: i.into(),
                sg_list: &[],
            })
            .with_context(|| format!("write {i}: couldn't post receive"))?;
        oob.send(&format!("ready {i}"))?;
        oob.expect(&format!("sent {i}"))?;
        let what = format!("write {i}: receive");
        let w = wait_one(&mut side.cq, wait, &what)?;
        if !w.is_success() {
            return Err(wc_error(&what, &w));
        }
        ensure!(
            w.opcode == abi::WC_OP_RECV_RDMA_WITH_IMM,
            "{what}: opcode {}, expected RECV_RDMA_WITH_IMM ({})",
            w.opcode,
            abi::WC_OP_RECV_RDMA_WITH_IMM
        );
        ensure!(
            w.wr_id == u64::from(i),
            "{what}: wr_id {}, expected {i}",
            w.wr_id
        );
        ensure!(
            w.imm_data == Some(i),
            "{what}: immediate {:?}, expected Some({i})",
            w.imm_data
        );
        ensure!(
            w.byte_len as usize == size,
            "{what}: byte_len {}, expected {size}",
            w.byte_len
        );
        side.mr.read(0, &mut got);
        fill_pattern(i, &mut expected);
        check_buffer(i, &got, &expected)?;
        let hash = fnv1a64(&got[GUARD..GUARD + size]);
        oob.send(&format!("ok {i} {hash:016x}"))?;
    }
    say(
        tag,
        format_args!("write-imm verified: {} writes of {size} bytes", a.iters),
    );
    Ok(a.iters)
}

/// The client after connecting: exchange, then per write fill, write, report, compare.
fn client_session(a: &Args, side: &mut Side, oob: &mut Oob, tag: &str) -> Result<u32> {
    let size = a.size as usize;
    let wait = a.wait();
    oob.send(&dest_msg(&side.me, None))?;
    let line = oob.recv("the server's address")?;
    let (rem, buf) = parse_dest_msg(&line, true)?;
    let buf = buf.expect("parsed with the buffer fields");
    say_dest(tag, "remote address:", &rem);
    say(
        tag,
        format_args!(
            "  remote buffer:  addr 0x{:016x}, rkey 0x{:08x}, {} bytes",
            buf.addr, buf.rkey, buf.len
        ),
    );
    ensure!(
        buf.len as usize == GUARD + size + GUARD,
        "the server's buffer is {} bytes, expected {} for -s {size}: both sides need the same -s",
        buf.len,
        GUARD + size + GUARD
    );
    connect_qp(&mut side.qp, a, side.me.psn, &rem)?;

    let mut data = vec![0u8; size];
    let sge = [side.mr.sge(0, size)];
    for i in 0..a.iters {
        oob.expect(&format!("ready {i}"))?;
        fill_pattern(i, &mut data);
        side.mr.write(0, &data);
        let mut wr = SendWr {
            wr_id: i.into(),
            opcode: WrOpcode::RdmaWriteWithImm,
            send_flags: SEND_SIGNALED,
            sg_list: &sge,
            imm_data: i,
            rdma: RdmaWr {
                remote_addr: buf.addr + GUARD as u64,
                rkey: buf.rkey,
            },
            ..Default::default()
        };
        match a.fault {
            Some(Fault::Offset) => wr.rdma.remote_addr -= 1,
            Some(Fault::Imm) => wr.imm_data ^= 0x8000_0000,
            Some(Fault::Rkey) => wr.rdma.rkey ^= 0x5a5a_0000,
            None => {}
        }
        side.qp
            .post_send(&wr)
            .with_context(|| format!("write {i}: couldn't post RDMA_WRITE_WITH_IMM"))?;
        let what = format!("write {i}: RDMA_WRITE_WITH_IMM");
        let w = wait_one(&mut side.cq, wait, &what)?;
        if !w.is_success() {
            return Err(wc_error(&what, &w));
        }
        ensure!(
            w.opcode == abi::WC_OP_RDMA_WRITE && w.wr_id == u64::from(i),
            "{what}: completion opcode {} wr_id {}, expected RDMA_WRITE ({}) wr_id {i}",
            w.opcode,
            w.wr_id,
            abi::WC_OP_RDMA_WRITE
        );
        oob.send(&format!("sent {i}"))?;
        let line = oob.recv(&format!("\"ok {i} HASH\""))?;
        let theirs = line
            .strip_prefix(&format!("ok {i} "))
            .filter(|h| h.len() == 16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or_else(|| anyhow!("protocol error: expected \"ok {i} HASH\", got {line:?}"))?;
        let ours = fnv1a64(&data);
        ensure!(
            theirs == ours,
            "write {i}: the server's FNV-1a {theirs:016x} differs from the data's {ours:016x}"
        );
    }
    say(
        tag,
        format_args!("write-imm verified: {} writes of {size} bytes", a.iters),
    );
    Ok(a.iters)
}

/// `--loopback`: a server thread and a client over two in-process devices.
fn run_loopback(a: &Args) -> Result<()> {
    let (ts, tc) = tools::loopback_pair(a.mtu)?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("Couldn't listen")?;
    let port = listener.local_addr()?.port();
    let sa = a.clone();
    let server = std::thread::spawn(move || run(&sa, ts, Role::Server(listener), "server: "));
    let client = run(
        a,
        tc,
        Role::Client(Ipv4Addr::LOCALHOST.to_string(), port, false),
        "client: ",
    );
    if client.is_err() {
        // Wake a server still waiting in accept: it then reads EOF and stops.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, port));
    }
    let server = server
        .join()
        .map_err(|_| anyhow!("the server thread panicked"))?;
    match (client, server) {
        (Ok(c), Ok(s)) if c == a.iters && s == a.iters => Ok(()),
        (Ok(c), Ok(s)) => bail!(
            "verified {c} (client) and {s} (server) of {} writes",
            a.iters
        ),
        (Err(c), Ok(_)) => Err(c.context("client")),
        (Ok(_), Err(s)) => Err(s.context("server")),
        (Err(c), Err(s)) => Err(anyhow!("client: {c:#}; server: {s:#}")),
    }
}

fn main() -> ExitCode {
    tools::init_tracing();
    let a = Args::parse();
    let r = if a.loopback {
        run_loopback(&a)
    } else {
        tools::open_pci(a.pci.as_deref()).and_then(|t| {
            let role = match &a.host {
                Some(h) => Role::Client(h.clone(), a.port, true),
                None => Role::Server(tools::listen(a.port)?),
            };
            run(&a, t, role, "").map(|_| ())
        })
    };
    tools::exit_code("vrnic-write-imm", r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_messages_round_trip_in_the_documented_format() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from(Ipv4Addr::new(10, 0, 0, 2)),
        };
        let c = dest_msg(&d, None);
        assert_eq!(c, "0000:000011:abcdef:00000000000000000000ffff0a000002");
        assert_eq!(parse_dest_msg(&c, false).unwrap(), (d, None));
        let b = RemoteBuf {
            addr: 0x7f00_1234_5000,
            rkey: 0xdead_beef,
            len: 65536 + 128,
        };
        let s = dest_msg(&d, Some(&b));
        assert_eq!(
            s,
            "0000:000011:abcdef:00000000000000000000ffff0a000002:00007f0012345000:deadbeef:00010080"
        );
        assert_eq!(parse_dest_msg(&s, true).unwrap(), (d, Some(b)));
        assert!(
            parse_dest_msg(&c, true).is_err(),
            "client message lacks the buffer"
        );
        assert!(parse_dest_msg(&s, false).is_err());
        assert!(parse_dest_msg(
            "0000:1000000:000000:00000000000000000000ffff0a000002",
            false
        )
        .is_err());
        assert!(parse_dest_msg("0000:000011:abcdef:0000", false).is_err());
    }

    #[test]
    fn patterns_differ_per_iteration_and_size() {
        let (mut a, mut b, mut c) = (vec![0u8; 4097], vec![0u8; 4097], vec![0u8; 4098]);
        fill_pattern(0, &mut a);
        fill_pattern(1, &mut b);
        fill_pattern(0, &mut c);
        assert_ne!(a, b);
        assert_ne!(a[..], c[..4097]);
        let mut again = vec![0u8; 4097];
        fill_pattern(0, &mut again);
        assert_eq!(a, again, "the generator is deterministic");
        // Not constant and not trivially guard-like.
        assert!(a.iter().filter(|&&x| x == GUARD_FILL).count() < 100);
    }

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn buffer_check_names_guard_and_data_corruption() {
        let size = 100;
        let mut expected = vec![0u8; size];
        fill_pattern(7, &mut expected);
        let mut buf = vec![GUARD_FILL; GUARD + size + GUARD];
        buf[GUARD..GUARD + size].copy_from_slice(&expected);
        check_buffer(7, &buf, &expected).unwrap();

        let mut b = buf.clone();
        b[GUARD - 1] ^= 1;
        let e = check_buffer(7, &b, &expected).unwrap_err().to_string();
        assert!(e.contains("guard byte at offset 63 (1 before"), "{e}");

        let mut b = buf.clone();
        b[GUARD + size] ^= 1;
        let e = check_buffer(7, &b, &expected).unwrap_err().to_string();
        assert!(e.contains("guard byte at offset 164 (0 after"), "{e}");

        let mut b = buf.clone();
        b[GUARD + 42] ^= 0xff;
        let e = check_buffer(7, &b, &expected).unwrap_err().to_string();
        assert!(
            e.contains("target byte 42") && e.contains("1 of 100"),
            "{e}"
        );

        let mut other = vec![0u8; size];
        fill_pattern(8, &mut other);
        assert!(
            check_buffer(8, &buf, &other).is_err(),
            "a stale write is refused"
        );
    }

    #[test]
    fn out_of_band_lines_split_report_peer_failures_and_every_wait_is_bounded() {
        let wait = Duration::from_millis(200);
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let e = accept_bounded(&listener, wait).unwrap_err().to_string();
        assert!(e.contains("--timeout"), "{e}");

        let mut peer = connect_bounded("127.0.0.1", port, wait, false).unwrap();
        let mut oob = Oob::new(accept_bounded(&listener, wait).unwrap(), wait).unwrap();
        peer.write_all(b"ready 0\nsent 0\nfail it broke\n").unwrap();
        oob.expect("ready 0").unwrap();
        let e = oob.expect("ready 1").unwrap_err().to_string();
        assert!(e.contains("expected \"ready 1\", got \"sent 0\""), "{e}");
        let e = oob.recv("ok").unwrap_err().to_string();
        assert_eq!(e, "the peer failed: it broke");

        let start = Instant::now();
        let e = oob.recv("a silent peer").unwrap_err().to_string();
        assert!(e.contains("--timeout"), "{e}");
        assert!(start.elapsed() >= wait && start.elapsed() < 10 * wait);

        peer.write_all(&[b'x'; MAX_LINE + 2]).unwrap();
        let e = oob.recv("a long line").unwrap_err().to_string();
        assert!(e.contains("longer than"), "{e}");

        drop(peer);
        let mut oob2 = {
            let p = connect_bounded("127.0.0.1", port, wait, false).unwrap();
            drop(p);
            Oob::new(accept_bounded(&listener, wait).unwrap(), wait).unwrap()
        };
        let e = oob2.recv("anything").unwrap_err().to_string();
        assert!(e.contains("closed the connection"), "{e}");

        drop(listener);
        let e = connect_bounded("127.0.0.1", port, wait, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("couldn't connect"), "{e}");
    }

    #[test]
    fn options_parse_like_strtoul_and_refuse_bad_values() {
        assert_eq!(parse_mtu("1024"), Ok(3));
        assert!(parse_mtu("1500").is_err());
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert!(parse_size("0").is_err());
        assert!(parse_positive("0").is_err());
        let a = Args::try_parse_from(["vrnic-write-imm"]).unwrap();
        assert_eq!(
            (a.port, a.size, a.iters, a.mtu, a.gid_idx, a.timeout),
            (18516, 65536, 10, 3, 1, 60)
        );
        assert!(a.host.is_none());
    }
}
