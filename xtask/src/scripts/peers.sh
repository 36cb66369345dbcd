# cargo xtask bench --peers, on both nodes of the two-node testbed: runs a plan of steps in
# order, each a target on node a and an initiator on node b, of Mooncake's
# transfer_engine_bench ($2, from its wheel in the cache) or the engine's twin,
# engine_peer_bench ($3). Both take the same parameters, and P2P-handshake metadata: node a's
# target prints `listening on IP:PORT`, which node b's initiator is given as its segment.
#
# Plan lines (words; `#` starts a comment line):
#   ID N LIMIT ENGINE OPERATION BLOCK BATCH THREADS DURATION BUFFER
# N: the step's number (its ports: 17000+N, 27000+N, 37000+N); ENGINE: mooncake or ours;
# LIMIT (seconds): bounds the target's start and the initiator's run each.
#
# Node a: for each step, starts the target, writes its address into `ready-ID` in its run
# folder (`none` if it never listened), waits for node b's `done-ID`, and stops the target.
# Node b: for each step, waits for `ready-ID` in node a's run folder, prints
# `### step ID begin`, the initiator's closing lines, `### step ID end rc=RC secs=S` (RC 124:
# timed out; `ready`: the target never listened; S: the initiator's wall time), then writes
# `done-ID` in its own run folder.
set -u
PLAN=$1 MOONCAKE=$2 OURS=$3
D=$RDMA_DEVICE

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

# Node a: starts step $1's target (number $2, engine $3, buffer $4), bounded by $5 seconds
# for its start; writes its address (or `none`) into ready-$1.
target() {
    id=$1 num=$2 engine=$3 buffer=$4 limit=$5
    log=/tmp/target-$id.log
    : > "$log"
    case $engine in
    mooncake)
        "$MOONCAKE" --mode=target --metadata_server=P2PHANDSHAKE \
            --local_server_name="$LOCAL_ADDR:$((17000 + num))" --device_name="$D" \
            --buffer_size="$buffer" > "$log" 2>&1 &
        ;;
    *)
        "$OURS" --mode target --local_server_name "$LOCAL_ADDR:$((27000 + num))" \
            --buffer_size "$buffer" > "$log" 2>&1 &
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
    echo "${seg:-none}" > "$TESTBED_RUN/ready-$id"
    if [ -z "$seg" ]; then
        echo "peers.sh: step $id: the target never said where it listens; its log:"
        tail -n 20 "$log"
    fi
}

# Node b: runs step $1's initiator against segment $2 (the rest: number, engine, operation,
# block, batch, threads, duration, buffer, limit).
initiator() {
    id=$1 seg=$2 num=$3 engine=$4 op=$5 block=$6 batch=$7 threads=$8 secs=$9
    shift 9
    buffer=$1 limit=$2
    log=/tmp/initiator-$id.log
    case $engine in
    mooncake)
        timeout "$limit" "$MOONCAKE" --mode=initiator --metadata_server=P2PHANDSHAKE \
            --local_server_name="$LOCAL_ADDR:$((37000 + num))" --segment_id="$seg" \
            --device_name="$D" --buffer_size="$buffer" --operation="$op" \
            --block_size="$block" --batch_size="$batch" --threads="$threads" \
            --duration="$secs" --report_unit=MiB > "$log" 2>&1
        ;;
    *)
        timeout "$limit" "$OURS" --mode initiator --segment_id "$seg" \
            --buffer_size "$buffer" --operation "$op" --block_size "$block" \
            --batch_size "$batch" --threads "$threads" --duration "$secs" > "$log" 2>&1
        ;;
    esac
    rc=$?
    # The closing lines, and the errors of a failed run (glog's `E` and `F` lines); the log's
    # end when it failed.
    grep -E 'Test completed|RESULT|error|^[EF][0-9]{4} ' "$log" | tail -n 12
    if [ $rc != 0 ]; then
        echo "peers.sh: step $id: the initiator ended with $rc; its log ends:"
        tail -n 15 "$log"
    fi
    return $rc
}

while read -r id num limit engine op block batch threads secs buffer; do
    case $id in '' | '#'*) continue ;; esac
    if [ "$NODE" = a ]; then
        target "$id" "$num" "$engine" "$buffer" "$limit"
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
                "$secs" "$buffer" "$limit"
            rc=$?
        fi
    fi
    echo "### step $id end rc=$rc secs=$((($(now) - t0) / 100))"
    echo "$rc" > "$TESTBED_RUN/done-$id"
done < "$PLAN"
