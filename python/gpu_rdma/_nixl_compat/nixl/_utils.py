"""``nixl._utils``: host memory by address, for tests and examples (C's ``malloc`` and
``free``)."""

from __future__ import annotations

import ctypes

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.restype = None
_libc.free.argtypes = [ctypes.c_void_p]


def malloc_passthru(size: int) -> int:
    """``size`` bytes of host memory; their address (MemoryError when there are none)."""
    addr = _libc.malloc(size)
    if not addr:
        raise MemoryError(f"malloc({size})")
    return int(addr)


def free_passthru(addr: int) -> None:
    """Frees what :func:`malloc_passthru` gave."""
    _libc.free(addr)


def ba_buf(size: int) -> int:
    """An address of ``size`` bytes (NIXL's older name of :func:`malloc_passthru`)."""
    return malloc_passthru(size)
