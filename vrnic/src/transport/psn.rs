//! 24-bit packet sequence number arithmetic (IBTA Vol 1 §9.7.1: PSNs wrap
//! modulo 2^24; comparisons are within half the space).

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// `psn + n` modulo 2^24.
pub fn add(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a - b` in PSN space (-2^23 .. 2^23): positive when `a`
/// is after `b`.
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) << 8) as i32) >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_across_2_pow_24() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(add(PSN_MASK - 1, 5), 3);
        assert_eq!(diff(3, PSN_MASK - 1), 5);
        assert_eq!(diff(PSN_MASK - 1, 3), -5);
        assert_eq!(diff(7, 7), 0);
        assert_eq!(diff(0x80_0000, 0), -0x80_0000);
    }
}
