# cargo xtask bench --sched-trace, inside the one-node VM: one-node ping-pongs (perftest's
# ib_write_lat, rdma_bench's --mode lat and --mode lat-poll, host region) under each scheduler
# setting, each run traced with the kernel's scheduler and workqueue tracepoints (tracefs).
# $1: rdma_bench; $2: runs per program and setting; $3: round trips per run; $4: message size;
# $5: the settings, space-separated (RUN_TO_PARITY, NO_RUN_TO_PARITY). Run in a writable folder:
# run R's client output goes to the console between `### run R begin` and `### run R end
# client=RC server=RC`, its trace to trace-R.txt here (R: PROGRAM.SETTING.N).
set -u
B=/tmp/rdma_bench
cp "$1" "$B" || exit 1
RUNS=$2 ITERS=$3 SIZE=$4 SETTINGS=$5
D=$RDMA_DEVICE G=$RDMA_GID_INDEX SERVER=$PEER_ADDR
OUT=$PWD
LIMIT=120
PORT=18900

# tracefs, mounted by the kernel under debugfs (which the testbed mounts).
T=/sys/kernel/debug/tracing
[ -e "$T/set_event" ] || T=/sys/kernel/tracing
[ -e "$T/set_event" ] || { echo "sched.sh: no tracefs"; exit 1; }
FEATURES=/sys/kernel/debug/sched/features
[ -w "$FEATURES" ] || { echo "sched.sh: no $FEATURES to change"; exit 1; }

echo 0 > "$T/tracing_on"
echo nop > "$T/current_tracer"
# One clock for every CPU: a wakeup is recorded on one vCPU, the switch it waits for on another.
echo global > "$T/trace_clock"
echo 8192 > "$T/buffer_size_kb"
: > "$T/set_event"
for e in sched:sched_waking sched:sched_wakeup sched:sched_switch sched:sched_migrate_task \
    workqueue:workqueue_queue_work workqueue:workqueue_execute_start \
    workqueue:workqueue_execute_end; do
    echo "$e" >> "$T/set_event" || { echo "sched.sh: no event $e"; exit 1; }
done
# Whether a wake-up on another CPU asked that CPU to reschedule (an IPI) and when it took it.
for e in ipi:ipi_send_cpu irq_vectors:reschedule_entry; do
    echo "$e" >> "$T/set_event" 2>/dev/null || echo "sched.sh: no event $e (not traced)"
done

echo "### kernel $(uname -r)"
echo "### cpus $(grep -c ^processor /proc/cpuinfo)"
echo "### tracefs $T"

# Whether a socket listens on TCP port $1, given in hexadecimal.
listening() {
    grep -q -E ":$1 [0-9A-F]+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Runs "$@" every 100 ms until it succeeds (0) or $LIMIT seconds have passed (1).
wait_until() {
    n=0
    until "$@"; do
        n=$((n + 1))
        [ $n -gt $((LIMIT * 10)) ] && return 1
        sleep 0.1
    done
}

# One side of a ping-pong: $1 server or client, $2 the program (perftest, lat, lat-poll), $3 port.
side() {
    case "$2:$1" in
    perftest:server) timeout "$LIMIT" ib_write_lat -d "$D" -x "$G" -F -s "$SIZE" -n "$ITERS" -p "$3" ;;
    perftest:client) timeout "$LIMIT" ib_write_lat -d "$D" -x "$G" -F -s "$SIZE" -n "$ITERS" -p "$3" "$SERVER" ;;
    lat*:server) timeout "$LIMIT" "$B" server --port "$3" --size "$SIZE" --iters "$ITERS" \
        --mode "$2" --inline no --region host ;;
    lat*:client) timeout "$LIMIT" "$B" client "$SERVER" --port "$3" --size "$SIZE" \
        --iters "$ITERS" --mode "$2" --inline no --region host ;;
    esac
}

i=0
run=1
while [ "$run" -le "$RUNS" ]; do
    # Settings and programs interleaved, so that a spell of host load falls on all of them.
    for setting in $SETTINGS; do
        echo "$setting" > "$FEATURES" || { echo "sched.sh: cannot set $setting"; exit 1; }
        for prog in perftest lat lat-poll; do
            i=$((i + 1))
            port=$((PORT + i))
            id=$prog.$setting.$run
            echo 0 > "$T/tracing_on"
            : > "$T/trace"
            echo "### run $id begin"
            echo 1 > "$T/tracing_on"
            side server "$prog" "$port" > /tmp/server.out 2>&1 < /dev/null &
            spid=$!
            client=ready
            if wait_until listening "$(printf '%04X' "$port")"; then
                side client "$prog" "$port" < /dev/null 2>&1
                client=$?
                [ $client -eq 0 ] || kill "$spid" 2>/dev/null
            else
                kill "$spid" 2>/dev/null
            fi
            wait "$spid"
            server=$?
            echo 0 > "$T/tracing_on"
            cat "$T/trace" > "$OUT/trace-$id.txt"
            echo "### run $id end client=$client server=$server"
        done
    done
    run=$((run + 1))
done
echo RUN_TO_PARITY > "$FEATURES"
