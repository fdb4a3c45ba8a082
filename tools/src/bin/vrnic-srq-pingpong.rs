//! `vrnic-srq-pingpong`: rdma-core's `ibv_srq_pingpong` (libibverbs/
//! examples/srq_pingpong.c) over the vrnic verbs library, interoperable
//! with the unmodified tool in either role.
//!
//! Same as `ibv_srq_pingpong`:
//! - `-q` RC QPs (default 16, fewer than 255 and at most `rx_depth`) that
//!   take their receives from one shared receive queue of `rx_depth` WQEs
//!   (1 SGE), all completing on one CQ of `rx_depth + num_qp` entries;
//! - the out-of-band exchange: TCP port 18515 (`-p`), always 256
//!   (`MAX_QP`) 52-byte `"%04x:%06x:%06x:%s"` messages each way, one per QP
//!   and all-zero ones for the rest; the server connects its QPs before
//!   answering, the client writes `"done"`; QP `i` connects to the peer's
//!   QP `i`, so both sides need the same `-q`;
//! - rc_pingpong's QP attributes (INIT: no remote access; RTR: path MTU
//!   `-m`, `max_dest_rd_atomic` 1, `min_rnr_timer` 12, a GRH with hop limit
//!   1 to the peer's first GID when it has an interface ID; RTS: `timeout`
//!   14, `retry_cnt` 7, `rnr_retry` 7, `max_rd_atomic` 1), a random PSN per
//!   QP;
//! - the client posts one signalled SEND of `size` bytes on every QP, and
//!   each side posts the next SEND on a QP when both its previous SEND and
//!   a receive on it completed; `-n` counts SENDs and receives over all QPs
//!   together (so a QP may see more or fewer than the others);
//! - output: one `local address:` and one `remote address:` line per QP
//!   and the two result lines; `-c`/`--chk`: the server prints `invalid data
//!   in page N` for the last message's pages whose first byte is not 0.
//!
//! Additionally it verifies every message, whatever the peer. The stock
//! tool sends from one zero-filled buffer that all its QPs receive into, so
//! a stock server echoes whatever arrived last on any QP; a vrnic client
//! therefore sends the same pattern (0 at page starts) in every message and
//! checks that every reply equals it, and a vrnic server accepts either
//! that pattern or srq_pingpong's zeros, consistently for the run, and
//! echoes on each QP what arrived on it. Every SRQ receive has its own
//! buffer, refilled with a poison byte before it is posted again, and must
//! complete with exactly `size` bytes on one of this side's QPs.
//!
//! It then prints `data verified: N messages`. Any mismatch, error
//! completion, `-c` failure or failed step exits with status 1.
//! `-o`/`--odp` is refused, as the stock tool refuses it on a device
//! without on-demand paging.
//!
//! The device is the vrnic PCI function (`--pci BDF`, default the first
//! found; `-d` is accepted and ignored). `--loopback` runs a server and a
//! client in this process over two in-process devices, for tests.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use vrnic_guest::transport::Transport;
use vrnic_guest::verbs::*;
use vrnic_tools::pingpong::{
    self, client_exchange, fill_pattern, server_exchange, system_page_size, Common, CqPoller, Role,
    Side, Verifier, POISON, RECV_WRID, SEND_WRID,
};
use vrnic_tools::tools::{
    self, parse_c_int, parse_mtu, random_psn, say, Dest, LINK_LAYER_ETHERNET,
};

/// srq_pingpong's `MAX_QP`: the number of exchange messages each way, and
/// one more than the most QPs.
const MAX_QP: usize = 256;
/// The byte `ibv_srq_pingpong` fills its buffer with.
const SRQ_FILL: u8 = 0;
/// srq_pingpong's GRH hop limit.
const HOP_LIMIT: u8 = 1;
/// Largest memory region the buffers are split into, bytes (DMA memory
/// comes in chunks of at most 2 MiB).
const MR_CHUNK: usize = 1 << 20;

/// Ping-pong SENDs over several RC QPs sharing one SRQ, like ibv_srq_pingpong:
/// without SERVERNAME start a server and wait for a connection, with it
/// connect to the server there.
#[derive(Parser, Debug, Clone)]
#[command(name = "vrnic-srq-pingpong", version)]
struct Args {
    /// The options every ping-pong tool takes.
    #[command(flatten)]
    common: Common,
    /// Size of message to exchange, bytes.
    #[arg(short = 's', long = "size", default_value = "4096", value_parser = parse_c_int::<u32>)]
    size: u32,
    /// Path MTU, bytes.
    #[arg(short = 'm', long = "mtu", default_value = "1024", value_parser = parse_mtu)]
    mtu: u32,
    /// Number of QPs to use.
    #[arg(short = 'q', long = "num-qp", default_value = "16", value_parser = parse_c_int::<u32>)]
    num_qp: u32,
    /// Use on-demand paging (refused: vrnic has no ODP).
    #[arg(short = 'o', long = "odp")]
    odp: bool,
    /// With --loopback: this side handles its buffer as ibv_srq_pingpong
    /// does (one zero-filled buffer for every send and receive of every QP,
    /// no checks).
    #[arg(long, hide = true, value_enum, requires = "loopback")]
    emulate_stock: Option<Side>,
}

/// Fixed-size message buffers in as many memory regions as their total
/// needs (each at most [`MR_CHUNK`] bytes, or one buffer).
struct Buffers {
    mrs: Vec<Mr<'static>>,
    per_mr: usize,
    stride: usize,
    size: usize,
}

impl Buffers {
    /// `count` buffers of `size` bytes, registered for local write.
    fn new(pd: &Pd, count: usize, size: usize) -> Result<Buffers> {
        let stride = size.next_multiple_of(64);
        let per_mr = (MR_CHUNK / stride).max(1);
        let mut mrs = Vec::new();
        let mut left = count;
        while left > 0 {
            let n = left.min(per_mr);
            let mr =
                Mr::alloc(pd, n * stride, ACCESS_LOCAL_WRITE).context("Couldn't register MR")?;
            mrs.push(mr);
            left -= n;
        }
        Ok(Buffers {
            mrs,
            per_mr,
            stride,
            size,
        })
    }

    fn at(&self, i: usize) -> (&Mr<'static>, usize) {
        (&self.mrs[i / self.per_mr], (i % self.per_mr) * self.stride)
    }

    fn sge(&self, i: usize) -> Sge {
        let (mr, off) = self.at(i);
        mr.sge(off, self.size)
    }

    fn read(&self, i: usize, dst: &mut [u8]) {
        let (mr, off) = self.at(i);
        mr.read(off, dst);
    }

    fn write(&self, i: usize, src: &[u8]) {
        let (mr, off) = self.at(i);
        mr.write(off, src);
    }
}

/// srq_pingpong's `pp_connect_ctx`: every QP `i` to the peer's QP `i`.
fn connect_qps(qps: &mut [Qp], a: &Args, me: &[Dest], rem: &[Dest]) -> Result<()> {
    let mut ah = AhAttr {
        sl: a.common.sl,
        port_num: a.common.ib_port,
        ..Default::default()
    };
    // As srq_pingpong: the first peer entry's GID decides for all QPs.
    if rem[0].gid.interface_id() != 0 {
        ah.is_global = true;
        ah.hop_limit = HOP_LIMIT;
        ah.dgid = rem[0].gid;
        // srq_pingpong stores its int gidx in a u8: -1 becomes 255.
        ah.sgid_index = a.common.gid_idx as u8;
    }
    for (i, qp) in qps.iter_mut().enumerate() {
        tools::rc_qp_connect(qp, a.mtu, ah, me[i].psn, &rem[i], a.common.qp_timeout)
            .with_context(|| format!("QP[{i}]"))?;
    }
    Ok(())
}

/// The receive work request ID of SRQ buffer `slot`.
fn recv_wrid(slot: usize) -> u64 {
    (slot as u64) << 8 | RECV_WRID
}

/// One side of the ping-pong: `main` of srq_pingpong after option parsing.
fn run(a: &Args, transport: Box<dyn Transport>, role: Role, tag: &str) -> Result<u64> {
    let page = system_page_size();
    let size = a.size as usize;
    let num_qp = a.num_qp as usize;
    if a.odp {
        bail!("The device isn't ODP capable or does not support RC send, receive and srq with ODP");
    }
    a.common.check(a.size)?;
    if num_qp == 0 {
        bail!("num-qp must be at least 1");
    }
    if a.num_qp > a.common.rx_depth {
        bail!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            a.common.rx_depth,
            a.num_qp
        );
    }
    if num_qp >= MAX_QP {
        bail!("num_qp {} must be less than {}", a.num_qp, MAX_QP - 1);
    }
    let client = role.is_client();
    let stock = role.is(a.emulate_stock);
    let stall = a.common.stall();
    let rx_depth = a.common.rx_depth as usize;

    // pp_init_ctx: buffers 0..rx_depth receive, rx_depth + i is QP i's send
    // buffer; srq_pingpong has buffer 0 for everything.
    let ctx = Context::open(transport).context("Couldn't get context")?;
    let pd = Pd::alloc(&ctx).context("Couldn't allocate PD")?;
    let bufs = Buffers::new(&pd, if stock { 1 } else { rx_depth + num_qp }, size)?;
    let recv_buf = |slot: usize| if stock { 0 } else { slot };
    let send_buf = |qp: usize| if stock { 0 } else { rx_depth + qp };
    let mut cq =
        Cq::new(&ctx, a.common.rx_depth.saturating_add(a.num_qp)).context("Couldn't create CQ")?;
    let srq_init = SrqInitAttr {
        max_wr: a.common.rx_depth,
        max_sge: 1,
        srq_limit: 0,
    };
    let mut srq = Srq::new(&pd, &srq_init).context("Couldn't create SRQ")?;
    let mut qps = Vec::with_capacity(num_qp);
    for i in 0..num_qp {
        let qp = tools::rc_qp_init_srq(&pd, &cq, Some(&srq), 0, a.common.ib_port, 0)
            .with_context(|| format!("QP[{i}]"))?;
        qps.push(qp);
    }
    let inline = qps.iter().all(|q| q.cap().max_inline_data as usize >= size);

    let poison = vec![POISON; size];
    let post_recv = |srq: &mut Srq, slot: usize| -> Result<()> {
        if !stock {
            bufs.write(slot, &poison);
        }
        srq.post_recv(&RecvWr {
            wr_id: recv_wrid(slot),
            sg_list: &[bufs.sge(recv_buf(slot))],
        })
        .with_context(|| format!("Couldn't post receive ({slot})"))
    };
    for slot in 0..rx_depth {
        post_recv(&mut srq, slot)?;
    }

    let port = ctx
        .query_port(a.common.ib_port)
        .context("Couldn't get port info")?;
    if port.link_layer != LINK_LAYER_ETHERNET {
        bail!("Couldn't get local LID");
    }
    let gid = a
        .common
        .local_gid(&ctx, "Could not get local gid for gid index")?;
    let zero = Dest {
        lid: 0,
        qpn: 0,
        psn: 0,
        gid: Gid::default(),
    };
    let mut me = vec![zero; MAX_QP];
    for (d, qp) in me.iter_mut().zip(&qps) {
        *d = Dest {
            lid: 0,
            qpn: qp.qp_num(),
            psn: random_psn(),
            gid,
        };
        say(tag, format_args!("  local address:  {}", d.describe()));
    }

    let rem = match role {
        Role::Client(host, port) => client_exchange(&host, port, &me, stall)?,
        Role::Server(listener) => server_exchange(listener, &me, stall, |rem| {
            connect_qps(&mut qps, a, &me, rem)
        })?,
    };
    for d in &rem[..num_qp] {
        say(tag, format_args!("  remote address: {}", d.describe()));
    }
    if client {
        connect_qps(&mut qps, a, &me, &rem)?;
    }

    let mut verifier = Verifier::new(client, size, page, "srq_pingpong", SRQ_FILL, true);
    let mut received = vec![0u8; size];
    // What QP i's next SEND carries: the client's pattern, the server's echo.
    let mut out = vec![vec![0u8; size]; num_qp];
    if client && !stock {
        for o in &mut out {
            fill_pattern(verifier.pattern_of(0), o, page);
        }
    }
    let post_send = |qp: &mut Qp, i: usize, data: &mut [u8]| -> Result<()> {
        let sge = [bufs.sge(send_buf(i))];
        let mut wr = SendWr {
            wr_id: SEND_WRID,
            opcode: WrOpcode::Send,
            send_flags: SEND_SIGNALED,
            ..Default::default()
        };
        if stock {
            bufs.read(0, data);
        } else if !inline {
            bufs.write(send_buf(i), data);
        }
        if inline {
            wr.inline_data = Some(data);
        } else {
            wr.sg_list = &sge;
        }
        qp.post_send(&wr).context("Couldn't post send")
    };

    let mut pending = vec![RECV_WRID; num_qp];
    if client {
        for (i, qp) in qps.iter_mut().enumerate() {
            post_send(qp, i, &mut out[i])?;
            pending[i] = RECV_WRID | SEND_WRID;
        }
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wc = vec![WorkCompletion::default(); rx_depth + num_qp];
    let mut poller = CqPoller::new(stall);
    while rcnt < a.common.iters || scnt < a.common.iters {
        for w in poller.poll(&mut cq, &mut wc, rcnt, scnt)? {
            let Some(qi) = qps.iter().position(|q| q.qp_num() == w.qp_num) else {
                bail!("Couldn't find QPN {:06x}", w.qp_num);
            };
            let done = if w.wr_id == SEND_WRID {
                scnt += 1;
                SEND_WRID
            } else if w.wr_id & 0xff == RECV_WRID && ((w.wr_id >> 8) as usize) < rx_depth {
                let slot = (w.wr_id >> 8) as usize;
                if !stock {
                    bufs.read(slot, &mut received);
                    verifier.check(rcnt, w.byte_len, &received)?;
                    if !client {
                        out[qi].copy_from_slice(&received);
                    }
                }
                post_recv(&mut srq, slot)?;
                rcnt += 1;
                RECV_WRID
            } else {
                bail!("Completion for unknown wr_id {}", w.wr_id as i32);
            };
            pending[qi] &= !done;
            if scnt < a.common.iters && pending[qi] == 0 {
                post_send(&mut qps[qi], qi, &mut out[qi])?;
                pending[qi] = RECV_WRID | SEND_WRID;
            }
        }
    }
    pingpong::report(tag, a.size, a.common.iters, start.elapsed());
    if stock {
        bufs.read(0, &mut received);
    }
    if !client && a.common.chk {
        pingpong::check_chk(tag, &received, page)?;
    }
    if stock {
        // srq_pingpong checks nothing more.
        return Ok(u64::from(a.common.iters));
    }
    Ok(verifier.conclude(tag))
}

fn main() -> ExitCode {
    tools::init_tracing();
    let a = Args::parse();
    let mtu = a.mtu;
    pingpong::tool_main("vrnic-srq-pingpong", a, |a| &mut a.common, mtu, false, run)
}
