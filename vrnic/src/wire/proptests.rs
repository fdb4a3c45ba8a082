//! Property tests: header and frame round trips, and no panics on arbitrary
//! or mutated input.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::packet_tests::sample_headers;
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
