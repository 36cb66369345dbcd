# Extracts rxe's sources (and checkpatch with its data) from a linux-source deb into a folder,
# on the host; testbed/src/patched.rs fills in the placeholders (the series is
# setup::KERNEL_SERIES).
S=linux-source-@SERIES@
dpkg-deb --fsys-tarfile @DEB@ | tar -xO "./usr/src/$S.tar.xz" |
    tar -xJ -C @INTO@ --strip-components=1 "$S/drivers/infiniband/sw/rxe" \
        "$S/scripts/checkpatch.pl" "$S/scripts/spelling.txt" "$S/scripts/const_structs.checkpatch"
