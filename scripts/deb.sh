#!/usr/bin/env bash
# Builds the Debian package of vrnic's guest side, vrnic-guest_<version>_<arch>.deb (version: the
# workspace's Cargo.toml; release build), with dpkg-deb alone (no cargo-deb, no debhelper):
#   scripts/deb.sh [--no-build] [OUTDIR]       (default OUTDIR: target/deb)
# Prints the package's path. --no-build packages what target/release holds (no cargo run).
# Install it in a guest with `dpkg -i vrnic-guest_*.deb` (then `apt-get -f install` if a dependency
# is missing). Contents:
#   /usr/lib/vrnic/libibverbs.so.1       vrnic's libibverbs (guest-lib/ibverbs), beside rdma-core's
#   /usr/lib/vrnic/librdmacm.so.1        vrnic's librdmacm (guest-lib/rdmacm), beside rdma-core's; it
#                                        needs libibverbs.so.1, vrnic's (the ld.so.conf order)
#   /etc/ld.so.conf.d/00-vrnic.conf      /usr/lib/vrnic, listed before the multiarch directory
#   /usr/bin/<DEB_TOOLS>                 vrnic's tools (tools/)
#   /usr/lib/vrnic/vrnic-agent           the guest agent libibverbs starts on first use (several
#                                        programs share the device through it)
#   /usr/share/doc/vrnic-guest/README    how a program uses it; copyright
# postinst and postrm run ldconfig. Depends: computed from the files' NEEDED entries and glibc
# symbol versions (objdump), so it is what they need at run time; no Conflicts/Provides: it
# installs beside Debian's libibverbs1 (another path) and leaves rdma-core as it is.
# The same inputs give the same bytes (file dates are SOURCE_DATE_EPOCH, default below), so the
# image recipe that installs it (images/vrnic-initramfs.sh, keyed on its content) rebuilds only when
# what is packaged changes.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)

# The binaries of the workspace that go to /usr/bin, each built by cargo under this name. A new
# guest program (a daemon of the driver, say) is one more word here.
DEB_TOOLS=(vrnic-probe vrnic-pingpong vrnic-write-imm vrnic-ud-pingpong vrnic-srq-pingpong vrnic-rdma)
# Their cargo packages, and the library's.
DEB_CARGO_PACKAGES=(vrnic-ibverbs vrnic-rdmacm vrnic-tools)

die() { echo "deb.sh: $*" >&2; exit 1; }

build=1
if [ "${1:-}" = --no-build ]; then
    build=0
    shift
fi
outdir=${1:-$top/target/deb}

version=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)"/\1/p' "$top/Cargo.toml")
[ -n "$version" ] || die "no version in [workspace.package] of $top/Cargo.toml"
arch=$(dpkg --print-architecture)
pkg=vrnic-guest
deb=$outdir/${pkg}_${version}_${arch}.deb
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1704067200} # 2024-01-01, any fixed date will do

if [ $build = 1 ]; then
    args=()
    for p in "${DEB_CARGO_PACKAGES[@]}"; do args+=(-p "$p"); done
    cargo build -q --release --manifest-path "$top/Cargo.toml" "${args[@]}" >&2 ||
        die "cargo build --release ${args[*]} failed"
fi
rel=$top/target/release
[ -f "$rel/libvrnic_ibverbs.so" ] || die "$rel/libvrnic_ibverbs.so not built"
[ -f "$rel/libvrnic_rdmacm.so" ] || die "$rel/libvrnic_rdmacm.so not built"

stage=$(mktemp -d "${TMPDIR:-/tmp}/vrnic-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root
doc=$root/usr/share/doc/$pkg
mkdir -p "$root/DEBIAN" "$root/usr/lib/vrnic" "$root/usr/bin" "$root/etc/ld.so.conf.d" "$doc"

install -m 0644 "$rel/libvrnic_ibverbs.so" "$root/usr/lib/vrnic/libibverbs.so.1"
strip --strip-debug "$root/usr/lib/vrnic/libibverbs.so.1"
install -m 0644 "$rel/libvrnic_rdmacm.so" "$root/usr/lib/vrnic/librdmacm.so.1"
strip --strip-debug "$root/usr/lib/vrnic/librdmacm.so.1"
for t in "${DEB_TOOLS[@]}"; do
    [ -f "$rel/$t" ] || die "$rel/$t not built"
    install -m 0755 "$rel/$t" "$root/usr/bin/$t"
    strip --strip-debug "$root/usr/bin/$t"
done
[ -f "$rel/vrnic-agent" ] || die "$rel/vrnic-agent not built"
install -m 0755 "$rel/vrnic-agent" "$root/usr/lib/vrnic/vrnic-agent"
strip --strip-debug "$root/usr/lib/vrnic/vrnic-agent"
echo /usr/lib/vrnic >"$root/etc/ld.so.conf.d/00-vrnic.conf"

cat >"$doc/README" <<'EOF'
vrnic-guest: the guest side of vrnic, a software RDMA NIC (RoCEv2) whose
device is a virtio-pci function of a VM.

/usr/lib/vrnic/libibverbs.so.1 has the ABI and every versioned symbol of
rdma-core's libibverbs.so.1 (Debian bookworm, rdma-core 44), so unmodified
rdma-core programs (ibv_devinfo, ibv_rc_pingpong, perftest's ib_*_bw, your
own) use the vrnic device through it. No RDMA kernel module is needed.

Which library a program loads:
  - /etc/ld.so.conf.d/00-vrnic.conf lists /usr/lib/vrnic ahead of the
    multiarch directory, so every program loads vrnic's library instead of
    rdma-core's (which stays installed, at its own path). Check with
      ldconfig -p | grep libibverbs.so.1       (the first line wins)
  - To choose per program instead, delete that file, run ldconfig, and
    start the program with LD_LIBRARY_PATH=/usr/lib/vrnic.

What it needs at run time:
  - root: the library drives the PCI function from user space
    (/sys/bus/pci, /proc/self/pagemap).
  - huge pages for its queues and DMA buffers, e.g. hugepages=64 on the
    kernel command line, or
      echo 64 > /proc/sys/vm/nr_hugepages
  - for completion events (ibv_get_cq_event, `-e` of the examples), the
    module uio_pci_generic:  modprobe uio_pci_generic
    The library binds the function to it (driver_override; it stays bound
    after the program ends) and sleeps on its interrupt. Without it, the
    library polls and says so.
  - VRNIC_PCI=0000:00:05.0 picks one function when there are several.

/usr/lib/vrnic/librdmacm.so.1 has every versioned symbol of rdma-core's
librdmacm.so.1 (rdma_cm), found first the same way, so rping, ucmatose,
udaddy, cmtime and perftest's -R run on vrnic unmodified. Its connection
manager (IB CM over RoCEv2, on the device's QP1) lives in vrnic-agent; it
connects to rxe, mlx5 and other Linux peers. Multicast and rsockets are not
implemented (ENOSYS); VRNIC_RDMACM_DEBUG=1 says why a call failed.

Several programs at once: the first program to open the device starts
/usr/lib/vrnic/vrnic-agent, which owns the device and serves every program
through /run/vrnic/agent.sock, each with objects of its own; a program that
exits or is killed leaves nothing behind. The agent exits 10 s after its
last program (log: /run/vrnic/agent.sock.log). `vrnic-agent --status`
shows the programs and the objects on the device. VRNIC_AGENT=off makes a
program open the device directly (then one program at a time).

The tools in /usr/bin (vrnic-probe, vrnic-pingpong, vrnic-ud-pingpong,
vrnic-srq-pingpong, vrnic-write-imm, vrnic-rdma) use the device directly,
without libibverbs; vrnic-probe checks that the device answers. Each
takes --help.
EOF
cat >"$doc/copyright" <<'EOF'
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: vrnic

Files: *
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF
chmod 0644 "$doc/README" "$doc/copyright"

# Depends: the packages of the shared libraries the files need (NEEDED), libc6 at least the newest
# GLIBC_ symbol version any of them uses (what dpkg-shlibdeps derives from libc6's symbols file).
needs=()
glibc=
for f in "$root/usr/lib/vrnic/libibverbs.so.1" "$root/usr/lib/vrnic/librdmacm.so.1" "$root/usr/lib/vrnic/vrnic-agent" "${DEB_TOOLS[@]/#/$root/usr/bin/}"; do
    while read -r n; do
        case $n in
        libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1 | ld-linux-x86-64.so.2) needs+=(libc6) ;;
        libgcc_s.so.1) needs+=(libgcc-s1) ;;
        # librdmacm.so.1's: the package's own libibverbs.so.1 (same directory, found first).
        libibverbs.so.1) [ -f "$root/usr/lib/vrnic/$n" ] || die "$f needs $n, not in the package" ;;
        *) die "$f needs $n: which package has it? (add it to deb.sh)" ;;
        esac
    done < <(objdump -p "$f" | awk '$1 == "NEEDED" { print $2 }')
    v=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
    glibc=$(printf '%s\n' $glibc $v | sort -V | tail -1)
done
depends=
for d in $(printf '%s\n' "${needs[@]}" | sort -u); do
    [ "$d" = libc6 ] && [ -n "$glibc" ] && d="libc6 (>= $glibc)"
    depends=${depends:+$depends, }$d
done

cat >"$root/DEBIAN/control" <<EOF
Package: $pkg
Version: $version
Architecture: $arch
Maintainer: vrnic developers <vrnic@localhost>
Installed-Size: $(du -sk --apparent-size --exclude=DEBIAN "$root" | cut -f1)
Depends: $depends
Recommends: ibverbs-utils, perftest
Section: net
Priority: optional
Description: vrnic guest library and tools (software RDMA NIC over virtio-pci)
 vrnic is a software RoCEv2 RDMA NIC that a VM sees as a virtio-pci
 function. This package is its guest side: a libibverbs.so.1 and a
 librdmacm.so.1 with rdma-core's ABI in /usr/lib/vrnic, which unmodified
 rdma-core programs load instead of rdma-core's (through
 /etc/ld.so.conf.d/00-vrnic.conf),
 and vrnic's own test tools (vrnic-probe, vrnic-pingpong, ...).
 It needs root, huge pages and, for completion events, uio_pci_generic;
 see /usr/share/doc/vrnic-guest/README.
EOF
echo /etc/ld.so.conf.d/00-vrnic.conf >"$root/DEBIAN/conffiles"
cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    ldconfig
fi
EOF
cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
case "$1" in
remove | purge) ldconfig ;;
esac
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/etc/ld.so.conf.d/00-vrnic.conf"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkdir -p "$outdir"
dpkg-deb --build --root-owner-group -Zxz "$root" "$stage/$pkg.deb" >/dev/null
mv "$stage/$pkg.deb" "$deb"
echo "$deb"
