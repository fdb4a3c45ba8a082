//! Control commands as types: each `CMD_*` opcode tied to the body it takes
//! and the body it answers with (device spec §5.x.6.1, the table of
//! commands), so a driver names the command once and cannot send it with
//! another command's body.
//!
//! A driver executes `C: Command` by sending [`CmdHeader`](crate::CmdHeader)
//! `{ opcode: C::OPCODE, len: size_of::<C::Request>() }` followed by the
//! request's bytes ([`Pod::as_bytes`]), and reads the response body as a
//! `C::Response` ([`Pod::read_from`]). `()` is "none": an empty body.
//!
//! The markers are uninhabited types: they exist only as type arguments
//! (`execute::<command::AllocPd>(&())`).

use crate::{Pod, MAX_CMD_BODY};

/// A control command of the device ABI: its opcode, the body the driver
/// sends and the body the device answers with on success.
pub trait Command {
    /// The `CMD_*` opcode ([`CmdHeader::opcode`](crate::CmdHeader::opcode)).
    const OPCODE: u16;
    /// The command body (device-readable); `()` when the command has none.
    type Request: Pod;
    /// The response body (device-writable) of a successful command; `()`
    /// when the command has none.
    type Response: Pod;
}

macro_rules! commands {
    ($($(#[$doc:meta])* $name:ident = $opcode:ident, $req:ty => $resp:ty;)*) => {$(
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}

        impl Command for $name {
            const OPCODE: u16 = crate::$opcode;
            type Request = $req;
            type Response = $resp;
        }

        const _: () = assert!(
            size_of::<$req>() <= MAX_CMD_BODY && size_of::<$resp>() <= MAX_CMD_BODY
        );
    )*};
}

commands! {
    /// [`CMD_QUERY_DEVICE`](crate::CMD_QUERY_DEVICE) (`ibv_query_device(3)`).
    QueryDevice = CMD_QUERY_DEVICE, () => crate::DeviceAttr;
    /// [`CMD_QUERY_PORT`](crate::CMD_QUERY_PORT) (`ibv_query_port(3)`).
    QueryPort = CMD_QUERY_PORT, crate::QueryPort => crate::PortAttr;
    /// [`CMD_QUERY_GID`](crate::CMD_QUERY_GID) (`ibv_query_gid(3)`).
    QueryGid = CMD_QUERY_GID, crate::QueryGid => crate::GidEntry;
    /// [`CMD_ALLOC_PD`](crate::CMD_ALLOC_PD) (`ibv_alloc_pd(3)`): the PD number.
    AllocPd = CMD_ALLOC_PD, () => crate::Handle;
    /// [`CMD_DEALLOC_PD`](crate::CMD_DEALLOC_PD) (`ibv_dealloc_pd(3)`): the PD number.
    DeallocPd = CMD_DEALLOC_PD, crate::Handle => ();
    /// [`CMD_REG_MR`](crate::CMD_REG_MR) (`ibv_reg_mr(3)`).
    RegMr = CMD_REG_MR, crate::RegMr => crate::MrKeys;
    /// [`CMD_DEREG_MR`](crate::CMD_DEREG_MR) (`ibv_dereg_mr(3)`): the lkey.
    DeregMr = CMD_DEREG_MR, crate::Handle => ();
    /// [`CMD_CREATE_CQ`](crate::CMD_CREATE_CQ) (`ibv_create_cq(3)`): the CQ number.
    CreateCq = CMD_CREATE_CQ, crate::CreateCq => crate::Handle;
    /// [`CMD_DESTROY_CQ`](crate::CMD_DESTROY_CQ) (`ibv_destroy_cq(3)`): the CQ number.
    DestroyCq = CMD_DESTROY_CQ, crate::Handle => ();
    /// [`CMD_CREATE_QP`](crate::CMD_CREATE_QP) (`ibv_create_qp(3)`).
    CreateQp = CMD_CREATE_QP, crate::CreateQp => crate::CreateQpResp;
    /// [`CMD_MODIFY_QP`](crate::CMD_MODIFY_QP) (`ibv_modify_qp(3)`).
    ModifyQp = CMD_MODIFY_QP, crate::QpAttr => ();
    /// [`CMD_QUERY_QP`](crate::CMD_QUERY_QP) (`ibv_query_qp(3)`): the QP number.
    QueryQp = CMD_QUERY_QP, crate::Handle => crate::QpAttr;
    /// [`CMD_DESTROY_QP`](crate::CMD_DESTROY_QP) (`ibv_destroy_qp(3)`): the QP number.
    DestroyQp = CMD_DESTROY_QP, crate::Handle => ();
    /// [`CMD_CREATE_AH`](crate::CMD_CREATE_AH) (`ibv_create_ah(3)`): the AH number.
    CreateAh = CMD_CREATE_AH, crate::CreateAh => crate::Handle;
    /// [`CMD_DESTROY_AH`](crate::CMD_DESTROY_AH) (`ibv_destroy_ah(3)`): the AH number.
    DestroyAh = CMD_DESTROY_AH, crate::Handle => ();
    /// [`CMD_CREATE_SRQ`](crate::CMD_CREATE_SRQ) (`ibv_create_srq(3)`).
    CreateSrq = CMD_CREATE_SRQ, crate::CreateSrq => crate::CreateSrqResp;
    /// [`CMD_MODIFY_SRQ`](crate::CMD_MODIFY_SRQ) (`ibv_modify_srq(3)`).
    ModifySrq = CMD_MODIFY_SRQ, crate::SrqAttr => ();
    /// [`CMD_QUERY_SRQ`](crate::CMD_QUERY_SRQ) (`ibv_query_srq(3)`): the SRQ number.
    QuerySrq = CMD_QUERY_SRQ, crate::Handle => crate::SrqAttr;
    /// [`CMD_DESTROY_SRQ`](crate::CMD_DESTROY_SRQ) (`ibv_destroy_srq(3)`): the SRQ number.
    DestroySrq = CMD_DESTROY_SRQ, crate::Handle => ();
    /// [`CMD_QUERY_PKEY`](crate::CMD_QUERY_PKEY) (`ibv_query_pkey(3)`).
    QueryPkey = CMD_QUERY_PKEY, crate::QueryPkey => crate::PkeyEntry;
    /// [`CMD_OPEN_CTX`](crate::CMD_OPEN_CTX): the new context's number.
    OpenCtx = CMD_OPEN_CTX, () => crate::Handle;
    /// [`CMD_CLOSE_CTX`](crate::CMD_CLOSE_CTX): the context's number.
    CloseCtx = CMD_CLOSE_CTX, crate::Handle => ();
    /// [`CMD_QUERY_USAGE`](crate::CMD_QUERY_USAGE).
    QueryUsage = CMD_QUERY_USAGE, () => crate::Usage;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One marker per opcode, each opcode once: the table above is the
    /// ABI's list of commands (1 to 23), in order.
    #[test]
    fn markers_cover_every_opcode_once() {
        let opcodes = [
            QueryDevice::OPCODE,
            QueryPort::OPCODE,
            QueryGid::OPCODE,
            AllocPd::OPCODE,
            DeallocPd::OPCODE,
            RegMr::OPCODE,
            DeregMr::OPCODE,
            CreateCq::OPCODE,
            DestroyCq::OPCODE,
            CreateQp::OPCODE,
            ModifyQp::OPCODE,
            QueryQp::OPCODE,
            DestroyQp::OPCODE,
            CreateAh::OPCODE,
            DestroyAh::OPCODE,
            CreateSrq::OPCODE,
            ModifySrq::OPCODE,
            QuerySrq::OPCODE,
            DestroySrq::OPCODE,
            QueryPkey::OPCODE,
            OpenCtx::OPCODE,
            CloseCtx::OPCODE,
            QueryUsage::OPCODE,
        ];
        assert_eq!(opcodes.to_vec(), (1..=23).collect::<Vec<u16>>());
    }

    /// "None" is an empty body on the wire, and reads back from any bytes.
    #[test]
    fn unit_body_is_empty() {
        assert!(().as_bytes().is_empty());
        assert_eq!(<() as Pod>::read_from(&[]), Some(()));
        assert_eq!(
            <DeallocPd as Command>::Request::default().as_bytes().len(),
            8
        );
    }
}
