//! A TAP device: the link's frames are the frames of a kernel network
//! interface in TAP mode, read and written through its `/dev/net/tun` file
//! descriptor (Linux `Documentation/networking/tuntap.rst`).
//!
//! Opened with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`: every `read(2)` returns
//! one whole Ethernet frame (no FCS, no packet-information prefix) after a
//! virtio-net header, and every `write(2)` injects one after one. With the
//! offload asked for (`TUNSETOFFLOAD` with `TUN_F_CSUM | TUN_F_USO4 |
//! TUN_F_USO6`, Linux 6.2+), a run of frames of one flow is written as one
//! UDP super-frame, which the kernel segments where it must, and a
//! super-frame the bridge forwards whole is read as one and cut back into
//! frames ([`super::uso`]): the per-frame cost of the tun driver and the
//! bridge (one system call and one skb per frame, issue 10) is paid per
//! run. The interface may exist already (`ip tuntap add NAME mode tap`) or
//! is created by the open and then disappears when the link is dropped.
//! Either needs `CAP_NET_ADMIN` unless the existing device is owned by the
//! caller. (The `tun-tap` crate opens without `IFF_VNET_HDR`, hence our own
//! `TUNSETIFF`.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::stats::{is_transient_tx_error, LinkStats, OpenError};
use super::uso::{self, Segments, VNET_HDR_LEN};
use super::{Icrc, Link, LinkCaps, Rx};

/// Longest interface name Linux accepts, bytes (`IFNAMSIZ - 1`).
pub const MAX_IFNAME_LEN: usize = libc::IFNAMSIZ - 1;

/// Most frames one [`Link::try_send_many`] call writes (one `writev(2)` per
/// super-frame or lone frame).
pub const SEND_MANY_MAX: usize = 64;

/// A [`Link`] over a TAP interface, nonblocking, pollable through
/// [`LinkCaps::fd`]. It reads ahead: the frames of a super-frame it holds
/// do not make the descriptor readable ([`LinkCaps::fd`]).
#[derive(Debug)]
pub struct TapLink {
    fd: OwnedFd,
    name: String,
    stats: LinkStats,
    /// Runs go as super-frames and super-frames come whole ([`uso`]); off
    /// where the kernel refused the offload.
    uso: bool,
    /// The last frame read, after its virtio-net header (allocated at the
    /// first receive: the largest super-frame with the offload on).
    rx: Vec<u8>,
    /// The frames of `rx` not yet handed out.
    cur: Option<Segments>,
}

impl TapLink {
    /// Attaches to the TAP interface `name`, creating it if it does not exist
    /// (`TUNSETIFF` with `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`), makes it
    /// nonblocking and asks for UDP segmentation offload (without it, if
    /// the kernel refuses: frames then go one by one).
    ///
    /// An empty `name` or one containing `%d` lets the kernel choose; see
    /// [`TapLink::name`]. The interface is not brought up: do that with
    /// `ip link set NAME up`; until then writes fail or are dropped.
    ///
    /// # Errors
    /// `InvalidInput` for a name longer than [`MAX_IFNAME_LEN`] bytes or
    /// containing NUL; otherwise the OS error of opening `/dev/net/tun` or
    /// of `TUNSETIFF` (`EPERM` without `CAP_NET_ADMIN`, `EBUSY`/`EINVAL`
    /// when the name belongs to a non-TAP interface or one already
    /// attached). The error's message names the interface ([`OpenError`]).
    pub fn open(name: &str) -> io::Result<TapLink> {
        if name.len() > MAX_IFNAME_LEN || name.contains('\0') {
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface names are at most {MAX_IFNAME_LEN} bytes without NUL"),
            );
            return Err(OpenError::wrap("TAP", name, "check name", e));
        }
        // SAFETY: a NUL-terminated path; the result is checked and then owned.
        let raw = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return Err(OpenError::wrap("TAP", name, "open /dev/net/tun", e));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = unsafe_zeroed_ifreq();
        for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
        // SAFETY: TUNSETIFF reads and writes the live ifreq we pass (name
        // NUL-terminated: at most MAX_IFNAME_LEN < IFNAMSIZ bytes, the rest
        // zero).
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut req) } < 0 {
            let e = io::Error::last_os_error();
            return Err(OpenError::wrap("TAP", name, "TUNSETIFF", e));
        }
        // The name the kernel gave (it fills in a `%d` pattern).
        let given: Vec<u8> = req
            .ifr_name
            .iter()
            .map(|&c| c as u8)
            .take_while(|&b| b != 0)
            .collect();
        let actual = String::from_utf8_lossy(&given).into_owned();
        let offload = libc::TUN_F_CSUM | libc::TUN_F_USO4 | libc::TUN_F_USO6;
        // SAFETY: TUNSETOFFLOAD takes its argument by value.
        let uso = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD as _, offload) } == 0;
        if !uso {
            tracing::info!(
                "TAP {actual}: no UDP segmentation offload ({}): frames go one by one",
                io::Error::last_os_error()
            );
        }
        if let Err(e) = set_tx_queue_len(&actual, TX_QUEUE_LEN) {
            tracing::warn!("TAP {actual}: cannot raise its queue to {TX_QUEUE_LEN} frames: {e}");
        }
        Ok(TapLink {
            fd,
            name: actual,
            stats: LinkStats::default(),
            uso,
            rx: Vec::new(),
            cur: None,
        })
    }

    /// The interface's actual name (the kernel's choice when [`TapLink::open`]
    /// was given an empty name or a `%d` pattern).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Frame counters.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// Writes `bufs` as one frame (`writev(2)`); the system call's result.
    fn write(&self, bufs: &[libc::iovec]) -> io::Result<()> {
        // SAFETY: every iovec points at a live buffer of its iov_len, only
        // read by the kernel, alive for the call.
        let n = unsafe {
            libc::writev(
                self.fd.as_raw_fd(),
                bufs.as_ptr(),
                bufs.len() as libc::c_int,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Writes `frame` alone, after a plain virtio-net header.
    fn write_one(&self, frame: &[u8]) -> io::Result<()> {
        let hdr = [0u8; VNET_HDR_LEN];
        self.write(&[iovec(&hdr), iovec(frame)])
    }

    /// The next frame of at most `frame_len` bytes: the next of the held
    /// super-frame's, else one read; `None` when none is waiting. Frames
    /// longer are skipped ([`LinkStats::rx_oversize`]), as are malformed
    /// ones ([`LinkStats::rx_malformed`]), at most 64 per call.
    fn next_frame(&mut self, frame_len: usize) -> io::Result<Option<&[u8]>> {
        for _ in 0..64 {
            if let Some(seg) = &mut self.cur {
                match seg.next(&mut self.rx[VNET_HDR_LEN..]) {
                    Some(r) if r.len() > frame_len => {
                        self.stats.rx_oversize += 1;
                        continue;
                    }
                    Some(r) => {
                        self.stats.rx_frames += 1;
                        let r = r.start + VNET_HDR_LEN..r.end + VNET_HDR_LEN;
                        return Ok(self.rx.get(r));
                    }
                    None => self.cur = None,
                }
            }
            let want = VNET_HDR_LEN
                + if self.uso {
                    frame_len.max(uso::MAX_SUPER_FRAME)
                } else {
                    frame_len
                };
            if self.rx.len() != want {
                self.rx = vec![0; want];
            }
            // SAFETY: the buffer is live and writable for its length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.rx.as_mut_ptr().cast(),
                    self.rx.len(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::EINTR | libc::EIO) => Ok(None),
                    _ => Err(e),
                };
            }
            let n = (n as usize).min(self.rx.len());
            let Some((vnet, frame)) = self.rx.get(..n).and_then(|f| f.split_first_chunk()) else {
                self.stats.rx_malformed += 1;
                continue;
            };
            match Segments::new(vnet, frame) {
                Ok(seg) => {
                    if seg.is_super() {
                        self.stats.rx_super += 1;
                    }
                    self.cur = Some(seg);
                }
                Err(_) => self.stats.rx_malformed += 1,
            }
        }
        Ok(None)
    }
}

/// An iovec over `b`, for the kernel to read.
fn iovec(b: &[u8]) -> libc::iovec {
    libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: b.len(),
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

impl Link for TapLink {
    /// Writes the frame to the TAP device. `EAGAIN`, `ENOBUFS` and `EIO`
    /// (the interface is down) drop the frame and count it in
    /// [`LinkStats::tx_dropped`]; other errors are returned.
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        match self.write_one(frame) {
            Ok(()) => {
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
        match self.write_one(frame) {
            Ok(()) => {
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

    /// Writes up to [`SEND_MANY_MAX`] frames, each run of one flow as one
    /// super-frame ([`uso::run_len`], one `writev(2)` each) with the
    /// offload on, else one by one; stops at the first write the link
    /// cannot take (`EAGAIN`/`ENOBUFS`: `Ok(0)` if it was the first,
    /// [`LinkStats::tx_busy`]). `EIO` (interface down) drops what that
    /// write carried, as [`Link::send`] does. A super-frame the kernel
    /// refuses (`EINVAL`) turns the offload's sending off for good and its
    /// frames go again one by one.
    fn try_send_many(&mut self, frames: &mut [Vec<u8>]) -> io::Result<usize> {
        let count = frames.len().min(SEND_MANY_MAX);
        let mut hdr = [0u8; VNET_HDR_LEN + uso::MAX_HDR_LEN];
        let mut iov = [iovec(&[]); SEND_MANY_MAX + 1];
        let mut i = 0;
        while i < count {
            let msg = uso::next_message(&frames[i..count], self.uso, &mut hdr);
            let n = msg.frames;
            iov[0] = iovec(&hdr[..msg.hdr_len]);
            for (v, f) in iov[1..].iter_mut().zip(&frames[i..i + n]) {
                *v = iovec(f.get(msg.payload_offset..).unwrap_or_default());
            }
            match self.write(&iov[..=n]) {
                Ok(()) => {
                    self.stats.tx_frames += n as u64;
                    self.stats.tx_super += u64::from(n > 1);
                }
                Err(e) if is_transient_tx_error(&e) => {
                    if i == 0 {
                        self.stats.tx_busy += 1;
                    }
                    return Ok(i);
                }
                Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                    self.stats.tx_dropped += n as u64;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) && n > 1 => {
                    tracing::warn!(
                        "TAP {}: the kernel refused a UDP super-frame: frames go one by one",
                        self.name
                    );
                    self.uso = false;
                    continue;
                }
                Err(e) if i == 0 => return Err(e),
                Err(_) => return Ok(i),
            }
            i += n;
        }
        Ok(count)
    }

    /// Reads one frame (or takes the next of a super-frame read before)
    /// and hands it over from the link's buffer (its ICRC to be checked);
    /// the caller's buffer only gives the largest frame taken, bytes.
    /// `EIO` (interface down) reads as no frame.
    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
        let f = self.next_frame(rx.max_len())?;
        Ok(f.and_then(|f| rx.hand(f, Icrc::Needed)))
    }

    fn caps(&self) -> LinkCaps {
        LinkCaps {
            fd: Some(self.fd.as_raw_fd()),
            ..LinkCaps::default()
        }
    }

    /// [`TapLink::stats`], with [`LinkStats::rx_dropped`] the frames the
    /// kernel dropped at the TAP's full ring ([`TX_QUEUE_LEN`]).
    fn link_stats(&self) -> Option<LinkStats> {
        Some(LinkStats {
            rx_dropped: queue_drops(&self.name),
            ..self.stats()
        })
    }
}
