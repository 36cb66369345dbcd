"""Two nodes through NIXL's agent API over gpu_rdma (the `nixl` package of
`python -m gpu_rdma.nixl path`), as vLLM's NixlConnector uses it: prepared descriptor lists
and transfers made by block index, with notifications.

    target:    python nixl_pair.py target    --host 10.0.0.1
    initiator: python nixl_pair.py initiator --host 10.0.0.2 --peer 10.0.0.1

The target registers a KV pool and listens for metadata on port 18_960. The initiator
fetches the target's metadata from that listener, pushes its own, reads every block of the
pool in a shuffled order, writes blocks back into the pool's other half, and tells the target
the digest of what it wrote; the target checks it. Each prints `RESULT ok blocks=N`.
"""

import argparse
import hashlib
import importlib
import os
import random
import sys
import time
from typing import Any

import numpy as np

from gpu_rdma import nixl as nixl_compat

sys.path.insert(0, nixl_compat.compat_path())
api: Any = importlib.import_module("nixl._api")

PORT = 18_960
BLOCK = 64 << 10
BLOCKS = 64
DEADLINE = 300.0


def agent(name: str, port: int) -> Any:
    conf = api.nixl_agent_config(enable_listen_thread=True, listen_port=port, backends=["UCX"])
    return api.nixl_agent(name, conf)


def until(what: str, done: Any) -> Any:
    deadline = time.monotonic() + DEADLINE
    while True:
        got = done()
        if got:
            return got
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.01)


def pool(seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=2 * BLOCKS * BLOCK, dtype=np.uint8)


def target(args: argparse.Namespace) -> None:
    a = agent("target", PORT)
    kv = pool(1)
    a.register_memory([(kv.ctypes.data, kv.nbytes, 0, "kv")], "DRAM")
    print(f"target: listening on {args.host}:{PORT}", flush=True)
    until("the initiator's metadata", lambda: a.check_remote_metadata("initiator"))
    blocks = [(kv.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(2 * BLOCKS)]
    a.send_notif("initiator", a.get_serialized_descs(a.get_xfer_descs(blocks, "DRAM")))
    digest = until("the initiator's digest", lambda: digest_from(a))
    mine = hashlib.sha256(bytes(kv[BLOCKS * BLOCK :])).hexdigest()
    if digest != mine:
        sys.exit(f"target: the written half's digest is {mine}, the initiator wrote {digest}")
    print(f"RESULT ok blocks={BLOCKS}", flush=True)


def digest_from(a: Any) -> str:
    for m in a.get_new_notifs().get("initiator", []):
        if m.startswith(b"digest="):
            return str(m[len(b"digest=") :].decode())
    return ""


def initiator(args: argparse.Namespace) -> None:
    a = agent("initiator", 0)
    local = np.zeros(BLOCKS * BLOCK, dtype=np.uint8)
    a.register_memory([(local.ctypes.data, local.nbytes, 0, "")], "DRAM")
    until("the target's listener", lambda: try_fetch(a, args.peer))
    a.send_local_metadata(args.peer, PORT)
    msgs = until("the target's descriptors", lambda: a.get_new_notifs().get("target"))
    remote_descs = a.deserialize_descs(msgs[0])
    mine = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(local.ctypes.data + i * BLOCK, BLOCK, 0) for i in range(BLOCKS)], "DRAM")
    theirs = a.prep_xfer_dlist("target", remote_descs)
    # Read the pool's first half, block i from block order[i].
    order = list(range(BLOCKS))
    random.Random(7).shuffle(order)
    h = a.make_prepped_xfer("READ", mine, np.arange(BLOCKS, dtype=np.int32), theirs, order, b"read")
    a.transfer(h)
    until("the reads", lambda: a.check_xfer_state(h) == "DONE")
    expect = pool(1)
    for i, j in enumerate(order):
        if bytes(local[i * BLOCK : (i + 1) * BLOCK]) != bytes(expect[j * BLOCK : (j + 1) * BLOCK]):
            sys.exit(f"initiator: block {i} is not the target's block {j}")
    # Write the blocks back, in read order, into the pool's second half.
    w = a.make_prepped_xfer("WRITE", mine, list(range(BLOCKS)), theirs, [BLOCKS + i for i in range(BLOCKS)])
    a.transfer(w)
    until("the writes", lambda: a.check_xfer_state(w) == "DONE")
    digest = hashlib.sha256(bytes(local)).hexdigest()
    a.send_notif("target", b"digest=" + digest.encode())
    for handle in (h, w):
        a.release_xfer_handle(handle)
    a.remove_remote_agent("target")
    a.invalidate_local_metadata(args.peer, PORT)
    print(f"RESULT ok blocks={BLOCKS}", flush=True)


def try_fetch(a: Any, peer: str) -> bool:
    try:
        a.fetch_remote_metadata("target", peer, PORT)
    except Exception:
        return False
    return bool(a.check_remote_metadata("target"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=["target", "initiator"])
    p.add_argument("--host", required=True, help="this node's address")
    p.add_argument("--peer", help="the target's address (initiator)")
    args = p.parse_args()
    # The control listener (NIXL's metadata listener) binds to this node's address.
    os.environ["GPU_RDMA_NIXL_BIND"] = args.host
    if args.role == "target":
        target(args)
    else:
        if not args.peer:
            sys.exit("--peer is needed")
        initiator(args)


if __name__ == "__main__":
    main()
