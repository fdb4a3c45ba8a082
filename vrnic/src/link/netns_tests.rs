//! Tests of the kernel-backed links (TAP, AF_PACKET). Each test creates its
//! own network namespace (`ip netns add`), enters it on a spawned thread
//! (`setns(2)` with `CLONE_NEWNET` changes only the calling thread), creates
//! its interfaces there and deletes the namespace afterwards, also when the
//! test fails (a guard's `Drop`). Nothing is sent outside that namespace.
//! Skipped, with a message, when not running as root or without `ip`.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{Icrc, Link, PacketLink, TapLink};

/// IEEE 802 "local experimental" EtherType: nothing in the namespace speaks it.
const TEST_ETHERTYPE: [u8; 2] = [0x88, 0xb5];
/// Bound on every wait for a frame.
const WAIT: Duration = Duration::from_secs(5);

/// Runs `ip ARGS`, returning its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace that exists while the guard lives; one at a time
/// in this process ([`ONE_AT_A_TIME`]).
struct Netns {
    name: String,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

impl Netns {
    /// `None` (after printing why) when the test cannot run here.
    fn create(tag: &str) -> Option<Netns> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: netns link tests need root");
            return None;
        }
        let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        // A flood of an earlier test whose wait ran out would drop this
        // test's frames.
        if let Some(q) = backlog_drained().filter(|&q| q > 0) {
            eprintln!("{tag}: {q} frames in the kernel's backlog before the test after {WAIT:?}");
        }
        let name = format!("vrnic-linktest-{}-{tag}", std::process::id());
        if let Err(e) = ip(&["netns", "add", &name]) {
            eprintln!("skipping: cannot create a network namespace: {e}");
            return None;
        }
        Some(Netns {
            name,
            _one_at_a_time: one,
        })
    }

    /// `ip -n NAME ARGS`.
    fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        if let Err(e) = ip(&all) {
            panic!("{e}");
        }
    }

    /// The transmit drops `ip -s link` reports for interface `dev`.
    fn tx_dropped(&self, dev: &str) -> u64 {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-s", "link", "show", dev])
            .output()
            .expect("ip -s link");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("TX:"));
        lines
            .nth(1)
            .and_then(|l| l.split_whitespace().nth(3))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no TX dropped in {text}"))
    }

    /// Runs `f` on a thread that has entered the namespace.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let cpath = CString::new(path.clone()).expect("no NUL in path");
                // SAFETY: valid C string; the descriptor is closed below.
                let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                assert!(fd >= 0, "open {path}: {}", std::io::Error::last_os_error());
                // SAFETY: fd is a namespace file we just opened.
                let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
                let err = std::io::Error::last_os_error();
                // SAFETY: closing our own descriptor once.
                unsafe { libc::close(fd) };
                assert_eq!(rc, 0, "setns {path}: {err}");
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("cleanup failed: {e}");
        }
    }
}

/// A 64-byte broadcast frame of [`TEST_ETHERTYPE`] carrying `token`.
fn test_frame(token: &[u8; 8]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f.extend_from_slice(&TEST_ETHERTYPE);
    f.extend_from_slice(token);
    f.resize(64, 0);
    f
}

/// Waits until `fd` is readable or `left` passed.
fn wait_readable(fd: RawFd, left: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe {
        libc::poll(
            &mut pfd,
            1,
            left.as_millis().min(i32::MAX as u128) as i32 + 1,
        )
    };
}

/// Waits (bounded by [`WAIT`], on the link's descriptor) for a frame equal
/// to `want`, skipping unrelated traffic (IPv6 autoconfiguration, ...).
fn wait_for(link: &mut dyn Link, want: &[u8]) -> bool {
    let fd: RawFd = link.caps().fd.expect("kernel links have a descriptor");
    let deadline = Instant::now() + WAIT;
    let mut buf = vec![0u8; 2048];
    loop {
        while let Some(n) = link.recv(&mut buf).expect("recv") {
            if &buf[..n] == want {
                return true;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        wait_readable(fd, left);
    }
}

/// Drains the link without waiting; `true` if a frame equal to `frame` was waiting.
fn has_frame(link: &mut dyn Link, frame: &[u8]) -> bool {
    let mut buf = vec![0u8; 2048];
    let mut seen = false;
    while let Some(n) = link.recv(&mut buf).expect("recv") {
        seen |= &buf[..n] == frame;
    }
    seen
}

#[test]
fn packet_links_exchange_frames_over_veth_in_netns() {
    let Some(ns) = Netns::create("veth") else {
        return;
    };
    ns.ip(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
    ns.ip(&["link", "set", "va", "up"]);
    ns.ip(&["link", "set", "vb", "up"]);
    ns.run(|| {
        let mut a = PacketLink::open("va").expect("open va");
        let mut b = PacketLink::open("vb").expect("open vb");
        assert!(a.caps().fd.is_some());

        let f1 = test_frame(b"a-to-b!!");
        a.send(&f1).expect("send on va");
        assert!(wait_for(&mut b, &f1), "frame sent on va not received on vb");
        // The outgoing copy is queued on va's socket (if at all) before the
        // frame crosses to vb: PACKET_IGNORE_OUTGOING must have kept it out.
        assert!(!has_frame(&mut a, &f1), "va read back its own frame");

        let f2 = test_frame(b"b-to-a!!");
        b.send(&f2).expect("send on vb");
        assert!(wait_for(&mut a, &f2), "frame sent on vb not received on va");
        assert!(a.stats().tx_frames == 1 && b.stats().tx_frames == 1);
        assert!(a.stats().rx_frames >= 1 && b.stats().rx_frames >= 1);
    });
}

#[test]
fn tap_link_exchanges_frames_with_its_interface_in_netns() {
    let Some(ns) = Netns::create("tap") else {
        return;
    };
    // An interface created beforehand, as `vrnic --link tap:NAME` expects...
    ns.ip(&["tuntap", "add", "dev", "vrtap0", "mode", "tap"]);
    let mut tap = ns.run(|| TapLink::open("vrtap0").expect("open existing tap"));
    assert_eq!(tap.name(), "vrtap0");
    ns.ip(&["link", "set", "vrtap0", "up"]);
    // ...and one created by the open itself.
    let created = ns.run(|| TapLink::open("vrtap%d").expect("create tap"));
    assert!(created.name().starts_with("vrtap"), "{}", created.name());
    assert_ne!(created.name(), "vrtap0");

    ns.run(|| {
        let mut sock = PacketLink::open("vrtap0").expect("open AF_PACKET on the tap");
        // TAP fd -> interface receive path -> AF_PACKET socket.
        let f1 = test_frame(b"tap->if!");
        tap.send(&f1).expect("tap send");
        assert!(
            wait_for(&mut sock, &f1),
            "frame written to the tap fd not seen on the interface"
        );
        // AF_PACKET send -> interface transmit path -> TAP fd.
        let f2 = test_frame(b"if->tap!");
        sock.send(&f2).expect("packet send");
        assert!(
            wait_for(&mut tap, &f2),
            "frame transmitted on the interface not read from the tap fd"
        );
    });
}

#[test]
fn open_errors_name_the_interface() {
    let e = PacketLink::open("vrnic-nosuch0").expect_err("no such interface");
    assert!(e.to_string().contains("vrnic-nosuch0"), "{e}");
    assert!(e.to_string().contains("if_nametoindex"), "{e}");
    let e = PacketLink::open("bad\0name").expect_err("NUL in name");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let e = TapLink::open("a-name-longer-than-15").expect_err("too long");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("a-name-longer-than-15"), "{e}");
}

/// A `len`-byte broadcast frame of [`TEST_ETHERTYPE`] carrying `seq`.
fn numbered_frame(seq: u32, len: usize) -> Vec<u8> {
    let mut f = test_frame(b"burst!!!");
    f[22..26].copy_from_slice(&seq.to_be_bytes());
    f.resize(len, 0x5a);
    f
}

/// Drains `link` once no CPU's backlog holds frames (at most [`WAIT`],
/// [`backlog_drained`]); the number of [`numbered_frame`]s of length `len`
/// read (other traffic is skipped).
fn count_numbered(link: &mut dyn Link, len: usize) -> u32 {
    // Frames still in a CPU's backlog (ksoftirqd runs late under load)
    // reach the socket, or its drop count, only when it runs: wait for
    // it (bounded), else they are neither counted received nor dropped.
    backlog_drained();
    let mut buf = vec![0u8; 9100];
    let mut n = 0;
    while let Some(got) = link.recv(&mut buf).expect("recv") {
        if got == len && buf[12..14] == TEST_ETHERTYPE && &buf[14..22] == b"burst!!!" {
            n += 1;
        }
    }
    n
}

/// The frames `keep` accepts that `link` receives: waits (bounded by
/// [`WAIT`], on the link's descriptor) until `want` of them came — a veth
/// hands frames over asynchronously — then takes whatever else is
/// already there, so extra frames show.
fn received(link: &mut dyn Link, want: usize, keep: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
    let fd: RawFd = link.caps().fd.expect("kernel links have a descriptor");
    let deadline = Instant::now() + WAIT;
    let mut buf = vec![0u8; 4200];
    let mut got = Vec::new();
    loop {
        for _ in 0..10_000 {
            let mut frame = None;
            link.recv_with(&mut buf, &mut |f, _| frame = Some(f.to_vec()))
                .expect("recv_with");
            let Some(f) = frame else {
                break;
            };
            if keep(&f) {
                got.push(f);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if got.len() >= want || left.is_zero() {
            return got;
        }
        wait_readable(fd, left);
    }
}

/// Held by every test's namespace ([`Netns`]): the kernel's backlog (1000
/// frames) is per CPU and shared by all namespaces, so a test that floods
/// a veth pair would drop another test's frames there.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `f` (with the namespace and a [`PacketLink`] on each end) in a new
/// namespace `tag` holding a veth pair `va`/`vb` with MTU 9000, up. `None`: the test cannot run here.
fn jumbo_pair<T: Send>(
    tag: &str,
    f: impl FnOnce(&Netns, PacketLink, PacketLink) -> T + Send,
) -> Option<T> {
    let ns = Netns::create(tag)?;
    ns.ip(&["link", "add", "va", "type", "veth", "peer", "name", "vb"]);
    for i in ["va", "vb"] {
        ns.ip(&["link", "set", i, "mtu", "9000", "up"]);
    }
    let r = ns.run(|| {
        let a = PacketLink::open("va").expect("open va");
        let b = PacketLink::open("vb").expect("open vb");
        f(&ns, a, b)
    });
    // A flood's frames the kernel has not processed yet (ksoftirqd runs
    // the backlog late under load) would fill the next test's backlog.
    if let Some(q) = backlog_drained().filter(|&q| q > 0) {
        eprintln!("{tag}: {q} frames still in the kernel's backlog after {WAIT:?}");
    }
    Some(r)
}

/// Waits (at most [`WAIT`]) until no CPU's backlog holds frames: the
/// twelfth column of `/proc/net/softnet_stat` (input and process queue
/// lengths, on kernels that show them). Returns the frames left when the
/// wait ended (0: drained; `None`: the file does not tell).
fn backlog_drained() -> Option<u64> {
    let queued = || -> Option<u64> {
        let t = std::fs::read_to_string("/proc/net/softnet_stat").ok()?;
        t.lines()
            .map(|l| {
                let v = l.split_whitespace().nth(11)?;
                u64::from_str_radix(v, 16).ok()
            })
            .sum()
    };
    let start = Instant::now();
    loop {
        let q = queued()?;
        if q == 0 || start.elapsed() > WAIT {
            return Some(q);
        }
        std::thread::yield_now();
    }
}

#[test]
fn packet_link_counts_the_kernels_receive_queue_drops() {
    jumbo_pair("drops", |ns, mut a, mut b| {
        // Far more than any receive buffer holds (50 MB of skbs), never read
        // while sent: veth delivers in the sender's context, so the queue
        // overflows and the kernel counts the rest as dropped.
        const SENT: u32 = 6000;
        for i in 0..SENT {
            a.send(&numbered_frame(i, 4154)).expect("send");
        }
        let got = count_numbered(&mut b, 4154);
        let dropped = b.stats().rx_dropped;
        assert!(got < SENT, "all {SENT} frames were queued");
        assert!(dropped > 0, "no drop counted");
        // Under load the softirq may run late and the backlog (1000 frames)
        // overflow first: veth counts those as va's transmit drops.
        let backlog = ns.tx_dropped("va");
        assert!(
            u64::from(got) + dropped + backlog >= u64::from(SENT),
            "received {got} + dropped {dropped} + backlog drops {backlog} < sent {SENT}"
        );
        assert_eq!(
            b.stats().rx_dropped,
            dropped,
            "the count is kept, not reset"
        );
    });
}

#[test]
fn packet_link_queues_a_burst_of_900_jumbo_frames_sent_while_it_does_not_read() {
    jumbo_pair("burst", |ns, mut a, mut b| {
        // Seven windows of 4 KiB-MTU packets (7.6 MB of skbs; fewer than
        // the 1000 frames of the kernel's backlog) arriving while the engine
        // thread is off the CPU: all of them must wait in the socket (the
        // default 208 KiB receive buffer holds about 23).
        const SENT: u32 = 900;
        for i in 0..SENT {
            a.send(&numbered_frame(i, 4154)).expect("send");
        }
        let got = count_numbered(&mut b, 4154);
        // Another host process flooding its own veth at the same time can
        // fill the shared backlog: those frames are lost before the socket
        // (va's transmit drops), which is not what this test is about.
        let backlog = ns.tx_dropped("va");
        assert_eq!(
            (u64::from(got) + backlog, b.stats().rx_dropped),
            (u64::from(SENT), 0),
            "(frames received + lost in the backlog, frames the socket dropped)"
        );
    });
}

#[test]
fn tap_link_holds_a_burst_of_3000_frames_sent_while_it_does_not_read() {
    let Some(ns) = Netns::create("tapq") else {
        return;
    };
    ns.ip(&["tuntap", "add", "dev", "vrtapq", "mode", "tap"]);
    let mut tap = ns.run(|| TapLink::open("vrtapq").expect("open tap"));
    ns.ip(&["link", "set", "vrtapq", "up"]);
    let len = 256;
    let sent = ns.run(|| {
        let mut sock = PacketLink::open("vrtapq").expect("AF_PACKET on the tap");
        for seq in 0..3000 {
            sock.send(&numbered_frame(seq, len)).expect("send");
        }
        sock.link_stats().map_or(0, |s| s.tx_frames)
    });
    assert_eq!(sent, 3000, "the sender handed every frame on");
    // Only now does the daemon's side read: the ring (TX_QUEUE_LEN, 4096,
    // instead of the default 1000) held them all.
    let got = count_numbered(&mut tap, len);
    assert_eq!(
        got,
        3000,
        "frames read from the TAP (the interface dropped {})",
        ns.tx_dropped("vrtapq")
    );
}

/// What [`Link::try_send_many`] (`sendmmsg`) sends arrives whole and in
/// order through `recvmmsg`, handed out one by one by `recv_with` and
/// `recv` alike across several reads; a frame longer than the receiver's
/// buffer is skipped and counted, not cut.
#[test]
fn packet_links_send_and_receive_frames_in_batches_in_order() {
    jumbo_pair("mmsg", |ns, mut a, mut b| {
        const SENT: u32 = 150;
        const BUF: usize = 4200;
        let mut frames: Vec<Vec<u8>> = (0..SENT)
            .map(|i| numbered_frame(i, 60 + (i as usize * 997) % 4000))
            .collect();
        frames[70] = numbered_frame(70, 5000);
        let want: Vec<Vec<u8>> = frames.iter().filter(|f| f.len() <= BUF).cloned().collect();
        // The kernel itself sometimes drops a burst on the veth (counted
        // in `va`'s TX drops, not in any backlog: seen twice in full
        // workspace runs under load, cause unknown): an attempt it dropped
        // frames of proves nothing about the link, and is made again.
        for attempt in 1..=3 {
            let dropped_before = ns.tx_dropped("va");
            let tx_before = a.stats().tx_frames;
            let oversize_before = b.stats().rx_oversize;
            let mut frames = frames.clone();
            let mut sent = 0;
            for _ in 0..1000 {
                if sent == frames.len() {
                    break;
                }
                sent += a.try_send_many(&mut frames[sent..]).expect("send");
            }
            assert_eq!(
                (sent, a.stats().tx_frames - tx_before),
                (frames.len(), u64::from(SENT))
            );

            let mut buf = vec![0u8; BUF];
            let mut got = Vec::new();
            for i in 0..10_000 {
                let mut frame = None;
                if i % 3 == 0 {
                    let n = b.recv(&mut buf).expect("recv");
                    frame = n.map(|n| buf[..n].to_vec());
                } else {
                    b.recv_with(&mut buf, &mut |f, icrc| {
                        assert_eq!(icrc, Icrc::Needed);
                        frame = Some(f.to_vec());
                    })
                    .expect("recv_with");
                }
                let Some(f) = frame else {
                    break;
                };
                if f[12..14] == TEST_ETHERTYPE && &f[14..22] == b"burst!!!" {
                    got.push(f);
                }
            }
            let dropped = ns.tx_dropped("va") - dropped_before;
            if dropped > 0 {
                eprintln!(
                    "mmsg: attempt {attempt}: the kernel dropped {dropped} frames on the veth"
                );
                continue;
            }
            assert_eq!(got.len(), want.len());
            assert!(got == want, "frames differ or out of order");
            assert_eq!(b.stats().rx_oversize - oversize_before, 1);
            return;
        }
        panic!("the kernel dropped frames of every attempt");
    });
}

/// Runs of RoCEv2-shaped frames of one flow go through the kernel as
/// super-frames (UDP segmentation offload) and come out of the receiving
/// link as the very frames sent, in order, among frames that go alone.
#[test]
fn packet_links_carry_runs_as_super_frames_and_hand_back_the_frames_sent() {
    use super::uso::test_frame;
    jumbo_pair("uso", |ns, mut a, mut b| {
        // Messages' shapes: a longer first packet, full ones, a short last
        // one; IPv4 and IPv6; two flows interleaved message by message;
        // plain frames between.
        let mut frames = Vec::new();
        let mut id = 0xfff0u16;
        for m in 0..12u16 {
            let v4 = m % 3 != 2;
            let (sport, mtu) = (0xc000 + m % 2, if m % 2 == 0 { 1024 } else { 4096 });
            let packets = 1 + usize::from(m) * 5 % 17;
            for p in 0..packets {
                let len = match p {
                    0 if packets > 1 => mtu + 16,
                    _ if p + 1 == packets => 1 + usize::from(m) * 37 % mtu,
                    _ => mtu,
                };
                frames.push(test_frame(v4, id, sport, len, (m * 7) as u8));
                id = id.wrapping_add(1);
            }
            if m % 4 == 3 {
                frames.push(numbered_frame(u32::from(m), 200));
            }
        }
        let want = frames.clone();
        let mut sent = 0;
        for _ in 0..1000 {
            if sent == frames.len() {
                break;
            }
            sent += a.try_send_many(&mut frames[sent..]).expect("send");
        }
        assert_eq!(sent, want.len());
        let tx = a.stats();
        assert_eq!(tx.tx_frames, want.len() as u64);
        assert!(tx.tx_super >= 8, "runs went as super-frames: {tx:?}");

        let got = received(&mut b, want.len(), |f| {
            f[12..14] == TEST_ETHERTYPE || f.get(..6) == Some(&[2, 0, 0, 0, 0, 2])
        });
        assert_eq!(
            ns.tx_dropped("va"),
            0,
            "frames lost in the kernel's backlog"
        );
        let rx = b.stats();
        assert_eq!(
            rx.rx_super, tx.tx_super,
            "super-frames arrived whole: {rx:?}"
        );
        assert_eq!((rx.rx_malformed, rx.rx_oversize), (0, 0));
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(g == w, "frame {i} differs");
        }
    });
}

/// A peer's super-frames the link cannot cut into RoCEv2 packets (pieces
/// shorter than a BTH and an ICRC, another kind of segmentation, lengths
/// that disagree) are dropped and counted, and the frames after them
/// still come through whole.
#[test]
fn packet_link_drops_a_peers_malformed_super_frames_and_carries_on() {
    use super::uso::{test_frame, VNET_HDR_LEN};
    jumbo_pair("usobad", |_, mut a, mut b| {
        let hdr = |gso_type: u8, gso: u16| {
            let mut h = [0u8; VNET_HDR_LEN];
            h[0] = 1; // VIRTIO_NET_HDR_F_NEEDS_CSUM
            h[1] = gso_type;
            h[2..4].copy_from_slice(&42u16.to_ne_bytes());
            h[4..6].copy_from_slice(&gso.to_ne_bytes());
            h[6..8].copy_from_slice(&34u16.to_ne_bytes());
            h[8..10].copy_from_slice(&6u16.to_ne_bytes());
            h
        };
        let big = test_frame(true, 1, 7, 3000, 1);
        let mut lying = big.clone();
        lying[17] ^= 0x40; // IP total length no longer the frame's
        let bad = [
            (
                "pieces of 8 bytes",
                hdr(5, 8),
                test_frame(true, 1, 7, 64, 1),
            ),
            ("TCP segmentation on UDP", hdr(1, 1000), big.clone()),
            ("an IP length that disagrees", hdr(5, 1000), lying),
        ];
        let mut sent_bad = 0;
        for (what, h, f) in &bad {
            // The sender's kernel may refuse some itself; what it lets
            // through must not reach the device.
            if a.send_after(h, f) >= 0 {
                sent_bad += 1;
            } else {
                eprintln!("{what}: refused by the sending kernel");
            }
        }
        let good: Vec<Vec<u8>> = (0..10)
            .map(|i| test_frame(true, 100 + i, 9, 1024, 3))
            .collect();
        let mut frames = good.clone();
        assert_eq!(a.try_send_many(&mut frames).expect("send"), good.len());
        let got = received(&mut b, good.len(), |f| {
            f.get(..6) == Some(&[2, 0, 0, 0, 0, 2])
        });
        assert!(
            got == good,
            "{} frames came for {} good ones sent: only those, whole and in order",
            got.len(),
            good.len()
        );
        assert!(sent_bad >= 1, "the kernel refused every bad super-frame");
        let st = b.stats();
        assert_eq!(st.rx_malformed, sent_bad, "{st:?}");
    });
}
