//! `vrnic-limits`: the machine's own limits for a software RNIC, measured
//! in the same run as the benchmark that is compared with them
//! (`scripts/bench.sh`, issue 10): memcpy bandwidth, AF_PACKET frame rates
//! over a veth pair with one `send(2)` per frame and with `sendmmsg(2)`
//! batches, RoCEv2-shaped UDP frames through vrnic's own AF_PACKET link
//! with UDP segmentation offload (`vrnic::link::uso`: runs of frames as
//! one super-frame, the path the engine's frames take), raw TAP frame rates (one `write(2)` per frame into one TAP of a
//! bridge, `read(2)` from another), and 64-byte round trips over both paths
//! with a busy-polling and with a blocking receiver; and the round trip of
//! two yielding pollers through one or two relay threads (the hand-offs of
//! a ping-pong through a daemon, [`relay_rtt_us`]), and the same with two
//! relays and the wire between them ([`relay_wire_rtt_us`]: the floor of a
//! ping-pong between two daemons).
//!
//! Run it inside a network namespace holding both ends of a veth pair and,
//! for the TAP figures, two TAP interfaces (`ip tuntap add NAME mode tap`)
//! on one bridge, all up: `vrnic-limits --a vA --b vB [--tap-a tA --tap-b
//! tB]`. Output: one `key=value` line per figure
//! (`memcpy_gbytes_per_s_<size>`, `pkt_<mode>_<bytes>_mpps` (modes `send`,
//! `sendmmsg64`, `uso`), `pkt_<mode>_<bytes>_gbps`,
//! `tap_write_<bytes>_mpps`, `tap_write_<bytes>_gbps`, `rtt_<mode>_us`,
//! `rtt_tap_<mode>_us`, `rtt_relay<n>_us`, `rtt_relay_wire_us`, `rtt_relay_tap_us`,
//! `pkt_rcvbuf_bytes`), each figure the best of `--windows` windows of `--secs` each.
//! The sockets get the buffers vrnic's AF_PACKET link asks for
//! (`vrnic::link::packet::RCVBUF_BYTES`, `SNDBUF_BYTES`) and the TAPs are
//! opened by vrnic's own TAP link (`vrnic::link::TapLink`, with its queue
//! length), so the frame rates are those of the same descriptors the
//! engine uses. Frame rates count what the receiver got; the receiver
//! reads without blocking and waits in `poll(2)` (`recvmmsg(2)`'s timeout
//! for AF_PACKET) when nothing is there.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;
use vrnic::link::{Link as _, PacketLink, TapLink};

/// Measure memcpy, AF_PACKET and TAP frame rates and round trips.
#[derive(Parser, Debug)]
#[command(name = "vrnic-limits", version)]
struct Args {
    /// One end of the veth pair (sender).
    #[arg(long)]
    a: String,
    /// The other end (receiver).
    #[arg(long)]
    b: String,
    /// A TAP interface on a bridge (sender); with --tap-b, adds the TAP figures.
    #[arg(long, requires = "tap_b")]
    tap_a: Option<String>,
    /// Another TAP interface on the same bridge (receiver).
    #[arg(long, requires = "tap_a")]
    tap_b: Option<String>,
    /// Seconds per measurement window.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Windows per figure; the best is printed (the highest rate, the
    /// lowest round trip): a limit is what the machine can do, and on a
    /// shared machine one window can land beside someone else's work.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    windows: u32,
}

/// The best of `n` windows of `f`: the highest value, or with `lowest`
/// the lowest.
fn best(n: u32, lowest: bool, mut f: impl FnMut() -> f64) -> f64 {
    let mut b = f();
    for _ in 1..n {
        let v = f();
        b = if lowest { b.min(v) } else { b.max(v) };
    }
    b
}

/// EtherType of the probe's frames (IEEE 802 local experimental 1).
const ETHERTYPE: u16 = 0x88b5;
/// The sender's MAC address (the source of every probe frame).
const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
/// The receiver's MAC address: the destination of every probe frame, so a
/// bridge forwards them to the other TAP only, as it does RoCEv2 frames
/// (a broadcast would also go up the bridge's own stack).
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
/// Longest wait of one receive for a frame; it then reports none. Bounds
/// every wait of the probe.
const RECV_WAIT: Duration = Duration::from_millis(100);
/// Frames one batched receive (`recvmmsg(2)`, or TAP reads in a row) takes.
const RX_BATCH: usize = 64;
/// Receive buffer per frame, bytes (MTU 9000 and headers).
const RX_FRAME: usize = 9216;

/// One end of a measured path: an AF_PACKET socket on a veth, or a TAP on
/// a bridge.
trait Port: Send {
    /// Sends one frame with one system call; a frame the kernel refuses is
    /// lost (the receiver counts what arrived).
    fn send(&mut self, frame: &[u8]);
    /// Sends `n` copies of `frame` in as few system calls as the port can;
    /// by default one [`Port::send`] each.
    fn send_batch(&mut self, frame: &[u8], n: usize) {
        for _ in 0..n {
            self.send(frame);
        }
    }
    /// One probe frame into `buf`: its length, or `None` when none came
    /// (`busy`: none is waiting now; else none within [`RECV_WAIT`]).
    fn recv(&mut self, buf: &mut [u8], busy: bool) -> Option<usize>;
    /// Up to [`RX_BATCH`] frames, waiting at most [`RECV_WAIT`] for the
    /// first: how many probe frames, or `None` when nothing came.
    fn recv_many(&mut self) -> Option<u64>;
}

/// An AF_PACKET socket bound to the probe's EtherType on one interface.
struct PacketPort {
    fd: OwnedFd,
    /// [`RX_BATCH`] frames of [`RX_FRAME`] bytes for `recvmmsg(2)`.
    bufs: Vec<[u8; RX_FRAME]>,
}

impl PacketPort {
    fn open(ifname: &str) -> anyhow::Result<PacketPort> {
        Ok(PacketPort {
            fd: packet_socket(ifname)?,
            bufs: vec![[0u8; RX_FRAME]; RX_BATCH],
        })
    }
}

impl Port for PacketPort {
    fn send(&mut self, frame: &[u8]) {
        // SAFETY: sending our buffer on our socket.
        unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    }

    fn send_batch(&mut self, frame: &[u8], n: usize) {
        let mut iov: Vec<libc::iovec> = (0..n)
            .map(|_| libc::iovec {
                iov_base: frame.as_ptr() as *mut libc::c_void,
                iov_len: frame.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data.
        let mut msgs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: msgs/iov/frame live for the call.
        unsafe { libc::sendmmsg(self.fd.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
    }

    fn recv(&mut self, buf: &mut [u8], busy: bool) -> Option<usize> {
        // A blocking receive is bounded by SO_RCVTIMEO (RECV_WAIT).
        let flags = if busy { libc::MSG_DONTWAIT } else { 0 };
        // SAFETY: receiving into our buffer.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
            )
        };
        usize::try_from(n).ok().filter(|&n| n > 0)
    }

    fn recv_many(&mut self) -> Option<u64> {
        let mut iov: Vec<libc::iovec> = self
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain data.
        let mut msgs: Vec<libc::mmsghdr> = (0..RX_BATCH)
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
        }
        // The socket's SO_RCVTIMEO bounds the wait for the first frame.
        // SAFETY: msgs/iov/bufs live for the call.
        let n = unsafe {
            libc::recvmmsg(
                self.fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                RX_BATCH as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        u64::try_from(n).ok().filter(|&n| n > 0)
    }
}

/// A TAP interface through vrnic's own TAP link (nonblocking, the engine's
/// queue length); frames other than the probe's (the kernel's IPv6
/// neighbour discovery on the bridge) are read and not counted.
struct TapPort {
    link: TapLink,
    fd: RawFd,
    /// One frame for [`Port::recv_many`].
    buf: Vec<u8>,
}

impl TapPort {
    fn open(name: &str) -> anyhow::Result<TapPort> {
        let link = TapLink::open(name)?;
        let fd = link.caps().fd.context("a TAP link has a descriptor")?;
        Ok(TapPort {
            link,
            fd,
            buf: vec![0; RX_FRAME],
        })
    }
}

impl Port for TapPort {
    fn send(&mut self, frame: &[u8]) {
        // A frame the TAP refuses is counted by the link and lost.
        let _ = self.link.send(frame);
    }

    fn recv(&mut self, buf: &mut [u8], busy: bool) -> Option<usize> {
        // Bounded: at most RX_BATCH frames read or waits of RECV_WAIT.
        for _ in 0..RX_BATCH {
            match self.link.recv(buf) {
                Ok(Some(n)) if is_probe(&buf[..n]) => return Some(n),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    if busy || !readable(self.fd, RECV_WAIT) {
                        return None;
                    }
                }
            }
        }
        None
    }

    fn recv_many(&mut self) -> Option<u64> {
        let (mut frames, mut probes) = (0u64, 0u64);
        for _ in 0..RX_BATCH {
            match self.link.recv(&mut self.buf) {
                Ok(Some(n)) => {
                    frames += 1;
                    probes += u64::from(is_probe(&self.buf[..n]));
                }
                Ok(None) | Err(_) => {
                    if frames > 0 || !readable(self.fd, RECV_WAIT) {
                        break;
                    }
                }
            }
        }
        (frames > 0).then_some(probes)
    }
}

/// RoCEv2-shaped IPv4/UDP frames through vrnic's AF_PACKET link, whose
/// batches go as UDP super-frames ([`vrnic::link::uso`]): 64 frames per
/// [`Port::send_batch`], IPv4 identifications counting up (as the
/// engine's), so runs form as they do for a long message.
struct UsoPort {
    link: PacketLink,
    fd: RawFd,
    /// The frames of one batch, rebuilt with fresh identifications.
    batch: Vec<Vec<u8>>,
    id: u16,
    buf: Vec<u8>,
}

/// UDP source port of the offload probe's frames (to 4791, RoCEv2's).
const USO_PORT: u16 = 0x88b5;

impl UsoPort {
    fn open(ifname: &str) -> anyhow::Result<UsoPort> {
        let link = PacketLink::open(ifname)?;
        let fd = link
            .caps()
            .fd
            .context("an AF_PACKET link has a descriptor")?;
        Ok(UsoPort {
            link,
            fd,
            batch: Vec::new(),
            id: 0,
            buf: vec![0; RX_FRAME],
        })
    }

    /// `n` frames of `len` bytes (at least 64), the next identifications.
    fn fill(&mut self, len: usize, n: usize) {
        let len = len.max(64);
        self.batch.resize_with(n, Vec::new);
        for f in &mut self.batch {
            f.clear();
            f.resize(len, 0);
            f[..6].copy_from_slice(&MAC_B);
            f[6..12].copy_from_slice(&MAC_A);
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            let ip_len = (len - 14) as u16;
            f[14..34].copy_from_slice(&[
                0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 79, 0, 1, 10, 79, 0, 2,
            ]);
            f[16..18].copy_from_slice(&ip_len.to_be_bytes());
            f[18..20].copy_from_slice(&self.id.to_be_bytes());
            self.id = self.id.wrapping_add(1);
            // The IPv4 header checksum (the sum is in the host's byte order).
            let sum = etherparse::checksum::Sum16BitWords::new()
                .add_slice(&f[14..34])
                .ones_complement();
            f[24..26].copy_from_slice(&sum.to_ne_bytes());
            f[34..36].copy_from_slice(&USO_PORT.to_be_bytes());
            f[36..38].copy_from_slice(&4791u16.to_be_bytes());
            f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
        }
    }

    fn is_probe(f: &[u8]) -> bool {
        f.get(34..36) == Some(&USO_PORT.to_be_bytes()[..])
    }
}

impl Port for UsoPort {
    fn send(&mut self, frame: &[u8]) {
        self.send_batch(frame, 1);
    }

    /// `n` RoCEv2-shaped frames as long as `frame` (its bytes unused).
    fn send_batch(&mut self, frame: &[u8], n: usize) {
        self.fill(frame.len(), n);
        let mut sent = 0;
        // Bounded: each pass takes at least one frame or ends.
        while sent < self.batch.len() {
            match self.link.try_send_many(&mut self.batch[sent..]) {
                Ok(0) | Err(_) => break,
                Ok(k) => sent += k,
            }
        }
    }

    fn recv(&mut self, buf: &mut [u8], _busy: bool) -> Option<usize> {
        self.link.recv(buf).ok().flatten()
    }

    fn recv_many(&mut self) -> Option<u64> {
        let (mut frames, mut probes) = (0u64, 0u64);
        // The link reads ahead (its descriptor does not show the frames it
        // holds): read until it has none, then wait on the descriptor.
        for _ in 0..RX_BATCH {
            let mut probe = false;
            match self
                .link
                .recv_with(&mut self.buf, &mut |f, _| probe = UsoPort::is_probe(f))
            {
                Ok(true) => {
                    frames += 1;
                    probes += u64::from(probe);
                }
                Ok(false) | Err(_) => {
                    if frames > 0 || !readable(self.fd, RECV_WAIT) {
                        break;
                    }
                }
            }
        }
        (frames > 0).then_some(probes)
    }
}

/// Whether `f` is one of the probe's frames (its EtherType).
fn is_probe(f: &[u8]) -> bool {
    f.get(12..14) == Some(&ETHERTYPE.to_be_bytes()[..])
}

/// Waits at most `wait` for `fd` to poll readable (`poll(2)`).
fn readable(fd: RawFd, wait: Duration) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one pollfd that lives for the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

fn packet_socket(ifname: &str) -> anyhow::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(ETHERTYPE.to_be()),
        )
    };
    if fd < 0 {
        bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SO_RCVBUFFORCE / SO_SNDBUFFORCE (asm-generic/socket.h), else the
    // plain options capped by the sysctls, as vrnic's PacketLink.
    for (force, plain, bytes) in [
        (33, libc::SO_RCVBUF, vrnic::link::packet::RCVBUF_BYTES),
        (32, libc::SO_SNDBUF, vrnic::link::packet::SNDBUF_BYTES),
    ] {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        let set = |opt| {
            // SAFETY: the option value points at a live c_int of the given size.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                )
            }
        };
        if set(force) != 0 {
            set(plain);
        }
    }
    let name = std::ffi::CString::new(ifname)?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        bail!("no interface {ifname}");
    }
    // SAFETY: sockaddr_ll is plain data.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = ETHERTYPE.to_be();
    sa.sll_ifindex = index as i32;
    // SAFETY: binding our socket to a valid sockaddr_ll.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if r != 0 {
        bail!("bind {ifname}: {}", std::io::Error::last_os_error());
    }
    // Every receive is bounded by RECV_WAIT (recvmmsg's own timeout is
    // checked only after a datagram arrives).
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: RECV_WAIT.as_micros() as libc::suseconds_t,
    };
    // SAFETY: setting a timeval option on our socket.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as u32,
        )
    };
    // Only frames from the wire: a packet socket also sees its own sends.
    let one: libc::c_int = 1;
    // SAFETY: setting an int option on our socket.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as u32,
        )
    };
    Ok(fd)
}

/// A probe frame of `len` bytes (at least 60) from [`MAC_A`] to [`MAC_B`].
fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(60)];
    f[..6].copy_from_slice(&MAC_B);
    f[6..12].copy_from_slice(&MAC_A);
    f[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
    f
}

fn memcpy_gbps(size: usize, secs: f64) -> f64 {
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let start = Instant::now();
    let mut bytes = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            let s = std::hint::black_box(src.as_slice());
            let d = std::hint::black_box(dst.as_mut_slice());
            d.copy_from_slice(s);
            std::hint::black_box(&d[size - 1]);
            bytes += size as u64;
        }
    }
    bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

/// Frames per second from `a` to `b` for `secs`, `batch` frames per send
/// call (1: [`Port::send`], else [`Port::send_batch`]); the receiver counts.
/// After the sender stops, the receiver reads until `b` is quiet for
/// [`RECV_WAIT`] (at most 1 s), so the frames in flight are counted and
/// none is left for the next measurement.
fn frame_rate(a: &mut impl Port, b: &mut impl Port, len: usize, batch: usize, secs: f64) -> f64 {
    let stop = AtomicBool::new(false);
    let f = frame(len);
    std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let mut got = 0u64;
            let mut stopped: Option<Instant> = None;
            loop {
                let n = b.recv_many();
                got += n.unwrap_or(0);
                if stopped.is_none() && stop.load(Ordering::Relaxed) {
                    stopped = Some(Instant::now());
                }
                if stopped.is_some_and(|t| n.is_none() || t.elapsed() > Duration::from_secs(1)) {
                    return got;
                }
            }
        });
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < secs {
            if batch <= 1 {
                a.send(&f);
            } else {
                a.send_batch(&f, batch);
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        rx.join().unwrap_or(0) as f64 / elapsed
    })
}

/// Mean 64-byte round trip from `a` to `b` and back, µs, over `secs`: `b`
/// echoes each frame to `a` (addresses swapped); both receive busy-polling
/// (`busy`) or blocking. A round trip that takes over 200 ms ends the
/// measurement.
fn rtt_us(a: &mut impl Port, b: &mut impl Port, busy: bool, secs: f64) -> f64 {
    let stop = AtomicBool::new(false);
    let f = frame(64);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut buf = [0u8; 2048];
            // A blocking receive returns within RECV_WAIT, so a stop is seen.
            while !stop.load(Ordering::Relaxed) {
                if let Some(n) = b.recv(&mut buf, busy) {
                    swap_macs(&mut buf);
                    b.send(&buf[..n]);
                }
            }
        });
        let mut buf = [0u8; 2048];
        let start = Instant::now();
        let mut n = 0u64;
        'outer: while start.elapsed().as_secs_f64() < secs {
            a.send(&f);
            let t = Instant::now();
            while a.recv(&mut buf, busy).is_none() {
                if t.elapsed() > Duration::from_millis(200) {
                    break 'outer;
                }
            }
            n += 1;
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64;
        stop.store(true, Ordering::Relaxed);
        us
    })
}

/// Waits (at most `bound`) until a probe frame sent on `a` arrives on `b`,
/// then empties `b`: a TAP's bridge port forwards only once the kernel has
/// seen its carrier (the probe's open brought it up).
fn wait_path(a: &mut impl Port, b: &mut impl Port, bound: Duration) -> anyhow::Result<()> {
    let f = frame(64);
    let mut buf = [0u8; RX_FRAME];
    let start = Instant::now();
    loop {
        a.send(&f);
        if b.recv(&mut buf, false).is_some() {
            break;
        }
        if start.elapsed() > bound {
            bail!("no frame crossed within {bound:?}");
        }
    }
    for _ in 0..1000 {
        if b.recv(&mut buf, true).is_none() {
            break;
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let secs = args.secs.clamp(0.05, 10.0);
    let w = args.windows;
    // 4 MiB: the largest message of the benchmark's QP-scaling rows (issue 28).
    for size in [4096usize, 65536, 1 << 20, 4 << 20] {
        println!(
            "memcpy_gbytes_per_s_{size}={:.2}",
            best(w, false, || memcpy_gbps(size, secs)) / 8.0
        );
    }
    let mut a = PacketPort::open(&args.a).with_context(|| args.a.clone())?;
    let mut b = PacketPort::open(&args.b).with_context(|| args.b.clone())?;
    let mut rcvbuf: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the option value points at a live c_int of `len` bytes.
    unsafe {
        libc::getsockopt(
            b.fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut rcvbuf as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    println!("pkt_rcvbuf_bytes={rcvbuf}");
    // RoCEv2-shaped frame sizes: 58 bytes of headers around 6 B, 1 KiB and 4 KiB.
    for len in FRAME_SIZES {
        for (mode, batch) in [("send", 1usize), ("sendmmsg64", 64)] {
            let fps = best(w, false, || frame_rate(&mut a, &mut b, len, batch, secs));
            print_rate(&format!("pkt_{mode}"), len, fps);
        }
    }
    {
        let mut a = UsoPort::open(&args.a).with_context(|| args.a.clone())?;
        let mut b = UsoPort::open(&args.b).with_context(|| args.b.clone())?;
        for len in FRAME_SIZES {
            let fps = best(w, false, || frame_rate(&mut a, &mut b, len, 64, secs));
            print_rate("pkt_uso", len, fps);
        }
    }
    for relays in [1, 2] {
        println!(
            "rtt_relay{relays}_us={:.2}",
            best(w, true, || relay_rtt_us(relays, secs))
        );
    }
    let rtt =
        |a: &mut PacketPort, b: &mut PacketPort, busy| best(w, true, || rtt_us(a, b, busy, secs));
    println!("rtt_busy_us={:.1}", rtt(&mut a, &mut b, true));
    println!("rtt_blocking_us={:.1}", rtt(&mut a, &mut b, false));
    println!(
        "rtt_relay_wire_us={:.1}",
        best(w, true, || relay_wire_rtt_us(&mut a, &mut b, secs))
    );
    if let (Some(ta), Some(tb)) = (&args.tap_a, &args.tap_b) {
        let mut a = TapPort::open(ta)?;
        let mut b = TapPort::open(tb)?;
        wait_path(&mut a, &mut b, Duration::from_secs(5))
            .with_context(|| format!("TAP {ta} -> bridge -> {tb}"))?;
        for len in FRAME_SIZES {
            let fps = best(w, false, || frame_rate(&mut a, &mut b, len, 1, secs));
            print_rate("tap_write", len, fps);
        }
        println!(
            "rtt_tap_busy_us={:.1}",
            best(w, true, || rtt_us(&mut a, &mut b, true, secs))
        );
        println!(
            "rtt_tap_blocking_us={:.1}",
            best(w, true, || rtt_us(&mut a, &mut b, false, secs))
        );
        println!(
            "rtt_relay_tap_us={:.1}",
            best(w, true, || relay_wire_rtt_us(&mut a, &mut b, secs))
        );
    }
    Ok(())
}

/// Round trip between two threads through `relays` relay threads and
/// back, microseconds: every thread polls one shared word and yields the
/// CPU when it is not its turn (`sched_yield(2)`), as two programs polling
/// their CQs through guest-lib and a daemon's polling workers do — the
/// hand-offs of a 64-byte ping-pong through vrnic (one relay: one worker
/// between two programs; two: a worker each), with no work in them. On a
/// machine with fewer cores than threads each hand-off is a context
/// switch. Runs for `secs`; every thread stops when the first one does.
fn relay_rtt_us(relays: u32, secs: f64) -> f64 {
    use std::sync::atomic::AtomicU32;
    // Stages of one round trip: 0 the first end, 1..=relays the relays
    // there, relays + 1 the other end, then the relays back.
    let stages = 2 * (relays + 1);
    let turn = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let owner = |stage: u32| -> u32 {
        // Thread 0: first end; 1..=relays: relays; relays + 1: other end.
        if stage <= relays + 1 {
            stage
        } else {
            stages - stage
        }
    };
    let mut rounds = 0u64;
    let start = Instant::now();
    std::thread::scope(|sc| {
        for me in 1..=relays + 1 {
            let (turn, stop) = (&turn, &stop);
            sc.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = turn.load(Ordering::Acquire);
                    if t != 0 && owner(t) == me {
                        turn.store((t + 1) % stages, Ordering::Release);
                    } else {
                        yield_cpu();
                    }
                }
            });
        }
        let end = Duration::from_secs_f64(secs);
        while start.elapsed() < end {
            if turn.load(Ordering::Acquire) == 0 {
                rounds += 1;
                turn.store(1, Ordering::Release);
            } else {
                yield_cpu();
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    start.elapsed().as_secs_f64() * 1e6 / rounds.max(1) as f64
}

/// Round trip between two yielding end threads through two relay threads
/// and the wire between them, microseconds: each end hands its turn to
/// its relay through a shared word, the relay sends a 64-byte frame on
/// its port and the other relay, which polls its port without blocking,
/// hands the frame to its end the same way; the answer comes back the
/// same path. Every thread yields the CPU when it has nothing to do
/// (`sched_yield(2)`), as the two programs polling their CQs and the two
/// daemons' workers of a 64-byte ping-pong over a wire do: the hand-offs
/// of [`relay_rtt_us`] (two relays) and the wire crossings of [`rtt_us`]
/// in one figure, with no other work. A frame not answered within 200 ms
/// ends the run (as [`rtt_us`]).
fn relay_wire_rtt_us(a: &mut impl Port, b: &mut impl Port, secs: f64) -> f64 {
    use std::sync::atomic::AtomicU32;
    // ping (first end and relay A): 1 relay A sends, 0 the answer came.
    // pong (relay B and other end): 1 a frame came, 2 the end answered.
    let (ping, pong) = (AtomicU32::new(0), AtomicU32::new(0));
    let stop = AtomicBool::new(false);
    let f = frame(64);
    // The answer goes back to the first end's address (a bridge learns
    // where each address is).
    let mut back = f.clone();
    swap_macs(&mut back);
    let mut rounds = 0u64;
    let start = Instant::now();
    std::thread::scope(|sc| {
        let (ping, pong, stop, f, back) = (&ping, &pong, &stop, &f, &back);
        // Relay A: sends when its end asks, then polls for the answer.
        sc.spawn(move || {
            let mut buf = [0u8; 2048];
            let mut sent = false;
            while !stop.load(Ordering::Relaxed) {
                if !sent && ping.load(Ordering::Acquire) == 1 {
                    a.send(f);
                    sent = true;
                } else if sent && a.recv(&mut buf, true).is_some() {
                    sent = false;
                    ping.store(0, Ordering::Release);
                } else {
                    yield_cpu();
                }
            }
        });
        // Relay B: hands a frame to its end, sends the end's answer.
        sc.spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if pong.load(Ordering::Acquire) == 2 {
                    b.send(back);
                    pong.store(0, Ordering::Release);
                } else if pong.load(Ordering::Acquire) == 0 && b.recv(&mut buf, true).is_some() {
                    pong.store(1, Ordering::Release);
                } else {
                    yield_cpu();
                }
            }
        });
        // The other end: answers at once.
        sc.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if pong.load(Ordering::Acquire) == 1 {
                    pong.store(2, Ordering::Release);
                } else {
                    yield_cpu();
                }
            }
        });
        let end = Duration::from_secs_f64(secs);
        'outer: while start.elapsed() < end {
            ping.store(1, Ordering::Release);
            let t = Instant::now();
            while ping.load(Ordering::Acquire) != 0 {
                if t.elapsed() > Duration::from_millis(200) {
                    break 'outer;
                }
                yield_cpu();
            }
            rounds += 1;
        }
        stop.store(true, Ordering::Relaxed);
    });
    start.elapsed().as_secs_f64() * 1e6 / rounds.max(1) as f64
}

/// Gives the CPU to another runnable thread (`sched_yield(2)`), as a
/// polling program or worker does between empty rounds.
fn yield_cpu() {
    // SAFETY: no arguments; it cannot fail on Linux.
    unsafe { libc::sched_yield() };
}

/// Swaps an Ethernet frame's destination and source addresses (an
/// answer goes back where the frame came from).
fn swap_macs(frame: &mut [u8]) {
    let (dst, src) = frame.split_at_mut(6);
    dst.swap_with_slice(&mut src[..6]);
}

/// The probe's frame sizes, bytes: RoCEv2-shaped, 58 bytes of headers
/// around 6 B, 1 KiB and 4 KiB of payload.
const FRAME_SIZES: [usize; 3] = [64, 1082, 4154];

/// Prints `<prefix>_<len>_mpps` and `<prefix>_<len>_gbps` (frame bits) for
/// `fps` frames of `len` bytes a second.
fn print_rate(prefix: &str, len: usize, fps: f64) {
    println!("{prefix}_{len}_mpps={:.3}", fps / 1e6);
    println!("{prefix}_{len}_gbps={:.2}", fps * len as f64 * 8.0 / 1e9);
}
