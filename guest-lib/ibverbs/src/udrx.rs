//! The RoCE packet type of a UD receive, reported in `ibv_wc.sl` as mlx5
//! reports it, for UCX.
//!
//! UCX's `ud_verbs` transport (`uct_ud_iface_check_grh`,
//! `src/uct/ib/ud/base/ud_iface.h`, UCX 1.13) drops every UD receive
//! whose destination in the GRH area is not one of its own GIDs, and
//! takes how to read that area from `ibv_wc.sl`: mlx5 puts the RoCE
//! packet type there for a UD receive over RoCE (bits 2:0 the L3 header,
//! 0 GRH, 1 IPv6, 2 IPv4; bit 3 set when the frame has a UDP header, i.e.
//! RoCE v2). With `sl` 0 UCX reads an IPv4 packet's area as a 16-byte GID
//! (bytes 24..40, where an IPv4 header has its addresses and more), finds
//! no GID of its own and drops the packet: `ucx_perftest` over
//! `UCX_TLS=ud_verbs` then times out (`UD endpoint ...: unhandled timeout
//! error`), unless `UCX_UD_VERBS_ETH_DGID_CHECK=n`.
//!
//! The device's completion does not say which IP version the datagram
//! came over, but its GRH area does (written by the device at the start
//! of the receive buffer, as rxe does: an IPv4 header at bytes 20..40, or
//! the IPv6 header in all 40). So, for a UD QP with its own receive queue
//! (an SRQ's receives complete in any order), each posted receive's first
//! SGE address is queued (receives complete in the order posted), and a
//! UD receive completion reads the area it names before it is handed to
//! the application, setting `sl` to [`SL_ROCE_V2_IPV4`] or
//! [`SL_ROCE_V2_IPV6`] (vrnic's only traffic is RoCE v2).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use vrnic_guest::verbs::{WorkCompletion, GRH_LEN, WC_GRH};

use crate::events::lock;

/// `sl` of a UD receive of a RoCE v2 datagram over IPv4 (mlx5: UDP bit 3
/// and L3 header type 2).
pub const SL_ROCE_V2_IPV4: u8 = 0x8 | 0x2;
/// `sl` of a UD receive of a RoCE v2 datagram over IPv6 (mlx5: UDP bit 3
/// and L3 header type 1).
pub const SL_ROCE_V2_IPV6: u8 = 0x8 | 0x1;

/// The receives posted to the UD QPs whose receive CQ this is: QP number →
/// the GRH area address of each posted receive, oldest first (`None`
/// when the first SGE is too short to hold the area).
#[derive(Debug, Default)]
pub(crate) struct UdRx(Mutex<HashMap<u32, VecDeque<Option<usize>>>>);

impl UdRx {
    /// A new, shared table (one per CQ, kept by its UD QPs too).
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Queues a receive posted to UD QP `qpn` whose first SGE is
    /// `(addr, len)` (bytes), before it is given to the device.
    pub(crate) fn push(&self, qpn: u32, first: Option<(u64, u32)>) {
        let area = first.and_then(|(a, l)| (l as usize >= GRH_LEN).then_some(a as usize));
        lock(&self.0).entry(qpn).or_default().push_back(area);
    }

    /// Takes back the receive just queued for `qpn` (its post failed).
    pub(crate) fn unpush(&self, qpn: u32) {
        if let Some(q) = lock(&self.0).get_mut(&qpn) {
            q.pop_back();
        }
    }

    /// Forgets QP `qpn` (destroyed).
    pub(crate) fn remove(&self, qpn: u32) {
        lock(&self.0).remove(&qpn);
    }

    /// Sets `sl` of each UD receive completion in `wcs` (see the module
    /// documentation); other completions are left as they are.
    pub(crate) fn mark(&self, wcs: &mut [WorkCompletion]) {
        let mut map = lock(&self.0);
        if map.is_empty() {
            return;
        }
        for w in wcs {
            if w.opcode != vrnic_abi::WC_OP_RECV {
                continue;
            }
            let Some(q) = map.get_mut(&w.qp_num) else {
                continue;
            };
            let Some(area) = q.pop_front() else {
                continue;
            };
            if let (Some(a), true) = (area, w.is_success() && w.wc_flags & WC_GRH != 0) {
                // SAFETY: the first GRH_LEN bytes of the receive buffer the
                // application posted (checked long enough at post) and the
                // device just filled; it is the application's again only
                // once this completion is returned.
                let grh = unsafe { std::slice::from_raw_parts(a as *const u8, GRH_LEN) };
                w.sl = sl_of(grh).unwrap_or(w.sl);
            }
        }
    }
}

/// The `sl` of a GRH area holding an IPv4 header at bytes 20..40 (version
/// 4, IHL 5) or an IPv6 header (version 6); `None` otherwise.
pub fn sl_of(grh: &[u8]) -> Option<u8> {
    let grh = grh.get(..GRH_LEN)?;
    if grh[20] == 0x45 {
        Some(SL_ROCE_V2_IPV4)
    } else if grh[0] >> 4 == 6 {
        Some(SL_ROCE_V2_IPV6)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_type_from_the_grh_area() {
        let mut g = [0u8; GRH_LEN];
        assert_eq!(sl_of(&g), None);
        g[20] = 0x45;
        assert_eq!(sl_of(&g), Some(SL_ROCE_V2_IPV4));
        let mut g6 = [0u8; GRH_LEN];
        g6[0] = 0x60;
        assert_eq!(sl_of(&g6), Some(SL_ROCE_V2_IPV6));
        assert_eq!(sl_of(&g[..39]), None);
    }
}
