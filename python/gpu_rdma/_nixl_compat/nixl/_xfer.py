"""Transfer requests of ``nixlAgent``: prepared lists, requests made from them or from two
lists, their posts, states, telemetry and release."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Deque, Dict, List, Optional, Sequence, Set, Tuple, Union

from gpu_rdma import Agent, Batch, Error

import numpy as np

from ._descs import first_outside, nixl_mem_t, nixlXferDList
from ._status import (
    nixl_status_t,
    nixlInvalidParamError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlRepostActiveError,
    raise_from,
)


class nixl_xfer_op_t(int):
    """NIXL's transfer operations (an int, as NIXL's enum compares)."""

    names = {0: "NIXL_READ", 1: "NIXL_WRITE"}

    def __repr__(self) -> str:
        return f"nixl_xfer_op_t.{self.names.get(int(self), int(self))}"


NIXL_READ = nixl_xfer_op_t(0)
NIXL_WRITE = nixl_xfer_op_t(1)

#: Handle numbers, unique in the process: one agent's number never names another's request.
_HANDLES = itertools.count(1)


def as_message(msg: Any) -> bytes:
    """A notification's bytes: ``bytes`` (or a bytes-like object) as it is, ``str`` as UTF-8;
    anything else is a TypeError (as NIXL's binding refuses it)."""
    if isinstance(msg, str):
        return msg.encode()
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    raise TypeError(f"a notification message is bytes or str, not {type(msg).__name__}")


#: The cost estimate's method: gpu_rdma gives none.
NIXL_COST_ANALYTICAL_BACKEND = 0
NIXL_COST_UNKNOWN = -1


class nixlXferTelemetry:
    """A transfer's telemetry: microseconds (``startTime`` since the epoch) and bytes."""

    def __init__(self, start: int, post: int, xfer: int, total: int, count: int) -> None:
        self.startTime = start
        self.postDuration = post
        self.xferDuration = xfer
        self.totalBytes = total
        self.descCount = count

    def __repr__(self) -> str:
        return (
            f"nixlXferTelemetry(startTime={self.startTime}, postDuration={self.postDuration}, "
            f"xferDuration={self.xferDuration}, totalBytes={self.totalBytes}, "
            f"descCount={self.descCount})"
        )


class _Prepped:
    """A prepared descriptor list: whose memory (``""``: the initiator's own) and which."""

    def __init__(self, agent: str, descs: nixlXferDList) -> None:
        self.agent = agent
        self.descs = descs


class _Request:
    """A transfer request: the entries of one batch, built again at each post."""

    def __init__(self, write: bool, peer: str, pairs: Sequence[Sequence[int]], notif: bytes) -> None:
        self.write = write
        self.peer = peer
        self.local = [p[0] for p in pairs]
        self.remote = [p[1] for p in pairs]
        self.lengths = [p[2] for p in pairs]
        self.notif = notif
        self.transfer: Optional[Any] = None
        # Held from the check that no post is in flight to the new post's record (and by a
        # release), so that two posts, or a post and a release, never interleave.
        self.lock = threading.Lock()
        self.released = False

    def batch(self, notif: bytes) -> Batch:
        b = Batch()
        add = b.write_many_at if self.write else b.read_many_at
        add(self.local, self.peer, self.remote, self.lengths)
        if notif:
            b.notify(notif)
        return b


def _op(op: Any) -> bool:
    """True for a write, False for a read."""
    if int(op) == int(NIXL_WRITE):
        return True
    if int(op) == int(NIXL_READ):
        return False
    raise nixlInvalidParamError(f"operation {op!r}: NIXL_READ or NIXL_WRITE")


def _indices(what: str, idx: Any, n: int) -> Any:
    """The indices as an int64 array, each in ``0..n`` (integers only: a float or a bool
    is a TypeError, as NIXL's binding refuses them)."""
    raw = np.asarray(list(idx) if isinstance(idx, (set, dict)) else idx)
    if raw.size and raw.dtype.kind not in "iu":
        raise TypeError(f"makeXferReq: {what} indices of {raw.dtype}: integers are needed")
    out = raw.astype(np.int64).reshape(-1)
    if raw.dtype.kind == "u" and raw.size and int(raw.max()) >= 1 << 63:
        raise nixlInvalidParamError(f"makeXferReq: {what} index {int(raw.max())} out of range")
    bad = np.flatnonzero((out < 0) | (out >= n))
    if bad.size:
        at = int(bad[0])
        raise nixlInvalidParamError(f"makeXferReq: {what} index out of range at index {at} with value {int(out[at])}")
    return out


class XferMixin:
    """The transfer calls of ``nixlAgent`` (its state is declared here for them)."""

    name: str
    _agent: Agent
    _lock: threading.Lock
    _backends: Dict[int, str]
    _telemetry: bool
    _dlists: Dict[int, _Prepped]
    _reqs: Dict[int, _Request]
    _doomed: Set[int]
    collected: Deque[Tuple[str, int]]

    # What nixlAgent defines.
    def _usable(self, op: str) -> None:
        raise NotImplementedError

    def _known(self, op: str, agent: str) -> None:
        raise NotImplementedError

    def _local_ranges(self, mem: nixl_mem_t) -> List[Tuple[int, int]]:
        raise NotImplementedError

    def _remote_check(self, op: str, agent: str, descs: nixlXferDList) -> None:
        raise NotImplementedError

    def _handle(self) -> int:
        return next(_HANDLES)

    def _local_check(self, op: str, descs: nixlXferDList) -> None:
        mem = descs.getType()
        bad = first_outside(self._local_ranges(mem), descs)
        if bad is not None:
            a, n, _d = descs[bad]
            raise nixlNotFoundError(f"{op}: {n} bytes at {a:#x} are not registered {mem.name} memory of this agent")

    def prepXferDlist(self, *args: Any) -> int:
        """``(descs, backends)`` for this agent's side, ``(agent, descs, backends)`` for a
        remote's (or this agent's name: a loopback's remote side)."""
        if len(args) >= 1 and isinstance(args[0], nixlXferDList):
            agent, descs = "", args[0]
        elif len(args) >= 2:
            agent = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            descs = args[1]
        else:
            raise TypeError("prepXferDlist(descs, backends) or prepXferDlist(agent, descs, backends)")
        if not isinstance(descs, nixlXferDList):
            raise nixlInvalidParamError("prepXferDlist: a nixlXferDList")
        self._usable("prepXferDlist")
        self._sweep()
        if agent == "":
            self._local_check("prepXferDlist", descs)
        else:
            self._known("prepXferDlist", agent)
            self._remote_check("prepXferDlist", agent, descs)
        h = self._handle()
        with self._lock:
            self._dlists[h] = _Prepped(agent, nixlXferDList(descs.getType(), list(descs)))
        return h

    def releasedDlistH(self, handle: int) -> nixl_status_t:
        with self._lock:
            if self._dlists.pop(int(handle), None) is None:
                raise nixlNotFoundError(f"releasedDlistH: no descriptor list {int(handle):#x}")
        return nixl_status_t.NIXL_SUCCESS

    def releaseXferReqWhenDone(self, handle: int) -> None:
        """Releases the request now, or, while its post is in flight, once it is done (a
        handle collected before its transfer finished)."""
        try:
            self.releaseXferReq(handle)
        except nixlNotAllowedError:
            with self._lock:
                self._doomed.add(int(handle))

    def _sweep(self) -> None:
        """Releases the handles collected since the last call (queued by their finalizers,
        which take no lock), then drops the requests released while in flight whose posts
        are done."""
        while True:
            try:
                kind, h = self.collected.popleft()
            except IndexError:
                break
            try:
                if kind == "xfer":
                    self.releaseXferReqWhenDone(h)
                else:
                    self.releasedDlistH(h)
            except Exception:  # noqa: BLE001 - already released, or never made
                pass
        with self._lock:
            done = [h for h in self._doomed if (r := self._reqs.get(h)) is None or r.transfer is None or r.transfer.done]
            for h in done:
                self._doomed.discard(h)
                self._reqs.pop(h, None)

    def _new(self, write: bool, peer: str, pairs: List[List[int]], notif: Union[str, bytes]) -> int:
        self._sweep()
        zero = next((at for at, p in enumerate(pairs) if p[2] == 0), None)
        if zero is not None:
            raise nixlInvalidParamError(f"descriptor {zero} has 0 bytes")
        msg = as_message(notif)
        h = self._handle()
        with self._lock:
            self._reqs[h] = _Request(write, peer, pairs, msg)
        return h

    def makeXferReq(
        self, op: Any, local: int, local_idx: Any, remote: int, remote_idx: Any,
        notif: Union[str, bytes] = b"", backends: Sequence[int] = (), skip_desc_merge: bool = False,
    ) -> int:
        write = _op(op)
        with self._lock:
            lside = self._dlists.get(int(local))
            rside = self._dlists.get(int(remote))
        if lside is None or rside is None or lside.agent != "" or rside.agent == "":
            raise nixlInvalidParamError("makeXferReq: invalid sides (local must be local, remote must be remote)")
        li = list(local_idx)
        ri = list(remote_idx)
        if len(li) != len(ri):
            raise nixlInvalidParamError(f"makeXferReq: different number of indices for local ({len(li)}), remote ({len(ri)})")
        lsel = _indices("local", li, lside.descs.descCount())
        rsel = _indices("remote", ri, rside.descs.descCount())
        la, ra = lside.descs.array()[lsel], rside.descs.array()[rsel]
        differ = np.flatnonzero(la[:, 1] != ra[:, 1])
        if differ.size:
            at = int(differ[0])
            raise nixlInvalidParamError(f"makeXferReq: length mismatch at index {at} ({int(la[at, 1])} and {int(ra[at, 1])} bytes)")
        pairs = np.stack([la[:, 0], ra[:, 0], la[:, 1]], axis=1).tolist()
        return self._new(write, rside.agent, pairs, notif)

    def createXferReq(
        self, op: Any, local: nixlXferDList, remote: nixlXferDList, agent: Union[str, bytes],
        notif: Union[str, bytes] = b"", backends: Sequence[int] = (),
    ) -> int:
        write = _op(op)
        peer = agent.decode() if isinstance(agent, bytes) else str(agent)
        if not isinstance(local, nixlXferDList) or not isinstance(remote, nixlXferDList):
            raise nixlInvalidParamError("createXferReq: two nixlXferDLists")
        if local.descCount() != remote.descCount():
            raise nixlInvalidParamError(
                f"createXferReq: different descriptor list sizes (local={local.descCount()}, remote={remote.descCount()})"
            )
        la, ra = local.array(), remote.array()
        differ = np.flatnonzero(la[:, 1] != ra[:, 1])
        if differ.size:
            at = int(differ[0])
            raise nixlInvalidParamError(f"createXferReq: length mismatch at index {at} ({int(la[at, 1])} and {int(ra[at, 1])} bytes)")
        pairs = np.stack([la[:, 0], ra[:, 0], la[:, 1]], axis=1).tolist()
        self._usable("createXferReq")
        self._known("createXferReq", peer)
        self._local_check("createXferReq", local)
        self._remote_check("createXferReq", peer, remote)
        return self._new(write, peer, pairs, notif)

    def _req(self, op: str, handle: int) -> _Request:
        with self._lock:
            r = self._reqs.get(int(handle))
        if r is None:
            raise nixlNotFoundError(f"{op}: no transfer request {int(handle):#x} (released?)")
        return r

    def postXferReq(self, handle: int, notif: Union[str, bytes] = b"") -> nixl_status_t:
        self._sweep()
        r = self._req("postXferReq", handle)
        msg = as_message(notif)
        if r.peer == self.name:
            self._known("postXferReq", r.peer)
        with r.lock:
            if r.released:
                raise nixlNotFoundError(f"postXferReq: no transfer request {int(handle):#x} (released)")
            if r.transfer is not None and not r.transfer.done:
                raise nixlRepostActiveError("postXferReq: the request's previous post is in flight")
            try:
                r.transfer = self._agent.transfer(r.batch(msg or r.notif))
            except Error as e:
                raise_from(e, "postXferReq")
        return self._status(r)

    def getXferStatus(self, handle: int) -> nixl_status_t:
        return self._status(self._req("getXferStatus", handle))

    @staticmethod
    def _status(r: _Request) -> nixl_status_t:
        t = r.transfer
        if t is None:
            raise nixlInvalidParamError("getXferStatus: the request was never posted")
        if not t.done:
            return nixl_status_t.NIXL_IN_PROG
        try:
            t.wait(0.0)
        except Error as e:
            raise_from(e, "transfer")
        return nixl_status_t.NIXL_SUCCESS

    def getXferTelemetry(self, handle: int) -> nixlXferTelemetry:
        if not self._telemetry:
            raise nixlNoTelemetryError("getXferTelemetry: telemetry is off (NIXL_TELEMETRY_ENABLE or capture_telemetry)")
        r = self._req("getXferTelemetry", handle)
        if r.transfer is None:
            raise nixlInvalidParamError("getXferTelemetry: the request was never posted")
        start, posted, finished = r.transfer.timing()
        return nixlXferTelemetry(start, posted, finished or 0, sum(r.lengths), len(r.lengths))

    def queryXferBackend(self, handle: int) -> int:
        self._req("queryXferBackend", handle)
        with self._lock:
            return min(self._backends)

    def estimateXferCost(self, handle: int) -> Tuple[int, int, int]:
        self._req("estimateXferCost", handle)
        return 0, 0, NIXL_COST_UNKNOWN

    def releaseXferReq(self, handle: int) -> nixl_status_t:
        """Forgets the request once its last post is done. One still in flight cannot be
        withdrawn from the NIC, so it is refused (the handle stays valid, as NIXL's when it
        cannot cancel): the caller keeps the memory until ``"DONE"``, then releases."""
        r = self._req("releaseXferReq", handle)
        with r.lock:
            if r.transfer is not None and not r.transfer.done:
                raise nixlNotAllowedError(
                    "releaseXferReq: the request's post is in flight and gpu_rdma cannot withdraw "
                    "it from the NIC: wait for DONE, then release it"
                )
            r.released = True
        with self._lock:
            self._reqs.pop(int(handle), None)
        return nixl_status_t.NIXL_SUCCESS
