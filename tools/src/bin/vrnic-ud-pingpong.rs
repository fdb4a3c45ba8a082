//! `vrnic-ud-pingpong`: rdma-core's `ibv_ud_pingpong` (libibverbs/examples/
//! ud_pingpong.c) over the vrnic verbs library, interoperable with the
//! unmodified tool in either role.
//!
//! Same as `ibv_ud_pingpong`:
//! - the out-of-band exchange: TCP port 18515 (`-p`), one 52-byte
//!   `"%04x:%06x:%06x:%s"` message each way (LID, QPN, PSN, GID in
//!   `gid_to_wire_gid` form), the server creates its AH before answering,
//!   the client writes `"done"`;
//! - a UD QP (1 send WR, `rx_depth` receive WRs, 1 SGE) with Q_Key
//!   0x11111111: INIT with P_Key index 0, port and Q_Key, RTR with the
//!   state only, RTS with a random 24-bit send PSN; an address handle to the
//!   peer with a GRH (hop limit 64, source GID index `-g`) when the peer's
//!   GID has an interface ID, else none (which RoCE refuses: give `-g`);
//! - receive buffers of `size + 40` bytes (the GRH area, then the payload),
//!   sends of `size` bytes to the peer's QPN with Q_Key 0x11111111 (inline
//!   when the QP allows that many inline bytes), signalled; the next SEND
//!   is posted when both the previous SEND and a receive completed;
//! - `size` may not exceed the port's active MTU (default size 1024);
//! - output: `local address:` (with ud_pingpong's `: GID` punctuation),
//!   `remote address:` and the two result lines;
//! - `-c`/`--chk`: the server prints `invalid data in page N` for any page
//!   of the last message whose first byte is not 0.
//!
//! Additionally it verifies every message, whatever the peer (the stock
//! tool fills its buffer with 0x7b and a server sends from the buffer it
//! receives into, so it echoes):
//! - as client it sends message `n` filled with a pattern unique to `n` (0
//!   at page starts) and checks that reply `n` equals it;
//! - as server it accepts either this pattern or ud_pingpong's data (0x7b,
//!   0 or 0x7b at page starts), consistently for the run, and echoes it;
//! - every receive must complete with `byte_len` = 40 + `size`, the GRH
//!   flag, the peer's QPN as source QP and, when the peer announced a GID,
//!   that GID as the GRH's source address; the receive area is refilled
//!   with a poison byte after each message, so a receive that writes
//!   nothing shows.
//!
//! It then prints `data verified: N messages`. Any mismatch, error
//! completion, `-c` failure or failed step exits with status 1; no
//! completion for `--stall-timeout` seconds (a lost datagram: UD does not
//! retransmit) too.
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
    self, client_exchange, fill_pattern, server_exchange, system_page_size, Common, CqPoller,
    Receives, Role, Side, Verifier, CHK_BYTE, POISON, RECV_WRID, SEND_WRID,
};
use vrnic_tools::tools::{
    self, parse_c_int, random_psn, say, Dest, LINK_LAYER_ETHERNET, UD_PINGPONG_QKEY,
};

/// The byte `ibv_ud_pingpong` fills its buffer with.
const UD_FILL: u8 = 0x7b;
/// Path MTU of the `--loopback` link: 1024 bytes (`ibv_mtu` 3), a
/// 1500-byte link, which is also the port's active MTU.
const LOOPBACK_MTU: u32 = 3;
/// ud_pingpong's GRH hop limit.
const HOP_LIMIT: u8 = 64;

/// Ping-pong SENDs over a UD QP, like ibv_ud_pingpong: without SERVERNAME start
/// a server and wait for a connection, with it connect to the server there.
#[derive(Parser, Debug, Clone)]
#[command(name = "vrnic-ud-pingpong", version)]
struct Args {
    /// The options every ping-pong tool takes.
    #[command(flatten)]
    common: Common,
    /// Size of message to exchange, bytes (at most the port's active MTU).
    #[arg(short = 's', long = "size", default_value = "1024", value_parser = parse_c_int::<u32>)]
    size: u32,
    /// With --loopback: this side handles its buffer as ibv_ud_pingpong
    /// does (sends from and receives into one 0x7b-filled buffer, no checks).
    #[arg(long, hide = true, value_enum, requires = "loopback")]
    emulate_stock: Option<Side>,
}

/// ud_pingpong's `pp_connect_ctx`: the QP to RTS, then the AH to the peer.
fn connect(qp: &mut Qp, pd: &Pd, a: &Args, my_psn: u32, rem: &Dest) -> Result<Ah> {
    tools::ud_qp_rts(qp, my_psn)?;
    let mut attr = AhAttr {
        sl: a.common.sl,
        port_num: a.common.ib_port,
        ..Default::default()
    };
    if rem.gid.interface_id() != 0 {
        attr.is_global = true;
        attr.hop_limit = HOP_LIMIT;
        attr.dgid = rem.gid;
        // ud_pingpong passes its int gidx as a u8: -1 becomes 255.
        attr.sgid_index = a.common.gid_idx as u8;
    }
    Ah::new(pd, &attr).context("Failed to create AH")
}

/// Checks a receive completion's UD fields (the data is the verifier's).
fn check_ud_completion(
    n: u32,
    w: &WorkCompletion,
    size: usize,
    rem: &Dest,
    grh: &[u8],
) -> Result<()> {
    if w.wc_flags & WC_GRH == 0 {
        bail!("message {n}: the completion has no GRH flag");
    }
    if w.src_qp != rem.qpn {
        bail!(
            "message {n}: source QP 0x{:06x}, expected the peer's 0x{:06x}",
            w.src_qp,
            rem.qpn
        );
    }
    if w.byte_len as usize != GRH_LEN + size {
        bail!(
            "message {n}: received {} bytes, expected {} (40 of GRH and {size})",
            w.byte_len,
            GRH_LEN + size
        );
    }
    if !rem.gid.is_zero() {
        match grh_sgid(grh) {
            Some(g) if g == rem.gid => {}
            Some(g) => bail!(
                "message {n}: GRH source GID {g} is not the peer's {}",
                rem.gid
            ),
            None => bail!("message {n}: the GRH area holds no IP header: {grh:02x?}"),
        }
    }
    Ok(())
}

/// One side of the ping-pong: `main` of ud_pingpong after option parsing.
fn run(a: &Args, transport: Box<dyn Transport>, role: Role, tag: &str) -> Result<u64> {
    let page = system_page_size();
    let size = a.size as usize;
    a.common.check(a.size)?;
    let client = role.is_client();
    let stock = role.is(a.emulate_stock);
    let stall = a.common.stall();

    // pp_init_ctx
    let ctx = Context::open(transport).context("Couldn't get context")?;
    let port = ctx
        .query_port(a.common.ib_port)
        .with_context(|| format!("Unable to query port info for port {}", a.common.ib_port))?;
    let mtu = mtu_bytes(port.active_mtu);
    if a.size > mtu {
        bail!("Requested size larger than port MTU ({mtu})");
    }
    let pd = Pd::alloc(&ctx).context("Couldn't allocate PD")?;
    // The receive area (GRH + payload), then the send area; ud_pingpong
    // sends the payload of its receive area.
    let recv_len = GRH_LEN + size;
    let send_off = if stock {
        GRH_LEN
    } else {
        recv_len.next_multiple_of(64)
    };
    let mr = Mr::alloc(
        &pd,
        recv_len.next_multiple_of(64) + size,
        ACCESS_LOCAL_WRITE,
    )
    .context("Couldn't register MR")?;
    mr.fill(if stock { UD_FILL } else { POISON });
    let mut cq =
        Cq::new(&ctx, a.common.rx_depth.saturating_add(1)).context("Couldn't create CQ")?;
    let mut qp = tools::ud_qp_init(
        &pd,
        &cq,
        a.common.rx_depth,
        a.common.ib_port,
        UD_PINGPONG_QKEY,
    )?;
    let inline = qp.cap().max_inline_data as usize >= size;

    let mut receives = Receives::post(&mut qp, mr.sge(0, recv_len), a.common.rx_depth)?;

    if port.link_layer != LINK_LAYER_ETHERNET {
        bail!("Couldn't get port info");
    }
    let gid = a
        .common
        .local_gid(&ctx, "Could not get local gid for gid index")?;
    let me = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid,
    };
    say(
        tag,
        format_args!(
            "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {}",
            me.lid, me.qpn, me.psn, me.gid
        ),
    );

    let mut ah = None;
    let rem = match role {
        Role::Client(host, port) => client_exchange(&host, port, &[me], stall)?,
        Role::Server(listener) => server_exchange(listener, &[me], stall, |rem| {
            ah = Some(connect(&mut qp, &pd, a, me.psn, &rem[0])?);
            Ok(())
        })?,
    };
    let rem = rem[0];
    say(tag, format_args!("  remote address: {}", rem.describe()));
    let ah = match ah {
        Some(ah) => ah,
        None => connect(&mut qp, &pd, a, me.psn, &rem)?,
    };

    let mut verifier = Verifier::new(client, size, page, "ud_pingpong", UD_FILL, false);
    let mut received = vec![0u8; recv_len];
    let poison = vec![POISON; recv_len];
    // What the next SEND carries: the client's pattern, the server's echo.
    let mut out = vec![0u8; size];
    let send_sge = [mr.sge(send_off, size)];
    let ud = UdWr {
        ah: ah.handle(),
        remote_qpn: rem.qpn,
        remote_qkey: UD_PINGPONG_QKEY,
    };
    if stock && client && a.common.chk {
        for i in (0..size).step_by(page) {
            mr.write(GRH_LEN + i, &[CHK_BYTE]);
        }
    }
    let post_send = |qp: &mut Qp, n: u32, out: &mut [u8]| -> Result<()> {
        if stock {
            mr.read(send_off, out);
        } else if client {
            fill_pattern(n, out, page);
        }
        let mut wr = SendWr {
            wr_id: SEND_WRID,
            opcode: WrOpcode::Send,
            send_flags: SEND_SIGNALED,
            ud,
            ..Default::default()
        };
        if inline {
            wr.inline_data = Some(out);
        } else {
            mr.write(send_off, out);
            wr.sg_list = &send_sge;
        }
        qp.post_send(&wr).context("Couldn't post send")
    };

    let mut pending = RECV_WRID;
    if client {
        post_send(&mut qp, 0, &mut out)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wc = [WorkCompletion::default(); 2];
    let mut poller = CqPoller::new(stall);
    while rcnt < a.common.iters || scnt < a.common.iters {
        for w in poller.poll(&mut cq, &mut wc, rcnt, scnt)? {
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if !stock {
                        mr.read(0, &mut received);
                        // Nothing else lands here before our next SEND is
                        // answered; the send area is left alone (a SEND
                        // may still be reading it).
                        mr.write(0, &poison);
                        let (grh, payload) = received.split_at(GRH_LEN);
                        check_ud_completion(rcnt, w, size, &rem, grh)?;
                        let len = (w.byte_len as usize - GRH_LEN) as u32;
                        verifier.check(rcnt, len, payload)?;
                        if !client {
                            out.copy_from_slice(payload);
                        }
                    }
                    receives.consumed(&mut qp)?;
                    rcnt += 1;
                }
                other => bail!("Completion for unknown wr_id {}", other as i32),
            }
            pending &= !w.wr_id;
            if scnt < a.common.iters && pending == 0 {
                post_send(&mut qp, scnt, &mut out)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    pingpong::report(tag, a.size, a.common.iters, start.elapsed());
    if stock {
        mr.read(0, &mut received);
    }
    if !client && a.common.chk {
        pingpong::check_chk(tag, &received[GRH_LEN..], page)?;
    }
    if stock {
        // ud_pingpong checks nothing more.
        return Ok(u64::from(a.common.iters));
    }
    Ok(verifier.conclude(tag))
}

/// `ibv_mtu` to bytes (`1 << (mtu + 7)`, as ud_pingpong computes it).
fn mtu_bytes(mtu: u32) -> u32 {
    1u32.checked_shl(mtu.saturating_add(7)).unwrap_or(0)
}

fn main() -> ExitCode {
    tools::init_tracing();
    let a = Args::parse();
    pingpong::tool_main(
        "vrnic-ud-pingpong",
        a,
        |a| &mut a.common,
        LOOPBACK_MTU,
        true,
        run,
    )
}
