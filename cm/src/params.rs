//! The parameters of the user calls that send REQ and REP, and private-data copying.

use crate::error::CmError;
#[cfg(doc)]
use crate::{
    timing::CMA_CM_RESPONSE_TIMEOUT, timing::CMA_IBOE_PACKET_LIFETIME, timing::CMA_MAX_CM_RETRIES,
    Cm,
};
use vrnic_wire::Gid;

/// The path of a connection as [`Cm::connect`] takes it (cm.c: the
/// `sa_path_rec` rdma_cm builds for RoCE in `cma_resolve_iboe_route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParams {
    /// The remote GID (its CM agent is sent the REQ).
    pub remote_gid: Gid,
    /// The path MTU, IBA encoding (1 = 256 ... 5 = 4096).
    pub mtu: u8,
    /// The packet life time exponent ([`CMA_IBOE_PACKET_LIFETIME`]).
    pub packet_life_time: u8,
    /// The flow label (20 bits).
    pub flow_label: u32,
    /// The hop limit (rdma_cm: the route's TTL, 64).
    pub hop_limit: u8,
    /// The traffic class.
    pub traffic_class: u8,
    /// The service level (4 bits).
    pub sl: u8,
    /// The static rate (6 bits; 0 for any).
    pub rate: u8,
}

/// A connection request ([`Cm::connect`]; cm.c's `ib_cm_req_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqParams {
    /// The service ID to connect to.
    pub service_id: u64,
    /// The local QP's number (24 bits).
    pub qpn: u32,
    /// The local QP's starting send PSN (24 bits).
    pub starting_psn: u32,
    /// RC (`false`) or UC (`true`).
    pub uc: bool,
    /// Responder resources offered (RDMA READ/atomic depth as target).
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// The transport retry count (3 bits).
    pub retry_count: u8,
    /// The RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Whether the local QP uses an SRQ.
    pub srq: bool,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The response timeout asked of the remote CM (IBA exponent;
    /// [`CMA_CM_RESPONSE_TIMEOUT`]).
    pub remote_cm_response_timeout: u8,
    /// This CM's response timeout (IBA exponent).
    pub local_cm_response_timeout: u8,
    /// How often the REQ is retried (4 bits; [`CMA_MAX_CM_RETRIES`]).
    pub max_cm_retries: u8,
    /// The primary path.
    pub path: PathParams,
    /// Private data, at most 92 bytes (rdma_cm's header and the user's).
    pub private_data: Vec<u8>,
}

/// An acceptance ([`Cm::accept`]; cm.c's `ib_cm_rep_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepParams {
    /// The local QP's number.
    pub qpn: u32,
    /// The local QP's starting send PSN.
    pub starting_psn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Whether a failover is accepted (0: accepted).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub flow_control: bool,
    /// The RNR retry count.
    pub rnr_retry_count: u8,
    /// Whether the local QP uses an SRQ.
    pub srq: bool,
    /// Private data, at most 196 bytes.
    pub private_data: Vec<u8>,
}

pub(crate) fn copy_private<const N: usize>(src: &[u8]) -> Result<[u8; N], CmError> {
    let mut b = [0u8; N];
    b.get_mut(..src.len())
        .ok_or(CmError::PrivateDataTooLong)?
        .copy_from_slice(src);
    Ok(b)
}
