//! Conversions that need no device: the `*_str` functions
//! (`ibv_wc_status_str(3)`, `ibv_event_type_str(3)`, `ibv_node_type_str(3)`,
//! `ibv_port_state_str(3)`), the rate conversions (`ibv_rate_to_mult(3)`,
//! `ibv_rate_to_mbps(3)`) and the fork-support calls (`ibv_fork_init(3)`).
//! Strings and tables as rdma-core 44's `libibverbs/enum_strs.c` and
//! `verbs.c`; the test `strings_match_debian` compares every value with
//! Debian's library.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use vrnic_guest::verbs::wc_status_str;

use crate::ffi;

/// A string from `table[i]`, or "unknown" (rdma-core's out-of-range answer).
fn pick(table: &[&'static CStr], i: c_int) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `ibv_wc_status_str(3)`: the text of an `enum ibv_wc_status`: guest-lib's
/// [`vrnic_guest::verbs::wc_status_str`] (the one table of rdma-core's
/// texts), as C strings made once and kept for the process's life.
pub(crate) extern "C" fn ibv_wc_status_str(status: ffi::ibv_wc_status) -> *const c_char {
    static S: OnceLock<Vec<CString>> = OnceLock::new();
    let table = S.get_or_init(|| {
        (0..=u8::MAX)
            .map(|i| CString::new(wc_status_str(i)).unwrap_or_default())
            .collect()
    });
    match usize::try_from(status as c_int)
        .ok()
        .and_then(|i| table.get(i))
    {
        Some(s) => s.as_ptr(),
        None => c"unknown".as_ptr(),
    }
}

/// `ibv_event_type_str(3)`: the text of an `enum ibv_event_type`.
pub(crate) extern "C" fn ibv_event_type_str(event: ffi::ibv_event_type) -> *const c_char {
    const S: &[&CStr] = &[
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    pick(S, event as c_int)
}

/// `ibv_node_type_str(3)`: the text of an `enum ibv_node_type` (from
/// `IBV_NODE_CA` = 1; `IBV_NODE_UNKNOWN` and others are "unknown").
pub(crate) extern "C" fn ibv_node_type_str(node_type: ffi::ibv_node_type) -> *const c_char {
    const S: &[&CStr] = &[
        c"unknown",
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
        c"unspecified",
    ];
    pick(S, node_type)
}

/// `ibv_port_state_str(3)`: the text of an `enum ibv_port_state`.
pub(crate) extern "C" fn ibv_port_state_str(state: ffi::ibv_port_state) -> *const c_char {
    const S: &[&CStr] = &[
        c"no state change (NOP)",
        c"down",
        c"init",
        c"armed",
        c"active",
        c"active defer",
    ];
    pick(S, state as c_int)
}

/// `(enum ibv_rate, multiple of 2.5 Gb/s, Mb/s)` as rdma-core's
/// `ibv_rate_to_mult`/`ibv_rate_to_mbps` tables.
const RATES: &[(ffi::ibv_rate, c_int, c_int)] = &[
    (ffi::ibv_rate_IBV_RATE_2_5_GBPS, 1, 2500),
    (ffi::ibv_rate_IBV_RATE_5_GBPS, 2, 5000),
    (ffi::ibv_rate_IBV_RATE_10_GBPS, 4, 10000),
    (ffi::ibv_rate_IBV_RATE_20_GBPS, 8, 20000),
    (ffi::ibv_rate_IBV_RATE_30_GBPS, 12, 30000),
    (ffi::ibv_rate_IBV_RATE_40_GBPS, 16, 40000),
    (ffi::ibv_rate_IBV_RATE_60_GBPS, 24, 60000),
    (ffi::ibv_rate_IBV_RATE_80_GBPS, 32, 80000),
    (ffi::ibv_rate_IBV_RATE_120_GBPS, 48, 120000),
    (ffi::ibv_rate_IBV_RATE_14_GBPS, -1, 14062),
    (ffi::ibv_rate_IBV_RATE_56_GBPS, -1, 56250),
    (ffi::ibv_rate_IBV_RATE_112_GBPS, -1, 112500),
    (ffi::ibv_rate_IBV_RATE_168_GBPS, -1, 168750),
    (ffi::ibv_rate_IBV_RATE_25_GBPS, -1, 25781),
    (ffi::ibv_rate_IBV_RATE_100_GBPS, -1, 103125),
    (ffi::ibv_rate_IBV_RATE_200_GBPS, -1, 206250),
    (ffi::ibv_rate_IBV_RATE_300_GBPS, -1, 309375),
    (ffi::ibv_rate_IBV_RATE_28_GBPS, 11, 28125),
    (ffi::ibv_rate_IBV_RATE_50_GBPS, 20, 53125),
    (ffi::ibv_rate_IBV_RATE_400_GBPS, 160, 425000),
    (ffi::ibv_rate_IBV_RATE_600_GBPS, 240, 637500),
    (ffi::ibv_rate_IBV_RATE_800_GBPS, 320, 850000),
    (ffi::ibv_rate_IBV_RATE_1200_GBPS, 480, 1275000),
];

/// `ibv_rate_to_mult(3)`: the multiple of 2.5 Gb/s, or -1.
pub(crate) extern "C" fn ibv_rate_to_mult(rate: ffi::ibv_rate) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate && r.1 > 0)
        .map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate(3)`: the rate for a multiple of 2.5 Gb/s, or `IBV_RATE_MAX`.
pub(crate) extern "C" fn mult_to_ibv_rate(mult: c_int) -> ffi::ibv_rate {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(ffi::ibv_rate_IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps(3)`: the rate in Mb/s, or -1.
pub(crate) extern "C" fn ibv_rate_to_mbps(rate: ffi::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate(3)`: the rate for a speed in Mb/s, or `IBV_RATE_MAX`.
pub(crate) extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ffi::ibv_rate {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(ffi::ibv_rate_IBV_RATE_MAX, |r| r.0)
}

/// `ibv_fork_init(3)`: vrnic's registered memory stays valid across
/// `fork(2)` as with a kernel that has copy-on-fork (rdma-core returns 0
/// then too): the parent keeps its pages, the child gets copies (in a VM
/// the pages are locked and pinned; elsewhere the library's fork handler
/// copies its remapped pages, `vrnic_guest::vhost_user`).
pub(crate) extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized(3)`: `IBV_FORK_UNNEEDED`, as rdma-core answers
/// on kernels with copy-on-fork.
pub(crate) extern "C" fn ibv_is_fork_initialized() -> ffi::ibv_fork_status {
    ffi::ibv_fork_status_IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range(3)`: nothing to do (see [`ibv_fork_init`]); 0.
pub(crate) extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range(3)`: nothing to do (see [`ibv_fork_init`]); 0.
pub(crate) extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
