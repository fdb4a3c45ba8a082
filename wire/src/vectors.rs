//! Known-good RoCEv2 frames produced by scapy 2.8.0 (`scapy.contrib.roce`,
//! which computes the ICRC as Linux rxe does) and checked here byte for
//! byte against `parse_frame` and `emit_frame`.
//!
//! Generated with, for example:
//!
//! ```text
//! Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
//!   / IP(src="192.168.1.1", dst="192.168.1.2", id=0x1234, flags="DF", ttl=64)
//!   / UDP(sport=0xc000, dport=4791, chksum=0)
//!   / BTH(opcode=0x04, padcount=3, pkey=0xffff, dqpn=0x11, ackreq=1, psn=0x100, icrc=None)
//!   / Raw(b"hello" + b"\0" * 3)
//! ```
//!
//! (IPv6 frames: `IPv6(src="fd00::1", dst="fd00::2", hlim=64, ...)` and
//! scapy's computed UDP checksum.)

use std::net::IpAddr;

use super::*;

/// The bytes that `s` spells in hex digits, with spaces between them where
/// they help the reader (one string per header below). Fails to compile
/// unless `s` holds exactly `N` bytes.
const fn hex<const N: usize>(s: &str) -> [u8; N] {
    const fn nibble(c: u8) -> u8 {
        match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => panic!("not a lower-case hex digit"),
        }
    }
    let s = s.as_bytes();
    let mut out = [0; N];
    let (mut i, mut n) = (0, 0);
    while i < s.len() {
        if s[i] == b' ' {
            i += 1;
            continue;
        }
        assert!(n < N && i + 1 < s.len(), "more bytes than the array holds");
        out[n] = nibble(s[i]) << 4 | nibble(s[i + 1]);
        n += 1;
        i += 2;
    }
    assert!(n == N, "fewer bytes than the array holds");
    out
}

/// Every frame's Ethernet header, 02:00:00:00:00:01 to 02:00:00:00:00:02,
/// with the ethertype given.
macro_rules! eth {
    ($ethertype:literal) => {
        concat!("020000000002 020000000001 ", $ethertype)
    };
}

/// The IPv6 frames' source and destination addresses, fd00::1 and fd00::2.
macro_rules! ipv6_addresses {
    () => {
        "fd000000 00000000 00000000 00000001 fd000000 00000000 00000000 00000002"
    };
}

// Ether / IP / UDP 192.168.1.1:49152 > 192.168.1.2:4791 / BTH / Raw
const V4_SEND_ONLY: [u8; 66] = hex(concat!(
    eth!("0800"),                                   // Ethernet: IPv4
    "45000034 12344000 4011a531 c0a80101 c0a80102", // IPv4
    "c00012b7 00200000",                            // UDP
    "0430ffff 00000011 80000100",                   // BTH
    "68656c6c 6f000000",                            // payload "hello", 3 bytes pad
    "0c7a0640",                                     // ICRC
));
// Ether / IP / UDP 192.168.1.1:49153 > 192.168.1.2:4791 / BTH / Raw
const V4_WRITE_ONLY_IMM: [u8; 86] = hex(concat!(
    eth!("0800"),                                   // Ethernet: IPv4
    "45020048 12344000 4011a51b c0a80101 c0a80102", // IPv4
    "c00112b7 00340000",                            // UDP
    "0b80ffff 00000123 80fffffe",                   // BTH
    "00007f00 12345678 abcd1234 00000008",          // RETH
    "deadbeef",                                     // ImmDt
    "00010203 04050607",                            // payload 0..8
    "491bd333",                                     // ICRC
));
// Ether / IP / UDP 192.168.1.1:49154 > 192.168.1.2:4791 / BTH / Raw
const V4_COMPARE_SWAP: [u8; 86] = hex(concat!(
    eth!("0800"),                                                     // Ethernet: IPv4
    "45000048 12344000 4011a51d c0a80101 c0a80102",                   // IPv4
    "c00212b7 00340000",                                              // UDP
    "1300ffff 00000042 80000007",                                     // BTH
    "00000000 00001000 55aa55aa 11111111 11111111 22222222 22222222", // AtomicETH
    "ac6a0d98",                                                       // ICRC
));
// Ether / IPv6 / UDP fd00::1:49155 > fd00::2:4791 / BTH / AETH
const V6_ACK: [u8; 82] = hex(concat!(
    eth!("86dd"),                 // Ethernet: IPv6
    "60012345 001c1140",          // IPv6
    ipv6_addresses!(),            // IPv6 source and destination
    "c00312b7 001c7aa8",          // UDP
    "1100ffff 00000777 00123456", // BTH
    "1f000010",                   // AETH
    "0fc13c9e",                   // ICRC
));
// Ether / IPv6 / UDP fd00::1:49156 > fd00::2:4791 / BTH / Raw
const V6_UD_SEND_ONLY_IMM: [u8; 94] = hex(concat!(
    eth!("86dd"),                 // Ethernet: IPv6
    "66000000 00281140",          // IPv6
    ipv6_addresses!(),            // IPv6 source and destination
    "c00412b7 0028c46d",          // UDP
    "6510ffff 00000001 00000005", // BTH
    "11111111 00000003",          // DETH
    "01020304",                   // ImmDt
    "61626300",                   // payload "abc", 1 byte pad
    "0e751057",                   // ICRC
));
// Ether / IPv6 / UDP fd00::1:49157 > fd00::2:4791 / BTH / Raw
const V6_READ_RESPONSE_ONLY: [u8; 86] = hex(concat!(
    eth!("86dd"),                 // Ethernet: IPv6
    "60000000 00201140",          // IPv6
    ipv6_addresses!(),            // IPv6 source and destination
    "c00512b7 00207b0e",          // UDP
    "1000ffff 00000009 00000010", // BTH
    "00000003",                   // AETH
    "64617461",                   // payload "data"
    "e1d4ed2a",                   // ICRC
));

const ALL: [(&str, &[u8]); 6] = [
    ("V4_SEND_ONLY", &V4_SEND_ONLY),
    ("V4_WRITE_ONLY_IMM", &V4_WRITE_ONLY_IMM),
    ("V4_COMPARE_SWAP", &V4_COMPARE_SWAP),
    ("V6_ACK", &V6_ACK),
    ("V6_UD_SEND_ONLY_IMM", &V6_UD_SEND_ONLY_IMM),
    ("V6_READ_RESPONSE_ONLY", &V6_READ_RESPONSE_ONLY),
];

fn roce(frame: &[u8]) -> RocePacket<'_> {
    match parse_frame(frame) {
        Ok(Frame::Roce(p)) => p,
        other => panic!("not RoCE: {other:?}"),
    }
}

#[test]
fn scapy_frames_parse_and_re_emit_byte_for_byte() {
    let mut out = Vec::new();
    for (name, frame) in ALL {
        let p = roce(frame);
        emit_frame(&p.hdr, p.payload, &mut out);
        assert_eq!(out, frame, "{name}");
        // ICRC as icrc() reports it.
        let n = frame.len();
        assert_eq!(
            icrc(&frame[14..n - 4]).to_be_bytes(),
            frame[n - 4..],
            "{name}"
        );
    }
}

#[test]
fn scapy_send_only_fields() {
    let p = roce(&V4_SEND_ONLY);
    assert_eq!(p.payload, b"hello");
    let h = &p.hdr;
    assert_eq!(h.eth_src, [2, 0, 0, 0, 0, 1]);
    assert_eq!(h.eth_dst, [2, 0, 0, 0, 0, 2]);
    assert_eq!(h.ip_src, "192.168.1.1".parse::<IpAddr>().unwrap());
    assert_eq!(h.ip_dst, "192.168.1.2".parse::<IpAddr>().unwrap());
    assert_eq!(
        (h.ip_id, h.ttl, h.tclass, h.flow_label, h.udp_src),
        (0x1234, 64, 0, 0, 0xc000)
    );
    assert_eq!(
        h.bth,
        Bth {
            opcode: Opcode::RcSendOnly,
            solicited: false,
            mig_req: false,
            pad_count: 3,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x11,
            ack_req: true,
            psn: 0x100,
        }
    );
    assert_eq!(
        (h.reth, h.aeth, h.deth, h.immdt, h.ieth),
        (None, None, None, None, None)
    );
    assert_eq!((h.atomic_eth, h.atomic_ack_eth), (None, None));
}

#[test]
fn scapy_extension_header_fields() {
    let p = roce(&V4_WRITE_ONLY_IMM);
    assert_eq!(p.hdr.tclass, 0x02);
    assert!(p.hdr.bth.solicited);
    assert_eq!(p.hdr.bth.psn, 0xff_fffe);
    assert_eq!(
        p.hdr.reth,
        Some(Reth {
            va: 0x7f00_1234_5678,
            rkey: 0xabcd_1234,
            dma_len: 8
        })
    );
    assert_eq!(p.hdr.immdt, Some(Immdt([0xde, 0xad, 0xbe, 0xef])));
    assert_eq!(p.payload, &[0, 1, 2, 3, 4, 5, 6, 7]);

    let p = roce(&V4_COMPARE_SWAP);
    assert_eq!(
        p.hdr.atomic_eth,
        Some(AtomicEth {
            va: 0x1000,
            rkey: 0x55aa_55aa,
            swap_add: 0x1111_1111_1111_1111,
            compare: 0x2222_2222_2222_2222
        })
    );
    assert!(p.payload.is_empty());

    let p = roce(&V6_ACK);
    assert_eq!(p.hdr.ip_dst, "fd00::2".parse::<IpAddr>().unwrap());
    assert_eq!((p.hdr.ttl, p.hdr.flow_label, p.hdr.ip_id), (64, 0x12345, 0));
    assert_eq!(
        p.hdr.aeth,
        Some(Aeth {
            syndrome: 0x1f,
            msn: 0x10
        })
    );
    assert_eq!(p.hdr.aeth.unwrap().kind(), AethKind::Ack { credits: 31 });

    let p = roce(&V6_UD_SEND_ONLY_IMM);
    assert_eq!(p.hdr.tclass, 0x60);
    assert_eq!(
        p.hdr.deth,
        Some(Deth {
            qkey: 0x1111_1111,
            src_qp: 3
        })
    );
    assert_eq!(p.hdr.immdt, Some(Immdt([1, 2, 3, 4])));
    assert_eq!(p.payload, b"abc");

    let p = roce(&V6_READ_RESPONSE_ONLY);
    assert_eq!(p.hdr.aeth, Some(Aeth::ack(3, 0)));
    assert_eq!(p.payload, b"data");
}

#[test]
fn scapy_frames_with_ethernet_padding() {
    // A receiver sees frames padded to 60 bytes or with trailing bytes.
    for (name, frame) in ALL {
        let mut padded = frame.to_vec();
        padded.resize(frame.len().max(60) + 7, 0xee);
        assert_eq!(roce(&padded), roce(frame), "{name}");
    }
}

// The generator (Python, scapy 2.8.0) that produced the arrays above:
//
// import struct
// from scapy.all import Ether, IP, IPv6, UDP, Raw, raw
// from scapy.contrib.roce import BTH, AETH
//
// E = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
// def v4(**kw):
//     return Ether(**E)/IP(src="192.168.1.1", dst="192.168.1.2", id=0x1234, flags="DF", ttl=64, **kw)
// def v6(**kw):
//     return Ether(**E)/IPv6(src="fd00::1", dst="fd00::2", hlim=64, **kw)
//
// vecs = {}
// # 1: IPv4 RC SEND ONLY, 5-byte payload, pad 3
// vecs["V4_SEND_ONLY"] = v4()/UDP(sport=0xc000, dport=4791, chksum=0)/BTH(opcode=0x04, padcount=3, pkey=0xffff, dqpn=0x11, ackreq=1, psn=0x100, icrc=None)/Raw(b"hello" + b"\0"*3)
// # 2: IPv4 RC WRITE ONLY IMM: RETH + ImmDt + 8 bytes, TOS 0x02
// reth = struct.pack("!QII", 0x00007f0012345678, 0xabcd1234, 8)
// vecs["V4_WRITE_ONLY_IMM"] = v4(tos=0x02)/UDP(sport=0xc001, dport=4791, chksum=0)/BTH(opcode=0x0b, solicited=1, pkey=0xffff, dqpn=0x000123, ackreq=1, psn=0xfffffe, icrc=None)/Raw(reth + bytes([0xde,0xad,0xbe,0xef]) + bytes(range(8)))
// # 3: IPv4 RC COMPARE SWAP
// ateth = struct.pack("!QIQQ", 0x1000, 0x55aa55aa, 0x1111111111111111, 0x2222222222222222)
// vecs["V4_COMPARE_SWAP"] = v4()/UDP(sport=0xc002, dport=4791, chksum=0)/BTH(opcode=0x13, pkey=0xffff, dqpn=0x42, ackreq=1, psn=7, icrc=None)/Raw(ateth)
// # 4: IPv6 RC ACK (AETH credits 31)
// vecs["V6_ACK"] = v6(fl=0x12345)/UDP(sport=0xc003, dport=4791)/BTH(opcode=0x11, pkey=0xffff, dqpn=0x000777, psn=0x123456, icrc=None)/AETH(syndrome=0x1f, msn=0x000010)
// # 5: IPv6 UD SEND ONLY IMM: DETH + ImmDt + 3 bytes, pad 1, tclass 0x60
// deth = struct.pack("!II", 0x11111111, 0x000003)
// vecs["V6_UD_SEND_ONLY_IMM"] = v6(tc=0x60)/UDP(sport=0xc004, dport=4791)/BTH(opcode=0x65, padcount=1, pkey=0xffff, dqpn=0x1, psn=0x5, icrc=None)/Raw(deth + b"\x01\x02\x03\x04" + b"abc" + b"\0")
// # 6: IPv6 RC READ RESPONSE ONLY: AETH + 4 bytes
// vecs["V6_READ_RESPONSE_ONLY"] = v6()/UDP(sport=0xc005, dport=4791)/BTH(opcode=0x10, pkey=0xffff, dqpn=0x9, psn=0x10, icrc=None)/Raw(struct.pack("!I", 0x00000003) + b"data")
//
// for name, p in vecs.items():
//     b = raw(p)
//     print(f"/// {p.summary()}")
//     print(f"const {name}: [u8; {len(b)}] = [")
//     for i in range(0, len(b), 16):
//         print("    " + " ".join(f"0x{x:02x}," for x in b[i:i+16]))
//     print("];")
//
// Its arrays stand above as one hex string per header.
