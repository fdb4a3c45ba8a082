//! The clock: the next timer, retransmission and timewait.

#[cfg(doc)]
use crate::timing::cm_ack_timeout;
use crate::{
    event::CmEventKind, limits::MAX_TIMEWAIT, state::CmState, timing::cm_convert_to_ms,
    timing::NS_PER_MS, Cm,
};

impl Cm {
    /// When [`Cm::poll`] next has work (ns, the caller's clock), `None` if
    /// no timer runs.
    pub fn next_timer(&self) -> Option<u64> {
        self.conns
            .values()
            .filter_map(|c| {
                if c.state == CmState::Timewait {
                    Some(c.timewait_until)
                } else {
                    c.retx.as_ref().map(|r| r.deadline)
                }
            })
            .min()
    }

    /// cm.c `cm_enter_timewait`: the timewait lasts
    /// `cm_convert_to_ms(ack timeout)` ms, the ACK timeout being the
    /// path's (`cm_ack_timeout` of the packet life time; with rdma_cm's 18
    /// and rxe's ACK delay 15: 19, 2048 ms).
    pub(crate) fn enter_timewait(&mut self, now_ns: u64, id: u32) {
        let in_tw = self.timewait_count();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.state == CmState::Timewait {
            return;
        }
        c.state = CmState::Timewait;
        c.retx = None;
        c.timewait_until =
            now_ns.saturating_add(cm_convert_to_ms(c.ack_timeout).saturating_mul(NS_PER_MS));
        if in_tw >= MAX_TIMEWAIT {
            let oldest = self
                .conns
                .iter()
                .filter(|(k, c)| c.state == CmState::Timewait && **k != id)
                .min_by_key(|(_, c)| c.timewait_until)
                .map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.conns.remove(&k);
                self.counters.timewait_evicted += 1;
            }
        }
    }

    /// Runs the timers due at `now_ns`: retransmissions, retry errors and
    /// timewait exits.
    pub fn poll(&mut self, now_ns: u64) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                if c.state == CmState::Timewait {
                    c.timewait_until <= now_ns
                } else {
                    c.retx.as_ref().is_some_and(|r| r.deadline <= now_ns)
                }
            })
            .map(|(k, _)| *k)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.state == CmState::Timewait {
                // cm_timewait_handler: the entry goes; the id is idle.
                if c.destroyed {
                    self.conns.remove(&id);
                } else {
                    c.state = CmState::Idle;
                    c.remote_known = false;
                    self.push_event(id, CmEventKind::TimewaitExit);
                }
                continue;
            }
            let Some(r) = c.retx.as_mut() else {
                continue;
            };
            if r.left > 0 {
                r.left -= 1;
                r.deadline = now_ns.saturating_add(r.interval_ns);
                let (gid, mad) = (c.peer_gid, r.mad);
                self.push_mad(gid, mad);
                continue;
            }
            // cm_process_send_error.
            c.retx = None;
            match c.state {
                CmState::ReqSent => {
                    c.state = CmState::Idle;
                    self.push_event(id, CmEventKind::ReqError);
                }
                CmState::RepSent => {
                    c.state = CmState::Idle;
                    c.remote_known = false;
                    self.push_event(id, CmEventKind::RepError);
                }
                CmState::DreqSent => {
                    self.enter_timewait(now_ns, id);
                    self.push_event(id, CmEventKind::DreqError);
                }
                CmState::SidrReqSent => {
                    let destroyed = c.destroyed;
                    self.conns.remove(&id);
                    if !destroyed {
                        self.push_event(id, CmEventKind::SidrReqError);
                    }
                }
                _ => {}
            }
        }
    }
}
