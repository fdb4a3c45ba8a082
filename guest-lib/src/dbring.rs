//! A doorbell virtqueue several processes post to directly: the guest
//! agent's doorbell queue lives in a shared huge-page memfd, and every
//! program it serves maps it, so a doorbell costs a program no hop through
//! the agent (device spec §5.x.6.9 is unchanged: the device sees one
//! driver's split virtqueue, virtio 1.2 §2.7).
//!
//! The queue is used *in order*: descriptor `i` permanently describes the
//! 16-byte slot `i` (written once, by the agent), and the chain made
//! available as avail index `n` is always descriptor `n mod size`. The
//! device returns doorbells in order, so a producer needs no free list:
//! slot `n mod size` is free once `n - used.idx < size`. Producers take a
//! lock in the shared memory ([`DbRingLayout::lock`]: the poster's thread
//! ID, 0 when free), write the slot, the avail entry and the avail index,
//! and release it; a lock whose holder no longer exists is taken over
//! (its half-written slot is simply written again: the avail index only
//! moves at the end).
//!
//! Processes sharing the ring are trusted alike: they write the `ctx` of
//! their doorbells (device spec §5.x.6.13; the device ignores and counts,
//! in `doorbells_foreign`, one naming a queue its `ctx` does not own, but
//! cannot tell a forged `ctx`), and a lock held by a live thread is never
//! taken over: a waiter gives up at its timeout
//! ([`TransportError::Timeout`]), so a holder that never lets go makes
//! others' posts fail, never hang. Taking over a live holder's lock would
//! let two producers write one slot and lose a doorbell whenever a holder
//! is merely preempted, and would not stop a hostile process anyway: it
//! maps the whole ring and can write its indices directly. Isolation
//! between hostile programs needs a kernel driver (issue 27).
//!
//! The ring's fields are reached through `vrnic-virtq`'s [`Ring`], the
//! accesses (and memory orders) every driver of vrnic shares; what is
//! this module's own is the lock, the slots and the in-order use.

use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vrnic_abi::{self as abi, Pod};
use vrnic_virtq::{QueueLayout, RawMemory, Ring};

use crate::transport::TransportError;

/// Bytes of one doorbell slot.
pub const SLOT: usize = size_of::<abi::Doorbell>();

/// Where the parts of a shared doorbell ring lie in its region (bytes from
/// the region's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbRingLayout {
    /// Queue size (descriptors), a power of two.
    pub size: u16,
    /// Descriptor table (16 bytes each).
    pub desc: u32,
    /// Available ring.
    pub avail: u32,
    /// Used ring.
    pub used: u32,
    /// The `size` doorbell slots.
    pub slots: u32,
    /// The producers' lock (a `u32`).
    pub lock: u32,
    /// Bytes the region must have.
    pub len: u32,
}

impl DbRingLayout {
    /// The layout for `size` descriptors: the split ring first (as
    /// [`QueueLayout`] lays it out), then the slots, then the lock. `None`
    /// for a size that is not a power of two in 1..=32768.
    pub fn new(size: u16) -> Option<DbRingLayout> {
        let q = QueueLayout::new(size).ok()?;
        let slots = q.len.next_multiple_of(64);
        let lock = (slots + SLOT * size as usize).next_multiple_of(64);
        Some(DbRingLayout {
            size,
            desc: q.desc as u32,
            avail: q.avail as u32,
            used: q.used as u32,
            slots: slots as u32,
            lock: lock as u32,
            len: (lock + 64) as u32,
        })
    }

    /// Encodes the layout (28 bytes, little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(28);
        v.extend_from_slice(&u32::from(self.size).to_le_bytes());
        for x in [
            self.desc, self.avail, self.used, self.slots, self.lock, self.len,
        ] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    /// Decodes [`DbRingLayout::encode`]; `None` when malformed or not what
    /// [`DbRingLayout::new`] gives for its size (nothing else is mapped).
    pub fn decode(b: &[u8]) -> Option<DbRingLayout> {
        let w = |i: usize| -> Option<u32> {
            Some(u32::from_le_bytes(
                b.get(4 * i..4 * i + 4)?.try_into().ok()?,
            ))
        };
        let l = DbRingLayout::new(u16::try_from(w(0)?).ok()?)?;
        let got = [w(1)?, w(2)?, w(3)?, w(4)?, w(5)?, w(6)?];
        (got == [l.desc, l.avail, l.used, l.slots, l.lock, l.len]).then_some(l)
    }
}

/// How a producer notifies the device.
#[derive(Debug, Clone, Copy)]
enum Notify {
    /// A virtio-pci notification register (a VM): the queue index is
    /// written to it.
    Register { reg: *mut u16, queue: u16 },
    /// A vhost-user kick eventfd (a daemon's function): 1 is added to it.
    EventFd(std::os::fd::RawFd),
}

/// A producer's view of a shared doorbell ring: the mapped region and how
/// the device is notified. See the [module documentation](self).
#[derive(Debug)]
pub struct DbRing {
    /// The split ring at the region's start.
    ring: Ring,
    base: *mut u8,
    layout: DbRingLayout,
    notify: Notify,
}

// SAFETY: the ring is plain shared memory; access goes through the lock.
unsafe impl Send for DbRing {}

thread_local! {
    // SAFETY: gettid has no preconditions.
    static TID: u32 = unsafe { libc::gettid() as u32 };
}

/// This thread's ID, from a thread-local: one `gettid(2)` per thread, not
/// one per doorbell (a system call costs microseconds in a TCG guest). A
/// forked child inherits its parent's value; as with `ibv_fork_init(3)`,
/// a child must not use its parent's device contexts.
fn tid() -> u32 {
    TID.with(|t| *t)
}

/// A deadline computed on first need: the fast path (lock free, a slot
/// free) reads no clock.
struct LazyDeadline {
    timeout: Duration,
    at: Option<Instant>,
}

impl LazyDeadline {
    fn new(timeout: Duration) -> Self {
        LazyDeadline { timeout, at: None }
    }

    /// Whether the deadline has passed (the first call starts it).
    fn passed(&mut self) -> bool {
        let now = Instant::now();
        now >= *self.at.get_or_insert(now + self.timeout)
    }
}

fn alive(tid: u32) -> bool {
    // SAFETY: signal 0 only checks that the task exists.
    let r = unsafe { libc::kill(tid as i32, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

impl DbRing {
    /// A ring over `base` (a mapping of at least `layout.len` bytes, shared
    /// with the device and the other producers) notifying through the
    /// 16-bit register at `notify` with queue index `queue`. Errors:
    /// `base` is not 16-byte aligned ([`TransportError::Io`]).
    ///
    /// # Safety
    /// `base` (`layout.len` bytes) and `notify` stay mapped for the ring's
    /// life; `base` is 64-byte aligned.
    pub unsafe fn new(
        base: *mut u8,
        layout: DbRingLayout,
        notify: *mut u16,
        queue: u16,
    ) -> Result<DbRing, TransportError> {
        // SAFETY: the caller's guarantees.
        unsafe { Self::with(base, layout, Notify::Register { reg: notify, queue }) }
    }

    /// A ring over `base` (as [`DbRing::new`]) notifying a vhost-user
    /// backend through its kick eventfd `kick` (vhost-user spec,
    /// `SET_VRING_KICK`).
    ///
    /// # Safety
    /// `base` (`layout.len` bytes) stays mapped and `kick` open for the
    /// ring's life; `base` is 64-byte aligned.
    pub unsafe fn with_eventfd(
        base: *mut u8,
        layout: DbRingLayout,
        kick: std::os::fd::RawFd,
    ) -> Result<DbRing, TransportError> {
        // SAFETY: the caller's guarantees.
        unsafe { Self::with(base, layout, Notify::EventFd(kick)) }
    }

    /// # Safety
    /// As [`DbRing::new`].
    unsafe fn with(
        base: *mut u8,
        layout: DbRingLayout,
        notify: Notify,
    ) -> Result<DbRing, TransportError> {
        let q = QueueLayout::new(layout.size)?;
        // SAFETY: the split ring is the region's first q.len bytes (q.len
        // <= layout.slots < layout.len), mapped for the ring's life.
        let mem = unsafe { RawMemory::new(base, q.len) }?;
        Ok(DbRing {
            ring: Ring::new(mem, q)?,
            base,
            layout,
            notify,
        })
    }

    fn at<T>(&self, off: u32) -> *mut T {
        // SAFETY: every offset used is inside the layout's region.
        unsafe { self.base.add(off as usize).cast() }
    }

    fn lock_word(&self) -> &AtomicU32 {
        // SAFETY: lock is a 64-aligned offset in the region.
        unsafe { &*self.at::<AtomicU32>(self.layout.lock) }
    }

    /// Writes descriptor `i` → slot `i` for every `i` (the agent, once,
    /// before the queue is enabled). `slots_gpa`: the slots' device address.
    pub fn init_descriptors(&self, slots_gpa: u64) {
        for i in 0..self.layout.size {
            let addr = slots_gpa + u64::from(i) * SLOT as u64;
            self.ring.write_desc(i, addr, SLOT as u32, 0, 0);
        }
    }

    fn lock(&self, deadline: &mut LazyDeadline) -> Result<(), TransportError> {
        let me = tid();
        let w = self.lock_word();
        let mut spins = 0u32;
        loop {
            match w.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(owner) if owner != me && !alive(owner) => {
                    // The holder died inside its critical section.
                    if w.compare_exchange(owner, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Ok(());
                    }
                }
                Err(_) => {}
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                if deadline.passed() {
                    return Err(TransportError::Timeout(0));
                }
                // Let a holder preempted inside its critical section finish.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Posts `db` and notifies the device unless it suppressed
    /// notifications. Waits (at most `timeout`) for the lock and, when all
    /// `size` slots are with the device, for one to come back.
    /// Errors: [`TransportError::Timeout`].
    pub fn post(&self, db: &abi::Doorbell, timeout: Duration) -> Result<(), TransportError> {
        let mut deadline = LazyDeadline::new(timeout);
        self.lock(&mut deadline)?;
        let r = self.post_locked(db, &mut deadline);
        self.lock_word().store(0, Ordering::Release);
        let n = r?;
        // The index store visible before the device's flag is read
        // (§2.7.10; the ring's queue never negotiates EVENT_IDX).
        self.ring.full_barrier();
        if self.ring.notify_wanted(false, n, n.wrapping_add(1)) {
            match self.notify {
                // SAFETY: `reg` is the mapped notification register.
                Notify::Register { reg, queue } => unsafe {
                    ptr::write_volatile(reg, queue.to_le())
                },
                Notify::EventFd(fd) => {
                    let one = 1u64;
                    // SAFETY: 8 bytes from a live u64 to an eventfd kept
                    // open for the ring's life; a full counter (EAGAIN)
                    // has the device notified already.
                    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
                }
            }
        }
        Ok(())
    }

    /// Writes the slot and the avail entry of index `n` (the avail index
    /// as the lock's holder finds it) and publishes `n + 1`; returns `n`.
    fn post_locked(
        &self,
        db: &abi::Doorbell,
        deadline: &mut LazyDeadline,
    ) -> Result<u16, TransportError> {
        let size = self.layout.size;
        let n = self.ring.avail_idx();
        let mut spins = 0u32;
        while n.wrapping_sub(self.ring.used_idx()) >= size {
            spins += 1;
            if spins.is_multiple_of(64) {
                if deadline.passed() {
                    return Err(TransportError::Timeout(0));
                }
                std::thread::yield_now();
            }
            std::hint::spin_loop();
        }
        let slot = n % size;
        let bytes = db.as_bytes();
        // SAFETY: slot < size: its 16 bytes lie in the region, and the
        // device has returned the slot (checked above).
        unsafe {
            let p = self.at::<u8>(self.layout.slots + SLOT as u32 * u32::from(slot));
            ptr::copy_nonoverlapping(bytes.as_ptr(), p, SLOT);
        }
        // In order: the chain of index n is descriptor n mod size.
        self.ring.set_avail_entry(n, slot);
        // Release: slot and entry are visible before the index.
        self.ring.publish_avail_idx(n.wrapping_add(1));
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU16;

    /// The device's side: stores the used index.
    pub(super) fn set_used_idx(r: &DbRing, v: u16) {
        // SAFETY: used + 2 is the 2-aligned used index in the region.
        unsafe { AtomicU16::from_ptr(r.at::<u16>(r.layout.used + 2)) }
            .store(v.to_le(), Ordering::Release);
    }

    #[test]
    fn layout_round_trips_and_refuses_anything_else() {
        let l = DbRingLayout::new(256).unwrap();
        assert_eq!(DbRingLayout::decode(&l.encode()), Some(l));
        let mut bad = l.encode();
        bad[8] ^= 1;
        assert_eq!(DbRingLayout::decode(&bad), None);
        assert_eq!(DbRingLayout::new(3), None);
        assert!(l.len as usize <= 2 << 20);
    }

    #[test]
    fn posts_in_order_and_waits_for_the_device_when_full() {
        let l = DbRingLayout::new(4).unwrap();
        let mut region = vec![0u64; l.len as usize / 8 + 8];
        let base = region.as_mut_ptr().cast::<u8>();
        let mut notify = 0u16;
        // SAFETY: the region and the register outlive the ring.
        let r = unsafe { DbRing::new(base, l, &mut notify, 1) }.unwrap();
        r.init_descriptors(0x1000);
        for i in 0..4u32 {
            let db = abi::Doorbell {
                kind: abi::DB_SQ,
                handle: 7,
                index: i,
                ..Default::default()
            };
            r.post(&db, Duration::from_millis(100)).unwrap();
        }
        assert_eq!(r.ring.avail_idx(), 4);
        assert_eq!(notify, 1, "notified (no NO_NOTIFY flag)");
        // Full: the device holds all four slots.
        let db = abi::Doorbell::default();
        assert!(matches!(
            r.post(&db, Duration::from_millis(20)),
            Err(TransportError::Timeout(_))
        ));
        // The device returns one: the next post reuses slot 0.
        set_used_idx(&r, 1);
        r.post(&db, Duration::from_millis(100)).unwrap();
        // SAFETY: avail ring entry 0 in the region.
        let e = unsafe { ptr::read_volatile(r.at::<u16>(l.avail + 4)) };
        assert_eq!(e, 0);
        // A lock left by a thread that no longer exists is taken over.
        r.lock_word().store(0x7fff_fff0, Ordering::Relaxed);
        set_used_idx(&r, 2);
        r.post(&db, Duration::from_millis(100)).unwrap();
        drop(region);
    }

    #[test]
    fn a_lock_held_by_a_live_thread_times_out_and_is_left_alone() {
        let l = DbRingLayout::new(4).unwrap();
        let mut region = vec![0u64; l.len as usize / 8 + 8];
        let base = region.as_mut_ptr().cast::<u8>();
        let mut notify = 0u16;
        // SAFETY: the region and the register outlive the ring.
        let r = unsafe { DbRing::new(base, l, &mut notify, 1) }.unwrap();
        r.init_descriptors(0x1000);
        // The holder: another thread, alive until told to end.
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(tid()).unwrap();
            // Returns when the test drops `stop`.
            let _ = stopped.recv();
        });
        let holder = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_ne!(holder, tid());
        r.lock_word().store(holder, Ordering::Relaxed);
        let start = Instant::now();
        let db = abi::Doorbell::default();
        assert!(matches!(
            r.post(&db, Duration::from_millis(50)),
            Err(TransportError::Timeout(_))
        ));
        assert!(start.elapsed() < Duration::from_secs(5), "bounded wait");
        assert_eq!(r.lock_word().load(Ordering::Relaxed), holder, "not stolen");
        assert_eq!(r.ring.avail_idx(), 0);
        assert_eq!(notify, 0, "nothing posted, nothing notified");
        drop(stop);
        t.join().unwrap();
        // Released, the next post goes through.
        r.lock_word().store(0, Ordering::Release);
        r.post(&db, Duration::from_millis(100)).unwrap();
        assert_eq!(r.ring.avail_idx(), 1);
        drop(region);
    }
}

#[cfg(test)]
mod concurrency_tests {
    use super::*;
    use std::sync::Arc;

    /// A region shared by threads standing in for processes, and a device
    /// thread that consumes the ring in order, as the daemon does.
    struct Shared(Vec<u64>);
    // SAFETY: accessed only through atomics and the ring's protocol.
    unsafe impl Send for Shared {}
    // SAFETY: as Send.
    unsafe impl Sync for Shared {}

    #[test]
    fn concurrent_producers_lose_and_reorder_nothing() {
        const PRODUCERS: u32 = 4;
        const EACH: u32 = 5000;
        let l = DbRingLayout::new(8).unwrap();
        let region = Arc::new(Shared(vec![0u64; l.len as usize / 8 + 16]));
        let base = region.0.as_ptr() as *mut u8;
        let notify = base.wrapping_add(l.len as usize).cast::<u16>();
        // SAFETY: the region outlives every ring (joined below).
        let dev = unsafe { DbRing::new(base, l, notify, 1) }.unwrap();
        dev.init_descriptors(0);
        let base_addr = base as usize;
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let _keep = region.clone();
                std::thread::spawn(move || {
                    let _keep = _keep;
                    // SAFETY: the region outlives the thread.
                    let r =
                        unsafe { DbRing::new(base_addr as *mut u8, l, base_addr as *mut u16, 1) }
                            .unwrap();
                    for i in 0..EACH {
                        let db = abi::Doorbell {
                            kind: abi::DB_SQ,
                            handle: p,
                            index: i,
                            ..Default::default()
                        };
                        r.post(&db, Duration::from_secs(10)).unwrap();
                    }
                })
            })
            .collect();
        // The device: takes entries in avail order, reads their slot,
        // returns them in order.
        let mut next = [0u32; PRODUCERS as usize];
        let mut taken = 0u32;
        let deadline = Instant::now() + Duration::from_secs(60);
        while taken < PRODUCERS * EACH {
            assert!(Instant::now() < deadline, "device starved: {taken} taken");
            let avail = dev.ring.avail_idx();
            let used = dev.ring.used_idx();
            if avail == used {
                std::hint::spin_loop();
                continue;
            }
            let slot = used % l.size;
            // SAFETY: entries before avail are complete (release/acquire).
            let head = u16::from_le(unsafe {
                ptr::read_volatile(dev.at::<u16>(l.avail + 4 + 2 * u32::from(slot)))
            });
            assert_eq!(head, slot, "in-order ring");
            let mut b = [0u8; SLOT];
            // SAFETY: slot `head` lies in the region.
            unsafe {
                ptr::copy_nonoverlapping(
                    dev.at::<u8>(l.slots + SLOT as u32 * u32::from(head)),
                    b.as_mut_ptr(),
                    SLOT,
                )
            };
            let db = abi::Doorbell::read_from(&b).unwrap();
            assert_eq!(
                db.index, next[db.handle as usize],
                "producer {} out of order",
                db.handle
            );
            next[db.handle as usize] += 1;
            taken += 1;
            super::tests::set_used_idx(&dev, used.wrapping_add(1));
        }
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(next, [EACH; PRODUCERS as usize]);
        assert_eq!(dev.lock_word().load(Ordering::Relaxed), 0, "lock released");
    }
}
