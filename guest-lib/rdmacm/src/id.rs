//! Communication identifiers: `rdma_create_id(3)`, `rdma_destroy_id(3)`,
//! `rdma_set_option(3)`, `rdma_get_src_port(3)`/`rdma_get_dst_port(3)` and
//! the ECE pair (`rdma_set_local_ece(3)`, `rdma_get_remote_ece(3)`).
//!
//! An id is a [`CmId`]: the header's `struct rdma_cm_id` first (the
//! layout applications and `<rdma/rdma_verbs.h>`'s inline functions
//! read), then what rdma-core keeps in its `struct cma_id_private`
//! (`librdmacm/cma.c`): the agent's handle of the id, the device, the
//! count of events acknowledged. The agent learns the id's address as its
//! `uid` (`CREATE_ID`), and names it so in events; the library accepts
//! only the uids of its live ids ([`lookup_uid`]).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::{Condvar, Mutex};

use vrnic_guest::agent::ucma::abi as kabi;

use crate::boundary::{fail, ffi, say};
use crate::channel::{self, Channel};
use crate::device::{self, CmaDevice};
use crate::ffi::*;
use crate::verbs::zeroed;
use vrnic_guest::agent::ucma::proto::MAX_OPTION_LEN;

/// An id as allocated by this library (rdma-core's `cma_id_private`).
#[repr(C)]
pub(crate) struct CmId {
    /// `struct rdma_cm_id`, what applications see.
    pub(crate) id: rdma_cm_id,
    /// The device the id is bound to (once the agent named it).
    pub(crate) dev: *mut CmaDevice,
    /// Private data `rdma_create_ep(3)` took from `ai_connect`, sent with
    /// the next connect or accept.
    pub(crate) connect: Vec<u8>,
    /// Events of this id acknowledged (`rdma_ack_cm_event`); `cond`
    /// signals each.
    pub(crate) events_completed: Mutex<u32>,
    cond: Condvar,
    /// The connection failed in the library (CONNECT_ERROR reported): the
    /// agent's REJECTED/DISCONNECTED that follow are swallowed.
    pub(crate) connect_error: bool,
    /// The id made its own channel (synchronous operation).
    pub(crate) sync: bool,
    /// The agent's handle of the id.
    pub(crate) handle: u32,
    /// `rdma_create_ep(3)`'s QP attributes, for `rdma_get_request(3)`.
    pub(crate) qp_init_attr: Option<ibv_qp_init_attr>,
    /// Initiator depth and responder resources negotiated.
    pub(crate) initiator_depth: u8,
    pub(crate) responder_resources: u8,
    /// ECE (vendor id, options): ours and the peer's.
    pub(crate) local_ece: (u32, u32),
    pub(crate) remote_ece: (u32, u32),
}

/// Live ids by agent handle (rdma-core's `ucma_idm`), holding their addresses.
static IDS: Mutex<BTreeMap<u32, usize>> = Mutex::new(BTreeMap::new());

/// The id whose address the agent gave as `uid`, if it is a live id.
pub(crate) fn lookup_uid(uid: u64) -> Option<*mut CmId> {
    let ids = IDS.lock().unwrap_or_else(|e| e.into_inner());
    ids.values()
        .any(|&p| p as u64 == uid)
        .then_some(uid as usize as *mut CmId)
}

/// The live id with agent handle `handle` (rdma-core's `ucma_lookup_id`).
pub(crate) fn lookup_handle(handle: u32) -> Option<*mut CmId> {
    let ids = IDS.lock().unwrap_or_else(|e| e.into_inner());
    ids.get(&handle).map(|&p| p as *mut CmId)
}

/// Registers `cm` under its handle (`ucma_insert_id`).
pub(crate) fn insert(cm: *mut CmId) {
    // SAFETY: a live id.
    let h = unsafe { (*cm).handle };
    IDS.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(h, cm as usize);
}

/// The library's id behind an application's id pointer.
///
/// # Safety
/// `id` came from this library and is live.
pub(crate) unsafe fn cm<'a>(id: *mut rdma_cm_id) -> &'a mut CmId {
    // SAFETY: the caller's contract: the C struct is the head of a CmId.
    unsafe { &mut *id.cast::<CmId>() }
}

impl CmId {
    /// The channel the id's commands and events go through.
    pub(crate) fn channel(&self) -> &Channel {
        // SAFETY: an id always has a live channel (its own, or the
        // application's, which must outlive it).
        unsafe { channel::of(self.id.channel) }
    }

    /// The device, if bound.
    pub(crate) fn device(&self) -> Option<&CmaDevice> {
        // SAFETY: device records are leaked, never freed.
        unsafe { self.dev.as_ref() }
    }

    /// rdma-core's `ucma_complete_event`: one more event acknowledged.
    pub(crate) fn complete_event(&self) {
        let mut n = self
            .events_completed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *n += 1;
        self.cond.notify_all();
    }

    /// Waits until `reported` events of this id are acknowledged (as
    /// rdma-core waits in `rdma_destroy_id` and `rdma_migrate_id`).
    pub(crate) fn wait_events(&self, reported: u32) {
        let mut n = self
            .events_completed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while *n < reported {
            n = self.cond.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// rdma-core's `ucma_alloc_id`: a new id on `channel` (NULL: a channel of
/// its own), not yet known to the agent.
pub(crate) fn alloc(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> Result<*mut CmId, c_int> {
    let (channel, sync) = if channel.is_null() {
        (channel::create()?.cast::<rdma_event_channel>(), true)
    } else {
        (channel, false)
    };
    let c = rdma_cm_id {
        channel,
        context,
        ps,
        qp_type,
        ..zeroed()
    };
    Ok(Box::into_raw(Box::new(CmId {
        id: c,
        dev: std::ptr::null_mut(),
        connect: Vec::new(),
        events_completed: Mutex::new(0),
        cond: Condvar::new(),
        connect_error: false,
        sync,
        handle: u32::MAX,
        qp_init_attr: None,
        initiator_depth: 0,
        responder_resources: 0,
        local_ece: (0, 0),
        remote_ece: (0, 0),
    })))
}

/// rdma-core's `ucma_free_id`: forgets the id, leaves its device, frees
/// its path records and its own channel.
///
/// # Safety
/// `cm` came from [`alloc`] and is not used afterwards.
pub(crate) unsafe fn free(cm: *mut CmId) {
    // SAFETY: the caller's contract: `cm` is a live CmId Box.
    let cm = unsafe { Box::from_raw(cm) };
    {
        let mut ids = IDS.lock().unwrap_or_else(|e| e.into_inner());
        if ids.get(&cm.handle) == Some(&(std::ptr::from_ref(&*cm) as usize)) {
            ids.remove(&cm.handle);
        }
    }
    if !cm.dev.is_null() {
        device::put(cm.dev);
    }
    // SAFETY: path records are malloc'd by this library (or NULL).
    unsafe { libc::free(cm.id.route.path_rec.cast()) };
    if cm.sync && !cm.id.channel.is_null() {
        // SAFETY: a synchronous id's channel is its own, made by
        // channel::create; nothing else refers to it.
        unsafe { channel::destroy(cm.id.channel.cast::<Channel>()) };
    }
}

/// rdma-core's `rdma_create_id2`: an id with an explicit QP type, made at
/// the agent (`CREATE_ID`, `uid` the id's address). An XRC QP type
/// (`rdma_create_ep(3)` of an `rdma_getaddrinfo(3)` for XRC, as
/// rdma_xserver/rdma_xclient `-c x` ask) is `EOPNOTSUPP`: vrnic has no XRC
/// domains or XRC SRQs, so such a connection could never carry data; the
/// first refusal of a process says so on stderr (the agent would answer
/// `EINVAL`, which does not tell the user what is missing).
pub(crate) fn create(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space,
    qp_type: ibv_qp_type,
) -> Result<*mut CmId, c_int> {
    if qp_type == IBV_QPT_XRC_SEND || qp_type == IBV_QPT_XRC_RECV {
        static TOLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !TOLD.swap(true, std::sync::atomic::Ordering::Relaxed) || crate::boundary::debug() {
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "librdmacm (vrnic): XRC is not supported by vrnic (no XRC domains or XRC SRQs)"
            );
        }
        return Err(libc::EOPNOTSUPP);
    }
    let cm = alloc(channel, context, ps, qp_type)?;
    let cmd = kabi::rdma_ucm_create_id {
        uid: cm as u64,
        ps: ps as u16,
        qp_type: qp_type as u8,
        ..zeroed()
    };
    let mut resp: kabi::rdma_ucm_create_id_resp = zeroed();
    // SAFETY: the id just allocated.
    let r = unsafe { &*cm }
        .channel()
        .exec_resp(kabi::RDMA_USER_CM_CMD_CREATE_ID, &cmd, &mut resp);
    if let Err(e) = r {
        // SAFETY: the id just allocated, never handed out.
        unsafe { free(cm) };
        return Err(e);
    }
    // SAFETY: as above.
    unsafe { (*cm).handle = resp.id };
    insert(cm);
    Ok(cm)
}

/// `rdma_create_id(3)`: allocates an id on `channel` (NULL: a channel of
/// its own, for synchronous use) with `ps` (`RDMA_PS_TCP`, `RDMA_PS_UDP`,
/// `RDMA_PS_IB`, `RDMA_PS_IPOIB`) and `context`, and makes it at the
/// agent (`CREATE_ID`). `qp_type` is UD for `RDMA_PS_UDP`/`RDMA_PS_IPOIB`,
/// RC otherwise, as rdma-core's `librdmacm/cma.c`; another `ps` is
/// `EINVAL`, as the kernel's `ucma_get_qp_type` answers it (checked here
/// before the agent is asked). A NULL `id` is `EINVAL` (librdmacm would
/// crash). `verbs` stays NULL until an address binds the id to a device.
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
        match create(channel, context, ps, qp_type) {
            Ok(cm) => {
                // SAFETY: `id` is non-NULL; the caller passes where to store the id.
                unsafe { *id = cm.cast() };
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// rdma-core's `ucma_destroy_kern_id`: `DESTROY_ID` on `ch`; the number of
/// events the agent reported for the id.
pub(crate) fn destroy_kern_id(ch: &Channel, handle: u32) -> Result<u32, c_int> {
    let cmd = kabi::rdma_ucm_destroy_id {
        id: handle,
        ..zeroed()
    };
    let mut resp: kabi::rdma_ucm_destroy_id_resp = zeroed();
    ch.exec_resp(kabi::RDMA_USER_CM_CMD_DESTROY_ID, &cmd, &mut resp)?;
    Ok(resp.events_reported)
}

/// rdma-core's `rdma_destroy_id`: `DESTROY_ID`, acknowledges the event the
/// id holds (synchronous ids), waits until every event the agent reported
/// for it is acknowledged, frees it.
///
/// # Safety
/// `id` is a live id of this library, not used afterwards on success.
pub(crate) unsafe fn destroy(id: *mut rdma_cm_id) -> Result<(), c_int> {
    // SAFETY: the caller's contract.
    let cm = unsafe { cm(id) };
    let reported = destroy_kern_id(cm.channel(), cm.handle)?;
    if !cm.id.event.is_null() {
        crate::events::ack(cm.id.event);
        cm.id.event = std::ptr::null_mut();
    }
    cm.wait_events(reported);
    // SAFETY: the id, no longer known to the agent.
    unsafe { free(cm) };
    Ok(())
}

/// `rdma_destroy_id(3)`: releases an id (and its own channel, for one
/// created without a channel), after every event the agent reported for
/// it has been acknowledged (`rdma_ack_cm_event(3)`); the man page
/// requires its QP destroyed first. NULL is `EINVAL`.
pub(crate) extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ffi("rdma_destroy_id", || {
        if id.is_null() {
            return fail(libc::EINVAL);
        }
        // SAFETY: an id pointer applications hold came from this library.
        match unsafe { destroy(id) } {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

/// `KMALLOC_MAX_SIZE` on x86-64 Linux 6.1 (4 MiB): the kernel's `rdma_ucm`
/// refuses a longer `optlen` with `EINVAL` (`ucma_set_option`).
const KMALLOC_MAX_SIZE: usize = 4 << 20;

/// `IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL`
/// (`<infiniband/sa.h>`): the primary path the kernel's
/// `ucma_set_ib_path` looks for.
const PATH_GMP_PRIMARY_BIDIRECTIONAL: u32 = 0x01 | 0x02 | 0x08 | 0x20;

/// `rdma_set_option(3)`: sets an option of an id at the agent
/// (`SET_OPTION`, the value's bytes after the structure), after the
/// argument checks the kernel's `rdma_ucm` makes (Linux
/// `drivers/infiniband/core/ucma.c` `ucma_set_option`,
/// `ucma_set_option_id`, `ucma_set_ib_path`), so that the agent sees only
/// well-formed options:
/// `optlen` over `KMALLOC_MAX_SIZE` is `EINVAL`, an unreadable (NULL)
/// `optval` with a length `EFAULT`; at `RDMA_OPTION_ID`, `TOS` and
/// `ACK_TIMEOUT` take a `uint8_t`, `REUSEADDR` and `AFONLY` an `int`
/// (another length: `EINVAL`); at `RDMA_OPTION_IB`, `IB_PATH` takes
/// `struct ibv_path_data[]` with a primary path (else `EINVAL`); an unknown
/// level or name is `ENOSYS`. The agent's errors are the call's. A NULL id
/// is `EINVAL`.
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
        match (level as u32, optname as u32) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {}
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR | RDMA_OPTION_ID_AFONLY) if optlen == 4 => {}
            (
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS
                | RDMA_OPTION_ID_ACK_TIMEOUT
                | RDMA_OPTION_ID_REUSEADDR
                | RDMA_OPTION_ID_AFONLY,
            ) => return fail(libc::EINVAL),
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                let n = size_of::<ibv_path_data>();
                if !optlen.is_multiple_of(n) {
                    return fail(libc::EINVAL);
                }
                let primary = (0..optlen / n).any(|i| {
                    // SAFETY: optval holds optlen / n path records
                    // (possibly unaligned).
                    let p = unsafe { optval.cast::<ibv_path_data>().add(i).read_unaligned() };
                    p.flags == PATH_GMP_PRIMARY_BIDIRECTIONAL
                });
                if !primary {
                    return fail(libc::EINVAL);
                }
            }
            _ => return fail(libc::ENOSYS),
        }
        if optlen > MAX_OPTION_LEN {
            say(&format!(
                "rdma_set_option: {optlen} bytes of option value, more than the agent takes ({MAX_OPTION_LEN})"
            ));
            return fail(libc::EINVAL);
        }
        // SAFETY: ids applications hold came from this library.
        let cm = unsafe { cm(id) };
        let cmd = kabi::rdma_ucm_set_option {
            id: cm.handle,
            level: level as u32,
            optname: optname as u32,
            optlen: optlen as u32,
            ..zeroed()
        };
        let value: &[u8] = if optlen == 0 {
            &[]
        } else {
            // SAFETY: optval is non-NULL with optlen readable bytes.
            unsafe { std::slice::from_raw_parts(optval.cast::<u8>(), optlen) }
        };
        if let Err(e) = cm
            .channel()
            .exec(kabi::RDMA_USER_CM_CMD_SET_OPTION, &cmd, value, &mut [])
        {
            return fail(e);
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
