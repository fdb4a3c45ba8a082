#!/usr/bin/env bash
# Recipe: the rxe peer guest's initramfs, an uncompressed cpio of the bookworm root (rdma-core,
# ibverbs-utils, perftest, ...) without docs, locales and apt lists, plus the 6.12 modules for
# virtio-net, fw_cfg and Soft-RoCE, the job-running /init (images/init/) and /usr/bin/rxe-rdma-peer
# (tests/e2e/peer/rxe-rdma-peer.c, compiled here with the host's gcc against its libibverbs-dev:
# the host is bookworm, like the root, so it links against the same libibverbs.so.1).
# Output directory: initramfs.cpio. Prints the directory.
set -euo pipefail
# shellcheck source=images/common.sh
. "$(dirname "$0")/common.sh"

MODULES=(virtio_net qemu_fw_cfg crc32_generic rdma_rxe ib_uverbs rdma_ucm)

build_rxe() {
    local out=$1 root=$2 kdir=$3 extra=$1/extra
    root_cpio "$root" "$out/root.cpio"
    # Our additions, as a second archive: the kernel unpacks concatenated archives in turn.
    mkdir -p "$extra/etc" "$extra/usr/bin"
    build_rdma_peer "$extra/usr/bin/rxe-rdma-peer"
    copy_modules "$kdir" "$extra" "${MODULES[@]}"
    install -m 0755 "$IMAGES_DIR/init/init" "$extra/init"
    install -m 0644 "$IMAGES_DIR/init/rxe-setup" "$extra/etc/vrnic-setup"
    pack_cpio "$extra" "$out/extra.cpio"
    cat "$out/root.cpio" "$out/extra.cpio" >"$out/initramfs.cpio"
    rm -rf "$extra" "$out/root.cpio" "$out/extra.cpio"
    log "rxe initramfs: $(du -m "$out/initramfs.cpio" | cut -f1) MiB"
}

root=$("$IMAGES_DIR/bookworm-root.sh")
kdir=$("$IMAGES_DIR/kernel.sh")
# The peer's source and the compiler and library it is built with are part of the key.
k=$(key "$IMAGES_DIR/common.sh" "$0" "$IMAGES_DIR/init/init" "$IMAGES_DIR/init/rxe-setup" "$RDMA_PEER_SRC" \
    <(echo "$root $kdir"; gcc --version | head -1; dpkg-query -W libibverbs-dev 2>/dev/null))
cached rxe-initramfs "$k" build_rxe "$root" "$kdir"
