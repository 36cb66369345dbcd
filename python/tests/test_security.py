"""Authentication from Python: agents of the cluster (the key the testbed gives through
GPU_RDMA_CLUSTER_KEY_FILE) talk; an agent with another key or none is refused, typed; an
agent with no authentication configured does not start; notifications carry the sender's
authenticated name."""

import os
import subprocess
import sys
import tempfile
from typing import Dict, Tuple

import gpu_rdma

from conftest import vm_env

# A process with its own environment: an agent `x` that sends one notification to the
# agent at argv[1] and prints the error's class.
FOREIGN = """
import sys, gpu_rdma
try:
    x = gpu_rdma.Agent("x", devices=[sys.argv[2]], bind="127.0.0.1:0")
except gpu_rdma.Error as e:
    print("start", type(e).__name__, e.hint or "", str(e))
    sys.exit(0)
x.add_peer("b", sys.argv[1])
try:
    x.notify("b", b"let me in")
    print("sent")
except gpu_rdma.Error as e:
    print("notify", type(e).__name__)
"""


def run_foreign(b: gpu_rdma.Agent, env: Dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", FOREIGN, b.address, vm_env("RDMA_DEVICE")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_notification_carries_its_senders_authenticated_name(
    pair: Tuple[gpu_rdma.Agent, gpu_rdma.Agent],
) -> None:
    a, b = pair
    a.notify("b", b"hello")
    n = b.wait_notification(60.0)
    assert n is not None and (n.sender, n.message) == ("a", b"hello")
    assert b.control_stats()["authenticated"] >= 1


def test_agents_of_another_cluster_or_none_are_refused_typed(
    pair: Tuple[gpu_rdma.Agent, gpu_rdma.Agent],
) -> None:
    _, b = pair
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_RDMA_")}
    with tempfile.TemporaryDirectory() as d:
        other = os.path.join(d, "other.key")
        fd = os.open(other, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (os.urandom(32).hex() + "\n").encode())
        os.close(fd)
        before = b.control_stats()
        assert run_foreign(b, {**base, "GPU_RDMA_CLUSTER_KEY_FILE": other}) == (
            "notify Unauthenticated"
        )
        assert run_foreign(b, {**base, "GPU_RDMA_INSECURE_NO_AUTH": "1"}) == (
            "notify Unauthenticated"
        )
        after = b.control_stats()
        assert after["unauthenticated"] > before["unauthenticated"]
        assert after["failed_handshakes"] > before["failed_handshakes"]
        # No authentication configured at all: the agent does not start, and says how.
        out = run_foreign(b, base)
        assert out.startswith("start InvalidInput"), out
        assert "GPU_RDMA_CLUSTER_KEY_FILE" in out
    assert b.wait_notification(0.0) is None
