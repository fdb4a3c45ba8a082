//! `vrnic-pingpong`: rdma-core's `ibv_rc_pingpong` (libibverbs/examples/
//! rc_pingpong.c) over the vrnic verbs library, interoperable with the
//! unmodified tool in either role.
//!
//! Same as `ibv_rc_pingpong`:
//! - the out-of-band exchange: TCP port 18515 (`-p`), the client sends
//!   `"%04x:%06x:%06x:%s"` (LID, QPN, PSN, GID as 32 hex digits in
//!   rdma-core's `gid_to_wire_gid` form) as a 52-byte message with its NUL,
//!   the server connects its QP and answers the same way, the client writes
//!   `"done"` (5 bytes);
//! - a random 24-bit PSN; QP attributes (INIT: pkey 0, port, no remote
//!   access; RTR: `max_dest_rd_atomic` 1, `min_rnr_timer` 12, a GRH with hop
//!   limit 1 when the peer's GID has an interface ID; RTS: `timeout` 14,
//!   `retry_cnt` 7, `rnr_retry` 7, `max_rd_atomic` 1);
//! - one page-aligned buffer for sends and receives, `rx_depth` receives
//!   kept posted, one signalled SEND of `size` bytes per iteration each way
//!   (inline when the QP allows that many inline bytes), the next SEND posted
//!   when both the previous SEND and a receive completed;
//! - output: the `local address:`/`remote address:` lines and
//!   `"%lld bytes in %.2f seconds = %.2f Mbit/sec"`,
//!   `"%d iters in %.2f seconds = %.2f usec/iter"`;
//! - `-c`/`--chk`: the client writes rc_pingpong's check value (0) at the
//!   start of every page of its buffer before the first send, and the server
//!   prints `invalid data in page N` for any page whose first byte is not 0
//!   at the end.
//!
//! Additionally it verifies every message, whatever the peer:
//! - as client it sends message `n` filled with a pattern unique to `n`
//!   (zero at every page start, so `-c` on an rc_pingpong server passes) and
//!   checks that reply `n` equals it: both `ibv_rc_pingpong` and
//!   `vrnic-pingpong` servers echo what they received, since they send from
//!   the buffer they receive into;
//! - as server it checks that message `n` is either this pattern (a
//!   `vrnic-pingpong` client) or what `ibv_rc_pingpong` sends (0x7b, with 0
//!   or 0x7b at page starts), consistently for the whole run;
//! - every receive must carry exactly `size` bytes.
//!
//! It then prints `data verified: N messages`. Any mismatch, error
//! completion (named as `ibv_wc_status_str` names it), `-c` failure or
//! failed step exits with status 1.
//!
//! The device is the vrnic PCI function (`--pci BDF`, default the first
//! found; `-d` is accepted and ignored). `--loopback` runs a server and a
//! client in this process over two in-process devices, for tests.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Parser;
use vrnic_guest::tools::{
    self, parse_c_int, parse_mtu, random_psn, say, Dest, PollPacer, LINK_LAYER_ETHERNET,
    RC_MSG_LEN as MSG_LEN,
};
use vrnic_guest::transport::Transport;
use vrnic_guest::verbs::*;

/// Work request IDs, as rc_pingpong's `PINGPONG_RECV_WRID`/`PINGPONG_SEND_WRID`.
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
/// The byte `ibv_rc_pingpong` fills its buffer with.
const RC_FILL: u8 = 0x7b;
/// What `ibv_rc_pingpong --chk` writes at each page start (`i / page_size % sizeof(char)`).
const RC_CHK: u8 = 0;
/// The fill of a server's buffer before the first message: never sent, and
/// neither rc_pingpong's nor our pattern, so a receive that writes nothing shows.
const SERVER_POISON: u8 = 0xa5;

fn parse_ib_port(s: &str) -> Result<u8, String> {
    let p: u8 = parse_c_int(s)?;
    if p < 1 {
        return Err("port numbers start at 1".into());
    }
    Ok(p)
}

/// Ping-pong SENDs over an RC QP, like ibv_rc_pingpong: without SERVERNAME start
/// a server and wait for a connection, with it connect to the server there.
#[derive(Parser, Debug, Clone)]
#[command(name = "vrnic-pingpong", version)]
struct Args {
    /// Server to connect to; none: be the server.
    servername: Option<String>,
    /// Listen on/connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18515", value_parser = parse_c_int::<u16>)]
    port: u16,
    /// IB device name (accepted for compatibility; the device is chosen by --pci).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Use this port of the device.
    #[arg(short = 'i', long = "ib-port", default_value = "1", value_parser = parse_ib_port)]
    ib_port: u8,
    /// Size of message to exchange, bytes.
    #[arg(short = 's', long = "size", default_value = "4096", value_parser = parse_c_int::<u32>)]
    size: u32,
    /// Path MTU, bytes.
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = parse_mtu)]
    mtu: u32,
    /// Number of receives to post at a time.
    #[arg(short = 'r', long = "rx-depth", default_value = "500", value_parser = parse_c_int::<u32>)]
    rx_depth: u32,
    /// Number of exchanges.
    #[arg(short = 'n', long = "iters", default_value = "1000", value_parser = parse_c_int::<u32>)]
    iters: u32,
    /// Service level value.
    #[arg(short = 'l', long = "sl", default_value = "0", value_parser = parse_c_int::<u8>)]
    sl: u8,
    /// Sleep on CQ events (accepted; vrnic-pingpong always polls).
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Local port GID index (RoCE needs one: 1 is the IPv4-mapped GID).
    #[arg(short = 'g', long = "gid-idx", default_value_t = -1, allow_negative_numbers = true)]
    gid_idx: i32,
    /// Validate the received buffer as ibv_rc_pingpong --chk does.
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// PCI address of the vrnic device (e.g. 0000:00:04.0); default: the first found.
    #[arg(long)]
    pci: Option<String>,
    /// Give up when no completion arrives for this many seconds.
    #[arg(long, default_value_t = 30)]
    stall_timeout: u64,
    /// Run a server and a client in this process over two in-process devices
    /// (10.0.0.1 and 10.0.0.2, GID index 1 unless -g is given).
    #[arg(long, hide = true)]
    loopback: bool,
}

/// How a side reaches its peer for the exchange.
enum Role {
    Server(TcpListener),
    Client(String, u16),
}

/// `pp_client_exch_dest`.
fn client_exchange(host: &str, port: u16, me: Dest, timeout: Duration) -> Result<Dest> {
    let addrs = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("{host}:{port}"))?;
    let mut sock = addrs
        .into_iter()
        .find_map(|a| TcpStream::connect(a).ok())
        .ok_or_else(|| anyhow!("Couldn't connect to {host}:{port}"))?;
    sock.set_read_timeout(Some(timeout))?;
    sock.write_all(&me.to_msg())
        .context("Couldn't send local address")?;
    let mut msg = [0u8; MSG_LEN];
    sock.read_exact(&mut msg)
        .context("Couldn't read/write remote address")?;
    sock.write_all(b"done\0")
        .context("Couldn't read/write remote address")?;
    Dest::from_msg(&msg)
}

/// `pp_server_exch_dest`: connects the QP between reading the client's
/// message and answering, as rc_pingpong does.
fn server_exchange(
    listener: TcpListener,
    me: Dest,
    timeout: Duration,
    connect: impl FnOnce(&Dest) -> Result<()>,
) -> Result<Dest> {
    let (mut sock, _) = listener.accept().context("accept() failed")?;
    drop(listener);
    sock.set_read_timeout(Some(timeout))?;
    let mut msg = [0u8; MSG_LEN];
    sock.read_exact(&mut msg)
        .context("Couldn't read remote address")?;
    let rem = Dest::from_msg(&msg)?;
    connect(&rem).context("Couldn't connect to remote QP")?;
    sock.write_all(&me.to_msg())
        .context("Couldn't send/recv local address")?;
    let mut done = [0u8; 5];
    sock.read_exact(&mut done)
        .context("Couldn't send/recv local address")?;
    if &done != b"done\0" {
        bail!("Couldn't send/recv local address: got {done:?} instead of \"done\"");
    }
    Ok(rem)
}

/// `pp_connect_ctx`: INIT → RTR → RTS with rc_pingpong's attributes.
fn connect_qp(qp: &mut Qp, a: &Args, my_psn: u32, rem: &Dest) -> Result<()> {
    let mut ah = AhAttr {
        sl: a.sl,
        ..Default::default()
    };
    if rem.gid.interface_id() != 0 {
        ah.is_global = true;
        ah.hop_limit = 1;
        ah.dgid = rem.gid;
        // rc_pingpong stores its int gidx in a u8: -1 becomes 255.
        ah.sgid_index = a.gid_idx as u8;
    }
    tools::rc_qp_connect(qp, a.mtu, ah, my_psn, rem)
}

fn system_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let ps = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(ps)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// The bytes of message `n`: a pattern unique to `n`, 0 at every page start.
fn fill_pattern(n: u32, buf: &mut [u8], page: usize) {
    for (w, chunk) in buf.chunks_mut(8).enumerate() {
        // splitmix64 of (message, word)
        let mut z = (u64::from(n) << 40 ^ w as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
    for b in buf.iter_mut().step_by(page) {
        *b = RC_CHK;
    }
}

/// Whether `m` is what `ibv_rc_pingpong` sends: 0x7b, and 0 (with `--chk`)
/// or 0x7b at page starts.
fn is_rc_pingpong_data(m: &[u8], page: usize) -> bool {
    m.iter()
        .enumerate()
        .all(|(i, &b)| b == RC_FILL || (i % page == 0 && b == RC_CHK))
}

/// What the server has learnt its client sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerData {
    Unknown,
    Pattern,
    RcPingpong,
}

/// Checks received messages (see the module documentation).
struct Verifier {
    client: bool,
    page: usize,
    peer: PeerData,
    expected: Vec<u8>,
    verified: u64,
}

impl Verifier {
    fn new(client: bool, size: usize, page: usize) -> Self {
        Verifier {
            client,
            page,
            peer: PeerData::Unknown,
            expected: vec![0; size],
            verified: 0,
        }
    }

    /// Checks message `n` (0-based): its completion's `byte_len` and the
    /// `got` bytes (the buffer after the receive).
    fn check(&mut self, n: u32, byte_len: u32, got: &[u8]) -> Result<()> {
        if byte_len as usize != self.expected.len() {
            bail!(
                "message {n}: received {byte_len} bytes, expected {}",
                self.expected.len()
            );
        }
        fill_pattern(n, &mut self.expected, self.page);
        let pattern = got == self.expected;
        let ok = match (self.client, self.peer) {
            (true, _) | (false, PeerData::Pattern) => pattern,
            (false, PeerData::RcPingpong) => is_rc_pingpong_data(got, self.page),
            (false, PeerData::Unknown) => {
                if pattern {
                    self.peer = PeerData::Pattern;
                } else if is_rc_pingpong_data(got, self.page) {
                    self.peer = PeerData::RcPingpong;
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
            bail!(
                "data mismatch in message {n}: byte {i} is {:#04x}, expected {:#04x}{}",
                got[i],
                self.expected[i],
                if self.client {
                    " (the server echoes what it received)"
                } else {
                    " or rc_pingpong's 0x7b"
                }
            );
        }
        self.verified += 1;
        Ok(())
    }
}

/// What a finished run reports.
struct Outcome {
    verified: u64,
}

/// One side of the ping-pong: `main` of rc_pingpong after option parsing.
fn run(a: &Args, transport: Box<dyn Transport>, role: Role, tag: &str) -> Result<Outcome> {
    let page = system_page_size();
    let size = a.size as usize;
    if size == 0 || a.rx_depth == 0 || a.iters == 0 {
        bail!("size, rx-depth and iters must be at least 1");
    }
    if a.events {
        tracing::info!("-e: completion events are not used; polling the CQ");
    }
    let client = matches!(role, Role::Client(..));
    let stall = Duration::from_secs(a.stall_timeout);

    // pp_init_ctx
    let ctx = Context::open(transport).context("Couldn't get context")?;
    let pd = Pd::alloc(&ctx).context("Couldn't allocate PD")?;
    let mr = Mr::alloc(&pd, size, ACCESS_LOCAL_WRITE).context("Couldn't register MR")?;
    mr.fill(if client { RC_FILL } else { SERVER_POISON });
    let mut cq = Cq::new(&ctx, a.rx_depth + 1).context("Couldn't create CQ")?;
    let mut qp = tools::rc_qp_init(&pd, &cq, a.rx_depth, a.ib_port, 0)?;
    let inline = qp.cap().max_inline_data as usize >= size;

    let recv_sge = [mr.sge(0, size)];
    let post_recv = |qp: &mut Qp, n: u32| -> u32 {
        (0..n)
            .take_while(|_| {
                qp.post_recv(&RecvWr {
                    wr_id: RECV_WRID,
                    sg_list: &recv_sge,
                })
                .is_ok()
            })
            .count() as u32
    };
    let mut routs = post_recv(&mut qp, a.rx_depth);
    if routs < a.rx_depth {
        bail!("Couldn't post receive ({routs})");
    }

    let port = ctx
        .query_port(a.ib_port)
        .context("Couldn't get port info")?;
    if port.link_layer != LINK_LAYER_ETHERNET {
        bail!("Couldn't get local LID");
    }
    let gid = if a.gid_idx >= 0 {
        ctx.query_gid(a.ib_port, a.gid_idx as u32)
            .with_context(|| format!("can't read sgid of index {}", a.gid_idx))?
    } else {
        Gid::default()
    };
    let me = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid,
    };
    say(tag, format_args!("  local address:  {}", me.describe()));

    let rem = match role {
        Role::Client(host, port) => client_exchange(&host, port, me, stall)?,
        Role::Server(listener) => server_exchange(listener, me, stall, |rem| {
            connect_qp(&mut qp, a, me.psn, rem)
        })?,
    };
    say(tag, format_args!("  remote address: {}", rem.describe()));
    if client {
        connect_qp(&mut qp, a, me.psn, &rem)?;
    }

    let mut verifier = Verifier::new(client, size, page);
    let mut received = vec![0u8; size];
    let send_sge = [mr.sge(0, size)];
    let mut inline_buf = vec![0u8; if inline { size } else { 0 }];
    let mut out = vec![0u8; if client { size } else { 0 }];
    // pp_post_send; a client first writes message `n`'s bytes.
    let mut post_send = |qp: &mut Qp, n: u32| -> Result<()> {
        if client {
            fill_pattern(n, &mut out, page);
            mr.write(0, &out);
        }
        let mut wr = SendWr {
            wr_id: SEND_WRID,
            opcode: WrOpcode::Send,
            send_flags: SEND_SIGNALED,
            ..Default::default()
        };
        if inline {
            mr.read(0, &mut inline_buf);
            wr.inline_data = Some(&inline_buf);
        } else {
            wr.sg_list = &send_sge;
        }
        qp.post_send(&wr).context("Couldn't post send")
    };

    let mut pending = RECV_WRID;
    if client {
        post_send(&mut qp, 0)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wc = [WorkCompletion::default(); 2];
    let mut last = Instant::now();
    let mut pacer = PollPacer::new();
    while rcnt < a.iters || scnt < a.iters {
        let ne = cq.poll(&mut wc);
        if ne == 0 {
            if pacer.idle(last, stall) {
                bail!(
                    "no completion for {} s ({rcnt} received, {scnt} sent)",
                    a.stall_timeout
                );
            }
            continue;
        }
        last = Instant::now();
        for w in &wc[..ne] {
            // parse_single_wc
            if !w.is_success() {
                bail!(
                    "Failed status {} ({}) for wr_id {}",
                    w.status_str(),
                    w.status,
                    w.wr_id as i32
                );
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    mr.read(0, &mut received);
                    verifier.check(rcnt, w.byte_len, &received)?;
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recv(&mut qp, a.rx_depth - routs);
                        if routs < a.rx_depth {
                            bail!("Couldn't post receive ({routs})");
                        }
                    }
                    rcnt += 1;
                }
                other => bail!("Completion for unknown wr_id {}", other as i32),
            }
            pending &= !w.wr_id;
            if scnt < a.iters && pending == 0 {
                post_send(&mut qp, scnt)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = size as u64 * u64::from(a.iters) * 2;
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
            a.iters,
            usec / 1e6,
            usec / f64::from(a.iters)
        ),
    );

    if !client && a.chk {
        let buf = mr.to_vec();
        let bad: Vec<usize> = (0..size)
            .step_by(page)
            .filter(|&i| buf[i] != RC_CHK)
            .map(|i| i / page)
            .collect();
        for p in &bad {
            say(tag, format_args!("invalid data in page {p}"));
        }
        if !bad.is_empty() {
            bail!(
                "--chk: {} of {} pages invalid",
                bad.len(),
                size.div_ceil(page)
            );
        }
    }
    say(
        tag,
        format_args!("data verified: {} messages", verifier.verified),
    );
    Ok(Outcome {
        verified: verifier.verified,
    })
}

fn open_pci(a: &Args) -> Result<Box<dyn Transport>> {
    if let Some(d) = &a.ib_dev {
        tracing::debug!("-d {d}: ignored; the vrnic device is chosen with --pci");
    }
    tools::open_pci(a.pci.as_deref())
}

/// `--loopback`: a server thread and a client over two in-process devices.
fn run_loopback(a: &Args) -> Result<()> {
    let mut a = a.clone();
    if a.gid_idx < 0 {
        a.gid_idx = 1;
    }
    let (ts, tc) = tools::loopback_pair(a.mtu)?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("Couldn't listen")?;
    let port = listener.local_addr()?.port();
    let sa = a.clone();
    let server = std::thread::spawn(move || run(&sa, ts, Role::Server(listener), "server: "));
    let client = run(
        &a,
        tc,
        Role::Client(Ipv4Addr::LOCALHOST.to_string(), port),
        "client: ",
    );
    let server = server
        .join()
        .map_err(|_| anyhow!("the server thread panicked"))?;
    let (c, s) = (client.context("client")?, server.context("server")?);
    if c.verified != u64::from(a.iters) || s.verified != u64::from(a.iters) {
        bail!(
            "verified {} (client) and {} (server) of {} messages",
            c.verified,
            s.verified,
            a.iters
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    tools::init_tracing();
    let a = Args::parse();
    let r = if a.loopback {
        run_loopback(&a)
    } else {
        open_pci(&a).and_then(|t| {
            let role = match &a.servername {
                Some(h) => Role::Client(h.clone(), a.port),
                None => Role::Server(tools::listen(a.port)?),
            };
            run(&a, t, role, "").map(|_| ())
        })
    };
    tools::exit_code("vrnic-pingpong", r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_per_message_and_keep_rc_chk_page_starts() {
        let (mut a, mut b) = (vec![0u8; 9000], vec![0u8; 9000]);
        fill_pattern(0, &mut a, 4096);
        fill_pattern(1, &mut b, 4096);
        assert_ne!(a, b);
        assert_eq!((a[0], a[4096], a[8192]), (0, 0, 0));
        assert!(!is_rc_pingpong_data(&a, 4096));
        let mut rc = vec![RC_FILL; 9000];
        assert!(is_rc_pingpong_data(&rc, 4096));
        rc[4096] = RC_CHK;
        assert!(is_rc_pingpong_data(&rc, 4096));
        rc[4097] = RC_CHK;
        assert!(!is_rc_pingpong_data(&rc, 4096));
    }

    #[test]
    fn client_accepts_only_the_echo_of_each_message() {
        let mut v = Verifier::new(true, 5000, 4096);
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
        assert_eq!(v.verified, 1);
    }

    #[test]
    fn server_learns_the_client_kind_from_the_first_message_and_holds_it() {
        let mut rc = vec![RC_FILL; 5000];
        rc[0] = RC_CHK;
        rc[4096] = RC_CHK;
        let mut v = Verifier::new(false, 5000, 4096);
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
        assert!(Verifier::new(false, 5000, 4096)
            .check(0, 5000, &[SERVER_POISON; 5000])
            .is_err());

        let mut v = Verifier::new(false, 5000, 4096);
        fill_pattern(0, &mut p, 4096);
        v.check(0, 5000, &p).unwrap();
        assert!(v.check(1, 5000, &p).is_err(), "message 1 repeats message 0");
        assert!(
            v.check(1, 5000, &[RC_FILL; 5000]).is_err(),
            "a pattern client does not switch"
        );
        assert_eq!(v.verified, 1);
    }
}
