//! Issue 27 ("Also"): property tests of hostile vhost-user frontends
//! against the daemon, as the engine's seeded harness
//! (`vrnic/tests/fuzz_smoke.rs`) is for commands and WQEs.
//!
//! The frontend is untrusted: it sends any vhost-user message in any order
//! and owns every byte of the memory it shares, which it may shrink under
//! the daemon at any time. A proptest strategy generates sequences of up
//! to [`MAX_STEPS`] such actions ([`Step`]): memory tables with generated
//! regions (past the end of the memfd, overlapping, zero-sized, at odd
//! offsets, near the top of the address space, not memory at all, many of
//! them), ring sizes, bases and addresses in and out of memory, ring
//! enables and stops, feature bits, configuration reads, device resets,
//! the memfd shrunk and grown, chains of generated buffers and raw
//! descriptors (loops, indirect tables, any head) on all three queues,
//! avail indices moved anywhere, kicks, raw messages, and dropped and new
//! connections (a connection the daemon closed after a refused request is
//! replaced before the next step). Each sequence runs against a function
//! of its own, `a<n>`, added to an in-process daemon ([`Functions`]) that
//! also has functions `b` and `c`, between which a program sends messages
//! all the while.
//!
//! The property: after every sequence the daemon is alive and serving (a
//! fresh well-behaved frontend on `a<n>` gets `CMD_QUERY_DEVICE` answered
//! with `STATUS_OK`, and `a<n>` is deleted within its bound), no vhost-user
//! request went unanswered past [`STEP_BOUND`], nothing panicked (in any
//! thread of the process), and `b` and `c` carried on undisturbed
//! (messages delivered byte for byte, no fault, no reset). Errors the
//! hostile frontend sees (refused requests, a closed connection) are
//! expected outcomes. Over the whole run the daemon's counters must show
//! the hostile paths were reached: tables refused, memory faults caught.
//!
//! The cases come from a fixed seed ([`SEED`]), so CI runs the same
//! sequences every time; `VRNIC_PROPTEST_CASES=N` runs more by hand,
//! `VRNIC_PROPTEST_SEED=N` other ones, and `VRNIC_PROPTEST_ONLY=N` only
//! the `N`th sequence of the run (a failure names it).
//!
//! The test process never touches memory it shrank away (that would raise
//! `SIGBUS` here, where nothing recovers it): its own accesses (rings,
//! command and doorbell buffers, a scratch area) lie in the first pages of
//! the memfd, and are skipped while the file is shorter than those.

mod common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserProtocolFeatures};
use vhost::vhost_user::VhostUserFrontend;
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vrnic::abi::{self, Pod};
use vrnic::link::MemLink;
use vrnic::mem::DmaMemory;
use vrnic_frontend::{test_device_config, Buffer, FrontendOptions, TestDaemon, TestFrontend, PAGE};
use vrnic_guest::vhost_user::Watchdog;
use vrnic_vhost::addr::Ipv4Prefix;
use vrnic_vhost::backend::FEATURES;
use vrnic_vhost::functions::{FunctionSpec, Functions, FunctionsConfig};

/// The seed of the CI run (ChaCha): the same sequences every time.
const SEED: [u8; 32] = *b"vrnic issue 27: hostile frontend";
/// Sequences run by default: about 20 ms each in a debug build on a
/// 2-core machine, so the file stays well under a minute.
const CASES: u32 = 1000;
/// Longest sequence.
const MAX_STEPS: usize = 40;
/// Bound on the daemon's answer to one vhost-user request (a hang past it
/// fails the property).
const STEP_BOUND: Duration = Duration::from_secs(5);
/// Bound on the well-behaved frontends' waits.
const WAIT: Duration = common::WAIT;

/// The hostile frontend's memory: region 0 at `G0` (file bytes
/// `0..R0`), a hole, region 1 at `G1` (file bytes `R0..FILE`).
const G0: u64 = 0x4000_0000;
const R0: u64 = 256 << 10;
const G1: u64 = G0 + 2 * R0;
const R1: u64 = 256 << 10;
const FILE: u64 = R0 + R1;
const FILE_PAGES: u16 = (FILE / PAGE) as u16;
/// Queue size of the hostile frontend's rings.
const QSIZE: u16 = 32;
/// The hostile frontend's scratch area: a command at 0, its response at
/// [`RESP`], free bytes (indirect tables, scribbles) from [`FREE`].
const SCRATCH: u64 = 8192;
const RESP: u64 = 256;
const FREE: u64 = 512;
/// Send messages between `b` and `c` per sequence.
const ROUNDS: u64 = 3;

/// Panics anywhere in the process (the daemon's threads included).
static PANICS: AtomicUsize = AtomicUsize::new(0);

// ---------------------------------------------------------------------------
// What a hostile frontend does
// ---------------------------------------------------------------------------

/// A memory region's guest-physical address.
#[derive(Debug, Clone, Copy)]
enum Gpa {
    /// Where the frontend's own region 0 or 1 is.
    Own(bool),
    /// Right after the previous region (adjacent).
    Adjacent,
    /// Inside the previous region, this many pages from its start.
    Overlap(u8),
    /// This many pages from 0.
    Low(u16),
    /// This many pages below the top of the 64-bit address space.
    NearMax(u8),
    Any(u64),
}

/// A memory region's size.
#[derive(Debug, Clone, Copy)]
enum Size {
    /// The frontend's region 0 or 1's.
    Own(bool),
    Pages(u16),
    Odd(u32),
    Zero,
    /// 1 TiB.
    Huge,
    Any(u64),
}

/// A memory region's offset in its file.
#[derive(Debug, Clone, Copy)]
enum Offset {
    Pages(u16),
    Odd(u32),
    Any(u64),
}

/// A memory region's frontend address (`userspace_addr`).
#[derive(Debug, Clone, Copy)]
enum UserAddr {
    /// Where the test maps that file offset.
    Own,
    Any(u64),
}

/// The file behind a memory region.
#[derive(Debug, Clone, Copy)]
enum Backing {
    /// The frontend's memfd.
    Own,
    /// Another memfd of 64 KiB.
    Other,
    /// An eventfd (cannot be mapped).
    Event,
    /// `/dev/null` (cannot be mapped).
    Null,
}

#[derive(Debug, Clone, Copy)]
struct Region {
    gpa: Gpa,
    size: Size,
    offset: Offset,
    uaddr: UserAddr,
    file: Backing,
}

/// A guest-physical address a buffer or descriptor points at.
#[derive(Debug, Clone, Copy)]
enum At {
    /// In the scratch area (always backed).
    Scratch(u16),
    /// This file offset's guest-physical address (past `R0`: region 1;
    /// past `FILE`: outside memory; in shrunk pages when the file is
    /// shorter).
    File(u32),
    /// In the hole between the regions.
    Hole(u32),
    /// This many bytes below `u64::MAX`.
    NearMax(u16),
    Any(u64),
}

/// A ring address for `SET_VRING_ADDR` (a frontend address).
#[derive(Debug, Clone, Copy)]
enum Ring {
    /// Ring 0 (descriptors), 1 (avail) or 2 (used) of a queue.
    Own(u8, u8),
    /// Where the test maps this file offset.
    File(u32),
    Zero,
    Any(u64),
}

/// One raw descriptor.
#[derive(Debug, Clone, Copy)]
struct Desc {
    at: At,
    len: u32,
    /// `NEXT` 1, `WRITE` 2, `INDIRECT` 4, or anything.
    flags: u16,
    next: u16,
}

/// One action of a hostile frontend.
#[derive(Debug, Clone)]
enum Step {
    /// `SET_MEM_TABLE` with generated regions.
    MemTable(Vec<Region>),
    /// `SET_MEM_TABLE` with the frontend's own table.
    OwnMemTable,
    VringNum(u8, u16),
    VringBase(u8, u16),
    VringAddr {
        q: u8,
        desc: Ring,
        avail: Ring,
        used: Ring,
        log: Option<u64>,
    },
    /// `SET_VRING_KICK` (0), `SET_VRING_CALL` (1) or `SET_VRING_ERR` (2)
    /// with the queue's own eventfd.
    VringFd(u8, u8),
    VringEnable(u8, bool),
    GetVringBase(u8),
    Features(u64),
    ProtocolFeatures(u64),
    GetConfig(u32, u32),
    SetConfig(u32, Vec<u8>),
    ResetDevice,
    ResetOwner,
    /// The memfd set to this many pages (shrunk or grown).
    Resize(u16),
    /// A chain of buffers made available on a queue.
    Post(u8, Vec<(At, u32, bool)>),
    /// A command on the control queue, without waiting for it: written
    /// in the scratch area, or its request read from `at` (where this
    /// process writes nothing).
    Command {
        opcode: u16,
        ctx: u16,
        body: Vec<u8>,
        len: Option<u32>,
        at: Option<At>,
    },
    Doorbell(abi::Doorbell),
    /// Raw descriptors at the start of a queue's table, `head` made
    /// available and the avail index moved on by `bump`.
    RawChain {
        q: u8,
        descs: Vec<Desc>,
        head: u16,
        bump: u16,
    },
    /// Bytes written into the scratch area (indirect tables, commands).
    Scribble(u16, Vec<u8>),
    AvailIdx(u8, u16),
    Republish(u8),
    Kick(u8),
    /// Used elements taken from a queue.
    Drain(u8),
    /// `SET_VRING_ENABLE 0` and `GET_VRING_BASE` on every queue.
    StopDevice,
    /// The device started again (`SET_MEM_TABLE`, and every queue) with
    /// these bases.
    Resume([u16; 3]),
    /// The connection closed and a new one started (as also happens
    /// before any step that finds the connection closed by the daemon).
    Reconnect,
    /// A raw vhost-user message (header: request, flags, size; then the
    /// body) written on the connection, or on a new one (`fresh`, before
    /// any negotiation), which is then closed: the frontend library no
    /// longer knows where the stream stands.
    Raw {
        fresh: bool,
        request: u32,
        flags: u32,
        size: Option<u32>,
        body: Vec<u8>,
    },
}

fn queue() -> impl Strategy<Value = u8> {
    0u8..3
}

fn gpa() -> impl Strategy<Value = Gpa> {
    prop_oneof![
        4 => any::<bool>().prop_map(Gpa::Own),
        2 => Just(Gpa::Adjacent),
        2 => any::<u8>().prop_map(Gpa::Overlap),
        1 => any::<u16>().prop_map(Gpa::Low),
        1 => (0u8..4).prop_map(Gpa::NearMax),
        1 => any::<u64>().prop_map(Gpa::Any),
    ]
}

fn size() -> impl Strategy<Value = Size> {
    prop_oneof![
        4 => any::<bool>().prop_map(Size::Own),
        3 => (1..FILE_PAGES + 8).prop_map(Size::Pages),
        1 => any::<u32>().prop_map(Size::Odd),
        1 => Just(Size::Zero),
        1 => Just(Size::Huge),
        1 => any::<u64>().prop_map(Size::Any),
    ]
}

fn offset() -> impl Strategy<Value = Offset> {
    prop_oneof![
        6 => (0..FILE_PAGES + 8).prop_map(Offset::Pages),
        1 => any::<u32>().prop_map(Offset::Odd),
        1 => any::<u64>().prop_map(Offset::Any),
    ]
}

fn region() -> impl Strategy<Value = Region> {
    let uaddr = prop_oneof![4 => Just(UserAddr::Own), 1 => any::<u64>().prop_map(UserAddr::Any)];
    let file = prop_oneof![
        8 => Just(Backing::Own),
        1 => Just(Backing::Other),
        1 => Just(Backing::Event),
        1 => Just(Backing::Null),
    ];
    // Mostly one of the frontend's own regions, slightly changed.
    let own = any::<bool>().prop_map(|r| Region {
        gpa: Gpa::Own(r),
        size: Size::Own(r),
        offset: Offset::Pages(if r { (R0 / PAGE) as u16 } else { 0 }),
        uaddr: UserAddr::Own,
        file: Backing::Own,
    });
    let any =
        (gpa(), size(), offset(), uaddr, file).prop_map(|(gpa, size, offset, uaddr, file)| {
            Region {
                gpa,
                size,
                offset,
                uaddr,
                file,
            }
        });
    prop_oneof![2 => own, 3 => any]
}

fn at() -> impl Strategy<Value = At> {
    prop_oneof![
        3 => any::<u16>().prop_map(At::Scratch),
        6 => (0..(FILE + 8 * PAGE) as u32).prop_map(At::File),
        1 => (0..R0 as u32).prop_map(At::Hole),
        1 => any::<u16>().prop_map(At::NearMax),
        1 => any::<u64>().prop_map(At::Any),
    ]
}

fn len() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => 0u32..512,
        2 => Just(16u32),
        2 => 0u32..(4 * PAGE as u32),
        1 => 0u32..(FILE as u32 * 2),
        1 => any::<u32>(),
    ]
}

fn ring() -> impl Strategy<Value = Ring> {
    prop_oneof![
        4 => (queue(), 0u8..3).prop_map(|(q, r)| Ring::Own(q, r)),
        // Mostly aligned as the rings must be (16 bytes), so that the
        // backend takes them and reads them.
        3 => (0..FILE_PAGES + 4, 0u32..256)
            .prop_map(|(p, o)| Ring::File(u32::from(p) * PAGE as u32 + 16 * o)),
        1 => (0..(FILE + 4 * PAGE) as u32).prop_map(Ring::File),
        1 => Just(Ring::Zero),
        1 => any::<u64>().prop_map(Ring::Any),
    ]
}

fn desc() -> impl Strategy<Value = Desc> {
    let flags = prop_oneof![
        6 => 0u16..8,
        1 => any::<u16>(),
    ];
    let next = prop_oneof![4 => 0u16..QSIZE, 1 => any::<u16>()];
    (at(), len(), flags, next).prop_map(|(at, len, flags, next)| Desc {
        at,
        len,
        flags,
        next,
    })
}

fn doorbell() -> impl Strategy<Value = abi::Doorbell> {
    (
        0u16..7,
        0u16..3,
        prop_oneof![0u32..8, any::<u32>()],
        any::<u32>(),
    )
        .prop_map(|(kind, ctx, handle, index)| abi::Doorbell {
            kind,
            ctx,
            handle,
            index,
            reserved2: 0,
        })
}

fn step() -> impl Strategy<Value = Step> {
    use proptest::collection::vec;
    let u16_edge = || prop_oneof![0u16..4, Just(QSIZE), Just(0xffff), any::<u16>()];
    let tables = prop_oneof![
        8 => vec(region(), 1..=4),
        1 => vec(region(), 5..=40),
    ];
    let features = prop_oneof![
        3 => any::<u64>().prop_map(|m| m & FEATURES),
        1 => any::<u64>(),
    ];
    let protocol = prop_oneof![
        3 => (0u64..4).prop_map(|b| {
            let c = VhostUserProtocolFeatures::CONFIG.bits();
            let r = VhostUserProtocolFeatures::REPLY_ACK.bits();
            (if b & 1 != 0 { c } else { 0 }) | if b & 2 != 0 { r } else { 0 }
        }),
        1 => any::<u64>(),
    ];
    let config = (0u32..64).prop_flat_map(|o| (Just(o), 1..=64 - o));
    let opcode = prop_oneof![4 => 0u16..=24, 1 => any::<u16>()];
    let resize = prop_oneof![
        4 => 4u16..=FILE_PAGES,
        1 => 0u16..4,
        1 => FILE_PAGES..FILE_PAGES + 16,
    ];
    prop_oneof![
        5 => tables.prop_map(Step::MemTable),
        3 => Just(Step::OwnMemTable),
        2 => (queue(), prop_oneof![0u16..4, Just(QSIZE), Just(256), Just(512), any::<u16>()])
            .prop_map(|(q, n)| Step::VringNum(q, n)),
        2 => (queue(), u16_edge()).prop_map(|(q, b)| Step::VringBase(q, b)),
        4 => (queue(), ring(), ring(), ring(), proptest::option::weighted(0.1, any::<u64>()))
            .prop_map(|(q, desc, avail, used, log)| Step::VringAddr { q, desc, avail, used, log }),
        2 => (queue(), 0u8..3).prop_map(|(q, k)| Step::VringFd(q, k)),
        3 => (queue(), any::<bool>()).prop_map(|(q, on)| Step::VringEnable(q, on)),
        2 => queue().prop_map(Step::GetVringBase),
        1 => features.prop_map(Step::Features),
        1 => protocol.prop_map(Step::ProtocolFeatures),
        1 => config.prop_map(|(o, s)| Step::GetConfig(o, s)),
        1 => (0u32..64, vec(any::<u8>(), 1..8)).prop_map(|(o, b)| Step::SetConfig(o, b)),
        1 => Just(Step::ResetDevice),
        1 => Just(Step::ResetOwner),
        5 => resize.prop_map(Step::Resize),
        6 => (queue(), vec((at(), len(), any::<bool>()), 1..=5)).prop_map(|(q, b)| Step::Post(q, b)),
        6 => (opcode, 0u16..3, vec(any::<u8>(), 0..=140), proptest::option::weighted(0.2, any::<u32>()),
              proptest::option::weighted(0.3, at()))
            .prop_map(|(opcode, ctx, body, len, at)| Step::Command { opcode, ctx, body, len, at }),
        3 => doorbell().prop_map(Step::Doorbell),
        4 => (queue(), vec(desc(), 1..=6), prop_oneof![3 => 0u16..QSIZE, 1 => any::<u16>()],
              prop_oneof![4 => 1u16..3, 1 => any::<u16>()])
            .prop_map(|(q, descs, head, bump)| Step::RawChain { q, descs, head, bump }),
        2 => (any::<u16>(), vec(any::<u8>(), 1..=64)).prop_map(|(o, b)| Step::Scribble(o, b)),
        2 => (queue(), u16_edge()).prop_map(|(q, i)| Step::AvailIdx(q, i)),
        1 => queue().prop_map(Step::Republish),
        2 => queue().prop_map(Step::Kick),
        2 => queue().prop_map(Step::Drain),
        1 => Just(Step::StopDevice),
        2 => [u16_edge(), u16_edge(), u16_edge()].prop_map(Step::Resume),
        2 => Just(Step::Reconnect),
        2 => (
            any::<bool>(),
            prop_oneof![4 => 0u32..50, 1 => any::<u32>()],
            prop_oneof![4 => Just(1u32), 2 => Just(9u32), 1 => any::<u32>()],
            proptest::option::weighted(0.2, prop_oneof![0u32..256, any::<u32>()]),
            vec(any::<u8>(), 0..=96),
        )
            .prop_map(|(fresh, request, flags, size, body)| Step::Raw {
                fresh,
                request,
                flags,
                size,
                body,
            }),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(step(), 1..=MAX_STEPS)
}

// ---------------------------------------------------------------------------
// Running a sequence
// ---------------------------------------------------------------------------

/// Files a memory table may name besides the frontend's memfd.
struct Files {
    other: File,
    event: EventFd,
    null: File,
}

impl Files {
    fn new() -> Self {
        // SAFETY: a new memfd, owned by the File.
        let other = unsafe {
            let fd = libc::memfd_create(c"vrnic-test-other".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0, "memfd_create");
            File::from_raw_fd(fd)
        };
        other.set_len(64 << 10).unwrap();
        Self {
            other,
            event: EventFd::new(EFD_NONBLOCK).unwrap(),
            null: File::open("/dev/null").unwrap(),
        }
    }
}

/// The hostile frontend's connection and what it knows of its memory.
struct Hostile {
    fe: TestFrontend,
    /// File bytes `0..keep` hold everything this process touches.
    keep: u64,
    /// The memfd's length now.
    len: u64,
    /// Guest-physical address of the scratch area.
    scratch: u64,
    /// Where this process maps region 0 and region 1.
    host: [u64; 2],
    /// The connection's descriptor (the frontend's).
    conn: std::os::fd::RawFd,
}

fn hostile_options() -> FrontendOptions {
    FrontendOptions {
        event_idx: true,
        queue_size: QSIZE,
        memory: vec![(G0, R0 as usize), (G1, R1 as usize)],
        // Its own bounded requests give up after the test's bound.
        timeout: 3 * STEP_BOUND,
    }
}

impl Hostile {
    fn connect(socket: &Path) -> Result<Self, String> {
        let mut fe =
            TestFrontend::connect(socket, &hostile_options()).map_err(|e| e.to_string())?;
        let scratch = fe
            .memory_mut()
            .alloc(SCRATCH, 64)
            .map_err(|e| e.to_string())?;
        let keep = (scratch + SCRATCH - G0).next_multiple_of(PAGE);
        assert!(keep < R0, "the test's own memory lies in region 0");
        let m = fe.memory();
        let host = [m.host_addr(G0).unwrap(), m.host_addr(G1).unwrap()];
        let conn = fe.vhost().as_raw_fd();
        Ok(Self {
            conn,
            fe,
            keep,
            len: FILE,
            scratch,
            host,
        })
    }

    /// Whether the daemon still holds the connection (it closes it after a
    /// refused request).
    fn alive(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.conn,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0 || p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) == 0
    }

    /// Whether this process may touch its memory (rings, buffers).
    fn touchable(&self) -> bool {
        self.len >= self.keep
    }

    /// The guest-physical address of file offset `off`.
    fn gpa_of(off: u64) -> u64 {
        if off < R0 {
            G0 + off
        } else {
            G1 + (off - R0)
        }
    }

    /// Where this process maps file offset `off` (past the regions: past
    /// the mapping).
    fn host_of(&self, off: u64) -> u64 {
        if off < R0 {
            self.host[0] + off
        } else {
            self.host[1] + (off - R0)
        }
    }

    fn at(&self, at: At) -> u64 {
        match at {
            At::Scratch(o) => self.scratch + u64::from(o) % SCRATCH,
            At::File(o) => Self::gpa_of(u64::from(o)),
            At::Hole(o) => G0 + R0 + u64::from(o),
            At::NearMax(k) => u64::MAX - u64::from(k),
            At::Any(a) => a,
        }
    }

    fn ring(&self, r: Ring) -> u64 {
        match r {
            Ring::Own(q, which) => {
                let (d, a, u) = self.fe.queue(u16::from(q)).rings();
                let gpa = [d, a, u][usize::from(which)];
                self.fe.memory().host_addr(gpa).unwrap_or(0)
            }
            Ring::File(o) => self.host_of(u64::from(o)),
            Ring::Zero => 0,
            Ring::Any(a) => a,
        }
    }

    fn table(&self, regions: &[Region], files: &Files) -> Vec<VhostUserMemoryRegionInfo> {
        let own = self.fe.memory().region_infos().unwrap_or_default();
        let own_fd = own.first().map_or(-1, |r| r.mmap_handle);
        let mut prev: Option<(u64, u64)> = None;
        regions
            .iter()
            .map(|r| {
                let size = match r.size {
                    Size::Own(false) => R0,
                    Size::Own(true) => R1,
                    Size::Pages(n) => u64::from(n) * PAGE,
                    Size::Odd(n) => u64::from(n),
                    Size::Zero => 0,
                    Size::Huge => 1 << 40,
                    Size::Any(n) => n,
                };
                let gpa = match r.gpa {
                    Gpa::Own(false) => G0,
                    Gpa::Own(true) => G1,
                    Gpa::Adjacent => prev.map_or(G0, |(g, s)| g.wrapping_add(s)),
                    Gpa::Overlap(n) => {
                        prev.map_or(G0, |(g, _)| g.wrapping_add(u64::from(n) * PAGE))
                    }
                    Gpa::Low(n) => u64::from(n) * PAGE,
                    Gpa::NearMax(n) => u64::MAX - (u64::from(n) + 1) * PAGE + 1,
                    Gpa::Any(a) => a,
                };
                prev = Some((gpa, size));
                let offset = match r.offset {
                    Offset::Pages(n) => u64::from(n) * PAGE,
                    Offset::Odd(n) => u64::from(n),
                    Offset::Any(n) => n,
                };
                let userspace_addr = match r.uaddr {
                    UserAddr::Own => self.host_of(offset),
                    UserAddr::Any(a) => a,
                };
                let mmap_handle = match r.file {
                    Backing::Own => own_fd,
                    Backing::Other => files.other.as_raw_fd(),
                    Backing::Event => files.event.as_raw_fd(),
                    Backing::Null => files.null.as_raw_fd(),
                };
                VhostUserMemoryRegionInfo {
                    guest_phys_addr: gpa,
                    memory_size: size,
                    userspace_addr,
                    mmap_offset: offset,
                    mmap_handle,
                }
            })
            .collect()
    }

    /// Runs `f`, vhost-user requests, failing when the daemon leaves one
    /// unanswered past [`STEP_BOUND`] (the watchdog then shuts the
    /// connection down, so `f` returns).
    fn request<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> Result<T, String> {
        let fd = self.fe.vhost().as_raw_fd();
        // SAFETY: the frontend owns `fd` for the whole call; the watchdog
        // keeps a duplicate of its own.
        let conn = unsafe { BorrowedFd::borrow_raw(fd) };
        let w = Watchdog::arm(conn, STEP_BOUND).map_err(|e| format!("watchdog: {e}"))?;
        let r = f(self);
        if w.disarm() {
            return Err(format!(
                "the daemon left a request unanswered for {STEP_BOUND:?}"
            ));
        }
        Ok(r)
    }

    /// Writes raw descriptors and makes `head` available (see
    /// [`Step::RawChain`]).
    fn raw_chain(&mut self, q: u8, descs: &[Desc], head: u16, bump: u16) -> Result<(), String> {
        let (dt, avail, _) = self.fe.queue(u16::from(q)).rings();
        let m = self.fe.memory().mem();
        for (i, d) in descs.iter().enumerate().take(usize::from(QSIZE)) {
            let mut b = [0u8; 16];
            b[0..8].copy_from_slice(&self.at(d.at).to_le_bytes());
            b[8..12].copy_from_slice(&d.len.to_le_bytes());
            b[12..14].copy_from_slice(&d.flags.to_le_bytes());
            b[14..16].copy_from_slice(&d.next.to_le_bytes());
            m.write(dt + 16 * i as u64, &b).map_err(|e| e.to_string())?;
        }
        let mut idx = [0u8; 2];
        m.read(avail + 2, &mut idx).map_err(|e| e.to_string())?;
        let idx = u16::from_le_bytes(idx);
        m.write(avail + 4 + 2 * u64::from(idx % QSIZE), &head.to_le_bytes())
            .map_err(|e| e.to_string())?;
        std::sync::atomic::fence(Ordering::SeqCst);
        m.write(avail + 2, &idx.wrapping_add(bump).to_le_bytes())
            .map_err(|e| e.to_string())?;
        std::sync::atomic::fence(Ordering::SeqCst);
        self.fe.queue(u16::from(q)).kick();
        Ok(())
    }
}

/// What happened to the steps of the run.
#[derive(Debug, Default)]
struct Outcomes {
    /// Steps carried out (whatever the daemon answered).
    done: u64,
    /// Steps the frontend saw fail (refused, connection closed, ...).
    failed: u64,
    /// Steps skipped: no connection, or memory this process may not touch.
    skipped: u64,
    /// New connections after the daemon closed one.
    reconnects: u64,
}

/// Runs `steps` against the function at `socket`. `Err` for a property
/// violation (an unanswered request); the frontend's own errors are
/// expected outcomes, counted in `out`.
fn attack(socket: &Path, steps: &[Step], files: &Files, out: &mut Outcomes) -> Result<(), String> {
    let mut h = match Hostile::connect(socket) {
        Ok(h) => Some(h),
        Err(e) => return Err(format!("a well-behaved frontend could not start: {e}")),
    };
    for (i, step) in steps.iter().enumerate() {
        let at = |e: String| format!("step {i} {step:?}: {e}");
        // Requests on a connection the daemon closed reach nothing: the
        // frontend connects again, as a program would.
        let closed = !h.as_ref().is_some_and(Hostile::alive);
        if closed && !matches!(step, Step::Reconnect) {
            reconnect(&mut h, socket).map_err(at)?;
            out.reconnects += 1;
        }
        let r = run_step(&mut h, socket, step, files).map_err(at)?;
        match r {
            Some(true) => out.done += 1,
            Some(false) => {
                out.done += 1;
                out.failed += 1;
            }
            None => out.skipped += 1,
        }
    }
    Ok(())
}

/// Closes the connection in `slot` and starts a new one: whether it
/// started. `Err` when the daemon left the start unanswered (a refusal, or
/// a closed connection, is an expected outcome).
fn reconnect(slot: &mut Option<Hostile>, socket: &Path) -> Result<bool, String> {
    drop(slot.take());
    let t = Instant::now();
    match Hostile::connect(socket) {
        Ok(h) => {
            *slot = Some(h);
            Ok(true)
        }
        Err(e) if e.contains("did not answer") => Err(format!("{e} (after {:?})", t.elapsed())),
        Err(_) => Ok(false),
    }
}

/// One step: `Ok(None)` when skipped, `Ok(Some(ok))` when carried out.
fn run_step(
    slot: &mut Option<Hostile>,
    socket: &Path,
    step: &Step,
    files: &Files,
) -> Result<Option<bool>, String> {
    if let Step::Reconnect = step {
        return reconnect(slot, socket).map(Some);
    }
    if let Step::Raw {
        fresh,
        request,
        flags,
        size,
        body,
    } = step
    {
        let mut msg = Vec::with_capacity(12 + body.len());
        msg.extend_from_slice(&request.to_le_bytes());
        msg.extend_from_slice(&flags.to_le_bytes());
        msg.extend_from_slice(&size.unwrap_or(body.len() as u32).to_le_bytes());
        msg.extend_from_slice(body);
        // Closed after the write: the daemon sees the message, then the end.
        let r = match slot.take() {
            Some(h) if !*fresh => {
                // SAFETY: `msg` is valid for its length; `h` owns the
                // socket until it is dropped below.
                let n = unsafe {
                    libc::send(h.conn, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL)
                };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            }
            h => {
                drop(h);
                std::os::unix::net::UnixStream::connect(socket)
                    .and_then(|mut c| std::io::Write::write_all(&mut c, &msg))
            }
        };
        return Ok(Some(r.is_ok()));
    }
    let Some(h) = slot.as_mut() else {
        return Ok(None);
    };
    let q16 = |q: &u8| u16::from(*q);
    let ok = |r: Result<(), String>| -> Result<Option<bool>, String> { Ok(Some(r.is_ok())) };
    let touch = h.touchable();
    match step {
        Step::MemTable(regions) => {
            let t = h.table(regions, files);
            let r = h.request(|h| h.fe.vhost().set_mem_table(&t).map(drop))?;
            Ok(Some(r.is_ok()))
        }
        Step::OwnMemTable => {
            let t = h.fe.memory().region_infos().map_err(|e| e.to_string())?;
            let r = h.request(|h| h.fe.vhost().set_mem_table(&t).map(drop))?;
            Ok(Some(r.is_ok()))
        }
        Step::VringNum(q, n) => {
            let r = h.request(|h| h.fe.vhost().set_vring_num(usize::from(*q), *n))?;
            Ok(Some(r.is_ok()))
        }
        Step::VringBase(q, b) => {
            let r = h.request(|h| h.fe.vhost().set_vring_base(usize::from(*q), *b))?;
            Ok(Some(r.is_ok()))
        }
        Step::VringAddr {
            q,
            desc,
            avail,
            used,
            log,
        } => {
            let cfg = VringConfigData {
                queue_max_size: QSIZE,
                queue_size: QSIZE,
                flags: u32::from(log.is_some()),
                desc_table_addr: h.ring(*desc),
                used_ring_addr: h.ring(*used),
                avail_ring_addr: h.ring(*avail),
                log_addr: *log,
            };
            let r = h.request(|h| h.fe.vhost().set_vring_addr(usize::from(*q), &cfg))?;
            Ok(Some(r.is_ok()))
        }
        Step::VringFd(q, kind) => {
            let vq = h.fe.queue(q16(q));
            let fd = match kind {
                0 => vq.kick_fd(),
                _ => vq.call_fd(),
            }
            .try_clone()
            .map_err(|e| e.to_string())?;
            let r = h.request(|h| {
                let fe = h.fe.vhost();
                let q = usize::from(*q);
                match kind {
                    0 => fe.set_vring_kick(q, &fd),
                    1 => fe.set_vring_call(q, &fd),
                    _ => fe.set_vring_err(q, &fd),
                }
            })?;
            Ok(Some(r.is_ok()))
        }
        Step::VringEnable(q, on) => {
            let r = h.request(|h| h.fe.vhost().set_vring_enable(usize::from(*q), *on))?;
            Ok(Some(r.is_ok()))
        }
        Step::GetVringBase(q) => {
            let r = h.request(|h| h.fe.vhost().get_vring_base(usize::from(*q)))?;
            Ok(Some(r.is_ok()))
        }
        Step::Features(f) => {
            let r = h.request(|h| h.fe.vhost().set_features(*f))?;
            Ok(Some(r.is_ok()))
        }
        Step::ProtocolFeatures(f) => {
            let pf = VhostUserProtocolFeatures::from_bits_truncate(*f);
            let r = h.request(|h| h.fe.vhost().set_protocol_features(pf))?;
            Ok(Some(r.is_ok()))
        }
        Step::GetConfig(o, s) => {
            // Only ranges inside the 64-byte space: the vhost crate's
            // frontend waits forever for the payload of others.
            let buf = vec![0u8; *s as usize];
            let r = h.request(|h| {
                h.fe.vhost()
                    .get_config(*o, *s, VhostUserConfigFlags::empty(), &buf)
            })?;
            Ok(Some(r.is_ok()))
        }
        Step::SetConfig(o, b) => {
            let r = h.request(|h| {
                h.fe.vhost()
                    .set_config(*o, VhostUserConfigFlags::empty(), b)
            })?;
            Ok(Some(r.is_ok()))
        }
        Step::ResetDevice => {
            let r = h.request(|h| h.fe.vhost().reset_device())?;
            Ok(Some(r.is_ok()))
        }
        Step::ResetOwner => {
            let r = h.request(|h| h.fe.vhost().reset_owner())?;
            Ok(Some(r.is_ok()))
        }
        Step::Resize(pages) => {
            let len = u64::from(*pages) * PAGE;
            let r = h.fe.memory().shrink_file(len);
            if r.is_ok() {
                h.len = len;
            }
            ok(r.map_err(|e| e.to_string()))
        }
        Step::StopDevice => {
            let r = h.request(|h| {
                let fe = h.fe.vhost();
                for q in 0..abi::NUM_QUEUES {
                    fe.set_vring_enable(q, false)?;
                }
                for q in 0..abi::NUM_QUEUES {
                    fe.get_vring_base(q)?;
                }
                Ok::<_, vhost::Error>(())
            })?;
            Ok(Some(r.is_ok()))
        }
        Step::Resume(bases) => {
            let b: Vec<u32> = bases.iter().map(|&b| u32::from(b)).collect();
            let r = h.request(|h| h.fe.resume_device(&b))?;
            Ok(Some(r.is_ok()))
        }
        // Everything below touches the frontend's memory.
        _ if !touch => Ok(None),
        Step::Post(q, bufs) => {
            let bufs: Vec<Buffer> = bufs
                .iter()
                .map(|&(at, len, writable)| Buffer {
                    addr: h.at(at),
                    len,
                    writable,
                })
                .collect();
            ok(h.fe
                .post(q16(q), &bufs)
                .map(drop)
                .map_err(|e| e.to_string()))
        }
        Step::Command {
            opcode,
            ctx,
            body,
            len,
            at,
        } => {
            let hdr = abi::CmdHeader {
                opcode: *opcode,
                ctx: *ctx,
                len: len.unwrap_or(body.len() as u32),
            };
            let m = h.fe.memory().mem();
            let r = m
                .write(h.scratch, hdr.as_bytes())
                .and_then(|()| m.write(h.scratch + 8, body))
                .map_err(|e| e.to_string());
            if r.is_err() {
                return ok(r);
            }
            let req = at.map_or(h.scratch, |a| h.at(a));
            let bufs = [
                Buffer::readable(req, 8 + body.len() as u32),
                Buffer::writable(h.scratch + RESP, (FREE - RESP) as u32),
            ];
            ok(h.fe
                .post(abi::CONTROLQ, &bufs)
                .map(drop)
                .map_err(|e| e.to_string()))
        }
        Step::Doorbell(db) => ok(h.fe.post_doorbell(db).map(drop).map_err(|e| e.to_string())),
        Step::RawChain {
            q,
            descs,
            head,
            bump,
        } => ok(h.raw_chain(*q, descs, *head, *bump)),
        Step::Scribble(o, bytes) => {
            let room = SCRATCH - FREE - bytes.len() as u64;
            let at = h.scratch + FREE + u64::from(*o) % room;
            ok(h.fe
                .memory()
                .mem()
                .write(at, bytes)
                .map_err(|e| e.to_string()))
        }
        Step::AvailIdx(q, i) => ok(h.fe.write_avail_idx(q16(q), *i).map_err(|e| e.to_string())),
        Step::Republish(q) => ok(h.fe.republish(q16(q)).map_err(|e| e.to_string())),
        Step::Kick(q) => {
            h.fe.queue(q16(q)).kick();
            Ok(Some(true))
        }
        Step::Drain(q) => {
            for _ in 0..QSIZE {
                match h.fe.try_used(q16(q)) {
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(Some(true)),
                    Err(_) => return Ok(Some(false)),
                }
            }
            Ok(Some(true))
        }
        Step::Reconnect | Step::Raw { .. } => unreachable!("handled above"),
    }
}

/// A well-behaved frontend gets `CMD_QUERY_DEVICE` answered on `socket`.
fn serving(socket: &Path) -> Result<(), String> {
    let opts = FrontendOptions {
        memory: vec![(G0, 1 << 20)],
        timeout: WAIT,
        ..FrontendOptions::default()
    };
    let mut fe = TestFrontend::connect(socket, &opts)
        .map_err(|e| format!("a well-behaved frontend could not start: {e}"))?;
    let (h, _) = fe
        .control(abi::CMD_QUERY_DEVICE, &[])
        .map_err(|e| format!("CMD_QUERY_DEVICE: {e}"))?;
    if h.status != abi::STATUS_OK {
        return Err(format!("CMD_QUERY_DEVICE answered {h:?}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The daemon and its other functions
// ---------------------------------------------------------------------------

fn spec(dir: &Path, name: &str, last: u8) -> FunctionSpec {
    let mut s = FunctionSpec::new(
        dir.join(format!("{name}.sock")),
        Ipv4Prefix {
            addr: std::net::Ipv4Addr::new(10, 0, 0, last),
            len: 24,
        },
    );
    s.name = Some(name.to_string());
    s
}

/// The counters of function `name`, as last published.
fn counters(fns: &Functions, name: &str) -> Option<vrnic_vhost::stats::Snapshot> {
    fns.list()
        .into_iter()
        .find(|f| f.name == name)
        .map(|f| f.counters)
}

/// A program on `b` sending [`ROUNDS`] messages to one on `c` per tick,
/// each checked byte for byte; it reports each batch (and first its
/// set-up) on `done`, and ends when `ticks` closes.
fn bystanders(
    b: PathBuf,
    c: PathBuf,
    ticks: mpsc::Receiver<()>,
    done: mpsc::Sender<u64>,
) -> std::thread::JoinHandle<()> {
    use common::*;
    use vrnic_guest::verbs::{Cq, Pd};
    std::thread::spawn(move || {
        let (cb, _conn_b) = open(&b);
        let (cc, _conn_c) = open(&c);
        let (pb, pc) = (Pd::alloc(&cb).unwrap(), Pd::alloc(&cc).unwrap());
        let (mut cq_b, mut cq_c) = (Cq::new(&cb, 64).unwrap(), Cq::new(&cc, 64).unwrap());
        let (mut qb, mut qc) = (rc_qp(&pb, &cq_b), rc_qp(&pc, &cq_c));
        let to_c = Peer {
            gid: gid(&cc),
            qpn: qc.qp_num(),
            psn: 200,
        };
        let to_b = Peer {
            gid: gid(&cb),
            qpn: qb.qp_num(),
            psn: 100,
        };
        connect_rc(&mut qb, to_c, 100);
        connect_rc(&mut qc, to_b, 200);
        let len = 2048;
        let src = buffer(&pb, len, &[]);
        let dst = buffer(&pc, len, &[]);
        let mut i = 0u64;
        if done.send(i).is_err() {
            return;
        }
        while ticks.recv().is_ok() {
            for _ in 0..ROUNDS {
                let data = pattern(len, i as u8);
                src.write(0, &data);
                recv(&mut qc, i, Some(dst.sge(0, len)));
                send(&mut qb, i, src.sge(0, len));
                let rc = wait_cq(&mut cq_c, "bystanders: receive");
                let sc = wait_cq(&mut cq_b, "bystanders: send");
                assert_eq!((rc.status, sc.status), (abi::WC_SUCCESS, abi::WC_SUCCESS));
                assert_eq!(dst.to_vec(), data, "message {i} byte for byte");
                i += 1;
            }
            if done.send(i).is_err() {
                return;
            }
        }
    })
}

/// Counters of the run: summed over the sequences for the attacked
/// functions.
const REACHED: [&str; 16] = [
    "memory_faults",
    "memory_tables_refused",
    "device_resets",
    "engine_panics",
    "commands",
    "rejected_chains",
    "faulted_commands",
    "doorbells",
    "bad_doorbells",
    "bad_event_buffers",
    "device_stops",
    "device_resumes",
    "device_lost",
    "lost_requests",
    "late_chains",
    "frontends_refused",
];

/// Counters of `b` and `c` that must not move while the others are attacked.
const UNDISTURBED: [&str; 5] = [
    "memory_faults",
    "memory_tables_refused",
    "device_resets",
    "engine_panics",
    "device_lost",
];

fn seed() -> [u8; 32] {
    let mut s = SEED;
    if let Some(n) = std::env::var("VRNIC_PROPTEST_SEED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        s[..8].copy_from_slice(&n.to_le_bytes());
    }
    s
}

fn cases() -> u32 {
    std::env::var("VRNIC_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES)
}

fn count_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            prev(info);
        }));
    });
}

/// Found by the property: a frontend shrinks its memfd, then sends
/// `SET_VRING_ADDR` with the used ring in the pages it cut off.
/// vhost-user-backend reads the used index there (`queue_used_idx`) on its
/// message thread, where no fault was recovered: the `SIGBUS` ended the
/// daemon, every function with it. Now the request fails, the connection
/// closes, the fault is counted, and the daemon serves the next frontend.
#[test]
fn a_used_ring_in_shrunk_memory_does_not_kill_the_daemon() {
    count_panics();
    let (link, _peer) = MemLink::pair();
    let d = TestDaemon::with_device(test_device_config(), Box::new(link)).unwrap();
    let opts = FrontendOptions {
        memory: vec![(G0, R0 as usize)],
        queue_size: QSIZE,
        timeout: WAIT,
        ..FrontendOptions::default()
    };
    let mut fe = TestFrontend::connect(d.socket(), &opts).unwrap();
    // The rings lie in the first pages; the test touches nothing else.
    fe.memory().shrink_file(R0 / 2).unwrap();
    let mem = fe.memory();
    let (desc, avail, _) = fe.queue(abi::DOORBELLQ).rings();
    let cfg = VringConfigData {
        queue_max_size: QSIZE,
        queue_size: QSIZE,
        flags: 0,
        desc_table_addr: mem.host_addr(desc).unwrap(),
        used_ring_addr: mem.host_addr(G0 + R0 - PAGE).unwrap(),
        avail_ring_addr: mem.host_addr(avail).unwrap(),
        log_addr: None,
    };
    let fd = fe.vhost().as_raw_fd();
    // SAFETY: `fe` owns `fd` past the watchdog's disarm.
    let w = Watchdog::arm(unsafe { BorrowedFd::borrow_raw(fd) }, WAIT).unwrap();
    let r = fe.vhost().set_vring_addr(usize::from(abi::DOORBELLQ), &cfg);
    assert!(!w.disarm(), "SET_VRING_ADDR answered");
    assert!(r.is_err(), "a ring in lost memory is refused");
    drop(fe);
    serving(d.socket()).unwrap();
    let b = d.stop(WAIT).unwrap();
    assert_eq!(b.stats().memory_faults, 1, "the fault is counted");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a thread panicked");
}

/// Found by the property: a driver whose used ring lies over its avail
/// ring (the device's every completion makes the next chain available)
/// keeps the worker busy for ever, and the worker took the data path's
/// lock back at each wake-up before the vhost-user message thread,
/// waiting for it, could: the frontend's next request (here
/// `SET_MEM_TABLE`) was never answered. Now the worker lets a waiting
/// request go first.
#[test]
fn a_ring_that_feeds_itself_does_not_hold_up_the_frontends_requests() {
    count_panics();
    let (link, _peer) = MemLink::pair();
    let d = TestDaemon::with_device(test_device_config(), Box::new(link)).unwrap();
    let opts = FrontendOptions {
        memory: vec![(G0, R0 as usize)],
        queue_size: QSIZE,
        timeout: WAIT,
        ..FrontendOptions::default()
    };
    let mut fe = TestFrontend::connect(d.socket(), &opts).unwrap();
    let q = abi::DOORBELLQ;
    // One doorbell through: the avail and used indices are 1.
    fe.doorbell(&abi::Doorbell::default()).unwrap();
    fe.stop_queue(q).unwrap();
    let mem = fe.memory();
    let (desc, avail, _) = fe.queue(q).rings();
    let cfg = VringConfigData {
        queue_max_size: QSIZE,
        queue_size: QSIZE,
        flags: 0,
        desc_table_addr: mem.host_addr(desc).unwrap(),
        // The used ring over the avail ring: vhost-user-backend takes the
        // avail index (1) for the used one, the ring restarts at 0, and
        // each completion moves the avail index one on.
        used_ring_addr: mem.host_addr(avail).unwrap(),
        avail_ring_addr: mem.host_addr(avail).unwrap(),
        log_addr: None,
    };
    let (kick, call) = (
        fe.queue(q).kick_fd().try_clone().unwrap(),
        fe.queue(q).call_fd().try_clone().unwrap(),
    );
    let table = fe.memory().region_infos().unwrap();
    let fd = fe.vhost().as_raw_fd();
    // SAFETY: `fe` owns `fd` past the watchdog's disarm.
    let w = Watchdog::arm(unsafe { BorrowedFd::borrow_raw(fd) }, WAIT).unwrap();
    let v = fe.vhost();
    let qi = usize::from(q);
    let r = (|| -> Result<(), vhost::Error> {
        v.set_vring_base(qi, 0)?;
        v.set_vring_addr(qi, &cfg)?;
        v.set_vring_call(qi, &call)?;
        v.set_vring_kick(qi, &kick)?;
        v.set_vring_enable(qi, true)?;
        let _ = kick.write(1);
        // The worker now serves the queue without end; requests still
        // pass.
        for _ in 0..20 {
            v.set_mem_table(&table)?;
        }
        Ok(())
    })();
    assert!(!w.disarm(), "the requests were answered within {WAIT:?}");
    r.unwrap();
    drop(fe);
    serving(d.socket()).unwrap();
    let b = d.stop(WAIT).unwrap();
    assert!(
        b.stats().doorbells > 100,
        "the ring fed itself: {:?}",
        b.stats()
    );
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a thread panicked");
}

/// Seeded sequences of hostile frontend actions, each against a function
/// of its own, leave the daemon serving, and functions `b` and `c`
/// undisturbed (see the module).
#[test]
fn hostile_vhost_user_sequences_leave_the_daemon_serving() {
    count_panics();
    let started = Instant::now();
    let dir = common::TempDir::new("sequences");
    let (uplink, _outside) = MemLink::pair();
    let fns = Functions::new(Box::new(uplink), FunctionsConfig::default());
    let (sb, sc) = (spec(&dir.0, "b", 2), spec(&dir.0, "c", 3));
    fns.add(&sb).expect("function b");
    fns.add(&sc).expect("function c");
    let (tick, ticks) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    let traffic = bystanders(sb.socket.clone(), sc.socket.clone(), ticks, done_tx);
    done.recv_timeout(WAIT).expect("the bystanders connected");
    // Their counters once a first batch went through (every reset of their
    // start is published by then).
    tick.send(()).unwrap();
    done.recv_timeout(WAIT)
        .expect("the bystanders' first messages");
    let before: Vec<_> = ["b", "c"]
        .iter()
        .map(|n| counters(&fns, n).expect("b and c are listed"))
        .collect();
    let undisturbed = || -> Result<(), String> {
        for (name, was) in ["b", "c"].iter().zip(&before) {
            let now = counters(&fns, name).ok_or(format!("{name} is not listed"))?;
            for n in UNDISTURBED {
                if now.get(n) != was.get(n) {
                    return Err(format!(
                        "{name}: {n} moved from {:?} to {:?}",
                        was.get(n),
                        now.get(n)
                    ));
                }
            }
        }
        Ok(())
    };

    let files = Files::new();
    let reached = RefCell::new(BTreeMap::<&str, u64>::new());
    let outcomes = RefCell::new(Outcomes::default());
    let sequences = RefCell::new(0u64);
    let config = Config {
        cases: cases(),
        // A failing sequence is shrunk within a bound: a hang costs
        // STEP_BOUND or more per try.
        max_shrink_iters: 64,
        max_shrink_time: 30_000,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed()));
    let first_failure = RefCell::new(None);
    // One sequence of the run alone, to look into a failure.
    let only: Option<u64> = std::env::var("VRNIC_PROPTEST_ONLY")
        .ok()
        .and_then(|v| v.parse().ok());
    let result = runner.run(&steps(), |steps| {
        let n = {
            let mut n = sequences.borrow_mut();
            *n += 1;
            *n
        };
        if only.is_some_and(|o| o != n) {
            return Ok(());
        }
        // A name and address of its own per sequence: a function that a
        // failed sequence left stuck does not stand in the way of the
        // next (shrinking goes on).
        let name = format!("a{n}");
        let sa = spec(&dir.0, &name, 10 + (n % 240) as u8);
        let r = (|| -> Result<(), String> {
            fns.add(&sa).map_err(|e| format!("function {name}: {e}"))?;
            tick.send(()).map_err(|_| "the bystanders are gone")?;
            let attacked = attack(&sa.socket, &steps, &files, &mut outcomes.borrow_mut());
            let checked = attacked.and_then(|()| serving(&sa.socket));
            let snap = counters(&fns, &name);
            let deleted = fns.del(&name);
            let batch = done.recv_timeout(WAIT);
            checked?;
            deleted.map_err(|e| format!("deleting {name}: {e}"))?;
            batch.map_err(|e| format!("b -> c messages stopped during the sequence: {e}"))?;
            undisturbed()?;
            let snap = snap.ok_or(format!("{name} is not listed"))?;
            let mut reached = reached.borrow_mut();
            for c in REACHED {
                *reached.entry(c).or_default() += snap.get(c).unwrap_or(0);
            }
            if snap.get("engine_panics") != Some(0) {
                return Err("the engine panicked".into());
            }
            if PANICS.load(Ordering::SeqCst) != 0 {
                return Err("a thread panicked".into());
            }
            Ok(())
        })();
        if let Err(e) = &r {
            let mut first = first_failure.borrow_mut();
            if first.is_none() {
                *first = Some(format!(
                    "{e}\nsequence {n} (VRNIC_PROPTEST_ONLY={n} runs it alone): {steps:#?}"
                ));
            }
        }
        r.map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, steps)) => panic!(
            "{why}\nsequence (shrunk as far as the budget allowed): {steps:#?}\n\
             first failure: {}",
            first_failure.borrow().as_deref().unwrap_or("-")
        ),
        Err(TestError::Abort(why)) => panic!("aborted: {why}"),
    }

    // Before the bystanders leave: their going resets their devices.
    undisturbed().unwrap();
    drop(tick);
    traffic
        .join()
        .expect("the bystanders' messages all arrived");
    let reached = reached.into_inner();
    let outcomes = outcomes.into_inner();
    eprintln!(
        "{} sequences in {:.1} s; steps: {outcomes:?}; attacked functions: {reached:?}",
        sequences.into_inner(),
        started.elapsed().as_secs_f64()
    );
    for n in [
        "memory_faults",
        "memory_tables_refused",
        "faulted_commands",
        "rejected_chains",
    ] {
        assert!(
            reached[n] > 0,
            "no sequence reached {n}: the property proves little ({reached:?})"
        );
    }
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a thread panicked");
}
