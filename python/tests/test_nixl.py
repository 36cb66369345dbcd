"""NIXL's agent API over gpu_rdma (the `nixl` package of gpu_rdma.nixl.compat_path()): agents
in one process over the testbed's rxe, on the ground NIXL's own test_nixl_api.py and Python
examples cover (metadata out of band and through the listener, prepared and initialized
transfers, reposts, notifications, telemetry, partial metadata, tensors), plus bad input:
each refusal is NIXL's exception with our typed reason, and no byte lands anywhere."""

import gc
import importlib
import os
import pickle
import subprocess
import threading
import sys
import time
import uuid
from typing import Any, Iterator, List, Tuple

import numpy as np
import pytest

from conftest import vm_env
from gpu_rdma import nixl as nixl_compat

sys.path.insert(0, nixl_compat.compat_path())
api: Any = importlib.import_module("nixl._api")
bindings: Any = importlib.import_module("nixl._bindings")

KIB = 1 << 10
Pair = Tuple[Any, Any]


def new_agent(**conf: Any) -> Any:
    conf.setdefault("backends", ["UCX"])
    return api.nixl_agent(str(uuid.uuid4()), api.nixl_agent_config(**conf))


@pytest.fixture
def pair() -> Iterator[Pair]:
    """Two agents; the first has loaded the second's metadata."""
    vm_env("RDMA_DEVICE")
    a, b = new_agent(), new_agent()
    assert a.add_remote_agent(b.get_agent_metadata()) == b.name.encode()
    yield a, b


def buffers(a: Any, b: Any, size: int) -> Tuple[Any, Any]:
    """A zeroed buffer registered with `a`, a patterned one registered with `b`."""
    x = np.zeros(size, dtype=np.uint8)
    y = (np.arange(size, dtype=np.uint32) * 7 % 251).astype(np.uint8)
    a.register_memory([(x.ctypes.data, size, 0, "")], "DRAM")
    b.register_memory([(y.ctypes.data, size, 0, "")], "DRAM")
    return x, y


def read_all(a: Any, b: Any, x: Any, y: Any, size: int) -> Any:
    """A prepared READ of the whole of `b`'s `y` into `a`'s `x` (`size` bytes each)."""
    return a.initialize_xfer(
        "READ",
        a.get_xfer_descs([(x.ctypes.data, size, 0)], "DRAM"),
        a.get_xfer_descs([(y.ctypes.data, size, 0)], "DRAM"),
        b.name,
    )


def wait_done(agent: Any, handle: Any, bound: float = 60.0) -> None:
    deadline = time.monotonic() + bound
    while agent.check_xfer_state(handle) == "PROC":
        assert time.monotonic() < deadline, "the transfer never finished"
    assert agent.check_xfer_state(handle) == "DONE"


def wait_notif(agent: Any, sender: str, tag: bytes, bound: float = 30.0) -> None:
    deadline = time.monotonic() + bound
    while not agent.check_remote_xfer_done(sender, tag):
        assert time.monotonic() < deadline, f"no notification {tag!r} from {sender}"
        time.sleep(0.01)


def test_read_and_write_by_address_with_notifications(pair: Pair) -> None:
    a, b = pair
    x, y = buffers(a, b, 64 * KIB)
    xa, ya = x.ctypes.data, y.ctypes.data
    # READ: b's first 16 KiB into a's second 16 KiB, in two descriptors.
    local = a.get_xfer_descs([(xa + 16 * KIB, 8 * KIB, 0), (xa + 24 * KIB, 8 * KIB, 0)], "DRAM")
    remote = a.get_xfer_descs([(ya, 8 * KIB, 0), (ya + 8 * KIB, 8 * KIB, 0)], "DRAM")
    h = a.initialize_xfer("READ", local, remote, b.name, b"read-done")
    assert a.transfer(h) in ("DONE", "PROC")
    wait_done(a, h)
    assert bytes(x[16 * KIB : 32 * KIB]) == bytes(y[: 16 * KIB])
    assert not x[: 16 * KIB].any() and not x[32 * KIB :].any()
    wait_notif(b, a.name, b"read")  # a prefix matches
    # WRITE: a's bytes back into b's tail.
    w = a.initialize_xfer(
        "WRITE",
        a.get_xfer_descs([(xa + 16 * KIB, 16 * KIB, 0)], "DRAM"),
        a.get_xfer_descs([(ya + 48 * KIB, 16 * KIB, 0)], "DRAM"),
        b.name,
        "write-done",  # a str works too
    )
    a.transfer(w)
    wait_done(a, w)
    assert bytes(y[48 * KIB :]) == bytes(y[: 16 * KIB])
    wait_notif(b, a.name, b"write-done")
    a.release_xfer_handle(h)
    a.release_xfer_handle(w)


def test_prepared_lists_by_index_and_reposts(pair: Pair) -> None:
    a, b = pair
    n, block = 16, 4 * KIB
    x, y = buffers(a, b, n * block)
    xa, ya = x.ctypes.data, y.ctypes.data
    mine = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(xa + i * block, block, 0) for i in range(n)], "DRAM")
    # vLLM passes the bytes add_remote_agent returned as the remote's name.
    theirs = a.prep_xfer_dlist(b.name.encode(), np.array([(ya + i * block, block, 0) for i in range(n)], dtype=np.uint64), "DRAM")
    order = np.arange(n, dtype=np.int32)[::-1].copy()
    h = a.make_prepped_xfer("READ", mine, list(range(n)), theirs, order, notif_msg=b"r1")
    a.transfer(h)
    wait_done(a, h)
    for i in range(n):
        j = n - 1 - i
        assert bytes(x[i * block : (i + 1) * block]) == bytes(y[j * block : (j + 1) * block])
    # Repost after the source changed: the same request reads the new bytes.
    y[:] = 5
    assert a.transfer(h, b"r2") in ("DONE", "PROC")
    wait_done(a, h)
    assert (x == 5).all()
    wait_notif(b, a.name, b"r1")
    wait_notif(b, a.name, b"r2")
    a.release_xfer_handle(h)
    a.release_dlist_handle(mine)
    a.release_dlist_handle(theirs)
    # NIXL 1.5's compressed lists (vLLM 0.33 on): rows of (address, length, device, stride,
    # count), indices over the blocks they expand to.
    y[:] = np.arange(n * block, dtype=np.uint32).astype(np.uint8)
    half = n // 2 * block
    strided = np.array([[ya, block, 0, block, n // 2], [ya + half, block, 0, block, n // 2]], dtype=np.uint64)
    with pytest.raises(ValueError):
        a.prep_xfer_dlist(b.name, strided)
    theirs5 = a.prep_xfer_dlist(b.name, strided, mem_type="DRAM")
    mine5 = a.prep_xfer_dlist("NIXL_INIT_AGENT", np.array([[xa, block, 0, block, n]], dtype=np.uint64), mem_type="DRAM")
    h5 = a.make_prepped_xfer("READ", mine5, np.arange(n), theirs5, np.arange(n)[::-1].copy())
    a.transfer(h5)
    wait_done(a, h5)
    for i in range(n):
        j = n - 1 - i
        assert bytes(x[i * block : (i + 1) * block]) == bytes(y[j * block : (j + 1) * block])
    with pytest.raises(bindings.nixlInvalidParamError):
        a.make_prepped_xfer("READ", mine5, [n], theirs5, [0])


def test_tensors_and_row_lists_are_descriptors(pair: Pair) -> None:
    import torch

    a, b = pair
    src = torch.arange(8 * 64, dtype=torch.float32).reshape(8, 64)
    dst = torch.zeros((8, 64), dtype=torch.float32)
    assert a.register_memory(dst) is not None
    assert b.register_memory(src) is not None
    rows = a.get_xfer_descs([dst[i, :] for i in range(8)])
    h = a.initialize_xfer("READ", rows, b.get_xfer_descs([src[i, :] for i in range(8)]), b.name)
    a.transfer(h)
    wait_done(a, h)
    assert torch.equal(dst, src)
    # A non-contiguous tensor is no descriptor (None, as NIXL answers).
    assert a.get_xfer_descs(src.t()) is None
    assert a.get_reg_descs(src.t()) is None


def test_send_notif_without_a_transfer(pair: Pair) -> None:
    a, b = pair
    a.send_notif(b.name, b"one")
    a.send_notif(b.name, "two")
    got: List[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < 2:
        assert time.monotonic() < deadline
        got += b.get_new_notifs().get(a.name, [])
    assert got == [b"one", b"two"]
    assert b.get_new_notifs() == {}
    with pytest.raises(bindings.nixlNotFoundError):
        a.send_notif("nobody", b"x")


def test_metadata_through_the_listener_and_its_invalidation() -> None:
    vm_env("RDMA_DEVICE")
    port = 18_950
    target = new_agent(enable_listen_thread=True, listen_port=port)
    initiator = new_agent(enable_listen_thread=True, listen_port=0)
    x, y = buffers(initiator, target, 8 * KIB)
    ip = "127.0.0.1"
    initiator.fetch_remote_metadata(target.name, ip, port)
    assert initiator.check_remote_metadata(target.name)
    assert not target.check_remote_metadata(initiator.name)
    initiator.send_local_metadata(ip, port)
    deadline = time.monotonic() + 30
    while not target.check_remote_metadata(initiator.name):
        assert time.monotonic() < deadline, "the pushed metadata never arrived"
    # The target now reaches the initiator: a notification, then a transfer.
    target.send_notif(initiator.name, b"hello")
    h = initiator.initialize_xfer(
        "READ",
        initiator.get_xfer_descs([(x.ctypes.data, 8 * KIB, 0)], "DRAM"),
        initiator.get_xfer_descs([(y.ctypes.data, 8 * KIB, 0)], "DRAM"),
        target.name,
    )
    initiator.transfer(h)
    wait_done(initiator, h)
    assert bytes(x) == bytes(y)
    wait_notif(initiator, target.name, b"hello")
    initiator.invalidate_local_metadata(ip, port)
    while target.check_remote_metadata(initiator.name):
        assert time.monotonic() < deadline + 30, "the invalidation never arrived"
    with pytest.raises(bindings.nixlNotFoundError):
        target.send_notif(initiator.name, b"gone")
    with pytest.raises(bindings.nixlMismatchError):
        initiator.fetch_remote_metadata("someone-else", ip, port)


def test_partial_metadata_publishes_only_its_ranges(pair: Pair) -> None:
    a, b = pair
    a.remove_remote_agent(b.name)
    n = 4 * KIB
    x = np.zeros(2 * n, dtype=np.uint8)
    y1, y2 = np.full(n, 1, dtype=np.uint8), np.full(n, 2, dtype=np.uint8)
    a.register_memory([(x.ctypes.data, 2 * n, 0, "")], "DRAM")
    r1 = b.register_memory([(y1.ctypes.data, n, 0, "")], "DRAM")
    r2 = b.register_memory([(y2.ctypes.data, n, 0, "")], "DRAM")
    local = a.get_xfer_descs([(x.ctypes.data + n, n, 0)], "DRAM")
    assert a.add_remote_agent(b.get_partial_agent_metadata(r1, True)) == b.name.encode()
    assert a.check_remote_metadata(b.name, r1.trim())
    assert not a.check_remote_metadata(b.name, r2.trim())
    with pytest.raises(bindings.nixlNotFoundError):
        a.initialize_xfer("READ", local, r2.trim(), b.name)
    a.add_remote_agent(b.get_partial_agent_metadata(r2, True))
    h = a.initialize_xfer("READ", local, r2.trim(), b.name)
    a.transfer(h)
    wait_done(a, h)
    assert (x[n:] == 2).all() and not x[:n].any()


def test_loopback_transfers_name_the_agent_itself() -> None:
    vm_env("RDMA_DEVICE")
    a = new_agent()
    x = np.zeros(8 * KIB, dtype=np.uint8)
    x[: 4 * KIB] = 9
    a.register_memory([(x.ctypes.data, 8 * KIB, 0, "")], "DRAM")
    h = a.initialize_xfer(
        "WRITE",
        a.get_xfer_descs([(x.ctypes.data, 4 * KIB, 0)], "DRAM"),
        a.get_xfer_descs([(x.ctypes.data + 4 * KIB, 4 * KIB, 0)], "DRAM"),
        a.name,
    )
    a.transfer(h)
    wait_done(a, h)
    assert (x == 9).all()


@pytest.mark.parametrize(
    "env, capture, on",
    [(None, True, True), (None, False, False), ("y", False, True), ("no", True, False)],
)
def test_telemetry_follows_the_environment_then_the_config(
    monkeypatch: pytest.MonkeyPatch, env: Any, capture: bool, on: bool
) -> None:
    if env is None:
        monkeypatch.delenv("NIXL_TELEMETRY_ENABLE", raising=False)
    else:
        monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", env)
    a, b = new_agent(capture_telemetry=capture), new_agent()
    a.add_remote_agent(b.get_agent_metadata())
    x, y = buffers(a, b, 64 * KIB)
    h = a.initialize_xfer(
        "WRITE",
        a.get_xfer_descs([(x.ctypes.data + i * 16 * KIB, 16 * KIB, 0) for i in range(4)], "DRAM"),
        a.get_xfer_descs([(y.ctypes.data + i * 16 * KIB, 16 * KIB, 0) for i in range(4)], "DRAM"),
        b.name,
    )
    before = int(time.time() * 1e6)
    a.transfer(h)
    wait_done(a, h)
    if not on:
        with pytest.raises(bindings.nixlNoTelemetryError):
            a.get_xfer_telemetry(h)
        return
    t = a.get_xfer_telemetry(h)
    assert (t.totalBytes, t.descCount) == (64 * KIB, 4)
    assert before - 10_000_000 <= t.startTime <= int(time.time() * 1e6)
    assert 0 < t.postDuration <= t.xferDuration


def test_bad_input_is_refused_as_nixl_refuses_it_and_moves_nothing(pair: Pair) -> None:
    a, b = pair
    x, y = buffers(a, b, 16 * KIB)
    before_x, before_y = bytes(x), bytes(y)
    xa, ya = x.ctypes.data, y.ctypes.data
    d = a.get_xfer_descs
    ok_l, ok_r = d([(xa, 4 * KIB, 0)], "DRAM"), d([(ya, 4 * KIB, 0)], "DRAM")

    def refused(exc: Any, f: Any, kind: str = "") -> None:
        with pytest.raises(exc) as e:
            f()
        if kind:
            assert e.value.reason is not None and e.value.reason.kind == kind, e.value

    md = b.get_agent_metadata()
    refused(bindings.nixlMismatchError, lambda: a.add_remote_agent(md[: len(md) // 2]))
    refused(bindings.nixlMismatchError, lambda: a.add_remote_agent(b"not metadata"))
    other = bytearray(md)
    other[4] += 1  # the card's format version
    refused(bindings.nixlMismatchError, lambda: a.add_remote_agent(bytes(other)), "Incompatible")
    outside = d([(ya + 16 * KIB - 100, 4 * KIB, 0)], "DRAM")
    refused(bindings.nixlNotFoundError, lambda: a.initialize_xfer("WRITE", ok_l, outside, b.name))
    refused(bindings.nixlNotFoundError, lambda: a.initialize_xfer("WRITE", d([(xa + 64 * KIB, 4 * KIB, 0)], "DRAM"), ok_r, b.name))
    refused(bindings.nixlInvalidParamError, lambda: a.initialize_xfer("WRITE", ok_l, d([(ya, 2 * KIB, 0)], "DRAM"), b.name))
    refused(bindings.nixlInvalidParamError, lambda: a.initialize_xfer("WRITE", ok_l, d([(ya, 4 * KIB, 0)] * 2, "DRAM"), b.name))
    refused(bindings.nixlNotFoundError, lambda: a.initialize_xfer("WRITE", ok_l, ok_r, "nobody"))
    # Memory registered as DRAM is not VRAM.
    refused(bindings.nixlNotFoundError, lambda: a.initialize_xfer("WRITE", ok_l, d([(ya, 4 * KIB, 0)], "VRAM"), b.name))
    refused(bindings.nixlNotFoundError, lambda: a.prep_xfer_dlist("nobody", [(ya, 4 * KIB, 0)], "DRAM"))
    mine = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(xa, 4 * KIB, 0), (xa + 4 * KIB, 4 * KIB, 0)], "DRAM")
    theirs = a.prep_xfer_dlist(b.name, [(ya, 4 * KIB, 0), (ya + 4 * KIB, 4 * KIB, 0)], "DRAM")
    refused(bindings.nixlInvalidParamError, lambda: a.make_prepped_xfer("WRITE", mine, [0, 5], theirs, [0, 1]))
    refused(bindings.nixlInvalidParamError, lambda: a.make_prepped_xfer("WRITE", mine, [-1], theirs, [0]))
    refused(bindings.nixlInvalidParamError, lambda: a.make_prepped_xfer("WRITE", mine, [0, 1], theirs, [0]))
    refused(bindings.nixlInvalidParamError, lambda: a.make_prepped_xfer("WRITE", theirs, [0], mine, [0]))
    with pytest.raises(KeyError):
        a.make_prepped_xfer("WR", mine, [0], theirs, [0])
    h = a.make_prepped_xfer("WRITE", mine, [0], theirs, [1])
    a.release_xfer_handle(h)
    a.release_xfer_handle(h)  # twice: nothing
    refused(bindings.nixlNotFoundError, lambda: a.transfer(h))
    refused(bindings.nixlNotFoundError, lambda: a.check_xfer_state(h))
    a.release_dlist_handle(mine)
    refused(bindings.nixlInvalidParamError, lambda: a.make_prepped_xfer("WRITE", mine, [0], theirs, [0]))
    refused(bindings.nixlNotFoundError, lambda: a.create_backend("UVX"))
    refused(bindings.nixlInvalidParamError, lambda: a.create_backend("UCX"))
    refused(bindings.nixlInvalidParamError, lambda: a.register_memory([(xa, 0, 0, "")], "DRAM"))
    refused(bindings.nixlNotSupportedError, lambda: a.register_memory([(xa, 4 * KIB, 0, "")], "FILE"))
    reg = b.get_reg_descs([(ya, 16 * KIB, 0, "")], "DRAM")
    b.deregister_memory(reg)
    refused(bindings.nixlNotFoundError, lambda: b.deregister_memory(reg))
    # a's view of b is now stale (NIXL's metadata is a snapshot too): the request is made,
    # and its post fails, typed, with nothing landing in b's deregistered memory.
    h = a.initialize_xfer("WRITE", ok_l, ok_r, b.name)
    with pytest.raises((bindings.nixlRemoteDisconnectError, bindings.nixlNotFoundError)):
        a.transfer(h)
        wait_done(a, h)
    a.remove_remote_agent(b.name)
    a.remove_remote_agent(b.name)  # twice: nothing
    refused(bindings.nixlNotFoundError, lambda: a.initialize_xfer("WRITE", ok_l, ok_r, b.name))
    assert bytes(x) == before_x and bytes(y) == before_y


def test_a_repost_or_release_while_the_last_post_is_in_flight_is_refused(pair: Pair) -> None:
    a, b = pair
    size = 32 << 20
    x, y = buffers(a, b, size)
    h = read_all(a, b, x, y, size)
    assert a.transfer(h) == "PROC"
    with pytest.raises(bindings.nixlRepostActiveError):
        a.transfer(h)
    # The NIC may still write: the handle is not released (NIXL's answer when it cannot
    # cancel), and stays usable.
    with pytest.raises(bindings.nixlNotAllowedError):
        a.release_xfer_handle(h)
    wait_done(a, h, 300.0)
    assert bytes(x[-4096:]) == bytes(y[-4096:])
    a.release_xfer_handle(h)
    with pytest.raises(bindings.nixlNotFoundError):
        a.check_xfer_state(h)


def test_descriptor_lists_convert_pickle_and_refuse_as_nixl_does() -> None:
    vm_env("RDMA_DEVICE")
    a = new_agent(backends=[])
    assert a.get_plugin_list() == ["GPU_RDMA", "UCX"]
    assert a.get_plugin_mem_types("UVX") == [] and a.get_backend_params("UCX") == {}
    xl = a.get_xfer_descs([(1, 2, 3)], "DRAM")
    assert xl.descCount() == 1 and xl[0] == (1, 2, 3) and xl.getType() == bindings.DRAM_SEG
    assert pickle.loads(a.get_serialized_descs(xl)) == xl
    assert a.get_xfer_descs([(1, 2, 3, 4)], "DRAM") is None
    assert a.get_xfer_descs([(1, 2, 3)]) is None
    with pytest.raises(KeyError):
        a.get_xfer_descs([(1, 2, 3)], "V-RAM")
    assert a.get_reg_descs(xl) is None and a.get_xfer_descs(a.get_reg_descs([(1, 2, 3, "m")], "DRAM")) is None
    assert a.get_reg_descs(np.array([[1, 2, 3]], dtype=np.uint64), "DRAM")[0] == (1, 2, 3, "")
    # No backend: nothing can be registered.
    with pytest.raises(bindings.nixlNotFoundError):
        a.register_memory([(1, 2, 0, "")], "DRAM")
    with pytest.raises(ValueError):
        api.nixl_agent("")
    assert os.environ.get("NIXL_TELEMETRY_ENABLE") is None


def test_the_printed_path_makes_nixl_ours_in_a_new_process() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpu_rdma.nixl", "path"], capture_output=True, text=True, check=True
    )
    path = out.stdout.strip()
    assert path == nixl_compat.compat_path()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
    code = (
        "import nixl, nixl._api, nixl._bindings, nixl._utils, nixl.logging\n"
        "from nixl._bindings import nixlXferTelemetry, nixlNotFoundError\n"
        "from nixl import nixl_agent, nixl_agent_config\n"
        "print(nixl.__file__)"
    )
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip().startswith(path), got.stdout
    bad = subprocess.run([sys.executable, "-m", "gpu_rdma.nixl"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_threads_never_post_twice_nor_release_a_post_in_flight(pair: Pair) -> None:
    a, b = pair
    block, n = 4 * KIB, 2048
    x, y = buffers(a, b, n * block)

    def descs(base: int) -> Any:
        return a.get_xfer_descs([(base + i * block, block, 0) for i in range(n)], "DRAM")

    h = a.initialize_xfer("READ", descs(x.ctypes.data), descs(y.ctypes.data), b.name)
    # Eight posts at once: one is accepted, the others see it in flight.
    gate = threading.Barrier(8)
    outcomes: List[str] = []

    def post() -> None:
        gate.wait()
        try:
            outcomes.append(a.transfer(h))
        except bindings.nixlRepostActiveError:
            outcomes.append("active")

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes).count("active") == 7, outcomes
    wait_done(a, h, 300.0)
    # A post and a release at once: either the release is refused (the post is in flight),
    # or the post is refused (the request is gone) and nothing lands afterwards.
    for _ in range(3):
        x[:] = 0
        g = a.initialize_xfer("READ", descs(x.ctypes.data), descs(y.ctypes.data), b.name)
        two = threading.Barrier(2)
        posted: List[bool] = []

        def race() -> None:
            two.wait()
            try:
                a.transfer(g)
                posted.append(True)
            except bindings.nixlNotFoundError:
                posted.append(False)

        t = threading.Thread(target=race)
        t.start()
        two.wait()
        try:
            a.release_xfer_handle(g)
            released = True
        except bindings.nixlNotAllowedError:
            released = False
        t.join()
        if released:
            assert posted == [False], "released while a post of it was made"
            time.sleep(0.5)
            assert not x.any(), "bytes landed after the release returned"
        else:
            assert posted == [True]
            wait_done(a, g, 300.0)
            a.release_xfer_handle(g)


def test_another_agents_handles_and_loose_types_are_refused(pair: Pair) -> None:
    a, b = pair
    x, y = buffers(a, b, 8 * KIB)
    hb = b.initialize_xfer(
        "WRITE",
        b.get_xfer_descs([(y.ctypes.data, 4 * KIB, 0)], "DRAM"),
        b.get_xfer_descs([(y.ctypes.data + 4 * KIB, 4 * KIB, 0)], "DRAM"),
        b.name,
    )
    for call in (a.transfer, a.check_xfer_state, a.release_xfer_handle):
        with pytest.raises(bindings.nixlInvalidParamError):
            call(hb)
    with pytest.raises(TypeError):
        a.transfer(None)
    mine = a.prep_xfer_dlist("NIXL_INIT_AGENT", [(x.ctypes.data, 4 * KIB, 0)], "DRAM")
    theirs = a.prep_xfer_dlist(b.name, [(y.ctypes.data, 4 * KIB, 0)], "DRAM")
    for bad in ([0.7], [True], ["0"]):
        with pytest.raises(TypeError):
            a.make_prepped_xfer("READ", mine, bad, theirs, [0])
    with pytest.raises(TypeError):
        a.send_notif(b.name, 3)
    assert not x.any()


def test_listener_metadata_carries_many_registrations_and_ranges() -> None:
    vm_env("RDMA_DEVICE")
    port = 18_951
    target = new_agent(enable_listen_thread=True, listen_port=port)
    initiator = new_agent(enable_listen_thread=True, listen_port=0)
    pool = np.zeros(300 * KIB, dtype=np.uint8)
    regs = [(pool.ctypes.data + i * KIB, KIB, 0, "") for i in range(300)]
    initiator.register_memory(regs, "DRAM")
    target.register_memory([(pool.ctypes.data, 1, 0, "")], "DRAM")
    initiator.fetch_remote_metadata(target.name, "127.0.0.1", port)
    # 300 ranges: more than one notification holds; all of them arrive.
    initiator.send_partial_agent_metadata(initiator.get_reg_descs(regs, "DRAM"), True, ["UCX"], "127.0.0.1", port)
    every = target.get_xfer_descs([r[:3] for r in regs], "DRAM")
    deadline = time.monotonic() + 30
    while not target.check_remote_metadata(initiator.name, every):
        assert time.monotonic() < deadline, "the partial metadata never arrived whole"
    initiator.send_local_metadata("127.0.0.1", port)


def test_a_handle_collected_in_flight_is_released_once_done(pair: Pair) -> None:
    a, b = pair
    size = 16 << 20
    x, y = buffers(a, b, size)
    h = read_all(a, b, x, y, size)
    a.transfer(h)
    del h
    gc.collect()  # its finalizer queues it, taking no lock
    deadline = time.monotonic() + 300
    while a.agent._reqs:  # released at a later call once its post is done
        assert time.monotonic() < deadline, "the collected request was never released"
        a.release_dlist_handle(a.prep_xfer_dlist("NIXL_INIT_AGENT", [(x.ctypes.data, 1, 0)], "DRAM"))
        time.sleep(0.05)
    assert bytes(x[-4096:]) == bytes(y[-4096:])
