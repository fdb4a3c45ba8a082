#!/usr/bin/env bash
# Heavy perftest between two host processes on vrnic daemons (issue 28, point 5): many RC QPs with
# large messages must never fail a transfer. `ib_write_bw -q 8 -a -F` between two host processes
# used to end now and then in "Completion with error ... Failed status 12" (IBV_WC_RETRY_EXC_ERR)
# under load; this runs that and its siblings, no QEMU.
#
#   tests/e2e/heavy.sh [MODE...]        # as root; MODE: switch | tap | packet (default: all three)
#
# Each mode in a network namespace of its own (vrnic-heavy-PID-MODE), its daemons on MTU 9000
# links (path MTU 4096), as scripts/bench.sh's daemon modes:
#   switch: one daemon, two functions (f1 10.78.0.1, f2 10.78.0.2) through its embedded switch,
#           its uplink a TAP (vr-sw) nobody reads;
#   tap:    two daemons on two TAPs of a bridge;
#   packet: two daemons on the two ends of a veth pair (--netdev, AF_PACKET).
# Per mode, each tool of HEAVY_TOOLS (ib_write_bw ib_read_bw ib_send_bw) with each argument set of
# HEAVY_ARGS ("-q 8 -a -n 5 -F;-q 32 -s 4194304 -n 5 -F", ';' between sets): Debian's perftest,
# server on f1 and client on f2 (both `-x 1`, a TCP port of their own; the exchange over TCP
# 127.0.0.1), each process attached to its vrnic function through the daemon's vhost-user socket
# (VRNIC_VHOST_USER=f1.sock / f2.sock, LD_LIBRARY_PATH=$(scripts/ibverbs-lib.sh --release): the
# containers' path, guest-lib/src/vhost_user.rs). The client is started again (at most 50 times,
# 0.2 s apart) while the server is not listening yet. Each process is bounded by `timeout`
# (HEAVY_RUN_TIMEOUT, 120 s); a server still running 20 s after its client ended is stopped.
# A run passes when both exit 0, the client's table is complete (with -a every size from 2 B to
# 8 MiB, 23 rows; else the one row of the -s size), the daemons still run afterwards and, in mode
# switch, no frame was lost between the functions (link_tx_errors, switch_rx_dropped: a full queue
# holds its sender back).
# Printed per run: its wall time, the client's last average bandwidth and the daemons' `vrnic
# stats` counters over the run, per function, those that moved (retransmits, naks_sent,
# naks_received, nak_psn_seq_sent/received, rnr_naks_sent/received, duplicates, rx_dropped,
# rx_drop_qp_state, link_rx_dropped, link_tx_dropped, link_tx_errors, switch_tx_busy,
# switch_rx_dropped, engine_panics; f1 is the server's function, f2 the client's), then one
# `PASS: heavy MODE TOOL ARGS` or `FAIL: heavy MODE TOOL ARGS: why` line; at the end
# "heavy: N runs passed, N failed". Exit status 0 iff no run failed.
# Environment: HEAVY_RESULTS (perftest outputs and daemon logs, default out/heavy-DATE),
# HEAVY_TOOLS, HEAVY_ARGS, HEAVY_RUN_TIMEOUT, HEAVY_BIN (the daemon; default target/release/vrnic,
# built here), HEAVY_NO_BUILD=1 (no cargo build: use what target/release holds).
# The daemon is a release build: with the debug one the 18 runs took 705 s instead of 180-280 s
# on the 2-core machine this was written on (most of a run is perftest's own start-up: filling its
# buffers with random() and timing the CPU per size). CI runs this as the e2e step `heavy`
# (tests/e2e/run.sh).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../../scripts/lib.sh"
vr_install_traps

MODES=("$@")
[ ${#MODES[@]} -gt 0 ] || MODES=(switch tap packet)
for m in "${MODES[@]}"; do
    case $m in
    switch | tap | packet) ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) vr_die "unknown mode $m (switch | tap | packet)" ;;
    esac
done
for b in ib_write_bw ib_read_bw ib_send_bw timeout ip; do
    command -v "$b" >/dev/null || vr_die "$b missing (scripts/deps.sh installs perftest)"
done

TOOLS=${HEAVY_TOOLS:-ib_write_bw ib_read_bw ib_send_bw}
IFS=';' read -ra ARG_SETS <<<"${HEAVY_ARGS:--q 8 -a -n 5 -F;-q 32 -s 4194304 -n 5 -F}"
RUN_TIMEOUT=${HEAVY_RUN_TIMEOUT:-120}
SERVER_GRACE=20
RESULTS=${HEAVY_RESULTS:-$VR_TOP/out/heavy-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RESULTS"
RESULTS=$(readlink -f "$RESULTS")
vr_release_build "${HEAVY_NO_BUILD:-0}" "${HEAVY_BIN:-}"
DAEMON_BIN=$VR_DAEMON_BIN LIB=$VR_IBVERBS_LIB
vr_log "heavy: daemon $DAEMON_BIN, library $LIB/libibverbs.so.1, results in $RESULTS"

PASSED=0 FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "PASS: heavy $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: heavy $*"; }

# The counters printed per run (differences over it, per function).
COUNTERS=(retransmits naks_sent naks_received nak_psn_seq_sent nak_psn_seq_received rnr_naks_sent
    rnr_naks_received duplicates rx_dropped rx_drop_qp_state link_rx_dropped link_tx_dropped link_tx_errors
    switch_tx_busy switch_rx_dropped engine_panics)

NS='' DIR='' DPIDS=()
# start_mode MODE: namespace NS with MODE's daemons (DPIDS), sockets DIR/f1.sock and DIR/f2.sock;
# fails (after saying why) if they do not come up within 10 s.
start_mode() {
    local mode=$1 i args
    NS=vrnic-heavy-$$-$mode DIR=$RESULTS/$mode DPIDS=()
    mkdir -p "$DIR"
    rm -f "$DIR"/f1.sock* "$DIR"/f2.sock*
    vr_netns_create "$NS"
    case $mode in
    switch)
        vr_spawn "$DIR/daemon.log" ip netns exec "$NS" env NO_COLOR=1 "$DAEMON_BIN" --socket "$DIR/f1.sock" \
            --ip 10.78.0.1/24 --mtu 9000 --tap vr-sw --function "socket=$DIR/f2.sock,ip=10.78.0.2/24"
        DPIDS+=("$VR_LAST_PID")
        ;;
    tap | packet)
        [ "$mode" = packet ] && ip -n "$NS" link add vr-p1 type veth peer name vr-p2
        for i in 1 2; do
            if [ "$mode" = tap ]; then
                vr_netns_tap "$NS" "vr-t$i" 9000
                args=(--tap "vr-t$i")
            else
                ip -n "$NS" link set "vr-p$i" mtu 9000 up
                args=(--netdev "vr-p$i")
            fi
            vr_spawn "$DIR/daemon-$i.log" ip netns exec "$NS" env NO_COLOR=1 "$DAEMON_BIN" --socket "$DIR/f$i.sock" \
                --ip "10.78.0.$i/24" --mtu 9000 "${args[@]}"
            DPIDS+=("$VR_LAST_PID")
        done
        ;;
    esac
    for _ in $(seq 100); do
        [ -S "$DIR/f1.sock" ] && [ -S "$DIR/f2.sock" ] && return 0
        for i in "${DPIDS[@]}"; do
            kill -0 "$i" 2>/dev/null || { vr_log "ERROR: a $mode daemon exited (logs $DIR/daemon*.log)"; return 1; }
        done
        sleep 0.1
    done
    vr_log "ERROR: the $mode daemons' sockets did not appear within 10 s (logs $DIR/daemon*.log)"
    return 1
}
stop_mode() {
    [ ${#DPIDS[@]} = 0 ] || vr_stop "${DPIDS[@]}"
    DPIDS=()
    [ -z "$NS" ] || vr_netns_destroy "$NS"
    NS=
}
# alive: true when every daemon of the mode still runs (not a zombie).
alive() {
    local p
    for p in "${DPIDS[@]}"; do
        kill -0 "$p" 2>/dev/null && [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null)" != Z ] || return 1
    done
}
# counters F: function F's (1 or 2) counters of COUNTERS, "name value" per line (none if the
# daemon does not answer within 10 s).
counters() {
    timeout 10 "$DAEMON_BIN" stats --socket "$DIR/f$1.sock" 2>/dev/null |
        awk 'NR == FNR { want[$1] = 1; next } ($1 in want) { print $1, $2 }' <(printf '%s\n' "${COUNTERS[@]}") - || true
}
# delta BEFORE AFTER: "name=after-before" of the nonzero differences (all zero: "all zero").
delta() {
    awk 'NR == FNR { b[$1] = $2; next } { d = $2 - b[$1]; if (d != 0) { printf "%s%s=%d", sep, $1, d; sep = " " } }
        END { if (sep == "") printf "all zero" }' <(echo "$1") <(echo "$2")
}

PORT=19500
# run MODE TOOL ARGS...: one perftest run, server on f1, client on f2; prints its verdict.
run() {
    local mode=$1 tool=$2
    shift 2
    local what="$mode $tool $*" tag srv src=0 crc=0 t=0 t0=$SECONDS rows want why='' b1 b2 a1 a2 bw
    PORT=$((PORT + 1))
    tag=$DIR/$tool-$PORT
    b1=$(counters 1) b2=$(counters 2)
    vr_spawn "$tag.server" ip netns exec "$NS" env LD_LIBRARY_PATH="$LIB" VRNIC_AGENT=off VRNIC_VHOST_USER="$DIR/f1.sock" \
        timeout -k 5 "$RUN_TIMEOUT" "$tool" -x 1 -p "$PORT" "$@"
    srv=$VR_LAST_PID
    # The client, again while the server is not listening yet (at most 50 tries, 0.2 s apart).
    while :; do
        crc=0
        # In the background (vr_spawn) so that a signal's cleanup stops it too.
        vr_spawn "$tag.client" ip netns exec "$NS" env LD_LIBRARY_PATH="$LIB" VRNIC_AGENT=off VRNIC_VHOST_USER="$DIR/f2.sock" \
            timeout -k 5 "$RUN_TIMEOUT" "$tool" -x 1 -p "$PORT" "$@" 127.0.0.1
        wait "$VR_LAST_PID" || crc=$?
        vr_stop "$VR_LAST_PID" # only drops it from the list: it has ended
        [ $crc = 0 ] && break
        t=$((t + 1))
        { [ $t -lt 50 ] && grep -qiE "couldn't connect|connection refused" "$tag.client"; } || break
        sleep 0.2
    done
    # The server ends with the client; one still running SERVER_GRACE s after it is stopped (a
    # failed client leaves it waiting until its timeout otherwise).
    for _ in $(seq $((SERVER_GRACE * 10))); do
        [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$srv/stat" 2>/dev/null || echo Z)" = Z ] && break
        sleep 0.1
    done
    if [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$srv/stat" 2>/dev/null || echo Z)" != Z ]; then
        vr_stop "$srv"
        src="still running $SERVER_GRACE s after the client ended, stopped"
    else
        wait "$srv" || src=$?
        vr_stop "$srv" # only drops it from the list: it has ended
    fi
    a1=$(counters 1) a2=$(counters 2)
    # Table rows: "#bytes #iterations BW-peak BW-average MsgRate", sizes of this run.
    rows=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 { print $1 }' "$tag.client" | tr '\n' ' ') || true
    if [[ " $* " == *" -a "* ]]; then
        want=$(for i in $(seq 1 23); do printf '%d ' $((1 << i)); done)
    else
        want="$(awk '{ for (i = 1; i < NF; i++) if ($i == "-s") print $(i + 1) }' <<<"$*") "
    fi
    bw=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 { v = $4 } END { print v }' "$tag.client")
    echo "heavy $what: $((SECONDS - t0)) s, last row ${bw:-none} MB/s; f1 (server): $(delta "$b1" "$a1"); f2 (client): $(delta "$b2" "$a2")"
    if [ $crc != 0 ] || [ "$src" != 0 ]; then
        why="client exit $crc, server exit $src"
        [ $crc = 124 ] || [ "$src" = 124 ] && why+=" (124: timed out after $RUN_TIMEOUT s)"
        why+=": $(grep -ahiE -m2 'error|fail|unable|couldn' "$tag.client" "$tag.server" | tr '\n' ' ' | cut -c1-300)"
    elif [ "$rows" != "$want" ]; then
        why="client's table: sizes [${rows% }], expected [${want% }]"
    fi
    if ! alive; then
        why+="${why:+; }a daemon is gone (logs $DIR/daemon*.log)"
    fi
    # Between functions nothing is lost: a full queue holds its sender back (issue 28, point 3);
    # frames given up (link_tx_errors) or dropped at a port's queue would be drops.
    if [ "$mode" = switch ]; then
        local d
        d="$(delta "$b1" "$a1") $(delta "$b2" "$a2")"
        if grep -qE 'link_tx_errors|switch_rx_dropped' <<<"$d"; then
            why+="${why:+; }frames lost between functions: $d"
        fi
    fi
    if [ -z "$why" ]; then pass "$what"; else fail "$what: $why (outputs $tag.client, $tag.server)"; fi
}

T0=$SECONDS
for mode in "${MODES[@]}"; do
    tm=$SECONDS
    echo "=== heavy $mode"
    if ! start_mode "$mode"; then
        fail "$mode: the daemons did not start"
        stop_mode
        continue
    fi
    for tool in $TOOLS; do
        for args in "${ARG_SETS[@]}"; do
            if ! alive; then
                # shellcheck disable=SC2086 # the argument set, word by word
                fail "$mode $tool $args: not run, a daemon is gone"
                continue
            fi
            # shellcheck disable=SC2086 # the argument set, word by word
            run "$mode" "$tool" $args
        done
    done
    stop_mode
    echo "=== heavy $mode took $((SECONDS - tm)) s"
done
echo "heavy: $PASSED runs passed, $FAILED failed ($((SECONDS - T0)) s; results in $RESULTS)"
[ "$FAILED" = 0 ]
