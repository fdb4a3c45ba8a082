#!/usr/bin/env bash
# Recipe: a Debian bookworm root (debootstrap --variant=minbase) whose apt sources include
# bookworm-backports, with the rxe peer's user space installed (rdma-core, ibverbs-utils,
# rdmacm-utils, perftest, iproute2, kmod). It is both the rxe guest's user land and the place
# where the other recipes download Debian packages (the host's apt sources are never touched).
# Prints the root's directory.
set -euo pipefail
# shellcheck source=images/common.sh
. "$(dirname "$0")/common.sh"

PACKAGES="rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest iproute2 kmod procps"

build_root() {
    local out=$1 root=$1/root
    command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
    debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" >"$out/debootstrap.log" 2>&1 ||
        { tail -20 "$out/debootstrap.log" >&2; die "debootstrap failed"; }
    echo "deb $DEBIAN_MIRROR bookworm-backports main" >"$root/etc/apt/sources.list.d/backports.list"
    # No daemons may start inside the chroot.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod +x "$root/usr/sbin/policy-rc.d"
    chroot "$root" apt-get update -qq
    # shellcheck disable=SC2086
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        $PACKAGES >"$out/apt.log" 2>&1 || { tail -20 "$out/apt.log" >&2; die "apt-get install failed"; }
    chroot "$root" apt-get clean
}

cached bookworm-root "$(key "$0")" build_root | sed 's|$|/root|'
