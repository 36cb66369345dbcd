//! CUDA device memory the caller already has (a PyTorch tensor's `data_ptr()`, a slice of a
//! pool) as a dma-buf fd and the pointer's offset in it: `drm_export`'s
//! `CudaDevice::export_range`, for C and Python. libcuda is loaded at run time.

use crate::{call, Failure};
use drm_export::cuda::CudaDevice;
use std::ffi::c_int;
use std::os::fd::IntoRawFd;
use std::sync::{Arc, Mutex};

/// The devices opened so far, kept for the process's life (each holds its primary context
/// retained, as the CUDA runtime does).
static DEVICES: Mutex<Vec<(c_int, Arc<CudaDevice>)>> = Mutex::new(Vec::new());

fn device(ordinal: c_int) -> Result<Arc<CudaDevice>, Failure> {
    let mut open = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, d)) = open.iter().find(|(o, _)| *o == ordinal) {
        return Ok(d.clone());
    }
    let d = CudaDevice::open(ordinal)?;
    open.push((ordinal, d.clone()));
    Ok(d)
}

/// The dma-buf of the pages that hold `[ptr, ptr + len)` of CUDA device memory of GPU
/// `device`, and in `out_offset` the offset of `ptr` in it: registering `len` bytes at that
/// offset with `iova = ptr` reaches exactly the range.
///
/// # Safety
/// `out_offset` and `out_size` are each null or valid for a write of a `u64`.
#[no_mangle]
pub unsafe extern "C" fn dmabuf_alloc_cuda_range(
    device_ordinal: c_int,
    ptr: u64,
    len: u64,
    out_offset: *mut u64,
    out_size: *mut u64,
) -> c_int {
    call(|| {
        let range = device(device_ordinal)?.export_range(ptr, len)?;
        let drm_export::cuda::RangeParts {
            dmabuf: buf,
            offset,
            ..
        } = range.into_parts();
        if !out_offset.is_null() {
            // SAFETY: the caller's contract: non-null means valid for a write.
            unsafe { out_offset.write(offset) };
        }
        if !out_size.is_null() {
            // SAFETY: as above.
            unsafe { out_size.write(buf.size()) };
        }
        Ok(buf.into_fd().into_raw_fd())
    })
}
