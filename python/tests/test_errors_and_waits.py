"""Bad input becomes a Python exception (never a crash), waits are bounded and release the
GIL, and asyncio awaits transfers and notifications."""

import asyncio
import concurrent.futures
import os
import threading
import time
from typing import Any, Tuple

import pytest

import gpu_rdma
from conftest import pattern

Pair = Tuple[gpu_rdma.Agent, gpu_rdma.Agent]


def test_the_hierarchy() -> None:
    for cls in (gpu_rdma.Unsupported, gpu_rdma.InvalidInput, gpu_rdma.PeerLost, gpu_rdma.Timeout):
        assert issubclass(cls, gpu_rdma.Error)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        gpu_rdma.dmabuf_from_fd(-1)
    assert e.value.operation == "dmabuf_from_fd"


def test_a_bad_agent_name_is_refused_typed() -> None:
    # Refused before any device is opened: a NUL would otherwise reach a thread's name.
    for bad in ("a\0b", "", "line\nbreak", "x" * 256):
        with pytest.raises(gpu_rdma.InvalidInput) as e:
            gpu_rdma.Agent(bad, bind="127.0.0.1:0")
        assert e.value.operation == "Agent"
        assert "agent name" in str(e.value)


def test_bad_memory_is_refused_typed(pair: Pair) -> None:
    a, _ = pair
    bad: Any
    for bad in ("text", 3.5, None, b"read-only bytes", bytearray()):
        with pytest.raises(gpu_rdma.InvalidInput):
            a.register("x", bad)
    # A non-contiguous view.
    import numpy as np

    with pytest.raises(gpu_rdma.InvalidInput):
        a.register("x", np.zeros((64, 64), dtype=np.uint8)[:, ::2])
    assert a.segments() == []


def test_closed_and_foreign_fds(pair: Pair) -> None:
    a, _ = pair
    r, w = os.pipe()
    with pytest.raises(gpu_rdma.InvalidInput):
        a.register("pipe", r)
    os.close(r)
    os.close(w)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        a.register("closed", r)
    assert e.value.errno == 9
    with pytest.raises(OverflowError):
        gpu_rdma.dmabuf_from_fd(1 << 40)


def test_bad_batches(pair: Pair) -> None:
    a, b = pair
    a.register("s", gpu_rdma.udmabuf(8192))
    b.register("d", gpu_rdma.udmabuf(8192))
    with pytest.raises(gpu_rdma.InvalidInput):
        a.transfer(gpu_rdma.Batch().write("s", 4096, "b", "d", 0, 8192))
    with pytest.raises(gpu_rdma.InvalidInput):
        a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 1 << 40, 10))
    with pytest.raises(gpu_rdma.InvalidInput):
        a.transfer(gpu_rdma.Batch())
    with pytest.raises(gpu_rdma.NotFound):
        a.transfer(gpu_rdma.Batch().write("s", 0, "b", "nothing", 0, 10))
    with pytest.raises(gpu_rdma.NotFound):
        a.transfer(gpu_rdma.Batch().write("nothing", 0, "b", "d", 0, 10))
    with pytest.raises(OverflowError):
        gpu_rdma.Batch().write("s", -1, "b", "d", 0, 10)
    with pytest.raises(gpu_rdma.InvalidInput):
        a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, 10).notify(bytes(gpu_rdma.MAX_NOTIFICATION + 1)))
    with pytest.raises(gpu_rdma.InvalidInput):
        a.register("s", gpu_rdma.udmabuf(4096))
    with pytest.raises(gpu_rdma.NotFound):
        a.unregister("nothing")
    with pytest.raises(TypeError):
        a.transfer("not a batch")  # type: ignore[arg-type]
    for t in (float("nan"), -1.0, float("inf")):
        with pytest.raises(gpu_rdma.InvalidInput):
            a.wait_notification(t)
    with pytest.raises(gpu_rdma.InvalidInput):
        gpu_rdma.Agent("x", bind="not an address")


def test_cuda_without_a_gpu_is_refused_typed(pair: Pair) -> None:
    a, _ = pair
    owner = object()
    with pytest.raises(gpu_rdma.Error) as e:
        a.register_cuda("gpu", 1 << 32, 1 << 20, owner=owner)
    assert isinstance(e.value, (gpu_rdma.Unsupported, gpu_rdma.InvalidInput)), e.value

    class Tensor:
        def __init__(self, strides: Any = None) -> None:
            self.__cuda_array_interface__ = {
                "data": (1 << 32, False),
                "shape": (4, 1024),
                "typestr": "<f4",
                "strides": strides,
                "version": 3,
            }

    with pytest.raises(gpu_rdma.InvalidInput):
        a.register("strided", Tensor(strides=(8192, 4)))
    with pytest.raises(gpu_rdma.Error) as e:
        a.register("tensor", Tensor())
    assert isinstance(e.value, (gpu_rdma.Unsupported, gpu_rdma.InvalidInput)), e.value
    assert a.segments() == []


def test_a_wait_releases_the_gil(pair: Pair) -> None:
    a, b = pair
    ticks = 0
    stop = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=count)
    t.start()
    started = time.monotonic()
    assert a.wait_notification(1.5) is None
    waited = time.monotonic() - started
    seen = ticks
    size = 4 << 20
    src = gpu_rdma.udmabuf(size)
    a.register("s", src)
    b.register("d", gpu_rdma.udmabuf(size))
    before = ticks
    a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size)).wait(120.0)
    during = ticks - before
    stop.set()
    t.join()
    assert waited >= 1.4
    # Another thread ran while this one waited: with the GIL held it could not have.
    assert seen > 1000, seen
    assert during > 0, during


def test_a_bounded_wait_ends(pair: Pair) -> None:
    a, b = pair
    size = 16 << 20
    a.register("s", gpu_rdma.udmabuf(size))
    b.register("d", gpu_rdma.udmabuf(size))
    t = a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size))
    try:
        t.wait(0.0)
    except gpu_rdma.Timeout as e:
        assert e.kind == "TimedOut"
    t.wait(120.0)
    assert t.done


def test_asyncio_awaits_a_transfer_and_its_notification(pair: Pair) -> None:
    a, b = pair
    size = 1 << 20
    src = gpu_rdma.udmabuf(size)
    src.write(pattern(size, 11))
    a.register("s", src)
    dst = gpu_rdma.udmabuf(size)
    b.register("d", dst)

    async def main() -> None:
        note = asyncio.ensure_future(b.notification(60.0))
        t = a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size).notify(b"async"))
        landed = t.finished(60.0)
        ticker = 0
        # The loop keeps running while the transfer is awaited.
        while not landed.done():
            ticker += 1
            await asyncio.sleep(0.001)
        await landed
        got = await note
        assert got is not None and got.message == b"async"
        assert ticker > 0
        assert await b.notification(0.1) is None

    asyncio.run(main())
    b.unregister("d")
    assert dst.read() == pattern(size, 11)


def test_awaited_transfers_hold_no_executor_thread(pair: Pair) -> None:
    """Many batches awaited at once while the loop's only executor thread is busy with a
    notification wait: each `finished` is settled from the engine, not from an executor
    thread (with the executor form they would queue behind the notification wait)."""
    a, b = pair
    size, n = 64 << 10, 24
    src = bytearray(pattern(size * n, 5))
    a.register("s", src)
    dst = bytearray(size * n)
    b.register("d", dst)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        note = asyncio.ensure_future(b.notification(60.0))
        await asyncio.sleep(0.05)  # the notification wait holds the executor's thread
        started = time.monotonic()
        ts = [a.transfer(gpu_rdma.Batch().write("s", k * size, "b", "d", k * size, size)) for k in range(n)]
        await asyncio.wait_for(asyncio.gather(*(t.finished(60.0) for t in ts)), 30.0)
        assert time.monotonic() - started < 30.0
        assert not note.done()
        a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, 1).notify(b"last")).wait(120.0)
        got = await note
        assert got is not None and got.message == b"last"

    asyncio.run(main())
    b.unregister("d")
    assert dst == src


def test_an_awaited_transfer_past_its_bound_raises_timeout(pair: Pair) -> None:
    a, b = pair
    size = 32 << 20  # far longer than a zero bound under the emulator
    a.register("s", bytearray(size))
    b.register("d", bytearray(size))
    t = a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size))

    async def main() -> None:
        with pytest.raises(gpu_rdma.Timeout) as e:
            await t.finished(0.0)
        assert e.value.operation == "finished"

    asyncio.run(main())
    t.wait(120.0)
    assert t.done


def test_a_closed_agent_refuses(pair: Pair) -> None:
    a, _ = pair
    d = gpu_rdma.udmabuf(4096)
    a.register("s", d)
    a.close()
    assert d.closed
    with pytest.raises(gpu_rdma.Error):
        a.register("t", gpu_rdma.udmabuf(4096))
