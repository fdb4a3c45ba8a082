//! What deleting a function with a connected frontend leaves in the
//! daemon's process (issue 10): nothing — descriptors, guest memory
//! mappings and threads are counted in `/proc/self`. Alone in its test
//! binary, so no other test opens descriptors, maps memory or starts
//! threads meanwhile. The frontend is a program on guest-lib's verbs over
//! `VhostUserTransport` (`common`).

mod common;

use std::net::Ipv4Addr;

use common::{memfd_mappings, open_fds, rc_qp, settle, threads};
use vrnic::link::MemLink;
use vrnic_guest::verbs::{Cq, Mr, Pd};
use vrnic_vhost::addr::Ipv4Prefix;
use vrnic_vhost::functions::{FunctionSpec, Functions, FunctionsConfig};

#[test]
fn deleting_a_connected_function_frees_everything_it_had() {
    let dir = std::env::temp_dir().join(format!("vrnic-fn-free-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let (uplink, _outside) = MemLink::pair();
    let fns = Functions::new(Box::new(uplink), FunctionsConfig::default());
    let (fds, tasks) = (open_fds(), threads());
    for round in 1..=3 {
        let socket = dir.join("f.sock");
        let spec = FunctionSpec::new(
            &socket,
            Ipv4Prefix {
                addr: Ipv4Addr::new(10, 0, 0, 1),
                len: 24,
            },
        );
        fns.add(&spec).unwrap();
        let (ctx, conn) = common::open(&socket);
        let pd = Pd::alloc(&ctx).unwrap();
        let cq = Cq::new(&ctx, 64).unwrap();
        let qp = rc_qp(&pd, &cq);
        let mr = Mr::alloc(&pd, 1 << 20, 0).unwrap();
        assert!(
            memfd_mappings() > 0,
            "round {round}: the guest's memory is mapped"
        );
        // The frontend stays connected: the delete closes its connection.
        assert!(
            conn.is_connected(),
            "round {round}: the program is connected"
        );
        fns.del("f.sock").expect("deleted");
        assert!(
            !conn.is_connected(),
            "round {round}: the program was disconnected"
        );
        // The program's own descriptors and mapping go with it (killed:
        // its objects can no longer be destroyed on a deleted function).
        // SAFETY: the objects are only dropped from now on; the MR is
        // `Mr::alloc`'s.
        unsafe { conn.kill() };
        drop((mr, qp, cq, pd, ctx));
        assert_eq!(
            settle(fds, open_fds),
            fds,
            "round {round}: every descriptor of the function closed"
        );
        assert_eq!(
            settle(0, memfd_mappings),
            0,
            "round {round}: the guest's memory unmapped"
        );
        assert_eq!(
            settle(tasks, threads),
            tasks,
            "round {round}: the function's threads ended"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
