#!/usr/bin/env bash
# Which QEMU the scripts pick (scripts/qemu-root.sh), on this machine, for every case a user meets:
#   1. the QEMU on the PATH as it is here (CI installs bookworm's 7.2, which lacks the device and
#      answers `-device vhost-user-test-device-pci,help` with exit status 0): the trixie-backports
#      fallback, with a "QEMU: ... lacks ...; using ..." line;
#   2. a capable QEMU first on the PATH: used as it is ("host PATH");
#   3. VRNIC_QEMU naming a capable QEMU: used; naming an incapable one or a missing file: a clear
#      error, never a silent fallback;
#   4. a capable QEMU on the PATH really boots the guest kernel through vr_qemu_exec (the kernel
#      panics for want of a root file system, which is all this needs).
# The capable QEMU is the trixie-backports one behind a small wrapper (chroot with /dev, /proc
# and the cache bind-mounted in a private mount namespace), so the test needs no second QEMU.
# Prints PASS:/FAIL: lines; exit status 0 iff no FAIL. Needs root (chroot, unshare).
#   tests/e2e/qemu-select.sh                 (run by tests/e2e/run.sh as its qemu-select step)
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
cache=${VRNIC_CACHE:-/var/cache/vrnic}
root=$cache/trixie-qemu
failed=0
pass() { echo "PASS: qemu-select: $*"; }
fail() { failed=1; echo "FAIL: qemu-select: $*"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# select [ENV...]: runs qemu-root.sh with ENV; sets OUT (stdout), ERR (stderr), RC.
select_qemu() {
    env "$@" "$top/scripts/qemu-root.sh" >"$tmp/out" 2>"$tmp/err"
    RC=$?
    OUT=$(cat "$tmp/out") ERR=$(cat "$tmp/err")
}

# 1. As installed here (ensures the trixie root exists for the cases below).
sys=$(command -v qemu-system-x86_64 || true) sys_old=0
select_qemu
if [ $RC != 0 ]; then
    fail "qemu-root.sh failed (exit $RC): $ERR"
    exit 1
fi
if [ -z "$sys" ]; then
    if [ "$OUT" = "chroot $root" ] && grep -q "^QEMU: no qemu-system-x86_64 on the PATH; using the trixie-backports QEMU 1[1-9]\." <<<"$ERR"; then
        pass "no system QEMU: trixie-backports fallback ($(tail -1 <<<"$ERR"))"
    else
        fail "no system QEMU: got '$OUT' / $ERR"
    fi
else
    sysver=$("$sys" --version | sed -n '1s/^QEMU emulator version \([^ ]*\).*/\1/p')
    case $sysver in
    [0-9].* | 10.[01].*)
        # Older than 10.2: it must be refused, whatever its exit status says.
        sys_old=1
        if [ "$OUT" = "chroot $root" ] &&
            grep -q "^QEMU: $sys $sysver lacks vhost-user-test-device-pci.*; using the trixie-backports QEMU 1[1-9]\." <<<"$ERR"; then
            pass "system QEMU $sysver refused, trixie-backports fallback ($(tail -1 <<<"$ERR"))"
        else
            fail "system QEMU $sysver: got '$OUT' / $ERR"
        fi
        ;;
    *)
        if [ "$OUT" = "host $sys" ]; then pass "system QEMU $sysver used"; else fail "system QEMU $sysver: got '$OUT' / $ERR"; fi
        ;;
    esac
fi

# A capable QEMU outside a chroot: the trixie one behind a wrapper.
mkdir -p "$tmp/bin"
cat >"$tmp/bin/qemu-system-x86_64" <<EOF
#!/bin/sh
# Test wrapper: the trixie-backports QEMU from $root, with /dev, /proc and the cache visible.
exec unshare -m --propagation private sh -c '
    mount --rbind /dev "$root/dev" && mount -t proc proc "$root/proc" &&
    mkdir -p "$root$cache" && mount --bind "$cache" "$root$cache" || exit 99
    exec chroot "$root" qemu-system-x86_64 "\$@"' sh "\$@"
EOF
chmod +x "$tmp/bin/qemu-system-x86_64"
wrapper=$tmp/bin/qemu-system-x86_64

# 2. A capable QEMU first on the PATH.
select_qemu PATH="$tmp/bin:$PATH"
if [ $RC = 0 ] && [ "$OUT" = "host $wrapper" ] && grep -q "^QEMU: using $wrapper 1[1-9]\." <<<"$ERR"; then
    pass "capable QEMU on the PATH used ($ERR)"
else
    fail "capable QEMU on the PATH: exit $RC, '$OUT' / $ERR"
fi

# 3. VRNIC_QEMU: capable, incapable, missing.
select_qemu VRNIC_QEMU="$wrapper"
if [ $RC = 0 ] && [ "$OUT" = "host $wrapper" ] && grep -q "^QEMU: using VRNIC_QEMU=$wrapper 1[1-9]\." <<<"$ERR"; then
    pass "VRNIC_QEMU=<capable> used"
else
    fail "VRNIC_QEMU=<capable>: exit $RC, '$OUT' / $ERR"
fi
if [ $sys_old = 1 ]; then
    select_qemu VRNIC_QEMU="$sys"
    if [ $RC != 0 ] && [ -z "$OUT" ] && grep -q "^QEMU: VRNIC_QEMU=$sys $sysver lacks vhost-user-test-device-pci" <<<"$ERR"; then
        pass "VRNIC_QEMU=<QEMU $sysver> refused with: $ERR"
    else
        fail "VRNIC_QEMU=<QEMU $sysver>: exit $RC, '$OUT' / $ERR"
    fi
fi
# A QEMU that behaves like 7.2 (the message, exit status 0), whatever is installed here.
cat >"$tmp/old-qemu" <<'EOF'
#!/bin/sh
case "$*" in
--version) echo "QEMU emulator version 7.2.22 (fake)" ;;
"-device help") echo 'name "virtio-net-pci", bus PCI' ;;
*) echo "qemu-system-x86_64: -device $2: Device 'vhost-user-test-device-pci' not found" >&2 ;;
esac
exit 0
EOF
chmod +x "$tmp/old-qemu"
select_qemu VRNIC_QEMU="$tmp/old-qemu"
if [ $RC != 0 ] && grep -q "lacks vhost-user-test-device-pci" <<<"$ERR"; then
    pass "a QEMU that says 'not found' with exit status 0 is refused"
else
    fail "fake 7.2-like QEMU: exit $RC, '$OUT' / $ERR"
fi
select_qemu VRNIC_QEMU="$tmp/no-such-qemu"
if [ $RC != 0 ] && grep -q "^QEMU: VRNIC_QEMU=$tmp/no-such-qemu is not an executable" <<<"$ERR"; then
    pass "VRNIC_QEMU=<missing> refused"
else
    fail "VRNIC_QEMU=<missing>: exit $RC, '$OUT' / $ERR"
fi

# 4. The host path boots: vr_qemu_exec with VR_QEMU_BIN and an empty root, as vr_guest runs it.
kernel=$(find "$cache" -maxdepth 2 -path '*/kernel-*/vmlinuz' | head -1)
if [ -z "$kernel" ]; then
    echo "qemu-select: no guest kernel in $cache yet (images not built): boot check skipped"
else
    # shellcheck source=scripts/lib.sh
    bootlog=$tmp/boot.log
    (
        . "$top/scripts/lib.sh"
        export VR_QEMU_BIN=$wrapper
        exec timeout -k 5 120 bash -c "$(declare -f vr_qemu_exec); vr_qemu_exec '' -- \"\$@\"" vr_qemu_exec \
            -accel tcg -m 256 -nodefaults -no-user-config -display none -no-reboot -serial stdio \
            -kernel "$kernel" -append 'console=ttyS0 panic=-1'
    ) </dev/null >"$bootlog" 2>&1
    if grep -q 'VFS: Unable to mount root' "$bootlog"; then
        pass "a capable QEMU on the PATH boots the guest kernel (VR_QEMU_BIN, no chroot)"
    else
        fail "boot through VR_QEMU_BIN=$wrapper: $(tail -3 "$bootlog" | tr '\n' ' ')"
    fi
fi
exit $failed
