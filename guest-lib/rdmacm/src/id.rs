//! Communication identifiers: `rdma_create_id(3)`, `rdma_destroy_id(3)`,
//! `rdma_set_option(3)`, `rdma_get_src_port(3)`/`rdma_get_dst_port(3)` and
//! the ECE pair (`rdma_set_local_ece(3)`, `rdma_get_remote_ece(3)`), the
//! parts that need no connection manager.
//!
//! An id is a [`CmId`]: the header's `struct rdma_cm_id` first (the
//! layout applications and `<rdma/rdma_verbs.h>`'s inline functions
//! read), then what rdma-core keeps in its `struct cma_id_private`
//! (`librdmacm/cma.c`) and the kernel's `rdma_ucm` keeps per id.

use std::ffi::{c_int, c_void};

use crate::boundary::{fail, ffi};
use crate::event_channel::{self, Channel};
use crate::ffi::*;

/// An id as allocated by this library.
#[repr(C)]
pub(crate) struct CmId {
    /// `struct rdma_cm_id`, what applications see.
    pub(crate) id: rdma_cm_id,
    /// The id made its own channel (`rdma_create_id` with a NULL channel:
    /// synchronous operation); destroying the id destroys it.
    pub(crate) sync: bool,
    /// `RDMA_OPTION_ID_TOS`, once set.
    pub(crate) tos: Option<u8>,
    /// `RDMA_OPTION_ID_REUSEADDR`.
    pub(crate) reuseaddr: bool,
    /// `RDMA_OPTION_ID_AFONLY`, once set.
    pub(crate) afonly: Option<bool>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`, once set.
    pub(crate) ack_timeout: Option<u8>,
    /// `rdma_set_local_ece(3)`'s vendor id and options.
    pub(crate) local_ece: (u32, u32),
    /// The peer's ECE (none until a connection exists).
    pub(crate) remote_ece: (u32, u32),
}

/// `rdma_create_id(3)`: allocates an id on `channel` (NULL: a channel of
/// its own, for synchronous use) with `ps` (`RDMA_PS_TCP`, `RDMA_PS_UDP`,
/// `RDMA_PS_IB`, `RDMA_PS_IPOIB`) and `context`. `qp_type` is UD for
/// `RDMA_PS_UDP`/`RDMA_PS_IPOIB`, RC otherwise, as `rdma_create_id` in
/// rdma-core's `librdmacm/cma.c`; another `ps` is `EINVAL`, as the kernel's
/// `ucma_get_qp_type` (drivers/infiniband/core/ucma.c) answers it. A NULL
/// `id` is `EINVAL` (librdmacm would crash). `verbs` stays NULL until an
/// address binds the id to a device.
pub(crate) extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    ffi("rdma_create_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        let qp_type = match ps {
            RDMA_PS_TCP | RDMA_PS_IB => IBV_QPT_RC,
            RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
            _ => return fail(libc::EINVAL),
        };
        let (channel, sync) = if channel.is_null() {
            match event_channel::create() {
                Some(ch) => (ch.cast::<rdma_event_channel>(), true),
                None => return -1,
            }
        } else {
            (channel, false)
        };
        let c = rdma_cm_id {
            channel,
            context,
            ps,
            qp_type,
            ..Default::default()
        };
        let cm = Box::new(CmId {
            id: c,
            sync,
            tos: None,
            reuseaddr: false,
            afonly: None,
            ack_timeout: None,
            local_ece: (0, 0),
            remote_ece: (0, 0),
        });
        // SAFETY: `id` is non-NULL; the caller passes where to store the id.
        unsafe { *id = Box::into_raw(cm).cast() };
        0
    })
}

/// Frees an id this library made (and its own channel, if synchronous).
///
/// # Safety
/// `id` came from [`rdma_create_id`] and is not used afterwards.
pub(crate) unsafe fn free(id: *mut rdma_cm_id) {
    // SAFETY: the caller's contract: `id` is the head of a live CmId Box.
    let cm = unsafe { Box::from_raw(id.cast::<CmId>()) };
    if cm.sync && !cm.id.channel.is_null() {
        // SAFETY: a synchronous id's channel is its own, made by
        // event_channel::create; nothing else refers to it.
        unsafe { event_channel::destroy(cm.id.channel.cast::<Channel>()) };
    }
}

/// `rdma_destroy_id(3)`: releases an id (and its own channel, for one
/// created without a channel). The man page requires its QP destroyed and
/// its events acknowledged first; no event exists yet. NULL is `EINVAL`.
pub(crate) extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ffi("rdma_destroy_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an id pointer applications hold came from rdma_create_id.
        unsafe { free(id) };
        0
    })
}

/// `rdma_destroy_ep(3)`: destroys an id made by `rdma_create_ep` with its
/// QP and SRQ. No endpoint can hold a QP yet, so this is
/// [`rdma_destroy_id`] (NULL: `EINVAL`, nothing done).
pub(crate) extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    rdma_destroy_id(id);
}

/// `KMALLOC_MAX_SIZE` on x86-64 Linux 6.1 (4 MiB): the kernel's `rdma_ucm`
/// refuses a longer `optlen` with `EINVAL` (`ucma_set_option`).
const KMALLOC_MAX_SIZE: usize = 4 << 20;

/// `rdma_set_option(3)`: sets an option of an unbound id with the checks
/// the kernel's `rdma_ucm` makes (rdma-core's `rdma_set_option` passes
/// everything to it; Linux `drivers/infiniband/core/ucma.c`
/// `ucma_set_option`, `ucma_set_option_id`, `ucma_set_ib_path`):
/// `optlen` over `KMALLOC_MAX_SIZE` is `EINVAL`, an unreadable (NULL)
/// `optval` with a length `EFAULT`; at `RDMA_OPTION_ID`, `TOS` and
/// `ACK_TIMEOUT` take a `uint8_t`, `REUSEADDR` and `AFONLY` an `int`
/// (another length: `EINVAL`); at `RDMA_OPTION_IB`, `IB_PATH` takes
/// `struct ibv_path_data[]` and, on an id bound to no device (every id,
/// until the CM exists), is `EINVAL`; an unknown level or name is
/// `ENOSYS`. A NULL id is `EINVAL`.
pub(crate) extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    ffi("rdma_set_option", || {
        if id.is_null() || optlen > KMALLOC_MAX_SIZE {
            return fail(libc::EINVAL);
        }
        if optval.is_null() && optlen > 0 {
            return fail(libc::EFAULT);
        }
        // SAFETY: ids applications hold came from rdma_create_id.
        let cm = unsafe { &mut *id.cast::<CmId>() };
        let byte = || {
            // SAFETY: optlen == 1 and optval non-NULL (checked above).
            unsafe { *optval.cast::<u8>() }
        };
        let int = || {
            // SAFETY: optlen == sizeof(int) and optval non-NULL; the
            // application's int need not be aligned for us.
            unsafe { optval.cast::<c_int>().read_unaligned() }
        };
        match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen == 1 => cm.tos = Some(byte()),
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {
                cm.ack_timeout = Some(byte())
            }
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) if optlen == 4 => cm.reuseaddr = int() != 0,
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) if optlen == 4 => cm.afonly = Some(int() != 0),
            (
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS
                | RDMA_OPTION_ID_ACK_TIMEOUT
                | RDMA_OPTION_ID_REUSEADDR
                | RDMA_OPTION_ID_AFONLY,
            ) => return fail(libc::EINVAL),
            // Any length: not a whole number of path records, no primary
            // path, or (always, for now) no device: all EINVAL.
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => return fail(libc::EINVAL),
            _ => return fail(libc::ENOSYS),
        }
        0
    })
}

/// The port of a socket address (network byte order), 0 for a family
/// without one: rdma-core's `ucma_get_port` (`librdmacm/cma.c`).
fn port_of(sa: &libc::sockaddr_storage) -> u16 {
    match sa.ss_family as c_int {
        libc::AF_INET => {
            // SAFETY: an AF_INET address in a sockaddr_storage is a sockaddr_in.
            unsafe { (*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()).sin_port }
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for AF_INET6.
            unsafe {
                (*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()).sin6_port
            }
        }
        // AF_IB (27): the low 16 bits of the service id `sib_sid`, a
        // big-endian u64 at offset 24 of `struct sockaddr_ib`.
        27 => {
            let b: &[u8; 128] = {
                // SAFETY: sockaddr_storage is 128 bytes, all initialized
                // (the id is allocated zeroed).
                unsafe { &*(sa as *const libc::sockaddr_storage).cast::<[u8; 128]>() }
            };
            u16::from_be_bytes([b[30], b[31]]).to_be()
        }
        _ => 0,
    }
}

/// `rdma_get_src_port(3)`: the id's local port in network byte order (0
/// before an address is bound). librdmacm does not check the id; NULL
/// returns 0 with `errno = EINVAL`.
pub(crate) extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    ffi("rdma_get_src_port", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: ids applications hold came from rdma_create_id; the
        // source address union is a `sockaddr_storage` (its largest member).
        port_of(unsafe { &*std::ptr::addr_of!((*id).route.addr.__bindgen_anon_1).cast() })
    })
}

/// `rdma_get_dst_port(3)`: the peer's port in network byte order (0 while
/// unconnected); NULL as [`rdma_get_src_port`].
pub(crate) extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    ffi("rdma_get_dst_port", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: as in rdma_get_src_port.
        port_of(unsafe { &*std::ptr::addr_of!((*id).route.addr.__bindgen_anon_2).cast() })
    })
}

/// `rdma_set_local_ece(3)`: the ECE options to offer when connecting.
/// As rdma-core (`librdmacm/cma.c`): `EINVAL` for a NULL id or ece, an id
/// with a QP, a zero `vendor_id` or a non-zero `comp_mask`.
pub(crate) extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ffi("rdma_set_local_ece", || {
        if id.is_null() || ece.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: non-NULL; ids come from rdma_create_id, ece is the caller's.
        let (cm, ece) = unsafe { (&mut *id.cast::<CmId>(), &*ece) };
        if !cm.id.qp.is_null() || ece.vendor_id == 0 || ece.comp_mask != 0 {
            return fail(libc::EINVAL);
        }
        cm.local_ece = (ece.vendor_id, ece.options);
        0
    })
}

/// `rdma_get_remote_ece(3)`: the peer's ECE options (zero until a
/// connection request or reply carried them). `EINVAL` for a NULL id or
/// ece or an id with a QP, as rdma-core.
pub(crate) extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ffi("rdma_get_remote_ece", || {
        if id.is_null() || ece.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: non-NULL; ids come from rdma_create_id, ece is the caller's.
        let (cm, ece) = unsafe { (&*id.cast::<CmId>(), &mut *ece) };
        if !cm.id.qp.is_null() {
            return fail(libc::EINVAL);
        }
        ece.vendor_id = cm.remote_ece.0;
        ece.options = cm.remote_ece.1;
        ece.comp_mask = 0;
        0
    })
}
