# cargo xtask bench --peers, on both nodes of the two-node testbed: runs a plan of steps in
# order, each a target on node a and an initiator on node b, of Mooncake's
# transfer_engine_bench ($2, from its wheel in the cache) or the engine's twin,
# engine_peer_bench ($3); or (ENGINE py-mooncake, py-ours) one Python client over
# TransferEngine's API ($4, python/examples/mooncake_bench.py) with Mooncake's mooncake.engine
# (PYTHONPATH $5, the wheel) or ours (PYTHONPATH $6). All take the same parameters and
# metadata service. META p2p: the
# P2P handshake: node a's target prints `listening on IP:PORT`, which node b's initiator is
# given as its segment. META etcd: node a starts an etcd (Debian's etcd-server) on its address
# at port 2379 before the first step when the plan has such steps; both engines publish in it
# and look up there, the target named by its `--local_server_name` (IP:PORT), which is then
# the initiator's segment.
#
# Plan lines (words; `#` starts a comment line):
#   ID N LIMIT ENGINE META OPERATION BLOCK BATCH THREADS DURATION BUFFER
# N: the step's number (its ports: 17000+N, 27000+N, 37000+N); ENGINE: mooncake, ours,
# py-mooncake or py-ours;
# META: p2p or etcd; LIMIT (seconds): bounds the target's start and the initiator's run each.
#
# Node a: for each step, starts the target, writes its address into `ready-ID` in its run
# folder (`none` if it never listened), waits for node b's `done-ID`, and stops the target.
# Node b: for each step, waits for `ready-ID` in node a's run folder, prints
# `### step ID begin`, the initiator's closing lines, `### step ID end rc=RC secs=S` (RC 124:
# timed out; `ready`: the target never listened; S: the initiator's wall time), then writes
# `done-ID` in its own run folder.
set -u
PLAN=$1 MOONCAKE=$2 OURS=$3 PYCLIENT=$4 PY_MOONCAKE=$5 PY_OURS=$6
D=$RDMA_DEVICE
ETCD_PORT=2379
if [ "$NODE" = a ]; then
    ETCD_HOST=$LOCAL_ADDR
else
    ETCD_HOST=$PEER_ADDR
fi

# Centiseconds since boot, without starting a process.
now() {
    read -r up _ < /proc/uptime
    echo "${up%.*}${up#*.}"
}

# Waits until file $2 exists and is not empty, for at most $1 seconds (status 1 after that).
wait_file() {
    n=0 most=$(($1 * 10))
    until [ -s "$2" ]; do
        n=$((n + 1))
        [ $n -gt $most ] && return 1
        sleep 0.1
    done
}

# The metadata server argument of mode $1, for both engines.
server() {
    if [ "$1" = etcd ]; then
        echo "$ETCD_HOST:$ETCD_PORT"
    else
        echo P2PHANDSHAKE
    fi
}

# Node a: starts etcd when the plan has etcd steps, and waits (at most 60 s) until it answers.
start_etcd() {
    grep -q '^[^#]* etcd ' "$PLAN" || return 0
    peer=http://127.0.0.1:2380 url=http://$ETCD_HOST:$ETCD_PORT
    etcd --name=peers --data-dir=/tmp/etcd-peers.$$ --listen-client-urls="$url" \
        --advertise-client-urls="$url" --listen-peer-urls=$peer \
        --initial-advertise-peer-urls=$peer --initial-cluster=peers=$peer \
        > /tmp/etcd-peers.log 2>&1 &
    ETCD_PID=$!
    n=0
    until grep -q 'ready to serve client requests' /tmp/etcd-peers.log; do
        n=$((n + 1))
        if [ $n -gt 600 ]; then
            echo "peers.sh: etcd did not start in 60 s; its log:"
            tail -n 20 /tmp/etcd-peers.log
            return 1
        fi
        sleep 0.1
    done
}

# The PYTHONPATH of Python engine $1 (py-mooncake or py-ours).
pypath() {
    if [ "$1" = py-mooncake ]; then echo "$PY_MOONCAKE"; else echo "$PY_OURS"; fi
}

# Node a: starts step $1's target (number $2, engine $3, buffer $4, metadata mode $6),
# bounded by $5 seconds for its start; writes its segment (or `none`) into ready-$1.
target() {
    id=$1 num=$2 engine=$3 buffer=$4 limit=$5 meta=$6
    log=/tmp/target-$id.log
    : > "$log"
    case $engine in
    py-*)
        name=$LOCAL_ADDR:$((17000 + num))
        PYTHONPATH=$(pypath "$engine") PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 "$PYCLIENT" \
            --mode target --metadata_server "$(server "$meta")" --local_server_name "$name" \
            --device_name "$D" --buffer_size "$buffer" > "$log" 2>&1 &
        ;;
    mooncake)
        name=$LOCAL_ADDR:$((17000 + num))
        "$MOONCAKE" --mode=target --metadata_server="$(server "$meta")" \
            --local_server_name="$name" --device_name="$D" \
            --buffer_size="$buffer" > "$log" 2>&1 &
        ;;
    *)
        name=$LOCAL_ADDR:$((27000 + num))
        "$OURS" --mode target --metadata_server "$(server "$meta")" \
            --local_server_name "$name" --buffer_size "$buffer" > "$log" 2>&1 &
        ;;
    esac
    pid=$!
    n=0 most=$((limit * 10)) seg=
    while [ -z "$seg" ] && [ $n -le $most ]; do
        while IFS= read -r line; do
            case $line in
            *"listening on "*)
                seg=${line##*listening on }
                seg=${seg%% *}
                break
                ;;
            esac
        done < "$log"
        [ -n "$seg" ] && break
        n=$((n + 1))
        sleep 0.1
    done
    # The same pause for both engines, untimed: Mooncake's target says where it listens
    # before it may be ready for a handshake.
    [ -n "$seg" ] && sleep 2
    # In etcd, the initiator looks the target up by its name.
    [ -n "$seg" ] && [ "$meta" = etcd ] && seg=$name
    echo "${seg:-none}" > "$TESTBED_RUN/ready-$id"
    if [ -z "$seg" ]; then
        echo "peers.sh: step $id: the target never said where it listens; its log:"
        tail -n 20 "$log"
    fi
}

# Node b: runs step $1's initiator against segment $2 (the rest: number, engine, operation,
# block, batch, threads, duration, buffer, limit, metadata mode).
initiator() {
    id=$1 seg=$2 num=$3 engine=$4 op=$5 block=$6 batch=$7 threads=$8 secs=$9
    shift 9
    buffer=$1 limit=$2 meta=$3
    log=/tmp/initiator-$id.log
    case $engine in
    py-*)
        PYTHONPATH=$(pypath "$engine") PYTHONDONTWRITEBYTECODE=1 timeout "$limit" \
            /usr/bin/python3 "$PYCLIENT" --mode initiator --metadata_server "$(server "$meta")" \
            --local_server_name "$LOCAL_ADDR:$((37000 + num))" --segment_id "$seg" \
            --device_name "$D" --buffer_size "$buffer" --operation "$op" \
            --block_size "$block" --batch_size "$batch" --threads "$threads" \
            --duration "$secs" > "$log" 2>&1
        ;;
    mooncake)
        timeout "$limit" "$MOONCAKE" --mode=initiator --metadata_server="$(server "$meta")" \
            --local_server_name="$LOCAL_ADDR:$((37000 + num))" --segment_id="$seg" \
            --device_name="$D" --buffer_size="$buffer" --operation="$op" \
            --block_size="$block" --batch_size="$batch" --threads="$threads" \
            --duration="$secs" --report_unit=MiB > "$log" 2>&1
        ;;
    *)
        timeout "$limit" "$OURS" --mode initiator --metadata_server "$(server "$meta")" \
            --segment_id "$seg" \
            --buffer_size "$buffer" --operation "$op" --block_size "$block" \
            --batch_size "$batch" --threads "$threads" --duration "$secs" > "$log" 2>&1
        ;;
    esac
    rc=$?
    # The closing lines, and the errors of a failed run (glog's `E` and `F` lines); the log's
    # end when it failed.
    grep -E 'Test completed|RESULT|error|timeout|^[EF][0-9]{4} ' "$log" | tail -n 12
    if [ $rc != 0 ]; then
        echo "peers.sh: step $id: the initiator ended with $rc; its log ends:"
        tail -n 25 "$log"
    fi
    return $rc
}

ETCD_PID=
[ "$NODE" = a ] && start_etcd
while read -r id num limit engine meta op block batch threads secs buffer; do
    case $id in '' | '#'*) continue ;; esac
    if [ "$NODE" = a ]; then
        target "$id" "$num" "$engine" "$buffer" "$limit" "$meta"
        # Node b's initiator: its own limit, the wait for its start and slack.
        wait_file $((2 * limit + 60)) "$TESTBED_PEER_RUN/done-$id" ||
            echo "peers.sh: step $id: node b never finished"
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        continue
    fi
    echo "### step $id begin"
    t0=$(now)
    rc=ready
    if wait_file $((limit + 30)) "$TESTBED_PEER_RUN/ready-$id"; then
        read -r seg < "$TESTBED_PEER_RUN/ready-$id"
        if [ "$seg" != none ]; then
            initiator "$id" "$seg" "$num" "$engine" "$op" "$block" "$batch" "$threads" \
                "$secs" "$buffer" "$limit" "$meta"
            rc=$?
        fi
    fi
    echo "### step $id end rc=$rc secs=$((($(now) - t0) / 100))"
    echo "$rc" > "$TESTBED_RUN/done-$id"
done < "$PLAN"
[ -n "$ETCD_PID" ] && kill "$ETCD_PID" 2>/dev/null
exit 0
