"""Agents that find each other through etcd (Debian's etcd-server, started here) alone."""

import time

import pytest

import gpu_rdma
from conftest import pattern, vm_env


def agent(name: str, url: str) -> gpu_rdma.Agent:
    deadline = time.monotonic() + 60
    while True:  # until etcd answers
        try:
            return gpu_rdma.Agent(
                name, devices=[vm_env("RDMA_DEVICE")], bind="127.0.0.1:0", etcd=[url], etcd_prefix="/py"
            )
        except gpu_rdma.PeerLost:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_agents_found_through_etcd_alone(etcd: str) -> None:
    a, b = agent("a", etcd), agent("b", etcd)
    size = 64 << 10
    src = gpu_rdma.udmabuf(size)
    src.write(pattern(size, 13))
    a.register("s", src)
    dst = gpu_rdma.udmabuf(size)
    b.register("d", dst)
    a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size).notify(b"etcd")).wait(120.0)
    note = b.wait_notification(10.0)
    assert note is not None and note.message == b"etcd"
    b.unregister("d")
    assert dst.read() == pattern(size, 13)
    a.close()
    b.close()


def test_etcd_keywords_need_endpoints() -> None:
    with pytest.raises(gpu_rdma.InvalidInput):
        gpu_rdma.Agent("x", etcd_prefix="/p")
