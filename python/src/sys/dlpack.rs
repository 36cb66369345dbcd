//! DLPack capsules: the producer's structs (`DLManagedTensor`, `DLManagedTensorVersioned`),
//! what a capsule's tensor says, copied into plain Rust values ([`read`]), and the taking of
//! the tensor as DLPack's consumers take it ([`Offer::take`]): in one step that runs no
//! Python code, the capsule is checked (the producer's name, the tensor read), its
//! destructor removed and it is renamed `used_dltensor` (`used_dltensor_versioned`), so that
//! no other consumer can take the tensor, and free it, while it is held; the [`Taken`]
//! tensor's deleter runs once, with the GIL, when it drops.

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

/// The most dimensions read (DLPack sets no bound; no framework comes near it).
pub(crate) const MAX_DIMS: usize = 64;

/// A capsule's form: the legacy `"dltensor"` or DLPack 1.x's `"dltensor_versioned"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Form {
    /// `"dltensor"`: a `DLManagedTensor`.
    Legacy,
    /// `"dltensor_versioned"`: a `DLManagedTensorVersioned`.
    Versioned,
}

impl Form {
    /// The producer's name for a capsule of this form.
    pub(crate) fn name(self) -> &'static CStr {
        match self {
            Form::Legacy => c"dltensor",
            Form::Versioned => c"dltensor_versioned",
        }
    }

    /// The name a consumer gives the capsule on taking its tensor.
    pub(crate) fn used(self) -> &'static CStr {
        match self {
            Form::Legacy => c"used_dltensor",
            Form::Versioned => c"used_dltensor_versioned",
        }
    }
}

/// What a capsule's tensor says, as read.
pub(crate) enum Contents {
    /// A legacy tensor, or a writable DLPack 1.x one.
    Tensor(Description),
    /// A DLPack 1.x tensor flagged read-only (its `DLTensor` not read).
    ReadOnly,
    /// A tensor of another major version than 1 (nothing past its version read: the layout
    /// past the deleter is unknown).
    OtherMajor(u32),
}

/// A `DLTensor`'s fields, copied.
pub(crate) struct Description {
    /// `device.device_type`.
    pub device_type: i32,
    /// `device.device_id`.
    pub device_id: i32,
    /// `ndim`.
    pub ndim: i32,
    /// `shape` and `strides`, where `ndim` lets them be read.
    pub dims: Dims,
    /// `dtype.code`.
    pub code: u8,
    /// `dtype.bits`.
    pub bits: u8,
    /// `dtype.lanes`.
    pub lanes: u16,
    /// `data`, as an address.
    pub data: u64,
    /// `byte_offset`.
    pub byte_offset: u64,
}

/// A tensor's shape and strides, read only for a dimension count DLPack's arrays can have.
pub(crate) enum Dims {
    /// `ndim` is negative or past [`MAX_DIMS`]: neither array read.
    OutOfRange,
    /// `ndim` is positive and `shape` null.
    NoShape,
    /// The `ndim` sizes, and the `ndim` strides (in elements) unless `strides` is null (compact
    /// row-major) or the tensor has no dimension.
    Read {
        shape: Vec<i64>,
        strides: Option<Vec<i64>>,
    },
}

/// A capsule's tensor as [`read`] found it, not taken yet: the capsule, and which tensor it
/// held (compared again when taken).
pub(crate) struct Offer<'py> {
    capsule: Bound<'py, PyCapsule>,
    form: Form,
    managed: NonNull<c_void>,
}

/// Why [`Offer::take`] took nothing.
#[derive(Debug)]
pub(crate) enum NotTaken {
    /// The capsule's name or tensor is not the one read (nothing changed).
    Changed,
    /// Its destructor could not be removed (nothing changed).
    Destructor,
    /// It could not be renamed (its destructor is removed: the tensor is leaked, never freed
    /// twice).
    Name,
}

/// What the tensor of `capsule`, a capsule of `form` (named `form.name()`), says, and the
/// offer to take it; `None` (the Python error taken) for a capsule named otherwise or with no
/// tensor. Nothing is changed: until [`Offer::take`], the capsule is the producer's.
pub(crate) fn read<'py>(
    capsule: &Bound<'py, PyCapsule>,
    form: Form,
) -> Option<(Offer<'py>, Contents)> {
    // SAFETY: `capsule` is a live capsule (a `Bound`: the GIL is held) and `form.name()` a C
    // string; the call reads the capsule's name and pointer, and on a mismatch or a null
    // pointer sets a Python error and returns null.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), form.name().as_ptr()) };
    let Some(managed) = NonNull::new(p) else {
        let _ = PyErr::take(capsule.py());
        return None;
    };
    // The pointer of a capsule named "dltensor" ("dltensor_versioned") is a DLManagedTensor
    // (DLManagedTensorVersioned), which its producer keeps valid until its deleter runs: not
    // before a consumer took it (renamed the capsule) and is done with it, or the unconsumed
    // capsule is destroyed. `capsule` holds a reference to it, and nothing below runs Python
    // code (nor releases the GIL), so no consumer takes it while it is read.
    let t: &DlTensor = match form {
        Form::Legacy => {
            // SAFETY: the pointer is a valid DLManagedTensor, as above, for this call.
            unsafe { &(*managed.cast::<DlManagedTensor>().as_ptr()).dl_tensor }
        }
        Form::Versioned => {
            let m = managed.cast::<DlManagedTensorVersioned>().as_ptr();
            // SAFETY: `m` is a valid DLManagedTensorVersioned, as above, whose version leads
            // it in every major version.
            let major = unsafe { (*m).version.major };
            if major != 1 {
                return Some((offer(capsule, form, managed), Contents::OtherMajor(major)));
            }
            // SAFETY: as above; a 1.x tensor has this layout.
            let flags = unsafe { (*m).flags };
            if flags & FLAG_READ_ONLY != 0 {
                return Some((offer(capsule, form, managed), Contents::ReadOnly));
            }
            // SAFETY: as above.
            unsafe { &(*m).dl_tensor }
        }
    };
    let ndim = usize::try_from(t.ndim).ok().filter(|&n| n <= MAX_DIMS);
    let dims = match ndim {
        None => Dims::OutOfRange,
        Some(n) if n > 0 && t.shape.is_null() => Dims::NoShape,
        Some(0) => Dims::Read {
            shape: Vec::new(),
            strides: None,
        },
        Some(n) => Dims::Read {
            // SAFETY: DLPack's `shape` is an array of `ndim` int64 (non-null, checked above),
            // valid as long as the tensor is; it is copied here.
            shape: unsafe { std::slice::from_raw_parts(t.shape, n) }.to_vec(),
            strides: if t.strides.is_null() {
                None
            } else {
                // SAFETY: a non-null `strides` is an array of `ndim` int64, valid as long as
                // the tensor is (null means compact row-major); it is copied here.
                Some(unsafe { std::slice::from_raw_parts(t.strides, n) }.to_vec())
            },
        },
    };
    let description = Description {
        device_type: t.device.device_type,
        device_id: t.device.device_id,
        ndim: t.ndim,
        dims,
        code: t.dtype.code,
        bits: t.dtype.bits,
        lanes: t.dtype.lanes,
        data: t.data as u64,
        byte_offset: t.byte_offset,
    };
    Some((offer(capsule, form, managed), Contents::Tensor(description)))
}

fn offer<'py>(capsule: &Bound<'py, PyCapsule>, form: Form, managed: NonNull<c_void>) -> Offer<'py> {
    Offer {
        capsule: capsule.clone(),
        form,
        managed,
    }
}

impl Offer<'_> {
    /// Takes the tensor from its capsule, as DLPack's consumers do, in one step that runs no
    /// Python code: the capsule is checked to be named `form.name()` still and to hold the
    /// tensor read, its destructor is removed (so the producer's never frees the tensor,
    /// even one that does not check the name) and it is renamed `form.used()` (so no other
    /// consumer takes the tensor). From then on the tensor's deleter is the [`Taken`]'s to
    /// call, once.
    pub(crate) fn take(self) -> Result<Taken, NotTaken> {
        let (capsule, name) = (self.capsule.as_ptr(), self.form.name());
        let failed = |why| {
            let _ = PyErr::take(self.capsule.py());
            Err(why)
        };
        // SAFETY: `capsule` is a live capsule (held by `self.capsule`, a `Bound`: the GIL is
        // held) and `name` a C string; the call reads the capsule's name and pointer and sets
        // no Python error.
        if unsafe { ffi::PyCapsule_IsValid(capsule, name.as_ptr()) } != 1 {
            return failed(NotTaken::Changed);
        }
        // SAFETY: as above; the capsule is valid with this name, so the call returns its
        // (non-null) pointer and sets no error.
        let p = unsafe { ffi::PyCapsule_GetPointer(capsule, name.as_ptr()) };
        if p != self.managed.as_ptr() {
            return failed(NotTaken::Changed);
        }
        // SAFETY: as above; a null destructor is allowed. A failure (only for a non-capsule)
        // changes nothing.
        if unsafe { ffi::PyCapsule_SetDestructor(capsule, None) } != 0 {
            return failed(NotTaken::Destructor);
        }
        // SAFETY: as above; `used` is a 'static C string, so the name the capsule keeps a
        // pointer to outlives it. (Were this to fail, the tensor would be leaked, never freed
        // twice: its capsule has no destructor any more.)
        if unsafe { ffi::PyCapsule_SetName(capsule, self.form.used().as_ptr()) } != 0 {
            return failed(NotTaken::Name);
        }
        let managed = match self.form {
            Form::Legacy => Managed::Legacy(self.managed.cast()),
            Form::Versioned => Managed::Versioned(self.managed.cast()),
        };
        Ok(Taken { managed })
    }
}

/// The managed tensor of a capsule this module consumed.
enum Managed {
    Legacy(NonNull<DlManagedTensor>),
    Versioned(NonNull<DlManagedTensorVersioned>),
}

/// A tensor taken from its capsule (by [`Offer::take`] only): its producer's deleter is
/// called once, when this drops (with the GIL held), and may free the tensor's memory, so
/// whoever holds it keeps it until nothing uses that memory (the segment over it holds it
/// until it is deregistered, and a host tensor's `HostBuffer` holds it too).
pub(crate) struct Taken {
    managed: Managed,
}

// SAFETY: the managed tensor is touched only to call its deleter, once, in `Drop`, which
// holds the GIL whichever thread it runs on (DLPack consumers such as numpy call deleters
// from any thread that holds the GIL). A `Taken` lives only inside a Python capsule, whose
// destructor runs with the GIL.
unsafe impl Send for Taken {}

impl Drop for Taken {
    fn drop(&mut self) {
        Python::with_gil(|_| match self.managed {
            Managed::Legacy(m) => {
                // SAFETY: `m` is the DLManagedTensor of a capsule `Offer::take` renamed
                // `used_dltensor` (so no other consumer took it, and the producer's capsule
                // destructor, removed too, does not free it): it stays valid until its
                // deleter runs, which happens only here, once.
                let deleter = unsafe { (*m.as_ptr()).deleter };
                if let Some(d) = deleter {
                    // SAFETY: DLPack's contract: the consumer calls the deleter once, with
                    // the managed tensor, when done; this `Taken` is the consumer, and this
                    // drop its only call. (That nothing uses the memory any more is its
                    // holder's to keep: see `Taken`.)
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
