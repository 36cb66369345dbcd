/*
 * A stand-in for the few CUDA driver entry points drm-export calls, for the testbed, which
 * has no GPU. It exercises drm-export's code, not NVIDIA's driver: results obtained with it
 * say nothing about a real GPU.
 *
 * "Device memory" is host memory: each allocation is one sealed memfd per segment, mapped
 * into this process (the host view, read and written by the standin_* helpers), and exported
 * with udmabuf, so that its dma-bufs are real ones that the kernel's RDMA stack can register.
 * Device addresses are numbers in a range of their own that nothing maps; an address freed
 * is handed out again by the next allocation that fits (as the CUDA driver does), and every
 * allocation gets a new buffer id.
 *
 * Besides device memory it makes allocations that report themselves as host memory and as
 * managed memory, and allocations mapped from several physical segments (as with cuMemMap),
 * so that the callers' checks can be tested. Allocations and mappings are reported as NVIDIA's
 * driver reported them on an H200 (driver 580): cuMemGetAddressRange gives each mapped segment
 * as an allocation of its own, and an allocation of one segment lies in a mapping of whole
 * 2 MiB blocks; cuMemRetainAllocationHandle succeeds for the allocations of several
 * segments only (the cuMemMap'd ones), and cuMemGetHandleForAddressRange exports a
 * page-aligned range inside one allocation, across its segments too, as NVIDIA's driver does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    NOT_FOUND = 500,
    NOT_SUPPORTED = 801,
};

enum kind { DEVICE = 0, HOST = 1, MANAGED = 2 };

#define MAX_ALLOCS 1024
#define MAX_SEGS 8
#define BASE 0x200000000ULL
#define ALIGN (2ULL << 20)

struct alloc {
    int live;
    enum kind kind;
    CUdeviceptr base;
    size_t size;
    size_t seg_size; /* size of each segment; == size for one segment */
    int nsegs;
    int memfd[MAX_SEGS];
    unsigned char *view;
    unsigned long long buffer_id;
};

static struct alloc allocs[MAX_ALLOCS];
static CUdeviceptr next_addr = BASE;
static unsigned long long next_id = 1;
static int initialised;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int ctx_token;
static __thread void *current;

static size_t page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* The live allocation holding p; lock held. */
static struct alloc *find(CUdeviceptr p)
{
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].live && p >= allocs[i].base && p - allocs[i].base < allocs[i].size)
            return &allocs[i];
    return 0;
}

/* A base for size bytes: the lowest freed base whose range is free and fits, or a new one. */
static CUdeviceptr place(size_t size)
{
    for (CUdeviceptr at = BASE; at < next_addr; at += ALIGN) {
        int clash = 0;
        for (int i = 0; i < MAX_ALLOCS && !clash; i++)
            if (allocs[i].live && at < allocs[i].base + allocs[i].size
                && allocs[i].base < at + size)
                clash = 1;
        if (!clash && at + size <= next_addr)
            return at;
    }
    CUdeviceptr at = next_addr;
    next_addr += (size + ALIGN - 1) / ALIGN * ALIGN;
    return at;
}

static CUresult make(CUdeviceptr *out, size_t size, int nsegs, enum kind kind)
{
    if (!out || size == 0 || nsegs < 1 || nsegs > MAX_SEGS)
        return INVALID_VALUE;
    size_t pg = page();
    size_t seg = (size + pg - 1) / pg * pg;
    if (nsegs > 1 && size % ((size_t)nsegs * pg))
        return INVALID_VALUE;
    if (nsegs > 1)
        seg = size / nsegs;
    size_t total = seg * nsegs;
    pthread_mutex_lock(&lock);
    struct alloc *a = 0;
    for (int i = 0; i < MAX_ALLOCS && !a; i++)
        if (!allocs[i].live)
            a = &allocs[i];
    if (!a) {
        pthread_mutex_unlock(&lock);
        return OUT_OF_MEMORY;
    }
    memset(a, 0, sizeof *a);
    unsigned char *view = mmap(0, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (view == MAP_FAILED) {
        pthread_mutex_unlock(&lock);
        return OUT_OF_MEMORY;
    }
    for (int s = 0; s < nsegs; s++) {
        int fd = memfd_create("cuda-standin", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, (off_t)seg) || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)
            || mmap(view + s * seg, seg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
                   == MAP_FAILED) {
            if (fd >= 0)
                close(fd);
            for (int t = 0; t < s; t++)
                close(a->memfd[t]);
            munmap(view, total);
            pthread_mutex_unlock(&lock);
            return OUT_OF_MEMORY;
        }
        a->memfd[s] = fd;
    }
    a->live = 1;
    a->kind = kind;
    /* As NVIDIA's driver reports it: the size asked for, not the whole pages behind it. */
    a->size = nsegs > 1 ? total : size;
    a->seg_size = seg;
    a->nsegs = nsegs;
    a->view = view;
    a->base = place(total);
    a->buffer_id = next_id++;
    *out = a->base;
    pthread_mutex_unlock(&lock);
    return OK;
}

CUresult cuInit(unsigned flags)
{
    if (flags)
        return INVALID_VALUE;
    initialised = 1;
    return OK;
}

CUresult cuDeviceGet(int *dev, int ordinal)
{
    if (!initialised)
        return NOT_INITIALIZED;
    if (ordinal != 0)
        return INVALID_DEVICE;
    *dev = 0;
    return OK;
}

CUresult cuDeviceGetAttribute(int *v, int attr, int dev)
{
    if (dev != 0)
        return INVALID_DEVICE;
    *v = attr == 124; /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED */
    return OK;
}

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (dev != 0)
        return INVALID_DEVICE;
    *ctx = &ctx_token;
    return OK;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return dev == 0 ? OK : INVALID_DEVICE; }

CUresult cuCtxSetCurrent(void *ctx)
{
    if (ctx && ctx != &ctx_token)
        return INVALID_CONTEXT;
    current = ctx;
    return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    if (!current)
        return INVALID_CONTEXT;
    return make(p, size, 1, DEVICE);
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    if (!a || a->base != p) {
        pthread_mutex_unlock(&lock);
        return INVALID_VALUE;
    }
    for (int s = 0; s < a->nsegs; s++)
        close(a->memfd[s]);
    munmap(a->view, a->seg_size * (size_t)a->nsegs);
    a->live = 0;
    pthread_mutex_unlock(&lock);
    return OK;
}

/* The host address of [p, p + n), all inside one live allocation, or 0. */
static unsigned char *host(CUdeviceptr p, size_t n)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    unsigned char *h = 0;
    if (a && n <= a->size - (p - a->base))
        h = a->view + (p - a->base);
    pthread_mutex_unlock(&lock);
    return h;
}

CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n)
{
    unsigned char *h = host(p, n);
    if (!h)
        return INVALID_VALUE;
    memset(h, v, n);
    return OK;
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    unsigned char *h = host(src, n);
    if (!h)
        return INVALID_VALUE;
    memcpy(dst, h, n);
    return OK;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    unsigned char *h = host(dst, n);
    if (!h)
        return INVALID_VALUE;
    memcpy(h, src, n);
    return OK;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    if (a) {
        /* As NVIDIA's driver does: each mapped segment is an allocation of its own. */
        size_t seg = (p - a->base) / a->seg_size;
        if (base)
            *base = a->nsegs > 1 ? a->base + seg * a->seg_size : a->base;
        if (size)
            *size = a->nsegs > 1 ? a->seg_size : a->size;
    }
    pthread_mutex_unlock(&lock);
    return a ? OK : NOT_FOUND;
}

CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    CUresult r = OK;
    if (!a) {
        r = INVALID_VALUE;
    } else {
        size_t seg = (p - a->base) / a->seg_size;
        switch (attr) {
        case 2: /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE: CU_MEMORYTYPE_HOST 1, _DEVICE 2 */
            *(unsigned *)data = a->kind == HOST ? 1 : 2;
            break;
        case 7: /* CU_POINTER_ATTRIBUTE_BUFFER_ID: as on NVIDIA's driver, each mapped
                 * segment has an id of its own, never given to another */
            *(unsigned long long *)data = a->buffer_id * MAX_SEGS + seg;
            break;
        case 8: /* CU_POINTER_ATTRIBUTE_IS_MANAGED */
            *(unsigned *)data = a->kind == MANAGED;
            break;
        case 9: /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */
            *(int *)data = 0;
            break;
        case 11: /* CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: the reserved range, as NVIDIA's
                  * driver reports it for cuMemMap'd memory (an allocation of several
                  * segments is one reserved range) */
            *(CUdeviceptr *)data = a->base;
            break;
        case 12: /* CU_POINTER_ATTRIBUTE_RANGE_SIZE */
            *(size_t *)data = a->size;
            break;
        case 18: /* CU_POINTER_ATTRIBUTE_MAPPING_SIZE */
            /* As NVIDIA's driver does, an allocation of one segment is inside a mapping of
             * whole 2 MiB blocks; a segment of several is its own mapping. */
            *(size_t *)data = a->nsegs > 1 ? a->seg_size : (a->size + ALIGN - 1) / ALIGN * ALIGN;
            break;
        case 19: /* CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR */
            *(CUdeviceptr *)data = a->base + seg * a->seg_size;
            break;
        default:
            r = INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t size, int type,
                                       unsigned long long flags)
{
    size_t pg = page();
    if (type != 1 || flags || size == 0 || p % pg || size % pg)
        return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p);
    CUresult r = INVALID_VALUE;
    if (a && a->kind == DEVICE && size <= a->size - (p - a->base)) {
        /* One udmabuf over the part of each segment the range covers: NVIDIA's driver, too,
         * exports a range across the mappings of a cuMemMap'd virtual range as one dma-buf. */
        size_t off = p - a->base;
        size_t first = off / a->seg_size, last = (off + size - 1) / a->seg_size;
        struct {
            struct udmabuf_create_list head;
            struct udmabuf_create_item items[MAX_SEGS];
        } c = {.head = {.flags = UDMABUF_FLAGS_CLOEXEC, .count = (unsigned)(last - first + 1)}};
        for (size_t s = first; s <= last; s++) {
            size_t from = s == first ? off - s * a->seg_size : 0;
            size_t to = s == last ? off + size - s * a->seg_size : a->seg_size;
            c.items[s - first] = (struct udmabuf_create_item){
                .memfd = (unsigned)a->memfd[s],
                .offset = from,
                .size = to - from,
            };
        }
        int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
        int fd = dev < 0 ? -1 : ioctl(dev, UDMABUF_CREATE_LIST, &c);
        if (dev >= 0)
            close(dev);
        if (fd >= 0) {
            *(int *)handle = fd;
            r = OK;
        } else {
            r = NOT_SUPPORTED;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* Succeeds only for memory mapped with cuMemMap: here, the allocations of several segments. */
CUresult cuMemRetainAllocationHandle(unsigned long long *handle, void *addr)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find((CUdeviceptr)addr);
    CUresult r = a && a->nsegs > 1 ? OK : INVALID_VALUE;
    if (r == OK)
        *handle = (unsigned long long)(a - allocs) + 1;
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemRelease(unsigned long long handle)
{
    return handle >= 1 && handle <= MAX_ALLOCS ? OK : INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult r, const char **s)
{
    switch (r) {
    case OK: *s = "CUDA_SUCCESS"; return OK;
    case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
    case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
    case NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; return OK;
    case INVALID_DEVICE: *s = "CUDA_ERROR_INVALID_DEVICE"; return OK;
    case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; return OK;
    case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
    case NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; return OK;
    default: *s = 0; return INVALID_VALUE;
    }
}

/* Test helpers, not CUDA's. */

/* An allocation of `size` bytes in `nsegs` equal segments (as cuMemMap of several
 * physical allocations into one reserved range), of kind 0 device, 1 host, 2 managed. */
CUresult standin_alloc(CUdeviceptr *p, size_t size, int nsegs, int kind)
{
    if (kind < DEVICE || kind > MANAGED)
        return INVALID_VALUE;
    return make(p, size, nsegs, (enum kind)kind);
}

/* Copies n bytes of the host view from p into dst; 0 on success. */
int standin_read(CUdeviceptr p, void *dst, size_t n) { return cuMemcpyDtoH_v2(dst, p, n); }

/* Copies n bytes from src into the host view at p; 0 on success. */
int standin_write(CUdeviceptr p, const void *src, size_t n) { return cuMemcpyHtoD_v2(p, src, n); }
