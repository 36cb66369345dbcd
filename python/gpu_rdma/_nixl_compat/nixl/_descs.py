"""NIXL's memory types and descriptor lists: ``nixlXferDList`` (address, length, device)
and ``nixlRegDList`` (address, length, device, meta), plain Python values that pickle (NIXL's
examples send them to peers with ``get_serialized_descs``)."""

from __future__ import annotations

import enum
from typing import Any, Iterable, List, Optional, Tuple, Union


class nixl_mem_t(enum.IntEnum):
    """NIXL's memory types. gpu_rdma moves DRAM (host memory) and VRAM (CUDA memory)."""

    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


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


class _DList:
    """What both lists share: a memory type and descriptors in order."""

    _descs: List[Any]

    def __init__(self, mem_type: Union[nixl_mem_t, int], descs: Optional[Iterable[Any]] = None) -> None:
        self._type = nixl_mem_t(int(mem_type))
        self._descs = []
        for d in descs if descs is not None else ():
            self.addDesc(d)

    def addDesc(self, desc: Any) -> None:
        self._descs.append(self._one(desc))

    def append(self, desc: Any) -> None:
        self.addDesc(desc)

    def _one(self, desc: Any) -> Any:
        raise NotImplementedError

    def getType(self) -> nixl_mem_t:
        return self._type

    def descCount(self) -> int:
        return len(self._descs)

    def isEmpty(self) -> bool:
        return not self._descs

    def index(self, desc: Any) -> int:
        """The position of ``desc`` in the list, -1 when absent (NIXL's)."""
        try:
            return self._descs.index(self._one(desc))
        except (ValueError, TypeError):
            return -1

    def remDesc(self, index: int) -> None:
        if not 0 <= index < len(self._descs):
            raise IndexError(f"descriptor {index} of {len(self._descs)}")
        del self._descs[index]

    def clear(self) -> None:
        self._descs.clear()

    def print(self) -> None:
        print(repr(self))

    def __getitem__(self, i: int) -> Any:
        return self._descs[i]

    def __iter__(self) -> Any:
        return iter(self._descs)

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self._type == other._type  # type: ignore[attr-defined]
            and self._descs == other._descs  # type: ignore[attr-defined]
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._type.name}, {self._descs!r})"

    # NIXL's lists have no length, so any list, even an empty one, is true: callers write
    # `if not descs:` to test for the None of a refused conversion.
    __hash__ = None  # type: ignore[assignment]


class nixlXferDList(_DList):
    """Transfer descriptors: ``(address, length, device id)`` each."""

    def _one(self, desc: Any) -> XferDesc:
        return _xfer(desc)


class nixlRegDList(_DList):
    """Registration descriptors: ``(address, length, device id, meta)`` each."""

    def _one(self, desc: Any) -> RegDesc:
        return _reg(desc)

    def trim(self) -> nixlXferDList:
        """The same ranges as transfer descriptors (the meta dropped)."""
        return nixlXferDList(self._type, [d[:3] for d in self._descs])


class nixlRemoteDList(nixlXferDList):
    """Transfer descriptors of a remote agent (NIXL's, for its partial metadata calls)."""
