#!/bin/sh
# The testbed initramfs's /init (testbed/src/initramfs.rs packs it): busybox applets only.
# The run's host paths come from the file `paths` in the node's run folder (the 9p share
# tagged `out`, mounted first at /out; vm::PATHS_FILE): one `key=path` a line, with the keys
# run (the run folder's host path), start (where the command starts), cwd (a working folder
# shared writable), pkgs (unpacked extra packages, laid over the host's root), preload (the
# patched libibverbs.so.1, which every program loads first) and expose (once per folder bound
# back over the guest's tmpfs). Paths may hold any byte but a newline:
# each is read whole (IFS= read -r) and used quoted, never split or globbed.
set -f
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() { echo "testbed: $*"; }
while read -r m; do
    insmod "/lib/modules/$m.ko" || say "insmod $m failed"
done < /modules.order
opts=trans=virtio,version=9p2000.L,msize=512000
mkdir -p /out
mount -t 9p -o "$opts" out /out || { say "cannot mount the run folder"; poweroff -f; }
RUN=
START=
CWD=
PKGS=
PRELOAD=
while IFS= read -r line; do
    case "$line" in
    run=*) RUN=${line#run=} ;;
    start=*) START=${line#start=} ;;
    cwd=*) CWD=${line#cwd=} ;;
    pkgs=*) PKGS=${line#pkgs=} ;;
    preload=*) PRELOAD=${line#preload=} ;;
    esac
done < /out/paths
[ -n "$RUN" ] && [ -n "$START" ] || { say "no run folder in /out/paths"; poweroff -f; }
mkdir -p /host /hostraw
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
if [ -n "$PRELOAD" ]; then
    # The patched libibverbs first in every program, whatever LD_LIBRARY_PATH the command
    # sets or clears (env -i, sudo): the loader maps /etc/ld.so.preload's libraries before
    # it searches any path, and a library already loaded under its soname is not looked for
    # again. /etc gets a read-only overlay whose top layer holds that file (the host's own
    # entries after ours) and a link to the library by a name without spaces or colons,
    # which the file cannot carry. Set before anything is mounted below /host/etc.
    mkdir -p /etc-testbed/dmabuf-testbed
    ln -s "$PRELOAD" /etc-testbed/dmabuf-testbed/libibverbs.so.1
    { echo /etc/dmabuf-testbed/libibverbs.so.1; cat /host/etc/ld.so.preload 2>/dev/null; } \
        > /etc-testbed/ld.so.preload
    mount -t overlay overlay -o ro,lowerdir=/etc-testbed:/host/etc /host/etc ||
        { say "cannot put the patched libibverbs in /etc/ld.so.preload"; poweroff -f; }
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
while IFS= read -r line; do
    case "$line" in
    expose=*)
        p=${line#expose=}
        mkdir -p "/host$p" && mount --bind "/hostraw$p" "/host$p" || say "cannot expose $p"
        ;;
    esac
done < /out/paths
if [ -n "$CWD" ]; then
    mkdir -p "/host$CWD"
    mount -t 9p -o "$opts" cwd "/host$CWD" || { say "cannot mount the working folder"; poweroff -f; }
fi
mkdir -p "/host$RUN"
mount --bind /out "/host$RUN" || { say "cannot bind the run folder"; poweroff -f; }
mount -t debugfs debugfs /host/sys/kernel/debug
mount -t configfs configfs /host/sys/kernel/config
chroot /host /bin/sh "$RUN/inner.sh" "$START" </dev/null
dmesg > /out/dmesg.txt
cat /proc/sys/kernel/tainted > /out/tainted
sync
poweroff -f
