//! RDMA devices as the connection manager uses them, through the process's
//! `libibverbs.so.1`: `rdma_get_devices(3)`, `rdma_free_devices(3)`, and
//! the device an id is bound to (rdma-core `librdmacm/cma.c`:
//! `struct cma_device`, `sync_devices_list`, `ucma_init_device`,
//! `ucma_get_device`, `ucma_put_device`).
//!
//! Every device is opened once and stays open for the life of the process,
//! as in rdma-core. The agent names an id's device by its node GUID (and
//! index, `ibdev_index`) in its `QUERY_ROUTE`/`QUERY` answers; this
//! library opens the device with that GUID and gives the id the device's
//! protection domain, one per device, allocated while an id uses it
//! (deallocated when the last such id goes, as `ucma_put_device` does).
//! vrnic's libibverbs reports GUID 0 for a device it reached through the
//! agent until the device is open: such a device is opened and its GUID
//! taken from `ibv_query_device(3)`'s `node_guid`.

use std::ffi::c_int;
use std::sync::Mutex;

use crate::boundary::{fail, ffi, say};
use crate::ffi::{ibv_context, ibv_device, ibv_device_attr, ibv_pd, ibv_port_attr};
use crate::verbs::*;

/// `IBV_LINK_LAYER_INFINIBAND` (`<infiniband/verbs.h>`, an anonymous enum).
pub(crate) const LINK_LAYER_INFINIBAND: u8 = 1;

/// One device (rdma-core's `struct cma_device`).
pub(crate) struct CmaDevice {
    /// libibverbs' device.
    pub(crate) dev: *mut ibv_device,
    /// The open context (NULL until opened).
    pub(crate) verbs: *mut ibv_context,
    /// The protection domain ids of this device get (NULL while unused).
    pub(crate) pd: *mut ibv_pd,
    /// Node GUID, network byte order (as `ibv_get_device_guid(3)`).
    pub(crate) guid: u64,
    /// `ibv_get_device_index(3)` (-1: unknown).
    pub(crate) idx: c_int,
    /// Link layer of each port (index: port number - 1).
    pub(crate) link_layer: Vec<u8>,
    /// `max_qp_wr`.
    pub(crate) max_qpsize: c_int,
    /// `max_qp_init_rd_atom`.
    pub(crate) max_initiator_depth: u8,
    /// `max_qp_rd_atom`.
    pub(crate) max_responder_resources: u8,
    /// Ids bound to this device.
    refcnt: u32,
    /// Failed to open.
    dead: bool,
}

/// The devices seen so far (leaked records: ids point at them).
struct Devices {
    list: *mut *mut ibv_device,
    devs: Vec<*mut CmaDevice>,
}

// SAFETY: the pointers are libibverbs objects and leaked records, usable
// from any thread; the Mutex serialises this library's use of them.
unsafe impl Send for Devices {}

static DEVICES: Mutex<Devices> = Mutex::new(Devices {
    list: std::ptr::null_mut(),
    devs: Vec::new(),
});

/// rdma-core's `sync_devices_list`: picks up devices that appeared since
/// the last call. `Err(ENODEV)` when libibverbs has none.
fn sync(d: &mut Devices) -> Result<(), c_int> {
    let mut n: c_int = 0;
    // SAFETY: n receives the count.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(libc::ENODEV);
    }
    if n <= 0 {
        // SAFETY: the list libibverbs just gave.
        unsafe { ibv_free_device_list(list) };
        return Err(libc::ENODEV);
    }
    for i in 0..n as usize {
        // SAFETY: the list has n entries.
        let dev = unsafe { *list.add(i) };
        // SAFETY: records are live leaked boxes.
        if d.devs.iter().any(|&c| unsafe { (*c).dev } == dev) {
            continue;
        }
        // SAFETY: a device of libibverbs' current list.
        let (guid, idx) = unsafe { (ibv_get_device_guid(dev), ibv_get_device_index(dev)) };
        d.devs.push(Box::into_raw(Box::new(CmaDevice {
            dev,
            verbs: std::ptr::null_mut(),
            pd: std::ptr::null_mut(),
            guid,
            idx,
            link_layer: Vec::new(),
            max_qpsize: 0,
            max_initiator_depth: 0,
            max_responder_resources: 0,
            refcnt: 0,
            dead: false,
        })));
    }
    if !d.list.is_null() {
        // SAFETY: the previous list; open devices hold their own references.
        unsafe { ibv_free_device_list(d.list) };
    }
    d.list = list;
    Ok(())
}

/// rdma-core's `ucma_init_device`: opens the device and learns its limits
/// and ports (and, for a device libibverbs gave GUID 0, its GUID).
fn init(c: &mut CmaDevice) -> Result<(), c_int> {
    if !c.verbs.is_null() {
        return Ok(());
    }
    // SAFETY: a device of libibverbs' list (kept in DEVICES).
    let verbs = unsafe { ibv_open_device(c.dev) };
    if verbs.is_null() {
        return Err(libc::ENODEV);
    }
    let mut attr: ibv_device_attr = zeroed();
    // SAFETY: an open context and an attribute structure to fill.
    let r = unsafe { ibv_query_device(verbs, &mut attr) };
    if r != 0 {
        // SAFETY: the context just opened.
        unsafe { ibv_close_device(verbs) };
        return Err(r);
    }
    c.link_layer = (1..=attr.phys_port_cnt)
        .map(|p| {
            let mut pa: ibv_port_attr = zeroed();
            // SAFETY: as above, port numbers from 1.
            match unsafe { ibv_query_port(verbs, p, &mut pa) } {
                0 => pa.link_layer,
                _ => 0,
            }
        })
        .collect();
    c.max_qpsize = attr.max_qp_wr;
    c.max_initiator_depth = attr.max_qp_init_rd_atom as u8;
    c.max_responder_resources = attr.max_qp_rd_atom as u8;
    if c.guid == 0 {
        c.guid = attr.node_guid;
    }
    c.verbs = verbs;
    Ok(())
}

/// Opens the first device (vrnic's libibverbs starts the agent when it
/// opens a device): what a channel does when the agent does not answer.
pub(crate) fn open_first() -> Result<(), c_int> {
    let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    sync(&mut d)?;
    let first = *d.devs.first().ok_or(libc::ENODEV)?;
    // SAFETY: a live leaked record, under the lock.
    init(unsafe { &mut *first })
}

/// rdma-core's `ucma_init` as far as devices go (`sync_devices_list`):
/// learns libibverbs' devices; `Err(ENODEV)` when there is none.
pub(crate) fn sync_list() -> Result<(), c_int> {
    let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    sync(&mut d)
}

/// The smallest `max_qp_wr` of the devices that open (rdma-core's
/// `ucma_max_qpsize(NULL)`, after `ucma_init_all`); 0 when none does.
pub(crate) fn min_max_qpsize() -> c_int {
    let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let _ = sync(&mut d);
    let mut max_size = 0;
    for &c in &d.devs {
        // SAFETY: live leaked records, under the lock.
        let c = unsafe { &mut *c };
        if c.dead {
            continue;
        }
        if init(c).is_err() {
            c.dead = true;
            continue;
        }
        if max_size == 0 || max_size > c.max_qpsize {
            max_size = c.max_qpsize;
        }
    }
    max_size
}

/// rdma-core's `ucma_get_device`: the device with node GUID `guid` (and
/// index `idx`, unless either side does not know it: -1), opened, with a
/// protection domain; its reference count taken for the id.
pub(crate) fn get(guid: u64, idx: u32) -> Result<*mut CmaDevice, c_int> {
    if guid == 0 {
        say("the agent named no device (node GUID 0): the id has no device");
        return Err(libc::ENODEV);
    }
    let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    let find = |d: &mut Devices| -> Option<*mut CmaDevice> {
        d.devs.iter().copied().find(|&c| {
            // SAFETY: live leaked records, under the lock.
            let c = unsafe { &mut *c };
            if c.dead {
                return false;
            }
            if c.guid == 0 && init(c).is_err() {
                c.dead = true;
                return false;
            }
            let idx_known = idx != u32::MAX && c.idx >= 0;
            c.guid == guid && (!idx_known || c.idx as u32 == idx)
        })
    };
    let found = match find(&mut d) {
        Some(c) => Some(c),
        None => sync(&mut d).ok().and_then(|()| find(&mut d)),
    };
    let Some(cp) = found else {
        say(&format!(
            "no device of this process's libibverbs has node GUID {:#018x} (index {}), \
             the device the agent named",
            u64::from_be(guid),
            idx as i32
        ));
        return Err(libc::ENODEV);
    };
    // SAFETY: a live leaked record, under the lock.
    let c = unsafe { &mut *cp };
    init(c)?;
    if c.pd.is_null() {
        // SAFETY: an open context.
        c.pd = unsafe { ibv_alloc_pd(c.verbs) };
        if c.pd.is_null() {
            return Err(crate::boundary::errno_or(libc::ENOMEM));
        }
    }
    c.refcnt += 1;
    Ok(cp)
}

/// rdma-core's `ucma_put_device`: an id leaves the device; the last one
/// frees the protection domain.
pub(crate) fn put(c: *mut CmaDevice) {
    let _d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: a live leaked record, under the lock.
    let c = unsafe { &mut *c };
    c.refcnt = c.refcnt.saturating_sub(1);
    if c.refcnt == 0 && !c.pd.is_null() {
        // SAFETY: the PD this module allocated; no id uses it any more.
        unsafe { ibv_dealloc_pd(c.pd) };
        c.pd = std::ptr::null_mut();
    }
}

/// `rdma_get_devices(3)`: a NULL-terminated array of the open verbs
/// contexts of every RDMA device, its length in `*num_devices` (if not
/// NULL); free it with [`rdma_free_devices`], which leaves the devices
/// open. With no device, NULL with `errno = ENODEV` and 0, as rdma-core
/// (whose `ucma_init` fails so).
pub(crate) extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    let r = ffi("rdma_get_devices", || {
        let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = sync(&mut d) {
            return fail(e);
        }
        let mut ctxs = Vec::new();
        for &c in &d.devs {
            // SAFETY: live leaked records, under the lock.
            let c = unsafe { &mut *c };
            if c.dead {
                continue;
            }
            if init(c).is_err() {
                c.dead = true;
                continue;
            }
            ctxs.push(c.verbs);
        }
        let size = size_of::<*mut ibv_context>() * (ctxs.len() + 1);
        // SAFETY: malloc of the array; NULL checked.
        let arr = unsafe { libc::malloc(size) }.cast::<*mut ibv_context>();
        if arr.is_null() {
            return fail(libc::ENOMEM);
        }
        for (i, c) in ctxs.iter().chain([&std::ptr::null_mut()]).enumerate() {
            // SAFETY: arr has ctxs.len() + 1 slots.
            unsafe { *arr.add(i) = *c };
        }
        if !num_devices.is_null() {
            // SAFETY: the caller's int.
            unsafe { *num_devices = ctxs.len() as c_int };
        }
        arr
    });
    if r.is_null() && !num_devices.is_null() {
        // SAFETY: the caller's int.
        unsafe { *num_devices = 0 };
    }
    r
}

/// `rdma_free_devices(3)`: frees an array [`rdma_get_devices`] returned
/// (the devices stay open, as in rdma-core). NULL: nothing (rdma-core
/// would crash).
pub(crate) extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: NULL or an array this library malloc'd.
    unsafe { libc::free(list.cast()) };
}
