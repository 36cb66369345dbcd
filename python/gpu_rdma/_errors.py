"""gpu_rdma's exceptions: one base, :class:`Error`, and a subclass for each failure a caller
handles. The classes are made once, when the package is imported; the extension module
raises them with the Rust error's own fields as attributes (docs/python.md, "Errors").

Every instance has ``kind`` (a stable name: ``"NotFound"``, ``"PeerDown"``,
``"RemoteAccess"``, ``"TimedOut"``, ...), ``operation`` (what was attempted), ``hint`` (what
to check, or None; ``str(e)`` does not repeat it), ``errno`` (the OS error number, or None,
as ``OSError.errno``: ``errno.errorcode[e.errno]`` names it) and ``strerror`` (its text), and
``agent``, ``segment``, ``device`` (an RDMA device's name, or ``"cuda:N"``) and ``fd`` where
the error names one (None elsewhere). :class:`Timeout` is a ``TimeoutError`` and
:class:`PeerLost` a ``ConnectionError`` too (both ``OSError``), so ``except TimeoutError``
catches a bounded wait's end.
"""

import os
from typing import Any, ClassVar, Dict, Optional, Tuple, Type

# The attributes set from the Rust error, besides the message.
_FIELDS = ("kind", "operation", "hint", "errno", "agent", "segment", "device", "fd")


class Error(Exception):
    """Every error of gpu_rdma: ``kind``, ``operation``, ``hint``, ``errno``, ``strerror``,
    ``agent``, ``segment``, ``device``, ``fd`` (see the module's documentation)."""

    #: The kind of an instance made without one.
    _default_kind: ClassVar[str] = "Other"

    kind: str
    operation: str
    hint: Optional[str]
    errno: Optional[int]
    strerror: Optional[str]
    agent: Optional[str]
    segment: Optional[str]
    device: Optional[str]
    fd: Optional[int]

    def __init__(
        self,
        message: str = "",
        *,
        kind: Optional[str] = None,
        operation: str = "",
        hint: Optional[str] = None,
        errno: Optional[int] = None,
        agent: Optional[str] = None,
        segment: Optional[str] = None,
        device: Optional[str] = None,
        fd: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind if kind is not None else self._default_kind
        self.operation = operation
        self.hint = hint
        self.errno = errno
        self.strerror = os.strerror(errno) if errno is not None else None
        self.agent = agent
        self.segment = segment
        self.device = device
        self.fd = fd

    def __str__(self) -> str:
        # The message alone (an OSError's own would print "[Errno N] strerror" instead).
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> Tuple[Any, ...]:
        fields: Dict[str, Any] = {f: getattr(self, f) for f in _FIELDS}
        return (_rebuild, (type(self), str(self), fields))


def _rebuild(cls: Type[Error], message: str, fields: Dict[str, Any]) -> Error:
    """An unpickled error: its class, message and fields as they were."""
    return cls(message, **fields)


class Unsupported(Error):
    """The device, driver, kernel or build cannot do it (no RDMA device, no CUDA, memory the
    engine cannot register)."""

    _default_kind = "Unsupported"


class InvalidInput(Error):
    """The request was refused before anything was posted: fix it (a range past a segment, a
    closed fd, a name taken, a read-only buffer)."""

    _default_kind = "InvalidInput"


# The ignores: this mypy's typeshed types OSError.errno and .strerror as int and str, which
# are None in CPython for an OSError made without an errno, as here where the Rust error has
# none (newer typeshed says `int | None`, as Error does).
class PeerLost(Error, ConnectionError):  # type: ignore[misc]
    """The peer is down, restarted, unreachable, or refused the access: its entries failed.
    A ``ConnectionError`` too."""

    _default_kind = "PeerDown"


class Timeout(Error, TimeoutError):  # type: ignore[misc]
    """A bounded wait ended before what it waited for. A ``TimeoutError`` too."""

    _default_kind = "TimedOut"


class NotFound(Error):
    """An agent or segment the metadata service does not know (yet, or any more)."""

    _default_kind = "NotFound"


class Busy(Error):
    """A segment is still used by an unfinished transfer: wait for it and try again."""

    _default_kind = "Busy"


class Unauthenticated(Error):
    """Authentication failed: a peer without the cluster's key or certificate, one this
    agent's key or certificate does not convince, or an etcd value written by someone who is
    not an agent of the cluster (docs/engine.md, "Security")."""

    _default_kind = "Unauthenticated"


class LimitReached(Error):
    """A peer refused a request at one of its limits (connections, queue pairs,
    notifications queued and not taken): retry later or with less."""

    _default_kind = "LimitReached"


class Closed(Error):
    """The agent was closed (``close()``, or the end of its ``with`` block): every method but
    ``close`` refuses; create a new Agent."""

    _default_kind = "Closed"


#: The classes, in the order the extension module knows them (python/src/errors.rs).
CLASSES: Tuple[Type[Error], ...] = (
    Error,
    Unsupported,
    InvalidInput,
    PeerLost,
    Timeout,
    NotFound,
    Busy,
    Unauthenticated,
    LimitReached,
    Closed,
)

for _cls in CLASSES:
    # Shown, and pickled, as the package's own (gpu_rdma.Timeout).
    _cls.__module__ = "gpu_rdma"
