//! What a frontend that goes away leaves in the daemon's process (issue 9,
//! a guest killed mid-run): nothing (descriptors and mappings are counted
//! in `/proc/self`). Alone in its test binary, so no other
//! test opens descriptors or maps memory meanwhile.

use std::time::{Duration, Instant};

use vrnic::link::MemLink;
use vrnic_vhost::frontend::verbs::QpSizes;
use vrnic_vhost::frontend::{test_device_config, FrontendOptions, TestDaemon};

const WAIT: Duration = Duration::from_secs(10);

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Mappings of memfd files (guest RAM is a memfd, as QEMU's
/// `memory-backend-memfd`).
fn memfd_mappings() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .expect("/proc/self/maps")
        .lines()
        .filter(|l| l.contains("/memfd:"))
        .count()
}

/// Waits (bounded by [`WAIT`]) until `f` gives `want`; the last value.
fn settle(want: usize, f: fn() -> usize) -> usize {
    let deadline = Instant::now() + WAIT;
    loop {
        let got = f();
        if got == want || Instant::now() >= deadline {
            return got;
        }
        std::thread::yield_now();
    }
}

/// A frontend with guest memory, vrings and verbs objects goes away: once
/// the daemon has handled the end of the connection (its device reset), the
/// process has exactly the descriptors it had before the frontend came and
/// no mapping of the guest's memory; and it does so for every guest in
/// turn.
#[test]
fn a_frontend_that_goes_away_leaves_no_descriptor_and_no_mapping() {
    let (link, _peer) = MemLink::pair();
    let d = TestDaemon::with_device(test_device_config(), Box::new(link)).unwrap();
    let fds = open_fds();
    assert_eq!(memfd_mappings(), 0, "no guest memory before a guest comes");
    for round in 1..=3u64 {
        let mut fe = d.connect(&FrontendOptions::default()).unwrap();
        let pd = fe.alloc_pd().unwrap();
        let cq = fe.create_cq(64).unwrap();
        let _qp = fe.create_rc_qp(pd, &cq, &cq, QpSizes::default()).unwrap();
        let buf = fe.alloc_buffer(1 << 20).unwrap();
        let _mr = fe.reg_mr(pd, buf, 1 << 20, 0).unwrap();
        fe.post_event_buffers(8).unwrap();
        assert!(
            open_fds() > fds,
            "round {round}: the connection holds descriptors"
        );
        drop(fe);
        // The daemon handles the end of the connection in its own time.
        assert_eq!(
            settle(fds, open_fds),
            fds,
            "round {round}: every descriptor of the connection closed within {WAIT:?}"
        );
        assert_eq!(
            settle(0, memfd_mappings),
            0,
            "round {round}: the guest's memory unmapped within {WAIT:?}"
        );
    }
    let b = d.stop(WAIT).unwrap();
    assert_eq!(b.mapped_regions(), 0);
}
