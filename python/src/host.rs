//! Host memory from Python: the pinning of buffer-protocol objects (a `bytearray`, a numpy
//! array, a `memoryview`, an `mmap`) registered in place, without a copy, as
//! `HostBuffer::from_foreign` over the pinned bytes; and `HostMemory`, page-aligned memory
//! a udmabuf can export (a sealed memfd mapped into the process), for segments that are
//! dma-bufs.
//!
//! A buffer is pinned through the C buffer protocol alone (`PyObject_GetBuffer` on the
//! object itself, writable and C-contiguous): the address and length come from the
//! `Py_buffer` the object's type filled in, never from a Python-level function (`ctypes`,
//! `memoryview`) that Python code could rebind to name other memory.

use crate::errors::{Class, Failure, Result};
use crate::sys::buffer::{BufferExport, Request};
use drm_export::{DmaBuf, MemfdPages, Udmabuf};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use rdma_dmabuf::HostBuffer;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// Page-aligned host memory that segments can be made of without a copy: a sealed memfd,
/// mapped shared (`buffer`, an `mmap.mmap`), exported as a udmabuf when registered.
/// `numpy.frombuffer(mem.buffer, dtype)` views it; registering the `HostMemory`, or any
/// page-aligned, whole-pages, C-contiguous view of it, makes a segment of those pages.
#[pyclass(module = "gpu_rdma", name = "HostMemory")]
pub(crate) struct HostMemory {
    memfd: Arc<OwnedFd>,
    size: u64,
    base: usize,
    mapping: PyObject,
}

/// Writable bytes of a Python object, held: for a buffer-protocol object, a capsule of this
/// module's own holding the object's buffer export (a `Py_buffer`, released when the capsule
/// is destroyed), so a `bytearray` cannot be resized nor its memory freed while the pin is
/// held; for a DLPack tensor, a capsule of this module's own holding the consumed tensor
/// (its producer's deleter runs when that capsule is destroyed). No Python code can reach
/// either capsule: they are held only here and by the segment.
pub(crate) struct Pin {
    /// What keeps the bytes allocated (released when the pin drops; without the GIL, pyo3
    /// defers that to the next time a thread holds it).
    pub _holder: PyObject,
    pub addr: usize,
    pub len: usize,
}

fn refused(why: String) -> Failure {
    Failure::new(Class::InvalidInput, "register", format!("register: {why}"))
        .hinted("pass a writable, C-contiguous buffer (numpy array, bytearray, memoryview)")
}

/// Whether `obj` has the buffer protocol (its type exports a buffer, as for `memoryview`).
pub(crate) fn is_buffer(obj: &Bound<'_, PyAny>) -> bool {
    BufferExport::get(obj, Request::Any).is_ok()
}

/// Pins `obj`'s bytes (a writable, C-contiguous buffer) through the C buffer protocol:
/// the export is held by the pin, the address and length are the export's own.
pub(crate) fn pin(obj: &Bound<'_, PyAny>) -> Result<Pin> {
    let py = obj.py();
    let export = BufferExport::get(obj, Request::WritableCContiguous).map_err(|e| {
        // Tell a read-only buffer apart: peers write segments, so it cannot be one.
        match BufferExport::get(obj, Request::Any) {
            Ok(ro) if ro.readonly() => refused(format!(
                "a read-only buffer ({}): peers write segments, so a segment must be writable",
                type_name(obj)
            )),
            Ok(_) => refused(format!(
                "a writable, C-contiguous buffer is needed ({}): {e}",
                type_name(obj)
            )),
            Err(_) => refused(format!("not a buffer ({}): {e}", type_name(obj))),
        }
    })?;
    if export.readonly() {
        return Err(refused(format!(
            "a read-only buffer ({}): peers write segments, so a segment must be writable",
            type_name(obj)
        )));
    }
    if export.has_suboffsets() || !export.c_contiguous(py) {
        return Err(refused(format!(
            "a buffer that is not one C-contiguous range ({})",
            type_name(obj)
        )));
    }
    let len = usize::try_from(export.byte_len())
        .map_err(|_| refused(format!("a buffer of length {}", export.byte_len())))?;
    if len == 0 {
        return Err(refused("an empty buffer".into()));
    }
    let addr = export.addr();
    let holder = PyCapsule::new_with_destructor(
        py,
        export,
        Some(c"gpu_rdma.buffer_export".to_owned()),
        |export, _| drop(export),
    )
    .map_err(|e| refused(e.to_string()))?;
    Ok(Pin {
        _holder: holder.into_any().unbind(),
        addr,
        len,
    })
}

/// `obj`'s type's name, for refusals (without running Python code beyond the type's own
/// `__name__`).
fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an object".into())
}

/// The pinned bytes as a `HostBuffer` to register in place: the buffer holds the pin (and
/// with it the object's buffer export) until it drops, after every region over it is
/// deregistered.
#[allow(unsafe_code)] // HostBuffer::from_foreign: see the SAFETY comment
pub(crate) fn foreign_buffer(pin: Pin) -> Result<HostBuffer> {
    let (addr, len) = (pin.addr, pin.len);
    let ptr = NonNull::new(addr as *mut u8).ok_or_else(|| {
        Failure::new(
            Class::InvalidInput,
            "register",
            "register: a buffer at address 0".to_string(),
        )
    })?;
    // SAFETY: `addr..addr + len` are either the bytes of a writable, C-contiguous buffer
    // export whose address and length the object's type filled in (`PyObject_GetBuffer`,
    // the `Py_buffer` held by `pin._holder` until it drops): while the export is held the
    // object cannot resize or free them (a `bytearray` refuses to resize, an `mmap` to close,
    // numpy keeps its data); or a contiguous host DLPack tensor this module consumed (its
    // capsule renamed `used_dltensor`, so no other consumer can take it) whose deleter runs
    // only when `pin._holder` is destroyed. `pin` is the buffer's owner, dropped with it. No
    // Rust reference to the bytes exists outside the buffer (Python code reaches them through
    // its own objects), and no slice of them is ever made through it: the buffer goes
    // straight to the engine as a segment, which gives the CPU no access, and comes back
    // from `unregister` only to be dropped. What Python code does with the bytes meanwhile
    // races only with the NIC, as in C.
    unsafe { HostBuffer::from_foreign(ptr, len, Box::new(pin)) }
        .map_err(|e| Failure::rdma("register", &e))
}

/// `len` bytes at `addr` of this process's memory, registered by address: the caller's
/// promise that they stay allocated while registered (`Agent.register_address`).
#[allow(unsafe_code)] // HostBuffer::from_foreign: see the SAFETY comment
pub(crate) fn address_buffer(addr: u64, len: u64) -> Result<HostBuffer> {
    let refused = |why: String| {
        Failure::new(
            Class::InvalidInput,
            "register_address",
            format!("register_address: {why}"),
        )
    };
    let ptr = usize::try_from(addr)
        .ok()
        .and_then(|a| NonNull::new(a as *mut u8))
        .ok_or_else(|| refused(format!("address {addr:#x}")))?;
    let len = usize::try_from(len).map_err(|_| refused(format!("{len} bytes")))?;
    // SAFETY: `Agent.register_address`'s documented contract, the caller's as in Mooncake's
    // `register_memory`: `addr..addr + len` is memory of this process that stays allocated
    // until the segment is unregistered. No Rust reference to it exists (Python reaches it
    // through its own objects or ctypes), and none is made through this buffer: it goes
    // straight to the engine as a segment, which gives the CPU no access, and comes back
    // from `unregister` only to be dropped (the owner is `()`: nothing is freed). Memory that
    // is not mapped is refused by the kernel's registration (EFAULT), not touched.
    unsafe { HostBuffer::from_foreign(ptr, len, Box::new(())) }
        .map_err(|e| Failure::rdma("register_address", &e))
}

#[pymethods]
impl HostMemory {
    /// `size` bytes (a multiple of the page size), zero-filled.
    #[new]
    fn new(py: Python<'_>, size: u64) -> PyResult<HostMemory> {
        let memfd = drm_export::sealed_memfd(MemfdPages::Shmem, size)
            .map_err(|e| Failure::export("HostMemory", &e))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&memfd);
        // Python's mmap duplicates the fd: the mapping lives as long as the mmap object.
        let mapping = py.import("mmap")?.getattr("mmap")?.call1((fd, size))?;
        // Its address, read from the mapping's own buffer export (released at once: the
        // mapping lives as long as this object, and segments of it are registered through
        // the memfd, never through this address).
        let mapped = pin(&mapping)?;
        if mapped.len as u64 != size {
            return Err(Failure::new(
                Class::Base,
                "HostMemory",
                format!("HostMemory: a mapping of {} bytes, not {size}", mapped.len),
            )
            .into());
        }
        let base = mapped.addr;
        Ok(HostMemory {
            memfd: Arc::new(memfd),
            size,
            base,
            mapping: mapping.unbind(),
        })
    }

    /// Its size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The memory as a writable buffer (an `mmap.mmap`): `numpy.frombuffer(mem.buffer)`,
    /// `memoryview(mem.buffer)`.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> PyObject {
        self.mapping.clone_ref(py)
    }

    /// The address of its first byte in this process.
    #[getter]
    fn address(&self) -> usize {
        self.base
    }

    fn __len__(&self) -> usize {
        self.size as usize
    }

    fn __repr__(&self) -> String {
        format!("HostMemory(size={})", self.size)
    }
}

impl HostMemory {
    /// A udmabuf of all of it.
    pub(crate) fn export(&self) -> Result<DmaBuf> {
        Udmabuf::export(&*self.memfd, 0, self.size).map_err(|e| Failure::export("register", &e))
    }
}
