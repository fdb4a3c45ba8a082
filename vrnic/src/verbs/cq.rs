//! Completion queues: a ring of [`abi::Cqe`] in driver memory
//! (`ibv_create_cq(3)`, `ibv_poll_cq(3)`; IBTA Vol 1 §11.4.2).

use crate::abi;
use crate::mem::{self, DmaMemory, MemError};

/// Why a CQE could not be delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CqError {
    /// The ring is full: the driver has not consumed enough CQEs.
    #[error("completion queue overrun")]
    Overrun,
    /// The ring or doorbell record is outside driver memory.
    #[error("completion queue memory: {0}")]
    Mem(#[from] MemError),
}

/// A completion queue.
#[derive(Debug, Clone)]
pub struct Cq {
    /// CQ number.
    pub cqn: u32,
    /// The device context owning the CQ (device spec §5.x.6.13).
    pub ctx: u16,
    /// Guest-physical address of the ring.
    pub ring: u64,
    /// Number of CQEs (power of two).
    pub size: u32,
    /// Guest-physical address of the doorbell record (driver consumer index).
    pub db: u64,
    /// Producer index (free-running).
    pub pi: u32,
    /// Armed for the next completion (`Some(false)`) or the next solicited one (`Some(true)`).
    pub armed: Option<bool>,
    /// Set once an overrun happened; the CQ then accepts nothing (IBTA C11-29).
    pub broken: bool,
}

impl Cq {
    /// Writes one CQE (with the owner bit for the current pass, last).
    /// Returns whether a completion event is due (the CQ was armed for it).
    pub fn push(
        &mut self,
        mem: &dyn DmaMemory,
        mut cqe: abi::Cqe,
        solicited: bool,
    ) -> Result<bool, CqError> {
        if self.broken {
            return Err(CqError::Overrun);
        }
        let ci: u32 = mem::read_obj::<abi::Handle>(mem, self.db)?.handle;
        if self.pi.wrapping_sub(ci) >= self.size {
            self.broken = true;
            return Err(CqError::Overrun);
        }
        let slot = (self.pi & (self.size - 1)) as u64;
        let addr = self.ring + slot * size_of::<abi::Cqe>() as u64;
        cqe.owner = ((self.pi / self.size) & 1) as u8 ^ 1;
        let bytes = abi::Pod::as_bytes(&cqe);
        mem.write(addr, &bytes[..31])?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        mem.write(addr + 31, &bytes[31..])?;
        self.pi = self.pi.wrapping_add(1);
        let fire = match self.armed {
            Some(only_solicited) => !only_solicited || solicited,
            None => false,
        };
        if fire {
            self.armed = None;
        }
        Ok(fire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;

    /// CQ 1 of `size` CQEs with its ring at 0x100 and its record at 0x10.
    fn cq(size: u32, armed: Option<bool>) -> Cq {
        Cq {
            ctx: 0,
            cqn: 1,
            ring: 0x100,
            size,
            db: 0x10,
            pi: 0,
            armed,
            broken: false,
        }
    }

    #[test]
    fn owner_bit_flips_per_pass_and_overrun_is_detected() {
        let mem = VecMemory::new(0, 0x1000);
        let mut cq = cq(2, None);
        for i in 0..2u64 {
            cq.push(
                &mem,
                abi::Cqe {
                    wr_id: i,
                    ..Default::default()
                },
                false,
            )
            .unwrap();
        }
        let c: abi::Cqe = mem::read_obj(&mem, 0x120).unwrap();
        assert_eq!((c.wr_id, c.owner), (1, 1));
        assert_eq!(
            cq.push(&mem, abi::Cqe::default(), false),
            Err(CqError::Overrun)
        );
        assert!(cq.broken);
        cq.broken = false;
        mem::write_obj(
            &mem,
            0x10,
            &abi::Handle {
                handle: 2,
                reserved: 0,
            },
        )
        .unwrap();
        cq.push(
            &mem,
            abi::Cqe {
                wr_id: 9,
                ..Default::default()
            },
            false,
        )
        .unwrap();
        let c: abi::Cqe = mem::read_obj(&mem, 0x100).unwrap();
        assert_eq!((c.wr_id, c.owner), (9, 0));
    }

    #[test]
    fn armed_cq_fires_once() {
        let mem = VecMemory::new(0, 0x1000);
        let mut cq = cq(8, Some(true));
        assert!(!cq.push(&mem, abi::Cqe::default(), false).unwrap());
        assert!(cq.push(&mem, abi::Cqe::default(), true).unwrap());
        assert!(!cq.push(&mem, abi::Cqe::default(), true).unwrap());
    }
}
