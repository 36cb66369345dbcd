#!/bin/sh
# The testbed initramfs's /init (testbed/src/initramfs.rs packs it): busybox applets only.
# Reads from the kernel command line testbed.run= (the run folder's host path),
# testbed.expose=, testbed.cwd= (a working folder shared writable) and testbed.pkgs= (unpacked
# extra packages, laid over the host's root).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() { echo "testbed: $*"; }
RUN=
EXPOSE=
CWD=
PKGS=
for x in $(cat /proc/cmdline); do
    case "$x" in
    testbed.run=*) RUN="${x#testbed.run=}" ;;
    testbed.expose=*) EXPOSE="${x#testbed.expose=}" ;;
    testbed.cwd=*) CWD="${x#testbed.cwd=}" ;;
    testbed.pkgs=*) PKGS="${x#testbed.pkgs=}" ;;
    esac
done
while read -r m; do
    insmod "/lib/modules/$m.ko" || say "insmod $m failed"
done < /modules.order
mkdir -p /host /hostraw
opts=trans=virtio,version=9p2000.L,msize=512000
# /hostraw: the host's root as it is, without the tmpfs mounted below /host.
mount -t 9p -o "$opts,ro" host /hostraw || { say "cannot mount the host's root"; poweroff -f; }
if [ -n "$PKGS" ]; then
    # Extra packages, unpacked on the host ($PKGS, shared on its own), over the host's root;
    # both read-only.
    mkdir -p /pkgs
    mount -t 9p -o "$opts,ro" pkgs /pkgs &&
        mount -t overlay overlay -o "ro,lowerdir=/pkgs:/hostraw" /host ||
        { say "cannot lay the extra packages over the host's root"; poweroff -f; }
else
    mount --bind /hostraw /host
fi
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
if [ -n "$CWD" ]; then
    mkdir -p "/host$CWD"
    mount -t 9p -o "$opts" cwd "/host$CWD" || { say "cannot mount the working folder"; poweroff -f; }
fi
mkdir -p "/host$RUN"
mount -t 9p -o "$opts" out "/host$RUN" || { say "cannot mount the run folder"; poweroff -f; }
mount -t debugfs debugfs /host/sys/kernel/debug
mount -t configfs configfs /host/sys/kernel/config
chroot /host /bin/sh "$RUN/inner.sh" </dev/null
dmesg > "/host$RUN/dmesg.txt"
cat /proc/sys/kernel/tainted > "/host$RUN/tainted"
sync
poweroff -f
