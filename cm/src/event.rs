//! The events a [`Cm`] gives its consumer (cm.c's `ib_cm_event`s).

use crate::{qp1::Source, state::CmId};
#[cfg(doc)]
use crate::{timing::cm_convert_to_ms, Cm};
#[cfg(doc)]
use vrnic_wire::rej_reason;
use vrnic_wire::{private_data_len, CmRep, CmReq, CmSidrRep, CmSidrReq};

/// What the consumer is told (cm.c's `enum ib_cm_event_type`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmEvent {
    /// The connection it is about.
    pub id: CmId,
    /// What happened.
    pub kind: CmEventKind,
}

/// The kinds of [`CmEvent`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEventKind {
    /// `IB_CM_REQ_RECEIVED`: a REQ for a listened service ID created
    /// connection `id`; answer with [`Cm::accept`] or [`Cm::reject`].
    ReqReceived {
        /// The service ID of the listener it matched.
        listener: u64,
        /// The REQ as received.
        req: Box<CmReq>,
        /// Who sent it.
        source: Source,
    },
    /// `IB_CM_REP_RECEIVED`: the passive side accepted; move the QP to
    /// RTR/RTS and call [`Cm::send_rtu`] (or [`Cm::reject`]).
    RepReceived(Box<CmRep>),
    /// `IB_CM_RTU_RECEIVED`: the passive side's connection is established.
    RtuReceived,
    /// `IB_CM_REJ_RECEIVED`: the peer rejected (reason: [`rej_reason`]).
    RejReceived {
        /// The REJ's reason.
        reason: u16,
        /// Its private data.
        private_data: Box<[u8; private_data_len::REJ]>,
    },
    /// `IB_CM_REQ_ERROR`: no REP after every REQ retry.
    ReqError,
    /// `IB_CM_REP_ERROR`: no RTU after every REP retry.
    RepError,
    /// `IB_CM_DREQ_ERROR`: no DREP after every DREQ retry; the connection
    /// is in timewait.
    DreqError,
    /// `IB_CM_DREQ_RECEIVED`: answer with [`Cm::reply_disconnect`].
    DreqReceived {
        /// The DREQ's private data.
        private_data: Box<[u8; private_data_len::DREQ]>,
    },
    /// `IB_CM_DREP_RECEIVED`: the disconnection is complete; timewait.
    DrepReceived,
    /// `IB_CM_MRA_RECEIVED`: the peer needs more time; the REQ's or REP's
    /// retransmission now waits `cm_convert_to_ms(service_timeout) +
    /// cm_convert_to_ms(ack timeout)` ms (cm.c `cm_mra_handler`).
    MraReceived {
        /// The MRA's service timeout (IBA exponent).
        service_timeout: u8,
    },
    /// `IB_CM_SIDR_REQ_RECEIVED`: a SIDR_REQ for a listened service ID;
    /// answer with [`Cm::sidr_reply`].
    SidrReqReceived {
        /// The service ID of the listener it matched.
        listener: u64,
        /// The SIDR_REQ as received.
        req: Box<CmSidrReq>,
        /// Who sent it.
        source: Source,
    },
    /// `IB_CM_SIDR_REP_RECEIVED`: the answer to [`Cm::sidr_request`]; the
    /// id is gone after it.
    SidrRepReceived(Box<CmSidrRep>),
    /// `IB_CM_SIDR_REQ_ERROR`: no SIDR_REP after every retry; the id is
    /// gone.
    SidrReqError,
    /// `IB_CM_USER_ESTABLISHED`: [`Cm::establish`] ended a REP's wait
    /// for its RTU.
    UserEstablished,
    /// `IB_CM_TIMEWAIT_EXIT`: the connection left timewait and is idle;
    /// destroy it.
    TimewaitExit,
}
