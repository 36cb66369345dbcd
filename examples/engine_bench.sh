#!/bin/sh
# The engine's bench beside perftest in the same boot, on the testbed's rxe device (one
# node, loopback). From the workspace root on the host:
#
#   cargo build --release -p examples --example engine_bench
#   cargo xtask vm -- sh -c 'cd /work/main && examples/engine_bench.sh'
#
# (any path to the workspace works). Prints perftest's ib_write_bw average (MB/s) at each
# size, then engine_bench's RESULT lines, then the ratio engine / perftest at each size for
# one peer. SIZES (bytes, default 4 KiB..4 MiB) and BYTES (per bandwidth batch) may be set.
set -u
cd "$(dirname "$0")/.." || exit 1
D=${RDMA_DEVICE:?run inside the testbed VM} G=${RDMA_GID_INDEX:?}
SIZES=${SIZES:-4096 16384 65536 262144 1048576 4194304}
BYTES=${BYTES:-8388608}
BENCH=target/release/examples/engine_bench
[ -x "$BENCH" ] || { echo "build it first: cargo build --release -p examples --example engine_bench"; exit 1; }
PT=/tmp/engine_bench_perftest.txt
: > "$PT"
port=18900
for s in $SIZES; do
    iters=$(( BYTES / s )); [ "$iters" -lt 5 ] && iters=5
    timeout 120 ib_write_bw -d "$D" -x "$G" -F -s "$s" -n "$iters" -p "$port" >/dev/null 2>&1 &
    server=$!
    sleep 1
    row=$(timeout 120 ib_write_bw -d "$D" -x "$G" -F -s "$s" -n "$iters" -p "$port" 127.0.0.1 2>&1 |
        awk -v s="$s" '$1 == s { print $4 }')
    wait "$server"
    # ib_write_bw reports MiB/s as "MB/sec" (2^20 bytes): convert to 10^6 bytes.
    mbps=$(awk -v m="${row:-0}" 'BEGIN { printf "%.2f", m * 1.048576 }')
    echo "RESULT perftest block=$s bw_MBps=$mbps"
    echo "$s $mbps" >> "$PT"
    port=$((port + 1))
done
sizes=$(echo "$SIZES" | tr ' ' ',')
"$BENCH" --sizes "$sizes" --bytes "$BYTES" | tee /tmp/engine_bench_engine.txt
echo "# engine / perftest bandwidth, one peer:"
awk 'NR == FNR { pt[$1] = $2; next }
     /^RESULT engine peers=1 / { split($4, b, "="); split($5, w, "=");
        if (pt[b[2]] > 0) printf "RATIO block=%s engine=%s perftest=%s ratio=%.2f\n", b[2], w[2], pt[b[2]], w[2] / pt[b[2]] }' \
    "$PT" /tmp/engine_bench_engine.txt
