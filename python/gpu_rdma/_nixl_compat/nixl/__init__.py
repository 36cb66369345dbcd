"""``nixl`` over gpu_rdma: NIXL's Python agent API (``nixl_agent``, ``nixl_agent_config``,
``nixl._bindings``, ``nixl._utils``, ``nixl.logging``) with gpu_rdma's engine underneath.

Put this package's parent folder (``python -m gpu_rdma.nixl path``) first on ``PYTHONPATH``
and ``from nixl._api import nixl_agent`` gets it; the backend names ``"UCX"`` and
``"GPU_RDMA"`` both select gpu_rdma. See docs/nixl.md.
"""

from ._api import (
    DEFAULT_COMM_PORT,
    nixl_agent,
    nixl_agent_config,
    nixl_backend_handle,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)

__all__ = [
    "DEFAULT_COMM_PORT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_backend_handle",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
]
