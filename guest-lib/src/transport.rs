//! How guest-lib reaches a vrnic device: the [`Transport`] trait.
//!
//! Implementations: the virtio-pci user-space driver in a VM
//! ([`crate::pci`]), an in-process device for tests (`loopback`, with
//! feature `loopback`), and the vhost-user frontend of a container or host
//! process ([`crate::vhost_user`]). The verbs layer ([`crate::verbs`]) is
//! written only against this trait; it sends control commands typed
//! (`execute::<C: abi::Command>`).

use std::os::fd::RawFd;

use vrnic_abi::{self as abi, Pod};

/// Errors of a transport.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The device answered a control command with an error status (a Linux errno).
    /// `STATUS_ENODEV` means the device lost every object (its vhost-user
    /// daemon restarted under the driver; device spec §5.x.9).
    #[error("device rejected command {opcode}: status {status} ({})", status_text(*status))]
    Status {
        /// The `abi::CMD_*` opcode.
        opcode: u16,
        /// The `abi::Status` (errno) the device returned.
        status: u32,
    },
    /// The device did not answer in time (bounded wait exceeded).
    #[error("device did not answer within {0} ms")]
    Timeout(u64),
    /// No usable vrnic device was found.
    #[error("no vrnic device found: {0}")]
    NoDevice(String),
    /// Out of DMA memory.
    #[error("out of DMA memory: {0} bytes requested")]
    NoDmaMemory(usize),
    /// An operating system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl TransportError {
    /// The Linux errno a verb failing with this error reports: the
    /// device's status, `ETIMEDOUT`, `ENODEV`, `ENOMEM`, or the system
    /// call's (`EIO` when it has none).
    pub fn errno(&self) -> i32 {
        match self {
            TransportError::Status { status, .. } => *status as i32,
            TransportError::Timeout(_) => libc::ETIMEDOUT,
            TransportError::NoDevice(_) => libc::ENODEV,
            TransportError::NoDmaMemory(_) => libc::ENOMEM,
            TransportError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// The text of a command status: the errno's, and for `STATUS_ENODEV` what
/// it means for a vrnic device.
fn status_text(status: u32) -> String {
    let errno = std::io::Error::from_raw_os_error(status as i32);
    if status == abi::STATUS_ENODEV {
        format!("{errno}: the device lost every object, its host daemon restarted; open the device again")
    } else {
        errno.to_string()
    }
}

/// A buffer of DMA memory: zeroed at allocation, contiguous in the device's
/// (guest-physical) address space, mapped at `ptr` in this process, alive as
/// long as the transport that allocated it.
#[derive(Debug, Clone, Copy)]
pub struct DmaBuf {
    /// Address in this process.
    pub ptr: *mut u8,
    /// Length, bytes.
    pub len: usize,
    /// Device (guest-physical) address of the first byte.
    pub gpa: u64,
}

// SAFETY: a DmaBuf is a plain description of memory owned by the transport;
// the verbs layer synchronises its use.
unsafe impl Send for DmaBuf {}
// SAFETY: as Send.
unsafe impl Sync for DmaBuf {}

/// The error of a command for a context other than [`abi::DEFAULT_CTX`] on a
/// transport that serves only that one: `EOPNOTSUPP`
/// ([`TransportError::Status`]), or `Ok(())` for the default context.
pub fn not_this_context(ctx: u16, opcode: u16) -> Result<(), TransportError> {
    if ctx == abi::DEFAULT_CTX {
        return Ok(());
    }
    Err(TransportError::Status {
        opcode,
        status: abi::STATUS_EOPNOTSUPP,
    })
}

/// A connection to one vrnic device.
pub trait Transport: Send {
    /// The device's configuration space, read once at open.
    fn config(&self) -> abi::ConfigSpace;
    /// Executes one control command (`abi::CMD_*`) with `body`; copies the
    /// response body into `resp` and returns its length in bytes. An error
    /// status from the device is [`TransportError::Status`].
    ///
    /// The default is [`Transport::command_in`] for [`abi::DEFAULT_CTX`].
    fn command(
        &mut self,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        self.command_in(abi::DEFAULT_CTX, opcode, body, resp)
    }
    /// [`Transport::command`] for device context `ctx` (device spec
    /// §5.x.6.13): what a guest agent does for the processes it serves. A
    /// transport that serves only [`abi::DEFAULT_CTX`] answers any other
    /// with [`not_this_context`].
    fn command_in(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError>;
    /// Rings a doorbell (posts it on the doorbell queue and notifies).
    fn doorbell(&mut self, db: &abi::Doorbell) -> Result<(), TransportError>;
    /// Allocates `len` zeroed bytes of DMA memory aligned to `align` (a power
    /// of two, at most 2 MiB), contiguous in guest-physical address space.
    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError>;
    /// Gives `buf`, from [`Transport::alloc_dma`], back for reuse; called
    /// only once the device no longer uses it (the object whose ring or
    /// record it was is destroyed, or its create was refused). The default
    /// keeps it allocated as long as the transport: a transport whose DMA
    /// memory is bounded and outlives many objects (the vhost-user ones,
    /// whose shared memory is 16 GiB) gives it back, or a program that
    /// creates and destroys CQs and QPs runs out of it.
    fn release_dma(&mut self, buf: DmaBuf) {
        let _ = buf;
    }
    /// Device address of the byte at `va` in this process. The page must be
    /// resident and locked (the verbs layer locks MR pages before asking).
    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError>;
    /// Page size that [`Transport::virt_to_phys`] translates at, bytes (4096 in a VM).
    fn page_size(&self) -> usize {
        4096
    }
    /// Next asynchronous event from the event queue, if any.
    fn poll_event(&mut self) -> Option<abi::Event>;
    /// A descriptor that becomes readable (`poll(2)`) when events are queued
    /// for [`Transport::poll_event`], if the transport has one: the
    /// loopback engine's eventfd, or in a VM the function's `/dev/uioN`
    /// (its INTx interrupt through `uio_pci_generic`). After it polls
    /// readable, the waiter calls [`Transport::ack_event`] and then drains
    /// [`Transport::poll_event`]. `None` (the default): the caller must poll.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }
    /// Consumes the wake-up of [`Transport::event_fd`] and re-arms it: an
    /// event queued after this call makes the descriptor readable again,
    /// so draining [`Transport::poll_event`] after it never misses one. The
    /// default reads the eventfd's counter (8 bytes; the descriptor is
    /// non-blocking, so nothing waiting is fine).
    fn ack_event(&mut self) {
        if let Some(fd) = self.event_fd() {
            let mut v: libc::eventfd_t = 0;
            // SAFETY: eventfd_read into a live u64 on the transport's
            // descriptor; an error (nothing waiting) is harmless.
            unsafe { libc::eventfd_read(fd, &mut v) };
        }
    }
    /// Whether a thread waiting for completions should yield the CPU
    /// between empty polls: true where the device's work needs this
    /// process's CPU (an in-process engine thread, a guest agent
    /// forwarding doorbells). Default false.
    fn yield_when_idle(&self) -> bool {
        false
    }
    /// Whether QPs ask the device for doorbell records
    /// ([`vrnic_abi::QP_F_SQ_RECORD`], [`vrnic_abi::QP_F_RQ_RECORD`]:
    /// no doorbell chain per post while the device polls). True for a
    /// process attached to the daemon's socket (containers, host
    /// processes), where they are measured; default false: guests ring
    /// as before, records brought them no measured gain under TCG (their
    /// one hang with records was the barrier, [`crate::barrier`]).
    fn doorbell_records(&self) -> bool {
        false
    }
    /// Makes `[va, va + len)` of this process reachable by the device, before
    /// an MR covering it is registered ([`crate::verbs::Mr::register`]). A
    /// no-op where the device reaches all of the process's memory (the
    /// default; in a VM every locked page has a guest-physical address).
    fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        let _ = (va, len);
        Ok(())
    }
    /// Whether registered pages must be locked (`mlock(2)`) to stay where
    /// the device addresses them: true in a VM (guest-physical pages); false
    /// where the device reaches memory by file offset or virtual address
    /// (vhost-user shared memory, the in-process device), which also spares
    /// a container's `RLIMIT_MEMLOCK`.
    fn needs_locked_pages(&self) -> bool {
        true
    }
    /// Undoes one [`Transport::map_user`] of the same range, after the MR
    /// was deregistered.
    fn unmap_user(&mut self, va: usize, len: usize) {
        let _ = (va, len);
    }
    /// Lets the device reach `len` bytes of memory file `fd` (another
    /// process's: a program served by a guest agent over vhost-user,
    /// [`crate::agent::proto::MODE_FILE`]) at a device address range of its
    /// own, whose first address is returned. The default: such a device
    /// reaches no other process's memory (`EOPNOTSUPP`). Errors: `ENOSPC`
    /// when the device's memory table is full, the transport's own.
    fn share_memory(&mut self, fd: RawFd, len: usize) -> Result<u64, TransportError> {
        let _ = (fd, len);
        Err(TransportError::Io {
            what: "sharing another process's memory with the device".into(),
            source: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
        })
    }
    /// Withdraws the memory [`Transport::share_memory`] placed at `gpa`,
    /// once no object of the device refers to it (its context closed).
    fn unshare_memory(&mut self, gpa: u64) {
        let _ = gpa;
    }
}

impl dyn Transport + '_ {
    /// Executes control command `C` ([`Transport::command`]) with body
    /// `req`: the opcode and both body types come from `C`
    /// ([`abi::Command`]; device spec §5.x.6.1), so the opcode is never
    /// given apart from its body. Returns the response body, read from a zeroed
    /// [`abi::MAX_CMD_BODY`] buffer (bytes the device did not write are
    /// zero), and the number of bytes the device wrote. Errors: as
    /// [`Transport::command`].
    pub fn execute<C: abi::Command>(
        &mut self,
        req: &C::Request,
    ) -> Result<(C::Response, usize), TransportError> {
        let mut resp = [0u8; abi::MAX_CMD_BODY];
        let n = self.command(C::OPCODE, req.as_bytes(), &mut resp)?;
        // `abi::command` holds every response within MAX_CMD_BODY.
        let r = C::Response::read_from(&resp).unwrap_or_default();
        Ok((r, n))
    }
}
