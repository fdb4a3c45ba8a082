//! The vrnic device ABI: the one source of truth for everything the driver
//! (`guest-lib`) and the device (`vhost`) exchange.
//!
//! Specified in prose in `docs/device-spec.md`, in the style of a virtio
//! device section. Every structure here is `#[repr(C)]`, has no implicit
//! padding (checked at compile time) and is little-endian, like every virtio
//! structure (virtio 1.2 §1.4). Numeric codes reuse the libibverbs values
//! (`ibv_wc_status`, `ibv_wr_opcode`, `ibv_qp_state`, ...; see
//! `infiniband/verbs.h` and the `ibv_*` man pages) so the driver can pass them
//! through unchanged.
//!
//! Queues (virtio 1.2 §2.7, split virtqueues):
//! - [`CONTROLQ`]: driver posts a chain `[CmdHeader + body (device-readable)]
//!   [RespHeader + body (device-writable)]`; the device answers every command.
//! - [`DOORBELLQ`]: driver posts device-readable [`Doorbell`] records.
//! - [`EVENTQ`]: driver posts device-writable buffers of [`Event`] size; the
//!   device fills them with asynchronous events.
//!
//! SQ, RQ and CQ rings live in driver memory, contiguous in guest-physical
//! address space, registered by [`CMD_CREATE_QP`] and [`CMD_CREATE_CQ`].

#![deny(missing_docs)]
#![allow(clippy::unusual_byte_groupings)]

pub mod command;
pub use command::Command;

#[cfg(not(target_endian = "little"))]
compile_error!("the vrnic ABI is little-endian and vrnic builds only for little-endian targets");

/// Plain-old-data structures of the ABI: byte views in both directions.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain only integer fields and byte
/// arrays, and have no padding, so every bit pattern is valid.
pub unsafe trait Pod: Copy + Default + 'static {
    /// The structure's bytes.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: Pod guarantees no padding and plain integer fields.
        unsafe { std::slice::from_raw_parts(self as *const Self as *const u8, size_of::<Self>()) }
    }
    /// The structure's bytes, writable.
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; every bit pattern is a valid value.
        unsafe { std::slice::from_raw_parts_mut(self as *mut Self as *mut u8, size_of::<Self>()) }
    }
    /// Reads a structure from the start of `bytes`; `None` when `bytes` is
    /// shorter than the structure. Never panics.
    fn read_from(bytes: &[u8]) -> Option<Self> {
        let mut v = Self::default();
        let n = size_of::<Self>();
        v.as_bytes_mut().copy_from_slice(bytes.get(..n)?);
        Some(v)
    }
}

macro_rules! pod {
    ($($t:ty = $size:expr),* $(,)?) => {$(
        // SAFETY: checked below: the size equals the sum of the declared
        // fields (no padding), and all fields are integers or byte arrays.
        unsafe impl Pod for $t {}
        const _: () = assert!(size_of::<$t>() == $size);
    )*};
}

/// PCI vendor ID of every virtio device (virtio 1.2 §4.1.2).
pub const PCI_VENDOR_ID: u16 = 0x1af4;
/// Modern virtio PCI device IDs are `0x1040 + virtio device ID` (virtio 1.2 §4.1.2).
pub const PCI_DEVICE_ID_BASE: u16 = 0x1040;
/// Default virtio device ID. The spec reserves 42 for RDMA, but QEMU aborts
/// on IDs it cannot name; 6 (ioMemory) is named by QEMU and claimed by no
/// Linux driver. The driver recognises vrnic by [`SIGNATURE`], not by ID.
pub const DEFAULT_VIRTIO_ID: u32 = 6;
/// First 8 bytes of the device configuration space.
pub const SIGNATURE: [u8; 8] = *b"vrnic\0\0\0";
/// Version of this ABI, in [`ConfigSpace::abi_version`].
pub const ABI_VERSION: u32 = 3;

/// Control virtqueue index.
pub const CONTROLQ: u16 = 0;
/// Doorbell virtqueue index.
pub const DOORBELLQ: u16 = 1;
/// Event virtqueue index.
pub const EVENTQ: u16 = 2;
/// Number of virtqueues (QEMU's `num_vqs`).
pub const NUM_QUEUES: usize = 3;
/// Largest virtqueue size the device accepts.
pub const MAX_QUEUE_SIZE: u16 = 256;

/// Device configuration space (virtio 1.2 §4.1.4.6), read-only, 64 bytes
/// (QEMU's `config_size=64`). Read it once: under vhost-user every access is
/// a round trip to the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigSpace {
    /// [`SIGNATURE`].
    pub signature: [u8; 8],
    /// [`ABI_VERSION`].
    pub abi_version: u32,
    /// Number of virtqueues the device serves ([`NUM_QUEUES`]).
    pub num_queues: u16,
    /// Number of ports (always 1).
    pub phys_port_cnt: u8,
    /// Active path MTU as `ibv_mtu` (1=256 .. 5=4096 bytes).
    pub active_mtu: u8,
    /// The port's Ethernet MAC address.
    pub mac: [u8; 6],
    /// Reserved, zero.
    pub reserved0: [u8; 2],
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum number of CQs.
    pub max_cq: u32,
    /// Maximum number of MRs.
    pub max_mr: u32,
    /// Maximum number of PDs.
    pub max_pd: u32,
    /// Maximum WQEs per SQ or RQ.
    pub max_qp_wr: u32,
    /// Maximum CQEs per CQ.
    pub max_cqe: u32,
    /// Maximum SGEs per WQE.
    pub max_sge: u32,
    /// Maximum inline data per send WQE, bytes.
    pub max_inline: u32,
    /// Reserved, zero.
    pub reserved1: [u8; 8],
}

// ---------------------------------------------------------------------------
// Control commands
// ---------------------------------------------------------------------------

/// Header of every control command (device-readable).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdHeader {
    /// One of the `CMD_*` codes.
    pub opcode: u16,
    /// The device context the command acts for ([`DEFAULT_CTX`], or one
    /// opened by [`CMD_OPEN_CTX`]; device spec §5.x.6.13): it owns every
    /// object the command creates, and may name only objects it owns.
    pub ctx: u16,
    /// Length of the body that follows, bytes.
    pub len: u32,
}

/// Header of every control response (device-writable).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RespHeader {
    /// `STATUS_OK` or a positive Linux errno ([`Status`]).
    pub status: u32,
    /// Length of the body that follows, bytes (0 on error).
    pub len: u32,
}

/// Largest command or response body, bytes.
pub const MAX_CMD_BODY: usize = 128;

/// Largest message of a work request, bytes (`ibv_port_attr.max_msg_sz`,
/// [`PortAttr::max_msg_sz`]; rxe's `RXE_MAX_MSG_SIZE`): a driver refuses a
/// longer one; the device completes a longer WQE with
/// [`WC_LOC_LEN_ERR`] and NAKs a peer's SEND growing past it, or a READ or
/// WRITE asking for more, as an invalid request.
pub const MAX_MSG_SZ: u32 = 1 << 31;

/// `CMD_QUERY_DEVICE`: body none; response [`DeviceAttr`] (`ibv_query_device(3)`).
pub const CMD_QUERY_DEVICE: u16 = 1;
/// `CMD_QUERY_PORT`: body [`QueryPort`]; response [`PortAttr`] (`ibv_query_port(3)`).
pub const CMD_QUERY_PORT: u16 = 2;
/// `CMD_QUERY_GID`: body [`QueryGid`]; response [`GidEntry`] (`ibv_query_gid(3)`).
pub const CMD_QUERY_GID: u16 = 3;
/// `CMD_ALLOC_PD`: body none; response [`Handle`] (the PD number) (`ibv_alloc_pd(3)`).
pub const CMD_ALLOC_PD: u16 = 4;
/// `CMD_DEALLOC_PD`: body [`Handle`]; response none. `EBUSY` while in use.
pub const CMD_DEALLOC_PD: u16 = 5;
/// `CMD_REG_MR`: body [`RegMr`]; response [`MrKeys`] (`ibv_reg_mr(3)`).
pub const CMD_REG_MR: u16 = 6;
/// `CMD_DEREG_MR`: body [`Handle`] (the lkey); response none.
pub const CMD_DEREG_MR: u16 = 7;
/// `CMD_CREATE_CQ`: body [`CreateCq`]; response [`Handle`] (the CQ number).
pub const CMD_CREATE_CQ: u16 = 8;
/// `CMD_DESTROY_CQ`: body [`Handle`]; response none. `EBUSY` while a QP uses it.
pub const CMD_DESTROY_CQ: u16 = 9;
/// `CMD_CREATE_QP`: body [`CreateQp`]; response [`CreateQpResp`] (`ibv_create_qp(3)`).
pub const CMD_CREATE_QP: u16 = 10;
/// `CMD_MODIFY_QP`: body [`QpAttr`]; response none (`ibv_modify_qp(3)`).
pub const CMD_MODIFY_QP: u16 = 11;
/// `CMD_QUERY_QP`: body [`Handle`]; response [`QpAttr`] (`ibv_query_qp(3)`).
pub const CMD_QUERY_QP: u16 = 12;
/// `CMD_DESTROY_QP`: body [`Handle`]; response none.
pub const CMD_DESTROY_QP: u16 = 13;
/// `CMD_CREATE_AH`: body [`CreateAh`]; response [`Handle`] (the AH number)
/// (`ibv_create_ah(3)`).
pub const CMD_CREATE_AH: u16 = 14;
/// `CMD_DESTROY_AH`: body [`Handle`]; response none.
pub const CMD_DESTROY_AH: u16 = 15;
/// `CMD_CREATE_SRQ`: body [`CreateSrq`]; response [`CreateSrqResp`]
/// (`ibv_create_srq(3)`).
pub const CMD_CREATE_SRQ: u16 = 16;
/// `CMD_MODIFY_SRQ`: body [`SrqAttr`]; response none (`ibv_modify_srq(3)`:
/// only [`SRQ_ATTR_LIMIT`]; resizing is `EOPNOTSUPP`).
pub const CMD_MODIFY_SRQ: u16 = 17;
/// `CMD_QUERY_SRQ`: body [`Handle`]; response [`SrqAttr`] (`ibv_query_srq(3)`).
pub const CMD_QUERY_SRQ: u16 = 18;
/// `CMD_DESTROY_SRQ`: body [`Handle`]; response none. `EBUSY` while a QP uses it.
pub const CMD_DESTROY_SRQ: u16 = 19;
/// `CMD_QUERY_PKEY`: body [`QueryPkey`]; response [`PkeyEntry`]
/// (`ibv_query_pkey(3)`).
pub const CMD_QUERY_PKEY: u16 = 20;
/// `CMD_OPEN_CTX`: body none; response [`Handle`] naming a new device
/// context (device spec §5.x.6.13). Only [`DEFAULT_CTX`] may open one;
/// `STATUS_ENOMEM` past [`MAX_CTX`].
pub const CMD_OPEN_CTX: u16 = 21;
/// `CMD_CLOSE_CTX`: body [`Handle`] naming a context other than
/// [`DEFAULT_CTX`]; destroys every object the context owns (QPs, SRQs,
/// CQs, AHs, MRs, PDs, as the kernel's `uverbs` does for a closed file)
/// and frees its number. Only [`DEFAULT_CTX`] may close one.
pub const CMD_CLOSE_CTX: u16 = 22;

/// `CMD_QUERY_USAGE`: body none; response [`Usage`]: the objects that
/// exist in the whole device, every context together (what `rdma
/// resource` shows for a kernel RNIC). Only [`DEFAULT_CTX`] may ask.
pub const CMD_QUERY_USAGE: u16 = 23;

/// Response of [`CMD_QUERY_USAGE`], 32 bytes: counts of live objects.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Open device contexts, [`DEFAULT_CTX`] included.
    pub ctxs: u32,
    /// Protection domains.
    pub pds: u32,
    /// Memory regions.
    pub mrs: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Address handles.
    pub ahs: u32,
    /// Shared receive queues.
    pub srqs: u32,
    /// Page-list entries of all MRs.
    pub mr_pages: u32,
}

/// The device context every driver has without opening one: the context
/// of a driver that does not share the device, and of a guest agent's own
/// commands (device spec §5.x.6.13).
pub const DEFAULT_CTX: u16 = 0;
/// [`Event::ctx`] of an event about the whole device.
pub const ALL_CTX: u16 = u16::MAX;
/// Device contexts open at once, [`DEFAULT_CTX`] included.
pub const MAX_CTX: usize = 256;

/// Command status codes: 0 or a positive Linux errno.
pub type Status = u32;
/// Success.
pub const STATUS_OK: Status = 0;
/// Operation not permitted (reserved; invalid access flag combinations are
/// `STATUS_EINVAL`, as the kernel answers `ibv_reg_mr(3)`).
pub const STATUS_EPERM: Status = 1;
/// No such object (bad handle or key).
pub const STATUS_ENOENT: Status = 2;
/// Out of resources (device limits reached).
pub const STATUS_ENOMEM: Status = 12;
/// Bad address: a guest address or length outside guest memory.
pub const STATUS_EFAULT: Status = 14;
/// Object in use.
pub const STATUS_EBUSY: Status = 16;
/// Invalid argument.
pub const STATUS_EINVAL: Status = 22;
/// No such device: the device has no state for this driver (a vhost-user
/// backend that restarted under a running driver; device spec §5.x.9). The
/// driver must reset the device and start again.
pub const STATUS_ENODEV: Status = 19;
/// Unknown command.
pub const STATUS_ENOSYS: Status = 38;
/// Not supported.
pub const STATUS_EOPNOTSUPP: Status = 95;

/// A single object handle (PD number, lkey, CQ number or QP number).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handle {
    /// The handle.
    pub handle: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `ibv_device_attr`'s fields a driver needs, and the device's budgets
/// (device spec §5.x.6.2): every count and size here is enforced by the
/// commands, a single object beyond its maximum with `STATUS_EINVAL`, an
/// object past a device-wide count or budget with `STATUS_ENOMEM` (as
/// mlx5; today's rxe answers `-EINVAL` for both, device spec §5.x.6.2).
/// 96 bytes; the fields from
/// `max_srq` on follow the 64 bytes of earlier devices.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Node GUID (EUI-64 of the MAC), big-endian bytes.
    pub node_guid: [u8; 8],
    /// Largest MR, bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (bit n = 2^n bytes).
    pub page_size_cap: u64,
    /// Maximum QPs.
    pub max_qp: u32,
    /// Maximum WQEs per queue.
    pub max_qp_wr: u32,
    /// Maximum SGEs per WQE.
    pub max_sge: u32,
    /// Maximum CQs.
    pub max_cq: u32,
    /// Maximum CQEs per CQ.
    pub max_cqe: u32,
    /// Maximum MRs.
    pub max_mr: u32,
    /// Maximum PDs.
    pub max_pd: u32,
    /// Maximum outstanding RDMA READ/atomic as responder.
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA READ/atomic as requester.
    pub max_qp_init_rd_atom: u32,
    /// Maximum inline data, bytes.
    pub max_inline: u32,
    /// Maximum SRQs (`ibv_device_attr.max_srq`).
    pub max_srq: u32,
    /// Maximum WQEs per SRQ (`max_srq_wr`).
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ receive WQE (`max_srq_sge`).
    pub max_srq_sge: u32,
    /// Maximum address handles (`max_ah`).
    pub max_ah: u32,
    /// Most page-list entries of one MR (`CMD_REG_MR` `npages`); more is
    /// `STATUS_EINVAL`.
    pub max_mr_pages: u32,
    /// Page-list entries of all MRs of the device together; a
    /// registration past it is `STATUS_ENOMEM` until MRs are deregistered.
    pub max_total_mr_pages: u32,
    /// SQ, RQ and SRQ ring entries of all QPs and SRQs of the device
    /// together; a QP or SRQ past it is `STATUS_ENOMEM`.
    pub max_total_wr: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `CMD_QUERY_PORT` body.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryPort {
    /// Port number, 1.
    pub port: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `ibv_port_attr`'s fields for a RoCE port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortAttr {
    /// `ibv_port_state` (4 = ACTIVE).
    pub state: u32,
    /// Largest path MTU, `ibv_mtu`.
    pub max_mtu: u32,
    /// Active path MTU, `ibv_mtu`.
    pub active_mtu: u32,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Largest message, bytes.
    pub max_msg_sz: u32,
    /// Link layer, `IBV_LINK_LAYER_ETHERNET` (2).
    pub link_layer: u32,
}

/// `CMD_QUERY_GID` body.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryGid {
    /// Port number, 1.
    pub port: u32,
    /// GID table index.
    pub index: u32,
}

/// One GID table entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID, network byte order.
    pub gid: [u8; 16],
    /// [`GID_TYPE_ROCE_V2`] (the only type vrnic sends).
    pub gid_type: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `CMD_QUERY_PKEY` body.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryPkey {
    /// Port number, 1.
    pub port: u32,
    /// P_Key table index.
    pub index: u32,
}

/// One P_Key table entry (IBTA §10.9.1: bit 15 full membership, bits
/// 14..0 the partition).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PkeyEntry {
    /// The P_Key, host order.
    pub pkey: u16,
    /// Reserved, zero.
    pub reserved0: u16,
    /// Reserved, zero.
    pub reserved1: u32,
}

/// RoCEv2 GID type (`IB_GID_TYPE_ROCE_UDP_ENCAP`).
pub const GID_TYPE_ROCE_V2: u32 = 2;

/// `CMD_REG_MR` body: a memory region described by a page list.
///
/// The region covers virtual addresses `[iova, iova + length)`. Page `i` of
/// the list holds the guest-physical address of the page containing
/// `(iova & !(page_size-1)) + i * page_size`; `npages` must equal the number
/// of pages the range touches.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegMr {
    /// PD number.
    pub pdn: u32,
    /// `ibv_access_flags` (`ACCESS_*`).
    pub access: u32,
    /// First virtual address of the region.
    pub iova: u64,
    /// Length, bytes.
    pub length: u64,
    /// log2 of the page size (12 for 4 KiB, 21 for 2 MiB).
    pub page_shift: u32,
    /// Number of entries in the page list.
    pub npages: u32,
    /// Guest-physical address of the page list: `npages` little-endian u64.
    pub page_list: u64,
}

/// `CMD_REG_MR` response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrKeys {
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `CMD_CREATE_CQ` body.
///
/// The ring is `cqe` entries of [`Cqe`] (32 bytes), contiguous at `ring`.
/// The doorbell record at `db` is 8 bytes: the driver's consumer index (u32,
/// free-running) at offset 0; offset 4 reserved.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateCq {
    /// Number of CQEs; a power of two.
    pub cqe: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Guest-physical address of the CQE ring.
    pub ring: u64,
    /// Guest-physical address of the CQ doorbell record.
    pub db: u64,
}

/// `CMD_CREATE_QP` body.
///
/// SQ: `sq_size` slots of [`sq_stride`]`(max_send_sge, max_inline)` bytes at
/// `sq`; RQ: `rq_size` slots of [`rq_stride`]`(max_recv_sge)` bytes at `rq`.
/// The QP record at `db` (16 bytes; 32 with [`QP_F_RQ_RECORD`]): SQ
/// consumer index (u32, device-written) at 0, RQ consumer index (u32,
/// device-written) at 4; with [`QP_F_SQ_RECORD`] the SQ producer index
/// (u32, driver-written, [`QP_REC_SQ_PI`]) at 8; with either record flag
/// the device's flags (u32, [`QP_REC_FLAGS`]: [`QP_REC_POLLED`]) at 12;
/// with [`QP_F_RQ_RECORD`] the RQ producer index (u32, driver-written,
/// [`QP_REC_RQ_PI`]) at 16 and 12 reserved bytes (device spec §5.x.6.9,
/// "Doorbell records"). Bytes no flag gives a meaning are reserved.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateQp {
    /// PD number.
    pub pdn: u32,
    /// `ibv_qp_type` ([`QPT_RC`], [`QPT_UC`], [`QPT_UD`]), or the
    /// kernel's `IB_QPT_GSI` ([`QPT_GSI`]) for the port's GSI QP.
    pub qp_type: u32,
    /// CQ for send completions.
    pub send_cqn: u32,
    /// CQ for receive completions.
    pub recv_cqn: u32,
    /// SQ slots, power of two.
    pub sq_size: u32,
    /// RQ slots, power of two (0 with an SRQ).
    pub rq_size: u32,
    /// SGEs per send WQE.
    pub max_send_sge: u32,
    /// SGEs per receive WQE.
    pub max_recv_sge: u32,
    /// Inline data per send WQE, bytes.
    pub max_inline: u32,
    /// Nonzero: every send WQE generates a CQE (`sq_sig_all`).
    pub sq_sig_all: u32,
    /// Guest-physical address of the SQ ring.
    pub sq: u64,
    /// Guest-physical address of the RQ ring (ignored with an SRQ).
    pub rq: u64,
    /// Guest-physical address of the QP record.
    pub db: u64,
    /// Shared receive queue number, or 0 for the QP's own RQ.
    pub srqn: u32,
    /// `QP_F_*` flags ([`QP_F_SQ_RECORD`]); other bits zero.
    pub flags: u32,
}

/// [`CreateQp::flags`]: the driver writes the SQ producer index to the QP
/// record ([`QP_REC_SQ_PI`]) before every `DB_SQ` it would post, and may
/// leave the doorbell out while the device sets [`QP_REC_POLLED`]
/// (device spec §5.x.6.9, "Doorbell records").
pub const QP_F_SQ_RECORD: u32 = 1;
/// [`CreateQp::flags`]: as [`QP_F_SQ_RECORD`] for the RQ and `DB_RQ`
/// ([`QP_REC_RQ_PI`]); the QP record is then 32 bytes. Not with an SRQ.
pub const QP_F_RQ_RECORD: u32 = 2;
/// Every `QP_F_*` flag the device knows.
pub const QP_F_ALL: u32 = QP_F_SQ_RECORD | QP_F_RQ_RECORD;
/// Offset in the QP record of the driver-written SQ producer index (u32,
/// free-running), with [`QP_F_SQ_RECORD`].
pub const QP_REC_SQ_PI: u64 = 8;
/// Offset in the QP record of the device-written flags (u32), with
/// [`QP_F_SQ_RECORD`] or [`QP_F_RQ_RECORD`].
pub const QP_REC_FLAGS: u64 = 12;
/// Offset in the QP record of the driver-written RQ producer index (u32,
/// free-running), with [`QP_F_RQ_RECORD`].
pub const QP_REC_RQ_PI: u64 = 16;
/// Bytes of a QP record with [`QP_F_RQ_RECORD`] (16 without).
pub const QP_RECORD_RQ_LEN: u64 = 32;

/// Bytes of the QP record of a QP created with `flags`
/// ([`CreateQp::flags`]): [`QP_RECORD_RQ_LEN`] with [`QP_F_RQ_RECORD`],
/// else 16.
pub fn qp_record_len(flags: u32) -> u64 {
    if flags & QP_F_RQ_RECORD != 0 {
        QP_RECORD_RQ_LEN
    } else {
        16
    }
}
/// [`QP_REC_FLAGS`] bit: the device reads the producer indices the QP
/// has records of while it polls, so `DB_SQ` and `DB_RQ` doorbells are
/// not needed (the driver reads this after writing [`QP_REC_SQ_PI`] or
/// [`QP_REC_RQ_PI`], with a full barrier between, as virtio 1.2
/// §2.7.13.3 checks `VIRTQ_USED_F_NO_NOTIFY`).
pub const QP_REC_POLLED: u32 = 1;

/// `CMD_CREATE_AH` body: an address vector for UD sends (`struct
/// ibv_ah_attr` with its GRH flattened). RoCE needs the GRH fields: `dgid`
/// selects IPv4 (an IPv4-mapped GID) or IPv6, and `sgid_index` must name a
/// GID of the same family.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateAh {
    /// PD number.
    pub pdn: u32,
    /// Flow label of the GRH (IPv6 flow label, 20 bits).
    pub flow_label: u32,
    /// Destination GID, network byte order.
    pub dgid: [u8; 16],
    /// Source GID index.
    pub sgid_index: u8,
    /// IP hop limit / TTL (0 means 64).
    pub hop_limit: u8,
    /// Traffic class / DSCP+ECN.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Port number (1).
    pub port_num: u8,
    /// Nonzero when the address vector has a GRH (required for RoCE).
    pub is_global: u8,
    /// Reserved, zero.
    pub reserved: [u8; 2],
}

/// `CMD_CREATE_SRQ` body.
///
/// The ring is `max_wr` slots of [`rq_stride`]`(max_sge)` bytes at `ring`,
/// each a [`RecvWqe`] with its SGEs. The SRQ record at `db` (8 bytes,
/// device-written) holds the consumer index (u32) at 0; 4..8 reserved.
/// The driver posts with [`DB_SRQ`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateSrq {
    /// PD number.
    pub pdn: u32,
    /// Ring slots, a power of two.
    pub max_wr: u32,
    /// SGEs per receive WQE.
    pub max_sge: u32,
    /// Limit: [`EV_SRQ_LIMIT`] fires once when fewer WQEs than this remain
    /// (0 = disarmed).
    pub srq_limit: u32,
    /// Guest-physical address of the ring.
    pub ring: u64,
    /// Guest-physical address of the SRQ record.
    pub db: u64,
}

/// `CMD_CREATE_SRQ` response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateSrqResp {
    /// SRQ number.
    pub srqn: u32,
    /// Receive WQE stride, bytes.
    pub stride: u32,
    /// Ring slots.
    pub max_wr: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// SRQ attributes: `CMD_MODIFY_SRQ` body and `CMD_QUERY_SRQ` response
/// (`struct ibv_srq_attr` plus the SRQ number and mask).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrqAttr {
    /// SRQ number.
    pub srqn: u32,
    /// `ibv_srq_attr_mask` ([`SRQ_ATTR_MAX_WR`], [`SRQ_ATTR_LIMIT`]).
    pub attr_mask: u32,
    /// Ring slots.
    pub max_wr: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Current limit (0 = disarmed).
    pub srq_limit: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `IBV_SRQ_MAX_WR`: resize (not supported: `EOPNOTSUPP`).
pub const SRQ_ATTR_MAX_WR: u32 = 1;
/// `IBV_SRQ_LIMIT`: arm the limit event.
pub const SRQ_ATTR_LIMIT: u32 = 2;

/// `CMD_CREATE_QP` response.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CreateQpResp {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Send WQE stride, bytes.
    pub sq_stride: u32,
    /// Receive WQE stride, bytes.
    pub rq_stride: u32,
    /// Inline data per send WQE actually available, bytes.
    pub max_inline: u32,
}

/// QP attributes for `CMD_MODIFY_QP` (body) and `CMD_QUERY_QP` (response),
/// mirroring `struct ibv_qp_attr` with its `ah_attr` flattened.
/// Only the fields named by `attr_mask` (`QP_ATTR_*`, `ibv_qp_attr_mask`)
/// are applied on modify.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// QP number.
    pub qpn: u32,
    /// `ibv_qp_attr_mask`.
    pub attr_mask: u32,
    /// `ibv_qp_state` (`QPS_*`).
    pub qp_state: u32,
    /// `ibv_mtu` (1..5).
    pub path_mtu: u32,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Expected PSN of the next request (RQ), 24 bits.
    pub rq_psn: u32,
    /// PSN of the next request sent (SQ), 24 bits.
    pub sq_psn: u32,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// `ibv_access_flags` for remote access to this QP.
    pub qp_access_flags: u32,
    /// Flow label of the GRH (unused by RoCEv2 IPv4).
    pub flow_label: u32,
    /// Destination GID, network byte order.
    pub dgid: [u8; 16],
    /// P_Key index.
    pub pkey_index: u16,
    /// Port number (1).
    pub port_num: u8,
    /// Local ACK timeout: 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Retries on timeout or PSN sequence error NAK (0..7).
    pub retry_cnt: u8,
    /// Retries on RNR NAK (0..6, 7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer field (IBTA Table 45).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READ/atomic as requester.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA READ/atomic as responder.
    pub max_dest_rd_atomic: u8,
    /// Source GID index.
    pub sgid_index: u8,
    /// IP hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class / DSCP+ECN.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Nonzero when the address vector has a GRH (always for RoCE).
    pub is_global: u8,
    /// Reserved, zero.
    pub reserved: [u8; 2],
}

/// `ibv_qp_type`: reliable connected.
pub const QPT_RC: u32 = 2;
/// `ibv_qp_type`: unreliable connected.
pub const QPT_UC: u32 = 3;
/// `ibv_qp_type`: unreliable datagram.
pub const QPT_UD: u32 = 4;
/// The GSI QP, QP1 of the port (IBTA Vol 1 §13.5): a UD QP the device
/// numbers [`GSI_QPN`], one per device, for the CM's MADs (device spec
/// §5.x.6.5, "The GSI QP"). The value is the kernel's `IB_QPT_GSI` (`enum
/// ib_qp_type`); `enum ibv_qp_type` starts at `IBV_QPT_RC` 2 (then 3, 4,
/// `RAW_PACKET` 8, `XRC_SEND` 9, `XRC_RECV` 10, `DRIVER` 0xff), so no
/// `IBV_QPT_*` value collides with it, and libibverbs has no way to ask
/// for it: `ibv_create_qp(3)` never creates the GSI QP.
pub const QPT_GSI: u32 = 1;
/// The GSI QP's number (IBTA's QP1), the only QP number below 0x11 the
/// device hands out, and only to a [`QPT_GSI`] QP.
pub const GSI_QPN: u32 = 1;
/// The Q_Key of every GSI packet (IBTA Vol 1 §13.5: QP1's well-known Q_Key,
/// the kernel's `IB_QP1_QKEY`): the device sends it in the DETH of the GSI QP's
/// datagrams whatever the WQE says, and drops a datagram for QP1 that
/// carries another.
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The P_Key of GSI packets: the default P_Key, full member. Received
/// datagrams for QP1 must match it (IBTA §10.9.3), as on Linux rxe.
pub const GSI_PKEY: u16 = 0xffff;
/// The UDP source port of the GSI QP's packets: Linux rxe's for QP 1
/// (`0xc000 + (hash_32(1, 14) & 0x3fff)`), so captures of vrnic and rxe
/// look alike. Receivers do not check it.
pub const GSI_UDP_SPORT: u16 = 0xd872;

/// `ibv_qp_state` values.
pub const QPS_RESET: u32 = 0;
/// INIT.
pub const QPS_INIT: u32 = 1;
/// Ready to receive.
pub const QPS_RTR: u32 = 2;
/// Ready to send.
pub const QPS_RTS: u32 = 3;
/// Send queue drained.
pub const QPS_SQD: u32 = 4;
/// Send queue error.
pub const QPS_SQE: u32 = 5;
/// Error.
pub const QPS_ERR: u32 = 6;

/// `ibv_qp_attr_mask` bits.
pub const QP_ATTR_STATE: u32 = 1 << 0;
/// `IBV_QP_CUR_STATE`.
pub const QP_ATTR_CUR_STATE: u32 = 1 << 1;
/// `IBV_QP_ACCESS_FLAGS`.
pub const QP_ATTR_ACCESS_FLAGS: u32 = 1 << 3;
/// `IBV_QP_PKEY_INDEX`.
pub const QP_ATTR_PKEY_INDEX: u32 = 1 << 4;
/// `IBV_QP_PORT`.
pub const QP_ATTR_PORT: u32 = 1 << 5;
/// `IBV_QP_QKEY`.
pub const QP_ATTR_QKEY: u32 = 1 << 6;
/// `IBV_QP_AV`.
pub const QP_ATTR_AV: u32 = 1 << 7;
/// `IBV_QP_PATH_MTU`.
pub const QP_ATTR_PATH_MTU: u32 = 1 << 8;
/// `IBV_QP_TIMEOUT`.
pub const QP_ATTR_TIMEOUT: u32 = 1 << 9;
/// `IBV_QP_RETRY_CNT`.
pub const QP_ATTR_RETRY_CNT: u32 = 1 << 10;
/// `IBV_QP_RNR_RETRY`.
pub const QP_ATTR_RNR_RETRY: u32 = 1 << 11;
/// `IBV_QP_RQ_PSN`.
pub const QP_ATTR_RQ_PSN: u32 = 1 << 12;
/// `IBV_QP_MAX_QP_RD_ATOMIC`.
pub const QP_ATTR_MAX_QP_RD_ATOMIC: u32 = 1 << 13;
/// `IBV_QP_MIN_RNR_TIMER`.
pub const QP_ATTR_MIN_RNR_TIMER: u32 = 1 << 15;
/// `IBV_QP_SQ_PSN`.
pub const QP_ATTR_SQ_PSN: u32 = 1 << 16;
/// `IBV_QP_MAX_DEST_RD_ATOMIC`.
pub const QP_ATTR_MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
/// `IBV_QP_DEST_QPN`.
pub const QP_ATTR_DEST_QPN: u32 = 1 << 20;

/// `ibv_access_flags`: local write.
pub const ACCESS_LOCAL_WRITE: u32 = 1;
/// Remote write.
pub const ACCESS_REMOTE_WRITE: u32 = 2;
/// Remote read.
pub const ACCESS_REMOTE_READ: u32 = 4;
/// Remote atomic.
pub const ACCESS_REMOTE_ATOMIC: u32 = 8;

/// `ibv_mtu` to bytes: 1→256 .. 5→4096; `None` otherwise.
pub fn mtu_bytes(mtu: u32) -> Option<u32> {
    (1..=5).contains(&mtu).then(|| 128u32 << mtu)
}

/// Bytes to `ibv_mtu`: the largest path MTU not above `bytes`; `None` below 256.
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    (1..=5u32).rev().find(|&m| (128u32 << m) <= bytes)
}

// ---------------------------------------------------------------------------
// Doorbells and events
// ---------------------------------------------------------------------------

/// A doorbell, posted on [`DOORBELLQ`] (device-readable, 16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Doorbell {
    /// `DB_*` kind.
    pub kind: u16,
    /// The device context ringing it (device spec §5.x.6.13): a doorbell
    /// naming an object of another context is ignored.
    pub ctx: u16,
    /// QP number (`DB_SQ`, `DB_RQ`), CQ number (`DB_CQ_ARM*`) or SRQ number (`DB_SRQ`).
    pub handle: u32,
    /// Producer index (free-running u32; slot = index mod ring size) for
    /// `DB_SQ`/`DB_RQ`/`DB_SRQ`; the consumer index for `DB_CQ_ARM*`.
    pub index: u32,
    /// Reserved, zero.
    pub reserved2: u32,
}

/// New send WQEs up to `index`.
pub const DB_SQ: u16 = 1;
/// New receive WQEs up to `index`.
pub const DB_RQ: u16 = 2;
/// Arm the CQ for the next completion (`ibv_req_notify_cq(cq, 0)`).
pub const DB_CQ_ARM: u16 = 3;
/// Arm the CQ for the next solicited completion (`ibv_req_notify_cq(cq, 1)`).
pub const DB_CQ_ARM_SOLICITED: u16 = 4;
/// New receive WQEs on the SRQ named by `handle`, up to `index`.
pub const DB_SRQ: u16 = 5;

/// An asynchronous event, written by the device into an [`EVENTQ`] buffer (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// `EV_*` kind.
    pub kind: u16,
    /// The device context owning the object the event is about (device
    /// spec §5.x.6.13); [`ALL_CTX`] for an event about the whole device
    /// (`EV_DEVICE_FATAL`).
    pub ctx: u16,
    /// The CQ or QP number the event is about.
    pub handle: u32,
    /// For `EV_QP_FATAL`: the `ibv_wc_status` that moved the QP to ERR.
    pub info: u32,
    /// Reserved, zero.
    pub reserved2: u32,
}

/// Completion event on an armed CQ.
pub const EV_COMP: u16 = 1;
/// `IBV_EVENT_QP_FATAL`.
pub const EV_QP_FATAL: u16 = 2;
/// `IBV_EVENT_CQ_ERR` (overrun).
pub const EV_CQ_ERR: u16 = 3;
/// `IBV_EVENT_SQ_DRAINED`.
pub const EV_SQ_DRAINED: u16 = 4;
/// `IBV_EVENT_SRQ_LIMIT_REACHED` (`handle` is the SRQ number).
pub const EV_SRQ_LIMIT: u16 = 5;
/// `IBV_EVENT_QP_LAST_WQE_REACHED`: a QP on an SRQ left the receive path
/// (moved to ERR); no further receive completions will name it.
pub const EV_QP_LAST_WQE_REACHED: u16 = 6;
/// `IBV_EVENT_DEVICE_FATAL` (`handle` 0): the device lost every object the
/// driver made (its vhost-user backend restarted under a running driver,
/// device spec §5.x.9); commands fail with [`STATUS_ENODEV`] until the
/// driver resets the device.
pub const EV_DEVICE_FATAL: u16 = 7;

// ---------------------------------------------------------------------------
// Work queue entries and completions
// ---------------------------------------------------------------------------

/// Scatter/gather element (16 bytes), as `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address inside the MR named by `lkey`.
    pub addr: u64,
    /// Length, bytes.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// Send WQE header (64 bytes), followed by `num_sge` [`Sge`]s, or by
/// `inline_len` bytes of data when `send_flags` has [`SEND_INLINE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendWqe {
    /// Caller's work request ID, returned in the CQE.
    pub wr_id: u64,
    /// `ibv_wr_opcode` (`WR_*`).
    pub opcode: u8,
    /// `ibv_send_flags` (`SEND_*`).
    pub send_flags: u8,
    /// Number of SGEs following the header.
    pub num_sge: u8,
    /// Reserved, zero.
    pub reserved: u8,
    /// Immediate data, network byte order (as `ibv_send_wr.imm_data`).
    pub imm_data: [u8; 4],
    /// Remote virtual address (RDMA and atomic).
    pub remote_addr: u64,
    /// Remote key (RDMA and atomic).
    pub rkey: u32,
    /// Inline data length, bytes.
    pub inline_len: u32,
    /// Atomic compare (CAS) or add (FAA) operand.
    pub compare_add: u64,
    /// Atomic swap operand.
    pub swap: u64,
    /// UD: destination QP number.
    pub remote_qpn: u32,
    /// UD: destination Q_Key; with its most significant bit set the QP's
    /// own Q_Key is sent instead (IBTA §10.2.5, "controlled Q_Key").
    pub remote_qkey: u32,
    /// UD: address handle number.
    pub ah: u32,
    /// Reserved, zero.
    pub reserved2: u32,
}

/// Receive WQE header (16 bytes), followed by `num_sge` [`Sge`]s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvWqe {
    /// Caller's work request ID, returned in the CQE.
    pub wr_id: u64,
    /// Number of SGEs following the header.
    pub num_sge: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `ibv_wr_opcode`: RDMA WRITE.
pub const WR_RDMA_WRITE: u8 = 0;
/// RDMA WRITE with immediate.
pub const WR_RDMA_WRITE_WITH_IMM: u8 = 1;
/// SEND.
pub const WR_SEND: u8 = 2;
/// SEND with immediate.
pub const WR_SEND_WITH_IMM: u8 = 3;
/// RDMA READ.
pub const WR_RDMA_READ: u8 = 4;
/// Atomic compare and swap.
pub const WR_ATOMIC_CMP_AND_SWP: u8 = 5;
/// Atomic fetch and add.
pub const WR_ATOMIC_FETCH_AND_ADD: u8 = 6;
/// SEND with invalidate.
pub const WR_SEND_WITH_INV: u8 = 9;

/// `ibv_send_flags`: fence.
pub const SEND_FENCE: u8 = 1;
/// Generate a CQE.
pub const SEND_SIGNALED: u8 = 2;
/// Solicited event.
pub const SEND_SOLICITED: u8 = 4;
/// Data inline in the WQE.
pub const SEND_INLINE: u8 = 8;

/// Completion queue entry (32 bytes), as `struct ibv_wc`.
///
/// Valid when `owner` equals the pass bit: the device writes `owner = 1` on
/// the first pass through the ring, 0 on the second, and so on; i.e. a CQE
/// at consumer index `ci` is valid when `owner == ((ci / cqe) & 1) ^ 1`.
/// The device writes `owner` last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// Work request ID of the completed WQE.
    pub wr_id: u64,
    /// Bytes transferred (receive: payload length, plus the 40-byte GRH
    /// area for UD; READ: bytes read).
    pub byte_len: u32,
    /// Immediate data (network byte order) or invalidated rkey.
    pub imm_data: [u8; 4],
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP number (UD receive).
    pub src_qp: u32,
    /// `ibv_wc_status` (`WC_*`).
    pub status: u8,
    /// `ibv_wc_opcode` (`WC_OP_*`).
    pub opcode: u8,
    /// `ibv_wc_flags` (`WC_WITH_IMM`, ...).
    pub wc_flags: u8,
    /// Service level.
    pub sl: u8,
    /// Vendor error detail (0 when none).
    pub vendor_err: u16,
    /// Reserved, zero.
    pub reserved: u8,
    /// Ownership/pass bit, written last.
    pub owner: u8,
}

/// `ibv_wc_status` values.
pub const WC_SUCCESS: u8 = 0;
/// Local length error.
pub const WC_LOC_LEN_ERR: u8 = 1;
/// Local QP operation error.
pub const WC_LOC_QP_OP_ERR: u8 = 2;
/// Local protection error.
pub const WC_LOC_PROT_ERR: u8 = 4;
/// Flushed because the QP went to ERR.
pub const WC_WR_FLUSH_ERR: u8 = 5;
/// Bad response.
pub const WC_BAD_RESP_ERR: u8 = 7;
/// Local access error.
pub const WC_LOC_ACCESS_ERR: u8 = 8;
/// Remote invalid request.
pub const WC_REM_INV_REQ_ERR: u8 = 9;
/// Remote access error.
pub const WC_REM_ACCESS_ERR: u8 = 10;
/// Remote operational error.
pub const WC_REM_OP_ERR: u8 = 11;
/// Transport retry counter exceeded.
pub const WC_RETRY_EXC_ERR: u8 = 12;
/// RNR retry counter exceeded.
pub const WC_RNR_RETRY_EXC_ERR: u8 = 13;
/// Fatal error.
pub const WC_FATAL_ERR: u8 = 19;
/// General error.
pub const WC_GENERAL_ERR: u8 = 21;

/// `ibv_wc_opcode`: SEND completed.
pub const WC_OP_SEND: u8 = 0;
/// RDMA WRITE completed.
pub const WC_OP_RDMA_WRITE: u8 = 1;
/// RDMA READ completed.
pub const WC_OP_RDMA_READ: u8 = 2;
/// Compare and swap completed.
pub const WC_OP_COMP_SWAP: u8 = 3;
/// Fetch and add completed.
pub const WC_OP_FETCH_ADD: u8 = 4;
/// Receive completed.
pub const WC_OP_RECV: u8 = 128;
/// RDMA WRITE with immediate received.
pub const WC_OP_RECV_RDMA_WITH_IMM: u8 = 129;

/// `ibv_wc_flags`: GRH present in the receive buffer.
pub const WC_GRH: u8 = 1;
/// Immediate data valid.
pub const WC_WITH_IMM: u8 = 2;
/// Invalidated rkey valid.
pub const WC_WITH_INV: u8 = 8;

/// Send WQE stride for a QP, bytes: the 64-byte header plus room for
/// `max_sge` SGEs or `max_inline` bytes, rounded up to a power of two.
pub fn sq_stride(max_sge: u32, max_inline: u32) -> u32 {
    let body = (16 * max_sge.max(1)).max(max_inline.div_ceil(16) * 16);
    (size_of::<SendWqe>() as u32 + body).next_power_of_two()
}

/// Receive WQE stride for a QP, bytes: the 16-byte header plus `max_sge`
/// SGEs, rounded up to a power of two.
pub fn rq_stride(max_sge: u32) -> u32 {
    (size_of::<RecvWqe>() as u32 + 16 * max_sge.max(1)).next_power_of_two()
}

// SAFETY: the empty body of a command or response with none
// ([`Command`]): zero bytes, no fields, every (empty) bit pattern valid.
unsafe impl Pod for () {}

pod!(
    ConfigSpace = 64,
    Usage = 32,
    CmdHeader = 8,
    RespHeader = 8,
    Handle = 8,
    DeviceAttr = 96,
    QueryPort = 8,
    PortAttr = 24,
    QueryGid = 8,
    GidEntry = 24,
    QueryPkey = 8,
    PkeyEntry = 8,
    RegMr = 40,
    MrKeys = 8,
    CreateCq = 24,
    CreateQp = 72,
    CreateAh = 32,
    CreateSrq = 32,
    CreateSrqResp = 16,
    SrqAttr = 24,
    CreateQpResp = 16,
    QpAttr = 72,
    Doorbell = 16,
    Event = 16,
    Sge = 16,
    SendWqe = 64,
    RecvWqe = 16,
    Cqe = 32,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_conversions_match_ibv_mtu() {
        assert_eq!(mtu_bytes(1), Some(256));
        assert_eq!(mtu_bytes(3), Some(1024));
        assert_eq!(mtu_bytes(5), Some(4096));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(mtu_bytes(6), None);
        assert_eq!(mtu_enum(1500), Some(3));
        assert_eq!(mtu_enum(9000), Some(5));
        assert_eq!(mtu_enum(255), None);
    }

    #[test]
    fn strides_hold_header_and_sges() {
        assert_eq!(sq_stride(1, 0), 128);
        assert_eq!(sq_stride(4, 0), 128);
        assert_eq!(sq_stride(4, 200), 512);
        assert_eq!(rq_stride(1), 32);
        assert_eq!(rq_stride(2), 64);
    }

    #[test]
    fn pod_read_rejects_short_input() {
        assert!(Cqe::read_from(&[0u8; 31]).is_none());
        let mut c = Cqe {
            wr_id: 7,
            owner: 1,
            ..Default::default()
        };
        let back = Cqe::read_from(c.as_bytes()).unwrap();
        assert_eq!(back, c);
        c.as_bytes_mut()[0] = 8;
        assert_eq!(c.wr_id, 8);
    }
}

// ---------------------------------------------------------------------------
// Typed vocabulary
// ---------------------------------------------------------------------------

/// A raw ABI value that names no variant of the enum it was converted to
/// (`TryFrom` of [`QpType`], [`QpState`], [`WrOpcode`], [`WcStatus`]).
/// The structures in driver memory and on the control queue carry raw
/// integers; they are converted at the edges, and an unknown value is this
/// error, never a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownValue {
    /// The enum the value was meant for (`"QpState"`, ...).
    pub what: &'static str,
    /// The raw value.
    pub value: u32,
}

impl std::fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown {} value {}", self.what, self.value)
    }
}

impl std::error::Error for UnknownValue {}

/// Defines a `#[repr($raw)]` enum of ABI values with `From<enum> for
/// $raw` and `TryFrom<$raw>` (unknown values: [`UnknownValue`]).
macro_rules! abi_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $raw:ty {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[repr($raw)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl $name {
            /// Every variant, in ABI value order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The raw ABI value.
            pub const fn raw(self) -> $raw {
                self as $raw
            }
        }

        impl From<$name> for $raw {
            fn from(v: $name) -> $raw {
                v as $raw
            }
        }

        impl TryFrom<$raw> for $name {
            type Error = UnknownValue;

            fn try_from(value: $raw) -> Result<Self, UnknownValue> {
                match value {
                    $( x if x == $value => Ok($name::$variant), )+
                    _ => Err(UnknownValue {
                        what: stringify!($name),
                        value: u32::from(value),
                    }),
                }
            }
        }
    };
}

abi_enum! {
    /// `ibv_qp_type` (the [`QPT_RC`], [`QPT_UC`], [`QPT_UD`] values of
    /// [`CreateQp::qp_type`]): the transport service (IBTA Vol 1
    /// chapter 9: RC, UC, UD), and the GSI QP ([`QPT_GSI`], the kernel's
    /// `IB_QPT_GSI`), a UD QP numbered [`GSI_QPN`]. Default: RC.
    pub enum QpType: u32 {
        /// The port's GSI QP, QP1 (`IB_QPT_GSI`; no `IBV_QPT_*`): UD
        /// with the GSI's fixed Q_Key, P_Key and QP number.
        Gsi = QPT_GSI,
        /// Reliable connected (`IBV_QPT_RC`).
        #[default]
        Rc = QPT_RC,
        /// Unreliable connected (`IBV_QPT_UC`).
        Uc = QPT_UC,
        /// Unreliable datagram (`IBV_QPT_UD`).
        Ud = QPT_UD,
    }
}

impl QpType {
    /// A datagram QP: UD or the GSI QP (one packet per message, an
    /// address handle per send, the GRH area in front of each receive).
    pub fn is_datagram(self) -> bool {
        matches!(self, QpType::Ud | QpType::Gsi)
    }
}

abi_enum! {
    /// `ibv_qp_state` (the `QPS_*` values of [`QpAttr::qp_state`]), the QP
    /// states of IBTA Vol 1 §10.3.1. Default: RESET, the state after
    /// creation.
    pub enum QpState: u32 {
        /// `IBV_QPS_RESET`: the state after creation.
        #[default]
        Reset = QPS_RESET,
        /// `IBV_QPS_INIT`.
        Init = QPS_INIT,
        /// `IBV_QPS_RTR`: ready to receive.
        Rtr = QPS_RTR,
        /// `IBV_QPS_RTS`: ready to send.
        Rts = QPS_RTS,
        /// `IBV_QPS_SQD`: send queue drained.
        Sqd = QPS_SQD,
        /// `IBV_QPS_SQE`: send queue error (UC, UD).
        Sqe = QPS_SQE,
        /// `IBV_QPS_ERR`.
        Err = QPS_ERR,
    }
}

abi_enum! {
    /// `ibv_wr_opcode` of a send work request (the `WR_*` values of
    /// [`SendWqe::opcode`]). Default: SEND.
    pub enum WrOpcode: u8 {
        /// `IBV_WR_RDMA_WRITE`.
        RdmaWrite = WR_RDMA_WRITE,
        /// `IBV_WR_RDMA_WRITE_WITH_IMM`: as `RdmaWrite`, and consumes a
        /// receive WQE at the peer carrying the immediate data.
        RdmaWriteWithImm = WR_RDMA_WRITE_WITH_IMM,
        /// `IBV_WR_SEND`.
        #[default]
        Send = WR_SEND,
        /// `IBV_WR_SEND_WITH_IMM`.
        SendWithImm = WR_SEND_WITH_IMM,
        /// `IBV_WR_RDMA_READ`.
        RdmaRead = WR_RDMA_READ,
        /// `IBV_WR_ATOMIC_CMP_AND_SWP`: the original value lands in the
        /// WR's one 8-byte SGE.
        AtomicCmpAndSwp = WR_ATOMIC_CMP_AND_SWP,
        /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
        AtomicFetchAndAdd = WR_ATOMIC_FETCH_AND_ADD,
        /// `IBV_WR_SEND_WITH_INV`: the immediate field is the rkey to
        /// invalidate at the peer.
        SendWithInv = WR_SEND_WITH_INV,
    }
}

impl WrOpcode {
    /// An atomic: compare-and-swap or fetch-and-add (IBTA §9.4.5).
    pub fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
}

abi_enum! {
    /// `ibv_wc_status` values the device writes in [`Cqe::status`] (the
    /// `WC_*` constants; libibverbs defines more, which vrnic never
    /// produces). Default: success.
    pub enum WcStatus: u8 {
        /// `IBV_WC_SUCCESS`.
        #[default]
        Success = WC_SUCCESS,
        /// `IBV_WC_LOC_LEN_ERR`: local length error.
        LocLenErr = WC_LOC_LEN_ERR,
        /// `IBV_WC_LOC_QP_OP_ERR`: local QP operation error.
        LocQpOpErr = WC_LOC_QP_OP_ERR,
        /// `IBV_WC_LOC_PROT_ERR`: local protection error.
        LocProtErr = WC_LOC_PROT_ERR,
        /// `IBV_WC_WR_FLUSH_ERR`: flushed because the QP went to ERR.
        WrFlushErr = WC_WR_FLUSH_ERR,
        /// `IBV_WC_BAD_RESP_ERR`: bad response.
        BadRespErr = WC_BAD_RESP_ERR,
        /// `IBV_WC_LOC_ACCESS_ERR`: local access error.
        LocAccessErr = WC_LOC_ACCESS_ERR,
        /// `IBV_WC_REM_INV_REQ_ERR`: remote invalid request.
        RemInvReqErr = WC_REM_INV_REQ_ERR,
        /// `IBV_WC_REM_ACCESS_ERR`: remote access error.
        RemAccessErr = WC_REM_ACCESS_ERR,
        /// `IBV_WC_REM_OP_ERR`: remote operational error.
        RemOpErr = WC_REM_OP_ERR,
        /// `IBV_WC_RETRY_EXC_ERR`: transport retry counter exceeded.
        RetryExcErr = WC_RETRY_EXC_ERR,
        /// `IBV_WC_RNR_RETRY_EXC_ERR`: RNR retry counter exceeded.
        RnrRetryExcErr = WC_RNR_RETRY_EXC_ERR,
        /// `IBV_WC_FATAL_ERR`.
        FatalErr = WC_FATAL_ERR,
        /// `IBV_WC_GENERAL_ERR`.
        GeneralErr = WC_GENERAL_ERR,
    }
}

#[cfg(test)]
mod typed_tests {
    use super::*;

    #[test]
    fn typed_values_round_trip_and_unknown_values_are_errors() {
        for &s in QpState::ALL {
            assert_eq!(QpState::try_from(u32::from(s)), Ok(s));
        }
        for &t in QpType::ALL {
            assert_eq!(QpType::try_from(t.raw()), Ok(t));
        }
        for &o in WrOpcode::ALL {
            assert_eq!(WrOpcode::try_from(o.raw()), Ok(o));
        }
        for &w in WcStatus::ALL {
            assert_eq!(WcStatus::try_from(w.raw()), Ok(w));
        }
        assert_eq!(QpState::Err.raw(), QPS_ERR);
        assert_eq!(QpType::Ud.raw(), QPT_UD);
        assert_eq!(WrOpcode::SendWithInv.raw(), WR_SEND_WITH_INV);
        assert_eq!(WcStatus::GeneralErr.raw(), WC_GENERAL_ERR);
        assert!(QpState::try_from(7).is_err());
        assert!(QpType::try_from(0).is_err());
        assert_eq!(QpType::try_from(1), Ok(QpType::Gsi));
        assert!(QpType::Gsi.is_datagram() && QpType::Ud.is_datagram());
        assert!(!QpType::Rc.is_datagram() && !QpType::Uc.is_datagram());
        assert!(WrOpcode::try_from(7).is_err());
        assert!(WrOpcode::try_from(u8::MAX).is_err());
        assert!(WcStatus::try_from(3).is_err());
        assert_eq!(
            QpState::try_from(u32::MAX),
            Err(UnknownValue {
                what: "QpState",
                value: u32::MAX
            })
        );
    }
}
