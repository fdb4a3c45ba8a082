//! Doorbell records: work requests without a doorbell while the device
//! polls (device spec §5.x.6.9, "Doorbell records"; issue 10).
//!
//! A `DB_SQ` or `DB_RQ` doorbell costs a driver a virtqueue chain
//! (descriptor, avail entry, maybe a kick) and the device a pop, a read and
//! a used entry: a good part of a small message's cost. A QP created with
//! [`abi::QP_F_SQ_RECORD`] also writes its SQ producer index into its QP
//! record ([`abi::QP_REC_SQ_PI`]), one with [`abi::QP_F_RQ_RECORD`] its RQ
//! producer index ([`abi::QP_REC_RQ_PI`]), as mlx5's doorbell records do.
//! While the device polls (the daemon's adaptive polling, its
//! notifications off), a QP that rang is **watched**: the device sets
//! [`abi::QP_REC_POLLED`] in its record and reads the producer indices
//! there every polling round, and the driver, which reads that flag after
//! writing an index (a full barrier between), leaves the doorbell out.
//!
//! When polling ends the device clears the flag of every watched QP, then
//! (after a full barrier) reads each record once more and takes what it
//! finds — virtio's notification suppression (virtio 1.2 §2.7.10: enable,
//! then check once more), the same two-sided pattern: either the driver
//! sees the flag cleared and rings, or the device sees its index.
//!
//! A producer index read from a record goes through the checks of a
//! doorbell's ([`super::producer_index_ok`]); one outside the window is
//! ignored and counted in `doorbells_ignored`, once per value written.
//! A doorbell that a record overtook (its index is already known) is
//! harmless and not counted. At most [`WATCH_MAX`] QPs are watched; the
//! others ring as before. A QP moved to RESET or destroyed is no longer
//! watched.

use std::sync::atomic::{fence, Ordering};

use super::{Counter, Device, Nanos};
use crate::abi;
use crate::mem::DmaMemory;

/// Most QPs whose records a device reads while it polls (each costs one
/// or two 4-byte reads of driver memory per polling round).
pub const WATCH_MAX: usize = 64;

/// A watched QP: its number and the producer indices last read or rung
/// (`None` for a queue without a record).
#[derive(Debug, Clone, Copy)]
struct Watched {
    qpn: u32,
    sq: Option<u32>,
    rq: Option<u32>,
}

/// The QPs whose producer indices the device reads from their record.
#[derive(Debug, Default)]
pub(super) struct Watch {
    /// The device polls: doorbells start watching.
    polling: bool,
    qps: Vec<Watched>,
}

impl Watch {
    /// Stops watching QP `qpn` (destroyed: its record may be gone).
    pub(super) fn forget(&mut self, qpn: u32) {
        self.qps.retain(|w| w.qpn != qpn);
    }
}

impl Device {
    /// The device polls from now on (the daemon's polling session began):
    /// a `DB_SQ` or `DB_RQ` doorbell for a QP with a record of that queue
    /// starts watching it. See the module.
    pub fn begin_record_polling(&mut self) {
        self.watch.polling = true;
    }

    /// Whether any QP's record is watched ([`Device::poll_records`] has
    /// something to read).
    pub fn watching_records(&self) -> bool {
        !self.watch.qps.is_empty()
    }

    /// One polling round over the watched records: a producer index that
    /// changed is taken as a `DB_SQ` or `DB_RQ` doorbell with that index.
    /// Whether one changed.
    pub fn poll_records(&mut self, mem: &dyn DmaMemory, now: Nanos) -> bool {
        let mut work = false;
        let mut i = 0;
        while let Some(&w) = self.watch.qps.get(i) {
            let Some((sq, rq)) = self.read_record(mem, &w) else {
                // Destroyed, or its record unreadable: nothing to watch.
                self.watch.qps.swap_remove(i);
                continue;
            };
            self.watch.qps[i].sq = sq;
            self.watch.qps[i].rq = rq;
            work |= self.take_changes(mem, &w, sq, rq, now);
            i += 1;
        }
        work
    }

    /// Polling ends: every watched QP's [`abi::QP_REC_POLLED`] cleared,
    /// then, after a full barrier, its record read once more (what the
    /// driver wrote before it could see the flag cleared). Whether a
    /// record held new work.
    pub fn end_record_polling(&mut self, mem: &dyn DmaMemory, now: Nanos) -> bool {
        self.watch.polling = false;
        let watched = std::mem::take(&mut self.watch.qps);
        for w in &watched {
            self.set_polled(mem, w.qpn, false);
        }
        // Pairs with the driver's barrier between writing its index and
        // reading the flag.
        fence(Ordering::SeqCst);
        let mut work = false;
        for w in watched {
            if let Some((sq, rq)) = self.read_record(mem, &w) {
                work |= self.take_changes(mem, &w, sq, rq, now);
            }
        }
        work
    }

    /// After QP `qpn` rang `kind` (`DB_SQ` or `DB_RQ`) with `index`
    /// (accepted): watch its record if the device polls, the QP has a
    /// record of that queue and there is room.
    pub(super) fn watch_queue(&mut self, mem: &dyn DmaMemory, kind: u16, qpn: u32, index: u32) {
        let Some(qp) = self.qps.get(qpn) else {
            return;
        };
        let recorded = if kind == abi::DB_SQ {
            qp.sq_record
        } else {
            qp.rq_record
        };
        if !self.watch.polling
            || !recorded
            || self.watch.qps.len() >= WATCH_MAX
            || self.watch.qps.iter().any(|w| w.qpn == qpn)
        {
            return;
        }
        // What the record holds now is known: the doorbell just rung, the
        // other queue's index as the device has it.
        let w = Watched {
            qpn,
            sq: qp.sq_record.then_some(if kind == abi::DB_SQ {
                index
            } else {
                qp.req.sq_pi
            }),
            rq: qp.rq_record.then_some(if kind == abi::DB_RQ {
                index
            } else {
                qp.resp.rq_pi
            }),
        };
        if self.set_polled(mem, qpn, true) {
            self.watch.qps.push(w);
        }
    }

    /// Stops watching QP `qpn`'s record, its flag cleared (a move to
    /// RESET: the driver's indices there restart at 0 and are not read
    /// until the QP rings again).
    pub(super) fn unwatch(&mut self, mem: &dyn DmaMemory, qpn: u32) {
        if self.watch.qps.iter().any(|w| w.qpn == qpn) {
            self.watch.forget(qpn);
            self.set_polled(mem, qpn, false);
        }
    }

    /// Writes QP `qpn`'s record flags: [`abi::QP_REC_POLLED`] or 0.
    /// Whether it could.
    fn set_polled(&self, mem: &dyn DmaMemory, qpn: u32, polled: bool) -> bool {
        let Some(at) = self
            .qps
            .get(qpn)
            .and_then(|q| q.record.checked_add(abi::QP_REC_FLAGS))
        else {
            return false;
        };
        let flags = if polled { abi::QP_REC_POLLED } else { 0 };
        mem.store_u32(at, flags).is_ok()
    }

    /// The SQ and RQ producer indices in `w`'s record (those it has);
    /// `None` when the QP is gone or the record unreadable.
    fn read_record(&self, mem: &dyn DmaMemory, w: &Watched) -> Option<(Option<u32>, Option<u32>)> {
        let record = self.qps.get(w.qpn)?.record;
        // One 32-bit load each: an index the driver stores meanwhile is
        // seen old or new, never torn (a torn one could lie inside the
        // window and name WQEs not written).
        let read = |offset: u64| mem.load_u32(record.checked_add(offset)?).ok();
        let sq = match w.sq {
            Some(_) => Some(read(abi::QP_REC_SQ_PI)?),
            None => None,
        };
        let rq = match w.rq {
            Some(_) => Some(read(abi::QP_REC_RQ_PI)?),
            None => None,
        };
        // The WQEs below the indices are read after them (the driver
        // wrote them before, with a release barrier).
        fence(Ordering::Acquire);
        Some((sq, rq))
    }

    /// Takes the indices `sq` and `rq` read from `w`'s record where they
    /// differ from what `w` last had: receive WQEs first (a SEND the SQ's
    /// new WQEs answer may need them). Whether one differed.
    fn take_changes(
        &mut self,
        mem: &dyn DmaMemory,
        w: &Watched,
        sq: Option<u32>,
        rq: Option<u32>,
        now: Nanos,
    ) -> bool {
        let mut work = false;
        for (kind, new, old) in [(abi::DB_RQ, rq, w.rq), (abi::DB_SQ, sq, w.sq)] {
            if let Some(index) = new.filter(|&n| Some(n) != old) {
                self.record_doorbell(mem, kind, w.qpn, index, now);
                work = true;
            }
        }
        work
    }

    /// A producer index read from QP `qpn`'s record, handled as a `kind`
    /// doorbell from the QP's own context (counted in `doorbells_ignored`
    /// when outside the window, as one would be).
    fn record_doorbell(
        &mut self,
        mem: &dyn DmaMemory,
        kind: u16,
        qpn: u32,
        index: u32,
        now: Nanos,
    ) {
        self.res.out.stats.count(Counter::records_read, 1);
        if !self.queue_doorbell(mem, kind, qpn, index, now) {
            tracing::debug!(qpn, kind, index, "record index ignored");
            self.res.out.stats.count(Counter::doorbells_ignored, 1);
        }
    }
}
