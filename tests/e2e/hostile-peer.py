#!/usr/bin/python3
"""A hostile RoCEv2 peer for the e2e test: not vrnic's code, built on scapy.

It plays an ``ibv_rc_pingpong`` client against a server (the TCP exchange of
rdma-core's examples, then RC SEND ONLY messages of the stock client's data,
0x7b bytes, acknowledged as rxe would), and between legitimate iterations it
sends the classes of frames a hostile host on the segment can send: bad ICRC,
truncations, reserved opcodes, a foreign P_Key, a spoofed source address
(SEND, RDMA WRITE, forged ACK and NAKs), ARP floods from strangers, PSNs out
of the window, floods of duplicates and of garbage. Every attack frame carries 0xee bytes: had the server accepted one
as data, its message check fails, and the next legitimate iteration (same
PSN) would not be answered. After each class one legitimate iteration must
succeed ("still serving"). The last class is an RDMA WRITE with a guessed
R_Key from the connected address: the server must answer it with a fatal
NAK (remote access error), after which its QP is in error and the server
fails cleanly.

Prints ``HOSTILE <class> ok|FAIL <detail>`` lines and a closing
``HOSTILE-RESULT passed=N failed=N iterations=N``; exit status 0 iff no
FAIL. Every wait is bounded (--timeout).

Usage: hostile-peer.py --iface IF --ip A.B.C.D --server A.B.C.D --port P
                       [--size 512] [--timeout 20]
"""
import argparse
import os
import random
import socket
import struct
import sys
import time

from scapy.all import ARP, IP, UDP, Ether, Raw  # noqa: E402
from scapy.contrib.roce import AETH, BTH  # noqa: E402

ROCE_PORT = 4791
OP_SEND_ONLY = 0x04
OP_WRITE_ONLY = 0x0A
OP_ACK = 0x11
STOCK_FILL = 0x7B  # rc_pingpong's buffer fill
EVIL = 0xEE
MSG_LEN = 52  # sizeof "0000:000000:000000:00000000000000000000000000000000"
PSN_MASK = 0xFFFFFF


def log(*a):
    print(*a, flush=True)


class Peer:
    def __init__(self, args):
        self.a = args
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.sock.bind((args.iface, 0))
        self.mac = open(f"/sys/class/net/{args.iface}/address").read().strip()
        # A bound UDP socket keeps the kernel from answering RoCEv2 frames with ICMP.
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind((args.ip, ROCE_PORT))
        self.qpn = 0x000ABC
        self.psn = random.randrange(1 << 24)
        self.msn = 0
        self.passed = self.failed = self.iters = 0

    # -- frames --------------------------------------------------------------------------------
    def frame(self, bth, payload=b"", src=None, ttl=64, sport=0xC000):
        return (Ether(src=self.mac, dst=self.peer_mac)
                / IP(src=src or self.a.ip, dst=self.peer_ip, ttl=ttl, flags="DF", id=random.randrange(65536))
                / UDP(sport=sport, dport=ROCE_PORT, chksum=0)
                / bth / Raw(payload))

    def send(self, pkt):
        self.sock.send(bytes(pkt) if not isinstance(pkt, (bytes, bytearray)) else pkt)

    def bth(self, opcode, psn, **kw):
        kw.setdefault("pkey", 0xFFFF)
        return BTH(opcode=opcode, dqpn=self.peer_qpn, psn=psn & PSN_MASK, icrc=None, **kw)

    def recv_roce(self, deadline):
        """Next RoCEv2 frame for us (BTH and what follows) before deadline, else None."""
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
            b = bytes(ip[UDP].payload)
            return b

    # -- set-up ----------------------------------------------------------------------------------
    def resolve(self):
        deadline = time.monotonic() + self.a.timeout
        while time.monotonic() < deadline:
            self.send(Ether(src=self.mac, dst="ff:ff:ff:ff:ff:ff")
                      / ARP(op=1, hwsrc=self.mac, psrc=self.a.ip, pdst=self.peer_ip))
            end = time.monotonic() + 0.5
            while time.monotonic() < end:
                self.sock.settimeout(max(end - time.monotonic(), 0.01))
                try:
                    data = self.sock.recv(65535)
                except socket.timeout:
                    break
                p = Ether(data)
                if ARP in p and p[ARP].op == 2 and p[ARP].psrc == self.peer_ip:
                    self.peer_mac = p[ARP].hwsrc
                    return
        sys.exit(f"no ARP answer from {self.peer_ip}")

    def exchange(self):
        gid = bytes(10) + b"\xff\xff" + socket.inet_aton(self.a.ip)
        msg = ("%04x:%06x:%06x:%s" % (0, self.qpn, self.psn, gid.hex())).encode() + b"\0"
        assert len(msg) == MSG_LEN
        deadline = time.monotonic() + self.a.timeout
        while True:
            try:
                s = socket.create_connection((self.a.server, self.a.port), timeout=2)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    sys.exit(f"couldn't connect to {self.a.server}:{self.a.port}: {e}")
                time.sleep(0.5)  # the server is not listening yet; bounded by the deadline
        s.settimeout(self.a.timeout)
        s.sendall(msg)
        rem = b""
        while len(rem) < MSG_LEN:
            chunk = s.recv(MSG_LEN - len(rem))
            if not chunk:
                sys.exit("the server closed the exchange")
            rem += chunk
        s.sendall(b"done\0")
        s.close()
        lid, qpn, psn, rgid = rem[:-1].decode().split(":")
        self.peer_qpn, self.epsn = int(qpn, 16), int(psn, 16)
        rg = bytes.fromhex(rgid)
        if rg[:12] != bytes(10) + b"\xff\xff":
            sys.exit(f"the server's GID {rgid} is not IPv4-mapped (use -g 1)")
        self.peer_ip = socket.inet_ntoa(rg[12:])
        log(f"HOSTILE-INFO server qpn {self.peer_qpn:#x} psn {self.epsn:#x} roce {self.peer_ip}; "
            f"ours qpn {self.qpn:#x} psn {self.psn:#x}")

    # -- the legitimate ping-pong ----------------------------------------------------------------
    def ack(self, psn):
        self.send(self.frame(BTH(opcode=OP_ACK, dqpn=self.peer_qpn, psn=psn & PSN_MASK, icrc=None)
                             / AETH(syndrome=0x1F, msn=self.msn & PSN_MASK)))

    def iteration(self):
        """One exchange: our SEND at self.psn, the server's ACK and its SEND back."""
        psn = self.psn
        self.send(self.frame(self.bth(OP_SEND_ONLY, psn, ackreq=1), bytes([STOCK_FILL]) * self.a.size))
        acked = got = False
        deadline = time.monotonic() + self.a.timeout
        resent = time.monotonic()
        while not (acked and got):
            b = self.recv_roce(min(deadline, time.monotonic() + 0.5))
            if b is None:
                if time.monotonic() >= deadline:
                    return f"no {'ACK' if not acked else 'SEND'} within {self.a.timeout} s"
                if not acked and time.monotonic() - resent > 1.0:
                    # Our SEND may be lost: retransmit it, as a requester does.
                    self.send(self.frame(self.bth(OP_SEND_ONLY, psn, ackreq=1),
                                         bytes([STOCK_FILL]) * self.a.size))
                    resent = time.monotonic()
                continue
            op, rpsn = b[0], int.from_bytes(b[9:12], "big")
            if op == OP_ACK:
                syndrome = b[12]
                if syndrome == 0x60 and rpsn == psn and not acked:
                    # A PSN sequence error NAK (after an attack ahead of the window) asks for a
                    # resend from our PSN: go back, as a requester does.
                    self.send(self.frame(self.bth(OP_SEND_ONLY, psn, ackreq=1),
                                         bytes([STOCK_FILL]) * self.a.size))
                    resent = time.monotonic()
                    continue
                if syndrome >> 5 == 3:
                    return f"NAK syndrome {syndrome:#x} for psn {rpsn:#x}"
                if syndrome >> 5 == 0 and rpsn == psn:
                    acked = True
            elif op == OP_SEND_ONLY:
                payload = b[12:-4]
                if rpsn == self.epsn:
                    if payload != bytes([STOCK_FILL]) * self.a.size:
                        return "the server's SEND carries unexpected data"
                    self.msn += 1
                    self.epsn = (self.epsn + 1) & PSN_MASK
                    got = True
                self.ack((self.epsn - 1) & PSN_MASK)  # also re-ACKs a duplicate
        self.psn = (psn + 1) & PSN_MASK
        self.iters += 1
        return None

    def check(self, name, detail=""):
        err = self.iteration()
        if err:
            self.failed += 1
            log(f"HOSTILE {name} FAIL: not serving afterwards: {err}")
        else:
            self.passed += 1
            log(f"HOSTILE {name} ok: still serving{detail}")

    # -- attacks ---------------------------------------------------------------------------------
    def evil(self, n=None):
        return bytes([EVIL]) * (n or self.a.size)

    def attacks(self):
        p = lambda: self.psn  # noqa: E731 - the PSN the server expects next
        # Bad ICRC.
        f = bytearray(bytes(self.frame(self.bth(OP_SEND_ONLY, p(), ackreq=1), self.evil())))
        f[-1] ^= 0xFF
        self.send(f)
        self.check("bad-icrc")
        # Truncations: inside the IP header, inside the BTH, inside the payload (lengths lie).
        whole = bytes(self.frame(self.bth(OP_SEND_ONLY, p(), ackreq=1), self.evil()))
        for cut in (20, 40, 14 + 20 + 8 + 6, len(whole) - 100, len(whole) - 3):
            self.send(whole[:cut])
        self.check("truncated")
        # Reserved RC opcodes (IBTA table 38: 0x18-0x1f are reserved for RC).
        for op in range(0x18, 0x20):
            self.send(self.frame(self.bth(op, p(), ackreq=1), self.evil()))
        self.check("reserved-opcode")
        # A P_Key the port does not hold (and 0, and a limited-membership mismatch).
        for pkey in (0x1234, 0x0000, 0x7FFE):
            self.send(self.frame(self.bth(OP_SEND_ONLY, p(), ackreq=1, pkey=pkey), self.evil()))
        self.check("bad-pkey")
        # Spoofed source address: a SEND and an RDMA WRITE with guessed R_Keys at the right PSN.
        self.send(self.frame(self.bth(OP_SEND_ONLY, p(), ackreq=1), self.evil(), src="10.0.0.9"))
        for rkey in range(0x100, 0x1100, 0x100):
            reth = struct.pack(">QII", 0, rkey, 64)
            self.send(self.frame(self.bth(OP_WRITE_ONLY, p(), ackreq=1), reth + self.evil(64),
                                 src="10.0.0.9"))
        # Forged ACK and NAK (remote access error) for the server's next send, from elsewhere.
        for syndrome in (0x1F, 0x62, 0x60):
            self.send(self.frame(BTH(opcode=OP_ACK, dqpn=self.peer_qpn, psn=self.epsn, icrc=None)
                                 / AETH(syndrome=syndrome, msn=self.msn), src="10.0.0.9"))
        self.check("spoofed-source")
        # Neighbour table: ARP requests for the server's address from 500 strangers, and 500
        # requests and gratuitous replies about other addresses.
        for i in range(1000):
            mac = "02:%02x:%02x:%02x:%02x:%02x" % tuple(random.randrange(256) for _ in range(5))
            src = "10.%d.%d.%d" % (random.randrange(1, 255), random.randrange(256), random.randrange(1, 255))
            dst = self.peer_ip if i < 500 else "10.0.0.%d" % random.randrange(150, 250)
            self.send(Ether(src=mac, dst="ff:ff:ff:ff:ff:ff")
                      / ARP(op=1 if i % 2 == 0 else 2, hwsrc=mac, psrc=src, pdst=dst))
        self.check("arp-flood")
        # PSNs out of the window: far ahead (a sequence NAK at most) and long past (duplicates).
        for d in (1 << 22, (1 << 23) + 5, -1000, -(1 << 22)):
            self.send(self.frame(self.bth(OP_SEND_ONLY, p() + d, ackreq=1), self.evil()))
        self.check("out-of-window")
        # Floods: duplicates of the last PSN, then garbage after a valid-looking BTH.
        t0 = time.monotonic()
        dup = bytes(self.frame(self.bth(OP_SEND_ONLY, p() - 1, ackreq=0), self.evil()))
        for _ in range(2000):
            self.send(dup)
        for _ in range(2000):
            self.send(bytes(self.frame(self.bth(random.randrange(256), random.randrange(1 << 24)),
                                       os.urandom(random.randrange(0, 1100)))))
        self.check("flood", f" (4000 frames in {time.monotonic() - t0:.1f} s)")
        # Last: from the connected address, an RDMA WRITE with a guessed R_Key: a fatal NAK.
        reth = struct.pack(">QII", 0x1000, 0x101, 64)
        psn = p()
        self.send(self.frame(self.bth(OP_WRITE_ONLY, psn, ackreq=1), reth + self.evil(64)))
        deadline = time.monotonic() + self.a.timeout
        while True:
            b = self.recv_roce(deadline)
            if b is None:
                self.failed += 1
                log(f"HOSTILE rkey-guess FAIL: no NAK within {self.a.timeout} s")
                return
            if b[0] == OP_ACK and b[12] >> 5 == 3:
                syndrome, rpsn = b[12], int.from_bytes(b[9:12], "big")
                if syndrome == 0x62 and rpsn == psn:
                    self.passed += 1
                    log("HOSTILE rkey-guess ok: fatal NAK (remote access error) for the guessed R_Key")
                else:
                    self.failed += 1
                    log(f"HOSTILE rkey-guess FAIL: NAK syndrome {syndrome:#x} psn {rpsn:#x}, "
                        f"expected 0x62 for {psn:#x}")
                return
            if b[0] == OP_ACK and b[12] >> 5 == 0 and int.from_bytes(b[9:12], "big") == psn:
                self.failed += 1
                log("HOSTILE rkey-guess FAIL: the WRITE with a guessed R_Key was acknowledged")
                return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iface", required=True)
    ap.add_argument("--ip", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--port", type=int, default=18515)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    peer = Peer(args)
    peer.exchange()
    peer.resolve()
    for i in range(args.warmup):
        err = peer.iteration()
        if err:
            log(f"HOSTILE warmup FAIL: iteration {i}: {err}")
            peer.failed += 1
            break
    else:
        log(f"HOSTILE warmup ok: {args.warmup} iterations")
        peer.passed += 1
        peer.attacks()
    log(f"HOSTILE-RESULT passed={peer.passed} failed={peer.failed} iterations={peer.iters}")
    return 1 if peer.failed else 0


if __name__ == "__main__":
    sys.exit(main())
