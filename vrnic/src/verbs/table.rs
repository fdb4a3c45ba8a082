//! The handle table every kind of verbs object lives in (PD, MR, CQ, QP,
//! SRQ, AH): handles allocated cyclically over a whole index space, never
//! two live objects under one handle, lookups in O(1).
//!
//! A handle is `index << key_bits | key`: `index` counts up through
//! `[first, 2^index_bits)` and wraps back to `first`, as Linux rxe's pools
//! allocate (`rxe_pool.c`, `xa_alloc_cyclic`), so a handle freed now is
//! handed out again only after the whole index space has gone round
//! (2^24 allocations for every table of the device); `key` is the
//! caller's (the random "key" byte of an MR key, as rxe's
//! `mr->lkey = index << 8 | key`, see [`crate::verbs::mr`]). An object sits
//! in slot `index mod capacity` (a power of two dividing 2^index_bits), and
//! a lookup compares the full handle stored there, so a stale handle finds
//! nothing even when its slot holds a newer object.

/// The shape of a table's handles and its size limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleSpace {
    /// Lowest index handed out: lower ones are reserved (0 means "none"
    /// in the ABI; QP numbers 0 and 1 are IBTA's QP0 and QP1).
    pub first: u32,
    /// Bits of an index (at most 24 with 8 key bits, 31 without).
    pub index_bits: u32,
    /// Low bits of a handle taken from the caller's key (0 or 8).
    pub key_bits: u32,
    /// Most objects alive at once (the device limit of the kind).
    pub max: usize,
    /// A handle below `first` that only [`HandleTable::insert_fixed`]
    /// places (QP number 1, the GSI QP): its slot is kept for it, so no
    /// handle [`HandleTable::insert_with`] hands out ever takes its place
    /// and it can always be created while fewer than `max` objects live.
    pub fixed: Option<u32>,
}

impl HandleSpace {
    /// Handles `1 ..` of 24 index bits and no key bits, at most `max`
    /// alive: PD, CQ, SRQ and AH numbers.
    pub const fn numbers(max: usize) -> HandleSpace {
        HandleSpace {
            first: 1,
            index_bits: 24,
            key_bits: 0,
            max,
            fixed: None,
        }
    }
}

/// Objects of one kind by handle (see the module documentation).
#[derive(Debug)]
pub struct HandleTable<T> {
    space: HandleSpace,
    /// Slot `index mod slots.len()`: the full handle and the object.
    slots: Vec<Option<(u32, Box<T>)>>,
    /// The slots in use, ascending: what the iterators visit, so a walk
    /// over a table of 1024 slots holding one QP (the engine's every poll)
    /// does not look at 1023 empty ones.
    used: Vec<u32>,
    live: usize,
    /// The next index to try.
    next: u32,
}

/// The objects in `slots` (which starts at slot `base`) at the slots
/// `used` (ascending, a subset of those `slots` holds), mutably, with
/// their slot numbers. Each is reached by skipping ahead in one mutable
/// iterator (`nth`, O(1) on a slice), so the empty slots between cost
/// nothing.
fn pick_mut<'a, T>(
    slots: &'a mut [Option<(u32, Box<T>)>],
    base: usize,
    used: &'a [u32],
) -> impl Iterator<Item = (usize, &'a mut T)> {
    let mut it = slots.iter_mut();
    // The slot (relative to `base`) `it` yields next.
    let mut pos = 0usize;
    used.iter().filter_map(move |&slot| {
        let rel = (slot as usize).checked_sub(base)?;
        let s = it.nth(rel.checked_sub(pos)?)?;
        pos = rel + 1;
        s.as_mut().map(|(_, v)| (slot as usize, v.as_mut()))
    })
}

impl<T> HandleTable<T> {
    /// An empty table of `space`. Panics if `space` is malformed (more
    /// than 32 handle bits, `first` outside the index space, or more
    /// objects than indices): a programming error, not an input.
    pub fn new(space: HandleSpace) -> Self {
        assert!(space.index_bits + space.key_bits <= 32 && space.index_bits <= 31);
        // The fixed handle's slot is its own: the others still need `max`.
        let cap = (space.max + usize::from(space.fixed.is_some()))
            .max(1)
            .next_power_of_two();
        assert!(u64::from(space.first) < 1u64 << space.index_bits);
        assert!(space
            .fixed
            .is_none_or(|f| f >> space.key_bits < space.first));
        assert!((cap as u64) < 1u64 << space.index_bits);
        let mut slots = Vec::new();
        slots.resize_with(cap, || None);
        HandleTable {
            space,
            slots,
            used: Vec::new(),
            live: 0,
            next: space.first,
        }
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no object is alive.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The most objects the table holds ([`HandleSpace::max`]).
    pub fn max(&self) -> usize {
        self.space.max
    }

    fn slot_of(&self, handle: u32) -> usize {
        let index = handle >> self.space.key_bits;
        index as usize & (self.slots.len() - 1)
    }

    /// The slot kept for [`HandleSpace::fixed`], if the table has one.
    fn fixed_slot(&self) -> Option<usize> {
        self.space.fixed.map(|h| self.slot_of(h))
    }

    /// Adds the object `make(handle)` under the fixed handle
    /// ([`HandleSpace::fixed`]) and returns it; `None` when the table has
    /// no fixed handle, an object already holds it, or
    /// [`HandleSpace::max`] objects are alive.
    pub fn insert_fixed(&mut self, make: impl FnOnce(u32) -> T) -> Option<u32> {
        let handle = self.space.fixed?;
        let slot = self.slot_of(handle);
        if self.live >= self.space.max || self.slots[slot].is_some() {
            return None;
        }
        self.place(slot, handle, make);
        Some(handle)
    }

    /// Puts `make(handle)` in the empty slot `slot`.
    fn place(&mut self, slot: usize, handle: u32, make: impl FnOnce(u32) -> T) {
        self.slots[slot] = Some((handle, Box::new(make(handle))));
        // `slot` < slots.len() ≤ 2^31 (asserted in `new`).
        let at = self.used.partition_point(|&u| (u as usize) < slot);
        self.used.insert(at, slot as u32);
        self.live += 1;
    }

    /// Adds the object `make(handle)` under a new handle whose low
    /// [`HandleSpace::key_bits`] bits are those of `key`; returns the
    /// handle, or `None` when [`HandleSpace::max`] objects are alive
    /// (`ENOMEM`). The index is the next free one cyclically after the
    /// last one handed out; the search is bounded (at most twice the
    /// capacity plus `first` steps), since fewer than capacity objects are
    /// alive (fewer than capacity - 1 besides the fixed handle's slot, which
    /// it never takes) and each run of capacity consecutive indices covers
    /// every slot.
    pub fn insert_with(&mut self, key: u32, make: impl FnOnce(u32) -> T) -> Option<u32> {
        if self.live >= self.space.max {
            return None;
        }
        let end = 1u64 << self.space.index_bits;
        let key_mask = ((1u64 << self.space.key_bits) - 1) as u32;
        let steps = 2 * self.slots.len() + self.space.first as usize;
        let fixed_slot = self.fixed_slot();
        for _ in 0..steps {
            let index = self.next;
            self.next = if u64::from(index) + 1 >= end {
                self.space.first
            } else {
                index + 1
            };
            let handle = ((u64::from(index) << self.space.key_bits) as u32) | (key & key_mask);
            let slot = self.slot_of(handle);
            if self.slots[slot].is_none() && Some(slot) != fixed_slot {
                self.place(slot, handle, make);
                return Some(handle);
            }
        }
        None
    }

    /// The object named by `handle`, if alive.
    pub fn get(&self, handle: u32) -> Option<&T> {
        match &self.slots[self.slot_of(handle)] {
            Some((h, v)) if *h == handle => Some(v),
            _ => None,
        }
    }

    /// The object named by `handle`, if alive, mutably.
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut T> {
        let slot = self.slot_of(handle);
        match &mut self.slots[slot] {
            Some((h, v)) if *h == handle => Some(v),
            _ => None,
        }
    }

    /// True when `handle` names a live object.
    pub fn contains(&self, handle: u32) -> bool {
        self.get(handle).is_some()
    }

    /// Removes and returns the object named by `handle`.
    pub fn remove(&mut self, handle: u32) -> Option<T> {
        let slot = self.slot_of(handle);
        match &self.slots[slot] {
            Some((h, _)) if *h == handle => {}
            _ => return None,
        }
        self.live -= 1;
        if let Ok(at) = self.used.binary_search(&(slot as u32)) {
            self.used.remove(at);
        }
        self.slots[slot].take().map(|(_, v)| *v)
    }

    /// Removes every live object for which `doomed` holds, in slot order.
    pub fn remove_where(&mut self, mut doomed: impl FnMut(&T) -> bool) {
        let handles: Vec<u32> = self
            .iter()
            .filter(|(_, v)| doomed(v))
            .map(|(h, _)| h)
            .collect();
        for h in handles {
            self.remove(h);
        }
    }

    /// Every live object with its handle, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.used
            .iter()
            .filter_map(|&u| self.slots.get(u as usize)?.as_ref())
            .map(|(h, v)| (*h, v.as_ref()))
    }

    /// Every live object, in slot order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.iter().map(|(_, v)| v)
    }

    /// Every live object, mutably, in slot order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        pick_mut(&mut self.slots, 0, &self.used).map(|(_, v)| v)
    }

    /// Every live object, mutably, with its slot number, in slot order
    /// from slot `start` (taken modulo the number of slots), wrapping
    /// round: a caller that serves objects in turn under a shared budget
    /// starts where the last round stopped, so that no object waits
    /// behind the same others forever.
    pub fn values_mut_from(&mut self, start: usize) -> impl Iterator<Item = (usize, &mut T)> {
        let start = start % self.slots.len();
        let (before, after) = self.slots.split_at_mut(start);
        let split = self.used.partition_point(|&u| (u as usize) < start);
        let (used_before, used_after) = self.used.split_at(split);
        pick_mut(after, start, used_after).chain(pick_mut(before, 0, used_before))
    }

    /// Continues the cyclic allocation where `old` stopped (a table that
    /// replaces `old` at a device reset), so handles of objects destroyed
    /// by the reset are not handed out again soon.
    pub fn continue_after(&mut self, old: &HandleTable<T>) {
        if old.space == self.space {
            self.next = old.next;
        }
    }
}

/// Where the random key bits of MR keys come from: a per-device secret
/// mixed with a counter. The secret comes from the kernel's CSPRNG
/// (`getrandom(2)`) unless given ([`KeySource::seeded`], for reproducible
/// fuzzing). The mixing is splitmix64's finaliser: it hides the secret from
/// a peer that sees 8 bits of each key well enough for keys a peer must
/// guess (one wrong guess costs it the connection), but it is not a
/// cryptographic PRF.
#[derive(Debug, Clone)]
pub struct KeySource {
    secret: u64,
    counter: u64,
}

impl KeySource {
    /// A source with a fresh secret from `getrandom(2)` (falling back to
    /// the standard library's randomly keyed hasher if that fails).
    pub fn from_os() -> KeySource {
        KeySource::seeded(os_random_u64())
    }

    /// A source with the given secret: the same keys every time.
    pub fn seeded(secret: u64) -> KeySource {
        KeySource { secret, counter: 0 }
    }

    /// The next 32 random-looking bits.
    pub fn next_u32(&mut self) -> u32 {
        self.counter = self.counter.wrapping_add(1);
        let mut z = self
            .secret
            .wrapping_add(self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 32) as u32
    }
}

fn os_random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n == b.len() as isize {
        return u64::from_ne_bytes(b);
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(max: usize) -> HandleSpace {
        HandleSpace {
            first: 0x11,
            index_bits: 24,
            key_bits: 8,
            max,
            fixed: None,
        }
    }

    /// The fixed handle's slot is never given to another handle, however
    /// the cyclic allocation wraps, and the fixed handle can be placed
    /// whenever fewer than `max` objects live, once at a time.
    #[test]
    fn the_fixed_handle_keeps_its_slot() {
        let space = HandleSpace {
            first: 0x11,
            index_bits: 24,
            key_bits: 0,
            max: 8,
            fixed: Some(1),
        };
        let mut t = HandleTable::new(space);
        // Indices 0x11.. go round the 16 slots many times: none lands in
        // slot 1, nor is handle 1 ever handed out.
        for _ in 0..100 {
            let hs: Vec<u32> = (0..8).map(|_| t.insert_with(0, |h| h).unwrap()).collect();
            assert!(hs.iter().all(|&h| h != 1 && h % 16 != 1), "{hs:?}");
            assert_eq!(t.insert_with(0, |h| h), None, "max alive");
            assert_eq!(t.insert_fixed(|h| h), None, "max alive");
            for h in hs {
                t.remove(h);
            }
        }
        assert_eq!(t.insert_fixed(|h| h), Some(1));
        assert_eq!(t.insert_fixed(|h| h), None, "already there");
        assert_eq!(t.get(1), Some(&1));
        let hs: Vec<u32> = (0..7).map(|_| t.insert_with(0, |h| h).unwrap()).collect();
        assert_eq!(t.insert_with(0, |h| h), None, "the fixed one counts");
        assert_eq!(t.remove(1), Some(1));
        assert_eq!(t.get(1), None);
        assert_eq!(t.insert_fixed(|h| h + 100), Some(1), "again after remove");
        assert_eq!(t.get(1), Some(&101));
        assert!(hs.iter().all(|&h| t.get(h) == Some(&h)));
        // A table without one has no fixed handle.
        let mut plain = HandleTable::new(HandleSpace::numbers(4));
        assert_eq!(plain.insert_fixed(|h| h), None);
    }

    #[test]
    fn values_from_a_slot_wrap_round() {
        let mut t = HandleTable::new(HandleSpace::numbers(8));
        let hs: Vec<u32> = (0..5).map(|_| t.insert_with(0, |h| h).unwrap()).collect();
        assert_eq!(hs, [1, 2, 3, 4, 5], "slots 1 to 5");
        let from = |t: &mut HandleTable<u32>, s| {
            t.values_mut_from(s)
                .map(|(slot, v)| (slot, *v))
                .collect::<Vec<_>>()
        };
        assert_eq!(from(&mut t, 3), [(3, 3), (4, 4), (5, 5), (1, 1), (2, 2)]);
        assert_eq!(from(&mut t, 0), [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]);
        assert_eq!(
            from(&mut t, 8 + 5),
            [(5, 5), (1, 1), (2, 2), (3, 3), (4, 4)]
        );
    }

    /// After any mix of inserts and removes the iterators visit exactly
    /// the live objects, in slot order (from any start, wrapping round),
    /// as a plain map of slot to object says (they walk only the slots in
    /// use, `used`).
    #[test]
    fn iterators_visit_exactly_the_live_objects_in_slot_order() {
        let mut t = HandleTable::new(HandleSpace::numbers(64));
        let mut model = std::collections::BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for step in 0..3000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let live: Vec<u32> = model.values().copied().collect();
            if !x.is_multiple_of(3) || live.is_empty() {
                if let Some(h) = t.insert_with(0, |h| h) {
                    model.insert(t.slot_of(h), h);
                } else {
                    assert_eq!(t.len(), 64, "refused only when full");
                }
            } else {
                let h = live[(x >> 8) as usize % live.len()];
                assert_eq!(t.remove(h), Some(h));
                model.remove(&t.slot_of(h));
            }
            let want: Vec<(usize, u32)> = model.iter().map(|(&s, &h)| (s, h)).collect();
            let got: Vec<(usize, u32)> = t.iter().map(|(h, &v)| (t.slot_of(h), v)).collect();
            assert_eq!(got, want, "iter, step {step}");
            let vals: Vec<u32> = t.values_mut().map(|v| *v).collect();
            assert_eq!(vals, model.values().copied().collect::<Vec<_>>());
            let start = (x >> 16) as usize % 80;
            let from: Vec<(usize, u32)> = t.values_mut_from(start).map(|(s, v)| (s, *v)).collect();
            let s0 = start % 64;
            let mut want_from: Vec<(usize, u32)> =
                want.iter().filter(|(s, _)| *s >= s0).copied().collect();
            want_from.extend(want.iter().filter(|(s, _)| *s < s0));
            assert_eq!(from, want_from, "from {start}, step {step}");
        }
    }

    #[test]
    fn handles_go_round_the_whole_index_space() {
        let mut t = HandleTable::new(space(4));
        let mut last = 0;
        for i in 0..10_000u32 {
            let h = t.insert_with(0xab, |h| h).unwrap();
            assert_eq!(h & 0xff, 0xab);
            assert_eq!(h >> 8, 0x11 + i, "cyclic, not the lowest free slot");
            assert_eq!(t.get(h), Some(&h));
            if last != 0 {
                assert_eq!(t.get(last), None, "a stale handle names nothing");
            }
            assert_eq!(t.remove(h), Some(h));
            last = h;
        }
        assert!(t.is_empty());
    }

    #[test]
    fn wraps_to_first_and_skips_live_slots() {
        let mut t = HandleTable::new(HandleSpace {
            first: 3,
            index_bits: 4,
            key_bits: 0,
            max: 4,
            fixed: None,
        });
        let a = t.insert_with(0, |_| 0).unwrap();
        assert_eq!(a, 3);
        let (mut prev, mut wrapped) = (a, false);
        for _ in 0..20 {
            let h = t.insert_with(0, |h| h).unwrap();
            assert!((3..16).contains(&h), "{h}: inside [first, 2^4)");
            assert_ne!(h % 4, 3, "{h}: never in the live object's slot");
            wrapped |= h < prev;
            prev = h;
            t.remove(h).unwrap();
        }
        assert!(wrapped, "the cursor went round");
        assert_eq!(t.get(a), Some(&0));
    }

    #[test]
    fn full_table_refuses_and_every_live_handle_stays_unique() {
        let mut t = HandleTable::new(space(8));
        let hs: Vec<u32> = (0..8).map(|i| t.insert_with(i, |h| h).unwrap()).collect();
        assert_eq!(t.insert_with(0, |h| h), None, "max objects alive");
        assert_eq!(t.len(), 8);
        // Free every other one; new ones land in free slots only.
        for h in hs.iter().step_by(2) {
            t.remove(*h).unwrap();
        }
        for _ in 0..4 {
            t.insert_with(0, |h| h).unwrap();
        }
        let live: Vec<u32> = t
            .iter()
            .map(|(h, v)| {
                assert_eq!(h, *v);
                h
            })
            .collect();
        assert_eq!(live.len(), 8);
        assert_eq!(t.insert_with(0, |h| h), None);
    }

    #[test]
    fn seeded_keys_repeat_and_differ_by_seed() {
        let a: Vec<u32> = {
            let mut k = KeySource::seeded(1);
            (0..8).map(|_| k.next_u32()).collect()
        };
        let mut k = KeySource::seeded(1);
        assert_eq!(a, (0..8).map(|_| k.next_u32()).collect::<Vec<_>>());
        let mut k = KeySource::seeded(2);
        assert_ne!(a, (0..8).map(|_| k.next_u32()).collect::<Vec<_>>());
    }
}
