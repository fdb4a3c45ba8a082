//! The device list (`ibv_get_device_list(3)`, `ibv_get_device_name(3)`,
//! `ibv_get_device_guid(3)`) and how a device is reached.
//!
//! Which device this library offers:
//! - with `VRNIC_LOOPBACK="netdev=IF,ip=A.B.C.D/N[,mac=xx:..][,mtu=M]"`
//!   (development and host tests): one device, `vrnic0`, run in this
//!   process by guest-lib's `LoopbackTransport` over an AF_PACKET link on
//!   interface `IF`, with IPv4 address `A.B.C.D/N` (GID index 1), the
//!   interface's MAC unless `mac=` is given, and the interface's MTU unless
//!   `mtu=` is given;
//! - with `VRNIC_AGENT_SOCKET=PATH`: one device, `vrnic0`, served by the
//!   guest agent listening at `PATH` (`vrnic-agent`, `vrnic_guest::agent`);
//! - with `VRNIC_VHOST_USER=PATH`, or when `/run/vrnic/vhost-user.sock`
//!   exists (a container with the daemon's socket mounted there, or a
//!   host process): one device, `vrnic0`, the vrnic function behind that
//!   vhost-user socket (`vrnic_guest::vhost_user`; no kernel module, no
//!   privilege). Where the agent binary is installed
//!   (`/usr/lib/vrnic/vrnic-agent`, or `VRNIC_AGENT=PATH`) the function is
//!   reached through an agent that is its frontend (`vrnic-agent
//!   --vhost-user PATH`, started on first use, its socket in
//!   `$TMPDIR/vrnic-UID/`), so several processes share it, each
//!   `ibv_open_device` a context of its own with its own memory file
//!   (`MODE_FILE`); with `VRNIC_AGENT=off`, or without the agent binary,
//!   this process is the frontend itself, and every `ibv_open_device` is a
//!   device context of its own on the process's one connection
//!   (`VhostUserContext`);
//! - otherwise (in a VM) one device per vrnic virtio-pci function
//!   (`VRNIC_PCI=BDF` picks the function, default the first), reached
//!   through the guest agent, which is started on first use
//!   (`/usr/lib/vrnic/vrnic-agent`, or `VRNIC_AGENT=PATH`), so several
//!   processes can use the device at once; with `VRNIC_AGENT=off`, or
//!   without the agent binary, opened directly with guest-lib's user-space
//!   driver (`PciTransport`) by this one process.
//!
//! Devices are created once per process and never freed, as rdma-core keeps
//! its device list; `ibv_free_device_list(3)` frees only the array.

use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

#[cfg(feature = "loopback")]
use vrnic::device::DeviceConfig;
use vrnic_guest::agent::{self, client::AgentTransport};
#[cfg(feature = "loopback")]
use vrnic_guest::loopback::LoopbackTransport;
use vrnic_guest::transport::Transport;

use crate::boundary::{copy_cstr, fail_with_errno, ffi};
use crate::ffi as c;

/// Environment variable selecting the in-process loopback device (feature
/// `loopback`, on by default; without it the variable is an error).
pub const LOOPBACK_ENV: &str = "VRNIC_LOOPBACK";

/// The device's `ibv_device.dev_name`: the name of its node under
/// `/dev/infiniband/` (there is one device per process, index 0).
///
/// Nothing opens the node (this library reaches the device its own way),
/// but UCX (`uct_ib_device_is_accessible`, `src/uct/ib/base/ib_md.c`,
/// UCX 1.13) skips a verbs device unless `/dev/infiniband/<dev_name>`
/// exists, is a character device (`stat(2)`, `S_ISCHR`; symlinks are
/// followed) and is readable and writable (`access(2)`, `R_OK | W_OK`).
/// Any character device passes, e.g. `/dev/null`: on a host, as root,
/// `ln -s /dev/null /dev/infiniband/vrnic-uverbs0`; in a container,
/// `podman run --device /dev/null:/dev/infiniband/vrnic-uverbs0`; in a
/// VM guest the library makes it itself ([`ensure_uverbs_node`]). The
/// name is not a kernel one (`uverbsN`), so it never hides or is hidden by
/// a real RDMA device's node.
pub const UVERBS_NODE: &str = "vrnic-uverbs0";

/// Where device nodes of verbs devices live (rdma-core, UCX).
pub const DEV_INFINIBAND: &str = "/dev/infiniband";

/// Makes `<dir>/<UVERBS_NODE>` (see [`UVERBS_NODE`]) a symlink to
/// `/dev/null`, creating `dir` (mode 0755) if needed, unless something
/// already exists under that name. Done for a VM guest's device (a PCI
/// function), whose programs run as root; a host process or a container
/// gets the node from its user (see the README). Errors (e.g. `EACCES`
/// when not root, `EROFS`) are returned for the caller to ignore: only
/// UCX needs the node.
pub fn ensure_uverbs_node(dir: &std::path::Path) -> std::io::Result<()> {
    let node = dir.join(UVERBS_NODE);
    if node.symlink_metadata().is_ok() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    match std::os::unix::fs::symlink("/dev/null", &node) {
        // Another process made it first.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

/// How a device is reached.
#[derive(Debug, Clone)]
pub enum DeviceKind {
    /// An in-process device on an AF_PACKET link (feature `loopback`).
    #[cfg(feature = "loopback")]
    Loopback {
        /// Interface name.
        netdev: String,
        /// Device configuration (MAC, IPv4, MTU).
        cfg: DeviceConfig,
    },
    /// A virtio-pci function (`None`: the first found), opened directly
    /// (`VRNIC_AGENT=off`, or no agent binary installed): this process
    /// then has the device to itself.
    Pci(Option<String>),
    /// A vrnic function reached over its daemon's vhost-user socket, this
    /// process being the frontend (`vrnic_guest::vhost_user`): a container
    /// or a host process. Chosen by `VRNIC_VHOST_USER=PATH`, or when
    /// `/run/vrnic/vhost-user.sock` exists.
    VhostUser(std::path::PathBuf),
    /// A device served by a guest agent on a Unix socket
    /// (`vrnic_guest::agent`): several processes share it. `spawn`: the
    /// agent binary to start, and its arguments naming the function it
    /// should serve (`--pci BDF`, `--vhost-user SOCKET`), when no agent
    /// answers.
    Agent {
        /// The agent's socket.
        socket: std::path::PathBuf,
        /// The agent to start when none answers.
        spawn: Option<(std::path::PathBuf, Vec<std::ffi::OsString>)>,
    },
}

/// A device of the list: the `struct ibv_device` applications see, first,
/// so a `*mut ibv_device` is a `*mut VrnicDevice`.
#[repr(C)]
pub struct VrnicDevice {
    /// What `ibv_get_device_list(3)` hands out.
    pub dev: c::ibv_device,
    /// How to reach it.
    pub kind: DeviceKind,
    /// Node GUID (network byte order), from the MAC as rxe does (EUI-64).
    pub guid: u64,
}

/// Parses `VRNIC_LOOPBACK`'s value ([`vrnic_guest::loopback::parse_spec`]).
#[cfg(feature = "loopback")]
pub fn parse_loopback(spec: &str) -> Result<(String, DeviceConfig), String> {
    vrnic_guest::loopback::parse_spec(spec)
}

/// The node GUID rxe derives from a MAC (modified EUI-64), in network byte order.
#[cfg(feature = "loopback")]
pub fn mac_to_guid(mac: [u8; 6]) -> u64 {
    let eui = [
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ];
    u64::from_ne_bytes(eui)
}

fn new_device(name: &str, kind: DeviceKind, guid: u64) -> VrnicDevice {
    let mut dev = c::ibv_device {
        node_type: c::ibv_node_type_IBV_NODE_CA,
        transport_type: c::ibv_transport_type_IBV_TRANSPORT_IB,
        ..Default::default()
    };
    copy_cstr(&mut dev.name, name);
    copy_cstr(&mut dev.dev_name, UVERBS_NODE);
    // No sysfs directory exists for vrnic: ibv_read_sysfs_file(3) on these
    // paths fails, as it does for a missing attribute.
    copy_cstr(&mut dev.dev_path, "/sys/class/infiniband_verbs/vrnic-none");
    copy_cstr(
        &mut dev.ibdev_path,
        &format!("/sys/class/infiniband/{name}"),
    );
    VrnicDevice { dev, kind, guid }
}

/// The process's devices, found on first use.
fn devices() -> &'static [&'static VrnicDevice] {
    static DEVICES: OnceLock<Vec<&'static VrnicDevice>> = OnceLock::new();
    DEVICES.get_or_init(|| {
        #[cfg(feature = "loopback")]
        if let Some(spec) = std::env::var_os(LOOPBACK_ENV) {
            let spec = spec.to_string_lossy();
            return match parse_loopback(&spec) {
                Ok((netdev, cfg)) => {
                    let guid = mac_to_guid(cfg.mac);
                    let d = new_device("vrnic0", DeviceKind::Loopback { netdev, cfg }, guid);
                    vec![&*Box::leak(Box::new(d))]
                }
                Err(e) => {
                    eprintln_ignore(&format!("libibverbs (vrnic): {LOOPBACK_ENV}={spec}: {e}"));
                    Vec::new()
                }
            };
        }
        #[cfg(not(feature = "loopback"))]
        if std::env::var_os(LOOPBACK_ENV).is_some() {
            eprintln_ignore(&format!(
                "libibverbs (vrnic): {LOOPBACK_ENV}: built without the in-process device (feature `loopback`)"
            ));
            return Vec::new();
        }
        if let Some(sock) = std::env::var_os(agent::SOCKET_ENV) {
            let kind = DeviceKind::Agent {
                socket: sock.into(),
                spawn: None,
            };
            return vec![&*Box::leak(Box::new(new_device("vrnic0", kind, 0)))];
        }
        if let Some(sock) = vrnic_guest::vhost_user::socket_from_env() {
            let d = new_device("vrnic0", vhost_user_kind(sock), 0);
            return vec![&*Box::leak(Box::new(d))];
        }
        let bdf = std::env::var("VRNIC_PCI").ok();
        let root = std::path::Path::new(vrnic_guest::pci::SYSFS_PCI_DEVICES);
        // A usable virtio-pci function (one no kernel driver holds): whether it
        // is a vrnic is known only when it is opened (ibv_open_device).
        let candidate = bdf.is_some()
            || vrnic_guest::pci::scan(root).is_ok_and(|v| v.iter().any(|c| c.skip.is_none()));
        if candidate {
            // A VM guest: let UCX see the device (UVERBS_NODE).
            let _ = ensure_uverbs_node(std::path::Path::new(DEV_INFINIBAND));
            let d = new_device("vrnic0", pci_kind(bdf), 0);
            vec![&*Box::leak(Box::new(d))]
        } else {
            Vec::new()
        }
    })
}

/// How this process reaches PCI function `bdf`: through the guest agent
/// (started on first use from `VRNIC_AGENT`, default
/// `/usr/lib/vrnic/vrnic-agent`), or directly when `VRNIC_AGENT=off` or
/// the agent binary is not installed.
fn pci_kind(bdf: Option<String>) -> DeviceKind {
    let Some(bin) = agent_bin() else {
        return DeviceKind::Pci(bdf);
    };
    let args = bdf
        .iter()
        .flat_map(|b| ["--pci".into(), b.into()])
        .collect();
    DeviceKind::Agent {
        socket: agent::default_socket(bdf.as_deref()),
        spawn: Some((bin, args)),
    }
}

/// How this process reaches the function behind vhost-user socket `sock`:
/// through an agent serving it (started on first use, as for a PCI
/// function; its socket [`agent::vhost_user_socket`]), or as its frontend
/// itself when `VRNIC_AGENT=off` or the agent binary is not installed.
fn vhost_user_kind(sock: std::path::PathBuf) -> DeviceKind {
    let Some(bin) = agent_bin() else {
        return DeviceKind::VhostUser(sock);
    };
    DeviceKind::Agent {
        socket: agent::vhost_user_socket(&sock),
        spawn: Some((bin, vec!["--vhost-user".into(), sock.into()])),
    }
}

/// The agent binary to start (`VRNIC_AGENT`, default
/// `/usr/lib/vrnic/vrnic-agent`); `None` for `VRNIC_AGENT=off` or when it
/// is not installed.
fn agent_bin() -> Option<std::path::PathBuf> {
    let bin = std::env::var_os(agent::AGENT_BIN_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| agent::DEFAULT_AGENT_BIN.into());
    (bin.as_os_str() != "off" && bin.exists()).then_some(bin)
}

/// Writes a line to stderr, ignoring failure (no panic at the C boundary).
pub(crate) fn eprintln_ignore(s: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{s}");
}

/// Opens a transport to `dev`.
pub fn open_transport(dev: &VrnicDevice) -> Result<Box<dyn Transport>, (c_int, String)> {
    match &dev.kind {
        #[cfg(feature = "loopback")]
        DeviceKind::Loopback { netdev, cfg } => {
            let link = vrnic::link::PacketLink::open(netdev)
                .map_err(|e| (e.raw_os_error().unwrap_or(libc::ENODEV), e.to_string()))?;
            let mut t = LoopbackTransport::new(cfg.clone(), Box::new(link))
                .map_err(|e| (libc::ENODEV, e.to_string()))?;
            // The application registers its own buffers (malloc, stack, ...).
            t.allow_user_memory();
            Ok(Box::new(t))
        }
        // Every open is a device context of its own on the process's one
        // connection to the function (the first open connects).
        DeviceKind::VhostUser(socket) => vrnic_guest::vhost_user::VhostUserContext::open(socket)
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .map_err(|e| (libc::ENODEV, e.to_string())),
        DeviceKind::Pci(bdf) => vrnic_guest::pci::PciTransport::open(bdf.as_deref())
            .map(|t| Box::new(t) as Box<dyn Transport>)
            .map_err(|e| (libc::ENODEV, e.to_string())),
        DeviceKind::Agent { socket, spawn } => {
            let t = match spawn {
                Some((bin, args)) => AgentTransport::connect_or_spawn(socket, bin, args),
                None => AgentTransport::connect(socket),
            };
            t.map(|t| Box::new(t) as Box<dyn Transport>)
                .map_err(|e| (libc::ENODEV, e.to_string()))
        }
    }
}

/// `ibv_get_device_list(3)`: a NULL-terminated array of the devices (see
/// the module documentation), its length in `*num_devices` when that is
/// not NULL; free it with `ibv_free_device_list(3)`. NULL with errno
/// `ENOMEM` when the array cannot be allocated.
pub(crate) extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut c::ibv_device {
    ffi("ibv_get_device_list", std::ptr::null_mut(), || {
        let devs = devices();
        // SAFETY: calloc of n+1 pointers; checked for NULL below.
        let list = unsafe {
            libc::calloc(devs.len() + 1, size_of::<*mut c::ibv_device>())
                .cast::<*mut c::ibv_device>()
        };
        if list.is_null() {
            return fail_with_errno(libc::ENOMEM);
        }
        for (i, d) in devs.iter().enumerate() {
            // SAFETY: `list` has devs.len() + 1 slots; the device lives forever.
            unsafe { *list.add(i) = std::ptr::from_ref(&d.dev).cast_mut() };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller passes a valid int pointer or NULL (checked).
            unsafe { *num_devices = devs.len() as c_int };
        }
        list
    })
}

/// `ibv_free_device_list(3)`: frees the array (the devices stay).
pub(crate) extern "C" fn ibv_free_device_list(list: *mut *mut c::ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list's calloc (or is NULL,
    // which free ignores).
    unsafe { libc::free(list.cast()) };
}

/// The `VrnicDevice` of an application's `ibv_device` pointer, if it is one
/// of ours.
pub(crate) fn from_ptr(dev: *const c::ibv_device) -> Option<&'static VrnicDevice> {
    devices()
        .iter()
        .copied()
        .find(|d| std::ptr::eq(&d.dev, dev))
}

/// `ibv_get_device_name(3)`: the device's name, or NULL (errno `EINVAL`)
/// for an unknown device.
pub(crate) extern "C" fn ibv_get_device_name(dev: *mut c::ibv_device) -> *const c_char {
    ffi("ibv_get_device_name", std::ptr::null(), || {
        match from_ptr(dev) {
            Some(d) => d.dev.name.as_ptr(),
            None => fail_with_errno(libc::EINVAL),
        }
    })
}

/// `ibv_get_device_guid(3)`: the node GUID in network byte order (0 for an
/// unknown device, and for a PCI device, whose GUID is known only once it
/// is open).
pub(crate) extern "C" fn ibv_get_device_guid(dev: *mut c::ibv_device) -> u64 {
    ffi("ibv_get_device_guid", 0, || {
        from_ptr(dev).map_or(0, |d| d.guid)
    })
}

/// `ibv_get_device_index(3)`: the device's index (its position in the
/// list), or -1.
pub(crate) extern "C" fn ibv_get_device_index(dev: *mut c::ibv_device) -> c_int {
    ffi("ibv_get_device_index", -1, || {
        devices()
            .iter()
            .position(|d| std::ptr::eq(&d.dev, dev))
            .map_or(-1, |i| i as c_int)
    })
}

/// The name of a device as a Rust string.
pub(crate) fn name(d: &VrnicDevice) -> String {
    // SAFETY: `name` is NUL-terminated (copy_cstr leaves the last byte 0).
    unsafe { CStr::from_ptr(d.dev.name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt as _;

    /// The node made for UCX is what `uct_ib_device_is_accessible` asks
    /// for: through `stat(2)` a character device, readable and writable;
    /// made once, then left as it is.
    #[test]
    fn uverbs_node_passes_ucx_checks() {
        let dir = std::env::temp_dir().join(format!("vrnic-uverbs-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ib = dir.join("infiniband");
        ensure_uverbs_node(&ib).expect("make node");
        let node = ib.join(UVERBS_NODE);
        let md = std::fs::metadata(&node).expect("stat node");
        assert!(md.file_type().is_char_device());
        let c = std::ffi::CString::new(node.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        let r = unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) };
        assert_eq!(r, 0);
        ensure_uverbs_node(&ib).expect("node already there");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
