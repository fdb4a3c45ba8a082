#!/usr/bin/env bash
# Recipe: the vrnic guest's initramfs, an uncompressed cpio of the bookworm root (rdma-core's user
# land: ibverbs-utils, perftest, ...; the same root as the rxe guest's) without docs, locales and
# apt lists, plus the 6.12 modules for virtio-net, fw_cfg and uio_pci_generic, the job-running /init
# (images/init/) and /etc/vrnic-setup (images/init/vrnic-setup). With --deb, the root is a copy of
# the bookworm root with vrnic's Debian package (scripts/deb.sh: vrnic's libibverbs.so.1 as
# /usr/lib/vrnic/libibverbs.so.1, found before Debian's through /etc/ld.so.conf.d/00-vrnic.conf,
# and the vrnic-* tools in /usr/bin) installed by `dpkg -i` in a chroot, as a user would on their
# own guest, so every run of the e2e test proves the package installs and works; the image also
# gets the libibverbs READ/atomic peer /usr/bin/rxe-rdma-peer (as in the rxe image), which then runs
# on vrnic, and /usr/bin/pin-check (tests/e2e/peer/pin-check.c: registered pages stay in place
# under compaction). The package's content is part of the cache key: a changed package, a new image.
# Usage: vrnic-initramfs.sh [--deb DEB]. Output directory: initramfs.cpio (and dpkg.log, the
# installation's output). Prints the directory.
set -euo pipefail
# shellcheck source=images/common.sh
. "$(dirname "$0")/common.sh"

MODULES=(virtio_net qemu_fw_cfg uio_pci_generic)
PIN_CHECK_SRC=$IMAGES_DIR/../tests/e2e/peer/pin-check.c

# build_pin_check FILE: compiles PIN_CHECK_SRC against the host's libibverbs-dev (as
# build_rdma_peer does; in the guest it runs on vrnic's libibverbs.so.1).
build_pin_check() {
    gcc -O2 -Wall -Wextra -Wno-missing-field-initializers -o "$1" "$PIN_CHECK_SRC" -libverbs ||
        die "compiling $PIN_CHECK_SRC failed"
}

build_vrnic() {
    local out=$1 root=$2 kdir=$3 deb=$4 extra=$1/extra img=$1/root
    if [ -n "$deb" ]; then
        # A copy of the shared root (the rxe image uses it as it is), removed on every exit path.
        # shellcheck disable=SC2064 # $img now: it is a local
        trap "rm -rf --one-file-system '$img'" EXIT
        cp -a "$root" "$img"
        cp "$deb" "$img/tmp/vrnic-guest.deb"
        chroot "$img" dpkg -i /tmp/vrnic-guest.deb >"$out/dpkg.log" 2>&1 ||
            { tail -20 "$out/dpkg.log" >&2; die "dpkg -i $(basename "$deb") in the image root failed"; }
        rm "$img/tmp/vrnic-guest.deb"
        root=$img
    fi
    root_cpio "$root" "$out/root.cpio"
    [ -z "$deb" ] || rm -rf --one-file-system "$img"
    # Our additions, as a second archive: the kernel unpacks concatenated archives in turn.
    mkdir -p "$extra/usr/bin"
    copy_modules "$kdir" "$extra" "${MODULES[@]}"
    install -m 0755 "$IMAGES_DIR/init/init" "$extra/init"
    install -m 0644 "$IMAGES_DIR/init/vrnic-setup" "$extra/etc/vrnic-setup"
    # The libibverbs READ/atomic peer and the compaction check run on vrnic's library too.
    if [ -n "$deb" ]; then
        build_rdma_peer "$extra/usr/bin/rxe-rdma-peer"
        build_pin_check "$extra/usr/bin/pin-check"
    fi
    pack_cpio "$extra" "$out/extra.cpio"
    cat "$out/root.cpio" "$out/extra.cpio" >"$out/initramfs.cpio"
    rm -rf "$extra" "$out/root.cpio" "$out/extra.cpio"
    log "vrnic initramfs: $(du -m "$out/initramfs.cpio" | cut -f1) MiB, package: $(basename "${deb:-none}")"
}

deb=
if [ "${1:-}" = --deb ]; then
    [ -f "${2:-}" ] || die "--deb ${2:-}: no such file"
    deb=$(readlink -f "$2")
    shift 2
fi
[ $# = 0 ] || die "usage: vrnic-initramfs.sh [--deb DEB]"
root=$("$IMAGES_DIR/bookworm-root.sh")
kdir=$("$IMAGES_DIR/kernel.sh")
k=$(key "$IMAGES_DIR/common.sh" "$0" "$IMAGES_DIR/init/init" "$IMAGES_DIR/init/vrnic-setup" \
    "$RDMA_PEER_SRC" "$PIN_CHECK_SRC" <(echo "$root $kdir ${deb:+package}"; gcc --version | head -1
        dpkg-query -W libibverbs-dev 2>/dev/null) ${deb:+"$deb"})
cached vrnic-initramfs "$k" build_vrnic "$root" "$kdir" "$deb"
