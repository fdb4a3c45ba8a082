//! What vrnic does not implement: multicast (`rdma_join_multicast(3)`,
//! `rdma_join_multicast_ex(3)`, `rdma_leave_multicast(3)`: the agent's CM
//! has no multicast), each function with its exact C signature, failing
//! with librdmacm's convention (`-1`) and `errno = ENOSYS`. A NULL
//! `rdma_cm_id` (or address) is `EINVAL` first: rdma-core dereferences
//! them, this library never crashes on an argument. With
//! `VRNIC_RDMACM_DEBUG` set, each call says why on stderr; the first
//! multicast call of a process says so in any case.

use std::ffi::{c_int, c_void};
use std::io::Write as _;

use crate::boundary::{debug, fail, ffi, Failed};
use crate::ffi::*;

/// `errno = ENOSYS` and the failure value, with a line on stderr under
/// `VRNIC_RDMACM_DEBUG`; for multicast, the first call of the process
/// says so on stderr whatever the setting: a program's own message only
/// shows `strerror(ENOSYS)` ("Function not implemented"), which does not
/// tell its user that the missing piece is multicast (mckey).
fn enosys<R: Failed>(name: &str) -> R {
    static MULTICAST_TOLD: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
    let multicast = name.contains("multicast");
    let first = multicast && !MULTICAST_TOLD.swap(true, std::sync::atomic::Ordering::Relaxed);
    if debug() || first {
        let _ = writeln!(
            std::io::stderr(),
            "librdmacm (vrnic): {name}: multicast is not supported by vrnic's connection manager"
        );
    }
    fail(libc::ENOSYS)
}

/// Defines each function: `EINVAL` when one of the pointers listed after
/// `nonnull` is NULL, else [`enosys`].
macro_rules! not_yet {
    ($(
        $(#[$m:meta])*
        fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? $(; nonnull $($p:ident),+)?;
    )*) => {$(
        $(#[$m])*
        #[allow(unused_variables)]
        pub(crate) extern "C" fn $name($($a: $t),*) $(-> $r)? {
            ffi(stringify!($name), || {
                $($(if $p.is_null() { return fail(libc::EINVAL); })+)?
                enosys(stringify!($name))
            })
        }
    )*};
}

not_yet! {
    /// `rdma_join_multicast(3)`: not supported (`ENOSYS`).
    fn rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void)
        -> c_int; nonnull id, addr;
    /// `rdma_leave_multicast(3)`: not supported (`ENOSYS`).
    fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int; nonnull id, addr;
    /// `rdma_join_multicast_ex(3)`: not supported (`ENOSYS`).
    fn rdma_join_multicast_ex(
        id: *mut rdma_cm_id,
        mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
        context: *mut c_void,
    ) -> c_int; nonnull id, mc_join_attr;
}
