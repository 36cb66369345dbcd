//! CUDA memory named from Python: an object with `__cuda_array_interface__` (a torch or CuPy
//! tensor), its range and its GPU, and the GPU of `register_cuda`. The interface names no
//! GPU; DLPack's `__dlpack_device__()` does (`(kDLCUDA, id)`), so the GPU is its device id
//! where the object has one, and GPU 0 only where nothing says which.

use crate::errors::{cuda_name, Class, Failure, Result};
use pyo3::prelude::*;
use std::sync::Arc;

/// DLPack's `kDLCUDA`: CUDA device memory.
const KDL_CUDA: i32 = 2;
/// DLPack's `kDLCUDAManaged`: CUDA managed memory, of a GPU too.
const KDL_CUDA_MANAGED: i32 = 13;

/// GPU `ordinal`, opened with the GIL released; a failure names the device (`cuda:N`).
pub(crate) fn cuda_device(
    py: Python<'_>,
    op: &str,
    ordinal: i32,
) -> Result<Arc<drm_export::cuda::CudaDevice>> {
    py.allow_threads(|| drm_export::cuda::CudaDevice::open(ordinal))
        .map_err(|e| Failure::export(op, &e).with_device(cuda_name(ordinal)))
}

/// `obj.__dlpack_device__()` as `(device type, device id)`, or None without one. Refused,
/// typed, when it fails or returns something else than two ints.
fn dlpack_device(op: &str, obj: &Bound<'_, PyAny>) -> Result<Option<(i32, i32)>> {
    let Ok(method) = obj.getattr("__dlpack_device__") else {
        return Ok(None);
    };
    let refused = |why: String| {
        Failure::new(
            Class::InvalidInput,
            op,
            format!("{op}: __dlpack_device__: {why}"),
        )
    };
    let device = method
        .call0()
        .map_err(|e| refused(format!("the call failed: {e}")))?;
    let pair = device
        .extract::<(i32, i32)>()
        .map_err(|_| refused(format!("{device} is not (device type, device id)")))?;
    Ok(Some(pair))
}

/// The GPU of an object with `__cuda_array_interface__`: its `__dlpack_device__()`'s id
/// where that says CUDA (`kDLCUDA`, `kDLCUDAManaged`), GPU 0 without `__dlpack_device__`.
/// Refused, typed (`InvalidInput`), when `__dlpack_device__` names another device type: the
/// two interfaces disagree about where the memory is.
fn array_ordinal(op: &str, obj: &Bound<'_, PyAny>) -> Result<i32> {
    match dlpack_device(op, obj)? {
        None => Ok(0),
        Some((KDL_CUDA | KDL_CUDA_MANAGED, id)) => Ok(id),
        Some((t, id)) => Err(Failure::new(
            Class::InvalidInput,
            op,
            format!(
                "{op}: __cuda_array_interface__ names CUDA memory, but __dlpack_device__ says \
                 ({t}, {id}), DLPack device type {t}, not CUDA ({KDL_CUDA})"
            ),
        )),
    }
}

/// The GPU `register_cuda` registers on: `device` where given, else `owner`'s
/// `__dlpack_device__()`'s CUDA id, else GPU 0. Refused, typed (`InvalidInput`, naming the
/// device asked for), when `device` and the owner's CUDA device differ.
pub(crate) fn register_ordinal(
    owner: Option<&Bound<'_, PyAny>>,
    device: Option<i32>,
) -> Result<i32> {
    let op = "register_cuda";
    let owners = match owner {
        Some(o) => match dlpack_device(op, o)? {
            Some((KDL_CUDA | KDL_CUDA_MANAGED, id)) => Some(id),
            _ => None,
        },
        None => None,
    };
    match (device, owners) {
        (Some(d), Some(o)) if d != o => Err(Failure::new(
            Class::InvalidInput,
            op,
            format!(
                "{op}: device {d}, but the owner's __dlpack_device__ says its memory is on \
                 CUDA device {o}"
            ),
        )
        .hinted("pass the owner's device (or leave `device` out to take the owner's)")
        .with_device(cuda_name(d))),
        (Some(d), _) => Ok(d),
        (None, o) => Ok(o.unwrap_or(0)),
    }
}

/// The device pointer, byte length and GPU of an object with `__cuda_array_interface__` (a
/// CUDA tensor), or None without one; refused when it is not C-contiguous.
pub(crate) fn cuda_array(obj: &Bound<'_, PyAny>) -> Result<Option<(u64, u64, i32)>> {
    let Ok(iface) = obj.getattr("__cuda_array_interface__") else {
        return Ok(None);
    };
    let refused = |why: &str| {
        Failure::new(
            Class::InvalidInput,
            "register",
            format!("register: __cuda_array_interface__: {why}"),
        )
    };
    let get = |k: &str| iface.get_item(k).map_err(|_| refused(&format!("no {k:?}")));
    let ptr: u64 = get("data")?
        .get_item(0)
        .and_then(|p| p.extract())
        .map_err(|_| refused("data[0] is not a pointer"))?;
    let shape: Vec<u64> = get("shape")?
        .extract()
        .map_err(|_| refused("shape is not a tuple of sizes"))?;
    let typestr: String = get("typestr")?
        .extract()
        .map_err(|_| refused("typestr is not a string"))?;
    let strides = iface.get_item("strides").ok().filter(|s| !s.is_none());
    if strides.is_some() {
        return Err(refused(
            "strided arrays are not one range: pass a contiguous one",
        ));
    }
    let item: u64 = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| refused(&format!("typestr {typestr:?}")))?;
    let len = shape
        .iter()
        .try_fold(item, |n, d| n.checked_mul(*d))
        .ok_or_else(|| refused("a size past 2^64 bytes"))?;
    let ordinal = array_ordinal("register", obj)?;
    Ok(Some((ptr, len, ordinal)))
}
