//! What the guest tools (`vrnic-pingpong`, `vrnic-ud-pingpong`,
//! `vrnic-srq-pingpong`, `vrnic-write-imm`, `vrnic-rdma`) share: the
//! `strtoul`-style option parsers, the `ibv_rc_pingpong` out-of-band
//! destination message (rdma-core's libibverbs/examples/pingpong.c and
//! rc_pingpong.c), the bounded line-oriented out-of-band channel ([`Oob`],
//! [`accept_bounded`], [`connect_bounded`]) of `vrnic-write-imm` and
//! `vrnic-rdma`, bounded single completions ([`wait_one`]), opening
//! the device (the PCI function or an in-process loopback pair), RC QP
//! bring-up RESET → INIT → RTR → RTS with rc_pingpong's attributes (also on
//! an SRQ, as srq_pingpong), UD QP bring-up with ud_pingpong's, and the
//! pacing of bounded CQ polls. What only the ping-pong ports share is in
//! [`crate::pingpong`].
//!
//! Errors are [`anyhow::Error`]s whose messages are the tools' own (most
//! follow rc_pingpong's wording, e.g. `Couldn't create QP`): the tools print
//! them as they are, so changing one here changes their output.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use vrnic::abi;

use vrnic_guest::transport::Transport;
use vrnic_guest::verbs::{
    AhAttr, Context, Cq, Gid, Mr, Pd, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RcPath,
    SendWr, Srq, WorkCompletion, ACCESS_LOCAL_WRITE, QP_ATTR_ACCESS_FLAGS, QP_ATTR_PKEY_INDEX,
    QP_ATTR_PORT, QP_ATTR_QKEY, QP_ATTR_SQ_PSN, QP_ATTR_STATE,
};

// ---------------------------------------------------------------------------
// Option parsing
// ---------------------------------------------------------------------------

/// Parses an integer as `strtoul(s, NULL, 0)` does: `0x`/`0X` hex, a
/// leading `0` octal, else decimal; surrounding white space is ignored.
///
/// Errors (as text, for clap's `value_parser`): not a number in its base,
/// or out of `T`'s range.
pub fn parse_c_int<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let t = s.trim();
    let v = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else if t.len() > 1 && t.starts_with('0') {
        u64::from_str_radix(&t[1..], 8)
    } else {
        t.parse::<u64>()
    };
    let v = v.map_err(|e| format!("{s:?}: {e}"))?;
    T::try_from(v).map_err(|_| format!("{s:?}: out of range"))
}

/// Parses a path MTU in bytes (256, 512, 1024, 2048 or 4096, in
/// [`parse_c_int`] syntax) into its `ibv_mtu` value (1 to 5), as
/// rc_pingpong's `pp_mtu_to_enum`. Errors (as text) on any other size.
pub fn parse_mtu(s: &str) -> Result<u32, String> {
    let b: u32 = parse_c_int(s)?;
    match b {
        256 | 512 | 1024 | 2048 | 4096 => Ok(abi::mtu_enum(b).expect("valid MTU")),
        _ => Err(format!(
            "{b}: path MTU is one of 256, 512, 1024, 2048, 4096"
        )),
    }
}

/// Parses a positive count (`strtoul` syntax, as [`parse_c_int`]).
///
/// Errors (as text, for clap): not a number, out of range, or 0.
pub fn parse_positive(s: &str) -> Result<u32, String> {
    match parse_c_int::<u32>(s)? {
        0 => Err("must be at least 1".into()),
        v => Ok(v),
    }
}

/// The options `vrnic-write-imm` and `vrnic-rdma` share (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone)]
pub struct RcToolArgs {
    /// Path MTU, bytes (256, 512, 1024, 2048 or 4096).
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = parse_mtu)]
    pub mtu: u32,
    /// Local GID index (1 is the IPv4-mapped RoCEv2 GID).
    #[arg(short = 'g', long = "gid-idx", default_value = "1", value_parser = parse_c_int::<u8>)]
    pub gid_idx: u8,
    /// PCI address of the vrnic device (e.g. 0000:00:04.0); default: the first found.
    #[arg(long)]
    pub pci: Option<String>,
    /// Give up on any single wait (accept, connect, TCP read, completion)
    /// longer than this many seconds.
    #[arg(long, default_value = "60", value_parser = parse_positive)]
    pub timeout: u32,
    /// Run both sides in this process over two in-process devices
    /// (10.0.0.1 and 10.0.0.2), tagged `server: ` and `client: `.
    #[arg(long, hide = true)]
    pub loopback: bool,
}

impl RcToolArgs {
    /// The bound of every single wait (`--timeout`).
    pub fn wait(&self) -> Duration {
        Duration::from_secs(self.timeout.into())
    }
}

// ---------------------------------------------------------------------------
// The out-of-band destination message
// ---------------------------------------------------------------------------

/// Size of rc_pingpong's exchange message, bytes: `sizeof
/// "0000:000000:000000:"` plus 32 hex digits of GID, NUL included.
pub const RC_MSG_LEN: usize = 52;

/// One side's QP details as exchanged out of band (rdma-core's
/// `struct pingpong_dest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// Local identifier; 0 on RoCE (rc_pingpong sends it as `%04x`).
    pub lid: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// The first packet sequence number this side sends (24 bits).
    pub psn: u32,
    /// The GID the peer addresses this side at (all zeros without `-g`).
    pub gid: Gid,
}

/// rdma-core's `gid_to_wire_gid`: the GID as four host-order u32 words,
/// each byte-swapped to big-endian and printed as `%08x`: 32 lower-case hex
/// digits, the GID's 16 bytes in order.
pub fn gid_to_wire(gid: &Gid) -> String {
    gid.raw
        .chunks_exact(4)
        .map(|w| format!("{:08x}", u32::from_be_bytes(w.try_into().expect("4 bytes"))))
        .collect()
}

/// rdma-core's `wire_gid_to_gid`, as leniently: the first 32 characters are
/// read as four 8-digit hex words and anything after them is ignored.
///
/// Errors: fewer than 32 characters (`is not 32 hex digits`) or a word
/// that is not hex.
pub fn wire_to_gid(s: &str) -> Result<Gid> {
    let mut raw = [0u8; 16];
    for (i, w) in raw.chunks_exact_mut(4).enumerate() {
        let hex = s
            .get(i * 8..i * 8 + 8)
            .ok_or_else(|| anyhow!("GID {s:?} is not 32 hex digits"))?;
        let v = u32::from_str_radix(hex, 16).map_err(|e| anyhow!("GID {s:?}: {e}"))?;
        w.copy_from_slice(&v.to_be_bytes());
    }
    Ok(Gid { raw })
}

impl Dest {
    /// The message text `LID:QPN:PSN:GID`, as rc_pingpong's
    /// `"%04x:%06x:%06x:%s"` with the GID in [`gid_to_wire`] form (51
    /// characters for 16-bit LIDs and 24-bit QPN and PSN).
    pub fn wire(&self) -> String {
        format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            gid_to_wire(&self.gid)
        )
    }

    /// rc_pingpong's `LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s`, the tail
    /// of its `local address:`/`remote address:` lines (GID as text).
    pub fn describe(&self) -> String {
        format!(
            "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid, self.qpn, self.psn, self.gid
        )
    }

    /// The [`RC_MSG_LEN`]-byte exchange message: [`Dest::wire`] cut to 51
    /// bytes and NUL-padded, as `sprintf` into `char msg[52]` leaves it.
    pub fn to_msg(self) -> [u8; RC_MSG_LEN] {
        let s = self.wire();
        let mut m = [0u8; RC_MSG_LEN];
        let n = s.len().min(RC_MSG_LEN - 1);
        m[..n].copy_from_slice(&s.as_bytes()[..n]);
        m
    }

    /// Parses an exchange message (up to its first NUL) as
    /// `sscanf(msg, "%x:%x:%x:%s")` then `wire_gid_to_gid` do.
    ///
    /// Errors: not UTF-8, fewer than four `:`-separated fields, a field
    /// that is not hex or over 32 bits, or a GID [`wire_to_gid`] refuses.
    pub fn from_msg(m: &[u8]) -> Result<Dest> {
        let end = m.iter().position(|&b| b == 0).unwrap_or(m.len());
        let s =
            std::str::from_utf8(&m[..end]).map_err(|_| anyhow!("exchange message is not text"))?;
        let f: Vec<&str> = s.splitn(4, ':').collect();
        let [lid, qpn, psn, gid] = f[..] else {
            bail!("malformed exchange message {s:?}");
        };
        let hex = |x: &str| {
            u32::from_str_radix(x, 16).map_err(|e| anyhow!("exchange message {s:?}: {e}"))
        };
        Ok(Dest {
            lid: hex(lid)?,
            qpn: hex(qpn)?,
            psn: hex(psn)?,
            gid: wire_to_gid(gid)?,
        })
    }
}

/// A random 24-bit PSN (rc_pingpong: `lrand48() & 0xffffff`), from
/// `getrandom(2)`, or from the clock and PID when that fails.
pub fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 4 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        b = (t.subsec_nanos() ^ std::process::id().rotate_left(16)).to_le_bytes();
    }
    u32::from_le_bytes(b) & 0xff_ffff
}

// ---------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------

/// Opens the vrnic PCI function at `bdf` (e.g. `0000:00:04.0`), or the
/// first one found, directly; when a guest agent serves it (the function
/// is taken and the agent's socket answers), through the agent, beside
/// the programs it serves (`vrnic_guest::agent`). Errors: `No vrnic device
/// found`, with the cause.
pub fn open_pci(bdf: Option<&str>) -> Result<Box<dyn Transport>> {
    match vrnic_guest::pci::PciTransport::open(bdf) {
        Ok(t) => Ok(Box::new(t)),
        Err(e) => {
            let sock = vrnic_guest::agent::default_socket(bdf);
            match vrnic_guest::agent::client::AgentTransport::connect(&sock) {
                Ok(t) => Ok(Box::new(t)),
                Err(_) => Err(anyhow::Error::new(e).context("No vrnic device found")),
            }
        }
    }
}

/// Two in-process devices joined by a memory link, for the tools'
/// `--loopback` runs: the server's at 10.0.0.1 and the client's at
/// 10.0.0.2 (MAC `02:00:00:00:00:0n`, /24), with a link MTU of 9000 bytes
/// when `path_mtu` (an `ibv_mtu` value) is above 1024 bytes, else 1500.
pub fn loopback_pair(path_mtu: u32) -> Result<(Box<dyn Transport>, Box<dyn Transport>)> {
    use vrnic::device::DeviceConfig;
    use vrnic_guest::loopback::LoopbackTransport;
    let link_mtu = if abi::mtu_bytes(path_mtu).unwrap_or(1024) > 1024 {
        9000
    } else {
        1500
    };
    let cfg = |n: u8| DeviceConfig {
        mac: [2, 0, 0, 0, 0, n],
        ipv4: Ipv4Addr::new(10, 0, 0, n),
        prefix_len: 24,
        ipv6: Vec::new(),
        link_mtu,
    };
    let (la, lb) = vrnic::link::mem::MemLink::pair();
    let ts: Box<dyn Transport> = Box::new(LoopbackTransport::new(cfg(1), Box::new(la))?);
    let tc: Box<dyn Transport> = Box::new(LoopbackTransport::new(cfg(2), Box::new(lb))?);
    Ok((ts, tc))
}

/// The server's listening socket: TCP `port` on all IPv6 (and, dual-stack,
/// IPv4) addresses, else on all IPv4 addresses. Errors: `Couldn't listen
/// to port N`.
pub fn listen(port: u16) -> Result<TcpListener> {
    TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .with_context(|| format!("Couldn't listen to port {port}"))
}

// ---------------------------------------------------------------------------
// QP bring-up
// ---------------------------------------------------------------------------

/// `ibv_port_attr.link_layer` of a RoCE (Ethernet) port.
pub const LINK_LAYER_ETHERNET: u32 = 2;

/// Creates an RC QP on `cq` (send and receive) with rc_pingpong's
/// capabilities (1 send WR, `max_recv_wr` receive WRs, 1 SGE each, no
/// inline data requested, only signalled sends completing) and moves it
/// RESET → INIT with P_Key index 0, `port` and `access` (`ACCESS_*` remote
/// access flags; rc_pingpong's `pp_init_ctx` uses 0).
///
/// Errors: `Couldn't create QP`, `Failed to modify QP to INIT`.
pub fn rc_qp_init(pd: &Pd, cq: &Cq, max_recv_wr: u32, port: u8, access: u32) -> Result<Qp> {
    rc_qp_init_srq(pd, cq, None, max_recv_wr, port, access)
}

/// [`rc_qp_init`] for a QP that takes its receives from `srq` when one is
/// given (srq_pingpong's QPs: `max_recv_wr` is then ignored).
///
/// Errors: `Couldn't create QP`, `Failed to modify QP to INIT`.
pub fn rc_qp_init_srq(
    pd: &Pd,
    cq: &Cq,
    srq: Option<&Srq>,
    max_recv_wr: u32,
    port: u8,
    access: u32,
) -> Result<Qp> {
    let attr = QpAttr {
        qp_access_flags: access,
        ..Default::default()
    };
    example_qp_init(
        pd,
        cq,
        QpType::Rc,
        srq,
        max_recv_wr,
        port,
        attr,
        QP_ATTR_ACCESS_FLAGS,
    )
}

/// The examples' QP: `qp_type` on `cq` (send and receive), optionally on
/// `srq`, 1 send WR, `max_recv_wr` receive WRs, 1 SGE each, no inline data
/// requested, only signalled sends completing; moved RESET → INIT with
/// P_Key index 0, `port` and the fields of `attr` named by `mask`.
#[allow(clippy::too_many_arguments)]
fn example_qp_init(
    pd: &Pd,
    cq: &Cq,
    qp_type: QpType,
    srq: Option<&Srq>,
    max_recv_wr: u32,
    port: u8,
    attr: QpAttr,
    mask: u32,
) -> Result<Qp> {
    let init = QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        srq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    let mut qp = Qp::new(pd, &init).context("Couldn't create QP")?;
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: port,
        ..attr
    };
    qp.modify(
        &attr,
        QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | mask,
    )
    .context("Failed to modify QP to INIT")?;
    Ok(qp)
}

/// The local ACK timeout rc_pingpong gives its QP: 4.096 µs × 2^14 ≈ 67 ms
/// (`ibv_modify_qp(3)` `timeout`).
pub const RC_TIMEOUT: u8 = 14;
/// `retry_cnt` of the RC QPs the tools connect (as the stock examples).
pub const RC_RETRY_CNT: u8 = 7;

/// rc_pingpong's `pp_connect_ctx`: moves `qp` INIT → RTR towards `rem`
/// (`path_mtu` an `ibv_mtu` value, address vector `ah`, `max_dest_rd_atomic`
/// 1, `min_rnr_timer` 12) → RTS (local ACK `timeout`, rc_pingpong's is
/// [`RC_TIMEOUT`]; `retry_cnt` 7, `rnr_retry` 7, `max_rd_atomic` 1, send
/// PSN `my_psn`).
///
/// Errors: `Failed to modify QP to RTR`, `Failed to modify QP to RTS`.
pub fn rc_qp_connect(
    qp: &mut Qp,
    path_mtu: u32,
    ah: AhAttr,
    my_psn: u32,
    rem: &Dest,
    timeout: u8,
) -> Result<()> {
    let path = RcPath {
        ah,
        timeout,
        retry_cnt: RC_RETRY_CNT,
        ..RcPath::new(ah.dgid, ah.sgid_index, rem.qpn, rem.psn, my_psn, path_mtu)
    };
    qp.modify_to_rtr(&path)
        .context("Failed to modify QP to RTR")?;
    qp.modify_to_rts(&path)
        .context("Failed to modify QP to RTS")?;
    Ok(())
}

/// Hop limit (IP TTL) of the GRH the tools' RC QPs send with.
pub const HOP_LIMIT: u8 = 64;

/// The device objects of one side of a one-QP RC tool (`vrnic-write-imm`,
/// `vrnic-rdma`): a CQ of 4 entries, an RC QP in INIT on it, one MR, and
/// the QP's details for the peer (`me`, with a random PSN and the GID at
/// the chosen index).
pub struct RcSide {
    /// Send and receive CQ of [`RcSide::qp`].
    pub cq: Cq,
    /// The RC QP, in INIT until [`rc_side_connect`].
    pub qp: Qp,
    /// The side's only MR, `Mr::alloc`ated.
    pub mr: Mr<'static>,
    /// What the peer needs: LID 0, QPN, initial send PSN, GID.
    pub me: Dest,
    // Dropped last: every object above keeps it alive anyway.
    _pd: Pd,
}

/// Opens the device behind `transport` and creates an [`RcSide`]: the PD,
/// an MR of `mr_len` bytes with access `ACCESS_LOCAL_WRITE | remote`, a CQ,
/// and an RC QP in INIT on port `port` accepting the remote operations
/// `remote` (`ACCESS_REMOTE_*`); reads the GID at `gid_idx`.
///
/// Errors: rc_pingpong's (`Couldn't get context`, `Couldn't allocate PD`,
/// `Couldn't register MR`, `Couldn't create CQ`, `Couldn't create QP`, ...),
/// a port that is not RoCE, an empty GID at `gid_idx`.
pub fn open_rc_side(
    transport: Box<dyn Transport>,
    port: u8,
    gid_idx: u8,
    mr_len: usize,
    remote: u32,
) -> Result<RcSide> {
    let ctx = Context::open(transport).context("Couldn't get context")?;
    let pd = Pd::alloc(&ctx).context("Couldn't allocate PD")?;
    let mr = Mr::alloc(&pd, mr_len, ACCESS_LOCAL_WRITE | remote).context("Couldn't register MR")?;
    let cq = Cq::new(&ctx, 4).context("Couldn't create CQ")?;
    let qp = rc_qp_init(&pd, &cq, 1, port, remote)?;
    let attr = ctx.query_port(port).context("Couldn't get port info")?;
    ensure!(
        attr.link_layer == LINK_LAYER_ETHERNET,
        "port {port} is not a RoCE (Ethernet) port"
    );
    let gid = ctx
        .query_gid(port, gid_idx.into())
        .with_context(|| format!("can't read sgid of index {gid_idx}"))?;
    ensure!(
        gid.interface_id() != 0,
        "GID index {gid_idx} is empty: RoCE needs a GID (-g)"
    );
    let me = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid,
    };
    Ok(RcSide {
        cq,
        qp,
        mr,
        me,
        _pd: pd,
    })
}

/// [`rc_qp_connect`] for an [`RcSide`]'s QP towards `rem`, through a GRH
/// from the GID at `gid_idx` (hop limit [`HOP_LIMIT`]).
///
/// Errors: the peer's GID is empty; `Couldn't connect to remote QP` with
/// the cause.
pub fn rc_side_connect(side: &mut RcSide, path_mtu: u32, gid_idx: u8, rem: &Dest) -> Result<()> {
    ensure!(
        rem.gid.interface_id() != 0,
        "the peer's GID {} is empty: RoCE needs a GID (-g)",
        rem.gid
    );
    let ah = AhAttr {
        is_global: true,
        hop_limit: HOP_LIMIT,
        dgid: rem.gid,
        sgid_index: gid_idx,
        ..Default::default()
    };
    rc_qp_connect(&mut side.qp, path_mtu, ah, side.me.psn, rem, RC_TIMEOUT)
        .context("Couldn't connect to remote QP")
}

/// Prints a side's QP details as `ibv_rc_pingpong` does (`which` is
/// `"local address: "` or `"remote address:"`).
pub fn say_dest(tag: &str, which: &str, d: &Dest) {
    say(tag, format_args!("  {which} {}", d.describe()));
}

/// ud_pingpong's Q_Key (`0x11111111`), on its QP and in its sends.
pub const UD_PINGPONG_QKEY: u32 = 0x1111_1111;

/// Creates a UD QP on `cq` (send and receive) with ud_pingpong's
/// capabilities (1 send WR, `max_recv_wr` receive WRs, 1 SGE each, no
/// inline data requested, only signalled sends completing) and moves it
/// RESET → INIT with P_Key index 0, `port` and `qkey` (`ibv_modify_qp(3)`:
/// `STATE | PKEY_INDEX | PORT | QKEY`).
///
/// Errors: `Couldn't create QP`, `Failed to modify QP to INIT`.
pub fn ud_qp_init(pd: &Pd, cq: &Cq, max_recv_wr: u32, port: u8, qkey: u32) -> Result<Qp> {
    let attr = QpAttr {
        qkey,
        ..Default::default()
    };
    example_qp_init(
        pd,
        cq,
        QpType::Ud,
        None,
        max_recv_wr,
        port,
        attr,
        QP_ATTR_QKEY,
    )
}

/// ud_pingpong's `pp_connect_ctx` for the QP: INIT → RTR (`STATE` only)
/// → RTS (`STATE | SQ_PSN`, send PSN `my_psn`). A UD QP has no peer; the
/// destination of each send is its address handle.
///
/// Errors: `Failed to modify QP to RTR`, `Failed to modify QP to RTS`.
pub fn ud_qp_rts(qp: &mut Qp, my_psn: u32) -> Result<()> {
    let mut attr = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    qp.modify(&attr, QP_ATTR_STATE)
        .context("Failed to modify QP to RTR")?;
    attr.qp_state = QpState::Rts;
    attr.sq_psn = my_psn;
    qp.modify(&attr, QP_ATTR_STATE | QP_ATTR_SQ_PSN)
        .context("Failed to modify QP to RTS")?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Bounded CQ polling
// ---------------------------------------------------------------------------

/// Paces a CQ poll loop that must give up after a bound: call
/// [`PollPacer::idle`] after every empty poll. It spins (`spin_loop`)
/// 63 times out of 64 and on the 64th checks the bound and yields the CPU,
/// so a busy CQ costs no clock reads.
#[derive(Debug, Default)]
pub struct PollPacer {
    empty: u32,
}

impl PollPacer {
    /// A pacer that has seen no empty poll.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one empty poll; `true` when it is a 64th one and more than
    /// `bound` has passed since `since` (the caller then gives up).
    pub fn idle(&mut self, since: Instant, bound: Duration) -> bool {
        self.empty = self.empty.wrapping_add(1);
        if self.empty.is_multiple_of(64) {
            if since.elapsed() > bound {
                return true;
            }
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        false
    }
}

// ---------------------------------------------------------------------------
// Line-oriented out-of-band connection (vrnic-write-imm, vrnic-rdma)
// ---------------------------------------------------------------------------

/// Longest out-of-band line [`Oob::recv`] accepts, bytes (newline excluded).
pub const OOB_MAX_LINE: usize = 256;

/// A line-oriented TCP connection whose every read is bounded: the
/// out-of-band channel of `vrnic-write-imm` and `vrnic-rdma`. Every message
/// is one line of text ending in `\n`, at most [`OOB_MAX_LINE`] bytes; a
/// line `fail MESSAGE` reports the peer's failure.
#[derive(Debug)]
pub struct Oob {
    sock: TcpStream,
    /// Bytes read beyond the last line returned.
    pending: Vec<u8>,
    wait: Duration,
}

impl Oob {
    /// Wraps a connected socket; every read and write is bounded by `wait`.
    ///
    /// Errors: the socket options cannot be set.
    pub fn new(sock: TcpStream, wait: Duration) -> Result<Oob> {
        sock.set_nodelay(true)?;
        sock.set_write_timeout(Some(wait))?;
        Ok(Oob {
            sock,
            pending: Vec::new(),
            wait,
        })
    }

    /// Sends `line` and its newline.
    ///
    /// Errors: the write fails or takes longer than the bound.
    pub fn send(&mut self, line: &str) -> Result<()> {
        let mut m = Vec::with_capacity(line.len() + 1);
        m.extend_from_slice(line.as_bytes());
        m.push(b'\n');
        self.sock
            .write_all(&m)
            .with_context(|| format!("sending {line:?} to the peer"))
    }

    /// Tells the peer this side failed (best effort: it may be gone).
    pub fn send_fail(&mut self, e: &anyhow::Error) {
        let text: String = format!("{e:#}")
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(OOB_MAX_LINE - 5)
            .collect();
        let _ = self.send(&format!("fail {text}"));
    }

    /// Receives one line (without its newline), waiting at most the
    /// connection's bound; `what` names the expected message in errors. A
    /// `fail ...` line from the peer becomes an error.
    ///
    /// Errors: the bound passes, the peer closes the connection, sends
    /// non-text or a line longer than [`OOB_MAX_LINE`], or sends `fail ...`.
    pub fn recv(&mut self, what: &str) -> Result<String> {
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
                self.pending.len() <= OOB_MAX_LINE,
                "waiting for {what}: the peer sent a line longer than {OOB_MAX_LINE} bytes"
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
    ///
    /// Errors: as [`Oob::recv`], or another line (`protocol error`).
    pub fn expect(&mut self, want: &str) -> Result<()> {
        let got = self.recv(&format!("{want:?}"))?;
        ensure!(
            got == want,
            "protocol error: expected {want:?}, got {got:?}"
        );
        Ok(())
    }
}

/// Accepts one connection on `listener`, waiting at most `wait`.
///
/// Errors: no client within `wait` (`--timeout`), or `poll`/`accept` fails.
pub fn accept_bounded(listener: &TcpListener, wait: Duration) -> Result<TcpStream> {
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
///
/// Errors: `couldn't connect to HOST:PORT within N s (--timeout)`, with
/// the last cause; the name does not resolve.
pub fn connect_bounded(host: &str, port: u16, wait: Duration, retry: bool) -> Result<TcpStream> {
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

/// Runs `session` on the out-of-band connection `sock` (every read and
/// write bounded by `wait`); if it fails, tells the peer (`fail MESSAGE`)
/// so that it stops at once instead of waiting out its bound.
///
/// Errors: the socket cannot be set up, or `session`'s.
pub fn oob_session<T>(
    sock: TcpStream,
    wait: Duration,
    session: impl FnOnce(&mut Oob) -> Result<T>,
) -> Result<T> {
    let mut oob = Oob::new(sock, wait)?;
    let r = session(&mut oob);
    if let Err(e) = &r {
        oob.send_fail(e);
    }
    r
}

/// Posts one signalled send work request `wr` on `qp` and waits at most
/// `wait` for its completion on `cq`, which must be successful, of opcode
/// `want` (`abi::WC_OP_*`) and for `wr.wr_id`; `what` names it in errors.
///
/// Errors: the post fails (`WHAT: couldn't post`), no completion within
/// `wait`, an error completion (named as `ibv_wc_status_str` does), another
/// opcode or wr_id.
pub fn post_send_wait(
    qp: &mut Qp,
    cq: &mut Cq,
    wr: &SendWr<'_>,
    want: u8,
    wait: Duration,
    what: &str,
) -> Result<WorkCompletion> {
    qp.post_send(wr)
        .with_context(|| format!("{what}: couldn't post"))?;
    let w = wait_one(cq, wait, what)?;
    if !w.is_success() {
        return Err(wc_error(what, &w));
    }
    ensure!(
        w.opcode == want && w.wr_id == wr.wr_id,
        "{what}: completion opcode {} wr_id {}, expected opcode {want} wr_id {}",
        w.opcode,
        w.wr_id,
        wr.wr_id
    );
    Ok(w)
}

/// Waits at most `wait` for exactly one completion on `cq`; `what` names
/// it in errors. More than one completion at once is an error.
///
/// Errors: no completion within `wait` (`--timeout`), or two at once.
pub fn wait_one(cq: &mut Cq, wait: Duration, what: &str) -> Result<WorkCompletion> {
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
pub fn wc_error(what: &str, w: &WorkCompletion) -> anyhow::Error {
    anyhow!(
        "{what} failed: status {} ({}), vendor error {:#x}, wr_id {}",
        w.status_str(),
        w.status,
        w.vendor_err,
        w.wr_id
    )
}

/// rdma-core's `wire_gid_to_gid`, strictly: exactly 32 hex digits (the
/// line-oriented messages of `vrnic-write-imm` and `vrnic-rdma`).
///
/// Errors: anything but 32 hex digits.
pub fn wire_to_gid_exact(s: &str) -> Result<Gid> {
    ensure!(
        s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        "GID {s:?} is not 32 hex digits"
    );
    wire_to_gid(s)
}

/// Parses field `name` (hex digits, at most `bits` bits) of message `line`.
///
/// Errors: not hex, or too large; the message names the field and the line.
pub fn hex_field(line: &str, name: &str, s: &str, bits: u32) -> Result<u64> {
    let v = u64::from_str_radix(s, 16).map_err(|e| anyhow!("{name} in {line:?}: {e}"))?;
    ensure!(
        bits >= 64 || v >> bits == 0,
        "{name} in {line:?} exceeds {bits} bits"
    );
    Ok(v)
}

/// Parses the first four fields of a line-oriented address message,
/// `LID:QPN:PSN:GID` (`%04x:%06x:%06x:` and 32 hex digits), strictly: each
/// field within its width. `line` is the whole message, for errors.
///
/// Errors: fewer than four fields, or a field [`hex_field`] or
/// [`wire_to_gid_exact`] refuses.
pub fn parse_dest_fields(line: &str, f: &[&str]) -> Result<Dest> {
    let [lid, qpn, psn, gid, ..] = f else {
        bail!("malformed address message {line:?}: {} fields", f.len());
    };
    Ok(Dest {
        lid: hex_field(line, "LID", lid, 16)? as u32,
        qpn: hex_field(line, "QPN", qpn, 24)? as u32,
        psn: hex_field(line, "PSN", psn, 24)? as u32,
        gid: wire_to_gid_exact(gid).with_context(|| format!("address message {line:?}"))?,
    })
}

// ---------------------------------------------------------------------------
// Process plumbing
// ---------------------------------------------------------------------------

/// Logs `tracing` events to stderr, filtered by `RUST_LOG`.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
}

/// Prints a line to stdout, prefixed with `tag` (the side, `"server: "` or
/// `"client: "`, in `--loopback` runs; empty otherwise).
pub fn say(tag: &str, line: std::fmt::Arguments<'_>) {
    println!("{tag}{line}");
}

/// The first fault [`guard_fault`] finds in a buffer meant to hold a
/// target between guard bytes; offsets are bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardFault {
    /// The leading guard's byte at offset `at` of the buffer is `byte`.
    Before {
        /// Offset in the buffer (the guard starts at 0).
        at: usize,
        /// The byte found.
        byte: u8,
    },
    /// The target's byte at offset `at` of the target is `got`, not `want`;
    /// `bad` of its bytes differ in all.
    Data {
        /// Offset in the target.
        at: usize,
        /// The byte found.
        got: u8,
        /// The byte expected.
        want: u8,
        /// How many target bytes differ.
        bad: usize,
    },
    /// The trailing guard's byte `at` bytes after the target is `byte`.
    After {
        /// Offset after the target's end.
        at: usize,
        /// The byte found.
        byte: u8,
    },
}

/// Checks `buf` after an RDMA operation wrote `expected` at offset `guard`:
/// the `guard` bytes before the target and every byte of `buf` after it
/// must be `fill`, the target must equal `expected`. Returns the first
/// fault, in that order (`vrnic-rdma`, `vrnic-write-imm`); the caller
/// checked that `buf` holds at least `guard + expected.len()` bytes.
pub fn guard_fault(buf: &[u8], guard: usize, fill: u8, expected: &[u8]) -> Option<GuardFault> {
    let end = guard + expected.len();
    if let Some(at) = buf[..guard].iter().position(|&b| b != fill) {
        return Some(GuardFault::Before { at, byte: buf[at] });
    }
    let target = &buf[guard..end];
    if let Some(at) = target.iter().zip(expected).position(|(a, b)| a != b) {
        let bad = target.iter().zip(expected).filter(|(a, b)| a != b).count();
        return Some(GuardFault::Data {
            at,
            got: target[at],
            want: expected[at],
            bad,
        });
    }
    let at = buf[end..].iter().position(|&b| b != fill)?;
    Some(GuardFault::After {
        at,
        byte: buf[end + at],
    })
}

/// A tool's exit status: success, or status 1 after printing
/// `TOOL: ERROR` (the error with its causes) to stderr.
pub fn exit_code(tool: &str, r: Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{tool}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards before and after the target, then the target, each named by
    /// its first bad byte; a clean buffer has no fault.
    #[test]
    fn guard_fault_names_the_first_bad_byte_in_order() {
        let mut buf = [0xa5u8; 4 + 3 + 4];
        buf[4..7].copy_from_slice(&[1, 2, 3]);
        assert_eq!(guard_fault(&buf, 4, 0xa5, &[1, 2, 3]), None);
        assert_eq!(
            guard_fault(&buf, 4, 0xa5, &[1, 9, 9]),
            Some(GuardFault::Data {
                at: 1,
                got: 2,
                want: 9,
                bad: 2
            })
        );
        buf[9] = 0;
        assert_eq!(
            guard_fault(&buf, 4, 0xa5, &[1, 2, 3]),
            Some(GuardFault::After { at: 2, byte: 0 })
        );
        buf[1] = 7;
        assert_eq!(
            guard_fault(&buf, 4, 0xa5, &[1, 2, 3]),
            Some(GuardFault::Before { at: 1, byte: 7 })
        );
    }

    #[test]
    fn exchange_message_matches_rc_pingpong_wire_format() {
        let gid = Gid::from(Ipv4Addr::new(10, 0, 0, 2));
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid,
        };
        let m = d.to_msg();
        assert_eq!(
            &m[..51],
            b"0000:000011:abcdef:00000000000000000000ffff0a000002"
        );
        assert_eq!(m[51], 0);
        assert_eq!(Dest::from_msg(&m).unwrap(), d);
        assert!(Dest::from_msg(b"0000:000011\0").is_err());
        assert!(Dest::from_msg(b"0000:000011:abcdef:0000\0").is_err());
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

        peer.write_all(&[b'x'; OOB_MAX_LINE + 2]).unwrap();
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
    fn numbers_parse_like_strtoul_base_0() {
        assert_eq!(parse_c_int::<u32>("4096"), Ok(4096));
        assert_eq!(parse_c_int::<u32>("0x1000"), Ok(4096));
        assert_eq!(parse_c_int::<u32>("010"), Ok(8));
        assert_eq!(parse_c_int::<u32>("0"), Ok(0));
        assert!(parse_c_int::<u8>("256").is_err());
        assert_eq!(parse_mtu("1024"), Ok(3));
        assert!(parse_mtu("1500").is_err());
    }
}
