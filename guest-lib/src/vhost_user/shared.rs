//! Several device opens in one process over its one vhost-user connection:
//! [`VhostUserContext`].
//!
//! The daemon serves one frontend per function, and the process is that
//! frontend; but a program (rdma-core's pyverbs tests, UCX) may open the
//! device several times. So the first open connects
//! ([`VhostUserTransport`]) and every open, the first included, takes a
//! device context of its own on that connection (`CMD_OPEN_CTX`, device
//! spec §5.x.6.13), as the guest agent does for the programs it serves
//! ([`crate::agent`]). The connection is shared, counted, and closed with
//! the last context.
//!
//! - **Commands** go out with the context's number in `CmdHeader.ctx`, and
//!   **doorbells** carry it (`Doorbell::ctx`): an open names only its own
//!   objects (another context's lkey in a WQE is a protection error, its QP
//!   or CQ number in a command `ENOENT`/`EINVAL`, in a doorbell ignored).
//!   The data path is as it was: a post writes the ring and, when the QP
//!   has no doorbell record, one doorbell slot and a kick; the connection's
//!   lock is taken, uncontended in a one-open program.
//! - **Memory**: the shared memory is the connection's; each context carves
//!   its DMA memory (rings, page lists) from chunks of its own, given back
//!   when it is closed. Registered pages are counted process-wide, so two
//!   contexts may register the same buffer.
//! - **Events** are stamped by the device with the owning context
//!   (`Event::ctx`). A router thread per connection sleeps on the event
//!   queue's call eventfd, drains the queue and appends each event to its
//!   context's mailbox, whose own eventfd is the context's
//!   [`Transport::event_fd`] (what completion channels and
//!   `ibv_get_async_event` sleep on); an event about the whole device
//!   ([`abi::ALL_CTX`]) goes to every context. Routing, opening and closing
//!   hold the connection's lock, so a closed context's number, reused by a
//!   new open, never receives the old one's events.
//! - **Closing** (dropping the transport, which the verbs layer does after
//!   the last object of the context is gone) sends `CMD_CLOSE_CTX`, which
//!   destroys whatever the context still owns and nothing of the others.
//! - Several **processes** per function are still refused (a second
//!   connection), with the message of [`VhostUserTransport::open`]. A
//!   child after `fork(2)` does not share its parent's connection: it
//!   connects anew (and is refused while the parent holds the function).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrnic_abi::{self as abi, command};

use super::{io_err, DmaCarver, VhostUserTransport, DEFAULT_TIMEOUT, PAGE};
use crate::transport::{DmaBuf, Transport, TransportError};

/// Longest the router sleeps without a wake-up before it drains the event
/// queue anyway (a missed interrupt costs at most this).
const ROUTER_INTERVAL: Duration = Duration::from_millis(200);
/// Events a context's mailbox holds; past it the newest are dropped
/// (counted), as a full event queue would.
const MAILBOX_DEPTH: usize = 4096;

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The events of one context, and the eventfd that is readable while the
/// router has appended some since the last [`Transport::ack_event`].
#[derive(Debug)]
struct Mailbox {
    queue: Mutex<VecDeque<abi::Event>>,
    efd: EventFd,
}

impl Mailbox {
    fn new() -> Result<Self, TransportError> {
        Ok(Mailbox {
            queue: Mutex::new(VecDeque::new()),
            efd: EventFd::new(EFD_NONBLOCK).map_err(|e| io_err("eventfd", e))?,
        })
    }

    /// Appends `ev` and wakes the context's waiter; false when full.
    fn push(&self, ev: abi::Event) -> bool {
        let mut q = lock(&self.queue);
        if q.len() >= MAILBOX_DEPTH {
            return false;
        }
        q.push_back(ev);
        drop(q);
        // An EAGAIN (counter at its maximum) leaves it readable anyway.
        let _ = self.efd.write(1);
        true
    }
}

/// What the connection's lock protects.
struct State {
    dev: VhostUserTransport,
    /// Open contexts → their mailboxes.
    routes: HashMap<u16, Arc<Mailbox>>,
    /// Events no open context owned, or whose mailbox was full.
    events_dropped: u64,
}

impl State {
    /// Drains the device's event queue into the mailboxes.
    fn route(&mut self) {
        // Bounded: an event queue's worth at a time is at most 256.
        for _ in 0..1024 {
            let Some(ev) = self.dev.poll_event() else {
                return;
            };
            let delivered = if ev.ctx == abi::ALL_CTX {
                // Every mailbox, not stopping at the first that takes it.
                self.routes.values().filter(|m| m.push(ev)).count() > 0
            } else {
                self.routes.get(&ev.ctx).is_some_and(|m| m.push(ev))
            };
            if !delivered {
                self.events_dropped += 1;
                tracing::debug!(?ev, "event for no open context; dropped");
            }
        }
    }
}

/// A connection and the router thread's stop signal.
struct Conn {
    state: Mutex<State>,
    /// The event queue's call eventfd (owned by `state.dev`).
    call: Option<RawFd>,
    stop: EventFd,
}

/// The process's connection to one socket, shared by its contexts; the
/// last one to go stops the router and closes the connection.
struct Shared {
    conn: Arc<Conn>,
    router: Option<std::thread::JoinHandle<()>>,
    socket: PathBuf,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // An EAGAIN (counter at its maximum) leaves it readable anyway.
        let _ = self.conn.stop.write(1);
        if let Some(t) = self.router.take() {
            let _ = t.join();
        }
        // `conn` goes now (the router's reference is gone): the connection
        // closes, the daemon resets the function.
    }
}

/// The connections of this process, by socket: opened by the first
/// context, found by the next ones while any of them lives. The process ID
/// tells a child after `fork(2)` its parent's entries.
static CONNECTIONS: Mutex<Vec<(PathBuf, u32, Weak<Shared>)>> = Mutex::new(Vec::new());

impl Shared {
    /// The live connection of this process to `socket`, or a new one.
    fn get(socket: &Path, timeout: Duration) -> Result<Arc<Shared>, TransportError> {
        let key = std::fs::canonicalize(socket).unwrap_or_else(|_| socket.to_path_buf());
        let pid = std::process::id();
        let mut all = lock(&CONNECTIONS);
        all.retain(|(_, p, w)| *p == pid && w.strong_count() > 0);
        if let Some(s) = all
            .iter()
            .find(|(k, _, _)| *k == key)
            .and_then(|(_, _, w)| w.upgrade())
        {
            return Ok(s);
        }
        // Connecting under the lock: a concurrent first open waits for
        // this one rather than making a second connection (refused).
        let dev = VhostUserTransport::open_within(socket, timeout)?;
        let conn = Arc::new(Conn {
            call: dev.event_fd(),
            state: Mutex::new(State {
                dev,
                routes: HashMap::new(),
                events_dropped: 0,
            }),
            stop: EventFd::new(EFD_NONBLOCK).map_err(|e| io_err("eventfd", e))?,
        });
        let c = conn.clone();
        let router = std::thread::Builder::new()
            .name("vrnic-evroute".into())
            .spawn(move || run_router(&c))
            .map_err(|e| io_err("starting the event router", e))?;
        let s = Arc::new(Shared {
            conn,
            router: Some(router),
            socket: socket.to_path_buf(),
        });
        all.push((key, pid, Arc::downgrade(&s)));
        Ok(s)
    }
}

/// The router: waits for the event queue's interrupt (or the stop
/// signal), then routes what the device queued.
fn run_router(conn: &Conn) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: conn.stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: conn.call.unwrap_or(-1),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of two pollfds; a negative fd is
        // ignored.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, ROUTER_INTERVAL.as_millis() as i32) };
        if fds[0].revents != 0 {
            return;
        }
        let mut st = lock(&conn.state);
        if fds[1].revents != 0 {
            // Consume the wake-up and re-arm it before draining, so an
            // event queued meanwhile wakes the next poll.
            st.dev.ack_event();
        }
        st.route();
    }
}

/// One device open in a process attached to a vrnic function's vhost-user
/// socket: a device context of its own on the process's shared connection
/// (see the [module documentation](self)). Dropping it closes the context
/// (`CMD_CLOSE_CTX`), and the last one the connection.
pub struct VhostUserContext {
    shared: Arc<Shared>,
    ctx: u16,
    config: abi::ConfigSpace,
    mailbox: Arc<Mailbox>,
    dma: DmaCarver,
}

impl std::fmt::Debug for VhostUserContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VhostUserContext")
            .field("socket", &self.shared.socket)
            .field("ctx", &self.ctx)
            .finish_non_exhaustive()
    }
}

impl VhostUserContext {
    /// Opens a device context on this process's connection to `socket`,
    /// connecting first when no other context of the process is open on
    /// it ([`VhostUserTransport::open`], bounded by [`DEFAULT_TIMEOUT`]).
    ///
    /// Errors: those of [`VhostUserTransport::open`] (another process holds
    /// the function: [`TransportError::NoDevice`]); `CMD_OPEN_CTX` refused
    /// ([`TransportError::Status`], `ENOMEM` past [`abi::MAX_CTX`]
    /// contexts); [`TransportError::Io`] for an eventfd or thread that
    /// cannot be made.
    pub fn open(socket: &Path) -> Result<Self, TransportError> {
        Self::open_within(socket, DEFAULT_TIMEOUT)
    }

    /// [`VhostUserContext::open`], a new connection's set-up bounded by
    /// `timeout` ([`VhostUserTransport::open_within`]).
    pub fn open_within(socket: &Path, timeout: Duration) -> Result<Self, TransportError> {
        let shared = Shared::get(socket, timeout)?;
        let mailbox = Arc::new(Mailbox::new()?);
        let mut st = lock(&shared.conn.state);
        let dev: &mut dyn Transport = &mut st.dev;
        let (h, _) = dev.execute::<command::OpenCtx>(&())?;
        let ctx = match u16::try_from(h.handle) {
            Ok(c) if c != abi::DEFAULT_CTX && c != abi::ALL_CTX => c,
            _ => {
                return Err(io_err(
                    "opening a device context",
                    std::io::Error::other(format!("the device answered context {}", h.handle)),
                ))
            }
        };
        st.routes.insert(ctx, mailbox.clone());
        let config = st.dev.config();
        tracing::debug!(ctx, contexts = st.routes.len(), "device context opened");
        drop(st);
        Ok(VhostUserContext {
            shared,
            ctx,
            config,
            mailbox,
            dma: DmaCarver::default(),
        })
    }

    /// This open's device context number.
    pub fn ctx(&self) -> u16 {
        self.ctx
    }

    /// The socket the shared connection is connected to.
    pub fn socket(&self) -> &Path {
        &self.shared.socket
    }

    /// Device contexts of this process open on the same connection, this
    /// one included.
    pub fn contexts(&self) -> usize {
        lock(&self.shared.conn.state).routes.len()
    }

    /// Events the router dropped on this connection: for no open context
    /// (a context closed with events queued), or a full mailbox.
    pub fn events_dropped(&self) -> u64 {
        lock(&self.shared.conn.state).events_dropped
    }

    /// Pages of the program remapped onto shared memory, for all contexts
    /// ([`VhostUserTransport::user_pages`]).
    pub fn user_pages(&self) -> usize {
        lock(&self.shared.conn.state).dev.user_pages()
    }

    /// Whether the daemon still holds the connection
    /// ([`VhostUserTransport::is_connected`]).
    pub fn is_connected(&self) -> bool {
        lock(&self.shared.conn.state).dev.is_connected()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared.conn.state)
    }
}

impl Transport for VhostUserContext {
    fn config(&self) -> abi::ConfigSpace {
        self.config
    }

    /// Executes the command in this open's context
    /// ([`VhostUserTransport`]'s, bounded by [`DEFAULT_TIMEOUT`]).
    /// [`abi::DEFAULT_CTX`] (what [`Transport::command`] passes) means this
    /// context; another context is `EOPNOTSUPP`.
    fn command_in(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        if ctx != self.ctx {
            crate::transport::not_this_context(ctx, opcode)?;
        }
        let ctx = self.ctx;
        self.state().dev.command_in(ctx, opcode, body, resp)
    }

    /// Rings the doorbell with this open's context in it.
    fn doorbell(&mut self, db: &abi::Doorbell) -> Result<(), TransportError> {
        let db = abi::Doorbell {
            ctx: self.ctx,
            ..*db
        };
        self.state().dev.doorbell(&db)
    }

    /// DMA memory from this context's own chunks of the shared memory,
    /// given back when the context is closed.
    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        let mut st = lock(&self.shared.conn.state);
        st.dev.alloc_dma_in(&mut self.dma, len, align)
    }

    /// Back to this context's own memory, for its next objects.
    fn release_dma(&mut self, buf: DmaBuf) {
        let mut st = lock(&self.shared.conn.state);
        st.dev.release_dma_in(&mut self.dma, buf)
    }

    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        self.state().dev.virt_to_phys(va)
    }

    fn page_size(&self) -> usize {
        PAGE
    }

    /// The next event the router put in this context's mailbox.
    fn poll_event(&mut self) -> Option<abi::Event> {
        lock(&self.mailbox.queue).pop_front()
    }

    /// The mailbox's eventfd: readable once the router appended an event.
    fn event_fd(&self) -> Option<RawFd> {
        Some(self.mailbox.efd.as_raw_fd())
    }

    /// As [`VhostUserTransport`]'s: the daemon's worker runs on this
    /// machine's CPUs.
    fn yield_when_idle(&self) -> bool {
        true
    }

    /// As [`VhostUserTransport`]'s: the daemon polls QP records.
    fn doorbell_records(&self) -> bool {
        true
    }

    /// As [`VhostUserTransport`]'s: registered pages are shared memory.
    fn needs_locked_pages(&self) -> bool {
        false
    }

    /// [`VhostUserTransport`]'s, counted per page for the whole process.
    fn map_user(&mut self, va: usize, len: usize) -> Result<(), TransportError> {
        self.state().dev.map_user(va, len)
    }

    fn unmap_user(&mut self, va: usize, len: usize) {
        self.state().dev.unmap_user(va, len)
    }
}

impl Drop for VhostUserContext {
    /// Closes the context (`CMD_CLOSE_CTX`: the device destroys what it
    /// still owns), stops routing its events, and gives its DMA memory
    /// back, unless the device may still use it (the close failed on a
    /// connection that is still there: then it stays allocated).
    fn drop(&mut self) {
        let ctx = self.ctx;
        let mut st = lock(&self.shared.conn.state);
        let body = abi::Handle {
            handle: ctx.into(),
            reserved: 0,
        };
        let dev: &mut dyn Transport = &mut st.dev;
        let closed = dev.execute::<command::CloseCtx>(&body);
        // Events of the context still queued go nowhere now.
        st.route();
        st.routes.remove(&ctx);
        match closed {
            Ok(_) => st.dev.free_dma(&mut self.dma),
            Err(_) if !st.dev.is_connected() => st.dev.free_dma(&mut self.dma),
            Err(e) => tracing::warn!(ctx, "closing the device context: {e}; its memory is kept"),
        }
        tracing::debug!(ctx, contexts = st.routes.len(), "device context closed");
    }
}
