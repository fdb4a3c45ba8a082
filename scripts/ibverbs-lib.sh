#!/usr/bin/env bash
# Builds vrnic's libibverbs.so.1 (crate guest-lib/ibverbs) and librdmacm.so.1 (guest-lib/rdmacm) and
# puts them, under those names, in a directory of their own, so the dynamic linker loads them instead
# of rdma-core's:
#   scripts/ibverbs-lib.sh [--release] [DIR]        (default DIR: target/<profile>/ibverbs)
#   LD_LIBRARY_PATH=DIR ibv_devinfo
# Prints DIR. The libraries are plain `cargo build` products (target/<profile>/libvrnic_ibverbs.so,
# soname libibverbs.so.1; libvrnic_rdmacm.so, soname librdmacm.so.1); this script only copies them to
# the file names ld.so looks for.
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
cargo build --manifest-path "$top/Cargo.toml" -p vrnic-ibverbs -p vrnic-rdmacm "${args[@]}" >&2
mkdir -p "$dir"
for l in ibverbs rdmacm; do
    cp "$top/target/$profile/libvrnic_$l.so" "$dir/lib$l.so.1.tmp"
    mv "$dir/lib$l.so.1.tmp" "$dir/lib$l.so.1"
done
echo "$dir"
