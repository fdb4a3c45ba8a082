//! The modern virtio-pci transport, driven from user space: capability
//! parsing, common configuration registers, the device status handshake,
//! queue setup, notifications, and split virtqueues.
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
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

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

/// Split virtqueue descriptor flag (§2.7.5): the buffer continues in `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the buffer is device-writable (otherwise device-readable).
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Available ring flag (§2.7.6): the driver does not want interrupts.
pub const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used ring flag (§2.7.8): the device does not want notifications.
pub const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;
/// Largest split virtqueue size (§2.7).
pub const MAX_SPLIT_QUEUE_SIZE: u16 = 32768;

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
// Split virtqueue
// ---------------------------------------------------------------------------

/// Errors of a [`SplitQueue`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VirtqError {
    /// The queue size is not a power of two in 1..=32768.
    #[error("invalid split virtqueue size {0}")]
    BadSize(u32),
    /// `add` of a chain with no buffers.
    #[error("empty descriptor chain")]
    EmptyChain,
    /// Not enough free descriptors for the chain.
    #[error("virtqueue full: chain needs {needed} descriptors, {free} free")]
    Full {
        /// Descriptors the chain needs.
        needed: usize,
        /// Descriptors free.
        free: u16,
    },
    /// A device-readable buffer after a device-writable one (§2.7.4.2).
    #[error("device-readable buffer after a device-writable one")]
    ReadableAfterWritable,
    /// The device returned an id that is not the head of a chain in flight.
    #[error("device returned descriptor id {0}, which is not in flight")]
    BadUsedId(u32),
    /// The device's used index ran more than a queue size ahead.
    #[error("device used index {used} is {ahead} entries ahead (queue size {size})")]
    BadUsedIdx {
        /// The device's `used.idx`.
        used: u16,
        /// How far ahead of the driver it is.
        ahead: u16,
        /// Queue size.
        size: u16,
    },
}

impl From<VirtqError> for TransportError {
    fn from(e: VirtqError) -> Self {
        let kind = match e {
            VirtqError::Full { .. } => io::ErrorKind::WouldBlock,
            VirtqError::EmptyChain | VirtqError::ReadableAfterWritable | VirtqError::BadSize(_) => {
                io::ErrorKind::InvalidInput
            }
            _ => io::ErrorKind::InvalidData,
        };
        TransportError::Io {
            what: "virtqueue".into(),
            source: io::Error::new(kind, e),
        }
    }
}

/// Placement of a split virtqueue's three parts in one contiguous
/// allocation (§2.7: descriptor table aligned 16, available ring 2, used
/// ring 4). Offsets and lengths in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLayout {
    /// Queue size (descriptors), a power of two.
    pub size: u16,
    /// Offset of the descriptor table (16 bytes per descriptor), 0.
    pub desc: usize,
    /// Offset of the available ring (`flags, idx, ring[size], used_event`).
    pub avail: usize,
    /// Offset of the used ring (`flags, idx, ring[size] of {id, len}, avail_event`).
    pub used: usize,
    /// Total length; the allocation must be 16-byte aligned.
    pub len: usize,
}

impl QueueLayout {
    /// Required alignment of the allocation, bytes.
    pub const ALIGN: usize = 16;

    /// The layout for `size` descriptors. Errors: `size` not a power of two
    /// in 1..=32768.
    pub fn new(size: u16) -> Result<Self, VirtqError> {
        if size == 0 || !size.is_power_of_two() || size > MAX_SPLIT_QUEUE_SIZE {
            return Err(VirtqError::BadSize(size.into()));
        }
        let n = size as usize;
        let avail = 16 * n;
        let used = (avail + 6 + 2 * n).next_multiple_of(4);
        Ok(QueueLayout {
            size,
            desc: 0,
            avail,
            used,
            len: used + 6 + 8 * n,
        })
    }
}

/// One buffer of a descriptor chain: guest-physical address, length in
/// bytes, and whether the device writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufDesc {
    /// Guest-physical address.
    pub gpa: u64,
    /// Length, bytes.
    pub len: u32,
    /// Device-writable (otherwise device-readable).
    pub writable: bool,
}

/// A chain the device has finished with (`struct virtq_used_elem`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index of the chain, as returned by [`SplitQueue::add`].
    pub id: u16,
    /// Bytes the device wrote into the chain's writable buffers.
    pub len: u32,
}

const NONE: u16 = u16::MAX;

/// The driver side of a split virtqueue (§2.7) in memory shared with the
/// device. Tracks free descriptors in a private free list (never trusting
/// what the device could write into shared memory), publishes chains on
/// the available ring and reaps the used ring.
///
/// Memory ordering: descriptors and the ring entry are written before
/// `avail.idx` is stored with release ordering; `used.idx` is loaded with
/// acquire ordering before the used entry and the device-written buffers
/// are read; a full fence separates publishing from reading
/// `used.flags` ([`SplitQueue::needs_notify`]). These are the
/// `virtio_wmb`/`virtio_rmb`/`virtio_mb` of §2.7.13 and §2.7.14.
#[derive(Debug)]
pub struct SplitQueue {
    size: u16,
    desc: *mut u8,
    avail: *mut u8,
    used: *mut u8,
    desc_gpa: u64,
    avail_gpa: u64,
    used_gpa: u64,
    next: Vec<u16>,
    chain_len: Vec<u16>,
    free_head: u16,
    num_free: u16,
    avail_idx: u16,
    last_used: u16,
}

// SAFETY: the queue exclusively owns its ring memory (per `new`'s
// contract); it is only touched through &mut self or atomics.
unsafe impl Send for SplitQueue {}

impl SplitQueue {
    /// A queue of `layout.size` descriptors on the memory at `ptr`
    /// (guest-physical `gpa`), which it zeroes. The available ring's flags
    /// are set to `VIRTQ_AVAIL_F_NO_INTERRUPT`: the queue is polled until
    /// [`SplitQueue::set_interrupts`] asks for interrupts.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `layout.len` bytes,
    /// aligned to [`QueueLayout::ALIGN`], physically contiguous at `gpa`,
    /// used by nothing but this queue and the device, and outlive the queue
    /// and the device's use of it (reset the device before freeing it).
    pub unsafe fn new(layout: QueueLayout, ptr: *mut u8, gpa: u64) -> Self {
        // SAFETY: per the contract.
        unsafe { ptr::write_bytes(ptr, 0, layout.len) };
        let n = layout.size as usize;
        let mut q = SplitQueue {
            size: layout.size,
            // SAFETY: offsets lie within layout.len.
            desc: unsafe { ptr.add(layout.desc) },
            // SAFETY: as desc.
            avail: unsafe { ptr.add(layout.avail) },
            // SAFETY: as desc.
            used: unsafe { ptr.add(layout.used) },
            desc_gpa: gpa + layout.desc as u64,
            avail_gpa: gpa + layout.avail as u64,
            used_gpa: gpa + layout.used as u64,
            next: (1..=n as u32)
                .map(|i| if i as usize == n { NONE } else { i as u16 })
                .collect(),
            chain_len: vec![0; n],
            free_head: 0,
            num_free: layout.size,
            avail_idx: 0,
            last_used: 0,
        };
        q.write_avail_flags(VIRTQ_AVAIL_F_NO_INTERRUPT);
        q
    }

    /// Queue size (descriptors).
    pub fn size(&self) -> u16 {
        self.size
    }

    /// Free descriptors.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }

    /// Descriptors in chains the device has not returned yet.
    pub fn in_flight(&self) -> u16 {
        self.size - self.num_free
    }

    /// The descriptor the next [`SplitQueue::add`] will use as the chain's
    /// head (lets a caller bind per-descriptor buffers to chains); `None`
    /// when the queue is full.
    pub fn next_head(&self) -> Option<u16> {
        (self.num_free > 0).then_some(self.free_head)
    }

    /// Guest-physical address of the descriptor table.
    pub fn desc_gpa(&self) -> u64 {
        self.desc_gpa
    }

    /// Guest-physical address of the available ring (driver area).
    pub fn avail_gpa(&self) -> u64 {
        self.avail_gpa
    }

    /// Guest-physical address of the used ring (device area).
    pub fn used_gpa(&self) -> u64 {
        self.used_gpa
    }

    /// Asks the device to interrupt after it adds used buffers (`true`:
    /// clears `VIRTQ_AVAIL_F_NO_INTERRUPT`) or not to (`false`: sets it),
    /// §2.7.7 without `VIRTIO_F_EVENT_IDX` (this driver never negotiates
    /// it, so `used_event` is unused). A full barrier follows
    /// ([`crate::barrier::mb`]), so a caller
    /// that then re-checks the used ring cannot miss a buffer the device
    /// added without interrupting.
    pub fn set_interrupts(&mut self, on: bool) {
        self.write_avail_flags(if on { 0 } else { VIRTQ_AVAIL_F_NO_INTERRUPT });
        crate::barrier::mb();
    }

    /// Whether the queue asks for interrupts (`VIRTQ_AVAIL_F_NO_INTERRUPT` clear).
    pub fn interrupts(&self) -> bool {
        // SAFETY: offset 0 of the avail ring, 2-aligned.
        let f = u16::from_le(unsafe { ptr::read_volatile(self.avail as *const u16) });
        f & VIRTQ_AVAIL_F_NO_INTERRUPT == 0
    }

    fn write_avail_flags(&mut self, flags: u16) {
        // SAFETY: offset 0 of the avail ring, 2-aligned.
        unsafe { ptr::write_volatile(self.avail as *mut u16, flags.to_le()) };
    }

    fn avail_idx_atomic(&self) -> &AtomicU16 {
        // SAFETY: avail + 2 is 2-aligned, inside the ring, and lives as long
        // as self; only the driver writes it.
        unsafe { AtomicU16::from_ptr(self.avail.add(2) as *mut u16) }
    }

    fn used_idx_atomic(&self) -> &AtomicU16 {
        // SAFETY: used + 2 is 2-aligned (used is 4-aligned), inside the ring.
        unsafe { AtomicU16::from_ptr(self.used.add(2) as *mut u16) }
    }

    fn write_desc(&mut self, i: u16, b: &BufDesc, flags: u16, next: u16) {
        // SAFETY: i < size; the descriptor is 16 bytes at desc + 16 * i.
        unsafe {
            let d = self.desc.add(16 * i as usize);
            ptr::write_volatile(d as *mut u64, b.gpa.to_le());
            ptr::write_volatile(d.add(8) as *mut u32, b.len.to_le());
            ptr::write_volatile(d.add(12) as *mut u16, flags.to_le());
            ptr::write_volatile(d.add(14) as *mut u16, next.to_le());
        }
    }

    /// Adds a chain of buffers and makes it available to the device:
    /// descriptors, then the available ring entry, then (release) `avail.idx`.
    /// Device-readable buffers must precede device-writable ones. Returns
    /// the head descriptor index, which [`SplitQueue::pop_used`] reports
    /// when the device is done. Does not notify.
    ///
    /// Errors: empty chain, readable after writable, not enough free
    /// descriptors ([`VirtqError::Full`]); nothing is changed then.
    pub fn add(&mut self, bufs: &[BufDesc]) -> Result<u16, VirtqError> {
        if bufs.is_empty() {
            return Err(VirtqError::EmptyChain);
        }
        if bufs.windows(2).any(|w| w[0].writable && !w[1].writable) {
            return Err(VirtqError::ReadableAfterWritable);
        }
        if bufs.len() > self.num_free as usize {
            return Err(VirtqError::Full {
                needed: bufs.len(),
                free: self.num_free,
            });
        }
        let head = self.free_head;
        let mut i = head;
        for (k, b) in bufs.iter().enumerate() {
            let last = k + 1 == bufs.len();
            let nxt = self.next[i as usize];
            let mut flags = if b.writable { VIRTQ_DESC_F_WRITE } else { 0 };
            if !last {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            self.write_desc(i, b, flags, if last { 0 } else { nxt });
            i = nxt;
        }
        self.free_head = i;
        self.num_free -= bufs.len() as u16;
        self.chain_len[head as usize] = bufs.len() as u16;
        let slot = (self.avail_idx % self.size) as usize;
        // SAFETY: slot < size; ring entry at avail + 4 + 2 * slot.
        unsafe { ptr::write_volatile(self.avail.add(4 + 2 * slot) as *mut u16, head.to_le()) };
        self.avail_idx = self.avail_idx.wrapping_add(1);
        // Release: the descriptors and the ring entry are visible before the index.
        self.avail_idx_atomic()
            .store(self.avail_idx.to_le(), Ordering::Release);
        Ok(head)
    }

    /// Whether the device wants a notification for newly added chains: a
    /// full barrier ([`crate::barrier::mb`]: the index store must be
    /// visible before the flag is read),
    /// then `used.flags & VIRTQ_USED_F_NO_NOTIFY == 0` (§2.7.10; without
    /// `VIRTIO_F_EVENT_IDX`).
    pub fn needs_notify(&self) -> bool {
        crate::barrier::mb();
        // SAFETY: offset 0 of the used ring, 2-aligned.
        let flags = u16::from_le(unsafe { ptr::read_volatile(self.used as *const u16) });
        flags & VIRTQ_USED_F_NO_NOTIFY == 0
    }

    /// Reaps the next chain the device has finished with, returning its
    /// descriptors to the free list; `Ok(None)` when there is none. The
    /// device-written contents of the chain's buffers are visible to the
    /// caller after this returns `Some`.
    ///
    /// Errors (the device broke the protocol; the entry is skipped):
    /// [`VirtqError::BadUsedId`], [`VirtqError::BadUsedIdx`].
    pub fn pop_used(&mut self) -> Result<Option<UsedElem>, VirtqError> {
        let used = u16::from_le(self.used_idx_atomic().load(Ordering::Acquire));
        if used == self.last_used {
            return Ok(None);
        }
        let ahead = used.wrapping_sub(self.last_used);
        if ahead > self.size {
            return Err(VirtqError::BadUsedIdx {
                used,
                ahead,
                size: self.size,
            });
        }
        let slot = (self.last_used % self.size) as usize;
        // SAFETY: slot < size; element at used + 4 + 8 * slot (4-aligned).
        let (id, len) = unsafe {
            let e = self.used.add(4 + 8 * slot);
            (
                u32::from_le(ptr::read_volatile(e as *const u32)),
                u32::from_le(ptr::read_volatile(e.add(4) as *const u32)),
            )
        };
        self.last_used = self.last_used.wrapping_add(1);
        if id >= self.size as u32 || self.chain_len[id as usize] == 0 {
            return Err(VirtqError::BadUsedId(id));
        }
        let head = id as u16;
        let n = self.chain_len[head as usize];
        let mut tail = head;
        for _ in 1..n {
            tail = self.next[tail as usize];
        }
        self.next[tail as usize] = if self.num_free == 0 {
            NONE
        } else {
            self.free_head
        };
        self.free_head = head;
        self.num_free += n;
        self.chain_len[head as usize] = 0;
        Ok(Some(UsedElem { id: head, len }))
    }
}

/// A simulated device and plain test memory, for unit tests of the driver
/// side (here and in [`crate::pci`]).
#[cfg(test)]
pub(crate) mod sim {
    use super::*;
    use std::alloc::{alloc_zeroed, dealloc, Layout};

    /// 16-aligned zeroed heap memory.
    pub(crate) struct Mem {
        pub(crate) ptr: *mut u8,
        layout: Layout,
    }
    impl Mem {
        pub(crate) fn new(len: usize) -> Self {
            let layout = Layout::from_size_align(len, 16).unwrap();
            // SAFETY: len > 0 in every test.
            let ptr = unsafe { alloc_zeroed(layout) };
            assert!(!ptr.is_null());
            Mem { ptr, layout }
        }
    }
    impl Drop for Mem {
        fn drop(&mut self) {
            // SAFETY: allocated with this layout.
            unsafe { dealloc(self.ptr, self.layout) };
        }
    }

    /// A simulated device: consumes available chains, returns used ones.
    pub(crate) struct Device {
        pub(crate) l: QueueLayout,
        pub(crate) base: *mut u8,
        last_avail: u16,
        used_idx: u16,
    }

    #[derive(Debug, PartialEq)]
    pub(crate) struct D {
        pub(crate) addr: u64,
        pub(crate) len: u32,
        pub(crate) flags: u16,
        pub(crate) next: u16,
    }

    // SAFETY: (tests) the simulated device owns its view of the ring; the
    // test keeps the memory alive while the device runs.
    unsafe impl Send for Device {}

    impl Device {
        pub(crate) fn new(l: QueueLayout, base: *mut u8) -> Self {
            Device {
                l,
                base,
                last_avail: 0,
                used_idx: 0,
            }
        }
        pub(crate) fn rd16(&self, off: usize) -> u16 {
            // SAFETY: (this and the other accesses below) `base` is the
            // ring memory of layout `l`, alive while the test runs.
            unsafe { ptr::read_volatile(self.base.add(off) as *const u16) }
        }
        fn desc(&self, i: u16) -> D {
            // SAFETY: as rd16; descriptor `i` of the table.
            unsafe {
                let d = self.base.add(self.l.desc + 16 * i as usize);
                D {
                    addr: ptr::read_volatile(d as *const u64),
                    len: ptr::read_volatile(d.add(8) as *const u32),
                    flags: ptr::read_volatile(d.add(12) as *const u16),
                    next: ptr::read_volatile(d.add(14) as *const u16),
                }
            }
        }
        /// Takes the next available chain: (head, descriptors).
        pub(crate) fn take(&mut self) -> Option<(u16, Vec<D>)> {
            // SAFETY: as rd16; the available ring's aligned index.
            let idx = unsafe { AtomicU16::from_ptr(self.base.add(self.l.avail + 2) as *mut u16) }
                .load(Ordering::Acquire);
            if idx == self.last_avail {
                return None;
            }
            let slot = (self.last_avail % self.l.size) as usize;
            let head = self.rd16(self.l.avail + 4 + 2 * slot);
            self.last_avail = self.last_avail.wrapping_add(1);
            let mut chain = vec![];
            let mut i = head;
            loop {
                let d = self.desc(i);
                let more = d.flags & VIRTQ_DESC_F_NEXT != 0;
                i = d.next;
                chain.push(d);
                assert!(chain.len() <= self.l.size as usize, "descriptor loop");
                if !more {
                    break;
                }
            }
            Some((head, chain))
        }
        pub(crate) fn complete(&mut self, id: u32, len: u32) {
            let slot = (self.used_idx % self.l.size) as usize;
            // SAFETY: as rd16; used element `slot`.
            unsafe {
                let e = self.base.add(self.l.used + 4 + 8 * slot);
                ptr::write_volatile(e as *mut u32, id);
                ptr::write_volatile(e.add(4) as *mut u32, len);
            }
            self.used_idx = self.used_idx.wrapping_add(1);
            // SAFETY: as rd16; the used ring's aligned index.
            unsafe { AtomicU16::from_ptr(self.base.add(self.l.used + 2) as *mut u16) }
                .store(self.used_idx, Ordering::Release);
        }
        pub(crate) fn set_used_flags(&mut self, f: u16) {
            // SAFETY: as rd16; the used ring's flags.
            unsafe { ptr::write_volatile(self.base.add(self.l.used) as *mut u16, f) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sim::{Device, Mem};
    use super::*;

    const GPA: u64 = 0x1_0000_0000;

    fn setup(size: u16) -> (Mem, SplitQueue, Device) {
        let l = QueueLayout::new(size).unwrap();
        let mem = Mem::new(l.len);
        // SAFETY: mem is l.len bytes, 16-aligned, and outlives q (returned together; tests drop q first).
        let q = unsafe { SplitQueue::new(l, mem.ptr, GPA) };
        let dev = Device::new(l, mem.ptr);
        (mem, q, dev)
    }

    fn rb(gpa: u64, len: u32) -> BufDesc {
        BufDesc {
            gpa,
            len,
            writable: false,
        }
    }
    fn wb(gpa: u64, len: u32) -> BufDesc {
        BufDesc {
            gpa,
            len,
            writable: true,
        }
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
        let (_ring, q, _dev) = setup(8);
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

    #[test]
    fn queues_are_polled_until_interrupts_are_asked_for() {
        let (_mem, mut q, dev) = setup(4);
        let avail_flags = || dev.rd16(QueueLayout::new(4).unwrap().avail);
        assert!(!q.interrupts());
        assert_eq!(avail_flags(), VIRTQ_AVAIL_F_NO_INTERRUPT);
        q.set_interrupts(true);
        assert!(q.interrupts());
        assert_eq!(avail_flags(), 0);
        // Adding buffers leaves the flag alone.
        q.add(&[wb(GPA, 16)]).unwrap();
        assert_eq!(avail_flags(), 0);
        q.set_interrupts(false);
        assert_eq!(avail_flags(), VIRTQ_AVAIL_F_NO_INTERRUPT);
    }

    #[test]
    fn layout_matches_spec_alignment() {
        let l = QueueLayout::new(256).unwrap();
        assert_eq!((l.desc, l.avail, l.used), (0, 4096, 4096 + 520));
        assert_eq!(l.len, 4096 + 520 + 6 + 8 * 256);
        let l = QueueLayout::new(1).unwrap();
        assert_eq!(l.used % 4, 0);
        assert!(QueueLayout::new(0).is_err());
        assert!(QueueLayout::new(3).is_err());
        assert!(QueueLayout::new(65535).is_err());
    }

    #[test]
    fn chain_round_trip() {
        let (_m, mut q, mut dev) = setup(8);
        assert_eq!(dev.rd16(dev.l.avail), VIRTQ_AVAIL_F_NO_INTERRUPT);
        assert_eq!(q.desc_gpa(), GPA);
        assert_eq!(q.used_gpa(), GPA + dev.l.used as u64);
        assert!(q.pop_used().unwrap().is_none());
        let head = q.add(&[rb(0x1000, 24), wb(0x2000, 136)]).unwrap();
        assert_eq!(q.num_free(), 6);
        let (h, chain) = dev.take().unwrap();
        assert_eq!(h, head);
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[0].addr, 0x1000);
        assert_eq!(chain[0].len, 24);
        assert_eq!(chain[0].flags, VIRTQ_DESC_F_NEXT);
        assert_eq!(chain[1].addr, 0x2000);
        assert_eq!(chain[1].len, 136);
        assert_eq!(chain[1].flags, VIRTQ_DESC_F_WRITE);
        assert!(dev.take().is_none());
        assert!(q.pop_used().unwrap().is_none(), "nothing used yet");
        dev.complete(h as u32, 16);
        assert_eq!(q.pop_used().unwrap(), Some(UsedElem { id: head, len: 16 }));
        assert!(q.pop_used().unwrap().is_none());
        assert_eq!(q.num_free(), 8);
        assert_eq!(q.in_flight(), 0);
    }

    #[test]
    fn wraps_around_many_times_in_and_out_of_order() {
        let size = 8u16;
        let (_m, mut q, mut dev) = setup(size);
        let mut expected: std::collections::HashMap<u16, (u64, usize)> = Default::default();
        let mut serial = 0u64;
        // > 65536 chains: both the ring slots and the 16-bit indices wrap.
        for round in 0..30_000u32 {
            // Fill with chains of 1..=3 descriptors while they fit.
            loop {
                let n = 1 + (serial % 3) as usize;
                let bufs: Vec<BufDesc> = (0..n)
                    .map(|k| wb(serial << 8 | k as u64, k as u32 + 1))
                    .collect();
                match q.add(&bufs) {
                    Ok(h) => {
                        assert!(
                            expected.insert(h, (serial, n)).is_none(),
                            "head reused while in flight"
                        );
                        serial += 1;
                    }
                    Err(VirtqError::Full { needed, free }) => {
                        assert_eq!(needed, n);
                        assert!((free as usize) < n);
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let mut taken = vec![];
            while let Some((h, chain)) = dev.take() {
                let (s, n) = expected[&h];
                assert_eq!(chain.len(), n);
                for (k, d) in chain.iter().enumerate() {
                    assert_eq!(d.addr, s << 8 | k as u64);
                }
                taken.push(h);
            }
            // Complete out of order on odd rounds; some only partially.
            if round % 2 == 1 {
                taken.reverse();
            }
            let keep = if round % 5 == 0 { taken.len() / 2 } else { 0 };
            for &h in &taken[keep..] {
                dev.complete(h as u32, h as u32 + 7);
            }
            let mut got = 0;
            while let Some(u) = q.pop_used().unwrap() {
                assert_eq!(u.len, u.id as u32 + 7);
                assert!(expected.remove(&u.id).is_some());
                got += 1;
            }
            assert_eq!(got, taken.len() - keep);
            for &h in &taken[..keep] {
                dev.complete(h as u32, h as u32 + 7);
            }
            while let Some(u) = q.pop_used().unwrap() {
                assert!(expected.remove(&u.id).is_some());
            }
            assert!(expected.is_empty());
            assert_eq!(q.num_free(), size);
        }
        assert!(serial > 65536, "indices wrapped ({serial} chains)");
    }

    #[test]
    fn full_queue_is_rejected_and_recovers() {
        let (_m, mut q, mut dev) = setup(4);
        let heads: Vec<u16> = (0..4).map(|i| q.add(&[rb(i, 16)]).unwrap()).collect();
        assert_eq!(q.next_head(), None);
        assert_eq!(
            q.add(&[rb(9, 16)]),
            Err(VirtqError::Full { needed: 1, free: 0 })
        );
        let (h, _) = dev.take().unwrap();
        assert_eq!(h, heads[0]);
        dev.complete(h as u32, 0);
        assert_eq!(q.pop_used().unwrap().unwrap().id, heads[0]);
        assert_eq!(q.next_head(), Some(heads[0]));
        assert_eq!(
            q.add(&[rb(1, 1), rb(2, 2)]),
            Err(VirtqError::Full { needed: 2, free: 1 })
        );
        assert_eq!(q.add(&[rb(9, 16)]).unwrap(), heads[0]);
        assert_eq!(
            q.add(&[wb(1, 1), rb(2, 2)]),
            Err(VirtqError::ReadableAfterWritable)
        );
        assert_eq!(q.add(&[]), Err(VirtqError::EmptyChain));
    }

    #[test]
    fn device_protocol_errors_do_not_panic() {
        let (_m, mut q, mut dev) = setup(4);
        let h = q.add(&[rb(1, 1)]).unwrap();
        dev.take().unwrap();
        dev.complete(3, 0); // never made available
        assert_eq!(q.pop_used(), Err(VirtqError::BadUsedId(3)));
        dev.complete(1000, 0);
        assert_eq!(q.pop_used(), Err(VirtqError::BadUsedId(1000)));
        dev.complete(h as u32, 5);
        assert_eq!(q.pop_used().unwrap(), Some(UsedElem { id: h, len: 5 }));
        dev.complete(h as u32, 5); // returned twice
        assert_eq!(q.pop_used(), Err(VirtqError::BadUsedId(h as u32)));
        // Used index racing far ahead.
        // SAFETY: the device's ring memory, alive; its aligned used index.
        unsafe { AtomicU16::from_ptr(dev.base.add(dev.l.used + 2) as *mut u16) }
            .store(200, Ordering::Release);
        assert!(matches!(q.pop_used(), Err(VirtqError::BadUsedIdx { .. })));
    }

    #[test]
    fn notification_suppression_is_honoured() {
        let (_m, q, mut dev) = setup(4);
        assert!(q.needs_notify());
        dev.set_used_flags(VIRTQ_USED_F_NO_NOTIFY);
        assert!(!q.needs_notify());
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
