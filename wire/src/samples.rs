//! Sample headers for tests of code that builds or parses frames (this
//! crate's and the engine's): every extension header an opcode requires,
//! filled with distinctive values. Feature `samples` (or `cfg(test)`); not
//! part of the wire API.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::*;

/// Headers for `op` with every extension header the opcode requires filled
/// with distinctive values, over IPv4 or IPv6.
pub fn sample_headers(op: Opcode, v6: bool) -> RoceHeaders {
    let (ip_src, ip_dst) = if v6 {
        (
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1)),
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
        )
    } else {
        (
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        )
    };
    RoceHeaders {
        eth_src: [2, 0, 0, 0, 0, 1],
        eth_dst: [2, 0, 0, 0, 0, 2],
        ip_src,
        ip_dst,
        ip_id: if v6 { 0 } else { 0x4242 },
        ttl: 64,
        tclass: 0x02,
        flow_label: if v6 { 0xabcde } else { 0 },
        udp_src: 0xc123,
        bth: Bth {
            opcode: op,
            solicited: true,
            mig_req: true,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x12_3456,
            ack_req: true,
            psn: 0xab_cdef,
        },
        reth: op.has_reth().then_some(Reth {
            va: 0x1122_3344_5566_7788,
            rkey: 0x99aa_bbcc,
            dma_len: 4096,
        }),
        aeth: op.has_aeth().then_some(Aeth::ack(0x654321, 7)),
        atomic_eth: op.has_atomic_eth().then_some(AtomicEth {
            va: 0x1000,
            rkey: 0xdead_beef,
            swap_add: 0x0102_0304_0506_0708,
            compare: 0x8877_6655_4433_2211,
        }),
        atomic_ack_eth: op.has_atomic_ack_eth().then_some(AtomicAckEth {
            orig: 0xfeed_f00d_cafe_babe,
        }),
        deth: op.has_deth().then_some(Deth {
            qkey: 0x1111_1111,
            src_qp: 0x00_0bad,
        }),
        immdt: op.has_immdt().then_some(Immdt([9, 8, 7, 6])),
        ieth: op.has_ieth().then_some(Ieth { rkey: 0x0bad_cafe }),
    }
}
