"""The fields of gpu_rdma's exceptions, each read from a real error of a real agent: `kind` (a
stable name, not Rust's debug text), `hint` (the Rust error's, never repeated in `str(e)`),
`errno` (an OSError's: `errno.errorcode` names it, `strerror` says it), `agent`, `segment`,
`device`, `fd` and `operation` where the error names them, None elsewhere; the builtin bases
(`Timeout` is a `TimeoutError`, `PeerLost` a `ConnectionError`); pickling keeps them all."""

import errno
import os
import pickle
from typing import Any, List, Tuple

import pytest

import gpu_rdma
import gpu_rdma._native as native

Pair = Tuple[gpu_rdma.Agent, gpu_rdma.Agent]
FIELDS = ("kind", "operation", "hint", "errno", "strerror", "agent", "segment", "device", "fd")
CLASSES = (
    gpu_rdma.Unsupported,
    gpu_rdma.InvalidInput,
    gpu_rdma.PeerLost,
    gpu_rdma.Timeout,
    gpu_rdma.NotFound,
    gpu_rdma.Busy,
    gpu_rdma.Unauthenticated,
    gpu_rdma.LimitReached,
    gpu_rdma.Closed,
)


def fields(e: gpu_rdma.Error) -> Tuple[Any, ...]:
    return tuple(getattr(e, f) for f in FIELDS)


def hint_apart(e: gpu_rdma.Error) -> str:
    """The hint (which the error must have), checked absent from the message."""
    assert e.hint, f"no hint: {e!r}"
    assert "(hint:" not in str(e) and e.hint not in str(e), str(e)
    return e.hint


def test_the_classes_are_made_once_with_their_builtin_bases() -> None:
    for cls in CLASSES:
        assert issubclass(cls, gpu_rdma.Error) and cls.__module__ == "gpu_rdma"
        assert getattr(native, cls.__name__) is cls, cls
    assert native.Error is gpu_rdma.Error and not issubclass(gpu_rdma.Error, OSError)
    assert issubclass(gpu_rdma.Timeout, TimeoutError)
    assert issubclass(gpu_rdma.PeerLost, ConnectionError)
    # Made from Python, an error has its class's kind and no fields.
    e = gpu_rdma.Timeout("wait: timed out", operation="wait")
    assert (e.kind, e.operation, e.errno, e.hint) == ("TimedOut", "wait", None, None)
    assert str(e) == "wait: timed out"


def test_a_device_the_host_lacks_is_named_with_its_errno() -> None:
    with pytest.raises(gpu_rdma.Unsupported) as e:
        gpu_rdma.Agent("x", devices=["nonexistent0"], bind="127.0.0.1:0")
    v = e.value
    assert (v.kind, v.device, v.operation) == ("NoDevice", "nonexistent0", "Agent")
    assert v.errno == errno.ENODEV and errno.errorcode[v.errno] == "ENODEV"
    assert v.strerror == os.strerror(errno.ENODEV)
    assert "rdma_rxe" in hint_apart(v) and "nonexistent0" in str(v)
    assert (v.agent, v.segment, v.fd) == (None, None, None)


def test_an_unknown_agent_is_named(pair: Pair) -> None:
    a, _ = pair
    a.register("s", bytearray(4096))
    with pytest.raises(gpu_rdma.NotFound) as e:
        a.transfer(gpu_rdma.Batch().write("s", 0, "nobody", "d", 0, 16))
    v = e.value
    assert (v.kind, v.operation, v.agent, v.segment) == ("NotFound", "transfer", "nobody", None)
    assert (v.errno, v.strerror, v.device, v.fd) == (None, None, None, None)
    assert "add_peer" in hint_apart(v)


def test_an_unknown_segment_names_its_agent_and_segment(pair: Pair) -> None:
    a, _ = pair
    a.register("s", bytearray(4096))
    with pytest.raises(gpu_rdma.NotFound) as e:
        a.transfer(gpu_rdma.Batch().write("s", 0, "b", "nothing", 0, 16))
    assert (e.value.kind, e.value.agent, e.value.segment) == ("NotFound", "b", "nothing")
    assert "registered" in hint_apart(e.value)
    with pytest.raises(gpu_rdma.NotFound) as e:
        a.unregister("nope")
    v = e.value
    assert (v.kind, v.operation, v.agent, v.segment) == ("NotFound", "unregister", "a", "nope")


def test_a_name_taken_names_the_segment(pair: Pair) -> None:
    a, _ = pair
    a.register("s", bytearray(4096))
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        a.register("s", bytearray(4096))
    v = e.value
    assert (v.kind, v.operation, v.segment, v.agent) == ("InvalidInput", "register", "s", None)
    assert "another name" in hint_apart(v)


def test_a_segment_in_use_is_busy_and_named(pair: Pair) -> None:
    a, b = pair
    size = 32 << 20
    a.register("s", gpu_rdma.udmabuf(size))
    b.register("d", gpu_rdma.udmabuf(size))
    busy = None
    for _ in range(3):
        t = a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size))
        try:
            a.unregister("s")
        except gpu_rdma.Busy as e:
            busy = e
        t.wait(120.0)
        if busy is not None:
            break
        a.register("s", gpu_rdma.udmabuf(size))
    assert busy is not None, "every transfer of 32 MiB ended before unregister"
    assert (busy.kind, busy.operation, busy.segment) == ("Busy", "unregister", "s")
    assert "wait" in hint_apart(busy)


def test_a_closed_agent_names_itself(pair: Pair) -> None:
    a, _ = pair
    a.close()
    with pytest.raises(gpu_rdma.Closed) as e:
        a.register("s", bytearray(4096))
    v = e.value
    assert (v.kind, v.operation, v.agent, v.segment) == ("Closed", "register", "a", None)
    assert "new Agent" in hint_apart(v)


def test_a_bounded_wait_for_an_unknown_peer_is_a_timeout_error(pair: Pair) -> None:
    a, _ = pair
    with pytest.raises(TimeoutError) as e:
        a.wait_for_peer("nobody", 0.2)
    v = e.value
    assert isinstance(v, gpu_rdma.Timeout) and isinstance(v, OSError)
    assert (v.kind, v.operation, v.agent, v.errno) == ("TimedOut", "wait_for_peer", "nobody", None)
    # The last look-up's hint: the peer was never named.
    assert "add_peer" in hint_apart(v)
    assert not str(v).startswith("[Errno"), str(v)


def test_a_lost_peer_is_a_connection_error_naming_it(pair: Pair) -> None:
    a, b = pair
    a.register("s", bytearray(4096))
    b.register("d", bytearray(4096))
    a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, 4096)).wait(120.0)
    b.close()
    t = a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, 4096))
    with pytest.raises(ConnectionError) as e:
        t.wait(120.0)
    v = e.value
    assert isinstance(v, gpu_rdma.PeerLost), repr(v)
    assert v.kind == "PeerDown" and v.agent == "b", (v.kind, v.agent, str(v))
    assert "later batch reconnects" in hint_apart(v)
    (entry,) = t.errors()
    assert entry is not None and type(entry) is type(v)
    assert (entry.kind, entry.agent, entry.hint) == (v.kind, v.agent, v.hint)


def test_fds_are_named_with_their_errno(pair: Pair) -> None:
    a, _ = pair
    r, w = os.pipe()
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        a.register("pipe", r)
    assert (e.value.fd, e.value.errno) == (r, None)
    assert f"fd {r} is not a dma-buf" in str(e.value)
    os.close(r)
    os.close(w)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        a.register("closed", r)
    v = e.value
    assert (v.kind, v.fd, v.errno) == ("InvalidInput", r, errno.EBADF)
    assert v.errno is not None and errno.errorcode[v.errno] == "EBADF"
    assert v.strerror == os.strerror(errno.EBADF)
    d = gpu_rdma.udmabuf(4096)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        gpu_rdma.dmabuf_from_fd(d.fileno())
    assert (e.value.fd, e.value.operation) == (d.fileno(), "dmabuf_from_fd")
    assert hint_apart(e.value).startswith("use that DmaBuf")
    d.close()


def test_an_error_pickles_with_its_class_and_fields(pair: Pair) -> None:
    a, _ = pair
    errors: List[gpu_rdma.Error] = []
    try:
        a.wait_for_peer("nobody", 0.0)
    except gpu_rdma.Error as e:
        errors.append(e)
    try:
        gpu_rdma.Agent("x", devices=["nonexistent0"], bind="127.0.0.1:0")
    except gpu_rdma.Error as e:
        errors.append(e)
    assert [type(e) for e in errors] == [gpu_rdma.Timeout, gpu_rdma.Unsupported]
    for error in errors:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert fields(back) == fields(error)

