//! The guest agent: one process owns a vrnic device and serves several
//! programs, each in a device context of its own (device spec §5.x.6.13).
//!
//! A virtqueue has one driver, so programs cannot share the device's
//! queues directly. `vrnic-agent` ([`server::Agent`]) opens the device
//! (the only process that does) and listens on a Unix socket
//! (`SOCK_SEQPACKET`). Each program connects ([`client::AgentTransport`],
//! what vrnic's `libibverbs.so.1` uses in a VM); the agent opens a device
//! context for it, forwards its commands and doorbells tagged with that
//! context, and routes the device's events to it by the context they name.
//! Data never passes through the agent: the device reads WQEs and buffers
//! and writes CQEs straight in the program's memory, as before.
//!
//! When a program goes away (exit, crash, SIGKILL: its socket closes), the
//! agent closes its context, which destroys every object it had
//! (`CMD_CLOSE_CTX`), and only then lets its pinned pages go: the program
//! hands the agent a descriptor that holds its DMA pins ([`pin::Pins`], an
//! `io_uring` whose registered buffers are long-term page pins), so a
//! killed program's pages cannot be reused by the kernel while the device
//! may still write them.
//!
//! Two memory modes ([`proto::Welcome::mode`]):
//! - [`proto::MODE_PHYS`] (a VM): device addresses are guest-physical; the
//!   program translates its own pages (`/proc/self/pagemap`, as root).
//! - [`proto::MODE_PROCESS`] (an agent over an in-process device, for tests
//!   and development on a host): a device address is `ctx << 48 | virtual
//!   address`, and the agent reaches the program's memory with
//!   `process_vm_readv(2)`/`process_vm_writev(2)` ([`procmem`]).

pub mod client;
pub mod pin;
pub mod procmem;
pub mod proto;
pub mod server;
pub mod ucma;

/// Environment variable naming the agent's socket a program connects to.
pub const SOCKET_ENV: &str = "VRNIC_AGENT_SOCKET";
/// Environment variable naming the agent binary a program starts when no
/// agent answers (`off`: do not use an agent; open the device directly).
pub const AGENT_BIN_ENV: &str = "VRNIC_AGENT";
/// Where the agent binary is installed in a vrnic guest.
pub const DEFAULT_AGENT_BIN: &str = "/usr/lib/vrnic/vrnic-agent";
/// Directory of the agents' sockets and logs in a guest.
pub const RUN_DIR: &str = "/run/vrnic";

/// The socket of the agent serving the function behind the daemon's
/// vhost-user socket `vhost_user` (a container, a host process):
/// `$TMPDIR/vrnic-UID/agent-HASH.sock`, `HASH` the FNV-1a hash of the
/// socket's path (made absolute), so every process of this user naming
/// that function finds the same agent.
pub fn vhost_user_socket(vhost_user: &std::path::Path) -> std::path::PathBuf {
    vhost_user_socket_in(&std::env::temp_dir(), vhost_user)
}

/// [`vhost_user_socket`] under temporary directory `tmp` instead of
/// `$TMPDIR`.
pub fn vhost_user_socket_in(
    tmp: &std::path::Path,
    vhost_user: &std::path::Path,
) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let abs = std::path::absolute(vhost_user).unwrap_or_else(|_| vhost_user.to_path_buf());
    let hash = abs
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    tmp.join(format!("vrnic-{uid}"))
        .join(format!("agent-{hash:016x}.sock"))
}

/// The socket of the agent serving PCI function `bdf` (`None`: the first
/// vrnic function), in [`RUN_DIR`].
pub fn default_socket(bdf: Option<&str>) -> std::path::PathBuf {
    let name = match bdf {
        Some(b) => format!("agent-{}.sock", b.replace(':', "_")),
        None => "agent.sock".to_string(),
    };
    std::path::Path::new(RUN_DIR).join(name)
}

/// The agent socket a program of this process reaches, chosen as vrnic's
/// `libibverbs.so.1` chooses it: [`SOCKET_ENV`] if set; else the agent of
/// the function behind `VRNIC_VHOST_USER` ([`vhost_user_socket`], a
/// container); else the agent of PCI function `VRNIC_PCI` (unset: the
/// first vrnic function; [`default_socket`], a VM).
pub fn socket_from_env() -> std::path::PathBuf {
    if let Some(s) = std::env::var_os(SOCKET_ENV) {
        return s.into();
    }
    if let Some(s) = crate::vhost_user::socket_from_env() {
        return vhost_user_socket(&s);
    }
    default_socket(std::env::var("VRNIC_PCI").ok().as_deref())
}
