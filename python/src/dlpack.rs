//! DLPack (`__dlpack__` / `__dlpack_device__`): a tensor of any framework that exports one
//! (torch, JAX, CuPy, numpy), registered in place. The capsule (`"dltensor"`, the legacy
//! unversioned form every producer gives when `__dlpack__` is called without
//! `max_version`) is held, not consumed, for the segment's life: its producer frees the
//! tensor only when an unconsumed capsule is destroyed, so the memory stays allocated until
//! the segment is unregistered. Host tensors (CPU, CUDA-pinned and ROCm-pinned host memory)
//! are registered as host memory, CUDA tensors (and managed memory, where the driver
//! exports it) as CUDA ranges; others are refused, typed.

use crate::errors::{Class, Failure, Result};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::c_void;

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (its leading tensor only: the context and deleter are the producer's).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
}

/// Where a tensor's bytes are.
pub(crate) enum Place {
    /// Host memory the CPU and the NIC address directly.
    Host,
    /// CUDA device memory of GPU `ordinal`.
    Cuda(i32),
}

/// A DLPack tensor's bytes: one contiguous range, and the capsule that keeps it allocated.
pub(crate) struct Tensor {
    pub place: Place,
    pub addr: u64,
    pub len: u64,
    pub capsule: PyObject,
}

/// The most dimensions read (DLPack sets no bound; no framework comes near it).
const MAX_DIMS: usize = 64;

fn refused(why: String) -> Failure {
    Failure::new(
        Class::InvalidInput,
        "register",
        format!("register: __dlpack__: {why}"),
    )
}

/// The device types of host memory (`kDLCPU`, `kDLCUDAHost`, `kDLROCMHost`) and of CUDA
/// memory (`kDLCUDA`, `kDLCUDAManaged`).
fn place(device_type: i32, device_id: i32) -> Result<Place> {
    match device_type {
        1 | 3 | 11 => Ok(Place::Host),
        2 | 13 => Ok(Place::Cuda(device_id)),
        t => Err(Failure::new(
            Class::Unsupported,
            "register",
            format!("register: __dlpack__: a tensor on DLPack device type {t}"),
        )
        .hinted("gpu_rdma registers host (CPU) and CUDA tensors; copy it to one of those")),
    }
}

/// `obj.__dlpack__()`'s tensor, as one range. Refused: a capsule already consumed, a
/// strided (non-contiguous) or empty tensor, a device gpu_rdma does not register.
pub(crate) fn tensor(obj: &Bound<'_, PyAny>) -> Result<Tensor> {
    let capsule = obj
        .call_method0("__dlpack__")
        .map_err(|e| refused(format!("the export failed: {e}")))?;
    let capsule = capsule
        .downcast_into::<PyCapsule>()
        .map_err(|_| refused("it did not return a capsule".into()))?;
    match capsule.name() {
        Ok(Some(n)) if n == c"dltensor" => {}
        Ok(n) => return Err(refused(format!("a capsule named {n:?}, not \"dltensor\""))),
        Err(e) => return Err(refused(e.to_string())),
    }
    let (place, addr, len) = read(&capsule)?;
    Ok(Tensor {
        place,
        addr,
        len,
        capsule: capsule.into_any().unbind(),
    })
}

/// The place, address and byte length of the tensor in a `"dltensor"` capsule held by the
/// caller (so its producer keeps the tensor alive meanwhile).
#[allow(unsafe_code)] // reads the producer's DLManagedTensor: see the SAFETY comments
fn read(capsule: &Bound<'_, PyCapsule>) -> Result<(Place, u64, u64)> {
    let managed = capsule.pointer() as *const DlManagedTensor;
    if managed.is_null() {
        return Err(refused("a capsule with no tensor".into()));
    }
    // SAFETY: a "dltensor" capsule's pointer is a DLManagedTensor, which its producer keeps
    // valid until its deleter runs: only once a consumer renames the capsule (we do not)
    // and is done with it, or when the unconsumed capsule is destroyed; `capsule` is held
    // by the caller for this whole call. Its first member is the DLTensor read here.
    let t = unsafe { &(*managed).dl_tensor };
    let place = place(t.device.device_type, t.device.device_id)?;
    let ndim = usize::try_from(t.ndim)
        .ok()
        .filter(|&n| n <= MAX_DIMS)
        .ok_or_else(|| refused(format!("{} dimensions", t.ndim)))?;
    if ndim > 0 && t.shape.is_null() {
        return Err(refused("no shape".into()));
    }
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: DLPack's `shape` is an array of `ndim` int64 (non-null, checked above),
        // valid as long as the tensor is.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let strides: Option<&[i64]> = if t.strides.is_null() || ndim == 0 {
        None
    } else {
        // SAFETY: a non-null `strides` is an array of `ndim` int64, valid as long as the
        // tensor is (null means compact row-major).
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) })
    };
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
    if bits == 0 || bits % 8 != 0 {
        return Err(refused(format!(
            "elements of {bits} bits (type code {}): not whole bytes",
            t.dtype.code
        )));
    }
    let mut len = bits / 8;
    // Row-major contiguity: each dimension's stride (in elements) is the product of the
    // later dimensions' sizes; a dimension of size 1 may carry any stride.
    let mut expected: i64 = 1;
    for d in (0..ndim).rev() {
        let n = shape[d];
        if n <= 0 {
            return Err(refused(format!("an empty tensor (shape {shape:?})")));
        }
        if let Some(s) = strides {
            if n > 1 && s[d] != expected {
                return Err(refused(format!(
                    "strides {s:?} for shape {shape:?}: not one contiguous range"
                ))
                .hinted("pass a contiguous tensor (.contiguous(), numpy.ascontiguousarray)"));
            }
        }
        expected = expected.saturating_mul(n);
        len = len
            .checked_mul(n as u64)
            .ok_or_else(|| refused("a size past 2^64 bytes".into()))?;
    }
    let addr = (t.data as u64)
        .checked_add(t.byte_offset)
        .filter(|&a| a != 0)
        .ok_or_else(|| refused("a tensor at address 0 or past the address space".into()))?;
    Ok((place, addr, len))
}
