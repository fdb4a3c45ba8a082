//! `vrnic`: the vrnic vhost-user daemon. Serves one software RoCEv2 RNIC to
//! a QEMU guest over a vhost-user socket, sending and receiving frames on a
//! TAP device or an existing interface.
//!
//! TODO: a `vrnic stats --socket PATH` subcommand reading the device's and
//! backend's counters through a control socket next to the vhost-user one
//! (the counters exist: `VrnicBackend::stats` and `device_stats`).

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Parser};
use tracing::info;
use tracing_subscriber::EnvFilter;
use vrnic::abi;
use vrnic::device::{Device, DeviceConfig};
use vrnic::link::{Link, PacketLink, PcapLink, TapLink};
use vrnic_vhost::addr::{Ipv4Prefix, Mac};
use vrnic_vhost::server::{self, Stopper};
use vrnic_vhost::{BackendConfig, VrnicBackend};

/// The vrnic vhost-user daemon: a software RoCEv2 RDMA NIC for a QEMU guest.
///
/// Logs go to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
#[derive(Debug, Parser)]
#[command(name = "vrnic", version)]
#[command(group(ArgGroup::new("link").required(true).args(["tap", "netdev"])))]
struct Cli {
    /// vhost-user socket to listen on (a stale socket there is replaced).
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,
    /// Send and receive frames on this TAP device (created if missing).
    #[arg(long, value_name = "NAME")]
    tap: Option<String>,
    /// Send and receive frames on this existing interface (AF_PACKET).
    #[arg(long, value_name = "IFNAME")]
    netdev: Option<String>,
    /// The port's IPv4 address and prefix length, e.g. 10.0.0.1/24.
    #[arg(long, value_name = "ADDR/PREFIX")]
    ip: Ipv4Prefix,
    /// The port's MAC address [default: 02:76 followed by the IPv4 address].
    #[arg(long, value_name = "XX:XX:XX:XX:XX:XX")]
    mac: Option<Mac>,
    /// Link MTU, bytes (1500 gives RoCE path MTU 1024).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(576..=9000))]
    mtu: u32,
    /// Virtio device ID to give QEMU (only printed in the QEMU arguments).
    #[arg(long, default_value_t = abi::DEFAULT_VIRTIO_ID)]
    virtio_id: u32,
    /// Also write every frame sent and received to this pcap file.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Largest virtqueue size accepted (a power of two, at most 256).
    #[arg(long, default_value_t = abi::MAX_QUEUE_SIZE)]
    queue_size: u16,
    /// Exit when the first frontend disconnects instead of waiting for the next.
    #[arg(long)]
    once: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    // Before any thread starts, so every thread inherits the mask and the
    // signals reach only the signal thread.
    let signals = block_stop_signals()?;
    let stopper = Stopper::new().context("cannot create the stop event")?;

    let mac = cli.mac.unwrap_or_else(|| Mac::from_ipv4(cli.ip.addr));
    let device = Device::new(DeviceConfig {
        mac: mac.0,
        ipv4: cli.ip.addr,
        prefix_len: cli.ip.len,
        link_mtu: cli.mtu,
    });
    let link = open_link(&cli)?;
    let backend = VrnicBackend::new(
        device,
        link,
        BackendConfig {
            queue_size: cli.queue_size,
        },
    )?;

    let mut listener = server::bind(&cli.socket)?;
    let socket = absolute(&cli.socket);
    info!(mac = %mac, ip = %cli.ip, mtu = cli.mtu, "vrnic listening on {}", socket.display());
    println!("vrnic: listening on {}", socket.display());
    println!("QEMU arguments:");
    println!("{}", qemu_args(&socket, cli.virtio_id, cli.queue_size));

    let s = stopper.clone();
    std::thread::Builder::new()
        .name("vrnic-signals".into())
        .spawn(move || wait_for_stop_signal(signals, &s))
        .context("cannot start the signal thread")?;

    let backend = server::run(&mut listener, backend, &stopper, cli.once)?;
    let stats = backend.stats();
    let dstats = backend.device_stats();
    info!(?stats, ?dstats, "vrnic exiting");
    // Dropping the listener removes the socket file.
    drop(listener);
    Ok(())
}

/// The QEMU command-line fragment that attaches a guest to this daemon.
fn qemu_args(socket: &Path, virtio_id: u32, queue_size: u16) -> String {
    format!(
        "-object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
         -chardev socket,id=vr0,path={} \
         -device vhost-user-test-device-pci,chardev=vr0,virtio-id={virtio_id},num_vqs={},vq_size={queue_size},config_size={}",
        socket.display(),
        abi::NUM_QUEUES,
        size_of::<abi::ConfigSpace>(),
    )
}

fn open_link(cli: &Cli) -> Result<Box<dyn Link>> {
    let link: Box<dyn Link> = match (&cli.tap, &cli.netdev) {
        (Some(tap), _) => {
            Box::new(TapLink::open(tap).with_context(|| format!("cannot open TAP device {tap}"))?)
        }
        (None, Some(dev)) => {
            Box::new(PacketLink::open(dev).with_context(|| format!("cannot open interface {dev}"))?)
        }
        (None, None) => bail!("one of --tap or --netdev is required"),
    };
    let Some(path) = &cli.pcap else {
        return Ok(link);
    };
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok(Box::new(PcapLink::new(link, file).with_context(|| {
        format!("cannot write {}", path.display())
    })?))
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Blocks SIGINT and SIGTERM in this thread (and the threads it starts).
fn block_stop_signals() -> Result<libc::sigset_t> {
    // SAFETY: the set is initialised by sigemptyset before use; pthread_sigmask
    // only reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            bail!(
                "cannot block SIGINT/SIGTERM: {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
        Ok(set)
    }
}

/// Waits for SIGINT or SIGTERM, then stops the server.
fn wait_for_stop_signal(set: libc::sigset_t, stopper: &Stopper) {
    let mut sig: libc::c_int = 0;
    loop {
        // SAFETY: `set` is a valid signal set; `sig` is a live c_int.
        let r = unsafe { libc::sigwait(&set, &mut sig) };
        if r == 0 {
            break;
        }
    }
    info!(signal = sig, "stopping");
    stopper.stop();
}
