//! The port's neighbour table (IP → MAC): what the transport looks a QP's
//! or AH's destination up in before its first packet, and what the device's
//! neighbour handling (`device::neigh`: ARP, RFC 826; IPv6 neighbour
//! discovery, RFC 4861 §7) fills from the wire.
//!
//! Everything in it comes from the wire or from a guest, so it is bounded
//! and expires (issue 9, item 5):
//!
//! - at most [`NEIGH_MAX`] resolved neighbours; a new one evicts the least
//!   recently confirmed entry, preferring one no QP used since;
//! - at most [`NEIGH_PENDING_MAX`] resolutions in progress (a guest can
//!   name any number of destinations); more wait for a slot. Nothing is
//!   queued behind a resolution: a QP or UD send waits in the transport
//!   (`waiting_arp`) and the device polls it every millisecond;
//! - a resolution sends at most [`NEIGH_MAX_PROBES`] requests,
//!   [`NEIGH_RETRANS_NS`] apart, then rests for [`NEIGH_FAILED_NS`] before
//!   a waiting sender may start another; an unresolved destination leaves
//!   its RC/UC QP waiting, while a UD datagram to it is dropped
//!   (`transport::datagram`);
//! - an entry is reachable for [`NEIGH_REACHABLE_NS`] after it was last
//!   confirmed (Linux's `base_reachable_time`). Then, if a QP used it since,
//!   it stays in use while it is re-probed (up to [`NEIGH_MAX_PROBES`]
//!   requests, Linux's PROBE state) and is dropped if none is answered;
//!   an unused one is dropped at once.

use std::cell::Cell;
use std::collections::HashMap;
use std::net::IpAddr;

use crate::time::Nanos;

/// Most resolved neighbours the port keeps.
pub const NEIGH_MAX: usize = 256;
/// Most neighbour resolutions in progress at once.
pub const NEIGH_PENDING_MAX: usize = 64;
/// How long an entry is used without re-confirmation, ns (Linux's
/// `base_reachable_time`, 30 s).
pub const NEIGH_REACHABLE_NS: Nanos = 30_000_000_000;
/// Interval between requests of one resolution or re-probe, ns.
pub const NEIGH_RETRANS_NS: Nanos = 200_000_000;
/// Requests one resolution or re-probe sends before it fails (Linux's
/// `mcast_solicit` / `ucast_solicit`, 3).
pub const NEIGH_MAX_PROBES: u8 = 3;
/// After a failed resolution, how long before a waiting sender may start
/// another, ns.
pub const NEIGH_FAILED_NS: Nanos = 1_000_000_000;

/// One resolved neighbour.
#[derive(Debug)]
struct Entry {
    mac: [u8; 6],
    /// When an answer or an ARP/NS from it last confirmed it.
    confirmed: Nanos,
    /// A packet was addressed with it since `confirmed` (set by lookups,
    /// which only borrow the table).
    used: Cell<bool>,
    /// Re-probe in progress: requests sent, the last one when.
    probes: u8,
    probe_sent: Nanos,
}

/// A resolution in progress: requests sent, the last one when.
#[derive(Debug, Clone, Copy)]
struct Pending {
    tries: u8,
    last: Nanos,
}

/// The port's neighbour table (IP → MAC), bounded and expiring; see the
/// module documentation for the rules.
#[derive(Debug, Default)]
pub struct NeighTable {
    entries: HashMap<IpAddr, Entry>,
    pending: HashMap<IpAddr, Pending>,
    /// No entry needs aging before this time (`None`: none needs it), so
    /// that a poll does not walk the tables for nothing.
    due: Option<Nanos>,
    /// The port's own addresses (its GIDs) and MAC: resolved without ARP
    /// or neighbour discovery, never aged, not counted in `len`. A QP
    /// addressing its own port sends to its own MAC, which a switch in
    /// front of the port (the daemon's, issue 10) loops back; the port
    /// never learns its own address from the wire (module documentation).
    own: Vec<(IpAddr, [u8; 6])>,
    /// Changes at every change of `entries` that a lookup's result or its
    /// marking depends on ([`NeighTable::generation`]).
    generation: u64,
}

impl NeighTable {
    /// An empty table that resolves each of `addrs` (the port's own) to
    /// `mac`.
    pub fn with_own(mac: [u8; 6], addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        Self {
            own: addrs.into_iter().map(|a| (a, mac)).collect(),
            ..Self::default()
        }
    }

    /// Whether `ip` resolves (one of the port's own addresses, or a
    /// resolved neighbour).
    pub(crate) fn resolved(&self, ip: &IpAddr) -> bool {
        self.own.iter().any(|(a, _)| a == ip) || self.entries.contains_key(ip)
    }

    /// The MAC of `ip` if it is resolved; marks the entry used (so that it
    /// is re-probed rather than dropped when its reachable time ends).
    /// The port's own addresses resolve to its own MAC.
    pub fn get(&self, ip: &IpAddr) -> Option<&[u8; 6]> {
        if let Some((_, mac)) = self.own.iter().find(|(a, _)| a == ip) {
            return Some(mac);
        }
        let e = self.entries.get(ip)?;
        e.used.set(true);
        Some(&e.mac)
    }

    /// A number that changes whenever an entry is added, changed,
    /// confirmed again (its `used` mark reset) or dropped: a lookup's
    /// result kept with it is still the table's answer, its entry still
    /// marked used, while it has not changed (headers kept per QP,
    /// [`crate::transport::peer_headers`]).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The MAC of `ip` if it is resolved, without marking it used.
    pub fn peek(&self, ip: &IpAddr) -> Option<[u8; 6]> {
        self.entries.get(ip).map(|e| e.mac)
    }

    /// Number of resolved neighbours.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no neighbour is resolved.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a resolution of `ip` is in progress (its answer may create
    /// an entry: RFC 826, RFC 4861 §7.2.5).
    pub(crate) fn is_pending(&self, ip: &IpAddr) -> bool {
        self.pending.contains_key(ip)
    }

    /// Whether the resolution of `ip` failed: every request was sent and
    /// the last went unanswered for [`NEIGH_RETRANS_NS`]; it rests (and
    /// reads as failed) until [`NEIGH_FAILED_NS`] after that request.
    pub(crate) fn failed(&self, ip: &IpAddr, now: Nanos) -> bool {
        self.pending.get(ip).is_some_and(|p| {
            p.tries >= NEIGH_MAX_PROBES && now >= p.last.saturating_add(NEIGH_RETRANS_NS)
        })
    }

    /// Number of resolutions in progress.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Confirms `ip` at `mac`: updates an existing entry; creates one when
    /// `create` (evicting one at [`NEIGH_MAX`]). Ends a resolution of `ip`.
    pub(crate) fn confirm(&mut self, ip: IpAddr, mac: [u8; 6], create: bool, now: Nanos) {
        self.pending.remove(&ip);
        self.wake_at(now.saturating_add(NEIGH_REACHABLE_NS));
        self.generation = self.generation.wrapping_add(1);
        if let Some(e) = self.entries.get_mut(&ip) {
            *e = Entry::new(mac, now);
            return;
        }
        if !create {
            return;
        }
        if self.entries.len() >= NEIGH_MAX {
            // Least recently confirmed, unused ones first.
            let victim = self
                .entries
                .iter()
                .min_by_key(|(_, e)| (e.used.get(), e.confirmed))
                .map(|(ip, _)| *ip);
            if let Some(v) = victim {
                self.entries.remove(&v);
            }
        }
        self.entries.insert(ip, Entry::new(mac, now));
    }

    /// Makes the next [`NeighTable::age`] run no later than `t`.
    pub(crate) fn wake_at(&mut self, t: Nanos) {
        self.due = Some(self.due.map_or(t, |d| d.min(t)));
    }

    /// Starts or continues the resolution of `ip`: true when a request
    /// should be sent now.
    pub(crate) fn want_request(&mut self, ip: IpAddr, now: Nanos) -> bool {
        self.wake_at(now.saturating_add(NEIGH_FAILED_NS));
        if let Some(p) = self.pending.get_mut(&ip) {
            if p.tries >= NEIGH_MAX_PROBES {
                if now < p.last.saturating_add(NEIGH_FAILED_NS) {
                    return false;
                }
                p.tries = 0;
            } else if now < p.last.saturating_add(NEIGH_RETRANS_NS) {
                return false;
            }
            p.tries += 1;
            p.last = now;
            return true;
        }
        if self.pending.len() >= NEIGH_PENDING_MAX {
            // Full: this one waits for a slot (a resolution ending or
            // resting past NEIGH_FAILED_NS). Evicting instead would let
            // many destinations restart each other's retries forever.
            return false;
        }
        self.pending.insert(
            ip,
            Pending {
                tries: 1,
                last: now,
            },
        );
        true
    }

    /// Ages the table at `now`: drops unused entries past their reachable
    /// time and probed ones whose probes went unanswered, forgets failed
    /// resolutions nobody retried. Returns the addresses to (re-)probe now
    /// and the next time the table needs aging.
    pub(crate) fn age(&mut self, now: Nanos) -> (Vec<IpAddr>, Option<Nanos>) {
        match self.due {
            Some(d) if now < d => return (Vec::new(), Some(d)),
            None => return (Vec::new(), None),
            _ => {}
        }
        let mut probe = Vec::new();
        let mut next: Option<Nanos> = None;
        let mut at = |t: Nanos| next = Some(next.map_or(t, |n: Nanos| n.min(t)));
        let before = self.entries.len();
        self.entries.retain(|ip, e| {
            let stale_at = e.confirmed.saturating_add(NEIGH_REACHABLE_NS);
            if now < stale_at {
                at(stale_at);
                return true;
            }
            if e.probes == 0 && !e.used.get() {
                return false;
            }
            let due = e.probe_sent.saturating_add(NEIGH_RETRANS_NS);
            if e.probes > 0 && now < due {
                at(due);
                return true;
            }
            if e.probes >= NEIGH_MAX_PROBES {
                return false;
            }
            e.probes += 1;
            e.probe_sent = now;
            probe.push(*ip);
            at(now.saturating_add(NEIGH_RETRANS_NS));
            true
        });
        if self.entries.len() != before {
            self.generation = self.generation.wrapping_add(1);
        }
        self.pending.retain(|_, p| {
            let end = p.last.saturating_add(NEIGH_FAILED_NS);
            if now >= end {
                return false;
            }
            at(end);
            true
        });
        self.due = next;
        (probe, next)
    }
}

impl Entry {
    fn new(mac: [u8; 6], now: Nanos) -> Entry {
        Entry {
            mac,
            confirmed: now,
            used: Cell::new(false),
            probes: 0,
            probe_sent: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn own_addresses_resolve_to_the_port_mac_without_being_learnt() {
        let mac = [2, 0x76, 10, 0, 0, 1];
        let me = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let t = NeighTable::with_own(mac, [me]);
        assert_eq!(t.get(&me), Some(&mac));
        assert!(t.resolved(&me));
        assert_eq!(t.get(&other), None);
        assert!(!t.resolved(&other));
        // Not a neighbour: not listed, counted or aged.
        assert_eq!((t.peek(&me), t.len()), (None, 0));
    }
}
