//! Fuzzing harness (cargo feature `fuzzing`; not part of the device API).
//!
//! One harness for the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer)
//! and the stable `vrnic/tests/fuzz_smoke.rs` that CI runs: a [`Target`] is
//! a [`Device`] over a [`VecMemory`] with a PD, two MRs, a CQ, an SRQ and
//! five QPs (RC in RTS with its own RQ, RC in RTR on the SRQ, UC in RTS,
//! UD in RTS, UD in RTS on the SRQ), every receive queue kept full, the
//! peer's MAC learnt by ARP. It drives the device the way a driver and a
//! link do — frames to [`Device::receive`], then [`Device::poll`], then
//! [`Device::pop_tx`] and [`Device::pop_event`] drained, completions
//! consumed and receive WQEs replenished — and checks what the device
//! promises for hostile input: no panic and a bounded output per input.
//!
//! The fuzz entry points take libFuzzer's bytes: [`fuzz_receive`] (a
//! sequence of frames), [`fuzz_control`] (commands and doorbells) and
//! [`fuzz_parse`] (one frame to the parser).

use std::net::Ipv4Addr;

use crate::abi::{self, Pod};
use crate::device::{Device, DeviceConfig, Nanos};
use crate::mem::{self, DmaMemory, VecMemory};
use crate::wire::{self, Frame, Icrc};

/// First guest-physical address of the target's memory.
pub const MEM_BASE: u64 = 0x10_0000;
/// Size of the target's memory.
pub const MEM_SIZE: usize = 4 << 20;
/// The target device's MAC.
pub const MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
/// The target device's IPv4 address.
pub const IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The peer's MAC (learnt by ARP when the target is built).
pub const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
/// The peer's IPv4 address.
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// Q_Key of the UD QPs.
pub const QKEY: u32 = 0x1111_1111;
/// Most frames the device may send in answer to one input. A READ request
/// is answered with at most MR-size / path-MTU packets (1 MiB / 256 B);
/// a timer may add retransmissions of the target's own requests.
pub const MAX_TX_PER_INPUT: usize = 4096 + 1024;
/// Most events the device may queue in answer to one input.
pub const MAX_EVENTS_PER_INPUT: usize = 1024;
/// Largest frame the fuzz entry points pass on (jumbo frame).
pub const MAX_FRAME: usize = 9018;
/// First guest-physical address of the peer's memory, which packets by
/// reference and runs of a batch from the peer refer to
/// ([`crate::data`]; the target reads it as another function's).
pub const PEER_MEM_BASE: u64 = 0x4000_0000;
/// Size of the peer's memory (patterned bytes).
pub const PEER_MEM_SIZE: usize = 256 << 10;

/// The peer as the target's device sees another function of the daemon:
/// not local (frames to it are plain frames), but its memory readable, so
/// batches from it may refer to that memory.
struct PeerReach(std::sync::Arc<VecMemory>);

impl crate::link::LocalReach for PeerReach {
    fn contains(&self, _mac: &[u8; 6]) -> bool {
        false
    }
    fn memory_of(&self, mac: &[u8; 6]) -> Option<std::sync::Arc<dyn crate::data::PeerMemory>> {
        (*mac == PEER_MAC).then(|| self.0.clone() as _)
    }
}

/// Slots of every ring (SQ, RQ, SRQ); the CQ has 4 × this.
const RING: u32 = 64;
const CQ_SIZE: u32 = 4 * RING;
const PAGE_LISTS: u64 = MEM_BASE;
const CQ_RING: u64 = MEM_BASE + 0x4000;
const CQ_DB: u64 = MEM_BASE + 0x3f00;
const SRQ_RING: u64 = MEM_BASE + 0x8000;
const SRQ_DB: u64 = MEM_BASE + 0x3f80;
/// QP k's rings and record live at `QP_AREAS + k * 0x10000`.
const QP_AREAS: u64 = MEM_BASE + 0x10000;
/// MR 0: 1 MiB with every access right; receive buffers in its first half.
const MR0: u64 = MEM_BASE + (1 << 20);
const MR0_LEN: u64 = 1 << 20;
/// MR 1: 64 KiB, local write and remote read only.
const MR1: u64 = MEM_BASE + (2 << 20);
const MR1_LEN: u64 = 64 << 10;
/// Bytes of each receive WQE's buffer.
const RECV_BUF: u32 = 4096;

/// The peer the target's connected QPs talk to.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// The peer's RC QP (the target's two RC QPs are connected to it).
    pub rc_qpn: u32,
    /// The peer's UC QP.
    pub uc_qpn: u32,
    /// The peer's first PSN (the target's expected PSN).
    pub psn: u32,
    /// The target's first PSN.
    pub my_psn: u32,
    /// Path MTU enum (1 = 256 ... 5 = 4096).
    pub mtu: u32,
}

impl Default for Peer {
    /// The peer of `tests/fuzz_smoke.rs`'s exchange (a fresh device's first
    /// QPs, PSNs just before the 2^24 wrap), so that the frames it records
    /// are valid, in-sequence seed inputs for [`fuzz_receive`].
    fn default() -> Self {
        Peer {
            rc_qpn: 0x11,
            uc_qpn: 0x12,
            psn: 0xff_fff0,
            my_psn: 0x100,
            mtu: 3,
        }
    }
}

/// One QP of the target.
#[derive(Debug, Clone, Copy)]
pub struct TargetQp {
    /// QP number.
    pub qpn: u32,
    /// `QPT_*`.
    pub qp_type: u32,
    /// Takes its receive WQEs from the SRQ.
    pub on_srq: bool,
    /// The state it is brought up to (`QPS_RTR` or `QPS_RTS`).
    pub up_state: u32,
    area: u64,
    sq_pi: u32,
    rq_pi: u32,
}

impl TargetQp {
    fn sq(&self) -> u64 {
        self.area
    }
    fn rq(&self) -> u64 {
        self.area + 0x8000
    }
    fn record(&self) -> u64 {
        self.area + 0xf000
    }
}

/// A device with objects of every kind, driven like a driver would.
pub struct Target {
    /// The device under test.
    pub dev: Device,
    /// Its driver memory.
    pub mem: VecMemory,
    /// The simulated clock, ns.
    pub now: Nanos,
    /// RC (RTS, own RQ), RC (RTR, SRQ), UC (RTS), UD (RTS), UD (RTS, SRQ).
    pub qps: [TargetQp; 5],
    /// Keys of MR 0 (every access right).
    pub lkey: u32,
    /// Remote key of MR 0.
    pub rkey: u32,
    /// Remote key of MR 1 (remote read only).
    pub ro_rkey: u32,
    /// Base address (iova) of MR 0 and of MR 1.
    pub mr_base: [u64; 2],
    /// The SRQ.
    pub srqn: u32,
    peer: Peer,
    pd: u32,
    srq_pi: u32,
    cq_ci: u32,
    /// Completions consumed so far.
    pub cqes: u64,
    /// When set, frames the device sends are kept in [`Target::tx`]
    /// instead of dropped (to run a real exchange with a peer).
    pub keep_tx: bool,
    /// Frames kept while [`Target::keep_tx`] is set.
    pub tx: Vec<Vec<u8>>,
}

/// Index of each QP in [`Target::qps`].
pub mod qp {
    /// RC in RTS with its own RQ.
    pub const RC: usize = 0;
    /// RC in RTR (responder only) on the SRQ.
    pub const RC_SRQ: usize = 1;
    /// UC in RTS.
    pub const UC: usize = 2;
    /// UD in RTS.
    pub const UD: usize = 3;
    /// UD in RTS on the SRQ.
    pub const UD_SRQ: usize = 4;
}

const ALL: u32 = abi::ACCESS_LOCAL_WRITE
    | abi::ACCESS_REMOTE_WRITE
    | abi::ACCESS_REMOTE_READ
    | abi::ACCESS_REMOTE_ATOMIC;

impl Target {
    /// Builds the target; panics only if the device refuses a valid setup.
    pub fn new(peer: Peer) -> Target {
        let mem = VecMemory::new(MEM_BASE, MEM_SIZE);
        // A fixed key secret: the same input always meets the same keys.
        let cfg = DeviceConfig {
            mac: MAC,
            ipv4: IP,
            prefix_len: 24,
            ipv6: Vec::new(),
            link_mtu: if peer.mtu >= 5 { 9000 } else { 1500 },
        };
        let mut dev = Device::with_key_secret(cfg, 0x0076_726e_6963);
        let peer_mem = VecMemory::new(PEER_MEM_BASE, PEER_MEM_SIZE);
        let pattern: Vec<u8> = (0..PEER_MEM_SIZE).map(|i| (i * 7 + 3) as u8).collect();
        let _ = peer_mem.write(PEER_MEM_BASE, &pattern);
        dev.set_local_macs(Some(crate::link::LocalMacs::with(PeerReach(
            std::sync::Arc::new(peer_mem),
        ))));
        let blank = TargetQp {
            qpn: 0,
            qp_type: 0,
            on_srq: false,
            up_state: 0,
            area: 0,
            sq_pi: 0,
            rq_pi: 0,
        };
        let mut t = Target {
            dev,
            mem,
            now: 1_000_000_000,
            qps: [blank; 5],
            lkey: 0,
            rkey: 0,
            ro_rkey: 0,
            mr_base: [MR0, MR1],
            srqn: 0,
            peer,
            pd: 0,
            srq_pi: 0,
            cq_ci: 0,
            cqes: 0,
            keep_tx: false,
            tx: Vec::new(),
        };
        t.pd = handle(&t.setup_cmd(abi::CMD_ALLOC_PD, &abi::Handle::default()));
        let (lkey, rkey) = t.reg_mr(0, MR0, MR0_LEN, ALL);
        let (_, ro_rkey) = t.reg_mr(
            1,
            MR1,
            MR1_LEN,
            abi::ACCESS_LOCAL_WRITE | abi::ACCESS_REMOTE_READ,
        );
        (t.lkey, t.rkey, t.ro_rkey) = (lkey, rkey, ro_rkey);
        let cq = abi::CreateCq {
            cqe: CQ_SIZE,
            reserved: 0,
            ring: CQ_RING,
            db: CQ_DB,
        };
        let cqn = handle(&t.setup_cmd(abi::CMD_CREATE_CQ, &cq));
        let srq = abi::CreateSrq {
            pdn: t.pd,
            max_wr: RING,
            max_sge: 1,
            srq_limit: RING / 4,
            ring: SRQ_RING,
            db: SRQ_DB,
        };
        t.srqn = abi::CreateSrqResp::read_from(&t.setup_cmd(abi::CMD_CREATE_SRQ, &srq))
            .expect("CreateSrqResp")
            .srqn;
        let kinds = [
            (abi::QPT_RC, false, abi::QPS_RTS),
            (abi::QPT_RC, true, abi::QPS_RTR),
            (abi::QPT_UC, false, abi::QPS_RTS),
            (abi::QPT_UD, false, abi::QPS_RTS),
            (abi::QPT_UD, true, abi::QPS_RTS),
        ];
        for (k, (qp_type, on_srq, up_state)) in kinds.into_iter().enumerate() {
            let area = QP_AREAS + k as u64 * 0x10000;
            let c = abi::CreateQp {
                pdn: t.pd,
                qp_type,
                send_cqn: cqn,
                recv_cqn: cqn,
                sq_size: RING,
                rq_size: if on_srq { 0 } else { RING },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline: 0,
                sq_sig_all: 1,
                sq: area,
                rq: area + 0x8000,
                db: area + 0xf000,
                srqn: if on_srq { t.srqn } else { 0 },
                flags: if on_srq {
                    abi::QP_F_SQ_RECORD
                } else {
                    abi::QP_F_SQ_RECORD | abi::QP_F_RQ_RECORD
                },
            };
            let r = abi::CreateQpResp::read_from(&t.setup_cmd(abi::CMD_CREATE_QP, &c))
                .expect("CreateQpResp");
            t.qps[k] = TargetQp {
                qpn: r.qpn,
                qp_type,
                on_srq,
                up_state,
                area,
                sq_pi: 0,
                rq_pi: 0,
            };
            t.bring_up(k, peer.psn);
        }
        // The peer's MAC, as the link would teach it (a reply addressed to
        // the device is learnt).
        let arp = wire::ArpPacket {
            op: wire::ArpPacket::REPLY,
            sender_mac: PEER_MAC,
            sender_ip: PEER_IP,
            target_mac: MAC,
            target_ip: IP,
        };
        let mut f = Vec::new();
        wire::emit_arp(PEER_MAC, MAC, &arp, &mut f);
        t.dev.receive(&t.mem, &f, t.now);
        t.settle();
        t
    }

    /// The QP numbers, in [`qp`] order.
    pub fn qpns(&self) -> [u32; 5] {
        self.qps.map(|q| q.qpn)
    }

    fn setup_cmd<T: Pod>(&mut self, opcode: u16, body: &T) -> Vec<u8> {
        let (status, resp) = self.command(opcode, body);
        assert_eq!(status, 0, "setup command {opcode} failed");
        resp
    }

    /// Sends one well-formed command; returns its status and response body.
    pub fn command<T: Pod>(&mut self, opcode: u16, body: &T) -> (u32, Vec<u8>) {
        let mut req = abi::CmdHeader {
            opcode,
            ctx: 0,
            len: size_of::<T>() as u32,
        }
        .as_bytes()
        .to_vec();
        req.extend_from_slice(body.as_bytes());
        let mut resp = [0u8; 8 + abi::MAX_CMD_BODY];
        let n = self.dev.control(&self.mem, &req, &mut resp, self.now);
        let status =
            abi::RespHeader::read_from(&resp[..n.min(resp.len())]).map_or(u32::MAX, |h| h.status);
        (status, resp[8.min(n)..n.min(resp.len())].to_vec())
    }

    fn reg_mr(&mut self, k: u64, base: u64, len: u64, access: u32) -> (u32, u32) {
        let list = PAGE_LISTS + k * 0x2000;
        let npages = len.div_ceil(4096);
        for i in 0..npages {
            self.mem
                .write(list + i * 8, &(base + i * 4096).to_le_bytes())
                .expect("page list inside memory");
        }
        let r = abi::RegMr {
            pdn: self.pd,
            access,
            iova: base,
            length: len,
            page_shift: 12,
            npages: npages as u32,
            page_list: list,
        };
        let k = abi::MrKeys::read_from(&self.setup_cmd(abi::CMD_REG_MR, &r)).expect("MrKeys");
        (k.lkey, k.rkey)
    }

    /// RESET → INIT → RTR (→ RTS) for QP `k`, expecting PSN `rq_psn`.
    fn bring_up(&mut self, k: usize, rq_psn: u32) {
        let q = self.qps[k];
        let peer = self.peer;
        let base = abi::QpAttr {
            qpn: q.qpn,
            ..Default::default()
        };
        let ud = q.qp_type == abi::QPT_UD;
        let init = abi::QpAttr {
            attr_mask: abi::QP_ATTR_STATE
                | abi::QP_ATTR_PKEY_INDEX
                | abi::QP_ATTR_PORT
                | if ud {
                    abi::QP_ATTR_QKEY
                } else {
                    abi::QP_ATTR_ACCESS_FLAGS
                },
            qp_state: abi::QPS_INIT,
            port_num: 1,
            qkey: QKEY,
            qp_access_flags: ALL,
            ..base
        };
        let rtr = if ud {
            abi::QpAttr {
                attr_mask: abi::QP_ATTR_STATE,
                qp_state: abi::QPS_RTR,
                ..base
            }
        } else {
            let rc = q.qp_type == abi::QPT_RC;
            abi::QpAttr {
                attr_mask: abi::QP_ATTR_STATE
                    | abi::QP_ATTR_AV
                    | abi::QP_ATTR_PATH_MTU
                    | abi::QP_ATTR_DEST_QPN
                    | abi::QP_ATTR_RQ_PSN
                    | if rc {
                        abi::QP_ATTR_MAX_DEST_RD_ATOMIC | abi::QP_ATTR_MIN_RNR_TIMER
                    } else {
                        0
                    },
                qp_state: abi::QPS_RTR,
                path_mtu: peer.mtu,
                dest_qp_num: if rc { peer.rc_qpn } else { peer.uc_qpn },
                rq_psn,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                dgid: PEER_IP.to_ipv6_mapped().octets(),
                sgid_index: 1,
                is_global: 1,
                hop_limit: 64,
                ..base
            }
        };
        let rts = abi::QpAttr {
            attr_mask: abi::QP_ATTR_STATE
                | abi::QP_ATTR_SQ_PSN
                | if q.qp_type == abi::QPT_RC {
                    abi::QP_ATTR_TIMEOUT
                        | abi::QP_ATTR_RETRY_CNT
                        | abi::QP_ATTR_RNR_RETRY
                        | abi::QP_ATTR_MAX_QP_RD_ATOMIC
                } else {
                    0
                },
            qp_state: abi::QPS_RTS,
            sq_psn: peer.my_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            ..base
        };
        self.setup_cmd(abi::CMD_MODIFY_QP, &init);
        self.setup_cmd(abi::CMD_MODIFY_QP, &rtr);
        if q.up_state == abi::QPS_RTS {
            self.setup_cmd(abi::CMD_MODIFY_QP, &rts);
        }
    }

    /// The state of QP `k` as `CMD_QUERY_QP` reports it.
    pub fn qp_state(&mut self, k: usize) -> u32 {
        let h = abi::Handle {
            handle: self.qps[k].qpn,
            reserved: 0,
        };
        let (status, r) = self.command(abi::CMD_QUERY_QP, &h);
        match abi::QpAttr::read_from(&r) {
            Some(a) if status == 0 => a.qp_state,
            _ => u32::MAX,
        }
    }

    /// Brings every QP that left its state (ERR after a fatal error, SQE)
    /// back through RESET, the RC/UC ones expecting PSN `rq_psn`, and fills
    /// its receive queue again. Returns how many were revived.
    pub fn revive(&mut self, rq_psn: u32) -> usize {
        let mut n = 0;
        for k in 0..self.qps.len() {
            if self.qp_state(k) == self.qps[k].up_state {
                continue;
            }
            let reset = abi::QpAttr {
                qpn: self.qps[k].qpn,
                attr_mask: abi::QP_ATTR_STATE,
                qp_state: abi::QPS_RESET,
                ..Default::default()
            };
            self.setup_cmd(abi::CMD_MODIFY_QP, &reset);
            self.qps[k].sq_pi = 0;
            self.qps[k].rq_pi = 0;
            self.bring_up(k, rq_psn);
            n += 1;
        }
        self.settle();
        n
    }

    /// Posts a send WQE with one SGE on QP `k` and rings its doorbell.
    pub fn post_send(&mut self, k: usize, wqe: abi::SendWqe, sge: abi::Sge) {
        let q = &mut self.qps[k];
        let stride = u64::from(abi::sq_stride(1, 0));
        let slot = q.sq() + u64::from(q.sq_pi % RING) * stride;
        let w = abi::SendWqe { num_sge: 1, ..wqe };
        let _ = mem::write_obj(&self.mem, slot, &w);
        let _ = mem::write_obj(&self.mem, slot + 64, &sge);
        q.sq_pi = q.sq_pi.wrapping_add(1);
        let db = abi::Doorbell {
            kind: abi::DB_SQ,
            handle: q.qpn,
            index: q.sq_pi,
            ..Default::default()
        };
        self.dev.doorbell(&self.mem, &db, self.now);
    }

    /// A doorbell record step on QP `k` ([`REC_DB_RECORD`]): `index`
    /// written to its QP record (the RQ's producer index when `step` has
    /// bit 7 set, else the SQ's), then `step % 3`: 0 the device starts
    /// polling, 1 one polling round over the watched records, 2 polling
    /// ends.
    pub fn db_record(&mut self, k: usize, index: u32, step: u8) {
        let offset = if step & 0x80 != 0 {
            abi::QP_REC_RQ_PI
        } else {
            abi::QP_REC_SQ_PI
        };
        let at = self.qps[k].record() + offset;
        let _ = self.mem.write(at, &index.to_le_bytes());
        match step % 3 {
            0 => self.dev.begin_record_polling(),
            1 => {
                self.dev.poll_records(&self.mem, self.now);
            }
            _ => {
                self.dev.end_record_polling(&self.mem, self.now);
            }
        }
    }

    /// Posts RC requests (SEND, WRITE, READ, fetch-and-add, empty SEND) to
    /// the peer's memory at `remote_addr`/`rkey`, so that responses have
    /// work to complete.
    /// Skipped (returns false) when the send queue has no room for them.
    pub fn post_sample_requests(&mut self, remote_addr: u64, rkey: u32) -> bool {
        let q = self.qps[qp::RC];
        let rec: abi::Handle = mem::read_obj(&self.mem, q.record()).unwrap_or_default();
        if q.sq_pi.wrapping_sub(rec.handle) > RING - 5 {
            return false;
        }
        let ops = [
            (abi::WR_SEND, 3000u32),
            (abi::WR_RDMA_WRITE, 2000),
            (abi::WR_RDMA_READ, 2500),
            (abi::WR_ATOMIC_FETCH_AND_ADD, 8),
            (abi::WR_SEND, 0),
        ];
        for (i, (opcode, len)) in ops.into_iter().enumerate() {
            let wqe = abi::SendWqe {
                wr_id: 0x1000 + i as u64,
                opcode,
                send_flags: abi::SEND_SIGNALED,
                remote_addr,
                rkey,
                compare_add: 1,
                ..Default::default()
            };
            let sge = abi::Sge {
                addr: MR0 + (MR0_LEN / 2) + i as u64 * 8192,
                length: len,
                lkey: self.lkey,
            };
            self.post_send(qp::RC, wqe, sge);
        }
        true
    }

    /// Consumes every completion (bounded by the CQ size).
    fn drain_cq(&mut self) {
        for _ in 0..CQ_SIZE {
            let slot = CQ_RING + u64::from(self.cq_ci % CQ_SIZE) * 32;
            let Ok(c) = mem::read_obj::<abi::Cqe>(&self.mem, slot) else {
                return;
            };
            if c.owner != ((self.cq_ci / CQ_SIZE) & 1) as u8 ^ 1 {
                return;
            }
            self.cq_ci = self.cq_ci.wrapping_add(1);
            self.cqes += 1;
            let h = abi::Handle {
                handle: self.cq_ci,
                reserved: 0,
            };
            let _ = mem::write_obj(&self.mem, CQ_DB, &h);
        }
    }

    fn recv_wqe(&self, slot: u64, wr_id: u64, buf: u64) {
        let w = abi::RecvWqe {
            wr_id,
            num_sge: 1,
            reserved: 0,
        };
        let sge = abi::Sge {
            addr: buf,
            length: RECV_BUF,
            lkey: self.lkey,
        };
        let _ = mem::write_obj(&self.mem, slot, &w);
        let _ = mem::write_obj(&self.mem, slot + 16, &sge);
    }

    /// Tops every receive queue and the SRQ up to full.
    fn replenish(&mut self) {
        let stride = u64::from(abi::rq_stride(1));
        for k in 0..self.qps.len() {
            let q = self.qps[k];
            if q.on_srq {
                continue;
            }
            let rec: abi::Handle = mem::read_obj(&self.mem, q.record()).unwrap_or_default();
            let ci = rec.reserved;
            let mut pi = q.rq_pi;
            // Never more than RING outstanding, whatever the record says.
            if pi.wrapping_sub(ci) > RING {
                continue;
            }
            while pi.wrapping_sub(ci) < RING {
                let buf = MR0 + k as u64 * 0x10000 + u64::from(pi % 8) * u64::from(RECV_BUF);
                self.recv_wqe(q.rq() + u64::from(pi % RING) * stride, u64::from(pi), buf);
                pi = pi.wrapping_add(1);
            }
            if pi != q.rq_pi {
                self.qps[k].rq_pi = pi;
                let db = abi::Doorbell {
                    kind: abi::DB_RQ,
                    handle: q.qpn,
                    index: pi,
                    ..Default::default()
                };
                self.dev.doorbell(&self.mem, &db, self.now);
            }
        }
        let rec: abi::Handle = mem::read_obj(&self.mem, SRQ_DB).unwrap_or_default();
        let ci = rec.handle;
        let mut pi = self.srq_pi;
        if pi.wrapping_sub(ci) <= RING {
            while pi.wrapping_sub(ci) < RING {
                let buf = MR0 + 0x50000 + u64::from(pi % 8) * u64::from(RECV_BUF);
                self.recv_wqe(SRQ_RING + u64::from(pi % RING) * stride, u64::from(pi), buf);
                pi = pi.wrapping_add(1);
            }
            if pi != self.srq_pi {
                self.srq_pi = pi;
                let db = abi::Doorbell {
                    kind: abi::DB_SRQ,
                    handle: self.srqn,
                    index: pi,
                    ..Default::default()
                };
                self.dev.doorbell(&self.mem, &db, self.now);
            }
        }
    }

    /// Drains the device's output, consumes completions, refills receive
    /// queues; returns the frames the device sent. Panics if one input made
    /// the device send or queue more than the bounds.
    pub fn settle(&mut self) -> usize {
        let tx = self.drain_tx();
        self.drain_events();
        self.drain_cq();
        self.replenish();
        tx + self.drain_tx()
    }

    fn drain_tx(&mut self) -> usize {
        let mut n = 0;
        while let Some(f) = self.dev.pop_tx() {
            assert!(f.len() <= 16384, "the device sent a {}-byte frame", f.len());
            n += 1;
            if self.keep_tx {
                self.tx.push(f);
            }
            assert!(
                n <= MAX_TX_PER_INPUT,
                "one input made more than {MAX_TX_PER_INPUT} frames"
            );
        }
        n
    }

    fn drain_events(&mut self) {
        let mut n = 0;
        while self.dev.pop_event().is_some() {
            n += 1;
            assert!(
                n <= MAX_EVENTS_PER_INPUT,
                "one input queued more than {MAX_EVENTS_PER_INPUT} events"
            );
        }
    }

    /// One frame from the link at the current time, then the device's
    /// timers; everything it sends is drained. Returns the frames sent.
    pub fn receive(&mut self, frame: &[u8]) -> usize {
        self.receive_with(frame, Icrc::Needed)
    }

    /// [`Target::receive`] of a frame that comes `icrc`: with
    /// [`Icrc::Unneeded`], as from another function of the daemon (its
    /// ICRC unchecked, and it may be a batch, [`crate::batch::gso`]).
    pub fn receive_with(&mut self, frame: &[u8], icrc: Icrc) -> usize {
        self.dev.receive_frame(&self.mem, frame, icrc, self.now);
        let mut n = self.settle();
        self.dev.poll(&self.mem, self.now);
        n += self.settle();
        n
    }

    /// Advances the clock by `ns` and runs the device's timers.
    pub fn advance(&mut self, ns: Nanos) -> usize {
        self.now = self.now.saturating_add(ns);
        self.dev.poll(&self.mem, self.now);
        self.settle()
    }

    /// One control command (arbitrary bytes); returns the response length.
    pub fn control(&mut self, req: &[u8]) -> usize {
        let mut resp = [0u8; 8 + abi::MAX_CMD_BODY];
        let n = self.dev.control(&self.mem, req, &mut resp, self.now);
        assert!(
            (8..=resp.len()).contains(&n),
            "a command got a {n}-byte response"
        );
        self.settle();
        n
    }

    /// One doorbell (arbitrary fields).
    pub fn doorbell(&mut self, db: &abi::Doorbell) {
        self.dev.doorbell(&self.mem, db, self.now);
        self.settle();
    }
}

fn handle(r: &[u8]) -> u32 {
    abi::Handle::read_from(r).map_or(0, |h| h.handle)
}

/// Makes the IPv4 header checksum and the ICRC of `frame` right (as far as
/// the frame has them), so that a mutated frame reaches the transport.
pub fn fix_checksums(frame: &mut [u8]) {
    const ETH: usize = 14;
    if frame.len() < ETH + 20 {
        return;
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let ip_len = match ethertype {
        0x0800 => {
            let ihl = usize::from(frame[ETH] & 0xf) * 4;
            if ihl < 20 || frame.len() < ETH + ihl {
                return;
            }
            let hdr = &mut frame[ETH..ETH + ihl];
            hdr[10] = 0;
            hdr[11] = 0;
            let mut sum = 0u32;
            for w in hdr.chunks(2) {
                sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            hdr[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            usize::from(u16::from_be_bytes([frame[ETH + 2], frame[ETH + 3]]))
        }
        0x86dd if frame.len() >= ETH + 40 => {
            40 + usize::from(u16::from_be_bytes([frame[ETH + 4], frame[ETH + 5]]))
        }
        _ => return,
    };
    let end = (ETH + ip_len).min(frame.len());
    if end < ETH + wire::ICRC_LEN {
        return;
    }
    let (covered, trailer) = frame[ETH..end].split_at_mut(end - ETH - wire::ICRC_LEN);
    trailer.copy_from_slice(&wire::icrc(covered).to_be_bytes());
}

/// Record flag: fix the checksums ([`fix_checksums`]) before delivery.
pub const REC_FIX: u8 = 1;
/// Record flag: bring fallen QPs back ([`Target::revive`]) first.
pub const REC_REVIVE: u8 = 2;
/// Record flags, bits 2-4: advance the clock by 4^k µs (k = 1..7) before
/// delivery, so timers fire between frames.
pub const REC_TIME_SHIFT: u8 = 2;
/// Record flag: deliver the frame as from another function of the daemon
/// ([`Target::receive_with`] [`Icrc::Unneeded`]; it may be a batch).
pub const REC_LOCAL: u8 = 0x20;

/// Encodes frames as one [`fuzz_receive`] input: per frame a flags byte
/// (`REC_*`) and a little-endian u16 length, then the bytes.
pub fn encode_records(frames: &[(u8, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (flags, f) in frames {
        let f = &f[..f.len().min(usize::from(u16::MAX))];
        out.push(*flags);
        out.extend_from_slice(&(f.len() as u16).to_le_bytes());
        out.extend_from_slice(f);
    }
    out
}

/// The `receive_frame` fuzz target: a fresh [`Target`] with RC requests in
/// flight receives up to 64 frames decoded as in [`encode_records`] (a
/// truncated last record is delivered as it is).
pub fn fuzz_receive(data: &[u8]) {
    let mut t = Target::new(Peer::default());
    t.post_sample_requests(0x10_0000, 0x1234);
    t.settle();
    let mut rest = data;
    for _ in 0..64 {
        let [flags, l0, l1, tail @ ..] = rest else {
            break;
        };
        let len = usize::from(u16::from_le_bytes([*l0, *l1]))
            .min(tail.len())
            .min(MAX_FRAME);
        let mut frame = tail[..len].to_vec();
        rest = &tail[len..];
        if flags & REC_REVIVE != 0 {
            t.revive(Peer::default().psn);
        }
        let k = (flags >> REC_TIME_SHIFT) & 7;
        if k != 0 {
            t.advance(1000 << (2 * u32::from(k)));
        }
        if flags & REC_FIX != 0 {
            fix_checksums(&mut frame);
        }
        let icrc = if flags & REC_LOCAL != 0 {
            Icrc::Unneeded
        } else {
            Icrc::Needed
        };
        t.receive_with(&frame, icrc);
    }
}

/// Record kind of [`fuzz_control`]: a doorbell.
pub const REC_DOORBELL: u8 = 0xdb;
/// Record kind of [`fuzz_control`]: a send WQE written into a QP's SQ in
/// the fake guest memory, then its doorbell.
pub const REC_WQE: u8 = 0x5e;

/// Record kind of [`fuzz_control`]: a step of doorbell records
/// ([`Target::db_record`]).
pub const REC_DB_RECORD: u8 = 0x5a;

/// The `control` fuzz target: up to 64 records `[kind, len, bytes...]`;
/// kind [`REC_DOORBELL`] is a doorbell (16 bytes, zero-padded),
/// [`REC_WQE`] a send WQE (`[qp index, SendWqe (64 bytes), Sge (16
/// bytes)]`, zero-padded; the QP index taken modulo the target's five QPs)
/// posted on one of the target's QPs, [`REC_DB_RECORD`] a doorbell record step
/// (`[qp index, producer index (le32), step]`, zero-padded), anything
/// else a control command of `len` bytes.
pub fn fuzz_control(data: &[u8]) {
    let mut t = Target::new(Peer::default());
    let mut rest = data;
    for _ in 0..64 {
        let [kind, len, tail @ ..] = rest else {
            break;
        };
        let len = usize::from(*len).min(tail.len());
        let bytes = &tail[..len];
        rest = &tail[len..];
        if *kind == REC_DOORBELL {
            let mut b = [0u8; size_of::<abi::Doorbell>()];
            let n = bytes.len().min(b.len());
            b[..n].copy_from_slice(&bytes[..n]);
            if let Some(db) = abi::Doorbell::read_from(&b) {
                t.doorbell(&db);
            }
        } else if *kind == REC_WQE {
            let mut b = [0u8; 1 + size_of::<abi::SendWqe>() + size_of::<abi::Sge>()];
            let n = bytes.len().min(b.len());
            b[..n].copy_from_slice(&bytes[..n]);
            let k = usize::from(b[0]) % t.qps.len();
            let w = &b[1..];
            if let (Some(wqe), Some(sge)) = (
                abi::SendWqe::read_from(&w[..size_of::<abi::SendWqe>()]),
                abi::Sge::read_from(&w[size_of::<abi::SendWqe>()..]),
            ) {
                t.post_send(k, wqe, sge);
            }
        } else if *kind == REC_DB_RECORD {
            let mut b = [0u8; 6];
            let n = bytes.len().min(b.len());
            b[..n].copy_from_slice(&bytes[..n]);
            let k = usize::from(b[0]) % t.qps.len();
            let index = u32::from_le_bytes([b[1], b[2], b[3], b[4]]);
            t.db_record(k, index, b[5]);
        } else {
            t.control(bytes);
        }
        t.advance(1_000_000);
    }
}

/// The `parse_frame` fuzz target: arbitrary bytes to the parser; a RoCE
/// packet it accepts is emitted again and must parse to the same headers
/// and payload. Its payload also goes to the IB CM MAD parser (a MAD on
/// QP1 is a UD SEND's whole payload).
pub fn fuzz_parse(data: &[u8]) {
    // emit_frame's callers keep packets MTU-sized (it debug-asserts that).
    if data.len() > MAX_FRAME {
        let _ = wire::parse_frame(data);
        return;
    }
    let Ok(Frame::Roce(p)) = wire::parse_frame(data) else {
        return;
    };
    let _ = wire::Mad::parse(p.payload).and_then(|m| wire::CmMessage::parse(&m));
    let mut out = Vec::new();
    wire::emit_frame(&p.hdr, p.payload, &mut out);
    match wire::parse_frame(&out) {
        Ok(Frame::Roce(q)) => {
            assert_eq!(q.hdr.bth, p.hdr.bth, "BTH after a round trip");
            assert_eq!(q.payload, p.payload, "payload after a round trip");
        }
        other => panic!("a parsed packet, emitted again, does not parse: {other:?}"),
    }
}
