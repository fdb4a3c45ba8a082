//! A small device for the fuzz targets: a PD, an MR, a CQ, an RC QP in RTS
//! and a UD QP in RTS, built with control commands over `VecMemory`.

use vrnic::abi::{self, Pod};
use vrnic::device::{Device, DeviceConfig};
use vrnic::mem::{DmaMemory, VecMemory};

pub const BASE: u64 = 0x10_0000;
pub const SIZE: usize = 4 << 20;

fn cmd<T: Pod>(dev: &mut Device, mem: &VecMemory, opcode: u16, body: &T) -> Vec<u8> {
    let mut req = abi::CmdHeader {
        opcode,
        flags: 0,
        len: size_of::<T>() as u32,
    }
    .as_bytes()
    .to_vec();
    req.extend_from_slice(body.as_bytes());
    let mut resp = vec![0u8; 256];
    let n = dev.control(mem, &req, &mut resp);
    resp.truncate(n);
    let h = abi::RespHeader::read_from(&resp).expect("response header");
    assert_eq!(h.status, 0, "setup command {opcode} failed");
    resp[8..].to_vec()
}

fn handle(r: Vec<u8>) -> u32 {
    abi::Handle::read_from(&r).expect("handle").handle
}

/// The device, its memory, and the numbers of its QPs (RC, UD).
pub fn device() -> (Device, VecMemory, [u32; 2]) {
    let mem = VecMemory::new(BASE, SIZE);
    let mut dev = Device::new(DeviceConfig {
        mac: [2, 0, 0, 0, 0, 2],
        ipv4: std::net::Ipv4Addr::new(10, 0, 0, 2),
        prefix_len: 24,
        ipv6: Vec::new(),
        link_mtu: 1500,
    });
    let pd = handle(cmd(
        &mut dev,
        &mem,
        abi::CMD_ALLOC_PD,
        &abi::Handle::default(),
    ));
    // MR over the second MiB, page list at BASE.
    let mr_base = BASE + (1 << 20);
    for i in 0..256u64 {
        mem.write(BASE + i * 8, &(mr_base + i * 4096).to_le_bytes())
            .unwrap();
    }
    let all = abi::ACCESS_LOCAL_WRITE
        | abi::ACCESS_REMOTE_WRITE
        | abi::ACCESS_REMOTE_READ
        | abi::ACCESS_REMOTE_ATOMIC;
    let reg = abi::RegMr {
        pdn: pd,
        access: all,
        iova: mr_base,
        length: 1 << 20,
        page_shift: 12,
        npages: 256,
        page_list: BASE,
    };
    let _keys = cmd(&mut dev, &mem, abi::CMD_REG_MR, &reg);
    let cq = abi::CreateCq {
        cqe: 256,
        reserved: 0,
        ring: BASE + 0x8000,
        db: BASE + 0x7f00,
    };
    let cqn = handle(cmd(&mut dev, &mem, abi::CMD_CREATE_CQ, &cq));
    let mut qpns = [0u32; 2];
    for (k, qp_type) in [abi::QPT_RC, abi::QPT_UD].into_iter().enumerate() {
        let area = BASE + 0x20000 + k as u64 * 0x20000;
        let c = abi::CreateQp {
            pdn: pd,
            qp_type,
            send_cqn: cqn,
            recv_cqn: cqn,
            sq_size: 16,
            rq_size: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
            sq_sig_all: 0,
            sq: area,
            rq: area + 0x10000,
            db: area + 0x1f000,
            srqn: 0,
            reserved: 0,
        };
        let qpn = abi::CreateQpResp::read_from(&cmd(&mut dev, &mem, abi::CMD_CREATE_QP, &c))
            .unwrap()
            .qpn;
        qpns[k] = qpn;
        let ud = qp_type == abi::QPT_UD;
        let steps: [abi::QpAttr; 3] = [
            abi::QpAttr {
                qpn,
                attr_mask: abi::QP_ATTR_STATE
                    | abi::QP_ATTR_PKEY_INDEX
                    | abi::QP_ATTR_PORT
                    | if ud {
                        abi::QP_ATTR_QKEY
                    } else {
                        abi::QP_ATTR_ACCESS_FLAGS
                    },
                qp_state: abi::QPS_INIT,
                port_num: 1,
                qkey: 0x1111_1111,
                qp_access_flags: all,
                ..Default::default()
            },
            if ud {
                abi::QpAttr {
                    qpn,
                    attr_mask: abi::QP_ATTR_STATE,
                    qp_state: abi::QPS_RTR,
                    ..Default::default()
                }
            } else {
                abi::QpAttr {
                    qpn,
                    attr_mask: abi::QP_ATTR_STATE
                        | abi::QP_ATTR_AV
                        | abi::QP_ATTR_PATH_MTU
                        | abi::QP_ATTR_DEST_QPN
                        | abi::QP_ATTR_RQ_PSN
                        | abi::QP_ATTR_MAX_DEST_RD_ATOMIC
                        | abi::QP_ATTR_MIN_RNR_TIMER,
                    qp_state: abi::QPS_RTR,
                    path_mtu: 3,
                    dest_qp_num: 0x11,
                    dgid: std::net::Ipv4Addr::new(10, 0, 0, 1)
                        .to_ipv6_mapped()
                        .octets(),
                    sgid_index: 1,
                    is_global: 1,
                    ..Default::default()
                }
            },
            abi::QpAttr {
                qpn,
                attr_mask: abi::QP_ATTR_STATE
                    | abi::QP_ATTR_SQ_PSN
                    | if ud {
                        0
                    } else {
                        abi::QP_ATTR_TIMEOUT
                            | abi::QP_ATTR_RETRY_CNT
                            | abi::QP_ATTR_RNR_RETRY
                            | abi::QP_ATTR_MAX_QP_RD_ATOMIC
                    },
                qp_state: abi::QPS_RTS,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 1,
                ..Default::default()
            },
        ];
        for s in &steps {
            cmd(&mut dev, &mem, abi::CMD_MODIFY_QP, s);
        }
    }
    (dev, mem, qpns)
}
