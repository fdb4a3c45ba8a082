#!/usr/bin/env bash
# Demo: an RC ping-pong between a vrnic guest and a Linux Soft-RoCE guest, Debian's unmodified
# ibv_rc_pingpong on both sides.
#   scripts/demo.sh [--baseline]
# Builds everything (cargo, guest images, the QEMU root; all cached), creates a private network
# namespace (bridge br0, TAPs), starts the vrnic daemon on its own TAP, and boots
#   guest A (vrnic, eth0 10.0.0.1, RoCE address 10.0.0.101 on the daemon; no RDMA kernel module:
#   ibv_rc_pingpong runs on vrnic's libibverbs.so.1):
#       ibv_rc_pingpong -g 1 -m 1024 -s 4096 -n 100 -c          (server)
#   guest B (rxe, 10.0.0.2):
#       ibv_rc_pingpong -g 1 -m 1024 -s 4096 -n 100 -c 10.0.0.1 (client)
# then prints both sides' result lines and cleans up. Exit status 0 iff both sides succeed.
# --baseline: guest A is a second rxe guest (checks the images, namespace and QEMU alone).
# Logs: out/demo-DATE/ (DEMO_RESULTS). Environment as for tests/e2e/run.sh.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
vr_install_traps
kind_a=vrnic
[ "${1:-}" = --baseline ] && kind_a=rxe
if [ -z "${DEMO_RESULTS:-}" ] && [ -d "$VR_TOP/out" ]; then # keep the last 5 demo logs
    find "$VR_TOP/out" -maxdepth 1 -name 'demo-*' -type d 2>/dev/null | sort | head -n -4 |
        xargs -r rm -rf --one-file-system
fi
dir=${DEMO_RESULTS:-$VR_TOP/out/demo-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir"
dir=$(readlink -f "$dir")
ns=vrnic-demo-$$

"$VR_SCRIPTS/deps.sh"
vr_qemu_find
t0=$SECONDS
if [ $kind_a = vrnic ]; then
    vr_build_rust
    vr_vrnic_image
fi
vr_images
vr_qemu_setup
vr_log "builds: $((SECONDS - t0)) s"

vr_netns_create "$ns"
for t in tap-ga tap-gb tap-va; do vr_netns_tap "$ns" "$t"; done

# Jobs: the shared ping-pong job (tests/e2e/guest-pp.sh) with one size and one role each.
job() { # FILE NAME TOOL PEER ROLE
    {
        echo "NAME=$2 TOOL=$3 PEER_IP=$4 ROLES=$5 SIZES=4096 ITERS=100 MTU=1024 GID=1"
        echo "BASEPORT=18515 RUN_TIMEOUT=120 CONNECT_WAIT=240 EXTRA=-c"
        cat "$VR_TOP/tests/e2e/guest-pp.sh"
    } >"$1"
}
if [ $kind_a = vrnic ]; then
    vr_daemon vrnic-a "$ns" "$dir/vrnic-a.sock" tap-va 10.0.0.101/24 "$dir" "$dir/vrnic-a.pcap" ||
        vr_die "the vrnic daemon did not start (log $dir/vrnic-a.log)"
    # Debian's own ibv_rc_pingpong, on vrnic's libibverbs.so.1 (the image lists it first).
    job "$dir/job-a.sh" A ibv_rc_pingpong 10.0.0.2 server
else
    job "$dir/job-a.sh" A ibv_rc_pingpong 10.0.0.2 server
fi
job "$dir/job-b.sh" B ibv_rc_pingpong 10.0.0.1 client
export VRNIC_GUEST_APPEND="vrnic.timeout=400"
t1=$SECONDS
vr_guest A $kind_a "$ns" tap-ga 10.0.0.1/24 "$dir/job-a.sh" "$dir" "$dir/vrnic-a.sock"
pid_a=$VR_LAST_PID
vr_guest B rxe "$ns" tap-gb 10.0.0.2/24 "$dir/job-b.sh" "$dir"
pid_b=$VR_LAST_PID
ok=1
vr_wait_job A "$dir" "$pid_a" 600 || ok=0
rc_a=$VR_JOB_RC
vr_wait_job B "$dir" "$pid_b" 600 || ok=0
rc_b=$VR_JOB_RC
echo
for g in A B; do
    echo "--- guest $g ($([ $g = A ] && echo $kind_a || echo rxe)), console $dir/$g.log"
    tr -d '\r' <"$dir/$g.log" | grep -a -E '^(---|VRNIC-RESULT|VRNIC-JOB-EXIT|VRNIC-INIT: libibverbs|[0-9]+ (bytes|iters) in| *local address| *remote address|.*verified|invalid data)' || true
done
echo
echo "guests took $((SECONDS - t1)) s; job exit: A=$rc_a B=$rc_b"
# -c only prints what it finds wrong.
grep -aq 'invalid data in page' "$dir/A.log" "$dir/B.log" && ok=0
if [ $ok = 1 ]; then echo "DEMO: PASS"; else echo "DEMO: FAIL (logs in $dir)"; exit 1; fi
