"""Allocates a dma-buf from each source named on the command line (vgem, udmabuf, system,
heap:<name>) through libdmabuf_alloc.so with ctypes, fills it through Python's mmap inside a
DMA_BUF_IOCTL_SYNC bracket, and reads it back with the library's synced copy.

    LD_LIBRARY_PATH=target/debug python3 fill_and_check.py vgem udmabuf system
"""
import ctypes
import mmap
import os
import sys

lib = ctypes.CDLL("libdmabuf_alloc.so", use_errno=True)
lib.dmabuf_alloc_from.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)]
lib.dmabuf_alloc_read.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
lib.dmabuf_alloc_sync.argtypes = [ctypes.c_int, ctypes.c_uint64]
lib.dmabuf_alloc_error.restype = ctypes.c_char_p
SYNC_WRITE, SYNC_START, SYNC_END = 2, 0, 4


class DmaBufError(OSError):
    pass


def alloc(source, size):
    """A new dma-buf fd (the caller closes it) and its size."""
    out = ctypes.c_uint64()
    fd = lib.dmabuf_alloc_from(source.encode(), size, ctypes.byref(out))
    if fd < 0:
        raise DmaBufError(ctypes.get_errno(), lib.dmabuf_alloc_error().decode())
    return fd, out.value


def check(source):
    fd, size = alloc(source, 1 << 20)
    try:
        pattern = bytes((i * 13 + 5) & 0xFF for i in range(256)) * (size // 256)
        with mmap.mmap(fd, size) as m:
            lib.dmabuf_alloc_sync(fd, SYNC_START | SYNC_WRITE)
            m[:] = pattern
            lib.dmabuf_alloc_sync(fd, SYNC_END | SYNC_WRITE)
        back = ctypes.create_string_buffer(size)
        if lib.dmabuf_alloc_read(fd, 0, back, size) != 0:
            raise DmaBufError(ctypes.get_errno(), lib.dmabuf_alloc_error().decode())
        assert back.raw == pattern, f"{source}: the bytes read back differ"
    finally:
        os.close(fd)
    print(f"RESULT source={source} size={size} ok")


for s in sys.argv[1:]:
    check(s)
try:
    alloc("vgem", 0)
    sys.exit("size 0 was not refused")
except DmaBufError as e:
    print(f"ERROR size-0 errno={e.errno} {e.strerror}")
    assert e.errno == 22, e
