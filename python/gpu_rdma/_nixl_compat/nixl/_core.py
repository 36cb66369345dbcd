"""``nixlAgent``: the agent of NIXL's binding layer, over a :class:`gpu_rdma.Agent`.

What maps to what:

- a registered range is a segment named by address (``Agent.register_address``); its name
  carries its NIXL memory type, so peers check a descriptor's type against the remote
  memory as NIXL does;
- a descriptor pair of a transfer is a ``write_at``/``read_at`` entry of one batch, posted
  again at each ``postXferReq``; its notification is the batch's;
- agent metadata is the agent's card (``Agent.card``): its control address and its
  versioned descriptor. Loading one names the peer; the descriptor transfers use is the one
  the peer gives over an authenticated connection;
- the metadata listener is the agent's control port: ``fetchRemoteMD`` asks the agent
  there for its descriptor, ``sendLocalMD`` and ``invalidateLocalMD`` reach it with a
  notification that this layer consumes (it never reaches ``getNotifs``);
- telemetry is the engine's own clock of each batch (``Transfer.timing``).
"""

from __future__ import annotations

import collections
import os
import struct
import threading
from typing import Any, Deque, Dict, List, Optional, Sequence, Set, Tuple, Union

from gpu_rdma import MAX_NOTIFICATION, Agent, Error

from ._descs import MOVABLE, first_outside, nixl_mem_t, nixlRegDList, nixlXferDList
from ._xfer import XferMixin, _Prepped, _Request, as_message
from ._status import (
    nixl_status_t,
    nixlInvalidParamError,
    nixlMismatchError,
    nixlNotFoundError,
    nixlNotSupportedError,
    raise_from,
)

#: The name NIXL's calls give for "this agent, the initiator's side".
NIXL_INIT_AGENT = ""

#: This engine's backend name; "UCX" (NIXL's default) names it too, so that callers that
#: ask for UCX run unchanged.
BACKENDS = ("GPU_RDMA", "UCX")

#: What NIXL's backends report they move.
MEM_TYPES = ["DRAM_SEG", "VRAM_SEG"]

#: The first bytes of a notification this layer sends to itself across agents (a card
#: pushed by ``sendLocalMD``, a goodbye of ``invalidateLocalMD``); never delivered to the
#: program.
_CARD = b"\x00gpu_rdma.nixl:card\x00"
#: The first bytes of partial metadata: the ranges it publishes, then the card.
_PARTIAL = b"\x00gpu_rdma.nixl:partial\x00"
_RANGE = struct.Struct("<BQQ")
_FORGET = b"\x00gpu_rdma.nixl:forget\x00"

_TRUE = ("y", "yes", "on", "1", "true", "enable")
_FALSE = ("n", "no", "off", "0", "false", "disable")


def _name(agent: Union[str, bytes]) -> str:
    """An agent name given as NIXL's callers give it (str, or the bytes NIXL returns)."""
    return agent.decode() if isinstance(agent, (bytes, bytearray)) else str(agent)


def _telemetry(config_says: bool) -> bool:
    """NIXL's rule: ``NIXL_TELEMETRY_ENABLE``, when set, wins over the agent's config."""
    v = os.environ.get("NIXL_TELEMETRY_ENABLE")
    if v is None:
        return config_says
    if v.strip().lower() in _TRUE:
        return True
    if v.strip().lower() in _FALSE:
        return False
    raise nixlInvalidParamError(f"NIXL_TELEMETRY_ENABLE={v!r}: y or n")


def _segment(mem: nixl_mem_t, dev: int, n: int) -> str:
    kind = "dram" if mem == nixl_mem_t.DRAM_SEG else f"vram{dev}"
    return f"nixl.{kind}.{n}"


def _mem_of(segment: str) -> Optional[nixl_mem_t]:
    """The NIXL memory type of a peer's segment, from its name (None: not one of ours)."""
    parts = segment.split(".")
    if len(parts) != 3 or parts[0] != "nixl":
        return None
    return nixl_mem_t.DRAM_SEG if parts[1] == "dram" else nixl_mem_t.VRAM_SEG


class nixlAgent(XferMixin):
    """NIXL's binding-level agent (``nixl._bindings.nixlAgent``) over a gpu_rdma agent."""

    def __init__(self, name: Union[str, bytes], config: Any) -> None:
        name = _name(name)
        if not name:
            raise ValueError("Agent needs a non-empty name")
        self.config = config
        self._telemetry = _telemetry(bool(config.captureTelemetry))
        port = int(config.listenPort) if config.useListenThread else 0
        host = os.environ.get("GPU_RDMA_NIXL_BIND", "0.0.0.0")
        try:
            self._agent = Agent(name, bind=f"{host}:{port}")
        except Error as e:
            raise_from(e, f"agent {name!r}")
        self.name = name
        self._lock = threading.Lock()
        self._backends: Dict[int, str] = {}
        # registered ranges: (type, address, length, device) -> segment names
        self._regs: Dict[Tuple[nixl_mem_t, int, int, int], List[str]] = {}
        self._seg = 0
        self._remotes: Set[str] = set()
        self._tables: Dict[str, List[Tuple[str, Optional[int], int]]] = {}
        self._dlists: Dict[int, _Prepped] = {}
        self._reqs: Dict[int, _Request] = {}
        self._doomed: Set[int] = set()  # released while in flight: dropped once done
        # Handles collected by Python, queued by their finalizers (appends take no lock).
        self.collected: Deque[Tuple[str, int]] = collections.deque()
        self._notifs: Dict[str, List[bytes]] = {}
        self._pumping = threading.Lock()  # one drain at a time: each sender's order kept
        # What each peer's metadata published: None for all its memory (a whole card),
        # else the ranges its partial metadata named: (type, address, length).
        self._published: Dict[str, Optional[Set[Tuple[int, int, int]]]] = {}

    # --- plugins and backends -------------------------------------------------------------

    def getAvailPlugins(self) -> List[str]:
        return list(BACKENDS)

    def getPluginParams(self, plugin: str) -> Tuple[Dict[str, str], List[str]]:
        if plugin not in BACKENDS:
            raise nixlNotFoundError(f"plugin {plugin!r}: gpu_rdma provides {list(BACKENDS)}")
        return {}, list(MEM_TYPES)

    def createBackend(self, plugin: str, params: Dict[str, str]) -> int:
        if plugin not in BACKENDS:
            raise nixlNotFoundError(f"backend {plugin!r}: gpu_rdma provides {list(BACKENDS)}")
        with self._lock:
            if plugin in self._backends.values():
                raise nixlInvalidParamError(f"backend {plugin!r} already created")
            h = self._handle()
            self._backends[h] = plugin
        return h

    def getBackendParams(self, backend: int) -> Tuple[Dict[str, str], List[str]]:
        if backend not in self._backends:
            raise nixlNotFoundError(f"backend handle {backend!r}")
        return {}, list(MEM_TYPES)

    def _usable(self, op: str) -> None:
        if not self._backends:
            raise nixlNotFoundError(
                f"{op}: no backend was created (nixl_agent_config(backends=['UCX']) or "
                "create_backend('UCX'): gpu_rdma serves both names)"
            )

    # --- memory ---------------------------------------------------------------------------

    def registerMem(self, descs: nixlRegDList, backends: Sequence[int] = ()) -> nixl_status_t:
        self._usable("registerMem")
        if not isinstance(descs, nixlRegDList):
            raise nixlInvalidParamError("registerMem: a nixlRegDList")
        mem = descs.getType()
        if mem not in MOVABLE:
            raise nixlNotSupportedError(f"registerMem: {mem.name}: gpu_rdma moves DRAM and VRAM")
        done: List[Tuple[Tuple[nixl_mem_t, int, int, int], str]] = []
        try:
            for addr, length, dev, _meta in descs:
                if length == 0:
                    raise nixlInvalidParamError(f"registerMem: 0 bytes at {addr:#x}")
                with self._lock:
                    seg = _segment(mem, dev, self._seg)
                    self._seg += 1
                location = "cpu" if mem == nixl_mem_t.DRAM_SEG else f"cuda:{dev}"
                try:
                    found = self._agent.register_address(seg, addr, length, location)
                except Error as e:
                    raise_from(e, f"registerMem: {length} bytes at {addr:#x}")
                key = (mem, addr, length, dev)
                done.append((key, seg))
                with self._lock:
                    self._regs.setdefault(key, []).append(seg)
                if found != location:
                    raise nixlInvalidParamError(
                        f"registerMem: {length} bytes at {addr:#x} are {found} memory, "
                        f"not {mem.name}"
                    )
        except BaseException:
            for key, seg in done:
                self._drop(key, seg)
            raise
        return nixl_status_t.NIXL_SUCCESS

    def _drop(self, key: Tuple[nixl_mem_t, int, int, int], seg: str) -> None:
        with self._lock:
            segs = self._regs.get(key, [])
            if seg in segs:
                segs.remove(seg)
            if not segs:
                self._regs.pop(key, None)
        try:
            self._agent.unregister(seg)
        except Error:
            pass

    def deregisterMem(self, descs: nixlRegDList, backends: Sequence[int] = ()) -> nixl_status_t:
        if not isinstance(descs, nixlRegDList):
            raise nixlInvalidParamError("deregisterMem: a nixlRegDList")
        mem = descs.getType()
        with self._lock:
            keys = [(mem, a, n, d) for a, n, d, _m in descs]
            missing = [k for k in keys if not self._regs.get(k)]
        if missing:
            _, a, n, _ = missing[0]
            raise nixlNotFoundError(f"deregisterMem: {n} bytes at {a:#x} are not registered")
        for k in keys:
            with self._lock:
                segs = self._regs.get(k, [])
                seg = segs[-1] if segs else None
            if seg is None:
                continue
            try:
                self._agent.unregister(seg)
            except Error as e:
                raise_from(e, f"deregisterMem: {k[2]} bytes at {k[1]:#x}")
            with self._lock:
                segs.remove(seg)
                if not segs:
                    del self._regs[k]
        return nixl_status_t.NIXL_SUCCESS

    def queryMem(self, descs: nixlRegDList, backend: int) -> List[Optional[Dict[str, str]]]:
        raise nixlNotSupportedError("queryMem: gpu_rdma has no storage to query")

    def _local_ranges(self, mem: nixl_mem_t) -> List[Tuple[int, int]]:
        with self._lock:
            return [(k[1], k[2]) for k in self._regs if k[0] == mem]

    # --- peers and metadata ---------------------------------------------------------------

    def getLocalMD(self) -> bytes:
        try:
            return self._agent.card()
        except Error as e:
            raise_from(e, "getLocalMD")

    def getLocalPartialMD(self, descs: Any, inc_conn_info: bool, backends: Sequence[int]) -> bytes:
        """Metadata that publishes only ``descs`` (a peer that loads it can reach no other
        range of this agent until more is published), with the card (the connection is
        always included)."""
        return self._partial(self._ranges(descs), self.getLocalMD())

    @staticmethod
    def _ranges(descs: Any) -> List[Tuple[int, int, int]]:
        if descs is None:
            return []
        if not isinstance(descs, (nixlRegDList, nixlXferDList)):
            raise TypeError(f"a nixlRegDList or nixlXferDList, not {type(descs).__name__}")
        mem = int(descs.getType())
        return [(mem, int(a), int(n)) for a, n, _d in descs.array().tolist()]

    @staticmethod
    def _partial(ranges: List[Tuple[int, int, int]], card: bytes) -> bytes:
        head = struct.pack("<I", len(ranges)) + b"".join(_RANGE.pack(*r) for r in ranges)
        return _PARTIAL + head + card

    def _load(self, blob: bytes) -> str:
        """Loads metadata (a card, or partial metadata); returns the agent's name."""
        ranges: Optional[Set[Tuple[int, int, int]]] = None
        if blob.startswith(_PARTIAL):
            at = len(_PARTIAL)
            if len(blob) < at + 4:
                raise nixlMismatchError("loadRemoteMD: partial metadata cut short")
            (n,) = struct.unpack_from("<I", blob, at)
            at += 4
            if len(blob) < at + n * _RANGE.size:
                raise nixlMismatchError("loadRemoteMD: partial metadata cut short")
            ranges = set()
            for i in range(n):
                m, a, length = _RANGE.unpack_from(blob, at + i * _RANGE.size)
                ranges.add((int(m), int(a), int(length)))
            blob = blob[at + n * _RANGE.size :]
        try:
            name = self._agent.add_peer_card(bytes(blob))
        except Error as e:
            raise nixlMismatchError(f"loadRemoteMD: {e}", e) from e
        self._loaded(name, ranges)
        return name

    def _loaded(self, name: str, ranges: Optional[Set[Tuple[int, int, int]]]) -> None:
        """Agent `name`'s metadata is here: all of its memory (`ranges` None) or, added to
        what it published before, those ranges."""
        with self._lock:
            self._remotes.add(name)
            self._tables.pop(name, None)
            had = self._published.get(name, set())
            if ranges is None or had is None and name in self._published:
                self._published[name] = None
            else:
                self._published[name] = (had or set()) | ranges

    def loadRemoteMD(self, metadata: bytes) -> bytes:
        return self._load(bytes(metadata)).encode()

    def invalidateRemoteMD(self, agent: Union[str, bytes]) -> nixl_status_t:
        name = _name(agent)
        with self._lock:
            self._remotes.discard(name)
            self._tables.pop(name, None)
            self._published.pop(name, None)
        if name != self.name:
            self._agent.remove_peer(name)
        return nixl_status_t.NIXL_SUCCESS

    def _known(self, op: str, agent: str) -> None:
        self._pump()
        if agent == self.name:
            with self._lock:
                fresh = agent not in self._remotes
                self._remotes.add(agent)
            if fresh:  # a loopback transfer: the agent is its own peer
                self._agent.add_peer_card(self._agent.card())
            return
        with self._lock:
            if agent in self._remotes:
                return
        raise nixlNotFoundError(f"{op}: metadata for remote agent {agent!r} not found")

    def checkRemoteMD(self, agent: Union[str, bytes], descs: nixlXferDList) -> nixl_status_t:
        name = _name(agent)
        self._pump()
        with self._lock:
            if name not in self._remotes:
                return nixl_status_t.NIXL_ERR_NOT_FOUND
        if descs is not None and not isinstance(descs, nixlXferDList):
            raise TypeError(f"a nixlXferDList, not {type(descs).__name__}")
        if descs is None or descs.isEmpty():
            return nixl_status_t.NIXL_SUCCESS  # the metadata is loaded: nothing to ask
        try:
            self._remote_check("checkRemoteMD", name, descs)
        except Exception:  # noqa: BLE001 - a peer that cannot answer has no such memory here
            return nixl_status_t.NIXL_ERR_NOT_FOUND
        return nixl_status_t.NIXL_SUCCESS

    def _table(self, agent: str, refresh: bool) -> List[Tuple[str, Optional[int], int]]:
        with self._lock:
            t = None if refresh else self._tables.get(agent)
        if t is None:
            try:
                t = self._agent.describe(agent)
            except Error as e:
                raise_from(e, f"metadata of {agent!r}")
            with self._lock:
                self._tables[agent] = t
        return t

    def _remote_check(self, op: str, agent: str, descs: nixlXferDList) -> None:
        """Each descriptor lies in memory of its type the agent registered (and published,
        if its metadata was partial); the agent's descriptor is fetched again once before a
        descriptor is refused."""
        mem = descs.getType()
        if agent == self.name:
            bad = first_outside(self._local_ranges(mem), descs)
            if bad is not None:
                a, n, _ = descs[bad]
                raise nixlNotFoundError(f"{op}: {n} bytes at {a:#x} are not registered {mem.name} memory of {agent!r}")
            return
        with self._lock:
            published = self._published.get(agent)
        if published is not None:
            bad = first_outside([(a, n) for m, a, n in published if m == mem], descs)
            if bad is not None:
                a, n, _ = descs[bad]
                raise nixlNotFoundError(
                    f"{op}: {n} bytes at {a:#x}: {agent!r}'s metadata loaded so far does not "
                    "publish them"
                )
        bad = None
        for refresh in (False, True):
            table = self._table(agent, refresh)
            held = [(base, n) for seg, base, n in table if base is not None and _mem_of(seg) == mem]
            bad = first_outside(held, descs)
            if bad is None:
                return
        assert bad is not None
        a, n, _ = descs[bad]
        raise nixlNotFoundError(
            f"{op}: {n} bytes at {a:#x} are not registered {mem.name} memory of {agent!r}"
        )

    def _pump(self) -> None:
        """Takes the notifications the engine holds: this layer's own are acted on, the
        program's are kept by sender for ``getNotifs``.

        A peer can send a message that looks like this layer's own; it then speaks only for
        itself (its card, its goodbye), the name its connection authenticated."""
        with self._pumping:
            self._drain()

    def _drain(self) -> None:
        while True:
            n = self._agent.wait_notification(0.0)
            if n is None:
                return
            msg = n.message
            if msg.startswith(_CARD):
                # Metadata of the agent the connection authenticated, not of another.
                try:
                    if self._peek_name(msg[len(_CARD) :]) == n.sender:
                        self._load(msg[len(_CARD) :])
                except (Error, nixlMismatchError, struct.error, UnicodeDecodeError):
                    pass  # not metadata this agent can load: dropped
                continue
            if msg == _FORGET:
                self.invalidateRemoteMD(n.sender)
                continue
            with self._lock:
                self._notifs.setdefault(n.sender, []).append(msg)

    @staticmethod
    def _peek_name(blob: bytes) -> str:
        """The agent a card (or partial metadata) names, read without loading it."""
        if blob.startswith(_PARTIAL):
            (n,) = struct.unpack_from("<I", blob, len(_PARTIAL))
            blob = blob[len(_PARTIAL) + 4 + n * _RANGE.size :]
        # The card: magic, version, the address (u32 length), the descriptor (u32 length):
        # magic, version, then the agent's name (u32 length).
        (alen,) = struct.unpack_from("<I", blob, 6)
        at = 10 + alen + 4 + 6
        (nlen,) = struct.unpack_from("<I", blob, at)
        return blob[at + 4 : at + 4 + nlen].decode()

    def _at(self, op: str, ip: str, port: int) -> str:
        """The agent listening at ``ip:port`` (asked each time: it may have restarted)."""
        if not ip:
            raise nixlNotSupportedError(
                f"{op}: no address given, and gpu_rdma's NIXL layer has no central metadata "
                "server: exchange get_agent_metadata() out of band, or give the peer's IP"
            )
        try:
            return self._agent.add_peer_at(f"{ip}:{port}")
        except Error as e:
            raise_from(e, f"{op}: the agent at {ip}:{port}")

    def fetchRemoteMD(self, agent: Union[str, bytes], ip: str = "", port: int = 0, label: str = "") -> nixl_status_t:
        name = _name(agent)
        found = self._at("fetchRemoteMD", ip, port)
        if found != name:
            raise nixlMismatchError(f"fetchRemoteMD: the agent at {ip}:{port} is {found!r}, not {name!r}")
        self._loaded(name, None)  # a fetch gets all of the agent's metadata
        return nixl_status_t.NIXL_SUCCESS

    def sendLocalMD(self, ip: str = "", port: int = 0) -> nixl_status_t:
        peer = self._at("sendLocalMD", ip, port)
        try:
            # The card without its segments (they are fetched over the authenticated
            # connection anyway): a notification holds 4096 bytes.
            self._agent.notify(peer, _CARD + self._agent.card(segments=False))
        except Error as e:
            raise_from(e, f"sendLocalMD to {peer!r}")
        return nixl_status_t.NIXL_SUCCESS

    def sendLocalPartialMD(self, descs: Any, inc_conn_info: bool, backends: Sequence[int], ip: str = "", port: int = 0, label: str = "") -> nixl_status_t:
        peer = self._at("sendLocalPartialMD", ip, port)
        ranges = self._ranges(descs)
        try:
            card = self._agent.card(segments=False)
        except Error as e:
            raise_from(e, "sendLocalPartialMD")
        # As many notifications as the ranges need (the peer adds up what it is told).
        room = (MAX_NOTIFICATION - len(_CARD) - len(_PARTIAL) - 4 - len(card)) // _RANGE.size
        for at in range(0, max(len(ranges), 1), max(room, 1)):
            try:
                self._agent.notify(peer, _CARD + self._partial(ranges[at : at + room], card))
            except Error as e:
                raise_from(e, f"sendLocalPartialMD to {peer!r}")
        return nixl_status_t.NIXL_SUCCESS

    def invalidateLocalMD(self, ip: str = "", port: int = 0) -> nixl_status_t:
        peer = self._at("invalidateLocalMD", ip, port)
        try:
            self._agent.notify(peer, _FORGET)
        except Error as e:
            raise_from(e, f"invalidateLocalMD at {peer!r}")
        return nixl_status_t.NIXL_SUCCESS

    def makeConnection(self, agent: Union[str, bytes], backends: Sequence[int] = ()) -> nixl_status_t:
        self._known("makeConnection", _name(agent))
        return nixl_status_t.NIXL_SUCCESS

    # --- notifications --------------------------------------------------------------------

    def genNotif(self, agent: Union[str, bytes], msg: Union[str, bytes], backend: Optional[int] = None) -> nixl_status_t:
        name = _name(agent)
        self._known("genNotif", name)
        try:
            self._agent.notify(name, as_message(msg))
        except Error as e:
            raise_from(e, f"genNotif to {name!r}")
        return nixl_status_t.NIXL_SUCCESS

    def getNotifs(self, notifs: Dict[str, List[bytes]], backends: Sequence[int] = ()) -> Dict[str, List[bytes]]:
        self._pump()
        with self._lock:
            new, self._notifs = self._notifs, {}
        for sender, msgs in new.items():
            notifs.setdefault(sender, []).extend(msgs)
        return notifs
