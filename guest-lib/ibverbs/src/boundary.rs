//! The C ABI boundary: errno and diagnostics.

use std::ffi::c_int;

/// Sets the calling thread's `errno` (rdma-core's "NULL + errno" and "-1 +
/// errno" conventions).
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// True when `VRNIC_IBVERBS_DEBUG` is set: the library then says on stderr
/// what it does not support.
pub(crate) fn debug() -> bool {
    std::env::var_os("VRNIC_IBVERBS_DEBUG").is_some()
}
