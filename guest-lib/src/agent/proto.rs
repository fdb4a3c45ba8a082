//! The agent's socket protocol: one message per `SOCK_SEQPACKET` packet,
//! a tag byte first, integers little-endian; descriptors travel as
//! `SCM_RIGHTS` (unix(7)).
//!
//! | tag | direction | body |
//! |---|---|---|
//! | [`MSG_HELLO`] | program → agent | `version: u32`, `pin_fd: i32` (the program's [`super::pin::Pins`] descriptor, taken by the agent with `pidfd_getfd(2)`; -1: none); descriptor: the event socket |
//! | [`MSG_WELCOME`] | agent → program | [`Welcome`] |
//! | [`MSG_CMD`] | program → agent | `opcode: u16`, command body (at most `abi::MAX_CMD_BODY` bytes) |
//! | [`MSG_RESP`] | agent → program | `status: u32`, response body |
//! | [`MSG_DB`] | program → agent | an `abi::Doorbell` (its `ctx` is overwritten) |
//! | [`MSG_EVENT`] | agent → program, on the event socket | an `abi::Event` |
//! | [`MSG_STATUS`] | anyone → agent, instead of a hello | none |
//! | [`MSG_STATUS`] | agent → asker | [`Status`] |
//! | [`MSG_MEMORY`] | program → agent, after a [`MODE_FILE`] welcome | `len: u64`; descriptor: the program's memory file |
//! | [`MSG_MEMORY`] | agent → program | `status: u32` (0 or an errno), `base: u64` (the device address of the file's first byte) |

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use vrnic_abi::{self as abi, Pod};

/// Protocol version in [`MSG_HELLO`].
pub const VERSION: u32 = 1;
/// First message of a program: protocol version and descriptors.
pub const MSG_HELLO: u8 = 1;
/// The agent's answer to [`MSG_HELLO`].
pub const MSG_WELCOME: u8 = 2;
/// A control command for the program's context.
pub const MSG_CMD: u8 = 3;
/// The answer to [`MSG_CMD`].
pub const MSG_RESP: u8 = 4;
/// A doorbell for the program's context (no answer).
pub const MSG_DB: u8 = 5;
/// A device event for the program's context.
pub const MSG_EVENT: u8 = 6;

/// A status query (`vrnic-agent --status`) and its answer.
pub const MSG_STATUS: u8 = 7;
/// A program's memory file ([`MODE_FILE`]) and the agent's answer: where
/// the device reaches it.
pub const MSG_MEMORY: u8 = 8;

/// The agent's answer to [`MSG_STATUS`]: 40 bytes after the tag.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Status {
    /// Programs connected (each with a context).
    pub programs: u32,
    /// Programs whose page pins the agent holds ([`super::pin`]).
    pub pinned: u32,
    /// The device's objects, all contexts together (`CMD_QUERY_USAGE`).
    pub usage: abi::Usage,
}

impl Status {
    /// Encodes the message, tag included.
    pub fn encode(&self) -> Vec<u8> {
        let mut m = vec![MSG_STATUS];
        m.extend_from_slice(&self.programs.to_le_bytes());
        m.extend_from_slice(&self.pinned.to_le_bytes());
        m.extend_from_slice(self.usage.as_bytes());
        m
    }

    /// Decodes a message; `None` when it is not a whole [`MSG_STATUS`].
    pub fn decode(m: &[u8]) -> Option<Status> {
        if m.first() != Some(&MSG_STATUS) {
            return None;
        }
        Some(Status {
            programs: u32::from_le_bytes(m.get(1..5)?.try_into().ok()?),
            pinned: u32::from_le_bytes(m.get(5..9)?.try_into().ok()?),
            usage: abi::Usage::read_from(m.get(9..)?)?,
        })
    }
}

/// Device addresses are guest-physical (a VM).
pub const MODE_PHYS: u8 = 0;
/// Device addresses are `ctx << 48 | virtual address` in the program
/// (an agent over an in-process device; [`super::procmem`]).
pub const MODE_PROCESS: u8 = 1;
/// Device addresses are offsets in memory files shared with the device
/// (an agent over a daemon's vhost-user socket: a container): each
/// program shares its own file ([`MSG_MEMORY`]) and the agent adds it to
/// the daemon's memory table.
pub const MODE_FILE: u8 = 2;
/// Bit position of the context in a [`MODE_PROCESS`] device address.
pub const PROCESS_CTX_SHIFT: u32 = 48;

/// Largest message, bytes.
pub const MAX_MSG: usize = 512;

/// The agent's shared doorbell queue, as a program maps it
/// ([`crate::dbring`]); the memfd travels with the [`MSG_WELCOME`] (and,
/// over vhost-user, the kick eventfd after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedDb {
    /// Where the ring's parts lie from its first byte.
    pub layout: crate::dbring::DbRingLayout,
    /// How the device is notified, and where the ring lies.
    pub notify: DbNotify,
}

/// How a program notifies the device of a shared doorbell queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbNotify {
    /// A virtio-pci function (a VM): the ring is at the memfd's start; the
    /// queue's notification register is mapped from a BAR's resource file.
    Register {
        /// The resource file of the BAR with the register.
        file: std::path::PathBuf,
        /// The register's offset in it, bytes.
        offset: u64,
    },
    /// A daemon's function over vhost-user: the ring lies at
    /// `region_offset` (a page multiple) of the agent's memory file, and the
    /// queue's kick eventfd is the second descriptor.
    EventFd {
        /// The ring's first byte in the memfd.
        region_offset: u64,
    },
}

/// The agent's [`MSG_WELCOME`]: 73 bytes after the tag, then the shared
/// doorbell queue if any (its memfd attached).
#[derive(Debug, Clone)]
pub struct Welcome {
    /// 0, or the errno why the program is refused.
    pub status: u32,
    /// The program's device context.
    pub ctx: u16,
    /// [`MODE_PHYS`], [`MODE_PROCESS`] or [`MODE_FILE`].
    pub mode: u8,
    /// The device's configuration space.
    pub config: abi::ConfigSpace,
    /// The doorbell queue the program posts to itself ([`MODE_PHYS`]);
    /// `None`: doorbells go to the agent ([`MSG_DB`]).
    pub db: Option<SharedDb>,
}

impl Welcome {
    /// Encodes the message, tag included.
    pub fn encode(&self) -> Vec<u8> {
        let mut m = vec![MSG_WELCOME];
        m.extend_from_slice(&self.status.to_le_bytes());
        m.extend_from_slice(&self.ctx.to_le_bytes());
        m.push(self.mode);
        m.push(0);
        m.extend_from_slice(self.config.as_bytes());
        match &self.db {
            None => m.push(0),
            Some(d) => match &d.notify {
                DbNotify::Register { file, offset } => {
                    use std::os::unix::ffi::OsStrExt;
                    m.push(1);
                    m.extend_from_slice(&d.layout.encode());
                    m.extend_from_slice(&offset.to_le_bytes());
                    m.extend_from_slice(file.as_os_str().as_bytes());
                }
                DbNotify::EventFd { region_offset } => {
                    m.push(2);
                    m.extend_from_slice(&d.layout.encode());
                    m.extend_from_slice(&region_offset.to_le_bytes());
                }
            },
        }
        m
    }

    /// Decodes a message; `None` when it is not a whole [`MSG_WELCOME`].
    pub fn decode(m: &[u8]) -> Option<Welcome> {
        if m.first() != Some(&MSG_WELCOME) || m.len() < 9 + size_of::<abi::ConfigSpace>() {
            return None;
        }
        let rest = &m[9 + size_of::<abi::ConfigSpace>()..];
        let db = match rest.first() {
            None | Some(0) => None,
            Some(&kind) => {
                use std::os::unix::ffi::OsStrExt;
                let layout = crate::dbring::DbRingLayout::decode(rest.get(1..29)?)?;
                let offset = u64::from_le_bytes(rest.get(29..37)?.try_into().ok()?);
                let notify = match kind {
                    1 => DbNotify::Register {
                        file: std::ffi::OsStr::from_bytes(rest.get(37..)?).into(),
                        offset,
                    },
                    2 if rest.len() == 37 => DbNotify::EventFd {
                        region_offset: offset,
                    },
                    _ => return None,
                };
                Some(SharedDb { layout, notify })
            }
        };
        Some(Welcome {
            status: u32::from_le_bytes(m[1..5].try_into().ok()?),
            ctx: u16::from_le_bytes(m[5..7].try_into().ok()?),
            mode: m[7],
            config: abi::ConfigSpace::read_from(&m[9..])?,
            db,
        })
    }
}

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A connected pair of `SOCK_SEQPACKET` sockets (close-on-exec).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into the array on success.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(last_err("socketpair"));
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all zeroes is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.len() >= a.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path too long: {}", path.display()),
        ));
    }
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Ok((a, size_of::<libc::sockaddr_un>() as libc::socklen_t))
}

fn socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_err("socket"));
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects to the agent socket at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let s = socket()?;
    let (a, len) = sockaddr(path)?;
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    let r = unsafe { libc::connect(s.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        return Err(last_err(&format!("connecting to {}", path.display())));
    }
    Ok(s)
}

/// A listening socket at `path` (mode 0600: the programs run as root).
pub fn listen(path: &Path) -> io::Result<OwnedFd> {
    let s = socket()?;
    let (a, len) = sockaddr(path)?;
    // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
    let r = unsafe { libc::bind(s.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    if r != 0 {
        return Err(last_err(&format!("binding {}", path.display())));
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    // SAFETY: plain syscall on our socket.
    if unsafe { libc::listen(s.as_raw_fd(), 64) } != 0 {
        return Err(last_err("listen"));
    }
    Ok(s)
}

/// Accepts one connection (non-blocking listener: `Ok(None)` when none waits).
pub fn accept(listener: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: accept4 with null address pointers is allowed.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted {
            return Ok(None);
        }
        return Err(e);
    }
    // SAFETY: fresh descriptor.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on our descriptor.
    let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if fl < 0 || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(last_err("fcntl"));
    }
    Ok(())
}

/// Largest number of descriptors in one message.
const MAX_FDS: usize = 4;

/// Sends one message with `fds` attached (`SCM_RIGHTS`). `flags`:
/// `send(2)` flags, e.g. `MSG_DONTWAIT`. `MSG_NOSIGNAL` is always added.
pub fn send(fd: RawFd, msg: &[u8], fds: &[RawFd], flags: i32) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    // Control buffer for up to MAX_FDS descriptors, aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds);
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = space;
        // SAFETY: the control buffer holds `space` bytes (<= 64), so the
        // first header and its data fit.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: mh points at live buffers for the call's duration.
        let n = unsafe { libc::sendmsg(fd, &mh, flags | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message into `buf`; returns its length (0: the peer
/// closed) and the descriptors attached. `flags`: `recv(2)` flags.
pub fn recv(fd: RawFd, buf: &mut [u8], flags: i32) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: mh points at live buffers for the call's duration.
        let n = unsafe { libc::recvmsg(fd, &mut mh, flags | libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf,
    // within msg_controllen; each SCM_RIGHTS payload is an array of fresh
    // descriptors now owned by this process.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let len = (*c).cmsg_len - libc::CMSG_LEN(0) as usize;
                for i in 0..len / size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    Ok((n, fds))
}

/// Waits until `fd` is readable, at most `timeout`. `Ok(false)` on timeout.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(r > 0)
}

/// The peer process of a connected Unix socket (`SO_PEERCRED`).
pub fn peer_pid(fd: &OwnedFd) -> io::Result<i32> {
    // SAFETY: ucred is plain data.
    let mut c: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `c`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(last_err("SO_PEERCRED"));
    }
    Ok(c.pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welcome_round_trips_and_short_messages_are_refused() {
        let w = Welcome {
            status: 0,
            ctx: 7,
            mode: MODE_PROCESS,
            config: abi::ConfigSpace {
                abi_version: abi::ABI_VERSION,
                ..Default::default()
            },
            db: None,
        };
        let m = w.encode();
        let d = Welcome::decode(&m).unwrap();
        assert_eq!((d.ctx, d.mode, d.config), (7, MODE_PROCESS, w.config));
        assert!(d.db.is_none());
        assert!(Welcome::decode(&m[..m.len() - 2]).is_none());
        let db = SharedDb {
            layout: crate::dbring::DbRingLayout::new(256).unwrap(),
            notify: DbNotify::Register {
                file: "/sys/bus/pci/devices/0000:00:04.0/resource4".into(),
                offset: 0x3004,
            },
        };
        let w2 = Welcome {
            db: Some(db.clone()),
            ..w
        };
        assert_eq!(Welcome::decode(&w2.encode()).unwrap().db, Some(db));
        let vu = SharedDb {
            layout: crate::dbring::DbRingLayout::new(128).unwrap(),
            notify: DbNotify::EventFd {
                region_offset: 0x20_1000,
            },
        };
        let w3 = Welcome {
            db: Some(vu.clone()),
            ..w2
        };
        let m3 = w3.encode();
        assert_eq!(Welcome::decode(&m3).unwrap().db, Some(vu));
        assert!(Welcome::decode(&m3[..m3.len() - 1]).is_none());
        assert!(Welcome::decode(&[MSG_RESP; 80]).is_none());
    }

    #[test]
    fn descriptors_travel_with_a_message() {
        let (a, b) = seqpacket_pair().unwrap();
        let (x, _y) = seqpacket_pair().unwrap();
        send(a.as_raw_fd(), b"hi", &[x.as_raw_fd()], 0).unwrap();
        let mut buf = [0u8; 16];
        let (n, fds) = recv(b.as_raw_fd(), &mut buf, 0).unwrap();
        assert_eq!((&buf[..n], fds.len()), (&b"hi"[..], 1));
        drop(a);
        assert_eq!(recv(b.as_raw_fd(), &mut buf, 0).unwrap().0, 0);
    }
}
