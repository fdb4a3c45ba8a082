//! Verbs objects through the test frontend: the control commands, rings,
//! work requests and completion polling a guest driver uses (device ABI,
//! [`vrnic::abi`]), built in driver memory and driven over the control and
//! doorbell queues. Enough for RC traffic between two daemons; not a
//! general driver (see `guest-lib` for that).
//!
//! Memory regions get virtual addresses ([`Mr::va`]) distinct from their
//! guest-physical ones, so the device's address translation is exercised.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use vrnic::abi::{self, Pod};
use vrnic::mem::DmaMemory;

use super::{FrontendError, TestFrontend, PAGE};

/// Offset added to a buffer's guest-physical address to make the virtual
/// address (`iova`) it is registered at. Page-aligned, so page offsets
/// agree as `CMD_REG_MR` requires.
pub const IOVA_OFFSET: u64 = 0x7f00_0000_0000;

/// A registered memory region over one buffer of driver memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// Guest-physical address of the buffer.
    pub gpa: u64,
    /// Virtual address of the buffer's first byte (`iova`).
    pub iova: u64,
    /// Length, bytes.
    pub len: u64,
}

impl Mr {
    /// Virtual address of byte `off` of the region.
    pub fn va(&self, off: u64) -> u64 {
        self.iova + off
    }

    /// An SGE for `len` bytes at byte `off` of the region.
    pub fn sge(&self, off: u64, len: u32) -> abi::Sge {
        abi::Sge {
            addr: self.va(off),
            length: len,
            lkey: self.lkey,
        }
    }
}

/// A completion queue whose ring lives in driver memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cq {
    /// CQ number.
    pub cqn: u32,
    /// Guest-physical address of the CQE ring.
    pub ring: u64,
    /// Guest-physical address of the consumer-index record.
    pub db: u64,
    /// Entries in the ring (a power of two).
    pub size: u32,
    /// Consumer index (free-running).
    pub ci: u32,
}

/// A queue pair whose rings live in driver memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qp {
    /// QP number.
    pub qpn: u32,
    /// Guest-physical address of the send ring.
    pub sq: u64,
    /// Guest-physical address of the receive ring.
    pub rq: u64,
    /// Guest-physical address of the QP record.
    pub rec: u64,
    /// Send WQE stride, bytes.
    pub sq_stride: u32,
    /// Receive WQE stride, bytes.
    pub rq_stride: u32,
    /// Send ring slots.
    pub sq_size: u32,
    /// Receive ring slots.
    pub rq_size: u32,
    /// SGEs per WQE.
    pub max_sge: u32,
    /// Send producer index (free-running).
    pub sq_pi: u32,
    /// Receive producer index (free-running).
    pub rq_pi: u32,
}

/// Sizes of a new RC queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpSizes {
    /// Send ring slots (a power of two).
    pub sq: u32,
    /// Receive ring slots (a power of two).
    pub rq: u32,
    /// SGEs per send and receive WQE.
    pub sge: u32,
}

impl Default for QpSizes {
    fn default() -> Self {
        Self {
            sq: 16,
            rq: 16,
            sge: 2,
        }
    }
}

/// The remote end of an RC connection and the path to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcPath {
    /// The peer port's IPv4 address (the GID is `::ffff:ip`).
    pub peer_ip: Ipv4Addr,
    /// The peer's QP number.
    pub peer_qpn: u32,
    /// The PSN the peer sends first (our expected receive PSN).
    pub peer_psn: u32,
    /// The PSN we send first.
    pub my_psn: u32,
    /// Path MTU as `ibv_mtu` (1..=5).
    pub path_mtu: u32,
}

/// The IPv4-mapped GID of `ip`, `::ffff:a.b.c.d`.
pub fn ipv4_gid(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

impl TestFrontend {
    /// Executes a command that must succeed; returns the response body.
    ///
    /// # Errors
    /// [`FrontendError::Command`] for an error status; as
    /// [`TestFrontend::control`].
    pub fn command<T: Pod>(&mut self, opcode: u16, body: &T) -> Result<Vec<u8>, FrontendError> {
        let (h, resp) = self.control_obj(opcode, body)?;
        if h.status != abi::STATUS_OK {
            return Err(FrontendError::Command {
                opcode,
                status: h.status,
            });
        }
        Ok(resp)
    }

    /// Executes a command that must succeed and answer with a `R`.
    fn command_resp<T: Pod, R: Pod>(&mut self, opcode: u16, body: &T) -> Result<R, FrontendError> {
        let resp = self.command(opcode, body)?;
        R::read_from(&resp).ok_or(FrontendError::ShortResponse {
            used: 8 + resp.len() as u32,
        })
    }

    /// Allocates zeroed, page-aligned driver memory.
    ///
    /// # Errors
    /// [`FrontendError::OutOfMemory`].
    pub fn alloc_buffer(&mut self, len: u64) -> Result<u64, FrontendError> {
        let gpa = self.memory_mut().alloc(len.max(1), PAGE)?;
        // The allocator never reuses memory, and memfd memory starts zeroed.
        Ok(gpa)
    }

    /// `CMD_ALLOC_PD`: returns the PD number.
    ///
    /// # Errors
    /// As [`TestFrontend::command`].
    pub fn alloc_pd(&mut self) -> Result<u32, FrontendError> {
        let h: abi::Handle = self.command_resp(abi::CMD_ALLOC_PD, &abi::Handle::default())?;
        Ok(h.handle)
    }

    /// `CMD_REG_MR` over `[gpa, gpa + len)` at virtual address
    /// `gpa + IOVA_OFFSET`, with the page list in driver memory.
    ///
    /// # Errors
    /// As [`TestFrontend::command`]; [`FrontendError::OutOfMemory`].
    pub fn reg_mr(
        &mut self,
        pdn: u32,
        gpa: u64,
        len: u64,
        access: u32,
    ) -> Result<Mr, FrontendError> {
        let first = gpa & !(PAGE - 1);
        let npages = (gpa + len.max(1) - first).div_ceil(PAGE);
        let list = self.memory_mut().alloc(8 * npages, 8)?;
        for i in 0..npages {
            let page = first + i * PAGE;
            self.memory()
                .mem()
                .write(list + 8 * i, &page.to_le_bytes())?;
        }
        let iova = gpa + IOVA_OFFSET;
        let req = abi::RegMr {
            pdn,
            access,
            iova,
            length: len,
            page_shift: PAGE.trailing_zeros(),
            npages: npages as u32,
            page_list: list,
        };
        let k: abi::MrKeys = self.command_resp(abi::CMD_REG_MR, &req)?;
        Ok(Mr {
            lkey: k.lkey,
            rkey: k.rkey,
            gpa,
            iova,
            len,
        })
    }

    /// `CMD_CREATE_CQ` with a ring of `size` CQEs (a power of two).
    ///
    /// # Errors
    /// As [`TestFrontend::command`]; [`FrontendError::OutOfMemory`].
    pub fn create_cq(&mut self, size: u32) -> Result<Cq, FrontendError> {
        let ring = self.alloc_buffer(u64::from(size) * size_of::<abi::Cqe>() as u64)?;
        let db = self.alloc_buffer(8)?;
        let req = abi::CreateCq {
            cqe: size,
            reserved: 0,
            ring,
            db,
        };
        let h: abi::Handle = self.command_resp(abi::CMD_CREATE_CQ, &req)?;
        Ok(Cq {
            cqn: h.handle,
            ring,
            db,
            size,
            ci: 0,
        })
    }

    /// `CMD_CREATE_QP`: an RC QP completing sends on `send_cq` and
    /// receives on `recv_cq`, no inline data, completions only for
    /// signalled work requests.
    ///
    /// # Errors
    /// As [`TestFrontend::command`]; [`FrontendError::OutOfMemory`].
    pub fn create_rc_qp(
        &mut self,
        pdn: u32,
        send_cq: &Cq,
        recv_cq: &Cq,
        sizes: QpSizes,
    ) -> Result<Qp, FrontendError> {
        let sq_stride = abi::sq_stride(sizes.sge, 0);
        let rq_stride = abi::rq_stride(sizes.sge);
        let sq = self.alloc_buffer(u64::from(sizes.sq * sq_stride))?;
        let rq = self.alloc_buffer(u64::from(sizes.rq * rq_stride))?;
        let rec = self.alloc_buffer(16)?;
        let req = abi::CreateQp {
            pdn,
            qp_type: abi::QPT_RC,
            send_cqn: send_cq.cqn,
            recv_cqn: recv_cq.cqn,
            sq_size: sizes.sq,
            rq_size: sizes.rq,
            max_send_sge: sizes.sge,
            max_recv_sge: sizes.sge,
            max_inline: 0,
            sq_sig_all: 0,
            sq,
            rq,
            db: rec,
            srqn: 0,
            reserved: 0,
        };
        let r: abi::CreateQpResp = self.command_resp(abi::CMD_CREATE_QP, &req)?;
        if (r.sq_stride, r.rq_stride) != (sq_stride, rq_stride) {
            return Err(FrontendError::Setup(format!(
                "the device chose strides {}/{}, the ABI says {sq_stride}/{rq_stride}",
                r.sq_stride, r.rq_stride
            )));
        }
        Ok(Qp {
            qpn: r.qpn,
            sq,
            rq,
            rec,
            sq_stride,
            rq_stride,
            sq_size: sizes.sq,
            rq_size: sizes.rq,
            max_sge: sizes.sge,
            sq_pi: 0,
            rq_pi: 0,
        })
    }

    /// `CMD_MODIFY_QP` RESET → INIT → RTR → RTS along `path`, the way
    /// `ibv_rc_pingpong` connects: remote read and write allowed, GID
    /// index 1 (the port's RoCEv2 IPv4 GID), ACK timeout 14, 7 retries.
    ///
    /// # Errors
    /// As [`TestFrontend::command`].
    pub fn connect_rc(&mut self, qp: &Qp, path: &RcPath) -> Result<(), FrontendError> {
        let init = abi::QpAttr {
            qpn: qp.qpn,
            attr_mask: abi::QP_ATTR_STATE
                | abi::QP_ATTR_PKEY_INDEX
                | abi::QP_ATTR_PORT
                | abi::QP_ATTR_ACCESS_FLAGS,
            qp_state: abi::QPS_INIT,
            port_num: 1,
            qp_access_flags: abi::ACCESS_LOCAL_WRITE
                | abi::ACCESS_REMOTE_WRITE
                | abi::ACCESS_REMOTE_READ,
            ..Default::default()
        };
        self.command(abi::CMD_MODIFY_QP, &init)?;
        let rtr = abi::QpAttr {
            qpn: qp.qpn,
            attr_mask: abi::QP_ATTR_STATE
                | abi::QP_ATTR_AV
                | abi::QP_ATTR_PATH_MTU
                | abi::QP_ATTR_DEST_QPN
                | abi::QP_ATTR_RQ_PSN
                | abi::QP_ATTR_MAX_DEST_RD_ATOMIC
                | abi::QP_ATTR_MIN_RNR_TIMER,
            qp_state: abi::QPS_RTR,
            path_mtu: path.path_mtu,
            dest_qp_num: path.peer_qpn,
            rq_psn: path.peer_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            dgid: ipv4_gid(path.peer_ip),
            sgid_index: 1,
            is_global: 1,
            hop_limit: 64,
            ..Default::default()
        };
        self.command(abi::CMD_MODIFY_QP, &rtr)?;
        let rts = abi::QpAttr {
            qpn: qp.qpn,
            attr_mask: abi::QP_ATTR_STATE
                | abi::QP_ATTR_SQ_PSN
                | abi::QP_ATTR_TIMEOUT
                | abi::QP_ATTR_RETRY_CNT
                | abi::QP_ATTR_RNR_RETRY
                | abi::QP_ATTR_MAX_QP_RD_ATOMIC,
            qp_state: abi::QPS_RTS,
            sq_psn: path.my_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.command(abi::CMD_MODIFY_QP, &rts)?;
        Ok(())
    }

    /// `CMD_QUERY_QP`.
    ///
    /// # Errors
    /// As [`TestFrontend::command`].
    pub fn query_qp(&mut self, qp: &Qp) -> Result<abi::QpAttr, FrontendError> {
        let h = abi::Handle {
            handle: qp.qpn,
            reserved: 0,
        };
        self.command_resp(abi::CMD_QUERY_QP, &h)
    }

    /// Writes `wqe` (with `num_sge` set from `sges`) into the next send
    /// slot and rings the SQ doorbell; returns once the device took the
    /// doorbell.
    ///
    /// The device's consumer index is not checked: the caller keeps at
    /// most `sq_size` work requests outstanding.
    ///
    /// # Errors
    /// [`FrontendError::Setup`] with more SGEs than the QP has; as
    /// [`TestFrontend::doorbell`].
    pub fn post_send(
        &mut self,
        qp: &mut Qp,
        wqe: abi::SendWqe,
        sges: &[abi::Sge],
    ) -> Result<(), FrontendError> {
        check_sges(qp, sges.len())?;
        let slot = qp.sq + u64::from(qp.sq_pi % qp.sq_size) * u64::from(qp.sq_stride);
        let w = abi::SendWqe {
            num_sge: sges.len() as u8,
            ..wqe
        };
        let m = self.memory().mem();
        m.write(slot, w.as_bytes())?;
        for (i, s) in sges.iter().enumerate() {
            m.write(slot + 64 + 16 * i as u64, s.as_bytes())?;
        }
        qp.sq_pi = qp.sq_pi.wrapping_add(1);
        self.doorbell(&abi::Doorbell {
            kind: abi::DB_SQ,
            handle: qp.qpn,
            index: qp.sq_pi,
            ..Default::default()
        })?;
        Ok(())
    }

    /// Writes a receive WQE into the next receive slot and rings the RQ
    /// doorbell; returns once the device took the doorbell.
    ///
    /// # Errors
    /// As [`TestFrontend::post_send`].
    pub fn post_recv(
        &mut self,
        qp: &mut Qp,
        wr_id: u64,
        sges: &[abi::Sge],
    ) -> Result<(), FrontendError> {
        check_sges(qp, sges.len())?;
        let slot = qp.rq + u64::from(qp.rq_pi % qp.rq_size) * u64::from(qp.rq_stride);
        let w = abi::RecvWqe {
            wr_id,
            num_sge: sges.len() as u32,
            reserved: 0,
        };
        let m = self.memory().mem();
        m.write(slot, w.as_bytes())?;
        for (i, s) in sges.iter().enumerate() {
            m.write(slot + 16 + 16 * i as u64, s.as_bytes())?;
        }
        qp.rq_pi = qp.rq_pi.wrapping_add(1);
        self.doorbell(&abi::Doorbell {
            kind: abi::DB_RQ,
            handle: qp.qpn,
            index: qp.rq_pi,
            ..Default::default()
        })?;
        Ok(())
    }

    /// Takes the next CQE if the device wrote it: valid when its owner
    /// bit equals `((ci / size) & 1) ^ 1` ([`abi::Cqe`]). Advances the
    /// consumer index and writes it to the CQ's record.
    ///
    /// # Errors
    /// [`FrontendError::Mem`] if the ring is outside driver memory.
    pub fn poll_cq(&mut self, cq: &mut Cq) -> Result<Option<abi::Cqe>, FrontendError> {
        let slot = cq.ring + u64::from(cq.ci % cq.size) * size_of::<abi::Cqe>() as u64;
        let m = self.memory().mem();
        let mut c = abi::Cqe::default();
        m.read(slot, c.as_bytes_mut())?;
        let pass = ((cq.ci / cq.size) & 1) as u8 ^ 1;
        if c.owner != pass {
            return Ok(None);
        }
        // The owner byte is written last; re-read the entry now that it
        // is seen valid so no field predates it.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        m.read(slot, c.as_bytes_mut())?;
        cq.ci = cq.ci.wrapping_add(1);
        m.write(cq.db, &cq.ci.to_le_bytes())?;
        Ok(Some(c))
    }

    /// Waits up to `timeout` for the next CQE on `cq`, sleeping on
    /// completion events rather than spinning: polls, arms the CQ
    /// (`DB_CQ_ARM`), polls again (a CQE written before the arm raises no
    /// event) and waits on the event queue. Gives the event queue
    /// buffers first if it has none.
    ///
    /// Events for other CQs that arrive meanwhile are consumed.
    ///
    /// # Errors
    /// [`FrontendError::NoCompletion`] if none came in time; as
    /// [`TestFrontend::poll_cq`] and [`TestFrontend::doorbell`].
    pub fn wait_cqe(&mut self, cq: &mut Cq, timeout: Duration) -> Result<abi::Cqe, FrontendError> {
        if self.event_buffers() == 0 {
            self.post_event_buffers(8)?;
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.poll_cq(cq)? {
                return Ok(c);
            }
            self.arm_cq(cq)?;
            if let Some(c) = self.poll_cq(cq)? {
                return Ok(c);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.next_event(left)?.is_none() {
                // One last look: the CQE may have landed just now.
                return self.poll_cq(cq)?.ok_or(FrontendError::NoCompletion {
                    cqn: cq.cqn,
                    waited: timeout,
                });
            }
        }
    }

    /// Arms `cq` (`DB_CQ_ARM` at its consumer index): the next CQE
    /// written raises one `EV_COMP` event. A CQE written before the arm
    /// raises none, so poll once more after arming.
    ///
    /// # Errors
    /// As [`TestFrontend::doorbell`].
    pub fn arm_cq(&mut self, cq: &Cq) -> Result<(), FrontendError> {
        self.doorbell(&abi::Doorbell {
            kind: abi::DB_CQ_ARM,
            handle: cq.cqn,
            index: cq.ci,
            ..Default::default()
        })?;
        Ok(())
    }

    /// Every event the device has delivered so far, without waiting (the
    /// buffers go back to the device).
    ///
    /// # Errors
    /// As [`TestFrontend::next_event`].
    pub fn take_events(&mut self) -> Result<Vec<abi::Event>, FrontendError> {
        let mut evs = Vec::new();
        while let Some(ev) = self.next_event(Duration::ZERO)? {
            evs.push(ev);
        }
        Ok(evs)
    }

    /// Reads `len` bytes of driver memory at `gpa`.
    ///
    /// # Errors
    /// [`FrontendError::Mem`] outside driver memory.
    pub fn read_bytes(&self, gpa: u64, len: usize) -> Result<Vec<u8>, FrontendError> {
        let mut b = vec![0u8; len];
        self.memory().mem().read(gpa, &mut b)?;
        Ok(b)
    }

    /// Writes `data` into driver memory at `gpa`.
    ///
    /// # Errors
    /// [`FrontendError::Mem`] outside driver memory.
    pub fn write_bytes(&self, gpa: u64, data: &[u8]) -> Result<(), FrontendError> {
        self.memory().mem().write(gpa, data)?;
        Ok(())
    }
}

fn check_sges(qp: &Qp, n: usize) -> Result<(), FrontendError> {
    if n > qp.max_sge as usize {
        return Err(FrontendError::Setup(format!(
            "{n} SGEs on QP {} with {} per WQE",
            qp.qpn, qp.max_sge
        )));
    }
    Ok(())
}

/// Waits up to `timeout` until one of `fes` has an event to deliver (one
/// thread driving several devices): takes every event already delivered
/// (which also asks each device to signal the next one), and only if
/// there was none sleeps on the event queues' call eventfds. Returns the
/// events, `(index into fes, event)`; empty when none came in time. Arm
/// the CQs first ([`TestFrontend::arm_cq`]) to get completion events.
///
/// # Errors
/// As [`TestFrontend::take_events`].
pub fn wait_events(
    fes: &mut [&mut TestFrontend],
    timeout: Duration,
) -> Result<Vec<(usize, abi::Event)>, FrontendError> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut out = Vec::new();
        for (i, fe) in fes.iter_mut().enumerate() {
            if fe.event_buffers() == 0 {
                fe.post_event_buffers(16)?;
            }
            out.extend(fe.take_events()?.into_iter().map(|e| (i, e)));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if !out.is_empty() || left.is_zero() {
            return Ok(out);
        }
        let mut pfds: Vec<libc::pollfd> = fes
            .iter_mut()
            .map(|fe| libc::pollfd {
                fd: fe.queue(abi::EVENTQ).call_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: `pfds` holds `pfds.len()` valid pollfds.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
        for (fe, p) in fes.iter_mut().zip(&pfds) {
            if p.revents != 0 {
                // Consume the notification; the used ring says what came.
                let _ = fe.queue(abi::EVENTQ).call_fd().read();
            }
        }
    }
}
