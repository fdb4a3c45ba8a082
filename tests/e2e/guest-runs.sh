# shellcheck shell=sh
# Guest side of the kill and restart steps (POSIX sh, busybox in the vrnic guest): ping-pong runs
# one after the other. The harness prepends the parameters and passes the whole file as the job:
#   NAME          this guest's name            ROLE      server or client
#   PEER_IP       the server's eth0 address    RUNS      "PORT:SIZE:ITERS ..." one run each
#   EXTRA         extra vrnic-pingpong options RUN_TIMEOUT bound on one run (s)
#   CONNECT_WAIT  how long a client retries a refused connection (s)
#   REPLUG_WAIT   0, or: before every run but the first, wait (at most this many s) until the
#                 vrnic PCI function was re-plugged (its sysfs directory is a new one; the harness
#                 re-plugs it over QMP after restarting the daemon). A device whose backend died
#                 must not be opened before: QEMU 11.1.3 aborts on its first config read then.
# Per run it prints the tool's output, then
#   VRNIC-RUN <name> <n> port=<p> rc=<rc> secs=<s> verified=<yes|no>
# (secs: the run's wall time; verified=yes: "data verified: ITERS messages").

now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# The vrnic function's sysfs directory (vendor 0x1af4, device 0x1046), as an inode number.
vrnic_ino() {
    for d in /sys/bus/pci/devices/*; do
        if [ "$(cat "$d/vendor" 2>/dev/null)" = 0x1af4 ] && [ "$(cat "$d/device" 2>/dev/null)" = 0x1046 ]; then
            ls -idL "$d" | awk '{ print $1 }'
            return
        fi
    done
}

ino=$(vrnic_ino)
fails=0
n=0
for run in $RUNS; do
    n=$((n + 1))
    port=${run%%:*} rest=${run#*:}
    size=${rest%%:*} iters=${rest#*:}
    if [ "$n" -gt 1 ] && [ "${REPLUG_WAIT:-0}" -gt 0 ]; then
        t0=$(now)
        while :; do
            cur=$(vrnic_ino)
            [ -n "$cur" ] && [ "$cur" != "$ino" ] && break
            if [ "$(awk -v a="$t0" -v b="$(now)" -v w="$REPLUG_WAIT" 'BEGIN { print (b - a > w) }')" = 1 ]; then
                break
            fi
            sleep 0.5
        done
        echo "VRNIC-REPLUG $NAME before run $n: inode $ino -> ${cur:-none} after $(since "$t0") s"
        ino=$cur
    fi
    set -- vrnic-pingpong -g 1 -m 1024 -s "$size" -n "$iters" -p "$port"
    # shellcheck disable=SC2086
    set -- "$@" ${EXTRA:-}
    [ "$ROLE" = client ] && set -- "$@" "$PEER_IP"
    t0=$(now)
    deadline=$(awk -v a="$t0" -v w="$CONNECT_WAIT" 'BEGIN { print a + w }')
    while :; do
        timeout "$RUN_TIMEOUT" "$@" >/tmp/out 2>&1
        rc=$?
        # A client retries only while the server is not listening yet.
        if [ $rc -ne 0 ] && [ "$ROLE" = client ] &&
            [ "$(awk -v d="$deadline" -v b="$(now)" 'BEGIN { print (b < d) }')" = 1 ] &&
            grep -qiE "couldn't connect to [^ ]+:[0-9]+|connection refused" /tmp/out; then
            sleep 0.5
            continue
        fi
        break
    done
    echo "--- $NAME run $n: $*"
    cat /tmp/out
    verified=no
    m=$(sed -n 's/.*data verified: \([0-9]*\) messages.*/\1/p' /tmp/out | tail -1)
    [ "${m:-0}" -eq "$iters" ] && verified=yes
    echo "VRNIC-RUN $NAME $n port=$port rc=$rc secs=$(since "$t0") verified=$verified"
    [ $rc -eq 0 ] || fails=$((fails + 1))
done
echo "VRNIC-SUMMARY $NAME failures=$fails"
exit 0
