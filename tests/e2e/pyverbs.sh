#!/usr/bin/env bash
# rdma-core's own test suite (pyverbs, Debian's python3-pyverbs: /usr/share/doc/rdma-core/tests),
# unmodified, in a host process on vrnic's libibverbs.so.1 attached to a daemon function: the
# containers' path (issue 30, point 4). No QEMU.
#
#   tests/e2e/pyverbs.sh [MODULE...]     # as root; MODULE: test_qp, test_mr, ... (default: all)
#
# One network namespace (vrnic-pyverbs-PID) with a TAP nobody reads and one daemon function
# (10.79.0.1/24, socket RESULTS/f1.sock); each module runs as
#   VRNIC_VHOST_USER=f1.sock LD_LIBRARY_PATH=LIB /usr/bin/python3 run_tests.py --dev vrnic0 --gid 1 -v MODULE
# inside the namespace, bounded by `timeout` (PYVERBS_TIMEOUT, 300 s). The suite is copied from
# the package (Debian compresses most of its files) into RESULTS/tests. A module passes when
# unittest ends with "OK" (its skips are what vrnic lacks, each with the suite's own reason:
# memory windows, device memory, ODP, dmabuf, rereg MR, vendor-only modules, rdma_cm) and the
# daemon still runs. Printed: one line per module (ran, passed, skipped, failed, errors), then
# `PASS: pyverbs MODULE` or `FAIL: pyverbs MODULE: why`, and "pyverbs: N modules passed, N failed";
# the skip reasons, counted, go to RESULTS/skips.txt. Exit status 0 iff no module failed. The suite
# runs twice (PYVERBS_VIA, default "direct agent"): each process its function's own vhost-user
# frontend (VRNIC_AGENT=off), then through the agent the library starts (vrnic-agent --vhost-user,
# how a container with vrnic's package runs it; lines `pyverbs (agent) MODULE`), after which the
# agent must serve no program and hold no object.
# Environment: PYVERBS_RESULTS (default out/pyverbs-DATE), PYVERBS_TIMEOUT, PYVERBS_BIN (the
# daemon; default target/release/vrnic, built here), PYVERBS_NO_BUILD=1 (use what target/release
# holds). CI runs this as the e2e step `pyverbs` (tests/e2e/run.sh).
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../../scripts/lib.sh"
vr_install_traps

SUITE=/usr/share/doc/rdma-core/tests
[ -f "$SUITE/run_tests.py" ] || vr_die "no $SUITE/run_tests.py (scripts/deps.sh installs python3-pyverbs)"
# Debian's interpreter, where python3-pyverbs is installed (not a python3 earlier on the PATH).
PY=/usr/bin/python3
[ -x "$PY" ] || vr_die "no $PY"
for b in timeout ip; do
    command -v "$b" >/dev/null || vr_die "$b missing"
done
RESULTS=${PYVERBS_RESULTS:-$VR_TOP/out/pyverbs-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RESULTS"
RESULTS=$(readlink -f "$RESULTS")
RUN_TIMEOUT=${PYVERBS_TIMEOUT:-300}
vr_release_build "${PYVERBS_NO_BUILD:-0}" "${PYVERBS_BIN:-}"
DAEMON_BIN=$VR_DAEMON_BIN LIB=$VR_IBVERBS_LIB
VIAS=${PYVERBS_VIA:-direct agent}
AGENT_BIN=$VR_TOP/target/release/vrnic-agent
if [[ " $VIAS " == *" agent "* ]]; then
    if [ "${PYVERBS_NO_BUILD:-0}" != 1 ]; then
        (cd "$VR_TOP" && cargo build -q --release -p vrnic-tools --bin vrnic-agent) ||
            vr_die "cargo build --release --bin vrnic-agent failed"
    fi
    [ -x "$AGENT_BIN" ] || vr_die "no $AGENT_BIN"
fi

# The suite, uncompressed (run_tests.py imports the package `tests` from its own directory).
rm -rf "$RESULTS/tests"
cp -r "$SUITE" "$RESULTS/tests"
find "$RESULTS/tests" -name '*.gz' -exec gunzip -f {} +
MODULES=("$@")
if [ ${#MODULES[@]} = 0 ]; then
    mapfile -t MODULES < <(cd "$RESULTS/tests" && ls test_*.py | sed 's/\.py$//')
fi
vr_log "pyverbs: daemon $DAEMON_BIN, library $LIB/libibverbs.so.1, ${#MODULES[@]} modules, results in $RESULTS"

NS=vrnic-pyverbs-$$
vr_netns_create "$NS"
vr_netns_tap "$NS" vr-py 1500
rm -f "$RESULTS"/f1.sock*
vr_spawn "$RESULTS/daemon.log" ip netns exec "$NS" env NO_COLOR=1 "$DAEMON_BIN" --socket "$RESULTS/f1.sock" \
    --ip 10.79.0.1/24 --tap vr-py
DPID=$VR_LAST_PID
for _ in $(seq 100); do
    [ -S "$RESULTS/f1.sock" ] && break
    kill -0 "$DPID" 2>/dev/null || vr_die "the daemon exited (log $RESULTS/daemon.log)"
    sleep 0.1
done
[ -S "$RESULTS/f1.sock" ] || vr_die "the daemon's socket did not appear within 10 s"

PASSED=0 FAILED=0
# num KEY: KEY's count in unittest's last line ($last), e.g. skipped=3.
num() { echo "$last" | grep -oE "$1=[0-9]+" | cut -d= -f2 || true; }
# suite VIA: every module, the process its function's own frontend (VIA=direct, VRNIC_AGENT=off)
# or through the agent the library starts (VIA=agent: vrnic-agent --vhost-user, each process's
# memory file added to the daemon's memory table; then the agent must serve nothing and hold no
# object, and is stopped). Logs in RESULTS/VIA/.
suite() {
    local via=$1 tag="" dir=$RESULTS/$1 agent=off tmp st p
    [ "$via" = agent ] && tag=" (agent)" agent=$AGENT_BIN
    tmp=$dir/tmp
    mkdir -p "$tmp"
    printf '%-28s %5s %6s %7s %6s %6s\n' "module$tag" ran passed skipped failed errors
    for m in "${MODULES[@]}"; do
        log=$dir/$m.log
        rc=0
        (cd "$RESULTS/tests" && VRNIC_VHOST_USER=$RESULTS/f1.sock LD_LIBRARY_PATH=$LIB VRNIC_AGENT=$agent \
            TMPDIR=$tmp timeout -k 10 "$RUN_TIMEOUT" ip netns exec "$NS" "$PY" run_tests.py --dev vrnic0 --gid 1 -v "$m") \
            >"$log" 2>&1 || rc=$?
        ran=$(sed -n 's/^Ran \([0-9]*\) tests\{0,1\} in.*/\1/p' "$log" | tail -1) || true
        last=$(grep -E '^(OK|FAILED)' "$log" | tail -1 || true)
        skipped=$(num skipped) failures=$(num failures) errors=$(num errors)
        ran=${ran:-0} skipped=${skipped:-0} failures=${failures:-0} errors=${errors:-0}
        printf '%-28s %5s %6s %7s %6s %6s\n' "$m" "$ran" "$((ran - skipped - failures - errors))" \
            "$skipped" "$failures" "$errors"
        if ! kill -0 "$DPID" 2>/dev/null; then
            FAILED=$((FAILED + 1)); echo "FAIL: pyverbs$tag $m: the daemon died (log $RESULTS/daemon.log)"
            break
        elif [ $rc = 124 ] || [ $rc = 137 ]; then
            FAILED=$((FAILED + 1)); echo "FAIL: pyverbs$tag $m: not done within $RUN_TIMEOUT s (log $log)"
        elif [ "${last%% *}" != OK ] || [ $rc != 0 ]; then
            FAILED=$((FAILED + 1)); echo "FAIL: pyverbs$tag $m: exit $rc, ${last:-no result} (log $log)"
            { grep -E '^(FAIL|ERROR):' "$log" || true; } | head -5 | sed 's/^/    /'
        else
            PASSED=$((PASSED + 1)); echo "PASS: pyverbs$tag $m"
        fi
    done
    [ "$via" = agent ] || return 0
    # What every program left is gone: no program, only the default context, no object. Then the
    # agent (the one process in the namespace besides the daemon) is stopped.
    st=$("$AGENT_BIN" --status --socket "$(ls "$tmp"/vrnic-*/agent-*.sock 2>/dev/null | head -1)" 2>&1 || true)
    if [ "$st" = "programs 0 pinned 0 contexts 1 pds 0 mrs 0 cqs 0 qps 0 ahs 0 srqs 0 mr_pages 0" ]; then
        PASSED=$((PASSED + 1)); echo "PASS: pyverbs$tag: nothing left ($st)"
    else
        FAILED=$((FAILED + 1)); echo "FAIL: pyverbs$tag: the agent's device after the suite: $st"
    fi
    # Not this script's child (the library detached it), but in this script's own namespace.
    for p in $(ip netns pids "$NS"); do
        [ "$p" = "$DPID" ] || kill -TERM "$p" 2>/dev/null || true
    done
    for _ in $(seq 100); do
        [ "$(ip netns pids "$NS" | grep -vcx "$DPID")" = 0 ] && break
        sleep 0.1
    done
}
for via in $VIAS; do suite "$via"; done
grep -hoE "skipped '[^']*'" "$RESULTS"/*/test_*.log 2>/dev/null | sort | uniq -c | sort -rn >"$RESULTS/skips.txt" || true
vr_stop "$DPID"
vr_netns_destroy "$NS"
echo "pyverbs: $PASSED modules passed, $FAILED failed (skip reasons: $RESULTS/skips.txt)"
[ $FAILED = 0 ]
