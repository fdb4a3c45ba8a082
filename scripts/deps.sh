#!/usr/bin/env bash
# Installs (apt-get, Debian packages only) what the demo, the images and the e2e test need on the
# host, and the Rust toolchain's clippy and rustfmt (scripts/test.sh's checks) through rustup, which
# brought the toolchain (README: "Rust toolchain installed"). Does nothing when all is there. The guest kernel and user lands come from debootstrapped
# roots (images/), never from the host's apt sources, which are left as they are.
# Usage: scripts/deps.sh [--bench]   (--bench: also what only scripts/bench.sh needs, matplotlib
# for its chart)
set -euo pipefail
PKGS=(debootstrap cpio iproute2 kmod xz-utils zstd binutils util-linux tshark python3-scapy
    ca-certificates nftables gcc libc6-dev libibverbs-dev librdmacm-dev libclang-dev ibverbs-utils perftest rdmacm-utils ucx-utils openmpi-bin libopenmpi-dev podman runc
    python3-pyverbs libfabric-bin qperf)
case ${1:-} in
'') ;;
--bench) PKGS+=(python3-matplotlib) ;;
*) echo "usage: scripts/deps.sh [--bench]" >&2; exit 2 ;;
esac
# The toolchain's lint and format tools: components of the rustup toolchain in use.
if ! cargo clippy --version >/dev/null 2>&1 || ! cargo fmt --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null; then
        echo "deps: rustup component add clippy rustfmt" >&2
        rustup component add clippy rustfmt >&2
    else
        echo "deps: cargo clippy and cargo fmt are missing and there is no rustup to add them" \
            "(install the toolchain with rustup, https://rustup.rs)" >&2
        exit 1
    fi
fi
missing=()
for p in "${PKGS[@]}"; do
    [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] || missing+=("$p")
done
[ ${#missing[@]} = 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
