//! The modes of the sockets a daemon listens on, under a permissive umask
//! (issue 27, finding 7): the control and stats sockets are their owner's
//! only (0600) from the moment their paths exist; the vhost-user socket's
//! mode is the umask's (`vrnic_vhost::server::bind`).
//!
//! A test binary of its own because it sets the process's umask to 0: the
//! other tests' files must not be created under it. It holds one test, so
//! nothing else runs while the umask is 0.
//!
//! "From the moment the path exists" is seen with inotify on the directory:
//! a mode set after the path appeared (a `chmod` after `bind`) shows as an
//! `IN_ATTRIB` event for the name. No such event and the right mode after
//! the server started mean the path never had another mode.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vrnic::link::MemLink;
use vrnic_vhost::addr::Ipv4Prefix;
use vrnic_vhost::control::{self, ControlServer, Request};
use vrnic_vhost::functions::{FunctionSpec, Functions, FunctionsConfig};
use vrnic_vhost::stats;

/// An inotify instance watching one directory for names created, moved in
/// and changed in their attributes.
struct Watch(std::os::fd::OwnedFd);

impl Watch {
    fn new(dir: &Path) -> Self {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1: {}", io::Error::last_os_error());
        // SAFETY: `fd` is a new descriptor this owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mask = libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ATTRIB;
        use std::os::fd::AsRawFd;
        // SAFETY: `c` is a NUL-terminated path; `fd` is an inotify fd.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), mask) };
        assert!(wd >= 0, "inotify_add_watch: {}", io::Error::last_os_error());
        Self(fd)
    }

    /// The events queued so far, by name: each name's event masks in
    /// order. The kernel queues an event within the syscall that causes
    /// it, so after a server's `start` returned its events are all here.
    fn events(&self) -> BTreeMap<String, Vec<u32>> {
        use std::os::fd::AsRawFd;
        let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is writable for its length.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "inotify read: {e}");
                return out;
            }
            let mut at = 0;
            let head = std::mem::size_of::<libc::inotify_event>();
            while at + head <= n as usize {
                // SAFETY: the kernel wrote a whole event at `at`; read it
                // unaligned.
                let ev: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                let name = &buf[at + head..at + head + ev.len as usize];
                let name = name.split(|&b| b == 0).next().unwrap_or_default();
                out.entry(String::from_utf8_lossy(name).into_owned())
                    .or_default()
                    .push(ev.mask);
                at += head + ev.len as usize;
            }
        }
    }
}

/// `p`'s mode, in octal.
fn mode(p: &Path) -> String {
    let m = std::fs::symlink_metadata(p).unwrap().permissions().mode();
    format!("{:o}", m & 0o7777)
}

#[test]
fn sockets_have_their_modes_from_the_start_under_umask_0() {
    // SAFETY: umask cannot fail; this binary's only test sets it.
    unsafe { libc::umask(0) };
    let dir = tempfile::tempdir().unwrap();
    let watch = Watch::new(dir.path());

    let (uplink, _outside) = MemLink::pair();
    let fns = Arc::new(Functions::new(Box::new(uplink), FunctionsConfig::default()));
    let ctl = dir.path().join("ctl");
    let _control = ControlServer::start(&ctl, fns.clone()).unwrap();
    let sock = dir.path().join("f.sock");
    let spec = FunctionSpec::new(
        sock.clone(),
        Ipv4Prefix {
            addr: "10.0.0.2".parse().unwrap(),
            len: 24,
        },
    );
    fns.add(&spec).unwrap();
    let st = stats::default_socket(&sock);

    let events = watch.events();
    // control::MODE and stats::MODE: literal, so that this also builds
    // (and fails) on code from before they existed.
    for (path, what) in [(&ctl, "control"), (&st, "stats")] {
        let name = path.file_name().unwrap().to_str().unwrap();
        let evs = events.get(name).map(Vec::as_slice).unwrap_or_default();
        assert!(!evs.is_empty(), "the {what} socket appeared: {events:?}");
        assert!(
            evs.iter().all(|m| m & libc::IN_ATTRIB == 0),
            "the {what} socket's mode changed after it appeared: {evs:x?}"
        );
        assert_eq!(mode(path), "600", "the {what} socket's mode");
    }
    // The vhost-user socket's mode is the umask's (0 here).
    assert_eq!(mode(&sock), "777", "the vhost-user socket's mode");
    // No private directory is left behind.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["ctl", "f.sock", "f.sock.stats"]);

    // A pcap file records a guest's traffic: the owner's only, also when
    // it was there before with a wider mode.
    let pcap = dir.path().join("g.pcap");
    std::fs::write(&pcap, b"old").unwrap();
    std::fs::set_permissions(&pcap, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut spec2 = FunctionSpec::new(
        dir.path().join("g.sock"),
        Ipv4Prefix {
            addr: "10.0.0.3".parse().unwrap(),
            len: 24,
        },
    );
    spec2.pcap = Some(pcap.clone());
    fns.add(&spec2).unwrap();
    assert_eq!(mode(&pcap), "600", "the pcap file's mode");
    let fresh = dir.path().join("h.pcap");
    let mut spec3 = FunctionSpec::new(
        dir.path().join("h.sock"),
        Ipv4Prefix {
            addr: "10.0.0.4".parse().unwrap(),
            len: 24,
        },
    );
    spec3.pcap = Some(fresh.clone());
    fns.add(&spec3).unwrap();
    assert_eq!(mode(&fresh), "600", "a new pcap file's mode");

    // Both answer.
    let t = Duration::from_secs(10);
    assert_eq!(control::request(&ctl, &Request::List, t).unwrap().len(), 4);
    assert!(stats::query(&st, t).is_ok());
    fns.shutdown();
}
