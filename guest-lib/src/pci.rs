//! The user-space virtio-pci driver of a vrnic device in a VM:
//! [`PciTransport`], an implementation of [`Transport`].
//!
//! The guest kernel has no vrnic driver and no usable VFIO (no IOMMU), so
//! the driver takes the PCI function from the kernel through sysfs and
//! drives it directly (Linux `Documentation/PCI/sysfs-pci.rst`):
//! 1. find the function in `/sys/bus/pci/devices`: vendor 0x1af4, modern
//!    device ID 0x1040..=0x107f (virtio 1.2 §4.1.2), not in use by a kernel
//!    virtio driver (its `virtioN/driver` link is absent);
//! 2. lock it against other processes (`flock` on its `config` file),
//!    unbind it from its driver (`driver/unbind`), set Memory Space and
//!    Bus Master in the PCI Command register (config offset 4; PCI Local
//!    Bus 3.0 §6.2.2);
//! 3. parse the virtio capabilities (virtio 1.2 §4.1.4) from `config`, map
//!    the BARs they name (`resourceN`), run the initialisation sequence
//!    (§3.1.1), read the device configuration once and accept the device
//!    only if it carries [`abi::SIGNATURE`] and [`abi::ABI_VERSION`];
//!    otherwise reset it, restore its Command register and driver, and try
//!    the next one;
//! 4. set up the three virtqueues ([`abi::CONTROLQ`], [`abi::DOORBELLQ`],
//!    [`abi::EVENTQ`]) in DMA memory from [`crate::dma`] and set DRIVER_OK.
//!
//! Interrupts (Linux `Documentation/driver-api/uio-howto.rst`, "Generic
//! PCI UIO driver"): in step 2 the function is bound to `uio_pci_generic`
//! (through its `driver_override`) unless it already is; that driver
//! claims no BAR, so `config` and `resourceN` work as before, and it
//! hands the function's INTx interrupt to user space as `/dev/uioN`. MSI-X
//! stays disabled and every virtio vector is `VIRTIO_MSI_NO_VECTOR`, so
//! the device interrupts through INTx and the ISR status (virtio 1.2
//! §4.1.4.5). Only the event queue asks for interrupts; the control and
//! doorbell queues keep `VIRTQ_AVAIL_F_NO_INTERRUPT` and are polled, since
//! their caller waits for the answer anyway. `/dev/uioN` is the
//! transport's [`Transport::event_fd`]; [`Transport::ack_event`] reads it,
//! reads the ISR (which de-asserts the line) and unmasks INTx again (the
//! kernel's handler masked it with the Interrupt Disable bit of the PCI
//! Command register, which `uio_pci_generic` leaves to user space to
//! clear). Without `uio_pci_generic` (or with MSI-X found enabled, no
//! interrupt pin, or [`NO_IRQ_ENV`] set) the transport says so once on
//! stderr and has no event descriptor: its user polls.
//!
//! Everything else is polled; nothing sleeps. Needs root (sysfs writes,
//! full configuration space, pagemap PFNs).
//!
//! On drop the device is reset (so it stops using driver memory) and left
//! bound to `uio_pci_generic` (or unbound), ready for the next process to
//! open it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr;
use std::time::Duration;

use vrnic_abi::{self as abi, Pod};

use crate::dma::{DmaAllocator, DmaMode};
use crate::driver::{
    pick_queue_size, ControlQueue, Kick, Queue, SlotQueue, RESP_LEN, RESP_OFF, SLOT,
};
use crate::transport::{DmaBuf, Transport, TransportError};
use crate::virtio::{polled_queue, Isr, Mmio, QueueLayout, VirtioPci, VirtioPciCaps};

/// Where the kernel lists PCI functions.
pub const SYSFS_PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// Default bound on waiting for the device (a control command's answer, a
/// free doorbell slot): 10 s, generous for QEMU under TCG (a queue round
/// trip there is about 150 µs).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on waiting for a device reset to complete.
pub const RESET_TIMEOUT: Duration = Duration::from_secs(1);
pub use crate::driver::STALE_COMMAND_GRACE;

/// PCI Command register offset in configuration space.
pub const PCI_COMMAND: u64 = 0x04;
/// Command register: Memory Space enable.
pub const PCI_COMMAND_MEMORY: u16 = 0x2;
/// Command register: Bus Master enable.
pub const PCI_COMMAND_MASTER: u16 = 0x4;
/// Command register: INTx Emulation Disable (PCI Local Bus 3.0 §6.2.2),
/// bit 10: set by the kernel's `uio_pci_generic` handler to mask the
/// interrupt, cleared by the driver to unmask it.
pub const PCI_COMMAND_INTX_DISABLE: u16 = 0x400;
/// Interrupt Pin register offset in configuration space (0: none).
pub const PCI_INTERRUPT_PIN: u64 = 0x3d;
/// Capability ID of MSI-X (PCI Local Bus 3.0 §6.8.2).
pub const PCI_CAP_ID_MSIX: u8 = 0x11;
/// MSI-X Message Control: MSI-X Enable (bit 15).
pub const PCI_MSIX_FLAGS_ENABLE: u16 = 0x8000;
/// sysfs `resource` flags: a memory BAR (`IORESOURCE_MEM`).
pub const IORESOURCE_MEM: u64 = 0x200;
/// The kernel driver that hands the function's interrupt to user space.
pub const UIO_DRIVER: &str = "uio_pci_generic";
/// Set (to anything) in the environment, the transport uses no interrupt:
/// events are polled (for comparison and debugging).
pub const NO_IRQ_ENV: &str = "VRNIC_PCI_NO_IRQ";
/// Where device nodes of UIO devices appear.
pub const DEV_DIR: &str = "/dev";

fn io_err(what: impl Into<String>, source: io::Error) -> TransportError {
    TransportError::Io {
        what: what.into(),
        source,
    }
}

fn protocol(what: impl Into<String>, msg: String) -> TransportError {
    io_err(what, io::Error::new(io::ErrorKind::InvalidData, msg))
}

// ---------------------------------------------------------------------------
// sysfs
// ---------------------------------------------------------------------------

/// Adds the PCI domain `0000:` to a `bus:dev.fn` address that lacks one.
pub fn normalize_bdf(bdf: &str) -> String {
    let bdf = bdf.trim();
    if bdf.matches(':').count() == 1 {
        format!("0000:{bdf}")
    } else {
        bdf.to_string()
    }
}

/// Parses a sysfs hex attribute such as `0x1af4\n`.
fn parse_hex(s: &str) -> Option<u64> {
    let s = s.trim();
    u64::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
}

/// Parses a sysfs `resource` file: one line per resource (BARs 0-5 first),
/// `start end flags` in hex. Unparsable lines read as zeros.
pub fn parse_resource_file(text: &str) -> Vec<(u64, u64, u64)> {
    text.lines()
        .map(|l| {
            let mut f = l.split_whitespace().map(|w| parse_hex(w).unwrap_or(0));
            (
                f.next().unwrap_or(0),
                f.next().unwrap_or(0),
                f.next().unwrap_or(0),
            )
        })
        .collect()
}

/// One PCI function in sysfs.
#[derive(Debug, Clone)]
struct SysfsDevice {
    dir: PathBuf,
    bdf: String,
}

impl SysfsDevice {
    fn new(root: &Path, bdf: &str) -> Self {
        SysfsDevice {
            dir: root.join(bdf),
            bdf: bdf.to_string(),
        }
    }

    fn path(&self, attr: &str) -> PathBuf {
        self.dir.join(attr)
    }

    fn read_attr(&self, attr: &str) -> Result<String, TransportError> {
        let p = self.path(attr);
        fs::read_to_string(&p).map_err(|e| io_err(format!("reading {}", p.display()), e))
    }

    fn ids(&self) -> Result<(u16, u16), TransportError> {
        let id = |attr| -> Result<u16, TransportError> {
            let s = self.read_attr(attr)?;
            parse_hex(&s)
                .and_then(|v| u16::try_from(v).ok())
                .ok_or_else(|| protocol(format!("parsing {}/{attr}", self.bdf), format!("{s:?}")))
        };
        Ok((id("vendor")?, id("device")?))
    }

    /// The driver bound to the function, if any.
    fn driver(&self) -> Option<String> {
        let l = fs::read_link(self.path("driver")).ok()?;
        Some(l.file_name()?.to_string_lossy().into_owned())
    }

    /// The kernel virtio driver using the function's virtio device (e.g.
    /// `virtio_net`), if any: `virtioN/driver` under a virtio-pci function.
    fn virtio_child_driver(&self) -> Option<String> {
        let rd = fs::read_dir(&self.dir).ok()?;
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("virtio") {
                if let Ok(l) = fs::read_link(e.path().join("driver")) {
                    return l.file_name().map(|n| n.to_string_lossy().into_owned());
                }
            }
        }
        None
    }

    fn driver_op(&self, driver: &str, op: &str) -> Result<(), TransportError> {
        let p = self.dir.join("driver");
        let p = if op == "unbind" {
            p.join("unbind")
        } else {
            // .../devices/BDF -> .../bus/pci/drivers/NAME/bind
            self.dir
                .parent()
                .and_then(Path::parent)
                .map(|bus| bus.join("drivers").join(driver).join("bind"))
                .unwrap_or(p)
        };
        fs::write(&p, self.bdf.as_bytes()).map_err(|e| {
            io_err(
                format!("{op} {} ({driver}) via {}", self.bdf, p.display()),
                e,
            )
        })
    }

    /// (size, flags) of BAR `bar` from the `resource` file.
    fn bar(&self, bar: u8) -> Result<(u64, u64), TransportError> {
        let res = parse_resource_file(&self.read_attr("resource")?);
        let (start, end, flags) = res.get(bar as usize).copied().unwrap_or_default();
        if end <= start {
            return Err(TransportError::NoDevice(format!(
                "{}: BAR {bar} is not assigned",
                self.bdf
            )));
        }
        Ok((end - start + 1, flags))
    }
}

/// One virtio-pci function found by [`scan`]: its address and, when it
/// cannot be used, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// PCI address, `DDDD:BB:DD.F`.
    pub bdf: String,
    /// PCI device ID (0x1040 + virtio device ID).
    pub device_id: u16,
    /// `Some(reason)` when the function must not be touched (a kernel
    /// virtio driver uses it).
    pub skip: Option<String>,
}

/// Lists the modern virtio-pci functions under `root` (normally
/// [`SYSFS_PCI_DEVICES`]), sorted by address: vendor 0x1af4, device ID
/// 0x1040..=0x107f. Functions whose virtio device is bound to a kernel
/// virtio driver (virtio-net, virtio-blk, ...) are marked `skip`: vrnic has
/// no kernel driver, and unbinding such a function would take a disk or NIC
/// away from the guest. Errors: `root` cannot be read: [`TransportError::Io`].
pub fn scan(root: &Path) -> Result<Vec<Candidate>, TransportError> {
    let rd = fs::read_dir(root).map_err(|e| io_err(format!("listing {}", root.display()), e))?;
    let mut names: Vec<String> = rd
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut out = Vec::new();
    for bdf in names {
        let dev = SysfsDevice::new(root, &bdf);
        let Ok((vendor, device_id)) = dev.ids() else {
            continue;
        };
        if vendor != abi::PCI_VENDOR_ID || !(0x1040..=0x107f).contains(&device_id) {
            continue;
        }
        let skip = dev
            .virtio_child_driver()
            .map(|d| format!("in use by kernel driver {d}"));
        out.push(Candidate {
            bdf,
            device_id,
            skip,
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Claiming and mapping
// ---------------------------------------------------------------------------

/// Exclusive use of a function: the locked `config` file, and what to
/// restore when the device is rejected.
#[derive(Debug)]
struct Claim {
    dev: SysfsDevice,
    config: File,
    orig_driver: Option<String>,
    orig_command: u16,
    unbound: bool,
    /// This claim bound the function to [`UIO_DRIVER`] (undone on restore).
    uio_bound: bool,
    /// Restore Command register and driver on drop (set until accepted).
    restore: bool,
}

impl Claim {
    fn command(&self) -> Result<u16, TransportError> {
        let mut b = [0u8; 2];
        self.config
            .read_exact_at(&mut b, PCI_COMMAND)
            .map_err(|e| io_err(format!("reading {} command register", self.dev.bdf), e))?;
        Ok(u16::from_le_bytes(b))
    }

    fn set_command(&self, v: u16) -> Result<(), TransportError> {
        self.config
            .write_all_at(&v.to_le_bytes(), PCI_COMMAND)
            .map_err(|e| io_err(format!("writing {} command register", self.dev.bdf), e))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.restore {
            return;
        }
        if let Err(e) = self.set_command(self.orig_command) {
            tracing::warn!("{e}");
        }
        if self.uio_bound {
            if let Err(e) = self.dev.driver_op(UIO_DRIVER, "unbind") {
                tracing::warn!("{e}");
            }
            if let Err(e) = fs::write(self.dev.path("driver_override"), b"\n") {
                tracing::warn!("{}: clearing driver_override: {e}", self.dev.bdf);
            }
        }
        if let (true, Some(d)) = (self.unbound, &self.orig_driver) {
            if let Err(e) = self.dev.driver_op(d, "bind") {
                tracing::warn!("{e}");
            }
        }
    }
}

/// Offset of the first capability with ID `id` in a type-0 configuration
/// space (the standard list at 0x34), if any. Bounded: at most 64 hops.
pub fn find_capability(space: &[u8], id: u8) -> Option<usize> {
    let status = u16::from_le_bytes([*space.get(6)?, *space.get(7)?]);
    if status & crate::virtio::PCI_STATUS_CAP_LIST == 0 {
        return None;
    }
    let mut ptr = (*space.get(0x34)? & 0xfc) as usize;
    for _ in 0..64 {
        if ptr < 0x40 {
            return None;
        }
        if *space.get(ptr)? == id {
            return Some(ptr);
        }
        ptr = (*space.get(ptr + 1)? & 0xfc) as usize;
    }
    None
}

/// The function's INTx interrupt through `uio_pci_generic` (kernel
/// `Documentation/driver-api/uio-howto.rst`): `/dev/uioN` becomes readable
/// when the interrupt fires (the kernel's handler then masks INTx with the
/// Command register's Interrupt Disable bit); the virtio ISR (§4.1.4.5)
/// says why and de-asserts the line when read.
#[derive(Debug)]
struct Intx {
    /// `/dev/uioN`, non-blocking: `read(2)` of 4 bytes returns the
    /// interrupt count, or `EAGAIN` when no interrupt came since the last read.
    uio: File,
    isr: Isr,
}

impl Intx {
    /// Consumes the pending wake-up and re-arms the interrupt, in the order
    /// that loses none: the uio count, then the ISR (clears it, de-asserts
    /// the line), then INTx unmasked through `config` (Command register
    /// high byte, offset 5). A buffer the device uses after the ISR read
    /// raises the line again; with INTx still masked it stays pending and
    /// fires once unmasked. Returns the ISR bits.
    fn ack(&self, config: &File) -> Result<u8, TransportError> {
        let mut count = [0u8; 4];
        match (&self.uio).read(&mut count) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io_err("reading the uio interrupt count", e)),
        }
        let bits = self.isr.read_and_clear()?;
        unmask_intx(config)?;
        Ok(bits)
    }
}

/// Clears the Interrupt Disable bit of the Command register (bit 2 of its
/// high byte, configuration offset 5), as the uio howto's example does;
/// writes only when it is set.
fn unmask_intx(config: &File) -> Result<(), TransportError> {
    let mut hi = [0u8; 1];
    config
        .read_exact_at(&mut hi, PCI_COMMAND + 1)
        .map_err(|e| io_err("reading the command register", e))?;
    let bit = (PCI_COMMAND_INTX_DISABLE >> 8) as u8;
    if hi[0] & bit != 0 {
        config
            .write_all_at(&[hi[0] & !bit], PCI_COMMAND + 1)
            .map_err(|e| io_err("unmasking INTx in the command register", e))?;
    }
    Ok(())
}

/// Why the function cannot interrupt through INTx, if it cannot: MSI-X
/// enabled (the device would then signal MSI-X vectors, which nobody
/// receives) or no interrupt pin.
fn intx_unusable(config: &File, space: &[u8]) -> Result<Option<String>, TransportError> {
    let mut pin = [0u8; 1];
    config
        .read_exact_at(&mut pin, PCI_INTERRUPT_PIN)
        .map_err(|e| io_err("reading the interrupt pin", e))?;
    if pin[0] == 0 {
        return Ok(Some("no INTx pin".into()));
    }
    if let Some(cap) = find_capability(space, PCI_CAP_ID_MSIX) {
        let mut ctl = [0u8; 2];
        config
            .read_exact_at(&mut ctl, cap as u64 + 2)
            .map_err(|e| io_err("reading the MSI-X control", e))?;
        if u16::from_le_bytes(ctl) & PCI_MSIX_FLAGS_ENABLE != 0 {
            return Ok(Some("MSI-X is enabled".into()));
        }
    }
    Ok(None)
}

/// Binds the function to [`UIO_DRIVER`] unless it already is (it must be
/// unbound): `driver_override`, then `drivers/uio_pci_generic/bind`. Sets
/// `claim.uio_bound` when it bound it. Errors: the module is not loaded, or
/// the bind failed (`driver_override` is cleared again).
fn bind_uio(claim: &mut Claim, drivers: &Path) -> Result<(), TransportError> {
    let dev = &claim.dev;
    if dev.driver().as_deref() == Some(UIO_DRIVER) {
        return Ok(());
    }
    if !drivers.join(UIO_DRIVER).is_dir() {
        return Err(TransportError::NoDevice(format!(
            "{UIO_DRIVER} is not loaded (modprobe {UIO_DRIVER})"
        )));
    }
    let ovr = dev.path("driver_override");
    fs::write(&ovr, UIO_DRIVER.as_bytes())
        .map_err(|e| io_err(format!("writing {}", ovr.display()), e))?;
    if let Err(e) = dev.driver_op(UIO_DRIVER, "bind") {
        let _ = fs::write(&ovr, b"\n");
        return Err(e);
    }
    claim.uio_bound = true;
    Ok(())
}

/// Opens the `/dev/uioN` of a function bound to [`UIO_DRIVER`] (`dev_dir`:
/// normally [`DEV_DIR`]), non-blocking.
fn open_uio(dev: &SysfsDevice, dev_dir: &Path) -> Result<File, TransportError> {
    let d = dev.path("uio");
    let name = fs::read_dir(&d)
        .map_err(|e| io_err(format!("listing {}", d.display()), e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("uio"))
        .ok_or_else(|| TransportError::NoDevice(format!("no uio device under {}", d.display())))?;
    let p = dev_dir.join(&name);
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&p)
        .map_err(|e| io_err(format!("opening {}", p.display()), e))
}

/// A BAR mapped through sysfs `resourceN`.
#[derive(Debug)]
struct BarMap {
    index: u8,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: device registers have no thread affinity; the mapping is owned.
unsafe impl Send for BarMap {}

impl Drop for BarMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

impl BarMap {
    /// Maps the first `len` bytes (rounded up to pages) of BAR `index`.
    fn map(dev: &SysfsDevice, index: u8, len: usize) -> Result<Self, TransportError> {
        let p = dev.path(&format!("resource{index}"));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .map_err(|e| io_err(format!("opening {}", p.display()), e))?;
        let len = len.next_multiple_of(crate::dma::page_size());
        // SAFETY: a shared mapping of device registers at a kernel-chosen address.
        let m = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(io_err(
                format!("mmap of {} ({len} bytes)", p.display()),
                io::Error::last_os_error(),
            ));
        }
        Ok(BarMap {
            index,
            ptr: m as *mut u8,
            len,
        })
    }

    fn mmio(&self) -> Mmio {
        // SAFETY: the mapping lives as long as the BarMap, which the
        // transport keeps until after the device is reset.
        unsafe { Mmio::new(self.ptr, self.len) }
    }
}

/// Resets the device on drop unless disarmed: stops it using driver
/// memory before that memory is freed on an error path.
struct ResetGuard(Option<VirtioPci>);

impl Drop for ResetGuard {
    fn drop(&mut self) {
        if let Some(v) = self.0.take() {
            if let Err(e) = v.reset(RESET_TIMEOUT) {
                tracing::warn!("resetting device: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Queues
// ---------------------------------------------------------------------------

/// The doorbell queue: private to this process, or shared with the
/// programs of a guest agent ([`crate::dbring`]).
#[derive(Debug)]
enum Doorbells {
    Private(SlotQueue),
    Shared(SharedDb),
}

/// A shared mapping (a memfd, or a device's resource file), unmapped on drop.
#[derive(Debug)]
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain shared memory; its users synchronise.
unsafe impl Send for SharedMap {}

impl SharedMap {
    /// Maps `len` bytes of `fd` from `offset` (page-aligned), shared,
    /// read-write; `flags` are added (`MAP_POPULATE`, `MAP_LOCKED`).
    pub fn map(
        fd: RawFd,
        len: usize,
        offset: u64,
        flags: i32,
    ) -> Result<SharedMap, TransportError> {
        // SAFETY: a new shared mapping at a kernel-chosen address.
        let m = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | flags,
                fd,
                offset as libc::off_t,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(io_err(
                format!("mmap of {len} bytes"),
                io::Error::last_os_error(),
            ));
        }
        Ok(SharedMap { ptr: m.cast(), len })
    }

    /// The mapping's first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// What a program needs to post to a guest agent's shared doorbell queue
/// ([`PciTransport::shared_doorbells`]).
#[derive(Debug, Clone)]
pub struct SharedDoorbells {
    /// The huge-page memfd holding the ring (map `layout.len` bytes, rounded
    /// up to 2 MiB, shared).
    pub memfd: RawFd,
    /// Where the ring's parts lie in it.
    pub layout: crate::dbring::DbRingLayout,
    /// The resource file of the BAR holding the queue's notification register.
    pub notify_file: PathBuf,
    /// The register's offset in that file, bytes.
    pub notify_offset: u64,
}

/// Size of the shared doorbell region: one 2 MiB huge page.
pub const SHARED_DB_REGION: usize = 2 << 20;

/// Maps the notification register at `offset` of resource file `path`;
/// returns the mapping and the register's address.
pub fn map_notify(path: &Path, offset: u64) -> Result<(SharedMap, *mut u16), TransportError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| io_err(format!("opening {}", path.display()), e))?;
    let page = crate::dma::page_size() as u64;
    let base = offset - offset % page;
    let m = SharedMap::map(f.as_raw_fd(), page as usize, base, 0)?;
    // SAFETY: offset - base < page: inside the mapping.
    let reg = unsafe { m.ptr.add((offset - base) as usize) }.cast::<u16>();
    Ok((m, reg))
}

/// The agent's shared doorbell queue.
#[derive(Debug)]
struct SharedDb {
    _memfd: OwnedFd,
    _region: SharedMap,
    ring: crate::dbring::DbRing,
    _notify: SharedMap,
    info: SharedDoorbells,
    /// Kept for its size only: nothing is posted through it.
    _queue: Queue,
}

impl SharedDb {
    /// A huge-page memfd holding a doorbell ring of `size` descriptors,
    /// mapped and locked; `gpa` of its first byte.
    fn region(pagemap: &crate::dma::Pagemap) -> Result<(OwnedFd, SharedMap, u64), TransportError> {
        // SAFETY: plain syscall with a static name; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"vrnic-doorbells".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
            )
        };
        if fd < 0 {
            return Err(io_err(
                "memfd_create (huge pages)",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), SHARED_DB_REGION as libc::off_t) } != 0 {
            return Err(io_err(
                "ftruncate of the doorbell memfd",
                io::Error::last_os_error(),
            ));
        }
        let m = SharedMap::map(
            fd.as_raw_fd(),
            SHARED_DB_REGION,
            0,
            libc::MAP_POPULATE | libc::MAP_LOCKED,
        )?;
        let gpa = pagemap.virt_to_phys(m.ptr as usize)?;
        Ok((fd, m, gpa))
    }
}

// ---------------------------------------------------------------------------
// The transport
// ---------------------------------------------------------------------------

/// A vrnic device driven through virtio-pci from user space.
///
/// Field order matters for drop: after [`Drop::drop`] resets the device,
/// DMA memory, then the BAR mappings, then the claim are released.
#[derive(Debug)]
pub struct PciTransport {
    virtio: VirtioPci,
    config: abi::ConfigSpace,
    ctrl: ControlQueue,
    db: Doorbells,
    ev: SlotQueue,
    timeout: Duration,
    dma: DmaAllocator,
    /// Kept mapped until after the reset in `drop`.
    _bars: Vec<BarMap>,
    /// The INTx interrupt, if `uio_pci_generic` delivers it.
    intx: Option<Intx>,
    claim: Claim,
}

impl PciTransport {
    /// Finds, claims and initialises a vrnic device.
    ///
    /// `bdf`: the PCI address (`0000:00:04.0` or `00:04.0`) of the device to
    /// use; `None` tries every modern virtio-pci function (see [`scan`]) in
    /// address order and takes the first vrnic. Errors:
    /// [`TransportError::NoDevice`] with the reason for each function tried
    /// (not virtio, in use by a kernel driver or another process, wrong
    /// signature or ABI version, ...); with an explicit `bdf`, that
    /// function's error as is ([`TransportError::Io`] for sysfs, mmap or
    /// pagemap failures, e.g. when not root; [`TransportError::Timeout`]
    /// when the device does not reset).
    pub fn open(bdf: Option<&str>) -> Result<PciTransport, TransportError> {
        Self::open_with(bdf, false)
    }

    /// Like [`PciTransport::open`], with the doorbell queue in a shared
    /// huge-page memfd that other processes may post to
    /// ([`PciTransport::shared_doorbells`], [`crate::dbring`]): what the
    /// guest agent opens. Errors as [`PciTransport::open`], and
    /// [`TransportError::Io`] when no huge page can be had for the ring.
    pub fn open_shared(bdf: Option<&str>) -> Result<PciTransport, TransportError> {
        Self::open_with(bdf, true)
    }

    fn open_with(bdf: Option<&str>, shared: bool) -> Result<PciTransport, TransportError> {
        let root = Path::new(SYSFS_PCI_DEVICES);
        if let Some(b) = bdf {
            let bdf = normalize_bdf(b);
            return Self::attach(&SysfsDevice::new(root, &bdf), shared);
        }
        let mut reasons = Vec::new();
        for c in scan(root)? {
            if let Some(why) = &c.skip {
                tracing::debug!("{}: skipped: {why}", c.bdf);
                reasons.push(format!("{}: {why}", c.bdf));
                continue;
            }
            match Self::attach(&SysfsDevice::new(root, &c.bdf), shared) {
                Ok(t) => return Ok(t),
                Err(e) => {
                    tracing::debug!("{}: {e}", c.bdf);
                    reasons.push(format!("{}: {e}", c.bdf));
                }
            }
        }
        Err(TransportError::NoDevice(if reasons.is_empty() {
            format!("no virtio-pci function (vendor 0x1af4, device 0x1040..=0x107f) in {SYSFS_PCI_DEVICES}")
        } else {
            reasons.join("; ")
        }))
    }

    /// Claims and initialises the function `dev`, step by step (see the
    /// module documentation): identify it, lock and read its configuration
    /// space and virtio capabilities, take it from its driver ([`Claim`]),
    /// choose its interrupt, enable it, map its BARs, initialise the device
    /// (virtio 1.2 §3.1.1), set up the queues and set DRIVER_OK. On any
    /// error the guards roll back what was done, in reverse order:
    /// [`ResetGuard`] resets the device before its DMA memory is freed,
    /// then the BARs are unmapped and [`Claim`] restores the Command
    /// register and the original driver.
    fn attach(dev: &SysfsDevice, shared: bool) -> Result<PciTransport, TransportError> {
        let bdf = &dev.bdf;
        check_virtio_function(dev)?;
        let (config, space) = lock_config(dev)?;
        let (caps, devcap) = read_virtio_caps(bdf, &space)?;
        let need = bar_extents(dev, &caps)?;
        let mut claim = Claim::take(dev, config)?;
        let (uio, no_irq) = choose_interrupt(&mut claim, &space, &caps)?;
        // Bus Master after /dev/uioN is open: uio_pci_generic clears it
        // when the last descriptor is closed.
        claim.set_command(claim.orig_command | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER)?;
        let bars = map_bars(dev, need)?;
        let (virtio, intx) = device_registers(bdf, &bars, &caps, devcap, uio)?;
        let mut dma = DmaAllocator::new()?;
        let mut guard = ResetGuard(Some(virtio));
        let config = init_device(&virtio, bdf)?;
        let mut queues = setup_queues(&virtio, &mut dma, dev, &caps, shared, intx.is_some())?;
        set_driver_ok(
            &virtio,
            &mut queues.ev,
            intx.as_ref(),
            &claim,
            no_irq.as_deref(),
        )?;

        guard.0 = None;
        claim.restore = false;
        let Queues {
            ctrl,
            ev,
            ev_size,
            db,
            db_size,
        } = queues;
        tracing::info!(
            "vrnic {bdf}: queues {}/{db_size}/{ev_size}, DMA from {:?}, MAC {:02x?}",
            ctrl.queue.q.size(),
            dma.mode(),
            config.mac
        );
        Ok(PciTransport {
            virtio,
            config,
            ctrl,
            db,
            ev,
            timeout: DEFAULT_TIMEOUT,
            dma,
            _bars: bars,
            intx,
            claim,
        })
    }

    /// The shared doorbell queue of a transport opened with
    /// [`PciTransport::open_shared`]; `None` otherwise.
    pub fn shared_doorbells(&self) -> Option<SharedDoorbells> {
        match &self.db {
            Doorbells::Shared(s) => Some(s.info.clone()),
            Doorbells::Private(_) => None,
        }
    }

    /// The device's PCI address.
    pub fn bdf(&self) -> &str {
        &self.claim.dev.bdf
    }

    /// The bound on waiting for the device ([`DEFAULT_TIMEOUT`] unless set).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the bound on waiting for the device.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sizes of the control, doorbell and event queues (descriptors).
    pub fn queue_sizes(&self) -> [u16; 3] {
        [
            self.ctrl.queue.q.size(),
            match &self.db {
                Doorbells::Private(d) => d.queue.q.size(),
                Doorbells::Shared(d) => d.info.layout.size,
            },
            self.ev.queue.q.size(),
        ]
    }

    /// Whether DMA memory comes from huge pages or the 4 KiB fallback.
    pub fn dma_mode(&self) -> DmaMode {
        self.dma.mode()
    }

    /// Whether device events arrive as an interrupt ([`Transport::event_fd`]
    /// is `/dev/uioN`); `false`: they must be polled.
    pub fn has_interrupt(&self) -> bool {
        self.intx.is_some()
    }
}

impl Drop for PciTransport {
    fn drop(&mut self) {
        // Stop the device before its rings and buffers are unmapped.
        if let Err(e) = self.virtio.reset(RESET_TIMEOUT) {
            tracing::warn!("{}: reset on close: {e}", self.claim.dev.bdf);
        }
    }
}

// ---------------------------------------------------------------------------
// Attaching, one step at a time (in the order `PciTransport::attach` runs them)
// ---------------------------------------------------------------------------

/// Step 1: the function is a modern virtio-pci function (vendor 0x1af4,
/// device 0x1040..=0x107f, virtio 1.2 §4.1.2) that no kernel virtio driver
/// uses. Errors: [`TransportError::NoDevice`] saying which;
/// [`TransportError::Io`] when sysfs cannot be read.
fn check_virtio_function(dev: &SysfsDevice) -> Result<(), TransportError> {
    let bdf = &dev.bdf;
    let (vendor, device_id) = dev.ids()?;
    if vendor != abi::PCI_VENDOR_ID || !(0x1040..=0x107f).contains(&device_id) {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: {vendor:04x}:{device_id:04x} is not a modern virtio-pci function"
        )));
    }
    if let Some(d) = dev.virtio_child_driver() {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: in use by kernel driver {d}"
        )));
    }
    Ok(())
}

/// Step 2: exclusive use among processes (`flock` on sysfs `config`, where
/// supported), then the configuration space (up to 4096 bytes). Returns the
/// open `config` file (which holds the lock) and its contents. Errors:
/// [`TransportError::NoDevice`] when another process holds the lock;
/// [`TransportError::Io`] when `config` cannot be opened or read.
fn lock_config(dev: &SysfsDevice) -> Result<(File, Vec<u8>), TransportError> {
    let bdf = &dev.bdf;
    let cfg_path = dev.path("config");
    let config = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&cfg_path)
        .map_err(|e| io_err(format!("opening {}", cfg_path.display()), e))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(config.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(TransportError::NoDevice(format!(
                "{bdf}: in use by another process"
            )));
        }
        tracing::debug!("{bdf}: flock unsupported ({e}); continuing without a lock");
    }
    let mut space = Vec::with_capacity(4096);
    (&config)
        .take(4096)
        .read_to_end(&mut space)
        .map_err(|e| io_err(format!("reading {}", cfg_path.display()), e))?;
    Ok((config, space))
}

/// Step 3: the virtio capabilities (virtio 1.2 §4.1.4) of configuration
/// space `space`, and the device configuration capability, which must hold
/// at least an [`abi::ConfigSpace`]. Errors: [`TransportError::NoDevice`]
/// (malformed capabilities, no or too small device configuration: not a
/// vrnic).
fn read_virtio_caps(
    bdf: &str,
    space: &[u8],
) -> Result<(VirtioPciCaps, crate::virtio::VirtioPciCap), TransportError> {
    let caps =
        VirtioPciCaps::parse(space).map_err(|e| TransportError::NoDevice(format!("{bdf}: {e}")))?;
    let Some(devcap) = caps.device else {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: no device configuration (not a vrnic)"
        )));
    };
    if (devcap.length as usize) < size_of::<abi::ConfigSpace>() {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: device configuration of {} bytes (not a vrnic)",
            devcap.length
        )));
    }
    Ok((caps, devcap))
}

/// Step 3 (continued): checks that every structure of `caps` lies in an
/// assigned memory BAR (sysfs `resource`) and returns, per BAR the
/// capabilities name, the bytes to map (the end of its last structure).
/// Errors: [`TransportError::NoDevice`] for an I/O BAR or a structure past
/// the end of its BAR; [`TransportError::Io`] when sysfs cannot be read.
fn bar_extents(
    dev: &SysfsDevice,
    caps: &VirtioPciCaps,
) -> Result<Vec<(u8, usize)>, TransportError> {
    let bdf = &dev.bdf;
    let mut need: Vec<(u8, usize)> = Vec::new();
    for bar in caps.bars() {
        let (size, flags) = dev.bar(bar)?;
        if flags & IORESOURCE_MEM == 0 {
            return Err(TransportError::NoDevice(format!(
                "{bdf}: BAR {bar} is not a memory BAR"
            )));
        }
        let mut end = 0usize;
        for cap in [Some(caps.common), Some(caps.notify), caps.isr, caps.device]
            .into_iter()
            .flatten()
        {
            if cap.bar != bar {
                continue;
            }
            let e = cap.offset as u64 + cap.length as u64;
            if e > size {
                return Err(TransportError::NoDevice(format!(
                    "{bdf}: capability at {:#x} ({:#x}+{:#x}) exceeds BAR {bar} of {size:#x} bytes",
                    cap.cap_offset, cap.offset, cap.length
                )));
            }
            end = end.max(e as usize);
        }
        need.push((bar, end));
    }
    Ok(need)
}

impl Claim {
    /// Step 4: takes the function from its kernel driver (`driver/unbind`,
    /// unless it is [`UIO_DRIVER`]), keeping its `config` file (and lock).
    /// From here on the returned claim restores the Command register and
    /// the driver when dropped, until `restore` is cleared. Errors:
    /// [`TransportError::Io`] reading the Command register or unbinding.
    fn take(dev: &SysfsDevice, config: File) -> Result<Claim, TransportError> {
        let orig_driver = dev.driver();
        let mut claim = Claim {
            dev: dev.clone(),
            config,
            orig_driver,
            orig_command: 0,
            unbound: false,
            uio_bound: false,
            restore: true,
        };
        claim.orig_command = claim.command()?;
        if let Some(d) = claim.orig_driver.clone() {
            if d != UIO_DRIVER {
                dev.driver_op(&d, "unbind")?;
                claim.unbound = true;
            }
        }
        Ok(claim)
    }
}

/// Step 5: the interrupt: INTx through [`UIO_DRIVER`] (bound here, see
/// [`bind_uio`]), or none (events polled). Runs after the unbind, since
/// virtio-pci's remove disables MSI-X. Returns `/dev/uioN` when usable,
/// else why not. Errors: [`TransportError::Io`] reading configuration
/// space; a failed bind only means no interrupt.
fn choose_interrupt(
    claim: &mut Claim,
    space: &[u8],
    caps: &VirtioPciCaps,
) -> Result<(Option<File>, Option<String>), TransportError> {
    let mut no_irq = intx_unusable(&claim.config, space)?;
    if no_irq.is_none() && std::env::var_os(NO_IRQ_ENV).is_some() {
        no_irq = Some(format!("{NO_IRQ_ENV} is set"));
    }
    if no_irq.is_none() && caps.isr.is_none() {
        no_irq = Some("no ISR status capability".into());
    }
    let mut uio = None;
    if no_irq.is_none() {
        let drivers = claim
            .dev
            .dir
            .parent()
            .and_then(Path::parent)
            .map(|bus| bus.join("drivers"))
            .unwrap_or_default();
        match bind_uio(claim, &drivers).and_then(|()| open_uio(&claim.dev, Path::new(DEV_DIR))) {
            Ok(f) => uio = Some(f),
            Err(e) => no_irq = Some(e.to_string()),
        }
    }
    Ok((uio, no_irq))
}

/// Step 6: maps `need` (BAR, bytes) as [`BarMap`]s, in order. Errors:
/// [`TransportError::Io`] opening or mapping `resourceN`.
fn map_bars(dev: &SysfsDevice, need: Vec<(u8, usize)>) -> Result<Vec<BarMap>, TransportError> {
    let mut bars = Vec::new();
    for (bar, end) in need {
        bars.push(BarMap::map(dev, bar, end)?);
    }
    Ok(bars)
}

/// Step 6 (continued): the virtio structures in the mapped `bars`: the
/// [`VirtioPci`] registers, and the interrupt if `uio` is open and the ISR
/// status is there. Errors: [`TransportError::NoDevice`] when a structure's
/// BAR is not mapped or its window does not fit.
fn device_registers(
    bdf: &str,
    bars: &[BarMap],
    caps: &VirtioPciCaps,
    devcap: crate::virtio::VirtioPciCap,
    uio: Option<File>,
) -> Result<(VirtioPci, Option<Intx>), TransportError> {
    let window = |cap: crate::virtio::VirtioPciCap| -> Result<Mmio, TransportError> {
        let b = bars.iter().find(|b| b.index == cap.bar).ok_or_else(|| {
            TransportError::NoDevice(format!("{bdf}: BAR {} not mapped", cap.bar))
        })?;
        b.mmio().window(cap.offset as usize, cap.length as usize)
    };
    let virtio = VirtioPci::new(
        window(caps.common)?,
        window(caps.notify)?,
        caps.notify_off_multiplier,
        window(devcap)?,
    )?;
    let intx = match (uio, caps.isr) {
        (Some(uio), Some(cap)) => Some(Intx {
            uio,
            isr: Isr::new(window(cap)?)?,
        }),
        _ => None,
    };
    Ok((virtio, intx))
}

/// Step 7: device initialisation up to FEATURES_OK (virtio 1.2 §3.1.1,
/// [`VirtioPci::negotiate`]) and identification: the device configuration
/// must carry [`abi::SIGNATURE`] and [`abi::ABI_VERSION`], and the device
/// at least [`abi::NUM_QUEUES`] virtqueues. Returns the configuration.
/// Errors: [`TransportError::NoDevice`] when it is not a vrnic this driver
/// speaks to; the transport's errors from the registers.
fn init_device(virtio: &VirtioPci, bdf: &str) -> Result<abi::ConfigSpace, TransportError> {
    virtio.negotiate(RESET_TIMEOUT)?;
    let mut raw = [0u8; size_of::<abi::ConfigSpace>()];
    virtio.read_device_config(&mut raw)?;
    let config = abi::ConfigSpace::read_from(&raw).unwrap_or_default();
    if config.signature != abi::SIGNATURE {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: signature {:?} is not vrnic's",
            String::from_utf8_lossy(&config.signature)
        )));
    }
    if config.abi_version != abi::ABI_VERSION {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: vrnic ABI version {} (this driver speaks {})",
            config.abi_version,
            abi::ABI_VERSION
        )));
    }
    let nq = virtio.common.num_queues()?;
    if (nq as usize) < abi::NUM_QUEUES {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: {nq} virtqueues, vrnic needs {}",
            abi::NUM_QUEUES
        )));
    }
    Ok(config)
}

/// The three queues [`setup_queues`] made, with the doorbell and event
/// queue sizes (descriptors). Fields drop in this order (as they did when
/// they were locals of one function: control, event, doorbell).
struct Queues {
    ctrl: ControlQueue,
    ev: SlotQueue,
    ev_size: u16,
    db: Doorbells,
    db_size: u16,
}

/// Step 8: the control, event and doorbell queues (virtio 1.2 §4.1.5.1.3),
/// in that order, in DMA memory from `dma` (the doorbell queue in a shared
/// huge-page memfd when `shared`); the event queue's buffers posted, and
/// its interrupts on when `interrupts`. The control bounce buffer is
/// allocated first: it settles whether huge pages are available, which
/// bounds the ring sizes. Errors: [`TransportError::NoDevice`] for an
/// unavailable queue; DMA and register errors.
fn setup_queues(
    virtio: &VirtioPci,
    dma: &mut DmaAllocator,
    dev: &SysfsDevice,
    caps: &VirtioPciCaps,
    shared: bool,
    interrupts: bool,
) -> Result<Queues, TransportError> {
    let bdf = &dev.bdf;
    let ctrl_bounce = dma.alloc(RESP_OFF + RESP_LEN, 64)?;
    let (ctrlq, _) = make_queue(virtio, dma, bdf, abi::CONTROLQ)?;
    let (evq, ev_size) = make_queue(virtio, dma, bdf, abi::EVENTQ)?;
    let (db, db_size) = if shared {
        shared_doorbells(virtio, dma, dev, caps)?
    } else {
        let (dbq, db_size) = make_queue(virtio, dma, bdf, abi::DOORBELLQ)?;
        let db = SlotQueue {
            queue: dbq,
            slots: dma.alloc(SLOT * db_size as usize, 64)?,
        };
        (Doorbells::Private(db), db_size)
    };
    let mut ev = SlotQueue {
        queue: evq,
        slots: dma.alloc(SLOT * ev_size as usize, 64)?,
    };
    ev.prefill()?;
    // Only the event queue interrupts (and only with an interrupt to
    // receive it); control and doorbell answers are polled.
    if interrupts {
        ev.queue.q.set_interrupts(true);
    }
    let ctrl = ControlQueue {
        queue: ctrlq,
        bounce: ctrl_bounce,
        pending: None,
    };
    Ok(Queues {
        ctrl,
        ev,
        ev_size,
        db,
        db_size,
    })
}

/// A polled virtqueue `index` in memory from `dma`, as large as the device
/// and the allocator allow ([`pick_queue_size`]), set up in the device.
/// Returns it and its size. Errors: [`TransportError::NoDevice`] when the
/// device offers no queue `index`; DMA and register errors.
fn make_queue(
    virtio: &VirtioPci,
    dma: &mut DmaAllocator,
    bdf: &str,
    index: u16,
) -> Result<(Queue, u16), TransportError> {
    let max = virtio.max_queue_size(index)?;
    let size = pick_queue_size(max, dma.max_alloc());
    if size == 0 {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: virtqueue {index} unavailable"
        )));
    }
    let layout = QueueLayout::new(size)?;
    let mem = dma.alloc(layout.len, QueueLayout::ALIGN.max(64))?;
    // SAFETY: mem is layout.len bytes of 64-aligned, physically
    // contiguous DMA memory at mem.gpa, owned by the transport and
    // freed only after the device is reset.
    let q = unsafe { polled_queue(layout, mem.ptr, mem.gpa) }?;
    let notifier = virtio.setup_queue(index, &q)?;
    Ok((
        Queue {
            q,
            notifier: Kick::Mmio(notifier),
        },
        size,
    ))
}

/// The doorbell queue of [`PciTransport::open_shared`]: at most 256
/// descriptors in a [`SharedDb`] region, set up in the device, with its
/// notification register mapped from the notify BAR for other processes
/// ([`crate::dbring`]). Returns it and its size. Errors:
/// [`TransportError::NoDevice`] for an unusable size; [`TransportError::Io`]
/// without a huge page or when mapping fails; register errors.
fn shared_doorbells(
    virtio: &VirtioPci,
    dma: &DmaAllocator,
    dev: &SysfsDevice,
    caps: &VirtioPciCaps,
) -> Result<(Doorbells, u16), TransportError> {
    let size = virtio.max_queue_size(abi::DOORBELLQ)?.min(256);
    let layout = crate::dbring::DbRingLayout::new(size).ok_or_else(|| {
        TransportError::NoDevice(format!("{}: doorbell queue size {size}", dev.bdf))
    })?;
    let (memfd, region, gpa) = SharedDb::region(dma.pagemap())?;
    let ql = QueueLayout::new(size)?;
    // SAFETY: the region is 2 MiB of locked, physically contiguous
    // (one huge page) shared memory at gpa, kept until after reset.
    let q = unsafe { polled_queue(ql, region.ptr, gpa) }?;
    let notifier = virtio.setup_queue(abi::DOORBELLQ, &q)?;
    virtio.common.select_queue(abi::DOORBELLQ)?;
    let notify_off = u64::from(virtio.common.queue_notify_off()?);
    let notify_offset =
        u64::from(caps.notify.offset) + notify_off * u64::from(caps.notify_off_multiplier);
    let notify_file = dev.path(&format!("resource{}", caps.notify.bar));
    let (nmap, reg) = map_notify(&notify_file, notify_offset)?;
    // SAFETY: region and register stay mapped in the SharedDb.
    let ring = unsafe { crate::dbring::DbRing::new(region.ptr, layout, reg, abi::DOORBELLQ) }?;
    ring.init_descriptors(gpa + u64::from(layout.slots));
    let info = SharedDoorbells {
        memfd: memfd.as_raw_fd(),
        layout,
        notify_file,
        notify_offset,
    };
    let db = SharedDb {
        _memfd: memfd,
        _region: region,
        ring,
        _notify: nmap,
        info,
        _queue: Queue {
            q,
            notifier: Kick::Mmio(notifier),
        },
    };
    Ok((Doorbells::Shared(db), size))
}

/// Step 9: DRIVER_OK (virtio 1.2 §3.1.1 step 8), checked to have been
/// accepted; then the event queue `ev` is kicked (its buffers are posted), a
/// stale ISR cleared and INTx unmasked (the kernel's handler may have
/// masked it since the last process), and the lack of an interrupt
/// (`no_irq`: why) said once on stderr. Errors:
/// [`TransportError::NoDevice`] when the device refused DRIVER_OK or needs
/// a reset; register and `config` errors.
fn set_driver_ok(
    virtio: &VirtioPci,
    ev: &mut SlotQueue,
    intx: Option<&Intx>,
    claim: &Claim,
    no_irq: Option<&str>,
) -> Result<(), TransportError> {
    let bdf = &claim.dev.bdf;
    virtio.driver_ok()?;
    let status = virtio.common.status()?;
    if status & crate::virtio::STATUS_DRIVER_OK == 0 || virtio.needs_reset()? {
        return Err(TransportError::NoDevice(format!(
            "{bdf}: device did not accept DRIVER_OK (status {status:#x})"
        )));
    }
    ev.queue.kick()?;
    if let Some(i) = intx {
        i.ack(&claim.config)?;
    }
    if let Some(why) = no_irq {
        eprintln!("vrnic {bdf}: no device interrupt ({why}); waiting for events polls");
    }
    Ok(())
}

impl Transport for PciTransport {
    /// [`Transport::command`] for device context `ctx` (the guest agent's;
    /// [`Transport::command`] is this for [`abi::DEFAULT_CTX`]).
    ///
    /// Posts `[CmdHeader + body]` (device-readable) and `[RespHeader +
    /// MAX_CMD_BODY]` (device-writable) from a DMA bounce buffer, notifies,
    /// and polls for the answer for at most [`PciTransport::timeout`].
    /// Returns the number of response bytes copied into `resp` (the body,
    /// truncated to `resp.len()`).
    ///
    /// Errors: `body` longer than [`abi::MAX_CMD_BODY`]: [`TransportError::Io`]
    /// (`InvalidInput`); no answer in time: [`TransportError::Timeout`] (the
    /// next command first waits for that answer); nonzero status:
    /// [`TransportError::Status`]; a response shorter than its header or
    /// than the length it claims: [`TransportError::Io`] (`InvalidData`).
    fn command_in(
        &mut self,
        ctx: u16,
        opcode: u16,
        body: &[u8],
        resp: &mut [u8],
    ) -> Result<usize, TransportError> {
        let r = self.ctrl.execute(ctx, opcode, body, resp, self.timeout);
        if let Err(TransportError::Timeout(_)) = r {
            if let Ok(true) = self.virtio.needs_reset() {
                tracing::warn!("{}: device signals DEVICE_NEEDS_RESET", self.bdf());
            }
        }
        r
    }

    fn config(&self) -> abi::ConfigSpace {
        self.config
    }

    /// Posts `db` in a preallocated 16-byte DMA buffer and notifies (unless
    /// the device suppressed notifications). When all doorbell descriptors
    /// are with the device, polls for one to come back for at most
    /// [`PciTransport::timeout`] ([`TransportError::Timeout`]).
    fn doorbell(&mut self, db: &abi::Doorbell) -> Result<(), TransportError> {
        match &mut self.db {
            Doorbells::Private(q) => q.ring(db, self.timeout),
            Doorbells::Shared(s) => s.ring.post(db, self.timeout),
        }
    }

    fn alloc_dma(&mut self, len: usize, align: usize) -> Result<DmaBuf, TransportError> {
        self.dma.alloc(len, align)
    }

    fn virt_to_phys(&self, va: usize) -> Result<u64, TransportError> {
        self.dma.pagemap().virt_to_phys(va)
    }

    fn page_size(&self) -> usize {
        self.dma.pagemap().page_size()
    }

    /// Pops one filled event buffer, reposts it, and returns the event.
    /// Buffers the device returns shorter than an [`abi::Event`], and
    /// protocol errors, are logged and skipped.
    fn poll_event(&mut self) -> Option<abi::Event> {
        self.ev.pop_event()
    }

    /// `/dev/uioN` of the function (readable when its INTx interrupt
    /// fired), or `None` when it has no usable interrupt.
    fn event_fd(&self) -> Option<RawFd> {
        self.intx.as_ref().map(|i| i.uio.as_raw_fd())
    }

    /// Reads the uio interrupt count, the ISR (de-asserting INTx) and
    /// unmasks INTx again; errors are logged.
    fn ack_event(&mut self) {
        if let Some(i) = &self.intx {
            if let Err(e) = i.ack(&self.claim.config) {
                tracing::warn!("{}: acknowledging the interrupt: {e}", self.claim.dev.bdf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::Notifier;
    use std::io::Write;
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::symlink;
    use std::time::Instant;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> Self {
            let p = std::env::temp_dir().join(format!("vrnic-pci-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn fake_fn(root: &Path, bdf: &str, vendor: u16, device: u16, virtio_driver: Option<&str>) {
        let d = root.join(bdf);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("vendor"), format!("0x{vendor:04x}\n")).unwrap();
        fs::write(d.join("device"), format!("0x{device:04x}\n")).unwrap();
        if vendor == 0x1af4 {
            symlink("../../../bus/pci/drivers/virtio-pci", d.join("driver")).unwrap();
            let v = d.join("virtio7");
            fs::create_dir_all(&v).unwrap();
            if let Some(drv) = virtio_driver {
                symlink(
                    format!("../../../../bus/virtio/drivers/{drv}"),
                    v.join("driver"),
                )
                .unwrap();
            }
        }
    }

    #[test]
    fn scan_finds_modern_virtio_functions_and_skips_kernel_owned_ones() {
        let t = TempDir::new("scan");
        fake_fn(&t.0, "0000:00:03.0", 0x1af4, 0x1041, Some("virtio_net"));
        fake_fn(&t.0, "0000:00:04.0", 0x1af4, 0x1046, None);
        fake_fn(&t.0, "0000:00:01.0", 0x8086, 0x1237, None);
        fake_fn(&t.0, "0000:00:02.0", 0x1af4, 0x1000, None); // transitional
        fake_fn(&t.0, "0000:00:05.0", 0x1af4, 0x107f, None);
        fs::create_dir_all(t.0.join("0000:00:06.0")).unwrap(); // unreadable ids
        let c = scan(&t.0).unwrap();
        assert_eq!(
            c,
            vec![
                Candidate {
                    bdf: "0000:00:03.0".into(),
                    device_id: 0x1041,
                    skip: Some("in use by kernel driver virtio_net".into())
                },
                Candidate {
                    bdf: "0000:00:04.0".into(),
                    device_id: 0x1046,
                    skip: None
                },
                Candidate {
                    bdf: "0000:00:05.0".into(),
                    device_id: 0x107f,
                    skip: None
                },
            ]
        );
        let dev = SysfsDevice::new(&t.0, "0000:00:04.0");
        assert_eq!(dev.driver().as_deref(), Some("virtio-pci"));
        assert_eq!(dev.ids().unwrap(), (0x1af4, 0x1046));
        // A kernel-owned function is refused before anything is touched.
        let err = PciTransport::attach(&SysfsDevice::new(&t.0, "0000:00:03.0"), false).unwrap_err();
        assert!(
            matches!(err, TransportError::NoDevice(ref m) if m.contains("virtio_net")),
            "{err}"
        );
        let err = PciTransport::attach(&SysfsDevice::new(&t.0, "0000:00:01.0"), false).unwrap_err();
        assert!(matches!(err, TransportError::NoDevice(_)), "{err}");
    }

    /// A configuration space file: Command 0x0406 (memory, master, INTx
    /// masked), pin A, MSI-X capability at 0x40 (control `msix_ctl`).
    fn fake_config(t: &TempDir, msix_ctl: u16, pin: u8) -> File {
        let mut c = vec![0u8; 256];
        c[0..4].copy_from_slice(&[0xf4, 0x1a, 0x46, 0x10]);
        c[4..6].copy_from_slice(&0x0406u16.to_le_bytes());
        c[6] = crate::virtio::PCI_STATUS_CAP_LIST as u8;
        c[0x34] = 0x50;
        c[0x3d] = pin;
        c[0x50..0x52].copy_from_slice(&[0x09, 0x40]); // vendor cap, then MSI-X
        c[0x40..0x42].copy_from_slice(&[PCI_CAP_ID_MSIX, 0]);
        c[0x42..0x44].copy_from_slice(&msix_ctl.to_le_bytes());
        let p = t.0.join(format!("config-{msix_ctl:x}-{pin}"));
        fs::write(&p, &c).unwrap();
        OpenOptions::new().read(true).write(true).open(&p).unwrap()
    }

    fn space(f: &File) -> Vec<u8> {
        let mut v = vec![0u8; 256];
        f.read_exact_at(&mut v, 0).unwrap();
        v
    }

    #[test]
    fn intx_is_usable_only_with_a_pin_and_msix_disabled() {
        let t = TempDir::new("intx");
        let ok = fake_config(&t, 0x0002, 1);
        assert_eq!(find_capability(&space(&ok), PCI_CAP_ID_MSIX), Some(0x40));
        assert_eq!(find_capability(&space(&ok), 0x05), None);
        assert_eq!(intx_unusable(&ok, &space(&ok)).unwrap(), None);
        let msix = fake_config(&t, 0x8002, 1);
        assert_eq!(
            intx_unusable(&msix, &space(&msix)).unwrap().as_deref(),
            Some("MSI-X is enabled")
        );
        let nopin = fake_config(&t, 0x0002, 0);
        assert_eq!(
            intx_unusable(&nopin, &space(&nopin)).unwrap().as_deref(),
            Some("no INTx pin")
        );
        // A looping or truncated capability list ends the walk.
        let mut looped = space(&ok);
        looped[0x41] = 0x50;
        looped[0x40] = 0x10;
        assert_eq!(find_capability(&looped, PCI_CAP_ID_MSIX), None);
        assert_eq!(find_capability(&looped[..0x30], PCI_CAP_ID_MSIX), None);
    }

    #[test]
    fn ack_reads_the_count_then_the_isr_then_unmasks_intx() {
        let t = TempDir::new("ack");
        let config = fake_config(&t, 0, 1);
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 into a live array; both ends are owned below.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        assert_eq!(r, 0);
        // SAFETY: fresh descriptors nobody else owns.
        let (rd, wr) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let isr_mem = Mem::new(16);
        // SAFETY: 16 bytes of test memory standing for the ISR window.
        unsafe { ptr::write_volatile(isr_mem.ptr, crate::virtio::VIRTIO_PCI_ISR_QUEUE) };
        let intx = Intx {
            uio: rd,
            // SAFETY: isr_mem outlives intx.
            isr: Isr::new(unsafe { Mmio::new(isr_mem.ptr, 1) }).unwrap(),
        };
        // An interrupt: the uio count (4 bytes) is readable, INTx masked.
        (&wr).write_all(&7u32.to_ne_bytes()).unwrap();
        assert_eq!(
            intx.ack(&config).unwrap(),
            crate::virtio::VIRTIO_PCI_ISR_QUEUE
        );
        let mut b = [0u8; 4];
        assert_eq!(
            (&intx.uio).read(&mut b).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "count consumed"
        );
        let cmd = u16::from_le_bytes(space(&config)[4..6].try_into().unwrap());
        assert_eq!(cmd, 0x0006, "INTx unmasked, memory and master kept");
        // Nothing pending: still fine, and INTx stays unmasked.
        intx.ack(&config).unwrap();
        assert_eq!(space(&config)[5], 0);
    }

    #[test]
    fn binding_to_uio_pci_generic_and_undoing_it() {
        let t = TempDir::new("uio");
        let devs = t.0.join("devices");
        let bdf = "0000:00:04.0";
        let d = devs.join(bdf);
        fs::create_dir_all(d.join("driver")).unwrap();
        fs::write(d.join("driver/unbind"), "").unwrap();
        fs::write(d.join("driver_override"), "(null)\n").unwrap();
        let drivers = t.0.join("drivers");
        let config = fake_config(&t, 0, 1);
        let mut claim = Claim {
            dev: SysfsDevice::new(&devs, bdf),
            config,
            orig_driver: None,
            orig_command: 0x0406,
            unbound: false,
            uio_bound: false,
            restore: true,
        };
        // Module not loaded: a clear error, nothing written.
        let e = bind_uio(&mut claim, &drivers).unwrap_err();
        assert!(
            e.to_string().contains("uio_pci_generic is not loaded"),
            "{e}"
        );
        assert_eq!(
            fs::read_to_string(d.join("driver_override")).unwrap(),
            "(null)\n"
        );
        fs::create_dir_all(drivers.join(UIO_DRIVER)).unwrap();
        fs::write(drivers.join(UIO_DRIVER).join("bind"), "").unwrap();
        bind_uio(&mut claim, &drivers).unwrap();
        assert!(claim.uio_bound);
        assert_eq!(
            fs::read_to_string(d.join("driver_override")).unwrap(),
            UIO_DRIVER
        );
        assert_eq!(
            fs::read_to_string(drivers.join(UIO_DRIVER).join("bind")).unwrap(),
            bdf
        );
        // Its /dev/uioN.
        fs::create_dir_all(d.join("uio/uio3")).unwrap();
        let dev_dir = t.0.join("dev");
        fs::create_dir_all(&dev_dir).unwrap();
        assert!(open_uio(&claim.dev, &dev_dir).is_err(), "no node yet");
        fs::write(dev_dir.join("uio3"), "").unwrap();
        open_uio(&claim.dev, &dev_dir).unwrap();
        // A rejected device: unbound from uio, override cleared.
        drop(claim);
        assert_eq!(fs::read_to_string(d.join("driver/unbind")).unwrap(), bdf);
        assert_eq!(fs::read_to_string(d.join("driver_override")).unwrap(), "\n");
    }

    #[test]
    fn sysfs_text_parsing() {
        assert_eq!(normalize_bdf("00:04.0"), "0000:00:04.0");
        assert_eq!(normalize_bdf(" 0001:00:04.0\n"), "0001:00:04.0");
        assert_eq!(parse_hex("0x1af4\n"), Some(0x1af4));
        assert_eq!(parse_hex("zz"), None);
        let r = parse_resource_file(
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
             0x00000000fe800000 0x00000000fe800fff 0x0000000000040200\n\
             garbage\n\
             0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
             0x0000008000000000 0x0000008000003fff 0x000000000014220c\n",
        );
        assert_eq!(r.len(), 5);
        assert_eq!(r[1], (0xfe80_0000, 0xfe80_0fff, 0x40200));
        assert_eq!(r[2], (0, 0, 0));
        assert_eq!(r[4].1 - r[4].0 + 1, 0x4000);
        assert_ne!(r[4].2 & IORESOURCE_MEM, 0);
    }

    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use vrnic_virtq::sim::{Device, Mem};

    /// A queue on plain memory whose "guest-physical" addresses are the
    /// virtual ones, so the simulated device can follow them.
    fn plain_queue(size: u16, index: u16) -> (Mem, Mem, Queue, Device) {
        let l = QueueLayout::new(size).unwrap();
        let ring = Mem::new(l.len);
        let notify = Mem::new(16);
        // SAFETY: ring is l.len bytes, 64-aligned, and outlives the queue
        // (returned together, dropped after it).
        let q = unsafe { polled_queue(l, ring.ptr, ring.ptr as u64) }.unwrap();
        // SAFETY: notify is 16 bytes and outlives the notifier.
        let notifier = Notifier::new(unsafe { Mmio::new(notify.ptr, 16) }, index).unwrap();
        let dev = Device::new(l, ring.ptr);
        (
            ring,
            notify,
            Queue {
                q,
                notifier: Kick::Mmio(notifier),
            },
            dev,
        )
    }

    fn plain_buf(m: &Mem, len: usize) -> DmaBuf {
        DmaBuf {
            ptr: m.ptr,
            len,
            gpa: m.ptr as u64,
        }
    }

    fn notified(n: &Mem) -> u16 {
        // SAFETY: 16 bytes of test memory.
        unsafe { ptr::read_volatile(n.ptr as *const u16) }
    }

    /// Stops and joins the simulated device thread before the memory it
    /// uses is freed, also when an assertion fails.
    struct Stop(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
            if let Some(h) = self.1.take() {
                let _ = h.join();
            }
        }
    }

    /// The simulated device of the control queue: answers each command
    /// ([`answer_command`]) until `stop` (or 30 s), except that it holds
    /// the answer to opcode 99 until `release`.
    fn control_device(mut dev: Device, stop: &AtomicBool, release: &AtomicBool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut held: Option<(u16, u32)> = None;
        while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
            if let (Some((h, n)), true) = (held, release.load(Ordering::SeqCst)) {
                dev.complete(h as u32, n);
                held = None;
            }
            let Some((head, chain)) = dev.take() else {
                std::thread::yield_now();
                continue;
            };
            let (opcode, n) = answer_command(&chain);
            if opcode == 99 {
                held = Some((head, n));
            } else {
                dev.complete(head as u32, n);
            }
        }
    }

    /// Checks a command's chain (request, then writable response) and
    /// writes the answer: opcode 77 an error status, 78 a used length
    /// shorter than the header, 79 a used length inconsistent with the
    /// body, any other the request body reversed. Returns the opcode and
    /// the used length.
    fn answer_command(chain: &[vrnic_virtq::sim::D]) -> (u16, u32) {
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[0].flags & crate::virtio::VIRTQ_DESC_F_WRITE, 0);
        assert_ne!(chain[1].flags & crate::virtio::VIRTQ_DESC_F_WRITE, 0);
        let (req, rsp) = (chain[0].addr as *const u8, chain[1].addr as *mut u8);
        // SAFETY: the driver's bounce buffer, addressed by its virtual address.
        let (hdr, body) = unsafe {
            let h = abi::CmdHeader::read_from(std::slice::from_raw_parts(req, 8)).unwrap();
            (
                h,
                std::slice::from_raw_parts(req.add(8), h.len as usize).to_vec(),
            )
        };
        assert_eq!(chain[0].len as usize, 8 + body.len());
        let (status, out, used): (u32, Vec<u8>, Option<u32>) = match hdr.opcode {
            77 => (abi::STATUS_EINVAL, vec![], None),
            78 => (0, vec![], Some(4)),
            79 => (0, vec![1; 100], Some(12)),
            _ => (0, body.iter().rev().copied().collect(), None),
        };
        let rh = abi::RespHeader {
            status,
            len: out.len() as u32,
        };
        // SAFETY: the writable half of the bounce buffer, RESP_LEN bytes.
        unsafe {
            ptr::copy_nonoverlapping(rh.as_bytes().as_ptr(), rsp, 8);
            ptr::copy_nonoverlapping(out.as_ptr(), rsp.add(8), out.len());
        }
        (hdr.opcode, used.unwrap_or(8 + out.len() as u32))
    }

    #[test]
    fn control_commands_through_a_simulated_device() {
        let (_ring, notify, queue, dev) = plain_queue(4, abi::CONTROLQ);
        let bounce = Mem::new(RESP_OFF + RESP_LEN);
        let mut ctrl = ControlQueue {
            queue,
            bounce: plain_buf(&bounce, RESP_OFF + RESP_LEN),
            pending: None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (stop2, release2) = (stop.clone(), release.clone());
        let handle = std::thread::spawn(move || control_device(dev, &stop2, &release2));
        let _stop = Stop(stop, Some(handle));
        let t = Duration::from_secs(10);

        let mut resp = [0u8; 16];
        assert_eq!(
            ctrl.execute(0, abi::CMD_QUERY_PORT, &[1, 2, 3], &mut resp, t)
                .unwrap(),
            3
        );
        assert_eq!(&resp[..3], &[3, 2, 1]);
        assert_eq!(notified(&notify), abi::CONTROLQ);
        // Body truncated to the caller's buffer; empty body.
        let mut small = [0u8; 2];
        assert_eq!(ctrl.execute(0, 5, &[9, 8, 7, 6], &mut small, t).unwrap(), 2);
        assert_eq!(small, [6, 7]);
        assert_eq!(
            ctrl.execute(0, abi::CMD_QUERY_DEVICE, &[], &mut resp, t)
                .unwrap(),
            0
        );
        // Largest body.
        let big: Vec<u8> = (0..abi::MAX_CMD_BODY as u8).collect();
        let mut out = [0u8; abi::MAX_CMD_BODY];
        assert_eq!(
            ctrl.execute(0, 6, &big, &mut out, t).unwrap(),
            abi::MAX_CMD_BODY
        );
        assert_eq!(out[0], abi::MAX_CMD_BODY as u8 - 1);
        assert!(matches!(
            ctrl.execute(0, 6, &[0; abi::MAX_CMD_BODY + 1], &mut out, t),
            Err(TransportError::Io { .. })
        ));
        // Error status, short and inconsistent responses.
        assert!(matches!(
            ctrl.execute(0, 77, &[], &mut resp, t),
            Err(TransportError::Status {
                opcode: 77,
                status: 22
            })
        ));
        assert!(matches!(
            ctrl.execute(0, 78, &[], &mut resp, t),
            Err(TransportError::Io { .. })
        ));
        assert!(matches!(
            ctrl.execute(0, 79, &[], &mut resp, t),
            Err(TransportError::Io { .. })
        ));
        // Timeout, then recovery once the device answers the stale command.
        assert!(matches!(
            ctrl.execute(0, 99, &[], &mut resp, Duration::from_millis(50)),
            Err(TransportError::Timeout(50))
        ));
        assert!(ctrl.pending.is_some());
        // While the device still holds it (a dead host daemon), a later
        // command fails within the grace, not after its own timeout.
        let t0 = Instant::now();
        assert!(matches!(
            ctrl.execute(0, 1, &[4, 5], &mut resp, t),
            Err(TransportError::Timeout(ms)) if ms == STALE_COMMAND_GRACE.as_millis() as u64
        ));
        assert!(
            t0.elapsed() < t / 2,
            "failed after {:?}, not within the grace",
            t0.elapsed()
        );
        assert!(ctrl.pending.is_some());
        release.store(true, Ordering::SeqCst);
        assert_eq!(ctrl.execute(0, 1, &[4, 5], &mut resp, t).unwrap(), 2);
        assert_eq!(&resp[..2], &[5, 4]);
        assert!(ctrl.pending.is_none());
        // Many commands: the ring wraps.
        for i in 0..50u8 {
            assert_eq!(ctrl.execute(0, 2, &[i, 1], &mut resp, t).unwrap(), 2);
            assert_eq!(&resp[..2], &[1, i]);
        }
        assert_eq!(ctrl.queue.q.num_free(), 4);
    }

    #[test]
    fn doorbells_are_posted_reclaimed_and_bounded_when_full() {
        let (_ring, notify, queue, mut dev) = plain_queue(4, abi::DOORBELLQ);
        let slots = Mem::new(4 * SLOT);
        let mut db = SlotQueue {
            queue,
            slots: plain_buf(&slots, 4 * SLOT),
        };
        let mut seen = Vec::new();
        let drain = |dev: &mut Device, seen: &mut Vec<u32>| {
            while let Some((h, chain)) = dev.take() {
                assert_eq!(chain.len(), 1);
                assert_eq!(chain[0].len as usize, SLOT);
                assert_eq!(chain[0].flags, 0, "device-readable, no chain");
                // SAFETY: a 16-byte doorbell slot.
                let d = abi::Doorbell::read_from(unsafe {
                    std::slice::from_raw_parts(chain[0].addr as *const u8, SLOT)
                })
                .unwrap();
                assert_eq!((d.kind, d.handle), (abi::DB_SQ, 7));
                seen.push(d.index);
                dev.complete(h as u32, 0);
            }
        };
        let t = Duration::from_secs(5);
        for i in 0..1000u32 {
            let d = abi::Doorbell {
                kind: abi::DB_SQ,
                handle: 7,
                index: i,
                ..Default::default()
            };
            db.ring(&d, t).unwrap();
            assert_eq!(notified(&notify), abi::DOORBELLQ);
            if i % 3 == 2 {
                drain(&mut dev, &mut seen);
            }
        }
        drain(&mut dev, &mut seen);
        assert_eq!(seen, (0..1000).collect::<Vec<_>>());
        // A device that stops consuming: four fit, the fifth times out.
        let d = abi::Doorbell {
            kind: abi::DB_RQ,
            handle: 1,
            index: 1,
            ..Default::default()
        };
        for _ in 0..4 {
            db.ring(&d, t).unwrap();
        }
        assert!(matches!(
            db.ring(&d, Duration::from_millis(20)),
            Err(TransportError::Timeout(20))
        ));
    }

    #[test]
    fn events_are_popped_in_order_and_buffers_reposted() {
        let (_ring, notify, queue, mut dev) = plain_queue(4, abi::EVENTQ);
        let slots = Mem::new(4 * SLOT);
        let mut evq = SlotQueue {
            queue,
            slots: plain_buf(&slots, 4 * SLOT),
        };
        evq.prefill().unwrap();
        assert_eq!(evq.queue.q.num_free(), 0);
        assert!(evq.pop_event().is_none());
        let mut next = 0u32;
        let mut got = Vec::new();
        for round in 0..40 {
            // The device fills up to 3 buffers; one in 7 events is short.
            for _ in 0..3 {
                let Some((h, chain)) = dev.take() else { break };
                assert_eq!(chain.len(), 1);
                assert_ne!(chain[0].flags & crate::virtio::VIRTQ_DESC_F_WRITE, 0);
                let e = abi::Event {
                    kind: abi::EV_COMP,
                    handle: next,
                    ..Default::default()
                };
                // SAFETY: a 16-byte event slot.
                unsafe {
                    ptr::copy_nonoverlapping(e.as_bytes().as_ptr(), chain[0].addr as *mut u8, SLOT)
                };
                let short = next % 7 == 3;
                dev.complete(h as u32, if short { 8 } else { SLOT as u32 });
                next += 1;
            }
            while let Some(e) = evq.pop_event() {
                assert_eq!(e.kind, abi::EV_COMP);
                got.push(e.handle);
            }
            assert_eq!(
                evq.queue.q.num_free(),
                0,
                "round {round}: every buffer reposted"
            );
        }
        assert_eq!(notified(&notify), abi::EVENTQ);
        let want: Vec<u32> = (0..next).filter(|n| n % 7 != 3).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn queue_sizes_fit_the_allocator() {
        assert_eq!(pick_queue_size(0, 1 << 21), 0);
        assert_eq!(pick_queue_size(1024, 1 << 21), 256);
        assert_eq!(pick_queue_size(256, 1 << 21), 256);
        assert_eq!(pick_queue_size(100, 1 << 21), 64);
        // 4 KiB fallback: 128 descriptors need 3342 bytes, 256 need 6662.
        assert_eq!(pick_queue_size(256, 4096), 128);
        assert_eq!(pick_queue_size(1, 4096), 1);
    }
}
