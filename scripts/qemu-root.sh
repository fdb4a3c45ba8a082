#!/usr/bin/env bash
# Finds a QEMU able to create vhost-user-test-device-pci (QEMU >= 10.2) and prints, as one line,
# how to run it:
#   host PATH      run the binary PATH directly
#   chroot ROOT    run qemu-system-x86_64 inside the chroot ROOT
# and on stderr one line "QEMU: ..." saying which QEMU is used and why. In order:
#   1. $VRNIC_QEMU, if set: a user's own qemu-system-x86_64; it must be capable, or this fails.
#   2. qemu-system-x86_64 on the PATH, if capable (Debian bookworm's 7.2 and bookworm-backports'
#      10.0 are not: the device came with QEMU 10.2).
#   3. A Debian trixie root with qemu-system-x86 from trixie-backports, built once and cached:
#      ${VRNIC_CACHE:-/var/cache/vrnic}/trixie-qemu, rebuilt when the recipe below changes
#      (ROOT/.vrnic-recipe holds the hash of the function build below). Run QEMU from it with
#      /dev, /proc and the directories holding sockets, kernel and initrds bind-mounted into ROOT
#      (scripts/lib.sh: vr_qemu_exec does that in a private mount namespace).
# "Capable" is decided from what QEMU prints, never from its exit status: QEMU 7.2 answers
# `-device vhost-user-test-device-pci,help` with "Device ... not found" and exits 0. The device
# must be listed by `-device help` (which lists only user-creatable devices; 10.0's
# vhost-user-device-pci is not) and its property list must have the properties vrnic uses.
set -euo pipefail
cache=${VRNIC_CACHE:-/var/cache/vrnic}
root=$cache/trixie-qemu
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEVICE=vhost-user-test-device-pci

# qemu_capable CMD...: true iff the QEMU run by CMD can create $DEVICE with the properties used.
qemu_capable() {
    local out p
    out=$("$@" -device help 2>&1 </dev/null) || return 1
    grep -q "^name \"$DEVICE\"" <<<"$out" || return 1
    out=$("$@" -device "$DEVICE,help" 2>&1 </dev/null) || return 1
    for p in chardev virtio-id num_vqs vq_size config_size; do
        grep -q "^ *$p=" <<<"$out" || return 1
    done
}
# qemu_version CMD...: the version QEMU prints ("7.2.22"), or "(version unknown)".
qemu_version() {
    local v
    v=$("$@" --version 2>/dev/null </dev/null | sed -n '1s/^QEMU emulator version \([^ ]*\).*/\1/p') || true
    echo "${v:-(version unknown)}"
}

if [ -n "${VRNIC_QEMU:-}" ]; then
    bin=$(command -v "$VRNIC_QEMU" 2>/dev/null) && [ -x "$bin" ] ||
        { echo "QEMU: VRNIC_QEMU=$VRNIC_QEMU is not an executable" >&2; exit 1; }
    if ! qemu_capable "$bin"; then
        echo "QEMU: VRNIC_QEMU=$bin $(qemu_version "$bin") lacks $DEVICE (needs QEMU >= 10.2);" \
            "unset VRNIC_QEMU to use the system's or the trixie-backports QEMU" >&2
        exit 1
    fi
    echo "QEMU: using VRNIC_QEMU=$bin $(qemu_version "$bin")" >&2
    echo "host $bin"
    exit 0
fi
why="no qemu-system-x86_64 on the PATH"
if bin=$(command -v qemu-system-x86_64 2>/dev/null); then
    if qemu_capable "$bin"; then
        echo "QEMU: using $bin $(qemu_version "$bin") (has $DEVICE)" >&2
        echo "host $bin"
        exit 0
    fi
    why="$bin $(qemu_version "$bin") lacks $DEVICE (needs QEMU >= 10.2)"
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
    qemu_capable chroot "$root.tmp" qemu-system-x86_64 ||
        { echo "qemu-root: the trixie-backports QEMU has no usable $DEVICE" >&2; exit 1; }
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
        qemu_capable chroot "$root" qemu-system-x86_64; then
        echo "$recipe" >"$root/.vrnic-recipe"
    fi
    if [ ! -x "$root/usr/bin/qemu-system-x86_64" ] || [ "$(cat "$root/.vrnic-recipe" 2>/dev/null)" != "$recipe" ]; then
        echo "qemu-root: $why; building $root (recipe $recipe, about a minute)" >&2
        build
    fi
) 9>"$cache/trixie-qemu.lock"
echo "QEMU: $why; using the trixie-backports QEMU $(qemu_version chroot "$root" qemu-system-x86_64) in $root" \
    "(VRNIC_QEMU=/path/to/qemu-system-x86_64 uses your own)" >&2
echo "chroot $root"
