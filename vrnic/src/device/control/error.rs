//! Why a control command failed ([`CommandError`]), and the one place
//! where that becomes the status the driver sees ([`CommandError::status`],
//! `abi::STATUS_*`: 0 or a positive Linux errno, as rxe's verbs return).

use thiserror::Error;

use super::command::DecodeError;
use crate::abi::{self, Status};

/// A device object a command names, by its number (device spec §5.x.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::device) enum Object {
    /// A device context (`CmdHeader::ctx`, `CMD_CLOSE_CTX`'s target).
    Context(u32),
    /// A protection domain.
    Pd(u32),
    /// A memory region, by its local key.
    Mr(u32),
    /// A completion queue.
    Cq(u32),
    /// A queue pair.
    Qp(u32),
    /// An address handle.
    Ah(u32),
    /// A shared receive queue.
    Srq(u32),
    /// A GID table entry, by its index.
    Gid(u32),
    /// A P_Key table entry, by its index.
    Pkey(u32),
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Object::Context(n) => write!(f, "context {n}"),
            Object::Pd(n) => write!(f, "PD {n}"),
            Object::Mr(n) => write!(f, "MR lkey {n:#x}"),
            Object::Cq(n) => write!(f, "CQ {n}"),
            Object::Qp(n) => write!(f, "QP {n:#x}"),
            Object::Ah(n) => write!(f, "AH {n}"),
            Object::Srq(n) => write!(f, "SRQ {n}"),
            Object::Gid(n) => write!(f, "GID index {n}"),
            Object::Pkey(n) => write!(f, "P_Key index {n}"),
        }
    }
}

/// Why a control command failed. Every variant maps to one status
/// ([`CommandError::status`]); the fields say what the driver got wrong,
/// for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub(in crate::device) enum CommandError {
    /// The opcode or body is not a command ([`DecodeError`]):
    /// `STATUS_ENOSYS` for an unknown opcode, `STATUS_EINVAL` for a short
    /// body.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The object does not exist, or belongs to another context, which
    /// answers as if it did not exist (device spec §5.x.6.13):
    /// `STATUS_ENOENT`.
    #[error("no {0} in this context")]
    NotFound(Object),
    /// The object is still used by another (a PD by an MR, QP, AH or SRQ;
    /// a CQ by a QP; an SRQ by a QP): `STATUS_EBUSY`.
    #[error("{0} is in use")]
    InUse(Object),
    /// A device limit is reached (`MAX_*` objects, MR pages, ring
    /// entries): `STATUS_ENOMEM`, as mlx5 answers its firmware's "limits
    /// exceeded"; today's rxe answers a full pool with `-EINVAL`
    /// (`__rxe_add_to_pool`), older ones with `-ENOMEM` (device spec
    /// §5.x.6.2).
    #[error("out of {what}")]
    NoResources {
        /// The limit reached.
        what: &'static str,
    },
    /// An argument is out of range or inconsistent: `STATUS_EINVAL`.
    #[error("invalid {what}")]
    InvalidArgument {
        /// The argument.
        what: &'static str,
    },
    /// A valid request the device does not implement: `STATUS_EOPNOTSUPP`.
    #[error("{what} is not supported")]
    NotSupported {
        /// What was asked for.
        what: &'static str,
    },
    /// Driver memory the command names cannot be accessed (a ring, a
    /// doorbell record, a page list or one of its pages): `STATUS_EFAULT`.
    #[error("driver address {gpa:#x} is not accessible")]
    BadAddress {
        /// The first address found inaccessible (or the start of a range
        /// that wraps).
        gpa: u64,
    },
    /// A command only [`abi::DEFAULT_CTX`] may send (`CMD_OPEN_CTX`,
    /// `CMD_CLOSE_CTX`, `CMD_QUERY_USAGE`) from another context:
    /// `STATUS_EPERM`.
    #[error("context {ctx} is not the default context")]
    NotDefaultContext {
        /// The sending context.
        ctx: u16,
    },
}

impl CommandError {
    /// The status the driver sees (`abi::STATUS_*`): the only mapping
    /// from a command's failure to the ABI.
    pub(in crate::device) fn status(&self) -> Status {
        match self {
            CommandError::Decode(DecodeError::UnknownOpcode(_)) => abi::STATUS_ENOSYS,
            CommandError::Decode(DecodeError::ShortBody { .. }) => abi::STATUS_EINVAL,
            CommandError::NotFound(_) => abi::STATUS_ENOENT,
            CommandError::InUse(_) => abi::STATUS_EBUSY,
            CommandError::NoResources { .. } => abi::STATUS_ENOMEM,
            CommandError::InvalidArgument { .. } => abi::STATUS_EINVAL,
            CommandError::NotSupported { .. } => abi::STATUS_EOPNOTSUPP,
            CommandError::BadAddress { .. } => abi::STATUS_EFAULT,
            CommandError::NotDefaultContext { .. } => abi::STATUS_EPERM,
        }
    }

    /// [`CommandError::InvalidArgument`] for `what`.
    pub(in crate::device) fn invalid(what: &'static str) -> CommandError {
        CommandError::InvalidArgument { what }
    }

    /// [`CommandError::NoResources`] for `what`.
    pub(in crate::device) fn no_resources(what: &'static str) -> CommandError {
        CommandError::NoResources { what }
    }
}

impl From<CommandError> for Status {
    fn from(e: CommandError) -> Status {
        e.status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_status() {
        let cases = [
            (
                CommandError::Decode(DecodeError::UnknownOpcode(99)),
                abi::STATUS_ENOSYS,
            ),
            (
                CommandError::Decode(DecodeError::ShortBody {
                    opcode: abi::CMD_CREATE_QP,
                    len: 3,
                    need: 8,
                }),
                abi::STATUS_EINVAL,
            ),
            (CommandError::NotFound(Object::Qp(0x11)), abi::STATUS_ENOENT),
            (
                CommandError::NotFound(Object::Context(5)),
                abi::STATUS_ENOENT,
            ),
            (CommandError::InUse(Object::Pd(1)), abi::STATUS_EBUSY),
            (CommandError::no_resources("QPs"), abi::STATUS_ENOMEM),
            (CommandError::invalid("port"), abi::STATUS_EINVAL),
            (
                CommandError::NotSupported { what: "QP type" },
                abi::STATUS_EOPNOTSUPP,
            ),
            (CommandError::BadAddress { gpa: 0x1000 }, abi::STATUS_EFAULT),
            (
                CommandError::NotDefaultContext { ctx: 3 },
                abi::STATUS_EPERM,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(e.status(), status, "{e}");
            assert_eq!(Status::from(e), status, "{e}");
        }
    }

    #[test]
    fn errors_say_what_went_wrong() {
        assert_eq!(
            CommandError::NotFound(Object::Cq(4)).to_string(),
            "no CQ 4 in this context"
        );
        assert_eq!(
            CommandError::Decode(DecodeError::UnknownOpcode(99)).to_string(),
            "unknown command opcode 99"
        );
    }
}
