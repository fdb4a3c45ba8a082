//! `vrnic-agent`: owns a vrnic device and serves several programs on it,
//! each in a device context of its own ([`vrnic_guest::agent`]; device
//! spec §5.x.6.13). vrnic's `libibverbs.so.1` starts it on first use in a
//! VM; it exits after `--linger` seconds without programs.
//!
//! In a VM: `vrnic-agent [--pci BDF] [--socket PATH]` (root). On a host,
//! for tests and development: `vrnic-agent --loopback
//! netdev=IF,ip=A.B.C.D/N --socket PATH` runs an in-process device on an
//! AF_PACKET link and reaches the programs' memory with
//! `process_vm_readv(2)`. In a container or a host process:
//! `vrnic-agent --vhost-user SOCKET --socket PATH` is the frontend of the
//! daemon's function behind `SOCKET`, and adds each program's memory file to
//! the daemon's memory table (`MODE_FILE`); vrnic's `libibverbs.so.1`
//! starts it on first use there too.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use vrnic_guest::agent::{self, client::AgentTransport, procmem::ProcessMemory, server::Agent};
use vrnic_guest::loopback::{self, LoopbackTransport};
use vrnic_guest::pci::PciTransport;
use vrnic_guest::transport::Transport;
use vrnic_guest::vhost_user::VhostUserTransport;

/// Serve a vrnic device to several programs.
#[derive(Parser, Debug)]
#[command(name = "vrnic-agent", version)]
struct Args {
    /// PCI address of the device (default: the first vrnic found).
    #[arg(long)]
    pci: Option<String>,
    /// An in-process device instead: `netdev=IF,ip=A.B.C.D/N[,mac=..][,mtu=M]`.
    #[arg(long, conflicts_with = "pci")]
    loopback: Option<String>,
    /// The function behind this daemon's vhost-user socket instead (a
    /// container, a host process).
    #[arg(long, conflicts_with_all = ["pci", "loopback"])]
    vhost_user: Option<PathBuf>,
    /// The socket to listen on (default: /run/vrnic/agent.sock, or
    /// /run/vrnic/agent-BDF.sock with --pci).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print what the agent at --socket serves (programs, and the objects
    /// on its device, all programs together) and exit.
    #[arg(long)]
    status: bool,
    /// Real-time priority (SCHED_FIFO) of the agent, 0 for none. A program
    /// that posts a doorbell through the agent and then spins (on its CQ,
    /// or on memory a peer writes) would otherwise hold a one-vCPU guest's
    /// CPU for its whole time slice before the agent forwards it. The
    /// agent only ever runs briefly per message.
    #[arg(long, default_value_t = 1)]
    rt: i32,
    /// Exit after this many seconds without programs (0: never).
    #[arg(long, default_value_t = 10)]
    linger: u64,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| agent::default_socket(args.pci.as_deref()));
    if args.status {
        let st = AgentTransport::status(&socket)
            .with_context(|| format!("asking the agent at {}", socket.display()))?;
        let u = st.usage;
        println!(
            "programs {} pinned {} contexts {} pds {} mrs {} cqs {} qps {} ahs {} srqs {} mr_pages {}",
            st.programs, st.pinned, u.ctxs, u.pds, u.mrs, u.cqs, u.qps, u.ahs, u.srqs, u.mr_pages
        );
        return Ok(());
    }
    let mut shared = None;
    let mut vu_shared = None;
    let (dev, procmem): (Box<dyn Transport>, _) = match (&args.loopback, &args.vhost_user) {
        (_, Some(sock)) => {
            let t = VhostUserTransport::open_shared(sock)
                .with_context(|| format!("opening the function behind {}", sock.display()))?;
            vu_shared = t.shared_doorbells();
            (Box::new(t), None)
        }
        (Some(spec), None) => {
            let (netdev, cfg) = loopback::parse_spec(spec).map_err(anyhow::Error::msg)?;
            let link = vrnic::link::PacketLink::open(&netdev)
                .with_context(|| format!("opening {netdev}"))?;
            let pm = Arc::new(ProcessMemory::default());
            let t = LoopbackTransport::with_device_memory(cfg, Box::new(link), pm.clone())?;
            (Box::new(t), Some(pm))
        }
        (None, None) => {
            let t = match PciTransport::open_shared(args.pci.as_deref()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(
                        "no shared doorbell queue ({e}); doorbells go through the agent"
                    );
                    match PciTransport::open(args.pci.as_deref()) {
                        Ok(t) => t,
                        // Another agent (another program's, started at the same
                        // moment) holds the device: the programs wait for it
                        // rather than fail (agent::client::EXIT_DEVICE_BUSY).
                        Err(e) if e.to_string().contains("in use by another process") => {
                            tracing::info!("{e}: another agent has the device");
                            std::process::exit(vrnic_guest::agent::client::EXIT_DEVICE_BUSY);
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            shared = t.shared_doorbells();
            (Box::new(t), None)
        }
    };
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    if args.rt > 0 {
        let p = libc::sched_param {
            sched_priority: args.rt,
        };
        // SAFETY: sets this thread's policy; `p` is a valid sched_param.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } != 0 {
            tracing::warn!(
                "SCHED_FIFO {}: {}; doorbells wait for spinning programs' time slices",
                args.rt,
                std::io::Error::last_os_error()
            );
        }
    }
    let linger = (args.linger > 0).then(|| Duration::from_secs(args.linger));
    let mut a = Agent::new(dev, socket.clone(), procmem, linger)
        .with_context(|| format!("listening on {}", socket.display()))?;
    if let Some(db) = shared {
        a.share_doorbells(db);
    }
    if args.vhost_user.is_some() {
        a.share_files();
    }
    if let Some(db) = vu_shared {
        a.share_vhost_user_doorbells(db);
    }
    tracing::info!("serving on {}", socket.display());
    let stats = a.run(&STOP)?;
    tracing::info!(?stats, "stopped");
    Ok(())
}
