//! The errors of a [`Cm`]'s user calls.

#[cfg(doc)]
use crate::{limits::MAX_CONNECTIONS, limits::MAX_LISTENERS, Cm};

/// Errors of the consumer's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// No such connection.
    #[error("no such connection")]
    NoSuchId,
    /// The call is not valid in the connection's state (cm.c: `-EINVAL`).
    #[error("invalid in the connection's state")]
    BadState,
    /// A table is full ([`MAX_CONNECTIONS`], [`MAX_LISTENERS`]).
    #[error("table full")]
    TableFull,
    /// The service ID is already listened on (cm.c: `-EBUSY`).
    #[error("service ID busy")]
    Busy,
    /// The service ID is not listened on.
    #[error("not listening")]
    NotListening,
    /// Private data longer than the message carries.
    #[error("private data too long")]
    PrivateDataTooLong,
    /// A parameter out of its field's range.
    #[error("invalid parameter")]
    InvalidParam,
}
