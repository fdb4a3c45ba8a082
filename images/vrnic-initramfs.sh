#!/usr/bin/env bash
# Recipe: the vrnic guest's initramfs, an uncompressed cpio of the bookworm root (rdma-core's user
# land: ibverbs-utils, perftest, ...; the same root as the rxe guest's) without docs, locales and
# apt lists, plus the 6.12 modules for virtio-net, fw_cfg and uio_pci_generic, the job-running /init
# (images/init/), /etc/vrnic-setup (images/init/vrnic-setup), the static guest-lib tools and, with
# --lib, vrnic's libibverbs.so.1 as /usr/lib/vrnic/libibverbs.so.1, found before Debian's through
# /etc/ld.so.conf.d/00-vrnic.conf (the one line a user adds on their own guest), and the libibverbs
# READ/atomic peer /usr/bin/rxe-rdma-peer (as in the rxe image), which then runs on vrnic, and
# /usr/bin/pin-check (tests/e2e/peer/pin-check.c: registered pages stay in place under compaction).
# Usage: vrnic-initramfs.sh [--lib LIBFILE] [BINARY...]   each BINARY (a static executable) goes to
# /usr/bin; missing ones are skipped with a warning. Output directory: initramfs.cpio. Prints the
# directory.
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
    local out=$1 root=$2 kdir=$3 lib=$4 extra=$1/extra b
    shift 4
    root_cpio "$root" "$out/root.cpio"
    # Our additions, as a second archive: the kernel unpacks concatenated archives in turn.
    mkdir -p "$extra/etc/ld.so.conf.d" "$extra/usr/bin" "$extra/usr/lib/vrnic"
    copy_modules "$kdir" "$extra" "${MODULES[@]}"
    install -m 0755 "$IMAGES_DIR/init/init" "$extra/init"
    install -m 0644 "$IMAGES_DIR/init/vrnic-setup" "$extra/etc/vrnic-setup"
    for b in "$@"; do
        install -m 0755 "$b" "$extra/usr/bin/$(basename "$b")"
        strip --strip-debug "$extra/usr/bin/$(basename "$b")" 2>/dev/null || true
    done
    if [ -n "$lib" ]; then
        # The libibverbs READ/atomic peer runs on vrnic's library too.
        build_rdma_peer "$extra/usr/bin/rxe-rdma-peer"
        build_pin_check "$extra/usr/bin/pin-check"
        install -m 0755 "$lib" "$extra/usr/lib/vrnic/libibverbs.so.1"
        strip --strip-debug "$extra/usr/lib/vrnic/libibverbs.so.1" 2>/dev/null || true
        echo /usr/lib/vrnic >"$extra/etc/ld.so.conf.d/00-vrnic.conf"
    fi
    pack_cpio "$extra" "$out/extra.cpio"
    cat "$out/root.cpio" "$out/extra.cpio" >"$out/initramfs.cpio"
    rm -rf "$extra" "$out/root.cpio" "$out/extra.cpio"
    log "vrnic initramfs: $(du -m "$out/initramfs.cpio" | cut -f1) MiB, tools: ${*:-none}, libibverbs: ${lib:-none}"
}

lib=
if [ "${1:-}" = --lib ]; then
    [ -f "${2:-}" ] || die "--lib ${2:-}: no such file"
    lib=$(readlink -f "$2")
    shift 2
fi
bins=()
for b in "$@"; do
    if [ -f "$b" ]; then
        readelf -l "$b" 2>/dev/null | grep 'program interpreter' >/dev/null &&
            log "warning: $b is dynamically linked; build the guest tools with crt-static"
        bins+=("$(readlink -f "$b")")
    else
        log "warning: $b not found, not included"
    fi
done
root=$("$IMAGES_DIR/bookworm-root.sh")
kdir=$("$IMAGES_DIR/kernel.sh")
k=$(key "$IMAGES_DIR/common.sh" "$0" "$IMAGES_DIR/init/init" "$IMAGES_DIR/init/vrnic-setup" \
    "$RDMA_PEER_SRC" "$PIN_CHECK_SRC" <(echo "$root $kdir ${bins[*]} $lib"; gcc --version | head -1
        dpkg-query -W libibverbs-dev 2>/dev/null) ${bins[@]+"${bins[@]}"} ${lib:+"$lib"})
cached vrnic-initramfs "$k" build_vrnic "$root" "$kdir" "$lib" ${bins[@]+"${bins[@]}"}
