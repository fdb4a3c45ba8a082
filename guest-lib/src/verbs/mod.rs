//! The verbs API: `ibv_*` semantics over a [`Transport`].
//!
//! Objects and the man pages they follow:
//! - [`Context`]: an open device (`ibv_open_device(3)`), with
//!   [`Context::query_device`] (`ibv_query_device(3)`),
//!   [`Context::query_port`] (`ibv_query_port(3)`) and
//!   [`Context::query_gid`] (`ibv_query_gid(3)`).
//! - [`Pd`]: a protection domain (`ibv_alloc_pd(3)`).
//! - [`Mr`]: a memory region (`ibv_reg_mr(3)`).
//! - [`Cq`]: a completion queue (`ibv_create_cq(3)`, `ibv_poll_cq(3)`).
//! - [`Qp`]: a queue pair (`ibv_create_qp(3)`, `ibv_modify_qp(3)`,
//!   `ibv_query_qp(3)`, `ibv_post_send(3)`, `ibv_post_recv(3)`): RC, UC or
//!   UD ([`QpType`]), or the port's GSI QP, QP1 ([`QpType::Gsi`], one per
//!   device, for the CM's MADs: the guest agent's; `libibverbs.so.1` never
//!   creates it).
//! - [`Ah`]: an address handle for UD sends (`ibv_create_ah(3)`).
//! - [`Srq`]: a shared receive queue (`ibv_create_srq(3)`,
//!   `ibv_modify_srq(3)`, `ibv_query_srq(3)`, `ibv_post_srq_recv(3)`).
//!
//! Asynchronous events (`ibv_get_async_event(3)`: `EV_QP_FATAL`,
//! `EV_SRQ_LIMIT`, `EV_QP_LAST_WQE_REACHED`, ...) and completion events
//! (`EV_COMP`) come from [`Context::poll_event`].
//!
//! Ownership replaces reference counting by hand: an [`Mr`], [`Ah`],
//! [`Srq`] and [`Qp`] keep their [`Pd`] alive, a [`Qp`] keeps its CQs and
//! its SRQ alive, and every object keeps the [`Context`] (and so the
//! transport and its DMA memory) alive.
//! Dropping an object destroys it on the device; a failure there is logged,
//! not returned.
//!
//! Rings live in DMA memory from [`Transport::alloc_dma`]. A CQ, QP or SRQ
//! gives its rings and records back ([`Transport::release_dma`]) once the
//! device destroyed it, or refused to create it; a transport that keeps
//! DMA memory for its lifetime (the default) ignores that. The page-list
//! buffer of [`Mr`] registration is reused.
//!
//! # Example
//! ```no_run
//! # fn demo(transport: Box<dyn vrnic_guest::transport::Transport>) -> Result<(), vrnic_guest::verbs::VerbsError> {
//! use vrnic_guest::verbs::*;
//! let ctx = Context::open(transport)?;
//! let pd = Pd::alloc(&ctx)?;
//! let mr = Mr::alloc(&pd, 4096, ACCESS_LOCAL_WRITE)?;
//! let mut cq = Cq::new(&ctx, 16)?;
//! let init = QpInitAttr {
//!     qp_type: QpType::Rc,
//!     send_cq: &cq,
//!     recv_cq: &cq,
//!     srq: None,
//!     cap: QpCap { max_send_wr: 1, max_recv_wr: 8, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
//!     sq_sig_all: false,
//! };
//! let mut qp = Qp::new(&pd, &init)?;
//! qp.post_recv(&RecvWr { wr_id: 1, sg_list: &[mr.sge(0, 4096)] })?;
//! let mut wc = [WorkCompletion::default(); 4];
//! let n = cq.poll(&mut wc);
//! # let _ = n; Ok(()) }
//! ```

mod ah;
mod cq;
mod device;
mod mr;
mod pd;
mod qp;
mod srq;
mod wc;
mod wq;

use std::sync::{Arc, Mutex, MutexGuard};

pub use ah::{grh_sgid, Ah, AhAttr, GRH_LEN};
pub use cq::Cq;
pub use device::Gid;
pub use mr::Mr;
pub use pd::Pd;
pub use qp::{
    AtomicWr, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType, RcPath, RdmaWr, SendWr, UdWr,
    WrOpcode,
};
pub use srq::{Srq, SrqAttr, SrqInitAttr};
pub use vrnic_abi::{
    DeviceAttr, Event, PortAttr, Sge, ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ,
    ACCESS_REMOTE_WRITE, EV_COMP, EV_CQ_ERR, EV_QP_FATAL, EV_QP_LAST_WQE_REACHED, EV_SQ_DRAINED,
    EV_SRQ_LIMIT, QP_ATTR_ACCESS_FLAGS, QP_ATTR_AV, QP_ATTR_CUR_STATE, QP_ATTR_DEST_QPN,
    QP_ATTR_MAX_DEST_RD_ATOMIC, QP_ATTR_MAX_QP_RD_ATOMIC, QP_ATTR_MIN_RNR_TIMER, QP_ATTR_PATH_MTU,
    QP_ATTR_PKEY_INDEX, QP_ATTR_PORT, QP_ATTR_QKEY, QP_ATTR_RETRY_CNT, QP_ATTR_RNR_RETRY,
    QP_ATTR_RQ_PSN, QP_ATTR_SQ_PSN, QP_ATTR_STATE, QP_ATTR_TIMEOUT, SEND_FENCE, SEND_INLINE,
    SEND_SIGNALED, SEND_SOLICITED, SRQ_ATTR_LIMIT, SRQ_ATTR_MAX_WR, WC_GRH, WC_WITH_IMM,
    WC_WITH_INV,
};
pub use wc::{wc_status_str, WorkCompletion};
pub use wq::RecvWr;

use crate::transport::{DmaBuf, Transport, TransportError};
use vrnic_abi::{self as abi, command};

/// Errors of the verbs API. [`VerbsError::errno`] gives the errno an
/// `ibv_*` call would have returned or set.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// The transport failed, or the device rejected a command (its status is
    /// the errno, as `ibv_*` calls report it).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The transport's configuration space does not describe a vrnic device
    /// of this ABI version.
    #[error("not a vrnic device of ABI version {expected}: signature {signature:02x?}, ABI version {abi_version}")]
    NotVrnic {
        /// The signature read.
        signature: [u8; 8],
        /// The ABI version read.
        abi_version: u32,
        /// [`abi::ABI_VERSION`].
        expected: u32,
    },
    /// An argument is outside what the object supports (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(ArgError),
    /// A work queue is full (`ENOMEM`, as `ibv_post_send(3)` and
    /// `ibv_post_recv(3)` report it).
    #[error("{queue} full: {outstanding} of {size} work requests outstanding")]
    QueueFull {
        /// `"send queue"` or `"receive queue"`.
        queue: &'static str,
        /// Work requests posted and not yet consumed by the device.
        outstanding: u32,
        /// Queue size, work requests.
        size: u32,
    },
    /// The device answered a command with fewer bytes than its response
    /// structure (`EIO`).
    #[error("device response to command {opcode} too short: {got} bytes, expected {want}")]
    ShortResponse {
        /// The `abi::CMD_*` opcode.
        opcode: u16,
        /// Bytes received.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
    /// The device answered with a value this library cannot use (`EIO`).
    #[error("device returned an invalid value: {0}")]
    BadResponse(ResponseError),
    /// An operating system call failed (for example `mlock(2)` of an MR).
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Which argument is outside what the object supports, and how
/// ([`VerbsError::InvalidArgument`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A work request with more SGEs than its queue holds.
    #[error("{sges} SGEs, {queue} allows {max}")]
    TooManySges {
        /// SGEs in the work request.
        sges: usize,
        /// `"QP"`, `"receive queue"` or `"shared receive queue"`.
        queue: &'static str,
        /// SGEs the queue holds per work request.
        max: u32,
    },
    /// A queue whose ring would exceed 2^31 slots.
    #[error("{queue} of {wr} work requests")]
    QueueTooLarge {
        /// `"send queue"`, `"receive queue"` or `"shared receive queue"`.
        queue: &'static str,
        /// Work requests asked for.
        wr: u32,
    },
    /// A ring larger than the address space.
    #[error("ring of {size} slots of {stride} bytes")]
    RingTooLarge {
        /// Slots.
        size: u32,
        /// Bytes a slot.
        stride: u32,
    },
    /// A QP on an SRQ of another context.
    #[error("the SRQ belongs to another context")]
    ForeignSrq,
    /// A QP with more than 255 SGEs per work request.
    #[error("{send}/{recv} SGEs per work request")]
    QpSges {
        /// Send SGEs asked for.
        send: u32,
        /// Receive SGEs asked for.
        recv: u32,
    },
    /// An SRQ with more than 255 SGEs per work request.
    #[error("{sges} SGEs per work request")]
    SrqSges {
        /// SGEs asked for.
        sges: u32,
    },
    /// `SEND_INLINE` in the flags instead of [`SendWr::inline_data`].
    #[error("SEND_INLINE: give the data in SendWr::inline_data")]
    InlineFlag,
    /// Inline data and an SGE list in one work request.
    #[error("inline data together with an SGE list")]
    InlineWithSges,
    /// More inline data than the QP holds.
    #[error("{len} bytes inline, QP allows {max}")]
    InlineTooLong {
        /// Bytes given.
        len: usize,
        /// The QP's `max_inline_data`.
        max: u32,
    },
    /// An atomic whose SGE list is not one 8-byte SGE.
    #[error("an atomic needs one 8-byte SGE")]
    AtomicSge,
    /// A message longer than `max_msg_sz`.
    #[error("a message of {len} bytes, max_msg_sz is {max}")]
    MessageTooLong {
        /// Bytes.
        len: u64,
        /// [`abi::MAX_MSG_SZ`].
        max: u32,
    },
    /// A remote address range that wraps the address space.
    #[error("remote range of {len} bytes at {addr:#x} wraps")]
    RemoteRangeWraps {
        /// Its start.
        addr: u64,
        /// Its length, bytes.
        len: u64,
    },
    /// A receive posted to a QP that receives from an SRQ.
    #[error("the QP receives from an SRQ: post with Srq::post_recv")]
    RecvOnSrqQp,
    /// A post to a queue the QP's state does not take work for yet: a
    /// send before RTS, a receive in RESET (rxe's `rxe_post_send`,
    /// `rxe_post_recv`).
    #[error("{queue} of a QP in {state:?} takes no work requests")]
    NotReady {
        /// Which queue.
        queue: &'static str,
        /// The QP's state.
        state: QpState,
    },
    /// A CQ of 0 or more than 2^31 entries.
    #[error("CQ of {cqe} entries")]
    CqSize {
        /// Entries asked for.
        cqe: u32,
    },
    /// A transport whose page size is not a power of two of at least 4096.
    #[error("transport page size {page_size} is not a power of two >= 4096")]
    PageSize {
        /// Its page size, bytes.
        page_size: usize,
    },
    /// A memory region of 0 bytes.
    #[error("memory region of 0 bytes")]
    EmptyMr,
    /// A memory region that wraps the address space.
    #[error("memory region wraps the address space")]
    MrWraps,
    /// A memory region of more pages than a page list holds.
    #[error("memory region of {len} bytes is too large")]
    MrTooLarge {
        /// Its length, bytes.
        len: usize,
    },
}

/// What the device answered that this library cannot use
/// ([`VerbsError::BadResponse`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// A QP state that is no `ibv_qp_state`.
    #[error("QP state {0}")]
    QpState(u32),
    /// QP ring strides that do not fit the rings allocated.
    #[error("QP strides {sq_stride}/{rq_stride} (inline {max_inline}) do not fit rings of {sq_size}/{rq_size} slots")]
    QpStrides {
        /// Send queue stride, bytes.
        sq_stride: u32,
        /// Receive queue stride, bytes.
        rq_stride: u32,
        /// Inline bytes granted.
        max_inline: u32,
        /// Send queue slots.
        sq_size: u32,
        /// Receive queue slots.
        rq_size: u32,
    },
    /// An SRQ ring that does not fit the ring allocated.
    #[error("SRQ of {max_wr} slots of {stride} bytes does not fit a ring of {size} slots for {max_sge} SGEs")]
    SrqRing {
        /// Slots granted.
        max_wr: u32,
        /// Stride granted, bytes.
        stride: u32,
        /// Slots allocated.
        size: u32,
        /// SGEs asked for.
        max_sge: u32,
    },
}

impl VerbsError {
    /// The Linux errno the corresponding `ibv_*` call would report.
    pub fn errno(&self) -> i32 {
        match self {
            VerbsError::Transport(e) => e.errno(),
            VerbsError::NotVrnic { .. } => libc::ENODEV,
            VerbsError::InvalidArgument(_) => libc::EINVAL,
            VerbsError::QueueFull { .. } => libc::ENOMEM,
            VerbsError::ShortResponse { .. } | VerbsError::BadResponse(_) => libc::EIO,
            VerbsError::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

/// Result of the verbs API.
pub type Result<T> = std::result::Result<T, VerbsError>;

/// An open vrnic device (`struct ibv_context`). Cheap to clone: clones share
/// the transport.
#[derive(Clone)]
pub struct Context {
    inner: Arc<CtxInner>,
}

struct CtxInner {
    transport: Mutex<Box<dyn Transport>>,
    config: abi::ConfigSpace,
    page_size: usize,
    /// DMA buffer reused for MR page lists; taken for the whole `CMD_REG_MR`.
    page_list: Mutex<Option<DmaBuf>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("mac", &self.inner.config.mac)
            .field("page_size", &self.inner.page_size)
            .finish_non_exhaustive()
    }
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Context {
    /// Opens the device behind `transport` (`ibv_open_device(3)`): reads its
    /// configuration space and checks the signature and ABI version.
    ///
    /// Errors: [`VerbsError::NotVrnic`] for another device or ABI version;
    /// [`VerbsError::InvalidArgument`] when the transport's page size is not
    /// a power of two of at least 4096 bytes.
    pub fn open(transport: Box<dyn Transport>) -> Result<Context> {
        let config = transport.config();
        if config.signature != abi::SIGNATURE || config.abi_version != abi::ABI_VERSION {
            return Err(VerbsError::NotVrnic {
                signature: config.signature,
                abi_version: config.abi_version,
                expected: abi::ABI_VERSION,
            });
        }
        let page_size = transport.page_size();
        if !page_size.is_power_of_two() || page_size < 4096 {
            return Err(VerbsError::InvalidArgument(ArgError::PageSize {
                page_size,
            }));
        }
        Ok(Context {
            inner: Arc::new(CtxInner {
                transport: Mutex::new(transport),
                config,
                page_size,
                page_list: Mutex::new(None),
            }),
        })
    }

    /// The device's configuration space, as read at open.
    pub fn config(&self) -> abi::ConfigSpace {
        self.inner.config
    }

    /// The page size the transport translates addresses at, bytes (the page
    /// size of MR page lists).
    pub fn page_size(&self) -> usize {
        self.inner.page_size
    }

    /// Device attributes (`ibv_query_device(3)`, `CMD_QUERY_DEVICE`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        self.execute::<command::QueryDevice>(&())
    }

    /// Attributes of `port` (`ibv_query_port(3)`, `CMD_QUERY_PORT`); vrnic
    /// has one port, number 1. A RoCE port has no LID: rdma-core reports 0.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let body = abi::QueryPort {
            port: port.into(),
            reserved: 0,
        };
        self.execute::<command::QueryPort>(&body)
    }

    /// GID `index` of `port` (`ibv_query_gid(3)`, `CMD_QUERY_GID`). On vrnic
    /// index 0 is the link-local GID from the MAC and index 1 the
    /// IPv4-mapped RoCEv2 GID, as with Linux rxe.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let body = abi::QueryGid {
            port: port.into(),
            index,
        };
        let e = self.execute::<command::QueryGid>(&body)?;
        Ok(Gid { raw: e.gid })
    }

    /// P_Key `index` of `port` (`ibv_query_pkey(3)`, `CMD_QUERY_PKEY`),
    /// host order; bit 15 is full membership (IBTA §10.9.1). vrnic's table
    /// has one entry, 0xFFFF, as Linux rxe; an index past it is an error
    /// (`ENOENT`).
    pub fn query_pkey(&self, port: u8, index: u32) -> Result<u16> {
        let body = abi::QueryPkey {
            port: port.into(),
            index,
        };
        let e = self.execute::<command::QueryPkey>(&body)?;
        Ok(e.pkey)
    }

    /// Next asynchronous event from the device (`ibv_get_async_event(3)` and
    /// completion events), if one is waiting. Never blocks. `kind` is one of
    /// `EV_COMP` (`handle` a CQ number, after [`Cq::req_notify`]),
    /// `EV_QP_FATAL` (a QP number; `info` the `ibv_wc_status` that moved
    /// it to ERR), `EV_CQ_ERR` (a CQ that overran), `EV_SQ_DRAINED` (a QP
    /// in SQD with nothing outstanding), `EV_SRQ_LIMIT` (an SRQ number; the
    /// limit armed with [`Srq::arm_limit`] was crossed) and
    /// `EV_QP_LAST_WQE_REACHED` (a QP on an SRQ that left the receive path).
    pub fn poll_event(&self) -> Option<abi::Event> {
        lock(&self.inner.transport).poll_event()
    }

    /// Whether to yield between empty CQ polls ([`Transport::yield_when_idle`]).
    pub fn yield_when_idle(&self) -> bool {
        lock(&self.inner.transport).yield_when_idle()
    }

    /// Whether this context's QPs ask for doorbell records
    /// ([`crate::transport::Transport::doorbell_records`]).
    pub fn doorbell_records(&self) -> bool {
        lock(&self.inner.transport).doorbell_records()
    }

    /// The transport's event descriptor ([`Transport::event_fd`]): readable
    /// when [`Context::poll_event`] has something.
    pub fn event_fd(&self) -> Option<std::os::fd::RawFd> {
        lock(&self.inner.transport).event_fd()
    }

    /// Consumes and re-arms the wake-up of [`Context::event_fd`]
    /// ([`Transport::ack_event`]); call it after the descriptor polled
    /// readable and before draining [`Context::poll_event`].
    pub fn ack_event(&self) {
        lock(&self.inner.transport).ack_event()
    }

    /// True when `self` and `other` are the same open device (clones of one
    /// [`Context::open`]).
    pub(crate) fn same_device(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Allocates `len` zeroed bytes of DMA memory aligned to `align` bytes (a
    /// power of two up to 2 MiB), alive as long as this context's transport.
    pub fn alloc_dma(&self, len: usize, align: usize) -> Result<DmaBuf> {
        Ok(lock(&self.inner.transport).alloc_dma(len, align)?)
    }

    /// Gives `bufs` (from [`Context::alloc_dma`]) back
    /// ([`Transport::release_dma`]); only once the device no longer uses
    /// them.
    pub(crate) fn release_dma(&self, bufs: &[DmaBuf]) {
        self.with_transport(|t| bufs.iter().for_each(|b| t.release_dma(*b)))
    }

    /// Gives `bufs`, allocated for an object whose create failed with
    /// `e`, back when the device answered (a status: it never took them);
    /// after a timeout or a lost connection the device may yet use them,
    /// and they stay allocated.
    pub(crate) fn release_after_refusal(&self, e: &VerbsError, bufs: &[DmaBuf]) {
        if matches!(e, VerbsError::Transport(TransportError::Status { .. })) {
            self.release_dma(bufs);
        }
    }

    /// Runs `f` with the transport locked.
    pub(crate) fn with_transport<T>(&self, f: impl FnOnce(&mut dyn Transport) -> T) -> T {
        f(&mut **lock(&self.inner.transport))
    }

    /// Rings a doorbell.
    pub(crate) fn doorbell(&self, db: &abi::Doorbell) -> Result<()> {
        Ok(self.with_transport(|t| t.doorbell(db))?)
    }

    /// Executes control command `C` with body `req` ([`abi::Command`]
    /// ties the opcode to both body types; `dyn Transport::execute`).
    /// Errors: the transport's, and a response shorter than
    /// `C::Response` ([`VerbsError::ShortResponse`]).
    pub(crate) fn execute<C: abi::Command>(&self, req: &C::Request) -> Result<C::Response> {
        let (r, n) = self.with_transport(|t| t.execute::<C>(req))?;
        let want = size_of::<C::Response>();
        if n < want {
            return Err(VerbsError::ShortResponse {
                opcode: C::OPCODE,
                got: n,
                want,
            });
        }
        Ok(r)
    }

    /// Destroys an object on drop: executes `C` on `handle` and logs a
    /// failure. True when the device destroyed it (and no longer uses its
    /// memory).
    pub(crate) fn destroy<C: abi::Command<Request = abi::Handle, Response = ()>>(
        &self,
        what: &str,
        handle: u32,
    ) -> bool {
        let body = abi::Handle {
            handle,
            reserved: 0,
        };
        match self.execute::<C>(&body) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("destroying {what} {handle:#x} failed: {e}");
                false
            }
        }
    }

    /// The page-list buffer, at least `len` bytes, locked for one registration.
    pub(crate) fn page_list_buf(&self, len: usize) -> Result<PageListGuard<'_>> {
        let mut g = lock(&self.inner.page_list);
        if g.is_none_or(|b| b.len < len) {
            let size = len.max(4096).next_power_of_two();
            *g = Some(self.alloc_dma(size, 4096)?);
        }
        Ok(PageListGuard(g))
    }
}

/// The context's page-list DMA buffer, held for one registration.
pub(crate) struct PageListGuard<'a>(MutexGuard<'a, Option<DmaBuf>>);

impl PageListGuard<'_> {
    /// The buffer.
    pub(crate) fn buf(&self) -> DmaBuf {
        self.0
            .expect("page-list buffer allocated by Context::page_list_buf")
    }
}
