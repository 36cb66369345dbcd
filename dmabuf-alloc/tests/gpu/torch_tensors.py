"""PyTorch tensors' GPU memory as dma-bufs, through libdmabuf_alloc's dmabuf_alloc_cuda_range.

Needs an NVIDIA GPU with dma-buf support (open kernel modules) and torch; not run by the
testbed (no GPU there: tests/tests/cuda/cuda_from_c.rs runs the same call against a stand-in).

    python3 torch_tensors.py path/to/libdmabuf_alloc.so

Run it once with the default caching allocator and once with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (tensors larger than a segment are mapped
from several physical allocations). For each tensor (and a slice of it) it prints one RESULT
line: the offset and the dma-buf's size, or the errno and message of a refusal. It checks
that every tensor exports, the offset being the pointer's offset in its page and the dma-buf
covering exactly the pages of the range; exit status 1 otherwise.
"""

import ctypes
import os
import sys

import torch

PAGE = os.sysconf("SC_PAGE_SIZE")

lib = ctypes.CDLL(sys.argv[1], use_errno=True)
lib.dmabuf_alloc_cuda_range.argtypes = [
    ctypes.c_int,
    ctypes.c_uint64,
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ctypes.c_uint64),
]
lib.dmabuf_alloc_error.restype = ctypes.c_char_p

conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")


def export(ptr, length):
    """(offset, dma-buf size) or (errno, message)."""
    offset, size = ctypes.c_uint64(), ctypes.c_uint64()
    fd = lib.dmabuf_alloc_cuda_range(0, ptr, length, ctypes.byref(offset), ctypes.byref(size))
    if fd < 0:
        return None, (ctypes.get_errno(), lib.dmabuf_alloc_error().decode())
    os.close(fd)
    return (offset.value, size.value), None


failures = 0
keep = []  # every tensor stays allocated, so the allocator packs the next ones around it
for n in [100, 4096 + 7, 1 << 20, 3 << 20, 25 << 20, 100 << 20, 600 << 20]:
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    keep.append(t)
    for what, ptr, length in [("whole", t.data_ptr(), n), ("slice", t[13:].data_ptr(), n - 113)]:
        if length <= 0:
            continue
        got, err = export(ptr, length)
        if got:
            offset, size = got
            first = ptr - ptr % PAGE
            end = -(-(ptr + length) // PAGE) * PAGE
            ok = offset == ptr - first and size == end - first
            failures += not ok
            print(f"RESULT alloc={conf} tensor={n} {what} ptr={ptr:#x}: "
                  f"{'ok' if ok else 'WRONG'} offset={offset} dmabuf={size}")
        else:
            failures += 1
            print(f"RESULT alloc={conf} tensor={n} {what} ptr={ptr:#x}: refused errno={err[0]} {err[1]}")
print(f"DONE alloc={conf} failures={failures}")
sys.exit(1 if failures else 0)
