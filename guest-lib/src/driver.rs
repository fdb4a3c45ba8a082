//! The transport-independent half of the vrnic virtio driver: the three
//! virtqueues of the device (device spec §5.x.2) as the driver uses them —
//! the control queue ([`ControlQueue`], one command at a time through a
//! bounce buffer), the doorbell and event queues ([`SlotQueue`], 16-byte
//! slots) — and bounded polling ([`poll_until`]).
//!
//! The virtio-pci driver ([`crate::pci`]) and the vhost-user frontend
//! ([`crate::vhost_user`]) differ only in where the rings live and how a
//! queue is notified ([`Kick`]: a write to the function's notification
//! register, virtio 1.2 §4.1.4.4, or to the queue's kick eventfd, vhost-user
//! spec "Ring kick"); everything here is shared by both.

use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vrnic_abi::{self as abi, Pod};

use crate::transport::{DmaBuf, TransportError};
use crate::virtio::{BufDesc, Notifier, QueueLayout, SplitQueue, UsedElem};

/// Size of a doorbell or event slot, bytes.
pub(crate) const SLOT: usize = 16;
const _: () = assert!(size_of::<abi::Doorbell>() == SLOT && size_of::<abi::Event>() == SLOT);
/// Length of a command in the control bounce buffer: header and largest body.
pub(crate) const CMD_LEN: usize = size_of::<abi::CmdHeader>() + abi::MAX_CMD_BODY;
/// Offset of the response in the control bounce buffer.
pub(crate) const RESP_OFF: usize = 256;
/// Length of the response area: header and largest body.
pub(crate) const RESP_LEN: usize = size_of::<abi::RespHeader>() + abi::MAX_CMD_BODY;
const _: () = assert!(CMD_LEN <= RESP_OFF);
/// How long a command waits for the device to return an earlier command
/// that timed out before it fails with [`TransportError::Timeout`] too.
pub const STALE_COMMAND_GRACE: Duration = Duration::from_millis(200);

fn io_err(what: impl Into<String>, source: std::io::Error) -> TransportError {
    TransportError::Io {
        what: what.into(),
        source,
    }
}

fn protocol(what: impl Into<String>, msg: String) -> TransportError {
    io_err(
        what,
        std::io::Error::new(std::io::ErrorKind::InvalidData, msg),
    )
}

/// How the driver notifies the device of a queue's new buffers.
#[derive(Debug, Clone)]
pub(crate) enum Kick {
    /// virtio-pci: a 16-bit write of the queue index to its notification
    /// address (virtio 1.2 §4.1.4.4).
    Mmio(Notifier),
    /// vhost-user: an 8-byte write to the queue's kick eventfd (the one
    /// sent with `VHOST_USER_SET_VRING_KICK`).
    EventFd {
        /// The eventfd.
        fd: Arc<vmm_sys_util::eventfd::EventFd>,
        /// The queue's index, for messages.
        queue: u16,
    },
}

impl Kick {
    /// Notifies the device. The caller ordered its ring updates before
    /// ([`SplitQueue::needs_notify`]).
    pub(crate) fn notify(&self) -> Result<(), TransportError> {
        match self {
            Kick::Mmio(n) => n.notify(),
            Kick::EventFd { fd, queue } => {
                // SAFETY: plain syscall on a live eventfd.
                if unsafe { libc::eventfd_write(fd.as_raw_fd(), 1) } != 0 {
                    return Err(io_err(
                        format!("kick of queue {queue}"),
                        std::io::Error::last_os_error(),
                    ));
                }
                Ok(())
            }
        }
    }

    /// The queue this notifies.
    pub(crate) fn queue(&self) -> u16 {
        match self {
            Kick::Mmio(n) => n.queue(),
            Kick::EventFd { queue, .. } => *queue,
        }
    }
}

/// A virtqueue and its notifier.
#[derive(Debug)]
pub(crate) struct Queue {
    pub(crate) q: SplitQueue,
    pub(crate) notifier: Kick,
}

impl Queue {
    /// Notifies the device unless it suppressed notifications.
    pub(crate) fn kick(&mut self) -> Result<(), TransportError> {
        if self.q.needs_notify() {
            self.notifier.notify()?;
        }
        Ok(())
    }

    /// Pops used entries until the one with head `head`; stray entries are
    /// logged and dropped. `Ok(None)`: not there yet.
    pub(crate) fn pop_head(&mut self, head: u16) -> Result<Option<UsedElem>, TransportError> {
        loop {
            match self.q.pop_used()? {
                None => return Ok(None),
                Some(u) if u.id == head => return Ok(Some(u)),
                Some(u) => tracing::warn!(
                    "queue {}: unexpected used descriptor {}",
                    self.notifier.queue(),
                    u.id
                ),
            }
        }
    }
}

/// A queue whose descriptor `i` always carries the 16-byte buffer `slots + 16 i`.
#[derive(Debug)]
pub(crate) struct SlotQueue {
    pub(crate) queue: Queue,
    pub(crate) slots: DmaBuf,
}

impl SlotQueue {
    pub(crate) fn slot(&self, i: u16) -> (*mut u8, u64) {
        let off = SLOT * i as usize;
        // SAFETY: i < queue size and slots holds size * SLOT bytes.
        (
            unsafe { self.slots.ptr.add(off) },
            self.slots.gpa + off as u64,
        )
    }

    /// Posts the slot of the next free descriptor, after `fill` wrote it.
    pub(crate) fn post(
        &mut self,
        writable: bool,
        fill: impl FnOnce(*mut u8),
    ) -> Result<(), TransportError> {
        let Some(head) = self.queue.q.next_head() else {
            return Err(crate::virtio::VirtqError::Full { needed: 1, free: 0 }.into());
        };
        let (p, gpa) = self.slot(head);
        fill(p);
        self.queue.q.add(&[BufDesc {
            addr: gpa,
            len: SLOT as u32,
            writable,
        }])?;
        Ok(())
    }
}

impl SlotQueue {
    /// Posts a writable slot on every free descriptor (event queue setup).
    pub(crate) fn prefill(&mut self) -> Result<(), TransportError> {
        while self.queue.q.next_head().is_some() {
            self.post(true, |_| {})?;
        }
        Ok(())
    }

    /// Posts `db` (device-readable) and notifies; reclaims used doorbell
    /// slots first and, when none is free, polls for one for at most
    /// `timeout`.
    pub(crate) fn ring(
        &mut self,
        db: &abi::Doorbell,
        timeout: Duration,
    ) -> Result<(), TransportError> {
        while self.queue.q.pop_used()?.is_some() {}
        if self.queue.q.next_head().is_none() {
            let q = &mut self.queue.q;
            poll_until(timeout, || Ok(q.pop_used()?.map(|_| ())))?;
        }
        let bytes = db.as_bytes();
        self.post(false, |p| {
            // SAFETY: p is a SLOT-byte slot owned by the driver (its
            // descriptor is free).
            unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), p, SLOT) }
        })?;
        self.queue.kick()
    }

    /// Pops one filled event buffer, reposts it (zeroed) and returns the
    /// event. Short buffers and protocol errors are logged and skipped.
    pub(crate) fn pop_event(&mut self) -> Option<abi::Event> {
        loop {
            let u = match self.queue.q.pop_used() {
                Ok(Some(u)) => u,
                Ok(None) => return None,
                Err(e @ crate::virtio::VirtqError::BadUsedId(_)) => {
                    tracing::warn!("event queue: {e}");
                    continue;
                }
                Err(e) => {
                    tracing::warn!("event queue: {e}");
                    return None;
                }
            };
            let (p, _) = self.slot(u.id);
            let mut ev = abi::Event::default();
            let full = u.len as usize >= SLOT;
            if full {
                // SAFETY: the device returned this SLOT-byte slot.
                unsafe { ptr::copy_nonoverlapping(p, ev.as_bytes_mut().as_mut_ptr(), SLOT) };
            } else {
                tracing::warn!(
                    "event queue: device wrote {} bytes, less than an Event",
                    u.len
                );
            }
            let reposted = self
                .post(true, |p| {
                    // SAFETY: as above; cleared before the device gets it back.
                    unsafe { ptr::write_bytes(p, 0, SLOT) }
                })
                .and_then(|()| self.queue.kick());
            if let Err(e) = reposted {
                tracing::warn!("event queue: reposting a buffer: {e}");
            }
            if full {
                return Some(ev);
            }
        }
    }
}

/// The control queue: one command at a time through a DMA bounce buffer
/// (`CmdHeader + body` at 0, `RespHeader + body` at `RESP_OFF`).
#[derive(Debug)]
pub(crate) struct ControlQueue {
    pub(crate) queue: Queue,
    pub(crate) bounce: DmaBuf,
    /// Head of a command that timed out and is still with the device.
    pub(crate) pending: Option<u16>,
}

impl ControlQueue {
    /// See [`PciTransport`]'s [`Transport::command`].
    pub(crate) fn execute(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
        timeout: Duration,
    ) -> Result<usize, TransportError> {
        if body.len() > abi::MAX_CMD_BODY {
            return Err(io_err(
                format!("command {opcode}"),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("body of {} bytes", body.len()),
                ),
            ));
        }
        // The bounce buffer may be reused only once the device returned it.
        // A device that let a command time out gets a short grace, not a
        // whole timeout per command: a program on a dead device (its host
        // daemon killed) fails each later command within
        // STALE_COMMAND_GRACE, so tearing its objects down stays quick.
        if let Some(stale) = self.pending {
            let queue = &mut self.queue;
            poll_until(timeout.min(STALE_COMMAND_GRACE), || queue.pop_head(stale))?;
            self.pending = None;
        }
        let b = self.bounce;
        let hdr = abi::CmdHeader {
            opcode,
            ctx,
            len: body.len() as u32,
        };
        let hlen = size_of::<abi::CmdHeader>();
        // SAFETY: the bounce buffer is RESP_OFF + RESP_LEN bytes, owned by
        // the transport, and the device does not hold it (nothing pending).
        unsafe {
            ptr::copy_nonoverlapping(hdr.as_bytes().as_ptr(), b.ptr, hlen);
            ptr::copy_nonoverlapping(body.as_ptr(), b.ptr.add(hlen), body.len());
            ptr::write_bytes(b.ptr.add(RESP_OFF), 0, RESP_LEN);
        }
        let head = self.queue.q.add(&[
            BufDesc {
                addr: b.gpa,
                len: (hlen + body.len()) as u32,
                writable: false,
            },
            BufDesc {
                addr: b.gpa + RESP_OFF as u64,
                len: RESP_LEN as u32,
                writable: true,
            },
        ])?;
        let queue = &mut self.queue;
        let used = queue
            .kick()
            .and_then(|()| poll_until(timeout, || queue.pop_head(head)));
        let used = match used {
            Ok(u) => u,
            Err(e) => {
                self.pending = Some(head);
                return Err(e);
            }
        };
        let what = || format!("response to command {opcode}");
        let rlen = size_of::<abi::RespHeader>();
        let written = used.len as usize;
        if written < rlen {
            return Err(protocol(
                what(),
                format!("device wrote {written} bytes, less than a RespHeader"),
            ));
        }
        let mut rh = abi::RespHeader::default();
        // SAFETY: the device returned the buffer; RESP_LEN >= rlen bytes.
        unsafe {
            ptr::copy_nonoverlapping(b.ptr.add(RESP_OFF), rh.as_bytes_mut().as_mut_ptr(), rlen)
        };
        if rh.status != abi::STATUS_OK {
            return Err(TransportError::Status {
                opcode,
                status: rh.status,
            });
        }
        let body_len = rh.len as usize;
        if body_len > abi::MAX_CMD_BODY || rlen + body_len > written.min(RESP_LEN) {
            return Err(protocol(
                what(),
                format!("body length {body_len} but the device wrote {written} bytes in all"),
            ));
        }
        let n = body_len.min(resp.len());
        // SAFETY: rlen + n <= RESP_LEN, inside the returned buffer.
        unsafe { ptr::copy_nonoverlapping(b.ptr.add(RESP_OFF + rlen), resp.as_mut_ptr(), n) };
        Ok(n)
    }
}

/// Polls `f` until it yields a value, spinning (4096 polls), then
/// sleeping 50 µs between polls, at most `timeout`.
pub(crate) fn poll_until<T>(
    timeout: Duration,
    mut f: impl FnMut() -> Result<Option<T>, TransportError>,
) -> Result<T, TransportError> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(v) = f()? {
            return Ok(v);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            if start.elapsed() >= timeout {
                return Err(TransportError::Timeout(timeout.as_millis() as u64));
            }
            if spins >= 4096 {
                // Sleep rather than yield: a real-time caller (the guest
                // agent) would otherwise keep the CPU from every normal
                // thread for the whole wait.
                std::thread::sleep(Duration::from_micros(50));
            }
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Largest power-of-two queue size not above `max` (the device's maximum),
/// [`abi::MAX_QUEUE_SIZE`], and whose rings fit in `limit` bytes; 0 if `max` is 0.
pub(crate) fn pick_queue_size(max: u16, limit: usize) -> u16 {
    let cap = max.min(abi::MAX_QUEUE_SIZE);
    if cap == 0 {
        return 0;
    }
    let mut s = 1u16 << (15 - cap.leading_zeros().min(15));
    while s > 1 && QueueLayout::new(s).map(|l| l.len > limit).unwrap_or(true) {
        s /= 2;
    }
    s
}
