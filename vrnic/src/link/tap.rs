//! A TAP device: the link's frames are the frames of a kernel network
//! interface in TAP mode, read and written through its `/dev/net/tun` file
//! descriptor (Linux `Documentation/networking/tuntap.rst`).
//!
//! Opened with `IFF_TAP | IFF_NO_PI`: every `read(2)` returns one whole
//! Ethernet frame (no FCS, no packet-information prefix) and every
//! `write(2)` injects one. The interface may exist already (`ip tuntap add
//! NAME mode tap`, which also sets `IFF_NO_PI`) or is created by the open
//! and then disappears when the link is dropped. Either needs
//! `CAP_NET_ADMIN` unless the existing device is owned by the caller.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use tun_tap::{Iface, Mode};

use super::stats::{is_transient_tx_error, LinkStats, OpenError};
use super::Link;

/// Longest interface name Linux accepts, bytes (`IFNAMSIZ - 1`).
pub const MAX_IFNAME_LEN: usize = libc::IFNAMSIZ - 1;

/// A [`Link`] over a TAP interface, nonblocking, pollable through
/// [`Link::raw_fd`].
pub struct TapLink {
    iface: Iface,
    stats: LinkStats,
}

impl std::fmt::Debug for TapLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TapLink")
            .field("name", &self.iface.name())
            .field("stats", &self.stats)
            .finish()
    }
}

impl TapLink {
    /// Attaches to the TAP interface `name`, creating it if it does not exist
    /// (`TUNSETIFF` with `IFF_TAP | IFF_NO_PI`), and makes it nonblocking.
    ///
    /// An empty `name` or one containing `%d` lets the kernel choose; see
    /// [`TapLink::name`]. The interface is not brought up: do that with
    /// `ip link set NAME up`; until then writes fail or are dropped.
    ///
    /// # Errors
    /// `InvalidInput` for a name longer than [`MAX_IFNAME_LEN`] bytes or
    /// containing NUL; otherwise the OS error of opening `/dev/net/tun`, of
    /// `TUNSETIFF` (`EPERM` without `CAP_NET_ADMIN`, `EBUSY`/`EINVAL` when
    /// the name belongs to a non-TAP interface or one already attached) or of
    /// `fcntl`. The error's message names the interface ([`OpenError`]).
    pub fn open(name: &str) -> io::Result<TapLink> {
        if name.len() > MAX_IFNAME_LEN || name.contains('\0') {
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface names are at most {MAX_IFNAME_LEN} bytes without NUL"),
            );
            return Err(OpenError::wrap("TAP", name, "check name", e));
        }
        let iface = Iface::without_packet_info(name, Mode::Tap)
            .map_err(|e| OpenError::wrap("TAP", name, "TUNSETIFF", e))?;
        set_nonblocking(iface.as_raw_fd())
            .map_err(|e| OpenError::wrap("TAP", name, "fcntl(O_NONBLOCK)", e))?;
        if let Err(e) = set_tx_queue_len(iface.name(), TX_QUEUE_LEN) {
            tracing::warn!(
                "TAP {}: cannot raise its queue to {TX_QUEUE_LEN} frames: {e}",
                iface.name()
            );
        }
        Ok(TapLink {
            iface,
            stats: LinkStats::default(),
        })
    }

    /// The interface's actual name (the kernel's choice when [`TapLink::open`]
    /// was given an empty name or a `%d` pattern).
    pub fn name(&self) -> &str {
        self.iface.name()
    }

    /// Frame counters.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }
}

/// Frames the kernel may hold for the daemon on its TAP, the interface's
/// `txqueuelen`: the tun driver's receive ring has this many slots, and a
/// frame arriving while it is full is dropped (the interface's TX
/// `dropped`). The default, 1000, is about 2 ms of 4 KiB frames at the
/// rate the bridge delivers them: a daemon whose worker waits that long
/// for a CPU (under load, beside busy VMs) lost READ response bursts and
/// recovered only through ACK timeouts (an `ib_read_bw -a` between two TCG
/// guests ended in `RETRY_EXC_ERR` at 4 MiB). As the AF_PACKET link's
/// receive buffer (issue 10).
pub const TX_QUEUE_LEN: u32 = 4096;

/// Sets interface `name`'s `txqueuelen` (`SIOCSIFTXQLEN`, netdevice(7);
/// needs `CAP_NET_ADMIN`). The tun driver resizes the ring of an attached
/// queue at once.
fn set_tx_queue_len(name: &str, len: u32) -> io::Result<()> {
    let mut req: libc::ifreq = unsafe_zeroed_ifreq();
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_metric = len as libc::c_int;
    // SAFETY: a plain socket for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCSIFTXQLEN reads the ifreq we pass (name NUL-terminated:
    // names are at most MAX_IFNAME_LEN < IFNAMSIZ bytes, the rest is zero).
    let r = unsafe { libc::ioctl(fd, libc::SIOCSIFTXQLEN as _, &req) };
    let e = io::Error::last_os_error();
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd) };
    if r < 0 {
        return Err(e);
    }
    Ok(())
}

/// An all-zero `ifreq`.
fn unsafe_zeroed_ifreq() -> libc::ifreq {
    // SAFETY: ifreq is plain C data (a name array and a union of integers
    // and pointers) for which all-zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

/// The kernel's count of frames it dropped for the daemon because the
/// TAP's ring was full (`/sys/class/net/NAME/statistics/tx_dropped`: the
/// interface transmits towards the daemon); 0 when unreadable.
fn queue_drops(name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{name}/statistics/tx_dropped"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Sets `O_NONBLOCK` on `fd` (`fcntl(2)`).
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no pointers involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Link for TapLink {
    /// Writes the frame to the TAP device. `EAGAIN`, `ENOBUFS` and `EIO`
    /// (the interface is down) drop the frame and count it in
    /// [`LinkStats::tx_dropped`]; other errors are returned.
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        match self.iface.send(frame) {
            Ok(_) => {
                self.stats.tx_frames += 1;
                Ok(())
            }
            Err(e) if is_transient_tx_error(&e) || e.raw_os_error() == Some(libc::EIO) => {
                self.stats.tx_dropped += 1;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// As [`Link::send`], but `EAGAIN`/`ENOBUFS` hand the frame back
    /// (`Ok(false)`, [`LinkStats::tx_busy`]); `EIO` (interface down) still
    /// drops it.
    fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
        match self.iface.send(frame) {
            Ok(_) => {
                self.stats.tx_frames += 1;
                Ok(true)
            }
            Err(e) if is_transient_tx_error(&e) => {
                self.stats.tx_busy += 1;
                Ok(false)
            }
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                self.stats.tx_dropped += 1;
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// Reads one frame. The kernel truncates frames longer than `buf`; such
    /// frames (a read that fills `buf` exactly is taken as complete) are not
    /// detectable here, so pass a buffer of at least the interface MTU + 14.
    /// `EIO` (interface down) reads as no frame.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.iface.recv(buf) {
            Ok(n) => {
                self.stats.rx_frames += 1;
                Ok(Some(n.min(buf.len())))
            }
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::EIO) =>
            {
                Ok(None)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.iface.as_raw_fd())
    }

    /// [`TapLink::stats`], with [`LinkStats::rx_dropped`] the frames the
    /// kernel dropped at the TAP's full ring ([`TX_QUEUE_LEN`]).
    fn link_stats(&self) -> Option<LinkStats> {
        Some(LinkStats {
            rx_dropped: queue_drops(self.iface.name()),
            ..self.stats()
        })
    }
}
