/* The uapi headers drm-export's raw layer is generated from. */
#include <linux/types.h>
#include <linux/udmabuf.h>
#include <linux/dma-heap.h>
#include <linux/dma-buf.h>
#include <drm.h>
#include <i915_drm.h>
#include <amdgpu_drm.h>
