//! Address handles and address vectors: where a UD send goes, and where an
//! RC/UC QP's packets go (`ibv_create_ah(3)`, IBTA Vol 1 §10.2.2, §11.2.2;
//! RoCEv2 Annex A17.4.2: the GRH fields become the IP header).

use crate::abi;

/// An address vector: the GRH fields of `struct ibv_ah_attr` that RoCEv2
/// maps onto the IP header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Av {
    /// Destination GID (an IPv4-mapped GID means IPv4), network byte order.
    pub dgid: [u8; 16],
    /// Source GID index (selects the source address and its family).
    pub sgid_index: u8,
    /// TTL / hop limit; 0 means 64.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
}

impl Av {
    /// The address vector of a connected QP's attributes (`IBV_QP_AV`).
    pub fn of_qp(a: &abi::QpAttr) -> Av {
        Av {
            dgid: a.dgid,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
            flow_label: a.flow_label & 0xf_ffff,
        }
    }

    /// The address vector of a `CMD_CREATE_AH` request.
    pub fn of_ah(c: &abi::CreateAh) -> Av {
        Av {
            dgid: c.dgid,
            sgid_index: c.sgid_index,
            hop_limit: c.hop_limit,
            traffic_class: c.traffic_class,
            flow_label: c.flow_label & 0xf_ffff,
        }
    }
}

/// An address handle: an address vector owned by a PD.
#[derive(Debug, Clone, Copy)]
pub struct Ah {
    /// AH number.
    pub ahn: u32,
    /// Protection domain; a UD QP may only use AHs of its own PD.
    pub pdn: u32,
    /// Where sends through this AH go.
    pub av: Av,
}
