"""Two nodes through Mooncake's TransferEngine API (gpu_rdma.mooncake): a target that
registers a buffer and waits, and an initiator that writes KV-sized blocks into it, reads
them back, checks them, and tells the target the digest of what it wrote.

    target:    python mooncake_pair.py target    --host 10.0.0.1 --device rxe0 --metadata p2p
    initiator: python mooncake_pair.py initiator --host 10.0.0.2 --device rxe0 --metadata p2p \\
                   --peer 10.0.0.1

`--metadata http`: the target also serves an HTTP metadata server (gpu_rdma.MetadataServer)
on port 18_811, and both engines find each other through it; `--metadata http://...`: both
use that server (Mooncake's own, say). Prints `RESULT ok` on success.
"""

import argparse
import hashlib
import random
import sys
import time
from typing import List, Optional

import gpu_rdma
from gpu_rdma.mooncake import TransferEngine, TransferNotify, TransferOpcode

PORT = 18_810
HTTP_PORT = 18_811
SIZE = 16 << 20
BLOCK = 64 << 10
BLOCKS = 100
DEADLINE = 300.0


def start(name: str, metadata: str, device: str) -> TransferEngine:
    e = TransferEngine()
    if e.initialize(name, metadata, "rdma", device) != 0:
        sys.exit(f"initialize: {e.last_error()}")
    return e


def target(args: argparse.Namespace) -> None:
    server: Optional[gpu_rdma.MetadataServer] = None
    metadata = "P2PHANDSHAKE"
    if args.metadata == "http":
        server = gpu_rdma.MetadataServer(f"{args.host}:{HTTP_PORT}")
        metadata = server.url
    elif args.metadata.startswith("http://"):
        metadata = args.metadata
    e = start(f"{args.host}:{PORT}", metadata, args.device)
    buf = e.allocate_managed_buffer(SIZE)
    assert buf, e.last_error()
    print(f"target ready at {args.host}:{PORT}, buffer at {buf:#x}", flush=True)
    end = time.monotonic() + DEADLINE
    notes: List[TransferNotify] = []

    def wait_for(prefix: str) -> TransferNotify:
        while True:
            for n in notes:
                if n.msg.startswith(prefix):
                    return n
            assert time.monotonic() < end, f"no {prefix!r} notification from the initiator"
            notes.extend(e.get_notifies())
            time.sleep(0.05)

    done = wait_for("done ")
    digest = hashlib.sha256(e.read_bytes_from_buffer(buf, BLOCKS * BLOCK)).hexdigest()
    assert done.msg == f"done {digest}", (done.msg, digest)
    print(f"RESULT ok blocks={BLOCKS} from={done.name}", flush=True)
    # Stay up until the initiator is finished with this buffer.
    wait_for("bye")
    agent = e.get_engine()
    if agent is not None:
        agent.close()
    if server is not None:
        server.close()


def initiator(args: argparse.Namespace) -> None:
    metadata = "P2PHANDSHAKE"
    if args.metadata == "http":
        metadata = f"http://{args.peer}:{HTTP_PORT}/metadata"
    elif args.metadata.startswith("http://"):
        metadata = args.metadata
    session = f"{args.peer}:{PORT}"
    e = start(args.host, metadata, args.device)
    end = time.monotonic() + DEADLINE
    while e.send_probe(session) != 0:
        assert time.monotonic() < end, f"target never answered: {e.last_error()}"
        time.sleep(0.2)
    dst = 0
    while not dst:
        dst = e.get_first_buffer_address(session)
        assert time.monotonic() < end, "target has no buffer"
    src = e.allocate_managed_buffer(SIZE)
    assert src, e.last_error()
    rng = random.Random(11)
    data = bytes(rng.randrange(256) for _ in range(BLOCKS * BLOCK))
    assert e.write_bytes_to_buffer(src, data, len(data)) == 0
    # Blocks scattered in the target's buffer, written in one batch, then read back.
    order = list(range(BLOCKS))
    rng.shuffle(order)
    srcs = [src + i * BLOCK for i in range(BLOCKS)]
    dsts = [dst + o * BLOCK for o in order]
    assert e.batch_transfer_sync_write(session, srcs, dsts, [BLOCK] * BLOCKS) == 0
    back = src + BLOCKS * BLOCK
    bid = e.batch_transfer_async_read(
        session, [back + i * BLOCK for i in range(BLOCKS)], dsts, [BLOCK] * BLOCKS
    )
    assert bid and e.get_batch_transfer_status([bid]) == 0, e.last_error()
    assert e.read_bytes_from_buffer(back, len(data)) == data
    # Tell the target the digest of what its buffer now holds (block k: data's block i
    # with order[i] == k), in a notification after a last one-byte read.
    ordered = b"".join(data[order.index(k) * BLOCK : (order.index(k) + 1) * BLOCK] for k in range(BLOCKS))
    note = TransferNotify("", f"done {hashlib.sha256(ordered).hexdigest()}")
    assert e.transfer_sync(session, src, dst, 1, TransferOpcode.Read, note) == 0
    e.transfer_sync(session, src, dst, 1, TransferOpcode.Read, TransferNotify("", "bye"))
    print(f"RESULT ok blocks={BLOCKS}", flush=True)
    agent = e.get_engine()
    if agent is not None:
        agent.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=["target", "initiator"])
    p.add_argument("--host", required=True, help="this node's address")
    p.add_argument("--device", required=True, help="RDMA device")
    p.add_argument("--metadata", default="p2p", help="p2p, http, or a metadata server's URL")
    p.add_argument("--peer", help="the target's address (initiator)")
    args = p.parse_args()
    if args.role == "target":
        target(args)
    else:
        assert args.peer, "--peer is needed"
        initiator(args)


if __name__ == "__main__":
    main()
