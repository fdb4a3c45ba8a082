//! The RC engine between two devices over an in-memory link pair: data
//! arrives intact and in order, errors complete with the right status, and
//! nothing hangs (bounded rounds on a simulated clock).

mod common;

use common::*;
use vrnic::abi;

const ALL: u32 = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;

/// The RC pair of these tests (a [`vrnic::link::mem::MemLink`] between them).
type Setup = RcPair;

/// A and B at path MTU `mtu_enum`, A's send PSN 0xfffff0 (it wraps within a
/// few packets), B's 100.
fn setup(mtu_enum: u32, retry: u8, rnr: u8, connect_b: bool) -> Setup {
    let (la, lb) = vrnic::link::mem::MemLink::pair();
    let o = ConnOpts {
        mtu: mtu_enum,
        my_psn: 0xff_fff0,
        peer_psn: 100,
        retry,
        rnr,
        ..ConnOpts::default()
    };
    RcPair::on((Box::new(la), Box::new(lb)), o, connect_b)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn wait_cqe(s: &mut Setup, on_b: bool) -> abi::Cqe {
    s.cqe(on_b, "engine_rc")
}

#[test]
fn send_recv_multi_packet_messages_arrive_intact_across_psn_wrap() {
    let mut s = setup(3, 7, 7, true);
    for (i, &len) in [1usize, 1024, 1025, 4096, 65536, 0].iter().enumerate() {
        let src = s.a.alloc(len.max(1));
        let dst = s.b.alloc(len.max(1) + 4096);
        let data = pattern(len, i as u8);
        s.a.fill(src, &data);
        let (lk_a, _) = s.a.reg_mr(s.pda, src, len.max(1) as u64, ALL).unwrap();
        let (lk_b, _) = s.b.reg_mr(s.pdb, dst, len as u64 + 4096, ALL).unwrap();
        let now = s.now;
        s.b.post_recv(
            &mut s.qb,
            100 + i as u64,
            &[sge(dst, len as u32 + 4096, lk_b)],
            now,
        );
        let wqe = abi::SendWqe {
            wr_id: i as u64,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        s.a.post_send(&mut s.qa, wqe, &[sge(src, len as u32, lk_a)], now);
        let rc = wait_cqe(&mut s, true);
        assert_eq!(
            (rc.status, rc.opcode, rc.wr_id, rc.byte_len),
            (abi::WC_SUCCESS, abi::WC_OP_RECV, 100 + i as u64, len as u32)
        );
        assert_eq!(s.b.read(dst, len), data, "payload of {len} bytes");
        let sc = wait_cqe(&mut s, false);
        assert_eq!(
            (sc.status, sc.opcode, sc.wr_id),
            (abi::WC_SUCCESS, abi::WC_OP_SEND, i as u64)
        );
    }
}

#[test]
fn write_with_immediate_larger_than_mtu_lands_byte_for_byte() {
    for mtu in [1u32, 3, 5] {
        let mut s = setup(mtu, 7, 7, true);
        let mtu_bytes = abi::mtu_bytes(mtu).unwrap() as usize;
        let len = mtu_bytes * 5 + 1;
        let src = s.a.alloc(len);
        let dst = s.b.alloc(len + 100);
        let data = pattern(len, 7);
        s.a.fill(src, &data);
        let (lk_a, _) = s.a.reg_mr(s.pda, src, len as u64, ALL).unwrap();
        let (_, rk_b) = s.b.reg_mr(s.pdb, dst, len as u64 + 100, ALL).unwrap();
        let now = s.now;
        s.b.post_recv(&mut s.qb, 9, &[], now);
        let wqe = abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_RDMA_WRITE_WITH_IMM,
            send_flags: abi::SEND_SIGNALED,
            imm_data: [0xde, 0xad, 0xbe, 0xef],
            remote_addr: dst + 50,
            rkey: rk_b,
            ..Default::default()
        };
        s.a.post_send(&mut s.qa, wqe, &[sge(src, len as u32, lk_a)], now);
        let rc = wait_cqe(&mut s, true);
        assert_eq!(rc.status, abi::WC_SUCCESS);
        assert_eq!(rc.opcode, abi::WC_OP_RECV_RDMA_WITH_IMM);
        assert_eq!(rc.imm_data, [0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(rc.wc_flags & abi::WC_WITH_IMM, abi::WC_WITH_IMM);
        assert_eq!(rc.byte_len, len as u32);
        assert_eq!(s.b.read(dst + 50, len), data);
        assert_eq!(
            s.b.read(dst, 50),
            vec![0; 50],
            "bytes before the target untouched"
        );
        assert_eq!(
            s.b.read(dst + 50 + len as u64, 50),
            vec![0; 50],
            "bytes after the target untouched"
        );
        assert_eq!(wait_cqe(&mut s, false).status, abi::WC_SUCCESS);
    }
}

#[test]
fn write_with_bad_rkey_is_nakked_and_completes_with_remote_access_error() {
    for case in ["bad key", "out of bounds", "no remote write"] {
        let mut s = setup(3, 7, 7, true);
        let src = s.a.alloc(4096);
        let dst = s.b.alloc(4096);
        let (lk_a, _) = s.a.reg_mr(s.pda, src, 4096, ALL).unwrap();
        let access = if case == "no remote write" {
            abi::ACCESS_LOCAL_WRITE
        } else {
            ALL
        };
        let (_, rk_b) = s.b.reg_mr(s.pdb, dst, 4096, access).unwrap();
        let (rkey, addr) = match case {
            "bad key" => (rk_b ^ 0x100, dst),
            "out of bounds" => (rk_b, dst + 4000),
            _ => (rk_b, dst),
        };
        let now = s.now;
        let wqe = abi::SendWqe {
            wr_id: 5,
            opcode: abi::WR_RDMA_WRITE,
            remote_addr: addr,
            rkey,
            ..Default::default()
        };
        s.a.post_send(&mut s.qa, wqe, &[sge(src, 200, lk_a)], now);
        // A second WQE behind the failing one is flushed.
        let wqe2 = abi::SendWqe {
            wr_id: 6,
            opcode: abi::WR_SEND,
            ..Default::default()
        };
        s.a.post_send(&mut s.qa, wqe2, &[sge(src, 10, lk_a)], now);
        let c = wait_cqe(&mut s, false);
        assert_eq!((c.wr_id, c.status), (5, abi::WC_REM_ACCESS_ERR), "{case}");
        let c2 = wait_cqe(&mut s, false);
        assert_eq!((c2.wr_id, c2.status), (6, abi::WC_WR_FLUSH_ERR), "{case}");
        assert_eq!(s.b.dev.stats().naks_sent, 1, "{case}");
        assert_eq!(
            s.b.read(dst, 4096),
            vec![0; 4096],
            "{case}: nothing written"
        );
        let q = abi::QpAttr::read_from(
            &s.b.cmd(
                abi::CMD_QUERY_QP,
                &abi::Handle {
                    handle: s.qb.qpn,
                    reserved: 0,
                },
            )
            .unwrap(),
        );
        assert_eq!(
            q.unwrap().qp_state,
            abi::QPS_ERR,
            "{case}: responder QP in ERR"
        );
    }
}

use abi::Pod;

#[test]
fn late_receive_is_retried_after_rnr_nak_and_rnr_retry_zero_fails() {
    for rnr in [7u8, 0] {
        let mut s = setup(3, 7, rnr, true);
        let src = s.a.alloc(100);
        let dst = s.b.alloc(100);
        s.a.fill(src, &pattern(100, 3));
        let (lk_a, _) = s.a.reg_mr(s.pda, src, 100, ALL).unwrap();
        let (lk_b, _) = s.b.reg_mr(s.pdb, dst, 100, ALL).unwrap();
        let now = s.now;
        let wqe = abi::SendWqe {
            wr_id: 1,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        s.a.post_send(&mut s.qa, wqe, &[sge(src, 100, lk_a)], now);
        // Let the first attempt be refused with an RNR NAK.
        let Setup { a, b, now, .. } = &mut s;
        run_until(a, b, now, 1000, |_, b| b.dev.stats().rnr_naks_sent > 0);
        if rnr == 0 {
            let c = wait_cqe(&mut s, false);
            assert_eq!(c.status, abi::WC_RNR_RETRY_EXC_ERR);
            continue;
        }
        let now = s.now;
        s.b.post_recv(&mut s.qb, 2, &[sge(dst, 100, lk_b)], now);
        let c = wait_cqe(&mut s, false);
        assert_eq!(c.status, abi::WC_SUCCESS);
        let r = wait_cqe(&mut s, true);
        assert_eq!((r.status, r.byte_len), (abi::WC_SUCCESS, 100));
        assert_eq!(s.b.read(dst, 100), pattern(100, 3));
    }
}

#[test]
fn silent_peer_exhausts_retries_with_retry_exc_err() {
    // B never moves its QP out of RESET: it drops A's packets.
    let mut s = setup(3, 2, 7, false);
    let src = s.a.alloc(64);
    let (lk_a, _) = s.a.reg_mr(s.pda, src, 64, ALL).unwrap();
    let now = s.now;
    let start = now;
    let wqe = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        ..Default::default()
    };
    s.a.post_send(&mut s.qa, wqe, &[sge(src, 64, lk_a)], now);
    let c = wait_cqe(&mut s, false);
    assert_eq!(c.status, abi::WC_RETRY_EXC_ERR);
    // timeout 14 = 67 ms, 1 try + 2 retries: about 200 ms of simulated time.
    let elapsed = s.now - start;
    assert!(
        (190_000_000..400_000_000).contains(&elapsed),
        "gave up after {elapsed} ns"
    );
    assert_eq!(s.a.dev.stats().retransmits, 2);
}

#[test]
fn commands_with_out_of_range_addresses_are_rejected_and_device_carries_on() {
    let (mut a, _b) = pair(1500);
    let pd = a.alloc_pd();
    // Page list outside driver memory.
    let r = abi::RegMr {
        pdn: pd,
        access: 1,
        iova: 0,
        length: 4096,
        page_shift: 12,
        npages: 1,
        page_list: 0xdead_0000_0000,
    };
    assert_eq!(a.cmd(abi::CMD_REG_MR, &r), Err(abi::STATUS_EFAULT));
    // Page list inside memory naming a page outside it.
    let list = a.alloc(8);
    a.fill(list, &0x7777_0000_0000u64.to_le_bytes());
    assert_eq!(
        a.cmd(
            abi::CMD_REG_MR,
            &abi::RegMr {
                page_list: list,
                ..r
            }
        ),
        Err(abi::STATUS_EFAULT)
    );
    // Length overflowing the address space.
    assert_eq!(
        a.cmd(
            abi::CMD_REG_MR,
            &abi::RegMr {
                iova: u64::MAX - 10,
                length: 4096,
                ..r
            }
        ),
        Err(abi::STATUS_EINVAL)
    );
    let cq = abi::CreateCq {
        cqe: 1 << 16,
        reserved: 0,
        ring: MEM_BASE + MEM_SIZE as u64 - 4096,
        db: MEM_BASE,
    };
    assert_eq!(a.cmd(abi::CMD_CREATE_CQ, &cq), Err(abi::STATUS_EFAULT));
    assert_eq!(
        a.cmd(abi::CMD_CREATE_CQ, &abi::CreateCq { cqe: 3, ..cq }),
        Err(abi::STATUS_EINVAL)
    );
    assert_eq!(
        a.cmd(0xffff, &abi::Handle::default()),
        Err(abi::STATUS_ENOSYS)
    );
    // A truncated command.
    let mut resp = [0u8; 64];
    let n = a.dev.control(&a.mem, &[1, 0], &mut resp, a.now);
    assert_eq!(
        abi::RespHeader::read_from(&resp[..n]).unwrap().status,
        abi::STATUS_EINVAL
    );
    // Still serving.
    let _ = a.alloc_pd();
    let c = a.create_cq(16);
    assert!(c.cqn > 0);
}

#[test]
fn modify_qp_rejects_missing_required_attributes() {
    let (mut a, _b) = pair(1500);
    let pd = a.alloc_pd();
    let cq = a.create_cq(16);
    let qp = a.create_qp(pd, &cq, 16, 1);
    let skip_init = abi::QpAttr {
        qpn: qp.qpn,
        attr_mask: abi::QP_ATTR_STATE,
        qp_state: abi::QPS_RTS,
        ..Default::default()
    };
    assert_eq!(
        a.cmd(abi::CMD_MODIFY_QP, &skip_init),
        Err(abi::STATUS_EINVAL)
    );
    let init_missing_port = abi::QpAttr {
        qp_state: abi::QPS_INIT,
        attr_mask: abi::QP_ATTR_STATE | abi::QP_ATTR_PKEY_INDEX | abi::QP_ATTR_ACCESS_FLAGS,
        ..skip_init
    };
    assert_eq!(
        a.cmd(abi::CMD_MODIFY_QP, &init_missing_port),
        Err(abi::STATUS_EINVAL)
    );
}

#[test]
fn read_of_1_mib_arrives_byte_for_byte() {
    let mut s = setup(3, 7, 7, true);
    let len = 1usize << 20;
    let src = s.b.alloc(len);
    let dst = s.a.alloc(len);
    let data = pattern(len, 11);
    s.b.fill(src, &data);
    let (_, rk_b) = s.b.reg_mr(s.pdb, src, len as u64, ALL).unwrap();
    let (lk_a, _) = s.a.reg_mr(s.pda, dst, len as u64, ALL).unwrap();
    let now = s.now;
    let wqe = abi::SendWqe {
        wr_id: 3,
        opcode: abi::WR_RDMA_READ,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: src,
        rkey: rk_b,
        ..Default::default()
    };
    s.a.post_send(&mut s.qa, wqe, &[sge(dst, len as u32, lk_a)], now);
    let c = wait_cqe(&mut s, false);
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (3, abi::WC_SUCCESS, abi::WC_OP_RDMA_READ, len as u32)
    );
    assert!(s.a.read(dst, len) == data, "READ data differs");
}

#[test]
fn read_with_bad_rkey_completes_with_remote_access_error() {
    let mut s = setup(3, 7, 7, true);
    let src = s.b.alloc(4096);
    let dst = s.a.alloc(4096);
    let (_, rk_b) = s.b.reg_mr(s.pdb, src, 4096, ALL).unwrap();
    let (lk_a, _) = s.a.reg_mr(s.pda, dst, 4096, ALL).unwrap();
    let now = s.now;
    let wqe = abi::SendWqe {
        wr_id: 4,
        opcode: abi::WR_RDMA_READ,
        remote_addr: src + 100,
        rkey: rk_b,
        ..Default::default()
    };
    s.a.post_send(&mut s.qa, wqe, &[sge(dst, 4096, lk_a)], now);
    let c = wait_cqe(&mut s, false);
    assert_eq!((c.wr_id, c.status), (4, abi::WC_REM_ACCESS_ERR));
}

#[test]
fn atomics_return_the_original_value_and_update_remote_memory() {
    let all = ALL | abi::ACCESS_REMOTE_ATOMIC;
    let mut s = setup(3, 7, 7, true);
    let target = s.b.alloc(4096);
    let res = s.a.alloc(4096);
    s.b.fill(target, &100u64.to_le_bytes());
    let (_, rk_b) = s.b.reg_mr(s.pdb, target, 4096, all).unwrap();
    let (lk_a, _) = s.a.reg_mr(s.pda, res, 4096, all).unwrap();
    let now = s.now;
    let faa = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_ATOMIC_FETCH_AND_ADD,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: target,
        rkey: rk_b,
        compare_add: 5,
        ..Default::default()
    };
    s.a.post_send(&mut s.qa, faa, &[sge(res, 8, lk_a)], now);
    let cas = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_ATOMIC_CMP_AND_SWP,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: target,
        rkey: rk_b,
        compare_add: 105,
        swap: 7,
        ..Default::default()
    };
    s.a.post_send(&mut s.qa, cas, &[sge(res + 8, 8, lk_a)], now);
    let c1 = wait_cqe(&mut s, false);
    let c2 = wait_cqe(&mut s, false);
    assert_eq!(
        (c1.wr_id, c1.status, c1.opcode),
        (1, abi::WC_SUCCESS, abi::WC_OP_FETCH_ADD)
    );
    assert_eq!(
        (c2.wr_id, c2.status, c2.opcode),
        (2, abi::WC_SUCCESS, abi::WC_OP_COMP_SWAP)
    );
    assert_eq!(
        s.a.read(res, 16),
        [100u64.to_le_bytes(), 105u64.to_le_bytes()].concat()
    );
    assert_eq!(s.b.read(target, 8), 7u64.to_le_bytes());
}

/// RDMA WRITE of `len` bytes at path MTU `mtu_enum` into the middle of a
/// guarded region; checks the bytes and that the guards are untouched.
fn write_lands(mtu_enum: u32, len: usize) {
    let mut s = setup(mtu_enum, 7, 7, true);
    let src = s.a.alloc(len);
    let dst = s.b.alloc(len + 8192);
    let (lka, _) =
        s.a.reg_mr(s.pda, src, len as u64, abi::ACCESS_LOCAL_WRITE)
            .unwrap();
    let (_, rkb) =
        s.b.reg_mr(
            s.pdb,
            dst,
            len as u64 + 8192,
            abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE,
        )
        .unwrap();
    let data = pattern(len, 9);
    s.a.fill(src, &data);
    s.b.fill(dst, &[0xee; 4096]);
    s.b.fill(dst + 4096 + len as u64, &[0xee; 4096]);
    let w = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: dst + 4096,
        rkey: rkb,
        ..Default::default()
    };
    let now = s.now;
    s.a.post_send(&mut s.qa, w, &[sge(src, len as u32, lka)], now);
    let c = wait_cqe(&mut s, false);
    assert_eq!((c.status, c.byte_len), (abi::WC_SUCCESS, len as u32));
    assert!(s.b.read(dst + 4096, len) == data, "{len} bytes land");
    assert_eq!(s.b.read(dst, 4096), vec![0xee; 4096], "guard before");
    assert_eq!(
        s.b.read(dst + 4096 + len as u64, 4096),
        vec![0xee; 4096],
        "guard after"
    );
}

#[test]
fn write_of_exactly_mtu_plus_one_bytes() {
    for mtu in [1u32, 3, 5] {
        write_lands(mtu, 128 << mtu | 1);
    }
}

#[test]
fn write_of_1_mib() {
    write_lands(3, 1 << 20);
}

/// A READ or WRITE one byte past the end of the remote MR.
fn out_of_bounds(opcode: u8) {
    let mut s = setup(3, 7, 7, true);
    let la = s.a.alloc(8192);
    let (lka, _) =
        s.a.reg_mr(s.pda, la, 8192, abi::ACCESS_LOCAL_WRITE)
            .unwrap();
    let lb = s.b.alloc(4096);
    let all = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;
    let (_, rkb) = s.b.reg_mr(s.pdb, lb, 4096, all).unwrap();
    let w = abi::SendWqe {
        wr_id: 1,
        opcode,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: lb + 1,
        rkey: rkb,
        ..Default::default()
    };
    let now = s.now;
    s.a.post_send(&mut s.qa, w, &[sge(la, 4096, lka)], now);
    let c = wait_cqe(&mut s, false);
    assert_eq!(c.status, abi::WC_REM_ACCESS_ERR);
    // IBTA §9.9.3.1.2: a remote access error is fatal to the responder QP.
    let q = abi::Handle {
        handle: s.qb.qpn,
        reserved: 0,
    };
    let attr = abi::QpAttr::read_from(&s.b.cmd(abi::CMD_QUERY_QP, &q).unwrap()).unwrap();
    assert_eq!(attr.qp_state, abi::QPS_ERR, "responder QP in ERR");
    assert_eq!(s.b.dev.stats().nak_rem_access_sent, 1);
}

#[test]
fn read_out_of_the_mr_bounds_is_a_remote_access_error() {
    out_of_bounds(abi::WR_RDMA_READ);
}

#[test]
fn write_out_of_the_mr_bounds_is_a_remote_access_error() {
    out_of_bounds(abi::WR_RDMA_WRITE);
}
