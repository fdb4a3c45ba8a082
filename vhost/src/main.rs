//! `vrnic`: the vrnic vhost-user daemon. Serves one software RoCEv2 RNIC to
//! a QEMU guest over a vhost-user socket, sending and receiving frames on a
//! TAP device or an existing interface, and serves its counters on a
//! management socket (`--stats-socket`, default `<socket>.stats`).
//!
//! `vrnic stats --socket PATH` prints a running daemon's counters.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args, Parser, Subcommand};
use tracing::info;
use tracing_subscriber::EnvFilter;
use vrnic::abi;
use vrnic::device::{Device, DeviceConfig};
use vrnic::link::{Link, PacketLink, PcapLink, TapLink};
use vrnic_vhost::addr::{Ipv4Prefix, Mac};
use vrnic_vhost::server::{self, Stopper};
use vrnic_vhost::stats::{self, StatsServer};
use vrnic_vhost::{BackendConfig, VrnicBackend};

/// How long `vrnic stats` waits for the daemon's answer.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);

/// The vrnic vhost-user daemon: a software RoCEv2 RDMA NIC for a QEMU guest.
///
/// Without a command, runs the daemon (the options below). Logs go to
/// stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more.
#[derive(Debug, Parser)]
#[command(name = "vrnic", version)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
#[command(after_help = "Read a running daemon's counters with `vrnic stats --socket PATH`.")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    daemon: Option<DaemonArgs>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a running daemon's counters, one `name value` line each.
    ///
    /// The engine's (tx_frames, rx_frames, rx_dropped, icrc_errors,
    /// cmd_errors, retransmits, naks_sent, naks_received, rnr_naks_sent,
    /// rnr_naks_received, duplicates), then the vhost-user side's
    /// (commands, rejected_chains, faulted_commands, doorbells,
    /// bad_doorbells, events_delivered, events_dropped, bad_event_buffers,
    /// link_tx_errors, link_rx_errors, device_resets, engine_panics,
    /// device_stops, device_resumes, rx_dropped_stopped, device_lost,
    /// lost_requests); all since the
    /// daemon started.
    Stats(StatsArgs),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("daemon").required(true).args(["socket", "stats_socket"])))]
struct StatsArgs {
    /// The daemon's vhost-user socket (its --socket); the counters are read
    /// from the stats socket next to it, PATH.stats.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The daemon's stats socket, for a daemon started with --stats-socket.
    #[arg(long, value_name = "PATH", conflicts_with = "socket")]
    stats_socket: Option<PathBuf>,
}

impl StatsArgs {
    fn path(&self) -> Option<PathBuf> {
        match (&self.stats_socket, &self.socket) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(s)) => Some(stats::default_socket(s)),
            (None, None) => None,
        }
    }
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("link").required(true).args(["tap", "netdev"])))]
#[command(group(ArgGroup::new("vhost").required(true).args(["socket", "connect"])))]
struct DaemonArgs {
    /// vhost-user socket to listen on (a stale socket there is replaced);
    /// QEMU connects to it. A guest does not survive a restart of the
    /// daemon this way (see --connect).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// vhost-user socket to connect to: QEMU listens on it
    /// (`-chardev socket,...,server=on,wait=on`). The daemon retries until
    /// the socket is there and connects again whenever the connection
    /// ends, so a restarted daemon finds its running guest again.
    #[arg(long, value_name = "PATH", conflicts_with = "socket")]
    connect: Option<PathBuf>,
    /// Send and receive frames on this TAP device (created if missing).
    #[arg(long, value_name = "NAME")]
    tap: Option<String>,
    /// Send and receive frames on this existing interface (AF_PACKET).
    #[arg(long, value_name = "IFNAME")]
    netdev: Option<String>,
    /// The port's IPv4 address and prefix length, e.g. 10.0.0.1/24.
    #[arg(long, value_name = "ADDR/PREFIX")]
    ip: Ipv4Prefix,
    /// Further IPv6 addresses of the port (GID indices 2, 3, ...; repeatable).
    /// The link-local GID (index 0) exists without it.
    #[arg(long, value_name = "ADDR")]
    ipv6: Vec<std::net::Ipv6Addr>,
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
    /// Serve the counters on this Unix socket, for `vrnic stats`
    /// [default: the --socket path followed by .stats].
    #[arg(long, value_name = "PATH")]
    stats_socket: Option<PathBuf>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match (cli.command, cli.daemon) {
        (Some(Command::Stats(args)), _) => print_stats(&args, &mut std::io::stdout().lock()),
        (None, Some(daemon)) => run_daemon(daemon),
        // clap requires the daemon's options when no command is given.
        (None, None) => bail!("no command and no daemon options; see --help"),
    }
}

/// `vrnic stats`: reads the counters from a running daemon and writes
/// them to `out`, checked to be `name value` lines.
fn print_stats(args: &StatsArgs, out: &mut impl Write) -> Result<()> {
    let Some(path) = args.path() else {
        bail!("one of --socket or --stats-socket is required");
    };
    let reply = stats::query(&path, STATS_TIMEOUT)
        .map_err(|e| anyhow::anyhow!("{e} (is a vrnic daemon serving its counters there?)"))?;
    for (name, value) in stats::parse(&reply)? {
        writeln!(out, "{name} {value}")?;
    }
    out.flush()?;
    Ok(())
}

fn run_daemon(cli: DaemonArgs) -> Result<()> {
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
        ipv6: cli.ipv6.clone(),
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

    let (mut listener, socket) = match (&cli.socket, &cli.connect) {
        (Some(s), _) => (Some(server::bind(s)?), absolute(s)),
        (None, Some(c)) => (None, absolute(c)),
        // clap requires one of them.
        (None, None) => bail!("one of --socket or --connect is required"),
    };
    let stats_path = cli
        .stats_socket
        .clone()
        .unwrap_or_else(|| stats::default_socket(&socket));
    // Reads the worker's published snapshot; never locks the data path.
    let stats_server = StatsServer::start(&stats_path, backend.stats_board())?;
    if listener.is_some() {
        info!(mac = %mac, ip = %cli.ip, mtu = cli.mtu, "vrnic listening on {}", socket.display());
        println!("vrnic: listening on {}", socket.display());
    } else {
        info!(mac = %mac, ip = %cli.ip, mtu = cli.mtu, "vrnic connecting to {}", socket.display());
        println!(
            "vrnic: connecting to {} (QEMU listens there)",
            socket.display()
        );
    }
    println!(
        "vrnic: counters on {} (vrnic stats --stats-socket {})",
        stats_server.path().display(),
        stats_server.path().display()
    );
    println!("QEMU arguments:");
    println!(
        "{}",
        qemu_args(&socket, listener.is_none(), cli.virtio_id, cli.queue_size)
    );

    let s = stopper.clone();
    std::thread::Builder::new()
        .name("vrnic-signals".into())
        .spawn(move || wait_for_stop_signal(signals, &s))
        .context("cannot start the signal thread")?;

    let backend = match listener.as_mut() {
        Some(l) => server::run(l, backend, &stopper, cli.once)?,
        None => server::run_client(&socket, backend, &stopper, cli.once)?,
    };
    let stats = backend.stats();
    let dstats = backend.device_stats();
    info!(?stats, ?dstats, "vrnic exiting");
    // Dropping the listener and the stats server removes their sockets.
    drop(listener);
    drop(stats_server);
    Ok(())
}

/// The QEMU command-line fragment that attaches a guest to this daemon.
/// With `qemu_listens` (`--connect`), QEMU is the socket's server and waits
/// for the daemon's first connection before it starts the guest
/// (`server=on,wait=on`; QEMU's `qemu_chr_wait_connected`).
fn qemu_args(socket: &Path, qemu_listens: bool, virtio_id: u32, queue_size: u16) -> String {
    let server = if qemu_listens {
        ",server=on,wait=on"
    } else {
        ""
    };
    format!(
        "-object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem \
         -chardev socket,id=vr0,path={}{server} \
         -device vhost-user-test-device-pci,id=vrnic0,chardev=vr0,virtio-id={virtio_id},num_vqs={},vq_size={queue_size},config_size={}",
        socket.display(),
        abi::NUM_QUEUES,
        size_of::<abi::ConfigSpace>(),
    )
}

fn open_link(cli: &DaemonArgs) -> Result<Box<dyn Link>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::fd::RawFd;
    use std::time::Instant;

    use vrnic::link::MemLink;
    use vrnic_vhost::frontend::{test_device_config, FrontendOptions, TestDaemon};

    const WAIT: Duration = Duration::from_secs(10);

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("vrnic").chain(args.iter().copied()))
    }

    #[test]
    fn the_daemon_command_line_is_unchanged() {
        let cli = parse(&["--socket", "s", "--ip", "10.0.0.1/24", "--tap", "t0"]).unwrap();
        assert!(cli.command.is_none());
        let d = cli.daemon.unwrap();
        assert_eq!(d.socket, Some(PathBuf::from("s")));
        assert_eq!(d.tap.as_deref(), Some("t0"));
        assert_eq!((d.mtu, d.once, d.stats_socket), (1500, false, None));
        let with = parse(&[
            "--socket",
            "s",
            "--ip",
            "10.0.0.1/24",
            "--netdev",
            "eth0",
            "--stats-socket",
            "/run/x",
        ])
        .unwrap();
        assert_eq!(
            with.daemon.unwrap().stats_socket,
            Some(PathBuf::from("/run/x"))
        );
        let c = parse(&["--connect", "q", "--ip", "10.0.0.1/24", "--tap", "t0"]).unwrap();
        let c = c.daemon.unwrap();
        assert_eq!((c.socket, c.connect), (None, Some(PathBuf::from("q"))));
        for bad in [
            &[
                "--socket",
                "s",
                "--connect",
                "q",
                "--ip",
                "10.0.0.1/24",
                "--tap",
                "t",
            ][..],
            &["--socket", "s", "--ip", "10.0.0.1/24"],
            &["--socket", "s", "--ip", "10.0.0.1", "--tap", "t"],
            &[
                "--socket",
                "s",
                "--ip",
                "10.0.0.1/24",
                "--tap",
                "t",
                "--netdev",
                "n",
            ],
            &["--ip", "10.0.0.1/24", "--tap", "t"],
            &[],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn the_stats_command_takes_one_socket() {
        let cli = parse(&["stats", "--socket", "/run/vr.sock"]).unwrap();
        let Some(Command::Stats(a)) = cli.command else {
            panic!("not the stats command");
        };
        assert_eq!(a.path(), Some(PathBuf::from("/run/vr.sock.stats")));
        let cli = parse(&["stats", "--stats-socket", "/run/st"]).unwrap();
        let Some(Command::Stats(a)) = cli.command else {
            panic!("not the stats command");
        };
        assert_eq!(a.path(), Some(PathBuf::from("/run/st")));
        for bad in [
            &["stats"][..],
            &["stats", "--socket", "a", "--stats-socket", "b"],
            &["stats", "--socket", "a", "--tap", "t"],
            &["--socket", "a", "stats"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} is refused");
        }
    }

    /// An ARP request for 10.0.0.1 from 10.0.0.2.
    fn arp_request() -> Vec<u8> {
        let peer_mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
        let mut f = Vec::new();
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&peer_mac);
        f.extend_from_slice(&[0x08, 0x06]);
        f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&peer_mac);
        f.extend_from_slice(&[10, 0, 0, 2]);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&[10, 0, 0, 1]);
        f.resize(60, 0);
        f
    }

    fn wait_readable(fd: RawFd, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) == 1 }
    }

    fn counters(args: &StatsArgs) -> String {
        let mut out = Vec::new();
        print_stats(args, &mut out).expect("vrnic stats");
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn vrnic_stats_shows_an_arp_exchange() {
        let (link, mut peer) = MemLink::pair();
        let d = TestDaemon::with_device_and_stats(test_device_config(), Box::new(link)).unwrap();
        let args = StatsArgs {
            socket: Some(d.socket().to_path_buf()),
            stats_socket: None,
        };
        assert_eq!(args.path().as_deref(), d.stats_socket());
        let before = counters(&args);
        assert!(before.lines().any(|l| l == "rx_frames 0"), "{before}");

        let mut fe = d.connect(&FrontendOptions::default()).unwrap();
        use vrnic::link::Link;
        peer.send(&arp_request()).unwrap();
        let fd = peer.raw_fd().expect("MemLink has an eventfd");
        let deadline = Instant::now() + WAIT;
        let mut buf = vec![0u8; 2048];
        let reply = loop {
            if let Some(n) = peer.recv(&mut buf).unwrap() {
                break buf[..n].to_vec();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero() && wait_readable(fd, left),
                "no ARP reply within {WAIT:?}"
            );
        };
        assert_eq!(&reply[20..22], &[0, 2], "an ARP reply");
        // The worker publishes at the end of each wake-up, one after the
        // other: once a command (a later wake-up) is answered, the ARP
        // exchange is in the published snapshot, and once a second one is,
        // the first command is too.
        fe.control(abi::CMD_QUERY_DEVICE, &[]).unwrap();
        fe.control(abi::CMD_QUERY_DEVICE, &[]).unwrap();

        let out = counters(&args);
        let lines: Vec<&str> = out.lines().collect();
        for want in ["rx_frames 1", "tx_frames 1", "rx_dropped 0", "cmd_errors 0"] {
            assert!(lines.contains(&want), "{want:?} missing from:\n{out}");
        }
        assert!(
            lines.contains(&"commands 1") || lines.contains(&"commands 2"),
            "commands 1 or 2 in:\n{out}"
        );
        assert_eq!(lines.len(), stats::COUNTERS, "{out}");
        drop(fe);
        let b = d.stop(WAIT).unwrap();
        assert_eq!(b.device_stats().rx_frames, 1);
    }

    #[test]
    fn vrnic_stats_without_a_daemon_fails_cleanly() {
        let args = StatsArgs {
            socket: None,
            stats_socket: Some(PathBuf::from("/nonexistent/vrnic.stats")),
        };
        let mut out = Vec::new();
        let e = print_stats(&args, &mut out).unwrap_err();
        assert!(
            format!("{e:#}").contains("/nonexistent/vrnic.stats"),
            "{e:#}"
        );
        assert!(out.is_empty());
    }
}
