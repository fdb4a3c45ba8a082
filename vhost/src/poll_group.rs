//! One poller for all the functions of a daemon (issue 10).
//!
//! Each function has its own worker thread (vhost-user-backend runs one per
//! device), and each worker polls for a while after work
//! ([`crate::spin`]). Two functions talking through the embedded switch
//! then keep four threads busy — two programs polling their CQs and two
//! workers — and on a machine with fewer cores every hand-off between them
//! is a context switch (a `sched_yield` hand-off between two threads of one
//! core costs ≈1.3 µs here, against ≈0.3 µs between two cores), six per
//! 64-byte round trip.
//!
//! So the functions of a daemon form a [`PollGroup`]: at most one worker
//! polls at a time, the group's **poller**, and it polls every member, its
//! own function first, then one round of each other's (`DataPath::poll_round`)
//! whose data path it can take without waiting (`try_lock`: a member whose
//! own worker is busy, or whose data path another thread waits for, is
//! skipped that round). A member it polls is **adopted**: its driver's
//! doorbell notifications are off as for the poller's own queue
//! (`VIRTQ_USED_F_NO_NOTIFY`, or the avail event left where it is), so its
//! program posts doorbells without kicks and its worker sleeps. Its
//! control queue is never polled: a command kicks the member's own
//! worker, which serves it on its own thread (`crate::spin`), so the
//! poller never runs another function's (possibly slow) commands. When the
//! poller's session ends, every adopted member gets its notifications back
//! and its queues served once more (as the poller's own, [`crate::spin`]),
//! so nothing posted meanwhile waits for a kick that will not come. A
//! worker that wakes while another polls serves its event and goes back to
//! sleep without polling itself.
//!
//! A switch port of an adopted member stops signalling while it is
//! adopted ([`vrnic::link::LinkSetting::Polling`]): frames queued for it wake
//! no worker; the poller reads them.
//!
//! Each member's round is bounded (`datapath::PASS_CHAINS_MAX` chains and
//! `datapath::PASS_BUDGET_NS` per queue pass), and the rounds start one
//! member further on each time, so a member whose driver floods its queues
//! holds the others up for one bounded round at a time.
//!
//! Locks: a worker holds its own data path for its whole wake-up and only
//! `try_lock`s the others', picking each under the member list's lock but
//! running its round without it (a member picked while in the list is
//! reset for its frontend's end only after the round: its backend leaves
//! the group, then locks the data path), except
//! when a member stays busy while it is given back (then a blocking lock
//! without the list's, taken with no other data path lock but its own: no
//! other thread waits for a second data path while holding one, so there
//! is no cycle). The member list's lock is never held across a data path
//! lock that blocks.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};

use crate::datapath::{DataPath, Vring};
use crate::stats::StatsBoard;

/// Most members of a group (the daemon's [`crate::switch::MAX_PORTS`]
/// functions at most).
pub const MAX_MEMBERS: usize = crate::switch::MAX_PORTS;

/// What a group knows of a member: its data path (weakly: the member's
/// backend owns it), how many other threads wait for it, its counters'
/// board and its worker's vrings.
struct Member {
    dp: Weak<Mutex<DataPath>>,
    waiters: Weak<AtomicUsize>,
    board: Arc<StatsBoard>,
    /// Shared: a round clones it without allocating.
    vrings: Arc<[Vring]>,
}

/// A member the poller adopted this session (weakly, as the group knows
/// it: a function deleted meanwhile is freed when its backend goes).
pub(crate) struct Adopted {
    dp: Weak<Mutex<DataPath>>,
    board: Arc<StatsBoard>,
    /// Shared: a round clones it without allocating.
    vrings: Arc<[Vring]>,
}

/// Tries [`PollGroup::give_back`] makes to take a busy member's data path
/// under the member list's lock before it waits for it without.
const GIVE_BACK_TRIES: u32 = 1000;

/// The functions of one daemon, polled by one worker at a time. See the
/// module.
#[derive(Default)]
pub struct PollGroup {
    /// A worker is the group's poller.
    polling: AtomicBool,
    members: Mutex<Vec<Member>>,
    /// `members.len()`, set under its lock: read on every wake-up of every
    /// worker ([`PollGroup::len`]) without taking it.
    count: AtomicUsize,
    /// Where the poller's next round of the others starts (round-robin).
    next: AtomicUsize,
}

impl std::fmt::Debug for PollGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollGroup")
            .field("members", &self.members().len())
            .field("polling", &self.polling.load(Ordering::Relaxed))
            .finish()
    }
}

fn id_of(dp: &Arc<Mutex<DataPath>>) -> *const Mutex<DataPath> {
    Arc::as_ptr(dp)
}

/// Gives `a` (locked in `g`) back ([`DataPath::release`]) and publishes
/// its counters. An engine panic on the way resets it (give-backs also run
/// while a panic of the poller's own engine unwinds, where a second panic
/// would abort the daemon).
fn release(g: &mut DataPath, a: &Adopted, publish: &dyn Fn(&StatsBoard, &mut DataPath)) {
    let (r, fault) =
        crate::fault::catch(|| catch_unwind(AssertUnwindSafe(|| g.release(&a.vrings))));
    if r.is_err() {
        tracing::error!("the engine panicked in a polled function: resetting it");
        g.reset_after_panic();
    }
    g.check_memory(fault);
    publish(&a.board, g);
}

/// `dp` if no thread holds it. A poisoned data path is still usable (a
/// panic in the engine is caught inside the lock and answered with a
/// reset), as for the backend's own locks.
fn try_lock(dp: &Mutex<DataPath>) -> Option<MutexGuard<'_, DataPath>> {
    match dp.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl PollGroup {
    /// An empty group.
    pub fn new() -> Self {
        Self::default()
    }

    fn members(&self) -> MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `dp` a member polled through `vrings` (its worker's, indexed
    /// by queue number), replacing what the group knew of it; members that
    /// are gone are forgotten. A full group ([`MAX_MEMBERS`]) leaves `dp`
    /// out: its worker polls for itself.
    pub(crate) fn join(
        &self,
        dp: &Arc<Mutex<DataPath>>,
        waiters: &Arc<AtomicUsize>,
        board: &Arc<StatsBoard>,
        vrings: &[Vring],
    ) {
        let mut m = self.members();
        m.retain(|x| x.dp.strong_count() > 0 && x.dp.as_ptr() != id_of(dp));
        if m.len() < MAX_MEMBERS {
            m.push(Member {
                dp: Arc::downgrade(dp),
                waiters: Arc::downgrade(waiters),
                board: board.clone(),
                vrings: vrings.into(),
            });
        }
        self.count.store(m.len(), Ordering::Relaxed);
    }

    /// `dp` leaves the group (its frontend is gone).
    pub(crate) fn leave(&self, dp: &Arc<Mutex<DataPath>>) {
        let mut m = self.members();
        m.retain(|x| x.dp.as_ptr() != id_of(dp));
        self.count.store(m.len(), Ordering::Relaxed);
    }

    /// Number of members (as of the last join or leave).
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Whether the group has no member.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes the caller the group's poller if no worker is; whether it is.
    pub(crate) fn lead(&self) -> bool {
        self.polling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The poller's session ended ([`PollGroup::give_back`] first).
    pub(crate) fn step_down(&self) {
        self.polling.store(false, Ordering::Release);
    }

    /// One round of every member but `own` whose data path is free now,
    /// adopting those not adopted yet (into `adopted`); whether any found
    /// work. For the poller, from its own session's loop.
    pub(crate) fn poll_others(
        &self,
        own: &Arc<Mutex<DataPath>>,
        adopted: &mut Vec<Adopted>,
        publish: &dyn Fn(&StatsBoard, &mut DataPath),
    ) -> bool {
        let mut work = false;
        // Round-robin: each round starts one member further on, so no
        // member is always served last.
        let n = self.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        for k in 0..n {
            // The member list's lock is held only to pick the member and
            // take its data path: a member taken while it is in the list
            // has not been reset for its frontend's end yet (its backend
            // locks the data path to do so, after leaving), and joins and
            // leaves of others do not wait for its round.
            let (dp, board, vrings) = {
                let members = self.members();
                let Some(m) = members.get(first.wrapping_add(k) % members.len().max(1)) else {
                    break;
                };
                if m.dp.as_ptr() == id_of(own)
                    || m.waiters
                        .upgrade()
                        .is_none_or(|w| w.load(Ordering::Relaxed) > 0)
                {
                    continue;
                }
                let Some(dp) = m.dp.upgrade() else {
                    continue;
                };
                (dp, m.board.clone(), m.vrings.clone())
            };
            let Some(mut g) = try_lock(&dp) else {
                continue;
            };
            let fresh = !adopted.iter().any(|a| a.dp.as_ptr() == id_of(&dp));
            // An engine panic in another function's round resets that
            // function, as its own worker would (the backend's
            // `handle_event`), not the poller's. A fault in its memory is
            // that function's too (`DataPath::check_memory`).
            let (round, fault) = crate::fault::catch(|| {
                catch_unwind(AssertUnwindSafe(|| {
                    if fresh && !g.adopt(&vrings) {
                        return None;
                    }
                    Some(g.poll_adopted(&vrings))
                }))
            });
            let lost = g.check_memory(fault);
            let found = match round {
                Ok(None) => continue,
                Ok(Some(found)) => found,
                Err(_) => {
                    tracing::error!("the engine panicked in a polled function: resetting it");
                    g.reset_after_panic();
                    true
                }
            } || lost;
            if fresh {
                adopted.push(Adopted {
                    dp: Arc::downgrade(&dp),
                    board: board.clone(),
                    vrings,
                });
            }
            if found {
                publish(&board, &mut g);
                work = true;
            }
        }
        work
    }

    /// Gives the adopted members back to their workers: notifications on,
    /// queues served once more ([`DataPath::release`]). A member that left
    /// the group meanwhile is skipped: its frontend is gone and its reset
    /// gave it back ([`DataPath::reset`]).
    ///
    /// Each is taken under the member list's lock, as in
    /// [`PollGroup::poll_others`], so that once a member has left
    /// ([`PollGroup::leave`]) the poller holds no reference to it and its
    /// backend frees it when it goes. A member whose data path is busy
    /// (its worker's wake-up, a vhost-user request) is tried again after
    /// the lock is let go (its worker may want it), at most
    /// [`GIVE_BACK_TRIES`] times, then waited for.
    pub(crate) fn give_back(
        &self,
        adopted: Vec<Adopted>,
        publish: &dyn Fn(&StatsBoard, &mut DataPath),
    ) {
        // Those free now first, so that a member whose worker is busy (a
        // slow command) holds back no other member's notifications.
        let busy: Vec<Adopted> = adopted
            .into_iter()
            .filter(|a| !self.try_give_back(a, publish))
            .collect();
        for a in busy {
            let mut tries = 0;
            while !self.try_give_back(&a, publish) {
                tries += 1;
                if tries >= GIVE_BACK_TRIES {
                    let Some(dp) = a.dp.upgrade() else {
                        break;
                    };
                    let mut g = dp.lock().unwrap_or_else(|e| e.into_inner());
                    release(&mut g, &a, publish);
                    break;
                }
                std::thread::yield_now();
            }
        }
    }

    /// Gives `a` back if its data path is free now (under the member
    /// list's lock); true when it is done with: given back, or gone.
    fn try_give_back(&self, a: &Adopted, publish: &dyn Fn(&StatsBoard, &mut DataPath)) -> bool {
        let members = self.members();
        if !members.iter().any(|m| m.dp.as_ptr() == a.dp.as_ptr()) {
            return true;
        }
        let Some(dp) = a.dp.upgrade() else {
            return true;
        };
        let done = match try_lock(&dp) {
            Some(mut g) => {
                release(&mut g, a, publish);
                true
            }
            None => false,
        };
        done
    }
}
