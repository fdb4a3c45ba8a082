//! Two engines of one process (a daemon's functions, through its embedded
//! switch) leave the ICRC out of the frames between them
//! (`Link::local_macs`, `wire::Icrc::Unneeded`), and RC works as on a
//! wire: SEND, WRITE and a READ whose stream holds the requests behind it
//! (held requests are processed later), and the frames between them
//! carry batches of packets (`wire::gso`), each packet handled on its own.

mod common;

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use common::*;
use vrnic::abi;
use vrnic::data::PeerMemory;
use vrnic::link::{Icrc, Link, LocalMacs, LocalReach, MemLink};
use vrnic::wire::{self, WireError};

const ALL: u32 = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;

/// A [`MemLink`] that, like a port of the embedded switch, reaches
/// `peer` within the process: frames to it need no ICRC. Counts the
/// RoCEv2 frames it carried without one, and the batches among them.
struct LocalLink {
    inner: MemLink,
    peer: [u8; 6],
    bare: Arc<AtomicU64>,
    batches: Arc<AtomicU64>,
    /// Receive buffer: a batch is longer than a wire's frame.
    buf: Vec<u8>,
    /// With payloads by reference: the peer's memory, once it exists.
    peer_mem: Option<PeerSlot>,
}

type PeerSlot = Arc<OnceLock<Arc<dyn PeerMemory>>>;

/// A peer that reads this device's memory, and whose memory this device
/// reads: packets between them may leave their payload in the sender's
/// memory (`LocalReach::by_reference`).
struct ByRef {
    peer: [u8; 6],
    mem: PeerSlot,
}

impl LocalReach for ByRef {
    fn contains(&self, mac: &[u8; 6]) -> bool {
        *mac == self.peer
    }
    fn by_reference(&self, mac: &[u8; 6]) -> bool {
        *mac == self.peer && self.mem.get().is_some()
    }
    fn memory_of(&self, mac: &[u8; 6]) -> Option<Arc<dyn PeerMemory>> {
        (*mac == self.peer)
            .then(|| self.mem.get().cloned())
            .flatten()
    }
}

impl Link for LocalLink {
    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if wire::parse_roce(frame).err() == Some(WireError::BadIcrc)
            && wire::parse_roce_with(frame, Icrc::Unneeded).is_ok()
        {
            self.bare.fetch_add(1, Ordering::Relaxed);
            if wire::gso::is_batch(frame) {
                self.batches.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.inner.send(frame)
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        self.inner.recv(buf)
    }

    fn recv_with(
        &mut self,
        _buf: &mut [u8],
        deliver: &mut dyn FnMut(&[u8], Icrc),
    ) -> io::Result<bool> {
        match self.inner.recv(&mut self.buf)? {
            Some(n) => {
                deliver(&self.buf[..n], Icrc::Unneeded);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn raw_fd(&self) -> Option<RawFd> {
        None
    }

    fn local_macs(&self) -> Option<LocalMacs> {
        let peer = self.peer;
        Some(match &self.peer_mem {
            Some(mem) => LocalMacs::with(ByRef {
                peer,
                mem: mem.clone(),
            }),
            None => LocalMacs::new(move |m: &[u8; 6]| *m == peer),
        })
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

#[test]
fn rc_between_engines_of_one_process_needs_no_icrc() {
    rc_between_engines(false);
}

/// The same, the payloads of SEND, WRITE and READ response packets left
/// in the sender's memory for the receiver to copy from there
/// (`vrnic::data`): the data arrives intact, also through the requests
/// held behind the READ.
#[test]
fn payloads_by_reference_arrive_intact() {
    rc_between_engines(true);
}

fn rc_between_engines(by_ref: bool) {
    let (la, lb) = MemLink::pair();
    let (slot_a, slot_b): (PeerSlot, PeerSlot) = Default::default();
    let bare = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let buf = vec![0; wire::gso::BATCH_MAX_BYTES];
    // Node::new gives node n the MAC 2:0:0:0:0:n.
    let la = LocalLink {
        inner: la,
        peer: [2, 0, 0, 0, 0, 2],
        bare: bare.clone(),
        batches: batches.clone(),
        buf: buf.clone(),
        peer_mem: by_ref.then(|| slot_b.clone()),
    };
    let lb = LocalLink {
        inner: lb,
        peer: [2, 0, 0, 0, 0, 1],
        bare: bare.clone(),
        batches: batches.clone(),
        buf: buf.clone(),
        peer_mem: by_ref.then(|| slot_a.clone()),
    };
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), o, true);
    // Each side reads the other's memory (as the switch's ports do).
    let _ = slot_a.set(s.a.mem.clone());
    let _ = slot_b.set(s.b.mem.clone());
    let local = s.a.link.local_macs();
    s.a.dev.set_local_macs(local);
    let local = s.b.link.local_macs();
    s.b.dev.set_local_macs(local);

    // A READ of 100 packets from B, then a SEND and a WRITE right behind
    // it (in the RC window of 128 packets): B holds them while its READ
    // response stream runs (64 packets a turn).
    let len = 100 * 4096;
    let (rsrc, rdst) = (s.b.alloc(len), s.a.alloc(len));
    let rdata = pattern(len, 1);
    s.b.fill(rsrc, &rdata);
    let (_, rk_b) = s.b.reg_mr(s.pdb, rsrc, len as u64, ALL).unwrap();
    let (lk_a, _) = s.a.reg_mr(s.pda, rdst, len as u64, ALL).unwrap();
    let slen = 10_000;
    let (ssrc, sdst) = (s.a.alloc(slen), s.b.alloc(slen));
    let sdata = pattern(slen, 2);
    s.a.fill(ssrc, &sdata);
    let (lk_s, _) = s.a.reg_mr(s.pda, ssrc, slen as u64, ALL).unwrap();
    let (lk_d, rk_d) = s.b.reg_mr(s.pdb, sdst, slen as u64, ALL).unwrap();
    let wlen = 9000;
    let wdst = s.b.alloc(wlen);
    let (_, rk_w) = s.b.reg_mr(s.pdb, wdst, wlen as u64, ALL).unwrap();
    let _ = rk_d;
    let now = s.now;
    s.b.post_recv(&mut s.qb, 7, &[sge(sdst, slen as u32, lk_d)], now);
    let read = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_READ,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: rsrc,
        rkey: rk_b,
        ..Default::default()
    };
    s.post(read, &[sge(rdst, len as u32, lk_a)]);
    let send = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    s.post(send, &[sge(ssrc, slen as u32, lk_s)]);
    let write = abi::SendWqe {
        wr_id: 3,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: wdst,
        rkey: rk_w,
        ..Default::default()
    };
    s.post(write, &[sge(ssrc, wlen as u32, lk_s)]);

    for want in 1..=3u64 {
        let c = s.cqe(false, "A's completions");
        assert_eq!((c.wr_id, c.status), (want, abi::WC_SUCCESS), "{c:?}");
    }
    let c = s.cqe(true, "B's receive");
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (7, abi::WC_SUCCESS, slen as u32)
    );
    assert!(s.a.read(rdst, len) == rdata, "READ data differs");
    assert!(s.b.read(sdst, slen) == sdata, "SEND data differs");
    assert!(s.b.read(wdst, wlen) == sdata[..wlen], "WRITE data differs");
    // Again with no READ in the way: B executes the SEND and the WRITE as
    // they come (their payloads copied from A's memory by reference).
    let fresh = pattern(slen, 3);
    s.a.fill(ssrc, &fresh);
    let sdst2 = s.b.alloc(slen);
    let (lk_d2, _) = s.b.reg_mr(s.pdb, sdst2, slen as u64, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 8, &[sge(sdst2, slen as u32, lk_d2)], now);
    s.post(
        abi::SendWqe { wr_id: 4, ..send },
        &[sge(ssrc, slen as u32, lk_s)],
    );
    s.post(
        abi::SendWqe { wr_id: 5, ..write },
        &[sge(ssrc, wlen as u32, lk_s)],
    );
    for want in 4..=5u64 {
        let c = s.cqe(false, "A's completions");
        assert_eq!((c.wr_id, c.status), (want, abi::WC_SUCCESS), "{c:?}");
    }
    let c = s.cqe(true, "B's receive");
    assert_eq!((c.wr_id, c.status), (8, abi::WC_SUCCESS));
    assert!(s.b.read(sdst2, slen) == fresh, "second SEND data differs");
    assert!(
        s.b.read(wdst, wlen) == fresh[..wlen],
        "second WRITE data differs"
    );
    let (sa, sb) = (s.a.dev.stats(), s.b.dev.stats());
    assert_eq!((sa.icrc_errors, sb.icrc_errors), (0, 0));
    assert_eq!(
        sa.retransmits + sb.retransmits,
        0,
        "nothing lost or dropped"
    );
    // 100 READ responses, 3 SEND and 3 WRITE packets, the requests, ACKs.
    // Batched: fewer frames than packets.
    let (bare, batches) = (
        bare.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
    );
    assert!(
        bare >= 6 && batches >= 4,
        "{bare} frames without ICRC, {batches} batches"
    );
    assert_eq!(
        sb.tx_frames + sa.tx_frames,
        sa.rx_frames + sb.rx_frames,
        "every packet counted once each way"
    );
    assert!(
        sb.tx_frames >= 100,
        "B sent its 100 READ responses as packets"
    );
}
