#!/usr/bin/env bash
# Builds vrnic's libibverbs.so.1 (crate guest-lib/ibverbs) and puts it, under that name, in a
# directory of its own, so the dynamic linker loads it instead of rdma-core's:
#   scripts/ibverbs-lib.sh [--release] [DIR]        (default DIR: target/<profile>/ibverbs)
#   LD_LIBRARY_PATH=DIR ibv_devinfo
# Prints DIR. The library is a plain `cargo build` product (target/<profile>/libvrnic_ibverbs.so,
# soname libibverbs.so.1); this script only copies it to the file name ld.so looks for.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
profile=debug
args=()
if [ "${1:-}" = --release ]; then
    profile=release
    args+=(--release)
    shift
fi
dir=${1:-$top/target/$profile/ibverbs}
cargo build --manifest-path "$top/Cargo.toml" -p vrnic-ibverbs "${args[@]}" >&2
mkdir -p "$dir"
cp "$top/target/$profile/libvrnic_ibverbs.so" "$dir/libibverbs.so.1.tmp"
mv "$dir/libibverbs.so.1.tmp" "$dir/libibverbs.so.1"
echo "$dir"
