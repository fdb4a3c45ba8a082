//! The vrnic backend driven through vhost-user by the test frontend, in
//! process, without QEMU: negotiation, configuration space, the control,
//! doorbell and event queues, hostile chains, the link and reconnection.

use std::os::fd::AsRawFd;
use std::time::Duration;

use vrnic::abi::{self, Pod};
use vrnic::link::{Link, MemLink};
use vrnic::mem::DmaMemory;
use vrnic_frontend::{
    arp_request_frame, test_device_config, Buffer, FrontendOptions, TestDaemon, TestFrontend,
};
use vrnic_vhost::VrnicBackend;

const WAIT: Duration = Duration::from_secs(10);

fn start() -> (TestDaemon, MemLink) {
    let (ours, peer) = MemLink::pair();
    let d = TestDaemon::with_device(test_device_config(), Box::new(ours)).expect("daemon starts");
    (d, peer)
}

fn connect(d: &TestDaemon) -> TestFrontend {
    d.connect(&FrontendOptions::default())
        .expect("frontend connects and starts the device")
}

fn stop(d: TestDaemon) -> VrnicBackend {
    d.stop(WAIT)
        .expect("daemon stops and gives the backend back")
}

/// Any command the device must refuse: an opcode no ABI version defines.
const BOGUS_OPCODE: u16 = 0x7fff;

/// A command answered with a well-formed header: `len` matches the bytes
/// written after it, and an error carries no body.
fn assert_valid_response(h: &abi::RespHeader, body: &[u8]) {
    assert_eq!(
        h.len as usize,
        body.len(),
        "RespHeader.len must count the body the device wrote: {h:?}"
    );
    if h.status != abi::STATUS_OK {
        assert_eq!(h.len, 0, "an error response has no body: {h:?}");
    }
}

#[test]
fn get_config_returns_the_vrnic_signature() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let cs = fe.config_space().unwrap();
    assert_eq!(cs.signature, abi::SIGNATURE);
    assert_eq!(cs.abi_version, abi::ABI_VERSION);
    assert_eq!(usize::from(cs.num_queues), abi::NUM_QUEUES);
    assert_eq!(cs.mac, test_device_config().mac);
    // A partial read returns exactly those bytes.
    assert_eq!(fe.get_config(8, 4).unwrap(), abi::ABI_VERSION.to_le_bytes());
    // (Reads past the 64 bytes: see the backend's unit tests; the vhost
    // crate's frontend cannot parse the empty error reply.)
    drop(fe);
    stop(d);
}

#[test]
fn negotiates_version_1_protocol_features_and_event_idx() {
    let (d, _peer) = start();
    let fe = connect(&d);
    let acked = fe.acked_features();
    assert_ne!(acked & (1 << 32), 0, "VIRTIO_F_VERSION_1");
    assert_ne!(acked & (1 << 30), 0, "VHOST_USER_F_PROTOCOL_FEATURES");
    assert_ne!(acked & (1 << 29), 0, "VIRTIO_RING_F_EVENT_IDX");
    drop(fe);
    let b = stop(d);
    assert_eq!(b.acked_features(), acked);
}

#[test]
fn control_command_round_trip() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_valid_response(&h, &body);
    assert_ne!(h.status, abi::STATUS_OK, "an unknown opcode must fail");
    drop(fe);
    let b = stop(d);
    assert_eq!(b.stats().commands, 1);
    assert_eq!(b.device_stats().cmd_errors, 1);
}

/// Needs the engine: with the ENOSYS stub this fails.
#[test]
fn alloc_pd_answers_ok_with_a_handle() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let (h, body) = fe.control(abi::CMD_ALLOC_PD, &[]).unwrap();
    assert_valid_response(&h, &body);
    assert_eq!(h.status, abi::STATUS_OK, "CMD_ALLOC_PD: {h:?}");
    let pd = abi::Handle::read_from(&body).expect("the response body is a Handle");
    let (h2, body2) = fe.control(abi::CMD_ALLOC_PD, &[]).unwrap();
    assert_eq!(h2.status, abi::STATUS_OK);
    let pd2 = abi::Handle::read_from(&body2).unwrap();
    assert_ne!(pd.handle, pd2.handle, "two PDs get two handles");
    drop(fe);
    stop(d);
}

#[test]
fn many_commands_under_both_notification_schemes() {
    for event_idx in [false, true] {
        let (d, _peer) = start();
        let opts = FrontendOptions {
            event_idx,
            queue_size: 8,
            ..Default::default()
        };
        let mut fe = d.connect(&opts).unwrap();
        assert_eq!(fe.acked_features() & (1 << 29) != 0, event_idx);
        // More commands than the queue has entries: indices wrap.
        for i in 0..100 {
            let (h, body) = fe
                .control(BOGUS_OPCODE, &[])
                .unwrap_or_else(|e| panic!("command {i}: {e}"));
            assert_valid_response(&h, &body);
        }
        drop(fe);
        assert_eq!(stop(d).stats().commands, 100);
    }
}

#[test]
fn pipelined_commands_all_complete() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let n = 16;
    let mut heads = Vec::new();
    for _ in 0..n {
        let req = fe.memory_mut().alloc(8, 8).unwrap();
        let resp = fe.memory_mut().alloc(64, 8).unwrap();
        let h = abi::CmdHeader {
            opcode: BOGUS_OPCODE,
            ctx: 0,
            len: 0,
        };
        fe.memory().mem().write(req, h.as_bytes()).unwrap();
        heads.push(
            fe.post(
                abi::CONTROLQ,
                &[Buffer::readable(req, 8), Buffer::writable(resp, 64)],
            )
            .unwrap(),
        );
    }
    let mut done = Vec::new();
    for _ in 0..n {
        let u = fe.wait(abi::CONTROLQ).unwrap();
        assert!(u.len >= 8);
        done.push(u.id);
    }
    done.sort_unstable();
    heads.sort_unstable();
    assert_eq!(done, heads);
    drop(fe);
    stop(d);
}

#[test]
fn control_chains_outside_guest_memory_are_rejected_and_the_daemon_carries_on() {
    let (d, _peer) = start();
    // Two regions with a hole between them.
    let opts = FrontendOptions {
        memory: vec![(0x4000_0000, 4 << 20), (0x5000_0000, 4 << 20)],
        ..Default::default()
    };
    let mut fe = d.connect(&opts).unwrap();
    let resp = fe.memory_mut().alloc(64, 8).unwrap();
    let req = fe.memory_mut().alloc(8, 8).unwrap();
    let h = abi::CmdHeader {
        opcode: BOGUS_OPCODE,
        ctx: 0,
        len: 0,
    };
    fe.memory().mem().write(req, h.as_bytes()).unwrap();

    // Request far outside guest memory: answered EFAULT, not executed.
    let far = 0xdead_0000_0000;
    let u = fe
        .submit(
            abi::CONTROLQ,
            &[Buffer::readable(far, 8), Buffer::writable(resp, 64)],
        )
        .unwrap();
    assert_eq!(u.len, 8);
    let mut b = [0u8; 8];
    fe.memory().mem().read(resp, &mut b).unwrap();
    let rh = abi::RespHeader::read_from(&b).unwrap();
    assert_eq!(
        rh,
        abi::RespHeader {
            status: abi::STATUS_EFAULT,
            len: 0
        }
    );

    // Request running off the end of the first region into the hole.
    let edge = 0x4000_0000 + (4 << 20) - 4;
    let u = fe
        .submit(
            abi::CONTROLQ,
            &[Buffer::readable(edge, 8), Buffer::writable(resp, 64)],
        )
        .unwrap();
    assert_eq!(u.len, 8);
    fe.memory().mem().read(resp, &mut b).unwrap();
    assert_eq!(
        abi::RespHeader::read_from(&b).unwrap().status,
        abi::STATUS_EFAULT
    );

    // Response buffer outside guest memory: completed with 0 bytes.
    let u = fe
        .submit(
            abi::CONTROLQ,
            &[Buffer::readable(req, 8), Buffer::writable(far, 64)],
        )
        .unwrap();
    assert_eq!(u.len, 0);
    // Response buffer spanning the hole.
    let u = fe
        .submit(
            abi::CONTROLQ,
            &[Buffer::readable(req, 8), Buffer::writable(edge, 64)],
        )
        .unwrap();
    assert_eq!(u.len, 0);
    // Address arithmetic overflow.
    let u = fe
        .submit(
            abi::CONTROLQ,
            &[
                Buffer::readable(u64::MAX - 3, 8),
                Buffer::writable(resp, 64),
            ],
        )
        .unwrap();
    assert_eq!(u.len, 8);

    // The next valid command still works.
    let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_valid_response(&h, &body);
    drop(fe);
    let s = stop(d).stats();
    assert_eq!(s.faulted_commands, 3);
    assert_eq!(s.rejected_chains, 2);
    assert_eq!(
        s.commands, 1,
        "only the final, fault-free command reached the device"
    );
}

#[test]
fn malformed_control_chains_do_not_kill_the_daemon() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let req = fe.memory_mut().alloc(64, 8).unwrap();
    let resp = fe.memory_mut().alloc(64, 8).unwrap();
    let h = abi::CmdHeader {
        opcode: BOGUS_OPCODE,
        ctx: 0,
        len: 0,
    };
    fe.memory().mem().write(req, h.as_bytes()).unwrap();

    // No writable descriptor.
    assert_eq!(
        fe.submit(abi::CONTROLQ, &[Buffer::readable(req, 8)])
            .unwrap()
            .len,
        0
    );
    // A writable part too small for a RespHeader.
    assert_eq!(
        fe.submit(
            abi::CONTROLQ,
            &[Buffer::readable(req, 8), Buffer::writable(resp, 7)]
        )
        .unwrap()
        .len,
        0
    );
    // Readable after writable.
    let bad_order = [Buffer::writable(resp, 64), Buffer::readable(req, 8)];
    assert_eq!(fe.submit(abi::CONTROLQ, &bad_order).unwrap().len, 0);
    // Only a writable part: an empty request, which the device refuses.
    let u = fe
        .submit(abi::CONTROLQ, &[Buffer::writable(resp, 64)])
        .unwrap();
    assert_eq!(u.len, 8);
    // A request shorter than a CmdHeader, and one longer than any command.
    let u = fe
        .submit(
            abi::CONTROLQ,
            &[Buffer::readable(req, 3), Buffer::writable(resp, 64)],
        )
        .unwrap();
    assert_eq!(u.len, 8);
    let mut b = [0u8; 8];
    fe.memory().mem().read(resp, &mut b).unwrap();
    assert_ne!(
        abi::RespHeader::read_from(&b).unwrap().status,
        abi::STATUS_OK
    );
    let big = fe.memory_mut().alloc(4096, 8).unwrap();
    fe.memory()
        .mem()
        .write(
            big,
            abi::CmdHeader {
                opcode: abi::CMD_QUERY_DEVICE,
                ctx: 0,
                len: 4000,
            }
            .as_bytes(),
        )
        .unwrap();
    let u = fe
        .submit(
            abi::CONTROLQ,
            &[Buffer::readable(big, 4096), Buffer::writable(resp, 64)],
        )
        .unwrap();
    assert!(u.len >= 8);
    // A response split over several small buffers is gathered correctly.
    let parts = [
        Buffer::readable(req, 8),
        Buffer::writable(resp, 3),
        Buffer::writable(resp + 16, 5),
    ];
    assert_eq!(fe.submit(abi::CONTROLQ, &parts).unwrap().len, 8);

    let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_valid_response(&h, &body);
    drop(fe);
    assert_eq!(stop(d).stats().rejected_chains, 3);
}

#[test]
fn a_corrupt_avail_index_does_not_kill_the_daemon() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    fe.control(BOGUS_OPCODE, &[]).unwrap();
    // The driver claims 1000 new chains on a 64-entry queue, and kicks.
    fe.write_avail_idx(abi::CONTROLQ, 1000).unwrap();
    // The other queues keep working meanwhile, and the device used nothing.
    let db = abi::Doorbell {
        kind: abi::DB_CQ_ARM,
        handle: 12345,
        ..Default::default()
    };
    fe.doorbell(&db).unwrap();
    assert_eq!(fe.try_used(abi::CONTROLQ).unwrap(), None);
    // Restored, the control queue works again.
    fe.republish(abi::CONTROLQ).unwrap();
    let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_valid_response(&h, &body);
    drop(fe);
    stop(d);
}

#[test]
fn doorbells_are_consumed_and_short_ones_ignored() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    // A doorbell naming no object: consumed, ignored by the device.
    let db = abi::Doorbell {
        kind: abi::DB_SQ,
        handle: 0xabcdef,
        index: 1,
        ..Default::default()
    };
    for _ in 0..3 {
        assert_eq!(fe.doorbell(&db).unwrap().len, 0);
    }
    // Short, split and out-of-memory doorbell chains.
    let buf = fe.memory_mut().alloc(16, 16).unwrap();
    fe.memory().mem().write(buf, db.as_bytes()).unwrap();
    assert_eq!(
        fe.submit(abi::DOORBELLQ, &[Buffer::readable(buf, 8)])
            .unwrap()
            .len,
        0
    );
    assert_eq!(
        fe.submit(
            abi::DOORBELLQ,
            &[Buffer::readable(buf, 8), Buffer::readable(buf + 8, 8)]
        )
        .unwrap()
        .len,
        0
    );
    assert_eq!(
        fe.submit(abi::DOORBELLQ, &[Buffer::readable(0xdead_0000_0000, 16)])
            .unwrap()
            .len,
        0
    );
    assert_eq!(
        fe.submit(abi::DOORBELLQ, &[Buffer::writable(buf, 16)])
            .unwrap()
            .len,
        0
    );
    drop(fe);
    let s = stop(d).stats();
    assert_eq!(
        s.doorbells, 4,
        "three whole doorbells and one split over two buffers"
    );
    assert_eq!(s.bad_doorbells, 3);
}

#[test]
fn event_buffers_are_held_until_there_is_an_event() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    fe.post_event_buffers(8).unwrap();
    // No event source is active: nothing comes back.
    assert_eq!(fe.next_event(Duration::from_millis(50)).unwrap(), None);
    let (h, _) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_ne!(h.status, abi::STATUS_OK);
    assert_eq!(fe.try_used(abi::EVENTQ).unwrap(), None);
    drop(fe);
    let s = stop(d).stats();
    assert_eq!(s.events_delivered, 0);
    assert_eq!(s.bad_event_buffers, 0);
}

fn wait_readable(fd: &impl AsRawFd, timeout: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout.as_millis() as i32) == 1 }
}

struct Fd(i32);
impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> i32 {
        self.0
    }
}

/// Frames from the link reach the device and its replies reach the link.
/// Needs the engine's ARP responder.
#[test]
fn link_frames_reach_the_device_and_replies_go_out() {
    let (d, mut peer) = start();
    let fe = connect(&d);
    let n = 5;
    for _ in 0..n {
        peer.send(&arp_request_frame()).unwrap();
    }
    let fd = Fd(peer.caps().fd.expect("MemLink has an eventfd"));
    let mut buf = vec![0u8; 2048];
    let mut replies = 0;
    while replies < n {
        assert!(
            wait_readable(&fd, WAIT),
            "no ARP reply within {WAIT:?} ({replies} of {n})"
        );
        while let Some(len) = peer.recv(&mut buf).unwrap() {
            let f = &buf[..len];
            assert_eq!(&f[12..14], &[0x08, 0x06], "an ARP frame");
            assert_eq!(&f[20..22], &[0, 2], "an ARP reply");
            assert_eq!(&f[22..28], &test_device_config().mac, "from the port's MAC");
            replies += 1;
        }
    }
    drop(fe);
    let b = stop(d);
    assert_eq!(b.device_stats().rx_frames, n as u64);
    assert_eq!(b.stats().link_tx_errors, 0);
}

/// Frames arriving with no frontend connected are received too (and the
/// daemon survives a frontend that never set memory up).
#[test]
fn frames_before_the_frontend_and_between_connections() {
    let (d, mut peer) = start();
    let mut fe = connect(&d);
    fe.control(BOGUS_OPCODE, &[]).unwrap();
    drop(fe);
    let mut fe = connect(&d);
    peer.send(&arp_request_frame()).unwrap();
    let fd = Fd(peer.caps().fd.unwrap());
    assert!(
        wait_readable(&fd, WAIT),
        "no ARP reply on the second connection"
    );
    let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_valid_response(&h, &body);
    drop(fe);
    let b = stop(d);
    assert_eq!(b.stats().commands, 2);
}

#[test]
fn a_frontend_can_reconnect_after_disconnecting() {
    let (d, _peer) = start();
    for round in 0..3 {
        let mut fe = connect(&d);
        assert_eq!(
            fe.config_space().unwrap().signature,
            abi::SIGNATURE,
            "round {round}"
        );
        let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
        assert_valid_response(&h, &body);
    }
    let b = stop(d);
    assert_eq!(b.stats().commands, 3);
}

/// A second frontend that connects while one is served (a second program
/// on the same function) is refused: its connection is closed after
/// `BUSY_GRACE`, so it fails at once instead of waiting out its own
/// timeout for answers that never come, and the one served carries on.
/// Once that one leaves, the next is served.
#[test]
fn a_second_frontend_is_refused_while_one_is_served() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let opts = FrontendOptions {
        timeout: 3 * WAIT,
        ..FrontendOptions::default()
    };
    let t0 = std::time::Instant::now();
    let second = d.connect(&opts);
    let waited = t0.elapsed();
    assert!(second.is_err(), "a second frontend was served");
    assert!(
        waited < WAIT,
        "refused after {waited:?}: it waited for answers instead"
    );
    let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_valid_response(&h, &body);
    drop(fe);
    let mut fe = connect(&d);
    let (h, body) = fe.control(BOGUS_OPCODE, &[]).unwrap();
    assert_valid_response(&h, &body);
    drop(fe);
    let b = stop(d);
    assert_eq!(b.stats().commands, 2);
    assert_eq!(b.stats().frontends_refused, 1, "the refusal is counted");
}

/// A VM pause (QMP `stop`, then `cont`): QEMU stops every queue
/// (`GET_VRING_BASE`) and later starts them again where they stopped. The
/// device keeps its objects across it (a PD made before is still there to
/// deallocate), drops and counts the frames that arrive meanwhile (they get
/// no answer), and answers the link again once resumed.
#[test]
fn a_vm_pause_keeps_the_device_and_its_objects() {
    let (ours, mut peer) = MemLink::pair();
    let d = TestDaemon::with_device_and_stats(test_device_config(), Box::new(ours)).unwrap();
    let mut fe = connect(&d);
    let pd: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    let bases = fe.stop_device().unwrap();
    assert_eq!(
        bases[usize::from(abi::CONTROLQ)],
        1,
        "GET_VRING_BASE reports the one consumed command"
    );
    // Frames while stopped: dropped, counted, never answered.
    for _ in 0..3 {
        peer.send(&arp_request_frame()).unwrap();
    }
    wait_for_counter(&d, "rx_dropped_stopped", 3);
    fe.resume_device(&bases).unwrap();
    // Resumed: the link is answered again, once (the three stayed dropped).
    peer.send(&arp_request_frame()).unwrap();
    let fd = Fd(peer.caps().fd.unwrap());
    assert!(wait_readable(&fd, WAIT), "no ARP reply after the resume");
    let mut buf = vec![0u8; 2048];
    let mut replies = 0;
    while peer.recv(&mut buf).unwrap().is_some() {
        replies += 1;
    }
    assert_eq!(
        replies, 1,
        "only the frame sent after the resume is answered"
    );
    // The PD survived: deallocating it succeeds (after a reset it would be unknown).
    let (h, _) = fe.control(abi::CMD_DEALLOC_PD, pd.as_bytes()).unwrap();
    assert_eq!(
        h.status,
        abi::STATUS_OK,
        "the PD made before the pause: {h:?}"
    );
    drop(fe);
    let b = stop(d);
    assert_eq!(b.stats().device_stops, 1);
    assert_eq!(b.stats().device_resumes, 1);
    assert_eq!(b.stats().rx_dropped_stopped, 3);
}

/// A driver that resets the device starts its queues again from index 0
/// with new rings: the device is reset then, and the objects it had are
/// gone. Stopping a device never used resets it at once.
#[test]
fn a_reinitialised_driver_resets_the_device() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let pd: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    fe.stop_device().unwrap();
    fe.reinit_device().unwrap();
    let (h, _) = fe.control(abi::CMD_DEALLOC_PD, pd.as_bytes()).unwrap();
    assert_ne!(
        h.status,
        abi::STATUS_OK,
        "the PD is gone after the reset: {h:?}"
    );
    drop(fe);
    let with_use = stop(d).stats();
    assert_eq!(with_use.device_stops, 1);
    assert_eq!(with_use.device_resumes, 0);

    // One reset when the memory table arrives and one at disconnect, plus
    // one for the re-initialisation.
    let (d, _peer) = start();
    drop(connect(&d));
    let plain = stop(d).stats().device_resets;
    assert_eq!(with_use.device_resets, plain + 1);
}

/// Waits (bounded by [`WAIT`]) until the daemon's stats socket shows the
/// device counter `name` at `want`.
fn wait_for_counter(d: &TestDaemon, name: &str, want: u64) {
    let path = d.stats_socket().expect("stats server");
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let reply = vrnic_vhost::stats::query(path, WAIT).expect("stats reply");
        let got = vrnic_vhost::stats::parse(&reply)
            .expect("name value lines")
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v);
        if got == Some(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} is {got:?}, never {want}, within {WAIT:?}"
        );
        std::thread::yield_now();
    }
}

/// The backend answers on a once-only server and finishes when the
/// frontend leaves.
#[test]
fn once_server_finishes_when_the_frontend_leaves() {
    let (ours, _peer) = MemLink::pair();
    let backend = VrnicBackend::new(
        vrnic::device::Device::new(test_device_config()),
        Box::new(ours),
        vrnic_vhost::BackendConfig::default(),
    )
    .unwrap();
    let d = TestDaemon::start(backend, true).unwrap();
    let mut fe = connect(&d);
    fe.control(BOGUS_OPCODE, &[]).unwrap();
    drop(fe);
    let b = d
        .finish(WAIT)
        .expect("the server returns after the only connection");
    assert_eq!(b.stats().commands, 1);
}

#[test]
fn queue_sizes_above_the_maximum_are_refused() {
    let (ours, _peer) = MemLink::pair();
    let cfg = vrnic_vhost::BackendConfig {
        queue_size: 16,
        ..Default::default()
    };
    let d = TestDaemon::with_backend_config(Box::new(ours), cfg, false).unwrap();
    let opts = FrontendOptions {
        queue_size: 32,
        ..Default::default()
    };
    assert!(
        d.connect(&opts).is_err(),
        "SET_VRING_NUM 32 on a 16-entry backend"
    );
    // The backend dropped that connection; the next one works.
    let mut fe = d
        .connect(&FrontendOptions {
            queue_size: 16,
            ..Default::default()
        })
        .unwrap();
    fe.control(BOGUS_OPCODE, &[]).unwrap();
    drop(fe);
    stop(d);
    for bad in [0, 3, 512] {
        let (ours, _peer) = MemLink::pair();
        let cfg = vrnic_vhost::BackendConfig {
            queue_size: bad,
            ..Default::default()
        };
        assert!(VrnicBackend::new(
            vrnic::device::Device::new(test_device_config()),
            Box::new(ours),
            cfg
        )
        .is_err());
    }
}

fn ok<T: Pod>(fe: &mut TestFrontend, opcode: u16, body: &[u8]) -> T {
    let (h, b) = fe.control(opcode, body).unwrap();
    assert_eq!(h.status, abi::STATUS_OK, "opcode {opcode}: {h:?}");
    T::read_from(&b).unwrap_or_default()
}

/// An armed CQ's completion becomes an `EV_COMP` in an event buffer; an
/// event raised while the driver has no event buffer waits for one. Needs
/// the engine (flushing a QP to ERR completes its receive WQE).
#[test]
fn events_reach_the_event_queue_and_wait_for_buffers() {
    let (d, _peer) = start();
    let mut fe = connect(&d);
    let pd: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    let cq_for = |fe: &mut TestFrontend| -> u32 {
        let ring = fe.memory_mut().alloc(4 * 32, 64).unwrap();
        let db = fe.memory_mut().alloc(8, 8).unwrap();
        let c = abi::CreateCq {
            cqe: 4,
            reserved: 0,
            ring,
            db,
        };
        ok::<abi::Handle>(fe, abi::CMD_CREATE_CQ, c.as_bytes()).handle
    };
    let cqs = [cq_for(&mut fe), cq_for(&mut fe)];
    let mut qps = Vec::new();
    for &cqn in &cqs {
        let m = fe.memory_mut();
        let (sq, rq, rec) = (
            m.alloc(4 * 128, 64).unwrap(),
            m.alloc(4 * 32, 64).unwrap(),
            m.alloc(16, 16).unwrap(),
        );
        let c = abi::CreateQp {
            pdn: pd.handle,
            qp_type: abi::QPT_RC,
            send_cqn: cqn,
            recv_cqn: cqn,
            sq_size: 4,
            rq_size: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            sq,
            rq,
            db: rec,
            ..Default::default()
        };
        let r: abi::CreateQpResp = ok(&mut fe, abi::CMD_CREATE_QP, c.as_bytes());
        let init = abi::QpAttr {
            qpn: r.qpn,
            attr_mask: abi::QP_ATTR_STATE
                | abi::QP_ATTR_PKEY_INDEX
                | abi::QP_ATTR_PORT
                | abi::QP_ATTR_ACCESS_FLAGS,
            qp_state: abi::QPS_INIT,
            port_num: 1,
            ..Default::default()
        };
        let _: abi::Handle = ok(&mut fe, abi::CMD_MODIFY_QP, init.as_bytes());
        // One receive WQE with no SGE, then the RQ doorbell and the CQ arm.
        let wqe = abi::RecvWqe {
            wr_id: 0x1234,
            num_sge: 0,
            reserved: 0,
        };
        fe.memory().mem().write(rq, wqe.as_bytes()).unwrap();
        fe.doorbell(&abi::Doorbell {
            kind: abi::DB_RQ,
            handle: r.qpn,
            index: 1,
            ..Default::default()
        })
        .unwrap();
        fe.doorbell(&abi::Doorbell {
            kind: abi::DB_CQ_ARM,
            handle: cqn,
            index: 0,
            ..Default::default()
        })
        .unwrap();
        qps.push(r.qpn);
    }
    let to_err = |fe: &mut TestFrontend, qpn: u32| {
        let a = abi::QpAttr {
            qpn,
            attr_mask: abi::QP_ATTR_STATE,
            qp_state: abi::QPS_ERR,
            ..Default::default()
        };
        let _: abi::Handle = ok(fe, abi::CMD_MODIFY_QP, a.as_bytes());
    };

    // No event buffer yet: the event waits in the backend.
    to_err(&mut fe, qps[0]);
    fe.post_event_buffers(1).unwrap();
    let ev = fe
        .next_event(WAIT)
        .unwrap()
        .expect("the waiting event is delivered once a buffer comes");
    assert_eq!((ev.kind, ev.handle), (abi::EV_COMP, cqs[0]));

    // With a buffer waiting, the next event goes straight in.
    to_err(&mut fe, qps[1]);
    let ev = fe.next_event(WAIT).unwrap().expect("event delivered");
    assert_eq!((ev.kind, ev.handle), (abi::EV_COMP, cqs[1]));
    drop(fe);
    let s = stop(d).stats();
    assert_eq!(s.events_delivered, 2);
    assert_eq!(s.events_dropped, 0);
}

/// A daemon restarted under a running guest (issue 9): the frontend sends
/// the new daemon the whole setup again, with the same memory and rings
/// and each queue starting where the driver left it (what QEMU's
/// `vhost_dev_start` does for a backend that reconnects). The new daemon
/// never had the driver's objects: it raises `EV_DEVICE_FATAL`, answers
/// every command with `STATUS_ENODEV` and ignores doorbells, so no handle
/// of the first daemon reaches its engine, until the driver resets the
/// device and starts its queues from index 0.
#[test]
fn a_driver_set_up_against_an_earlier_daemon_finds_the_device_lost() {
    let (first, _p1) = start();
    let mut fe = connect(&first);
    let pd: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    fe.post_event_buffers(4).unwrap();
    let bases = fe.stop_device().unwrap();
    assert_eq!(bases[usize::from(abi::CONTROLQ)], 1);
    stop(first);

    let (ours, _p2) = MemLink::pair();
    let second = TestDaemon::with_device_and_stats(test_device_config(), Box::new(ours)).unwrap();
    fe.reattach(second.socket(), &FrontendOptions::default(), &bases)
        .expect("the running driver's setup, sent to the new daemon");
    let ev = fe.next_event(WAIT).unwrap().expect("an event");
    assert_eq!(
        (ev.kind, ev.handle),
        (abi::EV_DEVICE_FATAL, 0),
        "the driver is told: {ev:?}"
    );
    for (opcode, body) in [
        (abi::CMD_DEALLOC_PD, pd.as_bytes().to_vec()),
        (abi::CMD_QUERY_DEVICE, Vec::new()),
    ] {
        let (h, b) = fe.control(opcode, &body).unwrap();
        assert_valid_response(&h, &b);
        assert_eq!(h.status, abi::STATUS_ENODEV, "opcode {opcode}: {h:?}");
    }
    let db = abi::Doorbell {
        kind: abi::DB_SQ,
        handle: 0x11,
        index: 1,
        ..Default::default()
    };
    fe.doorbell(&db).expect("the doorbell is consumed");
    wait_for_counter(&second, "lost_requests", 3);

    // The driver resets the device: it works again, from scratch.
    fe.stop_device().unwrap();
    fe.reinit_device().unwrap();
    let _: abi::DeviceAttr = ok(&mut fe, abi::CMD_QUERY_DEVICE, &[]);
    let pd2: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    let (h, _) = fe.control(abi::CMD_DEALLOC_PD, pd2.as_bytes()).unwrap();
    assert_eq!(h.status, abi::STATUS_OK);
    drop(fe);
    let s = stop(second).stats();
    assert_eq!((s.device_lost, s.lost_requests), (1, 3));
}

/// A driver that starts its queues at index 0 on a new daemon is a new
/// driver: the device is not lost.
#[test]
fn a_fresh_driver_on_a_new_connection_is_not_lost() {
    let (d, _p) = start();
    for _ in 0..2 {
        let mut fe = connect(&d);
        let _: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    }
    assert_eq!(stop(d).stats().device_lost, 0);
}

/// The daemon as the socket's client (`vrnic --connect`, for QEMU with
/// `server=on`): it retries until the frontend listens, and after a
/// connection ends it connects again, to a device reset in between.
#[test]
fn a_connecting_daemon_waits_for_its_frontend_and_comes_back_after_each_connection() {
    use std::os::unix::net::UnixListener;
    use vrnic_vhost::server::{self, Stopper};

    let dir = std::env::temp_dir().join(format!("vrnic-connect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("qemu.sock");
    let (ours, _peer) = MemLink::pair();
    let backend = VrnicBackend::new(
        vrnic::device::Device::new(test_device_config()),
        Box::new(ours),
        vrnic_vhost::BackendConfig::default(),
    )
    .unwrap();
    let stop = Stopper::new().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (p, s) = (path.clone(), stop.clone());
    let t = std::thread::spawn(move || {
        let _ = tx.send(server::run_client(&p, backend, &s, false));
    });
    // The socket is not there yet: the daemon keeps trying.
    std::thread::yield_now();
    let listener = UnixListener::bind(&path).unwrap();
    let opts = FrontendOptions::default();
    let mut fe = TestFrontend::accept(&listener, &opts).expect("the daemon connects");
    let pd: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    drop(fe);
    // It comes back by itself, to a device without the old objects.
    let mut fe = TestFrontend::accept(&listener, &opts).expect("the daemon connects again");
    let (h, _) = fe.control(abi::CMD_DEALLOC_PD, pd.as_bytes()).unwrap();
    assert_eq!(h.status, abi::STATUS_ENOENT, "the old PD is gone: {h:?}");
    drop(fe);
    stop.stop();
    let b = rx
        .recv_timeout(WAIT)
        .expect("the daemon stops within the bound")
        .expect("no error");
    t.join().unwrap();
    assert_eq!(b.stats().commands, 2);
    assert_eq!(b.mapped_regions(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression (seen in the e2e restart step): a driver that resets a device
/// in use and starts again may have commands served before QEMU has started
/// its doorbell queue; the control queue's index then moves on from 0 with
/// the device's own service, which is not a driver from another daemon.
#[test]
fn commands_before_the_doorbell_queue_restarts_do_not_make_the_device_lost() {
    let (d, _p) = start();
    let mut fe = connect(&d);
    let _: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    fe.stop_device().unwrap();
    let regions = fe.memory().region_infos().unwrap();
    vhost::VhostBackend::set_mem_table(fe.vhost(), &regions).unwrap();
    fe.reinit_queue(abi::CONTROLQ).unwrap();
    let _: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    let _: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    fe.reinit_queue(abi::DOORBELLQ).unwrap();
    fe.reinit_queue(abi::EVENTQ).unwrap();
    let _: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    let db = abi::Doorbell {
        kind: abi::DB_SQ,
        handle: 0x11,
        index: 1,
        ..Default::default()
    };
    fe.doorbell(&db).unwrap();
    let _: abi::Handle = ok(&mut fe, abi::CMD_ALLOC_PD, &[]);
    drop(fe);
    let s = stop(d).stats();
    assert_eq!((s.device_lost, s.lost_requests), (0, 0));
}
