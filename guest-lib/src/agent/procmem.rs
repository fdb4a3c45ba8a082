//! Driver memory in other processes, for an agent over an in-process
//! device ([`super::proto::MODE_PROCESS`]): a device address is
//! `ctx << 48 | virtual address` in the process holding context `ctx`,
//! reached with `process_vm_readv(2)`/`process_vm_writev(2)` (the agent
//! runs as root, or with `CAP_SYS_PTRACE` over its programs).
//!
//! The device's access (the engine's `DmaMemory`) needs feature
//! `loopback`. A process that is gone (or a context with no process)
//! makes every access fail (`MemError`), which the device turns into an
//! error CQE or a dropped packet: the device never touches another
//! process's memory.

use std::sync::RwLock;

#[cfg(feature = "loopback")]
use vrnic::mem::{DmaMemory, MemError};
use vrnic_abi as abi;

use super::proto::PROCESS_CTX_SHIFT;

/// The processes behind the open contexts.
#[derive(Debug)]
pub struct ProcessMemory {
    pids: RwLock<Vec<i32>>,
}

impl Default for ProcessMemory {
    fn default() -> Self {
        ProcessMemory {
            pids: RwLock::new(vec![0; abi::MAX_CTX]),
        }
    }
}

/// The device address of `va` in the process holding `ctx`.
pub fn device_address(ctx: u16, va: usize) -> u64 {
    (u64::from(ctx) << PROCESS_CTX_SHIFT) | va as u64
}

impl ProcessMemory {
    /// Context `ctx` is now process `pid` (0: none).
    pub fn set(&self, ctx: u16, pid: i32) {
        if let Ok(mut p) = self.pids.write() {
            if let Some(slot) = p.get_mut(usize::from(ctx)) {
                *slot = pid;
            }
        }
    }

    #[cfg(feature = "loopback")]
    fn target(&self, gpa: u64, len: usize) -> Result<(i32, usize), MemError> {
        let err = MemError { addr: gpa, len };
        let ctx = usize::try_from(gpa >> PROCESS_CTX_SHIFT).map_err(|_| err)?;
        let va = (gpa & ((1 << PROCESS_CTX_SHIFT) - 1)) as usize;
        va.checked_add(len).ok_or(err)?;
        let pid = self
            .pids
            .read()
            .ok()
            .and_then(|p| p.get(ctx).copied())
            .unwrap_or(0);
        if pid <= 0 || va == 0 {
            return Err(err);
        }
        Ok((pid, va))
    }
}

#[cfg(feature = "loopback")]
impl DmaMemory for ProcessMemory {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let (pid, va) = self.target(gpa, buf.len())?;
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: va as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, which we own mutably; the remote
        // range is only read by the kernel, in the other process.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n < 0 || n as usize != buf.len() {
            return Err(MemError {
                addr: gpa,
                len: buf.len(),
            });
        }
        Ok(())
    }

    fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        let (pid, va) = self.target(gpa, buf.len())?;
        let local = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: va as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, only read; the kernel writes the
        // remote range in the other process.
        let n = unsafe { libc::process_vm_writev(pid, &local, 1, &remote, 1, 0) };
        if n < 0 || n as usize != buf.len() {
            return Err(MemError {
                addr: gpa,
                len: buf.len(),
            });
        }
        Ok(())
    }
}

#[cfg(all(test, feature = "loopback"))]
mod tests {
    use super::*;

    #[test]
    fn reaches_a_registered_process_and_nothing_else() {
        let m = ProcessMemory::default();
        let mut mine = vec![5u8; 64];
        let va = mine.as_mut_ptr() as usize;
        let gpa = device_address(3, va);
        let mut b = [0u8; 8];
        assert!(m.read(gpa, &mut b).is_err(), "no process for ctx 3 yet");
        m.set(3, std::process::id() as i32);
        m.read(gpa, &mut b).unwrap();
        assert_eq!(b, [5; 8]);
        m.write(gpa + 8, &[9; 4]).unwrap();
        assert_eq!(&mine[8..12], &[9; 4]);
        assert!(m.read(device_address(4, va), &mut b).is_err());
        assert!(m.read(device_address(3, 0), &mut b).is_err());
        m.set(3, 0);
        assert!(m.read(gpa, &mut b).is_err());
    }
}
