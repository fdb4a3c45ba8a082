//! What needs the connection manager, not there yet: every such function
//! of `<rdma/rdma_cma.h>` and `<rdma/rsocket.h>` with its exact C
//! signature, failing with librdmacm's convention for its return type and
//! `errno = ENOSYS` (`-1`, NULL, or for `riowrite` `(size_t)-1`; a `void`
//! function only sets `errno`). A NULL `rdma_cm_id` (or event, channel,
//! out-pointer the function must write) is `EINVAL` first: rdma-core
//! dereferences them, this library never crashes on an argument. With
//! `VRNIC_RDMACM_DEBUG` set, each call says so on stderr.
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
/// `VRNIC_RDMACM_DEBUG`.
fn enosys<R: Failed>(name: &str) -> R {
    if debug() {
        let _ = writeln!(
            std::io::stderr(),
            "librdmacm (vrnic): {name} needs the connection manager, not implemented yet"
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
    /// `rdma_create_ep(3)`: resolves and creates an endpoint (id + QP).
    fn rdma_create_ep(
        id: *mut *mut rdma_cm_id,
        res: *mut rdma_addrinfo,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int; nonnull id, res;
    /// `rdma_bind_addr(3)`: binds an id to a local address (and device).
    fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int; nonnull id;
    /// `rdma_resolve_addr(3)`: resolves a destination address to a device.
    fn rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src_addr: *mut sockaddr,
        dst_addr: *mut sockaddr,
        timeout_ms: c_int,
    ) -> c_int; nonnull id;
    /// `rdma_resolve_route(3)`: resolves the route to the destination.
    fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int; nonnull id;
    /// `rdma_create_qp(3)`: a QP on the id's device, moved to INIT.
    fn rdma_create_qp(
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int; nonnull id, qp_init_attr;
    /// `rdma_create_qp_ex(3)`.
    fn rdma_create_qp_ex(id: *mut rdma_cm_id, qp_init_attr: *mut ibv_qp_init_attr_ex) -> c_int;
        nonnull id, qp_init_attr;
    /// `rdma_destroy_qp(3)`.
    fn rdma_destroy_qp(id: *mut rdma_cm_id); nonnull id;
    /// `rdma_create_srq(3)`.
    fn rdma_create_srq(
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        attr: *mut ibv_srq_init_attr,
    ) -> c_int; nonnull id, attr;
    /// `rdma_create_srq_ex(3)`.
    fn rdma_create_srq_ex(id: *mut rdma_cm_id, attr: *mut ibv_srq_init_attr_ex) -> c_int;
        nonnull id, attr;
    /// `rdma_destroy_srq(3)`.
    fn rdma_destroy_srq(id: *mut rdma_cm_id); nonnull id;
    /// `rdma_connect(3)`: sends a connection request (IB CM REQ, or SIDR for UD).
    fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int; nonnull id;
    /// `rdma_establish(3)`: completes an active connection whose QP the
    /// application moved to RTS itself (REP → RTU).
    fn rdma_establish(id: *mut rdma_cm_id) -> c_int; nonnull id;
    /// `rdma_listen(3)`.
    fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int; nonnull id;
    /// `rdma_get_request(3)`: the next connection request of a synchronous listener.
    fn rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int;
        nonnull listen, id;
    /// `rdma_accept(3)`: accepts a connection request (REP).
    fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int; nonnull id;
    /// `rdma_reject(3)`: rejects a connection request (REJ, consumer reason).
    fn rdma_reject(
        id: *mut rdma_cm_id,
        private_data: *const c_void,
        private_data_len: u8,
    ) -> c_int; nonnull id;
    /// `rdma_reject_ece(3)`: rejects for an ECE mismatch.
    fn rdma_reject_ece(
        id: *mut rdma_cm_id,
        private_data: *const c_void,
        private_data_len: u8,
    ) -> c_int; nonnull id;
    /// `rdma_notify(3)`: tells the CM of a QP event (`IBV_EVENT_COMM_EST`).
    fn rdma_notify(id: *mut rdma_cm_id, event: ibv_event_type) -> c_int; nonnull id;
    /// `rdma_disconnect(3)`: DREQ, QP to ERROR.
    fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int; nonnull id;
    /// `rdma_join_multicast(3)`.
    fn rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr, context: *mut c_void)
        -> c_int; nonnull id, addr;
    /// `rdma_leave_multicast(3)`.
    fn rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int; nonnull id, addr;
    /// `rdma_join_multicast_ex(3)`.
    fn rdma_join_multicast_ex(
        id: *mut rdma_cm_id,
        mc_join_attr: *mut rdma_cm_join_mc_attr_ex,
        context: *mut c_void,
    ) -> c_int; nonnull id, mc_join_attr;
    /// `rdma_get_cm_event(3)`: the next event of a channel.
    fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event)
        -> c_int; nonnull channel, event;
    /// `rdma_ack_cm_event(3)`: frees an event (none is ever handed out yet).
    fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int; nonnull event;
    /// `rdma_migrate_id(3)`: moves an id to another channel.
    fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int; nonnull id;
    /// `rdma_init_qp_attr(3)`: the attributes for the application's own
    /// QP transitions (from the connection's path and parameters).
    fn rdma_init_qp_attr(id: *mut rdma_cm_id, qp_attr: *mut ibv_qp_attr, qp_attr_mask: *mut c_int)
        -> c_int; nonnull id, qp_attr, qp_attr_mask;

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
