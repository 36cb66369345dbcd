"""NIXL's memory types and descriptor lists: ``nixlXferDList`` (address, length, device)
and ``nixlRegDList`` (address, length, device, meta), plain Python values that pickle (NIXL's
examples send them to peers with ``get_serialized_descs``)."""

from __future__ import annotations

import enum
from typing import Any, Iterable, List, Optional, Tuple, Union

import numpy as np


class nixl_mem_t(enum.IntEnum):
    """NIXL's memory types. gpu_rdma moves DRAM (host memory) and VRAM (CUDA memory)."""

    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


#: The most blocks strided descriptors may expand to (a KV cache has millions).
MAX_EXPANDED = 1 << 28

#: The memory types the engine moves, as NIXL names them to its callers.
MOVABLE = (nixl_mem_t.DRAM_SEG, nixl_mem_t.VRAM_SEG)

XferDesc = Tuple[int, int, int]
RegDesc = Tuple[int, int, int, str]


def _u64(x: Any, what: str) -> int:
    # numpy integers are accepted, bools are not
    if isinstance(x, bool) or not hasattr(x, "__index__"):
        raise TypeError(f"{what} {x!r}: an integer")
    v = int(x.__index__())
    if not 0 <= v < 1 << 64:
        raise ValueError(f"{what} {v}: outside 0..2**64")
    return v


def _xfer(d: Any) -> XferDesc:
    if len(d) != 3:
        raise TypeError(f"descriptor {tuple(d)!r}: (address, length, device id)")
    return (_u64(d[0], "address"), _u64(d[1], "length"), _u64(d[2], "device id"))


def _reg(d: Any) -> RegDesc:
    if len(d) == 3:  # a row of an Nx3 array: no meta
        return _xfer(d) + ("",)
    if len(d) != 4:
        raise TypeError(f"descriptor {tuple(d)!r}: (address, length, device id, meta)")
    meta = d[3].decode() if isinstance(d[3], bytes) else str(d[3])
    return _xfer(d[:3]) + (meta,)


def _rows(a: Any, width: int) -> Any:
    """An Nx``width`` array of non-negative integers as uint64 (TypeError / ValueError
    otherwise)."""
    if a.ndim != 2 or a.shape[1] != width:
        raise TypeError(f"an array of shape {a.shape}: Nx{width} is needed")
    if a.dtype.kind not in "iu":
        raise TypeError(f"an array of {a.dtype}: integers are needed")
    if a.dtype.kind == "i" and a.size and int(a.min()) < 0:
        raise ValueError("an array with a negative address, length or device")
    return np.array(a, dtype=np.uint64)  # a copy: the caller's array may change later


def expand_strided(a: Any) -> Any:
    """NIXL 1.5's compressed descriptors, an Nx5 array of (address, length, device, stride,
    count) rows, as the Nx3 array of the ``count`` blocks of each row: ``length`` bytes at
    ``address + i * stride``. Vectorised: a KV cache has millions of blocks."""
    rows = _rows(np.asarray(a), 5)
    counts = rows[:, 4]
    total = int(counts.astype(object).sum())
    if total > MAX_EXPANDED:
        raise ValueError(f"strided descriptors of {total} blocks (at most {MAX_EXPANDED})")
    counts = counts.astype(np.int64)
    which = np.repeat(np.arange(len(rows)), counts)
    firsts = np.repeat(np.cumsum(counts) - counts, counts)
    nth = (np.arange(total, dtype=np.int64) - firsts).astype(np.uint64)
    out = np.empty((total, 3), dtype=np.uint64)
    out[:, 0] = rows[which, 0] + nth * rows[which, 3]
    out[:, 1] = rows[which, 1]
    out[:, 2] = rows[which, 2]
    return out


def first_outside(ranges: Iterable[Tuple[int, int]], descs: "_DList") -> Optional[int]:
    """The index of the first descriptor no range ``(base, length)`` holds whole (one that
    wraps the address space included), or None. O((n + m) log m), vectorised."""
    arr = descs.array()
    if len(arr) == 0:
        return None
    r = sorted(ranges)
    if not r:
        return 0
    spans = np.array(r, dtype=np.uint64).reshape(-1, 2)
    bases = spans[:, 0]
    # The furthest end of any range starting at or below each base: a descriptor is held
    # whole if the furthest end among the ranges starting at or below its address covers it.
    reach = np.maximum.accumulate(spans[:, 0] + spans[:, 1])
    addr, end = arr[:, 0], arr[:, 0] + arr[:, 1]
    i = np.searchsorted(bases, addr, side="right").astype(np.int64) - 1
    held = (i >= 0) & (end >= addr) & (reach[np.maximum(i, 0)] >= end)
    bad = np.flatnonzero(~held)
    return int(bad[0]) if bad.size else None


class _DList:
    """What both lists share: a memory type and descriptors in order."""

    _descs: List[Any]
    _width = 3

    def __init__(self, mem_type: Union[nixl_mem_t, int], descs: Optional[Iterable[Any]] = None) -> None:
        self._type = nixl_mem_t(int(mem_type))
        self._descs = []
        self._array: Any = None
        self._pending = False
        if isinstance(descs, np.ndarray):
            # Whole arrays at once, the tuples made only if asked for: a KV cache's list has
            # millions of blocks.
            self._array = _rows(descs, 3)
            self._pending = True
            return
        for d in descs if descs is not None else ():
            self.addDesc(d)

    def _items(self) -> List[Any]:
        """The descriptors as tuples (made from the array the list was built from, once)."""
        if self._pending:
            tail = ("",) if self._width == 4 else ()
            self._descs = [tuple(r) + tail for r in self._array.tolist()]
            self._pending = False
        return self._descs

    def array(self) -> Any:
        """The list as an Nx3 uint64 array (address, length, device), cached."""
        if self._array is None:
            self._array = np.array([d[:3] for d in self._items()], dtype=np.uint64).reshape(-1, 3)
        return self._array

    def addDesc(self, desc: Any) -> None:
        self._items().append(self._one(desc))
        self._array = None

    def append(self, desc: Any) -> None:
        self.addDesc(desc)

    def _one(self, desc: Any) -> Any:
        raise NotImplementedError

    def getType(self) -> nixl_mem_t:
        return self._type

    def descCount(self) -> int:
        return len(self._array) if self._pending else len(self._descs)

    def isEmpty(self) -> bool:
        return self.descCount() == 0

    def index(self, desc: Any) -> int:
        """The position of ``desc`` in the list, -1 when absent (NIXL's)."""
        try:
            return self._items().index(self._one(desc))
        except (ValueError, TypeError):
            return -1

    def remDesc(self, index: int) -> None:
        items = self._items()
        if not 0 <= index < len(items):
            raise IndexError(f"descriptor {index} of {len(items)}")
        del items[index]
        self._array = None

    def clear(self) -> None:
        self._items().clear()
        self._array = None

    def print(self) -> None:
        print(repr(self))

    def __getitem__(self, i: int) -> Any:
        if self._pending:
            tail = ("",) if self._width == 4 else ()
            return tuple(int(x) for x in self._array[i]) + tail
        return self._descs[i]

    def __iter__(self) -> Any:
        return iter(self._items())

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self._type == other._type  # type: ignore[attr-defined]
            and self._items() == other._items()  # type: ignore[attr-defined]
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._type.name}, {self._items()!r})"

    def __getstate__(self) -> Any:
        return {"_type": self._type, "_descs": self._items()}

    def __setstate__(self, state: Any) -> None:
        # Checked again: a pickle comes from elsewhere.
        self._type = nixl_mem_t(int(state["_type"]))
        self._descs = [self._one(d) for d in state["_descs"]]
        self._array = None
        self._pending = False

    # NIXL's lists have no length, so any list, even an empty one, is true: callers write
    # `if not descs:` to test for the None of a refused conversion.
    __hash__ = None  # type: ignore[assignment]


class nixlXferDList(_DList):
    """Transfer descriptors: ``(address, length, device id)`` each."""

    def _one(self, desc: Any) -> XferDesc:
        return _xfer(desc)


class nixlRegDList(_DList):
    """Registration descriptors: ``(address, length, device id, meta)`` each."""

    _width = 4

    def _one(self, desc: Any) -> RegDesc:
        return _reg(desc)

    def trim(self) -> nixlXferDList:
        """The same ranges as transfer descriptors (the meta dropped)."""
        if self._pending:
            return nixlXferDList(self._type, self._array)
        return nixlXferDList(self._type, [d[:3] for d in self._descs])


class nixlRemoteDList(nixlXferDList):
    """Transfer descriptors of a remote agent (NIXL's, for its partial metadata calls)."""
