# shellcheck shell=sh
# Guest side of the ping-pong matrix (POSIX sh: busybox in the vrnic guest, dash in the rxe guest).
# The harness prepends the parameters and passes the whole file as the guest's job:
#   NAME        this guest's name                 PEER_IP  the other guest's eth0 address (TCP)
#   TOOL        ibv_rc_pingpong or vrnic-pingpong  GID      GID index (-g)
#   SIZES       message sizes (-s)                ITERS    iterations (-n)
#   MTU         path MTU (-m)                     ROLES    one role per phase, e.g. "server client"
#   BASEPORT    first TCP port; every (phase, size) run has a port of its own, so a client can
#               never reach the wrong server
#   RUN_TIMEOUT bound on one run (s)              CONNECT_WAIT how long a client retries (s)
#   EXTRA       extra tool options
#   WRITE_IMM_ROLE  server or client: afterwards run vrnic-write-imm (RDMA WRITE with immediate
#               into the peer's memory, checked byte for byte) for each of WRITE_IMM_SIZES; empty: skip
# Each run prints its output, then one line:
#   VRNIC-RESULT <name> <role> size=<s> rc=<rc> tool=<tool> usec_per_iter=<x> verified=<yes|no|n/a>
# verified=yes: the tool printed "data verified: ITERS messages" (vrnic-pingpong does; the rxe
# side's ibv_rc_pingpong does not, and is not asked to).

now() { cut -d. -f1 /proc/uptime; }

run_one() { # role size port
    role=$1 size=$2 port=$3
    # shellcheck disable=SC2086
    set -- "$TOOL" -g "$GID" -m "$MTU" -s "$size" -n "$ITERS" -p "$port" $EXTRA
    [ "$role" = client ] && set -- "$@" "$PEER_IP"
    deadline=$(($(now) + CONNECT_WAIT))
    attempt=0
    while :; do
        attempt=$((attempt + 1))
        timeout "$RUN_TIMEOUT" "$@" >/tmp/out 2>&1
        rc=$?
        # A client retries only while the server is not listening yet.
        if [ $rc -ne 0 ] && [ "$role" = client ] && [ "$(now)" -lt "$deadline" ] &&
            grep -qiE "couldn't connect to [^ ]+:[0-9]+|connection refused" /tmp/out; then
            sleep 0.5
            continue
        fi
        break
    done
    echo "--- $NAME $role size=$size port=$port attempts=$attempt: $*"
    cat /tmp/out
    usec=$(sed -n 's/.* = \([0-9.]*\) usec\/iter.*/\1/p' /tmp/out | tail -1)
    # vrnic-pingpong checks every message and prints "data verified: N messages" (N = -n).
    verified=no
    [ "$TOOL" = vrnic-pingpong ] || verified=n/a
    n=$(sed -n 's/.*data verified: \([0-9]*\) messages.*/\1/p' /tmp/out | tail -1)
    [ "${n:-0}" -eq "$ITERS" ] && verified=yes
    echo "VRNIC-RESULT $NAME $role size=$size rc=$rc tool=$TOOL usec_per_iter=${usec:-none} verified=$verified"
    [ "$rc" -eq 0 ]
}

fails=0
phase=0
for role in $ROLES; do
    i=0
    for size in $SIZES; do
        run_one "$role" "$size" $((BASEPORT + phase * 100 + i)) || fails=$((fails + 1))
        i=$((i + 1))
    done
    phase=$((phase + 1))
done
# RDMA WRITE with immediate, vrnic to vrnic: one line per size:
#   VRNIC-WRITEIMM <name> <role> size=<s> rc=<rc> verified=<yes|no>
i=0
for size in ${WRITE_IMM_SIZES:-}; do
    [ -n "${WRITE_IMM_ROLE:-}" ] || break
    set -- vrnic-write-imm -g "$GID" -m "$MTU" -s "$size" -n 10 -p $((BASEPORT + 900 + i)) --timeout "$RUN_TIMEOUT"
    # The client retries a refused connection itself, within --timeout.
    [ "$WRITE_IMM_ROLE" = client ] && set -- "$@" "$PEER_IP"
    timeout $((RUN_TIMEOUT + 30)) "$@" >/tmp/out 2>&1
    rc=$?
    echo "--- $NAME write-imm $WRITE_IMM_ROLE size=$size: $*"
    cat /tmp/out
    verified=no
    grep -q "write-imm verified: 10 writes of $size bytes" /tmp/out && verified=yes
    echo "VRNIC-WRITEIMM $NAME $WRITE_IMM_ROLE size=$size rc=$rc verified=$verified"
    [ $rc -eq 0 ] && [ $verified = yes ] || fails=$((fails + 1))
    i=$((i + 1))
done
echo "VRNIC-SUMMARY $NAME failures=$fails"
[ $fails -eq 0 ]
