//! `QUERY_ROUTE` and `QUERY` (ADDR, PATH, GID) answers (ucma.c
//! `ucma_query_route`, `ucma_query_addr`, `ucma_query_path`, `ucma_query_gid`).

use super::*;

impl Ucma {
    pub(super) fn node_guid(&self, i: &Id) -> [u8; 8] {
        // The id has a device once bound to one of its addresses.
        match i.src {
            Some(s) if !sockaddr::is_any(&s) => self.dev.node_guid,
            _ => [0; 8],
        }
    }

    /// ucma.c `ucma_query_route` (RoCE: `ucma_copy_iboe_route`).
    pub(super) fn query_route(&self, i: &Id) -> Vec<u8> {
        let mut r = vec![0u8; 208];
        r[0..8].copy_from_slice(&self.node_guid(i));
        if let Some(s) = i.src {
            sockaddr::emit(&s, &mut r[136..164]);
        }
        if let Some(d) = i.dst {
            sockaddr::emit(&d, &mut r[164..192]);
        }
        if r[0..8] == [0; 8] {
            return r;
        }
        let (sgid, dgid) = (
            i.src.map_or([0; 16], |s| ip_to_gid(s.ip())),
            i.dst.map_or([0; 16], |d| ip_to_gid(d.ip())),
        );
        let rec = &mut r[8..72];
        rec[0..16].copy_from_slice(&dgid);
        rec[16..32].copy_from_slice(&sgid);
        rec[52..54].copy_from_slice(&0xffffu16.to_be_bytes());
        if i.routed {
            if let Some((p, _)) = self.path(i) {
                rec[40..44].copy_from_slice(&p.flow_label.to_be_bytes());
                wr_u32(rec, 44, 1); // reversible
                wr_u32(rec, 48, u32::from(p.mtu));
                rec[54] = p.hop_limit;
                rec[55] = p.traffic_class;
                rec[56] = 1; // numb_path
                rec[58] = 2; // mtu_selector: exactly
                rec[59] = 2;
                rec[61] = 2;
                rec[62] = p.packet_life_time;
            }
            wr_u32(&mut r, 192, 1);
        }
        r[196] = 1; // port_num
        wr_u32(&mut r, 200, u32::MAX); // ibdev_index: match by GUID
        r
    }

    /// The device part of a `rdma_ucm_query_addr_resp`: node GUID, port
    /// and P_Key once the id has a device (ucma.c writes them only then).
    pub(super) fn addr_resp_head(&self, i: &Id) -> Vec<u8> {
        let mut r = vec![0u8; 280];
        let guid = self.node_guid(i);
        if guid != [0; 8] {
            r[0..8].copy_from_slice(&guid);
            r[8] = 1;
            r[10..12].copy_from_slice(&0xffffu16.to_ne_bytes());
        }
        r
    }

    /// ucma.c `ucma_query_addr`.
    pub(super) fn query_addr(&self, i: &Id) -> Vec<u8> {
        let mut r = self.addr_resp_head(i);
        if let Some(s) = i.src {
            let n = sockaddr::emit(&s, &mut r[16..144]);
            r[12..14].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        if let Some(d) = i.dst {
            let n = sockaddr::emit(&d, &mut r[144..272]);
            r[14..16].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        wr_u32(&mut r, 272, u32::MAX);
        r
    }

    /// ucma.c `ucma_query_gid`: the GIDs as `sockaddr_ib`s.
    pub(super) fn query_gid(&self, i: &Id) -> Vec<u8> {
        let mut r = self.addr_resp_head(i);
        let sid = |a: Option<SocketAddr>| a.map_or(0, |a| service_id(i.ps, a.port()));
        if let Some(s) = i.src {
            let n = sockaddr::emit_ib(&ip_to_gid(s.ip()), 0xffff, sid(i.src), &mut r[16..144]);
            r[12..14].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        if let Some(d) = i.dst {
            let n = sockaddr::emit_ib(&ip_to_gid(d.ip()), 0xffff, sid(i.dst), &mut r[144..272]);
            r[14..16].copy_from_slice(&(n as u16).to_ne_bytes());
        }
        wr_u32(&mut r, 272, u32::MAX);
        r
    }

    /// ucma.c `ucma_query_path`: the route as packed SA path records
    /// (`struct ib_path_rec_data`), at most as many as `out` holds.
    pub(super) fn query_path(&self, i: &Id, out: usize) -> Vec<u8> {
        let mut r = vec![0u8; 8];
        let Some((p, _)) = (if i.routed { self.path(i) } else { None }) else {
            return r;
        };
        if out < 8 + PATH_DATA_LEN {
            return r;
        }
        wr_u32(&mut r, 0, 1);
        let mut d = [0u8; PATH_DATA_LEN];
        // IB_PATH_GMP | IB_PATH_PRIMARY | IB_PATH_BIDIRECTIONAL.
        wr_u32(&mut d, 0, (1 << 0) | (1 << 1) | (1 << 4));
        let rec = &mut d[8..];
        let sid = i.dst.map_or(0, |a| service_id(i.ps, a.port()));
        rec[0..8].copy_from_slice(&sid.to_be_bytes());
        rec[8..24].copy_from_slice(&p.remote_gid.0);
        rec[24..40].copy_from_slice(&i.src.map_or([0; 16], |s| ip_to_gid(s.ip())));
        rec[44..48].copy_from_slice(&((p.flow_label << 8) | u32::from(p.hop_limit)).to_be_bytes());
        rec[48] = p.traffic_class;
        rec[49] = 0x80 | 1;
        rec[50..52].copy_from_slice(&0xffffu16.to_be_bytes());
        rec[54] = 0x80 | p.mtu;
        rec[55] = 0x80;
        rec[56] = 0x80 | p.packet_life_time;
        r.extend_from_slice(&d);
        r
    }
}
