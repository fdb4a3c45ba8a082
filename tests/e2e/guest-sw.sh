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
#   PYVERBS   1: afterwards rdma-core's test suite, `run_tests.py --dev DEV --gid GID -v`, bounded
#             by PYV_TIMEOUT (s)
# Lines it prints (the harness reads them from the serial console):
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
