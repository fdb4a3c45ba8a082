//! `INIT_QP_ATTR`'s answer: the QP attributes and mask rdma_cm gives for
//! each state (Linux cma.c `rdma_init_qp_attr`, `cma_ib_init_qp_attr`;
//! cm.c `cm_init_qp_init_attr`, `cm_init_qp_rtr_attr`,
//! `cm_init_qp_rts_attr`), as `struct ib_uverbs_qp_attr`.

use super::abi::{ib_uverbs_ah_attr, ib_uverbs_global_route, ib_uverbs_qp_attr};

/// `IB_QP_STATE` … `IB_QP_DEST_QPN` (`enum ib_qp_attr_mask`).
pub mod mask {
    #![allow(missing_docs)]
    pub const STATE: u32 = 1;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const QKEY: u32 = 1 << 6;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `IB_QPS_INIT`, `IB_QPS_RTR`, `IB_QPS_RTS`, `IB_QPS_ERR`.
pub const QPS_INIT: u32 = 1;
/// `IB_QPS_RTR`.
pub const QPS_RTR: u32 = 2;
/// `IB_QPS_RTS`.
pub const QPS_RTS: u32 = 3;
/// `IB_QPS_ERR`, the highest state `INIT_QP_ATTR` accepts.
pub const QPS_ERR: u32 = 6;
/// `IB_ACCESS_REMOTE_WRITE`.
pub const ACCESS_REMOTE_WRITE: u32 = 2;
/// `IB_ACCESS_REMOTE_READ`.
pub const ACCESS_REMOTE_READ: u32 = 4;
/// `IB_ACCESS_REMOTE_ATOMIC`.
pub const ACCESS_REMOTE_ATOMIC: u32 = 8;
/// `RDMA_UDP_QKEY`, the Q_Key of rdma_cm's UD ids (cma.c `cma_set_qkey`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// What an id knows of its connection, as cm.c keeps it in
/// `cm_id_private` (None before CONNECT or a CONNECT_REQUEST).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnAttrs {
    /// The peer's GID (the AV's destination).
    pub dgid: [u8; 16],
    /// The GID table index of the local GID (the AV's `sgid_index`).
    pub sgid_index: u8,
    /// Hop limit of the path (rdma_cm on RoCEv2: 64).
    pub hop_limit: u8,
    /// Traffic class (the id's TOS).
    pub traffic_class: u8,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Path MTU (IBA encoding, 1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// The peer's QPN (`dest_qp_num`).
    pub remote_qpn: u32,
    /// The PSN this side's receive queue starts at: the starting PSN this
    /// side sent in its REQ or REP (cm.c `rq_psn`; cma.c sets it to the
    /// id's `seq_num`, which is that PSN).
    pub rq_psn: u32,
    /// The PSN this side sends from: the starting PSN of the peer's REQ or
    /// REP (cm.c `sq_psn`).
    pub sq_psn: u32,
    /// RDMA READ/atomic depth as responder (`max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// As initiator (`max_rd_atomic`).
    pub initiator_depth: u8,
    /// Local ACK timeout exponent (`timeout`).
    pub timeout: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
}

/// The inputs of [`init_qp_attr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttrInput {
    /// The state asked for (`IB_QPS_*`).
    pub qp_state: u32,
    /// Whether the id's QP is UD (`IB_QPT_UD`).
    pub ud: bool,
    /// The UD Q_Key.
    pub qkey: u32,
    /// The connection, once the IB CM id exists.
    pub conn: Option<ConnAttrs>,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`'s value, if set (cma.c `timeout_set`).
    pub ack_timeout: Option<u8>,
}

/// Errors of [`init_qp_attr`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QpAttrError {
    /// A state above `IB_QPS_ERR` (ucma.c: `-EINVAL`), or RTR/RTS before
    /// the connection exists or for a state the CM has no attributes for
    /// (cm.c: `-EINVAL`).
    #[error("invalid QP state for the id")]
    Invalid,
}

/// The attributes and mask for `input.qp_state` (port 1, P_Key index 0:
/// vrnic has one port and the default P_Key only).
pub fn init_qp_attr(input: &QpAttrInput) -> Result<ib_uverbs_qp_attr, QpAttrError> {
    let mut a = ib_uverbs_qp_attr {
        qp_state: input.qp_state,
        ..Default::default()
    };
    if input.qp_state > QPS_ERR {
        return Err(QpAttrError::Invalid);
    }
    let mut m;
    match (input.conn, input.ud) {
        // cma_ib_init_qp_attr: no CM id yet, or UD.
        (None, _) | (_, true) => {
            a.pkey_index = 0;
            a.port_num = 1;
            m = mask::STATE | mask::PKEY_INDEX | mask::PORT;
            if input.ud {
                a.qkey = input.qkey;
                m |= mask::QKEY;
            } else {
                a.qp_access_flags = 0;
                m |= mask::ACCESS_FLAGS;
            }
            if input.qp_state == QPS_RTR {
                a.rq_psn = input.conn.map_or(0, |c| c.rq_psn);
            }
            if input.conn.is_none() && !input.ud && input.qp_state != QPS_INIT {
                return Err(QpAttrError::Invalid);
            }
        }
        (Some(c), false) => match input.qp_state {
            // cm_init_qp_init_attr.
            QPS_INIT => {
                m = mask::STATE | mask::ACCESS_FLAGS | mask::PKEY_INDEX | mask::PORT;
                a.qp_access_flags = ACCESS_REMOTE_WRITE;
                if c.responder_resources > 0 {
                    a.qp_access_flags |= ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
                }
                a.pkey_index = 0;
                a.port_num = 1;
            }
            // cm_init_qp_rtr_attr (RC).
            QPS_RTR => {
                m = mask::STATE
                    | mask::AV
                    | mask::PATH_MTU
                    | mask::DEST_QPN
                    | mask::RQ_PSN
                    | mask::MAX_DEST_RD_ATOMIC
                    | mask::MIN_RNR_TIMER;
                a.ah_attr = ib_uverbs_ah_attr {
                    grh: ib_uverbs_global_route {
                        dgid: c.dgid,
                        flow_label: c.flow_label,
                        sgid_index: c.sgid_index,
                        hop_limit: c.hop_limit,
                        traffic_class: c.traffic_class,
                        reserved: 0,
                    },
                    dlid: 0,
                    sl: 0,
                    src_path_bits: 0,
                    static_rate: 0,
                    is_global: 1,
                    port_num: 1,
                    reserved: 0,
                };
                a.path_mtu = u32::from(c.path_mtu);
                a.dest_qp_num = c.remote_qpn;
                a.rq_psn = c.rq_psn;
                a.max_dest_rd_atomic = c.responder_resources;
                a.min_rnr_timer = 0;
            }
            // cm_init_qp_rts_attr (RC).
            QPS_RTS => {
                m = mask::STATE
                    | mask::SQ_PSN
                    | mask::TIMEOUT
                    | mask::RETRY_CNT
                    | mask::RNR_RETRY
                    | mask::MAX_QP_RD_ATOMIC;
                a.sq_psn = c.sq_psn;
                a.timeout = c.timeout;
                a.retry_cnt = c.retry_count;
                a.rnr_retry = c.rnr_retry_count;
                a.max_rd_atomic = c.initiator_depth;
            }
            _ => return Err(QpAttrError::Invalid),
        },
    }
    if m & mask::TIMEOUT != 0 {
        if let Some(t) = input.ack_timeout {
            a.timeout = t;
        }
    }
    a.qp_attr_mask = m;
    Ok(a)
}

/// The bytes of `a` as the kernel copies them to user space (144 bytes).
pub fn to_bytes(a: &ib_uverbs_qp_attr) -> Vec<u8> {
    // SAFETY: `ib_uverbs_qp_attr` is a `repr(C)` struct of integers and
    // arrays of integers without padding (bindgen's layout tests: 144
    // bytes, every field at the kernel's offset), so all its bytes are
    // initialised; the slice lives no longer than `a`.
    let b = unsafe {
        std::slice::from_raw_parts(
            (a as *const ib_uverbs_qp_attr).cast::<u8>(),
            size_of::<ib_uverbs_qp_attr>(),
        )
    };
    b.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> ConnAttrs {
        ConnAttrs {
            dgid: [7; 16],
            sgid_index: 1,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 5,
            path_mtu: 3,
            remote_qpn: 0x12,
            rq_psn: 0x111,
            sq_psn: 0x222,
            responder_resources: 1,
            initiator_depth: 2,
            timeout: 19,
            retry_count: 7,
            rnr_retry_count: 6,
        }
    }

    #[test]
    fn attrs_per_state_as_cm_c() {
        let mut i = QpAttrInput {
            qp_state: QPS_INIT,
            ud: false,
            qkey: 0,
            conn: None,
            ack_timeout: None,
        };
        let a = init_qp_attr(&i).unwrap();
        assert_eq!(
            a.qp_attr_mask,
            mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS
        );
        assert_eq!((a.qp_access_flags, a.port_num), (0, 1));
        i.qp_state = QPS_RTR;
        assert!(init_qp_attr(&i).is_err());
        i.conn = Some(conn());
        i.qp_state = QPS_INIT;
        let a = init_qp_attr(&i).unwrap();
        assert_eq!(a.qp_access_flags, 2 | 4 | 8);
        i.qp_state = QPS_RTR;
        let a = init_qp_attr(&i).unwrap();
        assert_eq!(
            a.qp_attr_mask,
            1 | 128 | 256 | (1 << 20) | 4096 | (1 << 17) | (1 << 15)
        );
        assert_eq!((a.dest_qp_num, a.rq_psn, a.path_mtu), (0x12, 0x111, 3));
        assert_eq!(a.ah_attr.grh.dgid, [7; 16]);
        assert_eq!((a.ah_attr.is_global, a.ah_attr.grh.sgid_index), (1, 1));
        assert_eq!(a.max_dest_rd_atomic, 1);
        i.qp_state = QPS_RTS;
        i.ack_timeout = Some(14);
        let a = init_qp_attr(&i).unwrap();
        assert_eq!(
            (
                a.sq_psn,
                a.timeout,
                a.retry_cnt,
                a.rnr_retry,
                a.max_rd_atomic
            ),
            (0x222, 14, 7, 6, 2)
        );
        i.qp_state = 7;
        assert!(init_qp_attr(&i).is_err());
        i.qp_state = QPS_INIT;
        i.ud = true;
        i.qkey = RDMA_UDP_QKEY;
        let a = init_qp_attr(&i).unwrap();
        assert_eq!(
            a.qp_attr_mask,
            mask::STATE | mask::PKEY_INDEX | mask::PORT | mask::QKEY
        );
        assert_eq!(a.qkey, RDMA_UDP_QKEY);
        assert_eq!(to_bytes(&a).len(), 144);
    }
}
