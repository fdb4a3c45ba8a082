//! Work completions (`struct ibv_wc`, `ibv_poll_cq(3)`).

use vrnic_abi as abi;

/// One work completion (`struct ibv_wc`), decoded from an [`abi::Cqe`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The completed work request's `wr_id`.
    pub wr_id: u64,
    /// `ibv_wc_status` (`abi::WC_*`; 0 = success), raw. See
    /// [`Self::wc_status`] for it typed, [`Self::status_str`] for its name.
    pub status: u8,
    /// `ibv_wc_opcode` (`abi::WC_OP_*`). Valid only when `status` is success.
    pub opcode: u8,
    /// Vendor error detail, 0 when none.
    pub vendor_err: u16,
    /// Bytes transferred: the payload length of a receive (on a UD QP
    /// [`super::GRH_LEN`] + payload: the GRH area counts), the bytes read
    /// by an RDMA READ.
    pub byte_len: u32,
    /// Immediate data in host order (the sender's `imm_data` value), when
    /// `wc_flags` has `WC_WITH_IMM`.
    pub imm_data: Option<u32>,
    /// The rkey a SEND with invalidate invalidated, when `wc_flags` has `WC_WITH_INV`.
    pub invalidated_rkey: Option<u32>,
    /// Local QP number.
    pub qp_num: u32,
    /// Source QP number: the sender's QP of a UD receive (from its DETH).
    /// `ibv_poll_cq(3)` defines it for UD only; vrnic also reports the
    /// connected peer (`dest_qp_num`) in an RC or UC receive completion, as
    /// mlx5 does (rxe leaves it 0), and 0 in send completions.
    pub src_qp: u32,
    /// `ibv_wc_flags`: `WC_GRH` (a UD receive: the buffer starts with the
    /// [`super::GRH_LEN`]-byte GRH area, see [`super::grh_sgid`]),
    /// `WC_WITH_IMM`, `WC_WITH_INV`.
    pub wc_flags: u8,
    /// Service level.
    pub sl: u8,
}

impl WorkCompletion {
    /// Decodes a CQE.
    pub fn from_cqe(c: &abi::Cqe) -> Self {
        let imm = u32::from_be_bytes(c.imm_data);
        WorkCompletion {
            wr_id: c.wr_id,
            status: c.status,
            opcode: c.opcode,
            vendor_err: c.vendor_err,
            byte_len: c.byte_len,
            imm_data: (c.wc_flags & abi::WC_WITH_IMM != 0).then_some(imm),
            invalidated_rkey: (c.wc_flags & abi::WC_WITH_INV != 0).then_some(imm),
            qp_num: c.qp_num,
            src_qp: c.src_qp,
            wc_flags: c.wc_flags,
            sl: c.sl,
        }
    }

    /// True when `status` is `WC_SUCCESS`.
    pub fn is_success(&self) -> bool {
        self.wc_status() == Ok(abi::WcStatus::Success)
    }

    /// The status, typed ([`abi::WcStatus`], the values the device
    /// writes); `Err` for a value that names none of them. `status` keeps
    /// the raw `ibv_wc_status`, which libibverbs passes through as is.
    pub fn wc_status(&self) -> std::result::Result<abi::WcStatus, abi::UnknownValue> {
        abi::WcStatus::try_from(self.status)
    }

    /// The status as `ibv_wc_status_str(3)` names it.
    pub fn status_str(&self) -> &'static str {
        wc_status_str(self.status)
    }
}

/// The name `ibv_wc_status_str(3)` gives an `ibv_wc_status` (rdma-core's
/// `libibverbs/enum_strs.c`); `"unknown"` outside the enumeration.
pub fn wc_status_str(status: u8) -> &'static str {
    const NAMES: [&str; 24] = [
        "success",
        "local length error",
        "local QP operation error",
        "local EE context operation error",
        "local protection error",
        "Work Request Flushed Error",
        "memory management operation error",
        "bad response error",
        "local access error",
        "remote invalid request error",
        "remote access error",
        "remote operation error",
        "transport retry counter exceeded",
        "RNR retry counter exceeded",
        "local RDD violation error",
        "remote invalid RD request",
        "aborted error",
        "invalid EE context number",
        "invalid EE context state",
        "fatal error",
        "response timeout error",
        "general error",
        "TM error",
        "TM software rendezvous",
    ];
    NAMES.get(usize::from(status)).copied().unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_status_is_typed_and_unknown_values_are_errors() {
        let mut wc = WorkCompletion::default();
        assert!(wc.is_success());
        assert_eq!(wc.wc_status(), Ok(abi::WcStatus::Success));
        wc.status = abi::WC_RETRY_EXC_ERR;
        assert!(!wc.is_success());
        assert_eq!(wc.wc_status(), Ok(abi::WcStatus::RetryExcErr));
        wc.status = 3; // IBV_WC_LOC_EEC_OP_ERR: never written by vrnic
        assert!(wc.wc_status().is_err());
        assert!(!wc.is_success());
    }

    #[test]
    fn status_names_match_rdma_core() {
        assert_eq!(wc_status_str(abi::WC_SUCCESS), "success");
        assert_eq!(
            wc_status_str(abi::WC_WR_FLUSH_ERR),
            "Work Request Flushed Error"
        );
        assert_eq!(wc_status_str(abi::WC_REM_ACCESS_ERR), "remote access error");
        assert_eq!(
            wc_status_str(abi::WC_RETRY_EXC_ERR),
            "transport retry counter exceeded"
        );
        assert_eq!(
            wc_status_str(abi::WC_RNR_RETRY_EXC_ERR),
            "RNR retry counter exceeded"
        );
        assert_eq!(wc_status_str(abi::WC_FATAL_ERR), "fatal error");
        assert_eq!(wc_status_str(abi::WC_GENERAL_ERR), "general error");
        assert_eq!(wc_status_str(24), "unknown");
    }

    #[test]
    fn immediate_data_is_decoded_from_network_order_only_when_flagged() {
        let mut c = abi::Cqe {
            imm_data: [0x12, 0x34, 0x56, 0x78],
            ..Default::default()
        };
        assert_eq!(WorkCompletion::from_cqe(&c).imm_data, None);
        c.wc_flags = abi::WC_WITH_IMM;
        let wc = WorkCompletion::from_cqe(&c);
        assert_eq!(wc.imm_data, Some(0x1234_5678));
        assert_eq!(wc.invalidated_rkey, None);
    }
}
