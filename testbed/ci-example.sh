#!/bin/sh
# A CI job that runs a project's own RDMA tests in the dma-buf testbed. Copy it into the job
# and change the three settings. The runner must be Debian 12 (bookworm) amd64, as root (or
# with sudo for the one apt-get line `dmabuf-testbed setup` prints), with a Rust toolchain.
#
# Cache $DMABUF_TESTBED_CACHE between jobs (for example with actions/cache, keyed on this
# repository's commit): with it, a job boots in about 20 s; without, the first step downloads
# and builds about 400 MB (README.md, "Start times"). Leave out its runs/ folder.
set -eu

# Where this repository is checked out (the tool is built from it).
TESTBED_SRC=${TESTBED_SRC:-./gpu-rdma}
# Where the testbed keeps its kernel, patched stack and packages.
export DMABUF_TESTBED_CACHE=${DMABUF_TESTBED_CACHE:-$HOME/.cache/dmabuf-testbed}
# Debian packages your tests need in the guest (beyond what the host has).
PACKAGES=${PACKAGES:-python3-pytest}

cargo install --locked --path "$TESTBED_SRC/testbed"
# Host packages (QEMU 10 from bookworm-backports, rdma-core, perftest...), the guest kernel,
# the initramfs. Idempotent: a warm cache makes it a few seconds.
dmabuf-testbed setup
# What the guest has, in the job's log: kernel, rdma-core, rxe0, the dma-buf exporters.
dmabuf-testbed info

pkg_args=
for p in $PACKAGES; do pkg_args="$pkg_args --package $p"; done

# One node: your test suite, in the job's working folder (writable in the guest). The job
# fails when a test fails or when the guest kernel logs a warning or an oops.
# shellcheck disable=SC2086
dmabuf-testbed run $pkg_args --timeout 1800 -- pytest-3 -q tests/

# Two nodes: the same command runs on node a and node b; b finds a at $NODE_A_ADDR.
dmabuf-testbed run --nodes 2 --timeout 1800 -- sh -c '
    if [ "$NODE" = a ]; then
        rping -s -a "$LOCAL_ADDR" -C 10 -v
    else
        n=0
        until rping -c -a "$NODE_A_ADDR" -C 10 -v; do
            n=$((n+1)); [ $n -lt 30 ] || exit 1
            sleep 1
        done
    fi'
