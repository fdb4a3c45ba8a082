#!/bin/sh
# Runs its arguments where /dev/infiniband/vrnic-uverbs0 exists, without touching the host's /dev:
#   unshare --mount --propagation private sh scripts/uverbs-node.sh DIR CMD [ARG...]
# (root). UCX uses a verbs device only if /dev/infiniband/<dev_name> is an accessible character
# device; vrnic's library names vrnic-uverbs0, and any character device will do (README, "UCX").
# In the new mount namespace, /dev becomes a tmpfs of links to a bind of the real /dev (so its
# submounts, /dev/shm and /dev/pts, stay the same) plus infiniband/vrnic-uverbs0 -> /dev/null.
# DIR (made if missing) holds the two mountpoints; it is a set of empty directories once the
# namespace is gone, for the caller to remove. Used by the UCX and MPI tests
# (guest-lib/ibverbs/tests/common/mod.rs, with_node) and scripts/bench.sh.
set -e
t=$1; shift
mkdir -p "$t"
mkdir "$t/old" "$t/new"
mount --rbind /dev "$t/old"
mount -t tmpfs tmpfs "$t/new"
for e in "$t"/old/* "$t"/old/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  ln -s "$e" "$t/new/${e##*/}"
done
mkdir "$t/new/infiniband"
ln -s "$t/old/null" "$t/new/infiniband/vrnic-uverbs0"
mount --bind "$t/new" /dev
exec "$@"
