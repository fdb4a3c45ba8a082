//! `rdma_get_devices(3)`, `rdma_free_devices(3)`, through the process's
//! `libibverbs.so.1`.
//!
//! This library is linked against `libibverbs.so.1` (`NEEDED`), as
//! rdma-core's librdmacm is: the dynamic linker binds these calls to
//! whichever libibverbs the process loads (vrnic's, or rdma-core's). As in
//! rdma-core's `librdmacm/cma.c` (`sync_devices_list`, `ucma_init_device`),
//! every device is opened once, the first time a list is asked for, and
//! stays open for the life of the process; each `rdma_get_devices` call
//! picks up devices that appeared since. A device that fails to open is
//! left out.

use std::ffi::c_int;
use std::sync::Mutex;

use crate::boundary::{fail, ffi};
use crate::ffi::{ibv_context, ibv_device};

extern "C" {
    fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    fn ibv_free_device_list(list: *mut *mut ibv_device);
    fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
}

/// The devices seen so far: the last list libibverbs gave (kept, as
/// rdma-core keeps it, so its device pointers stay valid) and each
/// device's context (NULL: it failed to open).
struct Devices {
    list: *mut *mut ibv_device,
    open: Vec<(*mut ibv_device, *mut ibv_context)>,
}

// SAFETY: the pointers are libibverbs objects, usable from any thread;
// the Mutex serialises this library's use of them.
unsafe impl Send for Devices {}

static DEVICES: Mutex<Devices> = Mutex::new(Devices {
    list: std::ptr::null_mut(),
    open: Vec::new(),
});

/// `rdma_get_devices(3)`: a NULL-terminated array of the open verbs
/// contexts of every RDMA device, its length in `*num_devices` (if not
/// NULL); free it with [`rdma_free_devices`], which leaves the devices
/// open. With no device, NULL with `errno = ENODEV` and 0, as rdma-core
/// (whose `ucma_init` fails so).
pub(crate) extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    let r = ffi("rdma_get_devices", || {
        let mut n: c_int = 0;
        // SAFETY: n receives the count.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return fail(libc::ENODEV);
        }
        if n <= 0 {
            // SAFETY: the list libibverbs just gave.
            unsafe { ibv_free_device_list(list) };
            return fail(libc::ENODEV);
        }
        let mut d = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
        let mut ctxs = Vec::new();
        for i in 0..n as usize {
            // SAFETY: the list has n entries.
            let dev = unsafe { *list.add(i) };
            let ctx = match d.open.iter().find(|(k, _)| *k == dev) {
                Some(&(_, c)) => c,
                None => {
                    // SAFETY: a device of libibverbs' current list.
                    let c = unsafe { ibv_open_device(dev) };
                    d.open.push((dev, c));
                    c
                }
            };
            if !ctx.is_null() {
                ctxs.push(ctx);
            }
        }
        if !d.list.is_null() {
            // SAFETY: the previous list; open devices hold their own
            // references in libibverbs.
            unsafe { ibv_free_device_list(d.list) };
        }
        d.list = list;
        let size = std::mem::size_of::<*mut ibv_context>() * (ctxs.len() + 1);
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
