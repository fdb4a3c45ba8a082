#!/usr/bin/env bash
# Recipe: the "software" layer, an uncompressed cpio of what the RDMA software that users build on
# adds to the guests' bookworm root: rdma-core's own test suite (python3-pyverbs, its tests in
# /usr/share/doc/rdma-core/tests, uncompressed), UCX's tools (ucx-utils: ucx_info, ucx_perftest)
# and Open MPI (openmpi-bin), with their dependencies, all from Debian; and two test programs:
# /usr/bin/mpi-pingpong (guest-lib/ibverbs/tests/c/mpi_pingpong.c) and /usr/bin/sw-rsh
# (tests/e2e/peer/sw-rsh.py, the remote shell mpirun starts its daemon on the other guest with). A guest that needs them
# boots its image with this archive appended (the kernel unpacks concatenated archives in turn):
# the images every other e2e step boots stay as small and quick to unpack under TCG as they were.
#
# How: a copy of the bookworm root gets the packages (apt-get in a chroot, as images/bookworm-root.sh
# installs its own); the layer is every path of the copy that is new or changed (type, size,
# mtime, link target) against the root, less what a guest never reads (docs other than the test
# suite, man pages, locales, apt's caches and lists), and less the two files that would undo what the
# image under it holds: dpkg's database (the vrnic image lists vrnic's package) and ld.so's cache
# (the vrnic image's puts vrnic's libibverbs.so.1 first; a job on this layer runs `ldconfig`
# first). Output directory: software.cpio, apt.log.
# Prints the directory.
set -euo pipefail
# shellcheck source=images/common.sh
. "$(dirname "$0")/common.sh"

PACKAGES="python3-pyverbs ucx-utils openmpi-bin"
SW_RSH_SRC=$IMAGES_DIR/../tests/e2e/peer/sw-rsh.py

# listing ROOT: one line per path under ROOT (type, mode, size, mtime, link target, path), sorted.
listing() {
    (cd "$1" && find . -mindepth 1 -printf '%y %m %s %T@ %l\t%p\n' | LC_ALL=C sort)
}

build_software() {
    local out=$1 base=$2 root=$1/root
    # shellcheck disable=SC2064 # $root now: it is a local
    trap "rm -rf --one-file-system '$root'" EXIT
    cp -a "$base" "$root"
    # shellcheck disable=SC2086
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        $PACKAGES >"$out/apt.log" 2>&1 || { tail -20 "$out/apt.log" >&2; die "apt-get install $PACKAGES failed"; }
    chroot "$root" apt-get clean
    [ -f "$root/usr/share/doc/rdma-core/tests/run_tests.py" ] || die "python3-pyverbs brought no run_tests.py"
    # The suite as pyverbs' run_tests.py reads it: Debian compresses most of its files.
    find "$root/usr/share/doc/rdma-core/tests" -name '*.gz' -exec gunzip -f {} +
    # New or changed paths: lines of the copy's listing that the root's lacks; parents first
    # (sorted by path), so that each directory exists before what it holds is unpacked.
    LC_ALL=C comm -13 <(listing "$base") <(listing "$root") | cut -f2 |
        grep -vE '^\./(usr/share/(man|info|locale)|var/cache/apt|var/lib/(apt|dpkg)|var/log)(/|$)' |
        grep -vxF ./etc/ld.so.cache |
        grep -vE '^\./usr/share/doc/' >"$out/paths"
    # The test suite is the one document a guest reads; its parents too, which the images leave
    # out with the rest of /usr/share/doc (the kernel does not create a missing parent).
    (cd "$root" && printf '%s\n' ./usr/share/doc ./usr/share/doc/rdma-core && find ./usr/share/doc/rdma-core/tests) >>"$out/paths"
    # The test programs: the MPI ping-pong (built with the host's mpicc: the host is bookworm, like
    # the root, with the same Open MPI) and the remote shell mpirun starts its daemons with.
    build_mpi_pingpong "$root/usr/bin/mpi-pingpong"
    install -m 0755 "$SW_RSH_SRC" "$root/usr/bin/sw-rsh"
    printf '%s\n' ./usr/bin/mpi-pingpong ./usr/bin/sw-rsh >>"$out/paths"
    (cd "$root" && LC_ALL=C sort -u "$out/paths" | cpio --quiet -o -H newc -R 0:0) >"$out/software.cpio"
    rm -rf --one-file-system "$out/paths" "$root"
    log "software layer: $(du -m "$out/software.cpio" | cut -f1) MiB ($PACKAGES)"
}

root=$("$IMAGES_DIR/bookworm-root.sh")
cached software "$(key "$IMAGES_DIR/common.sh" "$0" "$SW_RSH_SRC" <(echo "$root"; mpi_key))" \
    build_software "$root"
