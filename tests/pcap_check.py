#!/usr/bin/python3
"""Check the RoCEv2 frames of a pcap file with tools that are not vrnic.

Usage:
    /usr/bin/python3 tests/pcap_check.py FILE.pcap [--min-packets N] [--no-tshark]
    /usr/bin/python3 tests/pcap_check.py --self-test

Every frame whose UDP destination port is 4791 (RoCEv2, IBTA Annex A17) is
checked twice:

(a) ICRC, with scapy.contrib.roce: the BTH and everything after it are
    rebuilt over the captured IPv4 and UDP headers with ``icrc=None``, so
    scapy computes the invariant CRC itself (masking TTL, TOS, the IP and
    UDP checksums and the BTH FECN/BECN/reserved bits), and the result is
    compared with the captured trailing 4 bytes of the UDP payload.

    This is deliberately an implementation independent of vrnic's own ICRC
    (vrnic/src/wire/icrc.rs): a bug shared by vrnic's sender and receiver
    would let two vrnic instances interoperate while every real RNIC drops
    their packets. scapy's computation reproduces a frame captured on a
    Mellanox ConnectX-4 Lx (see --self-test).

(b) Dissection, with tshark: ``tshark -Y udp.dstport==4791`` (decoding UDP
    port 4791 as InfiniBand, which is tshark's default, forced with ``-d``)
    must list the same frames, each with ``frame.protocols`` of the form
    ``eth:ethertype[:vlan:ethertype]:ip:udp:infiniband[...]``, and none
    may be malformed in its InfiniBand headers (malformations reported by
    tshark's payload heuristics, e.g. RPC-over-RDMA guessing at a SEND's
    opaque payload, are ignored). tshark's UDP dissector tries the lower
    of the two ports first, so a RoCEv2 frame from a source port below 4791
    that has a dissector of its own (53, DNS, ...) fails here: real RNICs
    use source ports 49152-65535 and so should vrnic.

The run fails (exit status 1, one line per bad frame naming its frame number
as tshark and Wireshark count, from 1) on any ICRC mismatch, undecodable or
unsupported frame (IPv6 is not supported by scapy's ICRC), dissection
mismatch, or when fewer than N RoCEv2 frames are present. Exit status 2 means
the check could not run (unreadable file, tshark missing). On success it
prints one summary line.

Needs Debian's python3-scapy and tshark (``apt-get install python3-scapy
tshark``); run it with /usr/bin/python3, which has Debian's scapy, not with a
pyenv or virtualenv python that lacks it.
"""

import argparse
import logging
import re
import shutil
import struct
import subprocess
import sys

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

try:
    from scapy.compat import raw
    from scapy.contrib.roce import BTH
    from scapy.error import Scapy_Exception
    from scapy.layers.inet import IP, UDP
    from scapy.packet import Raw
    from scapy.utils import RawPcapNgReader, RawPcapReader
except ImportError as e:
    print(f"pcap_check: {e}: run with /usr/bin/python3 and apt-get install python3-scapy", file=sys.stderr)
    sys.exit(2)

ROCEV2_PORT = 4791
LINKTYPE_ETHERNET = 1
ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
VLAN_TPIDS = (0x8100, 0x88A8)
BTH_LEN = 12
ICRC_LEN = 4

PROTOCOLS_RE = re.compile(r"^eth:ethertype(:vlan:ethertype)*:ip:udp:infiniband(:|$)")


class Skip(Exception):
    """The frame is not RoCEv2 (not IPv4/UDP to port 4791)."""


class Bad(Exception):
    """The frame is RoCEv2 but fails a check; the message says why."""


def read_frames(path):
    """Yields the captured bytes of every frame of a pcap or pcapng file."""
    try:
        reader = RawPcapReader(path)
    except Scapy_Exception:
        reader = RawPcapNgReader(path)
    try:
        linktype = getattr(reader, "linktype", LINKTYPE_ETHERNET)
        if linktype != LINKTYPE_ETHERNET:
            raise Scapy_Exception(f"link type {linktype}, expected Ethernet ({LINKTYPE_ETHERNET})")
        for data, _meta in reader:
            yield bytes(data)
    finally:
        reader.close()


def rocev2_parts(frame):
    """Splits an Ethernet frame into (IPv4 packet bytes, UDP payload bytes).

    Offsets come from the headers' own length fields, so Ethernet padding
    after a short frame is excluded. Raises Skip for non-RoCEv2 frames and
    Bad for RoCEv2 frames that cannot be checked.
    """
    off = 12
    if len(frame) < off + 2:
        raise Skip()
    (ethertype,) = struct.unpack_from("!H", frame, off)
    while ethertype in VLAN_TPIDS:
        off += 4
        if len(frame) < off + 2:
            raise Skip()
        (ethertype,) = struct.unpack_from("!H", frame, off)
    ip_off = off + 2
    if ethertype == ETH_P_IPV6:
        if len(frame) >= ip_off + 40 + 4 and frame[ip_off + 6] == 17:
            (dport,) = struct.unpack_from("!H", frame, ip_off + 40 + 2)
            if dport == ROCEV2_PORT:
                raise Bad("IPv6 RoCEv2: scapy.contrib.roce computes no ICRC for IPv6")
        raise Skip()
    if ethertype != ETH_P_IP or len(frame) < ip_off + 20:
        raise Skip()
    ver_ihl, _tos, total_len, _id, frag, _ttl, proto = struct.unpack_from("!BBHHHBB", frame, ip_off)
    ihl = (ver_ihl & 0x0F) * 4
    if ver_ihl >> 4 != 4 or proto != 17 or ihl < 20:
        raise Skip()
    udp_off = ip_off + ihl
    if len(frame) < udp_off + 8:
        raise Skip()
    _sport, dport, udp_len = struct.unpack_from("!HHH", frame, udp_off)
    if dport != ROCEV2_PORT:
        raise Skip()
    if frag & 0x3FFF:
        raise Bad("IPv4 fragment: RoCEv2 packets must not be fragmented")
    if ip_off + total_len > len(frame) or total_len < ihl + 8:
        raise Bad(f"IPv4 total length {total_len} does not fit the {len(frame)}-byte frame")
    if udp_len != total_len - ihl:
        raise Bad(f"UDP length {udp_len} != IPv4 payload length {total_len - ihl}")
    payload = frame[udp_off + 8 : udp_off + udp_len]
    if len(payload) < BTH_LEN + ICRC_LEN:
        raise Bad(f"UDP payload of {len(payload)} bytes cannot hold a BTH and an ICRC")
    return frame[ip_off : ip_off + total_len], payload


def expected_icrc(ip_bytes, udp_payload):
    """The ICRC bytes scapy computes for this packet (as they go on the wire)."""
    ip = IP(ip_bytes)
    udp = ip[UDP]
    # Rebuild the layers above UDP explicitly: scapy would otherwise pick the
    # UDP payload's dissector by source port (53 gives DNS, ...).
    udp.remove_payload()
    bth = BTH(udp_payload[:BTH_LEN] + udp_payload[-ICRC_LEN:])
    bth.remove_payload()
    body = udp_payload[BTH_LEN:-ICRC_LEN]
    if body:
        bth.add_payload(Raw(body))
    bth.icrc = None
    udp.add_payload(bth)
    built = raw(ip)
    if len(built) != len(ip_bytes):
        raise Bad(f"scapy rebuilt {len(built)} bytes from {len(ip_bytes)}")
    return built[-ICRC_LEN:]


def check_icrc(frame):
    """None for a non-RoCEv2 frame, True for a good one; raises Bad otherwise."""
    try:
        ip_bytes, payload = rocev2_parts(frame)
    except Skip:
        return None
    want = expected_icrc(ip_bytes, payload)
    got = payload[-ICRC_LEN:]
    if want != got:
        raise Bad(f"ICRC mismatch: captured {got.hex()}, scapy computes {want.hex()}")
    return True


def scapy_pass(path):
    """(numbers of RoCEv2 frames, list of failure lines)."""
    roce, failures = [], []
    for number, frame in enumerate(read_frames(path), start=1):
        try:
            if check_icrc(frame):
                roce.append(number)
        except Bad as e:
            roce.append(number)
            failures.append(f"frame {number}: {e}")
    return roce, failures


def tshark_pass(path, roce_numbers):
    """List of failure lines from tshark's dissection of the RoCEv2 frames."""
    cmd = [
        "tshark", "-n", "-r", path,
        "-d", f"udp.port=={ROCEV2_PORT},infiniband",
        "-Y", f"udp.dstport=={ROCEV2_PORT}",
        "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f",
        "-e", "frame.number", "-e", "frame.protocols", "-e", "udp.srcport", "-e", "_ws.malformed",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {res.returncode}: {res.stderr.strip()}")
    failures, seen = [], []
    for line in res.stdout.splitlines():
        if not line.strip():
            continue
        number, protocols, sport, malformed = (line.split("\t") + ["", "", ""])[:4]
        seen.append(int(number))
        # A malformed-packet exception counts when the InfiniBand headers
        # raised it (it is then the last protocol). tshark also runs payload
        # heuristics (RPC-over-RDMA, SMB Direct, ...) on SEND and WRITE
        # payloads, which are opaque application bytes here; those misfire
        # on arbitrary data and are not the sender's fault.
        ib_malformed = bool(malformed) and protocols.endswith(":infiniband")
        if not PROTOCOLS_RE.match(protocols) or ib_malformed:
            hint = ""
            if sport.isdigit() and int(sport) < ROCEV2_PORT:
                # tshark's UDP dissector tries the lower port first.
                hint = (f" (UDP source port {sport} is below {ROCEV2_PORT} and wins the dissector lookup;"
                        " RoCEv2 source ports are normally 49152-65535)")  # fmt: skip
            if ib_malformed:
                hint += " and reports it malformed"
            failures.append(f"frame {number}: tshark dissects it as {protocols!r}{hint}")
    if seen != roce_numbers:
        only_t = sorted(set(seen) - set(roce_numbers))
        only_s = sorted(set(roce_numbers) - set(seen))
        failures.append(f"tshark and scapy disagree on RoCEv2 frames: only tshark {only_t}, only scapy {only_s}")
    return failures


def check_file(path, min_packets, use_tshark):
    """Exit status for checking one file, after printing the verdict."""
    try:
        roce, failures = scapy_pass(path)
    except (OSError, Scapy_Exception) as e:
        print(f"pcap_check: cannot read {path}: {e}", file=sys.stderr)
        return 2
    if use_tshark:
        if shutil.which("tshark") is None:
            print("pcap_check: tshark not found (apt-get install tshark, or pass --no-tshark)", file=sys.stderr)
            return 2
        try:
            failures += tshark_pass(path, roce)
        except (OSError, RuntimeError) as e:
            print(f"pcap_check: {e}", file=sys.stderr)
            return 2
    if len(roce) < min_packets:
        failures.append(f"{len(roce)} RoCEv2 frames, fewer than --min-packets {min_packets}")
    for f in failures:
        print(f"pcap_check: {path}: {f}")
    verdict = "FAIL" if failures else "OK"
    checks = "ICRC (scapy), dissection (tshark)" if use_tshark else "ICRC (scapy)"
    print(f"pcap_check: {verdict}: {path}: {len(roce)} RoCEv2 frames; checked {checks}; {len(failures)} problems")
    return 1 if failures else 0


# A CNP captured on a Mellanox ConnectX-4 Lx, from scapy's test suite
# (test/contrib/roce.uts): the known answer that ties scapy's ICRC to hardware.
CX4_CNP = bytes.fromhex(
    """
    e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
    003c 718c 4000 4011 9161 0a00 1101 0a00
    1201 0000 12b7 0028 0000 8100 ffff 4000
    0118 0000 0000 0000 0000 0000 0000 0000
    0000 0000 0000 82fd 002a
    """
)


def self_test():
    """Checks the checker: a hardware capture, a good and a corrupted frame."""
    from scapy.layers.l2 import Ether

    assert check_icrc(CX4_CNP) is True, "ConnectX-4 Lx CNP must verify"
    good = raw(
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IP(src="192.0.2.1", dst="192.0.2.2", tos=0x02)
        / UDP(sport=53, dport=ROCEV2_PORT)
        / BTH(opcode=0x04, dqpn=0x11, psn=7, ackreq=1, icrc=None)
        / Raw(b"0123456789abcdef")
    )
    assert check_icrc(good) is True
    assert check_icrc(good + b"\0" * 8) is True, "Ethernet padding is ignored"
    for i in (len(good) - 1, 14 + 20 + 8 + 5, 14 + 20 + 8 + 12 + 3):
        bad = bytearray(good)
        bad[i] ^= 0x40
        try:
            check_icrc(bytes(bad))
        except Bad:
            continue
        raise AssertionError(f"a flipped bit at byte {i} must fail")
    # Variant fields are outside the ICRC: TTL and the UDP checksum.
    variant = bytearray(good)
    variant[14 + 8] ^= 0xFF
    variant[14 + 20 + 6] ^= 0xFF
    assert check_icrc(bytes(variant)) is True, "TTL and UDP checksum are masked"
    non_roce = raw(Ether() / IP() / UDP(sport=ROCEV2_PORT, dport=9) / Raw(b"x" * 20))
    assert check_icrc(non_roce) is None
    print("pcap_check: self-test OK")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pcap", nargs="?", help="pcap or pcapng file with Ethernet frames")
    ap.add_argument("--min-packets", type=int, default=1, metavar="N",
                    help="fail when fewer than N RoCEv2 frames (default 1)")  # fmt: skip
    ap.add_argument("--no-tshark", action="store_true", help="skip the tshark dissection check")
    ap.add_argument("--self-test", action="store_true", help="check the checker and exit")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    if args.pcap is None:
        ap.error("a pcap file is required")
    return check_file(args.pcap, args.min_packets, not args.no_tshark)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
