# The testbed, on each node: network, rxe device, then the command (cmd.sh in the run folder).
# testbed/src/vm/mod.rs fills in the placeholders; /init runs this chrooted into the host's
# root, with the folder the command starts in as its argument (any bytes but a newline).
set -u
START=$1
RUN=@RUN@
# The other node's run folder, seen read-only through the host's root (two nodes).
PEER_RUN=@PEER_RUN@
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
export TESTBED_VM=1 TESTBED_NODES=@NODES@ NODE=@NODE@ RDMA_DEVICE=rxe0
export LOCAL_ADDR=@LOCAL_ADDR@ PEER_ADDR=@PEER_ADDR@ TESTBED_MODE=@MODE@
# Node a's address on both nodes (the server's, by convention).
if [ "$NODE" = a ]; then NODE_A_ADDR=$LOCAL_ADDR; else NODE_A_ADDR=$PEER_ADDR; fi
export NODE_A_ADDR
# This node's run folder (writable) and the peer's (read-only), e.g. for readiness files.
export TESTBED_RUN="$RUN" TESTBED_PEER_RUN="$PEER_RUN"
# The patched stack and the test exporter module (unused with TESTBED_MODE=stock).
RXE_MODULE=@RXE_MODULE@ EXPORTER_MODULE=@EXPORTER_MODULE@ RDMA_LIB=@RDMA_LIB@
# The guest kernel's unpacked package, whose modules --topology loads (modprobe -d).
KERNEL_ROOT=@KERNEL_ROOT@
if [ "$TESTBED_NODES" -gt 1 ]; then
    # The peer is an emulated machine that a busy host can starve for seconds at a time:
    # reliable-connection requests of rdma-dmabuf's queue pairs wait longer for its ACKs
    # before failing, still a finite time (vm::RC_ACK_TIMEOUT, docs/testbed.md).
    export RDMA_DMABUF_ACK_TIMEOUT=@ACK_TIMEOUT@ RDMA_DMABUF_RETRY_COUNT=@RETRY_COUNT@
fi
# The caller's environment (vm::Opts::env).
@ENV@
say() { echo "testbed[$NODE]: $*"; }
fatal() { say "$*"; echo 125 > "$RUN/status"; exit 125; }
# The netdev with MAC $1.
mac_dev() {
    for d in /sys/class/net/*; do
        [ "$(cat "$d/address")" = "$1" ] && { echo "${d##*/}"; return 0; }
    done
    return 1
}
ip link set lo up
if [ "$TESTBED_NODES" -gt 1 ]; then
    # Rail 0's NIC, by its MAC (52:54:00:00:00:0<1|2>): eth0 unless --topology put another
    # NIC on a bus the kernel enumerates first.
    NETDEV=$(mac_dev "52:54:00:00:00:0$([ "$NODE" = a ] && echo 1 || echo 2)") || fatal "no NIC for rail 0"
else
    NETDEV=veth0
    ip link add veth0 type veth peer name veth1 && ip link set veth1 up
fi
ip addr add "$LOCAL_ADDR/24" dev "$NETDEV" || fatal "no $NETDEV"
ip link set "$NETDEV" up
if [ "$TESTBED_MODE" = patched ]; then
    # Before the rxe device exists: the patched module in place of Debian's. (Every program
    # loads the patched libibverbs first through /etc/ld.so.preload, which /init set up; it
    # loads the rxe provider from its own folder.)
    rmmod rdma_rxe 2>/dev/null
    insmod "$RXE_MODULE" || fatal "cannot load the patched rdma_rxe.ko"
    # /dev/dmabuf_test_exporter: dma-bufs whose sg_tables carry poisoned page pointers.
    insmod "$EXPORTER_MODULE" || fatal "cannot load the test exporter"
    export TESTBED_RDMA_LIB="$RDMA_LIB"
fi
rdma link add rxe0 type rxe netdev "$NETDEV" || fatal "rdma link add failed"
P=/sys/class/infiniband/rxe0/ports/1
# The index of the RoCE v2 GID that holds an IPv4 address (::ffff:a.b.c.d).
gid_index() {
    for g in "$P"/gids/*; do
        i=${g##*/}
        case "$(cat "$g")" in
        0000:0000:0000:0000:0000:ffff:*)
            [ "$(cat "$P/gid_attrs/types/$i" 2>/dev/null)" = "RoCE v2" ] && { echo "$i"; return 0; } ;;
        esac
    done
    return 1
}
n=0
until grep -q ACTIVE "$P/state" 2>/dev/null && RDMA_GID_INDEX=$(gid_index); do
    n=$((n+1)); [ $n -gt 200 ] && fatal "rxe0 did not become ACTIVE with a RoCE v2 IPv4 GID"
    sleep 0.05
done
export RDMA_GID_INDEX NETDEV
# More rails (--nics N): rxe<i> on its own link and subnet (between two nodes the NIC whose
# MAC names rail i, 52:54:00:00:<i>:0<1|2>; on one node a veth pair of its own).
export TESTBED_NICS=@NICS@ LOCAL_ADDRS=@LOCAL_ADDRS@ PEER_ADDRS=@PEER_ADDRS@
RDMA_DEVICES=rxe0 NETDEVS=$NETDEV
# The word after the first $1 words of the rest.
nth() { n=$1; shift; shift "$n"; echo "$1"; }
i=1
while [ "$i" -lt "$TESTBED_NICS" ]; do
    if [ "$TESTBED_NODES" -gt 1 ]; then
        mac=52:54:00:00:$(printf %02x "$i"):0$([ "$NODE" = a ] && echo 1 || echo 2)
        dev=$(mac_dev "$mac") || fatal "no NIC with MAC $mac (rail $i)"
    else
        dev=veth$((2 * i))
        ip link add "$dev" type veth peer name "veth$((2 * i + 1))" &&
            ip link set "veth$((2 * i + 1))" up || fatal "no veth pair for rail $i"
    fi
    ip addr add "$(nth "$i" $LOCAL_ADDRS)/24" dev "$dev" || fatal "no address on $dev"
    ip link set "$dev" up
    rdma link add "rxe$i" type rxe netdev "$dev" || fatal "rdma link add rxe$i failed"
    RDMA_DEVICES="$RDMA_DEVICES rxe$i" NETDEVS="$NETDEVS $dev"
    i=$((i + 1))
done
for d in $RDMA_DEVICES; do
    n=0
    until grep -q ACTIVE "/sys/class/infiniband/$d/ports/1/state" 2>/dev/null; do
        n=$((n+1)); [ $n -gt 200 ] && fatal "$d did not become ACTIVE"
        sleep 0.05
    done
done
export RDMA_DEVICES NETDEVS
# --topology (testbed/src/vm/topology.rs): a GPU behind a PCIe switch and the NICs at every
# distance from it, on two NUMA nodes. The placement comes from the host; the PCI addresses
# are read here, from sysfs, as the guest's kernel numbered the buses.
export TESTBED_TOPOLOGY=@TOPOLOGY@
if [ "$TESTBED_TOPOLOGY" = 1 ]; then
@LAYOUT@
    # virtio-gpu's DRM driver, loaded here only: every other boot keeps vgem as its only card.
    modprobe -d "$KERNEL_ROOT" virtio_gpu || fatal "cannot load virtio_gpu"
    # The PCI function of a sysfs device: virtio drivers bind to a virtioN below it.
    pci_of() {
        p=$(readlink -f "$1") || return 1
        case "${p##*/}" in virtio*) p=${p%/*} ;; esac
        echo "${p##*/}"
    }
    # The card whose PCI function's virtio device virtio_gpu drives (the card's own device
    # is the PCI function).
    gpu_card() {
        for c in /sys/class/drm/card*; do
            [ -e "$c/dev" ] || continue
            pci=$(pci_of "$c/device") || continue
            for v in "/sys/bus/pci/devices/$pci"/virtio*/driver; do
                drv=$(readlink -f "$v")
                [ "${drv##*/}" = virtio_gpu ] && { echo "${c##*/} $pci"; return 0; }
            done
        done
        return 1
    }
    n=0
    until gpu=$(gpu_card); do
        n=$((n+1)); [ $n -gt 20 ] && fatal "virtio-gpu has no DRM card"
        sleep 0.2
    done
    TESTBED_GPU_CARD=${gpu% *} TESTBED_GPU_PCI=${gpu#* }
    # rxe's parent is its netdev (a name in a file); the netdev's device is virtioN.
    TESTBED_NIC_PCI=
    for d in $RDMA_DEVICES; do
        net=$(cat "/sys/class/infiniband/$d/parent")
        pci=$(pci_of "/sys/class/net/$net/device") || fatal "no PCI function for $d ($net)"
        TESTBED_NIC_PCI="${TESTBED_NIC_PCI:+$TESTBED_NIC_PCI }$pci"
    done
    export TESTBED_GPU_CARD TESTBED_GPU_PCI TESTBED_NIC_PCI TESTBED_GPU_NUMA=@GPU_NUMA@
    export TESTBED_NIC_TIERS=@NIC_TIERS@ TESTBED_NIC_NUMA=@NIC_NUMA@ TESTBED_NIC_SPEEDS=@NIC_SPEEDS@
    say "topology: GPU $TESTBED_GPU_CARD at $TESTBED_GPU_PCI; NICs $RDMA_DEVICES at $TESTBED_NIC_PCI"
fi
if [ "$TESTBED_MODE" = patched ]; then
    # Verbs programs must really load the patched libibverbs and provider, even with the
    # system's library folder first on their own LD_LIBRARY_PATH: a silent fallback to the
    # system's library would look exactly like a stock kernel's EOPNOTSUPP.
    SYSLIBS=/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu
    real=$(cd "$RDMA_LIB" && pwd -P) || fatal "no patched library folder $RDMA_LIB"
    # The file a process maps (the maps' fields before the path hold no slash).
    mapped=$(LD_LIBRARY_PATH=$SYSLIBS sed -n 's|^[^/]*\(/.*/libibverbs\.so[^/]*\)$|\1|p' /proc/self/maps)
    case "$mapped" in "$real"/libibverbs.so.1*) ;; *) fatal "the patched libibverbs was not loaded: $mapped" ;; esac
    loaded=$(LD_LIBRARY_PATH=$SYSLIBS LD_DEBUG=libs ibv_devices 2>&1 | sed -n 's/.*calling init: //p')
    case "$loaded" in *"$RDMA_LIB"/librxe-rdmav34.so*) ;; *) fatal "the patched rxe provider was not loaded: $loaded" ;; esac
fi
if [ "$TESTBED_NODES" -gt 1 ]; then
    n=0
    for addr in $PEER_ADDRS; do
        until ping -c1 -W1 "$addr" >/dev/null 2>&1; do
            n=$((n+1)); [ $n -gt 120 ] && fatal "peer $addr unreachable"
        done
    done
    : > "$RUN/met"
fi
cd "$START" || fatal "no working folder"
sh "$RUN/cmd.sh"
echo $? > "$RUN/status"
if [ "$TESTBED_NODES" -gt 1 ]; then
    # Stay up until the peer has reached this node (its "met" file) or is gone: a node whose
    # command ends before the peer's ping would otherwise power off and fail the peer.
    n=0
    until [ -e "$PEER_RUN/met" ] || ! ping -c1 -W1 "$PEER_ADDR" >/dev/null 2>&1; do
        n=$((n+1)); [ $n -gt 600 ] && break
        sleep 0.1
    done
fi
