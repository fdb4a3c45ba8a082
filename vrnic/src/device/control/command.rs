//! A control command decoded once from its opcode and body
//! ([`abi::CmdHeader::opcode`], the bytes after the header) into
//! [`Command`], before any handler runs.
//!
//! The body is read as the opcode's `#[repr(C)]` structure from its
//! start: a shorter body is [`DecodeError::ShortBody`]; bytes past the
//! structure are ignored (the driver's descriptor may be longer than the
//! command), as they always have been.

use thiserror::Error;

use crate::abi::{self, Pod};

/// One control command with its arguments (device spec §5.x.6: the
/// `CMD_*` opcodes of [`crate::abi`]). Object numbers are the guest's,
/// unchecked: the handlers check them against the command's context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::device) enum Command {
    /// `CMD_QUERY_DEVICE`: the device's attributes; no arguments.
    QueryDevice,
    /// `CMD_QUERY_PORT`: a port's attributes.
    QueryPort(abi::QueryPort),
    /// `CMD_QUERY_GID`: one GID table entry.
    QueryGid(abi::QueryGid),
    /// `CMD_QUERY_PKEY`: one P_Key table entry.
    QueryPkey(abi::QueryPkey),
    /// `CMD_ALLOC_PD`: a new protection domain; no arguments.
    AllocPd,
    /// `CMD_DEALLOC_PD` of PD `pdn`.
    DeallocPd {
        /// The PD number.
        pdn: u32,
    },
    /// `CMD_REG_MR`: registers a memory region.
    RegMr(abi::RegMr),
    /// `CMD_DEREG_MR` of the MR with local key `lkey`.
    DeregMr {
        /// The MR's local key.
        lkey: u32,
    },
    /// `CMD_CREATE_CQ`: a new completion queue.
    CreateCq(abi::CreateCq),
    /// `CMD_DESTROY_CQ` of CQ `cqn`.
    DestroyCq {
        /// The CQ number.
        cqn: u32,
    },
    /// `CMD_CREATE_QP`: a new queue pair.
    CreateQp(abi::CreateQp),
    /// `CMD_MODIFY_QP`: the attributes `attr_mask` names, of QP `qpn`.
    ModifyQp(abi::QpAttr),
    /// `CMD_QUERY_QP` of QP `qpn`.
    QueryQp {
        /// The QP number.
        qpn: u32,
    },
    /// `CMD_DESTROY_QP` of QP `qpn`.
    DestroyQp {
        /// The QP number.
        qpn: u32,
    },
    /// `CMD_CREATE_AH`: a new address handle.
    CreateAh(abi::CreateAh),
    /// `CMD_DESTROY_AH` of AH `ahn`.
    DestroyAh {
        /// The AH number.
        ahn: u32,
    },
    /// `CMD_CREATE_SRQ`: a new shared receive queue.
    CreateSrq(abi::CreateSrq),
    /// `CMD_MODIFY_SRQ`: the attributes `attr_mask` names, of SRQ `srqn`.
    ModifySrq(abi::SrqAttr),
    /// `CMD_QUERY_SRQ` of SRQ `srqn`.
    QuerySrq {
        /// The SRQ number.
        srqn: u32,
    },
    /// `CMD_DESTROY_SRQ` of SRQ `srqn`.
    DestroySrq {
        /// The SRQ number.
        srqn: u32,
    },
    /// `CMD_OPEN_CTX`: a new device context; no arguments.
    OpenCtx,
    /// `CMD_CLOSE_CTX` of context `target` (as the driver sent it: 32
    /// bits, checked by the handler).
    CloseCtx {
        /// The context to close.
        target: u32,
    },
    /// `CMD_QUERY_USAGE`: the device's object counts; no arguments.
    QueryUsage,
}

/// Why a command's opcode and body are not a [`Command`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub(in crate::device) enum DecodeError {
    /// The opcode names no command (`STATUS_ENOSYS`).
    #[error("unknown command opcode {0}")]
    UnknownOpcode(u16),
    /// The body is shorter than the opcode's argument structure
    /// (`STATUS_EINVAL`).
    #[error("command {opcode}: body of {len} bytes, {need} needed")]
    ShortBody {
        /// The command's opcode.
        opcode: u16,
        /// Bytes the body has.
        len: usize,
        /// Bytes of the argument structure.
        need: usize,
    },
}

impl Command {
    /// Decodes command `opcode` with body `body` (the bytes after the
    /// [`abi::CmdHeader`]; trailing bytes ignored).
    pub(in crate::device) fn decode(opcode: u16, body: &[u8]) -> Result<Command, DecodeError> {
        let b = Body { opcode, body };
        Ok(match opcode {
            abi::CMD_QUERY_DEVICE => Command::QueryDevice,
            abi::CMD_QUERY_PORT => Command::QueryPort(b.read()?),
            abi::CMD_QUERY_GID => Command::QueryGid(b.read()?),
            abi::CMD_QUERY_PKEY => Command::QueryPkey(b.read()?),
            abi::CMD_ALLOC_PD => Command::AllocPd,
            abi::CMD_DEALLOC_PD => Command::DeallocPd { pdn: b.handle()? },
            abi::CMD_REG_MR => Command::RegMr(b.read()?),
            abi::CMD_DEREG_MR => Command::DeregMr { lkey: b.handle()? },
            abi::CMD_CREATE_CQ => Command::CreateCq(b.read()?),
            abi::CMD_DESTROY_CQ => Command::DestroyCq { cqn: b.handle()? },
            abi::CMD_CREATE_QP => Command::CreateQp(b.read()?),
            abi::CMD_MODIFY_QP => Command::ModifyQp(b.read()?),
            abi::CMD_QUERY_QP => Command::QueryQp { qpn: b.handle()? },
            abi::CMD_DESTROY_QP => Command::DestroyQp { qpn: b.handle()? },
            abi::CMD_CREATE_AH => Command::CreateAh(b.read()?),
            abi::CMD_DESTROY_AH => Command::DestroyAh { ahn: b.handle()? },
            abi::CMD_CREATE_SRQ => Command::CreateSrq(b.read()?),
            abi::CMD_MODIFY_SRQ => Command::ModifySrq(b.read()?),
            abi::CMD_QUERY_SRQ => Command::QuerySrq { srqn: b.handle()? },
            abi::CMD_DESTROY_SRQ => Command::DestroySrq { srqn: b.handle()? },
            abi::CMD_OPEN_CTX => Command::OpenCtx,
            abi::CMD_CLOSE_CTX => Command::CloseCtx {
                target: b.handle()?,
            },
            abi::CMD_QUERY_USAGE => Command::QueryUsage,
            _ => return Err(DecodeError::UnknownOpcode(opcode)),
        })
    }
}

/// A command's body, read as its opcode's argument structure.
struct Body<'a> {
    opcode: u16,
    body: &'a [u8],
}

impl Body<'_> {
    /// The body as `T`, from its start.
    fn read<T: Pod>(&self) -> Result<T, DecodeError> {
        T::read_from(self.body).ok_or(DecodeError::ShortBody {
            opcode: self.opcode,
            len: self.body.len(),
            need: size_of::<T>(),
        })
    }

    /// The object number of an [`abi::Handle`] body.
    fn handle(&self) -> Result<u32, DecodeError> {
        Ok(self.read::<abi::Handle>()?.handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_opcode_is_named() {
        for op in [0, abi::CMD_QUERY_USAGE + 1, u16::MAX] {
            assert_eq!(
                Command::decode(op, &[0; 256]),
                Err(DecodeError::UnknownOpcode(op))
            );
        }
    }

    #[test]
    fn a_short_body_is_an_error_and_a_long_one_is_read_from_its_start() {
        let h = abi::Handle {
            handle: 7,
            reserved: 0,
        };
        let mut long = h.as_bytes().to_vec();
        long.extend_from_slice(&[0xff; 8]);
        assert_eq!(
            Command::decode(abi::CMD_DESTROY_QP, &long),
            Ok(Command::DestroyQp { qpn: 7 })
        );
        assert_eq!(
            Command::decode(abi::CMD_DESTROY_QP, &long[..7]),
            Err(DecodeError::ShortBody {
                opcode: abi::CMD_DESTROY_QP,
                len: 7,
                need: size_of::<abi::Handle>(),
            })
        );
        let need = size_of::<abi::CreateQp>();
        assert!(matches!(
            Command::decode(abi::CMD_CREATE_QP, &vec![0; need - 1]),
            Err(DecodeError::ShortBody { .. })
        ));
        assert!(Command::decode(abi::CMD_CREATE_QP, &vec![0; need]).is_ok());
    }

    #[test]
    fn commands_without_arguments_take_any_body() {
        for (op, cmd) in [
            (abi::CMD_QUERY_DEVICE, Command::QueryDevice),
            (abi::CMD_ALLOC_PD, Command::AllocPd),
            (abi::CMD_OPEN_CTX, Command::OpenCtx),
            (abi::CMD_QUERY_USAGE, Command::QueryUsage),
        ] {
            assert_eq!(Command::decode(op, &[]), Ok(cmd));
        }
    }
}
