//! An AF_PACKET raw socket bound to an existing interface (`packet(7)`): the
//! link sends and receives whole Ethernet frames (no FCS) on that interface,
//! beside the kernel's own stack, which sees the same traffic.
//!
//! The socket is `SOCK_RAW` (frames include the link-level header), bound
//! to one interface index for `ETH_P_ALL`, nonblocking, and has
//! `PACKET_IGNORE_OUTGOING` set (Linux 4.20+) so frames this host transmits
//! on the interface, including our own, are not read back. On kernels
//! without that option, frames whose `sll_pkttype` is `PACKET_OUTGOING`
//! are skipped instead. Needs `CAP_NET_RAW`.
//!
//! Frames go in batches where the caller has several
//! ([`Link::try_send_many`]: one `sendmmsg(2)` of up to
//! [`SEND_MANY_MAX`]) and come in batches always (one `recvmmsg(2)` of up
//! to [`RECV_MANY`] into the link's own buffers, handed out one by one,
//! without a copy through [`Link::recv_with`]): the system call per frame
//! was the daemon's largest cost on this link (issue 10). So the link
//! reads ahead: its descriptor does not poll readable for the frames it
//! holds, and a caller reads until [`Link::recv`] returns none (or comes
//! back without waiting, see [`LinkCaps::fd`]).
//!
//! With `PACKET_VNET_HDR` (Linux 4.18+ for UDP), every frame carries a
//! virtio-net header: a run of frames of one flow goes as one super-frame
//! the kernel segments where it must, and a super-frame that arrives whole
//! (a veth delivers them so) is cut back into frames ([`super::uso`]).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::stats::{is_transient_tx_error, LinkStats, OpenError};
use super::uso::{self, Segments, VNET_HDR_LEN};
use super::{Icrc, Link, LinkCaps, Rx};

/// Upper bound of frames one [`Link::recv`] call skips (outgoing or
/// oversize) before it returns `Ok(None)`, so a flood cannot pin the caller.
const MAX_SKIPPED_PER_RECV: usize = 64;
/// Most frames one `sendmmsg(2)` of [`Link::try_send_many`] sends.
pub const SEND_MANY_MAX: usize = 64;
/// Frames one `recvmmsg(2)` reads at most ([`Link::recv_with`] then hands
/// them out one by one): 32 buffers of the caller's frame size (about
/// 300 KiB at a 9000-byte MTU), or with the offload on of the largest
/// super-frame ([`uso::MAX_SUPER_FRAME`], 2.1 MiB in all), allocated at
/// the first receive.
pub const RECV_MANY: usize = 32;
/// Receive buffer asked for, bytes (the kernel doubles it for its
/// bookkeeping, socket(7)): 8 MiB, so about 1,900 frames of a 4 KiB path
/// MTU (each costs about 8.5 KiB of buffer) wait while the engine thread
/// is not running. A veth or TAP peer delivers in the sender's context, as
/// fast as it sends; with the default 208 KiB the receiver's queue held
/// about 23 such frames and a 64 KiB `ib_write_bw` lost 70 % of its
/// frames there (issue 10). `SO_RCVBUFFORCE` (`CAP_NET_ADMIN`) can exceed
/// `net.core.rmem_max`; without it `SO_RCVBUF` is capped there.
pub const RCVBUF_BYTES: usize = 8 << 20;
/// Send buffer asked for, bytes (as [`RCVBUF_BYTES`]; `SO_SNDBUFFORCE`,
/// else `SO_SNDBUF` capped at `net.core.wmem_max`): frames the interface
/// has not yet consumed, before `send` answers `EAGAIN`.
pub const SNDBUF_BYTES: usize = 4 << 20;
/// `SO_RCVBUFFORCE` (asm-generic/socket.h).
const SO_RCVBUFFORCE: libc::c_int = 33;
/// `SO_SNDBUFFORCE` (asm-generic/socket.h).
const SO_SNDBUFFORCE: libc::c_int = 32;
/// `PACKET_STATISTICS` (linux/if_packet.h): the socket's `tpacket_stats`,
/// reset by each read.
const PACKET_STATISTICS: libc::c_int = 6;

/// `struct tpacket_stats` (linux/if_packet.h).
#[repr(C)]
#[derive(Default)]
struct TpacketStats {
    tp_packets: u32,
    tp_drops: u32,
}

/// A [`Link`] over an AF_PACKET socket bound to one interface.
#[derive(Debug)]
pub struct PacketLink {
    fd: OwnedFd,
    ifname: String,
    ifindex: u32,
    stats: LinkStats,
    /// Kernel receive-queue drops read so far (`PACKET_STATISTICS` resets
    /// its counters on every read, so they are summed here).
    kernel_drops: std::cell::Cell<u64>,
    /// Frames read by the last `recvmmsg(2)` and not yet handed out.
    rx: RxBatch,
    /// Every frame, both ways, carries a virtio-net header
    /// (`PACKET_VNET_HDR`): super-frames may come ([`uso`]); off where the
    /// kernel refused the option.
    vnet: bool,
    /// Runs go as super-frames: `vnet`, until the kernel refuses one.
    uso: bool,
}

/// The frames of one `recvmmsg(2)` ([`RECV_MANY`] buffers), handed out by
/// [`Link::recv_with`] in order.
#[derive(Debug, Default)]
struct RxBatch {
    /// [`RECV_MANY`] buffers, all of one length (the caller's frame size).
    bufs: Vec<Vec<u8>>,
    /// Per buffer, with the offload on: the frame's virtio-net header.
    vnet: Vec<[u8; VNET_HDR_LEN]>,
    /// Per buffer: the frame's length as the kernel gave it (longer than
    /// the buffer: truncated), and whether it is an outgoing frame.
    got: Vec<(usize, bool)>,
    /// The next frame to hand out; `got.len()` when all were.
    next: usize,
    /// The buffer being cut into frames ([`Segments`]), with the offload on.
    cur: Option<(usize, Segments)>,
}

fn err(ifname: &str, step: &'static str) -> io::Error {
    OpenError::wrap("AF_PACKET", ifname, step, io::Error::last_os_error())
}

impl PacketLink {
    /// Opens an AF_PACKET `SOCK_RAW` socket on the existing interface
    /// `ifname` (which should be up; frames sent while it is down are
    /// dropped by the kernel or fail with `ENETDOWN`).
    ///
    /// The socket is created with protocol 0 (receives nothing, `packet(7)`)
    /// and starts receiving only when bound to the interface for `ETH_P_ALL`,
    /// so no frame of another interface is ever queued.
    ///
    /// # Errors
    /// `InvalidInput` for a name with a NUL byte; `NotFound` (`ENODEV`) for
    /// an unknown interface; `PermissionDenied` without `CAP_NET_RAW`; the OS
    /// error of `socket`, `setsockopt` or `bind` otherwise. The message names
    /// the interface and step ([`OpenError`]).
    pub fn open(ifname: &str) -> io::Result<PacketLink> {
        let cname = CString::new(ifname).map_err(|e| {
            OpenError::wrap(
                "AF_PACKET",
                ifname,
                "check name",
                io::Error::new(io::ErrorKind::InvalidInput, e),
            )
        })?;
        // SAFETY: `cname` is a valid NUL-terminated string for the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(err(ifname, "if_nametoindex"));
        }
        // SAFETY: plain syscall; the result is checked and then owned.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(err(ifname, "socket(AF_PACKET, SOCK_RAW)"));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let one: libc::c_int = 1;
        // SAFETY: the option value points at a live c_int of the given size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_IGNORE_OUTGOING,
                &one as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            // Older kernels: fall back to skipping PACKET_OUTGOING in recv.
            if e.raw_os_error() != Some(libc::ENOPROTOOPT) {
                return Err(OpenError::wrap(
                    "AF_PACKET",
                    ifname,
                    "setsockopt(PACKET_IGNORE_OUTGOING)",
                    e,
                ));
            }
            tracing::debug!(
                ifname,
                "PACKET_IGNORE_OUTGOING unsupported; filtering outgoing frames in recv"
            );
        }

        // SAFETY: the option value points at a live c_int of the given size.
        let vnet = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_VNET_HDR,
                &one as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        } == 0;
        if !vnet {
            tracing::debug!(ifname, "PACKET_VNET_HDR refused: frames go one by one");
        }

        set_buffer(&fd, SO_RCVBUFFORCE, libc::SO_RCVBUF, RCVBUF_BYTES);
        set_buffer(&fd, SO_SNDBUFFORCE, libc::SO_SNDBUF, SNDBUF_BYTES);

        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: the address points at a live sockaddr_ll of the given size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(err(ifname, "bind"));
        }
        Ok(PacketLink {
            fd,
            ifname: ifname.to_owned(),
            ifindex,
            stats: LinkStats::default(),
            kernel_drops: std::cell::Cell::new(0),
            rx: RxBatch::default(),
            vnet,
            uso: vnet,
        })
    }

    /// The interface name given to [`PacketLink::open`].
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface index the socket is bound to.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Reads up to [`RECV_MANY`] frames of at most `frame_len` bytes (with
    /// the offload on: super-frames, [`uso::MAX_SUPER_FRAME`]) with one
    /// `recvmmsg(2)` into [`PacketLink::rx`] (which must be empty); false
    /// when none is waiting.
    fn refill(&mut self, frame_len: usize) -> io::Result<bool> {
        let rx = &mut self.rx;
        let buf_len = if self.vnet {
            frame_len.max(uso::MAX_SUPER_FRAME)
        } else {
            frame_len
        };
        if rx.bufs.first().is_none_or(|b| b.len() != buf_len) {
            rx.bufs = vec![vec![0; buf_len]; RECV_MANY];
            rx.vnet = vec![[0; VNET_HDR_LEN]; RECV_MANY];
        }
        rx.got.clear();
        rx.next = 0;
        rx.cur = None;
        let hdr = if self.vnet { VNET_HDR_LEN } else { 0 };
        // SAFETY: iovec, mmsghdr and sockaddr_ll are plain old data;
        // all-zero is a valid value of each.
        let mut iov: [[libc::iovec; 2]; RECV_MANY] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_ll; RECV_MANY] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; RECV_MANY] = unsafe { std::mem::zeroed() };
        for ((((b, h), v), name), m) in rx
            .bufs
            .iter_mut()
            .zip(rx.vnet.iter_mut())
            .zip(iov.iter_mut())
            .zip(names.iter_mut())
            .zip(msgs.iter_mut())
        {
            v[0].iov_base = h.as_mut_ptr().cast();
            v[0].iov_len = hdr;
            v[1].iov_base = b.as_mut_ptr().cast();
            v[1].iov_len = b.len();
            m.msg_hdr.msg_iov = v.as_mut_ptr();
            m.msg_hdr.msg_iovlen = 2;
            m.msg_hdr.msg_name = (name as *mut libc::sockaddr_ll).cast();
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        }
        // SAFETY: every message points at live buffers of their iov_len
        // and a live sockaddr_ll of its msg_namelen, all alive for the
        // call; MSG_TRUNC makes msg_len the frame's real length (with the
        // virtio-net header's).
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                RECV_MANY as libc::c_uint,
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(false),
                _ => Err(e),
            };
        }
        let n = (n as usize).min(RECV_MANY);
        rx.got
            .extend(msgs.iter().zip(names.iter()).take(n).map(|(m, a)| {
                (
                    (m.msg_len as usize).saturating_sub(hdr),
                    a.sll_pkttype == libc::PACKET_OUTGOING,
                )
            }));
        Ok(n > 0)
    }

    /// The next received frame of at most `frame_len` bytes, skipping (at
    /// most [`MAX_SKIPPED_PER_RECV`]) outgoing, malformed and longer ones
    /// and cutting super-frames into their frames; `None` when none is
    /// waiting.
    fn next_frame(&mut self, frame_len: usize) -> io::Result<Option<&[u8]>> {
        for _ in 0..MAX_SKIPPED_PER_RECV {
            if let Some((i, seg)) = &mut self.rx.cur {
                let i = *i;
                match self.rx.bufs.get_mut(i).and_then(|b| seg.next(b)) {
                    Some(r) if r.len() > frame_len => {
                        self.stats.rx_oversize += 1;
                        continue;
                    }
                    Some(r) => {
                        self.stats.rx_frames += 1;
                        return Ok(self.rx.bufs.get(i).and_then(|b| b.get(r)));
                    }
                    None => self.rx.cur = None,
                }
            }
            if self.rx.next >= self.rx.got.len() && !self.refill(frame_len)? {
                return Ok(None);
            }
            let i = self.rx.next;
            self.rx.next += 1;
            let Some(&(n, outgoing)) = self.rx.got.get(i) else {
                return Ok(None);
            };
            if outgoing {
                continue;
            }
            let Some(f) = self.rx.bufs.get(i).and_then(|b| b.get(..n)) else {
                self.stats.rx_oversize += 1;
                continue;
            };
            if !self.vnet {
                if n > frame_len {
                    self.stats.rx_oversize += 1;
                    continue;
                }
                self.stats.rx_frames += 1;
                return Ok(self.rx.bufs.get(i).and_then(|b| b.get(..n)));
            }
            let vnet = self.rx.vnet.get(i).copied().unwrap_or_default();
            match Segments::new(&vnet, f) {
                Ok(seg) => {
                    if seg.is_super() {
                        self.stats.rx_super += 1;
                    }
                    self.rx.cur = Some((i, seg));
                }
                Err(_) => self.stats.rx_malformed += 1,
            }
        }
        Ok(None)
    }

    /// Sends `frame` alone with one `send(2)` (after a plain virtio-net
    /// header with the offload on); the system call's result.
    fn send_one(&self, frame: &[u8]) -> isize {
        self.send_after(&[0; VNET_HDR_LEN], frame)
    }

    /// Sends `frame` after the virtio-net header `vnet` (left out where
    /// the socket has no `PACKET_VNET_HDR`) with one `sendmsg(2)`; the
    /// system call's result. (Tests send peers' headers with it.)
    pub(super) fn send_after(&self, vnet: &[u8; VNET_HDR_LEN], frame: &[u8]) -> isize {
        let iov = [
            libc::iovec {
                iov_base: vnet.as_ptr() as *mut libc::c_void,
                iov_len: if self.vnet { VNET_HDR_LEN } else { 0 },
            },
            libc::iovec {
                iov_base: frame.as_ptr() as *mut libc::c_void,
                iov_len: frame.len(),
            },
        ];
        // SAFETY: msghdr is plain old data; all-zero is a valid value.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = 2;
        // SAFETY: the message points at live buffers of their iov_len, only
        // read by the kernel, alive for the call; no address (the bound
        // sockaddr_ll is used).
        unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, 0) }
    }

    /// Frame counters. [`LinkStats::rx_dropped`] is the kernel's count of
    /// frames dropped because the socket's receive queue was full
    /// (`PACKET_STATISTICS`, read by this call; 0 if the read fails).
    pub fn stats(&self) -> LinkStats {
        let mut st = TpacketStats::default();
        let mut len = size_of::<TpacketStats>() as libc::socklen_t;
        // SAFETY: the option value points at a live tpacket_stats of `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                &mut st as *mut TpacketStats as *mut libc::c_void,
                &mut len,
            )
        };
        if rc == 0 {
            self.kernel_drops
                .set(self.kernel_drops.get().wrapping_add(st.tp_drops.into()));
        }
        LinkStats {
            rx_dropped: self.kernel_drops.get(),
            ..self.stats
        }
    }
}

/// Asks for a `bytes` socket buffer with `force` (beyond the sysctl
/// maximum, needs `CAP_NET_ADMIN`), else with `plain` (capped by the
/// kernel). Best effort: a buffer that stays smaller costs drops, not
/// correctness, so failures are only logged.
fn set_buffer(fd: &OwnedFd, force: libc::c_int, plain: libc::c_int, bytes: usize) {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for opt in [force, plain] {
        // SAFETY: the option value points at a live c_int of the given size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            return;
        }
    }
    tracing::debug!(
        "AF_PACKET socket buffer of {bytes} bytes refused: {}",
        io::Error::last_os_error()
    );
}

impl Link for PacketLink {
    /// Transmits the frame on the bound interface (`send(2)` without an
    /// address uses the bound `sockaddr_ll`). `EAGAIN`/`ENOBUFS` drop the
    /// frame ([`LinkStats::tx_dropped`]); other errors (`EMSGSIZE` for a
    /// frame above the MTU, `ENETDOWN`, `ENXIO`) are returned.
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let n = self.send_one(frame);
        if n < 0 {
            let e = io::Error::last_os_error();
            if is_transient_tx_error(&e) {
                self.stats.tx_dropped += 1;
                return Ok(());
            }
            return Err(e);
        }
        self.stats.tx_frames += 1;
        Ok(())
    }

    /// As [`Link::send`], but `EAGAIN`/`ENOBUFS` hand the frame back
    /// (`Ok(false)`, [`LinkStats::tx_busy`]) instead of dropping it.
    fn try_send(&mut self, frame: &[u8]) -> io::Result<bool> {
        let n = self.send_one(frame);
        if n < 0 {
            let e = io::Error::last_os_error();
            if is_transient_tx_error(&e) {
                self.stats.tx_busy += 1;
                return Ok(false);
            }
            return Err(e);
        }
        self.stats.tx_frames += 1;
        Ok(true)
    }

    /// Sends up to [`SEND_MANY_MAX`] frames with one `sendmmsg(2)`, with
    /// the offload on each run of one flow as one super-frame
    /// ([`uso::run_len`]); `EAGAIN`/`ENOBUFS` at the first message: `Ok(0)`
    /// ([`LinkStats::tx_busy`]). The kernel stops at the first message it
    /// cannot send and returns the count before it (its error is that of
    /// the next call). A super-frame the kernel refuses (`EINVAL`: a
    /// kernel without UDP segmentation) turns the offload's sending off
    /// for good and the frames go again one by one.
    fn try_send_many(&mut self, frames: &mut [Vec<u8>]) -> io::Result<usize> {
        let count = frames.len().min(SEND_MANY_MAX);
        if count == 0 {
            return Ok(0);
        }
        let mut hdrs = [[0u8; VNET_HDR_LEN + uso::MAX_HDR_LEN]; SEND_MANY_MAX];
        let mut runs = [0usize; SEND_MANY_MAX];
        // SAFETY: iovec and mmsghdr are plain old data; all-zero is valid.
        let mut iov: [libc::iovec; 2 * SEND_MANY_MAX] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; SEND_MANY_MAX] = unsafe { std::mem::zeroed() };
        let (mut i, mut m, mut v) = (0, 0, 0);
        while i < count {
            let msg = uso::next_message(&frames[i..count], self.uso, &mut hdrs[m]);
            let (n, off) = (msg.frames, msg.payload_offset);
            let first = v;
            iov[v].iov_base = hdrs[m].as_mut_ptr().cast();
            // Without PACKET_VNET_HDR (and so without runs), no header.
            iov[v].iov_len = if self.vnet { msg.hdr_len } else { 0 };
            v += 1;
            for f in &frames[i..i + n] {
                let p = f.get(off..).unwrap_or_default();
                iov[v].iov_base = p.as_ptr() as *mut libc::c_void;
                iov[v].iov_len = p.len();
                v += 1;
            }
            msgs[m].msg_hdr.msg_iov = &mut iov[first];
            msgs[m].msg_hdr.msg_iovlen = v - first;
            runs[m] = n;
            i += n;
            m += 1;
        }
        // SAFETY: the first `m` messages point at live iovecs (each at live
        // buffers of their iov_len, only read by the kernel), all alive for
        // the call and not moved since their pointers were taken; no
        // address (the bound sockaddr_ll is used).
        let sent =
            unsafe { libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), m as libc::c_uint, 0) };
        if sent < 0 {
            let e = io::Error::last_os_error();
            if is_transient_tx_error(&e) {
                self.stats.tx_busy += 1;
                return Ok(0);
            }
            if e.raw_os_error() == Some(libc::EINVAL) && runs[0] > 1 {
                tracing::warn!(
                    ifname = %self.ifname,
                    "the kernel refused a UDP super-frame: frames go one by one"
                );
                self.uso = false;
                return self.try_send_many(frames);
            }
            return Err(e);
        }
        let sent = (sent as usize).min(m);
        let taken: usize = runs[..sent].iter().sum();
        self.stats.tx_frames += taken as u64;
        self.stats.tx_super += runs[..sent].iter().filter(|&&n| n > 1).count() as u64;
        Ok(taken)
    }

    /// Receives one frame, from the frames the last `recvmmsg(2)` read
    /// ([`RECV_MANY`] at most; a new call when they are all handed out),
    /// and hands it over from the link's buffer (its ICRC to be checked);
    /// the caller's buffer only gives the largest frame taken, bytes.
    /// Frames longer are discarded ([`LinkStats::rx_oversize`], detected
    /// with `MSG_TRUNC`), as are outgoing frames on kernels without
    /// `PACKET_IGNORE_OUTGOING`.
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

    fn link_stats(&self) -> Option<LinkStats> {
        Some(self.stats())
    }
}
