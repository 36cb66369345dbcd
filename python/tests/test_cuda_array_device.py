"""The GPU of a CUDA array (`__cuda_array_interface__`, which names none) comes from its
`__dlpack_device__()` where it has one (`(kDLCUDA, id)`: GPU `id`), and is GPU 0 only where
nothing says which; an object whose two interfaces disagree, or a `register_cuda` whose
`device` differs from its owner's, is refused, typed. No GPU needed: the arrays are fakes,
and the GPU chosen is read from the error's `device` (`cuda:N`), whichever error opening or
registering on that GPU gives (the testbed has no CUDA at all)."""

from typing import Any, Dict, Tuple

import pytest

import gpu_rdma

Pair = Tuple[gpu_rdma.Agent, gpu_rdma.Agent]
KDL_CPU, KDL_CUDA = 1, 2
PTR, SIZE = 0x7F00_0000_0000, 4096


class CudaArray:
    """A contiguous CUDA array as torch and CuPy describe one, with no `__dlpack_device__`."""

    def __init__(self) -> None:
        self.__cuda_array_interface__: Dict[str, Any] = {
            "data": (PTR, False),
            "shape": (SIZE // 4,),
            "typestr": "<f4",
            "strides": None,
            "version": 3,
        }


class CudaArrayOn(CudaArray):
    """The same, whose `__dlpack_device__()` says where it is."""

    def __init__(self, device: Tuple[int, int]) -> None:
        super().__init__()
        self.device = device

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device


class BrokenDevice(CudaArray):
    """An array whose `__dlpack_device__()` fails."""

    def __dlpack_device__(self) -> Tuple[int, int]:
        raise RuntimeError("no device")


def gpu_tried(a: gpu_rdma.Agent, call: Any) -> str:
    """The GPU a registration that cannot succeed here chose (its error's `device`)."""
    with pytest.raises(gpu_rdma.Error) as e:
        call()
    assert a.segments() == []
    assert e.value.device is not None, repr(e.value)
    return e.value.device


def test_the_dlpack_device_chooses_the_gpu(pair: Pair) -> None:
    a, _ = pair
    assert gpu_tried(a, lambda: a.register("t", CudaArrayOn((KDL_CUDA, 1)))) == "cuda:1"
    assert gpu_tried(a, lambda: a.register("t", CudaArrayOn((KDL_CUDA, 3)))) == "cuda:3"


def test_without_a_dlpack_device_the_gpu_is_0(pair: Pair) -> None:
    a, _ = pair
    assert gpu_tried(a, lambda: a.register("t", CudaArray())) == "cuda:0"


def test_interfaces_that_disagree_are_refused(pair: Pair) -> None:
    a, _ = pair
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        a.register("t", CudaArrayOn((KDL_CPU, 0)))
    assert "__dlpack_device__" in str(e.value) and "(1, 0)" in str(e.value)
    assert (e.value.kind, e.value.operation) == ("InvalidInput", "register")
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        a.register("t", BrokenDevice())
    assert "no device" in str(e.value)
    assert a.segments() == []


def test_register_cuda_takes_the_owners_gpu_and_refuses_another(pair: Pair) -> None:
    a, _ = pair
    owner = CudaArrayOn((KDL_CUDA, 1))
    assert gpu_tried(a, lambda: a.register_cuda("t", PTR, SIZE, owner=owner)) == "cuda:1"
    assert gpu_tried(a, lambda: a.register_cuda("t", PTR, SIZE, device=1, owner=owner)) == "cuda:1"
    assert gpu_tried(a, lambda: a.register_cuda("t", PTR, SIZE)) == "cuda:0"
    with pytest.raises(gpu_rdma.InvalidInput) as e:
        a.register_cuda("t", PTR, SIZE, device=0, owner=owner)
    v = e.value
    assert (v.kind, v.operation, v.device) == ("InvalidInput", "register_cuda", "cuda:0")
    assert "CUDA device 1" in str(v) and v.hint is not None and "owner's device" in v.hint
    assert a.segments() == []
