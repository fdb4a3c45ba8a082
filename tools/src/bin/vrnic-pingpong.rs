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
//! A side that gets no completion for `--stall-timeout` seconds (30) checks
//! whether its peer is still there, which RC tells only through a SEND:
//! it sends one empty message; a dead peer (its VM killed) makes that fail
//! with `Failed status transport retry counter exceeded (12) for wr_id 4`
//! within the QP's retry budget (`pingpong::probe_peer`), else the stall is
//! reported. `ibv_rc_pingpong` waits for ever there.
//!
//! It then prints `data verified: N messages`. Any mismatch, error
//! completion (named as `ibv_wc_status_str` names it), `-c` failure or
//! failed step exits with status 1.
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
    Receives, Role, Stalled, Verifier, POISON, RECV_WRID, SEND_WRID,
};
use vrnic_tools::tools::{
    self, parse_c_int, parse_mtu, random_psn, say, Dest, LINK_LAYER_ETHERNET,
};

/// The byte `ibv_rc_pingpong` fills its buffer with.
const RC_FILL: u8 = 0x7b;

/// Ping-pong SENDs over an RC QP, like ibv_rc_pingpong: without SERVERNAME start
/// a server and wait for a connection, with it connect to the server there.
#[derive(Parser, Debug, Clone)]
#[command(name = "vrnic-pingpong", version)]
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
}

/// `pp_connect_ctx`: INIT → RTR → RTS with rc_pingpong's attributes.
fn connect_qp(qp: &mut Qp, a: &Args, my_psn: u32, rem: &Dest) -> Result<()> {
    let mut ah = AhAttr {
        sl: a.common.sl,
        ..Default::default()
    };
    if rem.gid.interface_id() != 0 {
        ah.is_global = true;
        ah.hop_limit = 1;
        ah.dgid = rem.gid;
        // rc_pingpong stores its int gidx in a u8: -1 becomes 255.
        ah.sgid_index = a.common.gid_idx as u8;
    }
    tools::rc_qp_connect(qp, a.mtu, ah, my_psn, rem, a.common.qp_timeout)
}

/// One side of the ping-pong: `main` of rc_pingpong after option parsing.
fn run(a: &Args, transport: Box<dyn Transport>, role: Role, tag: &str) -> Result<u64> {
    let page = system_page_size();
    let size = a.size as usize;
    a.common.check(a.size)?;
    let client = role.is_client();
    let stall = a.common.stall();

    // pp_init_ctx
    let ctx = Context::open(transport).context("Couldn't get context")?;
    let pd = Pd::alloc(&ctx).context("Couldn't allocate PD")?;
    let mr = Mr::alloc(&pd, size, ACCESS_LOCAL_WRITE).context("Couldn't register MR")?;
    mr.fill(if client { RC_FILL } else { POISON });
    let mut cq =
        Cq::new(&ctx, a.common.rx_depth.saturating_add(1)).context("Couldn't create CQ")?;
    let mut qp = tools::rc_qp_init(&pd, &cq, a.common.rx_depth, a.common.ib_port, 0)?;
    let inline = qp.cap().max_inline_data as usize >= size;

    let mut receives = Receives::post(&mut qp, mr.sge(0, size), a.common.rx_depth)?;

    let port = ctx
        .query_port(a.common.ib_port)
        .context("Couldn't get port info")?;
    if port.link_layer != LINK_LAYER_ETHERNET {
        bail!("Couldn't get local LID");
    }
    let gid = a.common.local_gid(&ctx, "can't read sgid of index")?;
    let me = Dest {
        lid: 0,
        qpn: qp.qp_num(),
        psn: random_psn(),
        gid,
    };
    say(tag, format_args!("  local address:  {}", me.describe()));

    let rem = match role {
        Role::Client(host, port) => client_exchange(&host, port, &[me], stall)?,
        Role::Server(listener) => server_exchange(listener, &[me], stall, |rem| {
            connect_qp(&mut qp, a, me.psn, &rem[0])
        })?,
    };
    let rem = rem[0];
    say(tag, format_args!("  remote address: {}", rem.describe()));
    if client {
        connect_qp(&mut qp, a, me.psn, &rem)?;
    }

    let mut verifier = Verifier::new(client, size, page, "rc_pingpong", RC_FILL, false);
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
    let mut poller = CqPoller::new(stall);
    while rcnt < a.common.iters || scnt < a.common.iters {
        let done = match poller.poll(&mut cq, &mut wc, rcnt, scnt) {
            Ok(done) => done,
            Err(e) => {
                if let Some(&stall) = e.downcast_ref::<Stalled>() {
                    // Is the peer still there? (Its death shows only on a SEND.)
                    return Err(pingpong::probe_peer(
                        &mut qp,
                        &mut cq,
                        a.common.qp_timeout,
                        tools::RC_RETRY_CNT,
                        stall,
                    ));
                }
                match e.downcast_ref::<pingpong::Failed>() {
                    Some(f) if last_ack_lost(f, rcnt, scnt, a.common.iters) => {
                        say(
                            tag,
                            format_args!(
                                "last SEND not acknowledged ({}): the peer ended after \
                                 receiving it{}",
                                f.status_str,
                                if client {
                                    " (it echoed it back)"
                                } else {
                                    "; its own result tells whether the reply reached it"
                                }
                            ),
                        );
                        scnt += 1;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
        };
        for w in done {
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    mr.read(0, &mut received);
                    verifier.check(rcnt, w.byte_len, &received)?;
                    receives.consumed(&mut qp)?;
                    rcnt += 1;
                }
                other => bail!("Completion for unknown wr_id {}", other as i32),
            }
            pending &= !w.wr_id;
            if scnt < a.common.iters && pending == 0 {
                post_send(&mut qp, scnt)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    pingpong::report(tag, a.size, a.common.iters, start.elapsed());
    if !client && a.common.chk {
        pingpong::check_chk(tag, &mr.to_vec(), page)?;
    }
    Ok(verifier.conclude(tag))
}

/// True when `f` is the end of a run on a lossy link rather than a
/// failure: every message received (`rcnt` = `iters`), only the last SEND
/// outstanding, and it ran out of retries. The peer finished its run and
/// destroyed its QP after receiving that SEND, and the ACK for it was lost
/// on the way (`ibv_rc_pingpong` fails there too). As client, the peer's
/// echo of the last message proves that it arrived; as server, the peer's
/// own result does.
fn last_ack_lost(f: &pingpong::Failed, rcnt: u32, scnt: u32, iters: u32) -> bool {
    f.wr_id == SEND_WRID
        && f.status == vrnic::abi::WC_RETRY_EXC_ERR
        && rcnt == iters
        && scnt.checked_add(1) == Some(iters)
}

fn main() -> ExitCode {
    tools::init_tracing();
    let a = Args::parse();
    let mtu = a.mtu;
    pingpong::tool_main("vrnic-pingpong", a, |a| &mut a.common, mtu, true, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(status: u8, wr_id: u64) -> pingpong::Failed {
        pingpong::Failed {
            status,
            status_str: "",
            wr_id,
        }
    }

    #[test]
    fn only_the_last_sends_lost_ack_ends_a_run() {
        let retry = vrnic::abi::WC_RETRY_EXC_ERR;
        assert!(last_ack_lost(&failed(retry, SEND_WRID), 200, 199, 200));
        // A message still to receive, or a SEND before the last one.
        assert!(!last_ack_lost(&failed(retry, SEND_WRID), 199, 199, 200));
        assert!(!last_ack_lost(&failed(retry, SEND_WRID), 200, 198, 200));
        // Another status, or a receive.
        assert!(!last_ack_lost(
            &failed(vrnic::abi::WC_REM_ACCESS_ERR, SEND_WRID),
            200,
            199,
            200
        ));
        assert!(!last_ack_lost(&failed(retry, RECV_WRID), 200, 199, 200));
    }
}
