#!/usr/bin/env bash
# Prints the command prefix that runs a QEMU able to create vhost-user-test-device-pci.
# Uses the system QEMU when it can; otherwise builds (once, cached) a Debian trixie root
# with qemu-system-x86 from trixie-backports and prints "chroot ROOT".
# Cache: ${VRNIC_CACHE:-/var/cache/vrnic}/trixie-qemu
set -euo pipefail
cache=${VRNIC_CACHE:-/var/cache/vrnic}
root=$cache/trixie-qemu
if command -v qemu-system-x86_64 >/dev/null 2>&1 &&
   qemu-system-x86_64 -device vhost-user-test-device-pci,help >/dev/null 2>&1; then
    echo ""
    exit 0
fi
if [ ! -x "$root/usr/bin/qemu-system-x86_64" ]; then
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
    rm -rf "$root.tmp"
    mkdir -p "$cache"
    debootstrap --variant=minbase trixie "$root.tmp" http://deb.debian.org/debian >&2
    echo "deb http://deb.debian.org/debian trixie-backports main" > "$root.tmp/etc/apt/sources.list.d/backports.list"
    chroot "$root.tmp" apt-get update -qq >&2
    chroot "$root.tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t trixie-backports qemu-system-x86 >&2
    chroot "$root.tmp" apt-get clean >&2
    mv "$root.tmp" "$root"
fi
echo "chroot $root"
