"""Operating an agent from Python: metrics counted against a known batch, the Prometheus
endpoint, waiting for a peer, the engine's traces with GPU_RDMA_LOG, and a remote segment
that is gone."""

import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from typing import Tuple

import pytest

import gpu_rdma
from conftest import agent, vm_env

BLOCK = 64 << 10


def test_metrics_count_a_known_batch_and_the_endpoint_serves_them() -> None:
    device = vm_env("RDMA_DEVICE")
    a = gpu_rdma.Agent(
        "ma",
        devices=[device],
        bind="127.0.0.1:0",
        chunk_size=BLOCK,
        metrics_address="127.0.0.1:0",
    )
    b = agent("mb")
    try:
        a.add_peer("mb", b.address)
        a.register("src", bytearray(8 * BLOCK))
        b.register("dst", bytearray(8 * BLOCK))
        batch = gpu_rdma.Batch()
        for k in range(4):
            batch = batch.write("src", k * 2 * BLOCK, "mb", "dst", k * 2 * BLOCK, 2 * BLOCK)
        a.transfer(batch).wait(60.0)
        m = a.metrics()
        (rail,) = [r for r in m["rails"] if r["peer"] == "mb"]
        assert rail["local_device"] == device
        assert (rail["write_bytes"], rail["write_requests"]) == (8 * BLOCK, 8)
        assert (rail["read_bytes"], rail["errors"]) == (0, 0)
        assert (m["batches"], m["entries_done"], m["entries_failed"]) == (1, 4, 0)
        assert m["chunk_latency"]["count"] == 8
        assert sum(n for _, n in m["chunk_latency"]["buckets"]) == 8
        assert m["chunk_latency"]["buckets"][-1][0] == float("inf")
        assert m["in_flight"] == 0 and m["completion_errors"] == {}
        assert m["metadata"]["lookups"] >= 1 and m["segments"] == 1
        assert device in m["caches"] and "accepted" in m["control"]

        addr = a.metrics_address
        assert addr is not None and addr.startswith("127.0.0.1:")
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
            text = r.read().decode()
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        line = (
            f'gpu_rdma_rail_bytes_total{{agent="ma",peer="mb",local_device="{device}",'
            f'remote_device="0",op="write"}} {8 * BLOCK}'
        )
        assert line in text.splitlines(), text
        assert line in a.metrics_text().splitlines()
    finally:
        a.close()
        b.close()


def test_wait_for_peer_is_bounded_and_returns_once_the_peer_answers() -> None:
    a, b = agent("wa"), agent("wb")
    try:
        start = time.monotonic()
        with pytest.raises(gpu_rdma.Timeout) as e:
            a.wait_for_peer("wb", 0.3)
        waited = time.monotonic() - start
        assert 0.3 <= waited < 2.0, waited
        assert "unknown agent" in str(e.value)
        assert e.value.hint is not None and "add_peer" in e.value.hint
        a.add_peer("wb", b.address)
        a.wait_for_peer("wb", 10.0)
        # The descriptor is fetched: the first transfer looks nothing up.
        before = a.metrics()["metadata"]["lookups"]
        b.register("dst", bytearray(BLOCK))
        a.register("src", bytearray(BLOCK))
        a.wait_for_peer("wb", 10.0)
        a.transfer(gpu_rdma.Batch().write("src", 0, "wb", "dst", 0, BLOCK)).wait(60.0)
        assert a.metrics()["metadata"]["lookups"] == before + 1
    finally:
        a.close()
        b.close()


def test_gpu_rdma_log_prints_the_engines_trace_of_a_batch() -> None:
    device = vm_env("RDMA_DEVICE")
    program = textwrap.dedent(
        f"""
        import gpu_rdma
        a = gpu_rdma.Agent("la", devices=["{device}"], bind="127.0.0.1:0")
        b = gpu_rdma.Agent("lb", devices=["{device}"], bind="127.0.0.1:0")
        a.add_peer("lb", b.address)
        a.register("src", bytearray(4096))
        b.register("dst", bytearray(4096))
        a.transfer(gpu_rdma.Batch().write("src", 0, "lb", "dst", 0, 4096)).wait(60.0)
        """
    )
    env = dict(os.environ, GPU_RDMA_LOG="gpu_rdma_engine=debug", NO_COLOR="1")
    out = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "agent=la" in line]
    for event in ["segment registered", "batch checked and planned", "posted", "batch done"]:
        assert any(event in line for line in lines), (event, out.stderr)
    # Without the variable, nothing is printed.
    env.pop("GPU_RDMA_LOG")
    quiet = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120
    )
    assert quiet.returncode == 0 and "batch done" not in quiet.stderr, quiet.stderr


def test_a_remote_segment_unregistered_after_a_batch_is_not_found(
    pair: Tuple[gpu_rdma.Agent, gpu_rdma.Agent],
) -> None:
    a, b = pair
    a.register("src", bytearray(BLOCK))
    b.register("dst", bytearray(BLOCK))
    batch = gpu_rdma.Batch().write("src", 0, "b", "dst", 0, BLOCK)
    a.transfer(batch).wait(60.0)
    b.unregister("dst")
    t = a.transfer(batch)
    with pytest.raises(gpu_rdma.NotFound) as e:
        t.wait(60.0)
    assert 'has no segment "dst"' in str(e.value)
    with pytest.raises(gpu_rdma.NotFound):
        a.transfer(batch)
