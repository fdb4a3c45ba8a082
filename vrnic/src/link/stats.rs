//! Counters shared by the link implementations, and the errors they report
//! when opening.

use std::io;

/// Frame counters of one link end, in frames (not bytes). Counters only
/// grow; they wrap at `u64::MAX`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames accepted by [`super::Link::send`] and handed on.
    pub tx_frames: u64,
    /// Frames [`super::Link::send`] dropped because the link could not take
    /// them now (queue full, `EAGAIN`/`ENOBUFS`, interface down).
    pub tx_dropped: u64,
    /// Times [`super::Link::try_send`] found the link full and handed the
    /// frame back to the caller (not lost: the caller sends it again).
    pub tx_busy: u64,
    /// Frames returned by [`super::Link::recv`].
    pub rx_frames: u64,
    /// Frames [`super::Link::recv`] discarded because they did not fit the
    /// caller's buffer (a NIC drops frames longer than its receive buffers).
    pub rx_oversize: u64,
    /// Frames the kernel dropped for this end before [`super::Link::recv`]
    /// could take them, because its receive queue was full (AF_PACKET's
    /// `PACKET_STATISTICS` `tp_drops`, packet(7)); 0 for links that do not
    /// count such drops. A receiver that falls behind a sender shows here
    /// first; the RC transport then recovers by retransmission.
    pub rx_dropped: u64,
    /// Super-frames sent: runs of frames of one flow handed to the kernel
    /// as one, to be segmented there ([`super::uso`]); their frames count
    /// in `tx_frames`.
    pub tx_super: u64,
    /// Super-frames received whole and cut into frames here
    /// ([`super::uso`]); their frames count in `rx_frames`.
    pub rx_super: u64,
    /// Frames discarded because their virtio-net header asked for an
    /// offload the link does not do or did not fit the frame
    /// ([`super::uso::BadFrame`]).
    pub rx_malformed: u64,
}

/// Opening a link on a named interface failed. Carried inside the
/// [`io::Error`] the `open` functions return (its kind is the kind of the
/// underlying OS error), so callers that print the `io::Error` see which
/// interface and which step failed.
#[derive(Debug, thiserror::Error)]
#[error("{kind} link on interface {ifname:?}: {step}: {io}")]
pub struct OpenError {
    /// Which link: `"TAP"` or `"AF_PACKET"`.
    pub kind: &'static str,
    /// The interface name as given by the caller.
    pub ifname: String,
    /// The step that failed, e.g. `"bind"` or `"if_nametoindex"`.
    pub step: &'static str,
    /// The OS error.
    pub io: io::Error,
}

impl OpenError {
    /// Wraps `io` into an [`io::Error`] of the same kind naming `ifname` and `step`.
    pub(crate) fn wrap(
        kind: &'static str,
        ifname: &str,
        step: &'static str,
        io: io::Error,
    ) -> io::Error {
        let k = io.kind();
        io::Error::new(
            k,
            OpenError {
                kind,
                ifname: ifname.to_owned(),
                step,
                io,
            },
        )
    }
}

/// `true` for the errors a NIC-like link reports when it cannot take a frame
/// right now: the frame is dropped, not failed.
pub(crate) fn is_transient_tx_error(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS)
}
