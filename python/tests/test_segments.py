"""Segments from each exporter, HostMemory and numpy arrays over it, moved between two
agents over loopback rxe and read back; buffers pinned through the C buffer protocol, not
through Python functions that Python code can rebind."""

import ctypes
import gc
from typing import Callable, Tuple

import numpy as np
import pytest

import gpu_rdma
from conftest import pattern

Pair = Tuple[gpu_rdma.Agent, gpu_rdma.Agent]
SIZE = 256 << 10
WAIT = 120.0


@pytest.mark.parametrize(
    "make", [gpu_rdma.vgem, gpu_rdma.udmabuf, gpu_rdma.dma_heap], ids=["vgem", "udmabuf", "heap"]
)
def test_each_exporter_written_and_read_back(pair: Pair, make: Callable[[int], gpu_rdma.DmaBuf]) -> None:
    a, b = pair
    src = make(SIZE)
    data = pattern(SIZE, 3)
    src.write(data)
    assert a.register("src", src) == src.size
    assert src.registered
    with pytest.raises(gpu_rdma.InvalidInput):
        src.read()
    dst = gpu_rdma.udmabuf(SIZE)
    b.register("dst", dst)
    half = SIZE // 2
    batch = gpu_rdma.Batch().write("src", 0, "b", "dst", half, half).write("src", half, "b", "dst", 0, half)
    a.transfer(batch.notify(b"landed")).wait(WAIT)
    note = b.wait_notification(10.0)
    assert note is not None and (note.sender, note.message) == ("a", b"landed")
    back = gpu_rdma.udmabuf(SIZE)
    a.register("back", back)
    a.transfer(gpu_rdma.Batch().read("back", 0, "b", "dst", 0, SIZE)).wait(WAIT)
    assert b.unregister("dst") is dst
    assert a.unregister("src") is src
    assert a.unregister("back") is back
    assert dst.read() == data[half:] + data[:half]
    assert back.read() == dst.read()
    assert src.read() == data


def test_numpy_arrays_over_host_memory(pair: Pair) -> None:
    a, b = pair
    blocks, block = 16, 16 << 10
    mem_a, mem_b = gpu_rdma.HostMemory(blocks * block), gpu_rdma.HostMemory(2 * blocks * block)
    src = np.frombuffer(mem_a.buffer, dtype=np.uint8).reshape(blocks, block)
    src[:] = np.random.default_rng(7).integers(0, 256, size=(blocks, block), dtype=np.uint8)
    whole_b = np.frombuffer(mem_b.buffer, dtype=np.uint8)
    dst = whole_b[blocks * block :].reshape(blocks, block)  # the second half, page-aligned
    a.register("src", src)
    b.register("dst", dst)
    ids = [3, 0, 15, 7]
    batch = gpu_rdma.Batch()
    for k, j in enumerate(ids):
        batch.write("src", j * block, "b", "dst", k * block, block)
    t = a.transfer(batch)
    t.wait(WAIT)
    assert t.done and t.status() == ["done"] * len(ids)
    for k, j in enumerate(ids):
        assert np.array_equal(dst[k], src[j]), f"block {j}"
    assert not whole_b[: blocks * block].any(), "the first half was not a segment"
    assert b.unregister("dst") is dst
    assert a.unregister("src") is src


def test_memory_python_allocated_registers_in_place(pair: Pair) -> None:
    """A bytearray and a numpy array numpy allocated (neither page-aligned nor whole pages)
    are segments without a copy: the NIC writes into the objects' own bytes, and they cannot
    be resized while registered."""
    a, b = pair
    size = 3 * 4096 + 123
    src = np.random.default_rng(11).integers(0, 256, size=size, dtype=np.uint8)
    dst = bytearray(size + 77)
    a.register("src", src)
    b.register("dst", memoryview(dst)[77:])
    with pytest.raises(BufferError):
        dst.extend(b"no: a registration holds the buffer")
    t = a.transfer(gpu_rdma.Batch().write("src", 0, "b", "dst", 0, size))
    t.wait(WAIT)
    assert t.done
    assert bytes(dst[77:]) == src.tobytes()
    assert dst[:77] == bytes(77), "bytes before the segment were written"
    back = np.zeros(size, dtype=np.uint8)
    a.register("back", back)
    a.transfer(gpu_rdma.Batch().read("back", 0, "b", "dst", 0, size)).wait(WAIT)
    assert np.array_equal(back, src)
    b.unregister("dst")
    a.unregister("src")
    a.unregister("back")
    dst.extend(b"resizable again once unregistered")


def test_a_registration_outlives_its_objects_other_references(pair: Pair) -> None:
    a, b = pair
    size = 64 << 10
    mem = gpu_rdma.HostMemory(size)
    arr = np.frombuffer(mem.buffer, dtype=np.uint8)
    b.register("dst", arr)
    del arr, mem
    gc.collect()
    src = gpu_rdma.udmabuf(size)
    src.write(pattern(size, 5))
    a.register("src", src)
    a.transfer(gpu_rdma.Batch().write("src", 0, "b", "dst", 0, size)).wait(WAIT)
    back = b.unregister("dst")
    assert isinstance(back, np.ndarray)
    assert back.tobytes() == pattern(size, 5)


def test_a_registered_buffer_is_pinned(pair: Pair) -> None:
    a, _ = pair
    mem = gpu_rdma.HostMemory(8192)
    a.register("m", memoryview(mem.buffer)[4096:])
    # The registration holds the buffer's export: the mapping cannot be closed under it.
    with pytest.raises(BufferError):
        mem.buffer.close()
    a.unregister("m")
    gc.collect()
    mem.buffer.close()


def test_an_int_fd_is_duplicated_and_checked(pair: Pair) -> None:
    a, _ = pair
    # The system heap's: a udmabuf this process did not make through drm-export is refused
    # on rxe under kernels whose udmabuf vmap misplaces large pages (Unsupported, with why).
    d = gpu_rdma.dma_heap(8192)
    d.write(b"fd!")
    fd = d.fileno()
    # Another DmaBuf of this process owns the buffer: refused, as the Rust side refuses it.
    with pytest.raises(gpu_rdma.InvalidInput):
        a.register("fd", fd)
    import os

    mine = os.dup(fd)
    d.close()
    assert a.register("fd", mine) == 8192
    back = a.unregister("fd")
    assert isinstance(back, gpu_rdma.DmaBuf) and back.read(0, 3) == b"fd!"
    os.close(mine)  # the caller's fd stayed the caller's


def test_a_rebound_ctypes_addressof_moves_no_registration(pair: Pair) -> None:
    """Pinning takes a buffer's address and length from its buffer export (the C buffer
    protocol), never from `ctypes`: with `ctypes.addressof` rebound to name an immutable
    `bytes` object, a `bytes` object is still refused (read-only), and a `bytearray` is
    registered as its own bytes, so a peer's write lands there and not in the `bytes`."""
    a, b = pair
    size = 16 << 10
    victim = bytes(size)
    victim_at = ctypes.cast(ctypes.c_char_p(victim), ctypes.c_void_p).value
    target = bytearray(size)
    real = ctypes.addressof
    setattr(ctypes, "addressof", lambda _obj: victim_at)
    try:
        with pytest.raises(gpu_rdma.InvalidInput) as e:
            b.register("ro", victim)
        assert "read-only" in str(e.value)
        with pytest.raises(gpu_rdma.InvalidInput):
            b.register("ro", memoryview(bytearray(size)).toreadonly())
        assert b.register("d", target) == size
        mem = gpu_rdma.HostMemory(4096)
    finally:
        setattr(ctypes, "addressof", real)
    data = pattern(size, 41)
    a.register("s", bytearray(data))
    a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size)).wait(WAIT)
    assert b.unregister("d") is target
    assert victim == bytes(size), "a peer wrote an immutable bytes object"
    assert bytes(target) == data
    pinned = (ctypes.c_char * 4096).from_buffer(mem.buffer)
    assert mem.address == ctypes.addressof(pinned)
    del pinned
    a.unregister("s")
