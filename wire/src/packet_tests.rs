//! Whole-frame tests: round trips for every opcode, truncation, ICRC
//! coverage and masking, and every validation error of `parse_frame`.

use std::net::{IpAddr, Ipv4Addr};

use super::samples::sample_headers;
use super::*;

const ETH: usize = 14;

fn frame(op: Opcode, v6: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    emit_frame(&sample_headers(op, v6), payload, &mut out);
    out
}

fn ip_hdr_len(f: &[u8]) -> usize {
    if f[ETH] >> 4 == 4 {
        usize::from(f[ETH] & 0xf) * 4
    } else {
        40
    }
}

/// Offset of the BTH in an emitted frame.
fn bth_off(f: &[u8]) -> usize {
    ETH + ip_hdr_len(f) + 8
}

/// Recomputes the IPv4 header checksum (if IPv4) and the ICRC after a test
/// edited the frame, so that only the intended defect remains.
fn restamp(f: &mut [u8]) {
    if let Ok(h) = etherparse::Ipv4HeaderSlice::from_slice(&f[ETH..]) {
        let c = h.to_header().calc_header_checksum();
        f[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
    }
    let n = f.len();
    let c = icrc(&f[ETH..n - 4]);
    f[n - 4..].copy_from_slice(&c.to_be_bytes());
}

fn parse_ok(f: &[u8]) -> RocePacket<'_> {
    match parse_frame(f) {
        Ok(Frame::Roce(p)) => p,
        other => panic!("expected RoCE, got {other:?}"),
    }
}

#[test]
fn every_opcode_round_trips_over_ipv4_and_ipv6() {
    let data = [0x11u8, 0x22, 0x33, 0x44, 0x55];
    let mut out = Vec::new();
    for op in Opcode::ALL {
        for v6 in [false, true] {
            let lens: &[usize] = if op.has_payload() {
                &[0, 1, 2, 3, 4, 5]
            } else {
                &[0]
            };
            for &len in lens {
                let hdr = sample_headers(op, v6);
                let payload = &data[..len];
                emit_frame(&hdr, payload, &mut out);
                assert_eq!(out.len(), hdr.frame_len(len), "{op} v6={v6} len={len}");
                assert_eq!(
                    out.len(),
                    ETH + if v6 { 40 } else { 20 } + 8 + op.header_len() + len.div_ceil(4) * 4 + 4
                );
                let p = parse_ok(&out);
                let want_pad = ((4 - len % 4) % 4) as u8;
                let want = RoceHeaders {
                    bth: Bth {
                        pad_count: want_pad,
                        ..hdr.bth
                    },
                    ..hdr.clone()
                };
                assert_eq!(p.hdr, want, "{op} v6={v6} len={len}");
                assert_eq!(p.payload, payload);
                // Pad bytes are zero.
                let n = out.len();
                assert!(out[n - 4 - usize::from(want_pad)..n - 4]
                    .iter()
                    .all(|&b| b == 0));
                // The stale pad_count in hdr is ignored.
                let stale = RoceHeaders {
                    bth: Bth {
                        pad_count: 3 - want_pad,
                        ..hdr.bth
                    },
                    ..hdr
                };
                let mut again = Vec::new();
                emit_frame(&stale, payload, &mut again);
                assert_eq!(again, out);
            }
        }
    }
}

#[test]
fn emitted_ip_and_udp_headers() {
    let f = frame(Opcode::RcSendOnly, false, b"abcd");
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&f[ETH..]).unwrap();
    assert!(ip.dont_fragment() && !ip.more_fragments());
    assert_eq!(
        (ip.identification(), ip.ttl(), f[ETH + 1]),
        (0x4242, 64, 0x02)
    );
    assert_eq!(usize::from(ip.total_len()), f.len() - ETH);
    assert_eq!(ip.header_checksum(), ip.to_header().calc_header_checksum());
    let udp = etherparse::UdpHeaderSlice::from_slice(&f[ETH + 20..]).unwrap();
    assert_eq!(
        (udp.source_port(), udp.destination_port(), udp.checksum()),
        (0xc123, 4791, 0)
    );
    assert_eq!(usize::from(udp.length()), f.len() - ETH - 20);

    let f = frame(Opcode::RcSendOnly, true, b"abcd");
    let ip = etherparse::Ipv6HeaderSlice::from_slice(&f[ETH..]).unwrap();
    assert_eq!(
        (ip.traffic_class(), ip.flow_label().value(), ip.hop_limit()),
        (0x02, 0xabcde, 64)
    );
    assert_eq!(usize::from(ip.payload_length()), f.len() - ETH - 40);
    let udp = etherparse::UdpHeaderSlice::from_slice(&f[ETH + 40..]).unwrap();
    let want = udp
        .to_header()
        .calc_checksum_ipv6_raw(ip.source(), ip.destination(), &f[ETH + 48..])
        .unwrap();
    assert_ne!(udp.checksum(), 0);
    assert_eq!(udp.checksum(), want);
}

#[test]
fn mixed_families_emit_ipv6_with_mapped_address() {
    let mut hdr = sample_headers(Opcode::RcAck, true);
    hdr.ip_src = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9));
    let mut out = Vec::new();
    emit_frame(&hdr, &[], &mut out);
    let p = parse_ok(&out);
    assert_eq!(
        p.hdr.ip_src,
        IpAddr::V6(Ipv4Addr::new(10, 0, 0, 9).to_ipv6_mapped())
    );
    assert_eq!(Gid::from_ip(p.hdr.ip_src).to_ip(), hdr.ip_src);
}

#[test]
fn every_truncation_is_an_error() {
    for op in [
        Opcode::RcSendOnly,
        Opcode::RcWriteOnlyImm,
        Opcode::RcAtomicAck,
        Opcode::UdSendOnlyImm,
    ] {
        for v6 in [false, true] {
            let f = frame(op, v6, b"xyz");
            for n in 0..f.len() {
                assert!(parse_frame(&f[..n]).is_err(), "{op} v6={v6} cut at {n}");
                assert!(parse_roce(&f[..n]).is_err());
            }
        }
    }
}

#[test]
fn trailing_ethernet_padding_is_ignored() {
    for v6 in [false, true] {
        let f = frame(Opcode::RcAck, v6, &[]);
        let mut padded = f.clone();
        padded.resize(f.len().max(60) + 4, 0);
        assert_eq!(parse_ok(&padded), parse_ok(&f));
    }
    // The smallest RoCE frame is below the Ethernet minimum.
    let f = frame(Opcode::RcSendOnly, false, &[]);
    assert_eq!(f.len(), 58);
    let mut padded = f.clone();
    padded.resize(60, 0);
    assert_eq!(parse_ok(&padded).payload, b"");
}

#[test]
fn any_flipped_bit_after_udp_fails_icrc() {
    for v6 in [false, true] {
        let f = frame(Opcode::RcWriteOnlyImm, v6, b"hello");
        let bth = bth_off(&f);
        for i in bth..f.len() {
            for bit in 0..8 {
                if i == bth + 4 {
                    continue; // FECN, BECN and resv6 are masked: see below.
                }
                let mut g = f.clone();
                g[i] ^= 1 << bit;
                assert_eq!(
                    parse_frame(&g),
                    Err(WireError::BadIcrc),
                    "v6={v6} byte {i} bit {bit}"
                );
            }
        }
    }
}

#[test]
fn flipped_bits_in_ip_and_udp_headers_never_pass() {
    for v6 in [false, true] {
        let f = frame(Opcode::RcSendOnly, v6, b"hello");
        let masked: &[usize] = if v6 {
            &[0, 1, 2, 3, 7]
        } else {
            &[1, 8, 10, 11]
        };
        let udp = ETH + ip_hdr_len(&f);
        for i in ETH..udp + 8 {
            if masked.contains(&(i - ETH)) || i == udp + 6 || i == udp + 7 {
                continue;
            }
            for bit in 0..8 {
                let mut g = f.clone();
                g[i] ^= 1 << bit;
                assert!(
                    !matches!(parse_frame(&g), Ok(Frame::Roce(_))),
                    "v6={v6} byte {i} bit {bit}"
                );
            }
        }
    }
}

#[test]
fn masked_fields_do_not_affect_icrc() {
    // IPv4: TOS and TTL (the header checksum is then updated, as a router
    // does), UDP checksum, FECN/BECN/resv6.
    let f = frame(Opcode::RcSendOnly, false, b"hello");
    let bth = bth_off(&f);
    let mut g = f.clone();
    g[ETH + 1] = 0xb9; // TOS: DSCP 46, ECN CE
    g[ETH + 8] = 3; // TTL
    g[ETH + 26..ETH + 28].copy_from_slice(&[0x12, 0x34]); // UDP checksum
    g[bth + 4] |= 0xff; // FECN, BECN, resv6
                        // Fix only the IPv4 header checksum, keep the ICRC.
    let icrc_before = f[f.len() - 4..].to_vec();
    restamp(&mut g);
    assert_eq!(g[g.len() - 4..], icrc_before[..]);
    let p = parse_ok(&g);
    assert_eq!((p.hdr.tclass, p.hdr.ttl), (0xb9, 3));
    assert!(p.hdr.bth.fecn && p.hdr.bth.becn);
    assert_eq!(p.payload, b"hello");

    // IPv6: traffic class, flow label, hop limit, UDP checksum, FECN.
    let f = frame(Opcode::RcSendOnly, true, b"hello");
    let bth = bth_off(&f);
    let mut g = f.clone();
    g[ETH..ETH + 4].copy_from_slice(&[0x6f, 0xf1, 0x23, 0x45]);
    g[ETH + 7] = 1;
    g[ETH + 46] ^= 0xff;
    g[bth + 4] = 0x80;
    let p = parse_ok(&g);
    assert_eq!(
        (p.hdr.tclass, p.hdr.flow_label, p.hdr.ttl),
        (0xff, 0x12345, 1)
    );
    assert!(p.hdr.bth.fecn && !p.hdr.bth.becn);
}

#[test]
fn validation_errors() {
    let base = frame(Opcode::RcSendOnly, false, b"hello");
    let bth = bth_off(&base);
    let edit = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut g = base.clone();
        f(&mut g);
        restamp(&mut g);
        parse_frame(&g).map(|_| ())
    };
    assert_eq!(edit(&|g| g[bth + 1] |= 0x01), Err(WireError::BadTver(1)));
    assert_eq!(
        edit(&|g| g[bth] = 0x15),
        Err(WireError::UnknownOpcode(0x15))
    );
    assert_eq!(
        edit(&|g| g[bth] = 0x81),
        Err(WireError::UnknownOpcode(0x81))
    );
    // Payload "hello" + 3 pad bytes; an ACK carries no payload.
    assert_eq!(
        edit(&|g| g[bth] = Opcode::RcAck as u8),
        Err(WireError::BadLength)
    );
    // An atomic needs 28 more header bytes than there are.
    assert_eq!(
        edit(&|g| g[bth] = Opcode::RcFetchAdd as u8),
        Err(WireError::BadLength)
    );
    // UDP length disagrees with the IP length.
    assert_eq!(edit(&|g| g[ETH + 25] -= 4), Err(WireError::BadLength));
    // Version 5 is not IPv4.
    assert_eq!(edit(&|g| g[ETH] = 0x55), Err(WireError::BadIpHeader));
    // IHL 4 is too small.
    assert_eq!(edit(&|g| g[ETH] = 0x44), Err(WireError::BadIpHeader));
    // Total length below the header length.
    assert_eq!(
        edit(&|g| g[ETH + 2..ETH + 4].copy_from_slice(&[0, 16])),
        Err(WireError::BadIpHeader)
    );
    // Total length beyond the frame.
    assert_eq!(edit(&|g| g[ETH + 3] += 1), Err(WireError::Truncated));
    // More-fragments.
    assert_eq!(edit(&|g| g[ETH + 6] = 0x20), Err(WireError::Fragmented));
    // Bad IPv4 header checksum.
    let mut g = base.clone();
    g[ETH + 10] ^= 1;
    assert_eq!(parse_frame(&g).map(|_| ()), Err(WireError::BadIpChecksum));

    // Pad count larger than the payload: an empty SEND claiming 3 pad bytes.
    let mut g = frame(Opcode::RcSendOnly, false, &[]);
    let b = bth_off(&g);
    g[b + 1] |= 0x30;
    restamp(&mut g);
    assert_eq!(parse_frame(&g).map(|_| ()), Err(WireError::BadPadCount));

    // Payload + pad not a multiple of 4: drop one byte, fix both lengths.
    let mut g = base.clone();
    g.remove(g.len() - 5);
    g[ETH + 3] -= 1;
    g[ETH + 25] -= 1;
    restamp(&mut g);
    assert_eq!(parse_frame(&g).map(|_| ()), Err(WireError::BadLength));

    // UDP payload too short for a BTH + ICRC.
    let mut g = base.clone();
    g.truncate(ETH + 20 + 8 + 12);
    g[ETH + 2..ETH + 4].copy_from_slice(&40u16.to_be_bytes());
    g[ETH + 24..ETH + 26].copy_from_slice(&20u16.to_be_bytes());
    restamp(&mut g);
    assert_eq!(parse_frame(&g).map(|_| ()), Err(WireError::BadLength));
}

#[test]
fn ipv6_validation_errors() {
    let base = frame(Opcode::RcAck, true, &[]);
    let mut g = base.clone();
    g[ETH] = 0x70;
    assert_eq!(parse_frame(&g).map(|_| ()), Err(WireError::BadIpHeader));
    let mut g = base.clone();
    g[ETH + 5] += 1;
    assert_eq!(parse_frame(&g).map(|_| ()), Err(WireError::Truncated));
    let mut g = base.clone();
    g[ETH + 5] -= 1;
    assert_eq!(parse_frame(&g).map(|_| ()), Err(WireError::BadLength));
}

#[test]
fn non_roce_traffic_is_other() {
    let base = frame(Opcode::RcSendOnly, false, b"hello");
    let other = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut g = base.clone();
        f(&mut g);
        restamp(&mut g);
        (
            matches!(parse_frame(&g), Ok(Frame::Other)),
            parse_roce(&g).map(|_| ()),
        )
    };
    // Other UDP port.
    assert_eq!(
        other(&|g| g[ETH + 23] = 0xb8),
        (true, Err(WireError::NotRoce))
    );
    // TCP.
    assert_eq!(other(&|g| g[ETH + 9] = 6), (true, Err(WireError::NotRoce)));
    // Non-first fragment.
    assert_eq!(other(&|g| g[ETH + 7] = 1), (true, Err(WireError::NotRoce)));
    // VLAN-tagged and other ethertypes.
    assert_eq!(
        other(&|g| g[12..14].copy_from_slice(&[0x81, 0])),
        (true, Err(WireError::NotIp))
    );
    assert_eq!(
        other(&|g| g[12..14].copy_from_slice(&[0x88, 0xcc])),
        (true, Err(WireError::NotIp))
    );
    // IPv6 with a non-UDP next header (e.g. an extension header).
    let mut g = frame(Opcode::RcAck, true, &[]);
    g[ETH + 6] = 0;
    assert!(matches!(parse_frame(&g), Ok(Frame::Other)));
    assert_eq!(parse_roce(&g).map(|_| ()), Err(WireError::NotRoce));
    // Short junk.
    assert_eq!(parse_frame(&[0u8; 13]), Err(WireError::Truncated));
    assert!(matches!(parse_frame(&[0u8; 14]), Ok(Frame::Other)));
}

#[test]
fn icrc_matches_linux_rxe_seed() {
    // rxe seeds its CRC with 0xdebb20e3, "the result of computing a CRC with
    // a seed of 0xffffffff and 8 bytes of 0xff"; check our prefix agrees by
    // comparing against a CRC over the 8 bytes alone.
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    assert_eq!(!h.finalize(), 0xdebb_20e3);
}

#[test]
fn every_error_has_a_message() {
    for e in [
        WireError::Truncated,
        WireError::NotIp,
        WireError::NotRoce,
        WireError::BadIpHeader,
        WireError::BadIpChecksum,
        WireError::Fragmented,
        WireError::UnknownOpcode(0x15),
        WireError::BadTver(1),
        WireError::BadPadCount,
        WireError::BadLength,
        WireError::BadIcrc,
        WireError::NotCmMad {
            base_version: 1,
            mgmt_class: 0x04,
            class_version: 1,
            method: 0x01,
        },
        WireError::UnknownCmAttribute(0x1b),
        WireError::BadCmaHeader {
            version: 1,
            ip_version: 4,
        },
    ] {
        assert!(!e.to_string().is_empty());
    }
    assert_eq!(
        WireError::UnknownOpcode(0x15).to_string(),
        "unknown BTH opcode 0x15"
    );
    assert_eq!(
        WireError::NotCmMad {
            base_version: 1,
            mgmt_class: 0x04,
            class_version: 1,
            method: 0x01
        }
        .to_string(),
        "not a CM MAD (base version 1, class 0x04, class version 1, method 0x01)"
    );
    assert_eq!(
        WireError::UnknownCmAttribute(0x1b).to_string(),
        "unknown CM attribute 0x001b"
    );
}

#[test]
fn frames_without_icrc_parse_only_unchecked_and_seal_to_the_emitted_frame() {
    let payload: Vec<u8> = (0..1003u32).map(|i| (i * 7) as u8).collect();
    for v6 in [false, true] {
        let hdr = sample_headers(Opcode::RcSendOnly, v6);
        let full = frame(Opcode::RcSendOnly, v6, &payload);
        let mut bare = Vec::new();
        let copy = |b: &mut [u8]| {
            b.copy_from_slice(&payload);
            Ok::<(), ()>(())
        };
        emit_frame_icrc(&hdr, payload.len(), &mut bare, Icrc::Unneeded, copy).unwrap();
        assert_eq!(bare.len(), full.len());
        assert_eq!(&bare[bare.len() - 4..], &[0; 4], "ICRC left zero (v6 {v6})");
        assert_eq!(parse_roce(&bare).err(), Some(WireError::BadIcrc));
        let p = parse_roce_with(&bare, Icrc::Unneeded).unwrap();
        assert_eq!(
            (p.hdr.bth, p.payload),
            (parse_ok(&full).hdr.bth, &payload[..])
        );
        seal_icrc(&mut bare).unwrap();
        assert_eq!(bare, full, "sealed = emitted with the ICRC (v6 {v6})");
    }
    // Not a RoCEv2 frame: an error, and nothing written.
    let mut junk = vec![0xa5u8; 80];
    assert!(seal_icrc(&mut junk).is_err());
    assert_eq!(junk, vec![0xa5u8; 80]);
}

#[test]
fn a_reused_buffer_holds_exactly_the_new_frame() {
    // Pad bytes included (1003 bytes: 1 of pad), over both IP versions.
    let payload: Vec<u8> = (0..1003u32).map(|i| (i * 3) as u8).collect();
    for v6 in [false, true] {
        let fresh = frame(Opcode::RcWriteOnlyImm, v6, &payload);
        for old in [vec![0xee; 9000], vec![0xee; 10], vec![0xee; fresh.len()]] {
            let mut out = old;
            emit_frame(
                &sample_headers(Opcode::RcWriteOnlyImm, v6),
                &payload,
                &mut out,
            );
            assert_eq!(out, fresh, "v6 {v6}");
        }
    }
}
