//! `vrnic-flood`: a hostile frontend, for measuring what one costs the
//! others (issue 27). Connects to a running daemon's function as its
//! vhost-user frontend (the test frontend, `vrnic_frontend`) and
//! keeps its control queue a ring ahead of the device, without waiting
//! for it (pausing `--pause-us` between moves of the avail index, so the
//! flood itself takes next to no CPU), with one command that costs the device milliseconds and fails:
//! a `REG_MR` of `--pages` pages whose last page is unaligned (the device
//! reads and checks the whole page list before it refuses it, keeping
//! nothing). Runs until `--seconds` pass or SIGTERM/SIGINT, then prints
//! how often it moved the avail index and how many commands the device
//! served (`vrnic stats` of the function's stats socket, if it has one).
//!
//! `scripts/bench.sh` (mode `flood`) measures a second pair's
//! `ib_send_lat` with and without it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use vrnic::abi::{self, Pod};
use vrnic::mem::DmaMemory;
use vrnic_frontend::{FrontendOptions, TestFrontend};

/// Command line.
#[derive(Debug, Parser)]
#[command(about = "Flood a vrnic function's control queue (a hostile frontend, for benchmarks)")]
struct Args {
    /// The function's vhost-user socket.
    #[arg(long)]
    socket: PathBuf,
    /// Pages of each REG_MR's page list (the device reads 8 bytes a page).
    #[arg(long, default_value_t = 1 << 16)]
    pages: u32,
    /// Sleep between two moves of the avail index, µs: the queue stays a
    /// ring ahead of a device that takes milliseconds a command, and the
    /// flood costs this process next to no CPU (0: spin).
    #[arg(long, default_value_t = 1000)]
    pause_us: u64,
    /// Stop after this many seconds (0: at SIGTERM or SIGINT only).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        (2..=1 << 19).contains(&args.pages),
        "--pages must be 2..=524288"
    );
    let list_bytes = u64::from(args.pages) * 8;
    let opts = FrontendOptions {
        memory: vec![(
            0x4000_0000,
            (list_bytes as usize + (8 << 20)).next_multiple_of(4096),
        )],
        ..Default::default()
    };
    let mut fe = TestFrontend::connect(&args.socket, &opts)
        .with_context(|| format!("connecting to {}", args.socket.display()))?;
    let (h, pd) = fe.control(abi::CMD_ALLOC_PD, &[])?;
    ensure!(h.status == abi::STATUS_OK, "ALLOC_PD: status {}", h.status);
    let list = fe.memory_mut().alloc(list_bytes, 4096)?;
    let page = fe.memory_mut().alloc(4096, 4096)?;
    let mut entries: Vec<u8> = (0..args.pages).flat_map(|_| page.to_le_bytes()).collect();
    let last = entries.len() - 8;
    entries[last..].copy_from_slice(&(page + 1).to_le_bytes());
    fe.memory().mem().write(list, &entries)?;
    let reg = abi::RegMr {
        pdn: u32::from_le_bytes(pd.get(..4).context("ALLOC_PD body")?.try_into()?),
        access: abi::ACCESS_LOCAL_WRITE,
        iova: 0,
        length: u64::from(args.pages) * 4096,
        page_shift: 12,
        npages: args.pages,
        page_list: list,
    };
    let (h, _) = fe.control(abi::CMD_REG_MR, reg.as_bytes())?;
    ensure!(
        h.status == abi::STATUS_EINVAL,
        "the flood's REG_MR should fail with EINVAL, got status {}",
        h.status
    );

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGINT] {
        signal_hook_flag(sig, stop.clone())?;
    }
    if args.seconds > 0 {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(args.seconds));
            stop.store(true, Ordering::Relaxed);
        });
    }
    let moves = fe.flood_control(
        abi::CMD_REG_MR,
        reg.as_bytes(),
        &stop,
        Duration::from_micros(args.pause_us),
    )?;
    let served = vrnic_vhost::stats::query(
        &vrnic_vhost::stats::default_socket(&args.socket),
        Duration::from_secs(5),
    )
    .ok()
    .and_then(|r| {
        r.lines()
            .find_map(|l| l.strip_prefix("commands ")?.trim().parse::<u64>().ok())
    });
    match served {
        Some(n) => {
            println!("vrnic-flood: {moves} avail index moves; the function served {n} commands")
        }
        None => println!("vrnic-flood: {moves} avail index moves"),
    }
    Ok(())
}

/// Sets `flag` when `sig` arrives (the flood loop checks it).
fn signal_hook_flag(sig: libc::c_int, flag: Arc<AtomicBool>) -> Result<()> {
    use std::sync::OnceLock;
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    let _ = FLAG.set(flag);
    extern "C" fn on_signal(_: libc::c_int) {
        if let Some(f) = FLAG.get() {
            f.store(true, Ordering::Relaxed);
        }
    }
    // SAFETY: installs a handler that only stores to an atomic.
    let r = unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    ensure!(r != libc::SIG_ERR, "cannot handle signal {sig}");
    Ok(())
}
