# cargo xtask bench, inside the VM: perftest and rdma_bench on the same rxe device, over its
# loopback, interleaved so that both see the same conditions. $1: rdma_bench; $2: rounds;
# $3: size; $4: bandwidth iterations; $5: latency iterations.
# Each server starts in the background; its client follows half a second later.
set -u
B=$1 ROUNDS=$2 SIZE=$3 BW_N=$4 LAT_N=$5
D=$RDMA_DEVICE G=$RDMA_GID_INDEX A=$LOCAL_ADDR
r=0
while [ $r -lt "$ROUNDS" ]; do
    r=$((r + 1))
    echo "### round $r perftest bw"
    ib_write_bw -d "$D" -x "$G" -s "$SIZE" -n "$BW_N" -p 18800 > /tmp/server.out 2>&1 &
    sleep 0.5
    ib_write_bw -d "$D" -x "$G" -s "$SIZE" -n "$BW_N" -p 18800 "$A" 2>&1
    wait
    echo "### round $r ours bw"
    "$B" server --port 18801 --size "$SIZE" --iters "$BW_N" --mode bw > /tmp/server.out 2>&1 &
    sleep 0.5
    "$B" client "$A" --port 18801 --size "$SIZE" --iters "$BW_N" --mode bw 2>&1
    wait
    echo "### round $r perftest lat"
    ib_write_lat -d "$D" -x "$G" -s "$SIZE" -n "$LAT_N" -p 18802 > /tmp/server.out 2>&1 &
    sleep 0.5
    ib_write_lat -d "$D" -x "$G" -s "$SIZE" -n "$LAT_N" -p 18802 "$A" 2>&1
    wait
    echo "### round $r ours lat"
    "$B" server --port 18803 --size "$SIZE" --iters "$LAT_N" --mode lat > /tmp/server.out 2>&1 &
    sleep 0.5
    "$B" client "$A" --port 18803 --size "$SIZE" --iters "$LAT_N" --mode lat 2>&1
    wait
done
