#!/usr/bin/env bash
# Create or destroy a vrnic test network namespace by hand (the test scripts do this themselves).
#   scripts/netns.sh create NS [TAP...]   namespace NS with bridge br0 and persistent TAPs on it
#   scripts/netns.sh destroy NS           deletes the TAPs and the namespace
# NS must start with "vrnic-". Nothing in the namespace has a route out of it.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"
[ $# -ge 2 ] || { sed -n '2,5s/^# \{0,1\}//p' "$0"; exit 2; }
cmd=$1 ns=$2
shift 2
case $ns in vrnic-*) ;; *) vr_die "namespace name must start with vrnic-" ;; esac
case $cmd in
create)
    vr_netns_create "$ns"
    for t in "$@"; do vr_netns_tap "$ns" "$t"; done
    # shellcheck disable=SC2034 # keep it: vr_cleanup would delete it
    VR_NETNS=()
    ip -n "$ns" -br link
    ;;
destroy) vr_netns_destroy "$ns" ;;
*) vr_die "unknown command $cmd" ;;
esac
