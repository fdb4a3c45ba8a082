//! ServiceIDResReq (SIDR_REQ) and ServiceIDResRep (SIDR_REP): the message's layout, parse and emit.

use super::*;

/// ServiceIDResReq, SIDR_REQ (IBTA 12.11.1, Table 119; Linux
/// `CM_SIDR_REQ_*`): a UD peer asks for the QPN and Q_Key of a service.
///
/// ```text
/// bytes 0-3    Request ID
/// bytes 4-5    Partition Key
/// bytes 6-7    reserved
/// bytes 8-15   Service ID
/// bytes 16-231 Private Data (216 bytes; rdma_cm: a [`crate::CmaHdr`]
///              first)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmSidrReq {
    /// Request ID: the sender's handle, echoed in the SIDR_REP.
    pub request_id: u32,
    /// Partition Key.
    pub partition_key: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private Data, 216 bytes.
    pub private_data: [u8; private_data_len::SIDR_REQ],
}

impl CmSidrReq {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmSidrReq {
            request_id: be32(b),
            partition_key: be16(&b[4..]),
            service_id: be64(&b[8..]),
            private_data: bytes(&b[16..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.request_id);
        put16(&mut b[4..], self.partition_key);
        put64(&mut b[8..], self.service_id);
        b[16..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReqResp, SIDR_REP (IBTA 12.11.2, Table 120; Linux
/// `CM_SIDR_REP_*`, `cm.c` `cm_format_sidr_rep`).
///
/// ```text
/// bytes 0-3    Request ID
/// byte  4      Status
/// byte  5      Additional Information Length
/// bytes 6-7    Vendor ID bits 23-8
/// bytes 8-10   QPN                      byte 11  Vendor ID bits 7-0
/// bytes 12-19  Service ID
/// bytes 20-23  Q_Key
/// bytes 24-95  Additional Information (72 bytes)
/// bytes 96-231 Private Data (136 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmSidrRep {
    /// Request ID: the SIDR_REQ's.
    pub request_id: u32,
    /// Status ([`sidr_status`]).
    pub status: u8,
    /// Additional Information Length.
    pub additional_info_length: u8,
    /// Vendor ID, 24 bits (ECE): bytes 6-7 then byte 11 (Linux
    /// `CM_SIDR_REP_VENDOR_ID_H/L`). Linux's `cm_format_sidr_rep` writes
    /// `(vendor_id >> 8) & 0xff` into the 16-bit high part, so from Linux
    /// bits 23-16 read 0.
    pub vendor_id: u32,
    /// QPN, 24 bits: the service's UD QP.
    pub qpn: u32,
    /// Service ID: the SIDR_REQ's.
    pub service_id: u64,
    /// Q_Key of the service's QP (rdma_cm: `RDMA_UDP_QKEY` 0x01234567).
    pub qkey: u32,
    /// Additional Information, 72 bytes.
    pub additional_info: [u8; private_data_len::ADDITIONAL_INFO],
    /// Private Data, 136 bytes.
    pub private_data: [u8; private_data_len::SIDR_REP],
}

impl CmSidrRep {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmSidrRep {
            request_id: be32(b),
            status: b[4],
            additional_info_length: b[5],
            vendor_id: u32::from_be_bytes([0, b[6], b[7], b[11]]),
            qpn: be24(&b[8..]),
            service_id: be64(&b[12..]),
            qkey: be32(&b[20..]),
            additional_info: bytes(&b[24..]),
            private_data: bytes(&b[96..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.request_id);
        b[4] = self.status;
        b[5] = self.additional_info_length;
        put24(&mut b[8..], self.qpn);
        let [_, vh, vm, vl] = self.vendor_id.to_be_bytes();
        (b[6], b[7], b[11]) = (vh, vm, vl);
        put64(&mut b[12..], self.service_id);
        put32(&mut b[20..], self.qkey);
        b[24..96].copy_from_slice(&self.additional_info);
        b[96..].copy_from_slice(&self.private_data);
    }
}
