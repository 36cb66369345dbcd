"""gpu_rdma: zero-copy RDMA of GPU and host memory from Python.

An :class:`Agent` per process registers memory as named segments (dma-bufs from the
exporters, :class:`HostMemory` and numpy arrays over it, CUDA ranges) and moves
:class:`Batch` es of reads and writes between its segments and its peers'. Waits are
bounded and release the GIL; ``await transfer.finished(timeout)`` and
``await agent.notification(timeout)`` wait from asyncio; ``transfer.status()`` is each
entry's :class:`EntryStatus`. Errors are :class:`Error` and its subclasses (a closed agent's
methods raise :class:`Closed`), with the Rust error's fields as attributes (``kind``,
``hint``, ``errno``, ``agent``, ``segment``, ...). See docs/python.md.
"""

from ._errors import (
    Busy,
    Closed,
    Error,
    InvalidInput,
    LimitReached,
    NotFound,
    PeerLost,
    Timeout,
    Unauthenticated,
    Unsupported,
)
from ._native import (
    MAX_NOTIFICATION,
    Agent,
    Batch,
    DmaBuf,
    EntryStatus,
    HostMemory,
    MetadataServer,
    Notification,
    Transfer,
    dma_heap,
    dmabuf_from_fd,
    udmabuf,
    vgem,
)

__all__ = [
    "MAX_NOTIFICATION",
    "Agent",
    "Batch",
    "Busy",
    "Closed",
    "DmaBuf",
    "EntryStatus",
    "Error",
    "HostMemory",
    "InvalidInput",
    "LimitReached",
    "MetadataServer",
    "NotFound",
    "Notification",
    "PeerLost",
    "Timeout",
    "Transfer",
    "Unauthenticated",
    "Unsupported",
    "dma_heap",
    "dmabuf_from_fd",
    "udmabuf",
    "vgem",
]
