//! The queues of MADs to send and events to give, in and out.

use crate::{
    event::CmEvent, event::CmEventKind, limits::MAX_EVENTS, limits::MAX_OUT_MADS, qp1::Outgoing,
    state::CmId, Cm,
};
use vrnic_wire::{Gid, MAD_LEN};

impl Cm {
    /// The next MAD to send, oldest first.
    pub fn pop_mad(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next event, oldest first.
    pub fn pop_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    pub(crate) fn push_mad(&mut self, to_gid: Gid, mad: [u8; MAD_LEN]) {
        if self.out.len() >= MAX_OUT_MADS {
            self.counters.mads_dropped += 1;
            return;
        }
        self.out.push_back(Outgoing {
            to_gid,
            dest_qpn: vrnic_wire::GSI_QPN,
            mad,
        });
    }

    pub(crate) fn push_event(&mut self, id: u32, kind: CmEventKind) {
        if self.events.len() >= MAX_EVENTS {
            self.counters.events_dropped += 1;
            return;
        }
        self.events.push_back(CmEvent { id: CmId(id), kind });
    }
}
