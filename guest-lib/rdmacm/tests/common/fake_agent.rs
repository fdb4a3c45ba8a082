//! A scripted fake of the agent's connection manager, for driving the
//! library through its C ABI without the agent: it listens on a Unix
//! `SOCK_SEQPACKET` socket (the test points `VRNIC_AGENT_SOCKET` at it),
//! answers `MSG_UCMA_HELLO` with a welcome and an `eventfd` (the wake
//! descriptor), records every command (`proto::decode_command`), and
//! answers them:
//! - by itself: `CREATE_ID` (handles from 1, the `uid` remembered),
//!   `DESTROY_ID` (`events_reported`: the events `GET_EVENT` delivered for
//!   the handle), `GET_EVENT` (the channel's queue, `-EAGAIN` when empty;
//!   the wake descriptor readable exactly while the queue is not),
//!   `MIGRATE_ID` (the handle moves to the asking channel), `SET_OPTION`
//!   (accepted), `ACCEPT`'s `uid` (remembered for the handle, as the
//!   kernel's `ucma_accept` does);
//! - through the test's script for every other command (and for
//!   `CREATE_ID`/`ACCEPT` after the above): the script returns `Ok(response
//!   bytes)` or `Err(errno)` and may queue events ([`Ctx::push`]).
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use vrnic_guest::agent::proto as agent_proto;
use vrnic_guest::agent::ucma::abi as kabi;
use vrnic_guest::agent::ucma::proto;

/// One recorded command.
#[derive(Clone, Debug)]
pub struct Rec {
    /// The channel it came on.
    pub chan: u32,
    /// `RDMA_USER_CM_CMD_*`.
    pub cmd: u32,
    /// The command structure.
    pub body: Vec<u8>,
    /// What followed it (`SET_OPTION`'s value).
    pub extra: Vec<u8>,
}

impl Rec {
    /// The structure as `T` (zero-padded when short).
    pub fn as_<T: Copy>(&self) -> T {
        read(&self.body)
    }
}

/// `T` from the start of `b` (zero-padded when short).
pub fn read<T: Copy>(b: &[u8]) -> T {
    // SAFETY: the ABI structures are plain data; all-zero is valid.
    let mut t: T = unsafe { std::mem::zeroed() };
    let n = b.len().min(size_of::<T>());
    // SAFETY: `t` has size_of::<T>() bytes, `b` at least n.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), std::ptr::from_mut(&mut t).cast(), n) };
    t
}

/// The bytes of plain ABI structure `t`.
pub fn bytes<T: Copy>(t: &T) -> Vec<u8> {
    // SAFETY: a live `T` of plain data (made from zeroed values).
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(t).cast::<u8>(), size_of::<T>()) }
        .to_vec()
}

/// An all-zero ABI structure.
pub fn zeroed<T: Copy>() -> T {
    // SAFETY: the ABI structures are plain data; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

struct Chan {
    wake: OwnedFd,
    events: VecDeque<kabi::rdma_ucm_event_resp>,
    sock: RawFd,
}

#[derive(Default)]
struct State {
    log: Vec<Rec>,
    chans: HashMap<u32, Chan>,
    /// handle -> (channel, uid, events delivered)
    ids: HashMap<u32, (u32, u64, u32)>,
    next_handle: u32,
    next_chan: u32,
    gone: bool,
}

/// What a script sees and may do.
pub struct Ctx<'a> {
    st: &'a mut State,
    /// The channel the command came on.
    pub chan: u32,
}

impl Ctx<'_> {
    /// The `uid` the library gave `handle`.
    pub fn uid(&self, handle: u32) -> u64 {
        self.st.ids.get(&handle).map_or(0, |i| i.1)
    }

    /// A new handle (for a connection request's new id), on the channel of `like`.
    pub fn new_handle(&mut self, like: u32) -> u32 {
        let h = self.st.next_handle;
        self.st.next_handle += 1;
        let chan = self.st.ids.get(&like).map_or(self.chan, |i| i.0);
        self.st.ids.insert(h, (chan, 0, 0));
        h
    }

    /// Queues event `ev` (its `id` names the handle whose channel gets it;
    /// `uid` 0 is filled with the handle's uid unless `keep_uid`).
    pub fn push(&mut self, mut ev: kabi::rdma_ucm_event_resp, keep_uid: bool) {
        let (chan, uid, _) = *self.st.ids.get(&ev.id).expect("event for a known handle");
        if !keep_uid && ev.uid == 0 {
            ev.uid = uid;
        }
        push(self.st, chan, ev);
    }

    /// Queues an event to the listener's channel for a request whose new
    /// id is `handle`, with `uid` the listener's.
    pub fn push_request(&mut self, listener: u32, mut ev: kabi::rdma_ucm_event_resp) {
        let (chan, uid, _) = *self.st.ids.get(&listener).expect("known listener");
        ev.uid = uid;
        push(self.st, chan, ev);
    }
}

fn push(st: &mut State, chan: u32, ev: kabi::rdma_ucm_event_resp) {
    let c = st.chans.get_mut(&chan).expect("live channel");
    if c.events.is_empty() {
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(c.wake.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
    }
    c.events.push_back(ev);
}

/// An event of type `event` for `handle` with `status`.
pub fn event(handle: u32, event: u32, status: i32) -> kabi::rdma_ucm_event_resp {
    let mut e: kabi::rdma_ucm_event_resp = zeroed();
    e.id = handle;
    e.event = event;
    e.status = status as u32;
    e
}

/// The script: `(ctx, command) -> Ok(response) | Err(errno)`.
pub type Script = Box<dyn FnMut(&mut Ctx, &Rec) -> Result<Vec<u8>, i32> + Send>;

/// The fake agent; dropping it stops it.
pub struct FakeAgent {
    /// Its socket (for `VRNIC_AGENT_SOCKET`).
    pub path: PathBuf,
    dir: PathBuf,
    shared: Arc<(Mutex<State>, Condvar)>,
    listener: OwnedFd,
}

impl FakeAgent {
    /// Starts a fake agent with `script` in a directory of its own.
    pub fn start(script: Script) -> FakeAgent {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("vrnic-fake-agent-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("fake agent dir");
        let path = dir.join("agent.sock");
        let listener = agent_proto::listen(&path).expect("fake agent listens");
        let shared = Arc::new((
            Mutex::new(State {
                next_handle: 1,
                next_chan: 1,
                ..Default::default()
            }),
            Condvar::new(),
        ));
        let script = Arc::new(Mutex::new(script));
        let lfd = listener.as_raw_fd();
        let sh = shared.clone();
        std::thread::spawn(move || loop {
            // SAFETY: accept on the listener; it is shut down on drop,
            // which ends this loop with an error.
            let fd = unsafe {
                libc::accept4(
                    lfd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                return;
            }
            // SAFETY: a fresh descriptor.
            let sock = unsafe { OwnedFd::from_raw_fd(fd) };
            let (sh, sc) = (sh.clone(), script.clone());
            std::thread::spawn(move || serve(sock, sh, sc));
        });
        FakeAgent {
            path,
            dir,
            shared,
            listener,
        }
    }

    /// The commands so far.
    pub fn log(&self) -> Vec<Rec> {
        self.shared.0.lock().unwrap().log.clone()
    }

    /// Waits (at most `limit`) until `pred` holds of the log (commands
    /// are logged once answered).
    pub fn wait_for(&self, limit: Duration, pred: impl Fn(&[Rec]) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut st = self.shared.0.lock().unwrap();
        loop {
            if pred(&st.log) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self.shared.1.wait_timeout(st, left).unwrap().0;
        }
    }

    /// The agent goes away: every connection is shut down and no more
    /// are accepted.
    pub fn vanish(&self) {
        let mut st = self.shared.0.lock().unwrap();
        st.gone = true;
        for c in st.chans.values() {
            // SAFETY: shutting down a connection's socket (its thread owns it).
            unsafe { libc::shutdown(c.sock, libc::SHUT_RDWR) };
        }
        // SAFETY: as above, the listener.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.vanish();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One connection: hello, then commands until it closes.
fn serve(sock: OwnedFd, shared: Arc<(Mutex<State>, Condvar)>, script: Arc<Mutex<Script>>) {
    let fd = sock.as_raw_fd();
    let mut buf = vec![0u8; proto::MAX_UCMA_MSG];
    let Ok((n, _)) = agent_proto::recv(fd, &mut buf, 0) else {
        return;
    };
    if proto::decode_hello(&buf[..n]) != Some(proto::UCMA_VERSION) {
        return;
    }
    // Blocking (no EFD_NONBLOCK): the library takes O_NONBLOCK on it as
    // the application's choice.
    // SAFETY: plain syscall.
    let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    assert!(efd >= 0, "eventfd");
    // SAFETY: a fresh descriptor.
    let wake = unsafe { OwnedFd::from_raw_fd(efd) };
    let chan = {
        let mut st = shared.0.lock().unwrap();
        if st.gone {
            return;
        }
        let c = st.next_chan;
        st.next_chan += 1;
        let _ = agent_proto::send(fd, &proto::welcome(0, c), &[wake.as_raw_fd()], 0);
        st.chans.insert(
            c,
            Chan {
                wake,
                events: VecDeque::new(),
                sock: fd,
            },
        );
        c
    };
    loop {
        let n = match agent_proto::recv(fd, &mut buf, 0) {
            Ok((0, _)) | Err(_) => break,
            Ok((n, _)) => n,
        };
        let Some(c) = proto::decode_command(&buf[..n]) else {
            break;
        };
        let rec = Rec {
            chan,
            cmd: c.cmd,
            body: c.body.to_vec(),
            extra: c.extra.to_vec(),
        };
        let ok = 8 + c.body.len() as i32;
        let out = c.out;
        let mut st = shared.0.lock().unwrap();
        let r = builtin(&mut st, chan, &rec).unwrap_or_else(|| {
            let mut ctx = Ctx { st: &mut st, chan };
            (script.lock().unwrap())(&mut ctx, &rec)
        });
        let msg = match r {
            Ok(resp) => proto::answer(ok, &resp, out),
            Err(e) => proto::answer(-e, &[], out),
        };
        drop(st);
        let sent = agent_proto::send(fd, &msg, &[], 0);
        // Recorded once answered: a test that waits for a command knows
        // the library has its answer.
        shared.0.lock().unwrap().log.push(rec);
        shared.1.notify_all();
        if sent.is_err() {
            break;
        }
    }
    let mut st = shared.0.lock().unwrap();
    st.chans.remove(&chan);
}

/// The commands the fake answers itself (`None`: the script's).
fn builtin(st: &mut State, chan: u32, rec: &Rec) -> Option<Result<Vec<u8>, i32>> {
    match rec.cmd {
        kabi::RDMA_USER_CM_CMD_CREATE_ID => {
            let c: kabi::rdma_ucm_create_id = rec.as_();
            let h = st.next_handle;
            st.next_handle += 1;
            st.ids.insert(h, (chan, c.uid, 0));
            let r = kabi::rdma_ucm_create_id_resp { id: h };
            Some(Ok(bytes(&r)))
        }
        kabi::RDMA_USER_CM_CMD_DESTROY_ID => {
            let c: kabi::rdma_ucm_destroy_id = rec.as_();
            let Some((_, _, n)) = st.ids.remove(&c.id) else {
                return Some(Err(libc::EINVAL));
            };
            Some(Ok(bytes(&kabi::rdma_ucm_destroy_id_resp {
                events_reported: n,
            })))
        }
        kabi::RDMA_USER_CM_CMD_GET_EVENT => {
            let ch = st.chans.get_mut(&chan)?;
            let Some(ev) = ch.events.pop_front() else {
                return Some(Err(libc::EAGAIN));
            };
            if ch.events.is_empty() {
                let mut v = 0u64;
                // SAFETY: reading our signalled (non-zero) eventfd.
                unsafe { libc::read(ch.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
            // Events reported: for the handle named (the listener's for a request).
            let h = if ev.event == vrnic_rdmacm::ffi::RDMA_CM_EVENT_CONNECT_REQUEST {
                st.ids.iter().find(|(_, v)| v.1 == ev.uid).map(|(k, _)| *k)
            } else {
                Some(ev.id)
            };
            if let Some(i) = h.and_then(|h| st.ids.get_mut(&h)) {
                i.2 += 1;
            }
            Some(Ok(bytes(&ev)))
        }
        kabi::RDMA_USER_CM_CMD_MIGRATE_ID => {
            let c: kabi::rdma_ucm_migrate_id = rec.as_();
            let i = st.ids.get_mut(&c.id)?;
            i.0 = chan;
            let n = i.2;
            Some(Ok(bytes(&kabi::rdma_ucm_migrate_resp {
                events_reported: n,
            })))
        }
        kabi::RDMA_USER_CM_CMD_SET_OPTION => Some(Ok(Vec::new())),
        kabi::RDMA_USER_CM_CMD_ACCEPT => {
            let c: kabi::rdma_ucm_accept = rec.as_();
            if c.uid != 0 {
                if let Some(i) = st.ids.get_mut(&c.id) {
                    i.1 = c.uid;
                }
            }
            None
        }
        _ => None,
    }
}
