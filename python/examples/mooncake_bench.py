"""One client, either engine: a bench that uses only Mooncake's ``TransferEngine`` API, run
with Mooncake's own ``mooncake.engine`` or ours (whichever ``mooncake`` is first on
``PYTHONPATH``), so that the two are measured with the same code (``cargo xtask bench --peers
--client python``). Its command line and closing line are those of Mooncake's
``transfer_engine_bench``:

    target:    mooncake_bench.py --mode target --metadata_server P2PHANDSHAKE \\
                   --local_server_name 10.0.0.1:17000 --device_name rxe0 --buffer_size N
    initiator: mooncake_bench.py --mode initiator --metadata_server P2PHANDSHAKE \\
                   --local_server_name 10.0.0.2:37000 --segment_id 10.0.0.1:17000 \\
                   --device_name rxe0 --buffer_size N --operation write|read|write-async|read-async \\
                   --block_size B --batch_size K --threads T --duration S

The target prints ``listening on IP:PORT`` and serves until killed; the initiator moves
batches of K blocks of B bytes from T threads (each its own slice of both buffers) for S
seconds, a batch synchronously (``batch_transfer_sync_*``) or submitted and waited for
(``batch_transfer_async_*`` then ``get_batch_transfer_status``), and prints
``Test completed: duration D, batch count N, throughput X MiB/s``.
"""

import argparse
import importlib
import sys
import threading
import time
from typing import Any, List


def engine(args: argparse.Namespace) -> Any:
    """A started TransferEngine of whichever `mooncake` package is importable."""
    module = importlib.import_module("mooncake.engine")
    e = module.TransferEngine()
    rc = e.initialize(args.local_server_name, args.metadata_server, "rdma", args.device_name)
    if rc != 0:
        sys.exit(f"initialize returned {rc}")
    return e


def target(args: argparse.Namespace) -> None:
    e = engine(args)
    if e.allocate_managed_buffer(args.buffer_size) == 0:
        sys.exit("allocate_managed_buffer failed")
    host = args.local_server_name.rpartition(":")[0]
    print(f"listening on {host}:{e.get_rpc_port()}", flush=True)
    while True:
        time.sleep(3600)


def initiator(args: argparse.Namespace) -> None:
    e = engine(args)
    local = e.allocate_managed_buffer(args.buffer_size)
    if local == 0:
        sys.exit("allocate_managed_buffer failed")
    remote = e.get_first_buffer_address(args.segment_id)
    if remote == 0:
        sys.exit(f"{args.segment_id} has no buffer")
    op, _, how = args.operation.partition("-")
    sync = e.batch_transfer_sync_write if op == "write" else e.batch_transfer_sync_read
    submit = e.batch_transfer_async_write if op == "write" else e.batch_transfer_async_read
    span = args.batch_size * args.block_size
    counts: List[int] = [0] * args.threads
    errors: List[str] = []
    start = threading.Barrier(args.threads + 1)
    stop = threading.Event()

    def one_batch(t: int) -> None:
        srcs = [local + t * span + i * args.block_size for i in range(args.batch_size)]
        dsts = [remote + t * span + i * args.block_size for i in range(args.batch_size)]
        lens = [args.block_size] * args.batch_size
        if how == "async":
            bid = submit(args.segment_id, srcs, dsts, lens)
            rc = -1 if bid == 0 else e.get_batch_transfer_status([bid])
        else:
            rc = sync(args.segment_id, srcs, dsts, lens)
        if rc != 0:
            raise RuntimeError(f"thread {t}: a batch returned {rc}")

    def run(t: int) -> None:
        try:
            one_batch(t)  # untimed: connections are made here
            start.wait()
            while not stop.is_set():
                one_batch(t)
                counts[t] += 1
        except (RuntimeError, threading.BrokenBarrierError) as x:
            errors.append(str(x))
            stop.set()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(args.threads)]
    for th in threads:
        th.start()
    try:
        start.wait(timeout=120)
    except threading.BrokenBarrierError:
        stop.set()
    t0 = time.monotonic()
    stop.wait(args.duration)
    stop.set()
    for th in threads:
        th.join()
    elapsed = time.monotonic() - t0
    if errors:
        sys.exit(f"error: {errors[0]}")
    n = sum(counts)
    mibps = n * span / elapsed / (1 << 20)
    print(
        f"Test completed: duration {elapsed:.2f}, batch count {n}, throughput {mibps:.2f} MiB/s",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["target", "initiator"], required=True)
    p.add_argument("--metadata_server", default="P2PHANDSHAKE")
    p.add_argument("--local_server_name", required=True)
    p.add_argument("--device_name", default="")
    p.add_argument("--buffer_size", type=int, default=1 << 30)
    p.add_argument("--segment_id", default="")
    p.add_argument(
        "--operation", choices=["write", "read", "write-async", "read-async"], default="write"
    )
    p.add_argument("--block_size", type=int, default=65536)
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--duration", type=float, default=5.0)
    args = p.parse_args()
    if args.mode == "target":
        target(args)
    else:
        initiator(args)


if __name__ == "__main__":
    main()
