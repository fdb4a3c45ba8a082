//! The rsocket API (`rsocket(7)`): rdma-core v44.0's `librdmacm/rsocket.c`,
//! vendored unchanged (`vendor/rdma-core/`, compiled by build.rs) on this
//! library's `rdma_*` functions, the process's libibverbs and the
//! internals of [`crate::internals`]. The C definitions carry hidden names
//! (`vrnic_rs_<name>`, `vendor/rdma-core/vrnic/names.h`); these
//! declarations give `symbols` the functions its versioned trampolines
//! branch to, so each is exported as rdma-core exports it
//! (`rsocket@@RDMACM_1.0`, ...). `rfcntl` is variadic: the trampoline's
//! jump leaves its arguments as the caller passed them.

use std::ffi::{c_int, c_void};

use crate::ffi::{sockaddr, socklen_t};

extern "C" {
    #[link_name = "vrnic_rs_rsocket"]
    pub(crate) fn rsocket(domain: c_int, type_: c_int, protocol: c_int) -> c_int;
    #[link_name = "vrnic_rs_rbind"]
    pub(crate) fn rbind(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    #[link_name = "vrnic_rs_rlisten"]
    pub(crate) fn rlisten(socket: c_int, backlog: c_int) -> c_int;
    #[link_name = "vrnic_rs_raccept"]
    pub(crate) fn raccept(socket: c_int, addr: *mut sockaddr, addrlen: *mut socklen_t) -> c_int;
    #[link_name = "vrnic_rs_rconnect"]
    pub(crate) fn rconnect(socket: c_int, addr: *const sockaddr, addrlen: socklen_t) -> c_int;
    #[link_name = "vrnic_rs_rshutdown"]
    pub(crate) fn rshutdown(socket: c_int, how: c_int) -> c_int;
    #[link_name = "vrnic_rs_rclose"]
    pub(crate) fn rclose(socket: c_int) -> c_int;
    #[link_name = "vrnic_rs_rrecv"]
    pub(crate) fn rrecv(socket: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    #[link_name = "vrnic_rs_rrecvfrom"]
    pub(crate) fn rrecvfrom(
        socket: c_int,
        buf: *mut c_void,
        len: usize,
        flags: c_int,
        src_addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> isize;
    #[link_name = "vrnic_rs_rrecvmsg"]
    pub(crate) fn rrecvmsg(socket: c_int, msg: *mut libc::msghdr, flags: c_int) -> isize;
    #[link_name = "vrnic_rs_rsend"]
    pub(crate) fn rsend(socket: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize;
    #[link_name = "vrnic_rs_rsendto"]
    pub(crate) fn rsendto(
        socket: c_int,
        buf: *const c_void,
        len: usize,
        flags: c_int,
        dest_addr: *const sockaddr,
        addrlen: socklen_t,
    ) -> isize;
    #[link_name = "vrnic_rs_rsendmsg"]
    pub(crate) fn rsendmsg(socket: c_int, msg: *const libc::msghdr, flags: c_int) -> isize;
    #[link_name = "vrnic_rs_rread"]
    pub(crate) fn rread(socket: c_int, buf: *mut c_void, count: usize) -> isize;
    #[link_name = "vrnic_rs_rreadv"]
    pub(crate) fn rreadv(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize;
    #[link_name = "vrnic_rs_rwrite"]
    pub(crate) fn rwrite(socket: c_int, buf: *const c_void, count: usize) -> isize;
    #[link_name = "vrnic_rs_rwritev"]
    pub(crate) fn rwritev(socket: c_int, iov: *const libc::iovec, iovcnt: c_int) -> isize;
    #[link_name = "vrnic_rs_rpoll"]
    pub(crate) fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    #[link_name = "vrnic_rs_rselect"]
    pub(crate) fn rselect(
        nfds: c_int,
        readfds: *mut libc::fd_set,
        writefds: *mut libc::fd_set,
        exceptfds: *mut libc::fd_set,
        timeout: *mut libc::timeval,
    ) -> c_int;
    #[link_name = "vrnic_rs_rgetpeername"]
    pub(crate) fn rgetpeername(
        socket: c_int,
        addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> c_int;
    #[link_name = "vrnic_rs_rgetsockname"]
    pub(crate) fn rgetsockname(
        socket: c_int,
        addr: *mut sockaddr,
        addrlen: *mut socklen_t,
    ) -> c_int;
    #[link_name = "vrnic_rs_rsetsockopt"]
    pub(crate) fn rsetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *const c_void,
        optlen: socklen_t,
    ) -> c_int;
    #[link_name = "vrnic_rs_rgetsockopt"]
    pub(crate) fn rgetsockopt(
        socket: c_int,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: *mut socklen_t,
    ) -> c_int;
    #[link_name = "vrnic_rs_rfcntl"]
    pub(crate) fn rfcntl(socket: c_int, cmd: c_int, ...) -> c_int;
    #[link_name = "vrnic_rs_riomap"]
    pub(crate) fn riomap(
        socket: c_int,
        buf: *mut c_void,
        len: usize,
        prot: c_int,
        flags: c_int,
        offset: libc::off_t,
    ) -> libc::off_t;
    #[link_name = "vrnic_rs_riounmap"]
    pub(crate) fn riounmap(socket: c_int, buf: *mut c_void, len: usize) -> c_int;
    #[link_name = "vrnic_rs_riowrite"]
    pub(crate) fn riowrite(
        socket: c_int,
        buf: *const c_void,
        count: usize,
        offset: libc::off_t,
        flags: c_int,
    ) -> usize;
}
