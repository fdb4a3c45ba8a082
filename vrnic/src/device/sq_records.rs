//! SQ doorbell records: send WQEs without a doorbell while the device polls
//! (device spec §5.x.6.9, "SQ doorbell records"; issue 10).
//!
//! A `DB_SQ` doorbell costs a driver a virtqueue chain (descriptor, avail
//! entry, maybe a kick) and the device a pop, a read and a used entry: a
//! good part of a small message's cost. A QP created with
//! [`abi::QP_F_SQ_RECORD`] also writes its SQ producer index into its QP
//! record ([`abi::QP_REC_SQ_PI`]), as mlx5's doorbell records do. While
//! the device polls (the daemon's adaptive polling, its notifications
//! off), a QP that rang is **watched**: the device sets
//! [`abi::QP_REC_SQ_POLLED`] in its record and reads the producer index
//! there every polling round, and the driver, which reads that flag after
//! writing the index (a full barrier between), leaves the doorbell out.
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
//! harmless and not counted. At most [`SQ_WATCH_MAX`] QPs are watched;
//! the others ring as before. A QP moved to RESET or destroyed is no
//! longer watched.

use std::sync::atomic::{fence, Ordering};

use super::{Device, Nanos};
use crate::abi;
use crate::mem::DmaMemory;

/// Most QPs whose records a device reads while it polls (each costs a
/// 4-byte read of driver memory per polling round).
pub const SQ_WATCH_MAX: usize = 64;

/// The QPs whose SQ producer index the device reads from their record.
#[derive(Debug, Default)]
pub(super) struct SqWatch {
    /// The device polls: doorbells start watching.
    polling: bool,
    /// (QP number, producer index last read or rung).
    qps: Vec<(u32, u32)>,
}

impl SqWatch {
    /// Whether QP `qpn` is watched.
    fn contains(&self, qpn: u32) -> bool {
        self.qps.iter().any(|&(q, _)| q == qpn)
    }

    /// Stops watching QP `qpn` (destroyed: its record may be gone).
    pub(super) fn forget(&mut self, qpn: u32) {
        self.qps.retain(|&(q, _)| q != qpn);
    }
}

impl Device {
    /// The device polls from now on (the daemon's polling session began):
    /// a `DB_SQ` doorbell for a QP with [`abi::QP_F_SQ_RECORD`] starts
    /// watching its record. See the module.
    pub fn begin_sq_polling(&mut self) {
        self.sq_watch.polling = true;
    }

    /// Whether any QP's record is watched ([`Device::poll_sq_records`] has
    /// something to read).
    pub fn sq_watching(&self) -> bool {
        !self.sq_watch.qps.is_empty()
    }

    /// One polling round over the watched records: a producer index that
    /// changed is taken as a `DB_SQ` doorbell with that index. Whether one
    /// changed.
    pub fn poll_sq_records(&mut self, mem: &dyn DmaMemory, now: Nanos) -> bool {
        let mut work = false;
        let mut i = 0;
        while let Some(&(qpn, last)) = self.sq_watch.qps.get(i) {
            let Some(pi) = self.sq_record_index(mem, qpn) else {
                // Destroyed, or its record unreadable: nothing to watch.
                self.sq_watch.qps.swap_remove(i);
                continue;
            };
            if pi != last {
                self.sq_watch.qps[i].1 = pi;
                self.record_doorbell(mem, qpn, pi, now);
                work = true;
            }
            i += 1;
        }
        work
    }

    /// Polling ends: every watched QP's [`abi::QP_REC_SQ_POLLED`] cleared,
    /// then, after a full barrier, its record read once more (what the
    /// driver wrote before it could see the flag cleared). Whether a
    /// record held new work.
    pub fn end_sq_polling(&mut self, mem: &dyn DmaMemory, now: Nanos) -> bool {
        self.sq_watch.polling = false;
        let watched = std::mem::take(&mut self.sq_watch.qps);
        for &(qpn, _) in &watched {
            self.set_sq_polled(mem, qpn, false);
        }
        // Pairs with the driver's barrier between writing its index and
        // reading the flag.
        fence(Ordering::SeqCst);
        let mut work = false;
        for (qpn, last) in watched {
            match self.sq_record_index(mem, qpn) {
                Some(pi) if pi != last => {
                    self.record_doorbell(mem, qpn, pi, now);
                    work = true;
                }
                _ => {}
            }
        }
        work
    }

    /// After QP `qpn` rang `DB_SQ` with `index` (accepted): watch its
    /// record if the device polls, the QP asked for it and there is room.
    pub(super) fn watch_sq(&mut self, mem: &dyn DmaMemory, qpn: u32, index: u32) {
        if !self.sq_watch.polling
            || self.sq_watch.qps.len() >= SQ_WATCH_MAX
            || !self.qps.get(qpn).is_some_and(|q| q.sq_record)
            || self.sq_watch.contains(qpn)
        {
            return;
        }
        if self.set_sq_polled(mem, qpn, true) {
            self.sq_watch.qps.push((qpn, index));
        }
    }

    /// Stops watching QP `qpn`'s record, its flag cleared (a move to
    /// RESET: the driver's index there restarts at 0 and is not read until
    /// the QP rings again).
    pub(super) fn unwatch_sq(&mut self, mem: &dyn DmaMemory, qpn: u32) {
        if self.sq_watch.contains(qpn) {
            self.sq_watch.forget(qpn);
            self.set_sq_polled(mem, qpn, false);
        }
    }

    /// Writes QP `qpn`'s record flags: [`abi::QP_REC_SQ_POLLED`] or 0.
    /// Whether it could.
    fn set_sq_polled(&self, mem: &dyn DmaMemory, qpn: u32, polled: bool) -> bool {
        let Some(at) = self
            .qps
            .get(qpn)
            .and_then(|q| q.record.checked_add(abi::QP_REC_FLAGS))
        else {
            return false;
        };
        let flags = if polled { abi::QP_REC_SQ_POLLED } else { 0 };
        mem.write(at, &flags.to_le_bytes()).is_ok()
    }

    /// The SQ producer index in QP `qpn`'s record; `None` when the QP is
    /// gone or the record unreadable.
    fn sq_record_index(&self, mem: &dyn DmaMemory, qpn: u32) -> Option<u32> {
        let at = self.qps.get(qpn)?.record.checked_add(abi::QP_REC_SQ_PI)?;
        let mut b = [0u8; 4];
        mem.read(at, &mut b).ok()?;
        // The WQEs below the index are read after it (the driver wrote
        // them before, with a release barrier).
        fence(Ordering::Acquire);
        Some(u32::from_le_bytes(b))
    }

    /// A producer index read from QP `qpn`'s record, handled as a `DB_SQ`
    /// doorbell from the QP's own context (counted in `doorbells_ignored`
    /// when outside the window, as one would be).
    fn record_doorbell(&mut self, mem: &dyn DmaMemory, qpn: u32, index: u32, now: Nanos) {
        self.res.out.stats.sq_records_read += 1;
        if !self.queue_doorbell(mem, abi::DB_SQ, qpn, index, now) {
            tracing::debug!(qpn, index, "SQ record index ignored");
            self.res.out.stats.doorbells_ignored += 1;
        }
    }
}
