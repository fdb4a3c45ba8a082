//! What a frontend that goes away leaves in the daemon's process (issue 9,
//! a guest killed mid-run): nothing (descriptors and mappings are counted
//! in `/proc/self`). The frontend is a program on guest-lib's verbs over
//! `VhostUserTransport`, killed with its objects alive (`common::Conn::kill`).
//! Alone in its test binary, so no other test opens descriptors or maps
//! memory meanwhile.

mod common;

use common::{memfd_mappings, open_fds, rc_qp, settle, WAIT};
use vrnic::link::MemLink;
use vrnic_frontend::{test_device_config, TestDaemon};
use vrnic_guest::verbs::{Cq, Mr, Pd};

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
        // The transport gives the event queue its buffers when it opens.
        let (ctx, conn) = common::open(d.socket());
        let pd = Pd::alloc(&ctx).unwrap();
        let cq = Cq::new(&ctx, 64).unwrap();
        let qp = rc_qp(&pd, &cq);
        let mr = Mr::alloc(&pd, 1 << 20, 0).unwrap();
        assert!(
            open_fds() > fds,
            "round {round}: the connection holds descriptors"
        );
        // SAFETY: the objects are only dropped from now on; the MR is
        // `Mr::alloc`'s.
        unsafe { conn.kill() };
        drop((mr, qp, cq, pd, ctx));
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
