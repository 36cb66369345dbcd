"""Tensors exported with DLPack (`__dlpack__`) registered in place: a host tensor that is not
a buffer (as a torch CPU tensor is not) written by the NIC and read back from the tensor, the
tensor taken from its capsule and held by the segment; strided, empty and foreign-device
tensors refused, typed. The tensors come from numpy's own DLPack export, and hand-made
capsules for the devices this machine has not (CUDA) or that gpu_rdma does not register
(ROCm), and for DLPack 1.x's versioned form. A producer whose `__dlpack__` returns the same
capsule twice gives the tensor to the first consumer only, whichever it is: the engine
(another consumer is then refused, and cannot free the memory under the registration), or
another (the engine then refuses, typed)."""

import ctypes
import gc
import time
import weakref
from typing import Any, List, Optional, Tuple

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


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


def capsule_name(capsule: Any) -> Optional[bytes]:
    """A capsule's name, read through the C API."""
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype = ctypes.c_char_p
    get.argtypes = [ctypes.py_object]
    name: Optional[bytes] = get(capsule)
    return name


class SameCapsule:
    """A producer whose `__dlpack__` returns the same capsule every time, as a careless or
    hostile one can: the capsule of a numpy array that nothing else holds, so the array's
    memory is freed as soon as whoever takes the tensor calls its deleter."""

    def __init__(self, array: Any) -> None:
        self.capsule = array.__dlpack__()
        self.device: Tuple[int, int] = tuple(array.__dlpack_device__())  # type: ignore[assignment]

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device


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


class Counted(HandMade):
    """A hand-made host tensor of 1,024 float32 whose deleter counts its calls."""

    def __init__(self, shape: Tuple[int, ...] = (1024,)) -> None:
        super().__init__(1, shape)
        self.calls = 0
        self.callback = DELETER(self.deleted)
        self.managed.deleter = ctypes.cast(self.callback, ctypes.c_void_p).value

    def deleted(self, _managed: Optional[int]) -> None:
        self.calls += 1


class Versioned:
    """A hand-made DLPack 1.x (`"dltensor_versioned"`) host tensor of 1,024 float32, with
    `flags` and `major`, whose deleter counts its calls; it keeps the capsules it gave."""

    def __init__(self, flags: int = 0, major: int = 1) -> None:
        self.shape = (ctypes.c_int64 * 1)(1024)
        self.backing = ctypes.create_string_buffer(4096)
        self.managed = DLManagedTensorVersioned()
        self.managed.version = DLPackVersion(major, 0)
        self.managed.flags = flags
        t = self.managed.dl_tensor
        t.data = ctypes.addressof(self.backing)
        t.device = DLDevice(1, 0)
        t.ndim = 1
        t.dtype = DLDataType(2, 32, 1)  # float32
        t.shape = self.shape
        self.calls = 0
        self.callback = DELETER(self.deleted)
        self.managed.deleter = ctypes.cast(self.callback, ctypes.c_void_p).value
        self.given: List[Any] = []

    def deleted(self, _managed: Optional[int]) -> None:
        self.calls += 1

    def __dlpack__(self, stream: Any = None) -> Any:
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        capsule = new(ctypes.addressof(self.managed), b"dltensor_versioned", None)
        self.given.append(capsule)
        return capsule

    def __dlpack_device__(self) -> Tuple[int, int]:
        return (1, 0)


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


def test_a_capsule_returned_twice_goes_to_the_engine_and_no_other_consumer(pair: Pair) -> None:
    """The engine takes the tensor first: the capsule is renamed `used_dltensor`, so numpy's
    `from_dlpack` of the same producer is refused and cannot free the memory (which a peer
    then writes) under the registration; the engine frees it once, when unregistered."""
    a, b = pair
    size = 64 << 10
    array = np.zeros(size, dtype=np.uint8)
    alive = weakref.ref(array)
    producer = SameCapsule(array)
    del array  # the capsule's tensor alone holds the array now
    gc.collect()
    assert alive() is not None
    assert b.register("d", producer) == size
    assert capsule_name(producer.capsule) == b"used_dltensor"
    with pytest.raises(ValueError):
        np.from_dlpack(producer)  # numpy finds the capsule taken
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        b.register("again", producer)
    assert "used_dltensor" in str(e.value)
    gc.collect()
    assert alive() is not None, "the registered tensor was freed"
    # A peer's write lands in the producer's array, not in memory reused by another.
    data = pattern(size, 33)
    a.register("s", bytearray(data))
    fresh = [np.zeros(size, dtype=np.uint8) for _ in range(4)]
    a.transfer(gpu_rdma.Batch().write("s", 0, "b", "d", 0, size)).wait(WAIT)
    held = alive()
    assert held is not None and held.tobytes() == data
    del held
    assert all(not f.any() for f in fresh)
    assert b.unregister("d") is producer
    gc.collect()
    assert alive() is None, "unregister let the tensor go (the producer's deleter ran)"
    a.unregister("s")


def test_a_capsule_returned_twice_taken_by_another_consumer_is_refused(pair: Pair) -> None:
    """Another consumer (numpy) takes the tensor first: the engine refuses the capsule it
    renamed `used_dltensor`, typed, and registers nothing; numpy's array is unharmed."""
    _, b = pair
    size = 4096
    array = (np.arange(size) % 251).astype(np.uint8)
    expected = array.tobytes()
    producer = SameCapsule(array)
    del array
    taken = np.from_dlpack(producer)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        b.register("d", producer)
    assert "used_dltensor" in str(e.value)
    assert "another consumer" in str(e.value)
    assert b.segments() == []
    gc.collect()
    assert taken.tobytes() == expected


def test_the_engine_calls_a_taken_tensors_deleter_once(pair: Pair) -> None:
    """The deleter of a tensor the engine took runs exactly once, after the memory is
    deregistered (unregister, or the agent's close); a refused tensor is not taken."""
    a, b = pair
    t = Counted()
    assert b.register("d", t) == 4096
    assert t.calls == 0
    assert b.unregister("d") is t
    gc.collect()
    assert t.calls == 1
    refused = Counted((4, 0))
    with pytest.raises(gpu_rdma.InvalidInput):
        b.register("e", refused)
    gc.collect()
    assert refused.calls == 0, "a refused tensor was taken"
    closing = Counted()
    a.register("c", closing)
    assert closing.calls == 0
    a.close()
    for _ in range(200):
        gc.collect()
        if closing.calls:
            break
        time.sleep(0.05)
    assert closing.calls == 1


def test_a_versioned_tensor_is_taken_and_a_read_only_one_refused(pair: Pair) -> None:
    _, b = pair
    t = Versioned()
    assert b.register("d", t) == 4096
    assert capsule_name(t.given[-1]) == b"used_dltensor_versioned"
    assert b.unregister("d") is t
    gc.collect()
    assert t.calls == 1
    # DLPACK_FLAG_BITMASK_READ_ONLY: peers write segments.
    ro = Versioned(flags=1)
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        b.register("ro", ro)
    assert "read-only" in str(e.value)
    assert capsule_name(ro.given[-1]) == b"dltensor_versioned", "a refused capsule was taken"
    with pytest.raises(gpu_rdma.Unsupported):
        b.register("v2", Versioned(major=2))
    gc.collect()
    assert ro.calls == 0
    assert b.segments() == []
