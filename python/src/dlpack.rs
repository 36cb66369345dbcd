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
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

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

/// `DLManagedTensor`: the tensor, the producer's context and its deleter.
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
struct DlPackVersion {
    major: u32,
    minor: u32,
}

/// `DLManagedTensorVersioned` (DLPack 1.x): its version, context and deleter lead, at the
/// places DLPack keeps for every later major version; then the flags and the tensor.
#[repr(C)]
struct DlManagedTensorVersioned {
    version: DlPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DlTensor,
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the producer allows no writes to the tensor.
const FLAG_READ_ONLY: u64 = 1;

/// A capsule's names: the producer's, and the one a consumer gives it on taking the tensor.
const LEGACY: &CStr = c"dltensor";
const LEGACY_USED: &CStr = c"used_dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";
const VERSIONED_USED: &CStr = c"used_dltensor_versioned";

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

/// The managed tensor of a capsule this module consumed.
enum Managed {
    Legacy(NonNull<DlManagedTensor>),
    Versioned(NonNull<DlManagedTensorVersioned>),
}

/// A tensor this module took from its capsule: its producer's deleter is called once, when
/// this drops (with the GIL held), and the producer object is held until then.
struct Taken {
    managed: Managed,
    _producer: PyObject,
}

// SAFETY: the managed tensor is touched only to call its deleter, once, in `Drop`, which
// holds the GIL whichever thread it runs on (DLPack consumers such as numpy call deleters
// from any thread that holds the GIL). A `Taken` lives only inside a Python capsule, whose
// destructor runs with the GIL.
#[allow(unsafe_code)]
unsafe impl Send for Taken {}

impl Drop for Taken {
    #[allow(unsafe_code)] // the producer's deleter: see the SAFETY comments
    fn drop(&mut self) {
        Python::with_gil(|_| match self.managed {
            Managed::Legacy(m) => {
                // SAFETY: `m` is the DLManagedTensor of a capsule this module renamed
                // `used_dltensor` (so no other consumer took it, and the producer's capsule
                // destructor, removed too, does not free it): it stays valid until its
                // deleter runs, which happens only here, once.
                let deleter = unsafe { (*m.as_ptr()).deleter };
                if let Some(d) = deleter {
                    // SAFETY: DLPack's contract: the consumer calls the deleter once, with
                    // the managed tensor, when done; the segment over it is deregistered
                    // (this drops after the memory it was registered as).
                    unsafe { d(m.as_ptr()) }
                }
            }
            Managed::Versioned(m) => {
                // SAFETY: as above, for a capsule renamed `used_dltensor_versioned`.
                let deleter = unsafe { (*m.as_ptr()).deleter };
                if let Some(d) = deleter {
                    // SAFETY: as above.
                    unsafe { d(m.as_ptr()) }
                }
            }
        });
    }
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
    // GIL): the check of its name and the taking of its tensor are one step for every other
    // consumer.
    let capsule = capsule
        .downcast_into::<PyCapsule>()
        .map_err(|_| refused("it did not return a capsule".into()))?;
    let name = capsule
        .name()
        .map_err(|_| refused("a capsule whose name cannot be read".into()))?;
    let versioned = match name {
        Some(n) if n == LEGACY => false,
        Some(n) if n == VERSIONED => true,
        Some(n) if n == LEGACY_USED || n == VERSIONED_USED => {
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
    let (managed, range) = if versioned {
        let m = pointer(&capsule, VERSIONED)?.cast::<DlManagedTensorVersioned>();
        (Managed::Versioned(m), read_versioned(m)?)
    } else {
        let m = pointer(&capsule, LEGACY)?.cast::<DlManagedTensor>();
        (Managed::Legacy(m), read_legacy(m)?)
    };
    consume(
        &capsule,
        if versioned {
            VERSIONED_USED
        } else {
            LEGACY_USED
        },
    )?;
    // Taken: from here the deleter is this module's to call, once (when `taken` drops).
    let taken = Taken {
        managed,
        _producer: obj.clone().unbind(),
    };
    let owner = PyCapsule::new_with_destructor(
        py,
        taken,
        Some(c"gpu_rdma.dltensor".to_owned()),
        |taken, _| drop(taken),
    )
    .map_err(|e| refused(format!("holding the tensor: {e}")))?;
    let (place, addr, len) = range;
    Ok(Tensor {
        place,
        addr,
        len,
        owner: owner.into_any().unbind(),
    })
}

/// The capsule's pointer, checked against its expected name.
#[allow(unsafe_code)] // PyCapsule_GetPointer: see the SAFETY comment
fn pointer(capsule: &Bound<'_, PyCapsule>, name: &CStr) -> Result<NonNull<c_void>> {
    // SAFETY: `capsule` is a live capsule (a `Bound`: the GIL is held) and `name` a C string;
    // the call reads the capsule's name and pointer, and on a mismatch or a null pointer
    // sets a Python error and returns null.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr()) };
    NonNull::new(p).ok_or_else(|| {
        let _ = PyErr::take(capsule.py());
        refused("a capsule with no tensor".into())
    })
}

/// Takes the tensor from its capsule, as DLPack's consumers do: the capsule's destructor is
/// removed (so the producer's never frees the tensor, even one that does not check the
/// name) and the capsule renamed `used` (so no other consumer takes the tensor).
#[allow(unsafe_code)] // PyCapsule_SetDestructor, PyCapsule_SetName: see the SAFETY comments
fn consume(capsule: &Bound<'_, PyCapsule>, used: &'static CStr) -> Result<()> {
    let failed = |what: &str| {
        let _ = PyErr::take(capsule.py());
        refused(format!("the capsule's {what} could not be changed"))
    };
    // SAFETY: `capsule` is a live capsule (the GIL is held); a null destructor is allowed.
    // A failure (only for a non-capsule) changes nothing.
    if unsafe { ffi::PyCapsule_SetDestructor(capsule.as_ptr(), None) } != 0 {
        return Err(failed("destructor"));
    }
    // SAFETY: as above; `used` is a 'static C string, so the name the capsule keeps a
    // pointer to outlives it. (Were this to fail, the tensor would be leaked, never freed
    // twice: its capsule has no destructor any more.)
    if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), used.as_ptr()) } != 0 {
        return Err(failed("name"));
    }
    Ok(())
}

/// The range of a legacy (`"dltensor"`) capsule's tensor, its capsule held by the caller.
#[allow(unsafe_code)] // reads the producer's DLManagedTensor: see the SAFETY comment
fn read_legacy(m: NonNull<DlManagedTensor>) -> Result<(Place, u64, u64)> {
    // SAFETY: a "dltensor" capsule's pointer is a DLManagedTensor, which its producer keeps
    // valid until its deleter runs: not before a consumer took it (renamed the capsule) and
    // is done with it, or the unconsumed capsule is destroyed. The caller holds the
    // capsule, unconsumed, for this whole call, or consumed it itself.
    read(unsafe { &(*m.as_ptr()).dl_tensor })
}

/// The range of a DLPack 1.x (`"dltensor_versioned"`) capsule's tensor, its capsule held by
/// the caller; refused: another major version (whose layout past the deleter is unknown), a
/// read-only tensor (peers write segments).
#[allow(unsafe_code)] // reads the producer's DLManagedTensorVersioned: see the SAFETY comments
fn read_versioned(m: NonNull<DlManagedTensorVersioned>) -> Result<(Place, u64, u64)> {
    // SAFETY: as in `read_legacy`, for a DLManagedTensorVersioned; its version leads it in
    // every major version.
    let major = unsafe { (*m.as_ptr()).version.major };
    if major != 1 {
        return Err(Failure::new(
            Class::Unsupported,
            "register",
            format!("register: __dlpack__: a DLPack {major}.x tensor (gpu_rdma reads 1.x)"),
        ));
    }
    // SAFETY: as above; a 1.x tensor has this layout.
    let flags = unsafe { (*m.as_ptr()).flags };
    if flags & FLAG_READ_ONLY != 0 {
        return Err(refused(
            "a read-only tensor: peers write segments, so a segment must be writable".into(),
        ));
    }
    // SAFETY: as above.
    read(unsafe { &(*m.as_ptr()).dl_tensor })
}

/// The place, address and byte length of a tensor, valid for this call.
#[allow(unsafe_code)] // reads the tensor's shape and strides: see the SAFETY comments
fn read(t: &DlTensor) -> Result<(Place, u64, u64)> {
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
