//! The device's and port's queries: `CMD_QUERY_DEVICE`, `CMD_QUERY_PORT`,
//! `CMD_QUERY_GID`, `CMD_QUERY_PKEY` (`ibv_query_device(3)`,
//! `ibv_query_port(3)`, `ibv_query_gid(3)`, `ibv_query_pkey(3)`) and
//! `CMD_QUERY_USAGE`.

use super::*;

impl Device {
    /// `CMD_QUERY_DEVICE`: the device's limits; the node GUID is the
    /// MAC's EUI-64.
    pub(super) fn query_device(&self) -> abi::DeviceAttr {
        let mac = self.res.port.mac;
        abi::DeviceAttr {
            node_guid: [
                mac[0] ^ 2,
                mac[1],
                mac[2],
                0xff,
                0xfe,
                mac[3],
                mac[4],
                mac[5],
            ],
            max_mr_size: MAX_MR_SIZE,
            page_size_cap: 0x1000 | 0x20_0000,
            max_qp: MAX_QP as u32,
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_cq: MAX_CQ as u32,
            max_cqe: MAX_CQE,
            max_mr: MAX_MR as u32,
            max_pd: MAX_PD as u32,
            max_qp_rd_atom: crate::verbs::qp::MAX_QP_RD_ATOM,
            max_qp_init_rd_atom: crate::verbs::qp::MAX_QP_RD_ATOM,
            max_inline: MAX_INLINE,
            max_srq: MAX_SRQ as u32,
            max_srq_wr: MAX_QP_WR,
            max_srq_sge: MAX_SGE,
            max_ah: MAX_AH as u32,
            max_mr_pages: MAX_MR_PAGES,
            max_total_mr_pages: MAX_MR_PAGES_TOTAL,
            max_total_wr: MAX_TOTAL_WR,
            reserved: 0,
        }
    }

    /// `CMD_QUERY_PORT` of port 1, the only one: active, RoCE (Ethernet
    /// link layer), 4096-byte maximum MTU, a GID table of [`GID_TBL_LEN`]
    /// entries (more if the port has more addresses) of which the unused
    /// ones are `NotFound` to `CMD_QUERY_GID`.
    pub(super) fn query_port(&self, q: abi::QueryPort) -> Result<abi::PortAttr, CommandError> {
        check_port(q.port)?;
        Ok(abi::PortAttr {
            state: 4,
            max_mtu: 5,
            active_mtu: self.active_mtu(),
            gid_tbl_len: self.res.port.gid_count().max(GID_TBL_LEN),
            max_msg_sz: MAX_MSG_SZ,
            link_layer: 2,
        })
    }

    /// `CMD_QUERY_GID`: GID table entry `q.index` of port 1 ([`Device::gid`]).
    pub(super) fn query_gid(&self, q: abi::QueryGid) -> Result<abi::GidEntry, CommandError> {
        check_port(q.port)?;
        let gid = self
            .gid(q.index)
            .ok_or(CommandError::NotFound(Object::Gid(q.index)))?;
        Ok(abi::GidEntry {
            gid: gid.0,
            gid_type: abi::GID_TYPE_ROCE_V2,
            reserved: 0,
        })
    }

    /// `CMD_QUERY_PKEY`: P_Key table entry `q.index` of port 1.
    pub(super) fn query_pkey(&self, q: abi::QueryPkey) -> Result<abi::PkeyEntry, CommandError> {
        check_port(q.port)?;
        let pkey = self
            .res
            .port
            .pkey(q.index)
            .ok_or(CommandError::NotFound(Object::Pkey(q.index)))?;
        Ok(abi::PkeyEntry {
            pkey,
            ..Default::default()
        })
    }

    /// `CMD_QUERY_USAGE`, from [`abi::DEFAULT_CTX`] only: the open
    /// contexts and the live objects of all of them.
    pub(super) fn query_usage(&self, ctx: u16) -> Result<abi::Usage, CommandError> {
        if ctx != abi::DEFAULT_CTX {
            return Err(CommandError::NotDefaultContext { ctx });
        }
        let [pds, mrs, cqs, qps, ahs, srqs] = self.object_counts().map(|n| n as u32);
        Ok(abi::Usage {
            ctxs: self.context_count() as u32,
            pds,
            mrs,
            cqs,
            qps,
            ahs,
            srqs,
            mr_pages: self.res.mrs.pages() as u32,
        })
    }
}

/// The device has one port, number 1.
fn check_port(port: u32) -> Result<(), CommandError> {
    if port != 1 {
        return Err(CommandError::invalid("port number"));
    }
    Ok(())
}
