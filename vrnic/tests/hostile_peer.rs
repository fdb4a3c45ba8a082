//! Issue 9, hostile peers on the wire: named regressions.
//!
//! - Item 1, off-path packets into a connected QP (rxe_recv.c's
//!   `check_type_state`, `check_addr`, `check_keys`):
//!   `off_path_write_from_other_ip_is_dropped`,
//!   `forged_ack_from_other_ip_is_dropped`,
//!   `forged_nak_from_other_ip_is_dropped`, `wrong_pkey_is_dropped`,
//!   `request_to_qp_not_ready_is_dropped`, `pkey_table_is_queryable`,
//!   `off_path_write_over_ipv6_is_dropped` (source and destination GID
//!   over IPv6), `ud_wrong_pkey_or_qkey_is_dropped`.
//! - Item 4, protocol arithmetic (max_msg_sz 2^31 on both sides, rxe's
//!   `check_length`; no address or length sum wraps):
//!   `send_past_max_msg_sz_is_naked`, `read_request_over_max_msg_sz_is_naked`,
//!   `read_rerequest_near_u64_max_does_not_panic`,
//!   `wrapping_remote_range_rejected` (guest-lib's `post_send` side:
//!   `guest-lib/tests/verbs_transports_loopback.rs`).
//! - Item 5, neighbour tables (RFC 826, RFC 4861; bounded, expiring):
//!   `arp_from_stranger_not_learned`, `ns_from_stranger_not_learned`,
//!   `neighbour_table_bounded`, `neighbour_entries_expire`,
//!   `neighbour_in_use_is_reprobed_not_dropped`.
//! - Item 3, READ amplification (rxe_resp.c's `read_reply`, one response
//!   per step, and `duplicate_request`): `huge_read_is_paced`,
//!   `duplicate_read_does_not_multiply_responses`, `many_huge_reads_bounded`,
//!   `requests_behind_a_read_wait_for_its_responses` (held in order, within
//!   `RESP_HOLD_MAX`), `requests_behind_a_read_within_the_window_are_not_lost`, `read_response_lost_mid_stream_is_re_requested`
//!   (go-back-N into a stream in progress),
//!   `read_streams_of_many_qps_take_turns` (polls serve the QPs round
//!   robin under the link backlog).
//! - Issue 27, finding A (rxe_resp.c's `check_rkey` for every WRITE
//!   packet): `write_packets_after_their_mr_went_away_do_not_land`, one
//!   packet per frame (`local_icrc.rs` has the twin for runs).
//! - Issue 27, finding B (replies bounded while the link is held):
//!   `replies_to_a_flood_while_the_link_is_held_stay_bounded`.
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

// ---------------------------------------------------------------------------
// Item 4: protocol arithmetic. Every length and address sum from a WQE or a
// packet is checked; max_msg_sz (2^31) is enforced on both sides.

/// Largest message, bytes (`PortAttr::max_msg_sz`).
const MAX_MSG_SZ: u64 = 1 << 31;

/// An RC pair at path MTU 4096 (link MTU 9000).
fn setup_4k() -> RcPair {
    let (la, lb) = QueueLink::pair();
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    RcPair::on((Box::new(la), Box::new(lb)), o, true)
}

/// Registers on `n` an MR of `len` bytes at iova `iova` (2 MiB aligned)
/// whose every page is the same page of driver memory: a huge region that
/// costs one page. The page is 4 KiB, or 2 MiB when 4 KiB pages would
/// need more than `MAX_MR_PAGES` entries (a 4 GiB MR). Returns (lkey,
/// rkey, the page's address).
fn aliased_mr(n: &mut Node, pdn: u32, iova: u64, len: u64) -> (u32, u32, u64) {
    let shift = if len.div_ceil(4096) <= u64::from(vrnic::device::MAX_MR_PAGES) {
        12
    } else {
        21
    };
    let size = 1u64 << shift;
    let page = n.alloc(2 * size as usize).next_multiple_of(size);
    let npages = len.div_ceil(size);
    let list = n.alloc(npages as usize * 8);
    let entries: Vec<u8> = (0..npages).flat_map(|_| page.to_le_bytes()).collect();
    n.fill(list, &entries);
    let r = abi::RegMr {
        pdn,
        access: ALL,
        iova,
        length: len,
        page_shift: shift,
        npages: npages as u32,
        page_list: list,
    };
    let k = <abi::MrKeys as abi::Pod>::read_from(&n.cmd(abi::CMD_REG_MR, &r).unwrap()).unwrap();
    (k.lkey, k.rkey, page)
}

/// Hands `n` the frame `hdr` + `payload` and drains what it sends; returns
/// the AETHs of its answers.
fn inject_aeths(n: &mut Node, hdr: &RoceHeaders, payload: &[u8], now: u64) -> Vec<Aeth> {
    let mut f = Vec::with_capacity(payload.len() + 100);
    wire::emit_frame(hdr, payload, &mut f);
    n.dev.receive(&n.mem, &f, now);
    let mut out = Vec::new();
    while let Some(t) = n.dev.pop_tx() {
        if let Ok(Frame::Roce(p)) = wire::parse_frame(&t) {
            out.extend(p.hdr.aeth);
        }
    }
    out
}

#[test]
fn send_past_max_msg_sz_is_naked() {
    let mut s = setup_4k();
    // A receive WQE of 4 GiB - 1 (one SGE on an MR of 4 GiB whose pages
    // all alias one page): room for a message past max_msg_sz.
    let iova = 0x7000_0000_0000;
    let (lkey, _, _) = aliased_mr(&mut s.b, s.pdb, iova, 1 << 32);
    let now = s.now;
    s.b.post_recv(&mut s.qb, 1, &[sge(iova, u32::MAX, lkey)], now);
    let a = (s.a.ip, s.a.dev.config_space().mac);
    let qpn_b = s.qb.qpn;
    let payload = vec![0x33u8; 4096];
    // SEND FIRST and MIDDLEs up to exactly max_msg_sz, ACK requested on
    // none of them; then one MIDDLE more.
    let n = (MAX_MSG_SZ / 4096) as u32;
    for psn in 0..=n {
        let op = if psn == 0 {
            Opcode::RcSendFirst
        } else {
            Opcode::RcSendMiddle
        };
        let mut h = frame(a, &s.b, qpn_b, op, psn, 0xffff);
        h.bth.ack_req = psn == n;
        let aeths = inject_aeths(&mut s.b, &h, &payload, now);
        if psn < n {
            assert!(aeths.is_empty(), "PSN {psn}: {aeths:?}");
            continue;
        }
        assert_eq!(
            aeths.iter().map(|x| x.kind()).collect::<Vec<_>>(),
            vec![wire::AethKind::Nak(NakCode::InvalidRequest)],
            "the packet past max_msg_sz"
        );
    }
    let c = s.b.poll_cq(&mut s.cb).expect("the receive WQE completes");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_LOC_LEN_ERR));
    assert_eq!(s.b.qp_state(qpn_b), abi::QPS_ERR);
    assert_eq!(s.b.dev.stats().nak_inv_req_sent, 1);
}

#[test]
fn read_request_over_max_msg_sz_is_naked() {
    // READ and WRITE requests whose DMA length exceeds max_msg_sz are
    // invalid requests (rxe's check_length), even when the R_Key covers
    // the range.
    for (op, len) in [
        (Opcode::RcReadRequest, MAX_MSG_SZ + 1),
        (Opcode::RcReadRequest, u64::from(u32::MAX)),
        (Opcode::RcWriteFirst, MAX_MSG_SZ + 4096),
    ] {
        let mut s = setup_4k();
        let iova = 0x7000_0000_0000;
        let (_, rkey, page) = aliased_mr(&mut s.b, s.pdb, iova, 1 << 32);
        s.b.fill(page, &[0x5a; 4096]);
        let a = (s.a.ip, s.a.dev.config_space().mac);
        let (qpn_b, now) = (s.qb.qpn, s.now);
        let mut h = frame(a, &s.b, qpn_b, op, 0, 0xffff);
        h.reth = Some(Reth {
            va: iova,
            rkey,
            dma_len: len as u32,
        });
        let payload = if op == Opcode::RcWriteFirst {
            vec![0xee; 4096]
        } else {
            Vec::new()
        };
        let aeths = inject_aeths(&mut s.b, &h, &payload, now);
        assert_eq!(
            aeths.iter().map(|x| x.kind()).collect::<Vec<_>>(),
            vec![wire::AethKind::Nak(NakCode::InvalidRequest)],
            "{op:?} of {len} bytes"
        );
        assert!(s.b.read(page, 4096).iter().all(|&x| x == 0x5a), "{op:?}");
        assert_eq!(s.b.qp_state(qpn_b), abi::QPS_ERR, "{op:?}");
    }
}

#[test]
fn read_rerequest_near_u64_max_does_not_panic() {
    // Path MTU 256: a READ of 768 bytes is three responses. The first
    // arrives, the second is lost: A asks again from the second, at
    // remote_addr + 256. Near the top of the address space that sum must
    // neither wrap nor panic: a READ ending at u64::MAX is re-requested,
    // one whose range wraps never leaves A.
    for (remote_addr, ok) in [(u64::MAX - 0x300, true), (u64::MAX - 0xff, false)] {
        let (la, lb) = QueueLink::pair();
        let o = ConnOpts {
            mtu: 1,
            ..ConnOpts::default()
        };
        let mut s = RcPair::on((Box::new(la), Box::new(lb)), o, true);
        connection_still_works(&mut s, "warm-up");
        let dst = s.a.alloc(4096);
        let (lkey, _) = s.a.reg_mr(s.pda, dst, 4096, ALL).unwrap();
        s.post(
            abi::SendWqe {
                wr_id: remote_addr,
                opcode: abi::WR_RDMA_READ,
                send_flags: abi::SEND_SIGNALED,
                remote_addr,
                rkey: 0x1234,
                ..Default::default()
            },
            &[sge(dst, 768, lkey)],
        );
        // The READ request (PSN 1; the warm-up SEND had 0) is on its way
        // to B, not delivered; B's first and third responses arrive.
        let (b, qpn_a, now) = ((s.b.ip, s.b.dev.config_space().mac), s.qa.qpn, s.now);
        for (psn, op) in [
            (1, Opcode::RcReadResponseFirst),
            (3, Opcode::RcReadResponseLast),
        ] {
            let mut h = frame(b, &s.a, qpn_a, op, psn, 0xffff);
            h.aeth = Some(Aeth::ack(1, 0x1f));
            let mut f = Vec::new();
            wire::emit_frame(&h, &[0x44; 256], &mut f);
            s.a.dev.receive(&s.a.mem, &f, now);
        }
        let sent: Vec<Reth> = std::iter::from_fn(|| s.a.dev.pop_tx())
            .filter_map(|t| match wire::parse_frame(&t) {
                Ok(Frame::Roce(p)) => p.hdr.reth,
                _ => None,
            })
            .collect();
        if ok {
            // The request, then the re-request for the last 512 bytes.
            let want = |va, dma_len| Reth {
                va,
                rkey: 0x1234,
                dma_len,
            };
            assert_eq!(
                sent,
                vec![want(remote_addr, 768), want(remote_addr + 256, 512)]
            );
            assert_eq!(s.a.poll_cq(&mut s.ca), None);
        } else {
            // remote_addr + 768 wraps: the WQE completes with an error
            // before anything is sent or re-requested.
            assert_eq!(sent, vec![], "a wrapping READ went out");
            let c = s.a.poll_cq(&mut s.ca).expect("an error completion");
            assert_eq!((c.wr_id, c.status), (remote_addr, abi::WC_LOC_QP_OP_ERR));
        }
    }
}

#[test]
fn wrapping_remote_range_rejected() {
    // A WRITE, READ or atomic whose remote range wraps past 2^64 (or ends
    // exactly there) completes with WC_LOC_QP_OP_ERR at the requester;
    // nothing reaches the wire.
    for (op, remote_addr, len) in [
        (abi::WR_RDMA_WRITE, u64::MAX - 9, 100u32),
        (abi::WR_RDMA_WRITE, u64::MAX - 99, 100),
        (abi::WR_RDMA_READ, u64::MAX, 2),
        (abi::WR_ATOMIC_FETCH_AND_ADD, u64::MAX - 7, 8),
    ] {
        let mut s = setup();
        let src = s.a.alloc(4096);
        let (lkey, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
        s.post(
            abi::SendWqe {
                wr_id: 3,
                opcode: op,
                send_flags: abi::SEND_SIGNALED,
                remote_addr,
                rkey: 0x1234,
                ..Default::default()
            },
            &[sge(src, len, lkey)],
        );
        let c = s.cqe(false, "wrapping WQE");
        assert_eq!(
            (c.wr_id, c.status),
            (3, abi::WC_LOC_QP_OP_ERR),
            "op {op} at {remote_addr:#x}"
        );
        assert_eq!(s.b.dev.stats().rx_frames, 0, "op {op}: B got a frame");
    }
}

// ---------------------------------------------------------------------------
// Item 5: neighbour tables.

/// A node alone on a link whose other end the test holds.
fn lone_node() -> (Node, QueueLink) {
    let (la, lb) = QueueLink::pair();
    (Node::new(1, Box::new(la), 1500), lb)
}

/// An ARP frame: `op` from (`sender_ip`, `sender_mac`) about `target_ip`,
/// in an Ethernet frame to `eth_dst`.
fn arp(op: u16, sender: (Ipv4Addr, [u8; 6]), target_ip: Ipv4Addr, eth_dst: [u8; 6]) -> Vec<u8> {
    let a = wire::ArpPacket {
        op,
        sender_mac: sender.1,
        sender_ip: sender.0,
        target_mac: if op == 1 { [0; 6] } else { eth_dst },
        target_ip,
    };
    let mut f = Vec::new();
    wire::emit_arp(sender.1, eth_dst, &a, &mut f);
    f
}

/// The ARP frames `n` sent.
fn arps_sent(n: &mut Node) -> Vec<wire::ArpPacket> {
    std::iter::from_fn(|| n.dev.pop_tx())
        .filter_map(|t| match wire::parse_frame(&t) {
            Ok(Frame::Arp(a)) => Some(a),
            _ => None,
        })
        .collect()
}

fn stranger(i: u32) -> (Ipv4Addr, [u8; 6]) {
    let b = i.to_be_bytes();
    (
        Ipv4Addr::new(10, 0, b[2], b[3].max(3)),
        [2, 0x55, 0, b[1], b[2], b[3]],
    )
}

#[test]
fn arp_from_stranger_not_learned() {
    let (mut n, _peer) = lone_node();
    let me = (n.ip, n.dev.config_space().mac);
    let now = 1_000_000_000;
    let s = stranger(7);
    let other_mac = [2, 0, 0, 0, 0, 99];
    // Not for us: a request for another IP (broadcast), a request for our
    // IP in a frame to another MAC, an unsolicited reply to us.
    for f in [
        arp(1, s, Ipv4Addr::new(10, 0, 0, 200), [0xff; 6]),
        arp(1, s, me.0, other_mac),
        arp(2, s, me.0, me.1),
    ] {
        n.dev.receive(&n.mem, &f, now);
    }
    assert_eq!(
        n.dev.neighbour(IpAddr::V4(s.0)),
        None,
        "learnt from a stranger"
    );
    assert_eq!(n.dev.neighbour_count(), 0);
    assert!(
        arps_sent(&mut n).is_empty(),
        "answered a request not addressed to it"
    );
    // A broadcast request for our IP (RFC 826): learnt, answered.
    n.dev.receive(&n.mem, &arp(1, s, me.0, [0xff; 6]), now);
    assert_eq!(n.dev.neighbour(IpAddr::V4(s.0)), Some(s.1));
    let replies = arps_sent(&mut n);
    assert_eq!(replies.len(), 1);
    assert_eq!((replies[0].op, replies[0].target_ip), (2, s.0));
    // Any ARP from a known sender updates it, even one about another
    // target (RFC 826's merge step) — but not one in a frame for
    // another MAC.
    let moved = (s.0, [2, 0x55, 0, 0, 0, 0x77]);
    n.dev.receive(
        &n.mem,
        &arp(1, moved, Ipv4Addr::new(10, 0, 0, 200), other_mac),
        now,
    );
    assert_eq!(n.dev.neighbour(IpAddr::V4(s.0)), Some(s.1));
    n.dev.receive(
        &n.mem,
        &arp(1, moved, Ipv4Addr::new(10, 0, 0, 200), [0xff; 6]),
        now,
    );
    assert_eq!(n.dev.neighbour(IpAddr::V4(s.0)), Some(moved.1));
    // A sender claiming a broadcast/multicast MAC or our own IP is never
    // learnt.
    let bad = (Ipv4Addr::new(10, 0, 0, 8), [0x01, 0, 0x5e, 0, 0, 1]);
    n.dev.receive(&n.mem, &arp(1, bad, me.0, [0xff; 6]), now);
    n.dev.receive(
        &n.mem,
        &arp(1, (me.0, [2, 9, 9, 9, 9, 9]), me.0, [0xff; 6]),
        now,
    );
    assert_eq!(n.dev.neighbour(IpAddr::V4(bad.0)), None);
    assert_eq!(n.dev.neighbour(IpAddr::V4(me.0)), None);
    assert_eq!(n.dev.neighbour_count(), 1);
}

#[test]
fn neighbour_table_bounded() {
    let (mut n, _peer) = lone_node();
    let me = (n.ip, n.dev.config_space().mac);
    let mut now = 1_000_000_000;
    // 5,000 hosts each ARP for us: the table keeps at most NEIGH_MAX, the
    // newest ones.
    for i in 0..5000u32 {
        let s = (
            Ipv4Addr::from(0x0a01_0000 + i),
            [2, 0x55, 0, 0, (i >> 8) as u8, i as u8],
        );
        n.dev.receive(&n.mem, &arp(1, s, me.0, [0xff; 6]), now);
        while n.dev.pop_tx().is_some() {}
        now += 1000;
    }
    let max = vrnic::device::NEIGH_MAX;
    assert_eq!(n.dev.neighbour_count(), max);
    let last = Ipv4Addr::from(0x0a01_0000 + 4999);
    assert!(n.dev.neighbour(IpAddr::V4(last)).is_some(), "newest kept");
    let first = Ipv4Addr::from(0x0a01_0000);
    assert!(
        n.dev.neighbour(IpAddr::V4(first)).is_none(),
        "oldest evicted"
    );
    // A guest naming 200 unreachable destinations at once (one RC QP
    // each, one SEND posted): resolutions in progress are bounded too, and
    // every poll sends at most one request per destination.
    let pd = n.alloc_pd();
    let cq = n.create_cq(256);
    for i in 0..200u32 {
        let mut qp = n.create_qp(pd, &cq, 4, 1);
        let ip = Ipv4Addr::from(0x0a02_0000 + i);
        n.connect(&qp, ip, 0x11, 3, 0, 0, 7, 7);
        let wqe = abi::SendWqe {
            wr_id: u64::from(i),
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        n.post_send(&mut qp, wqe, &[], now);
    }
    let mut requests = 0;
    for _ in 0..50 {
        n.dev.poll(&n.mem, now);
        requests += arps_sent(&mut n).len();
        assert!(n.dev.neighbour_pending() <= vrnic::device::NEIGH_PENDING_MAX);
        now += 100_000_000;
    }
    // 5 s: at most NEIGH_MAX_PROBES requests per resolution and rest.
    assert!(
        requests <= 200 * 2 * vrnic::device::NEIGH_MAX_PROBES as usize,
        "{requests} ARP requests"
    );
    assert!(n.dev.neighbour_pending() <= vrnic::device::NEIGH_PENDING_MAX);
}

#[test]
fn neighbour_entries_expire() {
    let (mut n, _peer) = lone_node();
    let me = (n.ip, n.dev.config_space().mac);
    let mut now = 1_000_000_000;
    let s = stranger(9);
    n.dev.receive(&n.mem, &arp(1, s, me.0, [0xff; 6]), now);
    assert_eq!(n.dev.neighbour(IpAddr::V4(s.0)), Some(s.1));
    assert_eq!(arps_sent(&mut n).len(), 1, "the ARP reply");
    // Nobody uses it: gone after the reachable time (Linux's
    // base_reachable_time, 30 s), with no ARP sent for it.
    let reach = vrnic::device::NEIGH_REACHABLE_NS;
    let mut polls = 0;
    while now < 1_000_000_000 + reach + 1_000_000_000 {
        let next = n.dev.poll(&n.mem, now);
        polls += 1;
        assert!(polls < 1000, "poll asked for too many wake-ups");
        now = next.map_or(now + 1_000_000_000, |t| t.max(now + 1));
    }
    assert_eq!(n.dev.neighbour(IpAddr::V4(s.0)), None, "never expired");
    assert!(arps_sent(&mut n).is_empty());
}

#[test]
fn neighbour_in_use_is_reprobed_not_dropped() {
    // An RC pair keeps working across several reachable times: the entries
    // in use are re-confirmed by ARP (no hiccup), and an entry whose host
    // stops answering is dropped after the probes.
    let mut s = setup();
    connection_still_works(&mut s, "first");
    let reach = vrnic::device::NEIGH_REACHABLE_NS;
    let end = s.now + 3 * reach;
    let mut k = 0;
    while s.now < end {
        s.assert_quiet(reach / 4_000_000, "idle");
        connection_still_works(&mut s, &format!("round {k}"));
        assert!(s.a.dev.neighbour(IpAddr::V4(s.b.ip)).is_some(), "round {k}");
        k += 1;
    }
    let b_ip = IpAddr::V4(s.b.ip);
    assert!(s.a.dev.neighbour(b_ip).is_some());
    // Once more, so A's last request is addressed after the last
    // confirmation (a QP keeps its headers while the table is unchanged).
    connection_still_works(&mut s, "last");
    // B goes silent (its frames are no longer pumped): A drops B's entry
    // after the reachable time and the unanswered probes.
    let mut now = s.now;
    let deadline = now + reach + 10_000_000_000;
    while s.a.dev.neighbour(b_ip).is_some() {
        assert!(now < deadline, "entry never dropped");
        s.a.dev.poll(&s.a.mem, now);
        while s.a.dev.pop_tx().is_some() {}
        now += 100_000_000;
    }
    // A's next request waits for B's address to resolve again: an ARP
    // request goes out, no RoCE frame to where B was.
    s.now = now;
    s.post(
        abi::SendWqe {
            wr_id: 90,
            opcode: abi::WR_SEND,
            ..Default::default()
        },
        &[],
    );
    s.a.dev.poll(&s.a.mem, now);
    let sent: Vec<Frame> = std::iter::from_fn(|| s.a.dev.pop_tx())
        .map(|f| match wire::parse_frame(&f) {
            Ok(Frame::Arp(a)) => Frame::Arp(a),
            Ok(Frame::Roce(_)) => panic!("a RoCE frame to a dropped neighbour"),
            _ => Frame::Other,
        })
        .collect();
    assert!(
        sent.iter()
            .any(|f| matches!(f, Frame::Arp(a) if a.op == 1 && a.target_ip == s.b.ip)),
        "no ARP request for B: {sent:?}"
    );
}

/// An ICMPv6 neighbour solicitation (`na` false) or advertisement from
/// `src` (IP, MAC) about `target`, to IP `dst` in a frame to `eth_dst`,
/// with the link-layer address option (source for NS, target for NA).
fn ndp(
    na: bool,
    src: (std::net::Ipv6Addr, [u8; 6]),
    target: std::net::Ipv6Addr,
    dst: std::net::Ipv6Addr,
    eth_dst: [u8; 6],
) -> Vec<u8> {
    use etherparse::{icmpv6::NeighborAdvertisementHeader, Icmpv6Type, PacketBuilder};
    let kind = if na {
        Icmpv6Type::NeighborAdvertisement(NeighborAdvertisementHeader {
            router: false,
            solicited: false,
            r#override: true,
        })
    } else {
        Icmpv6Type::NeighborSolicitation
    };
    let mut payload = target.octets().to_vec();
    payload.extend_from_slice(&[if na { 2 } else { 1 }, 1]);
    payload.extend_from_slice(&src.1);
    let b = PacketBuilder::ethernet2(src.1, eth_dst)
        .ipv6(src.0.octets(), dst.octets(), 255)
        .icmpv6(kind);
    let mut f = Vec::new();
    b.write(&mut f, &payload).unwrap();
    f
}

#[test]
fn ns_from_stranger_not_learned() {
    use std::net::Ipv6Addr;
    let (mut n, _peer) = lone_node();
    let mine: Ipv6Addr = "fd00::1".parse().unwrap();
    let mut cfg = vrnic::device::DeviceConfig {
        mac: n.dev.config_space().mac,
        ipv4: n.ip,
        prefix_len: 24,
        ipv6: vec![mine],
        link_mtu: 1500,
    };
    n.dev = vrnic::device::Device::new(cfg.clone());
    let me_mac = cfg.mac;
    let now = 1_000_000_000;
    let s: (Ipv6Addr, [u8; 6]) = ("fd00::7".parse().unwrap(), [2, 0x55, 0, 0, 0, 7]);
    let solicited_node: Ipv6Addr = "ff02::1:ff00:1".parse().unwrap();
    let sn_mac = [0x33, 0x33, 0xff, 0, 0, 1];
    let all_nodes: Ipv6Addr = "ff02::1".parse().unwrap();
    let other: Ipv6Addr = "fd00::99".parse().unwrap();
    for f in [
        // NS for our address in a frame to another host's MAC.
        ndp(false, s, mine, mine, [2, 0, 0, 0, 0, 99]),
        // NS for another target.
        ndp(
            false,
            s,
            other,
            "ff02::1:ff00:99".parse().unwrap(),
            [0x33, 0x33, 0xff, 0, 0, 0x99],
        ),
        // Unsolicited NA about a host we never asked for.
        ndp(true, s, s.0, all_nodes, [0x33, 0x33, 0, 0, 0, 1]),
    ] {
        n.dev.receive(&n.mem, &f, now);
    }
    assert_eq!(n.dev.neighbour(std::net::IpAddr::V6(s.0)), None);
    assert_eq!(n.dev.neighbour_count(), 0);
    assert!(n.dev.pop_tx().is_none(), "answered an NS not for it");
    // A proper NS (to our solicited-node group): learnt and answered.
    n.dev
        .receive(&n.mem, &ndp(false, s, mine, solicited_node, sn_mac), now);
    assert_eq!(n.dev.neighbour(std::net::IpAddr::V6(s.0)), Some(s.1));
    assert!(n.dev.pop_tx().is_some(), "no NA");
    let _ = (&mut cfg, me_mac);
}

/// Node `n` of an RC pair over IPv6: addresses fd00::n (GID index 2).
fn ipv6_pair() -> RcPair {
    use std::net::Ipv6Addr;
    let (la, lb) = QueueLink::pair();
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), ConnOpts::default(), false);
    for (n, last) in [(&mut s.a, 1u16), (&mut s.b, 2)] {
        // Fresh devices with an IPv6 address; the PD, CQ and QP are made
        // again below in the same order, so their numbers do not change.
        let cfg = vrnic::device::DeviceConfig {
            mac: n.dev.config_space().mac,
            ipv4: n.ip,
            prefix_len: 24,
            ipv6: vec![Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)],
            link_mtu: 1500,
        };
        n.dev = vrnic::device::Device::new(cfg);
    }
    s.pda = s.a.alloc_pd();
    s.pdb = s.b.alloc_pd();
    s.ca = s.a.create_cq(256);
    s.cb = s.b.create_cq(256);
    s.qa = s.a.create_qp(s.pda, &s.ca, 64, 4);
    s.qb = s.b.create_qp(s.pdb, &s.cb, 64, 4);
    for (n, qp, peer, peer_qpn) in [
        (&mut s.a, &s.qa, 2u16, s.qb.qpn),
        (&mut s.b, &s.qb, 1, s.qa.qpn),
    ] {
        let mut attrs = conn_attrs(qp.qpn, n.ip, peer_qpn, ConnOpts::default());
        attrs[1].dgid = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, peer).octets();
        attrs[1].sgid_index = 2;
        for a in attrs {
            n.cmd(abi::CMD_MODIFY_QP, &a).unwrap();
        }
    }
    s
}

#[test]
fn off_path_write_over_ipv6_is_dropped() {
    use std::net::Ipv6Addr;
    let mut s = ipv6_pair();
    connection_still_works(&mut s, "RC over IPv6");
    let (buf, rkey) = victim_mr(&mut s);
    let (qpn_b, now) = (s.qb.qpn, s.now);
    let a_mac = s.a.dev.config_space().mac;
    let b_ll = Ipv6Addr::from(wire::Gid::link_local_from_mac(s.b.dev.config_space().mac).0);
    let fd = |n| Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, n);
    // From another IPv6 host; and from A's address but to B's link-local
    // address (GID 0), which is not the QP's source GID (index 2).
    for (src, dst) in [(fd(66), fd(2)), (fd(1), b_ll)] {
        let mut w = frame((s.a.ip, a_mac), &s.b, qpn_b, Opcode::RcWriteOnly, 1, 0xffff);
        w.ip_src = IpAddr::V6(src);
        w.ip_dst = IpAddr::V6(dst);
        w.reth = Some(Reth {
            va: buf,
            rkey,
            dma_len: 16,
        });
        let replies = inject(&mut s.b, &w, &[0xee; 16], now);
        assert!(replies.is_empty(), "{src} -> {dst}: {replies:?}");
    }
    assert!(
        s.b.read(buf, 4096).iter().all(|&x| x == 0x5a),
        "memory changed"
    );
    assert_eq!(s.b.dev.stats().rx_drop_bad_src_addr, 2);
    connection_still_works(&mut s, "after the IPv6 off-path writes");
}

#[test]
fn ud_wrong_pkey_or_qkey_is_dropped() {
    // UD accepts any source, but checks the P_Key and the Q_Key (rxe's
    // check_keys): both mismatches are dropped and counted, the receive
    // WQE stays posted for a good datagram.
    let (mut n, _peer) = lone_node();
    let pd = n.alloc_pd();
    let mut cq = n.create_cq(16);
    let mut qp = n.create_qp_with(pd, &cq, QpSpec::typed(abi::QPT_UD, 0));
    let qkey = 0x1111_2222;
    for (mask, state) in [
        (
            abi::QP_ATTR_STATE | abi::QP_ATTR_PKEY_INDEX | abi::QP_ATTR_PORT | abi::QP_ATTR_QKEY,
            abi::QPS_INIT,
        ),
        (abi::QP_ATTR_STATE, abi::QPS_RTR),
        (abi::QP_ATTR_STATE | abi::QP_ATTR_SQ_PSN, abi::QPS_RTS),
    ] {
        let a = abi::QpAttr {
            qpn: qp.qpn,
            attr_mask: mask,
            qp_state: state,
            port_num: 1,
            qkey,
            ..Default::default()
        };
        n.cmd(abi::CMD_MODIFY_QP, &a).unwrap();
    }
    let buf = n.alloc(4096);
    let (lkey, _) = n.reg_mr(pd, buf, 4096, ALL).unwrap();
    n.post_recv(&mut qp, 1, &[sge(buf, 4096, lkey)], 0);
    let datagram = |pkey: u16, qk: u32| {
        let mut h = frame(stranger(5), &n, qp.qpn, Opcode::UdSendOnly, 0, pkey);
        h.deth = Some(wire::Deth {
            qkey: qk,
            src_qp: 0x99,
        });
        h
    };
    let bad = [datagram(0x1234, qkey), datagram(0xffff, qkey + 1)];
    let good = datagram(0x7fff, qkey);
    for h in &bad {
        inject(&mut n, h, &[1; 8], 0);
    }
    assert_eq!(n.poll_cq(&mut cq), None, "a bad datagram was received");
    let st = n.dev.stats().clone();
    assert_eq!((st.rx_drop_bad_pkey, st.rx_drop_bad_qkey), (1, 1));
    inject(&mut n, &good, &[2; 8], 0);
    let c = n.poll_cq(&mut cq).expect("the good datagram");
    assert_eq!((c.wr_id, c.status, c.byte_len), (1, abi::WC_SUCCESS, 48));
}

// ---------------------------------------------------------------------------
// Item 3: READ amplification. READ responses are produced incrementally:
// at most `READ_BURST` per QP and step (`receive`, `poll`), none while
// `TX_BACKLOG_MAX` frames wait for the link; a duplicate READ restarts
// the QP's one response stream instead of adding a second one (rxe's
// `read_reply`, one packet per call, and `duplicate_request`).

/// Most READ response frames one QP produces per step.
const READ_BURST: usize = vrnic::transport::responder::READ_BURST as usize;

/// Drains `n`'s transmit queue: the READ responses in it (PSN, payload
/// length, first payload byte), and the number of other frames.
fn drain_responses(n: &mut Node) -> (Vec<(u32, usize, u8)>, usize) {
    let (mut resp, mut other) = (Vec::new(), 0);
    while let Some(t) = n.dev.pop_tx() {
        match wire::parse_frame(&t) {
            Ok(Frame::Roce(p)) if p.hdr.bth.opcode.is_read_response() => resp.push((
                p.hdr.bth.psn,
                p.payload.len(),
                p.payload.first().copied().unwrap_or(0),
            )),
            _ => other += 1,
        }
    }
    (resp, other)
}

/// Lets A and B resolve each other (ARP) so that B's transmit queue
/// holds nothing but what the test provokes.
fn settle(s: &mut RcPair) {
    for _ in 0..4 {
        s.a.pump(s.now);
        s.b.pump(s.now);
    }
}

/// A READ request from A's address to B's QP.
fn read_request(s: &RcPair, psn: u32, va: u64, rkey: u32, len: u32) -> Vec<u8> {
    let a = (s.a.ip, s.a.dev.config_space().mac);
    let mut h = frame(a, &s.b, s.qb.qpn, Opcode::RcReadRequest, psn, 0xffff);
    h.reth = Some(Reth {
        va,
        rkey,
        dma_len: len,
    });
    let mut f = Vec::new();
    wire::emit_frame(&h, &[], &mut f);
    f
}

/// Polls B until its READ responses stop (at most `max_polls` polls),
/// checking that no step queues more than `READ_BURST` frames; returns the
/// responses.
fn poll_responses(s: &mut RcPair, max_polls: usize) -> Vec<(u32, usize, u8)> {
    let mut all = Vec::new();
    for _ in 0..max_polls {
        s.b.dev.poll(&s.b.mem, s.now);
        let (r, other) = drain_responses(&mut s.b);
        assert!(
            r.len() + other <= READ_BURST,
            "{} frames queued by one poll",
            r.len() + other
        );
        if r.is_empty() {
            return all;
        }
        all.extend(r);
    }
    panic!("READ responses still coming after {max_polls} polls");
}

#[test]
fn huge_read_is_paced() {
    // One 74-byte READ request for 256 MiB (65,536 responses at path MTU
    // 4096, from an MR whose pages all alias one page).
    let mut s = setup_4k();
    let len: u32 = 256 << 20;
    let iova = 0x7000_0000_0000;
    let (_, rkey, page) = aliased_mr(&mut s.b, s.pdb, iova, len.into());
    s.b.fill(page, &[0x5a; 4096]);
    settle(&mut s);
    let req = read_request(&s, 0, iova, rkey, len);
    s.b.dev.receive(&s.b.mem, &req, s.now);
    let (first, other) = drain_responses(&mut s.b);
    assert_eq!(other, 0);
    assert!(
        !first.is_empty() && first.len() <= READ_BURST,
        "one receive() queued {} READ responses",
        first.len()
    );
    // The rest, a burst per poll, in PSN order, every byte read.
    let rest = poll_responses(&mut s, 2 * (len as usize / 4096) / READ_BURST + 10);
    let all: Vec<_> = first.into_iter().chain(rest).collect();
    assert_eq!(all.len(), len as usize / 4096);
    for (k, &(psn, n, b)) in all.iter().enumerate() {
        assert_eq!((psn, n, b), (k as u32, 4096, 0x5a), "response {k}");
    }
    assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_RTS);

    // End to end between the two engines: A READs 256 MiB into an MR of
    // its own whose pages alias one page; the responses trickle over
    // many polls and the READ completes with every byte.
    let (lkey_a, _, page_a) = aliased_mr(&mut s.a, s.pda, iova, len.into());
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    s.b.fill(page, &pattern);
    s.post(
        abi::SendWqe {
            wr_id: 9,
            opcode: abi::WR_RDMA_READ,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: iova,
            rkey,
            ..Default::default()
        },
        &[sge(iova, len, lkey_a)],
    );
    let c = s.cqe(false, "256 MiB READ");
    assert_eq!((c.wr_id, c.status, c.byte_len), (9, abi::WC_SUCCESS, len));
    assert_eq!(s.a.read(page_a, 4096), pattern);
    // And a READ of distinct bytes (4 MiB) after it.
    let size = 4 << 20;
    let remote = s.b.alloc(size);
    let data: Vec<u8> = (0..size).map(|i| (i / 4093) as u8 ^ i as u8).collect();
    s.b.fill(remote, &data);
    let (_, rk) = s.b.reg_mr(s.pdb, remote, size as u64, ALL).unwrap();
    let local = s.a.alloc(size);
    let (lk, _) = s.a.reg_mr(s.pda, local, size as u64, ALL).unwrap();
    s.post(
        abi::SendWqe {
            wr_id: 10,
            opcode: abi::WR_RDMA_READ,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: remote,
            rkey: rk,
            ..Default::default()
        },
        &[sge(local, size as u32, lk)],
    );
    let c = s.cqe(false, "4 MiB READ");
    assert_eq!((c.wr_id, c.status), (10, abi::WC_SUCCESS));
    assert!(s.a.read(local, size) == data, "READ data differs");
    assert_eq!(s.a.dev.stats().retransmits, 0);
}

#[test]
fn duplicate_read_does_not_multiply_responses() {
    // A READ of 64 MiB (16,384 responses), then the same request ten
    // times more before the responses are done, and once from the
    // attacker's address.
    let mut s = setup_4k();
    let len: u32 = 64 << 20;
    let iova = 0x7000_0000_0000;
    let (_, rkey, page) = aliased_mr(&mut s.b, s.pdb, iova, len.into());
    s.b.fill(page, &[0x5a; 4096]);
    settle(&mut s);
    let req = read_request(&s, 0, iova, rkey, len);
    let mut total = 0;
    for k in 0..11 {
        s.b.dev.receive(&s.b.mem, &req, s.now);
        let (r, other) = drain_responses(&mut s.b);
        assert!(r.len() + other <= READ_BURST, "request {k}: {}", r.len());
        total += r.len();
    }
    // The duplicate from another address is dropped by the header checks.
    let mut forged = frame(
        (ATTACKER_IP, ATTACKER_MAC),
        &s.b,
        s.qb.qpn,
        Opcode::RcReadRequest,
        0,
        0xffff,
    );
    forged.reth = Some(Reth {
        va: iova,
        rkey,
        dma_len: len,
    });
    let drops = s.b.dev.stats().rx_drop_bad_src_addr;
    assert!(inject(&mut s.b, &forged, &[], s.now).is_empty());
    assert_eq!(s.b.dev.stats().rx_drop_bad_src_addr, drops + 1);
    // The duplicates restarted the one stream: the full response once,
    // plus at most a burst per restart, never eleven copies.
    let rest = poll_responses(&mut s, 2 * 16384 / READ_BURST + 10);
    let n = len as usize / 4096;
    assert_eq!(rest.last().map(|r| r.0), Some(n as u32 - 1));
    total += rest.len();
    assert!(
        total >= n && total <= n + 11 * READ_BURST,
        "{total} responses for 11 copies of a {n}-response READ"
    );
    assert_eq!(s.b.dev.stats().duplicates, 10);
    assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_RTS);
}

#[test]
fn many_huge_reads_bounded() {
    // Four 512 MiB READ requests in a row (responder resources for 4),
    // handed to B before anything is drained: what B queues stays within
    // one burst, and the four are answered in order, a burst per poll.
    let (la, lb) = QueueLink::pair();
    let o = ConnOpts {
        mtu: 5,
        max_rd_atomic: 4,
        ..ConnOpts::default()
    };
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), o, true);
    let len: u32 = 512 << 20;
    let iova = 0x7000_0000_0000;
    let (_, rkey, page) = aliased_mr(&mut s.b, s.pdb, iova, len.into());
    s.b.fill(page, &[0x5a; 4096]);
    let per = len / 4096;
    settle(&mut s);
    for k in 0..4 {
        let req = read_request(&s, k * per, iova, rkey, len);
        s.b.dev.receive(&s.b.mem, &req, s.now);
    }
    let (first, other) = drain_responses(&mut s.b);
    assert!(
        first.len() + other <= READ_BURST,
        "four READ requests queued {} frames",
        first.len() + other
    );
    let rest = poll_responses(&mut s, 2 * 4 * per as usize / READ_BURST + 10);
    let all: Vec<_> = first.into_iter().chain(rest).collect();
    assert_eq!(all.len(), 4 * per as usize);
    assert!(all.iter().enumerate().all(|(k, r)| r.0 == k as u32));
    assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_RTS);
}

#[test]
fn requests_behind_a_read_wait_for_its_responses() {
    // A READ of 1 MiB (256 responses at path MTU 4096), then
    // RESP_HOLD_MAX + 4 WRITEs of 8 bytes asking for an ACK each, all
    // handed to B at once: B holds the first RESP_HOLD_MAX WRITEs and
    // drops the rest (the requester would resend them); it executes and
    // acknowledges the held ones only after the READ's last response, in
    // PSN order.
    use vrnic::transport::responder::RESP_HOLD_MAX;
    let mut s = setup_4k();
    let len: u32 = 1 << 20;
    let iova = 0x7000_0000_0000;
    let (_, rkey, page) = aliased_mr(&mut s.b, s.pdb, iova, len.into());
    s.b.fill(page, &[0x5a; 4096]);
    let target = s.b.alloc(4096);
    let (_, rk_t) = s.b.reg_mr(s.pdb, target, 4096, ALL).unwrap();
    settle(&mut s);
    let a = (s.a.ip, s.a.dev.config_space().mac);
    let qpn_b = s.qb.qpn;
    let n_read = len / 4096;
    let mut frames = vec![read_request(&s, 0, iova, rkey, len)];
    let n_writes = RESP_HOLD_MAX as u32 + 4;
    for k in 0..n_writes {
        let mut h = frame(a, &s.b, qpn_b, Opcode::RcWriteOnly, n_read + k, 0xffff);
        h.reth = Some(Reth {
            va: target + 8 * u64::from(k),
            rkey: rk_t,
            dma_len: 8,
        });
        let mut f = Vec::new();
        wire::emit_frame(&h, &[k as u8 + 1; 8], &mut f);
        frames.push(f);
    }
    let dropped = s.b.dev.stats().rx_dropped;
    for f in &frames {
        s.b.dev.receive(&s.b.mem, f, s.now);
    }
    assert_eq!(
        s.b.dev.stats().rx_dropped,
        dropped + 4,
        "WRITEs past the hold bound"
    );
    assert!(
        s.b.read(target, 8 * n_writes as usize)
            .iter()
            .all(|&x| x == 0),
        "a WRITE ran before the READ's responses"
    );
    // Everything B sends, in order: the 256 responses, then an ACK per
    // held WRITE.
    let mut sent = Vec::new();
    for _ in 0..200 {
        let mut step = Vec::new();
        while let Some(t) = s.b.dev.pop_tx() {
            if let Ok(Frame::Roce(p)) = wire::parse_frame(&t) {
                step.push((p.hdr.bth.opcode, p.hdr.bth.psn));
            }
        }
        assert!(step.len() <= READ_BURST + RESP_HOLD_MAX, "{}", step.len());
        sent.extend(step);
        s.b.dev.poll(&s.b.mem, s.now);
    }
    let want: Vec<_> = (0..n_read)
        .map(|k| match k {
            0 => (Opcode::RcReadResponseFirst, 0),
            k if k + 1 == n_read => (Opcode::RcReadResponseLast, k),
            k => (Opcode::RcReadResponseMiddle, k),
        })
        .collect();
    assert_eq!(sent[..n_read as usize], want);
    // Then the ACKs of the held WRITEs, in order, the last one's PSN last;
    // an ACK queued behind another of this QP takes its place.
    let acks = &sent[n_read as usize..];
    let coalesced = s.b.dev.stats().acks_coalesced as usize;
    assert_eq!(acks.len() + coalesced, RESP_HOLD_MAX, "{acks:?}");
    assert!(acks.iter().all(|&(op, _)| op == Opcode::RcAck), "{acks:?}");
    assert!(acks.windows(2).all(|w| w[0].1 < w[1].1), "{acks:?}");
    assert_eq!(
        acks.last().map(|a| a.1),
        Some(n_read + RESP_HOLD_MAX as u32 - 1)
    );
    let mem = s.b.read(target, 8 * n_writes as usize);
    for k in 0..n_writes as usize {
        let want = if k < RESP_HOLD_MAX { k as u8 + 1 } else { 0 };
        assert_eq!(mem[8 * k..8 * k + 8], [want; 8], "WRITE {k}");
    }
    // The dropped ones, resent, are executed now.
    for f in &frames[1 + RESP_HOLD_MAX..] {
        s.b.dev.receive(&s.b.mem, f, s.now);
    }
    let mem = s.b.read(target, 8 * n_writes as usize);
    for k in RESP_HOLD_MAX..n_writes as usize {
        assert_eq!(mem[8 * k..8 * k + 8], [k as u8 + 1; 8], "resent WRITE {k}");
    }
    assert_eq!(s.b.qp_state(qpn_b), abi::QPS_RTS);
}

/// A link that loses the `nth` RoCEv2 frame sent through it (counting
/// from 0), and no other.
struct LoseOne {
    inner: QueueLink,
    nth: usize,
    sent: usize,
}

impl vrnic::link::Link for LoseOne {
    fn send(&mut self, frame: &[u8]) -> std::io::Result<()> {
        if matches!(wire::parse_frame(frame), Ok(Frame::Roce(_))) {
            self.sent += 1;
            if self.sent == self.nth + 1 {
                return Ok(());
            }
        }
        self.inner.send(frame)
    }

    fn receive(&mut self, rx: vrnic::link::Rx<'_>) -> std::io::Result<Option<usize>> {
        rx.read(|buf| self.inner.recv(buf))
    }
}

#[test]
fn read_response_lost_mid_stream_is_re_requested() {
    // A READ of 2 MiB between the engines (512 responses at path MTU
    // 4096); B's link loses its 300th response. A re-requests from it,
    // B restarts its stream there (one duplicate, no second stream), and
    // the READ completes with every byte, without waiting for a timeout.
    let (la, lb) = QueueLink::pair();
    let lb = LoseOne {
        inner: lb,
        nth: 300,
        sent: 0,
    };
    let o = ConnOpts {
        mtu: 5,
        ..ConnOpts::default()
    };
    let mut s = RcPair::on((Box::new(la), Box::new(lb)), o, true);
    let size = 2 << 20;
    let remote = s.b.alloc(size);
    let data: Vec<u8> = (0..size).map(|i| (i / 4099) as u8 ^ (i as u8)).collect();
    s.b.fill(remote, &data);
    let (_, rk) = s.b.reg_mr(s.pdb, remote, size as u64, ALL).unwrap();
    let local = s.a.alloc(size);
    let (lk, _) = s.a.reg_mr(s.pda, local, size as u64, ALL).unwrap();
    let start = s.now;
    s.post(
        abi::SendWqe {
            wr_id: 4,
            opcode: abi::WR_RDMA_READ,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: remote,
            rkey: rk,
            ..Default::default()
        },
        &[sge(local, size as u32, lk)],
    );
    let c = s.cqe(false, "READ with a lost response");
    assert_eq!((c.wr_id, c.status), (4, abi::WC_SUCCESS));
    assert!(s.a.read(local, size) == data, "READ data differs");
    assert_eq!(s.b.dev.stats().duplicates, 1, "one re-request");
    assert_eq!(s.a.dev.stats().retransmits, 0, "no timeout");
    // B sent the 512 responses, the lost one and whatever followed it
    // before the re-request arrived (at most a few bursts) again.
    let tx = s.b.dev.stats().tx_frames;
    assert!(tx <= 512 + 4 * READ_BURST as u64, "B sent {tx} frames");
    assert!(s.now - start < 1_000_000_000, "took {} ns", s.now - start);
}

#[test]
fn read_streams_of_many_qps_take_turns() {
    // Eight QPs of B each answer a 64 MiB READ. With the link backlog
    // (TX_BACKLOG_MAX) room for four bursts per poll, the polls serve the
    // QPs in turn: every stream moves within the first few polls, none
    // waits for the others to finish.
    use vrnic::transport::TX_BACKLOG_MAX;
    let mut s = setup_4k();
    let len: u32 = 64 << 20;
    let iova = 0x7000_0000_0000;
    let (_, rkey, page) = aliased_mr(&mut s.b, s.pdb, iova, len.into());
    s.b.fill(page, &[0x5a; 4096]);
    settle(&mut s);
    let a = (s.a.ip, s.a.dev.config_space().mac);
    let (ip_a, qpn_a) = (s.a.ip, s.qa.qpn);
    let qpns: Vec<u32> = (0..8)
        .map(|_| {
            let q = s.b.create_qp(s.pdb, &s.cb, 4, 1);
            s.b.connect(&q, ip_a, qpn_a, 5, 0, 0, 7, 7);
            q.qpn
        })
        .collect();
    settle(&mut s);
    let mut got = vec![0usize; qpns.len()];
    let count = |n: &mut Node, got: &mut Vec<usize>| {
        let mut frames = 0;
        while let Some(t) = n.dev.pop_tx() {
            frames += 1;
            if let Ok(Frame::Roce(p)) = wire::parse_frame(&t) {
                if let Some(i) = qpns
                    .iter()
                    .position(|&q| vrnic::transport::udp_src_port(q) == p.hdr.udp_src)
                {
                    got[i] += 1;
                }
            }
        }
        frames
    };
    for &qpn in &qpns {
        let mut h = frame(a, &s.b, qpn, Opcode::RcReadRequest, 0, 0xffff);
        h.reth = Some(Reth {
            va: iova,
            rkey,
            dma_len: len,
        });
        let mut f = Vec::new();
        wire::emit_frame(&h, &[], &mut f);
        s.b.dev.receive(&s.b.mem, &f, s.now);
        count(&mut s.b, &mut got);
    }
    let after_requests = got.clone();
    for _ in 0..4 {
        s.b.dev.poll(&s.b.mem, s.now);
        let n = count(&mut s.b, &mut got);
        assert!(n <= TX_BACKLOG_MAX, "one poll queued {n} frames");
    }
    for (i, (&before, &now)) in after_requests.iter().zip(&got).enumerate() {
        assert!(
            now >= before + READ_BURST,
            "QP {i}: {before} responses after its request, {now} after 4 polls"
        );
    }
}

#[test]
fn requests_behind_a_read_within_the_window_are_not_lost() {
    // A READ of 100 responses, then 27 SENDs: 127 PSNs, all within the
    // requester's window, on the wire at once. B answers the READ over
    // two steps and holds the SENDs meanwhile: none is dropped, nothing
    // waits for a timeout, the receive completions come in order.
    let mut s = setup_4k();
    connection_still_works(&mut s, "warm-up");
    let size = 100 * 4096;
    let remote = s.b.alloc(size);
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    s.b.fill(remote, &data);
    let (_, rk) = s.b.reg_mr(s.pdb, remote, size as u64, ALL).unwrap();
    let local = s.a.alloc(size);
    let (lk, _) = s.a.reg_mr(s.pda, local, size as u64, ALL).unwrap();
    let rbuf = s.b.alloc(4096);
    let (lk_b, _) = s.b.reg_mr(s.pdb, rbuf, 4096, ALL).unwrap();
    let now = s.now;
    for k in 0..27u64 {
        s.b.post_recv(&mut s.qb, 100 + k, &[sge(rbuf, 4096, lk_b)], now);
    }
    let (drops, retransmits) = (s.b.dev.stats().rx_dropped, s.a.dev.stats().retransmits);
    s.post(
        abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_RDMA_READ,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: remote,
            rkey: rk,
            ..Default::default()
        },
        &[sge(local, size as u32, lk)],
    );
    for k in 0..27u64 {
        s.post(
            abi::SendWqe {
                wr_id: 2 + k,
                opcode: abi::WR_SEND,
                send_flags: abi::SEND_SIGNALED,
                ..Default::default()
            },
            &[sge(local, 8, lk)],
        );
    }
    for k in 0..28u64 {
        let c = s.cqe(false, "A");
        assert_eq!((c.wr_id, c.status), (1 + k, abi::WC_SUCCESS));
    }
    for k in 0..27u64 {
        let c = s.cqe(true, "B");
        assert_eq!((c.wr_id, c.status), (100 + k, abi::WC_SUCCESS));
    }
    assert!(s.a.read(local, size) == data, "READ data differs");
    assert_eq!(s.b.dev.stats().rx_dropped, drops);
    assert_eq!(s.a.dev.stats().retransmits, retransmits);
}

/// A connected QP's requests follow its peer to a new MAC (an ARP update
/// of a known neighbour) and back: the headers a QP keeps between packets
/// (`transport::peer_headers`) are built anew when the neighbour table
/// changes, not sent to where the peer was.
#[test]
fn a_connected_qp_follows_its_peer_to_a_new_mac_and_back() {
    let mut s = setup();
    connection_still_works(&mut s, "before");
    let (ipa, ipb) = (s.a.ip, s.b.ip);
    let b_mac = s.b.dev.config_space().mac;
    let moved = [2, 0x55, 0, 0, 0, 0x42];
    let now = s.now;
    s.a.dev
        .receive(&s.a.mem, &arp(1, (ipb, moved), ipa, [0xff; 6]), now);
    assert_eq!(s.a.dev.neighbour(IpAddr::V4(ipb)), Some(moved));
    while s.a.dev.pop_tx().is_some() {}
    let src = s.a.alloc(4096);
    s.a.fill(src, &[9; 32]);
    let (lkey, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
    let dst = s.b.alloc(4096);
    let (lkey_b, _) = s.b.reg_mr(s.pdb, dst, 4096, ALL).unwrap();
    s.b.post_recv(&mut s.qb, 5, &[sge(dst, 4096, lkey_b)], now);
    s.post(
        abi::SendWqe {
            wr_id: 6,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        },
        &[sge(src, 32, lkey)],
    );
    let sent: Vec<[u8; 6]> = std::iter::from_fn(|| s.a.dev.pop_tx())
        .filter_map(|f| match wire::parse_frame(&f) {
            Ok(Frame::Roce(p)) => Some(p.hdr.eth_dst),
            _ => None,
        })
        .collect();
    assert_eq!(sent, vec![moved], "the SEND went where the peer was");
    // Back at B's own MAC: the retransmission reaches B.
    let now = s.now;
    s.a.dev
        .receive(&s.a.mem, &arp(1, (ipb, b_mac), ipa, [0xff; 6]), now);
    let c = s.cqe(false, "retransmitted SEND");
    assert_eq!((c.wr_id, c.status), (6, abi::WC_SUCCESS));
    let c = s.cqe(true, "its receive");
    assert_eq!((c.wr_id, c.status, c.byte_len), (5, abi::WC_SUCCESS, 32));
    assert_eq!(s.b.read(dst, 32), vec![9; 32]);
    connection_still_works(&mut s, "after");
}

/// A peer that answers with the same PSN sequence error NAK again and
/// again (a duplicated frame, or a hostile peer) gets one resend per
/// retry, not one per NAK: a NAK starts no retry while one is under way
/// (rxe's `started_retry`), each retry, after a NAK or a timeout, counts
/// against `retry_cnt` (rxe's `COMPST_ERROR_RETRY`), and the WQE ends
/// with `RETRY_EXC_ERR` when they are spent.
#[test]
fn repeated_sequence_naks_resend_once_per_retry_and_end_in_retry_exceeded() {
    let mut s = setup();
    undelivered_send(&mut s);
    let sent: Vec<u32> = std::iter::from_fn(|| s.a.dev.pop_tx())
        .filter_map(|f| match wire::parse_frame(&f) {
            Ok(Frame::Roce(p)) if p.hdr.bth.opcode == Opcode::RcSendOnly => Some(p.hdr.bth.psn),
            _ => None,
        })
        .collect();
    let [psn] = sent[..] else {
        panic!("A sent {sent:?}")
    };
    let b = (s.b.ip, s.b.dev.config_space().mac);
    let mut nak = frame(b, &s.a, s.qa.qpn, Opcode::RcAck, psn, 0xffff);
    nak.aeth = Some(Aeth::nak(0, NakCode::PsnSequenceError));
    let resends = |out: Vec<wire::RocePacket<'static>>| {
        out.iter()
            .filter(|p| p.hdr.bth.opcode == Opcode::RcSendOnly && p.hdr.bth.psn == psn)
            .count()
    };
    let mut now = s.now;
    let mut total = 0;
    for _ in 0..100 {
        total += resends(inject(&mut s.a, &nak, &[], now));
    }
    assert_eq!(total, 1, "100 copies of one NAK: one resend");
    // The timer retries; every NAK after a resend is ignored; the retries
    // run out.
    let mut cqe = None;
    for _ in 0..20 {
        now += 100_000_000;
        s.a.dev.poll(&s.a.mem, now);
        let out: Vec<wire::RocePacket<'static>> = std::iter::from_fn(|| s.a.dev.pop_tx())
            .filter_map(|t| {
                let t: &'static [u8] = Box::leak(t.into_boxed_slice());
                match wire::parse_frame(t) {
                    Ok(Frame::Roce(p)) => Some(p),
                    _ => None,
                }
            })
            .collect();
        let n = resends(out);
        total += n;
        for _ in 0..n * 10 {
            total += resends(inject(&mut s.a, &nak, &[], now));
        }
        cqe = s.a.poll_cq(&mut s.ca);
        if cqe.is_some() {
            break;
        }
    }
    let c = cqe.expect("the WQE never completed");
    assert_eq!((c.wr_id, c.status), (5, abi::WC_RETRY_EXC_ERR));
    // And at most one tail loss probe in the whole episode without
    // progress.
    let probes = s.a.dev.stats().tail_probes as usize;
    assert!(probes <= 1, "{probes} probes");
    assert_eq!(total, 7 + probes, "one resend per retry (retry_cnt 7)");
}

/// A WRITE whose target MR is invalidated by a SEND with invalidate (on
/// another QP) or deregistered after its FIRST packet executed: its later
/// packets are refused with a remote access error NAK, as a bad R_Key in
/// the FIRST would be, and land nowhere. After an invalidation they used
/// to be written through the key the FIRST packet checked; a dereg was
/// already caught (the key named no MR any more), kept here as a guard.
#[test]
fn write_packets_after_their_mr_went_away_do_not_land() {
    for how in [MrLoss::SendWithInvalidate, MrLoss::Dereg] {
        let mut s = setup();
        let r = write_across_mr_loss(&mut s, ConnOpts::default(), 1024, 4, how);
        assert_eq!(r.runs_after, 0, "{how:?}: one packet per frame");
    }
}

/// The reply bound (`transport::TX_REPLY_MAX`).
const TX_REPLY_MAX: usize = vrnic::transport::TX_REPLY_MAX;

/// While B's link takes no frames, A's peer floods B with duplicate WRITE
/// packets (each answered with an ACK) and strangers with ARP requests:
/// B's transmit queue never holds more than `TX_REPLY_MAX` packets, every
/// reply past it is dropped and counted (on the device and on the QP),
/// the ACK of a real WRITE executed meanwhile among them. Once the link
/// drains, A's retransmission after its ACK timeout recovers: the WRITE
/// completes, its bytes landed once, B's QP still works.
#[test]
fn replies_to_a_flood_while_the_link_is_held_stay_bounded() {
    let mut s = setup();
    connection_still_works(&mut s, "warm-up");
    let len = 4 * 1024;
    let src = s.a.alloc(len);
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
    s.a.fill(src, &data);
    let (lk, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
    let dst = s.b.alloc(2 * len);
    let (_, rk) = s.b.reg_mr(s.pdb, dst, 2 * len as u64, ALL).unwrap();
    let write = |wr_id: u64, at: u64| abi::SendWqe {
        wr_id,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: at,
        rkey: rk,
        ..Default::default()
    };
    // A WRITE of 4 packets whose frames the flood replays.
    s.post(write(1, dst), &[sge(src, len as u32, lk)]);
    let now = s.now;
    while s.a.pump(now) > 0 {}
    let frames = take_frames(&mut s.b);
    assert_eq!(frames.len(), 4, "the WRITE's packets");
    for (f, icrc) in &frames {
        s.b.dev.receive_frame(&s.b.mem, f, *icrc, now);
    }
    let c = s.cqe(false, "the first WRITE");
    assert_eq!((c.wr_id, c.status), (1, abi::WC_SUCCESS));
    assert_eq!(s.b.dev.tx_backlog(), 0, "B's link drained");

    // B's link is held from here on: nothing is popped from B.
    let b = &mut s.b;
    let bounded = |b: &Node| {
        let n = b.dev.tx_backlog();
        assert!(n <= TX_REPLY_MAX, "{n} packets wait for B's link");
    };
    let rounds = 200;
    for _ in 0..rounds {
        for (f, icrc) in &frames {
            b.dev.receive_frame(&b.mem, f, *icrc, now);
            bounded(b);
        }
    }
    let strangers = 100;
    for i in 0..strangers {
        let f = arp(1, stranger(i), b.ip, [0xff; 6]);
        b.dev.receive(&b.mem, &f, now);
        bounded(b);
    }
    // A second WRITE, executed by B; its ACK finds no room.
    s.post(write(2, dst + len as u64), &[sge(src, len as u32, lk)]);
    while s.a.pump(now) > 0 {}
    let b = &mut s.b;
    for (f, icrc) in take_frames(b) {
        b.dev.receive_frame(&b.mem, &f, icrc, now);
        bounded(b);
    }
    assert_eq!(
        b.read(dst + len as u64, len),
        data,
        "the second WRITE landed"
    );
    let dups = 4 * rounds;
    let st = b.dev.stats();
    assert_eq!(st.duplicates, dups as u64);
    let replies = dups + strangers as usize + 1;
    assert_eq!(b.dev.tx_backlog(), TX_REPLY_MAX);
    // Each reply was queued, took the place of the ACK queued before it
    // (an ACK of a later PSN), or was dropped.
    let coalesced = st.acks_coalesced as usize;
    assert_eq!(
        st.replies_dropped,
        (replies - TX_REPLY_MAX - coalesced) as u64
    );
    let qp = b.dev.qp_stats().into_iter().find(|(n, _)| *n == s.qb.qpn);
    assert_eq!(
        qp.map(|(_, q)| q.replies_dropped),
        Some((dups + 1 - TX_REPLY_MAX - coalesced) as u64),
        "the QP's dropped ACKs (the ARP replies are the device's)"
    );

    // The link drains: B's queued replies reach A; the second WRITE
    // completes.
    let mut sent = 0;
    while let Some(f) = b.dev.pop_tx() {
        b.link.send(&f).unwrap();
        sent += 1;
    }
    assert_eq!(sent, TX_REPLY_MAX);
    let c = s.cqe(false, "the second WRITE after the flood");
    assert_eq!((c.wr_id, c.status), (2, abi::WC_SUCCESS), "{c:?}");
    // (Its ACK took the place of the ACK queued last, or A resent it.)
    assert_eq!(s.b.read(dst + len as u64, len), data);
    assert_eq!(s.b.qp_state(s.qb.qpn), abi::QPS_RTS);
    connection_still_works(&mut s, "after the flood");
}
