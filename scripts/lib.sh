# shellcheck shell=bash
# vrnic test-harness library (sourced by demo.sh, netns.sh, guest.sh, tests/e2e/run.sh).
#
# Everything runs inside a network namespace created here (bridge br0 + TAPs); nothing leaves it.
# Processes started through vr_spawn are recorded and killed (by PID) in vr_cleanup, and the
# namespaces created through vr_netns_create are deleted there. A script using this library sets
#   trap vr_cleanup EXIT; trap 'exit 130' INT; trap 'exit 143' TERM
# (vr_install_traps does exactly that).

VR_SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VR_TOP=$(cd "$VR_SCRIPTS/.." && pwd)
VRNIC_CACHE=${VRNIC_CACHE:-/var/cache/vrnic}
export VRNIC_CACHE
VR_PIDS=()
VR_NETNS=()

vr_log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
vr_die() {
    vr_log "ERROR: $*"
    exit 1
}

vr_install_traps() {
    [ "$(id -u)" = 0 ] || vr_die "needs root (network namespaces, TAPs, chroot)"
    trap vr_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# ---------------------------------------------------------------------------------------------
# Processes

# vr_spawn LOGFILE CMD...: runs CMD in the background (stdout+stderr to LOGFILE), records its PID
# in VR_PIDS and in VR_LAST_PID.
vr_spawn() {
    local logf=$1
    shift
    "$@" </dev/null >"$logf" 2>&1 &
    VR_LAST_PID=$!
    VR_PIDS+=("$VR_LAST_PID")
}

# vr_is_child PID: true if PID is a (live or zombie) child of this script, so that a PID number
# reused by the system after our process ended is never signalled.
vr_is_child() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    # shellcheck disable=SC2086 # split the fields
    set -- $stat
    [ "$2" = "$$" ]
}

# vr_stop PID...: TERM, then KILL after 5 s, for processes this script started (vr_spawn).
vr_stop() {
    local pid alive mine=() keep=()
    for pid in "$@"; do vr_is_child "$pid" && mine+=("$pid"); done
    for pid in ${VR_PIDS[@]+"${VR_PIDS[@]}"}; do
        [[ " $* " == *" $pid "* ]] || keep+=("$pid")
    done
    VR_PIDS=(${keep[@]+"${keep[@]}"})
    [ ${#mine[@]} -gt 0 ] || return 0
    for pid in "${mine[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        alive=0
        for pid in "${mine[@]}"; do
            vr_is_child "$pid" && [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$pid/stat" 2>/dev/null)" != Z ] && alive=1
        done
        [ $alive = 0 ] && break
        sleep 0.1
    done
    for pid in "${mine[@]}"; do vr_is_child "$pid" && kill -KILL "$pid" 2>/dev/null; done
    for pid in "${mine[@]}"; do wait "$pid" 2>/dev/null || true; done
}

# vr_cleanup [RC]: the EXIT trap; exits with RC (default: the status the script was exiting with).
vr_cleanup() {
    local rc=${1:-$?} ns
    trap - EXIT INT TERM
    set +e # clean up as much as possible, whatever fails
    if [ ${#VR_PIDS[@]} -gt 0 ]; then
        vr_stop "${VR_PIDS[@]}"
        VR_PIDS=()
    fi
    for ns in ${VR_NETNS[@]+"${VR_NETNS[@]}"}; do vr_netns_destroy "$ns"; done
    VR_NETNS=()
    exit "$rc"
}

# ---------------------------------------------------------------------------------------------
# Network namespace: bridge br0, TAPs on it, no address in the namespace itself, no route out.

vr_netns_create() {
    local ns=$1
    ip netns add "$ns" || vr_die "ip netns add $ns failed"
    VR_NETNS+=("$ns")
    ip -n "$ns" link set lo up
    # shellcheck disable=SC2016
    ip netns exec "$ns" sh -c '
        for k in all default; do
            echo 1 > /proc/sys/net/ipv4/conf/$k/arp_ignore
            echo 1 > /proc/sys/net/ipv6/conf/$k/disable_ipv6
        done' || vr_die "netns sysctls failed"
    vr_netns_no_brnf "$ns"
    ip -n "$ns" link add br0 type bridge stp_state 0 forward_delay 0
    ip -n "$ns" link set br0 up
}

# vr_netns_no_brnf NS: bridged frames in NS skip iptables, ip6tables and arptables. With
# br_netfilter loaded (Docker and podman load it) each new namespace starts with the
# bridge-nf-call-* sysctls at 1, and every frame a bridge forwards walks the netfilter hooks
# although the namespace has no rule: a sixth of the vrnic daemons' CPU in a guest ib_write_bw
# (perf, 2026-11-25). Both vrnic and rxe guests' frames cross these bridges. The loss injection
# (vr_loss_start) is an nft bridge-family table, which does not need br_netfilter. Without
# br_netfilter the files are absent and nothing changes.
vr_netns_no_brnf() {
    # shellcheck disable=SC2016
    ip netns exec "$1" sh -c '
        for k in iptables ip6tables arptables; do
            f=/proc/sys/net/bridge/bridge-nf-call-$k
            [ ! -e "$f" ] || echo 0 >"$f"
        done' || vr_die "netns $1: bridge-nf sysctls failed"
}

# vr_netns_tap NS TAP [MTU]: a persistent TAP on br0 (for QEMU or the vrnic daemon to attach to).
vr_netns_tap() {
    local ns=$1 tap=$2 mtu=${3:-1500}
    ip -n "$ns" tuntap add dev "$tap" mode tap || vr_die "tuntap add $tap failed"
    ip -n "$ns" link set "$tap" mtu "$mtu" master br0 up
    ip netns exec "$ns" sh -c "echo 1 > /proc/sys/net/ipv4/conf/$tap/arp_ignore" 2>/dev/null || true
}

vr_netns_destroy() {
    local ns=$1 dev
    [ -e "/run/netns/$ns" ] || return 0
    for dev in $(ip -n "$ns" -o link show type tun 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
        ip -n "$ns" link del "$dev" 2>/dev/null || true
    done
    ip netns del "$ns" 2>/dev/null || vr_log "warning: could not delete netns $ns"
}

# ---------------------------------------------------------------------------------------------
# Images

# vr_images: builds (or finds in the cache) the kernel and the rxe initramfs; sets VR_KERNEL,
# VR_RXE_INITRD. vr_vrnic_image sets VR_VRNIC_INITRD: the vrnic image with vrnic's Debian package
# installed (VR_GUEST_DEB, made by vr_build_rust; else packaged from what target/release holds).
vr_images() {
    local kdir rdir
    kdir=$("$VR_TOP/images/kernel.sh") || vr_die "kernel image failed"
    rdir=$("$VR_TOP/images/rxe-initramfs.sh") || vr_die "rxe initramfs failed"
    VR_KERNEL=$kdir/vmlinuz
    VR_RXE_INITRD=$rdir/initramfs.cpio
}

vr_vrnic_image() {
    local d deb=()
    if [ -z "${VR_GUEST_DEB:-}" ]; then
        VR_GUEST_DEB=$("$VR_SCRIPTS/deb.sh" --no-build 2>/dev/null) ||
            vr_log "warning: no vrnic package (the release build is missing: cargo build --release -p vrnic-ibverbs -p vrnic-tools); the vrnic image has neither vrnic's libibverbs nor its tools"
    fi
    [ -n "${VR_GUEST_DEB:-}" ] && deb=(--deb "$VR_GUEST_DEB")
    d=$("$VR_TOP/images/vrnic-initramfs.sh" ${deb[@]+"${deb[@]}"}) || vr_die "vrnic initramfs failed"
    VR_VRNIC_INITRD=$d/initramfs.cpio
}

# vr_software_layer: builds (once) the software layer (images/software.sh: pyverbs' suite, UCX's
# tools, Open MPI) and sets VR_SOFTWARE_LAYER, its cpio, for VR_GUEST_LAYER (vr_guest).
vr_software_layer() {
    local d
    d=$("$VR_TOP/images/software.sh") || vr_die "software layer failed"
    VR_SOFTWARE_LAYER=$d/software.cpio
}

# ---------------------------------------------------------------------------------------------
# QEMU

# vr_qemu_find: finds the QEMU to use, once (scripts/qemu-root.sh, which logs which one and why),
# and sets VR_QEMU_ROOT (a chroot holding it) or VR_QEMU_BIN (a binary run directly; exported,
# for vr_qemu_exec in child shells). Scripts call it first thing, so the choice leads their output.
vr_qemu_find() {
    [ -z "${VR_QEMU_FOUND:-}" ] || return 0
    local how kind arg
    how=$("$VR_SCRIPTS/qemu-root.sh") || vr_die "no usable QEMU (scripts/qemu-root.sh)"
    read -r kind arg <<<"$how"
    VR_QEMU_ROOT= VR_QEMU_BIN=
    case $kind in
    host) VR_QEMU_BIN=$arg ;;
    chroot) VR_QEMU_ROOT=$arg ;;
    *) vr_die "scripts/qemu-root.sh printed '$how'" ;;
    esac
    export VR_QEMU_BIN
    VR_QEMU_FOUND=1
}

# vr_qemu_setup: vr_qemu_find, then sets VR_ACCEL (kvm or tcg; probed with the guest kernel, so
# after vr_images).
vr_qemu_setup() {
    vr_qemu_find
    if [ -z "${VRNIC_ACCEL:-}" ]; then
        # The verdict is kept per host kernel and guest kernel (the probe takes about 6 s).
        local id cache=$VRNIC_CACHE/kvm-probe
        id="$(uname -r) $(find "$VRNIC_CACHE" -maxdepth 1 -name 'kernel-*' ! -name '*.*' | head -1) ${VR_QEMU_ROOT:-$VR_QEMU_BIN}"
        if [ -f "$cache" ] && [ "$(head -1 "$cache")" = "$id" ]; then
            VRNIC_ACCEL=$(sed -n 2p "$cache")
        else
            VRNIC_ACCEL=$(vr_probe_kvm)
            printf '%s\n%s\n' "$id" "$VRNIC_ACCEL" >"$cache"
        fi
    fi
    VR_ACCEL=$VRNIC_ACCEL
    export VRNIC_ACCEL=$VR_ACCEL
    vr_log "QEMU: ${VR_QEMU_ROOT:-$VR_QEMU_BIN}, accel $VR_ACCEL"
}

# QEMU with KVM fails on this nested machine (an abort, "failed to set MSR 0x10a", or a guest
# that crashes in the kernel's decompressor with a register dump), so probe by booting the real
# kernel without an initrd: under a working KVM it reaches the "VFS: Unable to mount root" panic
# and, with panic=-1 and -no-reboot, QEMU exits within a few seconds.
vr_probe_kvm() {
    local out pid kernel verdict=tcg
    [ -w /dev/kvm ] || { echo tcg; return; }
    kernel=$(find "$VRNIC_CACHE" -maxdepth 2 -path '*/kernel-*/vmlinuz' | head -1)
    [ -n "$kernel" ] || { echo tcg; return; }
    out=$(mktemp)
    (vr_qemu_exec "$VR_QEMU_ROOT" "$(dirname "$kernel")" -- -accel kvm -m 256 -nodefaults \
        -display none -no-reboot -serial stdio -kernel "$kernel" -append 'console=ttyS0 panic=-1') \
        </dev/null >"$out" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        kill -0 $pid 2>/dev/null || break
        grep -qE 'EFER=|KVM internal error|failed to set MSR' "$out" && break
        sleep 0.1
    done
    kill -KILL $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    grep -q 'VFS: Unable to mount root' "$out" && verdict=kvm
    rm -f "$out"
    echo $verdict
}

# vr_qemu_exec ROOT DIR... -- QEMU-ARGS...: with ROOT empty, execs the host's $VR_QEMU_BIN (default:
# qemu-system-x86_64 on the PATH); otherwise execs qemu-system-x86_64 from the chroot ROOT in a
# private mount namespace into which /dev, /proc and each DIR are bind-mounted at their own paths
# (so the paths in QEMU-ARGS work inside and outside). Nothing leaks: the mounts vanish with the
# namespace.
vr_qemu_exec() {
    local root=$1
    shift
    local dirs=()
    while [ "$1" != -- ]; do
        dirs+=("$1")
        shift
    done
    shift
    if [ -z "$root" ]; then exec "${VR_QEMU_BIN:-qemu-system-x86_64}" "$@"; fi
    # shellcheck disable=SC2016
    exec unshare -m --propagation private sh -c '
        root=$1; shift
        mount --rbind /dev "$root/dev" && mount -t proc proc "$root/proc" || exit 99
        while [ "$1" != -- ]; do
            mkdir -p "$root$1" && mount --bind "$1" "$root$1" || exit 99
            shift
        done
        shift
        exec chroot "$root" qemu-system-x86_64 "$@"' sh "$root" "${dirs[@]}" -- "$@"
}

# vr_guest NAME KIND NS TAP IP JOB LOGDIR [SOCK]
#   Boots a guest in the background: KIND rxe (Soft-RoCE peer) or vrnic (Debian root with vrnic's
#   package: libibverbs.so.1 and tools, with the vhost-user device on SOCK; without SOCK, no device). eth0 on TAP gets IP (A.B.C.D/N); the job script
#   JOB runs in the guest. Serial console: LOGDIR/NAME.log, QEMU's own output LOGDIR/NAME.qemu,
#   its QMP socket LOGDIR/NAME.qmp (vr_qmp). With VR_GUEST_LAYER (a cpio, e.g. VR_SOFTWARE_LAYER)
#   the image is booted with that archive appended (LOGDIR/NAME-initrd.cpio; the caller removes it).
#   Sets VR_LAST_PID.
vr_guest() {
    local name=$1 kind=$2 ns=$3 tap=$4 ip=$5 job=$6 logdir=$7 sock=${8:-}
    local initrd mac append args=() dirs=() devargs=() mem=1G
    case $kind in
    rxe) initrd=$VR_RXE_INITRD ;;
    vrnic) initrd=$VR_VRNIC_INITRD ;;
    *) vr_die "unknown guest kind $kind" ;;
    esac
    if [ -n "${VR_GUEST_LAYER:-}" ]; then
        # The image with the layer appended (the kernel unpacks concatenated archives in turn),
        # beside the guest's console log.
        cat "$initrd" "$VR_GUEST_LAYER" >"$logdir/$name-initrd.cpio"
        initrd=$logdir/$name-initrd.cpio
    fi
    mac=$(printf '52:54:00:%s' "$(echo "$name$ip" | md5sum | sed 's/^\(..\)\(..\)\(..\).*/\1:\2:\3/')")
    job=$(readlink -f "$job")
    logdir=$(readlink -f "$logdir")
    append="console=ttyS0 quiet panic=-1 vrnic.name=$name vrnic.ip=$ip"
    [ "$kind" = vrnic ] && append+=" hugepages=64"
    append+=" ${VRNIC_GUEST_APPEND:-}"
    dirs=("$(dirname "$VR_KERNEL")" "$(dirname "$initrd")" "$(dirname "$job")" "$logdir")
    if [ "$kind" = vrnic ] && [ -n "$sock" ]; then
        sock=$(readlink -f "$sock")
        dirs+=("$(dirname "$sock")")
        if [ -s "$sock.qemu-args" ]; then
            read -r -a devargs <"$sock.qemu-args"
            # -m must match the memory backend's size.
            mem=$(grep -o 'memory-backend-memfd,[^ ]*size=[0-9]*[KMGT]\?' "$sock.qemu-args" | sed 's/.*size=//')
            mem=${mem:-1G}
        else
            # shellcheck disable=SC2054 # commas inside QEMU options
            devargs=(-object memory-backend-memfd,id=mem,size=1G,share=on -numa node,memdev=mem
                -chardev "socket,id=vr0,path=$sock"
                -device vhost-user-test-device-pci,id=vrnic0,chardev=vr0,virtio-id=6,num_vqs=3,config_size=64)
        fi
    fi
    args=(-accel "$VR_ACCEL" -M pc -m "$mem" -smp 1 -nodefaults -no-user-config -display none -no-reboot
        -kernel "$VR_KERNEL" -initrd "$initrd" -append "$append"
        -serial "file:$logdir/$name.log" -qmp "unix:$logdir/$name.qmp,server=on,wait=off"
        -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no"
        -device "virtio-net-pci,netdev=n0,mac=$mac"
        -fw_cfg "name=opt/vrnic/job,file=$job"
        ${devargs[@]+"${devargs[@]}"})
    : >"$logdir/$name.log"
    mapfile -t dirs < <(printf '%s\n' "${dirs[@]}" | sort -u)
    vr_spawn "$logdir/$name.qemu" ip netns exec "$ns" \
        bash -c "$(declare -f vr_qemu_exec); vr_qemu_exec \"\$@\"" vr_qemu_exec \
        "$VR_QEMU_ROOT" "${dirs[@]}" -- "${args[@]}"
    vr_log "guest $name ($kind, $ip on $tap) pid $VR_LAST_PID, console $logdir/$name.log"
}

# vr_qmp SOCK COMMAND: runs one QMP command without arguments (stop, cont, ...) on the guest whose
# QMP socket is SOCK (vr_guest: LOGDIR/NAME.qmp); every read bounded by 10 s. Fails with QEMU's
# error, if any.
vr_qmp() {
    python3 - "$1" "$2" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
f = s.makefile("rw")
json.loads(f.readline())  # the greeting
for cmd in ("qmp_capabilities", sys.argv[2]):
    f.write(json.dumps({"execute": cmd}) + "\n")
    f.flush()
    while True:  # events may come before the answer
        r = json.loads(f.readline())
        if "return" in r or "error" in r:
            break
    if "error" in r:
        sys.exit("QMP %s: %s" % (cmd, r["error"]))
EOF
}

# vr_qmp_replug QMP QEMU_ARGS_FILE SOCK: re-plugs the vrnic device of the guest whose QMP socket is
#   QMP, as a management layer does after restarting its vrnic daemon: `device_del` (the device's
#   id from the -device option in QEMU_ARGS_FILE, vr_daemon's SOCK.qemu-args), waits for
#   DEVICE_DELETED, `chardev-remove` + `chardev-add` of its chardev (a socket client to SOCK),
#   `device_add` with the same options. Every read bounded by 10 s, the whole by 60 s. QEMU 11.1.3
#   cannot reconnect the device to a restarted daemon by itself (hw/virtio/vhost-user-base.c:
#   vub_connect after vub_disconnect aborts in vhost_dev_start), so this is how a guest gets its
#   device back. Prints what it did; fails with QEMU's error.
vr_qmp_replug() {
    python3 - "$1" "$2" "$3" <<'PYEOF'
import json, shlex, socket, sys, time
qmp, argsfile, sock = sys.argv[1:4]
words = shlex.split(open(argsfile).read())
dev = words[words.index("-device") + 1].split(",")
props = {"driver": dev[0]}
for kv in dev[1:]:
    k, v = kv.split("=", 1)
    props[k] = int(v) if v.isdigit() else v
if "id" not in props or "chardev" not in props:
    sys.exit("the -device option has no id or chardev: %s" % ",".join(dev))
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(qmp)
f = s.makefile("rw")
json.loads(f.readline())  # the greeting
t0 = time.time()
events = []
def read():
    r = json.loads(f.readline())
    if "event" in r:
        events.append(r)
    return r
def cmd(c, a=None):
    m = {"execute": c}
    if a is not None:
        m["arguments"] = a
    f.write(json.dumps(m) + "\n")
    f.flush()
    while True:
        r = read()
        if "error" in r:
            sys.exit("QMP %s: %s" % (c, r["error"]))
        if "return" in r:
            return r["return"]
def deleted():
    return any(e["event"] == "DEVICE_DELETED" and e.get("data", {}).get("device") == props["id"]
               for e in events)
cmd("qmp_capabilities")
cmd("device_del", {"id": props["id"]})
while not deleted():
    if time.time() - t0 > 60:
        sys.exit("no DEVICE_DELETED for %s within 60 s" % props["id"])
    read()
print("replug: %s deleted after %.1f s" % (props["id"], time.time() - t0))
cmd("chardev-remove", {"id": props["chardev"]})
cmd("chardev-add", {"id": props["chardev"], "backend": {"type": "socket", "data": {
    "addr": {"type": "unix", "data": {"path": sock}}, "server": False}}})
cmd("device_add", props)
print("replug: %s added again on %s after %.1f s" % (props["id"], sock, time.time() - t0))
PYEOF
}

# ---------------------------------------------------------------------------------------------
# Loss on the bridge (tests/e2e/run.sh's lossy pairs, scripts/soak.sh)

# vr_loss_start NS MODE TAP PEER_TAP: drops 1% of the frames to and from TAP in NS. MODE nft: an
#   nftables bridge rule (table bridge vrnic_loss) drops 1% of the RoCEv2 frames (UDP 4791) the
#   bridge forwards from TAP and to it, by a random number per frame (`numgen random`); PEER_TAP
#   is not used. MODE netem: `tc qdisc add dev TAP root netem loss 1%` (frames towards TAP) and
#   the same on PEER_TAP (towards the peer), every frame, RoCEv2 or not; needs sch_netem.
#   Fails if the loss cannot be installed.
vr_loss_start() {
    local ns=$1 mode=$2 tap=$3 peer=$4
    case $mode in
    netem)
        modprobe sch_netem 2>/dev/null || true
        ip netns exec "$ns" tc qdisc add dev "$tap" root netem loss 1% &&
            ip netns exec "$ns" tc qdisc add dev "$peer" root netem loss 1%
        ;;
    nft)
        command -v nft >/dev/null || return 1
        ip netns exec "$ns" nft -f - <<NFT
table bridge vrnic_loss {
    chain forward {
        type filter hook forward priority 0;
        iifname "$tap" udp dport 4791 numgen random mod 100 == 0 counter drop
        oifname "$tap" udp dport 4791 numgen random mod 100 == 0 counter drop
    }
}
NFT
        ;;
    *) return 1 ;;
    esac
}

# vr_loss_count NS MODE TAP PEER_TAP: sets VR_LOSS_TO (frames dropped towards TAP) and
#   VR_LOSS_FROM (dropped from TAP, towards its peer) so far, without removing the loss.
vr_loss_count() {
    local ns=$1 mode=$2 tap=$3 peer=$4 c
    if [ "$mode" = netem ]; then
        # tc -s: " Sent B bytes P pkt (dropped D, overlimits ...".
        VR_LOSS_TO=$(ip netns exec "$ns" tc -s qdisc show dev "$tap" | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | head -1)
        VR_LOSS_FROM=$(ip netns exec "$ns" tc -s qdisc show dev "$peer" | sed -n 's/.*(dropped \([0-9]*\),.*/\1/p' | head -1)
    else
        c=$(ip netns exec "$ns" nft list table bridge vrnic_loss 2>/dev/null |
            sed -n "s/.*\(iif\|oif\)name \"$tap\".*counter packets \([0-9]*\).*/\1 \2/p")
        VR_LOSS_FROM=$(awk '$1 == "iif" { print $2 }' <<<"$c") VR_LOSS_TO=$(awk '$1 == "oif" { print $2 }' <<<"$c")
    fi
    VR_LOSS_TO=${VR_LOSS_TO:-0} VR_LOSS_FROM=${VR_LOSS_FROM:-0}
}

# vr_loss_stop NS MODE TAP PEER_TAP: vr_loss_count, then removes the loss.
vr_loss_stop() {
    local ns=$1 mode=$2 tap=$3 peer=$4
    vr_loss_count "$@"
    if [ "$mode" = netem ]; then
        ip netns exec "$ns" tc qdisc del dev "$tap" root 2>/dev/null || true
        ip netns exec "$ns" tc qdisc del dev "$peer" root 2>/dev/null || true
    else
        ip netns exec "$ns" nft delete table bridge vrnic_loss 2>/dev/null || true
    fi
}

# vr_rss_kb PID: the process's resident set (VmRSS, kB); vr_fd_count PID: its open descriptors.
vr_rss_kb() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status" 2>/dev/null; }
# vr_status_kb PID FIELD: a /proc/PID/status field in kB (VmRSS, VmHWM, RssAnon, ...).
vr_status_kb() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status" 2>/dev/null; }
vr_fd_count() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }

# vr_wait_job NAME LOGDIR PID TIMEOUT: waits (bounded) for the guest's "VRNIC-JOB-EXIT rc" line;
# sets VR_JOB_RC to rc (or "timeout", or "died": QEMU ended without the line) and returns 0 only
# for rc 0. Stops the guest if it is still running after the line (it powers itself off) or after
# the timeout. Call it in the main shell (not in $(...)), so the PID list stays right.
vr_wait_job() {
    local name=$1 logdir=$2 pid=$3 timeout=$4 t0=$SECONDS line
    while :; do
        line=$(grep -a -m1 '^VRNIC-JOB-EXIT ' "$logdir/$name.log" 2>/dev/null | tr -d '\r') || true
        if [ -n "$line" ]; then
            VR_JOB_RC=$(echo "$line" | awk '{ print $2 }')
            break
        fi
        if ! kill -0 "$pid" 2>/dev/null || [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$pid/stat" 2>/dev/null)" = Z ]; then
            VR_JOB_RC=died
            break
        fi
        if [ $((SECONDS - t0)) -ge "$timeout" ]; then
            VR_JOB_RC=timeout
            break
        fi
        sleep 0.5
    done
    # The guest powers off right after the line; give it a moment, then make sure.
    for _ in $(seq 40); do
        [ "$(sed 's/.*) \(.\).*/\1/' "/proc/$pid/stat" 2>/dev/null || echo Z)" = Z ] && break
        sleep 0.25
    done
    vr_stop "$pid"
    [ "$VR_JOB_RC" = 0 ]
}

# ---------------------------------------------------------------------------------------------
# The vrnic daemon

# vr_daemon NAME NS SOCK TAP IP LOGDIR [PCAP]: starts the vrnic daemon ($VRNIC_BIN, default
# target/debug/vrnic) in NS on TAP with the RoCE address IP (A.B.C.D/N), serving vhost-user on
# SOCK; waits (bounded) for the socket. Log: LOGDIR/NAME.log. Sets VR_LAST_PID. Returns 1 (after
# saying why, and stopping it) if it did not come up.
# With VR_DAEMON_CONNECT=1 the daemon connects to SOCK instead (--connect: QEMU is the socket's
# server, so the daemon can be restarted under a running guest); it then waits only for the
# daemon's QEMU arguments, and the guest (vr_guest, after it) creates the socket.
vr_daemon() {
    local name=$1 ns=$2 sock=$3 tap=$4 ip=$5 logdir=$6 pcap=${7:-} bin=${VRNIC_BIN:-$VR_TOP/target/debug/vrnic}
    local connect=${VR_DAEMON_CONNECT:-0} args=(--socket "$sock" --tap "$tap" --ip "$ip")
    [ "$connect" = 1 ] && args=(--connect "$sock" --tap "$tap" --ip "$ip")
    [ -x "$bin" ] || { vr_log "ERROR: vrnic daemon $bin not built (cargo build -p vrnic-vhost)"; return 1; }
    [ -n "$pcap" ] && args+=(--pcap "$pcap")
    # Further daemon options (e.g. --function specs) from the array VR_DAEMON_EXTRA, if set.
    args+=(${VR_DAEMON_EXTRA[@]+"${VR_DAEMON_EXTRA[@]}"})
    # And from the environment, for A/B runs (e.g. VRNIC_DAEMON_ARGS="--poll-us 0").
    local env_args
    read -ra env_args <<<"${VRNIC_DAEMON_ARGS:-}"
    args+=(${env_args[@]+"${env_args[@]}"})
    [ "$connect" = 1 ] || rm -f "$sock"
    rm -f "$sock.qemu-args"
    vr_spawn "$logdir/$name.log" ip netns exec "$ns" env RUST_LOG="${RUST_LOG:-info}" NO_COLOR=1 "$bin" "${args[@]}"
    for _ in $(seq 100); do
        if [ "$connect" = 1 ]; then
            grep -q -A1 '^QEMU arguments:' "$logdir/$name.log" && break
        else
            [ -S "$sock" ] && break
        fi
        if ! kill -0 "$VR_LAST_PID" 2>/dev/null; then
            tail -20 "$logdir/$name.log" >&2
            vr_log "ERROR: daemon $name exited"
            vr_stop "$VR_LAST_PID"
            return 1
        fi
        sleep 0.1
    done
    if [ "$connect" != 1 ] && [ ! -S "$sock" ]; then
        vr_log "ERROR: daemon $name: no socket $sock after 10 s"
        vr_stop "$VR_LAST_PID"
        return 1
    fi
    # The daemon prints the QEMU arguments its device needs (line after "QEMU arguments:"); the
    # guest uses them verbatim when they are there (vr_guest), so the two cannot drift apart.
    for _ in $(seq 20); do
        grep -q -A1 '^QEMU arguments:' "$logdir/$name.log" && break
        sleep 0.1
    done
    grep -A1 '^QEMU arguments:' "$logdir/$name.log" | sed -n 2p | grep -e '-device' >"$sock.qemu-args" ||
        rm -f "$sock.qemu-args"
    if [ "$connect" = 1 ]; then
        vr_log "daemon $name ($ip on $tap) pid $VR_LAST_PID, connecting to $sock, log $logdir/$name.log"
    else
        vr_log "daemon $name ($ip on $tap) pid $VR_LAST_PID, socket $sock, log $logdir/$name.log"
    fi
}

# ---------------------------------------------------------------------------------------------
# Rust builds

# vr_build_rust: the vrnic daemon and the host programs that drive daemons (package vrnic-frontend:
# vrnic-soak, which the e2e's soak-2min runs unbuilt, vrnic-flood) (debug: shares cargo test's
# artefacts, keeps overflow checks) and vrnic's Debian package for the guest (scripts/deb.sh: release builds of vrnic's
# libibverbs.so.1, librdmacm.so.1 and the tools, dynamically linked against the glibc of bookworm, like the
# guests'); sets VR_GUEST_DEB, its path.
vr_build_rust() {
    local t0=$SECONDS
    (cd "$VR_TOP" && cargo build -q -p vrnic-vhost -p vrnic-frontend) ||
        vr_die "cargo build -p vrnic-vhost -p vrnic-frontend failed"
    VR_GUEST_DEB=$("$VR_SCRIPTS/deb.sh") || vr_die "scripts/deb.sh (vrnic's Debian package) failed"
    vr_log "cargo builds took $((SECONDS - t0)) s; package $VR_GUEST_DEB"
}

# vr_release_build NO_BUILD BIN: what the host-process steps (tests/e2e/heavy.sh, pyverbs.sh) run.
# Sets VR_DAEMON_BIN (BIN, else target/release/vrnic, built here unless NO_BUILD=1 or BIN is given)
# and VR_IBVERBS_LIB (the directory holding vrnic's release libibverbs.so.1 and librdmacm.so.1: scripts/ibverbs-lib.sh
# --release, or with NO_BUILD=1 a copy of what target/release holds, as the e2e's build made it).
vr_release_build() {
    local no_build=$1 bin=$2
    VR_DAEMON_BIN=${bin:-$VR_TOP/target/release/vrnic}
    if [ "$no_build" != 1 ]; then
        if [ -z "$bin" ]; then
            (cd "$VR_TOP" && cargo build -q --release -p vrnic-vhost) ||
                vr_die "cargo build --release -p vrnic-vhost failed"
        fi
        VR_IBVERBS_LIB=$("$VR_SCRIPTS/ibverbs-lib.sh" --release) || vr_die "scripts/ibverbs-lib.sh --release failed"
    else
        VR_IBVERBS_LIB=$VR_TOP/target/release/ibverbs
        mkdir -p "$VR_IBVERBS_LIB"
        local l
        for l in ibverbs rdmacm; do
            [ -f "$VR_TOP/target/release/libvrnic_$l.so" ] || vr_die "no target/release/libvrnic_$l.so"
            cp "$VR_TOP/target/release/libvrnic_$l.so" "$VR_IBVERBS_LIB/lib$l.so.1.tmp"
            mv "$VR_IBVERBS_LIB/lib$l.so.1.tmp" "$VR_IBVERBS_LIB/lib$l.so.1"
        done
    fi
    [ -x "$VR_DAEMON_BIN" ] || vr_die "no vrnic daemon $VR_DAEMON_BIN"
}
