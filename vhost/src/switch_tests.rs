//! The embedded switch's tests: forwarding, queues and their wake-ups,
//! frames handed over in their buffers, ICRC between ports.

use super::*;
use crate::read_ahead::ReadAhead;
use vrnic::link::MemLink;

const A: [u8; 6] = [2, 0x76, 10, 0, 0, 1];
const B: [u8; 6] = [2, 0x76, 10, 0, 0, 2];
const C: [u8; 6] = [2, 0x76, 10, 0, 0, 3];
const OUTSIDE: [u8; 6] = [2, 0, 0, 0, 0, 9];

/// A switch on an in-memory uplink with ports A and B, and the far
/// end of the uplink.
fn switch_ab() -> (Switch, SwitchPort, SwitchPort, MemLink) {
    let (up, outside) = MemLink::pair();
    let sw = Switch::new(Box::new(up));
    let a = sw.add_port(A).unwrap();
    let b = sw.add_port(B).unwrap();
    (sw, a, b, outside)
}

fn frame(dst: [u8; 6], src: [u8; 6], tag: u8) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00, tag]);
    f.resize(60, tag);
    f
}

fn recv_all(l: &mut dyn Link) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 2048];
    let mut out = Vec::new();
    for _ in 0..10_000 {
        match l.recv(&mut buf).unwrap() {
            Some(n) => out.push(buf[..n].to_vec()),
            None => break,
        }
    }
    out
}

/// Whether `fd` polls readable now.
fn readable(fd: RawFd) -> bool {
    readable_within(fd, 0)
}

/// For a test's sender: waits (at most twice [`PATIENCE`]) until the
/// receiver has read `seq` frames (`seen`); false when it has not.
fn all_read(seen: &std::sync::atomic::AtomicU32, seq: u32) -> bool {
    let t0 = std::time::Instant::now();
    while seen.load(Ordering::Acquire) < seq {
        if t0.elapsed() > 2 * PATIENCE {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// Runs `send` on a thread of its own while this one reads `total`
/// frames from `b` ([`read_one_at_a_time`]), then checks that `send`
/// returned true and nothing is left. `send` is given a function that
/// waits until the receiver has read a number of frames ([`all_read`]).
fn race(
    b: &mut SwitchPort,
    total: u32,
    send: impl FnOnce(&dyn Fn(u32) -> bool) -> bool + Send + 'static,
) {
    let read = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = read.clone();
    let sender = std::thread::spawn(move || send(&|seq| all_read(&seen, seq)));
    read_one_at_a_time(b, total, &read);
    assert!(sender.join().unwrap());
    assert!(!b.recv_with(&mut [0u8; 64], &mut |_, _| ()).unwrap());
}

/// For a test's receiver: reads `total` frames from `b`, numbered from 0
/// (bytes 14..18), checking each comes once and in order, one per
/// `recv_with`, publishing the count in `read` after each and sleeping
/// on the port's descriptor between them ([`wait_readable`]).
fn read_one_at_a_time(b: &mut SwitchPort, total: u32, read: &std::sync::atomic::AtomicU32) {
    let fd = b.caps().fd.unwrap();
    let mut next = 0u32;
    let mut buf = [0u8; 64];
    while next < total {
        let got = b
            .recv_with(&mut buf, &mut |f, _| {
                let seq = u32::from_be_bytes(f[14..18].try_into().unwrap());
                assert_eq!(seq, next, "in order, once");
                next += 1;
            })
            .unwrap();
        read.store(next, Ordering::Release);
        if next < total {
            wait_readable(b, fd, next, got);
        }
    }
}

/// Whether `fd` polls readable within `ms` milliseconds.
fn readable_within(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

#[test]
fn unicast_between_ports_never_touches_the_uplink() {
    let (sw, mut a, mut b, mut outside) = switch_ab();
    let fb = b.caps().fd.unwrap();
    assert!(!readable(fb));
    a.send(&frame(B, A, 1)).unwrap();
    assert!(readable(fb), "B's worker is woken");
    b.send(&frame(A, B, 2)).unwrap();
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 1)]);
    assert!(!readable(fb));
    assert_eq!(recv_all(&mut a), vec![frame(A, B, 2)]);
    assert_eq!(outside.pending(), 0);
    assert_eq!(recv_all(&mut outside), Vec::<Vec<u8>>::new());
    assert_eq!(sw.uplink_stats(), UplinkStats::default());
    assert_eq!(a.stats().tx_local, 1);
    assert_eq!(a.stats().rx_local, 1);
}

/// A sender that set the flag before the receiver's reset and writes the
/// eventfd only after it (preempted between the two) leaves the port
/// readable without frames: the next look empties it, so the port's
/// worker does not wake for nothing again and again until the next frame.
/// (The other race of a slow sender, a write the reset swallows, is met
/// by chance in `a_signal_that_comes_after_its_frame_was_taken_strands_no_later_frame`.)
#[test]
fn a_late_write_leaves_the_port_readable_for_one_look_only() {
    let (_sw, _a, mut b, _outside) = switch_ab();
    let fb = b.caps().fd.unwrap();
    let q = b.shared.clone();
    assert!(q.queue(frame(B, A, 1), Icrc::Unneeded).is_ok());
    q.signal();
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 1)]);
    assert!(!readable(fb), "reset: no frame, not readable");
    q.wake();
    assert!(readable(fb));
    assert!(recv_all(&mut b).is_empty());
    assert!(!readable(fb), "a stale write is emptied by the next look");
    assert!(q.queue(frame(B, A, 2), Icrc::Unneeded).is_ok());
    q.signal();
    assert!(readable(fb), "and the next frame still wakes it");
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 2)]);
}

#[test]
fn frames_taken_in_a_burst_keep_the_port_readable_and_in_order() {
    let (_sw, mut a, mut b, _outside) = switch_ab();
    let fb = b.caps().fd.unwrap();
    for t in 0..3 {
        a.send(&frame(B, A, t)).unwrap();
    }
    let mut buf = [0u8; 64];
    let n = b.recv(&mut buf).unwrap().unwrap();
    assert_eq!(buf[..n], frame(B, A, 0)[..]);
    // Two frames are taken but not returned yet: a worker that stops
    // reading here (its budget spent) must still be woken for them.
    assert!(readable(fb), "taken frames keep the port readable");
    for t in 3..5 {
        a.send(&frame(B, A, t)).unwrap();
    }
    let got = recv_all(&mut b);
    assert_eq!(got, (1..5).map(|t| frame(B, A, t)).collect::<Vec<_>>());
    assert!(!readable(fb));
    a.send(&frame(B, A, 5)).unwrap();
    assert!(readable(fb), "a frame after the reset sets it again");
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 5)]);
    assert!(!readable(fb));
}

#[test]
fn frames_handed_over_in_their_buffers_arrive_intact_and_in_order() {
    let (_sw, mut a, mut b, _outside) = switch_ab();
    let recv_with_all = |l: &mut SwitchPort| {
        let (mut got, mut at) = (Vec::new(), Vec::new());
        let mut buf = [0u8; 64];
        for _ in 0..2 * PORT_QUEUE_DEPTH {
            let more = l
                .recv_with(&mut buf, &mut |f, _| {
                    got.push(f.to_vec());
                    at.push(f.as_ptr() as usize);
                })
                .unwrap();
            if !more {
                break;
            }
        }
        (got, at)
    };
    let mut f1 = frame(B, A, 1);
    let p1 = f1.as_ptr() as usize;
    assert!(a.try_send_buf(&mut f1).unwrap());
    assert_ne!(f1.as_ptr() as usize, p1, "the queue took the buffer");
    let mut f2 = frame(B, A, 2);
    let p2 = f2.as_ptr() as usize;
    assert!(a.try_send_buf(&mut f2).unwrap());
    let (got, at) = recv_with_all(&mut b);
    assert_eq!(got, vec![frame(B, A, 1), frame(B, A, 2)]);
    assert_eq!(
        at,
        vec![p1, p2],
        "delivered from the sender's buffers, not copies"
    );
    // The receiver's buffers come back as spares for the next sender.
    let mut f3 = frame(B, A, 3);
    assert!(a.try_send_buf(&mut f3).unwrap());
    assert!(f3.capacity() >= 60, "a used buffer, not a new one");
    // A full queue leaves the frame with the sender.
    for t in 1..PORT_QUEUE_DEPTH {
        assert!(a.try_send_buf(&mut frame(B, A, t as u8)).unwrap());
    }
    let mut held = frame(B, A, 9);
    assert!(!a.try_send_buf(&mut held).unwrap());
    assert_eq!(held, frame(B, A, 9));
    assert_eq!(a.stats().tx_busy, 1);
    let (got, _) = recv_with_all(&mut b);
    assert_eq!(got.len(), PORT_QUEUE_DEPTH);
    assert_eq!(got[0], frame(B, A, 3));
    assert_eq!(
        got[PORT_QUEUE_DEPTH - 1],
        frame(B, A, (PORT_QUEUE_DEPTH - 1) as u8)
    );
}

/// A RoCEv2 SEND ONLY frame from `src` to `dst`, emitted with or
/// without its ICRC.
fn roce_hdr(dst: [u8; 6], src: [u8; 6]) -> vrnic::wire::RoceHeaders {
    use std::net::{IpAddr, Ipv4Addr};
    use vrnic::wire::{Bth, Opcode, RoceHeaders};
    RoceHeaders {
        eth_src: src,
        eth_dst: dst,
        ip_src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        ip_dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        ip_id: 1,
        ttl: 64,
        tclass: 0,
        flow_label: 0,
        udp_src: 0xc001,
        bth: Bth {
            opcode: Opcode::RcSendOnly,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 5,
        },
        reth: None,
        aeth: None,
        atomic_eth: None,
        atomic_ack_eth: None,
        deth: None,
        immdt: None,
        ieth: None,
    }
}

fn fill_5a(b: &mut [u8]) -> Result<(), ()> {
    b.fill(0x5a);
    Ok(())
}

fn roce(dst: [u8; 6], src: [u8; 6], icrc: Icrc) -> Vec<u8> {
    let mut f = Vec::new();
    vrnic::wire::emit_frame_icrc(&roce_hdr(dst, src), 100, &mut f, icrc, fill_5a).unwrap();
    f
}

/// A batch of two packets from A to `dst` (`vrnic::batch::gso`), and the
/// two frames with their ICRC a wire carries for it.
fn roce_batch(dst: [u8; 6]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut h = roce_hdr(dst, A);
    let mut f = Vec::new();
    let end = gso::start(&mut f, &h, 100, fill_5a).unwrap();
    h.bth.psn += 1;
    h.ip_id += 1;
    let end = gso::append(&mut f, end, &h, 100, fill_5a).unwrap();
    f.truncate(end);
    let mut second = Vec::new();
    vrnic::wire::emit_frame(&h, &[0x5a; 100], &mut second);
    (f, vec![roce(dst, A, Icrc::Needed), second])
}

#[test]
fn a_batch_reaches_a_copying_reader_and_the_uplink_as_its_packets_sealed() {
    let (sw, a, mut b, mut outside) = switch_ab();
    let mut a: Box<dyn Link> = Box::new(a);
    let (f, want) = roce_batch(B);
    assert!(gso::is_batch(&f));
    a.try_send_buf(&mut f.clone()).unwrap();
    assert_eq!(recv_all(&mut b), want, "a reader of copies");
    // Its destination left after the batch was made.
    drop(b);
    a.try_send_buf(&mut f.clone()).unwrap();
    assert_eq!(recv_all(&mut outside), want, "the wire");
    drop(sw);
}

#[test]
fn frames_between_ports_need_no_icrc_and_frames_from_the_wire_do() {
    let (sw, mut a, mut b, mut outside) = switch_ab();
    let local = a.caps().local_macs.expect("a port reaches the other ports");
    assert!(local.contains(&A) && local.contains(&B));
    assert!(!local.contains(&OUTSIDE) && !local.contains(&[0xff; 6]));
    let bare = roce(B, A, Icrc::Unneeded);
    let full = roce(B, A, Icrc::Needed);
    assert_ne!(bare, full);
    a.try_send_buf(&mut bare.clone()).unwrap();
    outside.send(&roce(B, OUTSIDE, Icrc::Needed)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    for _ in 0..8 {
        if !b
            .recv_with(&mut buf, &mut |f, icrc| got.push((f.to_vec(), icrc)))
            .unwrap()
        {
            break;
        }
    }
    assert_eq!(
        got,
        vec![
            (bare.clone(), Icrc::Unneeded),
            (roce(B, OUTSIDE, Icrc::Needed), Icrc::Needed)
        ]
    );
    // A reader of copies (`recv`) gets frames as on a wire.
    a.try_send_buf(&mut bare.clone()).unwrap();
    assert_eq!(recv_all(&mut b), vec![full]);
    // A port that left is no longer local.
    drop(b);
    assert!(!local.contains(&B));
    drop(sw);
}

/// The wake-up protocol without a lock: a receiver that reads one frame
/// at a time and then sleeps on its descriptor (as a worker does when
/// its receive batch is spent) is always woken while the port has
/// frames, queued or taken (nothing is stranded), and gets every frame
/// once, in order. The sender sends bursts of 1 to 4 frames and waits
/// until all are read, so every burst races the receiver's reset of
/// the descriptor.
///
/// Stranded means: the port holds frames and its descriptor stays not
/// readable for a whole second more (a sender writes the eventfd
/// microseconds after it queues). A descriptor not readable while the
/// port holds none is the sender's turn: the receiver waits on, up to
/// [`PATIENCE`] (a machine that stalls the sender for seconds is slow,
/// not broken).
#[test]
fn a_sleeping_receiver_is_woken_for_every_frame_of_a_concurrent_sender() {
    const BURSTS: u32 = 60_000;
    let (_sw, mut a, mut b, _outside) = switch_ab();
    let total: u32 = (0..BURSTS).map(|k| k % 4 + 1).sum();
    race(&mut b, total, move |all_read| {
        let mut seq = 0u32;
        for k in 0..BURSTS {
            for _ in 0..k % 4 + 1 {
                let mut f = frame(B, A, 0);
                f[14..18].copy_from_slice(&seq.to_be_bytes());
                assert!(a.try_send_buf(&mut f).unwrap(), "room: bursts are read");
                seq += 1;
            }
            if !all_read(seq) {
                return false; // the receiver failed (it says why)
            }
        }
        true
    });
}

/// As [`a_sleeping_receiver_is_woken_for_every_frame_of_a_concurrent_sender`],
/// with senders slow to signal: each frame is queued, then signalled after
/// a pause of random length (a sender preempted between the two), so the
/// receiver often takes a frame before its signal comes, and a late signal
/// races the receiver's reset of the descriptor for a later look. No frame
/// is stranded: a signal the reset's emptying of the eventfd swallowed is
/// made good (`SwitchPort::take_batch`).
#[test]
fn a_signal_that_comes_after_its_frame_was_taken_strands_no_later_frame() {
    const BURSTS: u32 = 20_000;
    let (_sw, _a, mut b, _outside) = switch_ab();
    let q = b.shared.clone();
    let total: u32 = (0..BURSTS).map(|k| k % 3 + 1).sum();
    race(&mut b, total, move |all_read| {
        let mut seq = 0u32;
        let mut rng = 0x9e37_79b9_u32;
        for k in 0..BURSTS {
            for _ in 0..k % 3 + 1 {
                let mut f = frame(B, A, 0);
                f[14..18].copy_from_slice(&seq.to_be_bytes());
                assert!(q.queue(f, Icrc::Unneeded).is_ok(), "room: bursts are read");
                // xorshift32: a pause of 0 to 1023 spins, often none.
                rng ^= rng << 13;
                rng ^= rng >> 17;
                rng ^= rng << 5;
                if rng & 1 == 0 {
                    for _ in 0..rng >> 22 {
                        std::hint::spin_loop();
                    }
                }
                q.signal();
                seq += 1;
            }
            if !all_read(seq) {
                return false; // the receiver failed (it says why)
            }
        }
        true
    });
}

/// How long [`a_sleeping_receiver_is_woken_for_every_frame_of_a_concurrent_sender`]
/// waits for its sender's next frame.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until port `b` (its descriptor `fd`) is readable; panics when
/// it holds frames and stays not readable for a second, or when nothing
/// comes for [`PATIENCE`]. `next` and `got` describe the receiver's
/// last read, for the message.
fn wait_readable(b: &SwitchPort, fd: RawFd, next: u32, got: bool) {
    let t0 = std::time::Instant::now();
    while !readable_within(fd, 1_000) {
        let held = b.shared.frames.len() + b.taken.len();
        if held > 0 && !readable_within(fd, 1_000) {
            panic!(
                "stranded: {held} frames held (the next is {next}), port not readable for 1 s \
                 (last read got one: {got}; flag set: {}, eventfd readable: {})",
                b.shared.signalled.load(Ordering::SeqCst),
                readable(b.shared.efd.as_raw_fd()),
            );
        }
        assert!(
            t0.elapsed() < PATIENCE,
            "no frame {next} for {PATIENCE:?}: the sender stalled"
        );
    }
}

#[test]
fn a_frame_to_the_senders_own_mac_comes_back() {
    let (up, outside) = MemLink::pair();
    let sw = Switch::new(Box::new(up));
    let mut a = sw.add_port(A).unwrap();
    a.send(&frame(A, A, 7)).unwrap();
    assert_eq!(recv_all(&mut a), vec![frame(A, A, 7)]);
    assert_eq!(outside.pending(), 0);
}

#[test]
fn group_frames_reach_every_other_port_and_the_uplink() {
    let (sw, mut a, mut b, mut outside) = switch_ab();
    let mut c = sw.add_port(C).unwrap();
    let bc = frame([0xff; 6], A, 3);
    a.send(&bc).unwrap();
    let mc = frame([0x33, 0x33, 0xff, 0, 0, 1], A, 4);
    a.send(&mc).unwrap();
    assert_eq!(recv_all(&mut a), Vec::<Vec<u8>>::new(), "not to itself");
    assert_eq!(recv_all(&mut b), vec![bc.clone(), mc.clone()]);
    assert_eq!(recv_all(&mut c), vec![bc.clone(), mc.clone()]);
    assert_eq!(recv_all(&mut outside), vec![bc, mc]);
}

#[test]
fn uplink_frames_go_to_the_port_of_their_mac() {
    let (sw, mut a, mut b, mut outside) = switch_ab();
    let fb = b.caps().fd.unwrap();
    outside.send(&frame(B, OUTSIDE, 1)).unwrap();
    outside.send(&frame(OUTSIDE, OUTSIDE, 2)).unwrap();
    outside.send(&frame([0xff; 6], OUTSIDE, 3)).unwrap();
    outside.send(&frame(A, OUTSIDE, 4)).unwrap();
    outside.send(&[1, 2, 3]).unwrap();
    assert!(readable(fb), "the uplink wakes every port");
    // A reads the uplink: its frames come back, B's are queued for B.
    assert_eq!(
        recv_all(&mut a),
        vec![frame([0xff; 6], OUTSIDE, 3), frame(A, OUTSIDE, 4)]
    );
    assert!(readable(fb), "B's queue holds its frames");
    assert_eq!(
        recv_all(&mut b),
        vec![frame(B, OUTSIDE, 1), frame([0xff; 6], OUTSIDE, 3)]
    );
    assert!(!readable(fb));
    let s = sw.uplink_stats();
    assert_eq!((s.rx_frames, s.rx_unknown), (5, 2), "{s:?}");
    // A frame the outside sends later wakes B and reaches it directly.
    outside.send(&frame(B, OUTSIDE, 5)).unwrap();
    assert!(readable(fb));
    assert_eq!(recv_all(&mut b), vec![frame(B, OUTSIDE, 5)]);
    // Unicast to outside MACs goes out.
    a.send(&frame(OUTSIDE, A, 6)).unwrap();
    assert_eq!(recv_all(&mut outside), vec![frame(OUTSIDE, A, 6)]);
}

#[test]
fn a_full_queue_drops_and_counts() {
    let (_sw, mut a, mut b, _outside) = switch_ab();
    for i in 0..PORT_QUEUE_DEPTH + 5 {
        a.send(&frame(B, A, i as u8)).unwrap();
    }
    assert_eq!(b.stats().rx_queue_dropped, 5);
    assert_eq!(b.stats().rx_local, PORT_QUEUE_DEPTH as u64);
    assert_eq!(recv_all(&mut b).len(), PORT_QUEUE_DEPTH);
    a.send(&[0; 10]).unwrap();
    assert_eq!(a.stats().tx_runt, 1);
}

/// Big frames (batches) fill a port's queue by bytes before its frame
/// count: the sender is held back, nothing is lost, and the spares keep
/// few big buffers.
#[test]
fn a_queue_full_of_bytes_holds_big_frames_back_without_loss() {
    let (_sw, a, mut b, _outside) = switch_ab();
    let mut a: Box<dyn Link> = Box::new(a);
    let big = |i: usize| {
        let mut f = frame(B, A, i as u8);
        f.resize(64 * 1024, i as u8);
        f
    };
    let mut sent = 0;
    while sent < PORT_QUEUE_DEPTH && a.try_send_buf(&mut big(sent)).unwrap() {
        sent += 1;
    }
    assert_eq!(sent, PORT_QUEUE_BYTES / (64 * 1024), "held back by bytes");
    assert_eq!(b.shared.bytes.load(Ordering::Relaxed), sent * 64 * 1024);
    let mut got = 0;
    for _ in 0..PORT_QUEUE_DEPTH {
        let mut f = Vec::new();
        if !b.recv_with(&mut [], &mut |x, _| f = x.to_vec()).unwrap() {
            break;
        }
        assert_eq!(f, big(got), "frame {got} intact, in order");
        got += 1;
    }
    assert_eq!(got, sent);
    assert_eq!(b.stats().rx_queue_dropped, 0);
    // The read buffers went back as spares, few of them big.
    assert!(!b.recv_with(&mut [], &mut |_, _| ()).unwrap());
    assert!(b.shared.big_spares.load(Ordering::Relaxed) <= SPARE_BIG_MAX);
    let big_spares = std::iter::from_fn(|| b.shared.spare.pop())
        .filter(|s| s.capacity() > BIG_BUFFER)
        .count();
    assert_eq!(big_spares, SPARE_BIG_MAX);
    assert!(a.try_send_buf(&mut big(0)).unwrap(), "room again");
}

#[test]
fn a_full_queue_holds_a_try_send_back_without_loss() {
    let (_sw, mut a, mut b, _outside) = switch_ab();
    for i in 0..PORT_QUEUE_DEPTH {
        assert!(a.try_send(&frame(B, A, i as u8)).unwrap());
    }
    let last = frame(B, A, 0xee);
    assert!(!a.try_send(&last).unwrap(), "a full queue refuses");
    assert!(!a.try_send(&last).unwrap(), "and keeps refusing");
    assert_eq!(a.stats().tx_busy, 2);
    assert_eq!(b.stats().rx_queue_dropped, 0, "nothing was lost");
    // The receiver takes one frame: the held frame goes in, last.
    let mut buf = [0u8; 64];
    assert!(b.recv(&mut buf).unwrap().is_some());
    assert!(a.try_send(&last).unwrap());
    let got = recv_all(&mut b);
    assert_eq!(got.len(), PORT_QUEUE_DEPTH);
    assert_eq!(got.last(), Some(&last), "in order, at the end");
    assert_eq!(a.stats().tx_local, PORT_QUEUE_DEPTH as u64 + 1);
}

#[test]
fn a_full_uplink_holds_unicast_but_never_group_frames() {
    let (_sw, mut a, mut b, mut outside) = switch_ab();
    let far = [2, 0, 0, 0, 0, 0x99];
    for i in 0..vrnic::link::mem::DEFAULT_DEPTH {
        assert!(a.try_send(&frame(far, A, i as u8)).unwrap());
    }
    assert!(!a.try_send(&frame(far, A, 0xee)).unwrap(), "held back");
    assert_eq!(a.stats().tx_busy, 1);
    // A broadcast is taken even so: held, it would reach B again.
    let bcast = frame([0xff; 6], A, 0xbb);
    assert!(a.try_send(&bcast).unwrap());
    assert_eq!(recv_all(&mut b), vec![bcast], "B got the broadcast once");
    assert_eq!(
        recv_all(&mut outside).len(),
        vrnic::link::mem::DEFAULT_DEPTH
    );
}

#[test]
fn ports_are_unique_bounded_and_leave_when_dropped() {
    let (up, mut outside) = MemLink::pair();
    let sw = Switch::new(Box::new(up));
    let a = sw.add_port(A).unwrap();
    assert!(matches!(sw.add_port(A), Err(SwitchError::DuplicateMac(_))));
    assert!(matches!(
        sw.add_port([3, 0, 0, 0, 0, 1]),
        Err(SwitchError::GroupMac(_))
    ));
    let mut b = sw.add_port(B).unwrap();
    drop(a);
    assert_eq!(sw.ports(), 1);
    // A's MAC is no port's now: frames for it go out.
    b.send(&frame(A, B, 1)).unwrap();
    assert_eq!(recv_all(&mut outside), vec![frame(A, B, 1)]);
    let mut more = Vec::new();
    for i in 1..MAX_PORTS {
        more.push(sw.add_port([2, 0, 0, 0, 1, i as u8]).unwrap());
    }
    assert!(matches!(
        sw.add_port([2, 0, 0, 0, 2, 0]),
        Err(SwitchError::Full)
    ));
    drop(more);
    assert_eq!(sw.ports(), 1);
    assert!(sw.add_port(A).is_ok(), "A's MAC is free again");
}

/// A port's frames for the uplink go out in runs ([`Link::try_send_many`]),
/// its frames for other ports into their queues, all in order; a full
/// uplink holds the rest back, counted once.
#[test]
fn frames_sent_many_at_once_reach_the_uplink_and_the_ports_in_order() {
    let (up, mut outside) = MemLink::pair_with_depth(5);
    let sw = Switch::new(Box::new(up));
    let mut a = sw.add_port(A).unwrap();
    let mut b = sw.add_port(B).unwrap();
    let far = [2, 0, 0, 0, 0, 0x99];
    let mut frames = vec![
        frame(far, A, 1),
        frame(B, A, 2),
        frame(far, A, 3),
        frame(far, A, 4),
        frame([0xff; 6], A, 5),
        frame(far, A, 6),
        frame(far, A, 7),
        frame(B, A, 8),
    ];
    let want = frames.clone();
    // The uplink holds 5 (1, 3, 4, the broadcast, 6): frame 7 finds it full.
    assert_eq!(a.try_send_many(&mut frames).unwrap(), 6);
    assert_eq!(a.stats().tx_busy, 1);
    assert_eq!(a.try_send_many(&mut frames[6..]).unwrap(), 0);
    let mut out = recv_all(&mut outside);
    assert_eq!(a.try_send_many(&mut frames[6..]).unwrap(), 2);
    out.extend(recv_all(&mut outside));
    let to = |d: [u8; 6]| -> Vec<Vec<u8>> {
        want.iter()
            .filter(|f| f[..6] == d || f[..6] == [0xff; 6])
            .cloned()
            .collect()
    };
    assert_eq!(out, to(far));
    assert_eq!(recv_all(&mut b), to(B));
    let s = a.stats();
    assert_eq!((s.tx_uplink, s.tx_local), (6, 3), "{s:?}");
    assert_eq!(sw.uplink_stats().tx_frames, 6);
}

/// A port that stops reading the uplink after [`UPLINK_PULL_MAX`] frames
/// for others stays readable when the uplink read ahead: the frame for it
/// behind them is not stranded.
#[test]
fn a_pull_stopped_by_its_bound_keeps_the_port_readable_for_frames_read_ahead() {
    let (up, mut outside) = MemLink::pair_with_depth(4 * UPLINK_PULL_MAX);
    let sw = Switch::new(Box::new(ReadAhead::new(up)));
    let mut a = sw.add_port(A).unwrap();
    let mut b = sw.add_port(B).unwrap();
    let fa = a.caps().fd.unwrap();
    for i in 0..UPLINK_PULL_MAX {
        outside.send(&frame(B, OUTSIDE, i as u8)).unwrap();
    }
    outside.send(&frame(A, OUTSIDE, 0xaa)).unwrap();
    let mut buf = vec![0u8; 2048];
    assert!(!a
        .recv_with(&mut buf, &mut |_, _| panic!("no frame for A yet"))
        .unwrap());
    assert!(readable(fa), "A must come back for its frame");
    assert_eq!(recv_all(&mut a), vec![frame(A, OUTSIDE, 0xaa)]);
    assert_eq!(recv_all(&mut b).len(), UPLINK_PULL_MAX);
}

/// A port another thread polls (`LinkSetting::Polling`, `Polling::Other`) wakes nobody for the
/// frames queued for it, still hands them over in order, and once given
/// back is readable at once for the frames that wait (a worker asleep on
/// it would otherwise never learn of them).
#[test]
fn a_polled_port_wakes_nobody_and_is_readable_again_when_given_back() {
    let (_sw, mut a, mut b, _outside) = switch_ab();
    let fb = b.caps().fd.unwrap();
    // Readable before it is polled: the poller empties the eventfd.
    a.send(&frame(B, A, 1)).unwrap();
    assert!(readable(fb));
    b.set_polling(Polling::Other);
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 1)]);
    assert!(!readable(fb), "emptied by the poller's read");
    for tag in 2..5 {
        a.send(&frame(B, A, tag)).unwrap();
        assert!(!readable(fb), "frame {tag} woke the polled port's worker");
    }
    assert_eq!(
        recv_all(&mut b),
        (2..5).map(|t| frame(B, A, t)).collect::<Vec<_>>()
    );
    // Whatever writes the eventfd while the port is polled, its next read
    // empties it (else its worker would wake in a loop).
    b.shared.stay_readable();
    assert!(readable(fb));
    assert!(recv_all(&mut b).is_empty());
    assert!(!readable(fb), "a polled read empties a written eventfd");
    // Given back with a frame waiting: readable without a new sender.
    a.send(&frame(B, A, 5)).unwrap();
    assert!(!readable(fb));
    b.set_polling(Polling::Off);
    assert!(
        readable(fb),
        "a waiting frame makes the given-back port readable"
    );
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 5)]);
    assert!(!readable(fb));
    // And back to one wake-up per burst.
    a.send(&frame(B, A, 6)).unwrap();
    assert!(readable(fb));
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 6)]);
    // Given back with nothing waiting: not readable.
    b.set_polling(Polling::Other);
    b.set_polling(Polling::Off);
    assert!(!readable(fb));
}

/// The uplink does not wake a polled port's worker either, nor does the
/// polled port read it: the poller's own port does and queues the polled
/// port's frames. Given back with frames still waiting on the uplink, the
/// port is readable at once.
#[test]
fn a_polled_port_is_not_woken_by_the_uplink_until_given_back() {
    let (_sw, mut a, mut b, mut outside) = switch_ab();
    let fb = b.caps().fd.unwrap();
    b.set_polling(Polling::Other);
    outside.send(&frame(B, OUTSIDE, 1)).unwrap();
    assert!(!readable(fb), "the uplink woke a polled port");
    assert!(recv_all(&mut b).is_empty(), "a polled port reads no uplink");
    // The poller's own port (A) reads the uplink: B's frame goes to B's
    // queue, still waking nobody, and B's next read takes it.
    assert!(recv_all(&mut a).is_empty());
    assert!(!readable(fb));
    assert_eq!(recv_all(&mut b), vec![frame(B, OUTSIDE, 1)]);
    outside.send(&frame(B, OUTSIDE, 2)).unwrap();
    assert!(!readable(fb));
    b.set_polling(Polling::Off);
    assert!(
        readable(fb),
        "the uplink's waiting frame wakes the given-back port"
    );
    assert_eq!(recv_all(&mut b), vec![frame(B, OUTSIDE, 2)]);
    assert!(!readable(fb));
    outside.send(&frame(B, OUTSIDE, 3)).unwrap();
    assert!(readable(fb), "and every later one");
    assert_eq!(recv_all(&mut b), vec![frame(B, OUTSIDE, 3)]);
}

/// A port its own worker polls (a polling session, `Polling::Own`) wakes
/// nobody for the frames queued for it either (its worker reads the queue
/// every round: an eventfd write and read per burst would be for nothing),
/// but it still reads the uplink itself. Back to `Polling::Off` with a
/// frame waiting, it is readable at once.
#[test]
fn a_port_polled_by_its_own_worker_wakes_nobody_and_still_reads_the_uplink() {
    let (_sw, mut a, mut b, mut outside) = switch_ab();
    let fb = b.caps().fd.unwrap();
    b.set_polling(Polling::Own);
    for tag in 1..4 {
        a.send(&frame(B, A, tag)).unwrap();
        assert!(!readable(fb), "frame {tag} woke the polling worker");
    }
    assert_eq!(
        recv_all(&mut b),
        (1..4).map(|t| frame(B, A, t)).collect::<Vec<_>>()
    );
    outside.send(&frame(B, OUTSIDE, 4)).unwrap();
    assert_eq!(recv_all(&mut b), vec![frame(B, OUTSIDE, 4)]);
    a.send(&frame(B, A, 5)).unwrap();
    assert!(!readable(fb));
    b.set_polling(Polling::Off);
    assert!(readable(fb), "a waiting frame makes the port readable");
    assert_eq!(recv_all(&mut b), vec![frame(B, A, 5)]);
    assert!(!readable(fb));
    a.send(&frame(B, A, 6)).unwrap();
    assert!(readable(fb), "and a later one wakes its worker again");
}

/// Sends frame `tag` to B on the uplink, then reads B (`recv_with`) until
/// it comes: the number of reads it took (at most 2 × UPLINK_IDLE_EVERY).
fn reads_until_uplink_frame(b: &mut SwitchPort, outside: &mut MemLink, tag: u8) -> u32 {
    outside.send(&frame(B, OUTSIDE, tag)).unwrap();
    let mut buf = vec![0u8; 2048];
    for n in 1..=2 * UPLINK_IDLE_EVERY {
        let mut got = None;
        b.recv_with(&mut buf, &mut |f, _| got = Some(f.to_vec()))
            .unwrap();
        if let Some(f) = got {
            assert_eq!(f, frame(B, OUTSIDE, tag));
            return n;
        }
    }
    panic!("frame {tag} never read");
}

/// A port its own worker polls reads an uplink that stayed idle for
/// UPLINK_IDLE_PULLS reads only one round in UPLINK_IDLE_EVERY (an empty
/// read is a system call), and every round again from the first frame it
/// finds; a port nobody polls reads it whenever it is asked.
#[test]
fn a_polling_worker_reads_an_idle_uplink_less_often_and_a_busy_one_every_round() {
    let (_sw, a, mut b, mut outside) = switch_ab();
    let mut buf = vec![0u8; 2048];
    let mut idle = |b: &mut SwitchPort, n: u32| {
        for _ in 0..n {
            assert!(!b
                .recv_with(&mut buf, &mut |_, _| panic!("no frame"))
                .unwrap());
        }
    };
    idle(&mut b, 2 * UPLINK_IDLE_PULLS);
    assert_eq!(reads_until_uplink_frame(&mut b, &mut outside, 1), 1);
    b.set_polling(Polling::Own);
    idle(&mut b, UPLINK_IDLE_PULLS);
    let n = reads_until_uplink_frame(&mut b, &mut outside, 2);
    assert!(
        n > 1 && n <= UPLINK_IDLE_EVERY,
        "idle uplink read after {n} rounds"
    );
    assert_eq!(reads_until_uplink_frame(&mut b, &mut outside, 3), 1);
    idle(&mut b, UPLINK_IDLE_PULLS - 1);
    assert_eq!(
        reads_until_uplink_frame(&mut b, &mut outside, 4),
        1,
        "an uplink idle for fewer reads is read every round"
    );
    b.set_polling(Polling::Off);
    idle(&mut b, 2 * UPLINK_IDLE_PULLS);
    assert_eq!(reads_until_uplink_frame(&mut b, &mut outside, 5), 1);
    // Alone on the switch, the uplink is the port's only source of frames:
    // read every round.
    drop(a);
    b.set_polling(Polling::Own);
    idle(&mut b, 2 * UPLINK_IDLE_PULLS);
    assert_eq!(reads_until_uplink_frame(&mut b, &mut outside, 6), 1);
}

/// A memory for [`Reach::memory_of`] tests; reads nothing.
#[derive(Debug)]
struct NoMemory;

impl PeerMemory for NoMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), vrnic::mem::MemError> {
        Err(vrnic::mem::MemError {
            addr: gpa,
            len: buf.len(),
        })
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Issue 27, finding 3: a port nobody reads (its function has no driver)
/// takes no frames: unicast and group frames for it are dropped and
/// counted at once, and the sender's frames for others go on — nothing
/// is held back for it; what it held when its driver left is dropped, and
/// it starts empty when a driver comes.
#[test]
fn an_unattended_port_costs_its_senders_nothing() {
    let (sw, mut a, mut b, _outside) = switch_ab();
    let mut c = sw.add_port(C).unwrap();
    b.try_send(&frame(A, B, 0)).unwrap();
    a.set_attended(false);
    assert_eq!(a.stats().rx_unattended, 1, "the frame it held is dropped");
    // More than a queue's worth for A, and frames for C between them.
    let n = PORT_QUEUE_DEPTH + 10;
    let mut frames: Vec<Vec<u8>> = (0..n)
        .map(|i| frame(if i % 2 == 0 { A } else { C }, B, i as u8))
        .collect();
    let mut sent = 0;
    while sent < n {
        let took = b.try_send_many(&mut frames[sent..]).unwrap();
        assert!(took > 0, "nothing held back for the unattended port");
        sent += took;
    }
    b.send(&frame([0xff; 6], B, 1)).unwrap();
    assert_eq!(b.stats().tx_busy, 0);
    assert_eq!(a.stats().rx_unattended, 1 + n as u64 / 2 + 1);
    let got = recv_all(&mut c);
    assert_eq!(got.len(), n / 2 + 1, "C got its frames and the broadcast");
    assert!(recv_all(&mut a).is_empty(), "A holds nothing");
    a.set_attended(true);
    b.try_send(&frame(A, B, 7)).unwrap();
    assert_eq!(recv_all(&mut a), vec![frame(A, B, 7)]);
}

/// Issue 27, finding 4: a frame is read by reference only from the memory
/// its sender had when it sent it: once the sender shares another (a new
/// driver, or none), the frame's references find nothing (counted).
#[test]
fn references_are_read_only_from_the_memory_they_were_sent_with() {
    let (_sw, mut a, mut b, _outside) = switch_ab();
    let reach = b.caps().local_macs.unwrap();
    a.share_memory(Some(Arc::new(NoMemory)));
    b.share_memory(Some(Arc::new(NoMemory)));
    // Sent and read while A's memory stands: found.
    a.try_send(&frame(B, A, 1)).unwrap();
    let mut found = Vec::new();
    b.recv_with(&mut [0u8; 64], &mut |_, _| {
        found.push(reach.memory_of(&A).is_some())
    })
    .unwrap();
    // Sent, then A's driver goes and another comes before B reads it.
    a.try_send(&frame(B, A, 2)).unwrap();
    a.share_memory(None);
    a.share_memory(Some(Arc::new(NoMemory)));
    b.recv_with(&mut [0u8; 64], &mut |_, _| {
        found.push(reach.memory_of(&A).is_some())
    })
    .unwrap();
    assert_eq!(found, vec![true, false]);
    assert_eq!(b.stats().rx_stale_refs, 1);
    // Outside a delivery nothing is found either.
    assert!(reach.memory_of(&A).is_none());
}
