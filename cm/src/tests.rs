//! Two CMs wired in memory, a simulated clock, and a stranger.

use super::*;
use crate::timing::NS_PER_MS;
use proptest::prelude::*;
use std::net::Ipv4Addr;
use vrnic_wire::{
    msg_response, private_data_len, rej_reason, sidr_status, CmDreq, CmMessage, CmMra, CmRej,
    CmRep, CmRtu, CmSidrRep, Gid, Mad,
};

const SID: u64 = 0x0106_0000_0000_4791;
const MS: u64 = NS_PER_MS;

fn gid(last: u8) -> Gid {
    Gid::from_ip(Ipv4Addr::new(10, 0, 0, last).into())
}

fn cm(last: u8, seed: u64) -> Cm {
    Cm::new(PortIdentity {
        gid: gid(last),
        ca_guid: ca_guid_from_mac([2, 0, 0, 0, 0, last]),
        ca_ack_delay: 15,
        seed,
    })
}

fn src(c: &Cm) -> Source {
    Source {
        gid: c.port().gid,
        qpn: 1,
        pkey_index: 0,
    }
}

/// Moves every MAD `from` has for `to`'s GID into `to`; returns how many.
fn shuttle(now: u64, from: &mut Cm, to: &mut Cm) -> usize {
    let s = src(from);
    let mut n = 0;
    while let Some(o) = from.pop_mad() {
        assert_eq!(o.dest_qpn, 1);
        if o.to_gid == to.port().gid {
            to.handle_mad(now, s, &o.mad);
            n += 1;
        }
    }
    n
}

fn drop_mads(c: &mut Cm) -> usize {
    let mut n = 0;
    while c.pop_mad().is_some() {
        n += 1;
    }
    n
}

fn events(c: &mut Cm) -> Vec<CmEvent> {
    std::iter::from_fn(|| c.pop_event()).collect()
}

fn req_params(to: Gid, private: &[u8]) -> ReqParams {
    ReqParams {
        service_id: SID,
        qpn: 0x11,
        starting_psn: 0x123,
        uc: false,
        responder_resources: 4,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: false,
        flow_control: true,
        remote_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
        local_cm_response_timeout: CMA_CM_RESPONSE_TIMEOUT,
        max_cm_retries: CMA_MAX_CM_RETRIES,
        path: PathParams {
            remote_gid: to,
            mtu: 3,
            packet_life_time: CMA_IBOE_PACKET_LIFETIME,
            flow_label: 0x1234,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            rate: 0,
        },
        private_data: private.to_vec(),
    }
}

fn rep_params(private: &[u8]) -> RepParams {
    RepParams {
        qpn: 0x22,
        starting_psn: 0x456,
        responder_resources: 4,
        initiator_depth: 4,
        failover_accepted: 0,
        flow_control: true,
        rnr_retry_count: 7,
        srq: false,
        private_data: private.to_vec(),
    }
}

/// REQ delivered; returns (active id, passive id).
fn request(now: u64, a: &mut Cm, b: &mut Cm, private: &[u8]) -> (CmId, CmId) {
    let ida = a.connect(now, &req_params(b.port().gid, private)).unwrap();
    assert_eq!(shuttle(now, a, b), 1);
    let ev = events(b);
    assert_eq!(ev.len(), 1, "{ev:?}");
    let CmEventKind::ReqReceived {
        listener,
        req,
        source,
    } = &ev[0].kind
    else {
        panic!("{ev:?}")
    };
    assert_eq!(*listener, SID);
    assert_eq!(source.gid, a.port().gid);
    assert_eq!(&req.private_data[..private.len()], private);
    assert_eq!(req.local_qpn, 0x11);
    (ida, ev[0].id)
}

/// A full establishment; returns (active id, passive id).
fn establish(now: u64, a: &mut Cm, b: &mut Cm) -> (CmId, CmId) {
    let (ida, idb) = request(now, a, b, b"hello");
    b.accept(now, idb, &rep_params(b"world")).unwrap();
    assert_eq!(shuttle(now, b, a), 1);
    let ev = events(a);
    let CmEventKind::RepReceived(rep) = &ev[0].kind else {
        panic!("{ev:?}")
    };
    assert_eq!(ev[0].id, ida);
    assert_eq!(&rep.private_data[..5], b"world");
    assert_eq!(rep.local_qpn, 0x22);
    a.send_rtu(ida, b"rtu").unwrap();
    assert_eq!(shuttle(now, a, b), 1);
    assert_eq!(
        events(b),
        vec![CmEvent {
            id: idb,
            kind: CmEventKind::RtuReceived
        }]
    );
    assert_eq!(a.state(ida), Some(CmState::Established));
    assert_eq!(b.state(idb), Some(CmState::Established));
    assert_eq!(a.next_timer(), None);
    assert_eq!(b.next_timer(), None);
    (ida, idb)
}

#[test]
fn establish_both_ways() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    a.listen(SID).unwrap();
    b.listen(SID).unwrap();
    establish(0, &mut a, &mut b);
    establish(0, &mut b, &mut a);
}

#[test]
fn timeouts_follow_the_kernel() {
    assert_eq!(cm_convert_to_ms(20), 4096);
    assert_eq!(cm_convert_to_ms(18), 1024);
    assert_eq!(cm_convert_to_ms(3), 1);
    assert_eq!(cm_convert_to_ms(255), 1 << 23);
    assert_eq!(cm_ack_timeout(15, 18), 19);
    assert_eq!(cm_ack_timeout(0, 255), 31);
    assert_eq!(ca_guid_from_mac([0, 1, 2, 3, 4, 5]), 0x0201_02ff_fe03_0405);
}

#[test]
fn no_listener_rejects_invalid_service_id() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    let ida = a.connect(0, &req_params(b.port().gid, &[])).unwrap();
    shuttle(0, &mut a, &mut b);
    assert!(events(&mut b).is_empty());
    assert_eq!(b.counters().no_listener, 1);
    assert_eq!(shuttle(0, &mut b, &mut a), 1);
    let ev = events(&mut a);
    assert!(
        matches!(
            ev[0].kind,
            CmEventKind::RejReceived {
                reason: rej_reason::INVALID_SERVICE_ID,
                ..
            }
        ),
        "{ev:?}"
    );
    assert_eq!(a.state(ida), Some(CmState::Idle));
    assert_eq!(a.next_timer(), None);
    a.destroy(0, ida).unwrap();
    assert_eq!(a.connection_count(), 0);
}

#[test]
fn consumer_reject_carries_private_data() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let (ida, idb) = request(0, &mut a, &mut b, b"x");
    b.reject(0, idb, rej_reason::CONSUMER_DEFINED, b"go away")
        .unwrap();
    let o = b.pop_mad().unwrap();
    // cm_format_rej in REQ received: local comm ID 0, message REQ.
    let CmMessage::Rej(r) = CmMessage::parse(&Mad::parse(&o.mad).unwrap()).unwrap() else {
        panic!()
    };
    assert_eq!(
        (r.local_comm_id, r.remote_comm_id, r.message_rejected),
        (0, ida.0, msg_response::REQ)
    );
    a.handle_mad(0, src(&b), &o.mad);
    let ev = events(&mut a);
    let CmEventKind::RejReceived {
        reason,
        private_data,
    } = &ev[0].kind
    else {
        panic!("{ev:?}")
    };
    assert_eq!(ev[0].id, ida);
    assert_eq!(*reason, rej_reason::CONSUMER_DEFINED);
    assert_eq!(&private_data[..7], b"go away");
    assert_eq!(b.state(idb), Some(CmState::Idle));
}

#[test]
fn req_loss_is_retransmitted() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let ida = a.connect(0, &req_params(b.port().gid, b"p")).unwrap();
    assert_eq!(drop_mads(&mut a), 1);
    // 2 * 1024 ms (packet life 18) + 4096 ms (response timeout 20).
    let t = a.next_timer().unwrap();
    assert_eq!(t, 6144 * MS);
    a.poll(t - 1);
    assert_eq!(drop_mads(&mut a), 0);
    a.poll(t);
    assert_eq!(shuttle(t, &mut a, &mut b), 1);
    let idb = events(&mut b)[0].id;
    b.accept(t, idb, &rep_params(b"")).unwrap();
    shuttle(t, &mut b, &mut a);
    assert!(matches!(
        events(&mut a)[0].kind,
        CmEventKind::RepReceived(_)
    ));
    a.send_rtu(ida, &[]).unwrap();
    shuttle(t, &mut a, &mut b);
    assert_eq!(b.state(idb), Some(CmState::Established));
}

#[test]
fn rep_loss_dup_req_and_rep_retransmission() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let (ida, idb) = request(0, &mut a, &mut b, b"");
    b.accept(0, idb, &rep_params(b"rep")).unwrap();
    assert_eq!(drop_mads(&mut b), 1);
    // The active side retries its REQ: a duplicate, counted and dropped as
    // the kernel's cm_dup_req_handler drops it in REP sent.
    let t = a.next_timer().unwrap();
    a.poll(t);
    shuttle(t, &mut a, &mut b);
    assert_eq!(b.counters().dup_req, 1);
    assert!(events(&mut b).is_empty());
    assert!(b.pop_mad().is_none());
    // The REP's own timer retransmits it: REQ's local CM response
    // timeout 20 → 4096 ms.
    assert_eq!(b.next_timer(), Some(4096 * MS));
    b.poll(4096 * MS);
    let o = b.pop_mad().unwrap();
    assert_eq!(Mad::peek_attr_tid(&o.mad).unwrap().0, 0x13);
    assert_eq!(o.to_gid, a.port().gid);
    a.handle_mad(t, src(&b), &o.mad);
    assert!(matches!(
        events(&mut a)[0].kind,
        CmEventKind::RepReceived(_)
    ));
    a.send_rtu(ida, &[]).unwrap();
    // RTU lost; the REP again gets the same RTU.
    let rtu = a.pop_mad().unwrap();
    a.handle_mad(t, src(&b), &o.mad);
    assert_eq!(a.pop_mad().unwrap().mad, rtu.mad);
    b.handle_mad(t, src(&a), &rtu.mad);
    assert_eq!(b.state(idb), Some(CmState::Established));
    assert_eq!(b.next_timer(), None);
}

#[test]
fn req_timeout_after_all_retries() {
    let mut a = cm(1, 1);
    let b = cm(2, 2);
    let ida = a.connect(0, &req_params(b.port().gid, &[])).unwrap();
    let mut sent = drop_mads(&mut a);
    let mut now = 0;
    while let Some(t) = a.next_timer() {
        assert_eq!(t - now, 6144 * MS);
        now = t;
        a.poll(now);
        sent += drop_mads(&mut a);
    }
    assert_eq!(sent, 1 + usize::from(CMA_MAX_CM_RETRIES));
    assert_eq!(
        events(&mut a),
        vec![CmEvent {
            id: ida,
            kind: CmEventKind::ReqError
        }]
    );
    assert_eq!(now, 16 * 6144 * MS);
    assert_eq!(a.state(ida), Some(CmState::Idle));
}

#[test]
fn rep_timeout_after_all_retries() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let (_, idb) = request(0, &mut a, &mut b, b"");
    b.accept(0, idb, &rep_params(b"")).unwrap();
    let mut sent = drop_mads(&mut b);
    while let Some(t) = b.next_timer() {
        b.poll(t);
        sent += drop_mads(&mut b);
    }
    assert_eq!(sent, 16);
    assert_eq!(events(&mut b)[0].kind, CmEventKind::RepError);
}

fn disconnect(now: u64, a: &mut Cm, ida: CmId, b: &mut Cm, idb: CmId) {
    a.disconnect(now, ida, b"bye").unwrap();
    shuttle(now, a, b);
    let ev = events(b);
    let CmEventKind::DreqReceived { private_data } = &ev[0].kind else {
        panic!("{ev:?}")
    };
    assert_eq!(&private_data[..3], b"bye");
    b.reply_disconnect(now, idb, &[]).unwrap();
    shuttle(now, b, a);
    assert_eq!(
        events(a),
        vec![CmEvent {
            id: ida,
            kind: CmEventKind::DrepReceived
        }]
    );
    assert_eq!(a.state(ida), Some(CmState::Timewait));
    assert_eq!(b.state(idb), Some(CmState::Timewait));
}

#[test]
fn disconnect_both_ways_and_timewait() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    a.listen(SID).unwrap();
    b.listen(SID).unwrap();
    let (ida, idb) = establish(0, &mut a, &mut b);
    disconnect(0, &mut a, ida, &mut b, idb);
    // Timewait: cm_convert_to_ms(cm_ack_timeout(15, 18) = 19) = 2048 ms.
    assert_eq!(a.next_timer(), Some(2048 * MS));
    assert_eq!(b.next_timer(), Some(2048 * MS));
    // A new REQ from the same QP while b holds the old one: stale.
    let again = a.connect(0, &req_params(b.port().gid, &[])).unwrap();
    assert_ne!(again, ida);
    shuttle(0, &mut a, &mut b);
    assert_eq!(b.counters().stale_req, 1);
    shuttle(0, &mut b, &mut a);
    assert!(matches!(
        events(&mut a)[0].kind,
        CmEventKind::RejReceived {
            reason: rej_reason::STALE_CONN,
            ..
        }
    ));
    // cm_rej_handler: a REJ stale connection puts the REQ's id in timewait too.
    assert_eq!(a.state(again), Some(CmState::Timewait));
    a.poll(2048 * MS);
    b.poll(2048 * MS);
    let exit = |id| CmEvent {
        id,
        kind: CmEventKind::TimewaitExit,
    };
    let mut ev = events(&mut a);
    ev.sort_by_key(|e| e.id);
    let mut want = vec![exit(ida), exit(again)];
    want.sort_by_key(|e| e.id);
    assert_eq!(ev, want);
    assert_eq!(
        events(&mut b),
        vec![CmEvent {
            id: idb,
            kind: CmEventKind::TimewaitExit
        }]
    );
    a.destroy(0, ida).unwrap();
    b.destroy(0, idb).unwrap();
    a.destroy(0, again).unwrap();
    assert_eq!(a.connection_count(), 0);
    // Reuse: the same QPN connects again, the other way too.
    let (ida, idb) = establish(3000 * MS, &mut a, &mut b);
    disconnect(3000 * MS, &mut b, idb, &mut a, ida);
}

#[test]
fn dreq_loss_is_retransmitted_and_dup_dreq_gets_drep() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let (ida, idb) = establish(0, &mut a, &mut b);
    a.disconnect(0, ida, &[]).unwrap();
    assert_eq!(drop_mads(&mut a), 1);
    let t = a.next_timer().unwrap();
    assert_eq!(t, 6144 * MS);
    a.poll(t);
    shuttle(t, &mut a, &mut b);
    b.reply_disconnect(t, idb, &[]).unwrap();
    // DREP lost: the DREQ again; b in timewait answers it again.
    drop_mads(&mut b);
    let t2 = a.next_timer().unwrap();
    a.poll(t2);
    shuttle(t2, &mut a, &mut b);
    assert_eq!(shuttle(t2, &mut b, &mut a), 1);
    assert_eq!(events(&mut a)[0].kind, CmEventKind::DrepReceived);
    assert_eq!(a.state(ida), Some(CmState::Timewait));
}

#[test]
fn dreq_for_unknown_connection_gets_drep_rtu_dropped() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    let dreq = CmDreq {
        local_comm_id: 5,
        remote_comm_id: 77,
        remote_qpn_eecn: 9,
        private_data: [0; private_data_len::DREQ],
    };
    b.handle_mad(0, src(&a), &CmMessage::Dreq(dreq).to_mad(42, 0).to_bytes());
    assert_eq!(b.counters().unknown_dreq, 1);
    let o = b.pop_mad().unwrap();
    assert_eq!(Mad::peek_attr_tid(&o.mad), Some((0x16, 42)));
    let rtu = CmRtu {
        local_comm_id: 5,
        remote_comm_id: 77,
        private_data: [0; private_data_len::RTU],
    };
    b.handle_mad(0, src(&a), &CmMessage::Rtu(rtu).to_mad(42, 0).to_bytes());
    assert!(b.pop_mad().is_none());
    assert_eq!(b.counters().unknown_id, 1);
    a.handle_mad(0, src(&b), &[0u8; 100]);
    assert_eq!(a.counters().malformed, 1);
}

#[test]
fn forged_messages_are_ignored() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    let evil = cm(66, 3);
    b.listen(SID).unwrap();
    let (ida, idb) = establish(0, &mut a, &mut b);
    let rej = |local, remote| {
        CmMessage::Rej(CmRej {
            local_comm_id: local,
            remote_comm_id: remote,
            message_rejected: 2,
            ari_length: 0,
            reason: rej_reason::CONSUMER_DEFINED,
            ari: [0; private_data_len::ADDITIONAL_INFO],
            private_data: [0; private_data_len::REJ],
        })
        .to_mad(0, 0)
        .to_bytes()
    };
    let dreq = |local, remote| {
        CmMessage::Dreq(CmDreq {
            local_comm_id: local,
            remote_comm_id: remote,
            remote_qpn_eecn: 0x11,
            private_data: [0; private_data_len::DREQ],
        })
        .to_mad(0, 0)
        .to_bytes()
    };
    // The right comm IDs from the wrong GID, a guessed peer ID from the
    // right GID, guessed local IDs.
    for (from, local, remote) in [
        (src(&evil), idb.0, ida.0),
        (src(&b), idb.0.wrapping_add(1), ida.0),
        (src(&b), idb.0, ida.0 ^ 1),
        (src(&evil), 1, 2),
    ] {
        a.handle_mad(0, from, &rej(local, remote));
        a.handle_mad(0, from, &dreq(local, remote));
    }
    assert!(events(&mut a).is_empty());
    assert_eq!(a.state(ida), Some(CmState::Established));
    // A forged RTU for a passive side waiting for its RTU.
    let mut c = cm(3, 4);
    c.listen(SID).unwrap();
    let (idx, idc) = request(0, &mut a, &mut c, b"");
    c.accept(0, idc, &rep_params(b"")).unwrap();
    let rtu = CmMessage::Rtu(CmRtu {
        local_comm_id: idx.0,
        remote_comm_id: idc.0,
        private_data: [0; private_data_len::RTU],
    })
    .to_mad(0, 0)
    .to_bytes();
    c.handle_mad(0, src(&evil), &rtu);
    assert_eq!(c.state(idc), Some(CmState::RepSent));
    // The genuine one passes.
    c.handle_mad(0, src(&a), &rtu);
    assert_eq!(c.state(idc), Some(CmState::Established));
}

/// A REQ from a stranger's GID that names a live connection's remote CA
/// GUID and QPN (both on the wire in that connection's REQ) is rejected as
/// stale but leaves the connection alone: only the peer it was made with
/// may make it stale (Linux's `cm_match_req` sends a DREQ on the old one
/// whoever asks, which would let anyone on the link tear it down).
#[test]
fn a_strangers_stale_req_does_not_disconnect() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    let mut evil = cm(66, 3);
    b.listen(SID).unwrap();
    let (ida, idb) = establish(0, &mut a, &mut b);
    evil.connect(0, &req_params(b.port().gid, &[])).unwrap();
    let out = evil.pop_mad().unwrap();
    let mad = Mad::parse(&out.mad).unwrap();
    let CmMessage::Req(mut req) = CmMessage::parse(&mad).unwrap() else {
        panic!("not a REQ")
    };
    req.local_ca_guid = a.port().ca_guid;
    req.local_qpn = 0x11;
    let forged = CmMessage::Req(req).to_mad(mad.hdr.tid, 0).to_bytes();
    b.handle_mad(0, src(&evil), &forged);
    assert_eq!(b.counters().stale_req, 1);
    assert_eq!(b.state(idb), Some(CmState::Established));
    assert!(events(&mut b).is_empty());
    // Only the REJ, to the stranger; no DREQ to a.
    let o = b.pop_mad().unwrap();
    assert_eq!(o.to_gid, evil.port().gid);
    assert!(b.pop_mad().is_none());
    assert_eq!(a.state(ida), Some(CmState::Established));
    // The same REQ from a's own GID still ends the old connection.
    b.handle_mad(0, src(&a), &forged);
    assert_eq!(b.state(idb), Some(CmState::DreqSent));
}

#[test]
fn tables_are_bounded() {
    let mut a = cm(1, 1);
    for s in 0..MAX_LISTENERS as u64 {
        a.listen(s).unwrap();
    }
    assert_eq!(a.listen(u64::MAX), Err(CmError::TableFull));
    assert_eq!(a.listen(0), Err(CmError::Busy));
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let mut p = req_params(b.port().gid, &[]);
    for i in 0..MAX_CONNECTIONS as u32 {
        p.qpn = i;
        a.connect(0, &p).unwrap();
        drop_mads(&mut a);
    }
    assert_eq!(a.connect(0, &p), Err(CmError::TableFull));
    // b full of passive connections: the next REQ gets REJ no resources.
    for i in 0..MAX_CONNECTIONS as u32 {
        let mut r = req_params(b.port().gid, &[]);
        r.qpn = i;
        let mut c = cm(3, u64::from(i));
        c.connect(0, &r).unwrap();
        shuttle(0, &mut c, &mut b);
        drop_mads(&mut b);
    }
    assert_eq!(b.connection_count(), MAX_CONNECTIONS);
    let mut c = cm(4, 9);
    c.connect(0, &req_params(b.port().gid, &[])).unwrap();
    shuttle(0, &mut c, &mut b);
    assert_eq!(b.counters().no_resources, 1);
    shuttle(0, &mut b, &mut c);
    assert!(matches!(
        events(&mut c)[0].kind,
        CmEventKind::RejReceived {
            reason: rej_reason::NO_RESOURCES,
            ..
        }
    ));
    assert_eq!(b.connection_count(), MAX_CONNECTIONS);
    assert_eq!(
        a.connect(
            0,
            &ReqParams {
                private_data: vec![0; 93],
                ..p
            }
        ),
        Err(CmError::PrivateDataTooLong)
    );
}

#[derive(Debug, Clone)]
enum Op {
    Mad(Vec<u8>, bool),
    CmMad(u16, u64, Vec<u8>, bool),
    Listen(u64),
    Unlisten(u64),
    Connect(u32, u64),
    Accept(usize),
    Reject(usize, u16),
    Rtu(usize),
    Disconnect(usize),
    ReplyDisconnect(usize),
    Destroy(usize),
    Sidr(u64),
    SidrReply(usize, u8),
    Advance(u64),
    Shuttle,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (
            proptest::collection::vec(any::<u8>(), 0..300),
            any::<bool>()
        )
            .prop_map(|(v, b)| Op::Mad(v, b)),
        (
            0x10u16..0x1b,
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 232),
            any::<bool>()
        )
            .prop_map(|(a, t, d, b)| Op::CmMad(a, t, d, b)),
        (0u64..3).prop_map(Op::Listen),
        (0u64..3).prop_map(Op::Unlisten),
        (any::<u32>(), 0u64..3).prop_map(|(q, s)| Op::Connect(q, s)),
        any::<usize>().prop_map(Op::Accept),
        (any::<usize>(), any::<u16>()).prop_map(|(i, r)| Op::Reject(i, r)),
        any::<usize>().prop_map(Op::Rtu),
        any::<usize>().prop_map(Op::Disconnect),
        any::<usize>().prop_map(Op::ReplyDisconnect),
        any::<usize>().prop_map(Op::Destroy),
        (0u64..3).prop_map(Op::Sidr),
        (any::<usize>(), any::<u8>()).prop_map(|(i, st)| Op::SidrReply(i, st)),
        (0u64..20_000 * MS).prop_map(Op::Advance),
        Just(Op::Shuttle),
    ]
}

fn pick(c: &Cm, i: usize) -> CmId {
    let ids: Vec<u32> = c.conns.keys().copied().collect();
    CmId(ids.get(i % ids.len().max(1)).copied().unwrap_or(0))
}

proptest! {
    #[test]
    fn random_input_never_panics(ops in proptest::collection::vec(op(), 0..200)) {
        let mut a = cm(1, 1);
        let mut b = cm(2, 2);
        let mut now = 0u64;
        for (n, o) in ops.into_iter().enumerate() {
            let (x, y) = if n % 2 == 0 { (&mut a, &mut b) } else { (&mut b, &mut a) };
            match o {
                Op::Mad(v, s) => x.handle_mad(now, if s { src(y) } else { Source { gid: gid(9), qpn: 1, pkey_index: 0 } }, &v),
                Op::CmMad(attr, tid, d, s) => {
                    let mut data = [0u8; vrnic_wire::MAD_DATA_LEN];
                    data.copy_from_slice(&d);
                    let hdr = vrnic_wire::MadHeader::cm(vrnic_wire::CmAttrId::from_u16(attr).unwrap(), tid, 0);
                    let mut m = Mad { hdr, data }.to_bytes();
                    // Aim at a live connection now and then.
                    if s {
                        let id = pick(x, tid as usize);
                        m[28..32].copy_from_slice(&id.0.to_be_bytes());
                    }
                    x.handle_mad(now, src(y), &m);
                }
                Op::Listen(s) => { let _ = x.listen(SID + s); }
                Op::Unlisten(s) => { let _ = x.unlisten(SID + s); }
                Op::Connect(q, s) => {
                    let mut p = req_params(y.port().gid, &[]);
                    p.qpn = q & 0xff_ffff;
                    p.service_id = SID + s;
                    let _ = x.connect(now, &p);
                }
                Op::Accept(i) => { let id = pick(x, i); let _ = x.accept(now, id, &rep_params(b"")); }
                Op::Reject(i, r) => { let id = pick(x, i); let _ = x.reject(now, id, r, b""); }
                Op::Rtu(i) => { let id = pick(x, i); let _ = x.send_rtu(id, b""); }
                Op::Disconnect(i) => { let id = pick(x, i); let _ = x.disconnect(now, id, b""); }
                Op::ReplyDisconnect(i) => { let id = pick(x, i); let _ = x.reply_disconnect(now, id, b""); }
                Op::Destroy(i) => { let id = pick(x, i); let _ = x.destroy(now, id); }
                Op::Sidr(sv) => { let _ = x.sidr_request(now, SID + sv, y.port().gid, 100, 3, b""); }
                Op::SidrReply(i, st) => { let id = pick(x, i); let _ = x.sidr_reply(id, st, 1, 2, b""); }
                Op::Advance(d) => { now += d; x.poll(now); y.poll(now); }
                Op::Shuttle => { shuttle(now, x, y); shuttle(now, y, x); }
            }
            for c in [&a, &b] {
                prop_assert!(c.live_count() <= MAX_CONNECTIONS);
                prop_assert!(c.timewait_count() <= MAX_TIMEWAIT);
                prop_assert!(c.listener_count() <= MAX_LISTENERS);
                prop_assert!(c.out.len() <= MAX_OUT_MADS);
                prop_assert!(c.events.len() <= MAX_EVENTS);
            }
            while a.pop_event().is_some() {}
            while b.pop_event().is_some() {}
        }
    }
}

#[test]
fn mra_extends_the_req_wait_once() {
    let mut a = cm(1, 1);
    let b = cm(2, 2);
    let ida = a.connect(0, &req_params(b.port().gid, &[])).unwrap();
    drop_mads(&mut a);
    let mra = |mraed, timeout| {
        CmMessage::Mra(CmMra {
            local_comm_id: 99,
            remote_comm_id: ida.0,
            message_mraed: mraed,
            service_timeout: timeout,
            private_data: [0; private_data_len::MRA],
        })
        .to_mad(0, 0)
        .to_bytes()
    };
    // The wrong message MRAed, and a stranger's: ignored.
    a.handle_mad(10, src(&b), &mra(msg_response::REP, 24));
    a.handle_mad(
        10,
        Source {
            gid: gid(66),
            qpn: 1,
            pkey_index: 0,
        },
        &mra(msg_response::REQ, 24),
    );
    assert_eq!(a.next_timer(), Some(6144 * MS));
    // rdma_cm's MRA: service timeout 24 → 65536 ms + ack timeout 19 → 2048 ms.
    a.handle_mad(10, src(&b), &mra(msg_response::REQ, 24));
    assert_eq!(
        events(&mut a),
        vec![CmEvent {
            id: ida,
            kind: CmEventKind::MraReceived {
                service_timeout: 24
            }
        }]
    );
    assert_eq!(a.next_timer(), Some(10 + (65536 + 2048) * MS));
    a.handle_mad(20, src(&b), &mra(msg_response::REQ, 24));
    assert!(events(&mut a).is_empty());
    // A REP still completes it.
    let rep = CmMessage::Rep(CmRep {
        local_comm_id: 99,
        remote_comm_id: ida.0,
        local_qkey: 0,
        local_qpn: 5,
        vendor_id: 0,
        local_eecn: 0,
        starting_psn: 0,
        responder_resources: 0,
        initiator_depth: 0,
        target_ack_delay: 0,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 0,
        srq: false,
        local_ca_guid: 7,
        private_data: [0; private_data_len::REP],
    })
    .to_mad(0, 0)
    .to_bytes();
    a.handle_mad(30, src(&b), &rep);
    assert!(matches!(
        events(&mut a)[0].kind,
        CmEventKind::RepReceived(_)
    ));
    assert_eq!(a.next_timer(), None);
}

#[test]
fn sidr_resolves_rejects_and_times_out() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    let udp = 0x0111_0000_0000_1234;
    // No listener: SIDR_REP unsupported.
    let id = a
        .sidr_request(0, udp, b.port().gid, 4096, 15, b"q")
        .unwrap();
    shuttle(0, &mut a, &mut b);
    shuttle(0, &mut b, &mut a);
    let ev = events(&mut a);
    let CmEventKind::SidrRepReceived(rep) = &ev[0].kind else {
        panic!("{ev:?}")
    };
    assert_eq!((ev[0].id, rep.status), (id, sidr_status::UNSUPPORTED));
    assert_eq!(a.connection_count(), 0);
    // A listener answers with its QP; a stranger's SIDR_REP first is ignored.
    b.listen(udp).unwrap();
    let id = a
        .sidr_request(0, udp, b.port().gid, 4096, 15, b"q")
        .unwrap();
    shuttle(0, &mut a, &mut b);
    let ev = events(&mut b);
    let CmEventKind::SidrReqReceived { listener, req, .. } = &ev[0].kind else {
        panic!("{ev:?}")
    };
    assert_eq!((*listener, &req.private_data[..1]), (udp, &b"q"[..]));
    let forged = CmMessage::SidrRep(CmSidrRep {
        request_id: id.0,
        status: 0,
        additional_info_length: 0,
        vendor_id: 0,
        qpn: 666,
        service_id: udp,
        qkey: 0,
        additional_info: [0; private_data_len::ADDITIONAL_INFO],
        private_data: [0; private_data_len::SIDR_REP],
    })
    .to_mad(0, 0)
    .to_bytes();
    a.handle_mad(
        0,
        Source {
            gid: gid(66),
            qpn: 1,
            pkey_index: 0,
        },
        &forged,
    );
    assert!(events(&mut a).is_empty());
    b.sidr_reply(ev[0].id, sidr_status::SUCCESS, 0x33, 0x0123_4567, b"r")
        .unwrap();
    assert_eq!(b.connection_count(), 0);
    shuttle(0, &mut b, &mut a);
    let ev = events(&mut a);
    let CmEventKind::SidrRepReceived(rep) = &ev[0].kind else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (rep.status, rep.qpn, rep.qkey, rep.private_data[0]),
        (0, 0x33, 0x0123_4567, b'r')
    );
    // Nobody answers: 1 + 15 tries 4096 ms apart, then the error.
    let id = a.sidr_request(0, udp, gid(77), 4096, 15, &[]).unwrap();
    let mut sent = drop_mads(&mut a);
    while let Some(t) = a.next_timer() {
        a.poll(t);
        sent += drop_mads(&mut a);
    }
    assert_eq!(sent, 16);
    assert_eq!(
        events(&mut a),
        vec![CmEvent {
            id,
            kind: CmEventKind::SidrReqError
        }]
    );
    assert_eq!(a.connection_count(), 0);
}

#[test]
fn establish_ends_the_rep_wait() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let (_, idb) = request(0, &mut a, &mut b, b"");
    assert_eq!(b.establish(idb), Err(CmError::BadState));
    b.accept(0, idb, &rep_params(b"")).unwrap();
    assert!(b.next_timer().is_some());
    b.establish(idb).unwrap();
    assert_eq!(
        events(&mut b),
        vec![CmEvent {
            id: idb,
            kind: CmEventKind::UserEstablished
        }]
    );
    assert_eq!(b.next_timer(), None);
    assert_eq!(b.state(idb), Some(CmState::Established));
}

/// Both sides disconnect at once, one by destroying its established id
/// (DREQ, straight to timewait): the other's crossing DREQ reaches it in
/// timewait and gets a DREP, as cm.c's `cm_dreq_handler` formats one; it
/// sent back its RTU (what it last sent), e2e software's perftest -R.
#[test]
fn dreq_in_timewait_after_destroy_gets_a_drep_not_the_rtu() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let (ida, idb) = establish(0, &mut a, &mut b);
    a.destroy(0, ida).unwrap();
    b.disconnect(0, idb, &[]).unwrap();
    // b's DREQ reaches a in timewait.
    let s = src(&b);
    let o = b.pop_mad().unwrap();
    a.handle_mad(0, s, &o.mad);
    let dreq_tid = Mad::peek_attr_tid(&o.mad).unwrap().1;
    // a's own DREQ first, then the answer.
    let mut answers = Vec::new();
    while let Some(o) = a.pop_mad() {
        answers.push(Mad::peek_attr_tid(&o.mad).unwrap());
    }
    assert_eq!(answers.len(), 2, "{answers:x?}");
    assert_eq!(answers[0].0, 0x15);
    assert_eq!(answers[1], (0x16, dreq_tid));
}

#[test]
fn destroy_disconnects_and_keeps_timewait_quietly() {
    let mut a = cm(1, 1);
    let mut b = cm(2, 2);
    b.listen(SID).unwrap();
    let (ida, idb) = establish(0, &mut a, &mut b);
    // cm_destroy_id in established: DREQ, then timewait; no more events.
    b.destroy(0, idb).unwrap();
    assert_eq!(b.state(idb), None);
    assert_eq!(b.timewait_count(), 1);
    shuttle(0, &mut b, &mut a);
    assert!(matches!(
        events(&mut a)[0].kind,
        CmEventKind::DreqReceived { .. }
    ));
    // a destroys instead of replying: the DREP goes out for it.
    a.destroy(0, ida).unwrap();
    assert_eq!(shuttle(0, &mut a, &mut b), 1);
    assert_eq!(a.timewait_count(), 1);
    a.poll(2048 * MS);
    b.poll(2048 * MS);
    assert!(events(&mut a).is_empty() && events(&mut b).is_empty());
    assert_eq!((a.connection_count(), b.connection_count()), (0, 0));
    // The comm ID is free again only now; a new connection works.
    establish(2048 * MS, &mut a, &mut b);
}
