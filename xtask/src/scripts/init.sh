#!/bin/sh
# The testbed initramfs's /init (xtask/src/initramfs.rs packs it): busybox applets only. Reads
# testbed.run= (the run folder's host path) and testbed.expose= from the kernel command line.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() { echo "testbed: $*"; }
RUN=
EXPOSE=
for x in $(cat /proc/cmdline); do
    case "$x" in
    testbed.run=*) RUN="${x#testbed.run=}" ;;
    testbed.expose=*) EXPOSE="${x#testbed.expose=}" ;;
    esac
done
while read -r m; do
    insmod "/lib/modules/$m.ko" || say "insmod $m failed"
done < /modules.order
mkdir -p /host /hostraw
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts,ro" host /host || { say "cannot mount the host's root"; poweroff -f; }
# A non-recursive bind keeps a view of the host's root without the tmpfs mounted below.
mount --bind /host /hostraw
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -t devtmpfs devtmpfs /host/dev
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts
mount -t tmpfs tmpfs /host/dev/shm
mount -t tmpfs tmpfs /host/tmp
mount -t tmpfs tmpfs /host/run
# Host folders under /tmp or /run that the run needs (a checkout there) come back by bind.
for p in $(echo "$EXPOSE" | tr , ' '); do
    mkdir -p "/host$p" && mount --bind "/hostraw$p" "/host$p" || say "cannot expose $p"
done
mkdir -p "/host$RUN"
mount -t 9p -o "$opts" out "/host$RUN" || { say "cannot mount the run folder"; poweroff -f; }
mount -t debugfs debugfs /host/sys/kernel/debug
mount -t configfs configfs /host/sys/kernel/config
chroot /host /bin/sh "$RUN/inner.sh" </dev/null
dmesg > "/host$RUN/dmesg.txt"
cat /proc/sys/kernel/tainted > "/host$RUN/tainted"
sync
poweroff -f
