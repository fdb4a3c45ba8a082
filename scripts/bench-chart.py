#!/usr/bin/python3
"""The chart of a scripts/bench.sh run: bench.json -> bench.png.

Top left: perftest bandwidth (Gb/s of payload) against message size, one line per
mode (how the two programs reach vrnic; 1-QP rows of the size sweep), with the
machine's best raw frame rate and its raw TAP frame rate measured in the same run
as dashed lines; ucx_perftest's tag_bw 64 KiB and Open MPI's 4 MiB ping-pong are
one point each per mode.
Top right: perftest's 64 B and ucx_perftest tag_lat's 8 B latencies (us) per mode and
tool, with the busy-poll round trips (AF_PACKET and TAP), the yield relay round trip
(two yielding pollers through a third thread: the switch's floor) and the relayed wire round trips
(two yielding ends through two yielding relays and the veth pair or the TAPs'
bridge: the floor between two daemons) of the same run as lines.
Bottom left (modes switch-q, tap-q, packet-q): aggregate bandwidth against the
number of QPs, one line per mode, tool and size, each multi-QP point labelled
with Jain's fairness index of its QPs' throughput.
Bottom right (mode tap-loss): ib_write_bw 4 MiB goodput with 1 and 8 QPs
through a bridge dropping 1% of RoCEv2 frames, beside the same rows without
loss (tap-q) when the run has them, labelled with retransmissions per GB.

Usage: bench-chart.py OUT_DIR   (reads OUT_DIR/bench.json, writes OUT_DIR/bench.png)
Needs python3-matplotlib (Debian package; scripts/deps.sh --bench installs it).
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fnum(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def gbps(r):
    x = fnum(r.get("value"))
    return x * 8 / 1000 if x is not None else None


def size_txt(b):
    b = int(b)
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def sweep(bw, runs, lim):
    best = max(float(lim.get("pkt_sendmmsg64_4154_gbps", 0) or 0),
               float(lim.get("pkt_send_4154_gbps", 0) or 0))
    tap = float(lim.get("tap_write_4154_gbps", 0) or 0)
    uso = float(lim.get("pkt_uso_4154_gbps", 0) or 0)
    series = {}
    for r in runs:
        if r.get("unit") != "MB/s" or "atomic" in r["what"]:
            continue
        # The QP-scaling and loss modes have panels of their own.
        if r["mode"].endswith("-q") or r["mode"] == "tap-loss" or r.get("qps") not in (None, "1", "-"):
            continue
        v = gbps(r)
        if v is None:
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
    bw.set_title("bandwidth (1 QP; perftest, ucx_perftest tag_bw, MPI ping-pong)")
    bw.legend(fontsize=7)
    bw.grid(alpha=0.3)


def latency(lat, runs, lim):
    rtt = float(lim.get("rtt_busy_us", 0) or 0)
    tap_rtt = float(lim.get("rtt_tap_busy_us", 0) or 0)
    relay = float(lim.get("rtt_relay1_us", 0) or 0)
    floors = [(float(lim.get(k, 0) or 0), name) for k, name in
              (("rtt_relay_wire_us", "AF_PACKET"), ("rtt_relay_tap_us", "TAP"))]
    names, vals = [], []
    for r in runs:
        if r.get("unit") != "us" or r["what"] not in ("ib_send_lat", "ib_write_lat", "ucx_tag_lat"):
            continue
        v = fnum(r["value"])
        if v is None:
            continue
        # "send switch", "write tap", "ucx_tag 8 B switch" (UCX's rows are 8 B, perftest's 64 B).
        what = r["what"].replace("ib_", "").replace("_lat", "")
        if r["what"].startswith("ucx_"):
            what += f" {r['bytes']} B"
        names.append(f"{what} {r['mode']}")
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
    lat.set_title("latency (perftest 64 B, ucx_perftest tag_lat 8 B)")
    lat.grid(alpha=0.3, axis="y")


def scaling(ax, runs):
    """Aggregate Gb/s against QPs; colour per mode, line style per tool, marker per size."""
    colours = {"switch-q": "tab:blue", "tap-q": "tab:orange", "packet-q": "tab:green"}
    styles = {"ib_write_bw": "-", "ib_read_bw": "--"}
    markers = {}
    series = {}
    for r in runs:
        if not r["mode"].endswith("-q") or r.get("unit") != "MB/s":
            continue
        v, q = gbps(r), fnum(r.get("qps"))
        if v is None or q is None:
            continue
        series.setdefault((r["mode"], r["what"], int(r["bytes"])), []).append((q, v, fnum(r.get("jain"))))
    for n, ((mode, what, size), pts) in enumerate(sorted(series.items())):
        pts.sort()
        m = markers.setdefault(size, "os^vD"[len(markers) % 5])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=m, color=colours.get(mode),
                linestyle=styles.get(what, ":"), label=f"{what} {mode[:-2]} {size_txt(size)}")
        for q, v, j in pts:
            if j is not None:
                # Staggered: the lines of one mode often end close together.
                ax.annotate(f"J {j:.2f}", (q, v), textcoords="offset points", xytext=(5, 6 - 5 * (n % 3)),
                            fontsize=6, color=colours.get(mode))
    qs = [p[0] for pts in series.values() for p in pts]
    if qs:
        ax.set_xlim(min(qs) / 1.3, max(qs) * 2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("QPs (perftest -q)")
    ax.set_ylabel("aggregate payload Gb/s")
    ax.set_title("QP scaling (J: Jain's index of the QPs' throughput; target 0.95)")
    # Below the axes: the lines fill the panel's width.
    ax.legend(fontsize=6, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    ax.grid(alpha=0.3, which="both")


def loss(ax, runs, per_mille):
    """ib_write_bw 4 MiB with and without loss, 1 and 8 QPs."""
    bars = []
    for mode, name in (("tap-q", "no loss"), ("tap-loss", f"{per_mille / 10:g}% loss")):
        for q in ("1", "8"):
            r = next((r for r in runs if r["mode"] == mode and r["what"] == "ib_write_bw"
                      and r["bytes"] == "4194304" and r.get("qps") == q), None)
            if r is None or gbps(r) is None:
                continue
            bars.append((f"{name}\n{q} QP{'s' if q != '1' else ''}", gbps(r), r.get("retx_per_gb"),
                         "tab:red" if mode == "tap-loss" else "tab:grey"))
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[3] for b in bars])
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    for i, (_, v, retx, _) in enumerate(bars):
        if retx is not None:
            ax.annotate(f"{retx:.0f} retx/GB", (i, v), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=7)
    ax.set_ylabel("payload Gb/s")
    ax.set_title("TAP, ib_write_bw 4 MiB through a lossy bridge")
    ax.grid(alpha=0.3, axis="y")


def main() -> int:
    out = sys.argv[1]
    doc = json.load(open(f"{out}/bench.json"))
    lim = doc["limits"]
    runs = doc["runs"]
    # The panels this run has rows for, two to a row.
    panels = []
    if any(r.get("unit") == "MB/s" and not r["mode"].endswith("-q") and r["mode"] != "tap-loss" for r in runs):
        panels.append(lambda ax: sweep(ax, runs, lim))
    if any(r.get("unit") == "us" for r in runs):
        panels.append(lambda ax: latency(ax, runs, lim))
    if any(r["mode"].endswith("-q") for r in runs):
        panels.append(lambda ax: scaling(ax, runs))
    if any(r["mode"] == "tap-loss" for r in runs):
        panels.append(lambda ax: loss(ax, runs, doc.get("loss_per_mille", 10)))
    if not panels:
        print("no rows to draw", file=sys.stderr)
        return 1
    nrows = (len(panels) + 1) // 2
    ncols = min(2, len(panels))
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols + 0.5 * (ncols == 1), 5.5 * nrows), squeeze=False)
    cells = [ax for row in axes for ax in row]
    for draw, ax in zip(panels, cells):
        draw(ax)
    for ax in cells[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("vrnic (perftest, ucx_perftest, Open MPI) vs this machine's limits (same run)")
    fig.tight_layout()
    fig.savefig(f"{out}/bench.png", dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
