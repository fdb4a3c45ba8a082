//! guest-lib's vhost-user transport ([`VhostUserTransport`]: a process as
//! the device's vhost-user frontend, the container path) against real
//! daemons: two daemons on the ends of a `MemLink` pair, one program-side
//! context on each, verbs through `vrnic_guest::verbs` on memory the
//! program allocated itself (a `Vec`, not DMA memory), every byte checked.
//! Every wait is bounded (`common::WAIT`).

mod common;

use std::net::Ipv4Addr;

use common::{connect_rc, gid, rc_qp, wait_cq_n, Peer};
use vrnic::device::DeviceConfig;
use vrnic::link::MemLink;
use vrnic_frontend::TestDaemon;
use vrnic_guest::transport::Transport;
use vrnic_guest::verbs::*;
use vrnic_guest::vhost_user::{VhostUserTransport, DEFAULT_TIMEOUT};
use vrnic_vhost::addr::Mac;

fn config(n: u8) -> DeviceConfig {
    let ip = Ipv4Addr::new(10, 0, 0, n);
    DeviceConfig {
        mac: Mac::from_ipv4(ip).0,
        ipv4: ip,
        prefix_len: 24,
        ipv6: Vec::new(),
        link_mtu: 1500,
    }
}

/// One program: its context over the daemon's socket, a PD, a CQ and an
/// RC QP.
struct Program {
    qp: Qp,
    cq: Cq,
    pd: Pd,
    ctx: Context,
}

impl Program {
    fn open(daemon: &TestDaemon) -> Program {
        let (ctx, _conn) = common::open(daemon.socket());
        let pd = Pd::alloc(&ctx).expect("PD");
        let cq = Cq::new(&ctx, 64).expect("CQ");
        let qp = rc_qp(&pd, &cq);
        Program { qp, cq, pd, ctx }
    }

    fn connect(&mut self, peer: &Program, my_psn: u32, peer_psn: u32) {
        let to = Peer {
            gid: gid(&peer.ctx),
            qpn: peer.qp.qp_num(),
            psn: peer_psn,
        };
        connect_rc(&mut self.qp, to, my_psn);
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .collect()
}

/// A page-aligned heap buffer of `pages` pages (inside a larger `Vec`),
/// as a program's malloc'd memory.
struct Heap {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

impl std::ops::Deref for Heap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

impl std::ops::DerefMut for Heap {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

fn heap(pages: usize, fill: u8) -> Heap {
    let v = vec![fill; (pages + 1) * 4096];
    let off = v.as_ptr().align_offset(4096);
    Heap {
        v,
        off,
        len: pages * 4096,
    }
}

#[test]
fn programs_on_two_daemons_send_and_write_into_their_own_heap_memory() {
    let (la, lb) = MemLink::pair();
    let da = TestDaemon::with_device(config(1), Box::new(la)).expect("daemon A");
    let db = TestDaemon::with_device(config(2), Box::new(lb)).expect("daemon B");
    let mut a = Program::open(&da);
    let mut b = Program::open(&db);
    let (pa, pb) = (0x00_1234, 0xff_fff0);
    a.connect(&b, pa, pb);
    b.connect(&a, pb, pa);

    // Unaligned MRs inside malloc'd pages, with neighbours on the same pages.
    let len = 3 * 4096 + 100;
    let mut src = heap(5, 0);
    let data = pattern(7, len);
    src[50..50 + len].copy_from_slice(&data);
    let mut dst = heap(7, 0xa5);
    let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
    {
        let smr = Mr::register(&a.pd, &mut src[50..50 + len], access).expect("register A's heap");
        let dmr =
            Mr::register(&b.pd, &mut dst[10..10 + 2 * len], access).expect("register B's heap");
        // The registration kept what the program had written.
        assert_eq!(smr.to_vec(), data, "A's bytes survive registration");

        // SEND into a posted receive.
        b.qp.post_recv(&RecvWr {
            wr_id: 1,
            sg_list: &[dmr.sge(0, len)],
        })
        .expect("post recv");
        a.qp.post_send(&SendWr {
            wr_id: 2,
            opcode: WrOpcode::Send,
            send_flags: SEND_SIGNALED,
            sg_list: &[smr.sge(0, len)],
            ..Default::default()
        })
        .expect("post send");
        let wa = wait_cq_n(&mut a.cq, 1, "A's SEND");
        assert_eq!(wa[0].status_str(), "success", "{wa:?}");
        let wb = wait_cq_n(&mut b.cq, 1, "B's receive");
        assert_eq!(wb[0].status_str(), "success", "{wb:?}");
        assert_eq!(wb[0].byte_len as usize, len);

        // RDMA WRITE behind it, into the second half of B's MR.
        a.qp.post_send(&SendWr {
            wr_id: 3,
            opcode: WrOpcode::RdmaWrite,
            send_flags: SEND_SIGNALED,
            sg_list: &[smr.sge(0, len)],
            rdma: RdmaWr {
                remote_addr: dmr.addr() + len as u64,
                rkey: dmr.rkey(),
            },
            ..Default::default()
        })
        .expect("post write");
        let wa = wait_cq_n(&mut a.cq, 1, "A's WRITE");
        assert_eq!(wa[0].status_str(), "success", "{wa:?}");
    }
    // Deregistered: the program's memory holds what the device wrote, in
    // place, and is ordinary private memory again.
    assert_eq!(&dst[10..10 + len], &data[..], "SEND landed in B's heap");
    assert_eq!(&dst[10 + len..10 + 2 * len], &data[..], "WRITE landed");
    assert!(
        dst[..10].iter().all(|&x| x == 0xa5),
        "bytes before the MR untouched"
    );
    assert!(
        dst[10 + 2 * len..].iter().all(|&x| x == 0xa5),
        "bytes after the MR untouched"
    );
    dst.fill(1);
    assert!(dst.iter().all(|&x| x == 1), "memory stays writable");
    assert_eq!(&src[50..50 + len], &data[..], "A's buffer unchanged");
}

#[test]
fn registration_is_counted_per_page_and_undone_by_the_last_mr() {
    let (la, _lb) = MemLink::pair();
    let d = TestDaemon::with_device(config(1), Box::new(la)).expect("daemon");
    let mut t = VhostUserTransport::open(d.socket()).expect("transport");
    let mut buf = heap(4, 3);
    let va = buf.as_mut_ptr() as usize;
    t.map_user(va, 3 * 4096).expect("first range");
    t.map_user(va + 2 * 4096, 2 * 4096)
        .expect("overlapping range");
    assert_eq!(t.user_pages(), 4);
    let gpa = t.virt_to_phys(va + 2 * 4096 + 5).expect("translated");
    assert_eq!(t.virt_to_phys(va + 2 * 4096).unwrap() + 5, gpa);
    t.unmap_user(va, 3 * 4096);
    assert_eq!(t.user_pages(), 2, "the shared page stays for the second MR");
    assert_eq!(t.virt_to_phys(va + 2 * 4096 + 5).unwrap(), gpa);
    assert!(
        t.virt_to_phys(va).is_err(),
        "released page no longer translates"
    );
    t.unmap_user(va + 2 * 4096, 2 * 4096);
    assert_eq!(t.user_pages(), 0);
    assert!(buf.iter().all(|&x| x == 3), "contents kept throughout");

    // Unmapped memory is refused, not a crash.
    // SAFETY: a fresh inaccessible reservation, unmapped again below.
    let hole = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(hole, libc::MAP_FAILED);
    // SAFETY: our own mapping.
    unsafe { libc::munmap(hole, 8192) };
    assert!(
        t.map_user(hole as usize, 8192).is_err(),
        "unmapped range refused"
    );
    assert!(t.map_user(va + 1, 4096).is_err(), "unaligned range refused");
    // Memory shared with another process would silently stop being shared.
    // SAFETY: a fresh shared anonymous mapping, unmapped below.
    let shared = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(shared, libc::MAP_FAILED);
    let e = t
        .map_user(shared as usize, 8192)
        .expect_err("a shared mapping is refused");
    assert!(e.to_string().contains("shared mapping"), "{e}");
    // SAFETY: our own mapping.
    unsafe { libc::munmap(shared, 8192) };
    assert_eq!(t.user_pages(), 0);
}

#[test]
fn commands_fail_at_once_with_enodev_once_the_daemon_is_gone() {
    let (la, _lb) = MemLink::pair();
    let d = TestDaemon::with_device(config(1), Box::new(la)).expect("daemon");
    let mut t = VhostUserTransport::open(d.socket()).expect("transport");
    let mut resp = [0u8; 64];
    t.command(vrnic::abi::CMD_QUERY_DEVICE, &[], &mut resp)
        .expect("a command while the daemon runs");
    d.stop(DEFAULT_TIMEOUT).expect("daemon stops");
    let t0 = std::time::Instant::now();
    let e = t
        .command(vrnic::abi::CMD_QUERY_DEVICE, &[], &mut resp)
        .expect_err("no daemon");
    assert!(
        matches!(e, vrnic_guest::transport::TransportError::Status { status, .. } if status == vrnic::abi::STATUS_ENODEV),
        "{e}"
    );
    assert!(
        t0.elapsed() < DEFAULT_TIMEOUT,
        "failed at once, not after the command timeout"
    );
    assert!(!t.is_connected());
}

/// A daemon that takes the connection and never answers (stopped, or
/// wedged) fails `open` once its bound passes, instead of holding the
/// program forever: the vhost crate retries a receive that `SO_RCVTIMEO`
/// ended, so the transport shuts the connection down itself.
#[test]
fn opening_a_socket_whose_daemon_never_answers_fails_within_its_bound() {
    use std::io::Read;
    use std::os::unix::net::UnixListener;
    let dir = common::TempDir::new("silent");
    let path = dir.0.join("silent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let silent = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0u8; 256];
        // Reads the requests, answers none, until the frontend hangs up.
        while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let r = VhostUserTransport::open_within(&p, std::time::Duration::from_millis(300));
        let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
    });
    let r = rx
        .recv_timeout(common::WAIT)
        .expect("open still waiting for a daemon that never answers");
    let e = r.expect_err("opened a device nobody serves");
    assert!(e.contains("no answer"), "{e}");
    silent.join().unwrap();
}
