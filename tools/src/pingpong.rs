//! What the ports of rdma-core's ping-pong examples share
//! (libibverbs/examples/{rc,ud,srq}_pingpong.c as `vrnic-pingpong`,
//! `vrnic-ud-pingpong` and `vrnic-srq-pingpong`): the out-of-band exchange
//! of `pingpong_dest` messages over TCP, the check of every received
//! message, rc_pingpong's result lines and the in-process `--loopback` run.
//!
//! The exchange, as all three examples do it (the messages are
//! [`Dest::to_msg`], 52 bytes each with their NUL):
//! - the client connects, writes its N messages, reads the server's N and
//!   writes `"done"` (5 bytes with the NUL);
//! - the server accepts one connection, reads N messages, connects its
//!   QPs (the `connect` callback), writes its N messages and reads
//!   `"done"`.
//!
//! N is 1 for rc_pingpong and ud_pingpong and always 256 (`MAX_QP`) for
//! srq_pingpong, whose unused entries are all-zero messages.
//!
//! Message data. The examples send whatever their buffer holds and a server
//! sends from the buffer it receives into, so a server echoes. A vrnic
//! client therefore sends a pattern ([`fill_pattern`]) and checks that every
//! reply equals it; a vrnic server accepts either that pattern or what the
//! stock client sends (its buffer's fill byte, with `--chk`'s 0 at page
//! starts), learnt from the first message and held for the run
//! ([`Verifier`]).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::tools::{self, parse_c_int, say, Dest, PollPacer, RC_MSG_LEN};
use vrnic::abi;
use vrnic_guest::transport::Transport;
use vrnic_guest::verbs::{Context, Cq, Gid, Qp, RecvWr, Sge, WorkCompletion};

/// Work request ID of the examples' receives (`PINGPONG_RECV_WRID`).
pub const RECV_WRID: u64 = 1;
/// Work request ID of the examples' sends (`PINGPONG_SEND_WRID`).
pub const SEND_WRID: u64 = 2;
/// What `--chk` writes at each page start of a client's buffer
/// (`i / page_size % sizeof(char)`, always 0).
pub const CHK_BYTE: u8 = 0;
/// The fill of a receive buffer before a message lands in it: never sent,
/// and neither a stock tool's fill nor (at byte 0) a pattern, so a receive
/// that writes nothing shows.
pub const POISON: u8 = 0xa5;

/// Parses `-i`/`--ib-port` as the examples do: [`parse_c_int`], at least 1.
pub fn parse_ib_port(s: &str) -> Result<u8, String> {
    let p: u8 = parse_c_int(s)?;
    if p < 1 {
        return Err("port numbers start at 1".into());
    }
    Ok(p)
}

/// The options the ping-pong examples share, spelt as they spell them
/// (`-p -d -i -r -n -l -e -g -c`), plus vrnic's `--pci`,
/// `--stall-timeout` and the hidden `--loopback`. Flattened into each
/// tool's options (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Server to connect to; none: be the server.
    pub servername: Option<String>,
    /// Listen on/connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18515", value_parser = parse_c_int::<u16>)]
    pub port: u16,
    /// IB device name (accepted for compatibility; the device is chosen by --pci).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Use this port of the device.
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = parse_ib_port)]
    pub ib_port: u8,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value = "500", value_parser = parse_c_int::<u32>)]
    pub rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value = "1000", value_parser = parse_c_int::<u32>)]
    pub iters: u32,
    /// Service level value.
    #[arg(short = 'l', long = "sl", default_value = "0", value_parser = parse_c_int::<u8>)]
    pub sl: u8,
    /// Sleep on CQ events (accepted; the vrnic tools always poll).
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Local port GID index (RoCE needs one: 1 is the IPv4-mapped GID).
    #[arg(short = 'g', long = "gid-idx", default_value_t = -1, allow_negative_numbers = true)]
    pub gid_idx: i32,
    /// Validate the received buffer as the stock example's --chk does.
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
    /// PCI address of the vrnic device (e.g. 0000:00:04.0); default: the first found.
    #[arg(long)]
    pub pci: Option<String>,
    /// Give up when no completion arrives for this many seconds.
    #[arg(long, default_value_t = 30)]
    pub stall_timeout: u64,
    /// Local ACK timeout of the RC QPs, 4.096 µs × 2^N (`ibv_modify_qp(3)`
    /// `timeout`; the stock examples use 14, about 67 ms). A larger one
    /// lets a connection ride out a longer pause of its peer (VM `stop`).
    #[arg(long, default_value_t = crate::tools::RC_TIMEOUT, value_parser = clap::value_parser!(u8).range(0..=31))]
    pub qp_timeout: u8,
    /// Run a server and a client in this process over two in-process devices
    /// (10.0.0.1 and 10.0.0.2, GID index 1 unless -g is given).
    #[arg(long, hide = true)]
    pub loopback: bool,
}

impl Common {
    /// The options of a `--loopback` side: GID index 1 (the IPv4-mapped
    /// GID) unless `-g` was given.
    fn for_loopback(&mut self) {
        if self.gid_idx < 0 {
            self.gid_idx = 1;
        }
    }

    /// The local GID announced to the peer: GID `-g` of the port, or all
    /// zeros without `-g` (as the examples do). `what` is the example's
    /// error text (`can't read sgid of index`, `Could not get local gid for
    /// gid index`), followed by the index.
    pub fn local_gid(&self, ctx: &Context, what: &str) -> Result<Gid> {
        if self.gid_idx < 0 {
            return Ok(Gid::default());
        }
        ctx.query_gid(self.ib_port, self.gid_idx as u32)
            .with_context(|| format!("{what} {}", self.gid_idx))
    }

    /// The stall bound (`--stall-timeout`).
    pub fn stall(&self) -> Duration {
        Duration::from_secs(self.stall_timeout)
    }

    /// The common checks before a run: the message `size`, `-r` and `-n`
    /// at least 1; `-e` noted (completion events are not used).
    ///
    /// Errors: `size, rx-depth and iters must be at least 1`.
    pub fn check(&self, size: u32) -> Result<()> {
        if size == 0 || self.rx_depth == 0 || self.iters == 0 {
            bail!("size, rx-depth and iters must be at least 1");
        }
        if self.events {
            tracing::info!("-e: completion events are not used; polling the CQ");
        }
        Ok(())
    }
}

/// How a side reaches its peer for the exchange.
#[derive(Debug)]
pub enum Role {
    /// Wait for the client on this socket.
    Server(TcpListener),
    /// Connect to the server at this host and TCP port.
    Client(String, u16),
}

impl Role {
    /// True for [`Role::Client`].
    pub fn is_client(&self) -> bool {
        matches!(self, Role::Client(..))
    }

    /// True when this side is the one `stock` names.
    pub fn is(&self, stock: Option<Side>) -> bool {
        match stock {
            Some(Side::Client) => self.is_client(),
            Some(Side::Server) => !self.is_client(),
            None => false,
        }
    }
}

/// One side of a run, for the tools' hidden `--emulate-stock SIDE` option:
/// in `--loopback` runs that side handles its buffers exactly as the stock
/// example does (one buffer for sends and receives, its fill byte, no
/// checks), so that the other side's checks meet the stock tool's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    /// The server.
    Server,
    /// The client.
    Client,
}

/// `pp_client_exch_dest`: connects to `host:port`, writes `me` (one
/// message each), reads as many messages back and writes `"done"`. Every
/// read waits at most `timeout`.
///
/// Errors: `Couldn't connect to HOST:PORT`, `Couldn't send local address`,
/// `Couldn't read/write remote address`, or a message [`Dest::from_msg`]
/// refuses.
pub fn client_exchange(host: &str, port: u16, me: &[Dest], timeout: Duration) -> Result<Vec<Dest>> {
    let addrs = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("{host}:{port}"))?;
    let mut sock = addrs
        .into_iter()
        .find_map(|a| TcpStream::connect(a).ok())
        .ok_or_else(|| anyhow!("Couldn't connect to {host}:{port}"))?;
    sock.set_read_timeout(Some(timeout))?;
    for d in me {
        sock.write_all(&d.to_msg())
            .context("Couldn't send local address")?;
    }
    let rem = read_dests(&mut sock, me.len()).context("Couldn't read/write remote address")?;
    sock.write_all(b"done\0")
        .context("Couldn't read/write remote address")?;
    Ok(rem)
}

/// `pp_server_exch_dest`: accepts one connection on `listener` (and closes
/// the listener), reads as many messages as `me` holds, runs `connect` on
/// them (the examples connect their QPs before answering), writes `me` and
/// reads `"done"`. Every read waits at most `timeout`; the accept waits for
/// a client as long as it takes, as the examples do.
///
/// Errors: `accept() failed`, `Couldn't read remote address`, `Couldn't
/// connect to remote QP` (with `connect`'s error), `Couldn't send/recv
/// local address`, or a message [`Dest::from_msg`] refuses.
pub fn server_exchange(
    listener: TcpListener,
    me: &[Dest],
    timeout: Duration,
    connect: impl FnOnce(&[Dest]) -> Result<()>,
) -> Result<Vec<Dest>> {
    let (mut sock, _) = listener.accept().context("accept() failed")?;
    drop(listener);
    sock.set_read_timeout(Some(timeout))?;
    let rem = read_dests(&mut sock, me.len()).context("Couldn't read remote address")?;
    connect(&rem).context("Couldn't connect to remote QP")?;
    for d in me {
        sock.write_all(&d.to_msg())
            .context("Couldn't send/recv local address")?;
    }
    let mut done = [0u8; 5];
    sock.read_exact(&mut done)
        .context("Couldn't send/recv local address")?;
    if &done != b"done\0" {
        bail!("Couldn't send/recv local address: got {done:?} instead of \"done\"");
    }
    Ok(rem)
}

/// Reads `n` exchange messages.
fn read_dests(sock: &mut TcpStream, n: usize) -> Result<Vec<Dest>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut msg = [0u8; RC_MSG_LEN];
        sock.read_exact(&mut msg)?;
        out.push(Dest::from_msg(&msg)?);
    }
    Ok(out)
}

/// The system page size (`sysconf(_SC_PAGESIZE)`; 4096 if that fails):
/// the unit of `--chk`'s page starts.
pub fn system_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(ps)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// Writes the bytes of pattern `n` into `buf`: a splitmix64 stream unique
/// to `n`, with [`CHK_BYTE`] at every page start so that a stock server's
/// `--chk` passes.
pub fn fill_pattern(n: u32, buf: &mut [u8], page: usize) {
    for (w, chunk) in buf.chunks_mut(8).enumerate() {
        // splitmix64 of (message, word)
        let mut z = (u64::from(n) << 40 ^ w as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
    for b in buf.iter_mut().step_by(page.max(1)) {
        *b = CHK_BYTE;
    }
}

/// Whether `m` is what a stock example sends: its buffer's `fill`, and
/// [`CHK_BYTE`] (with `--chk`) or `fill` at page starts.
pub fn is_stock_data(m: &[u8], page: usize, fill: u8) -> bool {
    m.iter()
        .enumerate()
        .all(|(i, &b)| b == fill || (i % page.max(1) == 0 && b == CHK_BYTE))
}

/// What a server has learnt its client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerData {
    Unknown,
    Pattern,
    Stock,
}

/// Checks received messages (see the module documentation).
#[derive(Debug)]
pub struct Verifier {
    client: bool,
    page: usize,
    stock: &'static str,
    stock_fill: u8,
    constant: bool,
    peer: PeerData,
    expected: Vec<u8>,
    verified: u64,
}

impl Verifier {
    /// A verifier for messages of `size` bytes. `client`: this side sent
    /// the patterns and accepts only their echo. `stock` names the stock
    /// example (in errors) and `stock_fill` is the byte its buffer holds.
    /// `constant`: every message carries pattern 0 (srq_pingpong, whose
    /// server echoes from one buffer shared by all its QPs); otherwise
    /// message `n` carries pattern `n`.
    pub fn new(
        client: bool,
        size: usize,
        page: usize,
        stock: &'static str,
        stock_fill: u8,
        constant: bool,
    ) -> Self {
        Verifier {
            client,
            page,
            stock,
            stock_fill,
            constant,
            peer: PeerData::Unknown,
            expected: vec![0; size],
            verified: 0,
        }
    }

    /// The pattern index of message `n`.
    pub fn pattern_of(&self, n: u32) -> u32 {
        if self.constant {
            0
        } else {
            n
        }
    }

    /// Messages verified so far.
    pub fn verified(&self) -> u64 {
        self.verified
    }

    /// Prints `data verified: N messages` (tagged with `tag`) and returns N.
    pub fn conclude(&self, tag: &str) -> u64 {
        say(
            tag,
            format_args!("data verified: {} messages", self.verified),
        );
        self.verified
    }

    /// Checks message `n` (0-based): its payload length `byte_len` and the
    /// `got` bytes.
    ///
    /// Errors: a length other than the message size, or bytes that are
    /// neither the expected pattern nor (server only, consistently) the
    /// stock example's data; the error names the first differing byte.
    pub fn check(&mut self, n: u32, byte_len: u32, got: &[u8]) -> Result<()> {
        if byte_len as usize != self.expected.len() || got.len() != self.expected.len() {
            bail!(
                "message {n}: received {byte_len} bytes, expected {}",
                self.expected.len()
            );
        }
        fill_pattern(self.pattern_of(n), &mut self.expected, self.page);
        let pattern = got == self.expected;
        let stock = || is_stock_data(got, self.page, self.stock_fill);
        let ok = match (self.client, self.peer) {
            (true, _) | (false, PeerData::Pattern) => pattern,
            (false, PeerData::Stock) => stock(),
            (false, PeerData::Unknown) => {
                if pattern {
                    self.peer = PeerData::Pattern;
                } else if stock() {
                    self.peer = PeerData::Stock;
                }
                self.peer != PeerData::Unknown
            }
        };
        if !ok {
            let i = got
                .iter()
                .zip(&self.expected)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let hint = if self.client {
                " (the server echoes what it received)".to_string()
            } else {
                format!(" or {}'s {:#04x}", self.stock, self.stock_fill)
            };
            bail!(
                "data mismatch in message {n}: byte {i} is {:#04x}, expected {:#04x}{hint}",
                got[i],
                self.expected[i],
            );
        }
        self.verified += 1;
        Ok(())
    }
}

/// rc_pingpong's and ud_pingpong's receives: `depth` work requests with
/// ID [`RECV_WRID`], all on the same buffer, topped up to `depth` when at
/// most one is left (`pp_post_recv` and its use in the poll loop).
#[derive(Debug)]
pub struct Receives {
    sge: Sge,
    depth: u32,
    outstanding: u32,
}

impl Receives {
    /// Posts `depth` receives of `sge` on `qp`.
    ///
    /// Errors: `Couldn't post receive (N)` when only N could be posted.
    pub fn post(qp: &mut Qp, sge: Sge, depth: u32) -> Result<Receives> {
        let mut r = Receives {
            sge,
            depth,
            outstanding: 0,
        };
        r.top_up(qp)?;
        Ok(r)
    }

    /// Counts one completed receive and tops up when at most one is left.
    ///
    /// Errors: as [`Receives::post`].
    pub fn consumed(&mut self, qp: &mut Qp) -> Result<()> {
        self.outstanding = self.outstanding.saturating_sub(1);
        if self.outstanding <= 1 {
            self.top_up(qp)?;
        }
        Ok(())
    }

    fn top_up(&mut self, qp: &mut Qp) -> Result<()> {
        while self.outstanding < self.depth {
            let wr = RecvWr {
                wr_id: RECV_WRID,
                sg_list: std::slice::from_ref(&self.sge),
            };
            if qp.post_recv(&wr).is_err() {
                bail!("Couldn't post receive ({})", self.outstanding);
            }
            self.outstanding += 1;
        }
        Ok(())
    }
}

/// The server side of `--chk`: prints `invalid data in page N` for every
/// page of `buf` whose first byte is not [`CHK_BYTE`], as the examples do.
///
/// Errors: when any page was invalid.
pub fn check_chk(tag: &str, buf: &[u8], page: usize) -> Result<()> {
    let bad: Vec<usize> = (0..buf.len())
        .step_by(page.max(1))
        .filter(|&i| buf[i] != CHK_BYTE)
        .map(|i| i / page.max(1))
        .collect();
    for p in &bad {
        say(tag, format_args!("invalid data in page {p}"));
    }
    if !bad.is_empty() {
        bail!(
            "--chk: {} of {} pages invalid",
            bad.len(),
            buf.len().div_ceil(page.max(1))
        );
    }
    Ok(())
}

/// The examples' result lines: `"%lld bytes in %.2f seconds = %.2f
/// Mbit/sec"` for `size * iters * 2` bytes and `"%d iters in %.2f seconds
/// = %.2f usec/iter"`.
pub fn report(tag: &str, size: u32, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = u64::from(size) * u64::from(iters) * 2;
    say(
        tag,
        format_args!(
            "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
            bytes,
            usec / 1e6,
            bytes as f64 * 8.0 / usec
        ),
    );
    say(
        tag,
        format_args!(
            "{} iters in {:.2} seconds = {:.2} usec/iter",
            iters,
            usec / 1e6,
            usec / f64::from(iters.max(1))
        ),
    );
}

/// The examples' CQ polling, bounded: [`CqPoller::poll`] waits for
/// completions, and fails on an error completion (as the examples do), when
/// none arrived for the stall bound, or when the device reports
/// `EV_DEVICE_FATAL` (`IBV_EVENT_DEVICE_FATAL`: its host daemon restarted
/// and every object is gone; device spec §5.x.9). While it waits it takes
/// the context's asynchronous events ([`Context::poll_event`]), at most
/// every [`EVENT_CHECK`]: the tools that use it need no other event.
#[derive(Debug)]
pub struct CqPoller {
    pacer: PollPacer,
    last: Instant,
    stall: Duration,
    events_checked: Instant,
}

/// [`CqPoller::poll`]'s error when no completion arrived for the stall
/// bound (find it with `anyhow::Error::downcast_ref`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("no completion for {secs} s ({received} received, {sent} sent)")]
pub struct Stalled {
    /// The stall bound, seconds.
    pub secs: u64,
    /// Messages received so far.
    pub received: u32,
    /// Messages sent so far.
    pub sent: u32,
}

/// [`CqPoller::poll`]'s error for a completion with an error status
/// (find it with `anyhow::Error::downcast_ref`), worded as the rdma-core
/// examples word it: `Failed status STR (N) for wr_id ID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Failed status {status_str} ({status}) for wr_id {}", *wr_id as i32)]
pub struct Failed {
    /// `ibv_wc_status`.
    pub status: u8,
    /// Its name (`ibv_wc_status_str`).
    pub status_str: &'static str,
    /// The work request's `wr_id`.
    pub wr_id: u64,
}

/// `wr_id` of [`probe_peer`]'s SEND.
pub const PROBE_WRID: u64 = 4;

/// After a stall ([`Stalled`]) on an RC QP: is the peer still there? An RC
/// requester learns that its peer is gone only from a SEND it cannot
/// deliver, and a ping-pong side that waits for the peer's reply has none
/// outstanding (its last SEND was acknowledged before the peer died), so
/// it would wait for ever. This posts one signalled zero-length SEND
/// (`wr_id` [`PROBE_WRID`]) and waits for its completion, at most the QP's
/// whole retry budget (4.096 µs × 2^`qp_timeout` × (`retry_cnt` + 1),
/// twice, plus 2 s). Always returns an error to end the run with:
/// `Failed status transport retry counter exceeded (12) for wr_id 4 ...`
/// (the examples' wording) when the peer is gone, or `stall` itself,
/// completed with what the probe found. A live peer receives an empty
/// message it did not expect; the run was failing anyway.
pub fn probe_peer(
    qp: &mut Qp,
    cq: &mut Cq,
    qp_timeout: u8,
    retry_cnt: u8,
    stall: Stalled,
) -> anyhow::Error {
    let wr = vrnic_guest::verbs::SendWr {
        wr_id: PROBE_WRID,
        opcode: vrnic_guest::verbs::WrOpcode::Send,
        send_flags: vrnic_guest::verbs::SEND_SIGNALED,
        ..Default::default()
    };
    if let Err(e) = qp.post_send(&wr) {
        return anyhow!("{stall}; probing the peer failed: {e:#}");
    }
    let ack = Duration::from_nanos(4096u64 << qp_timeout.min(31));
    let bound = ack * 2 * (u32::from(retry_cnt) + 1) + Duration::from_secs(2);
    let start = Instant::now();
    let mut pacer = PollPacer::new();
    let mut wc = [WorkCompletion::default(); 4];
    loop {
        let ne = cq.poll(&mut wc);
        if let Some(w) = wc[..ne].iter().find(|w| w.wr_id == PROBE_WRID) {
            return if w.is_success() {
                anyhow!("{stall}; the peer is alive (a probe SEND was acknowledged)")
            } else {
                anyhow!(
                    "Failed status {} ({}) for wr_id {} (a probe SEND after {stall}: the peer stopped answering)",
                    w.status_str(),
                    w.status,
                    w.wr_id as i32
                )
            };
        }
        if ne == 0 && pacer.idle(start, bound) {
            return anyhow!("{stall}; a probe SEND got no completion within {bound:?}");
        }
    }
}

/// How often [`CqPoller::poll`] looks at the asynchronous events while no
/// completion arrives.
pub const EVENT_CHECK: Duration = Duration::from_millis(100);

impl CqPoller {
    /// A poller that gives up after `stall` without a completion.
    pub fn new(stall: Duration) -> Self {
        CqPoller {
            pacer: PollPacer::new(),
            last: Instant::now(),
            stall,
            events_checked: Instant::now(),
        }
    }

    /// Polls `cq` into `wc` until at least one completion arrived and
    /// returns them. `received` and `sent` only go into the errors.
    ///
    /// Errors: `Failed status STATUS (N) for wr_id ID` for the first
    /// completion that is not a success (`ibv_wc_status_str` names, the
    /// examples' wording); [`Stalled`] (`no completion for N s (R
    /// received, S sent)`);
    /// `device lost (IBV_EVENT_DEVICE_FATAL) ...`.
    pub fn poll<'w>(
        &mut self,
        cq: &mut Cq,
        wc: &'w mut [WorkCompletion],
        received: u32,
        sent: u32,
    ) -> Result<&'w [WorkCompletion]> {
        let ne = loop {
            let ne = cq.poll(wc);
            if ne > 0 {
                break ne;
            }
            if self.events_checked.elapsed() >= EVENT_CHECK {
                self.events_checked = Instant::now();
                // Bounded: each event frees one of the event queue's buffers.
                while let Some(ev) = cq.context().poll_event() {
                    if ev.kind == abi::EV_DEVICE_FATAL {
                        bail!(
                            "device lost (IBV_EVENT_DEVICE_FATAL): its host daemon restarted and \
                             every object is gone; open the device again \
                             ({received} received, {sent} sent)"
                        );
                    }
                }
            }
            if self.pacer.idle(self.last, self.stall) {
                return Err(Stalled {
                    secs: self.stall.as_secs(),
                    received,
                    sent,
                }
                .into());
            }
        };
        self.last = Instant::now();
        let wc = &wc[..ne];
        if let Some(w) = wc.iter().find(|w| !w.is_success()) {
            return Err(Failed {
                status: w.status,
                status_str: w.status_str(),
                wr_id: w.wr_id,
            }
            .into());
        }
        Ok(wc)
    }
}

/// A ping-pong tool's `main` after option parsing. `common` finds the
/// shared options in `args`; `run` is one side (`tag` prefixes its lines)
/// and returns how many messages it verified.
///
/// With `--loopback` both sides run in this process ([`run_loopback`] over
/// a link for `path_mtu`, an `ibv_mtu` value; GID index 1 unless `-g`),
/// and each must have verified `iters` messages (`exact`) or at least
/// `iters`. Otherwise `run` drives the PCI device (`--pci`; `-d` is
/// ignored) as the client of the server named on the command line or as
/// the server on TCP port `-p`. Errors are printed as `TOOL: ERROR` and
/// give exit status 1 ([`tools::exit_code`]).
pub fn tool_main<A>(
    tool: &str,
    mut args: A,
    common: fn(&mut A) -> &mut Common,
    path_mtu: u32,
    exact: bool,
    run: fn(&A, Box<dyn Transport>, Role, &str) -> Result<u64>,
) -> ExitCode
where
    A: Clone + Send + 'static,
{
    let c = common(&mut args).clone();
    let r = if c.loopback {
        common(&mut args).for_loopback();
        run_loopback_verified(path_mtu, c.iters, exact, move |t, role, tag| {
            run(&args, t, role, tag)
        })
    } else {
        if let Some(d) = &c.ib_dev {
            tracing::debug!("-d {d}: ignored; the vrnic device is chosen with --pci");
        }
        run_on_pci(
            c.pci.as_deref(),
            c.servername.as_deref(),
            c.port,
            |t, role| run(&args, t, role, "").map(|_| ()),
        )
    };
    tools::exit_code(tool, r)
}

/// Runs `side` on the vrnic PCI function `pci` (or the first one,
/// [`tools::open_pci`]) as the client of `host` at TCP `port`, or without
/// `host` as the server listening on `port` ([`tools::listen`]), in that
/// order: what a tool does without `--loopback`. Errors: opening, listening,
/// and `side`'s.
pub fn run_on_pci<T>(
    pci: Option<&str>,
    host: Option<&str>,
    port: u16,
    side: impl FnOnce(Box<dyn Transport>, Role) -> Result<T>,
) -> Result<T> {
    tools::open_pci(pci).and_then(|t| {
        let role = match host {
            Some(h) => Role::Client(h.to_owned(), port),
            None => Role::Server(tools::listen(port)?),
        };
        side(t, role)
    })
}

/// [`run_loopback`] for sides that return how many messages they
/// verified: each must have verified `iters` (`exact`) or at least `iters`.
///
/// Errors: either side's; a count short of `iters`.
pub fn run_loopback_verified<F>(path_mtu: u32, iters: u32, exact: bool, side: F) -> Result<()>
where
    F: Fn(Box<dyn Transport>, Role, &'static str) -> Result<u64> + Send + Clone + 'static,
{
    let (c, s) = run_loopback(path_mtu, side)?;
    let want = u64::from(iters);
    let ok = |v: u64| if exact { v == want } else { v >= want };
    if !ok(c) || !ok(s) {
        bail!("verified {c} (client) and {s} (server) messages of {iters}");
    }
    Ok(())
}

/// The `--loopback` run: a server (on a thread) and a client, each `side`
/// on one of [`tools::loopback_pair`]'s devices (`path_mtu` an `ibv_mtu`
/// value), exchanging over TCP on localhost; lines are tagged `server: `
/// and `client: `. Returns the client's and the server's results.
///
/// Errors: either side's, prefixed `client`/`server` (both, `; `-separated,
/// when both failed); a panicked server thread.
pub fn run_loopback<T, F>(path_mtu: u32, side: F) -> Result<(T, T)>
where
    T: Send + 'static,
    F: Fn(Box<dyn Transport>, Role, &'static str) -> Result<T> + Send + Clone + 'static,
{
    let (ts, tc) = tools::loopback_pair(path_mtu)?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("Couldn't listen")?;
    let port = listener.local_addr()?.port();
    let server_side = side.clone();
    let server = std::thread::spawn(move || server_side(ts, Role::Server(listener), "server: "));
    let client = side(
        tc,
        Role::Client(Ipv4Addr::LOCALHOST.to_string(), port),
        "client: ",
    );
    if client.is_err() {
        // A client that failed before connecting would leave the server in
        // accept(): connect once so that it sees the end of the stream.
        let _ = TcpStream::connect((Ipv4Addr::LOCALHOST, port));
    }
    let server = server
        .join()
        .map_err(|_| anyhow!("the server thread panicked"))?;
    match (client, server) {
        (Ok(c), Ok(s)) => Ok((c, s)),
        (Err(c), Ok(_)) => Err(c.context("client")),
        (Ok(_), Err(s)) => Err(s.context("server")),
        (Err(c), Err(s)) => Err(anyhow!("client: {c:#}; server: {s:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RC_FILL: u8 = 0x7b;

    /// A loopback device whose event queue reports `EV_DEVICE_FATAL` once
    /// `fatal` is set, as a vrnic daemon restarted under the driver does.
    struct Lost {
        inner: vrnic_guest::loopback::LoopbackTransport,
        fatal: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Transport for Lost {
        fn config(&self) -> abi::ConfigSpace {
            self.inner.config()
        }
        fn command_in(
            &mut self,
            ctx: u16,
            opcode: u16,
            body: &[u8],
            resp: &mut [u8],
        ) -> Result<usize, vrnic_guest::transport::TransportError> {
            self.inner.command_in(ctx, opcode, body, resp)
        }
        fn doorbell(
            &mut self,
            db: &abi::Doorbell,
        ) -> Result<(), vrnic_guest::transport::TransportError> {
            self.inner.doorbell(db)
        }
        fn alloc_dma(
            &mut self,
            len: usize,
            align: usize,
        ) -> Result<vrnic_guest::transport::DmaBuf, vrnic_guest::transport::TransportError>
        {
            self.inner.alloc_dma(len, align)
        }
        fn release_dma(&mut self, buf: vrnic_guest::transport::DmaBuf) {
            self.inner.release_dma(buf)
        }
        fn virt_to_phys(&self, va: usize) -> Result<u64, vrnic_guest::transport::TransportError> {
            self.inner.virt_to_phys(va)
        }
        fn poll_event(&mut self) -> Option<abi::Event> {
            if self.fatal.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Some(abi::Event {
                    kind: abi::EV_DEVICE_FATAL,
                    ..Default::default()
                });
            }
            self.inner.poll_event()
        }
    }

    /// A ping-pong side whose peer died after acknowledging its last SEND
    /// has nothing outstanding; the probe SEND after the stall fails with
    /// RETRY_EXC_ERR, reported in the examples' wording.
    #[test]
    fn a_probe_after_a_stall_finds_a_dead_peer() {
        // Path MTU 1024 bytes (`ibv_mtu` 3).
        let (ta, tb) = tools::loopback_pair(3).unwrap();
        let mut a = tools::open_rc_side(ta, 1, 1, 4096, 0).unwrap();
        let mut b = tools::open_rc_side(tb, 1, 1, 4096, 0).unwrap();
        let (da, db) = (a.me, b.me);
        tools::rc_side_connect(&mut a, 3, 1, &db).unwrap();
        tools::rc_side_connect(&mut b, 3, 1, &da).unwrap();
        drop(a);
        let stall = Stalled {
            secs: 1,
            received: 5,
            sent: 6,
        };
        let t0 = Instant::now();
        let e = probe_peer(
            &mut b.qp,
            &mut b.cq,
            tools::RC_TIMEOUT,
            tools::RC_RETRY_CNT,
            stall,
        )
        .to_string();
        assert!(
            e.starts_with("Failed status transport retry counter exceeded (12) for wr_id 4")
                && e.contains("5 received, 6 sent"),
            "{e}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "after {:?}",
            t0.elapsed()
        );
    }

    /// A program waiting for completions on a device that lost its state
    /// stops with a clear error soon after the fatal event, long before its
    /// stall bound.
    #[test]
    fn the_poller_stops_at_a_device_fatal_event() {
        let (link, _peer) = vrnic::link::MemLink::pair();
        let cfg = vrnic::device::DeviceConfig {
            mac: [2, 0x76, 10, 0, 0, 1],
            ipv4: Ipv4Addr::new(10, 0, 0, 1),
            prefix_len: 24,
            ipv6: Vec::new(),
            link_mtu: 1500,
        };
        let fatal = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let t = Lost {
            inner: vrnic_guest::loopback::LoopbackTransport::new(cfg, Box::new(link)).unwrap(),
            fatal: fatal.clone(),
        };
        let ctx = Context::open(Box::new(t)).unwrap();
        let mut cq = Cq::new(&ctx, 4).unwrap();
        let mut wc = [WorkCompletion::default(); 4];
        let stall = Duration::from_secs(30);
        let mut p = CqPoller::new(stall);
        fatal.store(true, std::sync::atomic::Ordering::SeqCst);
        let t0 = Instant::now();
        let e = p.poll(&mut cq, &mut wc, 3, 4).unwrap_err().to_string();
        assert!(
            e.contains("device lost (IBV_EVENT_DEVICE_FATAL)") && e.contains("3 received, 4 sent"),
            "{e}"
        );
        assert!(t0.elapsed() < stall / 10, "after {:?}", t0.elapsed());
    }

    #[test]
    fn patterns_differ_per_message_and_keep_chk_page_starts() {
        let (mut a, mut b) = (vec![0u8; 9000], vec![0u8; 9000]);
        fill_pattern(0, &mut a, 4096);
        fill_pattern(1, &mut b, 4096);
        assert_ne!(a, b);
        assert_eq!((a[0], a[4096], a[8192]), (0, 0, 0));
        assert!(!is_stock_data(&a, 4096, RC_FILL));
        let mut rc = vec![RC_FILL; 9000];
        assert!(is_stock_data(&rc, 4096, RC_FILL));
        rc[4096] = CHK_BYTE;
        assert!(is_stock_data(&rc, 4096, RC_FILL));
        rc[4097] = CHK_BYTE;
        assert!(!is_stock_data(&rc, 4096, RC_FILL));
        assert!(is_stock_data(&[0; 100], 4096, 0), "srq_pingpong's zeros");
    }

    #[test]
    fn client_accepts_only_the_echo_of_each_message() {
        let mut v = Verifier::new(true, 5000, 4096, "rc_pingpong", RC_FILL, false);
        let mut m = vec![0u8; 5000];
        fill_pattern(0, &mut m, 4096);
        v.check(0, 5000, &m).unwrap();
        assert!(
            v.check(1, 5000, &m).is_err(),
            "a stale buffer is not reply 1"
        );
        fill_pattern(1, &mut m, 4096);
        assert!(v.check(1, 4999, &m).is_err(), "short receive");
        m[4097] ^= 1;
        let e = v.check(1, 5000, &m).unwrap_err().to_string();
        assert!(e.contains("message 1: byte 4097"), "{e}");
        assert!(
            v.check(1, 5000, &[RC_FILL; 5000]).is_err(),
            "rc_pingpong data is no echo"
        );
        assert_eq!(v.verified(), 1);
    }

    #[test]
    fn server_learns_the_client_kind_from_the_first_message_and_holds_it() {
        let mut rc = vec![RC_FILL; 5000];
        rc[0] = CHK_BYTE;
        rc[4096] = CHK_BYTE;
        let mut v = Verifier::new(false, 5000, 4096, "rc_pingpong", RC_FILL, false);
        v.check(0, 5000, &rc).unwrap();
        v.check(1, 5000, &rc).unwrap();
        let mut p = vec![0u8; 5000];
        fill_pattern(2, &mut p, 4096);
        assert!(
            v.check(2, 5000, &p).is_err(),
            "an rc_pingpong client does not switch to patterns"
        );
        rc[17] = 0;
        assert!(v.check(2, 5000, &rc).is_err());
        assert!(
            Verifier::new(false, 5000, 4096, "rc_pingpong", RC_FILL, false)
                .check(0, 5000, &[POISON; 5000])
                .is_err()
        );

        let mut v = Verifier::new(false, 5000, 4096, "rc_pingpong", RC_FILL, false);
        fill_pattern(0, &mut p, 4096);
        v.check(0, 5000, &p).unwrap();
        assert!(v.check(1, 5000, &p).is_err(), "message 1 repeats message 0");
        assert!(
            v.check(1, 5000, &[RC_FILL; 5000]).is_err(),
            "a pattern client does not switch"
        );
        assert_eq!(v.verified(), 1);
    }

    #[test]
    fn a_constant_verifier_expects_pattern_zero_in_every_message() {
        let mut p = vec![0u8; 300];
        fill_pattern(0, &mut p, 4096);
        let mut v = Verifier::new(true, 300, 4096, "srq_pingpong", 0, true);
        for n in 0..3 {
            v.check(n, 300, &p).unwrap();
        }
        let mut s = Verifier::new(false, 300, 4096, "srq_pingpong", 0, true);
        s.check(0, 300, &[0; 300]).unwrap();
        s.check(1, 300, &[0; 300]).unwrap();
        let e = s.check(2, 300, &[POISON; 300]).unwrap_err().to_string();
        assert!(e.contains("srq_pingpong's 0x00"), "{e}");
        assert_eq!(v.verified() + s.verified(), 5);
    }

    #[test]
    fn chk_names_the_pages_whose_first_byte_is_not_zero() {
        let mut buf = vec![0u8; 3 * 4096];
        assert!(check_chk("", &buf, 4096).is_ok());
        buf[4096] = 1;
        let e = check_chk("", &buf, 4096).unwrap_err().to_string();
        assert!(e.contains("1 of 3 pages"), "{e}");
    }
}
