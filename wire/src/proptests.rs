//! Property tests: header and frame round trips, and no panics on arbitrary
//! or mutated input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::samples::sample_headers;
use super::*;

fn opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

prop_compose! {
    fn bth()(
        opcode in opcode(),
        solicited: bool, mig_req: bool, pad_count in 0u8..4, tver in 0u8..16, pkey: u16,
        fecn: bool, becn: bool, dest_qp in 0u32..1 << 24, ack_req: bool, psn in 0u32..1 << 24,
    ) -> Bth {
        Bth { opcode, solicited, mig_req, pad_count, tver, pkey, fecn, becn, dest_qp, ack_req, psn }
    }
}

prop_compose! {
    fn headers()(
        op in opcode(),
        v6: bool,
        bth in bth(),
        ip_src: [u8; 16], ip_dst: [u8; 16],
        eth_src: [u8; 6], eth_dst: [u8; 6],
        ip_id: u16, ttl: u8, tclass: u8, flow_label in 0u32..1 << 20, udp_src: u16,
        reth: (u64, u32, u32), aeth: (u8, u32), atomic: (u64, u32, u64, u64), orig: u64,
        deth: (u32, u32), imm: [u8; 4], inv: u32,
    ) -> RoceHeaders {
        let (ip_src, ip_dst) = if v6 {
            (IpAddr::V6(Ipv6Addr::from(ip_src)), IpAddr::V6(Ipv6Addr::from(ip_dst)))
        } else {
            let v4 = |b: [u8; 16]| IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]));
            (v4(ip_src), v4(ip_dst))
        };
        let mut h = sample_headers(op, v6);
        h.eth_src = eth_src;
        h.eth_dst = eth_dst;
        h.ip_src = ip_src;
        h.ip_dst = ip_dst;
        h.ip_id = if v6 { 0 } else { ip_id };
        h.ttl = ttl;
        h.tclass = tclass;
        h.flow_label = if v6 { flow_label } else { 0 };
        h.udp_src = udp_src;
        h.bth = Bth { opcode: op, tver: 0, ..bth };
        h.reth = h.reth.map(|_| Reth { va: reth.0, rkey: reth.1, dma_len: reth.2 });
        h.aeth = h.aeth.map(|_| Aeth { syndrome: aeth.0, msn: aeth.1 & 0xff_ffff });
        h.atomic_eth = h.atomic_eth.map(|_| AtomicEth { va: atomic.0, rkey: atomic.1, swap_add: atomic.2, compare: atomic.3 });
        h.atomic_ack_eth = h.atomic_ack_eth.map(|_| AtomicAckEth { orig });
        h.deth = h.deth.map(|_| Deth { qkey: deth.0, src_qp: deth.1 & 0xff_ffff });
        h.immdt = h.immdt.map(|_| Immdt(imm));
        h.ieth = h.ieth.map(|_| Ieth { rkey: inv });
        h
    }
}

proptest! {
    #[test]
    fn bth_round_trips(b in bth()) {
        let mut buf = [0u8; Bth::LEN];
        b.emit(&mut buf);
        prop_assert_eq!(Bth::parse(&buf), Ok(b));
    }

    #[test]
    fn reth_bytes_round_trip(bytes: [u8; 16]) {
        let r = Reth::parse(&bytes).unwrap();
        let mut out = [0u8; 16];
        r.emit(&mut out);
        prop_assert_eq!(out, bytes);
    }

    #[test]
    fn aeth_bytes_round_trip(bytes: [u8; 4]) {
        let a = Aeth::parse(&bytes).unwrap();
        let mut out = [0u8; 4];
        a.emit(&mut out);
        prop_assert_eq!(out, bytes);
        // kind() and the constructors agree.
        let msn = a.msn;
        match a.kind() {
            AethKind::Ack { credits } => prop_assert_eq!(Aeth::ack(msn, credits).syndrome, bytes[0] & 0x7f),
            AethKind::RnrNak { timer } => prop_assert_eq!(Aeth::rnr_nak(msn, timer).syndrome, bytes[0] & 0x7f),
            AethKind::Nak(code) => prop_assert_eq!(Aeth::nak(msn, code).syndrome, bytes[0] & 0x7f),
            AethKind::Reserved(s) => prop_assert_eq!(s, bytes[0]),
        }
    }

    #[test]
    fn atomic_eth_bytes_round_trip(bytes: [u8; 28]) {
        let a = AtomicEth::parse(&bytes).unwrap();
        let mut out = [0u8; 28];
        a.emit(&mut out);
        prop_assert_eq!(out, bytes);
    }

    #[test]
    fn small_headers_round_trip(bytes: [u8; 8]) {
        let mut out = [0u8; 8];
        AtomicAckEth::parse(&bytes).unwrap().emit(&mut out);
        prop_assert_eq!(out, bytes);
        let d = Deth::parse(&bytes).unwrap();
        d.emit(&mut out);
        prop_assert_eq!(Deth::parse(&out), Ok(d));
        Immdt::parse(&bytes).unwrap().emit(&mut out);
        Ieth::parse(&bytes[4..]).unwrap().emit(&mut out[4..]);
        prop_assert_eq!(out[..4].to_vec(), bytes[..4].to_vec());
        prop_assert_eq!(out[4..].to_vec(), bytes[4..].to_vec());
    }

    #[test]
    fn frames_round_trip(h in headers(), payload in proptest::collection::vec(any::<u8>(), 0..300)) {
        let payload = if h.bth.opcode.has_payload() { &payload[..] } else { &[][..] };
        let mut out = Vec::new();
        emit_frame(&h, payload, &mut out);
        prop_assert_eq!(out.len(), h.frame_len(payload.len()));
        let p = match parse_frame(&out) {
            Ok(Frame::Roce(p)) => p,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        let pad = ((4 - payload.len() % 4) % 4) as u8;
        prop_assert_eq!(p.hdr, RoceHeaders { bth: Bth { pad_count: pad, ..h.bth }, ..h.clone() });
        prop_assert_eq!(p.payload, payload);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_frame(&bytes);
        let _ = parse_roce(&bytes);
        let _ = icrc(&bytes);
    }

    #[test]
    fn mutated_frames_never_panic_and_rarely_pass(
        h in headers(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let payload: &[u8] = if h.bth.opcode.has_payload() { b"payload" } else { b"" };
        let mut out = Vec::new();
        emit_frame(&h, payload, &mut out);
        let orig = out.clone();
        let n = cut.index(orig.len());
        prop_assert!(parse_frame(&orig[..n]).is_err());
        for (i, v) in edits {
            let i = i.index(out.len());
            out[i] = v;
        }
        for n in 0..=out.len() {
            let _ = parse_frame(&out[..n]);
        }
        // Any surviving packet parses to the original transport content.
        if let Ok(Frame::Roce(p)) = parse_frame(&out) {
            let q = match parse_frame(&orig) { Ok(Frame::Roce(q)) => q, _ => unreachable!() };
            prop_assert_eq!(p.payload, q.payload);
            prop_assert_eq!(p.hdr.bth.opcode, q.hdr.bth.opcode);
            prop_assert_eq!(p.hdr.bth.psn, q.hdr.bth.psn);
        }
    }
}

// IB CM MADs (mad.rs, cm.rs) and rdma_cm's header (cma.rs).

fn cm_attr() -> impl Strategy<Value = CmAttrId> {
    proptest::sample::select(CmAttrId::ALL.to_vec())
}

prop_compose! {
    /// A MAD with the CM header the kernel sends, a random CM attribute
    /// and random data.
    fn cm_mad()(attr in cm_attr(), tid: u64, attr_mod: u32,
                data in proptest::collection::vec(any::<u8>(), MAD_DATA_LEN)) -> Vec<u8> {
        let mut b = vec![0u8; MAD_LEN];
        MadHeader::cm(attr, tid, attr_mod).emit(&mut b);
        b[MadHeader::LEN..].copy_from_slice(&data);
        b
    }
}

prop_compose! {
    fn cma_hdr()(v6: bool, src_port: u16, src: [u8; 16], dst: [u8; 16]) -> CmaHdr {
        let addrs = if v6 {
            CmaAddrs::V6 { src: Ipv6Addr::from(src), dst: Ipv6Addr::from(dst) }
        } else {
            CmaAddrs::V4 {
                src: Ipv4Addr::new(src[0], src[1], src[2], src[3]),
                dst: Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]),
            }
        };
        CmaHdr { src_port, addrs }
    }
}

prop_compose! {
    fn cm_path()(
        local_lid: u16, remote_lid: u16, local_gid: [u8; 16], remote_gid: [u8; 16],
        flow_label in 0u32..1 << 20, packet_rate in 0u8..64, traffic_class: u8, hop_limit: u8,
        sl in 0u8..16, subnet_local: bool, local_ack_timeout in 0u8..32,
    ) -> CmPath {
        CmPath {
            local_lid, remote_lid, local_gid: Gid(local_gid), remote_gid: Gid(remote_gid),
            flow_label, packet_rate, traffic_class, hop_limit, sl, subnet_local, local_ack_timeout,
        }
    }
}

prop_compose! {
    /// A REQ built field by field, each in its range.
    fn cm_req()(
        ids in (any::<u32>(), 0u32..1 << 24, any::<u64>(), any::<u64>(), any::<u32>()),
        qp in (0u32..1 << 24, any::<u8>(), 0u32..1 << 24, any::<u8>(), 0u32..1 << 24),
        flags in (0u8..32, 0u8..4, any::<bool>(), 0u32..1 << 24, 0u8..32, 0u8..8, any::<u16>()),
        more in (0u8..16, any::<bool>(), 0u8..8, 0u8..16, any::<bool>(), 0u8..8, any::<bool>()),
        primary_path in cm_path(), alternate_path in cm_path(),
        private in proptest::collection::vec(any::<u8>(), 92),
    ) -> CmReq {
        let (local_comm_id, vendor_id, service_id, local_ca_guid, local_qkey) = ids;
        let (local_qpn, responder_resources, local_eecn, initiator_depth, remote_eecn) = qp;
        let (remote_cm_response_timeout, transport_service_type, end_to_end_flow_control,
             starting_psn, local_cm_response_timeout, retry_count, partition_key) = flags;
        let (path_mtu, rdc_exists, rnr_retry_count, max_cm_retries, srq,
             extended_transport_type, sap_supported) = more;
        CmReq {
            local_comm_id, vendor_id, service_id, local_ca_guid, local_qkey, local_qpn,
            responder_resources, local_eecn, initiator_depth, remote_eecn,
            remote_cm_response_timeout, transport_service_type, end_to_end_flow_control,
            starting_psn, local_cm_response_timeout, retry_count, partition_key, path_mtu,
            rdc_exists, rnr_retry_count, max_cm_retries, srq, extended_transport_type,
            primary_path, alternate_path, sap_supported,
            private_data: private.try_into().unwrap(),
        }
    }
}

proptest! {
    #[test]
    fn mad_parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(m) = Mad::parse(&bytes) {
            prop_assert_eq!(bytes.len(), MAD_LEN);
            prop_assert_eq!(m.to_bytes().to_vec(), bytes.clone());
            let _ = CmMessage::parse(&m);
        } else {
            prop_assert_ne!(bytes.len(), MAD_LEN);
        }
        for attr in CmAttrId::ALL {
            prop_assert_eq!(CmMessage::parse_data(attr, &bytes).is_ok(), bytes.len() >= CM_MSG_LEN);
        }
        let _ = CmaHdr::parse(&bytes);
        let _ = Mad::peek_attr_tid(&bytes);
    }

    /// parse(emit(x)) == x for every message x: the messages are generated
    /// as parses of random bytes, which reach every in-range value of every
    /// field (fields take disjoint bits). And emit(parse(bytes)) is the
    /// bytes with exactly the reserved bits cleared, so emit loses nothing.
    #[test]
    fn cm_messages_round_trip(bytes in cm_mad()) {
        let mad = Mad::parse(&bytes).unwrap();
        let msg = CmMessage::parse(&mad).unwrap();
        prop_assert_eq!(msg.attr_id() as u16, mad.hdr.attr_id);
        let again = msg.to_mad(mad.hdr.tid, mad.hdr.attr_mod);
        prop_assert_eq!(&again.hdr, &mad.hdr);
        prop_assert_eq!(CmMessage::parse(&again), Ok(msg.clone()));
        // Bits emit keeps: those of an all-ones message.
        let mut used = [0u8; CM_MSG_LEN];
        CmMessage::parse_data(msg.attr_id(), &[0xff; CM_MSG_LEN]).unwrap().emit(&mut used);
        for (i, (out, (inp, keep))) in again.data.iter().zip(mad.data.iter().zip(used)).enumerate() {
            prop_assert_eq!(*out, inp & keep, "byte {}", i);
        }
    }

    /// A CM MAD with one byte of its header changed parses only if the
    /// change left it a CM MAD; otherwise the error says which check failed.
    #[test]
    fn cm_header_mutations(bytes in cm_mad(), at in 0usize..24, v: u8) {
        let mut b = bytes;
        b[at] = v;
        let mad = Mad::parse(&b).unwrap();
        match CmMessage::parse(&mad) {
            Ok(msg) => {
                prop_assert!(mad.hdr.is_cm());
                prop_assert_eq!(msg.attr_id() as u16, mad.hdr.attr_id);
            }
            Err(WireError::NotCmMad { .. }) => prop_assert!(!mad.hdr.is_cm()),
            Err(WireError::UnknownCmAttribute(a)) => {
                prop_assert!(CmAttrId::from_u16(a).is_none());
                prop_assert_eq!(a, mad.hdr.attr_id);
            }
            Err(e) => return Err(TestCaseError::fail(format!("{e:?}"))),
        }
    }

    /// parse(emit(x)) == x for a REQ generated field by field (the
    /// message with the most bitfields), also through a whole MAD.
    #[test]
    fn req_fields_round_trip(req in cm_req(), tid: u64) {
        let mut b = [0u8; CM_MSG_LEN];
        req.emit(&mut b);
        prop_assert_eq!(CmReq::parse(&b), Ok(req.clone()));
        let mad = CmMessage::Req(req.clone()).to_mad(tid, 0);
        let back = Mad::parse(&mad.to_bytes()).unwrap();
        prop_assert_eq!(CmMessage::parse(&back), Ok(CmMessage::Req(req)));
    }

    #[test]
    fn mad_header_bytes_round_trip(bytes: [u8; 24]) {
        let mut out = [0u8; 24];
        MadHeader::parse(&bytes).unwrap().emit(&mut out);
        prop_assert_eq!(out, bytes);
    }

    #[test]
    fn cma_hdr_round_trips(h in cma_hdr(), junk: [u8; 8]) {
        let mut b = [0u8; 44];
        b[36..].copy_from_slice(&junk);
        h.emit(&mut b);
        prop_assert_eq!(&b[36..], &junk[..]);
        prop_assert_eq!(CmaHdr::parse(&b), Ok(h));
    }

    #[test]
    fn service_ids_round_trip(ps in proptest::sample::select(PortSpace::ALL.to_vec()), port: u16) {
        let sid = service_id(ps, port);
        prop_assert_eq!(service_id_port(sid), port);
        prop_assert_eq!(service_id_port_space(sid), Some(ps));
        prop_assert_eq!(sid & !SERVICE_ID_PS_MASK, u64::from(port));
    }
}
