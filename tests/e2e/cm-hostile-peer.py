#!/usr/bin/python3
"""A hostile IB CM peer for the e2e test (issue 31): not vrnic's code, scapy.

It plays an rdma_cm client with MADs of its own against an rdma_cm server
(rping -P in a vrnic guest, on vrnic's librdmacm.so.1 and the guest agent's
CM): a REQ to QP 1 must get a REP (the listener is alive); then, class by
class, what a hostile host on the segment can send: REJ, DREQ, DREP, RTU and
MRA with the connection's right comm IDs from a stranger's address (spoofed:
nobody answers ARP for it, so every answer the CM makes is to an address
that never resolves), the same with guessed comm IDs, a replayed REQ and a
stale REQ (the connection's CA GUID and QPN, another comm ID) from the
stranger, truncated, oversized and garbage MADs, and the connection's own
DREQ spoofed from our address with a wrong Q_Key or P_Key. Our RTU goes
after the first class. After each class the connection must still be
there: a zero-length RDMA WRITE on it (the responder needs no receive and
no R_Key) is acknowledged. Then our DREQ gets a DREP. Last, a REQ flood
from 50 addresses, after which a fresh REQ still gets a REP (then we
reject it).

Prints ``HOSTILE cm-<class> ok|FAIL <detail>`` lines and a closing
``HOSTILE-CM-RESULT passed=N failed=N``; exit status 0 iff no FAIL. Every
wait is bounded (--timeout).

Usage: cm-hostile-peer.py --iface IF --ip A.B.C.D --server A.B.C.D --port P
"""
import argparse
import random
import socket
import struct
import sys
import time

from scapy.all import ARP, IP, UDP, Ether, Raw  # noqa: E402
from scapy.contrib.roce import BTH  # noqa: E402

ROCE_PORT = 4791
OP_UD_SEND_ONLY = 0x64
OP_WRITE_ONLY = 0x0A
OP_ACK = 0x11
GSI_QKEY = 0x80010000
GSI_SPORT = 0xD872
PSN_MASK = 0xFFFFFF
# MAD attribute IDs (IBA vol 1 ch. 12).
REQ, MRA, REJ, REP, RTU, DREQ, DREP = 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16
PS_TCP = 0x0106
STRANGER = "10.0.0.9"


def log(*a):
    print(*a, flush=True)


def gid(ip):
    return bytes(10) + b"\xff\xff" + socket.inet_aton(ip)


def mad(attr, tid, data):
    hdr = struct.pack(">BBBBHHQHHI", 1, 0x07, 2, 0x03, 0, 0, tid, attr, 0, 0)
    return hdr + data.ljust(232, b"\0")


class CmPeer:
    def __init__(self, args):
        self.a = args
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.sock.bind((args.iface, 0))
        self.mac = open(f"/sys/class/net/{args.iface}/address").read().strip()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((args.ip, ROCE_PORT))
        self.guid = random.getrandbits(64) | 1
        self.passed = self.failed = 0

    # -- frames --------------------------------------------------------------------------------
    def send(self, pkt):
        self.sock.send(bytes(pkt))

    def ud(self, payload, src=None, qkey=GSI_QKEY, pkey=0xFFFF):
        """A UD SEND ONLY to QP 1 carrying payload (DETH + it)."""
        deth = struct.pack(">IBBH", qkey, 0, 0, 1)  # Q_Key, reserved, source QP 1 (24 bits)
        return (Ether(src=self.mac, dst=self.peer_mac)
                / IP(src=src or self.a.ip, dst=self.a.server, flags="DF", id=random.randrange(65536))
                / UDP(sport=GSI_SPORT, dport=ROCE_PORT, chksum=0)
                / BTH(opcode=OP_UD_SEND_ONLY, dqpn=1, psn=0, pkey=pkey, icrc=None)
                / Raw(deth + payload))

    def send_mad(self, attr, data, src=None, tid=None, **kw):
        self.send(self.ud(mad(attr, tid if tid is not None else random.getrandbits(32), data), src, **kw))

    def recv(self, deadline):
        """(source IP, BTH and what follows) of the next RoCEv2 frame for us, else None."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65535)
            except socket.timeout:
                return None
            if len(data) < 14 + 20 + 8 + 12 + 4 or data[12:14] != b"\x08\x00":
                continue
            ip = IP(data[14:])
            if ip.dst != self.a.ip or UDP not in ip or ip[UDP].dport != ROCE_PORT:
                continue
            return ip.src, bytes(ip[UDP].payload)

    def wait_mad(self, want, deadline):
        """The next CM MAD to us whose (attr, data) satisfies want(attr, data), else None."""
        while True:
            r = self.recv(deadline)
            if r is None:
                return None
            _, b = r
            if b[0] != OP_UD_SEND_ONLY or len(b) < 12 + 8 + 256:
                continue
            m = b[20:20 + 256]
            attr = struct.unpack(">H", m[16:18])[0]
            if m[1] == 0x07 and want(attr, m[24:]):
                return attr, m[24:]

    def resolve(self):
        deadline = time.monotonic() + self.a.timeout
        while time.monotonic() < deadline:
            self.send(Ether(src=self.mac, dst="ff:ff:ff:ff:ff:ff")
                      / ARP(op=1, hwsrc=self.mac, psrc=self.a.ip, pdst=self.a.server))
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                self.sock.settimeout(max(end - time.monotonic(), 0.01))
                try:
                    data = self.sock.recv(65535)
                except socket.timeout:
                    break
                p = Ether(data)
                if ARP in p and p[ARP].op == 2 and p[ARP].psrc == self.a.server:
                    self.peer_mac = p[ARP].hwsrc
                    return
        sys.exit(f"no ARP answer from {self.a.server}")

    # -- CM messages ---------------------------------------------------------------------------
    def req(self, comm_id, qpn, psn, guid=None):
        sid = (PS_TCP << 16) + self.a.port
        d = bytearray(232)
        struct.pack_into(">I", d, 0, comm_id)
        struct.pack_into(">QQ", d, 8, sid, guid or self.guid)
        struct.pack_into(">I", d, 32, qpn << 8)  # QPN, responder resources 0
        d[43] = 20 << 3  # remote CM response timeout 20, RC, no e2e flow control
        struct.pack_into(">I", d, 44, (psn << 8) | (20 << 3) | 7)  # PSN, local timeout, retry 7
        struct.pack_into(">H", d, 48, 0xFFFF)
        d[50] = (3 << 4) | 7  # path MTU 1024, RNR retry 7
        d[51] = 15 << 4  # max CM retries
        struct.pack_into(">HH", d, 52, 0xFFFF, 0xFFFF)
        d[56:72] = gid(self.a.ip)
        d[72:88] = gid(self.a.server)
        d[93] = 64  # hop limit
        d[95] = 18 << 3  # local ACK timeout
        # rdma_cm's header: version 0, IPv4, our port, source and destination addresses.
        d[140], d[141] = 0, 4 << 4
        struct.pack_into(">H", d, 142, 0x4000 + (comm_id & 0xFFF))
        d[156:160] = socket.inet_aton(self.a.ip)
        d[172:176] = socket.inet_aton(self.a.server)
        return bytes(d)

    @staticmethod
    def ids(local, remote, tail=b""):
        return struct.pack(">II", local, remote) + tail

    def rej(self, local, remote, msg=2, reason=28):
        return struct.pack(">IIBBH", local, remote, msg << 6, 0, reason)

    def connect(self, comm_id, qpn, psn):
        """REQ (sent again every 2 s: the server may not listen yet) until its REP: (B's comm
        ID, B's QPN, B's starting PSN), or an error string."""
        deadline = time.monotonic() + self.a.timeout
        while time.monotonic() < deadline:
            self.send_mad(REQ, self.req(comm_id, qpn, psn), tid=comm_id)
            r = self.wait_mad(lambda a, d: a in (REP, REJ) and d[4:8] == struct.pack(">I", comm_id),
                              min(deadline, time.monotonic() + 2))
            if r is None:
                continue
            attr, d = r
            if attr == REJ:
                time.sleep(1)  # not listening yet (REJ 8) or busy: ask again, bounded
                continue
            # B's comm ID and QPN, and its starting PSN: the PSN it expects from us (as Linux's
            # cm.c, the passive side receives from the REP's PSN and sends from the REQ's).
            return struct.unpack(">I", d[0:4])[0], int.from_bytes(d[12:15], "big"), int.from_bytes(d[20:23], "big")
        return f"no REP within {self.a.timeout} s"

    # -- the connection's liveness ---------------------------------------------------------------
    def alive(self):
        """A zero-length RDMA WRITE at our next PSN: None if acknowledged, else why not."""
        psn = self.psn
        reth = struct.pack(">QII", 0, 0, 0)
        pkt = (Ether(src=self.mac, dst=self.peer_mac)
               / IP(src=self.a.ip, dst=self.a.server, flags="DF", id=random.randrange(65536))
               / UDP(sport=0xC000 + (self.qpn & 0x3FFF), dport=ROCE_PORT, chksum=0)
               / BTH(opcode=OP_WRITE_ONLY, dqpn=self.peer_qpn, psn=psn, ackreq=1, pkey=0xFFFF, icrc=None)
               / Raw(reth))
        deadline = time.monotonic() + self.a.timeout
        sent = 0.0
        while time.monotonic() < deadline:
            if time.monotonic() - sent > 1.0:
                self.send(pkt)  # again after a second: a lost frame is not what this checks
                sent = time.monotonic()
            r = self.recv(min(deadline, time.monotonic() + 0.5))
            if r is None:
                continue
            _, b = r
            if b[0] == OP_ACK and int.from_bytes(b[9:12], "big") == psn:
                syndrome = b[12]
                if syndrome >> 5 == 0:
                    self.psn = (psn + 1) & PSN_MASK
                    return None
                if syndrome >> 5 == 3:
                    return f"NAK {syndrome:#x}"
        return f"no ACK within {self.a.timeout} s"

    def check(self, name, detail=""):
        err = self.alive()
        if err:
            self.failed += 1
            log(f"HOSTILE cm-{name} FAIL: the connection is gone: {err}")
        else:
            self.passed += 1
            log(f"HOSTILE cm-{name} ok: still connected{detail}")

    def result(self, name, ok, detail):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        log(f"HOSTILE cm-{name} {'ok' if ok else 'FAIL'}: {detail}")

    # -- the run ---------------------------------------------------------------------------------
    def run(self):
        c = random.getrandbits(31) | 1
        self.qpn, self.psn = 0x000ABD, random.randrange(1 << 24)
        got = self.connect(c, self.qpn, self.psn)
        if isinstance(got, str):
            self.result("listener", False, got)
            return
        b, self.peer_qpn, self.psn = got
        self.result("listener", True, f"REP from QP 1 (comm ID {b:#x}, QPN {self.peer_qpn:#x})")
        # Before our RTU (REP sent): the right comm IDs from a stranger.
        forged = [
            (REJ, self.rej(c, b, msg=1)), (RTU, self.ids(c, b)), (MRA, self.ids(c, b, bytes([1 << 6, 31 << 3]))),
            (DREQ, self.ids(c, b, struct.pack(">I", self.peer_qpn << 8))), (DREP, self.ids(c, b)),
        ]
        for attr, d in forged:
            self.send_mad(attr, d, src=STRANGER)
        time.sleep(0.2)
        self.send_mad(RTU, self.ids(c, b))
        self.check("forged-right-ids-before-rtu", " (REJ, RTU, MRA, DREQ, DREP from a stranger, then our RTU)")
        for attr, d in forged:
            self.send_mad(attr, d, src=STRANGER)
        self.check("forged-right-ids", " (REJ, RTU, MRA, DREQ, DREP with the right comm IDs from a stranger)")
        for g in range(1, 33):
            gb, gc = b ^ g, (c + g) & 0xFFFFFFFF
            self.send_mad(REJ, self.rej(c, gb), src=STRANGER)
            self.send_mad(DREQ, self.ids(c, gb, struct.pack(">I", self.peer_qpn << 8)), src=STRANGER)
            self.send_mad(REJ, self.rej(gc, b), src=STRANGER)
            self.send_mad(DREQ, self.ids(gc, b, struct.pack(">I", self.peer_qpn << 8)), src=STRANGER)
        self.check("forged-guessed-ids", " (128 REJ/DREQ with guessed comm IDs)")
        # Our REQ replayed (a duplicate) and a stale one (our CA GUID and QPN, a new comm ID).
        self.send_mad(REQ, self.req(c, self.qpn, self.psn), src=STRANGER, tid=c)
        self.send_mad(REQ, self.req(c ^ 0x5555, self.qpn, self.psn), src=STRANGER)
        self.check("stale-req", " (our REQ replayed and a stale REQ from a stranger)")
        dreq = mad(DREQ, 7, self.ids(c, b, struct.pack(">I", self.peer_qpn << 8)))
        # Truncated and oversized: our DREQ, spoofed from our own address, cut short or in a
        # longer datagram (a well-formed datagram with its ICRC, not a 256-byte MAD).
        for n in (0, 1, 24, 100, 255):
            self.send(self.ud(dreq[:n]))
        for n in (257, 300, 600, 1200):
            self.send(self.ud(dreq.ljust(n, b"\xee")))
        for _ in range(20):
            self.send(self.ud(bytes(random.getrandbits(8) for _ in range(256)), src=STRANGER))
        self.check("bad-mad-size", " (truncated, oversized and garbage MADs; a DREQ among them)")
        for qkey in (0, 0x80010001, 0x01234567):
            self.send(self.ud(dreq, qkey=qkey))
        for pkey in (0x1234, 0x0000, 0x7FFE):
            self.send(self.ud(dreq, pkey=pkey))
        self.check("bad-keys", " (our DREQ with a wrong Q_Key or P_Key)")
        # Ours: DREQ → DREP.
        deadline = time.monotonic() + self.a.timeout
        r = None
        while r is None and time.monotonic() < deadline:
            self.send_mad(DREQ, self.ids(c, b, struct.pack(">I", self.peer_qpn << 8)), tid=c)
            r = self.wait_mad(lambda a, d: a == DREP and d[0:8] == self.ids(b, c),
                              min(deadline, time.monotonic() + 3))
        self.result("dreq", r is not None, "DREP for our DREQ" if r else f"no DREP within {self.a.timeout} s")
        # A REQ flood from 50 addresses (nobody answers ARP for them: every answer to them is
        # lost), then a fresh REQ of ours must still get a REP (the listener and QP 1 serve);
        # then we reject it (rping exits at that event: the guest goes on with the ping-pong).
        t0 = time.monotonic()
        for i in range(300):
            src = "10.0.0.%d" % (10 + i % 50)
            self.send_mad(REQ, self.req(0x5EED0000 + i, 0x100 + i, i, guid=0xDEAD0000 + i), src=src)
        sent = time.monotonic() - t0
        c2 = random.getrandbits(31) | 1
        got = self.connect(c2, 0x000ABE, random.randrange(1 << 24))
        ok = not isinstance(got, str)
        self.result("req-flood", ok, (f"300 REQs from 50 addresses in {sent:.1f} s, then a fresh REQ got its REP "
                                      f"(comm ID {got[0]:#x})") if ok else f"after 300 REQs from 50 addresses: {got}")
        if ok:
            self.send_mad(REJ, self.rej(c2, got[0], msg=1, reason=28))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iface", required=True)
    ap.add_argument("--ip", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--port", type=int, default=7174)
    ap.add_argument("--timeout", type=float, default=20)
    args = ap.parse_args()
    peer = CmPeer(args)
    peer.resolve()
    peer.run()
    log(f"HOSTILE-CM-RESULT passed={peer.passed} failed={peer.failed}")
    return 1 if peer.failed else 0


if __name__ == "__main__":
    sys.exit(main())
