"""NIXL's status codes and exceptions, and how gpu_rdma's typed errors map onto them.

Each exception is raised as NIXL raises it (the class a NIXL caller catches), with the
engine's reason kept: ``str(e)`` starts with NIXL's status name and goes on with our
message, and ``e.reason`` is the :class:`gpu_rdma.Error` behind it (``kind``,
``operation``, ``hint``), or None for a refusal of this module.
"""

from __future__ import annotations

import enum
from typing import Dict, NoReturn, Optional, Type

from gpu_rdma import Error


class nixl_status_t(enum.IntEnum):
    """NIXL's statuses (``nixl_types.h``): 0 and 1 are not errors."""

    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11
    NIXL_ERR_NO_TELEMETRY = -12


class _NixlError(Exception):
    """A NIXL error: ``status`` is its NIXL status, ``reason`` the engine's typed error."""

    status = nixl_status_t.NIXL_ERR_UNKNOWN

    def __init__(self, why: str = "", reason: Optional[Error] = None) -> None:
        name = self.status.name
        super().__init__(f"{name}: {why}" if why else name)
        self.reason = reason


class nixlNotPostedError(_NixlError):
    status = nixl_status_t.NIXL_ERR_NOT_POSTED


class nixlInvalidParamError(_NixlError):
    status = nixl_status_t.NIXL_ERR_INVALID_PARAM


class nixlBackendError(_NixlError):
    status = nixl_status_t.NIXL_ERR_BACKEND


class nixlNotFoundError(_NixlError):
    status = nixl_status_t.NIXL_ERR_NOT_FOUND


class nixlMismatchError(_NixlError):
    status = nixl_status_t.NIXL_ERR_MISMATCH


class nixlNotAllowedError(_NixlError):
    status = nixl_status_t.NIXL_ERR_NOT_ALLOWED


class nixlRepostActiveError(_NixlError):
    status = nixl_status_t.NIXL_ERR_REPOST_ACTIVE


class nixlUnknownError(_NixlError):
    status = nixl_status_t.NIXL_ERR_UNKNOWN


class nixlNotSupportedError(_NixlError):
    status = nixl_status_t.NIXL_ERR_NOT_SUPPORTED


class nixlRemoteDisconnectError(_NixlError):
    status = nixl_status_t.NIXL_ERR_REMOTE_DISCONNECT


class nixlCancelledError(_NixlError):
    status = nixl_status_t.NIXL_ERR_CANCELED


class nixlNoTelemetryError(_NixlError):
    status = nixl_status_t.NIXL_ERR_NO_TELEMETRY


#: The NIXL exception for each gpu_rdma error class, by its name, or for an error of the
#: base class, by its ``kind`` (the error's class hierarchy is looked at first).
_BY_KIND: Dict[str, Type[_NixlError]] = {
    "NotFound": nixlNotFoundError,
    "InvalidInput": nixlInvalidParamError,
    "Unsupported": nixlNotSupportedError,
    "PeerLost": nixlRemoteDisconnectError,
    "Busy": nixlNotAllowedError,
    "Unauthenticated": nixlNotAllowedError,
    "Incompatible": nixlMismatchError,
    "Timeout": nixlBackendError,
    "LimitReached": nixlBackendError,
}


def raise_from(e: Error, why: str = "") -> NoReturn:
    """Raises the NIXL exception for engine error ``e``, which it keeps as its reason."""
    names = [c.__name__ for c in type(e).__mro__] + [str(getattr(e, "kind", ""))]
    for name in names:
        mapped = _BY_KIND.get(name)
        if mapped is not None:
            raise mapped(f"{why}: {e}" if why else str(e), e) from e
    raise nixlBackendError(f"{why}: {e}" if why else str(e), e) from e
