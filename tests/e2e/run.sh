#!/usr/bin/env bash
# End-to-end test of vrnic against Linux Soft-RoCE (rdma_rxe), all inside a private network
# namespace (bridge br0, TAPs), guests under QEMU (TCG unless KVM works).
#
# Usage: tests/e2e/run.sh [STEP...]     STEP: qemu-select | rxe-rxe | probe | vrnic-rxe | vrnic-vrnic |
#                                             vrnic-rxe-lossy | vrnic-vrnic-pause | vrnic-vrnic-kill |
#                                             vrnic-vrnic-restart | hostile-peer | soak-2min | heavy |
#                                             pyverbs | ibv-rxe | ibv-ibv | ibv-ibv-switch | ibv-vrnic |
#                                             containers | software
#   default: qemu-select probe vrnic-rxe vrnic-vrnic vrnic-rxe-lossy vrnic-vrnic-pause
#   vrnic-vrnic-kill vrnic-vrnic-restart hostile-peer soak-2min heavy pyverbs ibv-rxe ibv-ibv
#   ibv-ibv-switch containers software
#   (software: rdma-core's test suite, UCX and Open MPI, unmodified from Debian, in a vrnic guest
#   beside an rxe guest, tests/e2e/software.sh)
#   (pyverbs: rdma-core's own test suite, Debian's python3-pyverbs, unmodified, in a host process on
#   a daemon function, every module passing or skipping, tests/e2e/pyverbs.sh; no QEMU, about 1 min)
#   (containers: Debian's tools in podman containers on vrnic through the daemon's vhost-user
#   socket, against each other and against a vrnic and an rxe guest, tests/e2e/containers.sh; soak-2min:
#   scripts/soak.sh --minutes 2, two daemons and the vrnic-soak driver, no QEMU; heavy: tests/e2e/heavy.sh,
#   Debian's perftest between two host processes on release vrnic daemons (-q 8 -a and -q 32 -s 4 MiB,
#   write/read/send, switch, tap and packet modes; no QEMU, about 3 minutes); qemu-select: which QEMU the
#   scripts pick, tests/e2e/qemu-select.sh; vrnic-vrnic-pause: a VM paused and resumed mid-run, see
#   run_pause; vrnic-vrnic-kill: a guest's QEMU killed mid-run, see run_kill; vrnic-vrnic-restart:
#   a daemon killed mid-run and restarted, see run_restart; hostile-peer: an independent scapy peer
#   attacks a vrnic server, see run_hostile; ibv: a vrnic guest running Debian's unmodified
#   ibv_*_pingpong and perftest on vrnic's libibverbs.so.1; ibv-ibv-switch: ibv-ibv with both
#   guests on one daemon, two functions reaching each other through its embedded switch
#   (payloads go from one guest's memory to the other's); rxe-rxe is the harness's own baseline;
#   E2E_BASELINE=1 puts it first). probe: one vrnic guest + daemon running vrnic-probe; when it
#   fails, the vrnic pairs are not run (they would only time out) unless E2E_KEEP_GOING=1.
# Each pair boots two guests once; each guest runs the whole matrix in one job: for every size,
# A is the server and B the client, then the roles swap. vrnic guests run vrnic-pingpong against
# a vrnic daemon (one per guest, own TAP on the bridge, writing a pcap that
# tests/pcap_check.py then checks); rxe guests run the unmodified ibv_rc_pingpong. Then the UD and
# SRQ ping-pongs, and RDMA READ + atomics in both directions (vrnic-rdma, or on rxe
# tests/e2e/peer/rxe-rdma-peer, built into the rxe image).
#
# Environment: E2E_RESULTS (results dir, default out/e2e-DATE), E2E_SIZES ("1 1024 4096 65536"),
# E2E_ITERS (200), E2E_MTU (1024), E2E_LINK_MTU (1500: every link's MTU, see below), E2E_RUN_TIMEOUT (bound on one ping-pong run, 90 s),
# E2E_GUEST_TIMEOUT (bound on one guest's whole job, 900 s), E2E_NO_BUILD=1 (skip cargo build),
# E2E_RDMA=0 (no RDMA READ/atomic runs), E2E_RDMA_SIZES ("1,4097,1048576"), E2E_RDMA_READS (2),
# E2E_RDMA_FAA (100), E2E_LOSSY_RDMA, E2E_LOSSY_SIZES, E2E_LOSS (nft|netem), E2E_CRASH_ITERS,
# E2E_CRASH_AFTER, E2E_KILL_RSS_SLACK_KB (kill/restart steps), E2E_SOAK_MINUTES (soak-2min, 2),
# E2E_HEAVY_MODES (heavy: "switch tap packet"), E2E_HEAVY_TIMEOUT (heavy, with its build: 1200 s),
# E2E_PERF=0 (no perftest),
# E2E_PERF_SWEEP=0 (no perftest -a / -q 4 / -q 8 large-message runs in the ibv pairs; =full adds the
# latency tools' -a and the switch's 8 MiB runs), E2E_PERF_ALL_TOOLS/ARGS,
# E2E_PERF_QP_TOOLS/ARGS, E2E_PERF_BIG_TOOLS/ARGS (-q 8 at 1 MiB), E2E_PERF_HUGE_TOOLS/ARGS (-q 8 at 8 MiB),
# E2E_PERF_LONG_TOOLS/ARGS (ib_send_lat -n 5000 in the ibv pairs), E2E_PIN=0 (no compaction check in ibv-ibv), E2E_PIN_SIZE, E2E_PIN_ITERS,
# E2E_PIN_RDMA_SIZES, E2E_PIN_RDMA_READS,
# VRNIC_BIN (daemon binary), VRNIC_ACCEL (kvm|tcg, default: probed), VRNIC_CACHE.
# Prints PASS:/FAIL: lines and a closing "e2e: N passed, N failed"; exit status 0 iff no failure.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/../../scripts/lib.sh"
vr_install_traps
# An abort (vr_die: images, QEMU, ...) still ends with the closing line.
SUMMARY_DONE=0 PASSED=0 FAILED=0
trap 'rc=$?; if [ $SUMMARY_DONE = 0 ]; then echo "FAIL: e2e aborted (exit $rc)"; echo "e2e: $PASSED passed, $((FAILED + 1)) failed"; fi; vr_cleanup $rc' EXIT

PAIRS=("$@")
[ ${#PAIRS[@]} -gt 0 ] || PAIRS=(qemu-select probe vrnic-rxe vrnic-vrnic vrnic-rxe-lossy vrnic-vrnic-pause
    vrnic-vrnic-kill vrnic-vrnic-restart hostile-peer soak-2min heavy pyverbs ibv-rxe ibv-ibv ibv-ibv-switch containers
    software)
# The baseline put first by E2E_BASELINE=1 (CI's) runs without perftest unless E2E_BASELINE_PERF=1:
# its figures are a column of the table, not a check of vrnic (scripts/bench.sh --guests names
# rxe-rxe, which then runs perftest).
BASELINE_AUTO=0
[ "${E2E_BASELINE:-0}" = 1 ] && PAIRS=(rxe-rxe "${PAIRS[@]}") BASELINE_AUTO=1
if [ -z "${E2E_RESULTS:-}" ] && [ -d "$VR_TOP/out" ]; then
    # Default results dirs out/e2e-DATE: keep the last 5 (daemon pcaps are ~60 MB each).
    find "$VR_TOP/out" -maxdepth 1 -name 'e2e-*' -type d 2>/dev/null | sort | head -n -4 |
        xargs -r rm -rf --one-file-system
fi
RESULTS=${E2E_RESULTS:-$VR_TOP/out/e2e-$(date +%Y%m%d-%H%M%S)}
T_START=$SECONDS
SIZES=${E2E_SIZES:-1 1024 4096 65536}
ITERS=${E2E_ITERS:-200}
MTU=${E2E_MTU:-1024}
RUN_TIMEOUT=${E2E_RUN_TIMEOUT:-90}
GUEST_TIMEOUT=${E2E_GUEST_TIMEOUT:-900}
NS=vrnic-e2e-$$
mkdir -p "$RESULTS"
RESULTS=$(readlink -f "$RESULTS")
exec > >(tee -a "$RESULTS/summary.log") 2>&1

# shellcheck source=tests/e2e/containers.sh
. "$VR_TOP/tests/e2e/containers.sh"
# shellcheck source=tests/e2e/software.sh
. "$VR_TOP/tests/e2e/software.sh"

pass() { PASSED=$((PASSED + 1)); echo "PASS: $*"; }
FAILS=()
fail() { FAILED=$((FAILED + 1)); FAILS+=("$*"); echo "FAIL: $*"; }

need_vrnic=0
for p in "${PAIRS[@]}"; do
    case $p in
    rxe-rxe | qemu-select) ;;
    probe | vrnic-rxe | vrnic-vrnic | vrnic-rxe-lossy | vrnic-vrnic-lossy | vrnic-vrnic-pause | vrnic-vrnic-kill | vrnic-vrnic-restart | hostile-peer) need_vrnic=1 ;;
    soak-2min | heavy | pyverbs) need_vrnic=1 ;;
    ibv-rxe | ibv-ibv | ibv-ibv-switch | ibv-vrnic | containers | software) need_vrnic=1 ;;
    *) vr_die "unknown pair $p" ;;
    esac
done

vr_qemu_find
t0=$SECONDS
if [ $need_vrnic = 1 ] && [ "${E2E_NO_BUILD:-0}" != 1 ]; then vr_build_rust; fi
vr_images
if [ $need_vrnic = 1 ]; then
    vr_vrnic_image
fi
vr_qemu_setup
export VRNIC_GUEST_APPEND="vrnic.timeout=$GUEST_TIMEOUT ${VRNIC_GUEST_APPEND:-}"
# E2E_LINK_MTU (default 1500): the MTU of every link of the test network, the same for both kinds
# of guest: the TAPs and bridge, the guests' eth0 (an rxe guest's path MTU follows it: 4096 at
# 9000) and the daemons' --mtu. The tests' sizes assume 1500 (path MTU 1024): the jumbo runs are
# for perftest (scripts/bench.sh --guests).
LINK_MTU=${E2E_LINK_MTU:-1500}
if [ "$LINK_MTU" != 1500 ]; then
    VRNIC_GUEST_APPEND+=" vrnic.mtu=$LINK_MTU"
    export VRNIC_DAEMON_ARGS="--mtu $LINK_MTU ${VRNIC_DAEMON_ARGS:-}"
fi
vr_log "build/images: $((SECONDS - t0)) s; results in $RESULTS"

vr_netns_create "$NS"
for t in ga gb va vb; do vr_netns_tap "$NS" "tap-$t" "$LINK_MTU"; done

# Sizes of the vrnic-to-vrnic RDMA WRITE with immediate check (vrnic-write-imm, 10 writes each).
WRITE_IMM_SIZES=${E2E_WRITE_IMM_SIZES:-1 4097 65536}

# UD and SRQ ping-pongs after the RC matrix (ibv_ud_pingpong / ibv_srq_pingpong or ours).
XRUNS=${E2E_XRUNS-ud srq}
XITERS=${E2E_XITERS:-200}

# ibv pairs: after the RC matrix, per role, one RC run spinning on the CQ (the baseline) and one with
# completion events (-e), EVENT_SIZE bytes x EVENT_ITERS each. On a vrnic (ibv) side the -e run must
# be woken by the device's interrupt: the guest's uio_pci_generic interrupt count rises during it
# (both runs' CPU shares are reported, not judged: under TCG they vary too much to prove anything).
# Before that, the idle check (ibv sides): the event thread of an open but idle context, watched
# for E2E_IDLE_WINDOW seconds, must wake fewer than E2E_IDLE_MAX_WAKEUPS times (a 1 ms poll wakes
# ~1000 times a second); the same check with the library's polling fallback (VRNIC_PCI_NO_IRQ=1)
# is reported beside it.
EVENT_SIZE=${E2E_EVENT_SIZE:-4096}
EVENT_ITERS=${E2E_EVENT_ITERS:-1000}
IDLE_WINDOW=${E2E_IDLE_WINDOW:-3}
IDLE_MAX_WAKEUPS=${E2E_IDLE_MAX_WAKEUPS:-20}

# RDMA READ and atomics after that (vrnic-rdma / rxe-rdma-peer), one run per role: the server is
# the passive side (responder), the client the active one (requester). E2E_RDMA=0 skips them.
RDMA=${E2E_RDMA:-1}
RDMA_SIZES=${E2E_RDMA_SIZES:-1,4097,1048576}
RDMA_READS=${E2E_RDMA_READS:-2}
RDMA_FAA=${E2E_RDMA_FAA:-100}

# perftest in the rxe-rxe and ibv-* pairs: these tools, each in both roles, with these options
# (besides -x 1 and a port of its own). Figures land in RESULTS/perftest.csv and a table at the end.
PERF_TOOLS_ALL=${E2E_PERF_TOOLS:-ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw ib_write_lat ib_read_lat ib_send_lat ib_atomic_lat}
PERF_ARGS_ALL=${E2E_PERF_ARGS:--n 200}
# In the ibv-* pairs perftest runs again, each tool in both roles: with every size from 2 B to
# 8 MiB (-a; not the atomics, whose size is fixed at 8 B and which have no -a) and with 4 QPs
# (-q 4; the bandwidth tools only: the latency tools have no -q). Few iterations per size (perftest
# takes at least 5) to bound the time under TCG; ib_read_lat is left out of -a for time (about 14 s
# a run under TCG; READs of every size are in ib_read_bw -a). Only exit status and rows are judged,
# the rows go to RESULTS/perftest-sweep.csv. E2E_PERF_SWEEP=0 leaves them out.
# E2E_PERF_SWEEP=full adds the latency tools to -a (ib_write_lat, ib_send_lat: about 30 s a run
# against rxe under TCG), ib_read_bw and ib_send_bw -a and the 8 MiB runs to ibv-rxe, and the
# 8 MiB runs to ibv-ibv-switch (the switch's large messages run in tests/e2e/heavy.sh too); CI
# runs the default, E2E_PERF_SWEEP=1 (ibv-rxe: ib_write_bw -a only, no 8 MiB run).
PERF_ALL_TOOLS_ALL=${E2E_PERF_ALL_TOOLS-ib_write_bw ib_read_bw ib_send_bw}
[ "${E2E_PERF_SWEEP:-1}" = full ] && PERF_ALL_TOOLS_ALL=${E2E_PERF_ALL_TOOLS-ib_write_bw ib_read_bw ib_send_bw ib_write_lat ib_send_lat}
PERF_ALL_ARGS_ALL=${E2E_PERF_ALL_ARGS:--a -n 5}
PERF_QP_TOOLS_ALL=${E2E_PERF_QP_TOOLS-ib_write_bw ib_read_bw ib_send_bw ib_atomic_bw}
PERF_QP_ARGS_ALL=${E2E_PERF_QP_ARGS:--q 4 -n 100}
# And many QPs with large messages (issue 28: ib_write_bw -q 8 -a failed with RETRY_EXC_ERR under
# load), 5 iterations (perftest's least), both roles: the bandwidth tools with 8 QPs at 1 MiB
# (big, ~27 s a pair under TCG), and ib_write_bw with 8 QPs at 8 MiB (huge, ~50 s: with all three
# tools it took 140 s, mostly perftest filling 128 MiB of buffers with random() in each guest; READ
# and SEND at 8 MiB on 8 QPs run in tests/e2e/heavy.sh, between host processes). The client must
# report the one row of its -s size. Each big and huge run is bounded by 3 x E2E_RUN_TIMEOUT (an
# 8 MiB run against rxe took 77 s of the 90 on a loaded machine).
PERF_BIG_TOOLS_ALL=${E2E_PERF_BIG_TOOLS-ib_write_bw ib_read_bw ib_send_bw}
PERF_BIG_ARGS_ALL=${E2E_PERF_BIG_ARGS:--q 8 -s 1048576 -n 5}
PERF_HUGE_TOOLS_ALL=${E2E_PERF_HUGE_TOOLS-ib_write_bw}
PERF_HUGE_ARGS_ALL=${E2E_PERF_HUGE_ARGS:--q 8 -s 8388608 -n 5}
# And a long ib_send_lat (5000 ping-pongs, ~0.3 s): a doorbell left without a kick stalled it until
# an unrelated wake-up in most runs before the worker served late chains (DataPath::serve_late).
PERF_LONG_TOOLS_ALL=${E2E_PERF_LONG_TOOLS-ib_send_lat}
PERF_LONG_ARGS_ALL=${E2E_PERF_LONG_ARGS:--n 5000}

# ibv-ibv: registered memory stays in place under compaction (tests/e2e/peer/pin-check.c), then
# data-checked transfers (ibv_rc_pingpong -c, PIN_SIZE x PIN_ITERS; rxe-rdma-peer READs of
# PIN_RDMA_SIZES x PIN_RDMA_READS) while memory is compacted every 0.2 s. E2E_PIN=0 skips it.
PIN_SIZE=${E2E_PIN_SIZE:-1048576}
PIN_ITERS=${E2E_PIN_ITERS:-100}
PIN_RDMA_SIZES=${E2E_PIN_RDMA_SIZES:-4097,1048576}
PIN_RDMA_READS=${E2E_PIN_RDMA_READS:-32}

# job FILE NAME TOOL PEER_IP ROLES [WRITE_IMM_ROLE [RDMA_ROLES]]: writes a guest job (parameters +
# tests/e2e/guest-pp.sh).
job() {
    {
        echo "NAME=$2 TOOL=$3 PEER_IP=$4 ROLES='$5' SIZES='$SIZES' ITERS=$ITERS MTU=$MTU GID=1"
        echo "WRITE_IMM_ROLE='${6:-}' WRITE_IMM_SIZES='$WRITE_IMM_SIZES'"
        echo "XRUNS='$XRUNS' XITERS=$XITERS"
        echo "RDMA_ROLES='${7:-}' RDMA_SIZES='$RDMA_SIZES' RDMA_READS=$RDMA_READS RDMA_FAA=$RDMA_FAA"
        echo "BASEPORT=18515 RUN_TIMEOUT=$RUN_TIMEOUT CONNECT_WAIT=$((RUN_TIMEOUT + 120)) EXTRA='${E2E_EXTRA:-}'"
        echo "PERF_TOOLS='${PERF_TOOLS:-}' PERF_ARGS='${PERF_ARGS:-}'"
        echo "PERF_ALL_TOOLS='${PERF_ALL_TOOLS:-}' PERF_ALL_ARGS='${PERF_ALL_ARGS:-}'"
        echo "PERF_QP_TOOLS='${PERF_QP_TOOLS:-}' PERF_QP_ARGS='${PERF_QP_ARGS:-}'"
        echo "PERF_LONG_TOOLS='${PERF_LONG_TOOLS:-}' PERF_LONG_ARGS='${PERF_LONG_ARGS:-}'"
        echo "PERF_BIG_TOOLS='${PERF_BIG_TOOLS:-}' PERF_BIG_ARGS='${PERF_BIG_ARGS:-}'"
        echo "PERF_HUGE_TOOLS='${PERF_HUGE_TOOLS:-}' PERF_HUGE_ARGS='${PERF_HUGE_ARGS:-}'"
        echo "PIN_CHECK=${PIN_CHECK:-0} PIN_SIZE=$PIN_SIZE PIN_ITERS=$PIN_ITERS PIN_RDMA_SIZES=$PIN_RDMA_SIZES PIN_RDMA_READS=$PIN_RDMA_READS"
        echo "EVENT_ROLES='${EVENT_ROLES:-}' EVENT_SIZE=$EVENT_SIZE EVENT_ITERS=$EVENT_ITERS"
        echo "IDLE_CHECK=${IDLE_CHECK:-0} IDLE_WINDOW=$IDLE_WINDOW"
        echo "MULTI_ROLE='${MULTI_ROLE:-}'"
        cat "$VR_TOP/tests/e2e/guest-pp.sh"
    } >"$1"
}

# check_pcaps "WHAT|PCAP"...: tests/pcap_check.py (scapy ICRC + tshark dissection) on each PCAP,
# two at a time (a 60000-frame capture takes about a minute).
check_pcaps() {
    local item what f pids=() items=() i rc
    for item in "$@"; do
        what=${item%%|*} f=${item#*|}
        if [ ! -s "$f" ]; then fail "$what: no pcap $f"; continue; fi
        if [ ! -f "$VR_TOP/tests/pcap_check.py" ]; then fail "$what: tests/pcap_check.py missing"; continue; fi
        vr_spawn "$f.check" timeout 600 /usr/bin/python3 "$VR_TOP/tests/pcap_check.py" "$f"
        pids+=("$VR_LAST_PID")
        items+=("$item")
        if [ ${#pids[@]} -ge 2 ]; then
            collect_pcap "${pids[0]}" "${items[0]}"
            pids=("${pids[@]:1}") items=("${items[@]:1}")
        fi
    done
    for i in "${!pids[@]}"; do collect_pcap "${pids[$i]}" "${items[$i]}"; done
}
collect_pcap() {
    local pid=$1 what=${2%%|*} f=${2#*|} rc=0
    wait "$pid" || rc=$?
    vr_stop "$pid" # only drops it from the list: it has ended
    if [ $rc = 0 ]; then
        pass "$what pcap check: $(tail -1 "$f.check")"
    else
        fail "$what pcap check rc $rc (see $f.check): $(tail -1 "$f.check")"
    fi
}

# How the lossy pairs lose frames (E2E_LOSS):
# - nft (default): the bridge drops 1% of the RoCEv2 frames (UDP 4791) it forwards from and to
#   tap-va, vrnic daemon A's TAP: an nftables bridge rule with a random number per frame.
# - netem: `tc qdisc add dev TAP root netem loss 1%` on tap-va (frames towards vrnic daemon A)
#   and tap-gb (towards guest B, its peer): every frame, RoCEv2 or not. Needs sch_netem, which the
#   kernel this harness was developed on lacks (CONFIG_NET_SCH_NETEM is not set, modprobe finds
#   no module), so this mode is untested there.
LOSS=${E2E_LOSS:-nft}

# lossy_start: installs the loss (scripts/lib.sh, vr_loss_start); fails if it cannot.
lossy_start() { vr_loss_start "$NS" "$LOSS" tap-va tap-gb; }
# lossy_stop PAIR: removes the loss and reports how many frames it dropped towards vrnic and from
# it (towards its peer); a loss run must have lost some in each direction.
lossy_stop() {
    vr_loss_stop "$NS" "$LOSS" tap-va tap-gb
    local to=$VR_LOSS_TO from=$VR_LOSS_FROM
    if [ "$from" -gt 0 ] && [ "$to" -gt 0 ]; then
        pass "$1: 1% loss ($LOSS) dropped $to frames to vrnic and $from from vrnic"
    else
        fail "$1: the loss ($LOSS) dropped $to frames to vrnic and $from from it"
    fi
}

# run_pair PAIR: A = first kind at 10.0.0.1 (RoCE 10.0.0.101 if vrnic), B = second at 10.0.0.2.
# Kinds: rxe (Soft-RoCE guest, Debian's tools), vrnic (vrnic guest, vrnic's own tools), ibv (vrnic
# guest running Debian's unmodified tools on vrnic's libibverbs.so.1).
# PAIR-lossy: the same pair with 1% of vrnic A's RoCEv2 frames dropped both ways (lossy_start),
# RC ping-pong (E2E_LOSSY_SIZES) and RDMA READ/atomics only, so go-back-N, retransmission and
# the responders' duplicate handling (READ re-execution, atomic replay) must recover.
run_pair() {
    local pair=$1 dir=$RESULTS/$1 side kind ip tool roles peer daemons=() tp=$SECONDS
    local -A pid_of kind_of
    local base=${1%-lossy} lossy=0 one_daemon=0
    [ "$base" = "$pair" ] || lossy=1
    # PAIR-switch: both vrnic guests are functions of one daemon (side a's), through its switch.
    if [ "$base" != "${base%-switch}" ]; then
        base=${base%-switch} one_daemon=1
    fi
    if [[ $base == ibv-* || $base == *-ibv ]]; then
        # Debian's unmodified tools on vrnic's libibverbs.so.1: sizes 1, MTU+1 and 1 MiB, the
        # stock tools' own check (-c) on both sides (job() reads these).
        local SIZES=${E2E_IBV_SIZES:-1 1025 1048576} ITERS=${E2E_IBV_ITERS:-20} E2E_EXTRA="-c"
        local EVENT_ROLES=set
    fi
    # perftest (Debian's, unmodified) in the pairs whose figures are compared: rxe-rxe, ibv-rxe,
    # ibv-ibv (same QEMU, same accelerator, same run); E2E_PERF=0 leaves it out.
    local PERF_TOOLS='' PERF_ARGS=''
    if [ $lossy = 0 ] && [ "${E2E_PERF:-1}" = 1 ] && [[ $pair == rxe-rxe || $pair == ibv-* ]]; then
        PERF_TOOLS=$PERF_TOOLS_ALL PERF_ARGS=$PERF_ARGS_ALL
    fi
    if [ "$pair" = rxe-rxe ] && [ $BASELINE_AUTO = 1 ] && [ "${E2E_BASELINE_PERF:-0}" != 1 ]; then
        PERF_TOOLS='' PERF_ARGS=''
    fi
    # The -a, -q 4 and -q 8 large-message (big, huge) sweeps in the ibv pairs (both sides run them).
    local PERF_ALL_TOOLS='' PERF_ALL_ARGS='' PERF_QP_TOOLS='' PERF_QP_ARGS='' PERF_LONG_TOOLS='' PERF_LONG_ARGS=''
    local PERF_BIG_TOOLS='' PERF_BIG_ARGS='' PERF_HUGE_TOOLS='' PERF_HUGE_ARGS=''
    if [ $lossy = 0 ] && [ "${E2E_PERF:-1}" = 1 ] && [ "${E2E_PERF_SWEEP:-1}" != 0 ] && [[ $pair == ibv-* ]]; then
        PERF_ALL_TOOLS=$PERF_ALL_TOOLS_ALL PERF_ALL_ARGS=$PERF_ALL_ARGS_ALL
        PERF_QP_TOOLS=$PERF_QP_TOOLS_ALL PERF_QP_ARGS=$PERF_QP_ARGS_ALL
        PERF_BIG_TOOLS=$PERF_BIG_TOOLS_ALL PERF_BIG_ARGS=$PERF_BIG_ARGS_ALL
        if [ "$pair" = ibv-ibv ] || [ "${E2E_PERF_SWEEP:-1}" = full ]; then
            PERF_HUGE_TOOLS=$PERF_HUGE_TOOLS_ALL PERF_HUGE_ARGS=$PERF_HUGE_ARGS_ALL
        fi
        # Against rxe, CI's sweep is ib_write_bw -a (every size across the MTU boundaries, rxe's
        # responder on the other side) and -q 4 / -q 8 at 1 MiB; READ and SEND -a and the 8 MiB
        # run take rxe under TCG about 2 minutes more and run between vrnic guests (ibv-ibv), host
        # processes (heavy) and here with E2E_PERF_SWEEP=full.
        if [ "$pair" = ibv-rxe ] && [ "${E2E_PERF_SWEEP:-1}" != full ] && [ -z "${E2E_PERF_ALL_TOOLS+x}" ]; then
            PERF_ALL_TOOLS=ib_write_bw
        fi
    fi
    # The long run: in the ibv pairs, sweep or not.
    if [ $lossy = 0 ] && [ "${E2E_PERF:-1}" = 1 ] && [[ $pair == ibv-* ]]; then
        PERF_LONG_TOOLS=$PERF_LONG_TOOLS_ALL PERF_LONG_ARGS=$PERF_LONG_ARGS_ALL
    fi
    # The compaction check where both guests run vrnic's libibverbs.so.1.
    local PIN_CHECK=0
    [ "$pair" = ibv-ibv ] && [ "${E2E_PIN:-1}" = 1 ] && PIN_CHECK=1
    if [ $lossy = 1 ]; then
        # Seen by job() and the checks: fewer sizes, no UD/SRQ runs (UD has no recovery; stock tools
        # would hang); the RDMA READ/atomic runs stay (E2E_LOSSY_RDMA=0 drops them).
        local SIZES=${E2E_LOSSY_SIZES:-4096 65536} XRUNS='' RDMA=${E2E_LOSSY_RDMA:-$RDMA}
        if ! lossy_start; then
            fail "$pair: cannot install the loss (E2E_LOSS=$LOSS)"
            return 0
        fi
    fi
    mkdir -p "$dir"
    echo "=== $pair"
    local capture=
    if [ "$pair" = rxe-rxe ] && command -v dumpcap >/dev/null; then
        # Baseline: rxe's own frames must pass the pcap checker too (checks the checker).
        vr_spawn "$dir/dumpcap.log" ip netns exec "$NS" dumpcap -q -P -i tap-ga -c 3000 -w "$dir/rxe-a.pcap"
        capture=$VR_LAST_PID
        sleep 1
    fi
    for side in a b; do
        if [ $side = a ]; then kind=${base%-*} ip=10.0.0.1 peer=10.0.0.2 roles="server client"
        else kind=${base#*-} ip=10.0.0.2 peer=10.0.0.1 roles="client server"; fi
        kind_of[$side]=$kind
        if [ "$kind" = vrnic ] || [ "$kind" = ibv ]; then
            tool=vrnic-pingpong
            [ "$kind" = ibv ] && tool=ibv_rc_pingpong
            # Captures are checked in the vrnic pairs; the ibv pairs test the library, and their
            # 1 MiB messages and perftest would make ~120,000-frame captures (minutes to check).
            local pcap=$dir/vrnic-$side.pcap
            [ "$kind" = ibv ] && pcap=
            local VR_DAEMON_EXTRA=()
            # One daemon for both: side a's serves side b's socket and address as a second function.
            [ $one_daemon = 1 ] && VR_DAEMON_EXTRA=(--function "socket=$dir/vrnic-b.sock,ip=10.0.0.102/24")
            if [ $one_daemon = 1 ] && [ $side = b ]; then
                :
            elif ! vr_daemon "vrnic-$side" "$NS" "$dir/vrnic-$side.sock" "tap-v$side" "10.0.0.10${ip##*.}/24" \
                "$dir" $pcap; then
                fail "$pair: daemon vrnic-$side did not start (log $dir/vrnic-$side.log)"
                [ ${#daemons[@]} = 0 ] || vr_stop "${daemons[@]}"
                [ -n "$capture" ] && vr_stop "$capture"
                [ "$side" = b ] && vr_stop "${pid_of[a]}"
                return 0
            else
                daemons+=("$VR_LAST_PID")
            fi
        else
            tool=ibv_rc_pingpong
        fi
        local wroles=
        if [ "$pair" = vrnic-vrnic ]; then
            if [ $side = a ]; then wroles=server; else wroles=client; fi
        fi
        local rroles=
        [ "$RDMA" = 1 ] && rroles=$roles
        local EVENT_ROLES=${EVENT_ROLES:+$roles} IDLE_CHECK=0
        [ "$kind" = ibv ] && IDLE_CHECK=1
        # Several programs on one device through the guest agent, one killed: the ibv guest of
        # side a serves, side b's guest (rxe or ibv) runs the clients.
        local MULTI_ROLE=
        if [ $lossy = 0 ] && [ "${kind_of[a]}" = ibv ]; then
            if [ $side = a ]; then MULTI_ROLE=server; else MULTI_ROLE=client; fi
        fi
        job "$dir/job-$side.sh" "$pair-$side" "$tool" "$peer" "$roles" "$wroles" "$rroles"
        local image=$kind
        [ "$kind" = ibv ] && image=vrnic
        vr_guest "$side" "$image" "$NS" "tap-g$side" "$ip/24" "$dir/job-$side.sh" "$dir" \
            "$dir/vrnic-$side.sock"
        pid_of[$side]=$VR_LAST_PID
    done
    for side in a b; do
        if vr_wait_job "$side" "$dir" "${pid_of[$side]}" $((GUEST_TIMEOUT + 180)); then
            pass "$pair guest $side (${kind_of[$side]}) job exit 0"
        else
            fail "$pair guest $side (${kind_of[$side]}) job: $VR_JOB_RC (console $dir/$side.log)"
        fi
    done
    # Per-run results, as the guests reported them.
    for side in a b; do
        # The stock tools' -c only prints what it finds wrong.
        if grep -aq 'invalid data in page' "$dir/$side.log"; then
            fail "$pair $side: $(grep -a -c 'invalid data in page' "$dir/$side.log") 'invalid data in page' lines (-c)"
        fi
        local want=$(($(wc -w <<<"$SIZES") * 2)) got=0 line
        while read -r line; do
            got=$((got + 1))
            # VRNIC-RESULT name role size=S rc=R tool=T usec_per_iter=U verified=V
            # shellcheck disable=SC2086
            set -- $line
            local what="$pair $side ${kind_of[$side]} $3 $4 $7 ${9:-}"
            if [ "$5" != rc=0 ]; then fail "$what $5"
            elif [ "$6" = tool=vrnic-pingpong ] && [ "$8" != verified=yes ]; then fail "$what: data not verified"
            elif [ "${kind_of[$side]}" = ibv ]; then pass "$what (Debian's ibv_rc_pingpong on vrnic's libibverbs.so.1)"
            elif [ "$6" = tool=vrnic-pingpong ]; then pass "$what, data verified"
            else pass "$what"; fi
        done < <(grep -a '^VRNIC-RESULT ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want runs reported"
        # Completion events (-e): VRNIC-ERESULT name role size=S rc=R cpu_pct=P wall_cs=W irqs=N mode=M
        want=0 got=0
        [ -n "${EVENT_ROLES:-}" ] && want=4
        local spin_cpu=
        while read -r line; do
            got=$((got + 1))
            # shellcheck disable=SC2086
            set -- $line
            local cpu=${6#cpu_pct=} irqs=${8#irqs=} mode=${9#mode=}
            local ewhat="$pair $side ${kind_of[$side]} $3 $4 $mode: $5, CPU $cpu% of ${7#wall_cs=} cs wall, irqs $irqs"
            if [ "$5" != rc=0 ]; then fail "$ewhat"
            elif [ "$mode" = spin ]; then spin_cpu=$cpu; pass "$ewhat (baseline: polls the CQ)"
            elif [ "${kind_of[$side]}" != ibv ]; then pass "$ewhat (rxe)"
            elif ! [[ $irqs =~ ^[0-9]+$ ]] || [ "$irqs" -eq 0 ]; then
                fail "$ewhat: no uio_pci_generic interrupt during the run"
            else
                # CPU shares under TCG are a figure, not a verdict (a short run is mostly start-up,
                # and the spinning run's share varies from 40 to 105%); the idle check below is
                # the deterministic proof that nothing polls.
                pass "$ewhat: woken by the device's interrupt (spinning run: ${spin_cpu:-?}% CPU)"
            fi
        done < <(grep -a '^VRNIC-ERESULT ' "$dir/$side.log" | tr -d '\r')
        # Idle: VRNIC-IDLE name found=F window_cs=W wakeups=N cpu_cs=C irqs=I mode=irq|poll
        local iwant=0 igot=0
        [ "${kind_of[$side]}" = ibv ] && iwant=2
        while read -r line; do
            igot=$((igot + 1))
            # shellcheck disable=SC2086
            set -- $line
            local wk=${5#wakeups=} imode=${8#mode=}
            local iwhat="$pair $side idle event thread ($imode): $4, $5, $6, $7"
            if [ "$3" != found=yes ] || ! [[ $wk =~ ^[0-9]+$ ]]; then fail "$iwhat: $3"
            elif [ "$imode" = poll ]; then pass "$iwhat (VRNIC_PCI_NO_IRQ=1: the 1 ms polling fallback, for comparison)"
            elif [ "$wk" -ge "$IDLE_MAX_WAKEUPS" ]; then fail "$iwhat: not asleep (>= $IDLE_MAX_WAKEUPS wake-ups)"
            else pass "$iwhat: asleep on the interrupt"; fi
        done < <(grep -a '^VRNIC-IDLE ' "$dir/$side.log" | tr -d '\r')
        [ "$igot" = "$iwant" ] || fail "$pair $side: $igot of $iwant idle checks reported"
        # VRNIC-LIB name lib=PATH devices=NAMES (ibv sides): what `ldd` and `ibv_devices` show.
        if [ "${kind_of[$side]}" = ibv ]; then
            line=$(grep -a -m1 '^VRNIC-LIB ' "$dir/$side.log" | tr -d '\r') || line=
            if [[ $line == *" lib=/usr/lib/vrnic/libibverbs.so.1 devices=vrnic0,"* ]]; then
                pass "$pair $side: ldd and ibv_devices show vrnic's library and device (${line#VRNIC-LIB * })"
            else
                fail "$pair $side: ldd/ibv_devices: ${line:-no VRNIC-LIB line}"
            fi
        fi
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want completion-event (-e) runs reported"
        want=$(($(wc -w <<<"$XRUNS") * 2)) got=0
        while read -r line; do
            got=$((got + 1))
            # VRNIC-XRESULT name ud|srq role rc=R verified=V
            # shellcheck disable=SC2086
            set -- $line
            local xwhat="$pair $side ${kind_of[$side]} $3-pingpong $4"
            if [ "$5" != rc=0 ]; then fail "$xwhat $5"
            elif [ "$6" = verified=no ]; then fail "$xwhat: data not verified"
            elif [ "$6" = verified=yes ]; then pass "$xwhat, data verified"
            else pass "$xwhat"; fi
        done < <(grep -a '^VRNIC-XRESULT ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want UD/SRQ runs reported"
        # RDMA READ and atomics: each side runs once passive (one line) and once active (one line
        # per READ size, plus fetch-add and cmp-swap); the peer is the other side's kind.
        local other=b
        [ $side = a ] || other=a
        want=0 got=0
        [ "$RDMA" = 1 ] && want=$(($(tr ',' ' ' <<<"$RDMA_SIZES" | wc -w) + 3))
        while read -r line; do
            got=$((got + 1))
            # VRNIC-RDMA name active|passive check rc=R verified=V
            # shellcheck disable=SC2086
            set -- $line
            local rwhat="$pair $side ${kind_of[$side]} rdma $3 $4 (${kind_of[$other]} peer)"
            if [ "$5" = rc=0 ] && [ "$6" = verified=yes ]; then pass "$rwhat, verified"
            else fail "$rwhat $5 $6"; fi
        done < <(grep -a '^VRNIC-RDMA ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want RDMA READ/atomic checks reported"
        want=$(($(wc -w <<<"$PERF_TOOLS") * 2)) got=0
        while read -r line; do
            got=$((got + 1))
            # VRNIC-PERF name tool role rc=R bytes=B value=V unit=U
            # shellcheck disable=SC2086
            set -- $line
            local pwhat="$pair $side ${kind_of[$side]} $3 $4"
            if [ "$5" = rc=0 ]; then pass "$pwhat ${7#value=} ${8#unit=} (${6#bytes=} B)"; else fail "$pwhat $5"; fi
            echo "$pair,$side,${kind_of[$side]},${kind_of[$other]},$3,$4,${6#bytes=},${7#value=},${8#unit=}" >>"$RESULTS/perftest.csv"
        done < <(grep -a '^VRNIC-PERF ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want perftest runs reported"
        # Several programs through the guest agent: VRNIC-MULTI name check ok=yes|no details...
        want=0 got=0
        if [ $lossy = 0 ] && [ "${kind_of[a]}" = ibv ]; then
            want=2
            [ $side = a ] && want=4
        fi
        while read -r line; do
            got=$((got + 1))
            # shellcheck disable=SC2086
            set -- $line
            local mwhat="$pair $side ${kind_of[$side]} several programs: $3 ${*:5}"
            if [ "$4" = ok=yes ]; then pass "$mwhat"; else fail "$mwhat $4"; fi
        done < <(grep -a '^VRNIC-MULTI ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want several-programs checks reported"
        # The sweeps: VRNIC-PERFX name tool role all|qp|long|big|huge rc=R rows=N bytes=FIRST-LAST
        want=$((($(wc -w <<<"$PERF_ALL_TOOLS $PERF_QP_TOOLS $PERF_LONG_TOOLS $PERF_BIG_TOOLS $PERF_HUGE_TOOLS")) * 2)) got=0
        while read -r line; do
            got=$((got + 1))
            # shellcheck disable=SC2086
            set -- $line
            local args rows=${7#rows=} size
            case $5 in
            all) args=$PERF_ALL_ARGS ;;
            long) args=$PERF_LONG_ARGS ;;
            big) args=$PERF_BIG_ARGS ;;
            huge) args=$PERF_HUGE_ARGS ;;
            *) args=$PERF_QP_ARGS ;;
            esac
            # The -s size of big and huge: the client's one row must be that size.
            size=$(awk '{ for (i = 1; i < NF; i++) if ($i == "-s") print $(i + 1) }' <<<"$args")
            local xwhat="$pair $side ${kind_of[$side]} $3 $args $4 (${kind_of[$other]} peer)"
            if [ "$6" != rc=0 ]; then fail "$xwhat $6"
            elif [ "$4" = client ] && [ "$5" = all ] && [ "$rows" != 23 ]; then
                fail "$xwhat: $rows sizes reported, not the 23 from 2 B to 8 MiB"
            elif [ "$4" = client ] && [ "$rows" -lt 1 ]; then fail "$xwhat: no result row"
            elif [ "$4" = client ] && [[ $5 == big || $5 == huge ]] && [ -n "$size" ] && [ "${8#bytes=}" != "$size-$size" ]; then
                fail "$xwhat: rows of ${8#bytes=} B, not the one of $size B"
            else pass "$xwhat: $rows sizes, ${8#bytes=} B"; fi
        done < <(grep -a '^VRNIC-PERFX ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want perftest -a/-q/long/big/huge runs reported"
        [ "$want" = 0 ] || vr_log "$pair $side: the perftest -a/-q/long/big/huge runs took $(grep -a '^VRNIC-PERFX ' "$dir/$side.log" |
            tr -d '\r' | awk '{ sub("cs=", "", $NF); t += $NF } END { printf "%.0f", t / 100 }') s"
        # (awk, not a grep pipeline: no row must not end the script under set -e -o pipefail)
        [ "$want" = 0 ] || tr -d '\r' <"$dir/$side.log" |
            awk -v p="$pair" -v s="$side" -v k="${kind_of[$side]}" -v o="${kind_of[$other]}" \
                '/^VRNIC-PERFROW / { print p "," s "," k "," o "," $3 "," $4 "," $5 "," $6 "," $7 }' >>"$RESULTS/perftest-sweep.csv"
        # Compaction: VRNIC-PIN name check rc=R registered_moved=.. ... second_open=S
        #             VRNIC-PIN name transfer role rc=R verified=V compactions=N migrated=M what...
        want=0 got=0
        [ "$PIN_CHECK" = 1 ] && want=6
        while read -r line; do
            got=$((got + 1))
            # shellcheck disable=SC2086
            set -- $line
            if [ "$3" = check ]; then
                local figs=${line#* check }
                if [ "$4" = rc=0 ] && [[ $figs == *" registered_moved=0 "* ]] && [[ $figs == *" data=intact"* ]]; then
                    pass "$pair $side pin-check: registered pages kept their PFNs under compaction: $figs"
                else
                    fail "$pair $side pin-check: $figs (console $dir/$side.log)"
                fi
            elif [ "$3" = unguarded ]; then
                # Without the sysctl the library's io_uring pins alone must hold the pages
                # (the control buffer, not registered, may move).
                local ufigs=${line#* unguarded }
                if [ "$4" = rc=0 ] && [[ $ufigs == *"registered_moved=0 "* ]] && [[ $ufigs == *" data=intact"* ]]; then
                    pass "$pair $side pin-check with compact_unevictable_allowed=1: the pins alone kept every registered page: $ufigs"
                else
                    fail "$pair $side pin-check with compact_unevictable_allowed=1: $ufigs"
                fi
            else
                local twhat="$pair $side ${kind_of[$side]} under compaction $4: ${line#* migrated=* }, ${7#compactions=} compactions, ${8#migrated=} pages migrated"
                if [ "$5" = rc=0 ] && [ "$6" = verified=yes ] && [ "${7#compactions=}" -gt 0 ]; then
                    pass "$twhat, data verified"
                else
                    fail "$twhat: $5 $6"
                fi
            fi
        done < <(grep -a '^VRNIC-PIN ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want compaction checks reported"
        [ "$pair" = vrnic-vrnic ] || continue
        want=$(wc -w <<<"$WRITE_IMM_SIZES") got=0
        while read -r line; do
            got=$((got + 1))
            # VRNIC-WRITEIMM name role size=S rc=R verified=V
            # shellcheck disable=SC2086
            set -- $line
            if [ "$5" = rc=0 ] && [ "$6" = verified=yes ]; then
                pass "$pair $side write-imm $3 $4: RDMA WRITE with immediate checked byte for byte"
            else
                fail "$pair $side write-imm $3 $4 $5 $6"
            fi
        done < <(grep -a '^VRNIC-WRITEIMM ' "$dir/$side.log" | tr -d '\r')
        [ "$got" = "$want" ] || fail "$pair $side: $got of $want write-imm runs reported"
    done
    [ $lossy = 0 ] || lossy_stop "$pair"
    [ $one_daemon = 1 ] || check_super_frames "$pair" "$dir" "${kind_of[a]}" "${kind_of[b]}"
    # Stop the daemons (the guests are gone), then check their captures.
    [ ${#daemons[@]} = 0 ] || vr_stop "${daemons[@]}"
    local pcaps=()
    if [ -n "$capture" ]; then
        vr_stop "$capture"
        pcaps+=("$pair a (rxe, captured on tap-ga)|$dir/rxe-a.pcap")
    fi
    for side in a b; do
        [ "${kind_of[$side]}" = vrnic ] && pcaps+=("$pair $side (vrnic daemon)|$dir/vrnic-$side.pcap")
    done
    [ ${#pcaps[@]} = 0 ] || check_pcaps "${pcaps[@]}"
    echo "=== $pair took $((SECONDS - tp)) s"
}

# run_probe: one vrnic guest and its daemon; the guest runs vrnic-probe (device config, port, GID).
PROBE_OK=1
run_probe() {
    local dir=$RESULTS/probe daemon tp=$SECONDS
    mkdir -p "$dir"
    echo "=== probe"
    if ! vr_daemon vrnic-a "$NS" "$dir/vrnic-a.sock" tap-va 10.0.0.101/24 "$dir" "$dir/vrnic-a.pcap"; then
        PROBE_OK=0
        fail "probe: daemon did not start (log $dir/vrnic-a.log)"
        return 0
    fi
    daemon=$VR_LAST_PID
    # shellcheck disable=SC2016 # the guest expands them
    printf '%s\n' 'vrnic-probe; rc=$?' 'echo "VRNIC-RESULT probe rc=$rc"' 'exit $rc' >"$dir/job-a.sh"
    vr_guest a vrnic "$NS" tap-ga 10.0.0.1/24 "$dir/job-a.sh" "$dir" "$dir/vrnic-a.sock"
    if vr_wait_job a "$dir" "$VR_LAST_PID" "${E2E_PROBE_TIMEOUT:-180}" && grep -aq '^probe: ok' "$dir/a.log"; then
        pass "probe: vrnic-probe in a vrnic guest ($(grep -a -c '^config\.' "$dir/a.log") config lines)"
    else
        PROBE_OK=0
        fail "probe: vrnic-probe job $VR_JOB_RC: $(tr -d '\r' <"$dir/a.log" | grep -a -m1 '^probe:' || echo 'no probe: line') (console $dir/a.log, daemon $dir/vrnic-a.log)"
    fi
    vr_stop "$daemon"
    echo "=== probe took $((SECONDS - tp)) s"
}

# check_super_frames PAIR DIR KIND_A KIND_B: every vrnic daemon of the pair sent runs of frames to
# its TAP as UDP super-frames (link::uso), and read whole the ones the other side's daemon sent
# (the bridge forwards them whole to a TAP that asked for the offload; rxe never sends them). A
# kernel that refuses the TAP offload (before Linux 6.2; the daemon says so) is reported, not failed.
check_super_frames() {
    local pair=$1 dir=$2 side kind other tx rx
    for side in a b; do
        if [ $side = a ]; then kind=$3 other=$4; else kind=$4 other=$3; fi
        case $kind in vrnic | ibv) ;; *) continue ;; esac
        if grep -q 'no UDP segmentation offload' "$dir/vrnic-$side.log" 2>/dev/null; then
            echo "note: $pair $side: the kernel refused the TAP's UDP segmentation offload"
            continue
        fi
        tx=$(stat_of "$dir/vrnic-$side.sock" link_tx_super)
        rx=$(stat_of "$dir/vrnic-$side.sock" link_rx_super)
        case $other in vrnic | ibv) ;; *) rx=peer-not-vrnic ;; esac
        if [ "${tx:-0}" -gt 0 ] && { [ "$rx" = peer-not-vrnic ] || [ "${rx:-0}" -gt 0 ]; }; then
            local what="sent $tx"
            [ "$rx" = peer-not-vrnic ] || what+=", read whole $rx"
            pass "$pair $side: the daemon's TAP carried UDP super-frames ($what)"
        else
            fail "$pair $side: UDP super-frames sent ${tx:-none}, read whole ${rx:-none}"
        fi
    done
}

# stat_of DAEMON_SOCK NAME: the counter NAME from `vrnic stats` of the daemon at DAEMON_SOCK (empty
# if it cannot be read).
stat_of() {
    "${VRNIC_BIN:-$VR_TOP/target/debug/vrnic}" stats --socket "$1" 2>/dev/null | awk -v n="$2" '$1 == n { print $2 }'
}

# run_pause: a VM pause in the middle of an RC ping-pong between two vrnic guests. A is the server,
# B the client (vrnic-pingpong, 4 KiB x E2E_PAUSE_ITERS, every message verified, QP timeout 18:
# 1.07 s x 8 tries, so the connection can ride out the pause). Once daemon A has carried
# E2E_PAUSE_AFTER bytes of the run, guest A is paused (QMP stop) for E2E_PAUSE_SECS and resumed
# (cont). Passes when both sides finish with all data verified, daemon A counted the stop and the
# resume, and its QP was still in its table while paused.
PAUSE_ITERS=${E2E_PAUSE_ITERS:-3000}
PAUSE_SECS=${E2E_PAUSE_SECS:-3}
PAUSE_AFTER=${E2E_PAUSE_AFTER:-1048576}
run_pause() {
    local dir=$RESULTS/vrnic-vrnic-pause side ip peer role pid_a pid_b daemons=() tp=$SECONDS
    local sock_a=$dir/vrnic-a.sock rx=0 qps
    mkdir -p "$dir"
    echo "=== vrnic-vrnic-pause"
    for side in a b; do
        if [ $side = a ]; then ip=10.0.0.1 peer=10.0.0.2 role=server; else ip=10.0.0.2 peer=10.0.0.1 role=client; fi
        if ! vr_daemon "vrnic-$side" "$NS" "$dir/vrnic-$side.sock" "tap-v$side" "10.0.0.10${ip##*.}/24" "$dir"; then
            fail "vrnic-vrnic-pause: daemon vrnic-$side did not start (log $dir/vrnic-$side.log)"
            [ ${#daemons[@]} = 0 ] || vr_stop "${daemons[@]}" "${pid_a:-}"
            return 0
        fi
        daemons+=("$VR_LAST_PID")
        local SIZES=4096 ITERS=$PAUSE_ITERS XRUNS='' E2E_EXTRA="--qp-timeout 18"
        job "$dir/job-$side.sh" "pause-$side" vrnic-pingpong "$peer" "$role"
        vr_guest "$side" vrnic "$NS" "tap-g$side" "$ip/24" "$dir/job-$side.sh" "$dir" "$dir/vrnic-$side.sock"
        if [ $side = a ]; then pid_a=$VR_LAST_PID; else pid_b=$VR_LAST_PID; fi
    done
    # Wait (bounded) until the run is well under way: A's daemon has received PAUSE_AFTER bytes.
    for _ in $(seq $((GUEST_TIMEOUT * 10))); do
        rx=$(stat_of "$sock_a" rx_bytes)
        [ "${rx:-0}" -ge "$PAUSE_AFTER" ] && break
        grep -aq '^VRNIC-JOB-EXIT' "$dir/a.log" "$dir/b.log" 2>/dev/null && break
        sleep 0.1
    done
    if [ "${rx:-0}" -lt "$PAUSE_AFTER" ]; then
        fail "vrnic-vrnic-pause: the run never got under way (daemon A rx_bytes ${rx:-none})"
    elif ! vr_qmp "$dir/a.qmp" stop; then
        fail "vrnic-vrnic-pause: QMP stop failed"
    else
        vr_log "guest a paused at rx_bytes $rx for $PAUSE_SECS s"
        sleep "$PAUSE_SECS" # the pause itself, not a synchronisation
        qps=$("${VRNIC_BIN:-$VR_TOP/target/debug/vrnic}" stats --socket "$sock_a" 2>/dev/null | grep -c '^qp_[0-9]*_tx_bytes ') || true
        local stops=$(stat_of "$sock_a" device_stops)
        vr_qmp "$dir/a.qmp" cont || fail "vrnic-vrnic-pause: QMP cont failed"
        if [ "${stops:-0}" = 1 ] && [ "${qps:-0}" -ge 1 ]; then
            pass "vrnic-vrnic-pause: paused guest A's device stopped with its QP kept ($qps in its table)"
        else
            fail "vrnic-vrnic-pause: while paused, device_stops ${stops:-none}, QPs in the table ${qps:-none}"
        fi
    fi
    for side in a b; do
        local pid=$pid_a
        [ $side = b ] && pid=$pid_b
        if vr_wait_job "$side" "$dir" "$pid" $((GUEST_TIMEOUT + 180)); then
            pass "vrnic-vrnic-pause guest $side job exit 0"
        else
            fail "vrnic-vrnic-pause guest $side job: $VR_JOB_RC (console $dir/$side.log)"
        fi
        local line
        line=$(grep -a '^VRNIC-RESULT ' "$dir/$side.log" | tr -d '\r' | tail -1) || true
        case $line in
        *" rc=0 "*" verified=yes"*) pass "vrnic-vrnic-pause $side: $PAUSE_ITERS x 4096 B across the pause, data verified" ;;
        *) fail "vrnic-vrnic-pause $side: ${line:-no result line}" ;;
        esac
    done
    # A reset in between would have destroyed the QP and failed the run; the daemon also says so.
    local resumes
    resumes=$(stat_of "$sock_a" device_resumes)
    if [ "${resumes:-0}" = 1 ] && grep -q 'control queue restarted where it stopped: device resumed' "$dir/vrnic-a.log"; then
        pass "vrnic-vrnic-pause: daemon A resumed the device with its state ($(stat_of "$sock_a" rx_dropped_stopped) frames dropped while stopped)"
    else
        fail "vrnic-vrnic-pause: daemon A device_resumes ${resumes:-none} (log $dir/vrnic-a.log)"
    fi
    vr_stop "${daemons[@]}"
    echo "=== vrnic-vrnic-pause took $((SECONDS - tp)) s"
}

# run_hostile: an independent hostile peer (tests/e2e/hostile-peer.py: scapy, not vrnic's code) on
# a host of its own on the bridge (10.0.0.3, namespace NS-h) plays an ibv_rc_pingpong client
# against vrnic-pingpong serving in vrnic guest A, and between legitimate iterations sends bad
# ICRCs, truncations, reserved opcodes, foreign P_Keys, spoofed sources (SEND, WRITE, forged
# ACK/NAKs), ARP floods, out-of-window PSNs and floods, checking after each that the server still
# serves; last an RDMA WRITE with a guessed
# R_Key, which must get a fatal NAK. Then the server must have failed cleanly (a completion
# error, no data error: nothing hostile was taken for data) and daemon A must have counted the
# drops by class in `vrnic stats`. Before that, where the image has vrnic's librdmacm.so.1, the CM
# classes: tests/e2e/cm-hostile-peer.py against rping -P in the guest (tests/e2e/README.md).
run_hostile() {
    local dir=$RESULTS/hostile-peer nsh=$NS-h daemon pid line tp=$SECONDS
    mkdir -p "$dir"
    echo "=== hostile-peer"
    if ! vr_daemon vrnic-a "$NS" "$dir/vrnic-a.sock" tap-va 10.0.0.101/24 "$dir"; then
        fail "hostile-peer: daemon did not start (log $dir/vrnic-a.log)"
        return 0
    fi
    daemon=$VR_LAST_PID
    vr_netns_create "$nsh"
    ip link add hA netns "$nsh" type veth peer name hA-br netns "$NS"
    ip -n "$NS" link set hA-br master br0 up
    ip -n "$nsh" addr add 10.0.0.3/24 dev hA
    ip -n "$nsh" link set hA up
    local SIZES=512 ITERS=1000000 XRUNS='' E2E_EXTRA=''
    job "$dir/job-a.sh" hostile-a vrnic-pingpong 10.0.0.3 server
    # The CM classes (issue 31) first: an rdma_cm server, Debian's rping on vrnic's
    # librdmacm.so.1 (where the package ships it) and the guest agent's CM. rping exits at the
    # first error event, here the REJ cm-hostile-peer.py ends with; then the agent, which holds
    # the device while a program uses it, lingers 10 s, and vrnic-pingpong (its own driver) can
    # open the device.
    {
        echo 'if [ -e /usr/lib/vrnic/librdmacm.so.1 ] && command -v rping >/dev/null; then'
        echo '    echo "VRNIC-CM rping-server started"'
        echo '    timeout 150 rping -s -P -a 10.0.0.101 -p 7174 2>&1 | sed "s/^/RPING /"'
        echo '    i=0'
        echo '    while pgrep -x vrnic-agent >/dev/null && [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done'
        echo '    echo "VRNIC-CM device free"'
        echo 'else'
        echo '    echo "VRNIC-CM skip: no /usr/lib/vrnic/librdmacm.so.1 (or rping) in the image"'
        echo 'fi'
        cat "$dir/job-a.sh"
    } >"$dir/job-a.cm" && mv "$dir/job-a.cm" "$dir/job-a.sh"
    vr_guest a vrnic "$NS" tap-ga 10.0.0.1/24 "$dir/job-a.sh" "$dir" "$dir/vrnic-a.sock"
    pid=$VR_LAST_PID
    local rc=0 cm='' t0
    t0=$SECONDS
    while [ $((SECONDS - t0)) -lt 180 ]; do
        cm=$(grep -a -m1 '^VRNIC-CM ' "$dir/a.log" 2>/dev/null | tr -d '\r') || true
        [ -n "$cm" ] && break
        sleep 0.5
    done
    case $cm in
    "VRNIC-CM rping-server started")
        t0=$SECONDS
        timeout -k 5 240 ip netns exec "$nsh" /usr/bin/python3 "$VR_TOP/tests/e2e/cm-hostile-peer.py" \
            --iface hA --ip 10.0.0.3 --server 10.0.0.101 --port 7174 >"$dir/cm-hostile.log" 2>&1 || rc=$?
        echo "cm-hostile-peer.py exit $rc in $((SECONDS - t0)) s (log $dir/cm-hostile.log)"
        while IFS= read -r line; do
            case $line in
            "HOSTILE "*" ok"*) pass "hostile-peer: ${line#HOSTILE }" ;;
            "HOSTILE "*) fail "hostile-peer: ${line#HOSTILE }" ;;
            esac
        done <"$dir/cm-hostile.log"
        grep -q '^HOSTILE-CM-RESULT .* failed=0$' "$dir/cm-hostile.log" ||
            fail "hostile-peer: cm: $(grep -a '^HOSTILE-CM-RESULT' "$dir/cm-hostile.log" || tail -3 "$dir/cm-hostile.log")"
        local c v
        for c in rx_drop_bad_qkey tx_drop_unresolved; do
            v=$(stat_of "$dir/vrnic-a.sock" "$c")
            if [ "${v:-0}" -gt 0 ]; then pass "hostile-peer: cm: vrnic stats $c $v"; else fail "hostile-peer: cm: vrnic stats $c ${v:-none}"; fi
        done
        rc=0 t0=$SECONDS
        until grep -aq '^VRNIC-CM device free' "$dir/a.log" 2>/dev/null; do
            [ $((SECONDS - t0)) -lt 200 ] || { fail "hostile-peer: cm: rping never ended (console $dir/a.log)"; break; }
            sleep 0.5
        done
        ;;
    "VRNIC-CM skip"*) echo "hostile-peer: CM classes SKIPPED: ${cm#VRNIC-CM skip: }" ;;
    *) fail "hostile-peer: the guest never said whether it serves rdma_cm (console $dir/a.log)" ;;
    esac
    timeout -k 5 300 ip netns exec "$nsh" /usr/bin/python3 "$VR_TOP/tests/e2e/hostile-peer.py" \
        --iface hA --ip 10.0.0.3 --server 10.0.0.1 --port 18515 --size 512 >"$dir/hostile.log" 2>&1 || rc=$?
    echo "hostile-peer.py exit $rc (log $dir/hostile.log)"
    while IFS= read -r line; do
        case $line in
        "HOSTILE "*" ok"*) pass "hostile-peer: ${line#HOSTILE }" ;;
        "HOSTILE "*) fail "hostile-peer: ${line#HOSTILE }" ;;
        esac
    done <"$dir/hostile.log"
    grep -q '^HOSTILE-RESULT .* failed=0 ' "$dir/hostile.log" ||
        fail "hostile-peer: $(grep -a '^HOSTILE-RESULT' "$dir/hostile.log" || tail -3 "$dir/hostile.log")"
    # The server: failed cleanly (a completion error), never on data.
    vr_wait_job a "$dir" "$pid" $((RUN_TIMEOUT + 120)) || true
    line=$(grep -a '^VRNIC-RESULT ' "$dir/a.log" | tr -d '\r' | tail -1) || true
    if grep -aq 'Failed status' "$dir/a.log" && ! grep -aqiE 'invalid data|expected .* bytes|differ' "$dir/a.log" &&
        [[ $line == *" rc=1 "* ]]; then
        pass "hostile-peer: the server failed cleanly after the fatal NAK ($(grep -a -m1 'Failed status' "$dir/a.log" | tr -d '\r'))"
    else
        fail "hostile-peer: the server's end: ${line:-no result line} (console $dir/a.log)"
    fi
    local c v
    for c in icrc_errors rx_drop_bad_pkey rx_drop_bad_src_addr; do
        v=$(stat_of "$dir/vrnic-a.sock" "$c")
        if [ "${v:-0}" -gt 0 ]; then pass "hostile-peer: vrnic stats $c $v"; else fail "hostile-peer: vrnic stats $c ${v:-none}"; fi
    done
    vr_stop "$daemon"
    vr_netns_destroy "$nsh"
    echo "=== hostile-peer took $((SECONDS - tp)) s"
}

# --- Guest killed / daemon restarted (issue 9). Both run vrnic-pingpong between two vrnic guests
# through tests/e2e/guest-runs.sh (ping-pong runs one after the other): A the server, B the
# client; 4 KiB x E2E_CRASH_ITERS for the run that gets broken, once daemon A has carried
# E2E_CRASH_AFTER bytes of it.
CRASH_ITERS=${E2E_CRASH_ITERS:-100000}
CRASH_AFTER=${E2E_CRASH_AFTER:-1048576}
# How close to its baseline daemon A's RSS must come back after its guest was killed (kB).
KILL_RSS_SLACK=${E2E_KILL_RSS_SLACK_KB:-2048}

# runs_job FILE NAME ROLE PEER_IP RUNS [EXTRA [REPLUG_WAIT]]: a guest job for guest-runs.sh.
runs_job() {
    {
        echo "NAME=$2 ROLE=$3 PEER_IP=$4 RUNS='$5' EXTRA='${6:-}' REPLUG_WAIT=${7:-0}"
        echo "RUN_TIMEOUT=$RUN_TIMEOUT CONNECT_WAIT=$((RUN_TIMEOUT + 240))"
        cat "$VR_TOP/tests/e2e/guest-runs.sh"
    } >"$1"
}

# wait_run LOG NAME N TIMEOUT: waits (bounded) for the guest's "VRNIC-RUN NAME N" line and prints
# it; fails after TIMEOUT s.
wait_run() {
    local t0=$SECONDS l
    while :; do
        l=$(grep -a "^VRNIC-RUN $2 $3 " "$1" 2>/dev/null | tr -d '\r' | tail -1) || true
        if [ -n "$l" ]; then
            echo "$l"
            return 0
        fi
        [ $((SECONDS - t0)) -lt "$4" ] || return 1
        sleep 0.1
    done
}

# wait_rx SOCK BYTES LOG...: waits (bounded by the guest timeout) until the daemon at SOCK has
# received BYTES, or a LOG shows its guest's job ended; prints the last rx_bytes.
wait_rx() {
    local sock=$1 want=$2 rx=0
    shift 2
    for _ in $(seq $((GUEST_TIMEOUT * 10))); do
        rx=$(stat_of "$sock" rx_bytes)
        [ "${rx:-0}" -ge "$want" ] && break
        grep -aq '^VRNIC-JOB-EXIT' "$@" 2>/dev/null && break
        sleep 0.1
    done
    echo "${rx:-0}"
}

# kill_child PID COMM: SIGKILL for a process this script started (a child of it, named COMM),
# then reaps it. Fails without signalling anything otherwise.
kill_child() {
    vr_is_child "$1" || return 1
    [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ] || return 1
    kill -KILL "$1"
    vr_stop "$1"
}

# memfd_maps PID: the process's mappings of memfd files (a guest's RAM: memory-backend-memfd).
memfd_maps() { grep -c '/memfd:' "/proc/$1/maps" 2>/dev/null || true; }

# elapsed T0: seconds since T0 (date +%s.%N), one decimal.
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# wait_log FILE PATTERN TIMEOUT: waits (bounded) until FILE has a line matching PATTERN.
wait_log() {
    local t0=$SECONDS
    until grep -q -- "$2" "$1" 2>/dev/null; do
        [ $((SECONDS - t0)) -lt "$3" ] || return 1
        sleep 0.1
    done
}

# check_retry_exc LINE WHAT T0 LOG: B's broken run must have failed with the retry-exceeded
# completion (vrnic-pingpong: "Failed status transport retry counter exceeded (12)").
check_retry_exc() {
    local line=$1 what=$2 t0=$3 log=$4
    if [ -z "$line" ]; then
        fail "$what: B's run did not end (console $log)"
    elif [[ $line == *" rc=0 "* ]]; then
        fail "$what: B's run succeeded although its peer was gone: $line"
    elif grep -aq 'Failed status transport retry counter exceeded (12)' "$log"; then
        pass "$what: B's QP failed with IBV_WC_RETRY_EXC_ERR $(elapsed "$t0") s after the kill ($(grep -a -m1 '^vrnic-pingpong: ' "$log" | tr -d '\r'); ${line#VRNIC-RUN })"
    else
        fail "$what: B's run failed without RETRY_EXC_ERR: $(grep -a -m1 'vrnic-pingpong:' "$log" | tr -d '\r') ($line)"
    fi
}

# vr_daemon_pair WHAT DIR: starts daemons vrnic-a (tap-va, 10.0.0.101/24) and vrnic-b (tap-vb,
# 10.0.0.102/24) in $NS with their sockets and logs in DIR, for the test WHAT; sets VR_PAIR to
# their pids. If one does not start: fails WHAT, stops the one started and returns 1.
vr_daemon_pair() {
    local what=$1 dir=$2 side ip
    VR_PAIR=()
    for side in a b; do
        if [ $side = a ]; then ip=10.0.0.1; else ip=10.0.0.2; fi
        if ! vr_daemon "vrnic-$side" "$NS" "$dir/vrnic-$side.sock" "tap-v$side" "10.0.0.10${ip##*.}/24" "$dir"; then
            fail "$what: daemon vrnic-$side did not start (log $dir/vrnic-$side.log)"
            [ ${#VR_PAIR[@]} = 0 ] || vr_stop "${VR_PAIR[@]}"
            return 1
        fi
        VR_PAIR+=("$VR_LAST_PID")
    done
}

# run_kill: guest A's QEMU is killed (SIGKILL) in the middle of the ping-pong. Daemon A must free
# everything the guest had (its RSS back within KILL_RSS_SLACK kB of, and its open descriptors
# exactly at, what they were before any guest attached), B's QP must fail with RETRY_EXC_ERR
# within a bounded time, and a new guest on daemon A's socket must then run a ping-pong with B.
run_kill() {
    local dir=$RESULTS/vrnic-vrnic-kill side ip peer pid_a pid_b pid_a2 daemons=() tp=$SECONDS
    local sock_a=$dir/vrnic-a.sock rx rss0 fd0 rss1 fd1 rss2 fd2 rss3 fd3 map0 map1 map2 t_kill line
    mkdir -p "$dir"
    echo "=== vrnic-vrnic-kill"
    vr_daemon_pair vrnic-vrnic-kill "$dir" || return 0
    daemons=("${VR_PAIR[@]}")
    # Daemon A before any guest attached.
    rss0=$(vr_rss_kb "${daemons[0]}") fd0=$(vr_fd_count "${daemons[0]}") map0=$(memfd_maps "${daemons[0]}")
    runs_job "$dir/job-a.sh" kill-a server 10.0.0.2 "18515:4096:$CRASH_ITERS"
    runs_job "$dir/job-b.sh" kill-b client 10.0.0.1 "18515:4096:$CRASH_ITERS 18516:4096:$ITERS" \
        "--stall-timeout 5"
    vr_guest a vrnic "$NS" tap-ga 10.0.0.1/24 "$dir/job-a.sh" "$dir" "$sock_a"
    pid_a=$VR_LAST_PID
    vr_guest b vrnic "$NS" tap-gb 10.0.0.2/24 "$dir/job-b.sh" "$dir" "$dir/vrnic-b.sock"
    pid_b=$VR_LAST_PID
    rx=$(wait_rx "$sock_a" "$CRASH_AFTER" "$dir/a.log" "$dir/b.log")
    rss1=$(vr_rss_kb "${daemons[0]}") fd1=$(vr_fd_count "${daemons[0]}") map1=$(memfd_maps "${daemons[0]}")
    if [ "$rx" -lt "$CRASH_AFTER" ]; then
        fail "vrnic-vrnic-kill: the run never got under way (daemon A rx_bytes $rx)"
        vr_stop "$pid_a" "$pid_b" "${daemons[@]}"
        return 0
    fi
    t_kill=$(date +%s.%N)
    if ! kill_child "$pid_a" qemu-system-x86; then
        fail "vrnic-vrnic-kill: guest A's QEMU (pid $pid_a) is not ours to kill"
        vr_stop "$pid_a" "$pid_b" "${daemons[@]}"
        return 0
    fi
    vr_log "guest a (QEMU pid $pid_a) killed at daemon A rx_bytes $rx"
    line=$(wait_run "$dir/b.log" kill-b 1 $((RUN_TIMEOUT + 30))) || line=
    check_retry_exc "$line" vrnic-vrnic-kill "$t_kill" "$dir/b.log"
    if wait_log "$dir/vrnic-a.log" 'frontend connection ended' 30; then
        rss2=$(vr_rss_kb "${daemons[0]}") fd2=$(vr_fd_count "${daemons[0]}") map2=$(memfd_maps "${daemons[0]}")
        if [ "$fd2" = "$fd0" ] && [ "$map2" = "$map0" ] && [ "$rss2" -le $((rss0 + KILL_RSS_SLACK)) ]; then
            pass "vrnic-vrnic-kill: daemon A freed the dead guest: fds $fd0 before it, $fd1 with it, $fd2 after; guest RAM mappings $map0/$map1/$map2; RSS $rss0 kB before, $rss1 kB with it, $rss2 kB after"
        else
            fail "vrnic-vrnic-kill: daemon A kept resources of the dead guest: fds $fd0 before, $fd2 after; guest RAM mappings $map0 before, $map2 after; RSS $rss0 kB before, $rss2 kB after (slack $KILL_RSS_SLACK kB)"
        fi
    else
        fail "vrnic-vrnic-kill: daemon A never saw guest A's connection end (log $dir/vrnic-a.log)"
    fi
    # A new guest on the same daemon socket: a ping-pong with B's second run. It is guest "a" again
    # (same MAC and eth0 address, so B's ARP entry stays right), logging to $dir/second/.
    mkdir -p "$dir/second"
    runs_job "$dir/second/job-a.sh" kill-a2 server 10.0.0.2 "18516:4096:$ITERS"
    vr_guest a vrnic "$NS" tap-ga 10.0.0.1/24 "$dir/second/job-a.sh" "$dir/second" "$sock_a"
    pid_a2=$VR_LAST_PID
    vr_wait_job b "$dir" "$pid_b" $((GUEST_TIMEOUT + 180)) ||
        fail "vrnic-vrnic-kill guest b job: $VR_JOB_RC (console $dir/b.log)"
    vr_wait_job a "$dir/second" "$pid_a2" $((GUEST_TIMEOUT + 180)) ||
        fail "vrnic-vrnic-kill new guest a job: $VR_JOB_RC (console $dir/second/a.log)"
    for who in "b.log kill-b 2 B" "second/a.log kill-a2 1 A2"; do
        # shellcheck disable=SC2086
        set -- $who
        line=$(grep -a "^VRNIC-RUN $2 $3 " "$dir/$1" | tr -d '\r' | tail -1) || true
        case $line in
        *" rc=0 "*verified=yes) pass "vrnic-vrnic-kill: a new guest on daemon A's socket, $4's side: $ITERS x 4096 B, data verified" ;;
        *) fail "vrnic-vrnic-kill: a new guest on daemon A's socket, $4's side: ${line:-no result line}" ;;
        esac
    done
    if wait_log "$dir/vrnic-a.log" 'frontend connection ended' 30 &&
        [ "$(grep -c 'frontend connection ended' "$dir/vrnic-a.log")" -ge 2 ]; then
        rss3=$(vr_rss_kb "${daemons[0]}") fd3=$(vr_fd_count "${daemons[0]}")
        vr_log "daemon A after guest A2 left: fds $fd3, RSS $rss3 kB"
        [ "$fd3" = "$fd0" ] || fail "vrnic-vrnic-kill: daemon A has $fd3 fds after guest A2 left, $fd0 before any guest"
    fi
    vr_stop "${daemons[@]}"
    echo "=== vrnic-vrnic-kill took $((SECONDS - tp)) s"
}

# run_restart: daemon A is killed (SIGKILL) in the middle of the ping-pong and restarted on the
# same socket. Guest A's program must fail with an error within a bounded time (its waits are
# bounded; --stall-timeout 10) and its QEMU must survive; B's QP fails with RETRY_EXC_ERR. QEMU
# 11.1.3 cannot reconnect the device to the new daemon by itself, so once guest A's program has
# ended the harness re-plugs the device over QMP (vr_qmp_replug), as a management layer would;
# then a new program in the same guest runs a ping-pong with B.
run_restart() {
    local dir=$RESULTS/vrnic-vrnic-restart side ip pid_a pid_b daemons=() tp=$SECONDS
    local sock_a=$dir/vrnic-a.sock rx t_kill line err out
    mkdir -p "$dir"
    echo "=== vrnic-vrnic-restart"
    vr_daemon_pair vrnic-vrnic-restart "$dir" || return 0
    daemons=("${VR_PAIR[@]}")
    runs_job "$dir/job-a.sh" restart-a server 10.0.0.2 "18515:4096:$CRASH_ITERS 18516:4096:$ITERS" \
        "--stall-timeout 10" $((GUEST_TIMEOUT / 2))
    runs_job "$dir/job-b.sh" restart-b client 10.0.0.1 "18515:4096:$CRASH_ITERS 18516:4096:$ITERS" \
        "--stall-timeout 5"
    vr_guest a vrnic "$NS" tap-ga 10.0.0.1/24 "$dir/job-a.sh" "$dir" "$sock_a"
    pid_a=$VR_LAST_PID
    vr_guest b vrnic "$NS" tap-gb 10.0.0.2/24 "$dir/job-b.sh" "$dir" "$dir/vrnic-b.sock"
    pid_b=$VR_LAST_PID
    rx=$(wait_rx "$sock_a" "$CRASH_AFTER" "$dir/a.log" "$dir/b.log")
    if [ "$rx" -lt "$CRASH_AFTER" ]; then
        fail "vrnic-vrnic-restart: the run never got under way (daemon A rx_bytes $rx)"
        vr_stop "$pid_a" "$pid_b" "${daemons[@]}"
        return 0
    fi
    t_kill=$(date +%s.%N)
    if ! kill_child "${daemons[0]}" vrnic; then
        fail "vrnic-vrnic-restart: daemon A (pid ${daemons[0]}) is not ours to kill"
        vr_stop "$pid_a" "$pid_b" "${daemons[@]}"
        return 0
    fi
    vr_log "daemon A (pid ${daemons[0]}) killed at rx_bytes $rx"
    daemons=("${daemons[1]}")
    if ! vr_daemon vrnic-a-restarted "$NS" "$sock_a" tap-va 10.0.0.101/24 "$dir"; then
        fail "vrnic-vrnic-restart: daemon A did not start again (log $dir/vrnic-a-restarted.log)"
        vr_stop "$pid_a" "$pid_b" "${daemons[@]}"
        return 0
    fi
    daemons+=("$VR_LAST_PID")
    line=$(wait_run "$dir/b.log" restart-b 1 $((RUN_TIMEOUT + 30))) || line=
    check_retry_exc "$line" vrnic-vrnic-restart "$t_kill" "$dir/b.log"
    line=$(wait_run "$dir/a.log" restart-a 1 $((RUN_TIMEOUT + 60))) || line=
    err=$(grep -a -m1 '^vrnic-pingpong: ' "$dir/a.log" | tr -d '\r') || true
    if [ -z "$line" ]; then
        fail "vrnic-vrnic-restart: guest A's program never ended after the daemon died (console $dir/a.log)"
    elif [[ $line == *" rc=0 "* ]]; then
        fail "vrnic-vrnic-restart: guest A's program succeeded on a dead daemon: $line"
    else
        pass "vrnic-vrnic-restart: guest A's program failed $(elapsed "$t_kill") s after its daemon was killed, exit ${line#* rc=}: ${err:-no error line}"
    fi
    if vr_is_child "$pid_a" && [ "$(cat "/proc/$pid_a/comm" 2>/dev/null)" = qemu-system-x86 ]; then
        pass "vrnic-vrnic-restart: guest A's QEMU survived its daemon's death"
        if out=$(vr_qmp_replug "$dir/a.qmp" "$sock_a.qemu-args" "$sock_a" 2>&1); then
            pass "vrnic-vrnic-restart: device re-plugged on the restarted daemon ($(tail -1 <<<"$out"))"
        else
            fail "vrnic-vrnic-restart: QMP re-plug failed: $out"
        fi
    else
        fail "vrnic-vrnic-restart: guest A's QEMU died with its daemon (see $dir/a.qemu)"
    fi
    for side in a b; do
        local pid=$pid_a
        [ $side = b ] && pid=$pid_b
        vr_wait_job "$side" "$dir" "$pid" $((GUEST_TIMEOUT + 180)) ||
            fail "vrnic-vrnic-restart guest $side job: $VR_JOB_RC (console $dir/$side.log)"
        line=$(grep -a "^VRNIC-RUN restart-$side 2 " "$dir/$side.log" | tr -d '\r' | tail -1) || true
        case $line in
        *" rc=0 "*verified=yes) pass "vrnic-vrnic-restart: a new program in guest $side after the restart: $ITERS x 4096 B, data verified" ;;
        *) fail "vrnic-vrnic-restart: the new program in guest $side after the restart: ${line:-no result line}" ;;
        esac
    done
    vr_stop "${daemons[@]}"
    echo "=== vrnic-vrnic-restart took $((SECONDS - tp)) s"
}

# run_qemu_select: tests/e2e/qemu-select.sh (the QEMU choice in every case a user meets, and a
# kernel boot through a QEMU found on the PATH); its PASS:/FAIL: lines count here.
run_qemu_select() {
    local line
    echo "=== qemu-select"
    while IFS= read -r line; do
        case $line in
        "PASS: "*) pass "${line#PASS: }" ;;
        "FAIL: "*) fail "${line#FAIL: }" ;;
        *) echo "$line" ;;
        esac
    done < <("$VR_TOP/tests/e2e/qemu-select.sh" 2>&1)
}

# run_soak: scripts/soak.sh --minutes 2 (E2E_SOAK_MINUTES) in a namespace of its own, results in
# RESULTS/soak-2min; its PASS:/FAIL: lines count here.
run_soak() {
    local line
    echo "=== soak-2min"
    while IFS= read -r line; do
        case $line in
        "PASS: "*) pass "soak: ${line#PASS: }" ;;
        "FAIL: "*) fail "soak: ${line#FAIL: }" ;;
        *) echo "$line" ;;
        esac
    done < <(SOAK_NO_BUILD=1 SOAK_RESULTS=$RESULTS/soak-2min timeout -k 30 $((${E2E_SOAK_MINUTES:-2} * 60 + 600)) \
        "$VR_TOP/scripts/soak.sh" --minutes "${E2E_SOAK_MINUTES:-2}" 2>&1 || echo "FAIL: scripts/soak.sh exit $?")
}

# relay SCRIPT DIR CMD...: runs CMD (SCRIPT, a step of host processes whose results are in DIR)
# and counts its PASS:/FAIL: lines here; a non-zero exit without a FAIL line (it could not run) is
# one failure; every other line is printed as it is.
relay() {
    local script=$1 dir=$2 line failed=0
    shift 2
    while IFS= read -r line; do
        case $line in
        "PASS: "*) pass "${line#PASS: }" ;;
        "FAIL: "*) failed=1; fail "${line#FAIL: }" ;;
        "RELAY-EXIT "*) [ $failed = 1 ] || fail "$script exit ${line#RELAY-EXIT } without a result (see $dir)" ;;
        *) echo "$line" ;;
        esac
    done < <("$@" 2>&1 || echo "RELAY-EXIT $?")
}

# run_heavy: tests/e2e/heavy.sh (E2E_HEAVY_MODES, default all three) with its own release daemon
# (built there unless E2E_NO_BUILD=1), results in RESULTS/heavy.
run_heavy() {
    local tp=$SECONDS modes
    read -ra modes <<<"${E2E_HEAVY_MODES:-}"
    echo "=== heavy"
    relay tests/e2e/heavy.sh "$RESULTS/heavy" env HEAVY_NO_BUILD="${E2E_NO_BUILD:-0}" \
        HEAVY_RESULTS="$RESULTS/heavy" timeout -k 30 "${E2E_HEAVY_TIMEOUT:-1200}" \
        "$VR_TOP/tests/e2e/heavy.sh" ${modes[@]+"${modes[@]}"}
    echo "=== heavy took $((SECONDS - tp)) s"
}

# run_pyverbs: tests/e2e/pyverbs.sh (all modules, both ways) on the e2e's release build, results
# in RESULTS/pyverbs.
run_pyverbs() {
    local tp=$SECONDS
    echo "=== pyverbs"
    relay tests/e2e/pyverbs.sh "$RESULTS/pyverbs" env PYVERBS_NO_BUILD="${E2E_NO_BUILD:-0}" \
        PYVERBS_RESULTS="$RESULTS/pyverbs" timeout -k 30 900 "$VR_TOP/tests/e2e/pyverbs.sh"
    echo "=== pyverbs took $((SECONDS - tp)) s"
}

for p in "${PAIRS[@]}"; do
    case $p in
    qemu-select) run_qemu_select ;;
    soak-2min) run_soak ;;
    heavy) run_heavy ;;
    pyverbs) run_pyverbs ;;
    probe) run_probe ;;
    containers) run_containers ;;
    software) run_software ;;
    hostile-peer)
        if [ $PROBE_OK = 0 ] && [ "${E2E_KEEP_GOING:-0}" != 1 ]; then
            fail "$p: not run, the probe failed (E2E_KEEP_GOING=1 runs it anyway)"
        else
            run_hostile
        fi
        ;;
    vrnic-vrnic-pause | vrnic-vrnic-kill | vrnic-vrnic-restart)
        if [ $PROBE_OK = 0 ] && [ "${E2E_KEEP_GOING:-0}" != 1 ]; then
            fail "$p: not run, the probe failed (E2E_KEEP_GOING=1 runs it anyway)"
        else
            case $p in
            vrnic-vrnic-pause) run_pause ;;
            vrnic-vrnic-kill) run_kill ;;
            *) run_restart ;;
            esac
        fi
        ;;
    vrnic-*)
        if [ $PROBE_OK = 0 ] && [ "${E2E_KEEP_GOING:-0}" != 1 ]; then
            fail "$p: not run, the probe failed (E2E_KEEP_GOING=1 runs it anyway)"
        else
            run_pair "$p"
        fi
        ;;
    *) run_pair "$p" ;;
    esac
done
if [ -s "$RESULTS/perftest.csv" ]; then
    /usr/bin/python3 "$VR_TOP/tests/e2e/perf-table.py" "$RESULTS/perftest.csv" | tee "$RESULTS/perftest.txt"
fi
echo "results: $RESULTS ($((SECONDS - T_START)) s)"
# The failed checks again, last, where a reader of a long log (CI's tail) finds them, with the
# guest consoles' last lines for a guest job that failed.
if [ "$FAILED" != 0 ]; then
    echo "failed checks:"
    for f in "${FAILS[@]}"; do echo "  FAIL: $f"; done
fi
SUMMARY_DONE=1
echo "e2e: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
