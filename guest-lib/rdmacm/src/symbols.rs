//! The exported symbols: one versioned export per line of `librdmacm.map`
//! (generated from Debian's librdmacm.so.1 by `guest-lib/ibverbs/gen-map.sh`).
//!
//! As in vrnic-ibverbs (`guest-lib/ibverbs/src/symbols.rs`, which explains
//! why): every export is an assembler trampoline `vrnic_sym_<name>_<node>:
//! jmp <implementation>` with a `.symver` giving it its public name and
//! node (`rdma_establish@@RDMACM_1.2`); build.rs passes the map to the
//! link as version script and generates the list (`$OUT_DIR/exports.rs`),
//! so a symbol of the map without an implementation here is a compile
//! error, and one the map lacks cannot be exported. The rsocket functions'
//! implementations are C (`crate::rsocket`): their trampolines branch to
//! the vendored rsocket.c's hidden definitions.

use crate::addr::{rdma_bind_addr, rdma_resolve_addr};
use crate::addrinfo::{rdma_freeaddrinfo, rdma_getaddrinfo};
use crate::channel::{rdma_create_event_channel, rdma_destroy_event_channel};
use crate::connect::{
    rdma_accept, rdma_connect, rdma_disconnect, rdma_establish, rdma_listen, rdma_notify,
    rdma_reject, rdma_reject_ece,
};
use crate::device::{rdma_free_devices, rdma_get_devices};
use crate::ep::{rdma_create_ep, rdma_destroy_ep, rdma_get_request};
use crate::events::{rdma_ack_cm_event, rdma_get_cm_event, rdma_migrate_id};
use crate::id::{
    rdma_create_id, rdma_destroy_id, rdma_get_dst_port, rdma_get_remote_ece, rdma_get_src_port,
    rdma_set_local_ece, rdma_set_option,
};
use crate::qp::{
    rdma_create_qp, rdma_create_qp_ex, rdma_create_srq, rdma_create_srq_ex, rdma_destroy_qp,
    rdma_destroy_srq, rdma_init_qp_attr,
};
use crate::route::rdma_resolve_route;
use crate::rsocket::*;
use crate::strings::rdma_event_str;
use crate::stubs::*;

/// The target's unconditional branch to the operand `{f}` of [`export!`].
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

/// Exports function `$f` as `$ver` (`name@@NODE` or `name@NODE`) through
/// the trampoline `$tramp`, which branches to it. (`%function`: the one
/// spelling of the type both targets' assemblers take; `@` starts a
/// comment on aarch64.)
macro_rules! export {
    ($f:path, $tramp:literal, $ver:literal) => {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        std::arch::global_asm!(
            ".pushsection .text",
            concat!(".globl ", $tramp),
            concat!(".type ", $tramp, ", %function"),
            ".p2align 4",
            concat!($tramp, ":"),
            jump_to_f!(),
            concat!(".size ", $tramp, ", . - ", $tramp),
            concat!(".symver ", $tramp, ", ", $ver),
            ".popsection",
            f = sym $f,
        );
    };
}

include!(concat!(env!("OUT_DIR"), "/exports.rs"));
