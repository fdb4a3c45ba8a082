#!/usr/bin/env bash
# Recipe: the container image of the e2e test and of users who want to try vrnic from a container:
# the bookworm root (rdma-core's user land: ibverbs-utils, perftest, ...; the guests' root) and
# UCX's tools (ucx-utils), rdma-core's test suite (python3-pyverbs), Open MPI (openmpi-bin) and the
# e2e's MPI ping-pong (/usr/bin/mpi-pingpong), with vrnic's Debian package installed by `dpkg -i` in a chroot (vrnic's libibverbs.so.1 found first
# through /etc/ld.so.conf.d/00-vrnic.conf), without docs, locales and apt lists, as a tar archive
# for `podman import`. In the container the library reaches a vrnic function through the daemon's
# vhost-user socket mounted at /run/vrnic/vhost-user.sock (guest-lib/src/vhost_user.rs): no kernel
# module, no privilege.
# Usage: container.sh --deb DEB. Output directory: image.tar, dpkg.log, apt.log. Prints the directory.
set -euo pipefail
# shellcheck source=images/common.sh
. "$(dirname "$0")/common.sh"

build_container() {
    local out=$1 root=$2 deb=$3 img=$1/root
    # shellcheck disable=SC2064 # $img now: it is a local
    trap "rm -rf --one-file-system '$img'" EXIT
    cp -a "$root" "$img"
    # UCX's tools (ucx_info, ucx_perftest), rdma-core's test suite (python3-pyverbs) and Open MPI,
    # from Debian, for the e2e's checks in containers; the suite uncompressed, as its run_tests.py
    # reads it.
    chroot "$img" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        ucx-utils python3-pyverbs openmpi-bin >"$out/apt.log" 2>&1 ||
        { tail -20 "$out/apt.log" >&2; die "apt-get install ucx-utils python3-pyverbs openmpi-bin failed"; }
    chroot "$img" apt-get clean
    find "$img/usr/share/doc/rdma-core/tests" -name '*.gz' -exec gunzip -f {} +
    build_mpi_pingpong "$img/usr/bin/mpi-pingpong"
    cp "$deb" "$img/tmp/vrnic-guest.deb"
    chroot "$img" dpkg -i /tmp/vrnic-guest.deb >"$out/dpkg.log" 2>&1 ||
        { tail -20 "$out/dpkg.log" >&2; die "dpkg -i $(basename "$deb") in the container root failed"; }
    rm "$img/tmp/vrnic-guest.deb"
    mkdir -p "$img/run/vrnic"
    # Docs go, except rdma-core's test suite (and the directories above it).
    (cd "$img" && find . -mindepth 1 \
        \( -path ./usr/share/doc -o -path ./usr/share/doc/rdma-core -o -path './usr/share/doc/rdma-core/tests*' \) \
        -print -o \( -path './usr/share/doc/*' -o -path ./usr/share/man -o -path ./usr/share/info \
        -o -path ./usr/share/locale -o -path ./var/cache/apt -o -path ./var/lib/apt/lists \
        -o -path './usr/lib/udev/hwdb.*' -o -path ./boot -o -path ./lib/modules \) -prune -o -print |
        LC_ALL=C sort | tar --no-recursion --numeric-owner -cf "$out/image.tar" -T -)
    rm -rf --one-file-system "$img"
    log "container image: $(du -m "$out/image.tar" | cut -f1) MiB, package: $(basename "$deb")"
}

[ "${1:-}" = --deb ] && [ -f "${2:-}" ] || die "usage: container.sh --deb DEB"
deb=$(readlink -f "$2")
root=$("$IMAGES_DIR/bookworm-root.sh")
k=$(key "$IMAGES_DIR/common.sh" "$0" "$deb" <(echo "$root"; mpi_key))
cached container "$k" build_container "$root" "$deb"
