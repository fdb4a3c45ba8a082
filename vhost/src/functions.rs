//! Many functions per daemon (issue 10): one `vrnic` process serves up to
//! [`MAX_FUNCTIONS`] vrnic devices, each a **function** with its own
//! vhost-user socket, MAC, IPv4 and IPv6 addresses (hence GIDs), stats
//! socket, [`Device`] and worker thread, all on one uplink through the
//! embedded [`Switch`].
//!
//! - Fairness between functions comes from each having its own worker
//!   thread (scheduled by the kernel like any thread); each function's
//!   resources are bounded by the per-device limits of [`vrnic::device`]
//!   (`MAX_QP`, `MAX_MR`, ... and the transport's budgets), as a function
//!   of a physical NIC has its own.
//! - Functions are declared at start-up ([`FunctionSpec`], the daemon's
//!   `--function`) and added or removed while the daemon runs
//!   ([`Functions::add`], [`Functions::del`]; the control socket,
//!   [`crate::control`]).
//! - Deleting a function stops its server: a connected frontend's
//!   connection is shut down, its worker joined, its device, memory table,
//!   switch port, sockets and pcap file freed, within [`STOP_TIMEOUT`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use tracing::{info, warn};
use vrnic::device::{Device, DeviceConfig};
use vrnic::link::{Link, PcapLink};

use crate::addr::{AddrError, Ipv4Prefix, Mac};
use crate::backend::{BackendConfig, VrnicBackend};
use crate::poll_group::PollGroup;
use crate::server::{self, ServeError, Stopper};
use crate::stats::{self, Snapshot, StatsBoard, StatsServer};
use crate::switch::{PortStats, Switch, SwitchError, MAX_PORTS};

/// Most functions one daemon serves (the switch's port limit).
pub const MAX_FUNCTIONS: usize = MAX_PORTS;
/// Most IPv6 addresses of one function (GID indices 2 and up).
pub const MAX_IPV6: usize = 16;
/// Longest function specification accepted, bytes.
pub const MAX_SPEC_LEN: usize = 4096;
/// Longest function name, bytes.
pub const MAX_NAME_LEN: usize = 64;
/// How long deleting a function waits for its server to stop.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of function specifications and of adding or deleting functions.
#[derive(Debug, thiserror::Error)]
pub enum FunctionError {
    /// The specification is not `key=value,...` as [`FunctionSpec`] says.
    #[error("bad function specification: {0}")]
    Spec(SpecError),
    /// The daemon has [`MAX_FUNCTIONS`] functions.
    #[error("the daemon has its maximum of {MAX_FUNCTIONS} functions")]
    TooMany,
    /// Another function has this name, socket or address.
    #[error("{what} {value} is already used by function {name}")]
    Duplicate {
        /// "name", "socket", "stats socket", "MAC", "IPv4 address" or "IPv6 address".
        what: &'static str,
        /// The value both have.
        value: String,
        /// The other function.
        name: String,
    },
    /// No function has this name or socket.
    #[error("no function {0}")]
    NotFound(String),
    /// The switch refused the port.
    #[error(transparent)]
    Switch(#[from] SwitchError),
    /// Setting the function up failed (socket, stats server, pcap file).
    #[error("cannot set up function {name}: {msg}")]
    Setup {
        /// The function.
        name: String,
        /// What failed.
        msg: String,
    },
    /// The function's server did not stop within [`STOP_TIMEOUT`], or
    /// failed.
    #[error("function {name} did not stop cleanly: {msg}")]
    Stop {
        /// The function.
        name: String,
        /// What happened.
        msg: String,
    },
}

/// Why a function specification does not parse ([`FunctionError::Spec`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// Longer than [`MAX_SPEC_LEN`] bytes.
    #[error("longer than {max} bytes")]
    TooLong {
        /// [`MAX_SPEC_LEN`].
        max: usize,
    },
    /// Whitespace or control characters anywhere.
    #[error("whitespace or control characters")]
    BadCharacters,
    /// A comma-separated part without `=`.
    #[error("{part:?} is not key=value")]
    NotKeyValue {
        /// The part.
        part: String,
    },
    /// A key that may be given once, given again.
    #[error("{key}= given twice")]
    Twice {
        /// The key.
        key: &'static str,
    },
    /// `socket=` and `connect=` together, or either twice.
    #[error("give socket= or connect=, once")]
    SocketTwice,
    /// A path key with an empty value or one with a NUL byte.
    #[error("{key}= needs a path")]
    NeedsPath {
        /// The key (`socket`, `connect`, `stats` or `pcap`).
        key: &'static str,
    },
    /// `ip=` or `mac=` that does not parse.
    #[error(transparent)]
    Addr(AddrError),
    /// `ipv6=` that does not parse.
    #[error("{input:?} is not an IPv6 address")]
    Ipv6 {
        /// The value given.
        input: String,
    },
    /// More than [`MAX_IPV6`] `ipv6=`.
    #[error("more than {max} ipv6=")]
    TooManyIpv6 {
        /// [`MAX_IPV6`].
        max: usize,
    },
    /// A `name=` that is not 1 to [`MAX_NAME_LEN`] letters, digits, `.`,
    /// `_` or `-`.
    #[error("name {name:?}: 1 to {MAX_NAME_LEN} letters, digits, '.', '_' or '-'")]
    BadName {
        /// The name given.
        name: String,
    },
    /// A key the specification does not have.
    #[error("unknown key {key:?}")]
    UnknownKey {
        /// The key (truncated to 32 characters).
        key: String,
    },
    /// `stats=` names the vhost-user socket.
    #[error("the stats socket is the vhost-user socket")]
    StatsIsSocket,
    /// Neither `socket=` nor `connect=`.
    #[error("socket= or connect= is required")]
    NoSocket,
    /// No `ip=`.
    #[error("ip= is required")]
    NoIp,
}

fn spec_err(e: SpecError) -> FunctionError {
    FunctionError::Spec(e)
}

/// One function as declared: `key=value` pairs separated by commas, e.g.
/// `socket=/run/vr1.sock,ip=10.0.0.1/24,mac=02:76:0a:00:00:01`.
///
/// Keys: `socket=PATH` (vhost-user socket to listen on) or `connect=PATH`
/// (a socket QEMU listens on, `-chardev socket,...,server=on`: the daemon
/// connects to it, waits while it is not there and connects again after
/// each connection, so a guest survives a restart of the daemon; one of
/// the two is required), `ip=ADDR/PREFIX` (required), `mac=XX:XX:XX:XX:XX:XX` (default 02:76
/// and the IPv4 address), `ipv6=ADDR` (repeatable, at most [`MAX_IPV6`]),
/// `name=NAME` (letters, digits, `.`, `_`, `-`; default from the socket's
/// file name, [`FunctionSpec::name`]), `stats=PATH` (default `<socket>.stats`), `pcap=PATH` (record
/// this function's frames). Values may not contain `,` or whitespace; at
/// most [`MAX_SPEC_LEN`] bytes in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSpec {
    /// The function's name (unique in the daemon).
    pub name: Option<String>,
    /// The vhost-user socket.
    pub socket: PathBuf,
    /// The daemon connects to `socket` (QEMU listens) instead of listening
    /// on it (`connect=PATH` in the text form; the single function's
    /// `--connect`).
    pub connect: bool,
    /// IPv4 address and prefix length.
    pub ip: Ipv4Prefix,
    /// MAC address; `None` for [`Mac::from_ipv4`].
    pub mac: Option<Mac>,
    /// Further IPv6 addresses (GID indices 2, 3, ...).
    pub ipv6: Vec<Ipv6Addr>,
    /// The stats socket; `None` for `<socket>.stats`.
    pub stats_socket: Option<PathBuf>,
    /// A pcap file for the function's frames.
    pub pcap: Option<PathBuf>,
}

impl FunctionSpec {
    /// A specification with only the required parts.
    pub fn new(socket: impl Into<PathBuf>, ip: Ipv4Prefix) -> Self {
        Self {
            name: None,
            socket: socket.into(),
            connect: false,
            ip,
            mac: None,
            ipv6: Vec::new(),
            stats_socket: None,
            pcap: None,
        }
    }

    /// The MAC the function gets.
    pub fn mac(&self) -> Mac {
        self.mac.unwrap_or_else(|| Mac::from_ipv4(self.ip.addr))
    }

    /// The function's name: `name=`, else the socket's file name with
    /// every character a name may not have replaced by `_`, cut to
    /// [`MAX_NAME_LEN`] bytes (when another function has that name,
    /// [`Functions::add`] appends `-2`, `-3`, ...).
    pub fn name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let file = self
            .socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut n: String = file
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .take(MAX_NAME_LEN - 4)
            .collect();
        if n.is_empty() {
            n.push('f');
        }
        n
    }

    /// The stats socket the function gets.
    pub fn stats_path(&self) -> PathBuf {
        self.stats_socket
            .clone()
            .unwrap_or_else(|| stats::default_socket(&self.socket))
    }
}

fn check_name(n: &str) -> Result<(), FunctionError> {
    let ok = !n.is_empty()
        && n.len() <= MAX_NAME_LEN
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(spec_err(SpecError::BadName {
            name: n.to_string(),
        }))
    }
}

fn check_path(key: &'static str, v: &str) -> Result<PathBuf, FunctionError> {
    if v.is_empty() || v.contains('\0') {
        return Err(spec_err(SpecError::NeedsPath { key }));
    }
    Ok(PathBuf::from(v))
}

impl FromStr for FunctionSpec {
    type Err = FunctionError;

    fn from_str(s: &str) -> Result<Self, FunctionError> {
        if s.len() > MAX_SPEC_LEN {
            return Err(spec_err(SpecError::TooLong { max: MAX_SPEC_LEN }));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(spec_err(SpecError::BadCharacters));
        }
        let (mut socket, mut ip) = (None, None);
        let unset = Ipv4Prefix {
            addr: std::net::Ipv4Addr::UNSPECIFIED,
            len: 32,
        };
        let mut spec = FunctionSpec::new(PathBuf::new(), unset);
        for part in s.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                spec_err(SpecError::NotKeyValue {
                    part: part.to_string(),
                })
            })?;
            let dup = |key: &'static str| spec_err(SpecError::Twice { key });
            match k {
                "socket" | "connect" => {
                    let key = if k == "socket" { "socket" } else { "connect" };
                    if socket.replace(check_path(key, v)?).is_some() {
                        return Err(spec_err(SpecError::SocketTwice));
                    }
                    spec.connect = k == "connect";
                }
                "ip" => {
                    if ip
                        .replace(v.parse::<Ipv4Prefix>().map_err(spec_err_addr)?)
                        .is_some()
                    {
                        return Err(dup("ip"));
                    }
                }
                "mac" => {
                    if spec
                        .mac
                        .replace(v.parse().map_err(spec_err_addr)?)
                        .is_some()
                    {
                        return Err(dup("mac"));
                    }
                }
                "ipv6" => {
                    let a: Ipv6Addr = v.parse().map_err(|_| {
                        spec_err(SpecError::Ipv6 {
                            input: v.to_string(),
                        })
                    })?;
                    if spec.ipv6.len() >= MAX_IPV6 {
                        return Err(spec_err(SpecError::TooManyIpv6 { max: MAX_IPV6 }));
                    }
                    spec.ipv6.push(a);
                }
                "name" => {
                    check_name(v)?;
                    if spec.name.replace(v.to_string()).is_some() {
                        return Err(dup("name"));
                    }
                }
                "stats" => {
                    if spec.stats_socket.replace(check_path("stats", v)?).is_some() {
                        return Err(dup("stats"));
                    }
                }
                "pcap" => {
                    if spec.pcap.replace(check_path("pcap", v)?).is_some() {
                        return Err(dup("pcap"));
                    }
                }
                other => {
                    return Err(spec_err(SpecError::UnknownKey {
                        key: other.chars().take(32).collect(),
                    }))
                }
            }
        }
        spec.socket = socket.ok_or_else(|| spec_err(SpecError::NoSocket))?;
        spec.ip = ip.ok_or_else(|| spec_err(SpecError::NoIp))?;
        Ok(spec)
    }
}

fn spec_err_addr(e: AddrError) -> FunctionError {
    spec_err(SpecError::Addr(e))
}

impl fmt::Display for FunctionSpec {
    /// The text form [`FunctionSpec::from_str`] parses.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.connect { "connect" } else { "socket" };
        write!(f, "{key}={},ip={}", self.socket.display(), self.ip)?;
        if let Some(m) = self.mac {
            write!(f, ",mac={m}")?;
        }
        for a in &self.ipv6 {
            write!(f, ",ipv6={a}")?;
        }
        if let Some(n) = &self.name {
            write!(f, ",name={n}")?;
        }
        if let Some(p) = &self.stats_socket {
            write!(f, ",stats={}", p.display())?;
        }
        if let Some(p) = &self.pcap {
            write!(f, ",pcap={}", p.display())?;
        }
        Ok(())
    }
}

/// Settings every function of a daemon shares.
#[derive(Debug, Clone)]
pub struct FunctionsConfig {
    /// Link MTU, bytes.
    pub link_mtu: u32,
    /// Backend settings (largest virtqueue size).
    pub backend: BackendConfig,
}

impl Default for FunctionsConfig {
    fn default() -> Self {
        Self {
            link_mtu: 1500,
            backend: BackendConfig::default(),
        }
    }
}

/// A function as [`Functions::list`] shows it.
#[derive(Debug, Clone)]
pub struct FunctionInfo {
    /// Name.
    pub name: String,
    /// The vhost-user socket (absolute).
    pub socket: PathBuf,
    /// The daemon connects to `socket` ([`FunctionSpec::connect`]).
    pub connect: bool,
    /// The stats socket.
    pub stats_socket: PathBuf,
    /// MAC address.
    pub mac: Mac,
    /// IPv4 address and prefix.
    pub ip: Ipv4Prefix,
    /// Further IPv6 addresses.
    pub ipv6: Vec<Ipv6Addr>,
    /// Whether a frontend is connected.
    pub connected: bool,
    /// The device's and backend's counters, as last published.
    pub counters: Snapshot,
    /// The function's switch port counters.
    pub port: PortStats,
}

impl fmt::Display for FunctionInfo {
    /// One line: `name=.. socket=..|connect=.. mac=.. ip=.. [ipv6=..]... connected=yes|no
    /// stats=.. tx_frames=.. rx_frames=.. rx_dropped=.. retransmits=..
    /// switch_tx_local=.. switch_tx_uplink=.. switch_rx_local=..
    /// switch_rx_uplink=.. switch_rx_dropped=.. switch_tx_busy=..`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "name={} {}={} mac={} ip={}",
            self.name,
            if self.connect { "connect" } else { "socket" },
            self.socket.display(),
            self.mac,
            self.ip
        )?;
        for a in &self.ipv6 {
            write!(f, " ipv6={a}")?;
        }
        write!(
            f,
            " connected={} stats={}",
            if self.connected { "yes" } else { "no" },
            self.stats_socket.display()
        )?;
        for n in ["tx_frames", "rx_frames", "rx_dropped", "retransmits"] {
            write!(f, " {n}={}", self.counters.get(n).unwrap_or(0))?;
        }
        let p = &self.port;
        write!(
            f,
            " switch_tx_local={} switch_tx_uplink={} switch_rx_local={} switch_rx_uplink={} switch_rx_dropped={} switch_tx_busy={}",
            p.tx_local, p.tx_uplink, p.rx_local, p.rx_uplink, p.rx_queue_dropped, p.tx_busy
        )
    }
}

struct Function {
    name: String,
    socket: PathBuf,
    connect: bool,
    stats_path: PathBuf,
    mac: Mac,
    ip: Ipv4Prefix,
    ipv6: Vec<Ipv6Addr>,
    stopper: Stopper,
    board: Arc<StatsBoard>,
    done: mpsc::Receiver<Result<VrnicBackend, ServeError>>,
    thread: thread::JoinHandle<()>,
    stats: StatsServer,
}

impl Function {
    fn info(&self, switch: &Switch) -> FunctionInfo {
        FunctionInfo {
            name: self.name.clone(),
            socket: self.socket.clone(),
            connect: self.connect,
            stats_socket: self.stats_path.clone(),
            mac: self.mac,
            ip: self.ip,
            ipv6: self.ipv6.clone(),
            connected: self.stopper.connected(),
            counters: self.board.read(),
            port: switch.port_stats(self.mac.0).unwrap_or_default(),
        }
    }

    /// Stops the server (a connected frontend's connection is shut down),
    /// waits up to `timeout`, then drops everything the function had.
    fn stop(self, timeout: Duration) -> Result<(), FunctionError> {
        self.stopper.stop();
        let stop_err = |msg: String| FunctionError::Stop {
            name: self.name.clone(),
            msg,
        };
        let r = match self.done.recv_timeout(timeout) {
            Ok(r) => r,
            // The thread keeps its backend; it ends when the server does.
            Err(e) => return Err(stop_err(format!("not within {timeout:?}: {e}"))),
        };
        let _ = self.thread.join();
        // Dropping the backend frees the device, its memory table and the
        // switch port; the stats server's drop removes its socket.
        drop(self.stats);
        match r {
            Ok(backend) => {
                drop(backend);
                info!(function = %self.name, "function removed");
                Ok(())
            }
            Err(e) => Err(stop_err(e.to_string())),
        }
    }
}

/// The functions of one daemon and the switch they share.
pub struct Functions {
    switch: Switch,
    /// The functions' workers poll for each other ([`crate::poll_group`]).
    poll_group: Arc<PollGroup>,
    cfg: FunctionsConfig,
    table: Mutex<BTreeMap<String, Function>>,
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

impl Functions {
    /// No function yet, on `uplink`.
    pub fn new(uplink: Box<dyn Link>, cfg: FunctionsConfig) -> Self {
        Self {
            switch: Switch::new(uplink),
            poll_group: Arc::new(PollGroup::new()),
            cfg,
            table: Mutex::new(BTreeMap::new()),
        }
    }

    /// The switch.
    pub fn switch(&self) -> &Switch {
        &self.switch
    }

    fn table(&self) -> MutexGuard<'_, BTreeMap<String, Function>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a function and starts serving its socket (listening, or
    /// connecting for [`FunctionSpec::connect`]) until it is deleted.
    ///
    /// # Errors
    /// [`FunctionError::TooMany`], [`FunctionError::Duplicate`] (name,
    /// socket, stats socket, MAC, IPv4 or IPv6 address of another
    /// function), [`FunctionError::Switch`] or [`FunctionError::Setup`].
    pub fn add(&self, spec: &FunctionSpec) -> Result<FunctionInfo, FunctionError> {
        self.add_with(spec, false, None)
    }

    /// [`Functions::add`]; with `once`, the server ends after its first
    /// connection (the daemon's `--once`); `on_end` fires when the server
    /// ends by itself (`once`, or an error), so the daemon can end with it.
    ///
    /// # Errors
    /// As [`Functions::add`].
    pub fn add_with(
        &self,
        spec: &FunctionSpec,
        once: bool,
        on_end: Option<Stopper>,
    ) -> Result<FunctionInfo, FunctionError> {
        let socket = absolute(&spec.socket);
        let stats_path = absolute(&spec.stats_path());
        let mac = spec.mac();
        let mut table = self.table();
        if table.len() >= MAX_FUNCTIONS {
            return Err(FunctionError::TooMany);
        }
        let name = match &spec.name {
            Some(n) => n.clone(),
            // A default name is made unique (at most MAX_FUNCTIONS tries).
            None => {
                let base = spec.name();
                (1..=MAX_FUNCTIONS + 1)
                    .map(|i| match i {
                        1 => base.clone(),
                        i => format!("{base}-{i}"),
                    })
                    .find(|n| !table.contains_key(n))
                    .unwrap_or(base)
            }
        };
        check_name(&name)?;
        for f in table.values() {
            let dup = |what, value: String| FunctionError::Duplicate {
                what,
                value,
                name: f.name.clone(),
            };
            if f.name == name {
                return Err(dup("name", name));
            }
            if f.socket == socket || f.stats_path == socket {
                return Err(dup("socket", socket.display().to_string()));
            }
            if f.stats_path == stats_path || f.socket == stats_path {
                return Err(dup("stats socket", stats_path.display().to_string()));
            }
            if f.mac == mac {
                return Err(dup("MAC", mac.to_string()));
            }
            if f.ip.addr == spec.ip.addr {
                return Err(dup("IPv4 address", spec.ip.addr.to_string()));
            }
            if let Some(a) = spec.ipv6.iter().find(|a| f.ipv6.contains(a)) {
                return Err(dup("IPv6 address", a.to_string()));
            }
        }
        if socket == stats_path {
            return Err(spec_err(SpecError::StatsIsSocket));
        }
        let setup = |msg: String| FunctionError::Setup {
            name: name.clone(),
            msg,
        };

        let port = self.switch.add_port(mac.0)?;
        let link: Box<dyn Link> = match &spec.pcap {
            None => Box::new(port),
            Some(path) => {
                // Guest traffic: the owner's only (mode 0600 from the
                // start, and for a file that was there before).
                use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(path)
                    .and_then(|f| {
                        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
                        Ok(f)
                    })
                    .map_err(|e| setup(format!("cannot create {}: {e}", path.display())))?;
                Box::new(
                    PcapLink::new(Box::new(port), file)
                        .map_err(|e| setup(format!("cannot write {}: {e}", path.display())))?,
                )
            }
        };
        let device = Device::new(DeviceConfig {
            mac: mac.0,
            ipv4: spec.ip.addr,
            prefix_len: spec.ip.len,
            ipv6: spec.ipv6.clone(),
            link_mtu: self.cfg.link_mtu,
        });
        let mut backend =
            VrnicBackend::new(device, link, self.cfg.backend).map_err(|e| setup(e.to_string()))?;
        backend.set_poll_group(self.poll_group.clone());
        let board = backend.stats_board();
        let mut listener = if spec.connect {
            None
        } else {
            Some(server::bind(&socket).map_err(|e| setup(e.to_string()))?)
        };
        let (sw, port_mac) = (self.switch.clone(), mac.0);
        let extra: stats::ExtraCounters = Arc::new(move || {
            let p = sw.port_stats(port_mac).unwrap_or_default();
            // The daemon's uplink, shared by every function: its own
            // counters (vrnic::link::LinkStats).
            let l = sw.uplink_link_stats().unwrap_or_default();
            vec![
                ("switch_tx_local", p.tx_local),
                ("switch_tx_uplink", p.tx_uplink),
                ("switch_tx_runt", p.tx_runt),
                ("switch_rx_local", p.rx_local),
                ("switch_rx_uplink", p.rx_uplink),
                ("switch_rx_dropped", p.rx_queue_dropped),
                ("switch_tx_busy", p.tx_busy),
                ("switch_rx_unattended", p.rx_unattended),
                ("switch_rx_stale_refs", p.rx_stale_refs),
                ("link_tx_frames", l.tx_frames),
                ("link_tx_super", l.tx_super),
                ("link_tx_dropped", l.tx_dropped),
                ("link_rx_frames", l.rx_frames),
                ("link_rx_super", l.rx_super),
                ("link_rx_dropped", l.rx_dropped),
                ("link_rx_oversize", l.rx_oversize),
                ("link_rx_malformed", l.rx_malformed),
            ]
        });
        let stats = StatsServer::start_with(&stats_path, board.clone(), Some(extra))
            .map_err(|e| setup(e.to_string()))?;
        let stopper = Stopper::new().map_err(|e| setup(format!("stop event: {e}")))?;
        let (tx, done) = mpsc::channel();
        let s = stopper.clone();
        let target = socket.clone();
        // The server's lines (frontend connected, ended, refused) name
        // their function.
        let span = tracing::info_span!("function", name = %name);
        let thread = thread::Builder::new()
            .name(format!(
                "vrnic-fn-{}",
                name.chars().take(8).collect::<String>()
            ))
            .spawn(move || {
                let _in_function = span.enter();
                let r = match listener.as_mut() {
                    Some(l) => server::run(l, backend, &s, once),
                    None => server::run_client(&target, backend, &s, once),
                };
                if let Err(e) = &r {
                    warn!("function server failed: {e}");
                }
                // The listener's drop removes the socket file.
                drop(listener);
                let _ = tx.send(r);
                if let Some(d) = on_end {
                    d.stop();
                }
            })
            .map_err(|e| setup(format!("cannot start its thread: {e}")))?;
        let f = Function {
            name: name.clone(),
            socket,
            connect: spec.connect,
            stats_path,
            mac,
            ip: spec.ip,
            ipv6: spec.ipv6.clone(),
            stopper,
            board,
            done,
            thread,
            stats,
        };
        let info = f.info(&self.switch);
        info!(function = %name, mac = %mac, ip = %spec.ip, "function added");
        table.insert(name, f);
        Ok(info)
    }

    /// Deletes the function named `key` (or whose socket is `key`): stops
    /// its server, shutting down a connected frontend's connection, and
    /// frees everything it had, waiting at most [`STOP_TIMEOUT`].
    ///
    /// # Errors
    /// [`FunctionError::NotFound`] or [`FunctionError::Stop`] (the function
    /// is gone from the table either way).
    pub fn del(&self, key: &str) -> Result<(), FunctionError> {
        let f = {
            let mut table = self.table();
            let name = if table.contains_key(key) {
                Some(key.to_string())
            } else {
                let abs = absolute(Path::new(key));
                table
                    .values()
                    .find(|f| f.socket == abs)
                    .map(|f| f.name.clone())
            };
            name.and_then(|n| table.remove(&n))
                .ok_or_else(|| FunctionError::NotFound(key.chars().take(256).collect()))?
        };
        // Outside the table's lock: listing and adding go on meanwhile.
        f.stop(STOP_TIMEOUT)
    }

    /// Every function, by name.
    pub fn list(&self) -> Vec<FunctionInfo> {
        self.table()
            .values()
            .map(|f| f.info(&self.switch))
            .collect()
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether there is no function.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Deletes every function (as [`Functions::del`]); returns the errors.
    pub fn shutdown(&self) -> Vec<FunctionError> {
        let all: Vec<Function> = std::mem::take(&mut *self.table()).into_values().collect();
        all.into_iter()
            .filter_map(|f| f.stop(STOP_TIMEOUT).err())
            .collect()
    }
}

impl Drop for Functions {
    fn drop(&mut self) {
        for e in self.shutdown() {
            warn!("{e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_parses_and_prints_back() {
        let s: FunctionSpec =
            "socket=/run/a.sock,ip=10.0.0.1/24,mac=02:00:00:00:00:01,ipv6=fd00::1,ipv6=fd00::2,name=a-1,stats=/run/a.st,pcap=/tmp/a.pcap"
                .parse()
                .unwrap();
        assert_eq!(s.socket, PathBuf::from("/run/a.sock"));
        assert_eq!(s.ip.to_string(), "10.0.0.1/24");
        assert_eq!(s.mac().0, [2, 0, 0, 0, 0, 1]);
        assert_eq!(s.ipv6.len(), 2);
        assert_eq!(s.name(), "a-1");
        assert_eq!(s.stats_path(), PathBuf::from("/run/a.st"));
        assert_eq!(s.to_string().parse::<FunctionSpec>().unwrap(), s);
        let d: FunctionSpec = "ip=10.0.0.2/24,socket=/run/b.sock".parse().unwrap();
        assert_eq!(d.name(), "b.sock");
        let odd = FunctionSpec::new("/run/a b\u{e9}.sock", d.ip);
        assert_eq!(odd.name(), "a_b_.sock");
        check_name(&FunctionSpec::new("/", d.ip).name()).unwrap();
        check_name(&FunctionSpec::new(format!("/{}", "x".repeat(300)), d.ip).name()).unwrap();
        assert_eq!(d.mac().0, [2, 0x76, 10, 0, 0, 2]);
        assert_eq!(d.stats_path(), PathBuf::from("/run/b.sock.stats"));
        assert!(!d.connect);
        let c: FunctionSpec = "connect=/run/qemu.sock,ip=10.0.0.3/24".parse().unwrap();
        assert!(c.connect, "the daemon connects to a socket QEMU listens on");
        assert_eq!(c.socket, PathBuf::from("/run/qemu.sock"));
        assert_eq!(c.to_string(), "connect=/run/qemu.sock,ip=10.0.0.3/24");
        assert_eq!(c.to_string().parse::<FunctionSpec>().unwrap(), c);
        assert_eq!(c.stats_path(), PathBuf::from("/run/qemu.sock.stats"));
    }

    #[test]
    fn bad_specs_are_refused() {
        let long = format!("socket=/{},ip=10.0.0.1/24", "x".repeat(MAX_SPEC_LEN));
        let many = format!(
            "socket=/s,ip=10.0.0.1/24{}",
            ",ipv6=fd00::1".repeat(MAX_IPV6 + 1)
        );
        for bad in [
            "",
            "socket=/s",
            "ip=10.0.0.1/24",
            "socket=/s,ip=10.0.0.1",
            "socket=/s,ip=10.0.0.1/24,mac=01:00:00:00:00:01",
            "socket=/s,ip=10.0.0.1/24,mac=zz",
            "socket=/s,ip=10.0.0.1/24,ipv6=10.0.0.1",
            "socket=/s,ip=10.0.0.1/24,bogus=1",
            "socket=/s,ip=10.0.0.1/24,socket=/t",
            "socket=/s,ip=10.0.0.1/24,connect=/t",
            "connect=/s,ip=10.0.0.1/24,connect=/s",
            "connect=,ip=10.0.0.1/24",
            "connect=/s",
            "socket=,ip=10.0.0.1/24",
            "socket=/s,ip=10.0.0.1/24,name=a b",
            "socket=/s,ip=10.0.0.1/24,name=a/b",
            "socket=/s,ip=10.0.0.1/24,",
            "socket=/s\tx,ip=10.0.0.1/24",
            "socket=/s,,ip=10.0.0.1/24",
            "\u{0}",
            long.as_str(),
            many.as_str(),
        ] {
            assert!(
                matches!(bad.parse::<FunctionSpec>(), Err(FunctionError::Spec(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn spec_errors_say_what_they_said_as_strings() {
        let msg = |s: &str| s.parse::<FunctionSpec>().unwrap_err().to_string();
        for (spec, want) in [
            ("socket=/s", "ip= is required"),
            ("ip=10.0.0.1/24", "socket= or connect= is required"),
            (
                "socket=/s,ip=10.0.0.1",
                "\"10.0.0.1\" is not an IPv4 address with a prefix length (e.g. 10.0.0.1/24)",
            ),
            ("socket=/s,ip=10.0.0.1/24,bogus=1", "unknown key \"bogus\""),
            (
                "socket=/s,ip=10.0.0.1/24,connect=/t",
                "give socket= or connect=, once",
            ),
            (
                "socket=/s,ip=10.0.0.1/24,name=a,name=b",
                "name= given twice",
            ),
            ("connect=,ip=10.0.0.1/24", "connect= needs a path"),
            ("socket=/s,,ip=10.0.0.1/24", "\"\" is not key=value"),
            (
                "socket=/s,ip=10.0.0.1/24,ipv6=x",
                "\"x\" is not an IPv6 address",
            ),
            (
                "socket=/s,ip=10.0.0.1/24,name=a b",
                "whitespace or control characters",
            ),
            (
                "socket=/s,ip=10.0.0.1/24,name=a/b",
                "name \"a/b\": 1 to 64 letters, digits, '.', '_' or '-'",
            ),
        ] {
            assert_eq!(msg(spec), format!("bad function specification: {want}"));
        }
    }
}
