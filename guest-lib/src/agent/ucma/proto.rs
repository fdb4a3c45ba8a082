//! The rdma_ucm ABI on an agent connection: what rdma-core's
//! `librdmacm/cma.c` writes to `/dev/infiniband/rdma_cm`, carried on a
//! `SOCK_SEQPACKET` connection to the agent's socket, one connection per
//! event channel.
//!
//! | message | direction | body after the tag byte |
//! |---|---|---|
//! | [`MSG_UCMA_HELLO`] | library → agent, first | `version: u32` ([`UCMA_VERSION`]) |
//! | [`MSG_UCMA_WELCOME`] | agent → library | `status: i32` (0 or a negative errno), `channel: u32` (this event channel's number at the agent); descriptor: the wake descriptor |
//! | [`MSG_UCMA_CMD`] | library → agent | an `rdma_ucm_cmd_hdr` and the command structure, as written to the kernel's device (its `response` pointer is ignored); for `SET_OPTION`, `optlen` bytes of option value follow the structure |
//! | [`MSG_UCMA_ANSWER`] | agent → library | `ret: i32` (what `write(2)` on the kernel's device returns: the bytes written, or a negative errno), then the response structure (at most the header's `out` bytes) |
//!
//! One command is answered before the next is read. Events stay in the
//! agent until `GET_EVENT` fetches one, which never blocks: with no event
//! waiting its answer is `-EAGAIN`. The wake descriptor (an `eventfd(2)`)
//! is readable exactly while an event waits, so it serves as the event
//! channel's pollable `fd`; the library waits on it (`poll(2)`) and never
//! reads it. In `MIGRATE_ID`, `fd` names the old channel by its
//! `channel` number rather than by a descriptor.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use super::abi;
use crate::agent::proto as agent_proto;

/// Opens an rdma_ucm connection (after the tag byte: `version: u32`).
pub const MSG_UCMA_HELLO: u8 = 9;
/// The agent's answer to [`MSG_UCMA_HELLO`].
pub const MSG_UCMA_WELCOME: u8 = 10;
/// One rdma_ucm command.
pub const MSG_UCMA_CMD: u8 = 11;
/// The answer to [`MSG_UCMA_CMD`].
pub const MSG_UCMA_ANSWER: u8 = 12;
/// Version in [`MSG_UCMA_HELLO`].
pub const UCMA_VERSION: u32 = 1;
/// Largest message in either direction, in bytes (the largest command,
/// `RESOLVE_ADDR` with two `sockaddr_storage`s, is 280 bytes; the largest
/// answer, `QUERY` of the path with its records, under 1 KiB; an option
/// value of `SET_OPTION` at most [`MAX_OPTION_LEN`]).
pub const MAX_UCMA_MSG: usize = 4096;
/// Largest `SET_OPTION` value carried, in bytes.
pub const MAX_OPTION_LEN: usize = 2048;
/// How long the library waits for the agent's answer to one command
/// before it gives up (`ETIMEDOUT`).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The header of an rdma_ucm command.
pub type CmdHdr = abi::rdma_ucm_cmd_hdr;

/// Encodes [`MSG_UCMA_HELLO`].
pub fn hello() -> Vec<u8> {
    let mut m = vec![MSG_UCMA_HELLO];
    m.extend_from_slice(&UCMA_VERSION.to_le_bytes());
    m
}

/// Decodes [`MSG_UCMA_HELLO`]: its version, `None` when it is not one.
pub fn decode_hello(m: &[u8]) -> Option<u32> {
    match m {
        [MSG_UCMA_HELLO, v @ ..] if v.len() == 4 => Some(u32::from_le_bytes(v.try_into().ok()?)),
        _ => None,
    }
}

/// Encodes [`MSG_UCMA_WELCOME`] (the wake descriptor travels beside it).
pub fn welcome(status: i32, channel: u32) -> Vec<u8> {
    let mut m = vec![MSG_UCMA_WELCOME];
    m.extend_from_slice(&status.to_le_bytes());
    m.extend_from_slice(&channel.to_le_bytes());
    m
}

/// Decodes [`MSG_UCMA_WELCOME`]: `(status, channel)`.
pub fn decode_welcome(m: &[u8]) -> Option<(i32, u32)> {
    if m.len() != 9 || m[0] != MSG_UCMA_WELCOME {
        return None;
    }
    Some((
        i32::from_le_bytes(m[1..5].try_into().ok()?),
        u32::from_le_bytes(m[5..9].try_into().ok()?),
    ))
}

/// Encodes [`MSG_UCMA_CMD`]: command `cmd` (`RDMA_USER_CM_CMD_*`) with
/// structure `body` (its bytes as the kernel's device reads them) and
/// `extra` after it (`SET_OPTION`'s value), `out` the response's size.
pub fn command(cmd: u32, body: &[u8], extra: &[u8], out: u16) -> Vec<u8> {
    let hdr = CmdHdr {
        cmd,
        in_: u16::try_from(body.len()).unwrap_or(u16::MAX),
        out,
    };
    let mut m = Vec::with_capacity(1 + 8 + body.len() + extra.len());
    m.push(MSG_UCMA_CMD);
    m.extend_from_slice(&hdr.cmd.to_ne_bytes());
    m.extend_from_slice(&hdr.in_.to_ne_bytes());
    m.extend_from_slice(&hdr.out.to_ne_bytes());
    m.extend_from_slice(body);
    m.extend_from_slice(extra);
    m
}

/// A decoded [`MSG_UCMA_CMD`], borrowing the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command<'a> {
    /// `RDMA_USER_CM_CMD_*`.
    pub cmd: u32,
    /// The header's `out`: the response's size in bytes.
    pub out: u16,
    /// The command structure (`in` bytes).
    pub body: &'a [u8],
    /// What follows the structure (`SET_OPTION`'s value).
    pub extra: &'a [u8],
}

/// Decodes [`MSG_UCMA_CMD`]; `None` when the message is not one or is
/// shorter than its header's `in`.
pub fn decode_command(m: &[u8]) -> Option<Command<'_>> {
    if m.first() != Some(&MSG_UCMA_CMD) || m.len() < 9 {
        return None;
    }
    let cmd = u32::from_ne_bytes(m[1..5].try_into().ok()?);
    let inl = usize::from(u16::from_ne_bytes(m[5..7].try_into().ok()?));
    let out = u16::from_ne_bytes(m[7..9].try_into().ok()?);
    let rest = &m[9..];
    if rest.len() < inl {
        return None;
    }
    let (body, extra) = rest.split_at(inl);
    Some(Command {
        cmd,
        out,
        body,
        extra,
    })
}

/// Encodes [`MSG_UCMA_ANSWER`]: `ret` and at most `out` bytes of `resp`.
pub fn answer(ret: i32, resp: &[u8], out: u16) -> Vec<u8> {
    let n = resp.len().min(usize::from(out));
    let mut m = Vec::with_capacity(5 + n);
    m.push(MSG_UCMA_ANSWER);
    m.extend_from_slice(&ret.to_le_bytes());
    m.extend_from_slice(&resp[..n]);
    m
}

/// Decodes [`MSG_UCMA_ANSWER`]: `(ret, response)`.
pub fn decode_answer(m: &[u8]) -> Option<(i32, &[u8])> {
    if m.len() < 5 || m[0] != MSG_UCMA_ANSWER {
        return None;
    }
    Some((i32::from_le_bytes(m[1..5].try_into().ok()?), &m[5..]))
}

/// The library's side of an rdma_ucm connection: one event channel.
#[derive(Debug)]
pub struct UcmaConn {
    sock: OwnedFd,
    /// Readable exactly while an event waits at the agent.
    pub wake: OwnedFd,
    /// This channel's number at the agent (`MIGRATE_ID`'s `fd`).
    pub channel: u32,
}

impl UcmaConn {
    /// Connects to the agent listening at `path` and opens an event
    /// channel. Errors: the agent cannot be reached (`ENOENT`,
    /// `ECONNREFUSED`), does not speak rdma_ucm (`EPROTO`), refuses
    /// (its errno), or does not answer within [`ANSWER_TIMEOUT`]
    /// (`ETIMEDOUT`).
    pub fn connect(path: &Path) -> io::Result<UcmaConn> {
        let sock = agent_proto::connect(path)?;
        agent_proto::send(sock.as_raw_fd(), &hello(), &[], 0)?;
        let mut buf = [0u8; 64];
        let (n, mut fds) = recv_answer(&sock, &mut buf)?;
        let Some((status, channel)) = decode_welcome(&buf[..n]) else {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        };
        if status != 0 {
            return Err(io::Error::from_raw_os_error(status.saturating_neg()));
        }
        if fds.len() != 1 {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        }
        Ok(UcmaConn {
            sock,
            wake: fds.remove(0),
            channel,
        })
    }

    /// The connection's socket, for the library to notice the agent going
    /// away (`poll(2)` reports `POLLHUP` on it) while it waits on `wake`.
    pub fn socket(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// Executes command `cmd` with structure `body` (and `extra`), copying
    /// at most `resp.len()` bytes of the response into `resp`; returns
    /// what the kernel device's `write(2)` would: the bytes written, or a
    /// negative errno. Errors: the agent went away or answered garbage.
    pub fn call(&self, cmd: u32, body: &[u8], extra: &[u8], resp: &mut [u8]) -> io::Result<i32> {
        let out = u16::try_from(resp.len()).unwrap_or(u16::MAX);
        agent_proto::send(
            self.sock.as_raw_fd(),
            &command(cmd, body, extra, out),
            &[],
            0,
        )?;
        let mut buf = vec![0u8; MAX_UCMA_MSG];
        let (n, _) = recv_answer(&self.sock, &mut buf)?;
        let Some((ret, r)) = decode_answer(&buf[..n]) else {
            return Err(io::Error::from_raw_os_error(libc::EPROTO));
        };
        let k = r.len().min(resp.len());
        resp[..k].copy_from_slice(&r[..k]);
        Ok(ret)
    }
}

/// Receives one answer from the agent, waiting at most [`ANSWER_TIMEOUT`].
fn recv_answer(sock: &OwnedFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    if !agent_proto::wait_readable(sock.as_raw_fd(), ANSWER_TIMEOUT)? {
        return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
    }
    let (n, fds) = agent_proto::recv(sock.as_raw_fd(), buf, 0)?;
    if n == 0 {
        return Err(io::Error::from_raw_os_error(libc::ECONNRESET));
    }
    Ok((n, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        assert_eq!(decode_hello(&hello()), Some(UCMA_VERSION));
        assert_eq!(decode_hello(&[MSG_UCMA_HELLO, 1, 0]), None);
        assert_eq!(decode_welcome(&welcome(-22, 7)), Some((-22, 7)));
        assert_eq!(decode_welcome(&welcome(0, 7)[..8]), None);
        let m = command(abi::RDMA_USER_CM_CMD_SET_OPTION, &[1; 24], &[2; 3], 0);
        let c = decode_command(&m).unwrap();
        assert_eq!(
            (c.cmd, c.out, c.body, c.extra),
            (
                abi::RDMA_USER_CM_CMD_SET_OPTION,
                0,
                &[1u8; 24][..],
                &[2u8; 3][..]
            )
        );
        // Shorter than its header's `in`.
        assert_eq!(decode_command(&m[..20]), None);
        assert_eq!(decode_command(&[MSG_UCMA_CMD; 5]), None);
        let a = answer(-11, &[9; 40], 16);
        assert_eq!(decode_answer(&a), Some((-11, &[9u8; 16][..])));
        assert_eq!(decode_answer(&a[..4]), None);
    }

    #[test]
    fn header_is_the_kernels() {
        // struct rdma_ucm_cmd_hdr { __u32 cmd; __u16 in; __u16 out; }
        assert_eq!(size_of::<CmdHdr>(), 8);
        let m = command(abi::RDMA_USER_CM_CMD_GET_EVENT, &[0; 8], &[], 336);
        assert_eq!(&m[1..9], &[12, 0, 0, 0, 8, 0, 0x50, 1]);
    }
}
