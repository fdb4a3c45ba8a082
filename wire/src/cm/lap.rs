//! LoadAlternatePath (LAP) and AlternatePathResponse (APR): the message's layout, parse and emit.

use super::*;

/// LoadAlternatePath, LAP (IBTA 12.6.12, Table 115; Linux `CM_LAP_*`).
/// Its path fields are not in a REQ path's order.
///
/// ```text
/// bytes 0-3     Local Communication ID
/// bytes 4-7     Remote Communication ID
/// bytes 8-11    reserved
/// bytes 12-14   Remote QPN/EECN
/// byte  15      Remote CM Response Timeout(7-3) reserved(2-0)
/// bytes 16-19   reserved
/// bytes 20-21   Alternate Local Port LID
/// bytes 22-23   Alternate Remote Port LID
/// bytes 24-39   Alternate Local Port GID
/// bytes 40-55   Alternate Remote Port GID
/// bytes 56-58   Alternate Flow Label (bits 23-4) reserved(3-0)
/// byte  59      Alternate Traffic Class
/// byte  60      Alternate Hop Limit
/// byte  61      reserved(7-6) Alternate Packet Rate(5-0)
/// byte  62      Alternate SL(7-4) Alternate Subnet Local(3) reserved(2-0)
/// byte  63      Alternate Local ACK Timeout(7-3) reserved(2-0)
/// bytes 64-231  Private Data (168 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmLap {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Remote QPN/EECN, 24 bits.
    pub remote_qpn_eecn: u32,
    /// Remote CM Response Timeout, 5 bits.
    pub remote_cm_response_timeout: u8,
    /// The alternate path; its fields have a REQ path's meaning.
    pub alternate_path: CmPath,
    /// Private Data, 168 bytes.
    pub private_data: [u8; private_data_len::LAP],
}

impl CmLap {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmLap {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            remote_qpn_eecn: be24(&b[12..]),
            remote_cm_response_timeout: hi(b[15], 5),
            alternate_path: CmPath {
                local_lid: be16(&b[20..]),
                remote_lid: be16(&b[22..]),
                local_gid: Gid(bytes(&b[24..])),
                remote_gid: Gid(bytes(&b[40..])),
                flow_label: be32(&b[56..]) >> 12,
                traffic_class: b[59],
                hop_limit: b[60],
                packet_rate: b[61] & 0x3f,
                sl: hi(b[62], 4),
                subnet_local: b[62] & 0x08 != 0,
                local_ack_timeout: hi(b[63], 5),
            },
            private_data: bytes(&b[64..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        let p = &self.alternate_path;
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        put24(&mut b[12..], self.remote_qpn_eecn);
        b[15] = to_hi(self.remote_cm_response_timeout, 5);
        put16(&mut b[20..], p.local_lid);
        put16(&mut b[22..], p.remote_lid);
        b[24..40].copy_from_slice(&p.local_gid.0);
        b[40..56].copy_from_slice(&p.remote_gid.0);
        put24(&mut b[56..], (p.flow_label & 0xf_ffff) << 4);
        b[59] = p.traffic_class;
        b[60] = p.hop_limit;
        b[61] = p.packet_rate & 0x3f;
        b[62] = to_hi(p.sl, 4) | (u8::from(p.subnet_local) << 3);
        b[63] = to_hi(p.local_ack_timeout, 5);
        b[64..].copy_from_slice(&self.private_data);
    }
}

/// AlternatePathResponse, APR (IBTA 12.6.13, Table 116; Linux `CM_APR_*`).
///
/// ```text
/// bytes 0-3    Local Communication ID
/// bytes 4-7    Remote Communication ID
/// byte  8      Additional Information Length
/// byte  9      AP Status
/// bytes 10-11  reserved
/// bytes 12-83  Additional Information (72 bytes)
/// bytes 84-231 Private Data (148 bytes)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CmApr {
    /// Local Communication ID: the sender's.
    pub local_comm_id: u32,
    /// Remote Communication ID: the receiver's.
    pub remote_comm_id: u32,
    /// Additional Information Length.
    pub additional_info_length: u8,
    /// AP Status (Linux `enum ib_cm_apr_status`: 0 success).
    pub ap_status: u8,
    /// Additional Information, 72 bytes.
    pub additional_info: [u8; private_data_len::ADDITIONAL_INFO],
    /// Private Data, 148 bytes.
    pub private_data: [u8; private_data_len::APR],
}

impl CmApr {
    /// Length on the wire: the MAD data area, 232 bytes.
    pub const LEN: usize = CM_MSG_LEN;

    /// Parses `buf[..232]`; [`WireError::Truncated`] if shorter.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let b = need(buf, Self::LEN)?;
        Ok(CmApr {
            local_comm_id: be32(b),
            remote_comm_id: be32(&b[4..]),
            additional_info_length: b[8],
            ap_status: b[9],
            additional_info: bytes(&b[12..]),
            private_data: bytes(&b[84..]),
        })
    }

    /// Writes the message into `buf[..232]`. Panics if `buf` is shorter.
    pub fn emit(&self, buf: &mut [u8]) {
        let b = area(buf);
        put32(b, self.local_comm_id);
        put32(&mut b[4..], self.remote_comm_id);
        b[8] = self.additional_info_length;
        b[9] = self.ap_status;
        b[12..84].copy_from_slice(&self.additional_info);
        b[84..].copy_from_slice(&self.private_data);
    }
}
