//! `vrnic`: the vrnic vhost-user daemon. Serves software RoCEv2 RNICs to
//! QEMU guests over vhost-user sockets, one **function** (device) per
//! socket, all sending and receiving frames on one TAP device or existing
//! interface through an embedded switch, and serves each function's
//! counters on a management socket (`--stats-socket`, default
//! `<socket>.stats`) and the daemon's control socket (`--control`, default
//! `<first socket>.control`).
//!
//! `vrnic stats --socket PATH` prints a running daemon's counters;
//! `vrnic function add|del|list --control PATH` changes and lists its
//! functions.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Args, Parser, Subcommand};
use tracing::{info, warn};
use tracing_subscriber::EnvFilter;
use vrnic::abi;
use vrnic::link::{Link, PacketLink, TapLink};
use vrnic_vhost::addr::{Ipv4Prefix, Mac};
use vrnic_vhost::control::{self, ControlServer, Request};
use vrnic_vhost::functions::{FunctionSpec, Functions, FunctionsConfig, MAX_FUNCTIONS};
use vrnic_vhost::server::Stopper;
use vrnic_vhost::stats;
use vrnic_vhost::BackendConfig;

/// How long `vrnic stats` waits for the daemon's answer.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `vrnic function` waits for the daemon's answer (a delete
/// waits up to `functions::STOP_TIMEOUT` for the function to stop).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// The vrnic vhost-user daemon: software RoCEv2 RDMA NICs for QEMU guests.
///
/// Without a command, runs the daemon (the options below). One daemon
/// serves up to 64 functions (devices), each with its own vhost-user
/// socket, addresses, stats socket and worker thread, on one uplink
/// (--tap or --netdev): `--socket S --ip A/N` declares one, each
/// `--function socket=S,ip=A/N,...` another, and `vrnic function add|del`
/// changes them while the daemon runs. Functions reach each other through
/// an embedded switch, not the uplink. Logs go to stderr; set RUST_LOG
/// (e.g. RUST_LOG=debug) for more.
#[derive(Debug, Parser)]
#[command(name = "vrnic", version)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
#[command(
    after_help = "Read a running daemon's counters with `vrnic stats --socket PATH`; list, add and \
                  delete its functions with `vrnic function list|add|del --control PATH`."
)]
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
    /// rnr_naks_received, duplicates, ..., doorbells_ignored and of those
    /// doorbells_foreign: naming another device context's queue, ...),
    /// then the vhost-user side's
    /// (commands, rejected_chains, faulted_commands, doorbells,
    /// bad_doorbells, events_delivered, events_dropped, bad_event_buffers,
    /// link_tx_errors, link_rx_errors, device_resets, engine_panics,
    /// device_stops, device_resumes, rx_dropped_stopped, device_lost,
    /// lost_requests); all since the
    /// daemon started.
    Stats(StatsArgs),
    /// List, add or delete a running daemon's functions (its control socket).
    #[command(subcommand)]
    Function(FunctionCommand),
}

#[derive(Debug, Subcommand)]
enum FunctionCommand {
    /// Print the daemon's limits (a `#` line), then one line per function:
    /// name, socket (`connect=` for one the daemon connects to), MAC, IPv4
    /// and IPv6 addresses, connected=yes|no, its
    /// stats socket and a few counters (the engine's tx_frames, rx_frames,
    /// rx_dropped, retransmits; the switch port's frames to and from other
    /// functions and the uplink, and those dropped for a full queue).
    List(ControlArgs),
    /// Add a function; prints it as `list` does.
    Add(FunctionAddArgs),
    /// Delete a function: a connected frontend's connection is closed, its
    /// worker stopped and everything it had freed.
    Del(FunctionDelArgs),
}

#[derive(Debug, Args)]
struct ControlArgs {
    /// The daemon's control socket (its --control; default
    /// `<first socket>.control`).
    #[arg(long, value_name = "PATH")]
    control: PathBuf,
}

#[derive(Debug, Args)]
struct FunctionAddArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// vhost-user socket the function listens on.
    #[arg(long, value_name = "PATH", required_unless_present = "connect")]
    socket: Option<PathBuf>,
    /// vhost-user socket QEMU listens on (`server=on`): the function
    /// connects to it, as the daemon's --connect.
    #[arg(long, value_name = "PATH", conflicts_with = "socket")]
    connect: Option<PathBuf>,
    /// The function's IPv4 address and prefix length, e.g. 10.0.0.2/24.
    #[arg(long, value_name = "ADDR/PREFIX")]
    ip: Ipv4Prefix,
    /// Its MAC address [default: 02:76 followed by the IPv4 address].
    #[arg(long, value_name = "XX:XX:XX:XX:XX:XX")]
    mac: Option<Mac>,
    /// Further IPv6 addresses (GID indices 2, 3, ...; repeatable, at most 16).
    #[arg(long, value_name = "ADDR")]
    ipv6: Vec<std::net::Ipv6Addr>,
    /// Its name [default: the socket's file name].
    #[arg(long)]
    name: Option<String>,
    /// Its stats socket [default: the --socket or --connect path followed
    /// by .stats].
    #[arg(long, value_name = "PATH")]
    stats_socket: Option<PathBuf>,
    /// Write every frame it sends and receives to this pcap file.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
}

impl FunctionAddArgs {
    fn spec(&self) -> FunctionSpec {
        let socket = self.socket.as_ref().or(self.connect.as_ref());
        FunctionSpec {
            name: self.name.clone(),
            socket: socket.map(|p| absolute(p)).unwrap_or_default(),
            connect: self.connect.is_some(),
            ip: self.ip,
            mac: self.mac,
            ipv6: self.ipv6.clone(),
            stats_socket: self.stats_socket.as_deref().map(absolute),
            pcap: self.pcap.as_deref().map(absolute),
        }
    }
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["socket", "name"])))]
struct FunctionDelArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// The function's vhost-user socket.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The function's name.
    #[arg(long, conflicts_with = "socket")]
    name: Option<String>,
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
#[command(group(ArgGroup::new("vhost").required(true).multiple(true).args(["socket", "connect", "function"])))]
#[command(group(ArgGroup::new("single").args(["socket", "connect"])))]
struct DaemonArgs {
    /// vhost-user socket to listen on (a stale socket there is replaced);
    /// QEMU connects to it. A guest does not survive a restart of the
    /// daemon this way (see --connect). With --ip and the options below
    /// it, the daemon's first function.
    #[arg(long, value_name = "PATH", requires = "ip")]
    socket: Option<PathBuf>,
    /// vhost-user socket to connect to: QEMU listens on it
    /// (`-chardev socket,...,server=on,wait=on`). The daemon retries until
    /// the socket is there and connects again whenever the connection
    /// ends, so a restarted daemon finds its running guest again.
    #[arg(long, value_name = "PATH", conflicts_with = "socket", requires = "ip")]
    connect: Option<PathBuf>,
    /// A further function, `socket=PATH,ip=ADDR/PREFIX` (or
    /// `connect=PATH,...`: QEMU listens on PATH, as with --connect)
    /// followed by any of `,mac=XX:..`, `,ipv6=ADDR` (repeatable),
    /// `,name=NAME`, `,stats=PATH`, `,pcap=PATH` (repeatable; at most 64
    /// functions in all). Each function has its own socket, addresses,
    /// stats socket and worker thread.
    #[arg(long, value_name = "SPEC")]
    function: Vec<FunctionSpec>,
    /// Send and receive frames on this TAP device (created if missing).
    #[arg(long, value_name = "NAME")]
    tap: Option<String>,
    /// Send and receive frames on this existing interface (AF_PACKET).
    #[arg(long, value_name = "IFNAME")]
    netdev: Option<String>,
    /// The port's IPv4 address and prefix length, e.g. 10.0.0.1/24.
    #[arg(long, value_name = "ADDR/PREFIX", requires = "single")]
    ip: Option<Ipv4Prefix>,
    /// Further IPv6 addresses of the port (GID indices 2, 3, ...; repeatable).
    /// The link-local GID (index 0) exists without it.
    #[arg(long, value_name = "ADDR", requires = "single")]
    ipv6: Vec<std::net::Ipv6Addr>,
    /// The port's MAC address [default: 02:76 followed by the IPv4 address].
    #[arg(long, value_name = "XX:XX:XX:XX:XX:XX", requires = "single")]
    mac: Option<Mac>,
    /// Link MTU, bytes (1500 gives RoCE path MTU 1024); every function's.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(576..=9000))]
    mtu: u32,
    /// Virtio device ID to give QEMU (only printed in the QEMU arguments).
    #[arg(long, default_value_t = abi::DEFAULT_VIRTIO_ID)]
    virtio_id: u32,
    /// Also write every frame the --socket/--connect function sends and
    /// receives (to other functions too) to this pcap file; other
    /// functions take `pcap=FILE` in their --function.
    #[arg(long, value_name = "FILE", requires = "single")]
    pcap: Option<PathBuf>,
    /// Largest virtqueue size accepted (a power of two, at most 256).
    #[arg(long, default_value_t = abi::MAX_QUEUE_SIZE)]
    queue_size: u16,
    /// Adaptive polling: after work, each function's worker keeps polling
    /// its queues and link this many microseconds after the last work it
    /// found (yielding the CPU between empty rounds) before it sleeps; 0
    /// sleeps at once. Cuts a blocking wake-up (≈13 µs) out of each
    /// message of a ping-pong.
    #[arg(long, value_name = "US", default_value_t = vrnic_vhost::spin::DEFAULT_POLL_NS / 1000,
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    poll_us: u64,
    /// Exit when the first frontend of the --socket/--connect function
    /// disconnects instead of waiting for the next.
    #[arg(long, requires = "single")]
    once: bool,
    /// Serve the --socket/--connect function's counters on this Unix
    /// socket, for `vrnic stats` [default: the --socket path followed by
    /// .stats].
    #[arg(long, value_name = "PATH", requires = "single")]
    stats_socket: Option<PathBuf>,
    /// The control socket, for `vrnic function add|del|list` [default:
    /// the first function's socket path followed by .control].
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
}

impl DaemonArgs {
    /// The functions declared on the command line: the --socket/--connect
    /// one first, then each --function.
    fn specs(&self) -> Result<Vec<FunctionSpec>> {
        let mut specs = Vec::new();
        if let (Some(path), connect) = match (&self.socket, &self.connect) {
            (Some(s), _) => (Some(s), false),
            (None, c) => (c.as_ref(), true),
        } {
            let Some(ip) = self.ip else {
                bail!("--ip is required with --socket or --connect");
            };
            specs.push(FunctionSpec {
                name: None,
                socket: absolute(path),
                connect,
                ip,
                mac: self.mac,
                ipv6: self.ipv6.clone(),
                stats_socket: self.stats_socket.as_deref().map(absolute),
                pcap: self.pcap.as_deref().map(absolute),
            });
        }
        specs.extend(self.function.iter().map(|f| FunctionSpec {
            socket: absolute(&f.socket),
            stats_socket: f.stats_socket.as_deref().map(absolute),
            pcap: f.pcap.as_deref().map(absolute),
            ..f.clone()
        }));
        if specs.is_empty() {
            bail!("no function: give --socket or --connect with --ip, or --function");
        }
        if specs.len() > MAX_FUNCTIONS {
            bail!("at most {MAX_FUNCTIONS} functions");
        }
        Ok(specs)
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match (cli.command, cli.daemon) {
        (Some(Command::Stats(args)), _) => print_stats(&args, &mut std::io::stdout().lock()),
        (Some(Command::Function(cmd)), _) => function_command(&cmd, &mut std::io::stdout().lock()),
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

/// `vrnic function ...`: one request to the daemon's control socket; the
/// reply's lines go to `out`.
fn function_command(cmd: &FunctionCommand, out: &mut impl Write) -> Result<()> {
    let (path, req) = match cmd {
        FunctionCommand::List(a) => (&a.control, Request::List),
        FunctionCommand::Add(a) => (&a.control.control, Request::Add(a.spec())),
        FunctionCommand::Del(a) => {
            let key = match (&a.name, &a.socket) {
                (Some(n), _) => n.clone(),
                (None, Some(s)) => absolute(s).display().to_string(),
                (None, None) => bail!("one of --socket or --name is required"),
            };
            (&a.control.control, Request::Del(key))
        }
    };
    let lines = control::request(&path.clone(), &req, CONTROL_TIMEOUT).map_err(|e| match e {
        control::ControlError::Refused(m) => anyhow::anyhow!("the daemon refused: {m}"),
        e => anyhow::anyhow!("{e} (is a vrnic daemon serving its control socket there?)"),
    })?;
    for l in lines {
        writeln!(out, "{l}")?;
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

    let specs = cli.specs()?;
    let uplink = open_link(&cli)?;
    let functions = Arc::new(Functions::new(
        uplink,
        FunctionsConfig {
            link_mtu: cli.mtu,
            backend: BackendConfig {
                queue_size: cli.queue_size,
                poll: vrnic_vhost::spin::PollConfig {
                    budget_ns: cli.poll_us * 1000,
                    ..Default::default()
                },
            },
        },
    ));
    for (i, spec) in specs.iter().enumerate() {
        // The daemon ends with the --socket/--connect function's server
        // (with --once, after its first connection; or when it fails), as
        // when that was the daemon's only server.
        let single = i == 0 && (cli.socket.is_some() || cli.connect.is_some());
        let on_end = single.then(|| stopper.clone());
        let f = functions
            .add_with(spec, single && cli.once, on_end)
            .with_context(|| format!("function {}", spec.name()))?;
        if spec.connect {
            info!(mac = %f.mac, ip = %f.ip, mtu = cli.mtu, "vrnic connecting to {}", f.socket.display());
            println!(
                "vrnic: connecting to {} (QEMU listens there)",
                f.socket.display()
            );
        } else {
            info!(mac = %f.mac, ip = %f.ip, mtu = cli.mtu, "vrnic listening on {}", f.socket.display());
            println!("vrnic: listening on {}", f.socket.display());
        }
        println!(
            "vrnic: counters on {} (vrnic stats --stats-socket {})",
            f.stats_socket.display(),
            f.stats_socket.display()
        );
        println!("QEMU arguments:");
        println!(
            "{}",
            qemu_args(&f.socket, spec.connect, cli.virtio_id, cli.queue_size)
        );
    }
    let control_path = cli
        .control
        .as_deref()
        .map(absolute)
        .unwrap_or_else(|| control::default_socket(&specs[0].socket));
    let control = ControlServer::start(&control_path, functions.clone())?;
    println!(
        "vrnic: control socket {} (vrnic function list --control {})",
        control.path().display(),
        control.path().display()
    );

    let s = stopper.clone();
    std::thread::Builder::new()
        .name("vrnic-signals".into())
        .spawn(move || wait_for_stop_signal(signals, &s))
        .context("cannot start the signal thread")?;

    stopper
        .wait(Duration::from_secs(1))
        .context("cannot wait for a stop signal")?;
    // No more requests, then every function stops: connections shut down,
    // workers joined, sockets removed.
    drop(control);
    for f in functions.list() {
        info!(function = %f.name, counters = ?f.counters, port = ?f.port, "function stopping");
    }
    let errors = functions.shutdown();
    for e in &errors {
        warn!("{e}");
    }
    info!(uplink = ?functions.switch().uplink_stats(), "vrnic exiting");
    if let Some(e) = errors.into_iter().next() {
        return Err(e.into());
    }
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

/// The uplink every function's switch port shares. (`--pcap` records the
/// first function's frames at its port: see `FunctionSpec::pcap`.)
fn open_link(cli: &DaemonArgs) -> Result<Box<dyn Link>> {
    Ok(match (&cli.tap, &cli.netdev) {
        (Some(tap), _) => {
            Box::new(TapLink::open(tap).with_context(|| format!("cannot open TAP device {tap}"))?)
        }
        (None, Some(dev)) => {
            Box::new(PacketLink::open(dev).with_context(|| format!("cannot open interface {dev}"))?)
        }
        (None, None) => bail!("one of --tap or --netdev is required"),
    })
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
    use vrnic_frontend::{arp_request_frame, test_device_config, FrontendOptions, TestDaemon};

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
    fn functions_are_declared_with_the_single_function_form_or_alone() {
        let cli = parse(&[
            "--tap",
            "t0",
            "--socket",
            "/run/a.sock",
            "--ip",
            "10.0.0.1/24",
            "--function",
            "socket=/run/b.sock,ip=10.0.0.2/24,name=b",
            "--function",
            "socket=/run/c.sock,ip=10.0.0.3/24",
            "--control",
            "/run/ctl",
        ])
        .unwrap();
        let specs = cli.daemon.unwrap().specs().unwrap();
        let names: Vec<String> = specs.iter().map(FunctionSpec::name).collect();
        assert_eq!(names, ["a.sock", "b", "c.sock"]);
        assert_eq!(specs[0].ip.to_string(), "10.0.0.1/24");
        let alone = parse(&[
            "--netdev",
            "eth0",
            "--function",
            "socket=/run/b.sock,ip=10.0.0.2/24",
        ])
        .unwrap();
        let specs = alone.daemon.unwrap().specs().unwrap();
        assert_eq!(specs.len(), 1);
        assert_eq!(
            control::default_socket(&specs[0].socket),
            PathBuf::from("/run/b.sock.control")
        );
        let f = ["--tap", "t", "--function", "socket=/s,ip=10.0.0.2/24"];
        for extra in [
            &["--ip", "10.0.0.1/24"][..],
            &["--mac", "02:00:00:00:00:01"],
            &["--stats-socket", "/x"],
            &["--pcap", "/x"],
            &["--once"],
            &["--function", "socket=/s"],
            &["--function", "garbage"],
        ] {
            let args: Vec<&str> = f.iter().chain(extra).copied().collect();
            assert!(parse(&args).is_err(), "{args:?} is refused");
        }
    }

    #[test]
    fn the_function_commands_parse() {
        let cli = parse(&[
            "function",
            "add",
            "--control",
            "/c",
            "--socket",
            "s",
            "--ip",
            "10.0.0.2/24",
            "--ipv6",
            "fd00::2",
            "--name",
            "f2",
        ])
        .unwrap();
        let Some(Command::Function(FunctionCommand::Add(a))) = cli.command else {
            panic!("not function add");
        };
        let spec = a.spec();
        assert_eq!(spec.name(), "f2");
        assert!(spec.socket.is_absolute());
        assert_eq!(spec.ipv6.len(), 1);
        assert!(parse(&["function", "list", "--control", "/c"]).is_ok());
        assert!(parse(&["function", "del", "--control", "/c", "--name", "f2"]).is_ok());
        assert!(parse(&["function", "del", "--control", "/c", "--socket", "s"]).is_ok());
        for bad in [
            &["function"][..],
            &["function", "list"],
            &["function", "del", "--control", "/c"],
            &[
                "function",
                "del",
                "--control",
                "/c",
                "--socket",
                "s",
                "--name",
                "n",
            ],
            &["function", "add", "--control", "/c", "--socket", "s"],
            &["function", "add", "--control", "/c", "--ip", "10.0.0.2/24"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn vrnic_function_talks_to_the_control_socket() {
        let dir = std::env::temp_dir().join(format!("vrnic-main-fn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let (uplink, _outside) = MemLink::pair();
        let fns = Arc::new(Functions::new(Box::new(uplink), FunctionsConfig::default()));
        let ctl = dir.join("ctl");
        let server = ControlServer::start(&ctl, fns.clone()).unwrap();
        let run = |args: &[&str]| {
            let cli = parse(args).unwrap();
            let Some(Command::Function(cmd)) = cli.command else {
                panic!("not a function command");
            };
            let mut out = Vec::new();
            function_command(&cmd, &mut out).map(|()| String::from_utf8(out).unwrap())
        };
        let ctl_s = ctl.to_str().unwrap();
        let sock = dir.join("f.sock");
        let sock_s = sock.to_str().unwrap();
        let added = run(&[
            "function",
            "add",
            "--control",
            ctl_s,
            "--socket",
            sock_s,
            "--ip",
            "10.0.0.5/24",
        ])
        .unwrap();
        assert!(added.contains("name=f.sock "), "{added}");
        assert!(sock.exists());
        let e = run(&[
            "function",
            "add",
            "--control",
            ctl_s,
            "--socket",
            sock_s,
            "--ip",
            "10.0.0.6/24",
        ])
        .unwrap_err();
        assert!(format!("{e}").contains("already used"), "{e}");
        let list = run(&["function", "list", "--control", ctl_s]).unwrap();
        assert_eq!(list.lines().count(), 2, "{list}");
        run(&["function", "del", "--control", ctl_s, "--socket", sock_s]).unwrap();
        assert!(!sock.exists());
        let e = run(&["function", "del", "--control", ctl_s, "--name", "f.sock"]).unwrap_err();
        assert!(format!("{e}").contains("no function"), "{e}");
        drop(server);
        let e = run(&["function", "list", "--control", ctl_s]).unwrap_err();
        assert!(format!("{e}").contains("is a vrnic daemon"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
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
        peer.send(&arp_request_frame()).unwrap();
        let fd = peer.caps().fd.expect("MemLink has an eventfd");
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
