#!/usr/bin/python3
"""A remote shell for Open MPI's launcher between two test guests, which have no ssh server.

    sw-rsh.py --serve PORT          run commands for clients (until killed)
    sw-rsh.py HOST:PORT|HOST CMD... run CMD on HOST (joined by spaces, as ssh does) through its
                                    `sw-rsh.py --serve`, forwarding its output; exit with its status

mpirun (`--mca plm_rsh_agent "sw-rsh.py"`) starts its daemon `orted` on the other guest with it,
as it would with ssh: the agent lives as long as the remote command. The port is SW_RSH_PORT
(default 18799) unless HOST:PORT says. Test networks only: it runs whatever it is sent, as root,
with no authentication; tests/e2e/guest-sw.sh starts the server on the guest's test address alone.

Wire format, client to server: the command as one line (UTF-8). Server to client: frames of a
4-byte big-endian length and that many bytes of the command's output (stdout and stderr merged),
then a frame of length 0xFFFFFFFF followed by the 4-byte exit status (128 + signal if killed).
"""

import os
import socket
import struct
import subprocess
import sys
import threading

PORT = int(os.environ.get("SW_RSH_PORT", "18799"))
EXIT = 0xFFFFFFFF


def serve_one(conn):
    with conn:
        f = conn.makefile("rb")
        cmd = f.readline().decode("utf-8", "replace").rstrip("\n")
        if not cmd:
            return
        p = subprocess.Popen(["/bin/sh", "-c", cmd], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        while True:
            chunk = p.stdout.read1(65536)
            if not chunk:
                break
            conn.sendall(struct.pack(">I", len(chunk)) + chunk)
        rc = p.wait()
        rc = 128 - rc if rc < 0 else rc
        conn.sendall(struct.pack(">II", EXIT, rc))


def serve(addr, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(16)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve_one, args=(conn,), daemon=True).start()


def run(host, cmd):
    port = PORT
    if ":" in host:
        host, p = host.rsplit(":", 1)
        port = int(p)
    with socket.create_connection((host, port), timeout=30) as c:
        c.settimeout(None)
        c.sendall(cmd.replace("\n", " ").encode() + b"\n")
        f = c.makefile("rb")
        out = sys.stdout.buffer
        while True:
            head = f.read(4)
            if len(head) < 4:
                return 255  # the connection broke: as ssh does
            (n,) = struct.unpack(">I", head)
            if n == EXIT:
                return struct.unpack(">I", f.read(4))[0]
            out.write(f.read(n))
            out.flush()


def main():
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--serve":
        serve(args[2] if len(args) > 2 else "0.0.0.0", int(args[1]))
    # Options an ssh-minded caller may put before the host (-x, -p PORT, ...) are ignored.
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in ("-p", "-l", "-o") else args[1:]
    if len(args) < 2:
        sys.exit(__doc__)
    sys.exit(run(args[0], " ".join(args[1:])))


if __name__ == "__main__":
    main()
