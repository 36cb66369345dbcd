"""Fixtures of the gpu_rdma tests: they run inside the testbed VM (soft-RoCE rxe), started
by tests/tests/programs/python_package.rs; outside it they fail, never skip."""

import os
import subprocess
import tempfile
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


CLIENT, PEER = 23790, 23800


@pytest.fixture
def etcd() -> Iterator[str]:
    """An etcd on loopback; its client URL."""
    url, peer = f"http://127.0.0.1:{CLIENT}", f"http://127.0.0.1:{PEER}"
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [
                "etcd",
                "--name=py",
                f"--data-dir={os.path.join(d, 'data')}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=py={peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield url
        finally:
            proc.terminate()
            proc.wait(30)
