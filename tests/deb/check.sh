#!/usr/bin/env bash
# The Debian package's fast test (part of scripts/test.sh's fast part; ~20 s once the release build
# is there): builds vrnic-guest_*.deb with scripts/deb.sh into a temporary directory and checks
#   1. its control fields (name, version = the workspace's, Depends libc6, Recommends, and no
#      Conflicts/Provides/Replaces/Breaks that could push rdma-core's libibverbs1 out) and
#      maintainer scripts (ldconfig; the conf file a conffile);
#   2. its file list (dpkg-deb -c), exactly;
#   3. the extracted library (dpkg-deb -x): soname libibverbs.so.1 and every versioned symbol of
#      guest-lib/ibverbs/libibverbs.map exported, nothing else (as guest-lib/ibverbs/tests/exports.rs
#      checks the cargo product); librdmacm.so.1: soname, NEEDED libibverbs.so.1, exports equal to
#      Debian's librdmacm.so.1 (else to guest-lib/rdmacm/librdmacm.map);
#   4. with LD_LIBRARY_PATH=<extracted>/usr/lib/vrnic, Debian's ibv_devinfo and perftest's
#      ib_write_bw (when installed) bind to it with every symbol resolved (ldd -r), rping to both
#      libraries, and
#      ibv_devices runs on it;
#   5. in a scratch root holding the package's files, Debian's libibverbs.so.1, this host's
#      ld.so.conf and glibc: ldconfig -r lists vrnic's libraries first and the dynamic linker
#      (ld.so --list, chrooted, through the cache ldconfig made) picks it for ibv_devinfo.
# Runs as root or, for step 5, in a user namespace (unshare -r). Prints PASS/FAIL lines; exit status
# 1 when any check failed.
#   tests/deb/check.sh [--no-build]      (--no-build: passed to scripts/deb.sh)
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vrnic-deb-check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

failed=0
pass() { echo "PASS: deb: $*"; }
fail() {
    echo "FAIL: deb: $*"
    failed=1
}

deb=$("$top/scripts/deb.sh" "$@" "$tmp/out")
echo "deb: $(basename "$deb"), $(du -k "$deb" | cut -f1) KiB"

# 1. Control fields and maintainer scripts.
version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)"/\1/p' "$top/Cargo.toml")
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = vrnic-guest ] && [ "$(field Version)" = "$version" ] &&
    [ "$(basename "$deb")" = "vrnic-guest_${version}_$(dpkg --print-architecture).deb" ] &&
    pass "name and version $version" || fail "name/version: $(field Package) $(field Version) $(basename "$deb")"
[[ "$(field Depends)" =~ ^libc6\ \(\>=\ 2\.[0-9]+\) ]] && pass "Depends: $(field Depends)" ||
    fail "Depends: $(field Depends)"
[ "$(field Recommends)" = "ibverbs-utils, perftest" ] && pass "Recommends: $(field Recommends)" ||
    fail "Recommends: $(field Recommends)"
bad=$(dpkg-deb -I "$deb" control | grep -E '^(Conflicts|Provides|Replaces|Breaks|Pre-Depends):' || true)
[ -z "$bad" ] && pass "no Conflicts/Provides/Replaces/Breaks" || fail "fields that touch rdma-core: $bad"
dpkg-deb -e "$deb" "$tmp/control"
grep -qx '    ldconfig' "$tmp/control/postinst" && grep -q 'remove | purge) ldconfig' "$tmp/control/postrm" &&
    [ "$(cat "$tmp/control/conffiles")" = /etc/ld.so.conf.d/00-vrnic.conf ] &&
    pass "postinst/postrm run ldconfig; 00-vrnic.conf is a conffile" || fail "maintainer scripts or conffiles"

# 2. The file list.
expected=(./etc/ld.so.conf.d/00-vrnic.conf ./usr/lib/vrnic/libibverbs.so.1 ./usr/lib/vrnic/librdmacm.so.1
    ./usr/lib/vrnic/vrnic-agent
    ./usr/share/doc/vrnic-guest/README ./usr/share/doc/vrnic-guest/copyright)
for t in vrnic-probe vrnic-pingpong vrnic-write-imm vrnic-ud-pingpong vrnic-srq-pingpong vrnic-rdma; do
    expected+=("./usr/bin/$t")
done
files=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { print $6 }' | LC_ALL=C sort)
want=$(printf '%s\n' "${expected[@]}" | LC_ALL=C sort)
[ "$files" = "$want" ] && pass "files: ${#expected[@]}, as expected" ||
    fail "files differ (-expected +package):
$(diff <(echo "$want") <(echo "$files") | grep '^[<>]' || true)"
dpkg-deb -c "$deb" | awk '$2 != "root/root" { bad = 1 } END { exit bad }' && pass "all files root:root" ||
    fail "files not owned by root"

# 3. The library as extracted.
x=$tmp/x
dpkg-deb -x "$deb" "$x"
lib=$x/usr/lib/vrnic/libibverbs.so.1
[ "$(cat "$x/etc/ld.so.conf.d/00-vrnic.conf")" = /usr/lib/vrnic ] && pass "00-vrnic.conf lists /usr/lib/vrnic" ||
    fail "00-vrnic.conf: $(cat "$x/etc/ld.so.conf.d/00-vrnic.conf")"
readelf -d -W "$lib" | grep -q 'Library soname: \[libibverbs.so.1\]' && pass "soname libibverbs.so.1" ||
    fail "no soname libibverbs.so.1"
# name@@NODE (name@NODE for `# compat`) for every symbol line of the map; the library's defined,
# versioned, non-local dynamic symbols (the version nodes' own entries are among both).
awk '/\{/ { node = $1; next }
     /;/ { s = $0; sub(/;.*/, "", s); gsub(/^[ \t]+|[ \t]+$/, "", s)
           if (s == "" || s ~ /[ :*}]/) next
           print s (index($0, "# compat") ? "@" : "@@") node }' \
    "$top/guest-lib/ibverbs/libibverbs.map" | LC_ALL=C sort >"$tmp/map"
readelf --dyn-syms -W "$lib" | awk 'NF >= 8 && $7 != "UND" && $5 != "LOCAL" && $8 ~ /@/ { print $8 }' |
    LC_ALL=C sort >"$tmp/exports"
n=$(wc -l <"$tmp/map")
if [ "$n" -gt 150 ] && cmp -s "$tmp/map" "$tmp/exports"; then
    pass "exports the map's $n versioned symbols, no others"
else
    fail "exports differ from libibverbs.map ($n symbols):
$(diff "$tmp/map" "$tmp/exports" | grep '^[<>]' | head -20 || true)"
fi

# librdmacm.so.1: its soname, NEEDED libibverbs.so.1 (the package's, by the ld.so.conf order), and
# exactly the versioned exports of Debian's librdmacm.so.1 (librdmacm1) where it is installed, else
# of guest-lib/rdmacm/librdmacm.map (as guest-lib/rdmacm/tests/exports.rs checks).
cm=$x/usr/lib/vrnic/librdmacm.so.1
readelf -d -W "$cm" | grep -q 'Library soname: \[librdmacm.so.1\]' &&
    readelf -d -W "$cm" | grep -q 'Shared library: \[libibverbs.so.1\]' &&
    pass "librdmacm.so.1: soname librdmacm.so.1, NEEDED libibverbs.so.1" || fail "librdmacm.so.1: soname/NEEDED"
dyn_exports() {
    readelf --dyn-syms -W "$1" | awk 'NF >= 8 && $7 != "UND" && $5 != "LOCAL" && $8 ~ /@/ { print $8 }' |
        LC_ALL=C sort -u
}
dyn_exports "$cm" >"$tmp/cm-exports"
debian_cm=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/librdmacm.so.1
if [ -f "$debian_cm" ]; then
    dyn_exports "$(readlink -f "$debian_cm")" >"$tmp/cm-debian"
    what="Debian's $debian_cm"
else
    awk '/\{/ { node = $1; next }
         /;/ { s = $0; sub(/;.*/, "", s); gsub(/^[ \t]+|[ \t]+$/, "", s)
               if (s == "" || s ~ /[ :*}]/) next
               print s (index($0, "# compat") ? "@" : "@@") node }' \
        "$top/guest-lib/rdmacm/librdmacm.map" | LC_ALL=C sort -u >"$tmp/cm-debian"
    what="guest-lib/rdmacm/librdmacm.map (librdmacm1 not installed)"
fi
n=$(wc -l <"$tmp/cm-debian")
if [ "$n" -gt 60 ] && cmp -s "$tmp/cm-debian" "$tmp/cm-exports"; then
    pass "librdmacm.so.1 exports the $n versioned symbols of $what, no others"
else
    fail "librdmacm.so.1's exports differ from $what ($n symbols):
$(diff "$tmp/cm-debian" "$tmp/cm-exports" | grep '^[<>]' | head -20 || true)"
fi

# 4. Debian's programs on the extracted library, through LD_LIBRARY_PATH.
for p in /usr/bin/ibv_devinfo /usr/bin/ib_write_bw; do
    if [ ! -x "$p" ]; then
        echo "skip: $p not installed (ibverbs-utils, perftest)"
        continue
    fi
    out=$(LD_LIBRARY_PATH=$x/usr/lib/vrnic ldd -r "$p" 2>&1) || true
    if grep -q "libibverbs.so.1 => $lib " <<<"$out" && ! grep -qiE 'undefined symbol|not found' <<<"$out"; then
        pass "$(basename "$p") binds to it, every symbol resolved (ldd -r)"
    else
        fail "$(basename "$p") on the extracted library: $out"
    fi
done
if [ -x /usr/bin/rping ]; then
    out=$(LD_LIBRARY_PATH=$x/usr/lib/vrnic ldd -r /usr/bin/rping 2>&1) || true
    if grep -q "librdmacm.so.1 => $cm " <<<"$out" && grep -q "libibverbs.so.1 => $lib " <<<"$out" &&
        ! grep -qiE 'undefined symbol|not found' <<<"$out"; then
        pass "rping binds to its librdmacm.so.1 and libibverbs.so.1, every symbol resolved (ldd -r)"
    else
        fail "rping on the extracted libraries: $out"
    fi
else
    echo "skip: /usr/bin/rping not installed (rdmacm-utils)"
fi
if [ -x /usr/bin/ibv_devices ]; then
    if out=$(LD_LIBRARY_PATH=$x/usr/lib/vrnic timeout 20 /usr/bin/ibv_devices 2>&1); then
        pass "ibv_devices runs on it"
    else
        fail "ibv_devices on the extracted library: $out"
    fi
fi

# 5. What ldconfig and ld.so make of the conf file, in a scratch root: the package's files, this
# host's ld.so.conf(.d) and glibc, Debian's libibverbs.so.1 (libibverbs1) where rdma-core has it.
multi=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
debian_lib=/usr/lib/$multi/libibverbs.so.1
devinfo=/usr/bin/ibv_devinfo
if [ ! -f "$debian_lib" ] || [ ! -x "$devinfo" ]; then
    echo "skip: scratch-root check (needs libibverbs1 and ibverbs-utils installed)"
else
    sr=$tmp/sr
    cp -a "$x" "$sr"
    mkdir -p "$sr/usr/lib/$multi" "$sr/usr/bin" "$sr/lib64"
    cp /etc/ld.so.conf "$sr/etc/"
    cp /etc/ld.so.conf.d/*.conf "$sr/etc/ld.so.conf.d/" 2>/dev/null || true
    cp "$x/etc/ld.so.conf.d/00-vrnic.conf" "$sr/etc/ld.so.conf.d/" # the package's, not the host's
    cp -L "$debian_lib" "$sr/usr/lib/$multi/libibverbs.so.1"
    debian_cm=/usr/lib/$multi/librdmacm.so.1
    [ -f "$debian_cm" ] && cp -L "$debian_cm" "$sr/usr/lib/$multi/librdmacm.so.1"
    for l in libc.so.6 libgcc_s.so.1; do cp -L "/usr/lib/$multi/$l" "$sr/usr/lib/$multi/"; done
    cp -L /lib64/ld-linux-x86-64.so.2 "$sr/lib64/"
    cp "$devinfo" "$sr/usr/bin/"
    asroot=()
    [ "$(id -u)" = 0 ] || asroot=(unshare -r)
    if ! "${asroot[@]}" ldconfig -r "$sr" 2>"$tmp/ldconfig.err"; then
        fail "ldconfig -r: $(cat "$tmp/ldconfig.err")"
    else
        first=$("${asroot[@]}" ldconfig -r "$sr" -p | sed -n 's/^\tlibibverbs.so.1 .* => //p' | head -1)
        [ "$first" = /usr/lib/vrnic/libibverbs.so.1 ] && pass "ldconfig -r lists vrnic's library first" ||
            fail "ldconfig -r lists $first first"
        first=$("${asroot[@]}" ldconfig -r "$sr" -p | sed -n 's/^\tlibrdmacm.so.1 .* => //p' | head -1)
        [ "$first" = /usr/lib/vrnic/librdmacm.so.1 ] && pass "ldconfig -r lists vrnic's librdmacm.so.1 first" ||
            fail "ldconfig -r lists $first first for librdmacm.so.1"
        out=$("${asroot[@]}" chroot "$sr" /lib64/ld-linux-x86-64.so.2 --list /usr/bin/ibv_devinfo 2>&1) || true
        grep -q 'libibverbs.so.1 => /usr/lib/vrnic/libibverbs.so.1 ' <<<"$out" &&
            pass "ld.so picks /usr/lib/vrnic/libibverbs.so.1 for ibv_devinfo" ||
            fail "ld.so, in the scratch root: $out"
    fi
fi

[ $failed = 0 ] && echo "deb: all checks passed" || echo "deb: some checks FAILED"
exit $failed
