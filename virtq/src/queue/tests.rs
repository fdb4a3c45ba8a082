use std::cell::RefCell;
use std::collections::HashMap;

use super::*;
use crate::sim::{Device, Mem};
use crate::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE, VIRTQ_USED_F_NO_NOTIFY};

const GPA: u64 = 0x1_0000_0000;

fn setup_with(size: u16, config: QueueConfig) -> (Mem, SplitQueue, Device) {
    let l = QueueLayout::new(size).unwrap();
    let mem = Mem::new(l.len);
    // SAFETY: mem is l.len bytes, 64-aligned, and outlives q (returned
    // together; the tests drop q first or never touch it after).
    let raw = unsafe { RawMemory::new(mem.ptr, l.len) }.unwrap();
    let q = SplitQueue::new(raw, l, GPA, config).unwrap();
    let dev = Device::new(l, mem.ptr);
    (mem, q, dev)
}

fn setup(size: u16) -> (Mem, SplitQueue, Device) {
    setup_with(size, QueueConfig::POLLED)
}

fn rb(addr: u64, len: u32) -> BufDesc {
    BufDesc::readable(addr, len)
}
fn wb(addr: u64, len: u32) -> BufDesc {
    BufDesc::writable(addr, len)
}

#[test]
fn new_zeroes_the_rings_and_checks_the_memory() {
    let l = QueueLayout::new(4).unwrap();
    let mem = Mem::new(l.len);
    // SAFETY: mem.ptr is l.len bytes.
    unsafe { std::ptr::write_bytes(mem.ptr, 0xee, l.len) };
    // SAFETY: as in setup.
    let raw = unsafe { RawMemory::new(mem.ptr, l.len) }.unwrap();
    let config = QueueConfig {
        event_idx: false,
        interrupts: true,
    };
    let q = SplitQueue::new(raw, l, GPA, config).unwrap();
    let dev = Device::new(l, mem.ptr);
    // Interrupts asked for: the flags stay 0; everything else is 0 too.
    assert!(q.interrupts());
    assert!((0..l.len).step_by(2).all(|o| dev.rd16(o) == 0));
    // SAFETY: as above; a length short of the layout is refused.
    let short = unsafe { RawMemory::new(mem.ptr, l.len - 1) }.unwrap();
    assert_eq!(
        SplitQueue::new(short, l, GPA, QueueConfig::default()).unwrap_err(),
        VirtqError::TooSmall {
            len: l.len - 1,
            needed: l.len
        }
    );
}

#[test]
fn queues_are_polled_until_interrupts_are_asked_for() {
    let (_mem, mut q, dev) = setup(4);
    assert!(!q.interrupts());
    assert_eq!(dev.avail_flags(), VIRTQ_AVAIL_F_NO_INTERRUPT);
    q.set_interrupts(true);
    assert!(q.interrupts());
    assert_eq!(dev.avail_flags(), 0);
    // Adding buffers leaves the flag alone.
    q.add(&[wb(GPA, 16)]).unwrap();
    assert_eq!(dev.avail_flags(), 0);
    q.set_interrupts(false);
    assert_eq!(dev.avail_flags(), VIRTQ_AVAIL_F_NO_INTERRUPT);
    assert_eq!(
        dev.used_event(),
        0,
        "used_event is not used without EVENT_IDX"
    );
}

#[test]
fn chain_round_trip() {
    let (_m, mut q, mut dev) = setup(8);
    assert_eq!(q.desc_gpa(), GPA);
    assert_eq!(q.avail_gpa(), GPA + dev.l.avail as u64);
    assert_eq!(q.used_gpa(), GPA + dev.l.used as u64);
    assert!(q.pop_used().unwrap().is_none());
    assert_eq!(q.next_head(), Some(0));
    let head = q.add(&[rb(0x1000, 24), wb(0x2000, 136)]).unwrap();
    assert_eq!(head, 0);
    assert_eq!(q.num_free(), 6);
    assert_eq!(q.in_flight(), 2);
    assert_eq!(q.avail_idx(), 1);
    let (h, chain) = dev.take().unwrap();
    assert_eq!(h, head);
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[0].addr, 0x1000);
    assert_eq!(chain[0].len, 24);
    assert_eq!(chain[0].flags, VIRTQ_DESC_F_NEXT);
    assert_eq!(chain[0].next, 1);
    assert_eq!(chain[1].addr, 0x2000);
    assert_eq!(chain[1].len, 136);
    assert_eq!(chain[1].flags, VIRTQ_DESC_F_WRITE);
    assert_eq!(chain[1].next, 0, "the last descriptor's next is 0");
    assert!(dev.take().is_none());
    assert!(q.pop_used().unwrap().is_none(), "nothing used yet");
    dev.complete(h as u32, 16);
    assert_eq!(q.pop_used().unwrap(), Some(UsedElem { id: head, len: 16 }));
    assert!(q.pop_used().unwrap().is_none());
    assert_eq!(q.num_free(), 8);
    assert_eq!(q.in_flight(), 0);
    // The freed chain's descriptors are the next used.
    assert_eq!(q.next_head(), Some(head));
}

#[test]
fn wraps_around_many_times_in_and_out_of_order() {
    let size = 8u16;
    let (_m, mut q, mut dev) = setup(size);
    let mut expected: HashMap<u16, (u64, usize)> = HashMap::new();
    let mut serial = 0u64;
    // > 65536 chains: both the ring slots and the 16-bit indices wrap.
    for round in 0..30_000u32 {
        // Fill with chains of 1..=3 descriptors while they fit.
        loop {
            let n = 1 + (serial % 3) as usize;
            let bufs: Vec<BufDesc> = (0..n)
                .map(|k| wb(serial << 8 | k as u64, k as u32 + 1))
                .collect();
            match q.add(&bufs) {
                Ok(h) => {
                    assert!(
                        expected.insert(h, (serial, n)).is_none(),
                        "head reused while in flight"
                    );
                    serial += 1;
                }
                Err(VirtqError::Full { needed, free }) => {
                    assert_eq!(needed, n);
                    assert!((free as usize) < n);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        let mut taken = vec![];
        while let Some((h, chain)) = dev.take() {
            let (s, n) = expected[&h];
            assert_eq!(chain.len(), n);
            for (k, d) in chain.iter().enumerate() {
                assert_eq!(d.addr, s << 8 | k as u64);
            }
            taken.push(h);
        }
        // Complete out of order on odd rounds; some only partially.
        if round % 2 == 1 {
            taken.reverse();
        }
        let keep = if round % 5 == 0 { taken.len() / 2 } else { 0 };
        for &h in &taken[keep..] {
            dev.complete(h as u32, h as u32 + 7);
        }
        let mut got = 0;
        while let Some(u) = q.pop_used().unwrap() {
            assert_eq!(u.len, u.id as u32 + 7);
            assert!(expected.remove(&u.id).is_some());
            got += 1;
        }
        assert_eq!(got, taken.len() - keep);
        for &h in &taken[..keep] {
            dev.complete(h as u32, h as u32 + 7);
        }
        while let Some(u) = q.pop_used().unwrap() {
            assert!(expected.remove(&u.id).is_some());
        }
        assert!(expected.is_empty());
        assert_eq!(q.num_free(), size);
    }
    assert!(serial > 65536, "indices wrapped ({serial} chains)");
    assert_eq!(q.avail_idx(), serial as u16, "the 16-bit index wrapped");
}

#[test]
fn full_queue_is_rejected_and_recovers() {
    let (_m, mut q, mut dev) = setup(4);
    let heads: Vec<u16> = (0..4).map(|i| q.add(&[rb(i, 16)]).unwrap()).collect();
    assert_eq!(heads, [0, 1, 2, 3]);
    assert_eq!(q.next_head(), None);
    assert_eq!(
        q.add(&[rb(9, 16)]),
        Err(VirtqError::Full { needed: 1, free: 0 })
    );
    let (h, _) = dev.take().unwrap();
    assert_eq!(h, heads[0]);
    dev.complete(h as u32, 0);
    assert_eq!(q.pop_used().unwrap().unwrap().id, heads[0]);
    assert_eq!(q.next_head(), Some(heads[0]));
    assert_eq!(
        q.add(&[rb(1, 1), rb(2, 2)]),
        Err(VirtqError::Full { needed: 2, free: 1 })
    );
    // A chain longer than the whole queue.
    assert_eq!(
        q.add(&[rb(1, 1); 5]),
        Err(VirtqError::Full { needed: 5, free: 1 })
    );
    assert_eq!(q.avail_idx(), 4, "refused chains publish nothing");
    assert_eq!(q.add(&[rb(9, 16)]).unwrap(), heads[0]);
    assert_eq!(
        q.add(&[wb(1, 1), rb(2, 2)]),
        Err(VirtqError::ReadableAfterWritable)
    );
    assert_eq!(q.add(&[]), Err(VirtqError::EmptyChain));
    assert_eq!(q.add_any_order(&[]), Err(VirtqError::EmptyChain));
}

#[test]
fn add_any_order_publishes_a_chain_the_spec_forbids() {
    let (_m, mut q, mut dev) = setup(4);
    let h = q.add_any_order(&[wb(1, 8), rb(2, 8)]).unwrap();
    let (head, chain) = dev.take().unwrap();
    assert_eq!(head, h);
    assert_eq!(chain[0].flags, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT);
    assert_eq!(chain[1].flags, 0);
}

#[test]
fn bad_used_ids_and_indices_are_errors_not_panics() {
    let (_m, mut q, mut dev) = setup(4);
    let h = q.add(&[rb(1, 1)]).unwrap();
    let h2 = q.add(&[rb(1, 1), wb(2, 2)]).unwrap();
    dev.take().unwrap();
    dev.take().unwrap();
    // Never made available; not a head (the second descriptor of h2's
    // chain); the queue size; far out; the largest u32.
    for bad in [3, u32::from(h2) + 1, 4, 1000, u32::MAX] {
        dev.complete(bad, 0);
        assert_eq!(q.pop_used(), Err(VirtqError::BadUsedId(bad)));
    }
    assert_eq!(q.num_free(), 1, "nothing freed by bad entries");
    dev.complete(h as u32, 5);
    assert_eq!(q.pop_used().unwrap(), Some(UsedElem { id: h, len: 5 }));
    dev.complete(h as u32, 5); // returned twice
    assert_eq!(q.pop_used(), Err(VirtqError::BadUsedId(h as u32)));
    assert_eq!(q.num_free(), 2);
    // The used index racing far ahead: an error each time, nothing reaped.
    dev.set_used_idx(200);
    for _ in 0..2 {
        assert_eq!(
            q.pop_used(),
            Err(VirtqError::BadUsedIdx {
                used: 200,
                ahead: 200 - 7,
                size: 4
            })
        );
    }
    // Behind (a device that moved it back): as far ahead as 65535.
    dev.set_used_idx(6);
    assert!(matches!(
        q.pop_used(),
        Err(VirtqError::BadUsedIdx { ahead: 65535, .. })
    ));
    // Honest again: the queue goes on.
    dev.set_used_idx(7);
    assert_eq!(q.pop_used(), Ok(None));
    assert_eq!(q.in_flight(), 2, "h2's chain still with the device");
}

#[test]
fn notification_suppression_is_honoured() {
    let (_m, mut q, mut dev) = setup(4);
    assert!(q.wants_notify_next());
    q.add(&[rb(1, 1)]).unwrap();
    assert!(q.needs_notify());
    dev.set_used_flags(VIRTQ_USED_F_NO_NOTIFY);
    q.add(&[rb(1, 1)]).unwrap();
    assert!(!q.needs_notify());
    assert!(!q.wants_notify_next());
    // Without EVENT_IDX avail_event means nothing.
    dev.set_avail_event(2);
    assert!(!q.needs_notify());
}

#[test]
fn event_idx_kicks_when_the_avail_index_passes_avail_event() {
    let config = QueueConfig {
        event_idx: true,
        interrupts: true,
    };
    let (_m, mut q, mut dev) = setup_with(8, config);
    // The flags mean nothing under EVENT_IDX (and stay 0).
    dev.set_used_flags(VIRTQ_USED_F_NO_NOTIFY);
    assert_eq!(dev.avail_flags(), 0);
    // avail_event 0: the first chain (index 0 -> 1) passes it.
    assert!(q.wants_notify_next());
    q.add(&[rb(1, 1)]).unwrap();
    assert!(q.needs_notify());
    // The device wants to hear at index 3 only: 1 -> 2 no, 2 -> 3 no,
    // 3 -> 4 yes; asked again with nothing added: no.
    dev.set_avail_event(3);
    q.add(&[rb(1, 1)]).unwrap();
    assert!(!q.needs_notify());
    q.add(&[rb(1, 1)]).unwrap();
    assert!(!q.needs_notify());
    assert!(q.wants_notify_next());
    q.add(&[rb(1, 1)]).unwrap();
    assert!(q.needs_notify());
    assert!(!q.needs_notify(), "nothing added since");
    // Several chains between two decisions: one kick if any passed it.
    dev.set_avail_event(5);
    q.add(&[rb(1, 1)]).unwrap(); // 4 -> 5
    q.add(&[rb(1, 1)]).unwrap(); // 5 -> 6: passes 5
    assert!(q.needs_notify());
    // An event behind the window: no kick.
    dev.set_avail_event(4);
    for _ in 0..2 {
        q.add(&[rb(1, 1)]).unwrap();
    }
    assert!(!q.needs_notify());
}

#[test]
fn event_idx_decisions_across_the_16_bit_wrap() {
    let config = QueueConfig {
        event_idx: true,
        interrupts: false,
    };
    let (_m, mut q, mut dev) = setup_with(4, config);
    // Walk the avail index to 65534 one chain at a time, the device
    // returning each, never wanting a kick (its event stays 32768 behind).
    let mut kicks = 0;
    for i in 0..65534u32 {
        dev.set_avail_event((i as u16).wrapping_add(32768));
        let h = q.add(&[rb(1, 1)]).unwrap();
        if q.needs_notify() {
            kicks += 1;
        }
        dev.take().unwrap();
        dev.complete(h.into(), 0);
        assert!(q.pop_used().unwrap().is_some());
    }
    assert_eq!(kicks, 0);
    assert_eq!(q.avail_idx(), 65534);
    // 65534 -> 0 -> 1 with the device asking for index 65535, then 0.
    dev.set_avail_event(65535);
    q.add(&[rb(1, 1)]).unwrap(); // 65534 -> 65535
    assert!(!q.needs_notify());
    q.add(&[rb(1, 1)]).unwrap(); // 65535 -> 0: passes 65535
    assert_eq!(q.avail_idx(), 0);
    assert!(q.needs_notify());
    dev.set_avail_event(0);
    q.add(&[rb(1, 1)]).unwrap(); // 0 -> 1: passes 0
    assert!(q.needs_notify());
}

#[test]
fn event_idx_interrupts_are_asked_for_with_used_event() {
    let config = QueueConfig {
        event_idx: true,
        interrupts: false,
    };
    let (_m, mut q, mut dev) = setup_with(4, config);
    assert_eq!(dev.avail_flags(), 0, "flags stay 0 under EVENT_IDX");
    for _ in 0..3 {
        let h = q.add(&[rb(1, 1)]).unwrap();
        dev.take().unwrap();
        dev.complete(h.into(), 0);
        q.pop_used().unwrap().unwrap();
    }
    q.set_interrupts(true);
    assert!(q.interrupts());
    assert_eq!(dev.used_event(), 3, "interrupt at the next used buffer");
    assert_eq!(dev.avail_flags(), 0);
    q.set_interrupts(false);
    assert!(!q.interrupts());
    assert_eq!(dev.used_event(), 3, "left alone");
    assert_eq!(dev.avail_flags(), 0);
}

/// One access of a [`Trace`]d memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum A {
    R16(usize),
    R32(usize),
    W16(usize, u16),
    W32(usize, u32),
    W64(usize, u64),
    Acquire(usize),
    Release(usize, u16),
    Zero(usize, usize),
    Mb,
}

/// Ring memory that records every access, in order, on top of real memory.
struct Trace {
    inner: RawMemory,
    log: RefCell<Vec<A>>,
}

impl Trace {
    fn take(&self) -> Vec<A> {
        std::mem::take(&mut self.log.borrow_mut())
    }
}

// SAFETY: every access is passed on to `inner` with the same arguments.
unsafe impl RingMemory for Trace {
    fn len(&self) -> usize {
        self.inner.len()
    }
    unsafe fn read_u16(&self, off: usize) -> u16 {
        self.log.borrow_mut().push(A::R16(off));
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.read_u16(off) }
    }
    unsafe fn read_u32(&self, off: usize) -> u32 {
        self.log.borrow_mut().push(A::R32(off));
        // SAFETY: as above.
        unsafe { self.inner.read_u32(off) }
    }
    unsafe fn write_u16(&self, off: usize, v: u16) {
        self.log.borrow_mut().push(A::W16(off, v));
        // SAFETY: as above.
        unsafe { self.inner.write_u16(off, v) }
    }
    unsafe fn write_u32(&self, off: usize, v: u32) {
        self.log.borrow_mut().push(A::W32(off, v));
        // SAFETY: as above.
        unsafe { self.inner.write_u32(off, v) }
    }
    unsafe fn write_u64(&self, off: usize, v: u64) {
        self.log.borrow_mut().push(A::W64(off, v));
        // SAFETY: as above.
        unsafe { self.inner.write_u64(off, v) }
    }
    unsafe fn load_u16_acquire(&self, off: usize) -> u16 {
        self.log.borrow_mut().push(A::Acquire(off));
        // SAFETY: as above.
        unsafe { self.inner.load_u16_acquire(off) }
    }
    unsafe fn store_u16_release(&self, off: usize, v: u16) {
        self.log.borrow_mut().push(A::Release(off, v));
        // SAFETY: as above.
        unsafe { self.inner.store_u16_release(off, v) }
    }
    unsafe fn zero(&self, off: usize, len: usize) {
        self.log.borrow_mut().push(A::Zero(off, len));
        // SAFETY: as above.
        unsafe { self.inner.zero(off, len) }
    }
    fn full_barrier(&self) {
        self.log.borrow_mut().push(A::Mb);
        self.inner.full_barrier();
    }
}

/// The exact accesses, in order, of each operation: the on-ring behaviour
/// every driver of the crate relies on (what the guest driver, the test
/// frontend and the doorbell ring did before they shared this queue).
#[test]
fn every_operation_makes_exactly_its_accesses_in_order() {
    let l = QueueLayout::new(4).unwrap();
    let mem = Mem::new(l.len);
    // SAFETY: as in setup.
    let inner = unsafe { RawMemory::new(mem.ptr, l.len) }.unwrap();
    let trace = Trace {
        inner,
        log: RefCell::new(Vec::new()),
    };
    let mut q = SplitQueue::new(trace, l, GPA, QueueConfig::POLLED).unwrap();
    let mut dev = Device::new(l, mem.ptr);
    let t = |q: &SplitQueue<Trace>| q.ring().memory().take();
    let (avail, used) = (l.avail, l.used);
    assert_eq!(
        t(&q),
        [A::Zero(0, l.len), A::W16(avail, VIRTQ_AVAIL_F_NO_INTERRUPT)]
    );

    // add: each descriptor field by field, the ring entry, then the index
    // with release order; no read, no barrier.
    q.add(&[rb(0xa000, 8), wb(0xb000, 64)]).unwrap();
    assert_eq!(
        t(&q),
        [
            A::W64(0, 0xa000),
            A::W32(8, 8),
            A::W16(12, VIRTQ_DESC_F_NEXT),
            A::W16(14, 1),
            A::W64(16, 0xb000),
            A::W32(24, 64),
            A::W16(28, VIRTQ_DESC_F_WRITE),
            A::W16(30, 0),
            A::W16(avail + 4, 0),
            A::Release(avail + 2, 1),
        ]
    );
    // The kick decision: the full barrier, then the device's flag.
    assert!(q.needs_notify());
    assert_eq!(t(&q), [A::Mb, A::R16(used)]);
    // A query reads the flag alone.
    assert!(q.wants_notify_next());
    assert_eq!(t(&q), [A::R16(used)]);
    // Nothing used: the used index only (acquire).
    assert_eq!(q.pop_used(), Ok(None));
    assert_eq!(t(&q), [A::Acquire(used + 2)]);
    // Used: the index (acquire), then the entry's id and len.
    dev.take().unwrap();
    dev.complete(0, 3);
    assert_eq!(q.pop_used(), Ok(Some(UsedElem { id: 0, len: 3 })));
    assert_eq!(
        t(&q),
        [A::Acquire(used + 2), A::R32(used + 4), A::R32(used + 8)]
    );
    // Interrupts: the flag, then the full barrier.
    q.set_interrupts(true);
    assert_eq!(t(&q), [A::W16(avail, 0), A::Mb]);
}

#[test]
fn event_idx_operations_touch_the_event_fields() {
    let l = QueueLayout::new(4).unwrap();
    let mem = Mem::new(l.len);
    // SAFETY: as in setup.
    let inner = unsafe { RawMemory::new(mem.ptr, l.len) }.unwrap();
    let trace = Trace {
        inner,
        log: RefCell::new(Vec::new()),
    };
    let config = QueueConfig {
        event_idx: true,
        interrupts: true,
    };
    let mut q = SplitQueue::new(trace, l, GPA, config).unwrap();
    let t = |q: &SplitQueue<Trace>| q.ring().memory().take();
    assert_eq!(t(&q), [A::Zero(0, l.len)], "flags stay 0");
    q.add(&[rb(1, 1)]).unwrap();
    t(&q);
    assert!(q.needs_notify());
    assert_eq!(t(&q), [A::Mb, A::R16(l.avail_event())]);
    q.set_interrupts(true);
    assert_eq!(t(&q), [A::W16(l.used_event(), 0), A::Mb]);
}
