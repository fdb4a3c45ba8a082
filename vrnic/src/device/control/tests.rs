//! The status the driver sees for each way a command fails, through
//! [`Device::control`]: pins the statuses the command path answered
//! before it was split into handlers and a `CommandError` (issue 29).

use crate::abi::{self, Pod};
use crate::device::{Device, DeviceConfig};
use crate::mem::VecMemory;

const BASE: u64 = 0x10_0000;
const SIZE: usize = 4 << 20;
/// An address past the end of driver memory.
const OUTSIDE: u64 = BASE + SIZE as u64 + 0x1000;

struct Harness {
    dev: Device,
    mem: VecMemory,
    next: u64,
}

impl Harness {
    fn new() -> Harness {
        let cfg = DeviceConfig {
            mac: [2, 0, 0, 0, 0, 1],
            ipv4: std::net::Ipv4Addr::new(10, 0, 0, 1),
            prefix_len: 24,
            ipv6: Vec::new(),
            link_mtu: 1500,
        };
        Harness {
            dev: Device::with_key_secret(cfg, 1),
            mem: VecMemory::new(BASE, SIZE),
            next: BASE,
        }
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let gpa = self.next;
        self.next += len.div_ceil(4096) * 4096;
        gpa
    }

    /// Command `opcode` from context `ctx` with body `body`: its response
    /// body, or its status.
    fn raw(&mut self, ctx: u16, opcode: u16, body: &[u8]) -> Result<Vec<u8>, u32> {
        let mut req = abi::CmdHeader {
            opcode,
            ctx,
            len: body.len() as u32,
        }
        .as_bytes()
        .to_vec();
        req.extend_from_slice(body);
        let mut resp = [0u8; 8 + abi::MAX_CMD_BODY];
        let n = self.dev.control(&self.mem, &req, &mut resp, 0);
        let h = abi::RespHeader::read_from(&resp[..n]).expect("a response header");
        if h.status != abi::STATUS_OK {
            return Err(h.status);
        }
        Ok(resp[8..n].to_vec())
    }

    fn cmd<T: Pod>(&mut self, opcode: u16, body: &T) -> Result<Vec<u8>, u32> {
        self.raw(abi::DEFAULT_CTX, opcode, body.as_bytes())
    }

    fn status<T: Pod>(&mut self, opcode: u16, body: &T) -> u32 {
        self.cmd(opcode, body).err().unwrap_or(abi::STATUS_OK)
    }

    fn handle(&mut self, opcode: u16, body: &impl Pod) -> u32 {
        let r = self.cmd(opcode, body).expect("command succeeds");
        abi::Handle::read_from(&r).expect("a handle").handle
    }

    fn pd(&mut self) -> u32 {
        self.handle(abi::CMD_ALLOC_PD, &abi::Handle::default())
    }

    fn cq(&mut self) -> u32 {
        let c = abi::CreateCq {
            cqe: 16,
            reserved: 0,
            ring: self.alloc(16 * 32),
            db: self.alloc(8),
        };
        self.handle(abi::CMD_CREATE_CQ, &c)
    }

    fn srq(&mut self, pdn: u32) -> u32 {
        let c = abi::CreateSrq {
            pdn,
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
            ring: self.alloc(16 * 64),
            db: self.alloc(8),
        };
        let r = self.cmd(abi::CMD_CREATE_SRQ, &c).expect("SRQ created");
        abi::CreateSrqResp::read_from(&r)
            .expect("SRQ response")
            .srqn
    }

    fn create_qp(&mut self, pdn: u32, cqn: u32) -> abi::CreateQp {
        abi::CreateQp {
            pdn,
            qp_type: abi::QPT_RC,
            send_cqn: cqn,
            recv_cqn: cqn,
            sq_size: 16,
            rq_size: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
            sq_sig_all: 0,
            sq: self.alloc(16 * 1024),
            rq: self.alloc(16 * 1024),
            db: self.alloc(64),
            srqn: 0,
            flags: 0,
        }
    }
}

#[test]
fn decoding_answers_enoent_for_a_closed_context_then_enosys_and_einval() {
    let mut h = Harness::new();
    // The context is checked before the opcode.
    assert_eq!(h.raw(7, 0xffff, &[]), Err(abi::STATUS_ENOENT));
    assert_eq!(
        h.raw(7, abi::CMD_QUERY_DEVICE, &[]),
        Err(abi::STATUS_ENOENT)
    );
    assert_eq!(h.raw(0, 0, &[]), Err(abi::STATUS_ENOSYS));
    assert_eq!(h.raw(0, 0xffff, &[]), Err(abi::STATUS_ENOSYS));
    assert_eq!(
        h.raw(0, abi::CMD_DESTROY_QP, &[0; 7]),
        Err(abi::STATUS_EINVAL)
    );
    assert_eq!(h.raw(0, abi::CMD_QUERY_PORT, &[]), Err(abi::STATUS_EINVAL));
    // No arguments: any body; trailing bytes ignored.
    assert!(h.raw(0, abi::CMD_QUERY_DEVICE, &[]).is_ok());
    let port = abi::QueryPort {
        port: 1,
        ..Default::default()
    };
    let mut long = port.as_bytes().to_vec();
    long.extend_from_slice(&[0xee; 16]);
    assert!(h.raw(0, abi::CMD_QUERY_PORT, &long).is_ok());
}

#[test]
fn queries_answer_einval_for_another_port_and_enoent_past_the_tables() {
    let mut h = Harness::new();
    let port2 = abi::QueryPort {
        port: 2,
        ..Default::default()
    };
    assert_eq!(h.status(abi::CMD_QUERY_PORT, &port2), abi::STATUS_EINVAL);
    let gid = abi::QueryGid { port: 1, index: 99 };
    assert_eq!(h.status(abi::CMD_QUERY_GID, &gid), abi::STATUS_ENOENT);
    let gid2 = abi::QueryGid { port: 2, index: 0 };
    assert_eq!(h.status(abi::CMD_QUERY_GID, &gid2), abi::STATUS_EINVAL);
    let pkey = abi::QueryPkey { port: 1, index: 99 };
    assert_eq!(h.status(abi::CMD_QUERY_PKEY, &pkey), abi::STATUS_ENOENT);
    let ctx = h.handle(abi::CMD_OPEN_CTX, &abi::Handle::default()) as u16;
    assert_eq!(
        h.raw(ctx, abi::CMD_QUERY_USAGE, &[]),
        Err(abi::STATUS_EPERM)
    );
    assert_eq!(h.raw(ctx, abi::CMD_OPEN_CTX, &[]), Err(abi::STATUS_EPERM));
}

#[test]
fn objects_in_use_answer_ebusy() {
    let mut h = Harness::new();
    let pdn = h.pd();
    let cqn = h.cq();
    let c = h.create_qp(pdn, cqn);
    h.cmd(abi::CMD_CREATE_QP, &c).expect("QP created");
    let pd = abi::Handle {
        handle: pdn,
        reserved: 0,
    };
    assert_eq!(h.status(abi::CMD_DEALLOC_PD, &pd), abi::STATUS_EBUSY);
    let cq = abi::Handle {
        handle: cqn,
        reserved: 0,
    };
    assert_eq!(h.status(abi::CMD_DESTROY_CQ, &cq), abi::STATUS_EBUSY);
    let nothing = abi::Handle {
        handle: 0x77,
        reserved: 0,
    };
    for op in [
        abi::CMD_DEALLOC_PD,
        abi::CMD_DEREG_MR,
        abi::CMD_DESTROY_CQ,
        abi::CMD_QUERY_QP,
        abi::CMD_DESTROY_QP,
        abi::CMD_DESTROY_AH,
        abi::CMD_QUERY_SRQ,
        abi::CMD_DESTROY_SRQ,
    ] {
        assert_eq!(h.status(op, &nothing), abi::STATUS_ENOENT, "opcode {op}");
    }
}

#[test]
fn create_qp_checks_in_order() {
    let mut h = Harness::new();
    let pdn = h.pd();
    let cqn = h.cq();
    let good = h.create_qp(pdn, cqn);
    let status = |h: &mut Harness, c: abi::CreateQp| h.status(abi::CMD_CREATE_QP, &c);
    // The type first, then the objects, then the sizes.
    let bad_type = abi::CreateQp {
        qp_type: 99,
        pdn: 0x55,
        ..good
    };
    assert_eq!(status(&mut h, bad_type), abi::STATUS_EOPNOTSUPP);
    let no_pd = abi::CreateQp {
        pdn: 0x55,
        sq_size: 3,
        ..good
    };
    assert_eq!(status(&mut h, no_pd), abi::STATUS_ENOENT);
    let no_cq = abi::CreateQp {
        recv_cqn: 0x55,
        ..good
    };
    assert_eq!(status(&mut h, no_cq), abi::STATUS_ENOENT);
    let no_srq = abi::CreateQp {
        srqn: 0x55,
        rq_size: 0,
        ..good
    };
    assert_eq!(status(&mut h, no_srq), abi::STATUS_ENOENT);
    let other_pd = h.pd();
    let srqn = h.srq(other_pd);
    let foreign_srq = abi::CreateQp {
        srqn,
        rq_size: 0,
        ..good
    };
    assert_eq!(status(&mut h, foreign_srq), abi::STATUS_EINVAL);
    let srqn = h.srq(pdn);
    let on_srq = abi::CreateQp {
        srqn,
        rq_size: 0,
        ..good
    };
    for bad in [
        abi::CreateQp { sq_size: 3, ..good },
        abi::CreateQp { rq_size: 0, ..good },
        abi::CreateQp {
            rq_size: 16,
            ..on_srq
        },
        abi::CreateQp {
            max_send_sge: 33,
            ..good
        },
        abi::CreateQp {
            max_inline: 513,
            ..good
        },
        abi::CreateQp {
            flags: 1 << 31,
            ..good
        },
        abi::CreateQp {
            flags: abi::QP_F_RQ_RECORD,
            ..on_srq
        },
    ] {
        assert_eq!(status(&mut h, bad), abi::STATUS_EINVAL, "{bad:?}");
    }
    for bad in [
        abi::CreateQp {
            sq: OUTSIDE,
            ..good
        },
        abi::CreateQp {
            rq: OUTSIDE,
            ..good
        },
        abi::CreateQp {
            db: OUTSIDE,
            ..good
        },
    ] {
        assert_eq!(status(&mut h, bad), abi::STATUS_EFAULT, "{bad:?}");
    }
    // With an SRQ the RQ address is not looked at.
    let ok = abi::CreateQp {
        rq: OUTSIDE,
        ..on_srq
    };
    assert_eq!(status(&mut h, ok), abi::STATUS_OK);
    assert_eq!(status(&mut h, good), abi::STATUS_OK);
}

#[test]
fn srqs_and_ahs_answer_as_before() {
    let mut h = Harness::new();
    let pdn = h.pd();
    let srqn = h.srq(pdn);
    let attr = |attr_mask, srq_limit| abi::SrqAttr {
        srqn,
        attr_mask,
        srq_limit,
        ..Default::default()
    };
    let resize = attr(abi::SRQ_ATTR_MAX_WR, 0);
    assert_eq!(
        h.status(abi::CMD_MODIFY_SRQ, &resize),
        abi::STATUS_EOPNOTSUPP
    );
    assert_eq!(
        h.status(abi::CMD_MODIFY_SRQ, &attr(1 << 7, 0)),
        abi::STATUS_EINVAL
    );
    let limit = abi::SRQ_ATTR_LIMIT;
    assert_eq!(
        h.status(abi::CMD_MODIFY_SRQ, &attr(limit, 17)),
        abi::STATUS_EINVAL
    );
    assert_eq!(
        h.status(abi::CMD_MODIFY_SRQ, &attr(limit, 16)),
        abi::STATUS_OK
    );
    let mut dgid = [0u8; 16];
    dgid[10..12].copy_from_slice(&[0xff, 0xff]);
    dgid[12..].copy_from_slice(&[10, 0, 0, 2]);
    let ah = abi::CreateAh {
        pdn,
        dgid,
        sgid_index: 1,
        port_num: 1,
        is_global: 1,
        ..Default::default()
    };
    for bad in [
        abi::CreateAh { port_num: 2, ..ah },
        abi::CreateAh { is_global: 0, ..ah },
        abi::CreateAh {
            sgid_index: 0,
            ..ah
        },
        abi::CreateAh {
            sgid_index: 9,
            ..ah
        },
    ] {
        assert_eq!(h.status(abi::CMD_CREATE_AH, &bad), abi::STATUS_EINVAL);
    }
    let no_pd = abi::CreateAh { pdn: 0x55, ..ah };
    assert_eq!(h.status(abi::CMD_CREATE_AH, &no_pd), abi::STATUS_ENOENT);
    assert_eq!(h.status(abi::CMD_CREATE_AH, &ah), abi::STATUS_OK);
}
