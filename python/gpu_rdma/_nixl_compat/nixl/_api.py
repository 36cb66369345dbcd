"""``nixl._api`` over gpu_rdma: ``nixl_agent`` and ``nixl_agent_config`` with NIXL's
signatures, return values and states, calling :mod:`nixl._bindings` (this package's, over
:class:`gpu_rdma.Agent`). See docs/nixl.md for what maps to what and what differs."""

from __future__ import annotations

import enum
import pickle
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _bindings as nixlBind
from ._descs import expand_strided
from .logging import get_logger

logger = get_logger(__name__)

DEFAULT_COMM_PORT = nixlBind.DEFAULT_COMM_PORT

#: A transfer's state, as NIXL's callers compare it.
_STATES = {nixlBind.NIXL_SUCCESS: "DONE", nixlBind.NIXL_IN_PROG: "PROC"}


def _torch_tensor(obj: object) -> bool:
    """Whether ``obj`` is a torch tensor (only if the program imported torch: a tensor
    cannot exist otherwise, and importing it here would cost a second)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


class nixl_thread_sync_t(enum.Enum):
    """NIXL's thread-safety modes (gpu_rdma's agent is thread-safe in each)."""

    NIXL_THREAD_SYNC_NONE = nixlBind.NIXL_THREAD_SYNC_NONE
    NIXL_THREAD_SYNC_STRICT = nixlBind.NIXL_THREAD_SYNC_STRICT
    NIXL_THREAD_SYNC_RW = nixlBind.NIXL_THREAD_SYNC_RW
    NIXL_THREAD_SYNC_DEFAULT = nixlBind.NIXL_THREAD_SYNC_DEFAULT


class nixl_agent_config:
    """An agent's settings (NIXL's arguments, in NIXL's order)."""

    def __init__(
        self,
        enable_prog_thread: bool = True,
        enable_listen_thread: bool = False,
        listen_port: int = DEFAULT_COMM_PORT,
        capture_telemetry: bool = False,
        num_threads: int = 0,
        backends: Optional[List[str]] = None,
        sync_mode: Optional[nixl_thread_sync_t] = None,
    ) -> None:
        if sync_mode is not None and not isinstance(sync_mode, nixl_thread_sync_t):
            raise TypeError(f"sync_mode must be a nixl_thread_sync_t (got {type(sync_mode).__name__!r})")
        self.backends = ["UCX"] if backends is None else backends
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        self.sync_mode = sync_mode


class _Handle:
    """A handle NIXL's callers hold; released once, explicitly or when collected."""

    __slots__ = ("_handle", "_agent", "_released")
    _kind = "handle"

    def __init__(self, agent: Any, value: int) -> None:
        self._handle = int(value)
        self._agent = agent
        self._released = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(0x{self._handle:x}, released={self._released})"

    def _free(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        if not self._released:
            self._free()
            self._released = True

    def __del__(self) -> None:
        # A collection can run while this thread holds the agent's locks (inside any
        # allocation), so nothing is released here: the handle is queued, without a lock,
        # and the agent releases it at its next call (an in-flight request once done).
        if not getattr(self, "_released", True):
            try:
                self._agent.collected.append((self._kind, self._handle))
            except Exception:
                pass


class nixl_prepped_dlist_handle(_Handle):
    """A prepared descriptor list (``prep_xfer_dlist``)."""

    __slots__ = ()
    _kind = "dlist"

    def _free(self) -> None:
        self._agent.releasedDlistH(self._handle)


class nixl_xfer_handle(_Handle):
    """A transfer request (``initialize_xfer``, ``make_prepped_xfer``)."""

    __slots__ = ()
    _kind = "xfer"

    def _free(self) -> None:
        self._agent.releaseXferReq(self._handle)



class nixl_backend_handle(int):
    """A created backend."""


class nixl_agent:
    """NIXL's agent over a gpu_rdma agent: register memory, exchange metadata, prepare and
    post transfers, send and take notifications."""

    def __init__(
        self,
        agent_name: str,
        nixl_conf: Optional[nixl_agent_config] = None,
        instantiate_all: bool = False,
    ) -> None:
        if nixl_conf is not None and instantiate_all:
            logger.warning("instantiate_all is ignored when a config is given")
            instantiate_all = False
        conf = nixl_conf or nixl_agent_config()
        default = (
            nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
            if conf.enable_listen
            else nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
        )
        cfg = nixlBind.nixlAgentConfig()
        cfg.useProgThread = conf.enable_pthread
        cfg.useListenThread = conf.enable_listen
        cfg.listenPort = conf.port
        cfg.syncMode = (conf.sync_mode or default).value
        cfg.captureTelemetry = conf.capture_telemetry
        self.agent = nixlBind.nixlAgent(agent_name, cfg)
        self.name = agent_name
        self.notifs: Dict[str, List[bytes]] = {}
        self.backends: Dict[str, Any] = {}
        self.backend_mems: Dict[str, List[str]] = {}
        self.backend_options: Dict[str, Dict[str, str]] = {}
        self.plugin_list: List[str] = self.agent.getAvailPlugins()
        self.plugin_b_options: Dict[str, Dict[str, str]] = {}
        self.plugin_mem_types: Dict[str, List[str]] = {}
        for b in self.plugin_list if instantiate_all else conf.backends:
            if b not in self.plugin_list:
                logger.warning("Skipping backend %s: no such plugin (gpu_rdma serves %s)", b, self.plugin_list)
            elif b not in self.backends:
                init = {"num_threads": str(conf.num_threads)} if conf.num_threads > 0 else {}
                self.create_backend(b, init)
        self.nixl_mems = {
            "DRAM": nixlBind.DRAM_SEG,
            "VRAM": nixlBind.VRAM_SEG,
            "FILE": nixlBind.FILE_SEG,
            "BLOCK": nixlBind.BLK_SEG,
            "OBJ": nixlBind.OBJ_SEG,
            "cpu": nixlBind.DRAM_SEG,
            "cuda": nixlBind.VRAM_SEG,
        }
        self.nixl_ops = {"WRITE": nixlBind.NIXL_WRITE, "READ": nixlBind.NIXL_READ}
        logger.info("Initialized NIXL agent %s over gpu_rdma", agent_name)

    def _handles(self, backends: Sequence[str]) -> List[Any]:
        return [self.backends[b] for b in backends]

    def _own(self, handle: Any, kind: type) -> int:
        """The number of `handle`, a `kind` of this agent (a TypeError for anything else, a
        nixlInvalidParamError for another agent's)."""
        if not isinstance(handle, kind):
            raise TypeError(f"a {kind.__name__}, not {type(handle).__name__}")
        h: Any = handle
        if h._agent is not self.agent:
            raise nixlBind.nixlInvalidParamError(f"{h!r} belongs to another agent")
        return int(h._handle)

    # --- plugins and backends -------------------------------------------------------------

    def get_plugin_list(self) -> List[str]:
        return self.plugin_list

    def _plugin(self, name: str) -> bool:
        if name not in self.plugin_mem_types and name in self.plugin_list:
            try:
                opts, mems = self.agent.getPluginParams(name)
                self.plugin_b_options[name], self.plugin_mem_types[name] = opts, mems
            except Exception:
                logger.warning("Could not read plugin %s's parameters", name, exc_info=True)
        return name in self.plugin_mem_types

    def get_plugin_mem_types(self, backend: str) -> List[str]:
        if not self._plugin(backend):
            logger.warning("Plugin %s is not available", backend)
            return []
        return self.plugin_mem_types[backend]

    def get_plugin_params(self, backend: str) -> Dict[str, str]:
        if not self._plugin(backend):
            logger.warning("Plugin %s is not available", backend)
            return {}
        return self.plugin_b_options[backend]

    def get_backend_mem_types(self, backend: str) -> List[str]:
        if backend not in self.backend_mems:
            logger.warning("Backend %s is not instantiated", backend)
            return []
        return self.backend_mems[backend]

    def get_backend_params(self, backend: str) -> Dict[str, str]:
        if backend not in self.backend_options:
            logger.warning("Backend %s is not instantiated", backend)
            return {}
        return self.backend_options[backend]

    def create_backend(self, backend: str, initParams: Optional[Dict[str, str]] = None) -> None:
        h = self.agent.createBackend(backend, dict(initParams or {}))
        self.backends[backend] = nixl_backend_handle(h)
        self.backend_options[backend], self.backend_mems[backend] = self.agent.getBackendParams(h)
        logger.info("Backend %s was instantiated (gpu_rdma)", backend)

    # --- memory ---------------------------------------------------------------------------

    def register_memory(self, reg_list: Any, mem_type: Optional[str] = None, backends: Sequence[str] = ()) -> Any:
        descs = self.get_reg_descs(reg_list, mem_type)
        self.agent.registerMem(descs, self._handles(backends))
        return descs

    def deregister_memory(self, dereg_list: Any, backends: Sequence[str] = ()) -> None:
        self.agent.deregisterMem(dereg_list, self._handles(backends))

    def query_memory(self, reg_list: Any, backend: str, mem_type: Optional[str] = None) -> List[Optional[Dict[str, str]]]:
        descs = self.get_reg_descs(reg_list, mem_type)
        if backend not in self.backends:
            raise ValueError(f"Backend '{backend}' not found. Available backends: {list(self.backends)}")
        return self.agent.queryMem(descs, self.backends[backend])

    def make_connection(self, remote_agent: str, backends: Sequence[str] = ()) -> None:
        self.agent.makeConnection(remote_agent, self._handles(backends))

    # --- transfers ------------------------------------------------------------------------

    def prep_xfer_dlist(self, agent_name: str, xfer_list: Any, mem_type: Optional[str] = None, backends: Sequence[str] = ()) -> nixl_prepped_dlist_handle:
        if isinstance(xfer_list, np.ndarray) and xfer_list.ndim == 2 and xfer_list.shape[1] == 5:
            # NIXL 1.5's compressed list: (address, length, device, stride, count) rows.
            if mem_type is None:
                raise ValueError("Please specify a mem type for strided descriptors")
            xfer_list = expand_strided(xfer_list)
        descs = self.get_xfer_descs(xfer_list, mem_type)
        hs = self._handles(backends)
        if agent_name in ("NIXL_INIT_AGENT", "", b""):
            h = self.agent.prepXferDlist(descs, hs)
        else:
            h = self.agent.prepXferDlist(agent_name, descs, hs)
        return nixl_prepped_dlist_handle(self.agent, h)

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle) -> Tuple[int, int, str]:
        duration, margin, method = self.agent.estimateXferCost(self._own(req_handle, nixl_xfer_handle))
        known = method == nixlBind.NIXL_COST_ANALYTICAL_BACKEND
        return duration, margin, "ANALYTICAL_BACKEND" if known else "UNKNOWN"

    def make_prepped_xfer(
        self,
        operation: str,
        local_xfer_side: nixl_prepped_dlist_handle,
        local_indices: Union[List[int], "np.ndarray[Any, Any]"],
        remote_xfer_side: nixl_prepped_dlist_handle,
        remote_indices: Union[List[int], "np.ndarray[Any, Any]"],
        notif_msg: Union[bytes, str] = b"",
        backends: Sequence[str] = (),
        skip_desc_merge: bool = False,
    ) -> nixl_xfer_handle:
        op = self.nixl_ops[operation]
        h = self.agent.makeXferReq(
            op,
            self._own(local_xfer_side, nixl_prepped_dlist_handle),
            local_indices,
            self._own(remote_xfer_side, nixl_prepped_dlist_handle),
            remote_indices,
            notif_msg,
            self._handles(backends),
            skip_desc_merge,
        )
        return nixl_xfer_handle(self.agent, h)

    def initialize_xfer(
        self,
        operation: str,
        local_descs: Any,
        remote_descs: Any,
        remote_agent: str,
        notif_msg: Union[bytes, str] = b"",
        backends: Sequence[str] = (),
    ) -> nixl_xfer_handle:
        op = self.nixl_ops[operation]
        h = self.agent.createXferReq(op, local_descs, remote_descs, remote_agent, notif_msg, self._handles(backends))
        return nixl_xfer_handle(self.agent, h)

    def transfer(self, handle: nixl_xfer_handle, notif_msg: Union[bytes, str] = b"") -> str:
        return _STATES.get(self.agent.postXferReq(self._own(handle, nixl_xfer_handle), notif_msg), "ERR")

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        return _STATES.get(self.agent.getXferStatus(self._own(handle, nixl_xfer_handle)), "ERR")

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> Any:
        return self.agent.getXferTelemetry(self._own(handle, nixl_xfer_handle))

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        used = self.agent.queryXferBackend(self._own(handle, nixl_xfer_handle))
        return next(name for name, h in self.backends.items() if h == used)

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        self._own(handle, nixl_xfer_handle)
        handle.release()

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        self._own(handle, nixl_prepped_dlist_handle)
        handle.release()

    # --- notifications --------------------------------------------------------------------

    def get_new_notifs(self, backends: Sequence[str] = ()) -> Dict[str, List[bytes]]:
        return self.agent.getNotifs({}, self._handles(backends))

    def update_notifs(self, backends: Sequence[str] = ()) -> Dict[str, List[bytes]]:
        self.notifs = self.agent.getNotifs(self.notifs, self._handles(backends))
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes, backends: Sequence[str] = (), tag_is_prefix: bool = True) -> bool:
        self.notifs = self.agent.getNotifs(self.notifs, self._handles(backends))
        msgs = self.notifs.get(remote_agent_name, [])
        for i, m in enumerate(msgs):
            if m.startswith(lookup_tag) if tag_is_prefix else lookup_tag in m:
                del msgs[i]
                return True
        return False

    def send_notif(self, remote_agent_name: str, notif_msg: Union[bytes, str], backend: Optional[str] = None) -> None:
        if backend is None:
            self.agent.genNotif(remote_agent_name, notif_msg)
        else:
            self.agent.genNotif(remote_agent_name, notif_msg, self.backends[backend])

    # --- metadata -------------------------------------------------------------------------

    def get_agent_metadata(self) -> bytes:
        return self.agent.getLocalMD()

    def get_partial_agent_metadata(self, descs: Any, inc_conn_info: bool = False, backends: Sequence[str] = ()) -> bytes:
        return self.agent.getLocalPartialMD(descs, inc_conn_info, self._handles(backends))

    def add_remote_agent(self, metadata: bytes) -> bytes:
        return self.agent.loadRemoteMD(metadata)

    def remove_remote_agent(self, agent: str) -> None:
        self.agent.invalidateRemoteMD(agent)

    def send_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        self.agent.sendLocalMD(ip_addr, port)

    def send_partial_agent_metadata(self, descs: Any, inc_conn_info: bool = False, backends: Sequence[str] = (), ip_addr: str = "", port: int = DEFAULT_COMM_PORT, label: str = "") -> None:
        self.agent.sendLocalPartialMD(descs, inc_conn_info, self._handles(backends), ip_addr, port, label)

    def fetch_remote_metadata(self, remote_agent: str, ip_addr: str = "", port: int = DEFAULT_COMM_PORT, label: str = "") -> None:
        self.agent.fetchRemoteMD(remote_agent, ip_addr, port, label)

    def invalidate_local_metadata(self, ip_addr: str = "", port: int = DEFAULT_COMM_PORT) -> None:
        self.agent.invalidateLocalMD(ip_addr, port)

    def check_remote_metadata(self, agent: str, descs: Any = None) -> bool:
        if descs is None:
            descs = nixlBind.nixlXferDList(nixlBind.DRAM_SEG)
        return bool(self.agent.checkRemoteMD(agent, descs) == nixlBind.NIXL_SUCCESS)

    # --- descriptor lists -----------------------------------------------------------------

    @staticmethod
    def _tensor_range(t: Any) -> Optional[Tuple[str, int, int, int]]:
        """(memory type, address, bytes, device) of a contiguous tensor, else None."""
        if not t.is_contiguous():
            logger.error("Please use a list of contiguous Tensors")
            return None
        dev = t.get_device()
        return ("DRAM" if dev == -1 else "VRAM", t.data_ptr(), t.numel() * t.element_size(), max(dev, 0))

    def _descs(self, descs: Any, mem_type: Optional[str], cls: Any, other: Any, width: int) -> Any:
        """The list of ``cls`` for ``descs`` (see get_xfer_descs), or None with the reason
        logged."""
        what = "transfer" if cls is nixlBind.nixlXferDList else "registration"
        if isinstance(descs, cls):
            return descs
        if isinstance(descs, other):
            logger.error("A %s list cannot be used for %s", type(descs).__name__, what)
            return None
        if _torch_tensor(descs):
            r = self._tensor_range(descs)
            if r is None:
                return None
            return cls(self.nixl_mems[r[0]], [r[1:] + (("",) if width == 4 else ())])
        if isinstance(descs, np.ndarray):
            if mem_type is None:
                logger.error("Please specify a mem type if not using Tensors")
                return None
            if descs.ndim != 2 or descs.shape[1] != 3:
                logger.error("An Nx3 array is needed for a %s list", what)
                return None
            return cls(self.nixl_mems[mem_type], descs)
        if isinstance(descs, (list, tuple)) and descs and _torch_tensor(descs[0]):
            rows = []
            for t in descs:
                if t.device != descs[0].device:
                    return None
                r = self._tensor_range(t)
                if r is None:
                    return None
                rows.append(r)
            return cls(self.nixl_mems[rows[0][0]], np.array([r[1:] for r in rows], dtype=np.uint64).reshape(-1, 3))
        if isinstance(descs, (list, tuple)) and descs and isinstance(descs[0], tuple):
            if mem_type is None:
                logger.error("Please specify a mem type if not using Tensors")
                return None
            mem = self.nixl_mems[mem_type]
            if len(descs[0]) != width:
                logger.error("A list of %d-tuples is needed for a %s list", width, what)
                return None
            return cls(mem, descs)
        return None

    def get_xfer_descs(self, descs: Any, mem_type: Optional[str] = None) -> Any:
        """A ``nixlXferDList`` from 3-tuples ``(address, length, device)`` with
        ``mem_type``, an Nx3 array with ``mem_type``, a contiguous tensor or a list of
        them, or such a list itself; None (with the reason logged) otherwise."""
        return self._descs(descs, mem_type, nixlBind.nixlXferDList, nixlBind.nixlRegDList, 3)

    def get_reg_descs(self, descs: Any, mem_type: Optional[str] = None) -> Any:
        """A ``nixlRegDList`` from 4-tuples ``(address, length, device, meta)``, or as
        :meth:`get_xfer_descs` takes them."""
        return self._descs(descs, mem_type, nixlBind.nixlRegDList, nixlBind.nixlXferDList, 4)

    def get_serialized_descs(self, descs: Any) -> bytes:
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs: bytes) -> Any:
        return pickle.loads(serialized_descs)
