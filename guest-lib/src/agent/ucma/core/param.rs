//! The byte-level helpers of the commands' structures: little readers and
//! writers at offsets, and `rdma_ucm_conn_param`/`rdma_ucm_ud_param` in and out.

use super::*;

pub(super) fn rd_u16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}
pub(super) fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(super) fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
pub(super) fn wr_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// A command's result: the response bytes, or a negative errno.
pub(super) type Answer = Result<Vec<u8>, i32>;

/// `struct rdma_ucm_conn_param`, decoded.
#[derive(Debug, Clone, Default)]
pub(super) struct ConnParam {
    pub(super) qp_num: u32,
    pub(super) private_data: Vec<u8>,
    pub(super) srq: bool,
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) flow_control: bool,
    pub(super) retry_count: u8,
    pub(super) rnr_retry_count: u8,
    pub(super) valid: bool,
}

pub(super) fn conn_param(b: &[u8]) -> ConnParam {
    let len = usize::from(b[264]).min(256);
    ConnParam {
        qp_num: rd_u32(b, 0) & 0xff_ffff,
        private_data: b[8..8 + len].to_vec(),
        srq: b[265] != 0,
        responder_resources: b[266],
        initiator_depth: b[267],
        flow_control: b[268] != 0,
        retry_count: b[269] & 7,
        rnr_retry_count: b[270] & 7,
        valid: b[271] != 0,
    }
}

/// Writes an `rdma_ucm_conn_param` at `b[20..]` of an event.
#[allow(clippy::too_many_arguments)]
pub(super) fn put_conn(
    resp: &mut [u8; EVENT_RESP_LEN],
    qp_num: u32,
    pd: &[u8],
    srq: bool,
    rr: u8,
    id: u8,
    fc: bool,
    retry: u8,
    rnr: u8,
) {
    let p = &mut resp[20..20 + 272];
    p[0..4].copy_from_slice(&qp_num.to_ne_bytes());
    let n = pd.len().min(256);
    p[8..8 + n].copy_from_slice(&pd[..n]);
    p[264] = n.min(255) as u8;
    p[265] = srq.into();
    p[266] = rr;
    p[267] = id;
    p[268] = fc.into();
    p[269] = retry;
    p[270] = rnr;
}

/// Writes an `rdma_ucm_ud_param` at `resp[20..]` of an event: QPN,
/// Q_Key, the AH to the peer (`ib_init_ah_attr_from_path`) and private
/// data.
pub(super) fn put_ud(
    resp: &mut [u8; EVENT_RESP_LEN],
    qp_num: u32,
    qkey: u32,
    path: Option<&ConnAttrs>,
    pd: &[u8],
) {
    let p = &mut resp[20..20 + 304];
    p[0..4].copy_from_slice(&qp_num.to_ne_bytes());
    p[4..8].copy_from_slice(&qkey.to_ne_bytes());
    if let Some(c) = path {
        let ah = &mut p[8..40];
        ah[0..16].copy_from_slice(&c.dgid);
        ah[16..20].copy_from_slice(&c.flow_label.to_ne_bytes());
        ah[20] = c.sgid_index;
        ah[21] = c.hop_limit;
        ah[22] = c.traffic_class;
        ah[29] = 1; // is_global
        ah[30] = 1; // port_num
    }
    let n = pd.len().min(255);
    p[40..40 + n].copy_from_slice(&pd[..n]);
    p[296] = n as u8;
}
