# cargo xtask bench, inside the VM: perftest and rdma_bench on the same rxe device, over its
# loopback, interleaved so that both see the same conditions. $1: rdma_bench; $2: rounds;
# $3: size; $4: bandwidth iterations; $5: latency iterations.
set -u
B=$1 ROUNDS=$2 SIZE=$3 BW_N=$4 LAT_N=$5
D=$RDMA_DEVICE G=$RDMA_GID_INDEX A=$LOCAL_ADDR
pair() { # server-command client-command
    $1 > /tmp/server.out 2>&1 &
    sleep 0.5
    $2 2>&1
    wait
}
r=0
while [ $r -lt "$ROUNDS" ]; do
    r=$((r + 1))
    echo "### round $r perftest bw"
    pair "ib_write_bw -d $D -x $G -s $SIZE -n $BW_N -p 18800" "ib_write_bw -d $D -x $G -s $SIZE -n $BW_N -p 18800 $A"
    echo "### round $r ours bw"
    pair "$B server --port 18801 --size $SIZE --iters $BW_N --mode bw" "$B client $A --port 18801 --size $SIZE --iters $BW_N --mode bw"
    echo "### round $r perftest lat"
    pair "ib_write_lat -d $D -x $G -s $SIZE -n $LAT_N -p 18802" "ib_write_lat -d $D -x $G -s $SIZE -n $LAT_N -p 18802 $A"
    echo "### round $r ours lat"
    pair "$B server --port 18803 --size $SIZE --iters $LAT_N --mode lat" "$B client $A --port 18803 --size $SIZE --iters $LAT_N --mode lat"
done
