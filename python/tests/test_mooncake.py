"""Mooncake's TransferEngine API over gpu_rdma (gpu_rdma.mooncake, and `mooncake.engine`
through the compatibility package): two engines in one process over loopback rxe, found by
address (P2PHANDSHAKE) and through an HTTP metadata server; the same ground as Mooncake's
own transfer_engine_initiator_test.py (random writes read back, sync and async batches,
probes, unknown peers), plus bad input."""

import ctypes
import os
import random
import subprocess
import sys
import time
from typing import Iterator, List, Tuple

import pytest

import gpu_rdma
from conftest import pattern, vm_env
from gpu_rdma import mooncake
from gpu_rdma.mooncake import TransferEngine, TransferNotify, TransferOpcode

Pair = Tuple[TransferEngine, TransferEngine, str]
MIB = 1 << 20


def started(name: str, metadata: str) -> TransferEngine:
    e = TransferEngine()
    rc = e.initialize(name, metadata, "rdma", vm_env("RDMA_DEVICE"))
    assert rc == 0, e.last_error()
    return e


@pytest.fixture(params=["p2p", "http"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    """(initiator, target, the target's session id), each with a managed buffer."""
    server = None
    if request.param == "p2p":
        metadata = "P2PHANDSHAKE"
        target = started("127.0.0.1:0", metadata)
        session = f"127.0.0.1:{target.get_rpc_port()}"
    else:
        server = gpu_rdma.MetadataServer("127.0.0.1:0")
        metadata = server.url
        session = "127.0.0.1:17655"
        target = started(session, metadata)
    initiator = started("127.0.0.1", metadata)
    yield initiator, target, session
    for e in (initiator, target):
        agent = e.get_engine()
        assert agent is not None
        agent.close()
    if server is not None:
        server.close()


def test_random_writes_read_back_through_managed_buffers(pair: Pair) -> None:
    initiator, target, session = pair
    assert target.get_first_buffer_address(session) == 0, "nothing registered yet"
    dst = target.allocate_managed_buffer(4 * MIB)
    src = initiator.allocate_managed_buffer(4 * MIB)
    assert dst and src
    assert initiator.get_first_buffer_address(session) == dst
    rng = random.Random(5)
    for i in range(50):
        data = bytes(rng.randrange(256) for _ in range(rng.randint(16, 256)))
        at = rng.randrange(0, 4 * MIB - 256)
        assert initiator.write_bytes_to_buffer(src, data, len(data)) == 0
        assert initiator.transfer_sync_write(session, src, dst + at, len(data)) == 0
        assert initiator.write_bytes_to_buffer(src, bytes(len(data)), len(data)) == 0
        assert initiator.transfer_sync_read(session, src, dst + at, len(data)) == 0
        assert initiator.read_bytes_from_buffer(src, len(data)) == data, i
        assert target.read_bytes_from_buffer(dst + at, len(data)) == data
    assert initiator.free_managed_buffer(src, 4 * MIB) == 0
    assert target.free_managed_buffer(dst, 4 * MIB) == 0


def test_sync_and_async_batches_of_a_hundred(pair: Pair) -> None:
    initiator, target, session = pair
    dst = target.allocate_managed_buffer(MIB)
    src = initiator.allocate_managed_buffer(MIB)
    n, step = 100, 1024
    srcs = [src + i * step for i in range(n)]
    dsts = [dst + i * step for i in range(n)]
    for way in ("sync", "async"):
        data = [pattern(32 + i, i + (way == "async")) for i in range(n)]
        lens = [len(d) for d in data]
        for a, d in zip(srcs, data):
            assert initiator.write_bytes_to_buffer(a, d, len(d)) == 0
        if way == "sync":
            assert initiator.batch_transfer_sync_write(session, srcs, dsts, lens) == 0
        else:
            bid = initiator.batch_transfer_async_write(session, srcs, dsts, lens)
            assert bid != 0
            assert initiator.get_batch_transfer_status([bid]) == 0
        for a, d in zip(srcs, data):
            initiator.write_bytes_to_buffer(a, bytes(len(d)), len(d))
        if way == "sync":
            assert initiator.batch_transfer_sync_read(session, srcs, dsts, lens) == 0
        else:
            bid = initiator.batch_transfer_async_read(session, srcs, dsts, lens)
            assert bid != 0 and initiator.get_batch_transfer_status([bid]) == 0
        for a, d in zip(srcs, data):
            assert initiator.read_bytes_from_buffer(a, len(d)) == d
    # One write submitted and polled, Mooncake's 1 / 0 / -1 convention.
    bid = initiator.transfer_submit_write(session, src, dst, 4096)
    assert bid != 0
    deadline = time.monotonic() + 60
    while (rc := initiator.transfer_check_status(bid)) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert rc == 1
    assert initiator.transfer_check_status(bid) < 0, "a spent id is unknown"


def test_memory_registered_by_address_and_a_notification(pair: Pair) -> None:
    initiator, target, session = pair
    block = ctypes.create_string_buffer(64 << 10)
    addr = ctypes.addressof(block)
    assert target.register_memory(addr, len(block)) == 0
    assert target.register_memory(addr, len(block)) < 0, "registered twice"
    src = initiator.allocate_managed_buffer(64 << 10)
    payload = pattern(64 << 10, 9)
    initiator.write_bytes_to_buffer(src, payload, len(payload))
    note = TransferNotify("ignored", "kv ready")
    rc = initiator.transfer_sync(session, src, addr, len(payload), TransferOpcode.Write, note)
    assert rc == 0
    assert block.raw == payload
    deadline = time.monotonic() + 10
    notes: List[TransferNotify] = []
    while not notes and time.monotonic() < deadline:
        notes = target.get_notifies()
    assert [n.msg for n in notes] == ["kv ready"]
    assert target.unregister_memory(addr) == 0
    assert target.unregister_memory(addr) < 0
    # Many at once, by address.
    blocks = [ctypes.create_string_buffer(8192) for _ in range(4)]
    addrs = [ctypes.addressof(b) for b in blocks]
    assert target.batch_register_memory(addrs, [8192] * 4) == 0
    assert initiator.batch_transfer_sync_write(session, [src] * 4, addrs, [8192] * 4) == 0
    assert all(b.raw == payload[:8192] for b in blocks)
    assert target.batch_unregister_memory(addrs) == 0


def test_bad_input_gives_negative_codes_and_typed_reasons(pair: Pair) -> None:
    initiator, target, session = pair
    dst = target.allocate_managed_buffer(MIB)
    src = initiator.allocate_managed_buffer(MIB)
    before = target.read_bytes_from_buffer(dst, MIB)

    def refused(rc: int, kind: str) -> None:
        assert rc < 0, rc
        e = initiator.last_error()
        assert isinstance(e, gpu_rdma.Error) and e.kind == kind, (rc, e)

    # Past the end of the peer's buffer (partly registered), and nowhere near it.
    refused(initiator.transfer_sync_write(session, src, dst + MIB - 8, 16), "NotFound")
    refused(initiator.transfer_sync_write(session, src, 0x1000, 16), "NotFound")
    # Past the end of the local buffer.
    refused(initiator.transfer_sync_write(session, src + MIB - 8, dst, 16), "NotFound")
    # A length that wraps the address space.
    refused(initiator.transfer_sync_write(session, src, dst, (1 << 64) - 1), "InvalidInput")
    # A buffer freed: its address is no longer registered.
    old = initiator.allocate_managed_buffer(8192)
    assert initiator.free_managed_buffer(old, 8192) == 0
    refused(initiator.transfer_sync_write(session, old, dst, 16), "NotFound")
    assert initiator.free_managed_buffer(old, 8192) < 0
    # Unknown sessions: 0 from async submits, negative codes from the rest.
    assert initiator.batch_transfer_async_write("unreachable_peer:9", [0], [0], [16]) == 0
    assert initiator.transfer_submit_write("unreachable_peer:9", 0, 0, 16) == 0
    assert initiator.send_probe("unreachable_peer:9") < 0
    assert initiator.send_probe(session) == 0
    assert initiator.get_batch_transfer_status([12345]) < 0
    # CPU copies outside registered memory are refused, nothing written.
    assert initiator.write_bytes_to_buffer(src + MIB - 2, b"abcd", 4) == -1
    assert initiator.read_bytes_from_buffer(src + MIB, 1) == b""
    assert target.read_bytes_from_buffer(dst, MIB) == before, "no bytes landed anywhere"
    assert initiator.register_memory(0, 4096) < 0
    assert initiator.register_memory(src, 0) < 0
    assert initiator.register_memory(src, 1 << 64) < 0, "no OverflowError"
    assert initiator.allocate_managed_buffer(1 << 70) == 0
    # An opcode that is neither Read nor Write moves nothing.
    assert initiator.transfer_sync(session, src, dst, 16, 2) < 0
    assert initiator.transfer_sync(session, src, dst, 16, "Write") < 0  # type: ignore[arg-type]
    # A str is copied as UTF-8; a source too short, or not bytes, is refused.
    assert initiator.write_bytes_to_buffer(src, "h\u00e9llo", 6) == 0
    assert initiator.read_bytes_from_buffer(src, 6) == "h\u00e9llo".encode()
    assert initiator.write_bytes_to_buffer(src, b"ab", 3) == -1
    assert initiator.write_bytes_to_buffer(src, 12, 1) == -1
    # A batch registration that fails half way leaves nothing registered.
    blocks = [ctypes.create_string_buffer(4096) for _ in range(2)]
    addrs = [ctypes.addressof(blocks[0]), ctypes.addressof(blocks[1]), 0]
    assert initiator.batch_register_memory(addrs, [4096, 4096, 4096]) < 0
    assert initiator.register_memory(addrs[0], 4096) == 0, "rolled back"
    assert initiator.unregister_memory(addrs[0]) == 0
    # An unreadable MC_TRANSFER_TIMEOUT is refused before anything moves.
    os.environ["MC_TRANSFER_TIMEOUT"] = "soon"
    try:
        assert initiator.transfer_sync_write(session, src, dst, 16) < 0
        err = initiator.last_error()
        assert err is not None and "MC_TRANSFER_TIMEOUT" in str(err)
    finally:
        del os.environ["MC_TRANSFER_TIMEOUT"]
    # The same batch id twice is waited for once.
    bid = initiator.batch_transfer_async_write(session, [src], [dst], [64])
    assert bid != 0 and initiator.get_batch_transfer_status([bid, bid]) == 0


def test_a_peer_that_went_away_fails_within_its_bound(pair: Pair) -> None:
    initiator, target, session = pair
    dst = target.allocate_managed_buffer(MIB)
    src = initiator.allocate_managed_buffer(MIB)
    assert initiator.transfer_sync_write(session, src, dst, 4096) == 0
    agent = target.get_engine()
    assert agent is not None
    agent.close()
    os.environ["MC_TRANSFER_TIMEOUT"] = "20"
    try:
        start = time.monotonic()
        assert initiator.transfer_sync_write(session, src, dst, 4096) < 0
        assert time.monotonic() - start < 25
    finally:
        del os.environ["MC_TRANSFER_TIMEOUT"]


def test_initialize_refuses_what_it_cannot_do() -> None:
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") < 0
    err = e.last_error()
    assert err is not None and "RDMA only" in str(err)
    assert e.get_rpc_port() == -1
    assert e.allocate_managed_buffer(4096) == 0
    assert e.transfer_sync_write("x:1", 0, 0, 1) < 0
    ok = started("127.0.0.1", "P2PHANDSHAKE")
    assert ok.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "") < 0, "twice"
    agent = ok.get_engine()
    assert agent is not None
    agent.close()


def test_the_mooncake_package_and_its_metadata_server_are_ours() -> None:
    """`from mooncake.engine import TransferEngine` with the compatibility folder first on
    the path, and `python -m mooncake.http_metadata_server` serving an engine."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([mooncake.compat_path(), env.get("PYTHONPATH", "")])
    port = 17_690
    server = subprocess.Popen(
        [sys.executable, "-m", "mooncake.http_metadata_server", "--host", "127.0.0.1",
         "--port", str(port)],
        env=env, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert server.stdout is not None
        assert "HTTP metadata server at" in server.stdout.readline()
        code = (
            "from mooncake.engine import TransferEngine\n"
            "import gpu_rdma.mooncake, sys\n"
            "assert TransferEngine is gpu_rdma.mooncake.TransferEngine\n"
            "e = TransferEngine()\n"
            f"rc = e.initialize('127.0.0.1:17691', 'http://127.0.0.1:{port}/metadata', 'rdma', "
            f"{vm_env('RDMA_DEVICE')!r})\n"
            "assert rc == 0, e.last_error()\n"
            "a = e.allocate_managed_buffer(4096)\n"
            "assert e.get_first_buffer_address('127.0.0.1:17691') == a\n"
            "assert e.send_probe('127.0.0.1:17691') == 0\n"
            "print('OK')\n"
        )
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0 and "OK" in out.stdout, out.stderr
    finally:
        server.terminate()
        assert server.wait(10) == 0


def test_peers_found_through_etcd(etcd: str) -> None:
    """Mooncake's etcd form of the metadata string (`host:port`, no scheme)."""
    where = etcd.removeprefix("http://")
    deadline = time.monotonic() + 60
    while True:  # until etcd answers
        target = TransferEngine()
        if target.initialize("127.0.0.1:17670", where, "rdma", vm_env("RDMA_DEVICE")) == 0:
            break
        assert time.monotonic() < deadline, target.last_error()
        time.sleep(0.5)
    initiator = started("127.0.0.1:17671", f"etcd://{where}")
    dst = target.allocate_managed_buffer(MIB)
    src = initiator.allocate_managed_buffer(MIB)
    assert initiator.get_first_buffer_address("127.0.0.1:17670") == dst
    data = pattern(4096, 21)
    initiator.write_bytes_to_buffer(src, data, len(data))
    assert initiator.transfer_sync_write("127.0.0.1:17670", src, dst + 8192, len(data)) == 0
    assert target.read_bytes_from_buffer(dst + 8192, len(data)) == data
    for e in (initiator, target):
        agent = e.get_engine()
        assert agent is not None
        agent.close()
