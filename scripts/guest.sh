#!/usr/bin/env bash
# Boot one guest, run a job script in it, print its result; exit status = the job's.
#   scripts/guest.sh [options] NAME JOB.sh
#     --kind rxe|vrnic   rxe: Soft-RoCE peer (Debian user land); vrnic: Debian user land + vrnic's package
#     --ns NS            existing namespace (scripts/netns.sh); default: a private one for this guest
#     --tap TAP          TAP in NS for eth0 (default: tap-NAME, created in the private namespace)
#     --ip A.B.C.D/N     eth0's address (default 10.0.0.1/24)
#     --sock SOCK        vrnic guests: the vrnic daemon's vhost-user socket (default: no device)
#     --logdir DIR       console log NAME.log goes there (default out/guest-NAME)
#     --timeout S        bound on the job (default 600)
# The job runs as `sh /job.sh` as root in the guest; its output is on the console log.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
vr_install_traps
kind=rxe ns='' tap='' ip=10.0.0.1/24 sock='' logdir='' timeout=600
while [ $# -gt 2 ]; do
    case $1 in
    --kind) kind=$2 ;;
    --ns) ns=$2 ;;
    --tap) tap=$2 ;;
    --ip) ip=$2 ;;
    --sock) sock=$2 ;;
    --logdir) logdir=$2 ;;
    --timeout) timeout=$2 ;;
    *) vr_die "unknown option $1" ;;
    esac
    shift 2
done
[ $# = 2 ] || { sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 2; }
name=$1 job=$2
[ -f "$job" ] || vr_die "no job file $job"
logdir=${logdir:-$VR_TOP/out/guest-$name}
mkdir -p "$logdir"
vr_images
if [ "$kind" = vrnic ]; then
    vr_vrnic_image
fi
vr_qemu_setup
if [ -z "$ns" ]; then
    ns=vrnic-guest-$$
    tap=${tap:-tap-$name}
    vr_netns_create "$ns"
    vr_netns_tap "$ns" "$tap"
fi
[ -n "$tap" ] || vr_die "--tap is needed with --ns"
export VRNIC_GUEST_APPEND="vrnic.timeout=$timeout ${VRNIC_GUEST_APPEND:-}"
t0=$SECONDS
vr_guest "$name" "$kind" "$ns" "$tap" "$ip" "$job" "$logdir" "$sock"
rc=0
vr_wait_job "$name" "$logdir" "$VR_LAST_PID" $((timeout + 180)) || rc=1
vr_log "guest $name: job exit $VR_JOB_RC after $((SECONDS - t0)) s (console $logdir/$name.log)"
exit $rc
