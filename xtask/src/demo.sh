# The two-node testbed demo (runs on both nodes; NODE=a serves, NODE=b connects).
set -e
echo "node $NODE: $(uname -r), rdma device $RDMA_DEVICE on $NETDEV ($LOCAL_ADDR), RoCEv2 GID index $RDMA_GID_INDEX"
rdma link show
ls /dev/dri /dev/udmabuf /dev/dma_heap/system
if [ "$NODE" = a ]; then
    ibv_rc_pingpong -d "$RDMA_DEVICE" -g "$RDMA_GID_INDEX" -n 200 -s 65536
else
    sleep 1
    ibv_rc_pingpong -d "$RDMA_DEVICE" -g "$RDMA_GID_INDEX" -n 200 -s 65536 "$PEER_ADDR"
fi
