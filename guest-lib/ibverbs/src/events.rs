//! Completion channels and asynchronous events: `ibv_create_comp_channel(3)`,
//! `ibv_get_cq_event(3)`, `ibv_ack_cq_events(3)`, `ibv_get_async_event(3)`,
//! `ibv_ack_async_event(3)`.
//!
//! Every open context has an event thread. It sleeps on the transport's
//! event descriptor ([`vrnic_guest::transport::Transport::event_fd`]: the
//! loopback engine's eventfd, or in a VM the device's INTx interrupt
//! through `/dev/uioN`; a transport without one, e.g. a VM without
//! `uio_pci_generic`, is polled every millisecond) and on a stop
//! eventfd, drains the device's events and routes them: a completion event
//! (`EV_COMP`) to the channel of its CQ, anything else to the context's
//! asynchronous event queue (QP fatal, SQ drained, last WQE reached, CQ
//! error, SRQ limit reached). A channel's `fd` and the context's `async_fd`
//! are semaphore eventfds, readable while events wait — so applications can
//! `poll(2)`/`epoll(7)` them, and the blocking `ibv_get_cq_event` and
//! `ibv_get_async_event` sleep in `read(2)` instead of spinning, as with
//! rdma-core's kernel descriptors (`O_NONBLOCK` set by the application is
//! honoured: `EAGAIN`).

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vrnic_abi as abi;
use vrnic_guest::verbs::Context;

use crate::boundary::{fail_with_errno, ffi};
use crate::context::VrnicContext;
use crate::ffi as c;

/// How often the event thread polls a transport without an event descriptor.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A new eventfd: `EFD_SEMAPHORE` (one read, one event), blocking unless
/// `nonblock`.
pub(crate) fn eventfd(nonblock: bool) -> std::io::Result<OwnedFd> {
    let flags =
        libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE | if nonblock { libc::EFD_NONBLOCK } else { 0 };
    // SAFETY: plain syscall; the result is checked and then owned.
    let fd = unsafe { libc::eventfd(0, flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: RawFd) {
    // SAFETY: eventfd_write on a live eventfd; failure (counter overflow) leaves it readable.
    unsafe { libc::eventfd_write(fd, 1) };
}

/// Waits for one event on a semaphore eventfd: 0, or the errno of `read(2)`
/// (`EAGAIN` when the application made the descriptor non-blocking).
fn wait_one(fd: RawFd) -> c_int {
    let mut v: u64 = 0;
    loop {
        // SAFETY: reads 8 bytes into a live u64.
        let n = unsafe { libc::read(fd, std::ptr::from_mut(&mut v).cast(), 8) };
        if n == 8 {
            return 0;
        }
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        if e != libc::EINTR {
            return e;
        }
    }
}

/// A completion channel's shared part: the descriptor and the CQs whose
/// events wait (one entry per event).
pub(crate) struct Channel {
    pub(crate) fd: OwnedFd,
    queue: Mutex<VecDeque<usize>>,
}

/// What the application sees of a channel, with the shared part behind it.
#[repr(C)]
pub(crate) struct VrnicChannel {
    pub(crate) ch: c::ibv_comp_channel,
    pub(crate) shared: Arc<Channel>,
}

/// A CQ as the event thread knows it: the application's pointer and its channel.
struct CqEntry {
    cq: usize,
    channel: Option<Arc<Channel>>,
}

/// An asynchronous event waiting for `ibv_get_async_event` (pointers as integers: `Send`).
#[derive(Clone, Copy)]
struct AsyncEvent {
    element: usize,
    kind: c::ibv_event_type,
}

/// A context's event state, shared with its event thread.
pub(crate) struct Events {
    cqs: Mutex<HashMap<u32, CqEntry>>,
    qps: Mutex<HashMap<u32, usize>>,
    srqs: Mutex<HashMap<u32, usize>>,
    async_q: Mutex<VecDeque<AsyncEvent>>,
    /// The context's `async_fd`.
    pub(crate) async_fd: OwnedFd,
    stop: OwnedFd,
}

impl Events {
    /// Records a CQ (by number) for completion events.
    pub(crate) fn add_cq(&self, cqn: u32, cq: *mut c::ibv_cq, channel: Option<Arc<Channel>>) {
        lock(&self.cqs).insert(
            cqn,
            CqEntry {
                cq: cq as usize,
                channel,
            },
        );
    }

    /// Forgets a CQ: no event names it after this returns, and its waiting
    /// asynchronous events are dropped.
    pub(crate) fn remove_cq(&self, cqn: u32, cq: *mut c::ibv_cq) {
        lock(&self.cqs).remove(&cqn);
        lock(&self.async_q).retain(|e| e.element != cq as usize);
    }

    /// Records a QP (by number) for asynchronous events.
    pub(crate) fn add_qp(&self, qpn: u32, qp: *mut c::ibv_qp) {
        lock(&self.qps).insert(qpn, qp as usize);
    }

    /// Forgets a QP, and drops its waiting asynchronous events.
    pub(crate) fn remove_qp(&self, qpn: u32, qp: *mut c::ibv_qp) {
        lock(&self.qps).remove(&qpn);
        lock(&self.async_q).retain(|e| e.element != qp as usize);
    }

    /// Records an SRQ (by number) for its limit event.
    pub(crate) fn add_srq(&self, srqn: u32, srq: *mut c::ibv_srq) {
        lock(&self.srqs).insert(srqn, srq as usize);
    }

    /// Forgets an SRQ, and drops its waiting asynchronous events.
    pub(crate) fn remove_srq(&self, srqn: u32, srq: *mut c::ibv_srq) {
        lock(&self.srqs).remove(&srqn);
        lock(&self.async_q).retain(|e| e.element != srq as usize);
    }

    fn dispatch(&self, e: abi::Event) {
        let kind = match e.kind {
            abi::EV_COMP => {
                let cqs = lock(&self.cqs);
                if let Some(CqEntry {
                    cq,
                    channel: Some(ch),
                }) = cqs.get(&e.handle)
                {
                    lock(&ch.queue).push_back(*cq);
                    signal(ch.fd.as_raw_fd());
                }
                return;
            }
            abi::EV_CQ_ERR => {
                let cq = lock(&self.cqs).get(&e.handle).map(|c| c.cq);
                if let Some(cq) = cq {
                    self.push_async(cq, c::ibv_event_type_IBV_EVENT_CQ_ERR);
                }
                return;
            }
            abi::EV_SRQ_LIMIT => {
                let srq = lock(&self.srqs).get(&e.handle).copied();
                if let Some(srq) = srq {
                    self.push_async(srq, c::ibv_event_type_IBV_EVENT_SRQ_LIMIT_REACHED);
                }
                return;
            }
            abi::EV_QP_FATAL => c::ibv_event_type_IBV_EVENT_QP_FATAL,
            abi::EV_SQ_DRAINED => c::ibv_event_type_IBV_EVENT_SQ_DRAINED,
            abi::EV_QP_LAST_WQE_REACHED => c::ibv_event_type_IBV_EVENT_QP_LAST_WQE_REACHED,
            _ => return,
        };
        let qp = lock(&self.qps).get(&e.handle).copied();
        if let Some(qp) = qp {
            self.push_async(qp, kind);
        }
    }

    fn push_async(&self, element: usize, kind: c::ibv_event_type) {
        lock(&self.async_q).push_back(AsyncEvent { element, kind });
        signal(self.async_fd.as_raw_fd());
    }
}

/// The event thread of one context; stopped and joined on drop.
pub(crate) struct EventThread {
    pub(crate) events: Arc<Events>,
    thread: Option<JoinHandle<()>>,
}

impl EventThread {
    /// Starts the event thread of `verbs`.
    pub(crate) fn start(verbs: &Context) -> std::io::Result<EventThread> {
        let events = Arc::new(Events {
            cqs: Mutex::new(HashMap::new()),
            qps: Mutex::new(HashMap::new()),
            srqs: Mutex::new(HashMap::new()),
            async_q: Mutex::new(VecDeque::new()),
            async_fd: eventfd(false)?,
            stop: eventfd(true)?,
        });
        let (ev, verbs) = (events.clone(), verbs.clone());
        let thread = std::thread::Builder::new()
            .name("vrnic-events".into())
            .spawn(move || run(&verbs, &ev))?;
        Ok(EventThread {
            events,
            thread: Some(thread),
        })
    }
}

impl Drop for EventThread {
    fn drop(&mut self) {
        signal(self.events.stop.as_raw_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(verbs: &Context, ev: &Events) {
    let dev_fd = verbs.event_fd();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: ev.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: dev_fd.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = if dev_fd.is_some() {
            -1
        } else {
            POLL_INTERVAL.as_millis() as c_int
        };
        // SAFETY: `fds` is live for the call; a negative fd is ignored.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if fds[0].revents != 0 {
            return;
        }
        if dev_fd.is_some() {
            // Consume the wake-up and re-arm it before draining, so an
            // event queued meanwhile wakes the next poll.
            verbs.ack_event();
        }
        while let Some(e) = verbs.poll_event() {
            ev.dispatch(e);
        }
    }
}

/// `ibv_create_comp_channel(3)`: a channel whose `fd` is readable while
/// completion events wait; NULL with errno on failure.
pub(crate) extern "C" fn ibv_create_comp_channel(
    context: *mut c::ibv_context,
) -> *mut c::ibv_comp_channel {
    ffi("ibv_create_comp_channel", std::ptr::null_mut(), || {
        // SAFETY: the application passes a context from ibv_open_device or NULL.
        if unsafe { VrnicContext::from_ptr(context) }.is_none() {
            return fail_with_errno(libc::EINVAL);
        }
        let fd = match eventfd(false) {
            Ok(fd) => fd,
            Err(e) => {
                return fail_with_errno(e.raw_os_error().unwrap_or(libc::EMFILE));
            }
        };
        let shared = Arc::new(Channel {
            fd,
            queue: Mutex::new(VecDeque::new()),
        });
        let ch = c::ibv_comp_channel {
            context,
            fd: shared.fd.as_raw_fd(),
            refcnt: 0,
        };
        let b = Box::into_raw(Box::new(VrnicChannel { ch, shared }));
        // SAFETY: `b` is the live box just leaked; freed by ibv_destroy_comp_channel.
        unsafe { std::ptr::addr_of_mut!((*b).ch) }
    })
}

/// `ibv_destroy_comp_channel(3)`: 0, or `EINVAL` for NULL. (rdma-core
/// refuses with `EBUSY` while CQs use the channel; vrnic keeps the channel's
/// shared part alive for them instead.)
pub(crate) extern "C" fn ibv_destroy_comp_channel(channel: *mut c::ibv_comp_channel) -> c_int {
    ffi("ibv_destroy_comp_channel", libc::EIO, || {
        if channel.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: `ch` is the first field of the #[repr(C)] VrnicChannel boxed
        // by ibv_create_comp_channel; freed once here.
        drop(unsafe { Box::from_raw(channel.cast::<VrnicChannel>()) });
        0
    })
}

/// The shared part of an application's channel pointer (NULL: `None`).
///
/// # Safety
/// A non-NULL `channel` must come from [`ibv_create_comp_channel`] and be alive.
pub(crate) unsafe fn channel_of(channel: *mut c::ibv_comp_channel) -> Option<Arc<Channel>> {
    // SAFETY: per the contract, `channel` is the start of a live VrnicChannel.
    (!channel.is_null()).then(|| unsafe { (*channel.cast::<VrnicChannel>()).shared.clone() })
}

/// `ibv_get_cq_event(3)`: waits for the next completion event on `channel`
/// (sleeping in `read(2)` unless the application made the fd non-blocking)
/// and returns its CQ and the CQ's `cq_context`; 0, or -1 with errno.
pub(crate) extern "C" fn ibv_get_cq_event(
    channel: *mut c::ibv_comp_channel,
    cq_out: *mut *mut c::ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    ffi("ibv_get_cq_event", -1, || {
        // SAFETY: the application passes a live channel or NULL.
        let Some(ch) = (unsafe { channel_of(channel) }) else {
            return fail_with_errno(libc::EINVAL);
        };
        if cq_out.is_null() || cq_context.is_null() {
            return fail_with_errno(libc::EINVAL);
        }
        let e = wait_one(ch.fd.as_raw_fd());
        if e != 0 {
            return fail_with_errno(e);
        }
        let Some(cq) = lock(&ch.queue).pop_front() else {
            return fail_with_errno(libc::EAGAIN);
        };
        let cq = cq as *mut c::ibv_cq;
        // SAFETY: outputs non-NULL (checked); `cq` is a live CQ of this
        // channel (the application destroys CQs only after their events).
        unsafe {
            *cq_out = cq;
            *cq_context = (*cq).cq_context;
        }
        0
    })
}

/// `ibv_ack_cq_events(3)`: counts acknowledged events in
/// `cq->comp_events_completed`, as rdma-core.
pub(crate) extern "C" fn ibv_ack_cq_events(cq: *mut c::ibv_cq, nevents: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: `cq` is a live CQ; only the application's thread acknowledging
    // its events writes this counter (rdma-core takes cq->mutex; vrnic's
    // destroy does not wait on it).
    unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
}

/// `ibv_get_async_event(3)`: waits for the next asynchronous event of
/// `context` (QP fatal, SQ drained, last WQE reached, CQ error); 0, or -1
/// with errno.
pub(crate) extern "C" fn ibv_get_async_event(
    context: *mut c::ibv_context,
    event: *mut c::ibv_async_event,
) -> c_int {
    ffi("ibv_get_async_event", -1, || {
        // SAFETY: the application passes a context from ibv_open_device or NULL.
        let Some(ctx) = (unsafe { VrnicContext::from_ptr(context) }) else {
            return fail_with_errno(libc::EINVAL);
        };
        if event.is_null() {
            return fail_with_errno(libc::EINVAL);
        }
        let ev = &ctx.events.events;
        let e = wait_one(ev.async_fd.as_raw_fd());
        if e != 0 {
            return fail_with_errno(e);
        }
        let Some(a) = lock(&ev.async_q).pop_front() else {
            return fail_with_errno(libc::EAGAIN);
        };
        let mut out = c::ibv_async_event {
            event_type: a.kind,
            ..Default::default()
        };
        if a.kind == c::ibv_event_type_IBV_EVENT_CQ_ERR {
            out.element.cq = a.element as *mut c::ibv_cq;
        } else if a.kind == c::ibv_event_type_IBV_EVENT_SRQ_LIMIT_REACHED {
            out.element.srq = a.element as *mut c::ibv_srq;
        } else {
            out.element.qp = a.element as *mut c::ibv_qp;
        }
        // SAFETY: non-NULL (checked), the caller's struct ibv_async_event.
        unsafe { event.write(out) };
        0
    })
}

/// `ibv_ack_async_event(3)`: nothing to release in vrnic.
pub(crate) extern "C" fn ibv_ack_async_event(_event: *mut c::ibv_async_event) {}
