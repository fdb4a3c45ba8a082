#!/usr/bin/env bash
# Recipe: the vrnic guest's initramfs: Debian's busybox-static, the 6.12 modules for virtio-net
# and fw_cfg, the job-running /init (images/init/init) and the static guest-lib tools.
# Usage: vrnic-initramfs.sh [BINARY...]   each BINARY (a static executable) goes to /usr/bin;
# missing ones are skipped with a warning. Output directory: initramfs.cpio. Prints the directory.
set -euo pipefail
# shellcheck source=images/common.sh
. "$(dirname "$0")/common.sh"

MODULES=(virtio_net qemu_fw_cfg uio_pci_generic)

build_vrnic() {
    local out=$1 root=$2 kdir=$3 st=$1/staging deb b
    shift 3
    mkdir -p "$st"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root}
    # busybox-static, downloaded and unpacked (not installed) inside the bookworm root.
    rm -rf "$root/tmp/bb-dl" && mkdir -p "$root/tmp/bb-dl"
    chroot "$root" sh -c 'cd /tmp/bb-dl && apt-get download -qq -o APT::Sandbox::User=root busybox-static'
    deb=$(ls "$root"/tmp/bb-dl/busybox-static_*.deb)
    dpkg-deb -x "$deb" "$out/bb"
    rm -rf "$root/tmp/bb-dl"
    install -m 0755 "$out/bb/bin/busybox" "$st/bin/busybox"
    rm -rf "$out/bb"
    # One symlink per applet (the list comes from the binary itself).
    for b in $("$st/bin/busybox" --list-full); do
        [ -e "$st/$b" ] || ln -s /bin/busybox "$st/$b"
    done
    copy_modules "$kdir" "$st" "${MODULES[@]}"
    install -m 0755 "$IMAGES_DIR/init/init" "$st/init"
    for b in "$@"; do
        install -m 0755 "$b" "$st/usr/bin/$(basename "$b")"
        strip --strip-debug "$st/usr/bin/$(basename "$b")" 2>/dev/null || true
    done
    pack_cpio "$st" "$out/initramfs.cpio"
    rm -rf "$st"
    log "vrnic initramfs: $(du -k "$out/initramfs.cpio" | cut -f1) KiB, tools: ${*:-none}"
}

bins=()
for b in "$@"; do
    if [ -f "$b" ]; then
        readelf -l "$b" 2>/dev/null | grep 'program interpreter' >/dev/null &&
            log "warning: $b is dynamically linked; the guest has no libc (build with crt-static)"
        bins+=("$(readlink -f "$b")")
    else
        log "warning: $b not found, not included"
    fi
done
root=$("$IMAGES_DIR/bookworm-root.sh")
kdir=$("$IMAGES_DIR/kernel.sh")
k=$(key "$IMAGES_DIR/common.sh" "$0" "$IMAGES_DIR/init/init" <(echo "$root $kdir ${bins[*]}") \
    ${bins[@]+"${bins[@]}"})
cached vrnic-initramfs "$k" build_vrnic "$root" "$kdir" ${bins[@]+"${bins[@]}"}
