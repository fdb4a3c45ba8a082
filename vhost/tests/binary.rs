//! The `vrnic` binary: command line, start-up output, serving a frontend on
//! a TAP device, and a clean exit on SIGTERM. The daemon runs in a network
//! namespace of its own (`unshare --net`), which disappears with it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::TempDir;
use vrnic::abi::{self, Pod};
use vrnic_frontend::{FrontendOptions, TestFrontend};

const BIN: &str = env!("CARGO_BIN_EXE_vrnic");
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn the_command_line_requires_one_link() {
    let out = Command::new(BIN)
        .args(["--socket", "/nonexistent/s", "--ip", "10.0.0.1/24"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tap") && err.contains("--netdev"), "{err}");
    let out = Command::new(BIN)
        .args([
            "--socket",
            "/nonexistent/s",
            "--ip",
            "10.0.0.1",
            "--tap",
            "t0",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an address without a prefix is refused"
    );
    let out = Command::new(BIN)
        .args([
            "--socket",
            "/x",
            "--ip",
            "10.0.0.1/24",
            "--tap",
            "t0",
            "--netdev",
            "lo",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "--tap and --netdev exclude each other"
    );
}

#[test]
fn a_file_that_is_not_a_socket_is_left_alone() {
    let dir = TempDir::new("notsock");
    let path = dir.0.join("precious");
    std::fs::write(&path, b"keep me").unwrap();
    let out = Command::new("unshare")
        .args([
            "--net",
            BIN,
            "--tap",
            "vr0",
            "--ip",
            "10.0.0.1/24",
            "--socket",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
}

/// Kills the child on drop unless it already exited (a failing test must
/// not leave the daemon running).
struct Child(Option<std::process::Child>);

impl Drop for Child {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Child {
    /// Starts `vrnic ARGS` in a network namespace of its own
    /// (`unshare --net`); its stdout lines come on the channel, read in a
    /// thread so that every wait on them is bounded.
    fn daemon<S: AsRef<std::ffi::OsStr>>(
        args: impl IntoIterator<Item = S>,
    ) -> (Child, mpsc::Receiver<String>) {
        let mut c = Command::new("unshare")
            .args(["--net", BIN])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("unshare runs");
        let stdout = c.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        (Child(Some(c)), rx)
    }

    fn pid(&self) -> libc::pid_t {
        self.0.as_ref().map_or(0, |c| c.id() as libc::pid_t)
    }

    /// Waits up to [`WAIT`] for the child to exit (then kills it and
    /// panics, saying `after`); its exit status.
    fn wait_exit(mut self, after: &str) -> std::process::ExitStatus {
        let pid = self.pid();
        let mut c = self.0.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(c.wait());
        });
        let Ok(status) = rx.recv_timeout(WAIT) else {
            // SAFETY: kills our own child, by PID, so a failed test leaves nothing behind.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("vrnic did not exit within {WAIT:?} {after}");
        };
        status.unwrap()
    }
}

#[test]
fn serves_a_frontend_on_a_tap_and_exits_cleanly_on_sigterm() {
    let dir = TempDir::new("tap");
    let socket = dir.0.join("vrnic.sock");
    let (child, rx) = Child::daemon([
        "--tap".as_ref(),
        "vr0".as_ref(),
        "--ip".as_ref(),
        "10.0.0.1/24".as_ref(),
        "--queue-size".as_ref(),
        "128".as_ref(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ]);
    let pid = child.pid();

    // The start-up output.
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("vhost-user-test-device-pci"))
    {
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no QEMU arguments printed: {lines:?}"));
        lines.push(line);
    }
    let qemu = lines.last().unwrap();
    for part in [
        "memory-backend-memfd",
        "share=on",
        &format!("path={}", socket.display()),
        "virtio-id=6",
        "num_vqs=3",
        "vq_size=128",
        "config_size=64",
    ] {
        assert!(qemu.contains(part), "{part} missing from {qemu}");
    }

    // A frontend, twice: the daemon keeps listening after a disconnect.
    for _ in 0..2 {
        let mut fe = TestFrontend::connect(&socket, &FrontendOptions::default()).unwrap();
        let cs = fe.config_space().unwrap();
        assert_eq!(cs.signature, abi::SIGNATURE);
        assert_eq!(
            cs.mac,
            [0x02, 0x76, 10, 0, 0, 1],
            "default MAC from the IPv4 address"
        );
        let (h, _) = fe.control(abi::CMD_QUERY_DEVICE, &[]).unwrap();
        assert_eq!(h.status, abi::STATUS_OK);
    }

    // SIGTERM: a clean exit that removes the socket.
    // SAFETY: signals our own child, by PID.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait_exit("after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "the socket file is removed");
}

/// Runs `vrnic ARGS` to completion (bounded by its own CONTROL_TIMEOUT);
/// its stdout, or its stderr as the error.
fn vrnic(args: &[&str]) -> Result<String, String> {
    let out = Command::new(BIN).args(args).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// One daemon with two functions from the command line; a third added,
/// listed, attached to and deleted with `vrnic function` while it runs;
/// SIGTERM removes every socket.
#[test]
fn functions_are_declared_added_listed_and_deleted_with_the_binary() {
    let dir = TempDir::new("functions");
    let a = dir.0.join("a.sock");
    let b = dir.0.join("b.sock");
    let c = dir.0.join("c.sock");
    let ctl = dir.0.join("a.sock.control");
    let b_spec = format!("socket={},ip=10.0.0.2/24,name=b", b.display());
    let (child, rx) = Child::daemon([
        "--tap".as_ref(),
        "vr0".as_ref(),
        "--ip".as_ref(),
        "10.0.0.1/24".as_ref(),
        "--socket".as_ref(),
        a.as_os_str(),
        "--function".as_ref(),
        std::ffi::OsStr::new(&b_spec),
    ]);
    let pid = child.pid();
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.starts_with("vrnic: control socket"))
    {
        let line = rx
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no control socket printed: {lines:?}"));
        lines.push(line);
    }
    let qemu: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("vhost-user-test-device-pci"))
        .collect();
    assert_eq!(qemu.len(), 2, "QEMU arguments for each function: {lines:?}");
    assert!(qemu[1].contains(&format!("path={}", b.display())));

    let ctl_s = ctl.to_str().unwrap();
    let list = vrnic(&["function", "list", "--control", ctl_s]).unwrap();
    let fl: Vec<&str> = list.lines().collect();
    assert_eq!(fl.len(), 3, "{list}");
    assert!(fl[0].starts_with("# 2 of at most 64"), "{list}");
    assert!(fl[1].starts_with("name=a.sock ") && fl[1].contains("ip=10.0.0.1/24"));
    assert!(fl[2].starts_with("name=b ") && fl[2].contains("mac=02:76:0a:00:00:02"));

    vrnic(&[
        "function",
        "add",
        "--control",
        ctl_s,
        "--socket",
        c.to_str().unwrap(),
        "--ip",
        "10.0.0.3/24",
        "--mac",
        "02:00:00:00:00:33",
    ])
    .expect("function add");
    let mut fe = TestFrontend::connect(&c, &FrontendOptions::default()).unwrap();
    assert_eq!(fe.config_space().unwrap().mac, [2, 0, 0, 0, 0, 0x33]);
    let list = vrnic(&["function", "list", "--control", ctl_s]).unwrap();
    assert!(
        list.lines()
            .any(|l| l.starts_with("name=c.sock ") && l.contains(" connected=yes ")),
        "{list}"
    );
    let dup = vrnic(&[
        "function",
        "add",
        "--control",
        ctl_s,
        "--socket",
        "/nonexistent/d",
        "--ip",
        "10.0.0.3/24",
    ])
    .unwrap_err();
    assert!(dup.contains("already used"), "{dup}");
    vrnic(&["function", "del", "--control", ctl_s, "--name", "c.sock"]).expect("function del");
    assert!(!c.exists(), "c's socket removed");
    assert!(fe.config_space().is_err(), "c's connection closed");

    // SAFETY: signals our own child, by PID.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait_exit("after SIGTERM");
    assert!(status.success(), "{status:?}");
    for p in [&a, &b, &ctl] {
        assert!(!p.exists(), "{} removed", p.display());
    }
}

/// `--once`: the daemon ends, cleanly, when its first frontend leaves,
/// also with a second function declared.
#[test]
fn once_ends_the_daemon_with_the_first_functions_first_connection() {
    let dir = TempDir::new("once");
    let a = dir.0.join("a.sock");
    let b = dir.0.join("b.sock");
    let b_spec = format!("socket={},ip=10.0.0.2/24", b.display());
    let (child, rx) = Child::daemon([
        "--tap".as_ref(),
        "vr0".as_ref(),
        "--ip".as_ref(),
        "10.0.0.1/24".as_ref(),
        "--once".as_ref(),
        "--socket".as_ref(),
        a.as_os_str(),
        "--function".as_ref(),
        std::ffi::OsStr::new(&b_spec),
    ]);
    loop {
        let line = rx.recv_timeout(WAIT).expect("the daemon starts");
        if line.starts_with("vrnic: control socket") {
            break;
        }
    }
    let mut fe = TestFrontend::connect(&a, &FrontendOptions::default()).unwrap();
    assert_eq!(fe.config_space().unwrap().signature, abi::SIGNATURE);
    drop(fe);
    let status = child.wait_exit("after its frontend left (--once)");
    assert!(status.success(), "{status:?}");
    assert!(!a.exists() && !b.exists(), "sockets removed");
}

/// RC traffic between two functions of one daemon (their program on each,
/// through the embedded switch), in a thread: SENDs of 4 KiB, each
/// checked byte for byte, until `stop`; the count of messages checked so
/// far in `done`. Panics on any failed completion or corrupted byte.
fn traffic(
    a: std::path::PathBuf,
    b: std::path::PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    use common::*;
    use std::sync::atomic::Ordering;
    use vrnic_guest::verbs::{Cq, Pd};
    std::thread::spawn(move || {
        let (ca, _conn_a) = open(&a);
        let (cb, _conn_b) = open(&b);
        let (pa, pb) = (Pd::alloc(&ca).unwrap(), Pd::alloc(&cb).unwrap());
        let (mut qa_cq, mut qb_cq) = (Cq::new(&ca, 64).unwrap(), Cq::new(&cb, 64).unwrap());
        let (mut qa, mut qb) = (rc_qp(&pa, &qa_cq), rc_qp(&pb, &qb_cq));
        let to_b = Peer {
            gid: gid(&cb),
            qpn: qb.qp_num(),
            psn: 200,
        };
        let to_a = Peer {
            gid: gid(&ca),
            qpn: qa.qp_num(),
            psn: 100,
        };
        connect_rc(&mut qa, to_b, 100);
        connect_rc(&mut qb, to_a, 200);
        let len = 4096;
        let src = buffer(&pa, len, &[]);
        let dst = buffer(&pb, len, &[]);
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let data = pattern(len, i as u8);
            src.write(0, &data);
            recv(&mut qb, i, Some(dst.sge(0, len)));
            send(&mut qa, i, src.sge(0, len));
            let rc = wait_cq(&mut qb_cq, "traffic: receive");
            let sc = wait_cq(&mut qa_cq, "traffic: send");
            assert_eq!((rc.status, sc.status), (abi::WC_SUCCESS, abi::WC_SUCCESS));
            assert_eq!(dst.to_vec(), data, "message {i} byte for byte");
            i += 1;
            done.fetch_add(1, Ordering::Relaxed);
        }
    })
}

/// Waits up to [`WAIT`] until `f` holds; panics naming `what`.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            std::time::Instant::now() < until,
            "{what}: not within {WAIT:?}"
        );
        std::thread::yield_now();
    }
}

/// The counter `name` of the function at `socket` (`vrnic stats`).
fn counter(socket: &std::path::Path, name: &str) -> u64 {
    let out = vrnic(&["stats", "--socket", socket.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("vrnic stats: {e} (is the daemon gone?)"));
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {out}"))
}

/// A daemon (in a namespace of its own) with three functions, sockets
/// `a.sock`, `b.sock`, `c.sock` in `dir`, 10.0.0.1-3; returned once it has
/// printed its control socket.
fn three_functions(dir: &TempDir) -> (Child, [std::path::PathBuf; 3]) {
    let socks = ["a", "b", "c"].map(|n| dir.0.join(format!("{n}.sock")));
    let b_spec = format!("socket={},ip=10.0.0.2/24", socks[1].display());
    let c_spec = format!("socket={},ip=10.0.0.3/24", socks[2].display());
    let (child, rx) = Child::daemon([
        "--tap".as_ref(),
        "vr0".as_ref(),
        "--ip".as_ref(),
        "10.0.0.1/24".as_ref(),
        "--socket".as_ref(),
        socks[0].as_os_str(),
        "--function".as_ref(),
        std::ffi::OsStr::new(&b_spec),
        "--function".as_ref(),
        std::ffi::OsStr::new(&c_spec),
    ]);
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.starts_with("vrnic: control socket"))
    {
        lines.push(rx.recv_timeout(WAIT).expect("the daemon starts"));
    }
    (child, socks)
}

/// Issue 27, finding 1: a frontend that declares a region past the end of
/// its memfd, or shrinks the memfd after `SET_MEM_TABLE` and makes the
/// device read the lost pages, gets its connection closed and a counter;
/// the daemon lives on (before the fix it died of SIGBUS) and the RC
/// traffic between two other functions carries on, every message intact.
#[test]
fn a_frontend_whose_memory_loses_its_backing_cannot_end_the_daemon() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use vrnic_frontend::Buffer;
    let dir = TempDir::new("sigbus");
    let (child, [a, b, c]) = three_functions(&dir);

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let t = traffic(b.clone(), c.clone(), stop.clone(), done.clone());
    wait_until("traffic before the attacks", || {
        done.load(Ordering::Relaxed) >= 20 || t.is_finished()
    });

    // 1. A memory table whose region runs past the end of its file.
    let mut fe = TestFrontend::connect(&a, &FrontendOptions::default()).unwrap();
    let mut infos = fe.memory().region_infos().unwrap();
    let (base, size) = fe.memory().regions()[0];
    infos[0].memory_size += 1 << 20;
    let _ = vhost::VhostBackend::set_mem_table(fe.vhost(), &infos);
    // A command whose request lies past the file's end, should the table
    // have been taken.
    let resp = fe.memory_mut().alloc(64, 8).unwrap();
    let _ = fe.post(
        abi::CONTROLQ,
        &[
            Buffer::readable(base + size + 4096, 64),
            Buffer::writable(resp, 64),
        ],
    );
    wait_until("the table past the file's end refused", || {
        counter(&a, "memory_tables_refused") == 1
    });
    assert!(fe.config_space().is_err(), "the connection is closed");
    drop(fe);

    // 2. The memfd shrunk after SET_MEM_TABLE, then a command whose
    //    request lies in the lost pages (this process never touches them).
    let mut fe = TestFrontend::connect(&a, &FrontendOptions::default()).unwrap();
    let (base, size) = fe.memory().regions()[0];
    let resp = fe.memory_mut().alloc(64, 8).unwrap();
    fe.memory().shrink_file(size / 2).unwrap();
    fe.post(
        abi::CONTROLQ,
        &[
            Buffer::readable(base + size - 4096, 64),
            Buffer::writable(resp, 64),
        ],
    )
    .unwrap();
    wait_until("the lost memory answered", || {
        counter(&a, "memory_faults") == 1
    });
    assert!(fe.config_space().is_err(), "the connection is closed");
    drop(fe);

    // The function serves a well-behaved frontend again.
    let mut fe = TestFrontend::connect(&a, &FrontendOptions::default()).unwrap();
    let (h, _) = fe.control(abi::CMD_QUERY_DEVICE, &[]).unwrap();
    assert_eq!(h.status, abi::STATUS_OK);
    drop(fe);

    // The other functions' traffic went on.
    let after = done.load(Ordering::Relaxed);
    wait_until("traffic after the attacks", || {
        done.load(Ordering::Relaxed) >= after + 20 || t.is_finished()
    });
    stop.store(true, Ordering::Relaxed);
    t.join()
        .expect("the traffic between the other functions never failed");
    assert!(done.load(Ordering::Relaxed) >= after + 20);
    assert_eq!(counter(&b, "memory_faults"), 0);

    let pid = child.pid();
    // SAFETY: signals our own child, by PID.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait_exit("after SIGTERM");
    assert!(status.success(), "the daemon lived through it: {status:?}");
}

/// Issue 27, finding 2: a frontend that keeps its control queue full ahead
/// of the device (moving the avail index on as fast as the device uses
/// chains) holds neither its worker nor the daemon's poller: every pass
/// over a queue is bounded, so the RC traffic between two other functions
/// goes on while it floods. Before the fix the poller, once it served the
/// flooding function, never left that function's queue, and the functions
/// it polled (their drivers' notifications off) stalled.
#[test]
fn a_frontend_flooding_its_queue_does_not_stall_the_other_functions() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let dir = TempDir::new("flood");
    let (child, [a, b, c]) = three_functions(&dir);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let t = traffic(b.clone(), c.clone(), stop.clone(), done.clone());
    wait_until("traffic before the flood", || {
        done.load(Ordering::Relaxed) >= 20 || t.is_finished()
    });

    // A's device in use, then taken over by the poller serving B and C.
    let opts = FrontendOptions {
        memory: vec![(0x4000_0000, 16 << 20)],
        ..Default::default()
    };
    let mut fe = TestFrontend::connect(&a, &opts).unwrap();
    let (h, pd) = fe.control(abi::CMD_ALLOC_PD, &[]).unwrap();
    assert_eq!(h.status, abi::STATUS_OK);
    // The flood's command: a REG_MR of 2^14 pages whose last page is
    // unaligned: the device reads and checks the whole list (milliseconds)
    // before it refuses it (EINVAL) and keeps nothing. The flooder sleeps
    // 1 ms between moves of the avail index (it stays a ring ahead): the
    // test measures the daemon, not a core taken by the test itself.
    let npages = 1u32 << 14;
    let list = fe.memory_mut().alloc(u64::from(npages) * 8, 4096).unwrap();
    let page = fe.memory_mut().alloc(4096, 4096).unwrap();
    let mut entries: Vec<u8> = (0..npages).flat_map(|_| page.to_le_bytes()).collect();
    let last = entries.len() - 8;
    entries[last..].copy_from_slice(&(page + 1).to_le_bytes());
    vrnic::mem::DmaMemory::write(&fe.memory().mem(), list, &entries).unwrap();
    let reg = abi::RegMr {
        pdn: u32::from_le_bytes(pd[..4].try_into().unwrap()),
        access: abi::ACCESS_LOCAL_WRITE,
        iova: 0,
        length: u64::from(npages) * 4096,
        page_shift: 12,
        npages,
        page_list: list,
    };
    let (h, _) = fe.control(abi::CMD_REG_MR, reg.as_bytes()).unwrap();
    assert_eq!(h.status, abi::STATUS_EINVAL, "the flood's command fails");
    wait_until("A adopted by the poller", || {
        counter(&a, "poll_adopted") >= 1
    });

    let flooding = Arc::new(AtomicBool::new(false));
    let flood = {
        let flooding = flooding.clone();
        std::thread::spawn(move || {
            fe.flood_control(
                abi::CMD_REG_MR,
                reg.as_bytes(),
                &flooding,
                Duration::from_millis(1),
            )
        })
    };
    wait_until("the flood under way", || counter(&a, "commands") >= 100);
    let during = done.load(Ordering::Relaxed);
    wait_until("traffic during the flood", || {
        done.load(Ordering::Relaxed) >= during + 20 || t.is_finished()
    });
    let served = done.load(Ordering::Relaxed) - during;
    flooding.store(true, Ordering::Relaxed);
    let moves = flood.join().unwrap().expect("the flood ran");
    stop.store(true, Ordering::Relaxed);
    t.join()
        .expect("the traffic between the other functions never failed");
    assert!(served >= 20, "{served} messages during the flood");
    eprintln!(
        "flood: {moves} index moves, {} commands served; {served} messages between the others meanwhile",
        counter(&a, "commands")
    );

    let pid = child.pid();
    // SAFETY: signals our own child, by PID.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait_exit("after SIGTERM");
    assert!(status.success(), "{status:?}");
}
