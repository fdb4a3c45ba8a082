# shellcheck shell=sh
# Guest side of the e2e step `software` (tests/e2e/software.sh): RDMA software nobody here wrote,
# unmodified from Debian, on a guest booted with the software layer (images/software.sh). POSIX sh.
# The harness prepends the parameters:
#   NAME      this guest's name            DEV, GID   its RDMA device and GID index (UCX_NET_DEVICES=DEV:1)
#   PEER_IP   the other guest's eth0 address (ucx_perftest's TCP exchange)
#   ROLES     one role per UCX phase, e.g. "server client" (the other guest has the opposite)
#   UCX_TLS_LIST  UCX transports, e.g. "rc_v ud_v"; UCX_TESTS  "TEST:SIZE:ITERS ..." (ucx_perftest -t -s -n)
#   BASEPORT  first TCP port; every (transport, test, phase) has its own, so a client never reaches
#             the wrong server
#   RUN_TIMEOUT bound on one run (s)      CONNECT_WAIT how long a client retries (s)
#   MPI_ROLE  launcher (runs mpirun, rank 0 here), host (rank 1: serves sw-rsh) or empty (no MPI)
#   MPI_TIMEOUT bound on mpirun (s)     MPI_X  more `-x VAR=VALUE` options of mpirun
#   UCX_ENV   more variables for ucx_perftest (VAR=VALUE ..., unquoted)
#   CM_TOOLS  rdma_cm programs to run first, each in both roles (empty: none), from rping ucmatose
#             udaddy ib_send_bw ib_write_lat cmtime; CM_IP this guest's RDMA address (a vrnic guest's
#             function's, not eth0's; an rxe guest's eth0's), CM_PEER the other guest's;
#             CM_TIMEOUT bound on one run (s); CM_PORT first port
#   PYVERBS   1: afterwards rdma-core's test suite, `run_tests.py --dev DEV --gid GID -v`, bounded
#             by PYV_TIMEOUT (s)
# Lines it prints (the harness reads them from the serial console):
#   VRNIC-CM <name> <tool> <role> rc=<rc> attempts=<n> secs=<s> <figures: pings=, ok=, result=, connect=, ...>
#   VRNIC-UCX <name> <tl> <test> <role> rc=<rc> attempts=<n> final=<ucx_perftest's Final: fields>
#   VRNIC-MPI <name> launcher rc=<rc> ok=<yes|no> mb_s_4MiB=<MB/s> secs=<s>; VRNIC-MPI <name> host done=<yes|no>
#   VRNIC-PYVERBS-BEGIN <name>, the suite's output, VRNIC-PYVERBS-END <name> rc=<rc> secs=<s>

now() { cut -d. -f1 /proc/uptime; }
# The layer leaves ld.so's cache to the image (the vrnic image's puts vrnic's libibverbs first).
ldconfig
# mpirun names the guests by their host names.
printf '10.0.0.1 a\n10.0.0.2 b\n' >>/etc/hosts
case $DEV in
rxe*)
    # UCX on rxe: rxe leaves ibv_wc.sl 0 in a UD receive's completion, where UCX's ud_verbs expects
    # the RoCE packet type (mlx5's CQE), so its destination GID check (on by default on Ethernet)
    # reads a RoCEv2/IPv4 frame's GRH area as an IPv6 one and drops every datagram: UCX between
    # two rxe guests fails the same way without this (UCX's wire-up over UD times out).
    export UCX_UD_ETH_DGID_CHECK=n
    ;;
esac
# The MPI host (MPI_ROLE=host) serves mpirun's remote shell from the start.
rsh_pid=
if [ "${MPI_ROLE:-}" = host ]; then
    sw-rsh --serve 18799 "$(ip -4 -o addr show dev eth0 | awk '{ sub(/\/.*/, "", $4); print $4 }')" &
    rsh_pid=$!
fi

# ucx_run ROLE PORT TL TEST SIZE ITERS: one ucx_perftest run (a client retries, bounded, while the
# server does not listen yet); output in /tmp/ucx.out; sets rc and attempt.
ucx_run() {
    role=$1 port=$2 tl=$3 test=$4 size=$5 iters=$6
    deadline=$(($(now) + CONNECT_WAIT))
    attempt=0
    while :; do
        attempt=$((attempt + 1))
        if [ "$role" = server ]; then
            # shellcheck disable=SC2086 # UCX_ENV: VAR=VALUE words
            env $UCX_ENV UCX_TLS="$tl" UCX_NET_DEVICES="$DEV:1" timeout "$RUN_TIMEOUT" ucx_perftest -p "$port" >/tmp/ucx.out 2>&1
        else
            # shellcheck disable=SC2086 # UCX_ENV: VAR=VALUE words
            env $UCX_ENV UCX_TLS="$tl" UCX_NET_DEVICES="$DEV:1" timeout "$RUN_TIMEOUT" ucx_perftest "$PEER_IP" -p "$port" \
                -t "$test" -s "$size" -n "$iters" >/tmp/ucx.out 2>&1
        fi
        rc=$?
        if [ $rc -ne 0 ] && [ "$role" = client ] && [ "$(now)" -lt "$deadline" ] &&
            grep -qiE "connection refused|failed to connect|connect\(\) failed" /tmp/ucx.out; then
            sleep 0.5
            continue
        fi
        break
    done
}

# rdma_cm: Debian's rdmacm-utils and perftest's -R, unmodified, on vrnic's librdmacm.so.1 (its CM
# in the agent) or the kernel's rdma_cm (rxe). The other guest runs the same list with the roles
# swapped. A client retries (bounded by CONNECT_WAIT) while it was turned away because the server
# does not listen yet (REJ "no listener" → RDMA_CM_EVENT_REJECTED; SIDR → UNREACHABLE); so does a
# server that such an early client made fail.
# cm_cmd TOOL ROLE PORT: the command line.
cm_cmd() {
    case $1-$2 in
    rping-server) echo "rping -s -v -V -C 20 -a $CM_IP -p $3" ;;
    rping-client) echo "rping -c -v -V -C 20 -a $CM_PEER -p $3" ;;
    ucmatose-server) echo "ucmatose -b $CM_IP -c 4 -C 10" ;;
    ucmatose-client) echo "ucmatose -s $CM_PEER -c 4 -C 10" ;;
    udaddy-server) echo "udaddy -b $CM_IP -c 2 -C 10" ;;
    udaddy-client) echo "udaddy -s $CM_PEER -c 2 -C 10" ;;
    ib_send_bw-server) echo "ib_send_bw -R -F -n 200 -s 65536 -p $3" ;;
    ib_send_bw-client) echo "ib_send_bw -R -F -n 200 -s 65536 -p $3 $CM_PEER" ;;
    ib_write_lat-server) echo "ib_write_lat -R -F -n 200 -s 64 -p $3" ;;
    ib_write_lat-client) echo "ib_write_lat -R -F -n 200 -s 64 -p $3 $CM_PEER" ;;
    cmtime-server) echo "cmtime -b $CM_IP -c 10 -p $3" ;;
    cmtime-client) echo "cmtime -s $CM_PEER -c 10 -p $3" ;;
    esac
}
# cm_figures TOOL ROLE FILE: what the harness judges a run by.
cm_figures() {
    case $1 in
    rping) echo "pings=$(grep -cE '^(server )?ping data: rdma-ping-' "$3")" ;;
    ucmatose | udaddy)
        ok=no
        grep -q 'test complete' "$3" && grep -q 'return status 0' "$3" && ok=yes
        echo "ok=$ok"
        ;;
    ib_send_bw | ib_write_lat)
        # perftest's result line: bytes, iterations, then bandwidth (peak, average, msg rate) or
        # latency (min, max, typical, average, stdev, 99%, 99.9%).
        r=$(grep -E '^ *(65536|64) +200 ' "$3" | tail -1 | tr -s ' ' | sed 's/^ //; s/ /,/g')
        echo "result=${r:-none}"
        ;;
    cmtime)
        # The client's table: "step : total_ms max_ms min_us us/conn" (%11.2f each, so wide middle
        # figures run together): the first and the last.
        for step in connect disconnect; do
            r=$(awk -F: -v s="$step" '{ n = $1; gsub(/ /, "", n) } n == s { print $2; exit }' "$3" |
                awk 'NF >= 2 { print $1 "," $NF }')
            printf '%s=%s ' "$step" "${r:-none}"
        done
        # Every connection's failure is an "event: NAME, error: N" line (the table comes anyway).
        echo "errors=$(grep -c '^event: ' "$3")"
        ;;
    esac
}
# cm_threads PID: where each thread of process PID waits (name, wchan, syscall number).
cm_threads() {
    for t in /proc/"$1"/task/*; do
        echo "VRNIC-CM-WAIT $NAME: pid $1 $(cat "$t/comm" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
    done
}
# cm_exec CMD...: runs CMD (output in $out) bounded by CM_TIMEOUT, setting rc (124: timed out). A
# program still running at the bound has its threads' and the agent's waits printed first.
cm_exec() {
    "$@" >"$out" 2>&1 &
    cm_p=$!
    cm_i=0
    while kill -0 "$cm_p" 2>/dev/null && [ "$cm_i" -lt $((CM_TIMEOUT * 5)) ]; do
        sleep 0.2
        cm_i=$((cm_i + 1))
    done
    if kill -0 "$cm_p" 2>/dev/null; then
        for q in "$cm_p" $(pgrep -x vrnic-agent); do cm_threads "$q"; done
        kill "$cm_p"
        wait "$cm_p"
        rc=124
    else
        wait "$cm_p"
        rc=$?
    fi
}
cm_bg=
port=$((BASEPORT + 50))
# vrnic's librdmacm says on stderr why a call failed.
case $DEV in vrnic*) export VRNIC_RDMACM_DEBUG=1 ;; esac
for tool in ${CM_TOOLS:-}; do
    for role in $ROLES; do
        port=$((port + 1))
        t0=$(now)
        deadline=$(($(now) + CONNECT_WAIT))
        attempt=0
        out=/tmp/cm-$tool-$role.out
        while :; do
            attempt=$((attempt + 1))
            # shellcheck disable=SC2046 # the command line's words
            if [ "$tool-$role" = cmtime-server ]; then
                # cmtime's server serves until killed: in the background, killed once this guest's
                # next run (a client of the other guest, which ran its cmtime client first) is done.
                timeout "$CM_TIMEOUT" stdbuf -oL $(cm_cmd "$tool" "$role" "$port") >"$out" 2>&1 &
                cm_bg=$!
                rc=bg
                break
            fi
            # (stdbuf: a program killed by timeout still shows how far it got.)
            cm_exec stdbuf -oL $(cm_cmd "$tool" "$role" "$port")
            # (cmtime reports a rejected connection and still exits 0.) A server is started again
            # when a client's early attempt hurt it: ucmatose's client turned away on its first
            # connection exits, rejecting (REJ 28, as Linux's CM does) the connections its server
            # had meanwhile accepted, and ucmatose's server exits on that event.
            if { [ $rc -ne 0 ] || [ "$tool-$role" = cmtime-client ]; } && [ "$(now)" -lt "$deadline" ] &&
                grep -qE "REJECTED|UNREACHABLE|Connection refused|Unable to" "$out"; then
                sleep 0.5
                continue
            fi
            break
        done
        if [ "$rc" = bg ]; then continue; fi
        echo "VRNIC-CM-OUT $NAME $tool $role: $(cm_cmd "$tool" "$role" "$port")"
        cat "$out"
        echo "VRNIC-CM $NAME $tool $role rc=$rc attempts=$attempt secs=$(($(now) - t0)) $(cm_figures "$tool" "$role" "$out")"
        if [ "$rc" != 0 ] && [ -e /run/vrnic/agent.sock.log ]; then
            echo "VRNIC-CM-AGENT $NAME: vrnic-agent --status: $(timeout 5 /usr/lib/vrnic/vrnic-agent --status 2>&1 | tail -1)"
            tail -20 /run/vrnic/agent.sock.log
            for t in $(pgrep -x vrnic-agent | sed 's|^|/proc/|; s|$|/task/*|'); do
                echo "VRNIC-CM-AGENT $NAME: thread $t $(cat "$t/comm") wchan=$(cat "$t/wchan") syscall=$(cut -d' ' -f1 "$t/syscall")"
            done
        fi
        if [ -n "$cm_bg" ]; then
            kill "$cm_bg" 2>/dev/null
            wait "$cm_bg"
            rc=$?
            out=/tmp/cm-cmtime-server.out
            echo "VRNIC-CM-OUT $NAME cmtime server (killed when done)"
            cat "$out"
            echo "VRNIC-CM $NAME cmtime server rc=$rc attempts=1 secs=0 served=$(grep -c . "$out")"
            cm_bg=
        fi
    done
done
if [ -n "$cm_bg" ]; then
    sleep "$CM_TIMEOUT"
    kill "$cm_bg" 2>/dev/null
fi
unset VRNIC_RDMACM_DEBUG

port=$BASEPORT
for tl in $UCX_TLS_LIST; do
    for t in $UCX_TESTS; do
        test=${t%%:*} rest=${t#*:}
        size=${rest%%:*} iters=${rest#*:}
        for role in $ROLES; do
            port=$((port + 1))
            ucx_run "$role" "$port" "$tl" "$test" "$size" "$iters"
            cat /tmp/ucx.out
            final=$(grep -m1 '^Final:' /tmp/ucx.out | tr -s ' ' | sed 's/^Final: *//; s/ /,/g')
            echo "VRNIC-UCX $NAME $tl $test $role rc=$rc attempts=$attempt final=${final:-none}"
        done
    done
done

# Open MPI across the two guests: the launcher runs mpirun (its rank 0 here, rank 1 on the other
# guest through the remote shell), `--mca pml ucx` over rc_verbs, the ping-pong checked from 1 B to
# 4 MiB and MPI_Allreduce; then tells the host it is done. The host waits for that (bounded).
case ${MPI_ROLE:-} in
launcher)
    t0=$(now)
    # shellcheck disable=SC2086 # MPI_X: -x VAR=VALUE pairs
    timeout "$MPI_TIMEOUT" mpirun --allow-run-as-root --mca plm_rsh_agent sw-rsh --host a:1,b:1 -np 2 \
        --mca oob_tcp_if_include eth0 --mca pml ucx --mca btl ^openib,uct -x UCX_TLS=rc_v,ud_v \
        $MPI_X /usr/bin/mpi-pingpong >/tmp/mpi.out 2>&1
    rc=$?
    cat /tmp/mpi.out
    ok=no
    grep -q "^mpi_pingpong: ok" /tmp/mpi.out && ok=yes
    big=$(grep -a '^pingpong 4194304 ' /tmp/mpi.out | tail -1 | awk '{ print $4 }')
    echo "VRNIC-MPI $NAME launcher rc=$rc ok=$ok mb_s_4MiB=${big:-none} secs=$(($(now) - t0))"
    sw-rsh "$PEER_IP" 'touch /tmp/mpi-done' >/dev/null 2>&1 || echo "VRNIC-MPI $NAME: could not tell the host"
    ;;
host)
    deadline=$(($(now) + MPI_TIMEOUT + CONNECT_WAIT))
    while [ ! -e /tmp/mpi-done ] && [ "$(now)" -lt "$deadline" ]; do sleep 1; done
    done=no
    [ -e /tmp/mpi-done ] && done=yes
    echo "VRNIC-MPI $NAME host done=$done"
    kill "$rsh_pid" 2>/dev/null
    ;;
esac

if [ "${PYVERBS:-0}" = 1 ]; then
    t0=$(now)
    echo "VRNIC-PYVERBS-BEGIN $NAME"
    (cd /usr/share/doc/rdma-core/tests && timeout -k 10 "$PYV_TIMEOUT" python3 run_tests.py --dev "$DEV" \
        --gid "$GID" -v) >/tmp/pyverbs.out 2>&1
    rc=$?
    cat /tmp/pyverbs.out
    echo "VRNIC-PYVERBS-END $NAME rc=$rc secs=$(($(now) - t0))"
fi
