//! The librdmacm internals rdma-core's `rsocket.c` calls (its
//! `librdmacm/cma.h`), over this library's port of `cma.c`. Each is an
//! `extern "C"` function here and reaches the vendored C under its
//! rdma-core name through a hidden assembler alias (`.hidden`: linkable
//! inside `librdmacm.so.1`, exported by nothing; a `#[no_mangle]` item
//! would land in rustc's export list). rsocket.c needs no private
//! structure of the library: it reads only `struct rdma_cm_id`'s public
//! fields, and these functions look behind the id for it.
//!
//! - `ucma_init`: learns libibverbs' devices (`ENODEV` when there is
//!   none); rsocket's `rs_configure` then reads its tunables.
//! - `ucma_ib_init`: nothing (rdma-core connects to ibacm here; vrnic has
//!   no ibacm).
//! - `ucma_max_qpsize`: the id's device's `max_qp_wr`, or the smallest of
//!   all devices' for NULL or an id without a device.
//! - `ucma_complete`: a synchronous id waits for the event its call caused
//!   ([`crate::events::complete`]).
//! - `ucma_shutdown`: the id's QP to ERROR (SQD on iWARP), `EINVAL`
//!   without a device.
//! - `ucma_addrlen`: the length of an IPv4 or IPv6 address, else 0.

use std::ffi::c_int;

use crate::boundary::{fail, ffi};
use crate::ffi::*;
use crate::id::cm;

/// The target's unconditional branch to the operand `{f}` of [`alias!`].
#[cfg(target_arch = "x86_64")]
macro_rules! jump_to_f {
    () => {
        "jmp {f}"
    };
}
#[cfg(target_arch = "aarch64")]
macro_rules! jump_to_f {
    () => {
        "b {f}"
    };
}

/// Defines the hidden function `$name`, a branch to `$f`.
macro_rules! alias {
    ($name:literal, $f:path) => {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        std::arch::global_asm!(
            ".pushsection .text",
            concat!(".globl ", $name),
            concat!(".hidden ", $name),
            concat!(".type ", $name, ", %function"),
            ".p2align 4",
            concat!($name, ":"),
            jump_to_f!(),
            concat!(".size ", $name, ", . - ", $name),
            ".popsection",
            f = sym $f,
        );
    };
}

alias!("ucma_init", ucma_init);
alias!("ucma_ib_init", ucma_ib_init);
alias!("ucma_max_qpsize", ucma_max_qpsize);
alias!("ucma_complete", ucma_complete);
alias!("ucma_shutdown", ucma_shutdown);
alias!("ucma_addrlen", ucma_addrlen);

/// `int ucma_init(void)`: 0, or -1 with `errno` (`ENODEV`: no device).
extern "C" fn ucma_init() -> c_int {
    ffi("ucma_init", || match crate::device::sync_list() {
        Ok(()) => 0,
        Err(e) => fail(e),
    })
}

/// `void ucma_ib_init(void)`: nothing, vrnic has no ibacm.
extern "C" fn ucma_ib_init() {}

/// `int ucma_max_qpsize(struct rdma_cm_id *id)`.
extern "C" fn ucma_max_qpsize(id: *mut rdma_cm_id) -> c_int {
    ffi("ucma_max_qpsize", || {
        if !id.is_null() {
            // SAFETY: an id of this library (rsocket's own).
            if let Some(d) = unsafe { cm(id) }.device() {
                return d.max_qpsize;
            }
        }
        crate::device::min_max_qpsize()
    })
}

/// `int ucma_complete(struct rdma_cm_id *id)`: 0, or -1 with `errno`.
extern "C" fn ucma_complete(id: *mut rdma_cm_id) -> c_int {
    ffi("ucma_complete", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an id of this library (rsocket's own).
        match crate::events::complete(unsafe { cm(id) }) {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `int ucma_shutdown(struct rdma_cm_id *id)`: 0, or -1 with `errno`.
extern "C" fn ucma_shutdown(id: *mut rdma_cm_id) -> c_int {
    ffi("ucma_shutdown", || {
        // SAFETY: NULL or an id of this library.
        let Some(id) = (unsafe { id.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: NULL or the id's open context (libibverbs').
        let Some(verbs) = (unsafe { id.verbs.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        // SAFETY: NULL or the context's device (libibverbs').
        let Some(dev) = (unsafe { verbs.device.as_ref() }) else {
            return fail(libc::EINVAL);
        };
        let transport = dev.transport_type;
        let r = match transport {
            IBV_TRANSPORT_IB => crate::qp::modify_qp_err(id),
            IBV_TRANSPORT_IWARP => crate::qp::modify_qp_sqd(id),
            _ => Err(libc::EINVAL),
        };
        match r {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `int ucma_addrlen(struct sockaddr *addr)`.
extern "C" fn ucma_addrlen(addr: *mut sockaddr) -> c_int {
    crate::addr::addrlen(addr) as c_int
}
