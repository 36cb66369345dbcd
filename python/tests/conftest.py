"""Fixtures of the gpu_rdma tests: they run inside the testbed VM (soft-RoCE rxe), started
by tests/tests/python_package.rs; outside it they fail, never skip."""

import os
from typing import Iterator, Tuple

import pytest

import gpu_rdma


def vm_env(key: str) -> str:
    """A variable the testbed sets (fails the test outside the VM)."""
    value = os.environ.get(key)
    assert value, f"{key} is unset: these tests run in the testbed VM (cargo xtask test)"
    return value


def agent(name: str) -> gpu_rdma.Agent:
    """An agent on the testbed's rxe device, listening on loopback."""
    return gpu_rdma.Agent(name, devices=[vm_env("RDMA_DEVICE")], bind="127.0.0.1:0")


@pytest.fixture
def pair() -> Iterator[Tuple[gpu_rdma.Agent, gpu_rdma.Agent]]:
    """Agents `a` and `b` on one node, each knowing the other."""
    a, b = agent("a"), agent("b")
    a.add_peer("b", b.address)
    b.add_peer("a", a.address)
    yield a, b
    a.close()
    b.close()


def pattern(size: int, seed: int) -> bytes:
    """`size` bytes that differ with `seed` and with the position."""
    return bytes(((i * 131 + seed * 17 + (i >> 12)) & 0xFF) for i in range(size))
