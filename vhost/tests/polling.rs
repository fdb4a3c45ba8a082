//! Adaptive polling (`vhost/src/spin.rs`): while the worker polls, the
//! driver's notifications are off and a driver that honours that does not
//! kick; whatever it posts meanwhile, and just as polling ends, is served.

use std::time::{Duration, Instant};

use vrnic::abi;
use vrnic::link::MemLink;
use vrnic_frontend::{FrontendOptions, TestDaemon};
use vrnic_vhost::spin::PollConfig;
use vrnic_vhost::BackendConfig;

const WAIT: Duration = Duration::from_secs(10);
/// Back-to-back commands per run: enough that many are posted while the
/// worker polls, and some as a session ends.
const COMMANDS: u64 = 2000;

/// Runs [`COMMANDS`] commands back to back against a worker polling
/// `poll_ns`; returns the backend's counters afterwards.
fn run(budget_ns: u64, event_idx: bool) -> vrnic_vhost::BackendStats {
    let (ours, _peer) = MemLink::pair();
    let cfg = BackendConfig {
        // No back-off: the worker polls after every wake-up however busy
        // the machine is, so sessions start and end throughout the run.
        poll: PollConfig {
            budget_ns,
            backoff_ns: 0,
        },
        ..Default::default()
    };
    let d = TestDaemon::with_backend_config(Box::new(ours), cfg, true).unwrap();
    let opts = FrontendOptions {
        event_idx,
        timeout: WAIT,
        ..Default::default()
    };
    let mut fe = d.connect(&opts).unwrap();
    for i in 0..COMMANDS {
        // Each command is answered within WAIT (a lost one times out).
        let (h, _) = fe
            .control(abi::CMD_QUERY_DEVICE, &[])
            .unwrap_or_else(|e| panic!("command {i}: {e}"));
        assert_eq!(h.status, abi::STATUS_OK, "command {i}");
    }
    // Once the worker stops polling (within its budget, or a session),
    // it wants kicks again on both queues it polled: a driver that posts
    // later without a kick would wait forever.
    let deadline = Instant::now() + WAIT;
    for q in [abi::CONTROLQ, abi::DOORBELLQ] {
        while !fe.wants_kick(q).unwrap() {
            assert!(
                Instant::now() < deadline,
                "queue {q}: notifications still off {WAIT:?} after the last command"
            );
            std::thread::yield_now();
        }
    }
    drop(fe);
    d.finish(WAIT).unwrap().stats()
}

#[test]
fn commands_posted_while_the_worker_polls_are_all_served() {
    for event_idx in [false, true] {
        let s = run(1_000_000, event_idx);
        assert_eq!(s.commands, COMMANDS, "event_idx {event_idx}");
        assert!(s.poll_sessions > 0, "the worker polled: {s:?}");
    }
}

#[test]
fn a_worker_told_not_to_poll_never_does() {
    let s = run(0, false);
    assert_eq!(s.commands, COMMANDS);
    assert_eq!((s.poll_sessions, s.poll_idle_ns), (0, 0), "{s:?}");
}
