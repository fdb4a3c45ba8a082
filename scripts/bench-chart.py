#!/usr/bin/python3
"""The chart of a scripts/bench.sh run: bench.json -> bench.png.

Left: perftest bandwidth (Gb/s of payload) against message size, one line per
mode (how the two programs reach vrnic), with the machine's best raw frame
rate and its raw TAP frame rate measured in the same run as dashed lines.
Right: 64 B latencies (us) per mode and tool, with the busy-poll round trips
(AF_PACKET and TAP), the yield relay round trip (two yielding pollers
through a third thread: the switch's floor) and the relayed wire round trips
(two yielding ends through two yielding relays and the veth pair or the TAPs'
bridge: the floor between two daemons) of the same run as lines.

Usage: bench-chart.py OUT_DIR   (reads OUT_DIR/bench.json, writes OUT_DIR/bench.png)
Needs python3-matplotlib (Debian package).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    out = sys.argv[1]
    doc = json.load(open(f"{out}/bench.json"))
    lim = doc["limits"]
    runs = doc["runs"]
    best = max(float(lim.get("pkt_sendmmsg64_4154_gbps", 0) or 0),
               float(lim.get("pkt_send_4154_gbps", 0) or 0))
    rtt = float(lim.get("rtt_busy_us", 0) or 0)
    tap = float(lim.get("tap_write_4154_gbps", 0) or 0)
    uso = float(lim.get("pkt_uso_4154_gbps", 0) or 0)
    tap_rtt = float(lim.get("rtt_tap_busy_us", 0) or 0)
    relay = float(lim.get("rtt_relay1_us", 0) or 0)
    floors = [(float(lim.get(k, 0) or 0), name) for k, name in
              (("rtt_relay_wire_us", "AF_PACKET"), ("rtt_relay_tap_us", "TAP"))]

    fig, (bw, lat) = plt.subplots(1, 2, figsize=(13, 5.5))
    series = {}
    for r in runs:
        if r.get("unit") != "MB/s" or "atomic" in r["what"]:
            continue
        try:
            v = float(r["value"]) * 8 / 1000
        except ValueError:
            continue
        series.setdefault((r["what"], r["mode"]), []).append((int(r["bytes"]), v))
    for (what, mode), pts in sorted(series.items()):
        pts.sort()
        bw.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{what} {mode}")
    if best:
        bw.axhline(best, linestyle="--", color="grey", label=f"AF_PACKET frames {best:.1f} Gb/s")
    if uso:
        bw.axhline(uso, linestyle="-.", color="grey", label=f"AF_PACKET super-frames {uso:.1f} Gb/s")
    if tap:
        bw.axhline(tap, linestyle=":", color="grey", label=f"TAP frames {tap:.1f} Gb/s")
    bw.set_xscale("log", base=2)
    bw.set_xlabel("message size (bytes)")
    bw.set_ylabel("payload Gb/s")
    bw.set_title("perftest bandwidth")
    bw.legend(fontsize=7)
    bw.grid(alpha=0.3)

    names, vals = [], []
    for r in runs:
        if r.get("unit") != "us" or r["what"] not in ("ib_send_lat", "ib_write_lat"):
            continue
        try:
            v = float(r["value"])
        except ValueError:
            continue
        names.append(f"{r['what'].replace('ib_', '').replace('_lat', '')} {r['mode']}")
        vals.append(v)
    lat.bar(range(len(vals)), vals, color="tab:blue")
    lat.set_xticks(range(len(vals)), names, fontsize=7, rotation=60, ha="right")
    if rtt:
        lat.axhline(rtt, linestyle="--", color="grey", label=f"busy-poll RTT {rtt:.1f} us")
    if tap_rtt:
        lat.axhline(tap_rtt, linestyle=":", color="grey", label=f"TAP busy-poll RTT {tap_rtt:.1f} us")
    if relay:
        lat.axhline(relay, linestyle="-.", color="grey", label=f"yield relay RTT {relay:.1f} us (switch floor)")
    for (f, name), style in zip(floors, [(0, (1, 4)), (0, (5, 4))]):
        if f:
            lat.axhline(f, linestyle=style, color="tab:red",
                        label=f"relayed {name} RTT {f:.1f} us (two daemons' floor)")
    if rtt or tap_rtt or relay or any(f for f, _ in floors):
        lat.legend(fontsize=7)
    lat.set_yscale("log")
    lat.set_ylim(bottom=1)
    lat.set_ylabel("us (typical)")
    lat.set_title("64 B latency")
    lat.grid(alpha=0.3, axis="y")

    fig.suptitle("vrnic perftest vs this machine's limits (same run)")
    fig.tight_layout()
    fig.savefig(f"{out}/bench.png", dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
