"""A paged KV cache on two nodes: `num_blocks x block_bytes` numpy arrays, a list of block
ids moved from the prefill node to the decode node in one batch, a notification when they
land, every byte checked.

    decode node:   python3 kv_cache.py decode --bind 10.0.0.1:18800
    prefill node:  python3 kv_cache.py prefill --bind 10.0.0.2:0 --peer 10.0.0.1:18800

The decode node serves its cache (agent "decode"); the prefill node fills blocks, writes
the chosen ones into chosen slots of the decode node's cache, and notifies it with the
pairs. Each prints `RESULT ok` when every byte it checked matched.
"""

import argparse
import struct
import sys
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

import gpu_rdma

NUM_BLOCKS = 64
BLOCK_BYTES = 64 << 10


def block_content(block_id: int) -> "npt.NDArray[np.uint8]":
    """What the prefill node's block `block_id` holds: a function of its id alone."""
    rng = np.random.default_rng(1000 + block_id)
    return rng.integers(0, 256, size=BLOCK_BYTES, dtype=np.uint8)


def kv_cache(num_blocks: int) -> Tuple[gpu_rdma.HostMemory, "npt.NDArray[np.uint8]"]:
    """A cache of `num_blocks` blocks, as numpy over memory the NIC reaches without a copy."""
    mem = gpu_rdma.HostMemory(num_blocks * BLOCK_BYTES)
    cache = np.frombuffer(mem.buffer, dtype=np.uint8).reshape(num_blocks, BLOCK_BYTES)
    return mem, cache


def moves() -> List[Tuple[int, int]]:
    """(source block, destination slot) pairs: scattered on both sides."""
    return [((j * 7) % NUM_BLOCKS, (j * 37 + 5) % NUM_BLOCKS) for j in range(0, NUM_BLOCKS, 2)]


def decode(args: argparse.Namespace) -> int:
    agent = gpu_rdma.Agent("decode", devices=args.device, bind=args.bind)
    _mem, cache = kv_cache(NUM_BLOCKS)
    agent.register("kv", cache)
    print(f"decode: serving {NUM_BLOCKS} x {BLOCK_BYTES} B at {agent.address}", flush=True)
    note = agent.wait_notification(args.timeout)
    if note is None:
        print("decode: no notification", file=sys.stderr)
        return 1
    pairs = list(struct.iter_unpack("<II", note.message))
    agent.unregister("kv")
    bad = 0
    for src, dst in pairs:
        if not np.array_equal(cache[dst], block_content(src)):
            bad += 1
            print(f"decode: slot {dst} (block {src}) differs", file=sys.stderr)
    untouched = set(range(NUM_BLOCKS)) - {d for _, d in pairs}
    bad += sum(1 for s in untouched if cache[s].any())
    agent.close()
    print(f"RESULT {'ok' if bad == 0 and pairs == moves() else 'bad'} blocks={len(pairs)}")
    return 0 if bad == 0 else 1


def prefill(args: argparse.Namespace) -> int:
    agent = gpu_rdma.Agent("prefill", devices=args.device, bind=args.bind)
    agent.add_peer("decode", args.peer)
    _mem, cache = kv_cache(NUM_BLOCKS)
    for j in range(NUM_BLOCKS):
        cache[j] = block_content(j)
    agent.register("kv", cache)
    pairs = moves()
    batch = gpu_rdma.Batch()
    for src, dst in pairs:
        batch.write("kv", src * BLOCK_BYTES, "decode", "kv", dst * BLOCK_BYTES, BLOCK_BYTES)
    batch.notify(b"".join(struct.pack("<II", s, d) for s, d in pairs))
    deadline = time.monotonic() + args.timeout
    while True:  # the decode node may not be up yet
        try:
            t = agent.transfer(batch)
            break
        except (gpu_rdma.NotFound, gpu_rdma.PeerLost):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    started = time.monotonic()
    t.wait(args.timeout)
    took = time.monotonic() - started
    agent.unregister("kv")
    agent.close()
    moved = len(pairs) * BLOCK_BYTES
    print(f"RESULT ok blocks={len(pairs)} bytes={moved} seconds={took:.3f}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("role", choices=["decode", "prefill"])
    p.add_argument("--bind", default="0.0.0.0:18800")
    p.add_argument("--peer", help="the decode node's address (prefill)")
    p.add_argument("--device", action="append", help="an RDMA device (default: every one)")
    p.add_argument("--timeout", type=float, default=240.0)
    args = p.parse_args(argv)
    if args.role == "prefill" and not args.peer:
        p.error("prefill needs --peer")
    return decode(args) if args.role == "decode" else prefill(args)


if __name__ == "__main__":
    sys.exit(main())
