//! Invariant CRC of RoCEv2 packets (IBTA Vol 1 Annex A17.3.3; Linux rxe
//! `rxe_icrc.c`; scapy `contrib/roce.py`).

use super::Bth;

/// Length of the ICRC trailer on the wire, in bytes.
pub const ICRC_LEN: usize = 4;

/// Most bytes that need masking: a 60-byte IPv4 header (or 40-byte IPv6
/// header), the UDP header and the BTH.
const HEAD_MAX: usize = 60 + 8 + Bth::LEN;

/// The ICRC of one RoCEv2 IP packet.
///
/// `ip_packet` starts with the IPv4 or IPv6 header and ends just before the
/// ICRC (IP header, UDP header, BTH, extension headers, payload, pad).
///
/// The CRC is the standard CRC-32 (IEEE 802.3, as zlib `crc32`) over 8 bytes
/// of 0xff (the masked LRH of IBTA A17.3.3) followed by `ip_packet` with the
/// variant fields set to all ones:
/// - IPv4: type of service, time to live, header checksum;
/// - IPv6: traffic class, flow label, hop limit;
/// - UDP: checksum;
/// - BTH: byte 4 (FECN, BECN, 6 reserved bits).
///
/// The IP header length is taken from the packet (IPv4 IHL, including
/// options; 40 bytes for IPv6). If the first nibble is neither 4 nor 6 the IP
/// header is left unmasked. Short inputs are hashed as far as they go; this
/// never panics.
///
/// Returns the ICRC as it is stored on the wire, read big-endian: the four
/// trailer bytes are `icrc(p).to_be_bytes()`, and a received trailer `t` is
/// correct iff `u32::from_be_bytes(t) == icrc(p)`. (The trailer carries the
/// CRC-32 value least significant byte first, as rxe stores its `__be32` CRC
/// in CPU order and scapy packs `struct.pack("!I", crc)[::-1]`; so the
/// returned value is the zlib CRC-32 with its bytes swapped.)
pub fn icrc(ip_packet: &[u8]) -> u32 {
    let ip_hdr_len = match ip_packet.first().map(|b| b >> 4) {
        Some(4) => usize::from(ip_packet[0] & 0xf) * 4,
        Some(6) => 40,
        _ => 0,
    };
    let n = ip_packet.len().min(ip_hdr_len + 8 + Bth::LEN).min(HEAD_MAX);
    let mut head = [0u8; HEAD_MAX];
    head[..n].copy_from_slice(&ip_packet[..n]);
    let masked = &mut head[..n];
    match ip_packet.first().map(|b| b >> 4) {
        Some(4) => {
            ones(masked, 1..2); // TOS
            ones(masked, 8..9); // TTL
            ones(masked, 10..12); // header checksum
        }
        Some(6) => {
            // Version stays; traffic class and flow label become ones.
            if let Some(b) = masked.first_mut() {
                *b |= 0x0f;
            }
            ones(masked, 1..4);
            ones(masked, 7..8); // hop limit
        }
        _ => {}
    }
    let udp = ip_hdr_len;
    ones(masked, udp + 6..udp + 8); // UDP checksum
    let bth = udp + 8;
    ones(masked, bth + 4..bth + 5); // FECN, BECN, resv6

    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&head[..n]);
    h.update(&ip_packet[n..]);
    h.finalize().swap_bytes()
}

/// Sets the bytes of `buf` in `range` that exist to 0xff.
fn ones(buf: &mut [u8], range: core::ops::Range<usize>) {
    for b in buf.iter_mut().take(range.end).skip(range.start) {
        *b = 0xff;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_odd_inputs_do_not_panic() {
        for len in 0..100 {
            for first in [0x45u8, 0x4f, 0x60, 0x00, 0xff] {
                let mut p = vec![0xa5u8; len];
                if let Some(b) = p.first_mut() {
                    *b = first;
                }
                let _ = icrc(&p);
            }
        }
    }

    #[test]
    fn masks_only_variant_fields() {
        // IPv4 (IHL 5) + UDP + BTH + 4 payload bytes.
        let mut p = vec![0u8; 20 + 8 + 12 + 4];
        p[0] = 0x45;
        let base = icrc(&p);
        for (i, masked) in [
            (1, true),
            (8, true),
            (10, true),
            (11, true),
            (26, true),
            (27, true),
            (32, true),
        ] {
            let mut q = p.clone();
            q[i] ^= 0x5a;
            assert_eq!(icrc(&q) == base, masked, "byte {i}");
        }
        for i in [2, 4, 9, 12, 19, 20, 24, 28, 31, 33, 36, 40, 43] {
            let mut q = p.clone();
            q[i] ^= 0x01;
            assert_ne!(icrc(&q), base, "byte {i}");
        }
        // Bytes after the head are covered too.
        let mut q = p.clone();
        q.push(0);
        assert_ne!(icrc(&q), base);
    }
}
