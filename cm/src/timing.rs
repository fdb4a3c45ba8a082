//! rdma_cm's timing constants and cm.c's IBA time conversions.

/// The RDMA CM's response timeout exponent, `CMA_CM_RESPONSE_TIMEOUT` (20,
/// cma.c:47): 4.096 µs · 2^20 ≈ 4.3 s, which cm.c rounds to 4096 ms.
pub const CMA_CM_RESPONSE_TIMEOUT: u8 = 20;

/// The RDMA CM's retry count, `CMA_MAX_CM_RETRIES` (15, cma.c:48).
pub const CMA_MAX_CM_RETRIES: u8 = 15;

/// The packet life time rdma_cm puts in a RoCE path,
/// `CMA_IBOE_PACKET_LIFETIME` (18, cma.c).
pub const CMA_IBOE_PACKET_LIFETIME: u8 = 18;

/// An IBA time exponent (4.096 µs · 2^t) in milliseconds as cm.c's
/// `cm_convert_to_ms` rounds it: `1 << max(t - 8, 0)`. `t` above 31 is
/// taken as 31.
pub fn cm_convert_to_ms(iba_time: u8) -> u64 {
    1u64 << (iba_time.min(31).saturating_sub(8))
}

/// The local ACK timeout exponent of a path, cm.c's `cm_ack_timeout`: the
/// packet life time + 1, corrected for the CA's ACK delay, at most 31.
pub fn cm_ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let ca = ca_ack_delay.min(31);
    let mut ack = packet_life_time.min(30) + 1;
    if ack >= ca {
        ack += u8::from(ca >= ack - 1);
    } else {
        ack = ca + u8::from(ack >= ca.saturating_sub(1));
    }
    ack.min(31)
}

pub(crate) const NS_PER_MS: u64 = 1_000_000;
