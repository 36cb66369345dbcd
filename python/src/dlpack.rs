//! DLPack (`__dlpack__` / `__dlpack_device__`): a tensor of any framework that exports one
//! (torch, JAX, CuPy, numpy), registered in place. The capsule (`"dltensor"`, the legacy
//! unversioned form every producer gives when `__dlpack__` is called without
//! `max_version`, or a DLPack 1.x `"dltensor_versioned"` one) is consumed as DLPack's
//! consumers consume it: renamed `used_dltensor` (`used_dltensor_versioned`), its
//! destructor removed, in one step no Python code can run inside, so that no other
//! consumer can take the tensor, and free it, while it is registered (a producer whose
//! `__dlpack__` returns the same capsule twice gives it to the first consumer only). The
//! tensor and its producer object are then held by a capsule of this module's own, which
//! calls the producer's deleter once, when the segment lets it go after the memory is
//! deregistered. Host tensors (CPU, CUDA-pinned and ROCm-pinned host memory) are
//! registered as host memory, CUDA tensors (and managed memory, where the driver exports
//! it) as CUDA ranges; others are refused, typed.

use crate::errors::{Class, Failure, Result};
use crate::sys::dlpack::{self as raw, Contents, Description, Dims, Form, NotTaken, Taken};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// Where a tensor's bytes are.
pub(crate) enum Place {
    /// Host memory the CPU and the NIC address directly.
    Host,
    /// CUDA device memory of GPU `ordinal`.
    Cuda(i32),
}

/// A DLPack tensor's bytes: one contiguous range, and what keeps it allocated (a capsule of
/// this module's own holding the consumed tensor and its producer object; the producer's
/// deleter runs when that capsule is destroyed).
pub(crate) struct Tensor {
    pub place: Place,
    pub addr: u64,
    pub len: u64,
    pub owner: PyObject,
}

/// A tensor this module took from its capsule: its producer's deleter is called once, when
/// `tensor` drops (with the GIL held, first), and the producer object is held until then.
struct Held {
    _tensor: Taken,
    _producer: PyObject,
}

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

/// `obj.__dlpack__()`'s tensor, as one range, consumed: the capsule is renamed
/// `used_dltensor` (`used_dltensor_versioned`) and its destructor removed before any Python
/// code can run again, so no other consumer can take the tensor (and free it) while a
/// segment is registered over it, even when `__dlpack__` gives the same capsule to both;
/// the returned owner calls the producer's deleter once, when dropped. Refused, the capsule
/// left as it was: a capsule named otherwise (one consumed already), a read-only or
/// unknown-version DLPack 1.x tensor, a strided (non-contiguous) or empty tensor, a device
/// gpu_rdma does not register.
pub(crate) fn tensor(obj: &Bound<'_, PyAny>) -> Result<Tensor> {
    let py = obj.py();
    let capsule = obj
        .call_method0("__dlpack__")
        .map_err(|e| refused(format!("the export failed: {e}")))?;
    // From here until the capsule is renamed, nothing runs Python code (nor releases the
    // GIL): the check of its name, the reading of its tensor and the taking of it are one
    // step for every other consumer (and `Offer::take` checks again that the capsule's name
    // and tensor are the ones read, refusing it otherwise).
    let capsule = capsule
        .downcast_into::<PyCapsule>()
        .map_err(|_| refused("it did not return a capsule".into()))?;
    let name = capsule
        .name()
        .map_err(|_| refused("a capsule whose name cannot be read".into()))?;
    let form = match name {
        Some(n) if n == Form::Legacy.name() => Form::Legacy,
        Some(n) if n == Form::Versioned.name() => Form::Versioned,
        Some(n) if n == Form::Legacy.used() || n == Form::Versioned.used() => {
            return Err(refused(format!(
                "a capsule named {n:?}: another consumer took this tensor already"
            ))
            .hinted("pass the tensor itself, and let no other consumer take its capsule"))
        }
        n => {
            return Err(refused(format!(
                "a capsule named {n:?}, not \"dltensor\" or \"dltensor_versioned\""
            )))
        }
    };
    let (offer, contents) =
        raw::read(&capsule, form).ok_or_else(|| refused("a capsule with no tensor".into()))?;
    let (place, addr, len) = match contents {
        Contents::Tensor(t) => range(&t)?,
        Contents::OtherMajor(major) => {
            return Err(Failure::new(
                Class::Unsupported,
                "register",
                format!("register: __dlpack__: a DLPack {major}.x tensor (gpu_rdma reads 1.x)"),
            ))
        }
        Contents::ReadOnly => {
            return Err(refused(
                "a read-only tensor: peers write segments, so a segment must be writable".into(),
            ))
        }
    };
    // Taken: from here the deleter is this module's to call, once (when `held` drops).
    let tensor = offer.take().map_err(|e| {
        refused(match e {
            NotTaken::Changed => "the capsule changed while it was read".into(),
            NotTaken::Destructor => "the capsule's destructor could not be changed".into(),
            NotTaken::Name => "the capsule's name could not be changed".into(),
        })
    })?;
    let held = Held {
        _tensor: tensor,
        _producer: obj.clone().unbind(),
    };
    let owner = PyCapsule::new_with_destructor(
        py,
        held,
        Some(c"gpu_rdma.dltensor".to_owned()),
        |held, _| drop(held),
    )
    .map_err(|e| refused(format!("holding the tensor: {e}")))?;
    Ok(Tensor {
        place,
        addr,
        len,
        owner: owner.into_any().unbind(),
    })
}

/// The place, address and byte length of a tensor, as read from its capsule; refused: a
/// device gpu_rdma does not register, a strided (non-contiguous) or empty tensor, elements
/// of less than a byte, an address of 0.
fn range(t: &Description) -> Result<(Place, u64, u64)> {
    let place = place(t.device_type, t.device_id)?;
    let (shape, strides) = match &t.dims {
        Dims::OutOfRange => return Err(refused(format!("{} dimensions", t.ndim))),
        Dims::NoShape => return Err(refused("no shape".into())),
        Dims::Read { shape, strides } => (shape.as_slice(), strides.as_deref()),
    };
    let ndim = shape.len();
    let bits = u64::from(t.bits) * u64::from(t.lanes);
    if bits == 0 || bits % 8 != 0 {
        return Err(refused(format!(
            "elements of {bits} bits (type code {}): not whole bytes",
            t.code
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
    let addr = t
        .data
        .checked_add(t.byte_offset)
        .filter(|&a| a != 0)
        .ok_or_else(|| refused("a tensor at address 0 or past the address space".into()))?;
    Ok((place, addr, len))
}
