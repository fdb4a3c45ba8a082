//! What vrnic does not implement: multicast (`rdma_join_multicast(3)`,
//! `rdma_join_multicast_ex(3)`, `rdma_leave_multicast(3)`: the agent's CM
//! has no multicast) and the rsocket API, every function with its exact C
//! signature, failing with librdmacm's convention for its return type and
//! `errno = ENOSYS` (`-1`, NULL, or for `riowrite` `(size_t)-1`). A NULL
//! `rdma_cm_id` (or address) is `EINVAL` first: rdma-core dereferences
//! them, this library never crashes on an argument. With
//! `VRNIC_RDMACM_DEBUG` set, each call says why on stderr; the first
//! multicast call of a process says so in any case.
//!
//! `rfcntl(3)` is variadic in C (`int rfcntl(int, int, ...)`); stable Rust
//! cannot define a variadic function, so it is defined with the two fixed
//! arguments: on the C ABIs this library targets (x86-64 SysV, AArch64
//! AAPCS) the caller passes the variadic argument in a register or its own
//! frame and cleans up, so a callee that ignores it is sound.

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
            "librdmacm (vrnic): {name}: {}",
            if multicast {
                "multicast is not supported by vrnic's connection manager"
            } else {
                "the rsocket API is not implemented"
            }
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
    /// `rsocket(7)`: `rsocket`.
    fn rsocket(domain: c_int, type_: c_int, protocol: c_int) -> c_int;
    /// `rsocket(7)`: `rbind`.
    fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    /// `rsocket(7)`: `rlisten`.
    fn rlisten(socket: c_int, backlog: c_int) -> c_int;
    /// `rsocket(7)`: `raccept`.
    fn raccept(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int;
    /// `rsocket(7)`: `rconnect`.
    fn rconnect(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    /// `rsocket(7)`: `rshutdown`.
    fn rshutdown(socket: c_int, how: c_int) -> c_int;
    /// `rsocket(7)`: `rclose`.
    fn rclose(socket: c_int) -> c_int;
    /// `rsocket(7)`: `rrecv`.
    fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    /// `rsocket(7)`: `rrecvfrom`.
    fn rrecvfrom(
        socket: c_int,
        buf: *mut c_void,
        len: usize,
        flags: c_int,
        src_addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> isize;
    /// `rsocket(7)`: `rrecvmsg`.
    fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize;
    /// `rsocket(7)`: `rsend`.
    fn rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize;
    /// `rsocket(7)`: `rsendto`.
    fn rsendto(
        socket: c_int,
        buf: *const c_void,
        len: usize,
        flags: c_int,
        dest_addr: *const sockaddr,
        addrlen: socklen_t,
    ) -> isize;
    /// `rsocket(7)`: `rsendmsg`.
    fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize;
    /// `rsocket(7)`: `rread`.
    fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize;
    /// `rsocket(7)`: `rreadv`.
    fn rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize;
    /// `rsocket(7)`: `rwrite`.
    fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize;
    /// `rsocket(7)`: `rwritev`.
    fn rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize;
    /// `rsocket(7)`: `rpoll`.
    fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    /// `rsocket(7)`: `rselect`.
    fn rselect(
        nfds: c_int,
        readfds: *mut libc::fd_set,
        writefds: *mut libc::fd_set,
        exceptfds: *mut libc::fd_set,
        timeout: *mut libc::timeval,
    ) -> c_int;
    /// `rsocket(7)`: `rgetpeername`.
    fn rgetpeername(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int;
    /// `rsocket(7)`: `rgetsockname`.
    fn rgetsockname(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int;
    /// `rsocket(7)`: `rsetsockopt`.
    fn rsetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *const c_void,
        optlen: socklen_t,
    ) -> c_int;
    /// `rsocket(7)`: `rgetsockopt`.
    fn rgetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: *mut socklen_t,
    ) -> c_int;
    /// `rsocket(7)`: `rfcntl` (variadic in C; see the module documentation).
    fn rfcntl(socket: c_int, cmd: c_int) -> c_int;
    /// `rsocket(7)`: `riomap`.
    fn riomap(
        socket: c_int,
        buf: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        offset: libc::off_t,
    ) -> libc::off_t;
    /// `rsocket(7)`: `riounmap`.
    fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int;
    /// `rsocket(7)`: `riowrite` (returns `size_t`: `(size_t)-1` on failure).
    fn riowrite(
        socket: c_int,
        buf: *const c_void,
        count: usize,
        offset: libc::off_t,
        flags: c_int,
    ) -> usize;
}
