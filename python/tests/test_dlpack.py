"""Tensors exported with DLPack (`__dlpack__`) registered in place: a host tensor that is not
a buffer (as a torch CPU tensor is not) written by the NIC and read back from the tensor, the
capsule kept alive by the segment; strided, empty and foreign-device tensors refused, typed.
The tensors come from numpy's own DLPack export, and hand-made capsules for the devices this
machine has not (CUDA) or that gpu_rdma does not register (ROCm)."""

import ctypes
import gc
from typing import Any, Tuple

import numpy as np
import pytest

import gpu_rdma
from conftest import pattern

Pair = Tuple[gpu_rdma.Agent, gpu_rdma.Agent]
WAIT = 120.0


class DlpackOnly:
    """An array seen only through DLPack (no buffer protocol), as a torch tensor is."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.array.__dlpack__()

    def __dlpack_device__(self) -> Tuple[int, int]:
        return tuple(self.array.__dlpack_device__())  # type: ignore[return-value]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class HandMade:
    """A DLPack producer of one hand-made tensor (device type, shape), for what this machine
    cannot export: the capsule has no destructor, the structures live with the object."""

    def __init__(self, device_type: int, shape: Tuple[int, ...], name: bytes = b"dltensor") -> None:
        self.device_type = device_type
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.backing = ctypes.create_string_buffer(4096)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = ctypes.addressof(self.backing)
        t.device = DLDevice(device_type, 0)
        t.ndim = len(shape)
        t.dtype = DLDataType(1, 32, 1)  # float32
        t.shape = self.shape
        self.name = name

    def __dlpack__(self, stream: Any = None) -> Any:
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), self.name, None)

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (self.device_type, 0)


def test_a_host_tensor_seen_only_through_dlpack_is_written_in_place(pair: Pair) -> None:
    a, b = pair
    size = 96 << 10
    data = pattern(size, 21)
    src = bytearray(data)
    a.register("s", src)
    # A float32 tensor whose bytes start 12 bytes into numpy's allocation: any alignment.
    whole = np.zeros(size // 4 + 3, dtype=np.float32)
    view = whole[3:]
    tensor = DlpackOnly(view)
    assert b.register("d", tensor) == size
    with pytest.raises(TypeError):
        memoryview(tensor)  # type: ignore[arg-type]
    del tensor, view  # the segment keeps the capsule, and with it the memory
    gc.collect()
    a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size)).wait(WAIT)
    got = b.unregister("d")
    assert isinstance(got, DlpackOnly)
    assert whole[3:].tobytes() == data
    assert whole[:3].tobytes() == bytes(12)
    a.unregister("s")


def test_a_strided_tensor_is_refused(pair: Pair) -> None:
    _, b = pair
    grid = np.zeros((64, 64), dtype=np.uint8)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        b.register("d", DlpackOnly(grid[:, ::2]))
    assert "contiguous" in str(e.value)
    # Row slices of a C-contiguous array are one range: accepted.
    assert b.register("rows", DlpackOnly(grid[8:16])) == 8 * 64
    b.unregister("rows")


def test_an_empty_tensor_is_refused(pair: Pair) -> None:
    _, b = pair
    with pytest.raises(gpu_rdma.InvalidInput):
        b.register("d", HandMade(1, (4, 0)))


def test_a_consumed_capsule_is_refused(pair: Pair) -> None:
    _, b = pair
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        b.register("d", HandMade(1, (4,), name=b"used_dltensor"))
    assert "dltensor" in str(e.value)


def test_a_cuda_tensor_without_cuda_is_unsupported(pair: Pair) -> None:
    _, b = pair
    with pytest.raises(gpu_rdma.Unsupported):
        b.register("d", HandMade(2, (256,)))


def test_a_rocm_tensor_is_unsupported(pair: Pair) -> None:
    _, b = pair
    with pytest.raises(gpu_rdma.Unsupported) as e:
        b.register("d", HandMade(10, (256,)))
    assert "device type 10" in str(e.value)
    assert e.value.hint is not None


def test_a_failed_export_is_refused(pair: Pair) -> None:
    _, b = pair
    with pytest.raises(gpu_rdma.InvalidInput):
        # numpy refuses to export a read-only array (DLPack has no read-only flag).
        ro = np.zeros(4096, dtype=np.uint8)
        ro.flags.writeable = False
        b.register("d", DlpackOnly(ro))
