# cargo xtask demo, inside each VM of the two-node testbed: node a serves, node b writes.
# $1: the gpu_rdma_write binary; $2: buffer size; $3: iterations; $4: seconds either side
# waits without progress before it gives up.
set -u
B=$1 SIZE=$2 ITERS=$3 WAIT=$4
echo "@@@ begin node $NODE: kernel $(uname -r), $RDMA_DEVICE on $NETDEV ($LOCAL_ADDR)"
if [ "$NODE" = a ]; then
    "$B" server --size "$SIZE" --timeout "$WAIT"
else
    "$B" client "$PEER_ADDR" --size "$SIZE" --iters "$ITERS" --timeout "$WAIT"
fi
rc=$?
echo "@@@ end"
exit $rc
