#!/usr/bin/env bash
# End-to-end test of vrnic against Linux Soft-RoCE (rdma_rxe), all inside a private network
# namespace (bridge br0, TAPs), guests under QEMU (TCG unless KVM works).
#
# Usage: tests/e2e/run.sh [STEP...]     STEP: qemu-select | rxe-rxe | probe | vrnic-rxe | vrnic-vrnic |
#                                             vrnic-rxe-lossy | vrnic-vrnic-pause | hostile-peer |
#                                             ibv-rxe | ibv-ibv | ibv-vrnic
#   default: qemu-select probe vrnic-rxe vrnic-vrnic vrnic-rxe-lossy vrnic-vrnic-pause hostile-peer
#   ibv-rxe ibv-ibv (ibv: a vrnic guest running Debian's unmodified ibv_*_pingpong on vrnic's
#   libibverbs.so.1; hostile-peer: an independent scapy peer attacks a vrnic server, see
#   run_hostile; qemu-select:
#   which QEMU the scripts pick, tests/e2e/qemu-select.sh; vrnic-vrnic-pause: a VM paused and
#   resumed mid-run, see run_pause; rxe-rxe is the harness's own baseline;
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
# E2E_ITERS (200), E2E_MTU (1024), E2E_RUN_TIMEOUT (bound on one ping-pong run, 90 s),
# E2E_GUEST_TIMEOUT (bound on one guest's whole job, 900 s), E2E_NO_BUILD=1 (skip cargo build),
# E2E_RDMA=0 (no RDMA READ/atomic runs), E2E_RDMA_SIZES ("1,4097,1048576"), E2E_RDMA_READS (2),
# E2E_RDMA_FAA (100), E2E_LOSSY_RDMA, E2E_LOSSY_SIZES, E2E_LOSS (nft|netem),
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
[ ${#PAIRS[@]} -gt 0 ] || PAIRS=(qemu-select probe vrnic-rxe vrnic-vrnic vrnic-rxe-lossy vrnic-vrnic-pause hostile-peer ibv-rxe ibv-ibv)
[ "${E2E_BASELINE:-0}" = 1 ] && PAIRS=(rxe-rxe "${PAIRS[@]}")
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

pass() { PASSED=$((PASSED + 1)); echo "PASS: $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL: $*"; }

need_vrnic=0
for p in "${PAIRS[@]}"; do
    case $p in
    rxe-rxe | qemu-select) ;;
    probe | vrnic-rxe | vrnic-vrnic | vrnic-rxe-lossy | vrnic-vrnic-lossy | vrnic-vrnic-pause | hostile-peer) need_vrnic=1 ;;
    ibv-rxe | ibv-ibv | ibv-vrnic) need_vrnic=1 ;;
    *) vr_die "unknown pair $p" ;;
    esac
done

vr_qemu_find
t0=$SECONDS
if [ $need_vrnic = 1 ] && [ "${E2E_NO_BUILD:-0}" != 1 ]; then vr_build_rust; fi
vr_images
if [ $need_vrnic = 1 ]; then
    mapfile -t bins < <(vr_guest_bins)
    vr_vrnic_image "${bins[@]}"
fi
vr_qemu_setup
export VRNIC_GUEST_APPEND="vrnic.timeout=$GUEST_TIMEOUT ${VRNIC_GUEST_APPEND:-}"
vr_log "build/images: $((SECONDS - t0)) s; results in $RESULTS"

vr_netns_create "$NS"
for t in ga gb va vb; do vr_netns_tap "$NS" "tap-$t"; done

# Sizes of the vrnic-to-vrnic RDMA WRITE with immediate check (vrnic-write-imm, 10 writes each).
WRITE_IMM_SIZES=${E2E_WRITE_IMM_SIZES:-1 4097 65536}

# UD and SRQ ping-pongs after the RC matrix (ibv_ud_pingpong / ibv_srq_pingpong or ours).
XRUNS=${E2E_XRUNS-ud srq}
XITERS=${E2E_XITERS:-200}

# ibv pairs: after the RC matrix, per role, one RC run spinning on the CQ (the baseline) and one with
# completion events (-e), EVENT_SIZE bytes x EVENT_ITERS each. On a vrnic (ibv) side the -e run must
# sleep until the device's interrupt: its CPU time at least E2E_EVENT_CPU_GAP percentage points of
# wall time below the spinning run's, and the guest's uio_pci_generic interrupt count rising.
# Before that, the idle check (ibv sides): the event thread of an open but idle context, watched
# for E2E_IDLE_WINDOW seconds, must wake fewer than E2E_IDLE_MAX_WAKEUPS times (a 1 ms poll wakes
# ~1000 times a second); the same check with the library's polling fallback (VRNIC_PCI_NO_IRQ=1)
# is reported beside it.
EVENT_SIZE=${E2E_EVENT_SIZE:-4096}
EVENT_ITERS=${E2E_EVENT_ITERS:-1000}
EVENT_CPU_GAP=${E2E_EVENT_CPU_GAP:-25}
IDLE_WINDOW=${E2E_IDLE_WINDOW:-3}
IDLE_MAX_WAKEUPS=${E2E_IDLE_MAX_WAKEUPS:-20}

# RDMA READ and atomics after that (vrnic-rdma / rxe-rdma-peer), one run per role: the server is
# the passive side (responder), the client the active one (requester). E2E_RDMA=0 skips them.
RDMA=${E2E_RDMA:-1}
RDMA_SIZES=${E2E_RDMA_SIZES:-1,4097,1048576}
RDMA_READS=${E2E_RDMA_READS:-2}
RDMA_FAA=${E2E_RDMA_FAA:-100}

# job FILE NAME TOOL PEER_IP ROLES [WRITE_IMM_ROLE [RDMA_ROLES]]: writes a guest job (parameters +
# tests/e2e/guest-pp.sh).
job() {
    {
        echo "NAME=$2 TOOL=$3 PEER_IP=$4 ROLES='$5' SIZES='$SIZES' ITERS=$ITERS MTU=$MTU GID=1"
        echo "WRITE_IMM_ROLE='${6:-}' WRITE_IMM_SIZES='$WRITE_IMM_SIZES'"
        echo "XRUNS='$XRUNS' XITERS=$XITERS"
        echo "RDMA_ROLES='${7:-}' RDMA_SIZES='$RDMA_SIZES' RDMA_READS=$RDMA_READS RDMA_FAA=$RDMA_FAA"
        echo "BASEPORT=18515 RUN_TIMEOUT=$RUN_TIMEOUT CONNECT_WAIT=$((RUN_TIMEOUT + 120)) EXTRA='${E2E_EXTRA:-}'"
        echo "EVENT_ROLES='${EVENT_ROLES:-}' EVENT_SIZE=$EVENT_SIZE EVENT_ITERS=$EVENT_ITERS"
        echo "IDLE_CHECK=${IDLE_CHECK:-0} IDLE_WINDOW=$IDLE_WINDOW"
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

# lossy_start: installs the loss; fails if it cannot.
lossy_start() {
    case $LOSS in
    netem)
        modprobe sch_netem 2>/dev/null || true
        ip netns exec "$NS" tc qdisc add dev tap-va root netem loss 1% &&
            ip netns exec "$NS" tc qdisc add dev tap-gb root netem loss 1%
        ;;
    nft)
        command -v nft >/dev/null || return 1
        ip netns exec "$NS" nft -f - <<'EOF'
table bridge vrnic_loss {
    chain forward {
        type filter hook forward priority 0;
        iifname "tap-va" udp dport 4791 numgen random mod 100 == 0 counter drop
        oifname "tap-va" udp dport 4791 numgen random mod 100 == 0 counter drop
    }
}
EOF
        ;;
    *) return 1 ;;
    esac
}
# lossy_stop PAIR: removes the loss and reports how many frames it dropped towards vrnic and from
# it (towards its peer); a loss run must have lost some in each direction.
lossy_stop() {
    local c from to
    if [ "$LOSS" = netem ]; then
        # tc -s: " Sent B bytes P pkt (dropped D, overlimits ...".
        to=$(ip netns exec "$NS" tc -s qdisc show dev tap-va | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | head -1)
        from=$(ip netns exec "$NS" tc -s qdisc show dev tap-gb | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | head -1)
        ip netns exec "$NS" tc qdisc del dev tap-va root 2>/dev/null || true
        ip netns exec "$NS" tc qdisc del dev tap-gb root 2>/dev/null || true
    else
        c=$(ip netns exec "$NS" nft list table bridge vrnic_loss 2>/dev/null |
            sed -n 's/.*\(iif\|oif\)name "tap-va".*counter packets \([0-9]*\).*/\1 \2/p')
        ip netns exec "$NS" nft delete table bridge vrnic_loss 2>/dev/null || true
        from=$(awk '$1 == "iif" { print $2 }' <<<"$c") to=$(awk '$1 == "oif" { print $2 }' <<<"$c")
    fi
    if [ "${from:-0}" -gt 0 ] && [ "${to:-0}" -gt 0 ]; then
        pass "$1: 1% loss ($LOSS) dropped $to frames to vrnic and $from from vrnic"
    else
        fail "$1: the loss ($LOSS) dropped ${to:-0} frames to vrnic and ${from:-0} from it"
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
    local base=${1%-lossy}
    if [[ $base == ibv-* || $base == *-ibv ]]; then
        # Debian's unmodified tools on vrnic's libibverbs.so.1: sizes 1, MTU+1 and 1 MiB, the
        # stock tools' own check (-c) on both sides (job() reads these).
        local SIZES=${E2E_IBV_SIZES:-1 1025 1048576} ITERS=${E2E_IBV_ITERS:-20} E2E_EXTRA="-c"
        local EVENT_ROLES=set
    fi
    if [ "$base" != "$pair" ]; then
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
            if ! vr_daemon "vrnic-$side" "$NS" "$dir/vrnic-$side.sock" "tap-v$side" "10.0.0.10${ip##*.}/24" \
                "$dir" "$dir/vrnic-$side.pcap"; then
                fail "$pair: daemon vrnic-$side did not start (log $dir/vrnic-$side.log)"
                [ ${#daemons[@]} = 0 ] || vr_stop "${daemons[@]}"
                [ -n "$capture" ] && vr_stop "$capture"
                [ "$side" = b ] && vr_stop "${pid_of[a]}"
                return 0
            fi
            daemons+=("$VR_LAST_PID")
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
            elif ! [[ $cpu =~ ^[0-9]+$ && ${spin_cpu:-x} =~ ^[0-9]+$ ]] || [ $((cpu + EVENT_CPU_GAP)) -gt "$spin_cpu" ]; then
                fail "$ewhat: did not sleep (the spinning run used ${spin_cpu:-?}%)"
            elif ! [[ $irqs =~ ^[0-9]+$ ]] || [ "$irqs" -eq 0 ]; then
                fail "$ewhat: no uio_pci_generic interrupt during the run"
            else pass "$ewhat: slept on the device's interrupt (spinning: $spin_cpu%)"; fi
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
    [ "$base" = "$pair" ] || lossy_stop "$pair"
    # Stop the daemons (the guests are gone), then check their captures.
    [ ${#daemons[@]} = 0 ] || vr_stop "${daemons[@]}"
    local pcaps=()
    if [ -n "$capture" ]; then
        vr_stop "$capture"
        pcaps+=("$pair a (rxe, captured on tap-ga)|$dir/rxe-a.pcap")
    fi
    for side in a b; do
        [[ ${kind_of[$side]} == vrnic || ${kind_of[$side]} == ibv ]] &&
            pcaps+=("$pair $side (vrnic daemon)|$dir/vrnic-$side.pcap")
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
        qps=$("${VRNIC_BIN:-$VR_TOP/target/debug/vrnic}" stats --socket "$sock_a" 2>/dev/null | grep -c '^qp_[0-9]*_tx_bytes ')
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
        line=$(grep -a '^VRNIC-RESULT ' "$dir/$side.log" | tr -d '\r' | tail -1)
        case $line in
        *" rc=0 "*verified=yes) pass "vrnic-vrnic-pause $side: $PAUSE_ITERS x 4096 B across the pause, data verified" ;;
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
# drops by class in `vrnic stats`.
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
    vr_guest a vrnic "$NS" tap-ga 10.0.0.1/24 "$dir/job-a.sh" "$dir" "$dir/vrnic-a.sock"
    pid=$VR_LAST_PID
    local rc=0
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
    line=$(grep -a '^VRNIC-RESULT ' "$dir/a.log" | tr -d '\r' | tail -1)
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

for p in "${PAIRS[@]}"; do
    case $p in
    qemu-select) run_qemu_select ;;
    probe) run_probe ;;
    hostile-peer)
        if [ $PROBE_OK = 0 ] && [ "${E2E_KEEP_GOING:-0}" != 1 ]; then
            fail "$p: not run, the probe failed (E2E_KEEP_GOING=1 runs it anyway)"
        else
            run_hostile
        fi
        ;;
    vrnic-vrnic-pause)
        if [ $PROBE_OK = 0 ] && [ "${E2E_KEEP_GOING:-0}" != 1 ]; then
            fail "$p: not run, the probe failed (E2E_KEEP_GOING=1 runs it anyway)"
        else
            run_pause
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
echo "results: $RESULTS ($((SECONDS - T_START)) s)"
SUMMARY_DONE=1
echo "e2e: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
