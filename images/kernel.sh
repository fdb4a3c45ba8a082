#!/usr/bin/env bash
# Recipe: the shared guest kernel, Debian's linux-image 6.12 from bookworm-backports.
# Output directory: vmlinuz, config, version (the KVER string), lib/modules/KVER/... (all modules,
# decompressed, with a matching modules.dep). Prints the directory.
set -euo pipefail
# shellcheck source=images/common.sh
. "$(dirname "$0")/common.sh"

build_kernel() {
    local out=$1 root=$2 pkg deb kver
    # The metapackage from backports names the versioned image package.
    pkg=$(chroot "$root" apt-cache depends -t bookworm-backports linux-image-amd64 |
        awk '/Depends: linux-image-6\.12/ { print $2; exit }')
    [ -n "$pkg" ] || die "no linux-image-6.12 in bookworm-backports"
    rm -rf "$root/tmp/kernel-dl" && mkdir -p "$root/tmp/kernel-dl"
    chroot "$root" sh -c "cd /tmp/kernel-dl && apt-get download -qq -o APT::Sandbox::User=root -t bookworm-backports $pkg"
    deb=$(ls "$root"/tmp/kernel-dl/*.deb)
    dpkg-deb -x "$deb" "$out/pkg"
    rm -rf "$root/tmp/kernel-dl"
    kver=$(ls "$out/pkg/lib/modules")
    echo "$kver" >"$out/version"
    echo "$pkg" >"$out/package"
    mv "$out/pkg/boot/vmlinuz-$kver" "$out/vmlinuz"
    mv "$out/pkg/boot/config-$kver" "$out/config"
    mkdir -p "$out/lib/modules"
    mv "$out/pkg/lib/modules/$kver" "$out/lib/modules/$kver"
    rm -rf "$out/pkg"
    # Plain .ko files: busybox's insmod and the guests need no decompressor.
    find "$out/lib/modules/$kver" -name '*.ko.xz' -print0 | xargs -0 -r -P2 -n64 xz -d
    find "$out/lib/modules/$kver" -name '*.ko.zst' -print0 | xargs -0 -r -P2 -n64 zstd -q -d --rm
    depmod -b "$out" "$kver"
    log "kernel $pkg ($kver)"
}

root=$("$IMAGES_DIR/bookworm-root.sh")
cached kernel "$(key "$0" <(echo "$root"))" build_kernel "$root"
