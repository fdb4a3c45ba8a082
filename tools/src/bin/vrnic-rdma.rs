//! `vrnic-rdma`: RDMA READ, compare-and-swap and fetch-and-add against a
//! peer's memory, every byte and every returned value checked. Its C twin
//! for Linux rdma-core peers is `tests/e2e/peer/rxe-rdma-peer.c`; the two
//! speak the same protocol, so either can be on either side.
//!
//! Roles: without a host argument it is the *passive* side (the TCP
//! server), which owns the target memory and only responds; with one it is
//! the *active* side (the TCP client), the requester of every operation.
//!
//! # The passive side's memory
//! One MR (local write, remote read, remote atomic) of `64 + max(-s) + 8192`
//! bytes, 8-byte aligned:
//! - bytes 0..8: the counter (a native-endian u64) for fetch-and-add,
//!   initially `CNT0` = `SEED << 32 | 0xffffff00` (the low half wraps
//!   within the first fetch-and-adds, so the carry is exercised);
//! - bytes 8..16: the compare-and-swap word, initially `CAS0` = `!CNT0`;
//! - bytes 16..64: 0xA5 guard (no operation may touch it);
//! - bytes 64..: the data region; its byte `i` is [`pattern_byte`]`(SEED, i)`.
//!
//! # Out-of-band protocol (TCP, port 18517 by default, `-p`)
//! Lines of ASCII text ending in `\n`, at most 256 bytes; hex numbers
//! lower-case, zero-padded:
//!
//! 1. active → passive: `LID:QPN:PSN:GID` (`%04x:%06x:%06x:` + 32 hex
//!    digits, rdma-core's `gid_to_wire_gid`), as `ibv_rc_pingpong`'s message;
//! 2. the passive side connects its QP and answers
//!    `LID:QPN:PSN:GID:ADDR:RKEY:LEN:SEED:CNT0:CAS0`
//!    (`...:%016x:%08x:%08x:%08x:%016x:%016x`): its QP, the MR's address,
//!    rkey and length, the pattern seed and the initial counter and
//!    compare-and-swap word; the active side connects its QP;
//! 3. the active side, one operation at a time (each waited for):
//!    - for each size `S` of `-s`, `-r` RDMA READs of `S` bytes from data
//!      offset `(1 + k * 4097) mod (LEN - 64 - S + 1)` (read `k`) into a
//!      local buffer between 0xA5 guards; every byte and every guard byte is
//!      checked; then `progress read S`;
//!    - `-n` fetch-and-adds of `ADD` (0x100000003) on the counter: each
//!      returns the previous one's value + `ADD`, the first `CNT0`; then
//!      `progress fetch-add`;
//!    - compare-and-swap `CAS0` → `SWAP` (`CAS0 ^ 0x5a5a5a5aa5a5a5a5`) must
//!      return `CAS0` (swapped); the same again must return `SWAP` (refused,
//!      stale compare value); an 8-byte READ of the word must give `SWAP`;
//!      then `progress cmp-swap`;
//!    - `done N ADD SWAP` (N decimal, the others `%016x`);
//! 4. the passive side checks its memory: counter = `CNT0 + N * ADD`
//!    (wrapping), word = `SWAP`, guard and data region untouched; answers
//!    `final COUNTER WORD` (`%016x %016x`);
//! 5. the active side checks both values are exactly what it expects and
//!    answers `ok`.
//!
//! Either side that fails after connecting sends `fail MESSAGE` and stops;
//! the other stops at once with the reason. `progress` lines only keep the
//! passive side's bounded wait (`--timeout`) from running out.
//!
//! Output (what the e2e harness greps): the active side prints
//! `rdma-read verified: R reads of S bytes` per size, `fetch-add verified:
//! N ops, ...` and `cmp-swap verified: ...` (both after the passive side's
//! report agreed); the passive side prints `responder verified: ...`. Any
//! error prints `vrnic-rdma: ERROR` and exits with status 1.
//!
//! The device is the vrnic PCI function (`--pci BDF`, default the first
//! found). The hidden `--loopback` option runs both roles in this process
//! over two in-process devices (output lines tagged `server: ` for the
//! passive side, `client: ` for the active one); the hidden `--fault` option makes one side
//! misbehave so tests can see each check fail.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use clap::{Parser, ValueEnum};
use vrnic::abi;
use vrnic_guest::transport::Transport;
use vrnic_guest::verbs::*;
use vrnic_tools::pingpong::{self, Role};
use vrnic_tools::tools::{
    self, accept_bounded, connect_bounded, hex_field, oob_session, parse_c_int, parse_dest_fields,
    parse_positive, post_send_wait, random_psn, rc_side_connect, say, say_dest, Dest, Oob, RcSide,
    RcToolArgs,
};

/// Offset of the data region in the passive side's MR.
const DATA_OFF: usize = 64;
/// Offset of the compare-and-swap word in the passive side's MR.
const CAS_OFF: usize = 8;
/// Bytes of the passive side's data region beyond the largest read, so
/// reads start at different offsets.
const SLACK: usize = 8192;
/// Bytes of guard before and after the target in the active side's buffer.
const GUARD: usize = 64;
/// Guard byte value (both sides).
const GUARD_FILL: u8 = 0xa5;
/// The fetch-and-add addend: changes both 32-bit halves.
const ADD: u64 = 0x1_0000_0003;
/// XORed into the compare-and-swap word to make the swap value.
const SWAP_XOR: u64 = 0x5a5a_5a5a_a5a5_a5a5;
/// Read offsets advance by this per read (not a multiple of any page size).
const READ_STRIDE: u64 = 4097;
/// The port the device's verbs use (vrnic has one).
const IB_PORT: u8 = 1;
/// Largest read size accepted, bytes (1 GiB: far beyond the guests' memory).
const MAX_SIZE: u32 = 1 << 30;

/// Parses a read size: 1 byte to [`MAX_SIZE`].
fn parse_size(s: &str) -> Result<u32, String> {
    let v = parse_positive(s)?;
    if v > MAX_SIZE {
        return Err(format!("{v}: at most {MAX_SIZE} bytes"));
    }
    Ok(v)
}

/// How a side misbehaves (hidden `--fault`, for tests of the checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Fault {
    /// Passive: corrupt the data region's byte 1 (the first read's byte).
    Data,
    /// Active: use a wrong rkey (the first READ completes with an error).
    Rkey,
    /// Active: report a wrong addend in `done` (the counter check fails).
    Add,
}

/// RDMA READ, compare-and-swap and fetch-and-add against a peer, verified:
/// without HOST be the passive side (owner of the memory) and wait for a
/// client, with HOST connect to the passive side there and operate on it.
#[derive(Parser, Debug, Clone)]
#[command(name = "vrnic-rdma", version)]
struct Args {
    /// Passive side to connect to; none: be the passive side.
    host: Option<String>,
    /// Listen on/connect to this TCP port.
    #[arg(short = 'p', long = "port", default_value = "18517", value_parser = parse_c_int::<u16>)]
    port: u16,
    /// RDMA READ sizes, bytes, comma-separated (the passive side sizes its
    /// region for the largest).
    #[arg(short = 's', long = "sizes", default_value = "1,4097,1048576",
          value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<u32>,
    /// RDMA READs per size.
    #[arg(short = 'r', long = "reads", default_value = "2", value_parser = parse_positive)]
    reads: u32,
    /// Number of fetch-and-adds.
    #[arg(short = 'n', long = "fetch-adds", default_value = "100", value_parser = parse_positive)]
    fetch_adds: u32,
    #[command(flatten)]
    rc: RcToolArgs,
    /// Make a side misbehave, to test that the checks fail.
    #[arg(long, hide = true, value_enum)]
    fault: Option<Fault>,
}

impl Args {
    /// The largest read size.
    fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1) as usize
    }
}

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

/// Byte `i` of the passive side's data region for `seed` (the C peer's
/// `pattern_byte` computes the same): a multiplicative hash of the offset
/// with a murmur3-style finaliser, so shifted, swapped or stale data is
/// caught.
fn pattern_byte(seed: u32, i: u64) -> u8 {
    let mut x = (i as u32).wrapping_mul(0x9e37_79b1) ^ seed ^ ((i >> 32) as u32);
    x ^= x >> 15;
    x = x.wrapping_mul(0x85eb_ca77);
    x ^= x >> 13;
    (x >> 24) as u8
}

/// Fills `buf` with the pattern bytes of data offsets `off..off + buf.len()`.
fn fill_pattern(seed: u32, off: u64, buf: &mut [u8]) {
    for (j, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(seed, off + j as u64);
    }
}

/// The initial counter for `seed`: the low half wraps after a few adds.
fn counter0(seed: u32) -> u64 {
    (u64::from(seed) << 32) | 0xffff_ff00
}

/// Data offset of read `k` of `size` bytes in a data region of `data_len`
/// bytes (`size <= data_len`).
fn read_offset(k: u32, size: usize, data_len: usize) -> u64 {
    let span = (data_len - size) as u64 + 1;
    (1 + u64::from(k) * READ_STRIDE) % span
}

/// Checks the active side's buffer after a read of `expected.len()` bytes
/// into offset [`GUARD`]: guards intact, every target byte as expected.
/// `what` names the read in errors.
fn check_read(what: &str, buf: &[u8], expected: &[u8]) -> Result<()> {
    let end = GUARD + expected.len();
    ensure!(buf.len() >= end + GUARD, "{what}: buffer too small");
    match tools::guard_fault(&buf[..end + GUARD], GUARD, GUARD_FILL, expected) {
        None => Ok(()),
        Some(tools::GuardFault::Before { at, byte }) => bail!(
            "{what}: guard byte {} before the target is {byte:#04x}, expected {GUARD_FILL:#04x}",
            GUARD - at
        ),
        Some(tools::GuardFault::Data { at, got, want, bad }) => bail!(
            "{what}: data mismatch at byte {at}: {got:#04x}, expected {want:#04x} ({bad} of {} bytes differ)",
            expected.len()
        ),
        Some(tools::GuardFault::After { at, byte }) => bail!(
            "{what}: guard byte {at} after the target is {byte:#04x}, expected {GUARD_FILL:#04x}"
        ),
    }
}

// ---------------------------------------------------------------------------
// Address exchange
// ---------------------------------------------------------------------------

/// What the passive side advertises besides its QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target {
    /// Remote address (iova) of the MR's first byte.
    addr: u64,
    rkey: u32,
    /// MR length, bytes.
    len: u32,
    /// Pattern seed of the data region.
    seed: u32,
    /// Initial counter.
    cnt0: u64,
    /// Initial compare-and-swap word.
    cas0: u64,
}

/// The active side's address message.
fn active_msg(d: &Dest) -> String {
    d.wire()
}

/// The passive side's address message.
fn passive_msg(d: &Dest, t: &Target) -> String {
    format!(
        "{}:{:016x}:{:08x}:{:08x}:{:08x}:{:016x}:{:016x}",
        d.wire(),
        t.addr,
        t.rkey,
        t.len,
        t.seed,
        t.cnt0,
        t.cas0
    )
}

/// Parses the active side's address message (4 fields).
fn parse_active_msg(line: &str) -> Result<Dest> {
    let f: Vec<&str> = line.split(':').collect();
    ensure!(
        f.len() == 4,
        "malformed address message {line:?}: {} fields, expected 4",
        f.len()
    );
    parse_dest_fields(line, &f)
}

/// Parses the passive side's address message (10 fields).
fn parse_passive_msg(line: &str) -> Result<(Dest, Target)> {
    let f: Vec<&str> = line.split(':').collect();
    ensure!(
        f.len() == 10,
        "malformed address message {line:?}: {} fields, expected 10",
        f.len()
    );
    let d = parse_dest_fields(line, &f)?;
    let t = Target {
        addr: hex_field(line, "address", f[4], 64)?,
        rkey: hex_field(line, "rkey", f[5], 32)? as u32,
        len: hex_field(line, "length", f[6], 32)? as u32,
        seed: hex_field(line, "seed", f[7], 32)? as u32,
        cnt0: hex_field(line, "counter", f[8], 64)?,
        cas0: hex_field(line, "compare-and-swap word", f[9], 64)?,
    };
    Ok((d, t))
}

/// The passive side's memory as the active side addresses it.
struct Remote {
    t: Target,
    /// The rkey used (the advertised one unless `--fault rkey`).
    rkey: u32,
    /// Bound of each completion.
    wait: Duration,
}

/// Parses `PREFIX A B ...`: the words after `prefix`, exactly `n` of them.
fn words<'a>(line: &'a str, prefix: &str, n: usize) -> Result<Vec<&'a str>> {
    let w: Vec<&str> = line.split(' ').collect();
    ensure!(
        w.len() == n + 1 && w[0] == prefix,
        "protocol error: expected \"{prefix}\" and {n} values, got {line:?}"
    );
    Ok(w[1..].to_vec())
}

// ---------------------------------------------------------------------------
// Device side
// ---------------------------------------------------------------------------

/// One side of the run.
fn run(a: &Args, transport: Box<dyn Transport>, role: Role, tag: &str) -> Result<()> {
    let wait = a.rc.wait();
    match role {
        Role::Server(listener) => {
            let len = DATA_OFF + a.max_size() + SLACK;
            let remote = ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
            let side = tools::open_rc_side(transport, IB_PORT, a.rc.gid_idx, len, remote)?;
            let seed = (random_psn() << 8) ^ random_psn();
            let cnt0 = counter0(seed);
            let t = Target {
                addr: side.mr.addr(),
                rkey: side.mr.rkey(),
                len: u32::try_from(len).context("region too large")?,
                seed,
                cnt0,
                cas0: !cnt0,
            };
            let mut data = vec![0u8; len - DATA_OFF];
            fill_pattern(seed, 0, &mut data);
            if a.fault == Some(Fault::Data) {
                data[1] ^= 0x40;
            }
            side.mr.fill(GUARD_FILL);
            side.mr.write(0, &t.cnt0.to_ne_bytes());
            side.mr.write(CAS_OFF, &t.cas0.to_ne_bytes());
            side.mr.write(DATA_OFF, &data);
            say_dest(tag, "local address: ", &side.me);
            say(
                tag,
                format_args!(
                    "  local region:   addr 0x{:016x}, rkey 0x{:08x}, {} bytes, seed 0x{seed:08x}",
                    t.addr, t.rkey, t.len
                ),
            );
            let sock = accept_bounded(&listener, wait)?;
            drop(listener);
            oob_session(sock, wait, |oob| {
                passive_session(a, side, oob, &t, &data, tag)
            })
        }
        Role::Client(host, port) => {
            let len = GUARD + a.max_size().max(8) + GUARD;
            let side = tools::open_rc_side(transport, IB_PORT, a.rc.gid_idx, len, 0)?;
            say_dest(tag, "local address: ", &side.me);
            let sock = connect_bounded(&host, port, wait, !a.rc.loopback)?;
            oob_session(sock, wait, |oob| active_session(a, side, oob, tag))
        }
    }
}

/// The passive side after accepting: exchange, wait for `done`, check the
/// memory, report it, wait for the verdict.
fn passive_session(
    a: &Args,
    mut side: RcSide,
    oob: &mut Oob,
    t: &Target,
    data: &[u8],
    tag: &str,
) -> Result<()> {
    let line = oob.recv("the active side's address")?;
    let rem = parse_active_msg(&line)?;
    say_dest(tag, "remote address:", &rem);
    rc_side_connect(&mut side, a.rc.mtu, a.rc.gid_idx, &rem)?;
    oob.send(&passive_msg(&side.me, t))?;
    let done = loop {
        let line = oob.recv("\"progress ...\" or \"done N ADD SWAP\"")?;
        if line.starts_with("progress ") {
            continue;
        }
        break line;
    };
    let w = words(&done, "done", 3)?;
    let n: u64 = w[0]
        .parse()
        .map_err(|_| anyhow!("protocol error: bad count in {done:?}"))?;
    let add = hex_field(&done, "addend", w[1], 64)?;
    let swap = hex_field(&done, "swap value", w[2], 64)?;
    let mut mem = vec![0u8; t.len as usize];
    side.mr.read(0, &mut mem);
    let cnt = u64::from_ne_bytes(mem[..8].try_into().expect("8 bytes"));
    let cas = u64::from_ne_bytes(mem[CAS_OFF..CAS_OFF + 8].try_into().expect("8 bytes"));
    let want = t.cnt0.wrapping_add(n.wrapping_mul(add));
    ensure!(
        cnt == want,
        "counter is 0x{cnt:016x} after {n} fetch-adds of 0x{add:x} from 0x{:016x}, expected 0x{want:016x}",
        t.cnt0
    );
    ensure!(
        cas == swap,
        "compare-and-swap word is 0x{cas:016x}, expected the swap value 0x{swap:016x}"
    );
    if let Some(j) = mem[CAS_OFF + 8..DATA_OFF]
        .iter()
        .position(|&b| b != GUARD_FILL)
    {
        bail!(
            "guard byte at offset {} changed to {:#04x}",
            CAS_OFF + 8 + j,
            mem[CAS_OFF + 8 + j]
        );
    }
    if let Some(j) = mem[DATA_OFF..].iter().zip(data).position(|(x, y)| x != y) {
        bail!("the data region changed at byte {j} (READs must not write)");
    }
    oob.send(&format!("final {cnt:016x} {cas:016x}"))?;
    oob.expect("ok")?;
    say(
        tag,
        format_args!(
            "responder verified: {n} fetch-adds, counter 0x{cnt:016x}, compare-and-swap word 0x{cas:016x}, data intact"
        ),
    );
    Ok(())
}

/// One atomic on the passive side's word at `off`; returns the original
/// value (landed between guards in the local buffer).
fn atomic(
    side: &mut RcSide,
    r: &Remote,
    op: WrOpcode,
    off: usize,
    compare_add: u64,
    swap: u64,
    what: &str,
) -> Result<u64> {
    side.mr.fill(GUARD_FILL);
    let sge = [side.mr.sge(GUARD, 8)];
    let wr = SendWr {
        wr_id: 0xa7,
        opcode: op,
        send_flags: SEND_SIGNALED,
        sg_list: &sge,
        atomic: AtomicWr {
            remote_addr: r.t.addr.wrapping_add(off as u64),
            rkey: r.rkey,
            compare_add,
            swap,
        },
        ..Default::default()
    };
    let want = if op == WrOpcode::AtomicCmpAndSwp {
        abi::WC_OP_COMP_SWAP
    } else {
        abi::WC_OP_FETCH_ADD
    };
    post_send_wait(&mut side.qp, &mut side.cq, &wr, want, r.wait, what)?;
    let mut buf = [0u8; GUARD + 8 + GUARD];
    side.mr.read(0, &mut buf);
    ensure!(
        buf[..GUARD]
            .iter()
            .chain(&buf[GUARD + 8..])
            .all(|&b| b == GUARD_FILL),
        "{what}: the result overran its 8 bytes"
    );
    Ok(u64::from_ne_bytes(
        buf[GUARD..GUARD + 8].try_into().expect("8 bytes"),
    ))
}

/// One RDMA READ of `size` bytes at offset `off` of the passive side's MR
/// into the local buffer (between guards); returns the local buffer.
fn read(side: &mut RcSide, r: &Remote, off: u64, size: usize, what: &str) -> Result<Vec<u8>> {
    side.mr.fill(GUARD_FILL);
    let sge = [side.mr.sge(GUARD, size)];
    let wr = SendWr {
        wr_id: u64::from(size as u32),
        opcode: WrOpcode::RdmaRead,
        send_flags: SEND_SIGNALED,
        sg_list: &sge,
        rdma: RdmaWr {
            remote_addr: r.t.addr.wrapping_add(off),
            rkey: r.rkey,
        },
        ..Default::default()
    };
    let want = abi::WC_OP_RDMA_READ;
    post_send_wait(&mut side.qp, &mut side.cq, &wr, want, r.wait, what)?;
    let mut buf = vec![0u8; GUARD + size + GUARD];
    side.mr.read(0, &mut buf);
    Ok(buf)
}

/// The active side after connecting: exchange, READs, fetch-and-adds,
/// compare-and-swaps, then the passive side's report.
fn active_session(a: &Args, mut side: RcSide, oob: &mut Oob, tag: &str) -> Result<()> {
    let wait = a.rc.wait();
    oob.send(&active_msg(&side.me))?;
    let line = oob.recv("the passive side's address")?;
    let (rem, t) = parse_passive_msg(&line)?;
    say_dest(tag, "remote address:", &rem);
    say(
        tag,
        format_args!(
            "  remote region:  addr 0x{:016x}, rkey 0x{:08x}, {} bytes, seed 0x{:08x}",
            t.addr, t.rkey, t.len, t.seed
        ),
    );
    let data_len = (t.len as usize)
        .checked_sub(DATA_OFF)
        .filter(|&d| d >= a.max_size())
        .ok_or_else(|| {
            anyhow!(
                "the passive side's region is {} bytes, too small for {}-byte reads: both sides need the same -s",
                t.len,
                a.max_size()
            )
        })?;
    ensure!(
        t.addr.is_multiple_of(8),
        "the passive side's region at 0x{:x} is not 8-byte aligned",
        t.addr
    );
    rc_side_connect(&mut side, a.rc.mtu, a.rc.gid_idx, &rem)?;
    let r = Remote {
        t,
        rkey: if a.fault == Some(Fault::Rkey) {
            t.rkey ^ 0x5a5a_0000
        } else {
            t.rkey
        },
        wait,
    };

    // RDMA READ.
    for &size in &a.sizes {
        let size = size as usize;
        let mut expected = vec![0u8; size];
        for k in 0..a.reads {
            let off = read_offset(k, size, data_len);
            let what = format!("RDMA READ {k} of {size} bytes at data offset {off}");
            let buf = read(&mut side, &r, DATA_OFF as u64 + off, size, &what)?;
            fill_pattern(t.seed, off, &mut expected);
            check_read(&what, &buf, &expected)?;
        }
        say(
            tag,
            format_args!("rdma-read verified: {} reads of {size} bytes", a.reads),
        );
        oob.send(&format!("progress read {size}"))?;
    }

    // Fetch-and-add.
    let mut cur = t.cnt0;
    for i in 0..a.fetch_adds {
        let what = format!("fetch-add {i}");
        let got = atomic(&mut side, &r, WrOpcode::AtomicFetchAndAdd, 0, ADD, 0, &what)?;
        ensure!(
            got == cur,
            "{what}: returned 0x{got:016x}, expected 0x{cur:016x}"
        );
        cur = cur.wrapping_add(ADD);
    }
    oob.send("progress fetch-add")?;

    // Compare-and-swap: success, then failure on the stale compare value.
    let swap = t.cas0 ^ SWAP_XOR;
    let what = "compare-and-swap (must swap)";
    let got = atomic(
        &mut side,
        &r,
        WrOpcode::AtomicCmpAndSwp,
        CAS_OFF,
        t.cas0,
        swap,
        what,
    )?;
    ensure!(
        got == t.cas0,
        "{what}: returned 0x{got:016x}, expected 0x{:016x}",
        t.cas0
    );
    let what = "compare-and-swap (must not swap)";
    let got = atomic(
        &mut side,
        &r,
        WrOpcode::AtomicCmpAndSwp,
        CAS_OFF,
        t.cas0,
        !swap,
        what,
    )?;
    ensure!(
        got == swap,
        "{what}: returned 0x{got:016x}, expected the current 0x{swap:016x}"
    );
    let what = "RDMA READ of the compare-and-swap word";
    let buf = read(&mut side, &r, CAS_OFF as u64, 8, what)?;
    check_read(what, &buf, &swap.to_ne_bytes())?;
    oob.send("progress cmp-swap")?;

    // The passive side's report.
    let add = if a.fault == Some(Fault::Add) {
        ADD + 1
    } else {
        ADD
    };
    oob.send(&format!("done {} {add:016x} {swap:016x}", a.fetch_adds))?;
    let line = oob.recv("\"final COUNTER WORD\"")?;
    let w = words(&line, "final", 2)?;
    let cnt = hex_field(&line, "counter", w[0], 64)?;
    let cas = hex_field(&line, "compare-and-swap word", w[1], 64)?;
    ensure!(
        cnt == cur,
        "the passive side's counter is 0x{cnt:016x}, expected 0x{cur:016x}"
    );
    ensure!(
        cas == swap,
        "the passive side's compare-and-swap word is 0x{cas:016x}, expected 0x{swap:016x}"
    );
    oob.send("ok")?;
    say(
        tag,
        format_args!(
            "fetch-add verified: {} ops, counter 0x{:016x} -> 0x{cur:016x} (the responder agrees)",
            a.fetch_adds, t.cnt0
        ),
    );
    say(
        tag,
        format_args!(
            "cmp-swap verified: swapped 0x{:016x} -> 0x{swap:016x}, refused when stale",
            t.cas0
        ),
    );
    Ok(())
}

/// `--loopback`: the passive side (the server, on a thread) and the
/// active side over two in-process devices.
fn run_loopback(a: &Args) -> Result<()> {
    let args = a.clone();
    pingpong::run_loopback(a.rc.mtu, move |t, role, tag| run(&args, t, role, tag)).map(|_| ())
}

/// Runs what `a` asks for: both sides in-process with `--loopback`, else
/// one side on the PCI device (the active one with a host argument).
fn run_args(a: &Args) -> Result<()> {
    if a.rc.loopback {
        return run_loopback(a);
    }
    pingpong::run_on_pci(a.rc.pci.as_deref(), a.host.as_deref(), a.port, |t, role| {
        run(a, t, role, "")
    })
}

fn main() -> ExitCode {
    tools::init_tracing();
    tools::exit_code("vrnic-rdma", run_args(&Args::parse()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn address_messages_round_trip_in_the_documented_format() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: Gid::from(Ipv4Addr::new(10, 0, 0, 2)),
        };
        let c = active_msg(&d);
        assert_eq!(c, "0000:000011:abcdef:00000000000000000000ffff0a000002");
        assert_eq!(parse_active_msg(&c).unwrap(), d);
        let t = Target {
            addr: 0x7f00_1234_5000,
            rkey: 0xdead_beef,
            len: 64 + 1048576 + 8192,
            seed: 0x0102_0304,
            cnt0: counter0(0x0102_0304),
            cas0: !counter0(0x0102_0304),
        };
        let s = passive_msg(&d, &t);
        assert_eq!(
            s,
            "0000:000011:abcdef:00000000000000000000ffff0a000002:00007f0012345000:deadbeef:00102040:01020304:01020304ffffff00:fefdfcfb000000ff"
        );
        assert!(s.len() < tools::OOB_MAX_LINE);
        assert_eq!(parse_passive_msg(&s).unwrap(), (d, t));
        assert!(parse_passive_msg(&c).is_err());
        assert!(parse_active_msg(&s).is_err());
        assert!(parse_active_msg("0000:1000000:000000:00000000000000000000ffff0a000002").is_err());
        assert!(parse_passive_msg(&s.replace(":deadbeef:", ":1deadbeef:")).is_err());
    }

    #[test]
    fn the_pattern_is_fixed_and_matches_the_c_peer() {
        // The same values are asserted by `rxe-rdma-peer --self-test`.
        let got: Vec<u8> = (0..8).map(|i| pattern_byte(0x1234_5678, i)).collect();
        assert_eq!(got, PATTERN_VECTOR);
        let mut a = vec![0u8; 4097];
        fill_pattern(7, 3, &mut a);
        assert_eq!(a[0], pattern_byte(7, 3));
        assert!(a.windows(2).filter(|w| w[0] == w[1]).count() < 64);
    }

    /// `pattern_byte(0x12345678, 0..8)`.
    const PATTERN_VECTOR: [u8; 8] = [0xdd, 0x9b, 0x73, 0x22, 0xa4, 0x03, 0x8e, 0x1e];

    #[test]
    fn read_offsets_stay_inside_the_region_and_vary() {
        for size in [1usize, 4097, 1 << 20] {
            let data_len = size + SLACK;
            let offs: Vec<u64> = (0..4).map(|k| read_offset(k, size, data_len)).collect();
            for &o in &offs {
                assert!(o as usize + size <= data_len, "{size} at {o}");
            }
            assert_ne!(offs[0], offs[1]);
        }
        assert_eq!(read_offset(5, 10, 10), 0, "no slack: offset 0");
    }

    #[test]
    fn read_checks_name_guard_and_data_corruption() {
        let mut expected = vec![0u8; 100];
        fill_pattern(9, 0, &mut expected);
        let mut buf = vec![GUARD_FILL; GUARD + 100 + GUARD];
        buf[GUARD..GUARD + 100].copy_from_slice(&expected);
        check_read("r", &buf, &expected).unwrap();
        let mut b = buf.clone();
        b[GUARD - 1] ^= 1;
        assert!(check_read("r", &b, &expected)
            .unwrap_err()
            .to_string()
            .contains("guard byte 1 before"));
        let mut b = buf.clone();
        b[GUARD + 100] ^= 1;
        assert!(check_read("r", &b, &expected)
            .unwrap_err()
            .to_string()
            .contains("guard byte 0 after"));
        let mut b = buf.clone();
        b[GUARD + 42] ^= 1;
        let e = check_read("r", &b, &expected).unwrap_err().to_string();
        assert!(
            e.contains("mismatch at byte 42") && e.contains("1 of 100"),
            "{e}"
        );
    }

    #[test]
    fn options_parse_and_refuse_bad_values() {
        let a = Args::try_parse_from(["vrnic-rdma"]).unwrap();
        assert_eq!(a.sizes, vec![1, 4097, 1 << 20]);
        assert_eq!(
            (a.port, a.reads, a.fetch_adds, a.rc.mtu),
            (18517, 2, 100, 3)
        );
        let a = Args::try_parse_from(["vrnic-rdma", "-s", "0x10,3", "10.0.0.1"]).unwrap();
        assert_eq!((a.sizes.clone(), a.max_size()), (vec![16, 3], 16));
        assert_eq!(a.host.as_deref(), Some("10.0.0.1"));
        for bad in [
            &["-s", "0"][..],
            &["-s", "1,,2"],
            &["-n", "0"],
            &["-m", "1500"],
            &["-s", "2000000000"],
        ] {
            let mut v = vec!["vrnic-rdma"];
            v.extend_from_slice(bad);
            assert!(Args::try_parse_from(v).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn protocol_words_are_checked() {
        assert_eq!(words("done 3 a b", "done", 3).unwrap(), vec!["3", "a", "b"]);
        assert!(words("done 3 a", "done", 3).is_err());
        assert!(words("final 1 2", "done", 2).is_err());
    }
}
