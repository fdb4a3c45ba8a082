//! A vrnic backend served on a temporary socket by a thread of the test
//! process, with a bounded shutdown, and optionally its stats server.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use vrnic::device::{Device, DeviceConfig};
use vrnic::link::Link;

use vrnic_vhost::addr::Mac;
use vrnic_vhost::backend::{BackendConfig, VrnicBackend};
use vrnic_vhost::server::{self, ServeError, Stopper};
use vrnic_vhost::stats::{self, StatsServer};

use crate::{FrontendError, FrontendOptions, TestFrontend};

/// A device configuration for tests: 10.0.0.1/24, MAC 02:76:0a:00:00:01,
/// MTU 1500.
pub fn test_device_config() -> DeviceConfig {
    let ip = Ipv4Addr::new(10, 0, 0, 1);
    DeviceConfig {
        mac: Mac::from_ipv4(ip).0,
        ipv4: ip,
        prefix_len: 24,
        ipv6: Vec::new(),
        link_mtu: 1500,
    }
}

/// An Ethernet frame with an ARP request for [`test_device_config`]'s
/// address 10.0.0.1, broadcast from 10.0.0.2 at MAC 02:00:00:00:00:02,
/// padded to 60 bytes.
pub fn arp_request_frame() -> Vec<u8> {
    let peer_mac = [0x02, 0x00, 0x00, 0x00, 0x00, 0x02];
    let mut f = Vec::new();
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&peer_mac);
    f.extend_from_slice(&[0x08, 0x06]);
    f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&peer_mac);
    f.extend_from_slice(&[10, 0, 0, 2]);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&[10, 0, 0, 1]);
    f.resize(60, 0);
    f
}

/// A backend serving frontends on a socket in a fresh temporary directory,
/// in a thread. Dropping it stops the thread (bounded) and removes the
/// directory.
pub struct TestDaemon {
    socket: PathBuf,
    dir: PathBuf,
    stopper: Stopper,
    done: Option<mpsc::Receiver<Result<VrnicBackend, ServeError>>>,
    thread: Option<thread::JoinHandle<()>>,
    stats: Option<StatsServer>,
}

impl TestDaemon {
    /// Serves `backend`: one connection with `once`, else connections one
    /// after another until stopped. The socket is bound before this
    /// returns, so a frontend can connect at once.
    ///
    /// # Errors
    /// [`FrontendError::Setup`] or [`FrontendError::Daemon`].
    pub fn start(backend: VrnicBackend, once: bool) -> Result<Self, FrontendError> {
        Self::start_inner(backend, once, false)
    }

    /// [`TestDaemon::start`], also serving the backend's counters on
    /// [`TestDaemon::stats_socket`] (`<socket>.stats`), as `vrnic` does.
    ///
    /// # Errors
    /// As [`TestDaemon::start`].
    pub fn start_with_stats(backend: VrnicBackend, once: bool) -> Result<Self, FrontendError> {
        Self::start_inner(backend, once, true)
    }

    fn start_inner(
        backend: VrnicBackend,
        once: bool,
        with_stats: bool,
    ) -> Result<Self, FrontendError> {
        let dir = temp_dir()?;
        let socket = dir.join("vrnic.sock");
        let stats = if with_stats {
            let path = stats::default_socket(&socket);
            match StatsServer::start(&path, backend.stats_board()) {
                Ok(s) => Some(s),
                Err(e) => {
                    let _ = fs::remove_dir_all(&dir);
                    return Err(FrontendError::Setup(e.to_string()));
                }
            }
        } else {
            None
        };
        let mut listener = match server::bind(&socket) {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(FrontendError::Daemon(e.to_string()));
            }
        };
        let stopper = Stopper::new().map_err(|e| FrontendError::Setup(format!("stopper: {e}")))?;
        let (tx, rx) = mpsc::channel();
        let s = stopper.clone();
        let thread = thread::Builder::new()
            .name("vrnic-test-daemon".into())
            .spawn(move || {
                let r = server::run(&mut listener, backend, &s, once);
                let _ = tx.send(r);
            })
            .map_err(|e| FrontendError::Setup(format!("spawn: {e}")))?;
        Ok(Self {
            socket,
            dir,
            stopper,
            done: Some(rx),
            thread: Some(thread),
            stats,
        })
    }

    /// [`TestDaemon::start`] with a new device of configuration `cfg` on
    /// `link`, default backend settings, serving connections until stopped.
    ///
    /// # Errors
    /// As [`TestDaemon::start`].
    pub fn with_device(cfg: DeviceConfig, link: Box<dyn Link>) -> Result<Self, FrontendError> {
        let backend = VrnicBackend::new(Device::new(cfg), link, BackendConfig::default())
            .map_err(|e| FrontendError::Setup(e.to_string()))?;
        Self::start(backend, false)
    }

    /// [`TestDaemon::start`] with a new device of [`test_device_config`] on
    /// `link` and the backend settings `backend`.
    ///
    /// # Errors
    /// [`FrontendError::Setup`] when the backend refuses `backend`; as
    /// [`TestDaemon::start`].
    pub fn with_backend_config(
        link: Box<dyn Link>,
        backend: BackendConfig,
        once: bool,
    ) -> Result<Self, FrontendError> {
        let backend = VrnicBackend::new(Device::new(test_device_config()), link, backend)
            .map_err(|e| FrontendError::Setup(e.to_string()))?;
        Self::start(backend, once)
    }

    /// [`TestDaemon::with_device`] with the stats server
    /// ([`TestDaemon::start_with_stats`]).
    ///
    /// # Errors
    /// As [`TestDaemon::start`].
    pub fn with_device_and_stats(
        cfg: DeviceConfig,
        link: Box<dyn Link>,
    ) -> Result<Self, FrontendError> {
        let backend = VrnicBackend::new(Device::new(cfg), link, BackendConfig::default())
            .map_err(|e| FrontendError::Setup(e.to_string()))?;
        Self::start_with_stats(backend, false)
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The stats server's socket, if it was started with one.
    pub fn stats_socket(&self) -> Option<&Path> {
        self.stats.as_ref().map(StatsServer::path)
    }

    /// Connects a [`TestFrontend`] and starts the device.
    ///
    /// # Errors
    /// As [`TestFrontend::connect`].
    pub fn connect(&self, opts: &FrontendOptions) -> Result<TestFrontend, FrontendError> {
        TestFrontend::connect(&self.socket, opts)
    }

    /// Waits up to `timeout` for the server to finish by itself (with
    /// `once`, after the frontend disconnected) and gives the backend back.
    ///
    /// # Errors
    /// [`FrontendError::Daemon`] when the server failed or did not finish.
    pub fn finish(mut self, timeout: Duration) -> Result<VrnicBackend, FrontendError> {
        self.collect(timeout)
    }

    /// Stops the server, waits up to `timeout` for it and gives the backend
    /// back.
    ///
    /// # Errors
    /// As [`TestDaemon::finish`].
    pub fn stop(mut self, timeout: Duration) -> Result<VrnicBackend, FrontendError> {
        self.stopper.stop();
        self.collect(timeout)
    }

    fn collect(&mut self, timeout: Duration) -> Result<VrnicBackend, FrontendError> {
        let rx = self
            .done
            .take()
            .ok_or_else(|| FrontendError::Daemon("already collected".into()))?;
        let r = rx.recv_timeout(timeout).map_err(|e| {
            FrontendError::Daemon(format!("server did not finish within {timeout:?}: {e}"))
        })?;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        r.map_err(|e| FrontendError::Daemon(e.to_string()))
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stopper.stop();
        if let Some(rx) = self.done.take() {
            if rx.recv_timeout(Duration::from_secs(10)).is_ok() {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            }
        }
        // Stops the stats thread and removes its socket.
        self.stats.take();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn temp_dir() -> Result<PathBuf, FrontendError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    for _ in 0..100 {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = base.join(format!("vrnic-vhost-{}-{n}", std::process::id()));
        match fs::create_dir(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(FrontendError::Setup(format!(
                    "temp dir {}: {e}",
                    p.display()
                )))
            }
        }
    }
    Err(FrontendError::Setup("no free temp dir name".into()))
}
