#!/usr/bin/env bash
# vrnic benchmark (issue 10): the machine's own limits and Debian's perftest (and, issue 30,
# ucx_perftest and Open MPI) on vrnic, measured in the same run and printed side by side with
# ratios; figures, never verdicts.
#
# Usage: scripts/bench.sh [--quick] [--guests] [--out DIR]
#   1. vrnic-limits in a namespace of its own with a veth pair and two TAPs on a bridge: memcpy,
#      AF_PACKET frame rates (send and sendmmsg) and raw TAP frame rates (write into one TAP, read
#      from the other), 64 B / 1 KiB / 4 KiB payload frames, busy-poll and blocking round trips
#      over both, and two yielding pollers' round trip through one and two relay threads (the
#      hand-offs of a ping-pong through one daemon's poller, and through two daemons' workers), and
#      through two relays with the veth pair or the TAPs' bridge between them (the floor of a
#      ping-pong between two daemons over that wire);
#   2. perftest (ib_write_bw, ib_read_bw at 64 B, 4 KiB, 64 KiB, 1 MiB for 3 s each, 1 s with
#      --quick; ib_send_lat, ib_write_lat at 64 B) between two host processes in two namespaces joined by a veth pair (MTU 9000, path
#      MTU 4096), each with an in-process vrnic device (VRNIC_LOOPBACK: the engine alone on
#      AF_PACKET, mode "loopback"), then through daemons (modes switch, tap, packet, and the QP-scaling
#      and loss modes, below; switch and tap also with ucx_perftest and Open MPI);
#   3. with --guests: tests/e2e/run.sh rxe-rxe ibv-ibv ibv-ibv-switch (perftest between two rxe
#      guests, two vrnic guests on two daemons over TAP, and two vrnic guests on one daemon through
#      its switch, under the same QEMU accelerator; several minutes under TCG), every tool with
#      -n 5000 (perftest's own default for the bandwidth tools; BENCH_GUEST_PERF_ARGS to change):
#      the e2e's -n 200 moves 13 MB, ~30 ms for vrnic, where start-up weighs on the figure.
#      Then the e2e step software with two rxe guests and two vrnic guests: ucx_perftest tag_bw
#      64 KiB and tag_lat 8 B over rc_verbs (2000 each; BENCH_GUEST_UCX_TESTS) and Open MPI's
#      checked ping-pong across the two guests (its 4 MiB round), and rdma_cm's connection rate
#      (cmtime -c 10: Linux's CM between the rxe guests, the agents' between the vrnic guests; rows
#      cmtime_connect, cmtime_disconnect), rows guests-rxe-rxe and guests-vrnic-vrnic.
# Each perftest row also shows why a figure is low: the frames the receive queues dropped and, for
# in-process devices (VRNIC_STATS=1), the ACK timeouts and sequence NAKs of that run; and what it
# cost: the CPU time of every process of the run (both perftest processes, from getrusage at
# their exit, and the daemons, from /proc/PID/stat before and after) over its wall time, the CPU
# cores used, and for bandwidth rows CPU seconds per Gbit of RoCEv2 payload the devices sent
# (their tx_bytes counters, retransmissions included).
# --quick: shorter runs. Results: DIR (default out/bench-DATE) with bench.csv, bench.json and the
# printed table (bench.txt), the chart (bench.png), the per-QP samples of multi-QP rows (qp/), a
# failed run's perftest output (fail-*.out).
# Needs root; installs its Debian packages when missing (scripts/deps.sh --bench: perftest,
# iproute2, nftables, ucx-utils, openmpi-bin and libopenmpi-dev, python3-matplotlib for the chart).
# Daemon modes (2b): the same perftest between two host processes each attached to a vrnic
# function of a release `vrnic` daemon through its vhost-user socket (VRNIC_VHOST_USER: the
# containers' path, guest-lib/src/vhost_user.rs), the two in one namespace (TCP over lo):
#   switch: one daemon, two functions, through its embedded switch (its uplink a TAP nobody reads);
#           with tap, also UCX and Open MPI (issue 30): ucx_perftest tag_bw 64 KiB (3000 messages,
#           20000 without --quick) and tag_lat 8 B (1000 round trips, 5000) over rc_verbs
#           (UCX_TLS=rc_v), server and client one on each function (rows ucx_tag_bw, ucx_tag_lat),
#           and Open MPI's ping-pong bandwidth at 4 MiB for 1 s (3 s; row mpi_pingpong: mpirun
#           --mca pml ucx, tests/c/mpi_pingpong.c --bw, its two ranks one on each function), each
#           beside the limits of perftest's rows of its mode. UCX needs /dev/infiniband/
#           vrnic-uverbs0 to be a character device: its processes run in mount namespaces of
#           their own whose /dev has it (with_node), the host's /dev untouched;
#   switch-agent: as switch, each process reaching its function through the agent vrnic's library
#           starts (vrnic-agent --vhost-user: how a container with vrnic's package runs, several
#           processes per function; every other daemon mode has each process its function's own
#           frontend, VRNIC_AGENT=off);
#   tap:    two daemons on two TAPs of a bridge (MTU 9000);
#   packet: two daemons on the two ends of a veth pair (AF_PACKET, MTU 9000);
#   flood:  as switch with a third function, ib_send_lat/ib_write_lat at 64 B between the first two
#           while the third is idle (mode switch-idle3), then while a hostile frontend floods the
#           third's control queue (vrnic-flood, of the package vrnic-frontend: the queue kept a ring
#           ahead of the device with a failing 64 Ki-page REG_MR, milliseconds of work each; mode
#           switch-flooded, its ratio the figure over the idle one of the same run: what one
#           flooding tenant costs the others);
#   switch-q, tap-q, packet-q (QP scaling, issue 28): the daemons of switch, tap, packet, and
#           ib_write_bw, ib_read_bw at 64 KiB and 4 MiB with each -q of BENCH_QPS (default "1 8 64"),
#           timed as above; each multi-QP row beside the 1-QP figure of the same size (vs_q1) with
#           Jain's index J = (sum x)^2 / (n sum x^2) of its QPs' throughput x: the payload sender's
#           per-QP tx_bytes (`qp_<qpn>_tx_bytes` of `vrnic stats`, sampled after a third and two
#           thirds of -D, since the QPs die with perftest; qp_sampler), printed beside the aggregate
#           (issue 28's target is 0.95: a figure, not a verdict). 64 QPs of 4 MiB register 512 MiB
#           on each side first: tens of seconds a run here, so such runs get 300 s, not 120;
#   tap-loss (issue 28, point 4): as tap with BENCH_LOSS per mille (default 10: 1%) of the RoCEv2
#           frames the bridge forwards to each daemon dropped by nft on both TAPs' egress (no
#           sch_netem on this kernel; an AF_PACKET sender resends its own egress drops as ENOBUFS,
#           so the loss is on the TAPs), ib_write_bw 4 MiB with -q 1 and -q 8: 8 QPs' goodput as a
#           fraction of 1 QP's (vs_q1), retransmissions per GB and the frames nft saw and dropped.
# Their rows show the daemons' dropped frames (rx_dropped + link_rx_dropped), retransmits and
# sequence NAKs received during the run (`vrnic stats`), and every bandwidth row (retx/GB) those
# retransmits + nak_psn_seq_received per GB of RoCEv2 payload the devices sent. The chart
# (bench.png, scripts/bench-chart.py) shows bandwidth by size per mode and the latencies against
# the limits, aggregate bandwidth and J against QPs, and goodput with and without loss.
# With --guests the guests' daemons are the release build too (VRNIC_BIN).
# For A/B runs: BENCH_MODES="switch tap" runs only those host modes (default: loopback switch tap
# packet flood switch-q tap-q packet-q tap-loss; the last four, 38 runs, took a full run here
# from 4 to 10 min, 3.5 min of --quick, more on a busy machine, where setting up 64 QPs of 4 MiB
# alone took up to 45 s a run); BENCH_QPS="1 8" leaves out the 64-QP runs (3.5 of those 6 min);
# BENCH_DAEMON_ARGS="--poll-us 0" adds arguments to every daemon of the daemon modes.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
quick=0 guests=0 out=
while [ $# -gt 0 ]; do
    case $1 in
    --quick) quick=1 ;;
    --guests) guests=1 ;;
    --out) out=$2; shift ;;
    *) echo "usage: scripts/bench.sh [--quick] [--guests] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
[ "$(id -u)" = 0 ] || { echo "bench: needs root (network namespaces)" >&2; exit 1; }
# The Debian packages of the runs and of the chart (apt-get, only when missing); without them (no
# package mirror) the checks below say what is missing, and only the chart is optional.
"$top/scripts/deps.sh" --bench || echo "bench: scripts/deps.sh --bench failed" >&2
for b in ib_write_bw ip timeout; do
    command -v $b >/dev/null || { echo "bench: $b missing (scripts/deps.sh)" >&2; exit 1; }
done
modes=${BENCH_MODES:-loopback switch switch-agent tap packet flood switch-q tap-q packet-q tap-loss}
qps=${BENCH_QPS:-1 8 64}
loss=${BENCH_LOSS:-10}
for m in $modes; do
    case $m in
    loopback | switch | switch-agent | tap | packet | flood | switch-q | tap-q | packet-q | tap-loss) ;;
    *) echo "bench: unknown mode $m in BENCH_MODES" >&2; exit 2 ;;
    esac
done
for q in $qps $loss; do
    case $q in '' | *[!0-9]*) echo "bench: BENCH_QPS and BENCH_LOSS take whole numbers" >&2; exit 2 ;; esac
done
# ucx_mpi: 1 when the run has the UCX and Open MPI rows (modes switch and tap).
ucx_mpi=0
case " $modes " in
*" switch "* | *" tap "*)
    ucx_mpi=1
    for b in ucx_perftest mpirun mpicc unshare; do
        command -v $b >/dev/null || { echo "bench: $b missing for the UCX and MPI rows (scripts/deps.sh)" >&2; exit 1; }
    done
    ;;
esac
case " $modes " in
*" tap-loss "*) command -v nft >/dev/null || { echo "bench: nft missing for mode tap-loss (scripts/deps.sh)" >&2; exit 1; } ;;
esac
out=${out:-$top/out/bench-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
# Bandwidth runs are timed (perftest -D, whole seconds): a fixed count of 1 MiB messages made
# runs of a few tens of ms whose figure was mostly start-up and scheduling noise.
secs=1 bw_secs=3 lat_iters=2000
[ $quick = 1 ] && secs=0.3 bw_secs=1 lat_iters=300
# ucx_perftest has no time limit, only counts: 64 KiB messages for tag_bw (20000: 1.3 GB, a few
# seconds at this machine's ~1 GB/s through vrnic) and round trips of 8 B for tag_lat.
ucx_bw_iters=20000 ucx_lat_iters=5000 cm_conns=100
[ $quick = 1 ] && ucx_bw_iters=3000 ucx_lat_iters=1000 cm_conns=20
tag=vrb$$
ns_l=$tag-l ns_a=$tag-a ns_b=$tag-b ns_v=$tag-v
pids=() dpids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    for p in ${dpids[@]+"${dpids[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${dpids[@]+"${dpids[@]}"}; do wait "$p" 2>/dev/null || true; done
    for n in $ns_l $ns_a $ns_b $ns_v; do ip netns del "$n" 2>/dev/null || true; done
    rm -rf "/tmp/$tag"
}
trap cleanup EXIT
log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }

log "building (release)"
(cd "$top" && cargo build -q --release -p vrnic-ibverbs -p vrnic-rdmacm -p vrnic-tools)
# shellcheck source=scripts/lib.sh
. "$top/scripts/lib.sh" # vr_netns_no_brnf (bridges without netfilter hooks, as in the e2e)
lib=$("$top/scripts/ibverbs-lib.sh" --release)
rel=$top/target/release
# vrnic's librdmacm.so.1 beside its libibverbs.so.1 (the rdma_cm rows, cm_rows).
cp "$rel/libvrnic_rdmacm.so" "$lib/librdmacm.so.1.tmp"
mv "$lib/librdmacm.so.1.tmp" "$lib/librdmacm.so.1"
mkdir -p "/tmp/$tag"
if [ $ucx_mpi = 1 ]; then
    # The MPI rows' program (its --bw mode) and the wrapper that gives each rank its own function.
    mpicc -O2 -Wall -o "/tmp/$tag/mpi_pingpong" "$top/guest-lib/ibverbs/tests/c/mpi_pingpong.c"
    # shellcheck disable=SC2016 # the wrapper expands them, in each rank
    printf '%s\n' '#!/bin/sh' 'export VRNIC_VHOST_USER="$TMPDIR/f$((OMPI_COMM_WORLD_RANK + 1)).sock"' 'exec "$@"' \
        >"/tmp/$tag/mpi-rank.sh"
    chmod +x "/tmp/$tag/mpi-rank.sh"
fi

# Namespaces: one with both ends of a veth pair and two TAPs on a bridge (the limits probe), two
# joined by a veth pair. Deleting a namespace (cleanup) deletes its interfaces.
ip netns add $ns_l
vr_netns_no_brnf $ns_l
ip -n $ns_l link add vA type veth peer name vB
for i in vA vB; do ip -n $ns_l link set $i mtu 9000 up; done
ip -n $ns_l link add br-l type bridge
for i in tA tB; do
    ip -n $ns_l tuntap add dev $i mode tap
    ip -n $ns_l link set $i mtu 9000 master br-l up
done
ip -n $ns_l link set br-l up
ip netns add $ns_a
ip netns add $ns_b
ip -n $ns_a link add veth-a type veth peer name veth-b netns $ns_b
ip -n $ns_a addr add 10.77.0.1/24 dev veth-a
ip -n $ns_b addr add 10.77.0.2/24 dev veth-b
for s in a b; do
    n=$tag-$s
    ip -n "$n" link set "veth-$s" mtu 9000 up
    ip -n "$n" link set lo up
done

log "machine limits (vrnic-limits, ${secs}s per figure)"
ip netns exec $ns_l "$rel/vrnic-limits" --a vA --b vB --tap-a tA --tap-b tB --secs $secs >"$out/limits.txt"
lim() { sed -n "s/^$1=//p" "$out/limits.txt"; }

# stat KEY FILE...: KEY's value summed over the vrnic-stats lines (VRNIC_STATS=1) of FILEs.
stat() {
    local k=$1
    shift
    cat "$@" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$k=//p" | awk '{ s += $1; n++ } END { print n ? s : "-" }'
}

# CPU time of a run's processes. cpu_wrap runs its arguments (as `bash -c "$cpu_wrap" FILE CMD...`)
# and then writes bash's `times` to FILE: its second line is the user and system time of every
# process it waited for (getrusage RUSAGE_CHILDREN: the command and the processes it waited for,
# all threads, to the microsecond). times_cpu FILE...: those seconds summed over FILEs.
# proc_ticks PID...: user + system time of running processes, all their threads (ended ones
# too), in clock ticks (/proc/PID/stat fields 14 and 15).
cpu_wrap='f=$0; "$@"; r=$?; times >"$f"; exit $r'
times_cpu() {
    cat "$@" 2>/dev/null | awk 'NR % 2 == 0 { for (i = 1; i <= 2; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] } }
        END { printf "%.3f\n", s }'
}
hz=$(getconf CLK_TCK)
proc_ticks() {
    local p st s=0
    for p in "$@"; do
        st=$(cat "/proc/$p/stat" 2>/dev/null) || continue
        read -ra st <<<"${st##*) }"
        s=$((s + st[11] + st[12]))
    done
    echo $s
}

# pair_tmo: the bound on each perftest process of a run, in seconds (qp_scaling raises it: 64 QPs
# of 4 MiB register 512 MiB on each side before the first message).
pair_tmo=120
# run_cost D0 T0: "cpu_s wall_s daemon_cpu_s" of the run that just ended: the CPU seconds of its
# processes (cpu_wrap's files /tmp/$tag/cpu-*) and of the daemons since D0 (proc_ticks), the wall
# seconds since T0 (EPOCHREALTIME), the daemons' share.
run_cost() {
    awk -v a="$(times_cpu "/tmp/$tag"/cpu-*)" -v d="$(($(proc_ticks ${dpids[@]+"${dpids[@]}"}) - $1))" \
        -v hz="$hz" -v t0="$2" -v t1="$EPOCHREALTIME" 'BEGIN { printf "%.3f %.3f %.2f", a + d / hz, t1 - t0, d / hz }'
}
# UCX (ucx_perftest, Open MPI's pml ucx) skips a verbs device unless /dev/infiniband/<dev_name> is
# an accessible character device; vrnic's library names vrnic-uverbs0. "${with_node[@]}" DIR CMD...
# runs CMD in a mount namespace of its own whose /dev has that node (-> /dev/null), the host's
# /dev left alone (scripts/uverbs-node.sh, the UCX tests' script). DIR, new for each command,
# holds the namespace's two mountpoints, empty directories once it is gone (cleanup removes
# /tmp/$tag).
with_node=(unshare --mount --propagation private sh "$top/scripts/uverbs-node.sh")
# The UCX environment of every UCX process: rc_verbs (UCX wires RC up over UD) on vrnic's port.
ucx_env=(UCX_TLS=rc_v UCX_NET_DEVICES=vrnic0:1)
# run_pair MODE TOOL PORT ARGS...: a perftest server and client (the client retrying, bounded,
# while the server is not listening yet); prints the client's figure (BW average MB/s, or
# t_typical µs) or "fail", then the run's dropped frames, ACK timeouts (retransmits), sequence
# NAKs and Gbit of payload the devices sent, then its CPU seconds (both perftest processes, every
# client attempt, and the daemons), wall seconds (the last client attempt's start to both ended)
# and the daemons' share of those CPU seconds. Mode loopback: server in ns_a, client in ns_b, each
# with an in-process device, which reports its counters when it stops (VRNIC_STATS=1). Daemon
# modes (start_daemons): both in ns_v on the functions f1 and f2, the counters the daemons'
# differences over the run (dcounters).
# TOOL ucx_tag_bw or ucx_tag_lat (daemon modes): ucx_perftest -t tag_bw or tag_lat over rc_verbs
# on vrnic0:1 (ucx_env), each side in with_node; ARGS go to the client, which tells the server
# the test. Its figure, from the client's "Final:" line: the overall bandwidth (MB/s, MB = 2^20
# bytes as perftest's) or the 50th percentile latency (µs, half a round trip as perftest's
# t_typical).
run_pair() {
    local mode=$1 tool=$2 port=$3 ns_s ns_c peer base= c t=0 srv d0 t0 v
    shift 3
    local env_a env_b srv_cmd cli_cmd cmd
    if [ "$mode" = loopback ]; then
        ns_s=$ns_a ns_c=$ns_b peer=10.77.0.1
        env_a=(VRNIC_LOOPBACK="netdev=veth-a,ip=10.77.0.11/24" VRNIC_STATS=1)
        env_b=(VRNIC_LOOPBACK="netdev=veth-b,ip=10.77.0.12/24" VRNIC_STATS=1)
    else
        ns_s=$ns_v ns_c=$ns_v peer=127.0.0.1
        local agent=off
        [ "$mode" = switch-agent ] && agent=$rel/vrnic-agent
        # Through rdma_cm (cm_rows' cm=1): the agent's connection manager, the server's function
        # address.
        if [ "${cm:-0}" = 1 ]; then
            agent=$rel/vrnic-agent peer=10.78.0.1
        fi
        env_a=(VRNIC_AGENT=$agent TMPDIR=/tmp/$tag VRNIC_VHOST_USER="/tmp/$tag/f1.sock")
        env_b=(VRNIC_AGENT=$agent TMPDIR=/tmp/$tag VRNIC_VHOST_USER="/tmp/$tag/f2.sock")
        base=$(dcounters)
    fi
    case $tool in
    ucx_*)
        env_a+=("${ucx_env[@]}") env_b+=("${ucx_env[@]}")
        srv_cmd=("${with_node[@]}" "/tmp/$tag/dev-$port-s" ucx_perftest -p "$port")
        cli_cmd=(ucx_perftest "$peer" -p "$port" -t "${tool#ucx_}" "$@")
        ;;
    *)
        local gid=(-x 1)
        [ "${cm:-0}" = 1 ] && gid=(-R)
        srv_cmd=("$tool" "${gid[@]}" -p "$port" "$@")
        cli_cmd=("$tool" "${gid[@]}" -p "$port" "$@" "$peer")
        ;;
    esac
    rm -f "/tmp/$tag"/cpu-*
    d0=$(proc_ticks ${dpids[@]+"${dpids[@]}"})
    ip netns exec "$ns_s" env LD_LIBRARY_PATH="$lib" "${env_a[@]}" bash -c "$cpu_wrap" "/tmp/$tag/cpu-server" \
        timeout "$pair_tmo" "${srv_cmd[@]}" >"/tmp/$tag/server.out" 2>&1 &
    srv=$!
    v=
    # t0: the start of the client attempt that connects (the retries' pauses are not the run's).
    # UCX's client says "connect() failed: Connection refused".
    while t0=$EPOCHREALTIME
        cmd=("${cli_cmd[@]}")
        [[ $tool != ucx_* ]] || cmd=("${with_node[@]}" "/tmp/$tag/dev-$port-c$t" "${cmd[@]}")
        ! ip netns exec "$ns_c" env LD_LIBRARY_PATH="$lib" "${env_b[@]}" bash -c "$cpu_wrap" "/tmp/$tag/cpu-client-$t" \
            timeout "$pair_tmo" "${cmd[@]}" >"/tmp/$tag/client.out" 2>&1; do
        t=$((t + 1))
        if [ $t -ge 50 ] || ! grep -qiE "couldn.t connect|connection refused|REJECTED|Unable to Connect|Unexpected CM event|Unable to init the socket" "/tmp/$tag/client.out"; then
            v=fail
            break
        fi
        sleep 0.2
    done
    wait $srv || true
    local cost
    cost=$(run_cost "$d0" "$t0")
    if [ -z "$v" ]; then
        case $tool in
        ucx_*_bw) v=$(awk '$1 == "Final:" { print $7; found = 1 } END { if (!found) print "fail" }' "/tmp/$tag/client.out") ;;
        ucx_*) v=$(awk '$1 == "Final:" { print $3; found = 1 } END { if (!found) print "fail" }' "/tmp/$tag/client.out") ;;
        *)
            case $tool in
            *_bw) c=4 ;;
            *) c=5 ;;
            esac
            v=$(awk -v c=$c '/#bytes/ { getline; if ($1 ~ /^[0-9]+$/) { print $c; found = 1 } exit }
                END { if (!found) print "fail" }' "/tmp/$tag/client.out")
            ;;
        esac
    fi
    echo "$v $(counters "$mode" "$base") $cost"
}

# counters MODE BASE: "drops timeouts seq_naks gbit" of the run that just ended (run_pair), gbit
# the RoCEv2 payload both devices sent; BASE is dcounters' line from before the run in the daemon
# modes.
counters() {
    local f=("/tmp/$tag/server.out" "/tmp/$tag/client.out") d0 r0 n0 b0 d1 r1 n1 b1 bytes
    if [ "$1" = loopback ]; then
        bytes=$(stat tx_bytes "${f[@]}")
        echo -n "$(stat link_rx_dropped "${f[@]}") $(stat retransmits "${f[@]}") $(stat nak_psn_seq_received "${f[@]}")"
    else
        read -r d0 r0 n0 b0 <<<"$2"
        read -r d1 r1 n1 b1 < <(dcounters)
        bytes=$((b1 - b0))
        echo -n "$((d1 - d0)) $((r1 - r0)) $((n1 - n0))"
    fi
    echo " $(awk -v b="$bytes" 'BEGIN { if (b == "-") print "-"; else printf "%.4f\n", b * 8 / 1e9 }')"
}


# Daemon modes: namespace ns_v, daemons started per mode by start_daemons, stopped by stop_daemons.
ip netns add $ns_v
vr_netns_no_brnf $ns_v
ip -n $ns_v link set lo up
# start_daemons MODE: the daemons of MODE (see the header), their sockets /tmp/$tag/f1.sock and
# f2.sock; waits (bounded) for both.
read -ra daemon_args <<<"${BENCH_DAEMON_ARGS:-}"
start_daemons() {
    local v=$rel/vrnic d=/tmp/$tag
    rm -f $d/f1.sock* $d/f2.sock* $d/f3.sock*
    case $1 in
    flood)
        ip netns exec $ns_v "$v" --socket $d/f1.sock --ip 10.78.0.1/24 --mtu 9000 --tap vr-sw \
            --function socket=$d/f2.sock,ip=10.78.0.2/24 --function socket=$d/f3.sock,ip=10.78.0.3/24 \
            ${daemon_args[@]+"${daemon_args[@]}"} >"$out/daemon-flood.log" 2>&1 &
        dpids+=($!)
        ;;
    switch)
        ip netns exec $ns_v "$v" --socket $d/f1.sock --ip 10.78.0.1/24 --mtu 9000 --tap vr-sw \
            --function socket=$d/f2.sock,ip=10.78.0.2/24 ${daemon_args[@]+"${daemon_args[@]}"} >"$out/daemon-switch.log" 2>&1 &
        dpids+=($!)
        ;;
    tap)
        ip -n $ns_v link add br-v type bridge
        ip -n $ns_v link set br-v up
        for i in 1 2; do
            ip -n $ns_v tuntap add dev vr-t$i mode tap
            ip -n $ns_v link set vr-t$i mtu 9000 master br-v up
            ip netns exec $ns_v "$v" --socket $d/f$i.sock --ip 10.78.0.$i/24 --mtu 9000 --tap vr-t$i \
                ${daemon_args[@]+"${daemon_args[@]}"} >"$out/daemon-tap-$i.log" 2>&1 &
            dpids+=($!)
        done
        ;;
    packet)
        ip -n $ns_v link add vr-p1 type veth peer name vr-p2
        for i in 1 2; do
            ip -n $ns_v link set vr-p$i mtu 9000 up
            ip netns exec $ns_v "$v" --socket $d/f$i.sock --ip 10.78.0.$i/24 --mtu 9000 --netdev vr-p$i \
                ${daemon_args[@]+"${daemon_args[@]}"} >"$out/daemon-packet-$i.log" 2>&1 &
            dpids+=($!)
        done
        ;;
    esac
    local t=0
    until [ -S $d/f1.sock ] && [ -S $d/f2.sock ]; do
        t=$((t + 1))
        [ $t -lt 100 ] || { log "daemons for $1 did not start (see $out/daemon-$1*.log)"; exit 1; }
        sleep 0.1
    done
}
stop_daemons() {
    local p
    # The agents the library started (switch-agent): not this script's children, but in its own
    # namespace.
    for p in $(ip netns pids $ns_v 2>/dev/null); do
        [ "$(cat /proc/$p/comm 2>/dev/null)" = vrnic-agent ] && kill "$p" 2>/dev/null || true
    done
    for p in ${dpids[@]+"${dpids[@]}"}; do kill "$p" 2>/dev/null || true; done
    for p in ${dpids[@]+"${dpids[@]}"}; do wait "$p" 2>/dev/null || true; done
    dpids=()
    ip netns exec $ns_v nft delete table netdev loss 2>/dev/null || true
    ip -n $ns_v link del br-v 2>/dev/null || true
    for l in vr-t1 vr-t2 vr-p1 vr-sw; do ip -n $ns_v link del $l 2>/dev/null || true; done
}
# dstat NAME: NAME summed over both functions' `vrnic stats`.
dstat() {
    local i v s=0
    for i in 1 2; do
        v=$("$rel/vrnic" stats --socket /tmp/$tag/f$i.sock 2>/dev/null | awk -v n="$1" '$1 == n { print $2 }')
        s=$((s + ${v:-0}))
    done
    echo $s
}
dcounters() {
    echo "$(($(dstat rx_dropped) + $(dstat link_rx_dropped))) $(dstat retransmits) $(dstat nak_psn_seq_received) $(dstat tx_bytes)"
}

# qp_sampler SECS FILE: Jain's index of the per-QP throughput of the timed run under way (-D SECS,
# run_pair in the background), written to FILE as "J QPS SIDE WINDOW" ("- 0 - -": not measured),
# the samples beside it (FILE-s0-f1 ... FILE-s2-f2: sample, function). The QPs die with perftest,
# so it samples while they live: it waits for the daemons' tx_bytes to move (the first message;
# 64 QPs of 4 MiB take long to set up), then takes both functions' per-QP counters
# (`qp_<qpn>_tx_bytes` lines of `vrnic stats`) at once (s0), after SECS/3 (s1) and after 2*SECS/3
# (s2). The run's QPs are those in both samples of a window whose tx_bytes grew (none of another
# run's); J = (sum x)^2 / (n sum x^2) over their growths x, on the function whose QPs sent the most
# (the payload's sender: the client for ib_write_bw, the server's responder for ib_read_bw), SIDE
# saying which. WINDOW "middle" is s1 to s2; "first" (s0 to s1) when the QPs were gone by s2: a
# run's first message can leave well after perftest's clock started (seen with -D 1).
qp_sampler() {
    local third b0 t=0 i k r w
    third=$(awk -v s="$1" 'BEGIN { print s / 3 }')
    b0=$(dstat tx_bytes)
    until [ "$(dstat tx_bytes)" -gt "$b0" ]; do
        t=$((t + 1))
        [ $t -lt $((pair_tmo * 10)) ] || { echo "- 0 - -" >"$2"; return 0; }
        sleep 0.1
    done
    for k in 0 1 2; do
        [ $k = 0 ] || sleep "$third"
        for i in 1 2; do
            { "$rel/vrnic" stats --socket /tmp/$tag/f$i.sock 2>/dev/null || true; } |
                awk '$1 ~ /^qp_[^_]+_tx_bytes$/' >"$2-s$k-f$i"
        done
    done
    r=$(jain_between "$2" 1 2) w=middle
    [ "$r" != "- 0 -" ] || r=$(jain_between "$2" 0 1) w=first
    [ "$r" != "- 0 -" ] || w=-
    echo "$r $w" >"$2"
}
# jain_between FILE A B: "J QPS SIDE" between qp_sampler's samples A and B ("- 0 -": no QP grew).
jain_between() {
    local i
    for i in 1 2; do
        awk -v side="$([ $i = 1 ] && echo server || echo client)" 'NR == FNR { a[$1] = $2; next }
            ($1 in a) && $2 > a[$1] { x = $2 - a[$1]; s += x; s2 += x * x; n++ }
            END { if (n) printf "%.0f %.4f %d %s\n", s, s * s / (n * s2), n, side }' "$1-s$2-f$i" "$1-s$3-f$i"
    done | sort -rn | awk 'NR == 1 { print $2, $3, $4; found = 1 } END { if (!found) print "- 0 -" }'
}
# loss_start: mode tap-loss's loss, BENCH_LOSS per mille (default 10: 1%) of the RoCEv2 frames the
# bridge forwards to each daemon, dropped at both TAPs' egress by nft (this kernel has no sch_netem;
# a drop at an AF_PACKET sender's own egress is an ENOBUFS that the sender sends again, so the loss
# is on the TAPs). Each chain counts the RoCEv2 frames it saw and those it dropped (nft_counts:
# "seen dropped" over both so far).
loss_start() {
    local i
    {
        echo "table netdev loss {"
        for i in 1 2; do
            echo " chain e$i {"
            echo "  type filter hook egress device vr-t$i priority 0;"
            echo "  udp dport 4791 counter"
            echo "  udp dport 4791 numgen random mod 1000 < $loss counter drop"
            echo " }"
        done
        echo "}"
    } | ip netns exec $ns_v nft -f -
}
nft_counts() {
    ip netns exec $ns_v nft list table netdev loss 2>/dev/null | awk '/counter packets/ {
            for (i = 1; i < NF; i++) if ($i == "packets") v = $(i + 1)
            if ($NF == "drop") d += v; else s += v
        } END { print s + 0, d + 0 }'
}

echo "what,mode,bytes,value,unit,drops,timeouts,seq_naks,gbit,cpu_s,wall_s,daemon_cpu_s,qps,jain,jain_qps,jain_side,jain_window,nft_seen,nft_dropped" >"$out/bench.csv"
port=23000
log "building the daemon and vrnic-flood (release)"
(cd "$top" && cargo build -q --release -p vrnic-vhost -p vrnic-frontend)
# flood_latency: the flood mode's rows (see the header); the flooder is stopped on every path.
flood_latency() {
    local tool fpid t v dr to nk gb cpu wall dcpu
    for phase in idle3 flooded; do
        fpid=
        if [ $phase = flooded ]; then
            ip netns exec $ns_v "$rel/vrnic-flood" --socket /tmp/$tag/f3.sock --seconds 600 >"$out/flood.log" 2>&1 &
            fpid=$!
            pids+=($fpid)
            # Under way: the third function has served commands of the flood (bounded wait).
            t=0
            until [ "$("$rel/vrnic" stats --socket /tmp/$tag/f3.sock 2>/dev/null | awk '$1 == "commands" { print $2 }')" -ge 4 ] 2>/dev/null; do
                t=$((t + 1))
                [ $t -lt 100 ] && kill -0 $fpid 2>/dev/null || { log "flood did not start (see $out/flood.log)"; break; }
                sleep 0.1
            done
        fi
        for tool in ib_send_lat ib_write_lat; do
            port=$((port + 1))
            log "flood ($phase) $tool 64 B x $lat_iters"
            read -r v dr to nk gb cpu wall dcpu < <(run_pair flood $tool $port -s 64 -n $lat_iters)
            echo "$tool,switch-$phase,64,$v,us,$dr,$to,$nk,$gb,$cpu,$wall,$dcpu,1,-,0,-,-,-,-" >>"$out/bench.csv"
        done
        if [ -n "$fpid" ]; then
            kill $fpid 2>/dev/null || true
            wait $fpid 2>/dev/null || true
            log "$(tail -1 "$out/flood.log")"
        fi
    done
}

# keep_failed NAME: a failed run's perftest or ucx_perftest output (its error: a completion status, a
# timeout, UCX's ERROR lines) kept as fail-NAME-server.out and fail-NAME-client.out in the results.
keep_failed() {
    local s
    for s in server client; do cp "/tmp/$tag/$s.out" "$out/fail-$1-$s.out" 2>/dev/null || true; done
    log "$1 failed: $(grep -ohiE "failed status [0-9]+.*|completion with error.*|couldn't.*|unable.*|UCX +ERROR.*" \
        "$out/fail-$1-client.out" "$out/fail-$1-server.out" 2>/dev/null | head -3 | paste -sd ';')"
}
# bw_row MODE TOOL SIZE QPS: one timed bandwidth run (run_pair, perftest -q QPS) and its CSV row;
# with QPS > 1 in a daemon mode Jain's index of its QPs (qp_sampler), in mode tap-loss the RoCEv2
# frames the loss table saw and dropped during it.
bw_row() {
    local mode=$1 tool=$2 size=$3 q=$4 spid="" j="- 0 - -" n0="" nft="- -" v dr to nk gb cpu wall dcpu
    local qf=$out/qp/$mode-$tool-$size-q$q
    port=$((port + 1))
    log "$mode $tool $size B, $q QP(s), for ${bw_secs}s"
    if [ "$q" -gt 1 ] && [ "$mode" != loopback ]; then
        mkdir -p "$out/qp"
        rm -f "$qf"*
        qp_sampler $bw_secs "$qf" &
        spid=$!
        pids+=("$spid")
    fi
    [ "$mode" = tap-loss ] && n0=$(nft_counts)
    read -r v dr to nk gb cpu wall dcpu < <(run_pair "$mode" "$tool" $port -s "$size" -q "$q" -D $bw_secs)
    if [ -n "$spid" ]; then
        kill $spid 2>/dev/null || true
        wait $spid 2>/dev/null || true
        j=$(cat "$qf" 2>/dev/null || echo "- 0 - -")
    fi
    if [ -n "$n0" ]; then
        nft=$(echo "$n0 $(nft_counts)" | awk '{ print $3 - $1, $4 - $2 }')
    fi
    [ "$v" != fail ] || keep_failed "$mode-$tool-$size-q$q"
    echo "$tool,$mode,$size,$v,MB/s,$dr,$to,$nk,$gb,$cpu,$wall,$dcpu,$q,${j// /,},${nft// /,}" >>"$out/bench.csv"
}
# ucx_rows MODE: ucx_perftest tag_bw 64 KiB (-n ucx_bw_iters) and tag_lat 8 B (-n ucx_lat_iters),
# each with a tenth as many warm-up iterations (its default, 10000, would be 655 MB at 64 KiB),
# between the two functions of MODE's daemons (run_pair); their CSV rows.
ucx_rows() {
    local mode=$1 v dr to nk gb cpu wall dcpu
    port=$((port + 1))
    log "$mode ucx_perftest tag_bw 65536 B x $ucx_bw_iters"
    read -r v dr to nk gb cpu wall dcpu < <(run_pair "$mode" ucx_tag_bw $port -s 65536 -n $ucx_bw_iters -w $((ucx_bw_iters / 10)))
    echo "ucx_tag_bw,$mode,65536,$v,MB/s,$dr,$to,$nk,$gb,$cpu,$wall,$dcpu,1,-,0,-,-,-,-" >>"$out/bench.csv"
    [ "$v" != fail ] || keep_failed "$mode-ucx_tag_bw-65536"
    port=$((port + 1))
    log "$mode ucx_perftest tag_lat 8 B x $ucx_lat_iters"
    read -r v dr to nk gb cpu wall dcpu < <(run_pair "$mode" ucx_tag_lat $port -s 8 -n $ucx_lat_iters -w $((ucx_lat_iters / 10)))
    echo "ucx_tag_lat,$mode,8,$v,us,$dr,$to,$nk,$gb,$cpu,$wall,$dcpu,1,-,0,-,-,-,-" >>"$out/bench.csv"
    [ "$v" != fail ] || keep_failed "$mode-ucx_tag_lat-8"
}
# mpi_row MODE: Open MPI's ping-pong bandwidth at 4 MiB (mpi_pingpong --bw, its figure MB/s with
# MB = 2^20 bytes) for about bw_secs: mpirun (--mca pml ucx, UCX_TLS=rc_v,self so that the ranks'
# messages go over rc_verbs, not shared memory) in with_node, its two ranks each on its own
# function (mpi-rank.sh picks f1 or f2 by OMPI_COMM_WORLD_RANK: mpirun gives both ranks one
# environment); its CSV row, with the run's counters and costs as run_pair's (cpu_s: mpirun and
# both ranks, and the daemons; wall_s: mpirun's start to its end, start-up included).
mpi_row() {
    local mode=$1 base d0 t0 v=fail r=0 e k dr to nk gb cost
    local size=4194304 x=()
    port=$((port + 1))
    log "$mode Open MPI ping-pong $size B for ${bw_secs}s"
    base=$(dcounters)
    rm -f "/tmp/$tag"/cpu-*
    d0=$(proc_ticks ${dpids[@]+"${dpids[@]}"})
    for e in LD_LIBRARY_PATH="$lib" VRNIC_AGENT=off TMPDIR="/tmp/$tag" UCX_TLS=rc_v,self UCX_NET_DEVICES=vrnic0:1; do
        x+=(-x "$e")
    done
    t0=$EPOCHREALTIME
    # timeout -k: mpirun passes the TERM to its ranks; KILL 10 s later if that did not end it.
    ip netns exec $ns_v bash -c "$cpu_wrap" "/tmp/$tag/cpu-mpirun" timeout -k 10 "$pair_tmo" \
        "${with_node[@]}" "/tmp/$tag/dev-$port-mpi" mpirun --allow-run-as-root --oversubscribe -np 2 \
        --mca pml ucx --mca btl '^openib,uct' "${x[@]}" "/tmp/$tag/mpi-rank.sh" "/tmp/$tag/mpi_pingpong" \
        --bw $size "$bw_secs" >"/tmp/$tag/client.out" 2>&1 || r=$?
    cost=$(run_cost "$d0" "$t0")
    read -r dr to nk gb < <(counters "$mode" "$base")
    [ $r != 0 ] || v=$(awk '$1 == "pingpong_bw" { print $5; found = 1 } END { if (!found) print "fail" }' "/tmp/$tag/client.out")
    if [ "$v" = fail ]; then
        cp "/tmp/$tag/client.out" "$out/fail-$mode-mpi_pingpong-$size.out"
        log "$mode mpi_pingpong failed (exit $r): $(grep -v '^ *$' "/tmp/$tag/client.out" | tail -2 | paste -sd ';')"
    fi
    k=${cost// /,}
    echo "mpi_pingpong,$mode,$size,$v,MB/s,$dr,$to,$nk,$gb,$k,1,-,0,-,-,-,-" >>"$out/bench.csv"
}
# cm_rows MODE (issue 31; mode switch-agent): connections made through rdma_cm, each process on vrnic's
# librdmacm.so.1 and the agent's connection manager (IB CM on QP1): ib_write_bw -R at 64 KiB and
# ib_write_lat -R at 64 B (rows ib_write_bw-R, ib_write_lat-R, beside the out-of-band rows of the
# same mode: the data path is the same, only the connection differs), then the connection rate:
# cmtime -c cm_conns between the two functions, its "us / conn" of the connect and disconnect steps
# (rows cmtime_connect, cmtime_disconnect: microseconds per connection, cmtime's own division of
# the step's wall time by the connections, which it runs concurrently).
cm_rows() {
    local mode=$1 cm=1 v dr to nk gb cpu wall dcpu d=/tmp/$tag srv t=0
    port=$((port + 1))
    log "$mode ib_write_bw -R 65536 B for ${bw_secs}s"
    read -r v dr to nk gb cpu wall dcpu < <(run_pair "$mode" ib_write_bw $port -s 65536 -D $bw_secs)
    echo "ib_write_bw-R,$mode,65536,$v,MB/s,$dr,$to,$nk,$gb,$cpu,$wall,$dcpu,1,-,0,-,-,-,-" >>"$out/bench.csv"
    [ "$v" != fail ] || keep_failed "$mode-ib_write_bw-R-65536"
    port=$((port + 1))
    log "$mode ib_write_lat -R 64 B x $lat_iters"
    read -r v dr to nk gb cpu wall dcpu < <(run_pair "$mode" ib_write_lat $port -s 64 -n $lat_iters)
    echo "ib_write_lat-R,$mode,64,$v,us,$dr,$to,$nk,$gb,$cpu,$wall,$dcpu,1,-,0,-,-,-,-" >>"$out/bench.csv"
    [ "$v" != fail ] || keep_failed "$mode-ib_write_lat-R-64"
    port=$((port + 1))
    log "$mode cmtime -c $cm_conns"
    ip netns exec "$ns_v" env LD_LIBRARY_PATH="$lib" VRNIC_AGENT="$rel/vrnic-agent" TMPDIR="$d" \
        VRNIC_VHOST_USER="$d/f1.sock" timeout "$pair_tmo" cmtime -b 10.78.0.1 -p $port >"$d/server.out" 2>&1 &
    srv=$!
    pids+=("$srv")
    while ! ip netns exec "$ns_v" env LD_LIBRARY_PATH="$lib" VRNIC_AGENT="$rel/vrnic-agent" TMPDIR="$d" \
        VRNIC_VHOST_USER="$d/f2.sock" timeout "$pair_tmo" cmtime -s 10.78.0.1 -p $port -c "$cm_conns" >"$d/client.out" 2>&1; do
        t=$((t + 1))
        # cmtime's client reports a rejection (the server not listening yet) per connection.
        if [ $t -ge 50 ] || ! grep -qiE "REJECTED|refused|failed" "$d/client.out"; then
            break
        fi
        sleep 0.2
    done
    kill "$srv" 2>/dev/null || true
    wait "$srv" 2>/dev/null || true
    local step row
    for step in connect disconnect; do
        row=cmtime_$step
        v=$(awk -F: -v s="$step" '{ n = $1; gsub(/ +$/, "", n) } n == s { split($2, f, " "); print f[4]; found = 1 }
            END { if (!found) print "fail" }' "$d/client.out")
        echo "$row,$mode,$cm_conns,$v,us,-,-,-,-,-,-,-,1,-,0,-,-,-,-" >>"$out/bench.csv"
    done
    [ "$v" != fail ] || { cp "$d/client.out" "$out/fail-$mode-cmtime-client.out"; log "$mode cmtime failed: $(tail -2 "$d/client.out" | paste -sd ';')"; }
}
# qp_scaling MODE: the rows of modes switch-q, tap-q and packet-q (see the header). Each perftest
# process gets more time: 64 QPs of 4 MiB register 512 MiB on each side before the first message.
qp_scaling() {
    local tool size q
    pair_tmo=300
    for tool in ib_write_bw ib_read_bw; do
        for size in 65536 4194304; do
            for q in $qps; do
                bw_row "$1" $tool $size "$q"
            done
        done
    done
    pair_tmo=120
}

for mode in $modes; do
    case $mode in
    loopback) ;;
    *-q) start_daemons "${mode%-q}" ;;
    switch-agent) start_daemons switch ;;
    tap-loss)
        start_daemons tap
        loss_start
        ;;
    *) start_daemons "$mode" ;;
    esac
    case $mode in
    flood) flood_latency ;;
    *-q) qp_scaling "$mode" ;;
    tap-loss)
        # ib_write_bw 4 MiB with 1 and 8 QPs through the loss (see loss_start).
        pair_tmo=300
        for q in 1 8; do
            bw_row tap-loss ib_write_bw 4194304 $q
        done
        pair_tmo=120
        ;;
    *)
        for tool in ib_write_bw ib_read_bw; do
            for size in 64 4096 65536 1048576; do
                bw_row "$mode" $tool $size 1
            done
        done
        for tool in ib_send_lat ib_write_lat; do
            port=$((port + 1))
            log "$mode $tool 64 B x $lat_iters"
            read -r v dr to nk gb cpu wall dcpu < <(run_pair "$mode" $tool $port -s 64 -n $lat_iters)
            echo "$tool,$mode,64,$v,us,$dr,$to,$nk,$gb,$cpu,$wall,$dcpu,1,-,0,-,-,-,-" >>"$out/bench.csv"
            [ "$v" != fail ] || keep_failed "$mode-$tool-64"
        done
        case $mode in
        switch | tap)
            ucx_rows "$mode"
            mpi_row "$mode"
            ;;
        switch-agent)
            # Beside this mode's out-of-band rows: both through the agent, which rdma_cm needs
            # (without it, a process is its function's own frontend, another memory path).
            cm_rows "$mode"
            ;;
        esac
        ;;
    esac
    if [ "$mode" != loopback ]; then
        stop_daemons
    fi
done

if [ $guests = 1 ]; then
    log "guests: tests/e2e/run.sh rxe-rxe ibv-ibv ibv-ibv-switch (several minutes under TCG)"
    VRNIC_BIN=$rel/vrnic E2E_RESULTS=$out/e2e E2E_PERF_SWEEP=0 E2E_PERF_ARGS="${BENCH_GUEST_PERF_ARGS:--n 5000}" "$top/tests/e2e/run.sh" rxe-rxe ibv-ibv ibv-ibv-switch >"$out/e2e.log" 2>&1 || true
    awk -F, 'NR > 1 && $2 == "a" && $6 == "client" { print "guest-" $1 "," $5 "," $7 "," $8 "," $9 }' \
        "$out/e2e/perftest.csv" 2>/dev/null | sed 's/MB\/sec/MB\/s/; s/usec/us/' |
        awk -F, '{ print $2 ",guests-" substr($1, 7) "," $3 "," $4 "," $5 ",-,-,-,-,-,-,-,-,-,-,-,-,-,-" }' >>"$out/bench.csv" || true
    # UCX and Open MPI in the same guests' software (the e2e step software, images/software.sh):
    # two rxe guests, then two vrnic guests (a daemon each, over TAP), ucx_perftest tag_bw 64 KiB
    # and tag_lat 8 B over rc_verbs, and Open MPI's checked ping-pong across the guests (its 4 MiB
    # round). Rows ucx_tag_bw, ucx_tag_lat, mpi_pingpong of modes guests-rxe-rxe, guests-vrnic-vrnic.
    log "guests: tests/e2e/run.sh software, rxe-rxe and vrnic-vrnic (UCX, Open MPI, rdma_cm; minutes under TCG)"
    VRNIC_BIN=$rel/vrnic E2E_RESULTS=$out/e2e-sw E2E_SW_PAIRS="rxe-rxe vrnic-vrnic" E2E_SW_PYVERBS=0 \
        E2E_SW_UCX_TLS=rc_v E2E_SW_UCX_TESTS="${BENCH_GUEST_UCX_TESTS:-tag_bw:65536:2000 tag_lat:8:2000}" E2E_SW_CM_TOOLS=cmtime \
        "$top/tests/e2e/run.sh" software >"$out/e2e-sw.log" 2>&1 || true
    for pair in rxe-rxe vrnic-vrnic; do
        # guest b's client runs (a serves): "VRNIC-UCX b rc_v TEST client rc=0 attempts=N final=F,..."
        # with F: iterations, typical/average/overall latency (us), average/overall MB/s, rates.
        tr -d '\r' <"$out/e2e-sw/software-$pair/b.log" 2>/dev/null | awk -v m="guests-$pair" '
            $1 == "VRNIC-UCX" && $5 == "client" && $6 == "rc=0" {
                split(substr($8, 7), f, ",")
                if ($4 == "tag_bw") print "ucx_tag_bw," m ",65536," f[6] ",MB/s,-,-,-,-,-,-,-,1,-,0,-,-,-,-"
                if ($4 == "tag_lat") print "ucx_tag_lat," m ",8," f[2] ",us,-,-,-,-,-,-,-,1,-,0,-,-,-,-"
            }' >>"$out/bench.csv" || true
        # rdma_cm's connection rate: guest b's cmtime client (a serves, 10 connections): "VRNIC-CM b
        # cmtime client rc=0 ... connect=TOTAL_MS,US_PER_CONN disconnect=... errors=0".
        tr -d '\r' <"$out/e2e-sw/software-$pair/b.log" 2>/dev/null | awk -v m="guests-$pair" '
            $1 == "VRNIC-CM" && $3 == "cmtime" && $4 == "client" && $5 == "rc=0" {
                for (i = 6; i <= NF; i++) {
                    split($i, kv, "="); split(kv[2], f, ",")
                    if ((kv[1] == "connect" || kv[1] == "disconnect") && f[2] != "")
                        print "cmtime_" kv[1] "," m ",10," f[2] ",us,-,-,-,-,-,-,-,1,-,0,-,-,-,-"
                }
            }' >>"$out/bench.csv" || true
        tr -d '\r' <"$out/e2e-sw/software-$pair/a.log" 2>/dev/null | awk -v m="guests-$pair" '
            $1 == "VRNIC-MPI" && $3 == "launcher" && $4 == "rc=0" && $5 == "ok=yes" {
                print "mpi_pingpong," m ",4194304," substr($6, 11) ",MB/s,-,-,-,-,-,-,-,1,-,0,-,-,-,-"
            }' >>"$out/bench.csv" || true
    done
fi

# The table: each figure beside the limit it is compared with (same run).
python3 - "$out" "$loss" <<'PY' | tee "$out/bench.txt"
import csv, json, sys
out, loss = sys.argv[1], int(sys.argv[2])
lim = dict(l.strip().split("=", 1) for l in open(f"{out}/limits.txt") if "=" in l)
rows = list(csv.DictReader(open(f"{out}/bench.csv")))
num = lambda k: float(lim.get(k, 0) or 0)
best = max(num("pkt_sendmmsg64_4154_gbps"), num("pkt_send_4154_gbps"))
# The same frames as UDP super-frames through vrnic's own AF_PACKET link (link::uso): the kernel's
# work per run of frames instead of per frame, the path the daemons' frames take.
uso = num("pkt_uso_4154_gbps")
rtt = num("rtt_busy_us")
relay = num("rtt_relay1_us")
# The TAP rows against the raw TAP path too: write() per frame into a TAP, through a bridge.
tap_best, tap_rtt = num("tap_write_4154_gbps"), num("rtt_tap_busy_us")
# The floor of a ping-pong between two daemons: two yielding ends through two yielding relays with
# the wire between them (no work), over the veth pair (packet) and through the TAPs' bridge (tap).
floor = {"packet": num("rtt_relay_wire_us"), "tap": num("rtt_relay_tap_us")}
def fnum(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None
def base(mode):
    # The QP-scaling modes run on the daemons of their base mode, the loss mode on tap's, the
    # agent mode on switch's.
    if mode.endswith("-q"):
        return mode[:-2]
    return {"tap-loss": "tap", "switch-agent": "switch"}.get(mode, mode)
def q1_of(r):
    # The 1-QP figure of the same mode, tool and size (same run) beside a multi-QP row.
    return next((fnum(i["value"]) for i in rows if i["mode"] == r["mode"] and i["what"] == r["what"]
                 and i["bytes"] == r["bytes"] and i.get("qps") == "1"), None)
opt = lambda x, f: f.format(x) if x is not None else "-"
mw = max([4] + [len(r["mode"]) for r in rows])
print("machine limits (same run):")
for k in sorted(lim):
    print(f"  {k:32} {lim[k]}")
print()
print(f"{'tool':14} {'mode':{mw}} {'bytes':>8} {'qps':>3} {'figure':>11}  {'limit':>20}  {'ratio':>5} {'vs_tap':>6} {'vs_uso':>6}  "
      f"{'vs_floor':>8} {'vs_q1':>5}  {'J':>11}  {'drops':>6} {'timeouts':>8} {'seq_naks':>8} {'retx/GB':>8}  {'cores':>5} {'cpu_s/Gbit':>10}")
print("  (ratio: figure / limit; vs_tap, TAP rows: figure / the raw TAP path, tap_write_4154_gbps or")
print("   rtt_tap_busy_us; vs_uso, bandwidth rows: figure / the same frames as UDP super-frames,")
print("   pkt_uso_4154_gbps; vs_floor, latency rows over a wire: figure / two yielding ends through two")
print("   yielding relays and that wire, rtt_relay_wire_us or rtt_relay_tap_us (the same hand-offs and")
print("   crossings with no work); qps: perftest -q; vs_q1, multi-QP rows: figure / the 1-QP figure of")
print("   the same mode, tool and size; J: Jain's fairness index of the QPs' throughput over the middle")
print("   third of the run, (sum x)^2 / (n sum x^2), 1 when all QPs moved as much, 1/n when one moved")
print("   all, with the QPs seen in brackets (*: over the first third, the QPs being gone by two")
print("   thirds; issue 28's target: 0.95); drops: frames the receive")
print("   queues dropped, both sides; timeouts: ACK timeouts that retransmitted; seq_naks: PSN sequence")
print("   NAKs; retx/GB: (timeouts + seq_naks) per GB of RoCEv2 payload the devices sent; cores: CPU")
print("   seconds of the run's processes, both perftests and the daemons, over its wall seconds,")
print("   start-up included; cpu_s/Gbit: those CPU seconds per Gbit of RoCEv2 payload the devices")
print("   sent; '-': not known)")
print("  (ucx_tag_bw, ucx_tag_lat: ucx_perftest tag_bw 64 KiB (overall MB/s) and tag_lat 8 B (50th")
print("   percentile, half a round trip) over rc_verbs; mpi_pingpong: Open MPI (pml ucx) ping-pong")
print("   of 4 MiB, 2 x bytes x rounds / time, its ranks on the two functions; both beside the limits")
print("   of perftest's rows of their mode)")
print("  (ib_write_bw-R, ib_write_lat-R: perftest -R, connected by rdma_cm through vrnic's librdmacm.so.1")
print("   and the agent's CM, ratio against the out-of-band row of the same mode and size; cmtime_connect,")
print("   cmtime_disconnect: cmtime's us / conn over the bytes column's connections, ratio against the")
print("   guests' rxe-rxe row when --guests ran)")
doc = {"limits": lim, "loss_per_mille": loss, "runs": []}
for r in rows:
    v = r["value"]
    x = fnum(v)
    b = base(r["mode"])
    cpu, wall, gbit = fnum(r.get("cpu_s")), fnum(r.get("wall_s")), fnum(r.get("gbit"))
    cores = cpu / wall if cpu is not None and wall else None
    per_gbit = cpu / gbit if cpu is not None and gbit and r["unit"] == "MB/s" else None
    to, nk = fnum(r.get("timeouts")), fnum(r.get("seq_naks"))
    retx_gb = (to + nk) / (gbit / 8) if r["unit"] == "MB/s" and to is not None and nk is not None and gbit else None
    qps = r.get("qps") or "-"
    jain, jqps = fnum(r.get("jain")), r.get("jain_qps") or "0"
    # "*": over the run's first third (its QPs were gone by two thirds, qp_sampler).
    jtxt = f"{jain:.3f} ({jqps}){'*' if r.get('jain_window') == 'first' else ''}" if jain is not None else "-"
    q1 = q1_of(r) if qps not in ("-", "1") and x is not None else None
    q1_ratio = x / q1 if q1 else None
    ratio = tap_ratio = uso_ratio = floor_ratio = None
    fig = limtxt = ""
    if x is None:
        fig = v
    elif r["what"].endswith("-R"):
        # Connected through rdma_cm (cm_rows): beside the same tool connected out of band (its
        # TCP exchange), same mode, size and run; the data path is the same.
        oob = next((fnum(i["value"]) for i in rows if i["mode"] == r["mode"] and i["what"] == r["what"][:-2]
                    and i["bytes"] == r["bytes"] and i.get("qps") == "1"), None)
        ratio = x / oob if oob else None
        unit = "Gb/s" if r["unit"] == "MB/s" else "us"
        val = (lambda y: y * 8 / 1000) if r["unit"] == "MB/s" else (lambda y: y)
        fig = f"{val(x):.2f} {unit}"
        limtxt = f"{val(oob):.2f} {unit} out-of-band" if oob else "-"
    elif r["what"].startswith("cmtime_"):
        # Microseconds per connection (cmtime's division of the step's time by its connections);
        # no limit of this machine bounds it: compare the guests' rxe-rxe row of the same run.
        fig = f"{x:.0f} us/conn"
        rxe = next((fnum(i["value"]) for i in rows if i["mode"] == "guests-rxe-rxe" and i["what"] == r["what"]), None)
        if rxe and r["mode"] != "guests-rxe-rxe":
            ratio, limtxt = x / rxe, f"{rxe:.0f} us rxe-rxe"
        else:
            limtxt = "-"
    elif r["unit"] == "MB/s" and b.endswith("switch"):
        # Between two functions of one daemon (host processes or guests) the limit is a memory
        # copy (same size).
        gbps = x * 8 / 1000
        mc = num(f"memcpy_gbytes_per_s_{r['bytes']}") * 8
        ratio = gbps / mc if mc else None
        fig, limtxt = f"{gbps:.2f} Gb/s", f"{mc:.0f} Gb/s memcpy"
    elif r["unit"] == "MB/s":
        gbps = x * 8 / 1000
        ratio = gbps / best if best else None
        if b == "tap" and tap_best:
            tap_ratio = gbps / tap_best
        if not b.startswith("guests") and uso:
            uso_ratio = gbps / uso
        fig, limtxt = f"{gbps:.2f} Gb/s", f"{best:.2f} Gb/s frames"
    elif r["mode"] == "switch-flooded":
        # What a flooding tenant costs the others: against the same pair idle, same run.
        idle = next((fnum(i["value"]) for i in rows if i["mode"] == "switch-idle3" and i["what"] == r["what"]), None)
        ratio = x / idle if idle else None
        fig, limtxt = f"{x:.1f} us", (f"{idle:.1f} us idle" if idle else "-")
    elif r["mode"] in ("switch", "switch-agent", "switch-idle3") and relay:
        # Two host processes through one daemon: the limit is the same hand-offs with no work,
        # two yielding pollers through one relay thread (the daemon's one poller).
        ratio = x / relay
        fig, limtxt = f"{x:.1f} us", f"{relay:.1f} us relay RTT"
    else:
        ratio = x / rtt if rtt else None
        if r["mode"] == "tap" and tap_rtt:
            tap_ratio = x / tap_rtt
        if floor.get(r["mode"]):
            floor_ratio = x / floor[r["mode"]]
        fig, limtxt = f"{x:.1f} us", f"{rtt:.1f} us busy RTT"
    print(f"{r['what']:14} {r['mode']:{mw}} {r['bytes']:>8} {qps:>3} {fig:>11}  {limtxt:>20}  "
          f"{opt(ratio, '{:.2f}'):>5} {opt(tap_ratio, '{:.2f}'):>6} {opt(uso_ratio, '{:.2f}'):>6} {opt(floor_ratio, '{:.2f}'):>8} "
          f"{opt(q1_ratio, '{:.2f}'):>5}  {jtxt:>11}  "
          f"{r['drops']:>6} {r['timeouts']:>8} {r['seq_naks']:>8} {opt(retx_gb, '{:.1f}'):>8}  "
          f"{opt(cores, '{:.2f}'):>5} {opt(per_gbit, '{:.3f}'):>10}")
    doc["runs"].append(dict(r, ratio=ratio, tap_ratio=tap_ratio, uso_ratio=uso_ratio, floor_ratio=floor_ratio,
                            q1_ratio=q1_ratio, retx_per_gb=retx_gb, cores=cores, cpu_s_per_gbit=per_gbit))
lossy = [r for r in rows if r["mode"] == "tap-loss"]
if lossy:
    # Issue 28's point 4: goodput through a lossy bridge, 8 QPs against 1 of the same run.
    print()
    print(f"loss (mode tap-loss): {loss / 10:g}% of the RoCEv2 frames the bridge forwards to each daemon dropped"
          " (nft, both TAPs' egress)")
    for r, d in zip(rows, doc["runs"]):
        if r["mode"] != "tap-loss":
            continue
        x, seen, dropped = fnum(r["value"]), fnum(r.get("nft_seen")), fnum(r.get("nft_dropped"))
        line = f"  {r['what']} {int(r['bytes']) >> 20} MiB, {r['qps']} QP(s): "
        line += f"{x * 8 / 1000:.2f} Gb/s goodput" if x is not None else f"{r['value']}"
        if d["q1_ratio"] is not None:
            line += f" ({d['q1_ratio']:.2f} of 1 QP's)"
        line += f", {opt(d['retx_per_gb'], '{:.1f}')} retransmissions/GB"
        if seen:
            line += f", nft dropped {dropped:.0f} of {seen:.0f} frames ({dropped / seen:.2%})"
        print(line)
json.dump(doc, open(f"{out}/bench.json", "w"), indent=1)
PY
/usr/bin/python3 "$top/scripts/bench-chart.py" "$out" 2>"$out/chart.log" ||
    log "no chart: $(tail -1 "$out/chart.log") (scripts/deps.sh --bench installs python3-matplotlib)"
log "results in $out"
