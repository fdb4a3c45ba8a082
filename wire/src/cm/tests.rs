use std::net::Ipv4Addr;

use super::super::{CmaAddrs, CmaHdr};
use super::*;

/// A MAD built by hand at absolute offsets (the kernel's offsets plus
/// the 24-byte header), never by the code under test: a CM header of
/// attribute `attr` and TID `tid`, then `fields` written where they go.
fn mad(attr: u16, tid: u64, fields: &[(usize, &[u8])]) -> [u8; 256] {
    let mut m = [0u8; 256];
    m[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    m[8..16].copy_from_slice(&tid.to_be_bytes());
    m[16..18].copy_from_slice(&attr.to_be_bytes());
    for (at, bytes) in fields {
        m[*at..*at + bytes.len()].copy_from_slice(bytes);
    }
    m
}

/// Parses a hand-built MAD, checks that emitting the message gives the
/// same 256 bytes back, and returns the message.
fn parse_and_reemit(bytes: &[u8; 256]) -> CmMessage {
    let m = Mad::parse(bytes).unwrap();
    let msg = CmMessage::parse(&m).unwrap();
    assert_eq!(msg.to_mad(m.hdr.tid, m.hdr.attr_mod).to_bytes(), *bytes);
    msg
}

fn gid4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
    Ipv4Addr::new(a, b, c, d).to_ipv6_mapped().octets()
}

#[test]
fn req_at_the_kernels_offsets() {
    let mut cma = [0u8; 36];
    cma[1] = 0x40; // cma_hdr: version 0, IPv4
    cma[2..4].copy_from_slice(&[0xc3, 0x50]); // source port 50000
    cma[16..20].copy_from_slice(&[10, 0, 0, 21]);
    cma[32..36].copy_from_slice(&[10, 0, 0, 22]);
    let bytes = mad(
        0x0010,
        0x0000_0001_1122_3344,
        &[
            (24, &[0x11, 0x22, 0x33, 0x44]),             // local comm ID
            (29, &[0xab, 0xcd, 0xef]),                   // vendor ID (byte 28 reserved)
            (32, &[0, 0, 0, 0, 0x01, 0x06, 0x1d, 0x2f]), // service ID: TCP 7471
            (40, &[2, 0, 0, 0xff, 0xfe, 0, 0, 0x15]),    // local CA GUID
            (52, &[0x01, 0x02, 0x03, 0x04]),             // local Q_Key
            (56, &[0x12, 0x34, 0x56, 0x10]),             // local QPN, responder resources
            (60, &[0x00, 0x00, 0x07, 0x0f]),             // local EECN, initiator depth
            (64, &[0x00, 0x00, 0x09, 0xa1]), // remote EECN; timeout 20, RC, flow control
            (68, &[0xab, 0xcd, 0xef, 0xa7]), // starting PSN; timeout 20, retry 7
            (72, &[0xff, 0xff, 0x37, 0xf8]), // P_Key; MTU 3, RNR 7; 15 retries, SRQ
            (76, &[0xff, 0xff, 0xff, 0xff]), // primary LIDs: permissive
            (80, &gid4(10, 0, 0, 21)),       // primary local GID
            (96, &gid4(10, 0, 0, 22)),       // primary remote GID
            (112, &[0xab, 0xcd, 0xe0, 0x10]), // flow label 0xabcde, rate 16
            (116, &[0x20, 0x40, 0x50, 0x90]), // tclass, hop limit 64, SL 5, ACK timeout 18
            (163, &[0x04]),                  // SAP supported (alternate path empty)
            (164, &cma),
            (200, b"hello"),
        ],
    );
    let CmMessage::Req(req) = parse_and_reemit(&bytes) else {
        panic!("not a REQ");
    };
    assert_eq!(req.local_comm_id, 0x1122_3344);
    assert_eq!(req.vendor_id, 0xab_cdef);
    assert_eq!(req.service_id, 0x0106_1d2f);
    assert_eq!(req.local_ca_guid, 0x0200_00ff_fe00_0015);
    assert_eq!(req.local_qkey, 0x0102_0304);
    assert_eq!((req.local_qpn, req.responder_resources), (0x12_3456, 0x10));
    assert_eq!((req.local_eecn, req.initiator_depth), (7, 15));
    assert_eq!(req.remote_eecn, 9);
    assert_eq!(req.remote_cm_response_timeout, 20);
    assert_eq!(req.transport_service_type, transport_type::RC);
    assert!(req.end_to_end_flow_control);
    assert_eq!(req.starting_psn, 0xab_cdef);
    assert_eq!((req.local_cm_response_timeout, req.retry_count), (20, 7));
    assert_eq!(req.partition_key, 0xffff);
    assert_eq!(
        (req.path_mtu, req.rdc_exists, req.rnr_retry_count),
        (3, false, 7)
    );
    assert_eq!(
        (req.max_cm_retries, req.srq, req.extended_transport_type),
        (15, true, 0)
    );
    let p = req.primary_path;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xffff));
    assert_eq!(p.local_gid, Gid(gid4(10, 0, 0, 21)));
    assert_eq!(p.remote_gid, Gid(gid4(10, 0, 0, 22)));
    assert_eq!((p.flow_label, p.packet_rate), (0xabcde, 16));
    assert_eq!((p.traffic_class, p.hop_limit), (0x20, 64));
    assert_eq!((p.sl, p.subnet_local, p.local_ack_timeout), (5, false, 18));
    assert_eq!(req.alternate_path, CmPath::default());
    assert!(req.sap_supported);
    let hdr = CmaHdr::parse(&req.private_data).unwrap();
    assert_eq!(hdr.src_port, 50000);
    assert_eq!(
        hdr.addrs,
        CmaAddrs::V4 {
            src: Ipv4Addr::new(10, 0, 0, 21),
            dst: Ipv4Addr::new(10, 0, 0, 22)
        }
    );
    assert_eq!(&req.private_data[36..41], b"hello");
}

#[test]
fn req_bitfields_one_at_a_time() {
    // Each narrow field alone at its maximum, against the kernel's masks.
    let base = CmReq::parse(&[0u8; 232]).unwrap();
    let cases: Vec<(CmReq, usize, u8)> = vec![
        (
            CmReq {
                remote_cm_response_timeout: 31,
                ..base.clone()
            },
            43,
            0xf8,
        ),
        (
            CmReq {
                transport_service_type: 3,
                ..base.clone()
            },
            43,
            0x06,
        ),
        (
            CmReq {
                end_to_end_flow_control: true,
                ..base.clone()
            },
            43,
            0x01,
        ),
        (
            CmReq {
                local_cm_response_timeout: 31,
                ..base.clone()
            },
            47,
            0xf8,
        ),
        (
            CmReq {
                retry_count: 7,
                ..base.clone()
            },
            47,
            0x07,
        ),
        (
            CmReq {
                path_mtu: 15,
                ..base.clone()
            },
            50,
            0xf0,
        ),
        (
            CmReq {
                rdc_exists: true,
                ..base.clone()
            },
            50,
            0x08,
        ),
        (
            CmReq {
                rnr_retry_count: 7,
                ..base.clone()
            },
            50,
            0x07,
        ),
        (
            CmReq {
                max_cm_retries: 15,
                ..base.clone()
            },
            51,
            0xf0,
        ),
        (
            CmReq {
                srq: true,
                ..base.clone()
            },
            51,
            0x08,
        ),
        (
            CmReq {
                extended_transport_type: 7,
                ..base.clone()
            },
            51,
            0x07,
        ),
        (
            CmReq {
                sap_supported: true,
                ..base.clone()
            },
            139,
            0x04,
        ),
    ];
    for (req, at, byte) in cases {
        let mut b = [0u8; 232];
        req.emit(&mut b);
        let mut want = [0u8; 232];
        want[at] = byte;
        assert_eq!(b, want, "field at byte {at}");
        assert_eq!(CmReq::parse(&b).unwrap(), req);
    }
    // Wider values are masked to the field.
    let mut b = [0u8; 232];
    CmReq {
        local_qpn: 0xff12_3456,
        starting_psn: 0x0100_0001,
        retry_count: 9,
        ..base
    }
    .emit(&mut b);
    assert_eq!(&b[32..36], &[0x12, 0x34, 0x56, 0]);
    assert_eq!(&b[44..48], &[0, 0, 1, 0x01]);
}

#[test]
fn rep_at_the_kernels_offsets() {
    let bytes = mad(
        0x0013,
        0x0000_0001_1122_3344,
        &[
            (24, &[0x55, 0x66, 0x77, 0x88]),          // local comm ID
            (28, &[0x11, 0x22, 0x33, 0x44]),          // remote comm ID
            (32, &[0, 0, 0, 0]),                      // local Q_Key
            (36, &[0x00, 0x0a, 0xbc, 0x01]),          // local QPN; vendor ID high
            (40, &[0x00, 0x00, 0x00, 0x02]),          // local EECN; vendor ID middle
            (44, &[0x65, 0x43, 0x21, 0x03]),          // starting PSN; vendor ID low
            (48, &[0x10, 0x0f, 0x7d, 0xf0]), // resp. res., depth; ACK delay 15, failover 2, FC; RNR 7, SRQ
            (52, &[2, 0, 0, 0xff, 0xfe, 0, 0, 0x16]), // local CA GUID
            (60, b"rep private"),
            (255, &[0x99]), // the last private data byte
        ],
    );
    let CmMessage::Rep(rep) = parse_and_reemit(&bytes) else {
        panic!("not a REP");
    };
    assert_eq!(
        (rep.local_comm_id, rep.remote_comm_id),
        (0x5566_7788, 0x1122_3344)
    );
    assert_eq!(rep.local_qkey, 0);
    assert_eq!(rep.local_qpn, 0xabc);
    assert_eq!(rep.vendor_id, 0x01_0203);
    assert_eq!(rep.local_eecn, 0);
    assert_eq!(rep.starting_psn, 0x65_4321);
    assert_eq!((rep.responder_resources, rep.initiator_depth), (0x10, 0x0f));
    assert_eq!(rep.target_ack_delay, 15);
    assert_eq!(rep.failover_accepted, 2);
    assert!(rep.end_to_end_flow_control);
    assert_eq!((rep.rnr_retry_count, rep.srq), (7, true));
    assert_eq!(rep.local_ca_guid, 0x0200_00ff_fe00_0016);
    assert_eq!(&rep.private_data[..11], b"rep private");
    assert_eq!(rep.private_data[195], 0x99);
}

#[test]
fn rej_mra_rtu_dreq_drep_at_the_kernels_offsets() {
    let ari = gid4(10, 0, 0, 9);
    let bytes = mad(
        0x0012,
        5,
        &[
            (24, &[0, 0, 0, 0]),
            (28, &[0x11, 0x22, 0x33, 0x44]),
            (32, &[0x40, 0x20, 0x00, 0x0c]), // REP rejected; ARI length 16 (<< 1); reason 12
            (36, &ari),
            (108, &[0x5a; 148]),
        ],
    );
    let CmMessage::Rej(rej) = parse_and_reemit(&bytes) else {
        panic!("not a REJ");
    };
    assert_eq!((rej.local_comm_id, rej.remote_comm_id), (0, 0x1122_3344));
    assert_eq!(rej.message_rejected, msg_response::REP);
    assert_eq!(rej.ari_length, 16);
    assert_eq!(rej.reason, rej_reason::INVALID_GID);
    assert_eq!(&rej.ari[..16], &ari);
    assert_eq!(rej.private_data, [0x5a; 148]);

    let bytes = mad(
        0x0011,
        6,
        &[
            (24, &[0, 0, 0, 1]),
            (28, &[0, 0, 0, 2]),
            (32, &[0x80, 0xc0]),
            (34, b"mra"),
        ],
    );
    let CmMessage::Mra(mra) = parse_and_reemit(&bytes) else {
        panic!("not an MRA");
    };
    assert_eq!((mra.local_comm_id, mra.remote_comm_id), (1, 2));
    assert_eq!(
        (mra.message_mraed, mra.service_timeout),
        (msg_response::OTHER, 24)
    );
    assert_eq!(&mra.private_data[..3], b"mra");

    let bytes = mad(
        0x0014,
        7,
        &[(24, &[0, 0, 0, 3]), (28, &[0, 0, 0, 4]), (32, b"rtu")],
    );
    assert_eq!(
        parse_and_reemit(&bytes),
        CmMessage::Rtu(CmRtu {
            local_comm_id: 3,
            remote_comm_id: 4,
            private_data: {
                let mut p = [0u8; 224];
                p[..3].copy_from_slice(b"rtu");
                p
            },
        })
    );

    let bytes = mad(
        0x0015,
        8,
        &[
            (24, &[0, 0, 0, 5]),
            (28, &[0, 0, 0, 6]),
            (32, &[0x12, 0x34, 0x56]),
            (36, b"dreq"),
        ],
    );
    let CmMessage::Dreq(dreq) = parse_and_reemit(&bytes) else {
        panic!("not a DREQ");
    };
    assert_eq!((dreq.local_comm_id, dreq.remote_comm_id), (5, 6));
    assert_eq!(dreq.remote_qpn_eecn, 0x12_3456);
    assert_eq!(&dreq.private_data[..4], b"dreq");

    let bytes = mad(
        0x0016,
        9,
        &[(24, &[0, 0, 0, 6]), (28, &[0, 0, 0, 5]), (255, &[1])],
    );
    let CmMessage::Drep(drep) = parse_and_reemit(&bytes) else {
        panic!("not a DREP");
    };
    assert_eq!((drep.local_comm_id, drep.remote_comm_id), (6, 5));
    assert_eq!(drep.private_data[223], 1);
}

#[test]
fn sidr_at_the_kernels_offsets() {
    let bytes = mad(
        0x0017,
        10,
        &[
            (24, &[0xde, 0xad, 0xbe, 0xef]),
            (28, &[0xff, 0xff]),
            (32, &[0, 0, 0, 0, 0x01, 0x11, 0x1d, 0x2f]), // UDP port 7471
            (40, &[0x00, 0x40]),                         // cma_hdr start
        ],
    );
    let CmMessage::SidrReq(req) = parse_and_reemit(&bytes) else {
        panic!("not a SIDR_REQ");
    };
    assert_eq!(req.request_id, 0xdead_beef);
    assert_eq!(req.partition_key, 0xffff);
    assert_eq!(req.service_id, 0x0111_1d2f);
    assert_eq!(&req.private_data[..2], &[0x00, 0x40]);

    let bytes = mad(
        0x0018,
        10,
        &[
            (24, &[0xde, 0xad, 0xbe, 0xef]),
            (28, &[0x00, 0x00, 0xaa, 0xbb]), // status, info length, vendor ID high
            (32, &[0x00, 0x01, 0x23, 0xcc]), // QPN 0x123; vendor ID low
            (36, &[0, 0, 0, 0, 0x01, 0x11, 0x1d, 0x2f]),
            (44, &[0x01, 0x23, 0x45, 0x67]), // Q_Key RDMA_UDP_QKEY
            (48, &[0x77; 72]),
            (120, &[0x88; 136]),
        ],
    );
    let CmMessage::SidrRep(rep) = parse_and_reemit(&bytes) else {
        panic!("not a SIDR_REP");
    };
    assert_eq!(rep.request_id, 0xdead_beef);
    assert_eq!(rep.status, sidr_status::SUCCESS);
    assert_eq!(rep.additional_info_length, 0);
    assert_eq!(rep.vendor_id, 0xaa_bbcc);
    assert_eq!(rep.qpn, 0x123);
    assert_eq!(rep.service_id, 0x0111_1d2f);
    assert_eq!(rep.qkey, 0x0123_4567);
    assert_eq!(rep.additional_info, [0x77; 72]);
    assert_eq!(rep.private_data, [0x88; 136]);
}

#[test]
fn lap_and_apr_at_the_kernels_offsets() {
    let bytes = mad(
        0x0019,
        11,
        &[
            (24, &[0, 0, 0, 1]),
            (28, &[0, 0, 0, 2]),
            (36, &[0x12, 0x34, 0x56, 0xa0]), // remote QPN; timeout 20
            (44, &[0xff, 0xff, 0xff, 0xfe]), // alternate LIDs
            (48, &gid4(10, 0, 1, 1)),
            (64, &gid4(10, 0, 1, 2)),
            (80, &[0xab, 0xcd, 0xe0, 0x20]), // flow label 0xabcde; tclass 0x20
            (84, &[0x40, 0x10, 0x58, 0x90]), // hop limit, rate 16, SL 5 + subnet local, ACK 18
            (88, b"lap"),
        ],
    );
    let CmMessage::Lap(lap) = parse_and_reemit(&bytes) else {
        panic!("not a LAP");
    };
    assert_eq!(lap.remote_qpn_eecn, 0x12_3456);
    assert_eq!(lap.remote_cm_response_timeout, 20);
    let p = lap.alternate_path;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xfffe));
    assert_eq!(
        (p.local_gid, p.remote_gid),
        (Gid(gid4(10, 0, 1, 1)), Gid(gid4(10, 0, 1, 2)))
    );
    assert_eq!(
        (p.flow_label, p.traffic_class, p.hop_limit),
        (0xabcde, 0x20, 0x40)
    );
    assert_eq!(
        (p.packet_rate, p.sl, p.subnet_local, p.local_ack_timeout),
        (16, 5, true, 18)
    );
    assert_eq!(&lap.private_data[..3], b"lap");

    let bytes = mad(
        0x001a,
        12,
        &[
            (24, &[0, 0, 0, 2]),
            (28, &[0, 0, 0, 1]),
            (32, &[4, 3]),
            (36, b"info"),
            (108, b"apr"),
        ],
    );
    let CmMessage::Apr(apr) = parse_and_reemit(&bytes) else {
        panic!("not an APR");
    };
    assert_eq!((apr.additional_info_length, apr.ap_status), (4, 3));
    assert_eq!(&apr.additional_info[..4], b"info");
    assert_eq!(&apr.private_data[..3], b"apr");
}

/// The bits no field covers, per message, from `ibta_vol1_c12.h`:
/// (offset in the data area, mask of reserved bits).
fn reserved_bits(attr: CmAttrId) -> Vec<(usize, u8)> {
    let mut r = match attr {
        CmAttrId::Req => vec![
            (4, 0xff),
            (24, 0xff),
            (25, 0xff),
            (26, 0xff),
            (27, 0xff),
            (90, 0x0f),
            (91, 0xc0),
            (94, 0x07),
            (95, 0x07),
            (134, 0x0f),
            (135, 0xc0),
            (138, 0x07),
            (139, 0x03),
        ],
        CmAttrId::Mra => vec![(8, 0x3f), (9, 0x07)],
        CmAttrId::Rej => vec![(8, 0x3f), (9, 0x01)],
        CmAttrId::Rep => vec![(27, 0x0f)],
        CmAttrId::Rtu | CmAttrId::Drep | CmAttrId::SidrRep => vec![],
        CmAttrId::Dreq => vec![(11, 0xff)],
        CmAttrId::SidrReq => vec![(6, 0xff), (7, 0xff)],
        CmAttrId::Lap => vec![(15, 0x07), (58, 0x0f), (61, 0xc0), (62, 0x07), (63, 0x07)],
        CmAttrId::Apr => vec![(10, 0xff), (11, 0xff)],
    };
    if attr == CmAttrId::Lap {
        r.extend([8, 9, 10, 11, 16, 17, 18, 19].map(|i| (i, 0xff)));
    }
    r
}

#[test]
fn every_bit_but_the_reserved_ones_round_trips() {
    for attr in CmAttrId::ALL {
        let msg = CmMessage::parse_data(attr, &[0xff; 232]).unwrap();
        let mut out = [0u8; 232];
        msg.emit(&mut out);
        let mut want = [0xffu8; 232];
        for (at, mask) in reserved_bits(attr) {
            want[at] &= !mask;
        }
        assert_eq!(out.to_vec(), want.to_vec(), "{attr:?}");
    }
}

#[test]
fn header_and_attribute_errors() {
    let good = mad(0x0014, 1, &[]);
    assert!(CmMessage::parse(&Mad::parse(&good).unwrap()).is_ok());
    for (at, v) in [(0, 2u8), (1, 0x03), (2, 1), (3, 0x83)] {
        let mut b = good;
        b[at] = v;
        let err = CmMessage::parse(&Mad::parse(&b).unwrap()).unwrap_err();
        assert!(matches!(err, WireError::NotCmMad { .. }), "{err:?}");
    }
    for attr in [0x0000, 0x000f, 0x001b, 0x0110, 0xffff] {
        let mut b = good;
        b[16..18].copy_from_slice(&u16::to_be_bytes(attr));
        assert_eq!(
            CmMessage::parse(&Mad::parse(&b).unwrap()),
            Err(WireError::UnknownCmAttribute(attr))
        );
    }
}

#[test]
fn truncated_data_areas() {
    for attr in CmAttrId::ALL {
        for n in [0, 1, 8, 231] {
            assert_eq!(
                CmMessage::parse_data(attr, &[0u8; 232][..n]),
                Err(WireError::Truncated),
                "{attr:?} {n}"
            );
        }
        assert!(CmMessage::parse_data(attr, &[0u8; 300]).is_ok());
    }
    assert_eq!(CmPath::parse(&[0u8; 43]), Err(WireError::Truncated));
}

#[test]
fn to_mad_builds_the_cm_header() {
    let msg = CmMessage::parse_data(CmAttrId::Dreq, &[0u8; 232]).unwrap();
    let m = msg.to_mad(0x0000_0002_0000_0009, 0x1234);
    assert_eq!(
        &m.to_bytes()[..24],
        &[1, 7, 2, 3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 9, 0, 0x15, 0, 0, 0, 0, 0x12, 0x34]
    );
    assert_eq!(msg.attr_id(), CmAttrId::Dreq);
}

#[test]
fn rej_reasons_match_the_kernel() {
    use rej_reason::*;
    let all = [
        NO_QP,
        NO_EEC,
        NO_RESOURCES,
        TIMEOUT,
        UNSUPPORTED,
        INVALID_COMM_ID,
        INVALID_COMM_INSTANCE,
        INVALID_SERVICE_ID,
        INVALID_TRANSPORT_TYPE,
        STALE_CONN,
        RDC_NOT_EXIST,
        INVALID_GID,
        INVALID_LID,
        INVALID_SL,
        INVALID_TRAFFIC_CLASS,
        INVALID_HOP_LIMIT,
        INVALID_PACKET_RATE,
        INVALID_ALT_GID,
        INVALID_ALT_LID,
        INVALID_ALT_SL,
        INVALID_ALT_TRAFFIC_CLASS,
        INVALID_ALT_HOP_LIMIT,
        INVALID_ALT_PACKET_RATE,
        PORT_CM_REDIRECT,
        PORT_REDIRECT,
        INVALID_MTU,
        INSUFFICIENT_RESP_RESOURCES,
        CONSUMER_DEFINED,
        INVALID_RNR_RETRY,
        DUPLICATE_LOCAL_COMM_ID,
        INVALID_CLASS_VERSION,
        INVALID_FLOW_LABEL,
        INVALID_ALT_FLOW_LABEL,
    ];
    assert_eq!(all.to_vec(), (1..=33).collect::<Vec<u16>>());
    assert_eq!(VENDOR_OPTION_NOT_SUPPORTED, 35);
    assert_eq!(
        [sidr_status::SUCCESS, sidr_status::UNSUPPORTED_VERSION],
        [0, 5]
    );
}
