# shellcheck shell=bash
# Shared helpers for the image recipes (sourced, not run).
#
# Every artefact lives in $VRNIC_CACHE/<name>-<key>, where <key> is a hash of the recipe files
# that produce it (and of its inputs). A changed recipe gives a new key and a rebuild; older
# builds of the same name are deleted once the new one is in place.

VRNIC_CACHE=${VRNIC_CACHE:-/var/cache/vrnic}
IMAGES_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export VRNIC_CACHE IMAGES_DIR DEBIAN_MIRROR

log() { printf '[images %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# key FILE... : short hash of the named files' contents (process substitutions welcome).
key() {
    local f
    for f in "$@"; do
        cat "$f"
        printf '\n--\n'
    done | sha256sum | cut -c1-16
}

# Builds of one NAME kept: the most recently used, the new one among them. Enough that a test run
# from another checkout (other tools, so another key) does not lose the image it is booting.
KEEP_BUILDS=3

# cached NAME KEY FUNCTION [ARGS...]
# Prints the artefact directory $VRNIC_CACHE/NAME-KEY. Builds it (by calling FUNCTION OUTDIR ARGS...
# with OUTDIR a temporary directory that is renamed into place on success) only if it is absent.
# A build marks it used (mtime); builds beyond the KEEP_BUILDS most recently used are deleted.
cached() {
    local name=$1 key=$2 fn=$3
    shift 3
    local out=$VRNIC_CACHE/$name-$key
    mkdir -p "$VRNIC_CACHE"
    [ -f "$VRNIC_CACHE/CACHEDIR.TAG" ] ||
        printf 'Signature: 8a477f597d28d172789f06886806bc55\n# vrnic build cache\n' >"$VRNIC_CACHE/CACHEDIR.TAG"
    (
        flock 9
        if [ ! -e "$out/.done" ]; then
            local t0=$SECONDS
            log "building $name-$key"
            rm -rf --one-file-system "$out.tmp" "$out"
            mkdir -p "$out.tmp"
            "$fn" "$out.tmp" "$@"
            touch "$out.tmp/.done"
            mv "$out.tmp" "$out"
            log "built $name-$key in $((SECONDS - t0)) s"
            # Older builds of NAME go, except the KEEP_BUILDS most recently used: another
            # checkout's test run may be using one of those right now.
            local old n=0
            while IFS= read -r old; do
                n=$((n + 1))
                [ "$n" -le "$KEEP_BUILDS" ] && continue
                # Never through a mount someone left inside (a chroot's bind-mounted /dev...).
                if grep -qE " $old(/| )" /proc/self/mountinfo; then
                    log "not removing stale $old: something is mounted under it"
                else
                    log "removing stale $old"
                    rm -rf --one-file-system "$old"
                fi
            done < <(find "$VRNIC_CACHE" -maxdepth 1 -type d -name "$name-*" ! -name '*.tmp' -printf '%T@ %p\n' |
                sort -rn | cut -d' ' -f2-)
        else
            touch "$out" # most recently used
        fi
    ) 9>"$VRNIC_CACHE/$name.lock" >&2
    echo "$out"
}

# Resolve the modules named in $@ (with their dependencies, from modules.dep under MODDIR)
# into load order; prints paths relative to MODDIR, one a line. Usage: module_order MODDIR NAME...
module_order() {
    local moddir=$1
    shift
    awk -v want="$*" '
        function base(p,  b) { b = p; sub(/.*\//, "", b); sub(/\.ko(\.(xz|zst|gz))?$/, "", b); gsub(/-/, "_", b); return b }
        function visit(m,  n, i, d) {
            if (m in seen) return
            seen[m] = 1
            if (!(m in path)) { missing = missing " " m; return }
            n = split(deps[m], d, " ")
            # modules.dep lists dependencies nearest-first; load the farthest first.
            for (i = n; i >= 1; i--) visit(base(d[i]))
            print path[m]
        }
        {
            p = $1; sub(/:$/, "", p)
            m = base(p); path[m] = p
            $1 = ""; deps[m] = $0
        }
        END {
            n = split(want, w, " ")
            for (i = 1; i <= n; i++) { x = w[i]; gsub(/-/, "_", x); visit(x) }
            if (missing != "") { print "module_order: not found:" missing > "/dev/stderr"; exit 1 }
        }' "$moddir/modules.dep"
}

# copy_modules KERNELDIR DEST NAME...: copies the named modules and their dependencies from the
# kernel artefact into DEST/usr/lib/modules/KVER (uncompressed; under usr/ so that an archive laid
# over a merged-/usr root does not replace its /lib symlink) and writes DEST/etc/vrnic-modules, the
# load order, for /init to insmod one by one (no depmod or modprobe needed in the guest).
copy_modules() {
    local kdir=$1 dest=$2
    shift 2
    local kver moddir list m
    kver=$(cat "$kdir/version")
    moddir=$kdir/lib/modules/$kver
    list=$(module_order "$moddir" "$@") || die "module list failed"
    mkdir -p "$dest/usr/lib/modules/$kver" "$dest/etc"
    : >"$dest/etc/vrnic-modules"
    for m in $list; do
        mkdir -p "$dest/usr/lib/modules/$kver/$(dirname "$m")"
        cp "$moddir/$m" "$dest/usr/lib/modules/$kver/$m"
        echo "/usr/lib/modules/$kver/$m" >>"$dest/etc/vrnic-modules"
    done
}

# root_cpio ROOT FILE: uncompressed newc cpio of a debootstrapped ROOT as it is, less what a guest
# never reads (docs, man pages, locales, apt's caches and lists, /boot, the root's own modules).
root_cpio() {
    (cd "$1" && find . -mindepth 1 \
        \( -path ./usr/share/doc -o -path ./usr/share/man -o -path ./usr/share/info \
        -o -path ./usr/share/locale -o -path ./var/cache/apt -o -path ./var/lib/apt/lists \
        -o -path './usr/lib/udev/hwdb.*' -o -path ./boot -o -path ./lib/modules \) -prune -o -print |
        LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) >"$2"
}

# RDMA_PEER_SRC: the libibverbs RDMA READ/atomic peer (tests/e2e/peer/rxe-rdma-peer.c).
RDMA_PEER_SRC=$IMAGES_DIR/../tests/e2e/peer/rxe-rdma-peer.c

# build_rdma_peer FILE: compiles RDMA_PEER_SRC with the host's gcc against its libibverbs-dev (the
# host is bookworm, like the guests' root, so it links against the same libibverbs.so.1) into
# FILE and runs its self-test.
build_rdma_peer() {
    if ! command -v gcc >/dev/null || [ ! -f /usr/include/infiniband/verbs.h ]; then
        die "rxe-rdma-peer needs gcc and libibverbs-dev on the host (scripts/deps.sh)"
    fi
    gcc -O2 -Wall -Wextra -Wno-missing-field-initializers -o "$1" "$RDMA_PEER_SRC" -libverbs ||
        die "compiling $RDMA_PEER_SRC failed"
    "$1" --self-test >/dev/null || die "rxe-rdma-peer --self-test failed"
}

# MPI_PINGPONG_SRC: the MPI ping-pong the e2e runs in guests and containers
# (guest-lib/ibverbs/tests/c/mpi_pingpong.c).
MPI_PINGPONG_SRC=$IMAGES_DIR/../guest-lib/ibverbs/tests/c/mpi_pingpong.c

# build_mpi_pingpong FILE: compiles MPI_PINGPONG_SRC with the host's mpicc (libopenmpi-dev: the
# host is bookworm, like the roots, with the same Open MPI) into FILE.
build_mpi_pingpong() {
    command -v mpicc >/dev/null || die "mpi-pingpong needs mpicc on the host (libopenmpi-dev: scripts/deps.sh)"
    mpicc -O2 -Wall -o "$1" "$MPI_PINGPONG_SRC" || die "compiling $MPI_PINGPONG_SRC failed"
}

# mpi_key: what the build of mpi-pingpong depends on, for a recipe's cache key.
mpi_key() {
    cat "$MPI_PINGPONG_SRC"
    mpicc --version 2>/dev/null | head -1
    dpkg-query -W libopenmpi-dev 2>/dev/null
}

# pack_cpio DIR FILE: uncompressed newc cpio of DIR (uncompressed: no decompression under TCG).
pack_cpio() {
    (cd "$1" && find . -mindepth 1 -path ./.done -prune -o -print | LC_ALL=C sort |
        cpio --quiet -o -H newc -R 0:0) >"$2"
}
