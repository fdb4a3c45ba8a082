//! The RNIC device model: executes the device ABI ([`crate::abi`]) against
//! driver memory and the wire. Transport-agnostic: the vhost-user backend,
//! the in-process test harnesses and (later) the embedded switch all drive
//! a [`Device`] through these entry points.
//!
//! The device is single-threaded: its owner calls [`Device::control`],
//! [`Device::doorbell`], [`Device::receive`] and [`Device::poll`], then drains
//! [`Device::pop_tx`] to the link and [`Device::pop_event`] to the event queue.
//! Time is passed in by the caller as nanoseconds on a monotonic clock, so
//! tests can run on a simulated clock.

use std::net::Ipv4Addr;

use crate::abi;
use crate::mem::DmaMemory;

/// Static configuration of one device (one port).
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The port's MAC address.
    pub mac: [u8; 6],
    /// The port's IPv4 address; its IPv4-mapped GID is GID index 1.
    pub ipv4: Ipv4Addr,
    /// IPv4 prefix length (for ARP: on-link destinations only).
    pub prefix_len: u8,
    /// Link MTU, bytes (IP packet size; 1500 gives path MTU 1024).
    pub link_mtu: u32,
}

/// Monotonic time in nanoseconds.
pub type Nanos = u64;

/// Per-device counters (see `vrnic stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Frames handed to the link.
    pub tx_frames: u64,
    /// Frames received from the link.
    pub rx_frames: u64,
    /// Frames dropped: not RoCEv2/ARP for us, malformed, or bad ICRC.
    pub rx_dropped: u64,
    /// Frames dropped for a bad ICRC.
    pub icrc_errors: u64,
    /// Control commands rejected with an error status.
    pub cmd_errors: u64,
}

/// One RNIC port: verbs objects, RoCEv2 transport and ARP.
pub struct Device {
    cfg: DeviceConfig,
    tx: std::collections::VecDeque<Vec<u8>>,
    events: std::collections::VecDeque<abi::Event>,
    stats: DeviceStats,
}

impl Device {
    /// A device with no objects.
    pub fn new(cfg: DeviceConfig) -> Self {
        Self { cfg, tx: Default::default(), events: Default::default(), stats: Default::default() }
    }

    /// The configuration space the driver reads ([`abi::ConfigSpace`]).
    pub fn config_space(&self) -> abi::ConfigSpace {
        abi::ConfigSpace {
            signature: abi::SIGNATURE,
            abi_version: abi::ABI_VERSION,
            num_queues: abi::NUM_QUEUES as u16,
            phys_port_cnt: 1,
            active_mtu: abi::mtu_enum(self.cfg.link_mtu.saturating_sub(58)).unwrap_or(1) as u8,
            mac: self.cfg.mac,
            ..Default::default()
        }
    }

    /// Executes one control command. `req` holds an [`abi::CmdHeader`] and
    /// its body; the response ([`abi::RespHeader`] and body) is written to
    /// `resp`. Returns the number of response bytes written (at least 8 when
    /// `resp` can hold a header; 0 when it cannot). Errors are statuses in the
    /// response, never panics.
    pub fn control(&mut self, _mem: &dyn DmaMemory, _req: &[u8], resp: &mut [u8]) -> usize {
        use abi::Pod;
        let h = abi::RespHeader { status: abi::STATUS_ENOSYS, len: 0 };
        self.stats.cmd_errors += 1;
        match resp.get_mut(..8) {
            Some(r) => {
                r.copy_from_slice(h.as_bytes());
                8
            }
            None => 0,
        }
    }

    /// Handles one doorbell from the doorbell queue.
    pub fn doorbell(&mut self, _mem: &dyn DmaMemory, _db: &abi::Doorbell, _now: Nanos) {}

    /// Handles one frame received from the link.
    pub fn receive(&mut self, _mem: &dyn DmaMemory, _frame: &[u8], _now: Nanos) {
        self.stats.rx_frames += 1;
    }

    /// Runs timers due at `now` (retransmission, RNR) and pending send work.
    /// Returns when it next needs to be polled, if ever.
    pub fn poll(&mut self, _mem: &dyn DmaMemory, _now: Nanos) -> Option<Nanos> {
        None
    }

    /// Next frame to hand to the link.
    pub fn pop_tx(&mut self) -> Option<Vec<u8>> {
        self.tx.pop_front()
    }

    /// Next asynchronous event for the event queue.
    pub fn pop_event(&mut self) -> Option<abi::Event> {
        self.events.pop_front()
    }

    /// Device reset (virtio 1.2 §2.4): destroys every object.
    pub fn reset(&mut self) {
        let cfg = self.cfg.clone();
        *self = Self::new(cfg);
    }

    /// Counters.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }
}
