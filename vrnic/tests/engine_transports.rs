//! UC, UD, SRQ, SEND with invalidate, fences, max_rd_atomic and SQD
//! between two engines over an in-memory link (IBTA Vol 1 chapters 9-10).

mod common;

use common::*;
use vrnic::abi::{self, Pod};
use vrnic::device::Nanos;
use vrnic::mem;

const QKEY: u32 = 0x1111_1111;
const ROUNDS: usize = 10_000;

fn gid_of(ip: std::net::Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// Test-only extensions of the engine driver for the newer objects.
trait NodeExt {
    fn create_typed_qp(&mut self, pdn: u32, cq: &Cq, qp_type: u32, srqn: u32) -> Qp;
    fn modify(&mut self, a: abi::QpAttr) -> Result<(), u32>;
    fn bring_up_ud(&mut self, qp: &Qp);
    fn create_ah(&mut self, pdn: u32, ip: std::net::Ipv4Addr) -> u32;
    fn create_srq(&mut self, pdn: u32, max_wr: u32, limit: u32) -> Srq;
    fn post_srq_recv(&mut self, srq: &mut Srq, wr_id: u64, sge: abi::Sge, now: Nanos);
    fn events(&mut self) -> Vec<abi::Event>;
}

struct Srq {
    srqn: u32,
    ring: u64,
    rec: u64,
    size: u32,
    stride: u32,
    pi: u32,
}

impl NodeExt for Node {
    fn create_typed_qp(&mut self, pdn: u32, cq: &Cq, qp_type: u32, srqn: u32) -> Qp {
        self.create_qp_with(pdn, cq, QpSpec::typed(qp_type, srqn))
    }

    fn modify(&mut self, a: abi::QpAttr) -> Result<(), u32> {
        self.cmd(abi::CMD_MODIFY_QP, &a).map(|_| ())
    }

    fn bring_up_ud(&mut self, qp: &Qp) {
        use abi::*;
        let base = QpAttr {
            qpn: qp.qpn,
            ..Default::default()
        };
        self.modify(QpAttr {
            attr_mask: QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_QKEY,
            qp_state: QPS_INIT,
            port_num: 1,
            qkey: QKEY,
            ..base
        })
        .unwrap();
        self.modify(QpAttr {
            attr_mask: QP_ATTR_STATE,
            qp_state: QPS_RTR,
            ..base
        })
        .unwrap();
        self.modify(QpAttr {
            attr_mask: QP_ATTR_STATE | QP_ATTR_SQ_PSN,
            qp_state: QPS_RTS,
            sq_psn: 0x42,
            ..base
        })
        .unwrap();
    }

    fn create_ah(&mut self, pdn: u32, ip: std::net::Ipv4Addr) -> u32 {
        let c = abi::CreateAh {
            pdn,
            dgid: gid_of(ip),
            sgid_index: 1,
            port_num: 1,
            is_global: 1,
            ..Default::default()
        };
        Node::handle_of(self.cmd(abi::CMD_CREATE_AH, &c).unwrap())
    }

    fn create_srq(&mut self, pdn: u32, max_wr: u32, limit: u32) -> Srq {
        let stride = abi::rq_stride(1);
        let ring = self.alloc((max_wr * stride) as usize);
        let rec = self.alloc(8);
        let c = abi::CreateSrq {
            pdn,
            max_wr,
            max_sge: 1,
            srq_limit: limit,
            ring,
            db: rec,
        };
        let r = abi::CreateSrqResp::read_from(&self.cmd(abi::CMD_CREATE_SRQ, &c).unwrap()).unwrap();
        assert_eq!(r.stride, stride);
        Srq {
            srqn: r.srqn,
            ring,
            rec,
            size: max_wr,
            stride,
            pi: 0,
        }
    }

    fn post_srq_recv(&mut self, srq: &mut Srq, wr_id: u64, sge: abi::Sge, now: Nanos) {
        let slot = srq.ring + (srq.pi % srq.size) as u64 * srq.stride as u64;
        let w = abi::RecvWqe {
            wr_id,
            num_sge: 1,
            reserved: 0,
        };
        mem::write_obj(&self.mem, slot, &w).unwrap();
        mem::write_obj(&self.mem, slot + 16, &sge).unwrap();
        srq.pi += 1;
        let db = abi::Doorbell {
            kind: abi::DB_SRQ,
            handle: srq.srqn,
            index: srq.pi,
            ..Default::default()
        };
        self.dev.doorbell(&self.mem, &db, now);
    }

    fn events(&mut self) -> Vec<abi::Event> {
        std::iter::from_fn(|| self.dev.pop_event()).collect()
    }
}

/// Pumps until `n` CQEs arrived on `cq` of the chosen node (bounded).
fn collect(a: &mut Node, b: &mut Node, on_b: bool, cq: &mut Cq, n: usize) -> Vec<abi::Cqe> {
    let mut got = Vec::new();
    let mut now = 0;
    run_until(a, b, &mut now, ROUNDS, |a, b| {
        let node = if on_b { b } else { a };
        while let Some(c) = node.poll_cq(cq) {
            got.push(c);
        }
        got.len() >= n
    });
    got
}

/// Pumps until both sides are idle (bounded), returning CQEs seen on `cq` of `b`.
fn settle(a: &mut Node, b: &mut Node, cq: &mut Cq) -> Vec<abi::Cqe> {
    let mut got = Vec::new();
    for _ in 0..100 {
        let moved = a.pump(0) + b.pump(0);
        while let Some(c) = b.poll_cq(cq) {
            got.push(c);
        }
        if moved == 0 {
            break;
        }
    }
    got
}

struct UdPair {
    a: Node,
    b: Node,
    pa: u32,
    cqa: Cq,
    cqb: Cq,
    qa: Qp,
    qb: Qp,
    buf_a: u64,
    lkey_a: u32,
    buf_b: u64,
    lkey_b: u32,
}

fn ud_pair() -> UdPair {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a.create_typed_qp(pa, &cqa, abi::QPT_UD, 0);
    let qb = b.create_typed_qp(pb, &cqb, abi::QPT_UD, 0);
    a.bring_up_ud(&qa);
    b.bring_up_ud(&qb);
    let buf_a = a.alloc(8192);
    let buf_b = b.alloc(8192);
    let (lkey_a, _) = a.reg_mr(pa, buf_a, 8192, abi::ACCESS_LOCAL_WRITE).unwrap();
    let (lkey_b, _) = b.reg_mr(pb, buf_b, 8192, abi::ACCESS_LOCAL_WRITE).unwrap();
    UdPair {
        a,
        b,
        pa,
        cqa,
        cqb,
        qa,
        qb,
        buf_a,
        lkey_a,
        buf_b,
        lkey_b,
    }
}

fn ud_send(p: &mut UdPair, ah: u32, len: u32, qkey: u32, imm: Option<u32>) {
    let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    p.a.fill(p.buf_a, &payload);
    let wqe = abi::SendWqe {
        wr_id: 0x5e,
        opcode: if imm.is_some() {
            abi::WR_SEND_WITH_IMM
        } else {
            abi::WR_SEND
        },
        send_flags: abi::SEND_SIGNALED,
        imm_data: imm.unwrap_or(0).to_be_bytes(),
        remote_qpn: p.qb.qpn,
        remote_qkey: qkey,
        ah,
        ..Default::default()
    };
    let sge = abi::Sge {
        addr: p.buf_a,
        length: len,
        lkey: p.lkey_a,
    };
    p.a.post_send(&mut p.qa, wqe, &[sge], 0);
}

#[test]
fn ud_send_lands_after_a_40_byte_grh_area() {
    let mut p = ud_pair();
    let ah = p.a.create_ah(p.pa, p.b.ip);
    let sge = abi::Sge {
        addr: p.buf_b,
        length: 2048,
        lkey: p.lkey_b,
    };
    p.b.post_recv(&mut p.qb, 77, &[sge], 0);
    ud_send(&mut p, ah, 1000, QKEY, Some(0xdead_beef));
    let sent = collect(&mut p.a, &mut p.b, false, &mut p.cqa, 1);
    assert_eq!(sent[0].status, abi::WC_SUCCESS);
    assert_eq!(sent[0].opcode, abi::WC_OP_SEND);
    let got = collect(&mut p.a, &mut p.b, true, &mut p.cqb, 1);
    let c = got[0];
    assert_eq!(c.status, abi::WC_SUCCESS);
    assert_eq!(c.wr_id, 77);
    assert_eq!(c.byte_len, 40 + 1000);
    assert_eq!(c.src_qp, p.qa.qpn);
    assert_eq!(c.wc_flags, abi::WC_GRH | abi::WC_WITH_IMM);
    assert_eq!(u32::from_be_bytes(c.imm_data), 0xdead_beef);
    let grh = p.b.read(p.buf_b, 40);
    assert_eq!(
        &grh[..20],
        &[0u8; 20],
        "IPv4: first 20 bytes of the GRH area are zero"
    );
    assert_eq!(grh[20], 0x45, "IPv4 header version/IHL");
    assert_eq!(&grh[32..36], &p.a.ip.octets(), "source address");
    assert_eq!(&grh[36..40], &p.b.ip.octets(), "destination address");
    let data = p.b.read(p.buf_b + 40, 1000);
    let want: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(data, want);
}

#[test]
fn ud_wrong_qkey_is_dropped_and_the_receive_stays_posted() {
    let mut p = ud_pair();
    let ah = p.a.create_ah(p.pa, p.b.ip);
    let sge = abi::Sge {
        addr: p.buf_b,
        length: 2048,
        lkey: p.lkey_b,
    };
    p.b.post_recv(&mut p.qb, 1, &[sge], 0);
    ud_send(&mut p, ah, 100, QKEY ^ 1, None);
    let seen = settle(&mut p.a, &mut p.b, &mut p.cqb);
    assert!(seen.is_empty(), "a wrong Q_Key must not complete a receive");
    let dropped = p.b.dev.stats().rx_dropped;
    assert!(dropped >= 1);
    // A controlled Q_Key (MSB set) sends the QP's own Q_Key, which matches.
    ud_send(&mut p, ah, 100, 0x8000_0000, None);
    let got = collect(&mut p.a, &mut p.b, true, &mut p.cqb, 1);
    assert_eq!((got[0].wr_id, got[0].status), (1, abi::WC_SUCCESS));
    assert_eq!(got[0].byte_len, 140);
}

#[test]
fn ud_send_longer_than_the_mtu_fails_and_moves_the_qp_to_sqe_then_back_to_rts() {
    let mut p = ud_pair();
    let ah = p.a.create_ah(p.pa, p.b.ip);
    ud_send(&mut p, ah, 1025, QKEY, None); // path MTU 1024 at link MTU 1500
    let sent = collect(&mut p.a, &mut p.b, false, &mut p.cqa, 1);
    assert_eq!(sent[0].status, abi::WC_LOC_LEN_ERR);
    let q = abi::Handle {
        handle: p.qa.qpn,
        reserved: 0,
    };
    let attr = abi::QpAttr::read_from(&p.a.cmd(abi::CMD_QUERY_QP, &q).unwrap()).unwrap();
    assert_eq!(attr.qp_state, abi::QPS_SQE);
    p.a.modify(abi::QpAttr {
        qpn: p.qa.qpn,
        attr_mask: abi::QP_ATTR_STATE,
        qp_state: abi::QPS_RTS,
        ..Default::default()
    })
    .unwrap();
    let sge = abi::Sge {
        addr: p.buf_b,
        length: 2048,
        lkey: p.lkey_b,
    };
    p.b.post_recv(&mut p.qb, 2, &[sge], 0);
    ud_send(&mut p, ah, 1024, QKEY, None);
    let got = collect(&mut p.a, &mut p.b, true, &mut p.cqb, 1);
    assert_eq!(
        (got[0].status, got[0].byte_len),
        (abi::WC_SUCCESS, 40 + 1024)
    );
}

#[test]
fn ud_send_through_a_missing_ah_fails_with_loc_qp_op_err() {
    let mut p = ud_pair();
    ud_send(&mut p, 999, 10, QKEY, None);
    let sent = collect(&mut p.a, &mut p.b, false, &mut p.cqa, 1);
    assert_eq!(sent[0].status, abi::WC_LOC_QP_OP_ERR);
}

fn uc_pair(link_mtu: u32) -> (Node, Node, Cq, Cq, Qp, Qp, u32, u32) {
    let (mut a, mut b) = pair(link_mtu);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(256), b.create_cq(256));
    let qa = a.create_typed_qp(pa, &cqa, abi::QPT_UC, 0);
    let qb = b.create_typed_qp(pb, &cqb, abi::QPT_UC, 0);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect_uc(&qa, ipb, qb.qpn, 1);
    b.connect_uc(&qb, ipa, qa.qpn, 1);
    (a, b, cqa, cqb, qa, qb, pa, pb)
}

#[test]
fn uc_send_and_write_with_immediate_span_many_packets() {
    let (mut a, mut b, mut cqa, mut cqb, mut qa, mut qb, pa, pb) = uc_pair(1500);
    let len = 256 * 5 + 1; // path MTU 256: 6 packets
    let src = a.alloc(len);
    let dst = b.alloc(2 * len);
    let (lka, _) = a
        .reg_mr(pa, src, len as u64, abi::ACCESS_LOCAL_WRITE)
        .unwrap();
    let (lkb, rkb) = b
        .reg_mr(
            pb,
            dst,
            2 * len as u64,
            abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE,
        )
        .unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    a.fill(src, &data);
    let sge = abi::Sge {
        addr: src,
        length: len as u32,
        lkey: lka,
    };
    b.post_recv(
        &mut qb,
        10,
        &[abi::Sge {
            addr: dst,
            length: len as u32,
            lkey: lkb,
        }],
        0,
    );
    b.post_recv(&mut qb, 11, &[], 0);
    let send = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        ..Default::default()
    };
    a.post_send(&mut qa, send, &[sge], 0);
    let write = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_RDMA_WRITE_WITH_IMM,
        imm_data: 7u32.to_be_bytes(),
        remote_addr: dst + len as u64,
        rkey: rkb,
        ..Default::default()
    };
    a.post_send(&mut qa, write, &[sge], 0);
    let sent = collect(&mut a, &mut b, false, &mut cqa, 2);
    assert!(sent.iter().all(|c| c.status == abi::WC_SUCCESS));
    let got = collect(&mut a, &mut b, true, &mut cqb, 2);
    assert_eq!((got[0].wr_id, got[0].byte_len), (10, len as u32));
    assert_eq!(
        (got[1].wr_id, got[1].opcode),
        (11, abi::WC_OP_RECV_RDMA_WITH_IMM)
    );
    assert_eq!(b.read(dst, len), data);
    assert_eq!(b.read(dst + len as u64, len), data);
}

#[test]
fn uc_bad_rkey_is_dropped_silently_and_the_qp_carries_on() {
    let (mut a, mut b, mut cqa, mut cqb, mut qa, mut qb, pa, pb) = uc_pair(1500);
    let src = a.alloc(4096);
    let dst = b.alloc(4096);
    let (lka, _) = a.reg_mr(pa, src, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    let (lkb, rkb) = b
        .reg_mr(
            pb,
            dst,
            4096,
            abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE,
        )
        .unwrap();
    let sge = abi::Sge {
        addr: src,
        length: 600,
        lkey: lka,
    };
    a.fill(src, &[0xab; 600]);
    let bad = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_WRITE,
        remote_addr: dst,
        rkey: rkb ^ 0x100,
        ..Default::default()
    };
    a.post_send(&mut qa, bad, &[sge], 0);
    let sent = collect(&mut a, &mut b, false, &mut cqa, 1);
    assert_eq!(sent[0].status, abi::WC_SUCCESS, "UC completes on the wire");
    assert_eq!(b.read(dst, 600), vec![0u8; 600], "nothing written");
    assert_eq!(b.dev.stats().naks_sent, 0, "UC never NAKs");
    b.post_recv(
        &mut qb,
        5,
        &[abi::Sge {
            addr: dst,
            length: 4096,
            lkey: lkb,
        }],
        0,
    );
    let send = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_SEND,
        ..Default::default()
    };
    a.post_send(&mut qa, send, &[sge], 0);
    let got = collect(&mut a, &mut b, true, &mut cqb, 1);
    assert_eq!(
        (got[0].wr_id, got[0].status, got[0].byte_len),
        (5, abi::WC_SUCCESS, 600)
    );
}

#[test]
fn uc_lost_packets_drop_whole_messages_and_keep_receive_wqes() {
    use vrnic::link::fault::FaultRates;
    let rates = FaultRates {
        drop: 0.05,
        ..Default::default()
    };
    let (mut a, mut b) = lossy_pair(1500, 7, rates);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (mut cqa, mut cqb) = (a.create_cq(256), b.create_cq(256));
    let mut qa = a.create_typed_qp(pa, &cqa, abi::QPT_UC, 0);
    let mut qb = b.create_typed_qp(pb, &cqb, abi::QPT_UC, 0);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect_uc(&qa, ipb, qb.qpn, 1);
    b.connect_uc(&qb, ipa, qa.qpn, 1);
    let msg = 256 * 3; // 3 packets each
    let n = 40u32;
    let src = a.alloc(msg * n as usize);
    let dst = b.alloc(msg * n as usize);
    let (lka, _) = a
        .reg_mr(pa, src, (msg * n as usize) as u64, abi::ACCESS_LOCAL_WRITE)
        .unwrap();
    let (lkb, _) = b
        .reg_mr(pb, dst, (msg * n as usize) as u64, abi::ACCESS_LOCAL_WRITE)
        .unwrap();
    for i in 0..n {
        b.post_recv(
            &mut qb,
            i as u64,
            &[abi::Sge {
                addr: dst + (i as usize * msg) as u64,
                length: msg as u32,
                lkey: lkb,
            }],
            0,
        );
    }
    for i in 0..n {
        let off = i as usize * msg;
        a.fill(src + off as u64, &vec![i as u8 + 1; msg]);
        let wqe = abi::SendWqe {
            wr_id: i as u64,
            opcode: abi::WR_SEND,
            ..Default::default()
        };
        let sge = abi::Sge {
            addr: src + off as u64,
            length: msg as u32,
            lkey: lka,
        };
        a.post_send(&mut qa, wqe, &[sge], 0);
    }
    let mut now = 0;
    let mut sent = Vec::new();
    let mut got = Vec::new();
    run_until(&mut a, &mut b, &mut now, ROUNDS, |a, b| {
        sent.extend(std::iter::from_fn(|| a.poll_cq(&mut cqa)));
        got.extend(std::iter::from_fn(|| b.poll_cq(&mut cqb)));
        sent.len() >= n as usize
    });
    assert!(sent.iter().all(|c| c.status == abi::WC_SUCCESS));
    got.extend(settle(&mut a, &mut b, &mut cqb));
    assert!(
        !got.is_empty() && got.len() < n as usize,
        "{} of {n} arrived",
        got.len()
    );
    // Receive WQEs are used in order, one per message that arrived whole:
    // the k-th completion is WQE k, and it holds one complete message.
    for (k, c) in got.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (k as u64, abi::WC_SUCCESS, msg as u32)
        );
        let data = b.read(dst + (k * msg) as u64, msg);
        assert!(
            data.iter().all(|&x| x == data[0]) && data[0] != 0,
            "message {k} whole"
        );
    }
}

#[test]
fn srq_is_shared_by_two_qps_and_raises_the_limit_event() {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (mut cqa, mut cqb) = (a.create_cq(64), b.create_cq(64));
    let mut srq = b.create_srq(pb, 8, 0);
    let dst = b.alloc(8 * 256);
    let (lkb, _) = b.reg_mr(pb, dst, 8 * 256, abi::ACCESS_LOCAL_WRITE).unwrap();
    for i in 0..8u64 {
        let sge = abi::Sge {
            addr: dst + i * 256,
            length: 256,
            lkey: lkb,
        };
        b.post_srq_recv(&mut srq, 100 + i, sge, 0);
    }
    // Arm the limit: fires once fewer than 6 WQEs remain.
    let arm = abi::SrqAttr {
        srqn: srq.srqn,
        attr_mask: abi::SRQ_ATTR_LIMIT,
        srq_limit: 6,
        ..Default::default()
    };
    b.cmd(abi::CMD_MODIFY_SRQ, &arm).unwrap();
    let mut qas = Vec::new();
    let mut qbs = Vec::new();
    for _ in 0..2 {
        let qa = a.create_qp(pa, &cqa, 16, 1);
        let qb = b.create_typed_qp(pb, &cqb, abi::QPT_RC, srq.srqn);
        qas.push(qa);
        qbs.push(qb);
    }
    let (ipa, ipb) = (a.ip, b.ip);
    for (qa, qb) in qas.iter().zip(&qbs) {
        a.connect(qa, ipb, qb.qpn, 3, 0x10, 0x20, 7, 7);
        b.connect(qb, ipa, qa.qpn, 3, 0x20, 0x10, 7, 7);
    }
    let src = a.alloc(4096);
    let (lka, _) = a.reg_mr(pa, src, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    a.fill(src, &[0x5a; 200]);
    for (k, qa) in qas.iter_mut().enumerate() {
        let wqe = abi::SendWqe {
            wr_id: k as u64,
            opcode: abi::WR_SEND,
            send_flags: abi::SEND_SIGNALED,
            ..Default::default()
        };
        let sge = abi::Sge {
            addr: src,
            length: 100 + k as u32,
            lkey: lka,
        };
        a.post_send(qa, wqe, &[sge], 0);
        a.post_send(qa, wqe, &[sge], 0);
    }
    let sent = collect(&mut a, &mut b, false, &mut cqa, 4);
    assert!(sent.iter().all(|c| c.status == abi::WC_SUCCESS));
    let got = collect(&mut a, &mut b, true, &mut cqb, 4);
    let mut ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(
        ids,
        vec![100, 101, 102, 103],
        "four SRQ WQEs, in ring order"
    );
    let qpns: std::collections::HashSet<u32> = got.iter().map(|c| c.qp_num).collect();
    assert_eq!(qpns.len(), 2, "both QPs received through the one SRQ");
    let limit: Vec<_> = b
        .events()
        .into_iter()
        .filter(|e| e.kind == abi::EV_SRQ_LIMIT)
        .collect();
    assert_eq!(limit.len(), 1, "the limit event fires once");
    assert_eq!(limit[0].handle, srq.srqn);
    let rec: abi::Handle = mem::read_obj(&b.mem, srq.rec).unwrap();
    assert_eq!(rec.handle, 4, "SRQ record holds the consumer index");
    let h = abi::Handle {
        handle: srq.srqn,
        reserved: 0,
    };
    assert_eq!(b.cmd(abi::CMD_DESTROY_SRQ, &h), Err(abi::STATUS_EBUSY));
}

#[test]
fn send_with_invalidate_revokes_the_rkey() {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (mut cqa, mut cqb) = (a.create_cq(64), b.create_cq(64));
    let mut qa = a.create_qp(pa, &cqa, 16, 1);
    let mut qb = b.create_qp(pb, &cqb, 16, 1);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect(&qa, ipb, qb.qpn, 3, 1, 2, 7, 7);
    b.connect(&qb, ipa, qa.qpn, 3, 2, 1, 7, 7);
    let src = a.alloc(4096);
    let (lka, _) = a.reg_mr(pa, src, 4096, abi::ACCESS_LOCAL_WRITE).unwrap();
    let win = b.alloc(4096);
    let (_, rk) = b
        .reg_mr(
            pb,
            win,
            4096,
            abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE,
        )
        .unwrap();
    b.post_recv(&mut qb, 9, &[], 0);
    let inv = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND_WITH_INV,
        send_flags: abi::SEND_SIGNALED,
        imm_data: rk.to_be_bytes(),
        ..Default::default()
    };
    a.post_send(&mut qa, inv, &[], 0);
    let got = collect(&mut a, &mut b, true, &mut cqb, 1);
    assert_eq!(got[0].status, abi::WC_SUCCESS);
    assert_eq!(got[0].wc_flags, abi::WC_WITH_INV);
    assert_eq!(u32::from_be_bytes(got[0].imm_data), rk);
    let write = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: win,
        rkey: rk,
        ..Default::default()
    };
    let sge = abi::Sge {
        addr: src,
        length: 64,
        lkey: lka,
    };
    a.post_send(&mut qa, write, &[sge], 0);
    let sent = collect(&mut a, &mut b, false, &mut cqa, 2);
    assert_eq!(sent[0].status, abi::WC_SUCCESS);
    assert_eq!(sent[1].status, abi::WC_REM_ACCESS_ERR, "invalidated rkey");
}

/// Frames a device queued for the link, without delivering them.
fn drain_tx(n: &mut Node) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| n.dev.pop_tx()).collect()
}

fn opcodes(frames: &[Vec<u8>]) -> Vec<vrnic::wire::Opcode> {
    frames
        .iter()
        .filter_map(|f| match vrnic::wire::parse_frame(f) {
            Ok(vrnic::wire::Frame::Roce(p)) => Some(p.hdr.bth.opcode),
            _ => None,
        })
        .collect()
}

/// A connected RC pair with every ARP exchange done, and 64 KiB buffers.
fn rc_ready() -> (Node, Node, Cq, Cq, Qp, Qp, u64, u32, u64, u32) {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (cqa, cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a.create_qp(pa, &cqa, 16, 1);
    let qb = b.create_qp(pb, &cqb, 16, 1);
    let (ipa, ipb) = (a.ip, b.ip);
    a.connect(&qa, ipb, qb.qpn, 3, 1, 2, 7, 7);
    b.connect(&qb, ipa, qa.qpn, 3, 2, 1, 7, 7);
    let all = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;
    let la = a.alloc(65536);
    let (lka, _) = a.reg_mr(pa, la, 65536, all).unwrap();
    let lb = b.alloc(65536);
    let (_, rkb) = b.reg_mr(pb, lb, 65536, all).unwrap();
    for _ in 0..10 {
        if a.pump(0) + b.pump(0) == 0 {
            break;
        }
    }
    (a, b, cqa, cqb, qa, qb, la, lka, lb, rkb)
}

#[test]
fn a_fenced_send_waits_for_an_earlier_read() {
    let (mut a, mut b, mut cqa, _cqb, mut qa, mut qb, la, lka, lb, rkb) = rc_ready();
    b.post_recv(&mut qb, 1, &[], 0);
    let read = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_READ,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: lb,
        rkey: rkb,
        ..Default::default()
    };
    let sge = abi::Sge {
        addr: la,
        length: 100,
        lkey: lka,
    };
    a.post_send(&mut qa, read, &[sge], 0);
    let send = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED | abi::SEND_FENCE,
        ..Default::default()
    };
    a.post_send(&mut qa, send, &[], 0);
    let first = drain_tx(&mut a);
    assert_eq!(opcodes(&first), vec![vrnic::wire::Opcode::RcReadRequest]);
    for f in &first {
        b.dev.receive(&b.mem, f, 0);
    }
    for f in drain_tx(&mut b) {
        a.dev.receive(&a.mem, &f, 0);
    }
    let after = drain_tx(&mut a);
    assert_eq!(opcodes(&after), vec![vrnic::wire::Opcode::RcSendOnly]);
    for f in &after {
        b.dev.receive(&b.mem, f, 0);
    }
    let done = collect(&mut a, &mut b, false, &mut cqa, 2);
    assert!(done.iter().all(|c| c.status == abi::WC_SUCCESS));
}

#[test]
fn reads_beyond_max_rd_atomic_wait_for_the_outstanding_one() {
    let (mut a, mut b, mut cqa, _cqb, mut qa, _qb, la, lka, lb, rkb) = rc_ready();
    for i in 0..3u64 {
        let read = abi::SendWqe {
            wr_id: i,
            opcode: abi::WR_RDMA_READ,
            send_flags: abi::SEND_SIGNALED,
            remote_addr: lb,
            rkey: rkb,
            ..Default::default()
        };
        let sge = abi::Sge {
            addr: la + i * 1024,
            length: 1024,
            lkey: lka,
        };
        a.post_send(&mut qa, read, &[sge], 0);
    }
    // max_rd_atomic is 1 (as ibv_rc_pingpong sets it): one READ at a time.
    let first = drain_tx(&mut a);
    assert_eq!(opcodes(&first).len(), 1);
    let done = collect(&mut a, &mut b, false, &mut cqa, 3);
    let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    assert!(done.iter().all(|c| c.status == abi::WC_SUCCESS));
}

#[test]
fn sqd_stops_new_work_and_raises_sq_drained() {
    let (mut a, mut b, mut cqa, _cqb, mut qa, mut qb, la, lka, _lb, _rkb) = rc_ready();
    for i in 0..4 {
        b.post_recv(&mut qb, i, &[], 0);
    }
    let send = |id| abi::SendWqe {
        wr_id: id,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    let sge = abi::Sge {
        addr: la,
        length: 0,
        lkey: lka,
    };
    a.post_send(&mut qa, send(1), &[sge], 0);
    let to_sqd = abi::QpAttr {
        qpn: qa.qpn,
        attr_mask: abi::QP_ATTR_STATE,
        qp_state: abi::QPS_SQD,
        ..Default::default()
    };
    a.modify(to_sqd).unwrap();
    assert!(a.events().iter().all(|e| e.kind != abi::EV_SQ_DRAINED));
    a.post_send(&mut qa, send(2), &[sge], 0); // posted while draining
    let done = collect(&mut a, &mut b, false, &mut cqa, 1);
    assert_eq!(done[0].wr_id, 1);
    let ev = a.events();
    assert_eq!(
        ev.iter().filter(|e| e.kind == abi::EV_SQ_DRAINED).count(),
        1,
        "{ev:?}"
    );
    for _ in 0..20 {
        a.pump(0);
        b.pump(0);
    }
    assert!(a.poll_cq(&mut cqa).is_none(), "WQE 2 waits in SQD");
    a.modify(abi::QpAttr {
        qp_state: abi::QPS_RTS,
        ..to_sqd
    })
    .unwrap();
    let done = collect(&mut a, &mut b, false, &mut cqa, 1);
    assert_eq!((done[0].wr_id, done[0].status), (2, abi::WC_SUCCESS));
}

#[test]
fn a_forged_ethernet_source_does_not_redirect_requests() {
    let (mut a, mut b, mut cqa, _cqb, mut qa, mut qb, la, lka, _lb, _rkb) = rc_ready();
    // A RoCE frame "from" B's IP with a bogus source MAC, with a valid ICRC.
    let hdr = vrnic::wire::RoceHeaders {
        eth_src: [0x02, 0xde, 0xad, 0xbe, 0xef, 0x01],
        eth_dst: [2, 0, 0, 0, 0, 1],
        ip_src: std::net::IpAddr::V4(b.ip),
        ip_dst: std::net::IpAddr::V4(a.ip),
        ip_id: 0,
        ttl: 64,
        tclass: 0,
        flow_label: 0,
        udp_src: 0xc000,
        bth: vrnic::wire::Bth {
            opcode: vrnic::wire::Opcode::RcAck,
            solicited: false,
            mig_req: true,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0xabcd,
            ack_req: false,
            psn: 0,
        },
        reth: None,
        aeth: Some(vrnic::wire::Aeth::ack(0, 0x1f)),
        atomic_eth: None,
        atomic_ack_eth: None,
        deth: None,
        immdt: None,
        ieth: None,
    };
    let mut frame = Vec::new();
    vrnic::wire::emit_frame(&hdr, &[], &mut frame);
    a.dev.receive(&a.mem, &frame, 0);
    b.post_recv(&mut qb, 1, &[], 0);
    let send = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_SEND,
        send_flags: abi::SEND_SIGNALED,
        ..Default::default()
    };
    let _ = (la, lka);
    a.post_send(&mut qa, send, &[], 0);
    let done = collect(&mut a, &mut b, false, &mut cqa, 1);
    assert_eq!(done[0].status, abi::WC_SUCCESS);
}

fn link_local(mac_last: u8) -> [u8; 16] {
    vrnic::wire::Gid::link_local_from_mac([2, 0, 0, 0, 0, mac_last]).0
}

#[test]
fn ud_over_ipv6_link_local_gids_resolves_by_neighbour_discovery() {
    let mut p = ud_pair();
    let c = abi::CreateAh {
        pdn: p.pa,
        dgid: link_local(2),
        sgid_index: 0,
        port_num: 1,
        is_global: 1,
        ..Default::default()
    };
    let ah = Node::handle_of(p.a.cmd(abi::CMD_CREATE_AH, &c).unwrap());
    let sge = abi::Sge {
        addr: p.buf_b,
        length: 2048,
        lkey: p.lkey_b,
    };
    p.b.post_recv(&mut p.qb, 3, &[sge], 0);
    ud_send(&mut p, ah, 500, QKEY, None);
    let got = collect(&mut p.a, &mut p.b, true, &mut p.cqb, 1);
    assert_eq!((got[0].status, got[0].byte_len), (abi::WC_SUCCESS, 540));
    let grh = p.b.read(p.buf_b, 40);
    assert_eq!(grh[0] >> 4, 6, "the GRH area holds the IPv6 header");
    assert_eq!(&grh[8..24], &link_local(1), "source GID");
    assert_eq!(&grh[24..40], &link_local(2), "destination GID");
    let want: Vec<u8> = (0..500u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(p.b.read(p.buf_b + 40, 500), want);
}

#[test]
fn rc_write_and_read_over_ipv6_gids() {
    let (mut a, mut b) = pair(1500);
    let (pa, pb) = (a.alloc_pd(), b.alloc_pd());
    let (mut cqa, _cqb) = (a.create_cq(64), b.create_cq(64));
    let qa = a.create_qp(pa, &cqa, 16, 1);
    let qb = b.create_qp(pb, &cqa, 16, 1);
    let all = abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_WRITE | abi::ACCESS_REMOTE_READ;
    for (n, q, peer, peer_qpn) in [(&mut a, &qa, 2u8, qb.qpn), (&mut b, &qb, 1u8, qa.qpn)] {
        use abi::*;
        let base = QpAttr {
            qpn: q.qpn,
            ..Default::default()
        };
        n.modify(QpAttr {
            attr_mask: QP_ATTR_STATE | QP_ATTR_PKEY_INDEX | QP_ATTR_PORT | QP_ATTR_ACCESS_FLAGS,
            qp_state: QPS_INIT,
            port_num: 1,
            qp_access_flags: all,
            ..base
        })
        .unwrap();
        n.modify(QpAttr {
            attr_mask: QP_ATTR_STATE
                | QP_ATTR_AV
                | QP_ATTR_PATH_MTU
                | QP_ATTR_DEST_QPN
                | QP_ATTR_RQ_PSN
                | QP_ATTR_MAX_DEST_RD_ATOMIC
                | QP_ATTR_MIN_RNR_TIMER,
            qp_state: QPS_RTR,
            path_mtu: 3,
            dest_qp_num: peer_qpn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            dgid: link_local(peer),
            sgid_index: 0,
            is_global: 1,
            ..base
        })
        .unwrap();
        n.modify(QpAttr {
            attr_mask: QP_ATTR_STATE
                | QP_ATTR_SQ_PSN
                | QP_ATTR_TIMEOUT
                | QP_ATTR_RETRY_CNT
                | QP_ATTR_RNR_RETRY
                | QP_ATTR_MAX_QP_RD_ATOMIC,
            qp_state: QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..base
        })
        .unwrap();
    }
    // An IPv6 destination with an IPv4 source GID is refused, as the kernel does.
    let bad = abi::CreateAh {
        pdn: pa,
        dgid: link_local(2),
        sgid_index: 1,
        port_num: 1,
        is_global: 1,
        ..Default::default()
    };
    assert_eq!(a.cmd(abi::CMD_CREATE_AH, &bad), Err(abi::STATUS_EINVAL));
    let len = 3000usize;
    let src = a.alloc(2 * len);
    let (lka, _) = a.reg_mr(pa, src, 2 * len as u64, all).unwrap();
    let dst = b.alloc(len);
    let (_, rkb) = b.reg_mr(pb, dst, len as u64, all).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
    a.fill(src, &data);
    let mut qa = qa;
    let write = abi::SendWqe {
        wr_id: 1,
        opcode: abi::WR_RDMA_WRITE,
        send_flags: abi::SEND_SIGNALED,
        remote_addr: dst,
        rkey: rkb,
        ..Default::default()
    };
    let sge = |off: u64| abi::Sge {
        addr: src + off,
        length: len as u32,
        lkey: lka,
    };
    a.post_send(&mut qa, write, &[sge(0)], 0);
    let read = abi::SendWqe {
        wr_id: 2,
        opcode: abi::WR_RDMA_READ,
        ..write
    };
    a.post_send(&mut qa, read, &[sge(len as u64)], 0);
    let done = collect(&mut a, &mut b, false, &mut cqa, 2);
    assert!(done.iter().all(|c| c.status == abi::WC_SUCCESS), "{done:?}");
    assert_eq!(b.read(dst, len), data);
    assert_eq!(a.read(src + len as u64, len), data);
}
