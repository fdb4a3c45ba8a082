//! The C ABI boundary: errno, and no panic unwinding into C.
//!
//! librdmacm's convention (rdma-core `librdmacm/cma.h` `ERR()`): a failing
//! call sets `errno` and returns -1 (or NULL).

use std::ffi::c_int;
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

/// The value a call returns when it fails with `errno` set.
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

impl Failed for isize {
    const FAILED: Self = -1;
}

impl Failed for i64 {
    const FAILED: Self = -1;
}

impl Failed for usize {
    /// `riowrite(3)` returns `size_t`; rsocket.c's error is `(size_t)-1`.
    const FAILED: Self = usize::MAX;
}

impl Failed for u16 {
    /// `rdma_get_src_port(3)` has no error value: 0 (no port).
    const FAILED: Self = 0;
}

impl Failed for () {
    const FAILED: Self = ();
}

/// Sets `errno` to `e` and returns the failure value ([`Failed`]).
pub(crate) fn fail<R: Failed>(e: c_int) -> R {
    set_errno(e);
    R::FAILED
}

/// True when `VRNIC_RDMACM_DEBUG` is set: the library then says on stderr
/// what it does not implement yet.
pub(crate) fn debug() -> bool {
    std::env::var_os("VRNIC_RDMACM_DEBUG").is_some()
}

/// Runs `f`; a panic (a bug in this library) becomes the failure value
/// with `errno = EIO` and a line on stderr naming `name`.
pub(crate) fn ffi<T: Failed>(name: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            let _ = writeln!(
                std::io::stderr(),
                "librdmacm (vrnic): internal error in {name}"
            );
            fail(libc::EIO)
        }
    }
}

/// Under `VRNIC_RDMACM_DEBUG`, says `msg` on stderr (why a call failed).
pub(crate) fn say(msg: &str) {
    if debug() {
        let _ = writeln!(std::io::stderr(), "librdmacm (vrnic): {msg}");
    }
}

/// The calling thread's `errno`, or `dflt` when it is 0 (a library that
/// failed without saying why).
pub(crate) fn errno_or(dflt: c_int) -> c_int {
    match errno() {
        0 => dflt,
        e => e,
    }
}
