//! The C ABI boundary: errno, diagnostics, and no panic unwinding into C.
//!
//! Every exported function that does real work runs its body through
//! [`ffi`], which catches a panic (a bug in this library) and turns it into
//! the function's error value with `errno = EIO`.

use std::ffi::{c_char, c_int};
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets the calling thread's `errno` (rdma-core's "NULL + errno" and "-1 +
/// errno" conventions).
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The value a verb returns when it fails with `errno` set: NULL for the
/// verbs that return an object, -1 for those that return an `int`.
pub(crate) trait Failed {
    /// The failure value.
    const FAILED: Self;
}

impl<T> Failed for *mut T {
    const FAILED: Self = std::ptr::null_mut();
}

impl<T> Failed for *const T {
    const FAILED: Self = std::ptr::null();
}

impl Failed for c_int {
    const FAILED: Self = -1;
}

/// Sets `errno` to `e` and returns the verb's failure value ([`Failed`]).
pub(crate) fn fail_with_errno<R: Failed>(e: c_int) -> R {
    set_errno(e);
    R::FAILED
}

/// True when `VRNIC_IBVERBS_DEBUG` is set: the library then says on stderr
/// what it does not support.
pub(crate) fn debug() -> bool {
    std::env::var_os("VRNIC_IBVERBS_DEBUG").is_some()
}

/// Runs `f`; a panic becomes `on_panic` with `errno = EIO` and a line on
/// stderr naming `name`.
pub(crate) fn ffi<T>(name: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "libibverbs (vrnic): internal error in {name}"
            );
            set_errno(libc::EIO);
            on_panic
        }
    }
}

/// Copies `s` into the C string buffer `dst`, truncated, NUL-terminated
/// (the rest of `dst` is left as is: callers pass zeroed buffers).
pub(crate) fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = dst.len().saturating_sub(1);
    for (d, b) in dst[..n].iter_mut().zip(s.bytes()) {
        *d = b as c_char;
    }
}
