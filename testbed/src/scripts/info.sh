# dmabuf-testbed info: what the guest has, one `key: value` line each.
echo "kernel: $(uname -r)"
echo "stack: $TESTBED_MODE"
if [ "$TESTBED_MODE" = patched ]; then
    echo "rdma-core: v55 with kernel-patches/rdma-core (libibverbs and the rxe provider: $TESTBED_RDMA_LIB)"
else
    echo "rdma-core: Debian's $(dpkg-query -W -f '${Version}' libibverbs1)"
fi
# The libibverbs a verbs program loads (the loader's list for ibv_devices, as ldd prints it),
# asked with the system's library folder first on LD_LIBRARY_PATH, as a command may set it.
verbs=$(LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu LD_TRACE_LOADED_OBJECTS=1 ibv_devices |
    sed -n '/libibverbs/{s/^[[:space:]]*//; s/ (0x[0-9a-f]*)$//; p;}')
if [ "$TESTBED_MODE" = patched ]; then
    echo "libibverbs: $verbs = $(cd "$TESTBED_RDMA_LIB" && pwd -P)/libibverbs.so.1 (listed in /etc/ld.so.preload: every program loads it first, whatever its LD_LIBRARY_PATH)"
else
    echo "libibverbs: $verbs"
fi
echo "rdma-core (Debian's, for everything else): $(dpkg-query -W -f '${Version}' rdma-core)"
echo "perftest: $(dpkg-query -W -f '${Version}' perftest)"
rdma link show | while read -r l; do echo "rdma link: $l"; done
for d in /sys/class/infiniband/*; do
    echo "rdma device: ${d##*/} (node GUID $(cat "$d/node_guid"), GID index $RDMA_GID_INDEX)"
done
echo "rdma address: $LOCAL_ADDR on $NETDEV (two nodes: a is 169.254.10.1, b is 169.254.10.2)"
for c in /sys/class/drm/card*; do
    [ -e "$c/dev" ] || continue
    # vgem is a platform device with no driver bound: its MODALIAS names it.
    drv=$(sed -n 's/^DRIVER=//p; s/^MODALIAS=platform://p' "$c/device/uevent" 2>/dev/null)
    # A virtio GPU's card hangs off the PCI function; its driver is the virtio device's.
    if [ "$drv" = virtio-pci ]; then
        for v in "$c"/device/virtio*/driver; do drv=$(readlink -f "$v"); drv=${drv##*/}; done
    fi
    echo "dma-buf exporter: /dev/dri/${c##*/} ($drv, GEM buffers exported with PRIME)"
done
[ -e /dev/udmabuf ] && echo "dma-buf exporter: /dev/udmabuf (size_limit_mb $(cat /sys/module/udmabuf/parameters/size_limit_mb))"
for h in /dev/dma_heap/*; do
    [ -e "$h" ] && echo "dma-buf exporter: $h (dma-heap)"
done
[ -e /dev/dmabuf_test_exporter ] && echo "dma-buf exporter: /dev/dmabuf_test_exporter (test exporter, poisoned page pointers)"
if [ "${TESTBED_TOPOLOGY:-0}" = 1 ]; then
    # --topology: each device's sysfs path (host bridge, ports, the function) and NUMA node.
    where() {
        p=$(readlink -f "/sys/bus/pci/devices/$1")
        echo "${p#/sys/devices/} (NUMA node $(cat "/sys/bus/pci/devices/$1/numa_node"))"
    }
    echo "numa nodes: $(cat /sys/devices/system/node/online)"
    echo "topology: GPU $TESTBED_GPU_CARD (virtio-gpu) at $(where "$TESTBED_GPU_PCI")"
    set -- $TESTBED_NIC_TIERS
    for pci in $TESTBED_NIC_PCI; do
        d=${RDMA_DEVICES%% *} RDMA_DEVICES=${RDMA_DEVICES#* }
        net=$(cat "/sys/class/infiniband/$d/parent")
        echo "topology: NIC $d ($net, $(cat "/sys/class/net/$net/speed") Mb/s), tier $1 from the GPU, at $(where "$pci")"
        shift
    done
fi
echo "huge pages: $(cat /proc/sys/vm/nr_hugepages) x 2 MiB reserved"
echo "memory: $(grep MemTotal /proc/meminfo | sed 's/MemTotal: *//')"
echo "cpus: $(grep -c ^processor /proc/cpuinfo)"
echo "locked memory: $(grep 'Max locked memory' /proc/self/limits | sed 's/  */ /g')"
exit 0
