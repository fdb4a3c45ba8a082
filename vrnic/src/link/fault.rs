//! A wrapper that injects seeded, deterministic faults into a link: drop,
//! duplicate, reorder and corrupt, each with its own probability per frame
//! and per direction. The same seed, configuration and sequence of calls
//! give the same faults, so a failing loss test replays exactly.
//!
//! Per frame (sent or received), four uniform draws are taken in this
//! order whatever their outcome: drop, duplicate, reorder, corrupt; a
//! corrupted frame takes one more draw for the bit to flip. The generator is
//! SplitMix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number
//! generators", OOPSLA 2014), one stream shared by both directions.
//!
//! - drop: the frame disappears.
//! - duplicate: the frame is delivered twice in a row.
//! - reorder: the frame is held back and delivered right after the next
//!   frame in the same direction. On receive, when no next frame is waiting
//!   the held frame is delivered at once (there is nothing to swap with);
//!   on send it waits for the next [`Link::send`] or
//!   [`FaultLink::release_held`].
//! - corrupt: one bit of the frame, chosen uniformly, is flipped (any byte:
//!   headers, payload or ICRC); an ARP frame, which only the Ethernet FCS
//!   protects, is mangled so its receiver drops it.
//! - delay: the frame is held back until 2 to 8 (uniform) further frames
//!   have passed in the same direction, then delivered. On receive, an
//!   empty inner link releases every delayed frame (as with reorder); on
//!   send they wait for later sends or [`FaultLink::release_held`]. The
//!   delay draw (and its length draw) is taken only when the delay rate is
//!   not zero, so configurations without delay replay as before.

use std::collections::VecDeque;
use std::io;

use super::{Link, Rx};

/// Largest number of inner frames one [`Link::recv`] call consumes before
/// it gives up (returns `Ok(None)`), so a drop rate of 1 under a flood
/// cannot pin the caller.
const MAX_INNER_PER_RECV: usize = 64;

/// Fault probabilities for one direction, each in `[0, 1]` per frame.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultRates {
    /// Probability that a frame is dropped.
    pub drop: f64,
    /// Probability that a frame is delivered twice.
    pub duplicate: f64,
    /// Probability that a frame is swapped with the next one.
    pub reorder: f64,
    /// Probability that one bit of a frame is flipped.
    pub corrupt: f64,
    /// Probability that a frame is held back behind 2 to 8 later frames.
    pub delay: f64,
}

/// Configuration of a [`FaultLink`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultConfig {
    /// PRNG seed; any value (0 included) is fine.
    pub seed: u64,
    /// Faults applied to frames passed to [`Link::send`].
    pub tx: FaultRates,
    /// Faults applied to frames returned by [`Link::recv`].
    pub rx: FaultRates,
}

/// A [`FaultConfig`] that cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum FaultConfigError {
    /// A rate is NaN or outside `[0, 1]`.
    #[error("{direction} {fault} rate {value} is not a probability in [0, 1]")]
    BadRate {
        /// `"tx"` or `"rx"`.
        direction: &'static str,
        /// `"drop"`, `"duplicate"`, `"reorder"` or `"corrupt"`.
        fault: &'static str,
        /// The offending value.
        value: f64,
    },
}

impl FaultConfig {
    /// Checks that every rate is a probability.
    ///
    /// # Errors
    /// [`FaultConfigError::BadRate`] for the first rate that is NaN or
    /// outside `[0, 1]`.
    pub fn validate(&self) -> Result<(), FaultConfigError> {
        for (direction, r) in [("tx", &self.tx), ("rx", &self.rx)] {
            for (fault, value) in [
                ("drop", r.drop),
                ("duplicate", r.duplicate),
                ("reorder", r.reorder),
                ("corrupt", r.corrupt),
                ("delay", r.delay),
            ] {
                if !(0.0..=1.0).contains(&value) {
                    return Err(FaultConfigError::BadRate {
                        direction,
                        fault,
                        value,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Fault counters for one direction, in frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Frames dropped.
    pub dropped: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Frames delivered after the frame that followed them (a frame held
    /// back for reordering but released with nothing to swap with, by
    /// [`FaultLink::release_held`] or an empty receive queue, is not counted).
    pub reordered: u64,
    /// Frames with one bit flipped.
    pub corrupted: u64,
    /// Frames held back behind later frames (delay).
    pub delayed: u64,
    /// Received frames (held or duplicated) discarded because they did not
    /// fit the caller's buffer.
    pub oversize: u64,
}

/// SplitMix64: 64-bit state, full period 2^64, passes BigCrush; plenty
/// for fault injection and trivially reproducible.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `true` with probability `p` (0 never, 1 always).
    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `[0, n)`; `n` > 0. Multiply-shift, bias below 2^-32 for
    /// the sizes used here.
    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// The outcome of the four draws for one frame.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    drop: bool,
    duplicate: bool,
    reorder: bool,
    corrupt: bool,
    /// Frames to wait behind (0: no delay).
    delay: u32,
}

/// A [`Link`] wrapper injecting deterministic faults; see the module docs.
pub struct FaultLink {
    inner: Box<dyn Link>,
    cfg: FaultConfig,
    rng: SplitMix64,
    tx_held: Option<Vec<u8>>,
    rx_held: Option<Vec<u8>>,
    rx_pending: VecDeque<Vec<u8>>,
    tx_delayed: Vec<(u32, Vec<u8>)>,
    rx_delayed: Vec<(u32, Vec<u8>)>,
    tx_stats: FaultStats,
    rx_stats: FaultStats,
}

impl std::fmt::Debug for FaultLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultLink")
            .field("cfg", &self.cfg)
            .field("tx_stats", &self.tx_stats)
            .field("rx_stats", &self.rx_stats)
            .finish()
    }
}

impl FaultLink {
    /// Wraps `inner` with the faults of `cfg`.
    ///
    /// # Errors
    /// [`FaultConfigError`] when a rate is not a probability.
    pub fn new(inner: Box<dyn Link>, cfg: FaultConfig) -> Result<FaultLink, FaultConfigError> {
        cfg.validate()?;
        Ok(FaultLink {
            inner,
            cfg,
            rng: SplitMix64(cfg.seed),
            tx_held: None,
            rx_held: None,
            rx_pending: VecDeque::new(),
            tx_delayed: Vec::new(),
            rx_delayed: Vec::new(),
            tx_stats: FaultStats::default(),
            rx_stats: FaultStats::default(),
        })
    }

    /// Fault counters of the send direction.
    pub fn tx_stats(&self) -> FaultStats {
        self.tx_stats
    }

    /// Fault counters of the receive direction.
    pub fn rx_stats(&self) -> FaultStats {
        self.rx_stats
    }

    /// Sends the frame held back by a send-side reorder, if any.
    ///
    /// # Errors
    /// The inner link's send error.
    /// Also sends every frame still delayed.
    pub fn release_held(&mut self) -> io::Result<()> {
        let mut res = Ok(());
        let held = self.tx_held.take().into_iter();
        let delayed: Vec<Vec<u8>> = self.tx_delayed.drain(..).map(|(_, f)| f).collect();
        for f in held.chain(delayed) {
            let r = self.inner.send(&f);
            if res.is_ok() {
                res = r;
            }
        }
        res
    }

    /// Counts one passing frame against every delayed one; returns those
    /// whose wait is over, in the order they were delayed.
    fn tick(delayed: &mut Vec<(u32, Vec<u8>)>) -> Vec<Vec<u8>> {
        let mut due = Vec::new();
        let mut i = 0;
        while i < delayed.len() {
            delayed[i].0 = delayed[i].0.saturating_sub(1);
            if delayed[i].0 == 0 {
                due.push(delayed.remove(i).1);
            } else {
                i += 1;
            }
        }
        due
    }

    fn draw(&mut self, rates: FaultRates) -> Verdict {
        Verdict {
            drop: self.rng.chance(rates.drop),
            duplicate: self.rng.chance(rates.duplicate),
            reorder: self.rng.chance(rates.reorder),
            corrupt: self.rng.chance(rates.corrupt),
            delay: if rates.delay > 0.0 && self.rng.chance(rates.delay) {
                2 + self.rng.below(7) as u32
            } else {
                0
            },
        }
    }

    /// Flips one uniformly chosen bit of `frame` (no-op when empty). An
    /// ARP frame has no checksum of its own: on a real link the Ethernet
    /// FCS catches its corruption and the NIC drops it, so here it is made
    /// unrecognisable instead (its EtherType zeroed; the bit draw is taken
    /// all the same) and its receiver drops it. A flipped bit in an ARP
    /// reply's sender MAC would otherwise teach the peer a MAC nobody
    /// has, and every request to it would vanish until the entry aged.
    fn corrupt(&mut self, frame: &mut [u8]) {
        if frame.is_empty() {
            return;
        }
        let bit = self.rng.below(frame.len() as u64 * 8);
        if frame.get(12..14) == Some(&[0x08, 0x06]) {
            frame[12..14].fill(0);
            return;
        }
        if let Some(b) = frame.get_mut((bit / 8) as usize) {
            *b ^= 1 << (bit % 8);
        }
    }

    /// Returns a duplicated or reordered frame buffered earlier, else takes
    /// frames from the inner link and applies the `rx` faults. When it
    /// returns `Ok(None)` nothing is buffered in the wrapper, so draining
    /// until `None` on each wakeup of [`super::LinkCaps::fd`] never strands a frame.
    /// ([`Link::recv`] into `buf`.)
    fn recv_into(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        while let Some(f) = self.rx_pending.pop_front() {
            if let Some(n) = Self::deliver(&mut self.rx_stats, &f, buf) {
                return Ok(Some(n));
            }
        }
        for _ in 0..MAX_INNER_PER_RECV {
            let Some(n) = self.inner.recv(buf)? else {
                break;
            };
            let v = self.draw(self.cfg.rx);
            if v.drop {
                self.rx_stats.dropped += 1;
                continue;
            }
            let Some(frame) = buf.get_mut(..n) else {
                continue;
            };
            if v.corrupt {
                self.rx_stats.corrupted += 1;
                self.corrupt(frame);
            }
            let frame = buf.get(..n).unwrap_or_default();
            let due = Self::tick(&mut self.rx_delayed);
            if v.delay > 0 {
                self.rx_stats.delayed += 1;
                self.rx_delayed.push((v.delay, frame.to_vec()));
                self.rx_pending.extend(due);
                continue;
            }
            self.rx_pending.extend(due);
            if v.duplicate {
                self.rx_stats.duplicated += 1;
                self.rx_pending.push_back(frame.to_vec());
            }
            if v.reorder && self.rx_held.is_none() {
                self.rx_held = Some(frame.to_vec());
                continue;
            }
            if let Some(h) = self.rx_held.take() {
                self.rx_stats.reordered += 1;
                self.rx_pending.push_back(h);
            }
            return Ok(Some(n));
        }
        // Nothing (more) to swap with: hand out what is held, then any
        // duplicate still buffered.
        self.rx_pending.extend(self.rx_held.take());
        self.rx_pending
            .extend(self.rx_delayed.drain(..).map(|(_, f)| f));
        while let Some(f) = self.rx_pending.pop_front() {
            if let Some(n) = Self::deliver(&mut self.rx_stats, &f, buf) {
                return Ok(Some(n));
            }
        }
        Ok(None)
    }

    /// Copies a buffered frame into `buf`; `None` (counted) when it does not fit.
    fn deliver(stats: &mut FaultStats, frame: &[u8], buf: &mut [u8]) -> Option<usize> {
        match buf.get_mut(..frame.len()) {
            Some(dst) => {
                dst.copy_from_slice(frame);
                Some(frame.len())
            }
            None => {
                stats.oversize += 1;
                None
            }
        }
    }
}

impl Link for FaultLink {
    /// Applies the `tx` faults, then sends through the inner link. Returns
    /// the first inner send error, after attempting every frame due.
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let v = self.draw(self.cfg.tx);
        if v.drop {
            self.tx_stats.dropped += 1;
            return Ok(());
        }
        let mut f = frame.to_vec();
        if v.corrupt {
            self.tx_stats.corrupted += 1;
            self.corrupt(&mut f);
        }
        let mut out: Vec<Vec<u8>> = Vec::with_capacity(3);
        if v.duplicate {
            self.tx_stats.duplicated += 1;
            out.push(f.clone());
        }
        let due = Self::tick(&mut self.tx_delayed);
        if v.delay > 0 {
            self.tx_stats.delayed += 1;
            self.tx_delayed.push((v.delay, f));
            out.extend(due);
        } else if v.reorder && self.tx_held.is_none() {
            self.tx_held = Some(f);
        } else {
            out.push(f);
            if let Some(h) = self.tx_held.take() {
                self.tx_stats.reordered += 1;
                out.push(h);
            }
            out.extend(due);
        }
        let mut res = Ok(());
        for f in &out {
            let r = self.inner.send(f);
            if res.is_ok() {
                res = r;
            }
        }
        res
    }

    /// Returns a frame buffered earlier or takes one from the inner link
    /// (`recv_into`), then hands it over, its ICRC to be
    /// checked.
    fn receive(&mut self, rx: Rx<'_>) -> io::Result<Option<usize>> {
        rx.read(|buf| self.recv_into(buf))
    }

    fn inner(&self) -> Option<&dyn Link> {
        Some(self.inner.as_ref())
    }

    fn inner_mut(&mut self) -> Option<&mut dyn Link> {
        Some(self.inner.as_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::MemLink;

    const N: u32 = 2000;

    fn frames() -> Vec<Vec<u8>> {
        (0..N).map(|i| i.to_be_bytes().repeat(4)).collect()
    }

    fn drain(l: &mut dyn Link) -> Vec<Vec<u8>> {
        let mut buf = [0u8; 64];
        let mut out = Vec::new();
        while let Some(n) = l.recv(&mut buf).unwrap() {
            out.push(buf[..n].to_vec());
        }
        out
    }

    /// Sends `frames()` through a FaultLink with `tx` rates; returns what arrived.
    fn run_tx(seed: u64, tx: FaultRates) -> (Vec<Vec<u8>>, FaultStats) {
        let (a, mut b) = MemLink::pair_with_depth(10 * N as usize);
        let mut f = FaultLink::new(
            Box::new(a),
            FaultConfig {
                seed,
                tx,
                ..Default::default()
            },
        )
        .unwrap();
        for fr in frames() {
            f.send(&fr).unwrap();
        }
        f.release_held().unwrap();
        (drain(&mut b), f.tx_stats())
    }

    #[test]
    fn fault_link_without_faults_is_transparent() {
        let (got, st) = run_tx(1, FaultRates::default());
        assert_eq!(got, frames());
        assert_eq!(st, FaultStats::default());
    }

    #[test]
    fn fault_link_is_deterministic_per_seed() {
        let r = FaultRates {
            drop: 0.1,
            duplicate: 0.1,
            reorder: 0.1,
            corrupt: 0.1,
            delay: 0.1,
        };
        assert_eq!(run_tx(42, r), run_tx(42, r));
        assert_ne!(run_tx(42, r).0, run_tx(43, r).0);
    }

    #[test]
    fn fault_link_rates_are_roughly_honoured() {
        let (got, st) = run_tx(
            7,
            FaultRates {
                drop: 0.2,
                ..Default::default()
            },
        );
        assert_eq!(got.len() as u64, N as u64 - st.dropped);
        // Binomial(2000, 0.2): mean 400, sd ~18.
        assert!((300..500).contains(&st.dropped), "{st:?}");
        let (got, st) = run_tx(
            7,
            FaultRates {
                duplicate: 0.1,
                ..Default::default()
            },
        );
        assert_eq!(got.len() as u64, N as u64 + st.duplicated);
        assert!((130..270).contains(&st.duplicated), "{st:?}");
        let (got, st) = run_tx(
            7,
            FaultRates {
                corrupt: 0.1,
                ..Default::default()
            },
        );
        let diff = got.iter().zip(frames()).filter(|(g, w)| **g != *w).count() as u64;
        assert_eq!(diff, st.corrupted);
        for (g, w) in got.iter().zip(frames()) {
            let bits: u32 = g.iter().zip(&w).map(|(x, y)| (x ^ y).count_ones()).sum();
            assert!(bits <= 1, "exactly one bit flipped per corrupted frame");
        }
    }

    #[test]
    fn fault_link_reorder_swaps_with_the_next_frame_only() {
        let (got, st) = run_tx(
            9,
            FaultRates {
                reorder: 0.3,
                ..Default::default()
            },
        );
        assert!(st.reordered > 0);
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, frames(), "nothing lost or duplicated");
        let idx: Vec<u32> = got
            .iter()
            .map(|f| u32::from_be_bytes(f[..4].try_into().unwrap()))
            .collect();
        let displaced = idx
            .iter()
            .enumerate()
            .filter(|(i, v)| **v != *i as u32)
            .count() as u64;
        assert_eq!(
            displaced,
            2 * st.reordered,
            "each reorder swaps two neighbours"
        );
        for (i, v) in idx.iter().enumerate() {
            assert!((*v as i64 - i as i64).abs() <= 1);
        }
    }

    #[test]
    fn fault_link_receive_side_faults_and_no_stranded_frames() {
        let (mut a, b) = MemLink::pair_with_depth(10 * N as usize);
        let rx = FaultRates {
            drop: 0.05,
            duplicate: 0.05,
            reorder: 0.2,
            corrupt: 0.0,
            delay: 0.1,
        };
        let mut f = FaultLink::new(
            Box::new(b),
            FaultConfig {
                seed: 3,
                rx,
                ..Default::default()
            },
        )
        .unwrap();
        // Bursts of 5: recv returning None must leave nothing buffered.
        let all = frames();
        let mut got = Vec::new();
        for burst in all.chunks(5) {
            for fr in burst {
                a.send(fr).unwrap();
            }
            got.extend(drain(&mut f));
        }
        let st = f.rx_stats();
        assert!(
            st.dropped > 0 && st.duplicated > 0 && st.reordered > 0 && st.delayed > 0,
            "{st:?}"
        );
        assert_eq!(got.len() as u64, N as u64 - st.dropped + st.duplicated);
        assert_eq!(drain(&mut f), Vec::<Vec<u8>>::new());
    }

    #[test]
    fn delayed_frames_arrive_behind_later_ones_and_none_is_lost() {
        let (a, mut b) = MemLink::pair_with_depth(10 * N as usize);
        let tx = FaultRates {
            delay: 0.1,
            ..Default::default()
        };
        let mut f = FaultLink::new(
            Box::new(a),
            FaultConfig {
                seed: 9,
                tx,
                ..Default::default()
            },
        )
        .unwrap();
        for fr in frames() {
            f.send(&fr).unwrap();
        }
        f.release_held().unwrap();
        let got = drain(&mut b);
        assert_eq!(got.len(), N as usize, "nothing lost");
        let idx: Vec<u32> = got
            .iter()
            .map(|g| u32::from_be_bytes(g[..4].try_into().unwrap()))
            .collect();
        // Some frame arrives at least two places behind where it was sent.
        let late = idx
            .iter()
            .enumerate()
            .any(|(pos, &i)| pos >= i as usize + 2);
        assert!(late && f.tx_stats().delayed > 0, "{:?}", f.tx_stats());
        let mut sorted = idx.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..N).collect::<Vec<_>>());
    }

    #[test]
    fn fault_config_rejects_non_probabilities() {
        for bad in [-0.1, 1.5, f64::NAN] {
            let cfg = FaultConfig {
                rx: FaultRates {
                    corrupt: bad,
                    ..Default::default()
                },
                ..Default::default()
            };
            let (a, _b) = MemLink::pair();
            let e = FaultLink::new(Box::new(a), cfg).expect_err("bad rate");
            assert!(matches!(
                e,
                FaultConfigError::BadRate {
                    direction: "rx",
                    fault: "corrupt",
                    ..
                }
            ));
        }
    }
}
