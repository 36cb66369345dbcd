"""The transfer engine's bandwidth step from Python: `cargo xtask bench`'s series
`python/1peer`, the twin of `examples/engine_bench.rs bw` (series `engine/1peer`), run beside
it in the same boot at the same sizes.

    engine_bench.py bw --peers 1 --size 65536 --iters 128 [--wait sync|async]

One process: an initiator agent and `--peers` agents (1 or 3), over the device in
RDMA_DEVICE (every active one when unset) and loopback control channels. One batch of
`--iters` blocks of `--size` bytes from page-aligned anonymous memory (an `mmap`, registered
in place, as the Rust step's `HostBuffer`), block j to peer j % peers, timed from `transfer`
to the wait's return (`Transfer.wait`, or `await Transfer.finished` with `--wait async`);
then the median of 5 batches of one block per peer. Prints the Rust step's line:
`RESULT bw_MBps=X mpps=Y batch_lat_usec=Z peers=P` (MiB/s, million blocks/s).
"""

import argparse
import asyncio
import mmap
import os
import sys
import time
from typing import List, Optional, Tuple

import gpu_rdma

WAIT = 600.0
LAT_BATCHES = 5


def size(text: str) -> int:
    """A size: `4096`, `64K`, `4M`."""
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:].upper(), 1)
    n = int(text[:-1] if scale > 1 else text) * scale
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text}: a size above 0")
    return n


def batch(peers: int, block: int, blocks: int) -> gpu_rdma.Batch:
    """`blocks` blocks of `block` bytes, block j to peer j % peers."""
    b = gpu_rdma.Batch()
    for j in range(blocks):
        b.write("src", j * block, f"p{j % peers}", "dst", (j // peers) * block, block)
    return b


def agents(peers: int, src: int, dst: int) -> Tuple[gpu_rdma.Agent, List[gpu_rdma.Agent]]:
    """An initiator with a `src` segment and `peers` agents with a `dst` segment each."""
    device = os.environ.get("RDMA_DEVICE")
    devices: Optional[List[str]] = [device] if device else None
    init = gpu_rdma.Agent("init", devices=devices, bind="127.0.0.1:0")
    init.register("src", mmap.mmap(-1, src))
    out = []
    for p in range(peers):
        agent = gpu_rdma.Agent(f"p{p}", devices=devices, bind="127.0.0.1:0")
        agent.register("dst", mmap.mmap(-1, dst))
        init.add_peer(agent.name, agent.address)
        out.append(agent)
    return init, out


def timed(init: gpu_rdma.Agent, b: gpu_rdma.Batch, awaited: bool) -> float:
    """Seconds from `transfer` to the wait's return."""
    t0 = time.perf_counter()
    t = init.transfer(b)
    if awaited:

        async def landed() -> None:
            await t.finished(WAIT)

        asyncio.run(landed())
    else:
        t.wait(WAIT)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["bw"])
    parser.add_argument("--peers", type=int, choices=[1, 3], default=1)
    parser.add_argument("--size", type=size, default=64 << 10)
    parser.add_argument("--iters", type=int, default=128)
    parser.add_argument("--wait", choices=["sync", "async"], default="sync")
    a = parser.parse_args()
    blocks = max(a.iters, a.peers)
    per_peer = -(-blocks // a.peers)
    init, peers = agents(a.peers, blocks * a.size, per_peer * a.size)
    small = batch(a.peers, a.size, a.peers)
    awaited = a.wait == "async"
    # Connections and descriptors made before anything is timed.
    init.transfer(small).wait(WAIT)
    big = batch(a.peers, a.size, blocks)
    t = timed(init, big, awaited)
    lat = sorted(timed(init, small, awaited) for _ in range(LAT_BATCHES))[LAT_BATCHES // 2]
    print(
        f"RESULT bw_MBps={blocks * a.size / t / (1 << 20):.3f} mpps={blocks / t / 1e6:.6f} "
        f"batch_lat_usec={lat * 1e6:.1f} peers={a.peers}"
    )
    for agent in [init] + peers:
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
