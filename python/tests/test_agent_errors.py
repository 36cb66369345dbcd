"""What a first user meets when something is missing: a closed agent (`Closed`), no RDMA
device (`Unsupported` with its errno and a hint, before any metadata service is tried), an
unknown peer (`NotFound` with a hint), and hints given once, in `e.hint`, not in `str(e)`."""

import errno
import time
from typing import Any, Callable, Dict, Tuple

import pytest

import gpu_rdma
from conftest import vm_env

Pair = Tuple[gpu_rdma.Agent, gpu_rdma.Agent]


def closed_calls(a: gpu_rdma.Agent) -> Dict[str, Callable[[], Any]]:
    """Every public method and property of an agent, each called with valid arguments."""
    calls: Dict[str, Callable[[], Any]] = {
        "name": lambda: a.name,
        "address": lambda: a.address,
        "devices": lambda: a.devices,
        "incarnation": lambda: a.incarnation,
        "segments": a.segments,
        "add_peer": lambda: a.add_peer("b", "127.0.0.1:1"),
        "add_peer_at": lambda: a.add_peer_at("127.0.0.1:1"),
        "card": a.card,
        "add_peer_card": lambda: a.add_peer_card(b"card"),
        "remove_peer": lambda: a.remove_peer("b"),
        "register": lambda: a.register("t", bytearray(4096)),
        "register_address": lambda: a.register_address("t", 4096, 4096),
        "register_cuda": lambda: a.register_cuda("t", 4096, 4096),
        "describe": a.describe,
        "unregister": lambda: a.unregister("s"),
        "transfer": lambda: a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, 16)),
        "wait_notification": lambda: a.wait_notification(0.0),
        "notify": lambda: a.notify("b", b"x"),
        "control_stats": a.control_stats,
        "notification": lambda: a.notification(0.0),
        "wait_for_peer": lambda: a.wait_for_peer("b", 0.0),
        "metrics": a.metrics,
        "metrics_text": a.metrics_text,
        "metrics_address": lambda: a.metrics_address,
    }
    return calls


def test_every_method_of_a_closed_agent_raises_closed(pair: Pair) -> None:
    a, _ = pair
    a.register("s", bytearray(4096))
    a.close()
    a.close()  # closing twice is no error
    calls = closed_calls(a)
    public = {n for n in dir(gpu_rdma.Agent) if not n.startswith("_")} - {"close"}
    assert public <= set(calls), f"not checked: {sorted(public - set(calls))}"
    for op, call in calls.items():
        with pytest.raises(gpu_rdma.Closed) as e:
            call()
        assert isinstance(e.value, gpu_rdma.Error)
        assert e.value.kind == "Closed", op
        assert e.value.operation == op
        assert str(e.value) == f'{op}: agent "a" is closed', op
        assert e.value.hint is not None and "new Agent" in e.value.hint
    assert repr(a) == "Agent(closed)"


def test_no_device_is_unsupported_before_etcd_is_tried() -> None:
    """A device the host lacks: `Unsupported` at once, although the etcd named is down."""
    start = time.monotonic()
    with pytest.raises(gpu_rdma.Unsupported) as e:
        gpu_rdma.Agent(
            "x",
            devices=["nonexistent0"],
            bind="127.0.0.1:0",
            etcd=["http://127.0.0.1:9"],  # nothing listens there
            io_timeout=30.0,
        )
    took = time.monotonic() - start
    assert took < 5.0, f"{took:.1f} s: etcd was tried first"
    assert "nonexistent0" in str(e.value) and vm_env("RDMA_DEVICE") in str(e.value)
    assert e.value.errno == errno.ENODEV
    assert e.value.hint is not None and "rdma link" in e.value.hint
    assert e.value.operation == "Agent"


def test_an_unknown_agent_has_a_hint(pair: Pair) -> None:
    a, _ = pair
    a.register("s", bytearray(4096))
    calls: Tuple[Callable[[], Any], ...] = (
        lambda: a.transfer(gpu_rdma.Batch().write("s", 0, "nobody", "d", 0, 16)),
        lambda: a.notify("nobody", b"x"),
    )
    for call in calls:
        with pytest.raises(gpu_rdma.NotFound) as e:
            call()
        assert "nobody" in str(e.value)
        hint = e.value.hint
        assert hint is not None
        for what in ("add_peer", "add_peer_at", "add_peer_card", "etcd_prefix"):
            assert what in hint, hint


def test_a_hint_is_not_repeated_in_the_message() -> None:
    # drm-export's text for a second owner of a dma-buf ends in "(hint: ...)".
    d = gpu_rdma.udmabuf(4096)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        gpu_rdma.dmabuf_from_fd(d.fileno())
    hint = e.value.hint
    assert hint is not None and hint.startswith("use that DmaBuf"), hint
    assert "(hint:" not in str(e.value) and hint not in str(e.value), str(e.value)
    assert "already owned" in str(e.value)
    d.close()
