"""NIXL's Python agent API over gpu_rdma.

vLLM's ``NixlConnector``, Dynamo and SGLang's NIXL backend call ``nixl._api.nixl_agent``;
with the folder :func:`compat_path` names first on ``PYTHONPATH`` (``python -m
gpu_rdma.nixl path`` prints it), that import finds gpu_rdma's ``nixl`` package: the same
classes, signatures, return values, states and exceptions, with gpu_rdma's engine moving
the bytes. The backend names ``"UCX"`` (NIXL's default) and ``"GPU_RDMA"`` both select it.

Agent metadata (``get_agent_metadata``) is the agent's card: its control address and its
descriptor, each versioned. The agent authenticates its peers as every gpu_rdma agent does
(``GPU_RDMA_CLUSTER_KEY_FILE``, mutual TLS, or ``GPU_RDMA_INSECURE_NO_AUTH=1`` on a test
bench). See docs/nixl.md.
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

__all__ = ["compat_path"]


def compat_path() -> str:
    """The folder holding the ``nixl`` package over gpu_rdma: put it first on
    ``PYTHONPATH`` and ``from nixl._api import nixl_agent`` gets it."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_nixl_compat")


def main(argv: Sequence[str]) -> int:
    """``python -m gpu_rdma.nixl path``: prints :func:`compat_path`."""
    if list(argv) == ["path"]:
        print(compat_path())
        return 0
    print("usage: python -m gpu_rdma.nixl path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
