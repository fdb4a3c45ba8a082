//! Issue 9, hostile peers on the wire: named regressions.
//!
//! - Item 1, off-path packets into a connected QP (rxe_recv.c's
//!   `check_type_state`, `check_addr`, `check_keys`):
//!   `off_path_write_from_other_ip_is_dropped`,
//!   `forged_ack_from_other_ip_is_dropped`,
//!   `forged_nak_from_other_ip_is_dropped`, `wrong_pkey_is_dropped`,
//!   `request_to_qp_not_ready_is_dropped`, `pkey_table_is_queryable`.
//!
//! A third host on the segment ("the attacker", 10.0.0.66) is simulated by
//! handing crafted frames straight to a device's `receive`; what the device
//! answers is collected from its transmit queue. Simulated clock only;
//! every wait is bounded.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::*;
use vrnic::abi;
use vrnic::wire::{self, Aeth, Bth, Frame, NakCode, Opcode, Reth, RoceHeaders};

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;

const ATTACKER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 66);
const ATTACKER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 66];

fn setup() -> RcPair {
    let (la, lb) = QueueLink::pair();
    RcPair::on((Box::new(la), Box::new(lb)), ConnOpts::default(), true)
}

/// A RoCEv2 frame from `src` (IP, MAC) to `dst`'s port for QP `dest_qp`.
fn frame(
    src: (Ipv4Addr, [u8; 6]),
    dst: &Node,
    dest_qp: u32,
    opcode: Opcode,
    psn: u32,
    pkey: u16,
) -> RoceHeaders {
    RoceHeaders {
        eth_src: src.1,
        eth_dst: dst.dev.config_space().mac,
        ip_src: IpAddr::V4(src.0),
        ip_dst: IpAddr::V4(dst.ip),
        ip_id: 0,
        ttl: 64,
        tclass: 0,
        flow_label: 0,
        udp_src: 0xc000,
        bth: Bth {
            opcode,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            tver: 0,
            pkey,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: true,
            psn,
        },
        reth: None,
        aeth: None,
        atomic_eth: None,
        atomic_ack_eth: None,
        deth: None,
        immdt: None,
        ieth: None,
    }
}

/// Hands the frame `hdr` + `payload` to `n`'s device and returns the RoCEv2
/// frames it answers (not delivered anywhere).
fn inject(
    n: &mut Node,
    hdr: &RoceHeaders,
    payload: &[u8],
    now: u64,
) -> Vec<wire::RocePacket<'static>> {
    let mut f = Vec::new();
    wire::emit_frame(hdr, payload, &mut f);
    n.dev.receive(&n.mem, &f, now);
    let mut out = Vec::new();
    while let Some(t) = n.dev.pop_tx() {
        let t: &'static [u8] = Box::leak(t.into_boxed_slice());
        if let Ok(Frame::Roce(p)) = wire::parse_frame(t) {
            out.push(p);
        }
    }
    out
}

/// B's QP memory: one 4 KiB MR filled with 0x5a; returns (addr, rkey).
fn victim_mr(s: &mut RcPair) -> (u64, u32) {
    let buf = s.b.alloc(4096);
    s.b.fill(buf, &[0x5a; 4096]);
    let (_, rkey) = s.b.reg_mr(s.pdb, buf, 4096, ALL).unwrap();
    (buf, rkey)
}

/// A SEND of 16 bytes from A that arrives intact proves the connection
/// still works after the attack.
fn connection_still_works(s: &mut RcPair, what: &str) {
    let src = s.a.alloc(4096);
    s.a.fill(src, &[7; 16]);
    let (lkey, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let dst = s.b.alloc(4096);
    let (lkey_b, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 77, &[sge(dst, 4096, lkey_b)], now);
    s.post(
        abi::SendWqe {
            wr_id: 78,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[sge(src, 16, lkey)],
    );
    let c = s.cqe(false, what);
    assert_eq!((c.wr_id, c.status), (78, abi::WC_SUCCESS), "{what}: send");
    let c = s.cqe(true, what);
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (77, abi::WC_SUCCESS, 16),
        "{what}: recv"
    );
    assert_eq!(s.b.read(dst, 16), vec![7; 16], "{what}: data");
}

#[test]
fn off_path_write_from_other_ip_is_dropped() {
    let mut s = setup();
    let (buf, rkey) = victim_mr(&mut s);
    let (qpn_b, now) = (s.qb.qpn, s.now);
    let attacker = (ATTACKER_IP, ATTACKER_MAC);
    // An out-of-sequence SEND: today the NAK that comes back tells the
    // attacker the expected PSN.
    let probe = frame(attacker, &s.b, qpn_b, Opcode::RcSendOnly, 0x40_0000, 0xffff);
    let probe_replies = inject(&mut s.b, &probe, &[0; 4], now);
    // The WRITE at the PSN the NAK named.
    let psn = probe_replies.first().map_or(0, |r| r.hdr.bth.psn);
    let mut w = frame(attacker, &s.b, qpn_b, Opcode::RcWriteOnly, psn, 0xffff);
    w.reth = Some(Reth {
        va: buf,
        rkey,
        dma_len: 16,
    });
    let replies = inject(&mut s.b, &w, &[0xee; 16], now);
    let mem = s.b.read(buf, 4096);
    assert!(
        mem.iter().all(|&x| x == 0x5a),
        "victim memory changed: {:x?}",
        &mem[..32]
    );
    assert!(
        probe_replies.is_empty(),
        "B answered an off-path probe: {probe_replies:?}"
    );
    assert!(
        replies.is_empty(),
        "B answered an off-path WRITE: {replies:?}"
    );
    assert_eq!(s.b.dev.stats().rx_drop_bad_src_addr, 2);
    assert_eq!(s.b.qp_state(qpn_b), abi::QPS_RTS);
    connection_still_works(&mut s, "after the off-path write");
}

/// After one SEND that went through (neighbours resolved), A posts a
/// signalled SEND that is on the wire but not delivered yet (nothing
/// pumped): its PSN is 1.
fn undelivered_send(s: &mut RcPair) -> u64 {
    connection_still_works(s, "warm-up");
    let src = s.a.alloc(4096);
    let (lkey, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    s.post(
        abi::SendWqe {
            wr_id: 5,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[sge(src, 8, lkey)],
    );
    src
}

/// After a forged response: A has no completion, its QP is in RTS, and
/// once the real peer gets the SEND everything completes normally.
fn send_survives(s: &mut RcPair, what: &str) {
    assert_eq!(s.a.poll_cq(&mut s.ca), None, "{what}: A completed a WQE");
    let qpn_a = s.qa.qpn;
    assert_eq!(s.a.qp_state(qpn_a), abi::QPS_RTS, "{what}: A's QP state");
    assert_eq!(s.a.dev.stats().rx_drop_bad_src_addr, 1, "{what}: counter");
    assert_eq!(s.a.dev.qp_stats()[0].1.rx_dropped, 1, "{what}: QP counter");
    let dst = s.b.alloc(4096);
    let (lkey_b, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    let now = s.now;
    s.b.post_recv(&mut s.qb, 9, &[sge(dst, 4096, lkey_b)], now);
    let c = s.cqe(false, what);
    assert_eq!((c.wr_id, c.status), (5, abi::WC_SUCCESS), "{what}");
    let c = s.cqe(true, what);
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (9, abi::WC_SUCCESS, 8),
        "{what}"
    );
}

#[test]
fn forged_ack_from_other_ip_is_dropped() {
    let mut s = setup();
    undelivered_send(&mut s);
    let (qpn_a, now) = (s.qa.qpn, s.now);
    let mut ack = frame(
        (ATTACKER_IP, ATTACKER_MAC),
        &s.a,
        qpn_a,
        Opcode::RcAck,
        1,
        0xffff,
    );
    ack.aeth = Some(Aeth::ack(2, 0x1f));
    inject(&mut s.a, &ack, &[], now);
    send_survives(&mut s, "forged ACK");
}

#[test]
fn forged_nak_from_other_ip_is_dropped() {
    let mut s = setup();
    undelivered_send(&mut s);
    let (qpn_a, now) = (s.qa.qpn, s.now);
    let mut nak = frame(
        (ATTACKER_IP, ATTACKER_MAC),
        &s.a,
        qpn_a,
        Opcode::RcAck,
        1,
        0xffff,
    );
    nak.aeth = Some(Aeth::nak(1, NakCode::RemoteAccessError));
    inject(&mut s.a, &nak, &[], now);
    send_survives(&mut s, "forged NAK");
}

#[test]
fn wrong_pkey_is_dropped() {
    let mut s = setup();
    let (buf, rkey) = victim_mr(&mut s);
    let (qpn_b, now) = (s.qb.qpn, s.now);
    // From A's own address, at the expected PSN: only the P_Key is wrong.
    let a = (s.a.ip, s.a.dev.config_space().mac);
    let write = |s: &RcPair, pkey: u16, psn: u32| {
        let mut w = frame(a, &s.b, qpn_b, Opcode::RcWriteOnly, psn, pkey);
        w.reth = Some(Reth {
            va: buf,
            rkey,
            dma_len: 16,
        });
        w
    };
    for pkey in [0x1234, 0x0000, 0x8000, 0x7ffe] {
        let w = write(&s, pkey, 0);
        let replies = inject(&mut s.b, &w, &[0xee; 16], now);
        assert!(replies.is_empty(), "P_Key {pkey:#x} answered: {replies:?}");
    }
    assert_eq!(s.b.read(buf, 16), vec![0x5a; 16], "memory changed");
    assert_eq!(s.b.dev.stats().rx_drop_bad_pkey, 4);
    // A limited member of the default partition (0x7fff) may talk to the
    // port's full member 0xffff (IBTA §10.9.3): accepted and ACKed.
    let w = write(&s, 0x7fff, 0);
    let replies = inject(&mut s.b, &w, &[0xee; 16], now);
    assert_eq!(replies.len(), 1, "limited-member P_Key: one ACK");
    assert_eq!(replies[0].hdr.bth.opcode, Opcode::RcAck);
    assert_eq!(s.b.read(buf, 16), vec![0xee; 16]);
    assert_eq!(s.b.dev.stats().rx_drop_bad_pkey, 4);
}

#[test]
fn request_to_qp_not_ready_is_dropped() {
    // B's QP stays in RESET, then INIT: requests are dropped and counted
    // (rxe's check_type_state: a request needs RTR or later).
    let (la, lb) = QueueLink::pair();
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), ConnOpts::default(), false);
    let (qpn_b, now) = (s.qb.qpn, s.now);
    let a = (s.a.ip, s.a.dev.config_space().mac);
    let f = frame(a, &s.b, qpn_b, Opcode::RcSendOnly, 0, 0xffff);
    assert!(inject(&mut s.b, &f, &[0; 4], now).is_empty());
    let init = conn_attrs(qpn_b, s.a.ip, s.qa.qpn, ConnOpts::default())[0];
    s.b.cmd(abi::CMD_MODIFY_QP, &init).unwrap();
    assert!(inject(&mut s.b, &f, &[0; 4], now).is_empty());
    assert_eq!(s.b.dev.stats().rx_drop_qp_state, 2);
}

#[test]
fn pkey_table_is_queryable() {
    let mut s = setup();
    let q = |index| abi::QueryPkey { port: 1, index };
    let r = s.b.cmd(abi::CMD_QUERY_PKEY, &q(0)).unwrap();
    let e = <abi::PkeyEntry as abi::Pod>::read_from(&r).unwrap();
    assert_eq!(e.pkey, 0xffff);
    assert_eq!(s.b.cmd(abi::CMD_QUERY_PKEY, &q(1)), Err(abi::STATUS_ENOENT));
}
