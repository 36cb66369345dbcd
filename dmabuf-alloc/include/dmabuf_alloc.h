/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * dmabuf_alloc.h: dma-buf file descriptors from software exporters, for C and Python tests
 * of dma-buf consumers (ibv_reg_dmabuf_mr, DRM PRIME import, ...) on machines without a GPU.
 *
 * Link with -ldmabuf_alloc (libdmabuf_alloc.so, built by `cargo build -p dmabuf-alloc`).
 *
 * Conventions:
 *  - Every allocator returns a new dma-buf fd (O_RDWR | O_CLOEXEC) that the caller owns and
 *    closes with close(2); the buffer lives until its last fd, mapping and importer let go.
 *    The size is rounded up to a multiple of the page size; *out_size (if not NULL) receives
 *    the dma-buf's real size, which is what a mapping or an MR may cover.
 *  - On failure a function returns -1 and sets errno (EINVAL: bad argument; ENOENT: no such
 *    exporter, e.g. vgem not loaded; EACCES: no permission on the device; ENOMEM; EBADF;
 *    EBUSY: the fd is being read or written by another thread of this process; ...).
 *    dmabuf_alloc_error() then returns a message naming the operation, the device and a hint.
 *  - All functions are thread-safe.
 */
#ifndef DMABUF_ALLOC_H
#define DMABUF_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A vgem dumb buffer (shmem pages), exported with PRIME: a GEM object of a DRM driver, as a
 * GPU buffer is. Needs the vgem module and access to its card node (/dev/dri/cardN). */
int dmabuf_alloc_vgem(uint64_t size, uint64_t *out_size);

/* A sealed memfd's pages exported through /dev/udmabuf (host memory as a dma-buf). */
int dmabuf_alloc_udmabuf(uint64_t size, uint64_t *out_size);

/* A buffer of the dma-heap /dev/dma_heap/<heap>; heap NULL means "system". */
int dmabuf_alloc_heap(const char *heap, uint64_t size, uint64_t *out_size);

/* One of the above by name: "vgem", "udmabuf", "system", or "heap:<name>". */
int dmabuf_alloc_from(const char *source, uint64_t size, uint64_t *out_size);

/* CUDA device memory the program already has, e.g. a PyTorch tensor's data_ptr(): the
 * dma-buf of the pages holding [ptr, ptr + len), anywhere inside a cuMemAlloc, pool
 * (cuMemAllocAsync) or cuMemCreate + cuMemMap allocation of GPU `device`, also across the
 * seams of a virtual range mapped from several physical allocations (PyTorch's expandable
 * segments), exported with cuMemGetHandleForAddressRange. *out_offset (if not NULL)
 * receives the offset of ptr in the dma-buf: ibv_reg_dmabuf_mr(pd, offset, len, ptr, fd,
 * access) registers exactly the range, at iova = ptr. libcuda.so.1 is loaded at run time
 * (the environment variable DRM_EXPORT_LIBCUDA names another library). Errors: EOPNOTSUPP
 * without libcuda or without dma-buf support (NVIDIA's open kernel modules, CUDA 11.7+);
 * EINVAL for host, managed, freed or another GPU's memory, a range past its allocation or
 * into a neighbouring allocation (the message says which). NVIDIA's dma-bufs have no CPU
 * mapping: dmabuf_alloc_read/_write on them fail with errno 524 (ENOTSUPP). */
int dmabuf_alloc_cuda_range(int device, uint64_t ptr, uint64_t len, uint64_t *out_offset,
                            uint64_t *out_size);

/* The dma-buf's size in bytes; 0 on success, -1 with errno (EINVAL: not a dma-buf). */
int dmabuf_alloc_size(int fd, uint64_t *out_size);

/* Copies len bytes from src into the buffer at offset, through a mapping of the dma-buf
 * bracketed by DMA_BUF_IOCTL_SYNC (START|RW ... END|RW). 0 on success, -1 with errno. */
int dmabuf_alloc_write(int fd, uint64_t offset, const void *src, size_t len);

/* Copies len bytes at offset of the buffer into dst, through a mapping bracketed by
 * DMA_BUF_IOCTL_SYNC (START|READ ... END|READ). 0 on success, -1 with errno. */
int dmabuf_alloc_read(int fd, uint64_t offset, void *dst, size_t len);

/* For callers that mmap(2) the dma-buf fd themselves: bracket each CPU access with
 * dmabuf_alloc_sync(fd, DMABUF_ALLOC_SYNC_START | access) and
 * dmabuf_alloc_sync(fd, DMABUF_ALLOC_SYNC_END | access), access being READ, WRITE or RW.
 * Retries on EINTR/EAGAIN. 0 on success, -1 with errno. */
#define DMABUF_ALLOC_SYNC_READ  (1u << 0)
#define DMABUF_ALLOC_SYNC_WRITE (2u << 0)
#define DMABUF_ALLOC_SYNC_RW    (DMABUF_ALLOC_SYNC_READ | DMABUF_ALLOC_SYNC_WRITE)
#define DMABUF_ALLOC_SYNC_START (0u << 2)
#define DMABUF_ALLOC_SYNC_END   (1u << 2)
int dmabuf_alloc_sync(int fd, uint64_t flags);

/* The CPU page size: sizes are rounded up to it, and an MR's iova and offset in the dma-buf
 * must agree modulo it. */
uint64_t dmabuf_alloc_page_size(void);

/* The message of this thread's last failure ("" if none); valid until this thread's next
 * call into the library. */
const char *dmabuf_alloc_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DMABUF_ALLOC_H */
