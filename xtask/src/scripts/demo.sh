# cargo xtask demo, inside each VM of the two-node testbed: node a serves, node b writes.
# $1: the gpu_rdma_write binary; $2: buffer size; $3: iterations.
set -u
B=$1 SIZE=$2 ITERS=$3
echo "@@@ begin node $NODE: kernel $(uname -r), $RDMA_DEVICE on $NETDEV ($LOCAL_ADDR)"
if [ "$NODE" = a ]; then
    "$B" server --size "$SIZE"
else
    "$B" client "$PEER_ADDR" --size "$SIZE" --iters "$ITERS"
fi
rc=$?
echo "@@@ end"
exit $rc
