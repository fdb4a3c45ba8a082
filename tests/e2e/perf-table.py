#!/usr/bin/python3
"""Prints the e2e test's perftest figures side by side (tests/e2e/run.sh, RESULTS/perftest.csv).

CSV rows: pair,side,kind,peer_kind,tool,role,bytes,value,unit. A figure is the client's (perftest
prints its results there; the server's lines are ignored). Columns are "client kind -> server
kind" (rxe: Soft-RoCE guest; ibv: a vrnic guest running Debian's tools on vrnic's
libibverbs.so.1), each the mean over the runs of that direction, then vrnic's columns as a ratio
of rxe->rxe (bandwidth: higher is better; latency: lower is better). A pair named *-switch (both
vrnic guests on one daemon, through its embedded switch) has its own column, "v->v switch".
"""
import csv
import sys
from collections import defaultdict

NAME = {"rxe": "rxe", "ibv": "vrnic", "vrnic": "vrnic"}


def main(path):
    figs = defaultdict(list)
    units = {}
    for row in csv.reader(open(path)):
        if len(row) != 9:
            continue
        pair, side, kind, peer, tool, role, nbytes, value, unit = row
        if role != "client" or value == "none":
            continue
        col = f"{NAME.get(kind, kind)}->{NAME.get(peer, peer)}"
        if pair.endswith("-switch"):
            col = "v->v switch"
        figs[(tool, col)].append(float(value))
        units[tool] = f"{unit}, {nbytes} B"
    cols = ["rxe->rxe", "vrnic->rxe", "rxe->vrnic", "vrnic->vrnic", "v->v switch"]
    tools = sorted({t for t, _ in figs}, key=lambda t: (t.endswith("_lat"), t))
    print("perftest under the same QEMU and accelerator, client's figures "
          "(BW average / typical latency); ratio = vrnic column / rxe->rxe")
    print(f"{'tool':<14} {'unit':<16}" + "".join(f"{c:>14}" for c in cols) + f"{'ratio v->v':>12}{'ratio sw':>10}")
    for t in tools:
        vals = {c: sum(figs[(t, c)]) / len(figs[(t, c)]) for c in cols if figs.get((t, c))}
        line = f"{t:<14} {units[t]:<16}" + "".join(
            f"{vals[c]:>14.2f}" if c in vals else f"{'-':>14}" for c in cols)
        base, v, sw = vals.get("rxe->rxe"), vals.get("vrnic->vrnic"), vals.get("v->v switch")
        line += f"{v / base:>12.2f}" if base and v else f"{'-':>12}"
        line += f"{sw / base:>10.2f}" if base and sw else f"{'-':>10}"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1])
