//! The backend's vrings: vhost-user-backend's [`VringRwLock`] whose
//! guest-memory accesses outside the worker survive a frontend memory
//! that lost its backing (issue 27, [`crate::fault`]).
//!
//! vhost-user-backend reads a ring itself on its message thread: for
//! `SET_VRING_ADDR` it loads the used index from the new used ring
//! ([`VringT::queue_used_idx`], vhost-user-backend 0.24's
//! `VhostUserHandler::set_vring_addr`). A frontend that shrank its memfd
//! after `SET_MEM_TABLE` can put that ring in pages with no backing; the
//! load then raised `SIGBUS` outside any [`crate::fault::catch`] scope,
//! which ended the daemon and every function with it.
//!
//! So each [`VringT`] method that touches guest memory runs inside a scope
//! when its thread is not in one already. Inside the worker's scope it
//! runs as it is: the worker answers a fault itself
//! (`DataPath::check_memory`). Elsewhere a fault marks the memory it hit
//! lost ([`crate::memory::blame`]) and fails the call: the request fails,
//! vhost-user-backend closes the connection, and the connection's end
//! answers the lost memory as any other ([`crate::backend::VrnicBackend::disconnected`]:
//! device reset, memory table dropped, `memory_faults` counted).

use std::fs::File;
use std::io;

use vhost_user_backend::{VringRwLock, VringStateGuard, VringStateMutGuard, VringT};
use virtio_queue::Error as VirtQueError;
use vm_memory::{GuestMemoryAtomic, GuestMemoryError, GuestMemoryMmap};

type Mem = GuestMemoryAtomic<GuestMemoryMmap>;

/// A vring of the backend: a [`VringRwLock`] whose guest-memory accesses
/// are recovered from a fault when no [`crate::fault::catch`] scope
/// covers them (see the module).
#[derive(Clone)]
pub struct Vring(VringRwLock<Mem>);

/// Runs `f`, an access to guest memory, inside a fault scope if the thread
/// is not in one: a fault there marks the memory lost and fails the call.
fn guarded<T>(f: impl FnOnce() -> Result<T, VirtQueError>) -> Result<T, VirtQueError> {
    if crate::fault::in_scope() {
        return f();
    }
    let (r, fault) = crate::fault::catch(f);
    match fault {
        None => r,
        Some(fault) => {
            crate::memory::blame(fault);
            tracing::error!(
                host_addr = format_args!("{:#x}", fault.addr),
                "a ring lies in frontend memory that lost its backing: request refused"
            );
            Err(VirtQueError::GuestMemory(GuestMemoryError::IOError(
                io::Error::other("the frontend's memory lost its backing"),
            )))
        }
    }
}

impl<'a> VringStateGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateGuard<'a, Mem>>::G;
}

impl<'a> VringStateMutGuard<'a, Mem> for Vring {
    type G = <VringRwLock<Mem> as VringStateMutGuard<'a, Mem>>::G;
}

impl VringT<Mem> for Vring {
    fn new(mem: Mem, max_queue_size: u16) -> Result<Self, VirtQueError> {
        VringRwLock::new(mem, max_queue_size).map(Self)
    }

    fn get_ref(&self) -> <Self as VringStateGuard<'_, Mem>>::G {
        self.0.get_ref()
    }

    fn get_mut(&self) -> <Self as VringStateMutGuard<'_, Mem>>::G {
        self.0.get_mut()
    }

    fn add_used(&self, desc_index: u16, len: u32) -> Result<(), VirtQueError> {
        guarded(|| self.0.add_used(desc_index, len))
    }

    fn signal_used_queue(&self) -> io::Result<()> {
        self.0.signal_used_queue()
    }

    fn enable_notification(&self) -> Result<bool, VirtQueError> {
        guarded(|| self.0.enable_notification())
    }

    fn disable_notification(&self) -> Result<(), VirtQueError> {
        guarded(|| self.0.disable_notification())
    }

    fn needs_notification(&self) -> Result<bool, VirtQueError> {
        guarded(|| self.0.needs_notification())
    }

    fn set_enabled(&self, enabled: bool) {
        self.0.set_enabled(enabled)
    }

    fn set_queue_info(
        &self,
        desc_table: u64,
        avail_ring: u64,
        used_ring: u64,
    ) -> Result<(), VirtQueError> {
        self.0.set_queue_info(desc_table, avail_ring, used_ring)
    }

    fn queue_next_avail(&self) -> u16 {
        self.0.queue_next_avail()
    }

    fn set_queue_next_avail(&self, base: u16) {
        self.0.set_queue_next_avail(base)
    }

    fn set_queue_next_used(&self, idx: u16) {
        self.0.set_queue_next_used(idx)
    }

    /// The load vhost-user-backend makes on its message thread for
    /// `SET_VRING_ADDR` (see the module).
    fn queue_used_idx(&self) -> Result<u16, VirtQueError> {
        guarded(|| self.0.queue_used_idx())
    }

    fn set_queue_size(&self, num: u16) {
        self.0.set_queue_size(num)
    }

    fn set_queue_event_idx(&self, enabled: bool) {
        self.0.set_queue_event_idx(enabled)
    }

    fn set_queue_ready(&self, ready: bool) {
        self.0.set_queue_ready(ready)
    }

    fn set_kick(&self, file: Option<File>) {
        self.0.set_kick(file)
    }

    fn read_kick(&self) -> io::Result<bool> {
        self.0.read_kick()
    }

    fn set_call(&self, file: Option<File>) {
        self.0.set_call(file)
    }

    fn set_err(&self, file: Option<File>) {
        self.0.set_err(file)
    }
}
