//! `vrnic-limits`: the machine's own limits for a software RNIC, measured
//! in the same run as the benchmark that is compared with them
//! (`scripts/bench.sh`, issue 10): memcpy bandwidth, AF_PACKET frame rates
//! over a veth pair with one `send(2)` per frame and with `sendmmsg(2)`
//! batches, and 64-byte round trips over the pair with a busy-polling and
//! with a blocking receiver.
//!
//! Run it inside a network namespace holding both ends of a veth pair:
//! `vrnic-limits --a vA --b vB`. Output: one `key=value` line per figure
//! (`memcpy_gbytes_per_s_<size>`, `pkt_<mode>_<bytes>_mpps`, `pkt_<mode>_<bytes>_gbps`,
//! `rtt_<mode>_us`, `pkt_rcvbuf_bytes`), every measurement bounded by `--secs`.
//! The sockets get the buffers vrnic's AF_PACKET link asks for
//! (`vrnic::link::packet::RCVBUF_BYTES`, `SNDBUF_BYTES`), so the frame
//! rates are those of the same sockets the engine uses.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Parser;

/// Measure memcpy, AF_PACKET frame rates and round trips on a veth pair.
#[derive(Parser, Debug)]
#[command(name = "vrnic-limits", version)]
struct Args {
    /// One end of the veth pair (sender).
    #[arg(long)]
    a: String,
    /// The other end (receiver).
    #[arg(long)]
    b: String,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
}

/// EtherType of the probe's frames (IEEE 802 local experimental 1).
const ETHERTYPE: u16 = 0x88b5;

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
    // Every receive is bounded (recvmmsg's own timeout is checked only
    // after a datagram arrives).
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
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

fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len.max(60)];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
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

/// Frames per second from `a` to `b` for `secs` (the receiver counts).
fn frame_rate(a: &OwnedFd, b: &OwnedFd, len: usize, batch: usize, secs: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let got = Arc::new(AtomicU64::new(0));
    let rx = {
        let (stop, got) = (stop.clone(), got.clone());
        let fd = b.as_raw_fd();
        std::thread::spawn(move || {
            let mut bufs = vec![[0u8; 9216]; 64];
            let mut iov: Vec<libc::iovec> = bufs
                .iter_mut()
                .map(|b| libc::iovec {
                    iov_base: b.as_mut_ptr().cast(),
                    iov_len: b.len(),
                })
                .collect();
            // SAFETY: mmsghdr is plain data.
            let mut msgs: Vec<libc::mmsghdr> =
                (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
            for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
            }
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 50_000_000,
            };
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: msgs/iov/bufs live for the call.
                let n = unsafe {
                    libc::recvmmsg(fd, msgs.as_mut_ptr(), 64, libc::MSG_WAITFORONE, &mut ts)
                };
                if n > 0 {
                    got.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        })
    };
    let f = frame(len);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        if batch <= 1 {
            // SAFETY: sending our buffer on our socket.
            unsafe { libc::send(a.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
        } else {
            let mut iov: Vec<libc::iovec> = (0..batch)
                .map(|_| libc::iovec {
                    iov_base: f.as_ptr() as *mut libc::c_void,
                    iov_len: f.len(),
                })
                .collect();
            // SAFETY: mmsghdr is plain data.
            let mut msgs: Vec<libc::mmsghdr> =
                (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect();
            for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
                m.msg_hdr.msg_iov = v;
                m.msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: msgs/iov/f live for the call.
            unsafe { libc::sendmmsg(a.as_raw_fd(), msgs.as_mut_ptr(), batch as u32, 0) };
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Let the receiver drain what is in flight (bounded).
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::Relaxed);
    let _ = rx.join();
    got.load(Ordering::Relaxed) as f64 / elapsed
}

/// Mean 64-byte round trip over the pair, µs: `a` sends, `b` echoes.
fn rtt_us(a: &OwnedFd, b: &OwnedFd, busy: bool, secs: f64) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        let fd = b.as_raw_fd();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let flags = if busy { libc::MSG_DONTWAIT } else { 0 };
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: receiving into our buffer.
                let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
                if n > 0 {
                    // SAFETY: echoing the bytes received.
                    unsafe { libc::send(fd, buf.as_ptr().cast(), n as usize, 0) };
                }
            }
        })
    };
    let f = frame(64);
    let mut buf = [0u8; 2048];
    let flags = if busy { libc::MSG_DONTWAIT } else { 0 };
    let start = Instant::now();
    let mut n = 0u64;
    'outer: while start.elapsed().as_secs_f64() < secs {
        // SAFETY: sending our frame.
        unsafe { libc::send(a.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
        let t = Instant::now();
        loop {
            // SAFETY: receiving into our buffer.
            let r = unsafe { libc::recv(a.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
            if r > 0 {
                break;
            }
            if t.elapsed() > Duration::from_millis(200) {
                break 'outer;
            }
        }
        n += 1;
    }
    let us = start.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64;
    stop.store(true, Ordering::Relaxed);
    // Unblock a blocking echo thread.
    // SAFETY: sending a last frame to the echo side.
    unsafe { libc::send(a.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
    let _ = echo.join();
    us
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let secs = args.secs.clamp(0.05, 10.0);
    for size in [4096usize, 65536, 1 << 20] {
        println!(
            "memcpy_gbytes_per_s_{size}={:.2}",
            memcpy_gbps(size, secs) / 8.0
        );
    }
    let a = packet_socket(&args.a).with_context(|| args.a.clone())?;
    let b = packet_socket(&args.b).with_context(|| args.b.clone())?;
    let mut rcvbuf: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the option value points at a live c_int of `len` bytes.
    unsafe {
        libc::getsockopt(
            b.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut rcvbuf as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    println!("pkt_rcvbuf_bytes={rcvbuf}");
    // RoCEv2-shaped frame sizes: 58 bytes of headers around 6 B, 1 KiB and 4 KiB.
    for len in [64usize, 1082, 4154] {
        for (mode, batch) in [("send", 1usize), ("sendmmsg64", 64)] {
            let fps = frame_rate(&a, &b, len, batch, secs);
            println!("pkt_{mode}_{len}_mpps={:.3}", fps / 1e6);
            println!("pkt_{mode}_{len}_gbps={:.2}", fps * len as f64 * 8.0 / 1e9);
        }
    }
    println!("rtt_busy_us={:.1}", rtt_us(&a, &b, true, secs));
    println!("rtt_blocking_us={:.1}", rtt_us(&a, &b, false, secs));
    Ok(())
}
