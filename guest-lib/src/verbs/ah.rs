//! Address handles (`ibv_create_ah(3)`, `ibv_destroy_ah(3)`) and the
//! address vector they hold ([`AhAttr`], `struct ibv_ah_attr`), plus the
//! GRH area that UD receives start with (`struct ibv_grh`).

use std::net::{Ipv4Addr, Ipv6Addr};

use vrnic_abi::{self as abi, command};

use super::{Context, Gid, Pd, Result};

/// Bytes of the GRH area at the start of every UD receive buffer
/// (`sizeof(struct ibv_grh)`): a UD receive's `byte_len` is `GRH_LEN` plus
/// the payload length, and the payload starts at byte `GRH_LEN` of the
/// scatter list (`ibv_post_recv(3)`, IBTA Vol 1 §11.4.1.1).
pub const GRH_LEN: usize = 40;

/// An address vector (`struct ibv_ah_attr` with its `grh` flattened): where
/// a connected QP's packets go ([`super::QpAttr::ah_attr`], `IBV_QP_AV`) or
/// where UD sends through an [`Ah`] go. RoCE always needs the GRH
/// (`is_global`): the GRH fields become the IP header (RoCEv2, IBTA Annex
/// A17.4). There is no LID on RoCE (`dlid` and `src_path_bits` of
/// `ibv_ah_attr` have no counterpart here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AhAttr {
    /// Destination GID (an IPv4-mapped GID addresses an IPv4 peer).
    pub dgid: Gid,
    /// GRH flow label (IPv6 flow label, 20 bits; unused over IPv4).
    pub flow_label: u32,
    /// Source GID index: selects the source address, which must be of the
    /// destination's family (index 1 is the IPv4-mapped GID on vrnic).
    pub sgid_index: u8,
    /// IP hop limit / TTL (0 means 64).
    pub hop_limit: u8,
    /// Traffic class (IPv4 TOS / IPv6 traffic class: DSCP and ECN).
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// The address vector has a GRH (required for RoCE; `Ah::new` fails
    /// with `EINVAL` without it).
    pub is_global: bool,
    /// Port number (1). Used by [`Ah::new`]; for a QP's address vector the
    /// port is [`super::QpAttr::port_num`] and this field is ignored on
    /// modify (and reported as the QP's port by [`super::Qp::query`]).
    pub port_num: u8,
}

/// An address handle (`struct ibv_ah`): an address vector registered with
/// the device in a PD, named by UD send work requests
/// ([`super::UdWr::ah`] = [`Ah::handle`]). Destroyed (`ibv_destroy_ah(3)`,
/// `CMD_DESTROY_AH`) on drop; it keeps its [`Pd`] alive.
///
/// Work requests name the AH by number, so the caller keeps the `Ah` alive
/// until the sends using it have completed (as with `ibv_destroy_ah(3)`); a
/// send through a destroyed AH completes with `WC_LOC_QP_OP_ERR`.
#[derive(Debug)]
pub struct Ah {
    pd: Pd,
    ahn: u32,
    attr: AhAttr,
}

impl Ah {
    /// Creates an address handle in `pd` (`ibv_create_ah(3)`,
    /// `CMD_CREATE_AH`). The device starts resolving the destination's MAC
    /// address at once, so the first send need not wait for ARP.
    ///
    /// Errors: the device's status, as `ibv_create_ah(3)` reports it on
    /// RoCE: `EINVAL` without `is_global`, for a port other than 1, an
    /// unspecified or multicast `dgid`, a `sgid_index` that names no GID or
    /// a GID of the other address family; `ENOENT` for a PD of another
    /// device; `ENOMEM` when the device has `max_ah` address handles.
    pub fn new(pd: &Pd, attr: &AhAttr) -> Result<Ah> {
        let body = abi::CreateAh {
            pdn: pd.pdn(),
            flow_label: attr.flow_label,
            dgid: attr.dgid.raw,
            sgid_index: attr.sgid_index,
            hop_limit: attr.hop_limit,
            traffic_class: attr.traffic_class,
            sl: attr.sl,
            port_num: attr.port_num,
            is_global: attr.is_global.into(),
            reserved: [0; 2],
        };
        let h: abi::Handle = pd.context().execute::<command::CreateAh>(&body)?;
        Ok(Ah {
            pd: pd.clone(),
            ahn: h.handle,
            attr: *attr,
        })
    }

    /// The AH number the device assigned: what [`super::UdWr::ah`] carries.
    pub fn handle(&self) -> u32 {
        self.ahn
    }

    /// The address vector the AH was created with.
    pub fn attr(&self) -> &AhAttr {
        &self.attr
    }

    /// The PD the AH belongs to (a UD QP may use only AHs of its own PD).
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    fn context(&self) -> &Context {
        self.pd.context()
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        self.context().destroy::<command::DestroyAh>("AH", self.ahn);
    }
}

/// The source GID of a UD receive's GRH area (the first [`GRH_LEN`] bytes
/// of the receive buffer when the completion has `WC_GRH`), as
/// `ibv_init_ah_from_wc(3)` reads it for RoCEv2: an IPv4 packet's area is
/// 20 zero bytes followed by its IPv4 header (the source address becomes an
/// IPv4-mapped GID); an IPv6 packet's area is its IPv6 header (the source
/// address is the GID). `None` when `grh` is shorter than [`GRH_LEN`] or
/// holds neither.
pub fn grh_sgid(grh: &[u8]) -> Option<Gid> {
    let grh = grh.get(..GRH_LEN)?;
    let ip4 = &grh[20..];
    if grh[..20].iter().all(|&b| b == 0) && ip4[0] == 0x45 {
        let src: [u8; 4] = ip4[12..16].try_into().expect("4 bytes");
        return Some(Gid::from(Ipv4Addr::from(src)));
    }
    if grh[0] >> 4 == 6 {
        let src: [u8; 16] = grh[8..24].try_into().expect("16 bytes");
        return Some(Gid::from(Ipv6Addr::from(src)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_source_is_read_from_the_ipv4_header_or_the_ipv6_header() {
        let mut g = [0u8; GRH_LEN];
        assert_eq!(grh_sgid(&g), None, "all zero: no IP header");
        g[20] = 0x45;
        g[32..36].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(grh_sgid(&g), Some(Gid::from(Ipv4Addr::new(10, 0, 0, 2))));
        assert_eq!(grh_sgid(&g[..39]), None, "short");
        let mut g6 = [0u8; GRH_LEN];
        g6[0] = 0x60;
        let src: Ipv6Addr = "fd00::2".parse().unwrap();
        g6[8..24].copy_from_slice(&src.octets());
        assert_eq!(grh_sgid(&g6), Some(Gid::from(src)));
    }
}
