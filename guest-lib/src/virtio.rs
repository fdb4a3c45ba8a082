//! The modern virtio-pci transport, driven from user space: capability
//! parsing, common configuration registers, the device status handshake,
//! queue setup and notifications. The split virtqueues themselves are the
//! crate `vrnic-virtq`'s (re-exported here: [`SplitQueue`], [`QueueLayout`],
//! ...), the one driver-side implementation guest-lib's drivers, the shared
//! doorbell ring and the daemon's test frontend share.
//!
//! References are to the virtio 1.2 specification:
//! - §2.1 device status field, §2.2 feature bits, §2.5 configuration space
//!   (generation counter), §2.7 split virtqueues, §3.1.1 driver
//!   initialisation, §6 reserved feature bits (`VIRTIO_F_VERSION_1`).
//! - §4.1.4 virtio structure PCI capabilities, §4.1.4.3 common
//!   configuration, §4.1.4.4 notifications, §4.1.4.6 device configuration,
//!   §4.1.5.1.3 virtqueue configuration.
//!
//! Everything here works on memory it is handed: [`Mmio`] windows of a
//! mapped BAR (or plain memory in tests) and DMA memory for rings
//! ([`SplitQueue`]). Finding the device, mapping BARs and allocating DMA
//! memory is [`crate::pci`]'s and [`crate::dma`]'s business.
//!
//! Interrupts: the driver never enables MSI-X. It sets every vector to
//! [`VIRTIO_MSI_NO_VECTOR`] (§4.1.4.3, §4.1.5.1.2) so that a device that
//! interrupts does it through INTx and the ISR status (§4.1.4.5, [`Isr`]).
//! Queues are created with `VIRTQ_AVAIL_F_NO_INTERRUPT` set (polled); the
//! owner turns interrupts on per queue with [`SplitQueue::set_interrupts`].

use std::io;
use std::ptr;
use std::time::{Duration, Instant};

pub use vrnic_virtq::{
    BufDesc, QueueConfig, QueueLayout, RawMemory, SplitQueue, UsedElem, VirtqError,
    MAX_SPLIT_QUEUE_SIZE, VIRTQ_AVAIL_F_NO_INTERRUPT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
    VIRTQ_USED_F_NO_NOTIFY,
};

use crate::transport::TransportError;

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

/// Device status (§2.1): the guest OS has noticed the device.
pub const STATUS_ACKNOWLEDGE: u8 = 1;
/// Device status: the guest OS knows how to drive the device.
pub const STATUS_DRIVER: u8 = 2;
/// Device status: the driver is set up and ready to drive the device.
pub const STATUS_DRIVER_OK: u8 = 4;
/// Device status: feature negotiation is complete.
pub const STATUS_FEATURES_OK: u8 = 8;
/// Device status: the device hit an error it cannot recover from without a reset.
pub const STATUS_DEVICE_NEEDS_RESET: u8 = 64;
/// Device status: the driver has given up on the device.
pub const STATUS_FAILED: u8 = 128;

/// `VIRTIO_F_VERSION_1` (§6): the device complies with virtio 1.x. The only
/// feature this driver accepts.
pub const VIRTIO_F_VERSION_1: u64 = 1 << 32;

/// PCI capability ID of vendor-specific capabilities, used by all virtio
/// structure capabilities (PCI Local Bus 3.0 §6.7; virtio 1.2 §4.1.4).
pub const PCI_CAP_ID_VNDR: u8 = 0x09;
/// `cfg_type` of the common configuration capability (§4.1.4).
pub const VIRTIO_PCI_CAP_COMMON_CFG: u8 = 1;
/// `cfg_type` of the notification capability.
pub const VIRTIO_PCI_CAP_NOTIFY_CFG: u8 = 2;
/// `cfg_type` of the ISR status capability.
pub const VIRTIO_PCI_CAP_ISR_CFG: u8 = 3;
/// "No MSI-X vector" (§4.1.4.3, `VIRTIO_MSI_NO_VECTOR`): written to
/// `config_msix_vector` and `queue_msix_vector`, the device uses no
/// vector for that source; with MSI-X disabled it interrupts through INTx.
pub const VIRTIO_MSI_NO_VECTOR: u16 = 0xffff;
/// ISR status bit 0 (§4.1.4.5): a queue interrupt (used buffers).
pub const VIRTIO_PCI_ISR_QUEUE: u8 = 0x1;
/// ISR status bit 1 (§4.1.4.5): a device configuration change.
pub const VIRTIO_PCI_ISR_CONFIG: u8 = 0x2;
/// `cfg_type` of the device-specific configuration capability.
pub const VIRTIO_PCI_CAP_DEVICE_CFG: u8 = 4;
/// `cfg_type` of the PCI configuration access capability.
pub const VIRTIO_PCI_CAP_PCI_CFG: u8 = 5;

/// PCI configuration header: Status register offset (PCI 3.0 §6.2.3).
pub const PCI_STATUS: usize = 0x06;
/// Status register bit: the device has a capability list.
pub const PCI_STATUS_CAP_LIST: u16 = 0x10;
/// PCI configuration header: Capabilities Pointer offset (type 0 header).
pub const PCI_CAPABILITY_LIST: usize = 0x34;

/// Common configuration register offsets (§4.1.4.3, `struct virtio_pci_common_cfg`).
pub mod common {
    /// le32 RW: selects which 32 feature bits `DEVICE_FEATURE` shows.
    pub const DEVICE_FEATURE_SELECT: usize = 0x00;
    /// le32 RO: 32 device feature bits.
    pub const DEVICE_FEATURE: usize = 0x04;
    /// le32 RW: selects which 32 feature bits `DRIVER_FEATURE` sets.
    pub const DRIVER_FEATURE_SELECT: usize = 0x08;
    /// le32 RW: 32 driver (accepted) feature bits.
    pub const DRIVER_FEATURE: usize = 0x0c;
    /// le16 RW: MSI-X vector for configuration changes.
    pub const CONFIG_MSIX_VECTOR: usize = 0x10;
    /// le16 RO: number of virtqueues.
    pub const NUM_QUEUES: usize = 0x12;
    /// u8 RW: device status (§2.1); writing 0 resets the device.
    pub const DEVICE_STATUS: usize = 0x14;
    /// u8 RO: configuration generation counter (§2.5.1).
    pub const CONFIG_GENERATION: usize = 0x15;
    /// le16 RW: selects the queue the `QUEUE_*` registers address.
    pub const QUEUE_SELECT: usize = 0x16;
    /// le16 RW: queue size; reads the maximum after reset, 0 = unavailable.
    pub const QUEUE_SIZE: usize = 0x18;
    /// le16 RW: MSI-X vector of the queue.
    pub const QUEUE_MSIX_VECTOR: usize = 0x1a;
    /// le16 RW: 1 enables the queue.
    pub const QUEUE_ENABLE: usize = 0x1c;
    /// le16 RO: the queue's notification offset, in multiples of `notify_off_multiplier`.
    pub const QUEUE_NOTIFY_OFF: usize = 0x1e;
    /// le64 RW: guest-physical address of the descriptor table (as two le32, low first).
    pub const QUEUE_DESC: usize = 0x20;
    /// le64 RW: guest-physical address of the driver area (available ring).
    pub const QUEUE_DRIVER: usize = 0x28;
    /// le64 RW: guest-physical address of the device area (used ring).
    pub const QUEUE_DEVICE: usize = 0x30;
    /// Size of the virtio 1.0 common configuration structure, bytes.
    pub const LEN: usize = 0x38;
}

fn invalid(what: String, msg: &'static str) -> TransportError {
    TransportError::Io {
        what,
        source: io::Error::new(io::ErrorKind::InvalidInput, msg),
    }
}

fn protocol(what: impl Into<String>, msg: String) -> TransportError {
    TransportError::Io {
        what: what.into(),
        source: io::Error::new(io::ErrorKind::InvalidData, msg),
    }
}

// ---------------------------------------------------------------------------
// MMIO
// ---------------------------------------------------------------------------

/// A window of memory-mapped device registers (a mapped BAR or a part of
/// it), accessed only with naturally aligned volatile loads and stores of
/// 1, 2 or 4 bytes. Every access is bounds- and alignment-checked against
/// the window; 64-bit registers are accessed as two 32-bit halves, which the
/// virtio-pci transport allows (§4.1.3.1).
///
/// A copyable view: the mapping it points into must outlive every copy.
#[derive(Clone, Copy, Debug)]
pub struct Mmio {
    base: *mut u8,
    len: usize,
}

// SAFETY: device registers have no thread affinity; Mmio is a plain
// description of them, and every access is a single volatile load/store.
unsafe impl Send for Mmio {}
// SAFETY: as Send.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// A window of `len` bytes at `base`.
    ///
    /// # Safety
    /// `base..base + len` must be valid for volatile reads and writes (a live
    /// mapping of device registers or memory) for as long as this window or
    /// any copy or sub-window of it is used.
    pub unsafe fn new(base: *mut u8, len: usize) -> Self {
        Mmio { base, len }
    }

    /// Length of the window, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-window `[offset, offset + len)`. Errors: it does not lie
    /// within this window: [`TransportError::Io`] (`InvalidInput`).
    pub fn window(&self, offset: usize, len: usize) -> Result<Mmio, TransportError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(Mmio {
                // SAFETY: offset <= len, inside the window.
                base: unsafe { self.base.add(offset) },
                len,
            }),
            _ => Err(invalid(
                format!(
                    "MMIO window [{offset:#x}, +{len:#x}) of a {:#x}-byte region",
                    self.len
                ),
                "window outside the region",
            )),
        }
    }

    fn check(&self, off: usize, size: usize) -> Result<*mut u8, TransportError> {
        let in_bounds = off.checked_add(size).is_some_and(|end| end <= self.len);
        if !in_bounds {
            return Err(invalid(
                format!(
                    "{size}-byte MMIO access at {off:#x} of a {:#x}-byte window",
                    self.len
                ),
                "access outside the window",
            ));
        }
        // SAFETY: off + size <= len.
        let p = unsafe { self.base.add(off) };
        if !(p as usize).is_multiple_of(size) {
            return Err(invalid(
                format!("{size}-byte MMIO access at {off:#x}"),
                "misaligned access",
            ));
        }
        Ok(p)
    }

    /// Reads the byte at `off`.
    pub fn read8(&self, off: usize) -> Result<u8, TransportError> {
        let p = self.check(off, 1)?;
        // SAFETY: checked in bounds; validity per Mmio::new's contract.
        Ok(unsafe { ptr::read_volatile(p) })
    }

    /// Reads the little-endian u16 at `off` (2-byte aligned).
    pub fn read16(&self, off: usize) -> Result<u16, TransportError> {
        let p = self.check(off, 2)?;
        // SAFETY: checked in bounds and aligned.
        Ok(u16::from_le(unsafe { ptr::read_volatile(p as *const u16) }))
    }

    /// Reads the little-endian u32 at `off` (4-byte aligned).
    pub fn read32(&self, off: usize) -> Result<u32, TransportError> {
        let p = self.check(off, 4)?;
        // SAFETY: checked in bounds and aligned.
        Ok(u32::from_le(unsafe { ptr::read_volatile(p as *const u32) }))
    }

    /// Writes the byte at `off`.
    pub fn write8(&self, off: usize, v: u8) -> Result<(), TransportError> {
        let p = self.check(off, 1)?;
        // SAFETY: checked in bounds.
        unsafe { ptr::write_volatile(p, v) };
        Ok(())
    }

    /// Writes the little-endian u16 at `off` (2-byte aligned).
    pub fn write16(&self, off: usize, v: u16) -> Result<(), TransportError> {
        let p = self.check(off, 2)?;
        // SAFETY: checked in bounds and aligned.
        unsafe { ptr::write_volatile(p as *mut u16, v.to_le()) };
        Ok(())
    }

    /// Writes the little-endian u32 at `off` (4-byte aligned).
    pub fn write32(&self, off: usize, v: u32) -> Result<(), TransportError> {
        let p = self.check(off, 4)?;
        // SAFETY: checked in bounds and aligned.
        unsafe { ptr::write_volatile(p as *mut u32, v.to_le()) };
        Ok(())
    }

    /// Writes a 64-bit register at `off` as two 32-bit writes, low half
    /// first (§4.1.3.1).
    pub fn write64_split(&self, off: usize, v: u64) -> Result<(), TransportError> {
        self.write32(off, v as u32)?;
        self.write32(off + 4, (v >> 32) as u32)
    }
}

// ---------------------------------------------------------------------------
// Capabilities
// ---------------------------------------------------------------------------

/// Errors while parsing a device's PCI capability list.
#[derive(Debug, thiserror::Error)]
pub enum CapError {
    /// The configuration space is too short for the structure being read
    /// (a non-root reader of sysfs `config` sees only 64 bytes).
    #[error("PCI configuration space too short ({len} bytes; reading it fully needs root)")]
    ShortConfig {
        /// Bytes available.
        len: usize,
    },
    /// The Status register says there is no capability list.
    #[error("device has no PCI capability list")]
    NoCapabilities,
    /// The list is malformed (pointer into the header, or a loop).
    #[error("malformed PCI capability list at {offset:#x}: {reason}")]
    Malformed {
        /// Offset of the offending capability.
        offset: usize,
        /// What is wrong.
        reason: &'static str,
    },
    /// A capability the driver needs is absent.
    #[error("no virtio {0} capability")]
    Missing(&'static str),
}

/// One virtio structure PCI capability (`struct virtio_pci_cap`, §4.1.4):
/// the structure of type `cfg_type` lives in BAR `bar` at
/// `[offset, offset + length)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioPciCap {
    /// `VIRTIO_PCI_CAP_*`.
    pub cfg_type: u8,
    /// BAR index, 0..=5.
    pub bar: u8,
    /// Identifier of multiple capabilities of one type (shared memory); else 0.
    pub id: u8,
    /// Offset of the structure within the BAR, bytes.
    pub offset: u32,
    /// Length of the structure, bytes.
    pub length: u32,
    /// Offset of the capability itself in PCI configuration space.
    pub cap_offset: usize,
}

/// The virtio structure capabilities the driver uses, the first of each
/// type (§4.1.4: "the driver SHOULD use the first instance").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioPciCaps {
    /// Common configuration (§4.1.4.3).
    pub common: VirtioPciCap,
    /// Notification area (§4.1.4.4).
    pub notify: VirtioPciCap,
    /// `notify_off_multiplier` of the notification capability: bytes per
    /// unit of `queue_notify_off` (0: all queues share one address).
    pub notify_off_multiplier: u32,
    /// ISR status (§4.1.4.5), read to learn and acknowledge an INTx interrupt ([`Isr`]).
    pub isr: Option<VirtioPciCap>,
    /// Device-specific configuration (§4.1.4.6).
    pub device: Option<VirtioPciCap>,
}

impl VirtioPciCaps {
    /// Walks the capability list of a type-0 PCI configuration space
    /// (`config`, as read from sysfs `config`: 256 or 4096 bytes) and
    /// collects the virtio structure capabilities (vendor capabilities,
    /// ID 0x09). Capabilities with a reserved BAR (> 5), unknown types or
    /// too short are ignored (§4.1.4.1). Never panics on malformed input.
    pub fn parse(config: &[u8]) -> Result<Self, CapError> {
        let short = || CapError::ShortConfig { len: config.len() };
        let rd8 = |o: usize| config.get(o).copied().ok_or_else(short);
        let rd32 = |o: usize| {
            config
                .get(o..o + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(short)
        };
        let status = u16::from_le_bytes([rd8(PCI_STATUS)?, rd8(PCI_STATUS + 1)?]);
        if status & PCI_STATUS_CAP_LIST == 0 {
            return Err(CapError::NoCapabilities);
        }
        let (mut common, mut notify, mut isr, mut device) = (None, None, None, None);
        let mut mult = 0;
        let mut ptr = (rd8(PCI_CAPABILITY_LIST)? & 0xfc) as usize;
        let mut seen = 0;
        while ptr != 0 {
            if ptr < 0x40 {
                return Err(CapError::Malformed {
                    offset: ptr,
                    reason: "capability inside the header",
                });
            }
            seen += 1;
            if seen > 64 {
                return Err(CapError::Malformed {
                    offset: ptr,
                    reason: "capability list loops",
                });
            }
            let id = rd8(ptr)?;
            let next = (rd8(ptr + 1)? & 0xfc) as usize;
            if id == PCI_CAP_ID_VNDR {
                let cap_len = rd8(ptr + 2)? as usize;
                let cfg_type = rd8(ptr + 3)?;
                let bar = rd8(ptr + 4)?;
                if cap_len >= 16 && bar <= 5 {
                    let cap = VirtioPciCap {
                        cfg_type,
                        bar,
                        id: rd8(ptr + 5)?,
                        offset: rd32(ptr + 8)?,
                        length: rd32(ptr + 12)?,
                        cap_offset: ptr,
                    };
                    match cfg_type {
                        VIRTIO_PCI_CAP_COMMON_CFG if common.is_none() => common = Some(cap),
                        VIRTIO_PCI_CAP_NOTIFY_CFG if notify.is_none() && cap_len >= 20 => {
                            mult = rd32(ptr + 16)?;
                            notify = Some(cap);
                        }
                        VIRTIO_PCI_CAP_ISR_CFG if isr.is_none() => isr = Some(cap),
                        VIRTIO_PCI_CAP_DEVICE_CFG if device.is_none() => device = Some(cap),
                        _ => {}
                    }
                }
            }
            ptr = next;
        }
        Ok(VirtioPciCaps {
            common: common.ok_or(CapError::Missing("common configuration"))?,
            notify: notify.ok_or(CapError::Missing("notification"))?,
            notify_off_multiplier: mult,
            isr,
            device,
        })
    }

    /// The distinct BAR indices the used structures live in, ascending.
    pub fn bars(&self) -> Vec<u8> {
        let mut v: Vec<u8> = [Some(self.common), Some(self.notify), self.isr, self.device]
            .into_iter()
            .flatten()
            .map(|c| c.bar)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

// ---------------------------------------------------------------------------
// Common configuration, notifications, the device
// ---------------------------------------------------------------------------

/// The common configuration structure (§4.1.4.3) in a mapped BAR.
#[derive(Clone, Copy, Debug)]
pub struct CommonCfg {
    mmio: Mmio,
}

impl CommonCfg {
    /// Wraps the window named by the common configuration capability.
    /// Errors: the window is shorter than the 0x38-byte virtio 1.0 layout:
    /// [`TransportError::Io`].
    pub fn new(mmio: Mmio) -> Result<Self, TransportError> {
        if mmio.len() < common::LEN {
            return Err(invalid(
                format!("common configuration of {} bytes", mmio.len()),
                "shorter than 0x38",
            ));
        }
        Ok(CommonCfg { mmio })
    }

    /// The underlying registers.
    pub fn mmio(&self) -> Mmio {
        self.mmio
    }

    /// All 64 device feature bits (§2.2).
    pub fn device_features(&self) -> Result<u64, TransportError> {
        self.mmio.write32(common::DEVICE_FEATURE_SELECT, 0)?;
        let lo = self.mmio.read32(common::DEVICE_FEATURE)?;
        self.mmio.write32(common::DEVICE_FEATURE_SELECT, 1)?;
        let hi = self.mmio.read32(common::DEVICE_FEATURE)?;
        Ok(u64::from(hi) << 32 | u64::from(lo))
    }

    /// Writes the 64 accepted (driver) feature bits.
    pub fn set_driver_features(&self, features: u64) -> Result<(), TransportError> {
        self.mmio.write32(common::DRIVER_FEATURE_SELECT, 0)?;
        self.mmio.write32(common::DRIVER_FEATURE, features as u32)?;
        self.mmio.write32(common::DRIVER_FEATURE_SELECT, 1)?;
        self.mmio
            .write32(common::DRIVER_FEATURE, (features >> 32) as u32)
    }

    /// Number of virtqueues the device offers.
    pub fn num_queues(&self) -> Result<u16, TransportError> {
        self.mmio.read16(common::NUM_QUEUES)
    }

    /// The device status (`STATUS_*` bits).
    pub fn status(&self) -> Result<u8, TransportError> {
        self.mmio.read8(common::DEVICE_STATUS)
    }

    /// Writes the device status. Bits are cumulative: write the old status
    /// ORed with the new bit (§3.1.1); 0 resets.
    pub fn set_status(&self, status: u8) -> Result<(), TransportError> {
        self.mmio.write8(common::DEVICE_STATUS, status)
    }

    /// The configuration generation counter (§2.5.1).
    pub fn config_generation(&self) -> Result<u8, TransportError> {
        self.mmio.read8(common::CONFIG_GENERATION)
    }

    /// Resets the device: writes 0 to the status and waits (up to
    /// `timeout`) for it to read back 0 (§4.1.4.3.2). After that the device
    /// no longer accesses any driver memory. Errors:
    /// [`TransportError::Timeout`].
    pub fn reset(&self, timeout: Duration) -> Result<(), TransportError> {
        self.set_status(0)?;
        let start = Instant::now();
        loop {
            if self.status()? == 0 {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(TransportError::Timeout(timeout.as_millis() as u64));
            }
            std::thread::yield_now();
        }
    }

    /// Selects queue `index` for the `QUEUE_*` registers.
    pub fn select_queue(&self, index: u16) -> Result<(), TransportError> {
        self.mmio.write16(common::QUEUE_SELECT, index)
    }

    /// The selected queue's size: its maximum until written; 0 = the queue
    /// does not exist.
    pub fn queue_size(&self) -> Result<u16, TransportError> {
        self.mmio.read16(common::QUEUE_SIZE)
    }

    /// Sets the selected queue's size.
    pub fn set_queue_size(&self, size: u16) -> Result<(), TransportError> {
        self.mmio.write16(common::QUEUE_SIZE, size)
    }

    /// The selected queue's `queue_notify_off`.
    pub fn queue_notify_off(&self) -> Result<u16, TransportError> {
        self.mmio.read16(common::QUEUE_NOTIFY_OFF)
    }

    /// Writes the selected queue's descriptor table, driver area and device
    /// area guest-physical addresses.
    pub fn set_queue_addrs(
        &self,
        desc: u64,
        driver: u64,
        device: u64,
    ) -> Result<(), TransportError> {
        self.mmio.write64_split(common::QUEUE_DESC, desc)?;
        self.mmio.write64_split(common::QUEUE_DRIVER, driver)?;
        self.mmio.write64_split(common::QUEUE_DEVICE, device)
    }

    /// Whether the selected queue is enabled.
    pub fn queue_enabled(&self) -> Result<bool, TransportError> {
        Ok(self.mmio.read16(common::QUEUE_ENABLE)? != 0)
    }

    /// Enables the selected queue (write 1 to `queue_enable`).
    pub fn enable_queue(&self) -> Result<(), TransportError> {
        self.mmio.write16(common::QUEUE_ENABLE, 1)
    }

    /// Sets the selected queue's MSI-X vector and returns what the device
    /// reads back (§4.1.5.1.2: the device answers
    /// [`VIRTIO_MSI_NO_VECTOR`] when it cannot use the vector).
    pub fn set_queue_msix_vector(&self, vector: u16) -> Result<u16, TransportError> {
        self.mmio.write16(common::QUEUE_MSIX_VECTOR, vector)?;
        self.mmio.read16(common::QUEUE_MSIX_VECTOR)
    }

    /// Sets the configuration-change MSI-X vector and returns what the
    /// device reads back (§4.1.5.1.2).
    pub fn set_config_msix_vector(&self, vector: u16) -> Result<u16, TransportError> {
        self.mmio.write16(common::CONFIG_MSIX_VECTOR, vector)?;
        self.mmio.read16(common::CONFIG_MSIX_VECTOR)
    }
}

/// The ISR status register (§4.1.4.5): one byte in the window named by the
/// ISR capability. With MSI-X disabled the device raises its INTx line when
/// it sets a bit ([`VIRTIO_PCI_ISR_QUEUE`], [`VIRTIO_PCI_ISR_CONFIG`]);
/// reading the register returns the bits, clears them and de-asserts the
/// line.
#[derive(Clone, Copy, Debug)]
pub struct Isr {
    mmio: Mmio,
}

impl Isr {
    /// Wraps the window named by the ISR capability. Errors: the window is
    /// empty ([`TransportError::Io`]).
    pub fn new(mmio: Mmio) -> Result<Self, TransportError> {
        if mmio.is_empty() {
            return Err(invalid(
                "ISR status window".into(),
                "ISR status capability of length 0",
            ));
        }
        Ok(Isr { mmio })
    }

    /// Reads (and so clears) the ISR status: the interrupt causes since the
    /// last read.
    pub fn read_and_clear(&self) -> Result<u8, TransportError> {
        self.mmio.read8(0)
    }
}

/// Notifies one queue (§4.1.4.4): a 16-bit write of the queue index to
/// `notify.offset + queue_notify_off * notify_off_multiplier`.
#[derive(Clone, Copy, Debug)]
pub struct Notifier {
    mmio: Mmio,
    queue: u16,
}

impl Notifier {
    /// A notifier writing `queue` to the start of `mmio` (the queue's
    /// notification address, as [`VirtioPci::setup_queue`] computes it).
    /// Errors: `mmio` is shorter than 2 bytes: [`TransportError::Io`].
    pub fn new(mmio: Mmio, queue: u16) -> Result<Self, TransportError> {
        Ok(Notifier {
            mmio: mmio.window(0, 2)?,
            queue,
        })
    }

    /// Tells the device that queue has new available buffers. The caller
    /// orders its ring updates before this (see [`SplitQueue::needs_notify`]).
    pub fn notify(&self) -> Result<(), TransportError> {
        self.mmio.write16(0, self.queue)
    }

    /// The queue this notifier notifies.
    pub fn queue(&self) -> u16 {
        self.queue
    }
}

/// A modern virtio-pci device's register windows: common configuration,
/// notification area and device-specific configuration.
#[derive(Clone, Copy, Debug)]
pub struct VirtioPci {
    /// Common configuration.
    pub common: CommonCfg,
    notify: Mmio,
    notify_off_multiplier: u32,
    device: Mmio,
}

impl VirtioPci {
    /// The device from its three windows: `common` and `notify` as named by
    /// the capabilities, `device` the device-specific configuration (may be
    /// empty). Errors: `common` is too short ([`CommonCfg::new`]).
    pub fn new(
        common: Mmio,
        notify: Mmio,
        notify_off_multiplier: u32,
        device: Mmio,
    ) -> Result<Self, TransportError> {
        Ok(VirtioPci {
            common: CommonCfg::new(common)?,
            notify,
            notify_off_multiplier,
            device,
        })
    }

    /// Length of the device-specific configuration window, bytes.
    pub fn device_config_len(&self) -> usize {
        self.device.len()
    }

    /// Resets the device ([`CommonCfg::reset`]).
    pub fn reset(&self, timeout: Duration) -> Result<(), TransportError> {
        self.common.reset(timeout)
    }

    /// Steps 1-6 of the initialisation sequence (§3.1.1): reset,
    /// ACKNOWLEDGE, DRIVER, feature negotiation accepting only
    /// `VIRTIO_F_VERSION_1`, FEATURES_OK and its check. Returns the device's
    /// offered features. Errors: the device does not offer VERSION_1 (a
    /// legacy-only device) or refuses FEATURES_OK: [`TransportError::NoDevice`].
    pub fn negotiate(&self, reset_timeout: Duration) -> Result<u64, TransportError> {
        self.reset(reset_timeout)?;
        self.common.set_status(STATUS_ACKNOWLEDGE)?;
        self.common.set_status(STATUS_ACKNOWLEDGE | STATUS_DRIVER)?;
        let offered = self.common.device_features()?;
        if offered & VIRTIO_F_VERSION_1 == 0 {
            return Err(TransportError::NoDevice(format!(
                "device does not offer VIRTIO_F_VERSION_1 (features {offered:#x})"
            )));
        }
        self.common.set_driver_features(VIRTIO_F_VERSION_1)?;
        // Configuration changes never interrupt through MSI-X (it stays
        // disabled); the device may still set ISR bit 1, which the driver
        // ignores (it reads the configuration once).
        self.common.set_config_msix_vector(VIRTIO_MSI_NO_VECTOR)?;
        let s = STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK;
        self.common.set_status(s)?;
        let back = self.common.status()?;
        if back & STATUS_FEATURES_OK == 0 {
            return Err(TransportError::NoDevice(format!(
                "device refused FEATURES_OK with VERSION_1 only (offered {offered:#x}, status {back:#x})"
            )));
        }
        Ok(offered)
    }

    /// Final step of initialisation: sets DRIVER_OK (§3.1.1 step 8). The
    /// driver may notify queues only after this.
    pub fn driver_ok(&self) -> Result<(), TransportError> {
        let s = self.common.status()?;
        self.common.set_status(s | STATUS_DRIVER_OK)
    }

    /// Sets FAILED: the driver gives up on the device.
    pub fn set_failed(&self) -> Result<(), TransportError> {
        let s = self.common.status()?;
        self.common.set_status(s | STATUS_FAILED)
    }

    /// Whether the device has set DEVICE_NEEDS_RESET.
    pub fn needs_reset(&self) -> Result<bool, TransportError> {
        Ok(self.common.status()? & STATUS_DEVICE_NEEDS_RESET != 0)
    }

    /// Reads the device-specific configuration `[0, out.len())` with 32-bit
    /// reads (under vhost-user every access is a round trip to the daemon,
    /// so never byte by byte), retrying while the configuration generation
    /// changes (§2.5.1, at most 16 attempts). Errors: `out` is longer than
    /// the window ([`TransportError::Io`]); the generation never settles
    /// ([`TransportError::Io`]).
    pub fn read_device_config(&self, out: &mut [u8]) -> Result<(), TransportError> {
        if out.len() > self.device.len() {
            return Err(invalid(
                format!(
                    "reading {} bytes of a {}-byte device configuration",
                    out.len(),
                    self.device.len()
                ),
                "device configuration too short",
            ));
        }
        for _ in 0..16 {
            let before = self.common.config_generation()?;
            for (i, chunk) in out.chunks_mut(4).enumerate() {
                let off = i * 4;
                if off + 4 <= self.device.len() {
                    let w = self.device.read32(off)?.to_le_bytes();
                    chunk.copy_from_slice(&w[..chunk.len()]);
                } else {
                    for (j, b) in chunk.iter_mut().enumerate() {
                        *b = self.device.read8(off + j)?;
                    }
                }
            }
            if self.common.config_generation()? == before {
                return Ok(());
            }
        }
        Err(protocol(
            "reading device configuration",
            "configuration generation never settled".into(),
        ))
    }

    /// The largest size queue `index` supports (0 = the queue does not exist).
    pub fn max_queue_size(&self, index: u16) -> Result<u16, TransportError> {
        self.common.select_queue(index)?;
        self.common.queue_size()
    }

    /// Configures and enables queue `index` on the ring memory of `queue`
    /// (§4.1.5.1.3): select, size, addresses, MSI-X vector
    /// [`VIRTIO_MSI_NO_VECTOR`] (§4.1.5.1.2), enable. Must run after
    /// [`VirtioPci::negotiate`] and before [`VirtioPci::driver_ok`]. Returns
    /// the queue's [`Notifier`]. Errors: the queue does not exist, is
    /// already enabled, its maximum size is below `queue.size()`, or its
    /// notification address lies outside the notification window:
    /// [`TransportError::NoDevice`] / [`TransportError::Io`].
    pub fn setup_queue(&self, index: u16, queue: &SplitQueue) -> Result<Notifier, TransportError> {
        let c = &self.common;
        c.select_queue(index)?;
        let max = c.queue_size()?;
        if max == 0 {
            return Err(TransportError::NoDevice(format!(
                "device has no virtqueue {index}"
            )));
        }
        if queue.size() > max {
            return Err(TransportError::NoDevice(format!(
                "virtqueue {index}: size {} above the device's maximum {max}",
                queue.size()
            )));
        }
        if c.queue_enabled()? {
            return Err(TransportError::NoDevice(format!(
                "virtqueue {index} already enabled after reset"
            )));
        }
        let notify_off = c.queue_notify_off()?;
        let at = notify_off as usize * self.notify_off_multiplier as usize;
        let mmio = self.notify.window(at, 2)?;
        c.set_queue_size(queue.size())?;
        c.set_queue_addrs(queue.desc_gpa(), queue.avail_gpa(), queue.used_gpa())?;
        // No MSI-X vector: interrupts, where the queue asks for them, go
        // through INTx and the ISR (MSI-X stays disabled).
        let v = c.set_queue_msix_vector(VIRTIO_MSI_NO_VECTOR)?;
        if v != VIRTIO_MSI_NO_VECTOR {
            return Err(protocol(
                format!("virtqueue {index}"),
                format!("queue_msix_vector reads {v:#x} after writing VIRTIO_MSI_NO_VECTOR"),
            ));
        }
        c.enable_queue()?;
        Ok(Notifier { mmio, queue: index })
    }
}

// ---------------------------------------------------------------------------
// Split virtqueues: the crate vrnic-virtq
// ---------------------------------------------------------------------------

impl From<VirtqError> for TransportError {
    fn from(e: VirtqError) -> Self {
        let kind = match e {
            VirtqError::Full { .. } => io::ErrorKind::WouldBlock,
            VirtqError::EmptyChain
            | VirtqError::ReadableAfterWritable
            | VirtqError::BadSize(_)
            | VirtqError::TooSmall { .. }
            | VirtqError::Misaligned(_) => io::ErrorKind::InvalidInput,
            VirtqError::BadUsedId(_) | VirtqError::BadUsedIdx { .. } => io::ErrorKind::InvalidData,
        };
        TransportError::Io {
            what: "virtqueue".into(),
            source: io::Error::new(kind, e),
        }
    }
}

/// A polled queue (no `VIRTIO_F_EVENT_IDX`, `VIRTQ_AVAIL_F_NO_INTERRUPT`
/// set until [`SplitQueue::set_interrupts`]) of `layout.size` descriptors
/// on the memory at `ptr` (guest-physical `gpa`), which it zeroes: how both
/// of guest-lib's drivers make their queues.
///
/// # Safety
/// `ptr` must be valid for reads and writes of `layout.len` bytes, aligned
/// to [`QueueLayout::ALIGN`], physically contiguous at `gpa`, used by
/// nothing but this queue and the device, and outlive the queue and the
/// device's use of it (reset the device before freeing it).
pub unsafe fn polled_queue(
    layout: QueueLayout,
    ptr: *mut u8,
    gpa: u64,
) -> Result<SplitQueue, TransportError> {
    // SAFETY: per the contract.
    let mem = unsafe { RawMemory::new(ptr, layout.len) }?;
    Ok(SplitQueue::new(mem, layout, gpa, QueueConfig::POLLED)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrnic_virtq::sim::Mem;

    const GPA: u64 = 0x1_0000_0000;

    /// A queue of `size` on test memory (returned with it, to outlive it).
    fn setup(size: u16) -> (Mem, SplitQueue) {
        let l = QueueLayout::new(size).unwrap();
        let mem = Mem::new(l.len);
        // SAFETY: mem is l.len bytes, 64-aligned, and outlives q (returned
        // together; tests drop q first).
        let q = unsafe { polled_queue(l, mem.ptr, GPA) }.unwrap();
        (mem, q)
    }

    /// A fake BAR: common configuration at 0, ISR at 0x100, notifications
    /// at 0x200; plain memory, so registers read back what was written.
    fn fake_bar() -> (Mem, VirtioPci, Isr) {
        let bar = Mem::new(0x300);
        // SAFETY: bar is 0x300 bytes and outlives the windows (returned together).
        let m = unsafe { Mmio::new(bar.ptr, 0x300) };
        let v = VirtioPci::new(
            m.window(0, common::LEN).unwrap(),
            m.window(0x200, 0x100).unwrap(),
            4,
            m.window(0x2f0, 0).unwrap(),
        )
        .unwrap();
        (bar, v, Isr::new(m.window(0x100, 4).unwrap()).unwrap())
    }

    #[test]
    fn driver_sets_no_msix_vector_for_config_and_every_queue() {
        let (bar, v, isr) = fake_bar();
        let m = v.common.mmio();
        // Vectors a previous owner left behind; VERSION_1 offered.
        m.write16(common::CONFIG_MSIX_VECTOR, 0).unwrap();
        m.write16(common::QUEUE_MSIX_VECTOR, 1).unwrap();
        m.write32(common::DEVICE_FEATURE, 1).unwrap();
        v.negotiate(Duration::from_millis(100)).unwrap();
        assert_eq!(
            m.read16(common::CONFIG_MSIX_VECTOR).unwrap(),
            VIRTIO_MSI_NO_VECTOR
        );
        // A queue of 8: its maximum is what QUEUE_SIZE reads before setup.
        m.write16(common::QUEUE_SIZE, 8).unwrap();
        let (_ring, q) = setup(8);
        let n = v.setup_queue(2, &q).unwrap();
        assert_eq!(n.queue(), 2);
        assert_eq!(m.read16(common::QUEUE_SELECT).unwrap(), 2);
        assert_eq!(
            m.read16(common::QUEUE_MSIX_VECTOR).unwrap(),
            VIRTIO_MSI_NO_VECTOR
        );
        assert_eq!(m.read16(common::QUEUE_ENABLE).unwrap(), 1);
        // The ISR is the first byte of its window.
        // SAFETY: offset 0x100 of the fake BAR.
        unsafe { ptr::write_volatile(bar.ptr.add(0x100), VIRTIO_PCI_ISR_QUEUE) };
        assert_eq!(isr.read_and_clear().unwrap(), VIRTIO_PCI_ISR_QUEUE);
        // SAFETY: a zero-length window cannot be an ISR.
        assert!(Isr::new(unsafe { Mmio::new(bar.ptr, 0) }).is_err());
    }

    /// A synthetic type-0 configuration space shaped like QEMU's virtio
    /// devices: MSI-X, then vendor caps for common/ISR/device/notify/pci-cfg
    /// in BAR 4.
    fn synthetic_config() -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0..4].copy_from_slice(&[0xf4, 0x1a, 0x46, 0x10]);
        c[PCI_STATUS] = PCI_STATUS_CAP_LIST as u8;
        c[PCI_CAPABILITY_LIST] = 0x98;
        // MSI-X at 0x98 -> 0x84
        c[0x98..0x9c].copy_from_slice(&[0x11, 0x84, 0x02, 0x80]);
        let vcap =
            |c: &mut Vec<u8>, at: usize, next: u8, len: u8, ty: u8, bar: u8, off: u32, l: u32| {
                c[at..at + 4].copy_from_slice(&[PCI_CAP_ID_VNDR, next, len, ty]);
                c[at + 4] = bar;
                c[at + 8..at + 12].copy_from_slice(&off.to_le_bytes());
                c[at + 12..at + 16].copy_from_slice(&l.to_le_bytes());
            };
        vcap(&mut c, 0x84, 0x70, 20, VIRTIO_PCI_CAP_PCI_CFG, 0, 0, 0);
        vcap(
            &mut c,
            0x70,
            0x60,
            20,
            VIRTIO_PCI_CAP_NOTIFY_CFG,
            4,
            0x3000,
            0x1000,
        );
        c[0x70 + 16..0x70 + 20].copy_from_slice(&4u32.to_le_bytes());
        vcap(
            &mut c,
            0x60,
            0x50,
            16,
            VIRTIO_PCI_CAP_DEVICE_CFG,
            4,
            0x2000,
            0x40,
        );
        vcap(
            &mut c,
            0x50,
            0x40,
            16,
            VIRTIO_PCI_CAP_ISR_CFG,
            4,
            0x1000,
            0x1000,
        );
        vcap(
            &mut c,
            0x40,
            0x00,
            16,
            VIRTIO_PCI_CAP_COMMON_CFG,
            4,
            0x0,
            0x38,
        );
        c
    }

    #[test]
    fn parses_qemu_shaped_capabilities() {
        let c = synthetic_config();
        let caps = VirtioPciCaps::parse(&c).unwrap();
        assert_eq!(
            caps.common,
            VirtioPciCap {
                cfg_type: 1,
                bar: 4,
                id: 0,
                offset: 0,
                length: 0x38,
                cap_offset: 0x40
            }
        );
        assert_eq!(
            (caps.notify.bar, caps.notify.offset, caps.notify.length),
            (4, 0x3000, 0x1000)
        );
        assert_eq!(caps.notify_off_multiplier, 4);
        assert_eq!(caps.device.unwrap().offset, 0x2000);
        assert_eq!(caps.device.unwrap().length, 0x40);
        assert_eq!(caps.isr.unwrap().offset, 0x1000);
        assert_eq!(caps.bars(), vec![4]);
    }

    #[test]
    fn capability_parsing_rules_and_malformed_lists() {
        // First instance wins; reserved BARs and short caps are ignored.
        let mut c = synthetic_config();
        // Put a bogus common cap (bar 7) first, then a second valid one.
        c[PCI_CAPABILITY_LIST] = 0xc0;
        c[0xc0..0xc4].copy_from_slice(&[PCI_CAP_ID_VNDR, 0xd0, 16, VIRTIO_PCI_CAP_COMMON_CFG]);
        c[0xc4] = 7;
        c[0xd0..0xd4].copy_from_slice(&[PCI_CAP_ID_VNDR, 0x98, 16, VIRTIO_PCI_CAP_COMMON_CFG]);
        c[0xd4] = 2;
        c[0xd8..0xdc].copy_from_slice(&0x500u32.to_le_bytes());
        c[0xdc..0xe0].copy_from_slice(&0x38u32.to_le_bytes());
        let caps = VirtioPciCaps::parse(&c).unwrap();
        assert_eq!((caps.common.bar, caps.common.offset), (2, 0x500));
        assert_eq!(caps.bars(), vec![2, 4]);

        // No capability list.
        let mut c = synthetic_config();
        c[PCI_STATUS] = 0;
        assert!(matches!(
            VirtioPciCaps::parse(&c),
            Err(CapError::NoCapabilities)
        ));
        // Truncated (non-root read of sysfs config).
        let c = synthetic_config();
        assert!(matches!(
            VirtioPciCaps::parse(&c[..64]),
            Err(CapError::ShortConfig { len: 64 })
        ));
        assert!(matches!(
            VirtioPciCaps::parse(&c[..4]),
            Err(CapError::ShortConfig { .. })
        ));
        // Loop.
        let mut c = synthetic_config();
        c[0x41] = 0x98;
        assert!(matches!(
            VirtioPciCaps::parse(&c),
            Err(CapError::Malformed { .. })
        ));
        // Pointer into the header.
        let mut c = synthetic_config();
        c[0x41] = 0x10;
        assert!(matches!(
            VirtioPciCaps::parse(&c),
            Err(CapError::Malformed { offset: 0x10, .. })
        ));
        // Missing notify.
        let mut c = synthetic_config();
        c[0x73] = 0x77;
        assert!(matches!(
            VirtioPciCaps::parse(&c),
            Err(CapError::Missing("notification"))
        ));
        // Never panics on arbitrary bytes.
        let mut x = 0x12345678u32;
        for _ in 0..2000 {
            let mut c = vec![0u8; 256];
            for b in c.iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            c[PCI_STATUS] |= PCI_STATUS_CAP_LIST as u8;
            let _ = VirtioPciCaps::parse(&c);
        }
    }

    #[test]
    fn mmio_bounds_and_alignment() {
        let m = Mem::new(64);
        // SAFETY: m is 64 bytes and outlives the window.
        let w = unsafe { Mmio::new(m.ptr, 64) };
        w.write32(60, 0xdead_beef).unwrap();
        assert_eq!(w.read32(60).unwrap(), 0xdead_beef);
        assert_eq!(w.read16(62).unwrap(), 0xdead);
        assert!(w.read32(61).is_err(), "misaligned");
        assert!(w.read32(62).is_err(), "out of bounds");
        assert!(w.read8(64).is_err());
        assert!(w.write16(usize::MAX, 0).is_err());
        let sub = w.window(32, 32).unwrap();
        assert_eq!(sub.read32(28).unwrap(), 0xdead_beef);
        assert!(w.window(33, 32).is_err());
        assert!(w.window(usize::MAX, 2).is_err());
    }

    #[test]
    fn device_config_is_read_in_words() {
        let common = Mem::new(64);
        let notify = Mem::new(64);
        let devcfg = Mem::new(64);
        for i in 0..64 {
            // SAFETY: `devcfg` is 64 live bytes.
            unsafe { *devcfg.ptr.add(i) = i as u8 };
        }
        // SAFETY: all three live until the end of the test.
        let v = unsafe {
            VirtioPci::new(
                Mmio::new(common.ptr, 64),
                Mmio::new(notify.ptr, 64),
                4,
                Mmio::new(devcfg.ptr, 64),
            )
        }
        .unwrap();
        let mut out = [0u8; 64];
        v.read_device_config(&mut out).unwrap();
        assert!(out.iter().enumerate().all(|(i, &b)| b == i as u8));
        let mut odd = [0u8; 7];
        v.read_device_config(&mut odd).unwrap();
        assert_eq!(odd, [0, 1, 2, 3, 4, 5, 6]);
        let mut big = [0u8; 65];
        assert!(v.read_device_config(&mut big).is_err());
        // Status handshake against plain memory: reset reads back 0.
        v.reset(Duration::from_millis(10)).unwrap();
        // Common window too short.
        // SAFETY: all three live until the end of the test.
        let short = unsafe {
            VirtioPci::new(
                Mmio::new(common.ptr, 0x30),
                Mmio::new(notify.ptr, 64),
                4,
                Mmio::new(devcfg.ptr, 0),
            )
        };
        assert!(short.is_err());
    }
}
