# cargo xtask bench, inside the VM: runs a plan of steps in order, each under `timeout`. A
# failed step is reported and the plan goes on. $1: the plan; $2: rdma_bench; $3: cost_floor.c
# (compiled here when the plan counts instructions); $4: engine_bench (the transfer engine's
# steps, one process each); $5: engine_bench.py (the engine's bandwidth step from Python), run
# with the package folder $6 (the release build of gpu_rdma) on PYTHONPATH; $7: the folder of
# sideway_cost, sideway_basic_cost and ibverbs_cost (bench/verbs-crates: the C loop written
# with those crates).
#
# Plan lines (words; `#` starts a comment line):
#   pair  ID LIMIT PROGRAM SIZE ITERS [ARGS...]   a server, then its client once it listens
#   local ID LIMIT PROGRAM SIZE ITERS [ARGS...]   one process: rdma_bench (e.g. `reg --region
#         heap`) or engine_bench (`bw --peers 3`, `alloc`)
#   cost  ID LIMIT PROGRAM SIZE SHORT,LONG [ARGS...]   one process under callgrind, run with
#         SHORT then LONG iterations; prints `RESULT ins_short=N ins_long=N iters_short=SHORT
#         iters_long=LONG writes_per_iter=W` (the instructions counted in `*measured_*`)
# PROGRAM is ib_write_bw, ib_write_lat, rdma_bench, engine_bench, engine_bench.py,
# cost_floor (its ARGS: writes a chain), sideway_cost, sideway_basic_cost or ibverbs_cost;
# ARGS go to both sides; LIMIT (seconds) bounds the wait for the server and each process.
# Each step prints `### step ID begin`, its client's output, then
# `### step ID end client=RC server=RC secs=S` (RC 124: timed out; `ready`: the server never
# listened; S: the step's wall time).
#
# One node: server and client run here, the server's readiness is its listening TCP port.
# Two nodes: node a runs every server, node b every client; node a says that a server listens
# with a file in its run folder, which node b sees through the host's root.
set -u
PLAN=$1
# rdma_bench from the VM's memory: it starts faster than over 9p, and a rebuild on the host
# during the run cannot change it.
B=/tmp/rdma_bench
cp "$2" "$B" || exit 1
# The engine's bench, the same way (only when the plan has engine steps).
E=/tmp/engine_bench
if grep -q ' engine_bench ' "$PLAN" && ! cp "$4" "$E"; then
    echo "bench.sh: no $4: every engine_bench step will fail"
fi
PY_BENCH=${5-} PY_PATH=${6-}
# The verbs crates' loops, the same way (only when the plan counts them).
for p in sideway_cost sideway_basic_cost ibverbs_cost; do
    if grep -q " $p " "$PLAN" && ! cp "${7-}/$p" "/tmp/$p"; then
        echo "bench.sh: no ${7-}/$p: every $p step will fail"
    fi
done
# The C loop of the instruction counts, built here with the guest's libibverbs.
F=/tmp/cost_floor
if grep -q '^cost ' "$PLAN" && ! cc -O2 -o "$F" "$3" -libverbs; then
    echo "bench.sh: cc could not build $3: every cost_floor step will fail"
fi
D=$RDMA_DEVICE G=$RDMA_GID_INDEX SERVER=$PEER_ADDR
SERVER_OUT=/tmp/bench-server.out
PORT_BASE=18800

# Whether a socket listens on TCP port $1, given in hexadecimal (one grep: in the emulated
# VM every process started costs milliseconds that the server being waited for needs).
listening() {
    grep -q -E ":$1 [0-9A-F]+:0000 0A" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Centiseconds since boot, without starting a process.
now() {
    read -r up _ < /proc/uptime
    echo "${up%.*}${up#*.}"
}

# Whether node a has said that step $1's server listens.
peer_ready() {
    [ -e "$TESTBED_PEER_RUN/ready-$1" ]
}

# Runs "$@" (after $1, a number of seconds) every 100 ms until it succeeds (0) or $1 seconds
# have passed (1).
wait_until() {
    n=0 most=$(($1 * 10))
    shift
    until "$@"; do
        n=$((n + 1))
        [ $n -gt $most ] && return 1
        sleep 0.1
    done
}

# One side of a step: $1 server, client or local; $2 program; $3 port; $4 size; $5 iters;
# the rest is passed on. Bounded by $LIMIT.
side() {
    role=$1 prog=$2 port=$3 size=$4 iters=$5
    shift 5
    case "$prog:$role" in
    ib_write_*:server) timeout "$LIMIT" "$prog" -d "$D" -x "$G" -F -s "$size" -n "$iters" -p "$port" "$@" ;;
    ib_write_*:client) timeout "$LIMIT" "$prog" -d "$D" -x "$G" -F -s "$size" -n "$iters" -p "$port" "$@" "$SERVER" ;;
    rdma_bench:server) timeout "$LIMIT" "$B" server --port "$port" --size "$size" --iters "$iters" "$@" ;;
    rdma_bench:client) timeout "$LIMIT" "$B" client "$SERVER" --port "$port" --size "$size" --iters "$iters" "$@" ;;
    rdma_bench:local) timeout "$LIMIT" "$B" "$@" --size "$size" --iters "$iters" ;;
    engine_bench:local) timeout "$LIMIT" "$E" "$@" --size "$size" --iters "$iters" ;;
    engine_bench.py:local) PYTHONPATH=$PY_PATH PYTHONDONTWRITEBYTECODE=1 timeout "$LIMIT" \
        /usr/bin/python3 "$PY_BENCH" "$@" --size "$size" --iters "$iters" ;;
    *) echo "bench.sh: no $role side for $prog"; return 2 ;;
    esac
}

# Prints the instructions callgrind counts in `*measured_*` functions when step $1 runs $2
# (rdma_bench, engine_bench, cost_floor or a verbs crate's loop) at size $3 for $4 iterations (the rest: its
# arguments), bounded by $LIMIT; the program's output goes to /tmp/cost.$1.$4.out. Fails when
# nothing was counted.
counted() {
    f=/tmp/callgrind.$1.$4 out=/tmp/cost.$1.$4.out prog=$2 size=$3 n=$4
    shift 4
    case "$prog" in
    rdma_bench) set -- "$B" "$@" --size "$size" --iters "$n" --device "$D" ;;
    cost_floor) set -- "$F" "$D" "$G" "$size" "$n" "$@" ;;
    sideway_cost | sideway_basic_cost | ibverbs_cost) set -- "/tmp/$prog" "$D" "$G" "$size" "$n" ;;
    engine_bench) set -- "$E" "$@" --size "$size" --iters "$n" ;;
    *) echo "bench.sh: no count for $prog" > "$out"; return 2 ;;
    esac
    timeout "$LIMIT" valgrind --tool=callgrind --callgrind-out-file="$f" --collect-atstart=no \
        '--toggle-collect=*measured_*' "$@" > "$out" 2>&1 || return $?
    # A verbs crate's loop that polled an empty queue counted those polls too.
    if grep -q -E '^RESULT .*misses=[1-9]' "$out"; then
        echo "bench.sh: polls found the queue empty, the count is off" >> "$out"
        return 3
    fi
    # shellcheck disable=SC2046 # the file's counts, as words
    set -- $(sed -n -E 's/^(summary|totals): *([0-9]+).*/\2/p' "$f")
    [ -n "${1-}" ] && echo "$1"
}

# A cost step: step $1 counts $2 at size $3, with "SHORT,LONG" iterations $4 (the rest: its
# arguments). Prints one RESULT line; or, when a run fails, the runs' output, and fails.
cost() {
    i=$1 prog=$2 size=$3 short=${4%,*} long=${4#*,}
    shift 4
    if a=$(counted "$i" "$prog" "$size" "$short" "$@") &&
        b=$(counted "$i" "$prog" "$size" "$long" "$@"); then
        w=$(sed -n -E 's/^RESULT .*writes_per_iter=([0-9]+).*/\1/p' "/tmp/cost.$i.$long.out")
        echo "RESULT ins_short=$a ins_long=$b iters_short=$short iters_long=$long" \
            "writes_per_iter=${w:-1}"
    else
        rc=$?
        for n in "$short" "$long"; do
            [ -s "/tmp/cost.$i.$n.out" ] && sed "s/^/  cost $n| /" "/tmp/cost.$i.$n.out"
        done
        echo "bench.sh: no count of $prog under callgrind (status $rc)"
        return $rc
    fi
}

# Server side of step number $1 (the rest: program, port, size, iters, args); prints its status.
serve() {
    i=$1
    shift
    side server "$@" > "$SERVER_OUT" 2>&1 < /dev/null &
    spid=$!
    if wait_until "$LIMIT" listening "$(printf '%04X' "$2")"; then
        [ "$TESTBED_NODES" -gt 1 ] && : > "$TESTBED_RUN/ready-$i"
    else
        kill "$spid" 2>/dev/null
    fi
    wait "$spid"
}

echo "### kernel $(uname -r)"
# The scheduler. A ping-pong's two busy-polling processes and rxe's kworkers (which carry
# every packet) share the VM's vCPUs. Under EEVDF's RUN_TO_PARITY (6.12's default) a kworker
# woken behind a spinner waits for the spinner's slice to run out, which the tick notices:
# whole runs of ib_write_lat and rdma_bench alike then measured about 4 ms (Debian's HZ=250)
# one way instead of tens of microseconds, at random. NO_RUN_TO_PARITY lets the woken kworker
# run at once (docs/performance.md, "One-node latency and the scheduler"). Both sides of every
# comparison run under the same setting; it is printed for the report.
FEATURES=/sys/kernel/debug/sched/features
if [ -w "$FEATURES" ] && echo NO_RUN_TO_PARITY > "$FEATURES" 2>/dev/null; then
    echo "### sched NO_RUN_TO_PARITY"
else
    echo "### sched default (no $FEATURES to change)"
fi
i=0
while read -r kind id LIMIT prog size iters rest; do
    case "$kind" in '' | '#'*) continue ;; esac
    i=$((i + 1))
    port=$((PORT_BASE + i % 1000))
    echo "### step $id begin"
    client=- server=- t0=$(now)
    case "$kind:${TESTBED_NODES}${NODE}" in
    local:*)
        # shellcheck disable=SC2086 # ARGS are words
        side local "$prog" "$port" "$size" "$iters" $rest < /dev/null 2>&1
        client=$?
        ;;
    cost:1*)
        # shellcheck disable=SC2086 # ARGS are words
        cost "$i" "$prog" "$size" "$iters" $rest < /dev/null 2>&1
        client=$?
        ;;
    pair:1*)
        # shellcheck disable=SC2086
        side server "$prog" "$port" "$size" "$iters" $rest > "$SERVER_OUT" 2>&1 < /dev/null &
        spid=$!
        if wait_until "$LIMIT" listening "$(printf '%04X' "$port")"; then
            # shellcheck disable=SC2086
            side client "$prog" "$port" "$size" "$iters" $rest < /dev/null 2>&1
            client=$?
            [ $client -eq 0 ] || kill "$spid" 2>/dev/null
        else
            client=ready
            kill "$spid" 2>/dev/null
        fi
        wait "$spid"
        server=$?
        ;;
    pair:2a)
        # shellcheck disable=SC2086
        serve "$i" "$prog" "$port" "$size" "$iters" $rest
        server=$?
        ;;
    pair:2b)
        if wait_until $((LIMIT + 10)) peer_ready "$i"; then
            # shellcheck disable=SC2086
            side client "$prog" "$port" "$size" "$iters" $rest < /dev/null 2>&1
            client=$?
        else
            client=ready
        fi
        ;;
    *) echo "bench.sh: unknown step kind $kind" ;;
    esac
    if [ "$server" != 0 ] && [ "$server" != - ] && [ -s "$SERVER_OUT" ]; then
        sed 's/^/  server| /' "$SERVER_OUT"
    fi
    t=$(($(now) - t0))
    echo "### step $id end client=$client server=$server secs=$((t / 100)).$((t / 10 % 10))$((t % 10))"
done < "$PLAN"
