"""One client, either engine: a bench that uses only NIXL's agent API (``nixl._api``), run
with NIXL's own package or ours (whichever ``nixl`` is first on ``PYTHONPATH``), so that the
two are measured with the same code (``cargo xtask bench --peers --client nixl``).

    target:    nixl_bench.py target    --port 5601 --buffer 134217728
    initiator: nixl_bench.py initiator --peer 10.0.0.1 --port 5601 --buffer 134217728 \\
                   --ops WRITE,READ --blocks 4096,65536,1048576 --batches 1,128 --duration 3

The target registers a buffer, listens for metadata on ``--port`` and tells the initiator
where the buffer is; the initiator, for each cell (operation, block size, descriptors per
transfer), prepares both sides' descriptor lists once, makes one transfer request and posts
it again and again for ``--duration`` seconds, each post polled with ``check_xfer_state``
until ``"DONE"``. It prints one line per cell, ``NIXLBENCH {json}``: the transfers, seconds,
MiB/s and the median time from ``transfer`` to ``"DONE"`` in microseconds.
"""

import argparse
import importlib
import json
import statistics
import sys
import time
from typing import Any, List

import numpy as np

TARGET, INITIATOR = "bench-target", "bench-initiator"
DEADLINE = 300.0


def agent(name: str, port: int) -> Any:
    api = importlib.import_module("nixl._api")
    conf = api.nixl_agent_config(True, True, port, backends=["UCX"])
    return api.nixl_agent(name, conf)


def until(what: str, done: Any) -> Any:
    deadline = time.monotonic() + DEADLINE
    while True:
        got = done()
        if got:
            return got
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.001)


def target(args: argparse.Namespace) -> None:
    a = agent(TARGET, args.port)
    buf = np.zeros(args.buffer, dtype=np.uint8)
    a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    print(f"target: listening on port {args.port}", flush=True)
    until("the initiator's metadata", lambda: a.check_remote_metadata(INITIATOR))
    a.send_notif(INITIATOR, f"base={buf.ctypes.data}".encode())
    until("the initiator's goodbye", lambda: b"bye" in a.get_new_notifs().get(INITIATOR, []))
    print("target: done", flush=True)


def fetched(a: Any, peer: str, port: int) -> bool:
    try:
        a.fetch_remote_metadata(TARGET, peer, port)
    except Exception:
        return False
    return bool(a.check_remote_metadata(TARGET))


def cell(a: Any, op: str, la: int, ra: int, block: int, batch: int, duration: float) -> dict:  # type: ignore[type-arg]
    mine = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(la + i * block, block, 0) for i in range(batch)], "DRAM")
    theirs = a.prep_xfer_dlist(TARGET, [(ra + i * block, block, 0) for i in range(batch)], "DRAM")
    idx = list(range(batch))
    h = a.make_prepped_xfer(op, mine, idx, theirs, idx)
    times: List[float] = []
    start = time.perf_counter()
    end = start + duration
    while True:
        t0 = time.perf_counter()
        if a.transfer(h) == "ERR":
            sys.exit(f"{op} {block}x{batch}: transfer returned ERR")
        while True:
            state = a.check_xfer_state(h)
            if state == "DONE":
                break
            if state != "PROC":
                sys.exit(f"{op} {block}x{batch}: state {state}")
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if t1 >= end and len(times) >= 3:
            break
    seconds = time.perf_counter() - start
    a.release_xfer_handle(h)
    a.release_dlist_handle(mine)
    a.release_dlist_handle(theirs)
    moved = len(times) * batch * block
    return {
        "op": op,
        "block": block,
        "batch": batch,
        "transfers": len(times),
        "seconds": seconds,
        "mibps": moved / seconds / (1 << 20),
        "done_usec": statistics.median(times) * 1e6,
    }


def initiator(args: argparse.Namespace) -> None:
    a = agent(INITIATOR, 0)
    buf = np.zeros(args.buffer, dtype=np.uint8)
    a.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    until("the target's listener", lambda: fetched(a, args.peer, args.port))
    a.send_local_metadata(args.peer, args.port)
    msg = until("the target's buffer", lambda: a.get_new_notifs().get(TARGET))
    ra = int(msg[0].decode().partition("=")[2])
    for op in args.ops.split(","):
        for block in [int(b) for b in args.blocks.split(",")]:
            for batch in [int(b) for b in args.batches.split(",")]:
                if block * batch > args.buffer:
                    continue
                r = cell(a, op, buf.ctypes.data, ra, block, batch, args.duration)
                print("NIXLBENCH " + json.dumps(r), flush=True)
    a.send_notif(TARGET, b"bye")
    a.remove_remote_agent(TARGET)
    print("initiator: done", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=["target", "initiator"])
    p.add_argument("--peer", help="the target's address (initiator)")
    p.add_argument("--port", type=int, default=5601)
    p.add_argument("--buffer", type=int, default=128 << 20)
    p.add_argument("--ops", default="WRITE,READ")
    p.add_argument("--blocks", default="4096,65536,1048576")
    p.add_argument("--batches", default="1,128")
    p.add_argument("--duration", type=float, default=3.0)
    args = p.parse_args()
    if args.role == "target":
        target(args)
    elif not args.peer:
        sys.exit("--peer is needed")
    else:
        initiator(args)


if __name__ == "__main__":
    main()
