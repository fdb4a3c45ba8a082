//! Making a [`Cm`], and looking up and allocating in its connection table.

use crate::{
    conn::Conn, counters::CmCounters, error::CmError, limits::MAX_CONNECTIONS,
    limits::MAX_TIMEWAIT, port::PortIdentity, qp1::Source, state::CmId, state::CmState, Cm,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

impl Cm {
    /// A CM for `port`, with empty tables.
    pub fn new(port: PortIdentity) -> Cm {
        let mix = port.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Cm {
            port,
            conns: BTreeMap::new(),
            listeners: BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            next_index: (mix >> 32) as u32,
            id_operand: mix as u32,
            counters: CmCounters::default(),
        }
    }

    /// The port's identity.
    pub fn port(&self) -> &PortIdentity {
        &self.port
    }

    /// The drop and answer counters.
    pub fn counters(&self) -> CmCounters {
        self.counters
    }

    /// A connection's state, `None` if there is no such connection (or it
    /// was destroyed).
    pub fn state(&self, id: CmId) -> Option<CmState> {
        self.conns
            .get(&id.0)
            .filter(|c| !c.destroyed)
            .map(|c| c.state)
    }

    /// How many connections are held (timewait ones included).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// How many connections are in timewait.
    pub fn timewait_count(&self) -> usize {
        self.conns
            .values()
            .filter(|c| c.state == CmState::Timewait)
            .count()
    }

    pub(crate) fn live_count(&self) -> usize {
        self.conns.len() - self.timewait_count()
    }

    /// How many listeners there are.
    pub fn listener_count(&self) -> usize {
        self.listeners.len()
    }

    /// A fresh local comm ID: cm.c's `cm_alloc_id_priv`, a cyclic index
    /// XORed with a random operand; never one in use or in timewait, never
    /// 0.
    pub(crate) fn alloc_id(&mut self) -> Option<u32> {
        for _ in 0..=MAX_CONNECTIONS + MAX_TIMEWAIT {
            let id = self.next_index ^ self.id_operand;
            self.next_index = self.next_index.wrapping_add(1);
            if id != 0 && !self.conns.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    pub(crate) fn conn_mut(&mut self, id: CmId) -> Result<&mut Conn, CmError> {
        self.conns
            .get_mut(&id.0)
            .filter(|c| !c.destroyed)
            .ok_or(CmError::NoSuchId)
    }

    /// A connection of ours named by a message's remote comm ID whose
    /// peer (comm ID when known, GID) is the sender.
    pub(crate) fn peer_conn(&self, local: u32, remote: u32, from: &Source) -> Option<u32> {
        let c = self.conns.get(&local)?;
        if c.peer_gid != from.gid {
            return None;
        }
        if c.remote_known && c.remote_id != remote {
            return None;
        }
        Some(local)
    }
}
