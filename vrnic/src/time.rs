//! Time as the engine counts it: a leaf every layer may use.

/// Monotonic time in nanoseconds.
pub type Nanos = u64;
