#!/usr/bin/env bash
# Prints the command prefix that runs a QEMU able to create vhost-user-test-device-pci.
# Uses the system QEMU when it can; otherwise builds (once, cached) a Debian trixie root
# with qemu-system-x86 from trixie-backports and prints "chroot ROOT".
# Cache: ${VRNIC_CACHE:-/var/cache/vrnic}/trixie-qemu, rebuilt when the recipe below changes
# (ROOT/.vrnic-recipe holds the hash of the function build below). Run QEMU from it with /dev,
# /proc and the directories holding sockets, kernel and initrds bind-mounted into ROOT
# (scripts/lib.sh: vr_qemu_exec does that in a private mount namespace).
set -euo pipefail
cache=${VRNIC_CACHE:-/var/cache/vrnic}
root=$cache/trixie-qemu
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if command -v qemu-system-x86_64 >/dev/null 2>&1 &&
   qemu-system-x86_64 -device vhost-user-test-device-pci,help >/dev/null 2>&1; then
    echo ""
    exit 0
fi
# The recipe: build() (its text is the cache key).
build() {
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
    rm -rf "$root.tmp"
    debootstrap --variant=minbase trixie "$root.tmp" "$mirror" >"$cache/trixie-qemu.log" 2>&1 ||
        { tail -20 "$cache/trixie-qemu.log" >&2; echo "qemu-root: debootstrap failed" >&2; exit 1; }
    echo "deb $mirror trixie-backports main" > "$root.tmp/etc/apt/sources.list.d/backports.list"
    printf '#!/bin/sh\nexit 101\n' >"$root.tmp/usr/sbin/policy-rc.d"
    chmod +x "$root.tmp/usr/sbin/policy-rc.d"
    chroot "$root.tmp" apt-get update -qq >&2
    chroot "$root.tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        -t trixie-backports qemu-system-x86 >>"$cache/trixie-qemu.log" 2>&1 ||
        { tail -20 "$cache/trixie-qemu.log" >&2; echo "qemu-root: apt-get failed" >&2; exit 1; }
    chroot "$root.tmp" apt-get clean >&2
    chroot "$root.tmp" qemu-system-x86_64 -device vhost-user-test-device-pci,help >/dev/null ||
        { echo "qemu-root: this QEMU has no vhost-user-test-device-pci" >&2; exit 1; }
    echo "$recipe" >"$root.tmp/.vrnic-recipe"
    # Swap in; an old root (other recipe) goes away only once the new one is complete.
    # Never delete through a mount someone left inside the old root (a bind-mounted /dev...).
    if [ -e "$root" ]; then
        if grep -qE " $root(/| )" /proc/self/mountinfo; then
            echo "qemu-root: something is mounted under $root; keeping it as $root.old-$$" >&2
            mv "$root" "$root.old-$$"
        else
            mv "$root" "$root.old"
            rm -rf --one-file-system "$root.old"
        fi
    fi
    mv "$root.tmp" "$root"
}
recipe=$(declare -f build | sha256sum | cut -c1-16)
mkdir -p "$cache"
(
    flock 9
    # A root from before the stamp existed is adopted if its QEMU has the device.
    if [ -x "$root/usr/bin/qemu-system-x86_64" ] && [ ! -e "$root/.vrnic-recipe" ] &&
        chroot "$root" qemu-system-x86_64 -device vhost-user-test-device-pci,help >/dev/null 2>&1; then
        echo "$recipe" >"$root/.vrnic-recipe"
    fi
    if [ ! -x "$root/usr/bin/qemu-system-x86_64" ] || [ "$(cat "$root/.vrnic-recipe" 2>/dev/null)" != "$recipe" ]; then
        echo "qemu-root: building $root (recipe $recipe)" >&2
        build
    fi
) 9>"$cache/trixie-qemu.lock"
echo "chroot $root"
