//! The pause in a worker's adaptive polling after a neighbour kept the
//! core: the state the data path keeps per worker, used by the polling
//! (module `spin`, which documents the scheme and its constants).

use vrnic::device::Nanos;

/// First pause in polling after a `LONG_YIELD_NS` yield ([`Backoff`]),
/// nanoseconds (1 ms: about one time slice).
pub const BACKOFF_MIN_NS: Nanos = 1_000_000;

/// When a worker pauses its polling after a
/// `LONG_YIELD_NS` yield (see module `spin`): the first pause [`BACKOFF_MIN_NS`], each further one
/// twice the last, up to `PollConfig::backoff_ns`; a session that
/// polled its whole `SESSION_MAX_NS` without such a yield halves the
/// next pause (not below [`BACKOFF_MIN_NS`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    /// No polling before this device time, nanoseconds.
    until: Nanos,
    /// The next pause, nanoseconds (0: [`BACKOFF_MIN_NS`]).
    next: Nanos,
}

impl Backoff {
    /// Whether polling pauses at `now`.
    pub(crate) fn active(&self, now: Nanos) -> bool {
        now < self.until
    }

    /// A long yield at `now`: polling pauses for the next pause (at most
    /// `max`), and the one after is twice as long. Returns the pause,
    /// nanoseconds.
    pub(crate) fn long_yield(&mut self, now: Nanos, max: Nanos) -> Nanos {
        let pause = self.next.clamp(BACKOFF_MIN_NS.min(max), max);
        self.until = now.saturating_add(pause);
        self.next = pause.saturating_mul(2).min(max);
        pause
    }

    /// A session polled `SESSION_MAX_NS` without a long yield: the next
    /// pause is halved.
    pub(crate) fn calm(&mut self) {
        self.next = (self.next / 2).max(BACKOFF_MIN_NS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A neighbour that keeps not yielding: pauses of 1, 2, 4 ... ms up to
    /// the longest; calm sessions halve the next pause back to 1 ms; a
    /// longest pause of 0 never pauses.
    #[test]
    fn pauses_double_while_long_yields_repeat_and_halve_when_calm() {
        let ms = 1_000_000;
        let mut b = Backoff::default();
        assert!(!b.active(0));
        let pauses: Vec<Nanos> = (0..9)
            .map(|i| b.long_yield(i * 1000 * ms, 100 * ms))
            .collect();
        assert_eq!(
            pauses,
            [1, 2, 4, 8, 16, 32, 64, 100, 100].map(|p| p * ms),
            "doubling up to the longest"
        );
        let at = 8000 * ms;
        assert!(b.active(at) && b.active(at + 100 * ms - 1) && !b.active(at + 100 * ms));
        for _ in 0..3 {
            b.calm();
        }
        assert_eq!(b.long_yield(0, 100 * ms), 12_500_000, "halved three times");
        for _ in 0..20 {
            b.calm();
        }
        assert_eq!(b.long_yield(0, 100 * ms), ms, "never below the first pause");
        let mut off = Backoff::default();
        assert_eq!(off.long_yield(5, 0), 0);
        assert!(!off.active(5));
    }
}
