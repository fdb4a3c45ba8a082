//! Queue pairs: `CMD_CREATE_QP`, `CMD_QUERY_QP`, `CMD_DESTROY_QP`
//! (`ibv_create_qp(3)`, `ibv_query_qp(3)`, `ibv_destroy_qp(3)`).
//! `CMD_MODIFY_QP` is [`super::modify_qp`].
//!
//! `CMD_CREATE_QP` runs one function per check, as rxe's `rxe_qp_chk_init`
//! and `rxe_qp_chk_cap` do, in this order (the first failing check gives
//! the status): the QP type, the objects it names, its SRQ, its ring
//! sizes, its capabilities, the device's limits, then the driver memory
//! of its rings and doorbell record.
//!
//! The GSI QP (`QPT_GSI`, the kernel's `IB_QPT_GSI`) is a UD QP numbered
//! [`abi::GSI_QPN`], one per device: any context of the function may
//! create it, the first to ask gets it, and a second `CMD_CREATE_QP` of
//! the type while it lives is `STATUS_EBUSY` (the guest agent, or a guest
//! kernel driver's MAD layer, is meant to own it and run the CM for every
//! program of the function). Its number's slot in the QP table is kept
//! for it ([`crate::verbs::table::HandleSpace::fixed`]), so no other QP
//! ever takes number 1 or its place.

use super::*;
use crate::transport::requester::ReqState;
use crate::transport::responder::RespState;
use crate::verbs::qp::Ring;

/// The ring layout of a QP being created: strides from its SGE and inline
/// capabilities ([`abi::sq_stride`], [`abi::rq_stride`]) and the inline
/// bytes its SQ stride holds.
struct QpLayout {
    sq_stride: u32,
    rq_stride: u32,
    max_inline: u32,
}

impl QpLayout {
    fn of(c: &abi::CreateQp) -> QpLayout {
        let sq_stride = abi::sq_stride(c.max_send_sge, c.max_inline);
        QpLayout {
            sq_stride,
            rq_stride: abi::rq_stride(c.max_recv_sge),
            max_inline: sq_stride - size_of::<abi::SendWqe>() as u32,
        }
    }
}

/// The QP type (RC, UC, UD or GSI): any other is `EOPNOTSUPP`.
fn check_qp_type(c: &abi::CreateQp) -> Result<abi::QpType, CommandError> {
    abi::QpType::try_from(c.qp_type).map_err(|_| CommandError::NotSupported { what: "QP type" })
}

/// A ring size: a power of two up to [`MAX_QP_WR`].
fn ring_size_ok(n: u32) -> bool {
    n > 0 && n.is_power_of_two() && n <= MAX_QP_WR
}

/// The SQ and RQ sizes; with an SRQ the QP has no receive ring of its own
/// (`rq_size` 0).
fn check_qp_ring_sizes(c: &abi::CreateQp) -> Result<(), CommandError> {
    if !ring_size_ok(c.sq_size) {
        return Err(CommandError::invalid("SQ size"));
    }
    let rq_ok = if c.srqn != 0 {
        c.rq_size == 0
    } else {
        ring_size_ok(c.rq_size)
    };
    if !rq_ok {
        return Err(CommandError::invalid("RQ size"));
    }
    Ok(())
}

/// The SGE and inline capabilities ([`MAX_SGE`], [`MAX_INLINE`]) and the
/// flags: known ones only, and no RQ record without an RQ.
fn check_qp_caps(c: &abi::CreateQp) -> Result<(), CommandError> {
    if c.max_send_sge > MAX_SGE || c.max_recv_sge > MAX_SGE {
        return Err(CommandError::invalid("QP max SGEs"));
    }
    if c.max_inline > MAX_INLINE {
        return Err(CommandError::invalid("QP max inline"));
    }
    if c.flags & !abi::QP_F_ALL != 0 || (c.flags & abi::QP_F_RQ_RECORD != 0 && c.srqn != 0) {
        return Err(CommandError::invalid("QP flags"));
    }
    Ok(())
}

/// The driver memory of the SQ and (without an SRQ) the RQ.
fn probe_qp_rings(
    mem: &dyn DmaMemory,
    c: &abi::CreateQp,
    layout: &QpLayout,
) -> Result<(), CommandError> {
    probe(mem, c.sq, c.sq_size as u64 * layout.sq_stride as u64)?;
    if c.srqn == 0 {
        probe(mem, c.rq, c.rq_size as u64 * layout.rq_stride as u64)?;
    }
    Ok(())
}

/// The doorbell record ([`abi::qp_record_len`] bytes): probed, then
/// zeroed (the QP's indices start at 0).
fn init_qp_record(mem: &dyn DmaMemory, c: &abi::CreateQp) -> Result<(), CommandError> {
    let record_len = abi::qp_record_len(c.flags);
    probe(mem, c.db, record_len)?;
    zero_record(mem, c.db, record_len as usize)
}

/// QP `qpn` as `c` creates it, in the reset state.
fn new_qp(
    qpn: u32,
    c: &abi::CreateQp,
    qp_type: abi::QpType,
    layout: &QpLayout,
    path_mtu: u32,
) -> Qp {
    Qp {
        qpn,
        pdn: c.pdn,
        qp_type,
        state: abi::QpState::Reset,
        send_cqn: c.send_cqn,
        recv_cqn: c.recv_cqn,
        sq_sig_all: c.sq_sig_all != 0,
        srqn: c.srqn,
        sq: Ring {
            gpa: c.sq,
            size: c.sq_size,
            stride: layout.sq_stride,
        },
        rq: Ring {
            gpa: if c.srqn == 0 { c.rq } else { 0 },
            size: c.rq_size,
            stride: layout.rq_stride,
        },
        max_send_sge: c.max_send_sge.max(1),
        max_recv_sge: c.max_recv_sge.max(1),
        max_inline: layout.max_inline,
        record: c.db,
        sq_record: c.flags & abi::QP_F_SQ_RECORD != 0,
        rq_record: c.flags & abi::QP_F_RQ_RECORD != 0,
        attr: abi::QpAttr {
            qpn,
            path_mtu,
            port_num: 1,
            ..Default::default()
        },
        req: ReqState::default(),
        resp: RespState::default(),
        stats: Default::default(),
        in_flight_counted: 0,
        to_wire: true,
    }
}

impl Device {
    /// `CMD_CREATE_QP`: the checks in order (module documentation), then
    /// the QP in the reset state.
    pub(super) fn create_qp(
        &mut self,
        mem: &dyn DmaMemory,
        ctx: u16,
        c: abi::CreateQp,
    ) -> Result<abi::CreateQpResp, CommandError> {
        let qp_type = check_qp_type(&c)?;
        self.check_qp_objects(ctx, &c)?;
        self.check_qp_srq(ctx, &c)?;
        check_qp_ring_sizes(&c)?;
        check_qp_caps(&c)?;
        self.check_qp_resources(&c)?;
        let layout = QpLayout::of(&c);
        probe_qp_rings(mem, &c, &layout)?;
        init_qp_record(mem, &c)?;
        // UD has no PATH_MTU attribute: its messages may fill the port's
        // active MTU, as on rxe and hardware RNICs.
        let path_mtu = if qp_type.is_datagram() {
            self.active_mtu()
        } else {
            3
        };
        let make = |qpn| new_qp(qpn, &c, qp_type, &layout, path_mtu);
        let qpn = if qp_type == abi::QpType::Gsi {
            // check_qp_resources left room for one more QP: only a live
            // GSI QP can hold its number.
            self.qps
                .insert_fixed(make)
                .ok_or(CommandError::InUse(Object::Qp(abi::GSI_QPN)))?
        } else {
            self.qps
                .insert_with(0, make)
                .ok_or(CommandError::no_resources("QP numbers"))?
        };
        Ok(abi::CreateQpResp {
            qpn,
            sq_stride: layout.sq_stride,
            rq_stride: layout.rq_stride,
            max_inline: layout.max_inline,
        })
    }

    /// The PD and both CQs must be the context's.
    fn check_qp_objects(&self, ctx: u16, c: &abi::CreateQp) -> Result<(), CommandError> {
        if !self.owns_pd(ctx, c.pdn) {
            return Err(CommandError::NotFound(Object::Pd(c.pdn)));
        }
        for cqn in [c.send_cqn, c.recv_cqn] {
            if !self.owns_cq(ctx, cqn) {
                return Err(CommandError::NotFound(Object::Cq(cqn)));
            }
        }
        Ok(())
    }

    /// An SRQ, if any (`srqn` not 0), must be the context's and in the
    /// QP's PD.
    fn check_qp_srq(&self, ctx: u16, c: &abi::CreateQp) -> Result<(), CommandError> {
        if c.srqn == 0 {
            return Ok(());
        }
        if !self.owns_srq(ctx, c.srqn) {
            return Err(CommandError::NotFound(Object::Srq(c.srqn)));
        }
        let srq = self
            .res
            .srqs
            .get(c.srqn)
            .ok_or(CommandError::NotFound(Object::Srq(c.srqn)))?;
        if srq.pdn != c.pdn {
            return Err(CommandError::invalid("SRQ (of another PD)"));
        }
        Ok(())
    }

    /// The device's limits: [`MAX_QP`] QPs and [`MAX_TOTAL_WR`] ring
    /// entries.
    fn check_qp_resources(&self, c: &abi::CreateQp) -> Result<(), CommandError> {
        if self.qps.len() >= MAX_QP {
            return Err(CommandError::no_resources("QPs"));
        }
        if !self.ring_entries_fit(c.sq_size, c.rq_size) {
            return Err(CommandError::no_resources("ring entries"));
        }
        Ok(())
    }

    /// `CMD_QUERY_QP` of QP `qpn`: its attributes and state.
    pub(super) fn query_qp(&self, ctx: u16, qpn: u32) -> Result<abi::QpAttr, CommandError> {
        if !self.owns_qp(ctx, qpn) {
            return Err(CommandError::NotFound(Object::Qp(qpn)));
        }
        let qp = self
            .qps
            .get(qpn)
            .ok_or(CommandError::NotFound(Object::Qp(qpn)))?;
        let mut a = qp.attr;
        a.qpn = qp.qpn;
        a.qp_state = qp.state.into();
        Ok(a)
    }

    /// `CMD_DESTROY_QP` of QP `qpn` ([`Device::remove_qp`]).
    pub(super) fn destroy_qp(&mut self, ctx: u16, qpn: u32) -> Result<(), CommandError> {
        if !self.owns_qp(ctx, qpn) {
            return Err(CommandError::NotFound(Object::Qp(qpn)));
        }
        self.remove_qp(qpn)
            .ok_or(CommandError::NotFound(Object::Qp(qpn)))
    }

    /// Removes QP `qpn` (`CMD_DESTROY_QP`, `CMD_CLOSE_CTX`): its responder
    /// resources released and the watch of its record ended (the record
    /// may be gone). `None` when there is no such QP.
    pub(in crate::device) fn remove_qp(&mut self, qpn: u32) -> Option<()> {
        let mut qp = self.qps.remove(qpn)?;
        qp.resp.release(&mut self.res.out);
        self.res.bytes_in_flight = self
            .res
            .bytes_in_flight
            .saturating_sub(qp.in_flight_counted);
        if qp.in_flight_counted > 0 {
            self.res.qps_in_flight = self.res.qps_in_flight.saturating_sub(1);
        }
        self.watch.forget(qpn);
        Some(())
    }
}
