# shellcheck shell=sh
# Guest side of the ping-pong matrix (POSIX sh: busybox in the vrnic guest, dash in the rxe guest).
# The harness prepends the parameters and passes the whole file as the guest's job:
#   NAME        this guest's name                 PEER_IP  the other guest's eth0 address (TCP)
#   TOOL        ibv_rc_pingpong or vrnic-pingpong  GID      GID index (-g)
#   SIZES       message sizes (-s)                ITERS    iterations (-n)
#   MTU         path MTU (-m)                     ROLES    one role per phase, e.g. "server client"
#   BASEPORT    first TCP port; every (phase, size) run has a port of its own, so a client can
#               never reach the wrong server
#   RUN_TIMEOUT bound on one run (s)              CONNECT_WAIT how long a client retries (s)
#   EXTRA       extra tool options
#   PERF_TOOLS  perftest tools to run afterwards (e.g. "ib_write_bw ib_send_lat"), PERF_ARGS their
#               options besides -x GID -p PORT (e.g. "-n 200"); empty: none
#   PERF_ALL_TOOLS, PERF_ALL_ARGS  perftest tools to run again with PERF_ALL_ARGS (e.g. "-a -n 5":
#               every size from 2 B to 8 MiB), and
#   PERF_QP_TOOLS, PERF_QP_ARGS    with PERF_QP_ARGS (e.g. "-q 4 -n 100": several QPs), and
#   PERF_LONG_TOOLS, PERF_LONG_ARGS with PERF_LONG_ARGS (e.g. "-n 5000": a long run), and
#   PERF_BIG_TOOLS, PERF_BIG_ARGS  with PERF_BIG_ARGS (e.g. "-q 8 -s 1048576 -n 5": many QPs,
#               large messages), and
#   PERF_HUGE_TOOLS, PERF_HUGE_ARGS with PERF_HUGE_ARGS (e.g. "-q 8 -s 8388608 -n 5"); each in
#               ROLES order, one line per run and one per size the tool printed:
#               VRNIC-PERFX <name> <tool> <role> <all|qp|long|big|huge> rc=<rc> rows=<n> bytes=<first>-<last> cs=<wall>
#               VRNIC-PERFROW <name> <tool> <role> <all|qp|long|big|huge> <bytes> <value>
#               (value: BW average, or the typical latency)
#   PIN_CHECK   1: at the end, pin-check (tests/e2e/peer/pin-check.c: registered pages keep their
#               PFNs while memory is fragmented and compacted; meanwhile a second process,
#               ibv_devinfo, uses the device beside it through the guest agent), then per role an ibv_rc_pingpong -c of
#               PIN_SIZE x PIN_ITERS and an rxe-rdma-peer run (READs of PIN_RDMA_SIZES,
#               PIN_RDMA_READS each, 20 fetch-adds), each with pin-check --compact-loop fragmenting
#               and compacting memory every 0.2 s in the background; lines:
#               VRNIC-PIN <name> check rc=<rc> <pin-check's result fields> second_open=<rc>
#               VRNIC-PIN <name> unguarded rc=<rc> <fields>  (the same with
#               /proc/sys/vm/compact_unevictable_allowed=1 for its duration: for comparison)
#               VRNIC-PIN <name> transfer <role> rc=<rc> verified=<yes|no> compactions=<n> migrated=<n> <what>
#   XRUNS       "ud srq" (or a subset): afterwards run the UD and SRQ ping-pongs (ibv_ud_pingpong /
#               ibv_srq_pingpong on rxe, vrnic-ud-pingpong / vrnic-srq-pingpong on vrnic), in ROLES
#               order, XITERS iterations each; one line per run:
#               VRNIC-XRESULT <name> <ud|srq> <role> rc=<rc> verified=<yes|no|n/a>
#   WRITE_IMM_ROLE  server or client: afterwards run vrnic-write-imm (RDMA WRITE with immediate
#               into the peer's memory, checked byte for byte) for each of WRITE_IMM_SIZES; empty: skip
#   RDMA_ROLES  e.g. "server client" (empty: skip): afterwards, per role, one run of the RDMA READ
#               and atomics check (vrnic-rdma on vrnic, tests/e2e/peer/rxe-rdma-peer on rxe): the
#               server is the passive side (responder, owns the memory), the client the active one
#               (RDMA_READS READs of each of RDMA_SIZES bytes, RDMA_FAA fetch-and-adds, two
#               compare-and-swaps); one line per check:
#               VRNIC-RDMA <name> active <read-S|fetch-add|cmp-swap> rc=<rc> verified=<yes|no>
#               VRNIC-RDMA <name> passive responder rc=<rc> verified=<yes|no>
#   EVENT_ROLES e.g. "server client" (empty: skip): afterwards, per role, two RC runs of TOOL,
#               EVENT_SIZE bytes x EVENT_ITERS: mode=spin (no -e: polls the CQ) and mode=events
#               (-e: the process sleeps in ibv_get_cq_event until the CQ's completion event); one
#               line per run:
#               VRNIC-ERESULT <name> <role> size=<s> rc=<rc> cpu_pct=<p> wall_cs=<w> irqs=<n|n/a> mode=<m>
#               cpu_pct: the run's CPU time (user + system, all its threads: the shell's `times`
#               for its children) over its wall time, in percent; irqs: how much the
#               uio_pci_generic line of /proc/interrupts rose during the run (n/a: no such line)
#   MULTI_ROLE  server or client (empty: skip): several programs on one device through the guest
#               agent, one killed (see the block before the summary); VRNIC-MULTI lines
#   IDLE_CHECK  1: before those runs, an idle check of vrnic's libibverbs.so.1: an ibv_rc_pingpong -e
#               server that no client ever reaches (its context open, its event thread waiting) is
#               watched for IDLE_WINDOW seconds, then killed; one line:
#               VRNIC-IDLE <name> found=<yes|no> window_cs=<w> wakeups=<n> cpu_cs=<c> irqs=<n|n/a> mode=<irq|poll>
#               (twice: mode=irq as is, mode=poll with VRNIC_PCI_NO_IRQ=1, the 1 ms polling fallback)
#               wakeups: context switches of its event thread (`vrnic-events`) in the window (a
#               1 ms poll makes ~10 per cs, a thread asleep on an interrupt none); cpu_cs: that
#               thread's CPU time
# Each run prints its output, then one line:
#   VRNIC-RESULT <name> <role> size=<s> rc=<rc> tool=<tool> usec_per_iter=<x> verified=<yes|no|n/a> cpu_pct=<p>
# verified=yes: the tool printed "data verified: ITERS messages" (vrnic-pingpong does; the rxe
# side's ibv_rc_pingpong does not, and is not asked to).

now() { cut -d. -f1 /proc/uptime; }

# Wall clock in centiseconds (/proc/uptime), and CPU time of all waited-for children in
# centiseconds (the second line of `times`: "XmY.YYs XmY.YYs", user and system). `times` runs in
# this shell (into a file): in a $(...) subshell it would count the subshell's children only.
now_cs() { tr -d . </proc/uptime | cut -d' ' -f1; }
child_cpu_cs() {
    times >/tmp/times
    sed -n 2p /tmp/times | awk '{
        t = 0
        for (i = 1; i <= 2; i++) { split($i, a, "m"); sub("s", "", a[2]); t += a[1] * 6000 + a[2] * 100 }
        printf "%d\n", t }'
}
# Interrupts of the uio_pci_generic line(s) in /proc/interrupts, summed over CPUs; empty if none.
uio_irqs() {
    awk '/uio_pci_generic/ { for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) n += $i; found = 1 }
        END { if (found) print n + 0 }' /proc/interrupts
}
# measure_start / measure_end: CPU and wall time of the runs between them; sets cpu_pct, wall_cs.
measure_start() {
    child_cpu_cs >/tmp/cpu
    c0=$(cat /tmp/cpu) w0=$(now_cs)
}
measure_end() {
    wall_cs=$(($(now_cs) - w0))
    child_cpu_cs >/tmp/cpu
    cpu_cs=$(($(cat /tmp/cpu) - c0))
    cpu_pct=$((cpu_cs * 100 / (wall_cs > 0 ? wall_cs : 1)))
}

# run_retry ROLE CMD...: runs CMD (with PEER_IP appended for a client) into /tmp/out, bounded by
# RUN_TIMEOUT; a client retries while the server is not listening yet. Sets rc and attempt.
run_retry() {
    role=$1
    shift
    [ "$role" = client ] && set -- "$@" "$PEER_IP"
    deadline=$(($(now) + CONNECT_WAIT))
    attempt=0
    while :; do
        attempt=$((attempt + 1))
        timeout "$RUN_TIMEOUT" "$@" >/tmp/out 2>&1
        rc=$?
        # A client retries only while the server is not listening yet.
        if [ $rc -ne 0 ] && [ "$role" = client ] && [ "$(now)" -lt "$deadline" ] &&
            grep -qiE "couldn't connect to [^ ]+:[0-9]+|connection refused|unable to init the socket connection" /tmp/out; then
            sleep 0.5
            continue
        fi
        break
    done
    echo "--- $NAME $role attempts=$attempt: $*"
}

run_one() { # role size port
    role=$1 size=$2 port=$3
    measure_start
    # shellcheck disable=SC2086
    run_retry "$role" "$TOOL" -g "$GID" -m "$MTU" -s "$size" -n "$ITERS" -p "$port" $EXTRA
    measure_end
    echo "--- $NAME $role size=$size port=$port"
    cat /tmp/out
    usec=$(sed -n 's/.* = \([0-9.]*\) usec\/iter.*/\1/p' /tmp/out | tail -1)
    # vrnic-pingpong checks every message and prints "data verified: N messages" (N = -n).
    verified=no
    [ "$TOOL" = vrnic-pingpong ] || verified=n/a
    n=$(sed -n 's/.*data verified: \([0-9]*\) messages.*/\1/p' /tmp/out | tail -1)
    [ "${n:-0}" -eq "$ITERS" ] && verified=yes
    echo "VRNIC-RESULT $NAME $role size=$size rc=$rc tool=$TOOL usec_per_iter=${usec:-none} verified=$verified cpu_pct=$cpu_pct"
    [ "$rc" -eq 0 ]
}

# perf_run ROLE PORTBASE TOOL ARGS...: a perftest run (run_retry) on port BASEPORT+PORTBASE+p, p
# counting runs. perftest calibrates its cycle counter against gettimeofday when it reports, and
# gives up ("Can't produce a report", exit 1) when the fit is poor (r^2 < 0.9), which a loaded
# TCG guest sometimes is; its peer then fails the final exchange. Both sides then see one of those
# messages and run the same tool once more, on a port of its own, in step (the peer's failure is
# usually one of them); any other failure, or a second one, stands.
perf_run() {
    role=$1 base=$2
    shift 2
    # Every tool's first run has a port fixed by its place in the list, whatever happened to the
    # runs before it, and a retry has a port of its own (+50): should only one side retry (each
    # judges its own output), the two still meet at the next tool instead of staying a port
    # apart for the rest of the list.
    port=$((BASEPORT + base + p))
    p=$((p + 1))
    run_retry "$role" "$@" -x "$GID" -p $port
    if [ "$rc" -ne 0 ] &&
        grep -qE "Can't produce a report|Failed to exchange data|Couldn't read remote address" /tmp/out; then
        echo "--- $NAME $1 $role: perftest could not report (clock calibration) or lost its peer at the end; once more"
        cat /tmp/out
        run_retry "$role" "$@" -x "$GID" -p $((port + 50))
    fi
}

fails=0
phase=0
for role in $ROLES; do
    i=0
    for size in $SIZES; do
        run_one "$role" "$size" $((BASEPORT + phase * 100 + i)) || fails=$((fails + 1))
        i=$((i + 1))
    done
    phase=$((phase + 1))
done
# Which libibverbs.so.1 Debian's tools get, and the device list (IDLE_CHECK=1: ibv sides):
#   VRNIC-LIB <name> lib=<path> devices=<names,>
if [ "${IDLE_CHECK:-0}" = 1 ]; then
    echo "--- $NAME ldd /usr/bin/ib_write_bw; ibv_devices"
    ldd /usr/bin/ib_write_bw | grep libibverbs
    timeout 60 ibv_devices >/tmp/devices.out 2>&1
    cat /tmp/devices.out
    lib=$(ldd /usr/bin/ib_write_bw | sed -n 's/.*libibverbs.so.1 => \([^ ]*\).*/\1/p')
    devs=$(awk 'NR > 2 && NF >= 1 { printf "%s,", $1 }' /tmp/devices.out)
    echo "VRNIC-LIB $NAME lib=${lib:-none} devices=${devs:-none}"
fi
# thread_stat DIR: "<context switches> <CPU cs>" of the task at DIR (/proc/PID/task/TID), from
# status (voluntary + nonvoluntary) and stat (utime + stime, fields 14 and 15, in USER_HZ = 100).
thread_stat() {
    sw=$(awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' "$1/status" 2>/dev/null)
    cpu=$(sed 's/.*) //' "$1/stat" 2>/dev/null | awk '{ print $12 + $13 }')
    echo "${sw:-0} ${cpu:-0}"
}
# The idle check (IDLE_CHECK=1): is the event thread of an idle context asleep?
# Twice: as is (irq), and with VRNIC_PCI_NO_IRQ=1 (poll: the library's 1 ms fallback), which
# shows what the check would see without the interrupt.
for how in ${IDLE_CHECK:+irq poll}; do
    [ "$IDLE_CHECK" = 1 ] || break
    if [ $how = irq ]; then
        "$TOOL" -g "$GID" -m "$MTU" -e -p $((BASEPORT + 650)) >/tmp/idle.out 2>&1 &
    else
        VRNIC_PCI_NO_IRQ=1 "$TOOL" -g "$GID" -m "$MTU" -e -p $((BASEPORT + 651)) >/tmp/idle.out 2>&1 &
    fi
    ipid=$!
    # Wait (at most 30 s) for the context's event thread to exist.
    evt=
    deadline=$(($(now) + 30))
    while [ -z "$evt" ] && [ "$(now)" -lt "$deadline" ] && kill -0 $ipid 2>/dev/null; do
        for t in /proc/$ipid/task/*; do
            [ "$(cat "$t/comm" 2>/dev/null)" = vrnic-events ] && evt=$t
        done
        [ -n "$evt" ] || sleep 0.1
    done
    found=no window=0 wakeups=0 ecpu=0 irqs=n/a
    if [ -n "$evt" ]; then
        found=yes
        # Let the server finish its set-up (QP, MR, listen) before the window opens.
        sleep 1
        i0=$(uio_irqs) w0=$(now_cs)
        set -- $(thread_stat "$evt")
        s0=$1 c0=$2
        sleep "${IDLE_WINDOW:-3}" # the measurement window, not a synchronisation
        set -- $(thread_stat "$evt")
        window=$(($(now_cs) - w0)) wakeups=$(($1 - s0)) ecpu=$(($2 - c0))
        i1=$(uio_irqs)
        [ -n "$i0" ] && [ -n "$i1" ] && irqs=$((i1 - i0))
    fi
    kill $ipid 2>/dev/null
    wait $ipid 2>/dev/null
    cat /tmp/idle.out
    echo "VRNIC-IDLE $NAME found=$found window_cs=$window wakeups=$wakeups cpu_cs=$ecpu irqs=$irqs mode=$how"
    [ $found = yes ] || fails=$((fails + 1))
done
# RC ping-pong with completion events (-e): the process should sleep, not spin.
# Per role: the same run twice, first spinning on the CQ (no -e: the baseline), then with -e.
e=0
for role in ${EVENT_ROLES:-}; do
    for mode in spin events; do
        eopt=
        [ $mode = events ] && eopt=-e
        i0=$(uio_irqs)
        measure_start
        # shellcheck disable=SC2086
        run_retry "$role" "$TOOL" -g "$GID" -m "$MTU" -s "$EVENT_SIZE" -n "$EVENT_ITERS" \
            -p $((BASEPORT + 600 + e)) $eopt $EXTRA
        measure_end
        i1=$(uio_irqs)
        irqs=n/a
        [ -n "$i0" ] && [ -n "$i1" ] && irqs=$((i1 - i0))
        cat /tmp/out
        echo "VRNIC-ERESULT $NAME $role size=$EVENT_SIZE rc=$rc cpu_pct=$cpu_pct wall_cs=$wall_cs irqs=$irqs mode=$mode"
        [ "$rc" -eq 0 ] || fails=$((fails + 1))
        e=$((e + 1))
    done
done
# UD and SRQ ping-pong against the stock rdma-core tools (or ours on both sides).
x=0
for kind in ${XRUNS:-}; do
    case "$kind:$TOOL" in
    ud:vrnic-pingpong) xt=vrnic-ud-pingpong ;;
    ud:*) xt=ibv_ud_pingpong ;;
    srq:vrnic-pingpong) xt=vrnic-srq-pingpong ;;
    *) xt=ibv_srq_pingpong ;;
    esac
    for role in $ROLES; do
        port=$((BASEPORT + 700 + x))
        x=$((x + 1))
        # UD messages fit the path MTU (1024 at link MTU 1500); SRQ: 16 QPs on one SRQ.
        if [ "$kind" = ud ]; then
            run_retry "$role" "$xt" -g "$GID" -s 1024 -n "$XITERS" -p "$port"
        else
            run_retry "$role" "$xt" -g "$GID" -m "$MTU" -s 4096 -q 16 -n "$XITERS" -p "$port"
        fi
        cat /tmp/out
        verified=n/a
        case $xt in vrnic-*)
            # The SRQ tool counts -n over all QPs like the stock one, so a side may receive more.
            n=$(sed -n 's/.*data verified: \([0-9]*\) messages.*/\1/p' /tmp/out | tail -1)
            verified=no
            [ "${n:-0}" -ge "$XITERS" ] && verified=yes
            ;;
        esac
        echo "VRNIC-XRESULT $NAME $kind $role rc=$rc verified=$verified"
        [ "$rc" -eq 0 ] && [ "$verified" != no ] || fails=$((fails + 1))
    done
done
# RDMA WRITE with immediate, vrnic to vrnic: one line per size:
#   VRNIC-WRITEIMM <name> <role> size=<s> rc=<rc> verified=<yes|no>
i=0
for size in ${WRITE_IMM_SIZES:-}; do
    [ -n "${WRITE_IMM_ROLE:-}" ] || break
    set -- vrnic-write-imm -g "$GID" -m "$MTU" -s "$size" -n 10 -p $((BASEPORT + 900 + i)) --timeout "$RUN_TIMEOUT"
    # The client retries a refused connection itself, within --timeout.
    [ "$WRITE_IMM_ROLE" = client ] && set -- "$@" "$PEER_IP"
    timeout $((RUN_TIMEOUT + 30)) "$@" >/tmp/out 2>&1
    rc=$?
    echo "--- $NAME write-imm $WRITE_IMM_ROLE size=$size: $*"
    cat /tmp/out
    verified=no
    grep -q "write-imm verified: 10 writes of $size bytes" /tmp/out && verified=yes
    echo "VRNIC-WRITEIMM $NAME $WRITE_IMM_ROLE size=$size rc=$rc verified=$verified"
    [ $rc -eq 0 ] && [ $verified = yes ] || fails=$((fails + 1))
    i=$((i + 1))
done
# RDMA READ, fetch-and-add and compare-and-swap (vrnic-rdma / rxe-rdma-peer, same protocol).
case $TOOL in
vrnic-pingpong) rt=vrnic-rdma ;;
*) rt=rxe-rdma-peer ;;
esac
i=0
for role in ${RDMA_ROLES:-}; do
    set -- "$rt" -g "$GID" -m "$MTU" -s "$RDMA_SIZES" -r "$RDMA_READS" -n "$RDMA_FAA" \
        -p $((BASEPORT + 800 + i)) --timeout "$RUN_TIMEOUT"
    # The active side (client) retries a refused connection itself, within --timeout.
    [ "$role" = client ] && set -- "$@" "$PEER_IP"
    t0=$(now)
    timeout $((RUN_TIMEOUT * 2 + 30)) "$@" >/tmp/out 2>&1
    rc=$?
    echo "--- $NAME rdma $role ($(($(now) - t0)) s): $*"
    cat /tmp/out
    if [ "$role" = server ]; then
        verified=no
        grep -q "^responder verified: $RDMA_FAA fetch-adds, .*data intact" /tmp/out && verified=yes
        echo "VRNIC-RDMA $NAME passive responder rc=$rc verified=$verified"
        [ $rc -eq 0 ] && [ $verified = yes ] || fails=$((fails + 1))
    else
        for s in $(echo "$RDMA_SIZES" | tr ',' ' '); do
            verified=no
            grep -q "^rdma-read verified: $RDMA_READS reads of $s bytes" /tmp/out && verified=yes
            echo "VRNIC-RDMA $NAME active read-$s rc=$rc verified=$verified"
            [ $rc -eq 0 ] && [ $verified = yes ] || fails=$((fails + 1))
        done
        verified=no
        grep -q "^fetch-add verified: $RDMA_FAA ops, .*(the responder agrees)" /tmp/out && verified=yes
        echo "VRNIC-RDMA $NAME active fetch-add rc=$rc verified=$verified"
        [ $rc -eq 0 ] && [ $verified = yes ] || fails=$((fails + 1))
        verified=no
        grep -q "^cmp-swap verified: swapped .*, refused when stale" /tmp/out && verified=yes
        echo "VRNIC-RDMA $NAME active cmp-swap rc=$rc verified=$verified"
        [ $rc -eq 0 ] && [ $verified = yes ] || fails=$((fails + 1))
    fi
    i=$((i + 1))
done
# perftest without -R (the TCP exchange): each of PERF_TOOLS once per role, in ROLES order, with
# PERF_ARGS; one line per run, with the figure perftest printed (BW average, or the typical latency)
# where this side printed one:
#   VRNIC-PERF <name> <tool> <role> rc=<rc> bytes=<b> value=<v> unit=<MB/sec|Gb/sec|usec|none>
# After each run, where this guest's CPU went during it (the run is short under TCG, so a busy
# guest is a busy vCPU thread on the host):
#   VRNIC-PERFCPU <name> <tool> <role> busy_pct=<guest CPU not idle, %> perftest_cpu_pct=<%>
#       top=<comm:ticks,...>
# (perftest's own CPU over the run's wall time; the three living processes that used the most CPU
# ticks, kernel threads included).
cpu_ticks() { # "pid comm ticks" per process (utime + stime, clock ticks; comm's blanks as _)
    awk '{ r = $0; sub(/.*\) /, "", r); split(r, f, " "); c = $0; sub(/^[0-9]+ \(/, "", c)
        sub(/\) [^)]*$/, "", c); gsub(/ /, "_", c); print $1, c, f[12] + f[13] }' \
        /proc/[0-9]*/stat 2>/dev/null
}
cpu_idle() { awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 }' /proc/stat; }
cpu_report() { # TOOL ROLE: against the snapshots cpu_ticks/cpu_idle took before the run
    read -r c_i0 c_t0 </tmp/cpu-idle0
    cpu_idle >/tmp/cpu-idle1
    read -r c_i1 c_t1 </tmp/cpu-idle1
    cpu_ticks >/tmp/cpu-ticks1
    c_top=$(awk 'NR == FNR { b[$1] = $3; next } { d = $3 - b[$1]; if (d > 0) print d, $2 }' \
        /tmp/cpu-ticks0 /tmp/cpu-ticks1 | sort -rn | head -3 | awk '{ printf "%s%s:%s", s, $2, $1; s = "," }')
    c_dt=$((c_t1 - c_t0))
    [ "$c_dt" -gt 0 ] || c_dt=1
    echo "VRNIC-PERFCPU $NAME $1 $2 busy_pct=$(((c_dt - (c_i1 - c_i0)) * 100 / c_dt)) perftest_cpu_pct=$cpu_pct top=${c_top:-none}"
}
p=0
for tool in ${PERF_TOOLS:-}; do
    for role in $ROLES; do
        cpu_ticks >/tmp/cpu-ticks0
        cpu_idle >/tmp/cpu-idle0
        measure_start
        # shellcheck disable=SC2086
        perf_run "$role" 1000 "$tool" ${PERF_ARGS:-}
        measure_end
        cpu_report "$tool" "$role"
        echo "--- $NAME perf $tool $role"
        cat /tmp/out
        # shellcheck disable=SC2046 # the three words
        set -- $(awk '/#bytes/ { getline; if ($1 ~ /^[0-9]+$/) print $1, $4, $5; exit }' /tmp/out)
        bytes=${1:-none} value=none unit=none
        case $tool in
        *_bw) [ -n "${2:-}" ] && value=$2 unit=$(grep -o 'average\[[^]]*\]' /tmp/out | head -1 | tr -d '[]' | sed 's/average//') ;;
        *_lat) [ -n "${3:-}" ] && value=$3 unit=usec ;;
        esac
        echo "VRNIC-PERF $NAME $tool $role rc=$rc bytes=$bytes value=$value unit=${unit:-none}"
        [ "$rc" -eq 0 ] || fails=$((fails + 1))
    done
done
# Several programs on one vrnic device (MULTI_ROLE server: a vrnic guest on vrnic's libibverbs, whose
# programs share the device through the guest agent; client: the peer). The server side runs two
# benchmark servers (ib_write_bw, ib_send_bw) and a victim (ib_write_bw -D 60) at once, ibv_devinfo
# while they run, kills the victim with SIGKILL once its client is connected (its "remote address"
# line printed), then checks that the agent serves nobody and its device holds nothing. The client
# side runs the three clients at once; the victim's must fail, not hang. One line per check:
#   VRNIC-MULTI <name> <check> ok=<yes|no> <details>
multi_field() { # name: the value after NAME in `vrnic-agent --status`'s line
    /usr/lib/vrnic/vrnic-agent --status 2>/dev/null | awk -v k="$1" '{ for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) }'
}
multi_client() { # out port tool args...: retries while the server is not listening yet
    out=$1 port=$2
    shift 2
    deadline=$(($(now) + CONNECT_WAIT))
    while :; do
        timeout 150 "$@" -x "$GID" -p "$port" "$PEER_IP" >"$out" 2>&1
        rc=$?
        if [ $rc -ne 0 ] && [ "$(now)" -lt "$deadline" ] &&
            grep -qiE "couldn't connect|connection refused|unable to init the socket" "$out"; then
            sleep 0.5
            continue
        fi
        echo "rc=$rc" >>"$out"
        return $rc
    done
}
mp=$((BASEPORT + 1900))
case ${MULTI_ROLE:-} in
server)
    t0=$(now)
    timeout 150 ib_write_bw -x "$GID" -p $mp -n 3000 >/tmp/m1 2>&1 &
    m1=$!
    timeout 150 ib_send_bw -x "$GID" -p $((mp + 1)) -n 3000 >/tmp/m2 2>&1 &
    m2=$!
    stdbuf -oL ib_write_bw -x "$GID" -p $((mp + 2)) -D 60 >/tmp/m3 2>&1 &
    m3=$!
    deadline=$(($(now) + CONNECT_WAIT + 30))
    while ! grep -q 'remote address' /tmp/m3 && [ "$(now)" -lt "$deadline" ]; do sleep 0.2; done
    before=$(/usr/lib/vrnic/vrnic-agent --status 2>&1)
    echo "--- $NAME multi: agent before the kill: $before"
    timeout 60 ibv_devinfo >/tmp/m4 2>&1
    rc4=$?
    ok=no
    [ $rc4 -eq 0 ] && grep -q 'hca_id:.*vrnic0' /tmp/m4 && ok=yes
    echo "VRNIC-MULTI $NAME devinfo-beside-benchmarks ok=$ok rc=$rc4"
    [ $ok = yes ] || fails=$((fails + 1))
    connected=no
    grep -q 'remote address' /tmp/m3 && connected=yes
    kill -9 $m3
    wait $m3
    rc3=$?
    ok=no
    [ $connected = yes ] && [ $rc3 -eq 137 ] && ok=yes
    echo "VRNIC-MULTI $NAME victim-killed ok=$ok connected=$connected rc=$rc3 programs_before=$(echo "$before" | awk '{print $2}')"
    [ $ok = yes ] || fails=$((fails + 1))
    wait $m1
    r1=$?
    wait $m2
    r2=$?
    echo "--- $NAME multi ib_write_bw server:"
    cat /tmp/m1
    echo "--- $NAME multi ib_send_bw server:"
    cat /tmp/m2
    ok=no
    [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && ok=yes
    echo "VRNIC-MULTI $NAME two-servers-beside-the-kill ok=$ok rc_write=$r1 rc_send=$r2 wall_s=$(($(now) - t0))"
    [ $ok = yes ] || fails=$((fails + 1))
    # Everything the three programs had is gone: no program, no pins, only the default context,
    # no object on the device.
    deadline=$(($(now) + 30))
    while :; do
        st=$(/usr/lib/vrnic/vrnic-agent --status 2>&1)
        case $st in
        "programs 0 pinned 0 contexts 1 pds 0 mrs 0 cqs 0 qps 0 ahs 0 srqs 0 mr_pages 0") ok=yes; break ;;
        esac
        [ "$(now)" -lt "$deadline" ] || { ok=no; break; }
        sleep 0.2
    done
    closed=$(grep -c 'program gone; context closed' /run/vrnic/agent.sock.log 2>/dev/null)
    echo "VRNIC-MULTI $NAME nothing-left ok=$ok contexts_closed=${closed:-0} status=\"$st\""
    [ $ok = yes ] || fails=$((fails + 1))
    echo "--- $NAME multi: agent log"
    tail -20 /run/vrnic/agent.sock.log 2>/dev/null
    ;;
client)
    multi_client /tmp/c1 $mp ib_write_bw -n 3000 &
    c1=$!
    multi_client /tmp/c2 $((mp + 1)) ib_send_bw -n 3000 &
    c2=$!
    multi_client /tmp/c3 $((mp + 2)) ib_write_bw -D 60 &
    c3=$!
    wait $c1
    r1=$?
    wait $c2
    r2=$?
    wait $c3
    r3=$?
    for f in /tmp/c1 /tmp/c2 /tmp/c3; do
        echo "--- $NAME multi client $f:"
        cat $f
    done
    ok=no
    [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && ok=yes
    echo "VRNIC-MULTI $NAME two-clients ok=$ok rc_write=$r1 rc_send=$r2"
    [ $ok = yes ] || fails=$((fails + 1))
    ok=no
    [ $r3 -ne 0 ] && [ $r3 -ne 124 ] && ok=yes
    echo "VRNIC-MULTI $NAME victim-peer-failed ok=$ok rc=$r3"
    [ $ok = yes ] || fails=$((fails + 1))
    ;;
esac
# perftest again, with all sizes (-a), with several QPs (-q 4), a long run, and many QPs with
# large messages (-q 8 at 1 MiB and 8 MiB): only the exit status is judged here (the harness checks
# the rows); the rows go to the harness's perftest-sweep.csv.
p=0
for variant in all qp long big huge; do
    case $variant in
    all) vtools=${PERF_ALL_TOOLS:-} vargs=${PERF_ALL_ARGS:-} ;;
    qp) vtools=${PERF_QP_TOOLS:-} vargs=${PERF_QP_ARGS:-} ;;
    long) vtools=${PERF_LONG_TOOLS:-} vargs=${PERF_LONG_ARGS:-} ;;
    big) vtools=${PERF_BIG_TOOLS:-} vargs=${PERF_BIG_ARGS:-} ;;
    huge) vtools=${PERF_HUGE_TOOLS:-} vargs=${PERF_HUGE_ARGS:-} ;;
    esac
    # Many QPs with large messages take longest (perftest fills its buffers with random() first):
    # bounded by 3 x RUN_TIMEOUT.
    run_timeout=$RUN_TIMEOUT
    case $variant in big | huge) run_timeout=$((RUN_TIMEOUT * 3)) ;; esac
    for tool in $vtools; do
        for role in $ROLES; do
            w0=$(now_cs)
            run_timeout0=$RUN_TIMEOUT RUN_TIMEOUT=$run_timeout
            # shellcheck disable=SC2086
            perf_run "$role" 1100 "$tool" $vargs
            RUN_TIMEOUT=$run_timeout0
            echo "--- $NAME perf $tool $role ($variant: $vargs)"
            cat /tmp/out
            # Result rows: "#bytes" header, then one numeric row per size (BW average: 4th
            # column; latency: t_typical, 5th).
            awk -v n="$NAME" -v t="$tool" -v r="$role" -v v="$variant" '
                /#bytes/ { on = 1; next }
                on && $1 ~ /^[0-9]+$/ && NF >= 5 { print "VRNIC-PERFROW", n, t, r, v, $1, (t ~ /_lat$/ ? $5 : $4) }
                on && /^-+$/ { on = 0 }' /tmp/out >/tmp/rows
            cat /tmp/rows
            rows=$(wc -l </tmp/rows)
            first=$(awk 'NR == 1 { print $6 }' /tmp/rows) last=$(awk 'END { print $6 }' /tmp/rows)
            echo "VRNIC-PERFX $NAME $tool $role $variant rc=$rc rows=$rows bytes=${first:-none}-${last:-none} cs=$(($(now_cs) - w0))"
            [ "$rc" -eq 0 ] || fails=$((fails + 1))
        done
    done
done
# Registered memory stays in place under compaction (PIN_CHECK=1, vrnic guests only).
if [ "${PIN_CHECK:-0}" = 1 ]; then
    rm -f /tmp/pin-go /tmp/pin.out
    timeout $((RUN_TIMEOUT * 2)) pin-check --hold /tmp/pin-go --hold-timeout 60 >/tmp/pin.out 2>&1 &
    ppid=$!
    # While it holds the device (bounded wait for its line), a second process uses it too.
    deadline=$(($(now) + RUN_TIMEOUT))
    while ! grep -q 'holding the device' /tmp/pin.out && kill -0 $ppid 2>/dev/null && [ "$(now)" -lt "$deadline" ]; do
        sleep 0.2
    done
    second=n/a
    if grep -q 'holding the device' /tmp/pin.out; then
        timeout 60 ibv_devinfo >/tmp/devinfo.out 2>&1
        second=$?
        echo "--- $NAME ibv_devinfo while pin-check holds the device: exit $second"
        cat /tmp/devinfo.out
    fi
    touch /tmp/pin-go
    wait $ppid
    rc=$?
    echo "--- $NAME pin-check"
    cat /tmp/pin.out
    res=$(sed -n 's/^pin-check: result //p' /tmp/pin.out | tail -1)
    echo "VRNIC-PIN $NAME check rc=$rc ${res:-no-result} second_open=$second"
    [ "$rc" -eq 0 ] || fails=$((fails + 1))
    # The same check with the image's compact_unevictable_allowed=0 undone for its duration:
    # what keeps registered pages in place is then the library's io_uring pins alone.
    cua=/proc/sys/vm/compact_unevictable_allowed
    if [ -w $cua ]; then
        old=$(cat $cua)
        echo 1 >$cua
        timeout $((RUN_TIMEOUT * 2)) pin-check >/tmp/pin.out 2>&1
        rc=$?
        echo "$old" >$cua
        echo "--- $NAME pin-check with compact_unevictable_allowed=1 (restored to $old)"
        cat /tmp/pin.out
        res=$(sed -n 's/^pin-check: result //p' /tmp/pin.out | tail -1)
        echo "VRNIC-PIN $NAME unguarded rc=$rc ${res:-no-result}"
    fi
    # Data-checked transfers while memory is fragmented and compacted every 0.2 s: per role,
    # Debian's ibv_rc_pingpong -c (which checks the first byte of every page) and rxe-rdma-peer
    # (RDMA READs checked byte for byte with their guard bytes, fetch-adds, compare-and-swaps).
    i=0
    for role in $ROLES; do
        for t in pingpong rdma; do
            rm -f /tmp/pin-stop
            pin-check --compact-loop $((RUN_TIMEOUT * 2 + 60)) --stop /tmp/pin-stop >/tmp/loop.out 2>&1 &
            lpid=$!
            port=$((BASEPORT + 1300 + i))
            i=$((i + 1))
            if [ $t = pingpong ]; then
                run_retry "$role" ibv_rc_pingpong -g "$GID" -m "$MTU" -s "$PIN_SIZE" -n "$PIN_ITERS" -p "$port" -c
            else
                set -- rxe-rdma-peer -g "$GID" -m "$MTU" -s "$PIN_RDMA_SIZES" -r "$PIN_RDMA_READS" -n 20 \
                    -p "$port" --timeout "$RUN_TIMEOUT"
                # The active side (client) retries a refused connection itself, within --timeout.
                [ "$role" = client ] && set -- "$@" "$PEER_IP"
                echo "--- $NAME $role: $*"
                timeout $((RUN_TIMEOUT * 2 + 30)) "$@" >/tmp/out 2>&1
                rc=$?
            fi
            touch /tmp/pin-stop
            wait $lpid
            cat /tmp/out /tmp/loop.out
            n=$(sed -n 's/.*compact-loop compactions=\([0-9]*\).*/\1/p' /tmp/loop.out)
            m=$(sed -n 's/.*compact-loop .* migrated=\([0-9]*\).*/\1/p' /tmp/loop.out)
            if [ $t = pingpong ]; then
                what="ibv_rc_pingpong -c $PIN_SIZE B x $PIN_ITERS"
                verified=yes
                grep -q 'invalid data' /tmp/out && verified=no
            else
                what="rxe-rdma-peer READs of $PIN_RDMA_SIZES B x $PIN_RDMA_READS"
                verified=no
                if [ "$role" = server ]; then
                    grep -q '^responder verified: 20 fetch-adds, .*data intact' /tmp/out && verified=yes
                else
                    want=$(echo "$PIN_RDMA_SIZES" | tr ',' ' ' | wc -w)
                    got=$(grep -c "^rdma-read verified: $PIN_RDMA_READS reads of " /tmp/out)
                    [ "$got" -eq "$want" ] && grep -q '^cmp-swap verified' /tmp/out && verified=yes
                fi
            fi
            echo "VRNIC-PIN $NAME transfer $role rc=$rc verified=$verified compactions=${n:-0} migrated=${m:-0} $what"
            [ "$rc" -eq 0 ] && [ $verified = yes ] && [ "${n:-0}" -gt 0 ] || fails=$((fails + 1))
        done
    done
fi
echo "VRNIC-SUMMARY $NAME failures=$fails"
[ $fails -eq 0 ]
