"""``nixl._bindings`` over gpu_rdma: the names NIXL's Python layer and its callers use from
NIXL's compiled bindings (constants, enums, descriptor lists, the agent, its config and
exceptions), written over :mod:`gpu_rdma`."""

from __future__ import annotations

import enum

from ._core import BACKENDS, MEM_TYPES, NIXL_INIT_AGENT, nixlAgent
from ._descs import nixl_mem_t, nixlRegDList, nixlRemoteDList, nixlXferDList
from ._status import (
    nixl_status_t,
    nixlBackendError,
    nixlCancelledError,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlUnknownError,
)
from ._xfer import (
    NIXL_COST_ANALYTICAL_BACKEND,
    NIXL_READ,
    NIXL_WRITE,
    nixl_xfer_op_t,
    nixlXferTelemetry,
)

#: NIXL's default metadata listener port.
DEFAULT_COMM_PORT = 8888

DRAM_SEG = nixl_mem_t.DRAM_SEG
VRAM_SEG = nixl_mem_t.VRAM_SEG
BLK_SEG = nixl_mem_t.BLK_SEG
OBJ_SEG = nixl_mem_t.OBJ_SEG
FILE_SEG = nixl_mem_t.FILE_SEG

NIXL_SUCCESS = nixl_status_t.NIXL_SUCCESS
NIXL_IN_PROG = nixl_status_t.NIXL_IN_PROG
NIXL_ERR_NOT_POSTED = nixl_status_t.NIXL_ERR_NOT_POSTED
NIXL_ERR_INVALID_PARAM = nixl_status_t.NIXL_ERR_INVALID_PARAM
NIXL_ERR_BACKEND = nixl_status_t.NIXL_ERR_BACKEND
NIXL_ERR_NOT_FOUND = nixl_status_t.NIXL_ERR_NOT_FOUND
NIXL_ERR_MISMATCH = nixl_status_t.NIXL_ERR_MISMATCH
NIXL_ERR_NOT_ALLOWED = nixl_status_t.NIXL_ERR_NOT_ALLOWED
NIXL_ERR_REPOST_ACTIVE = nixl_status_t.NIXL_ERR_REPOST_ACTIVE
NIXL_ERR_UNKNOWN = nixl_status_t.NIXL_ERR_UNKNOWN
NIXL_ERR_NOT_SUPPORTED = nixl_status_t.NIXL_ERR_NOT_SUPPORTED
NIXL_ERR_REMOTE_DISCONNECT = nixl_status_t.NIXL_ERR_REMOTE_DISCONNECT


class nixl_thread_sync_t(enum.IntEnum):
    """NIXL's thread-safety modes. gpu_rdma's agent is thread-safe in every mode."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 3


NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT


class nixl_cost_t(enum.IntEnum):
    """How a cost estimate was made."""

    ANALYTICAL_BACKEND = NIXL_COST_ANALYTICAL_BACKEND


class nixlAgentConfig:
    """An agent's settings, as NIXL's Python layer fills them. gpu_rdma uses
    ``useListenThread`` and ``listenPort`` (the control port: port 0, any, without the
    listener) and ``captureTelemetry``; the others are kept and have no effect."""

    def __init__(self) -> None:
        self.useProgThread = True
        self.useListenThread = False
        self.listenPort = DEFAULT_COMM_PORT
        self.syncMode = int(NIXL_THREAD_SYNC_DEFAULT)
        self.pthrDelay = 0
        self.lthrDelay = 100000
        self.captureTelemetry = False
        self.etcdWatchTimeout = 5000000


HAVE_UCX_GPU_DEVICE_API = False

__all__ = [
    "BACKENDS", "MEM_TYPES", "NIXL_INIT_AGENT", "DEFAULT_COMM_PORT", "nixlAgent",
    "nixlAgentConfig", "nixlRegDList", "nixlRemoteDList", "nixlXferDList", "nixlXferTelemetry",
    "nixl_mem_t", "nixl_status_t", "nixl_thread_sync_t", "nixl_xfer_op_t", "nixl_cost_t",
    "NIXL_READ", "NIXL_WRITE", "NIXL_COST_ANALYTICAL_BACKEND",
    "nixlBackendError", "nixlCancelledError", "nixlInvalidParamError", "nixlMismatchError",
    "nixlNoTelemetryError", "nixlNotAllowedError", "nixlNotFoundError", "nixlNotPostedError",
    "nixlNotSupportedError", "nixlRemoteDisconnectError", "nixlRepostActiveError",
    "nixlUnknownError",
]
