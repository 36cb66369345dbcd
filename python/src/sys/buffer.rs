//! The C buffer protocol: a buffer export (`PyObject_GetBuffer`), owned, its fields read as
//! values, released once (`PyBuffer_Release`) when it drops.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void};

/// CPython's `Py_buffer`, as the C buffer protocol fills it in. Declared here because
/// pyo3's declaration exists only for the stable ABI of 3.11 and newer, while this module
/// is built for 3.9's: the layout is the one 3.11 made part of the stable ABI, unchanged
/// since Python 3.3, and the functions below are exported by every CPython 3.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

/// `PyBUF_FULL_RO`: any buffer (strided, indirect, read-only), as `memoryview(obj)` asks.
const PYBUF_FULL_RO: c_int = 0x0100 | 0x0010 | 0x0008 | 0x0004;
/// `PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS`: writable bytes, one C-contiguous range.
const PYBUF_WRITABLE_C_CONTIGUOUS: c_int = 0x0001 | 0x0020 | 0x0010 | 0x0008;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
    fn PyBuffer_IsContiguous(view: *const RawBuffer, order: c_char) -> c_int;
}

/// What a buffer export asks the exporter for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Request {
    /// Any buffer (`PyBUF_FULL_RO`): strided, indirect, read-only.
    Any,
    /// Writable bytes, one C-contiguous range (`PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS`).
    WritableCContiguous,
}

impl Request {
    fn flags(self) -> c_int {
        match self {
            Request::Any => PYBUF_FULL_RO,
            Request::WritableCContiguous => PYBUF_WRITABLE_C_CONTIGUOUS,
        }
    }
}

/// A buffer export (a filled-in `Py_buffer`, boxed so that it never moves: exporters may
/// keep its address), made only by a successful `PyObject_GetBuffer` and released exactly
/// once, with the GIL, when dropped. While it is held the exporter keeps the bytes where
/// they are (a `bytearray` refuses to resize, an `mmap` to close).
pub(crate) struct BufferExport(Box<RawBuffer>);

// SAFETY: the export is a plain C struct the exporter filled in; what its pointers point to
// is read only under the GIL (`c_contiguous` takes the GIL's token; the other methods copy
// plain fields) and released in `Drop`, which takes the GIL, so which thread holds the value
// does not matter. It is only ever held inside a Python capsule, whose destructor runs with
// the GIL.
unsafe impl Send for BufferExport {}

impl BufferExport {
    /// `obj`'s buffer as `request` asks, or the exporter's refusal (its Python error, taken).
    pub(crate) fn get(
        obj: &Bound<'_, PyAny>,
        request: Request,
    ) -> std::result::Result<BufferExport, PyErr> {
        let mut view = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object (a `Bound`: the GIL is held) and `view` a `Py_buffer`
        // of CPython's layout that outlives the call. On success the exporter filled it in
        // and took a reference to `obj` (released by `PyBuffer_Release` in `Drop`); on
        // failure it set a Python error and the view holds nothing to release.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, request.flags()) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(BufferExport(view))
    }

    /// Whether the exported bytes are one C-contiguous range.
    pub(crate) fn c_contiguous(&self, _py: Python<'_>) -> bool {
        // SAFETY: `self.0` is a view filled in by a successful `PyObject_GetBuffer` and not
        // yet released; the call reads only its shape, strides and suboffsets, with the GIL
        // held (`_py`).
        unsafe { PyBuffer_IsContiguous(&*self.0, b'C' as c_char) == 1 }
    }

    /// Whether the exporter marked the bytes read-only.
    pub(crate) fn readonly(&self) -> bool {
        self.0.readonly != 0
    }

    /// Whether the export has suboffsets (an indirect, PIL-style buffer).
    pub(crate) fn has_suboffsets(&self) -> bool {
        !self.0.suboffsets.is_null()
    }

    /// The address of the first byte, as the exporter filled it in.
    pub(crate) fn addr(&self) -> usize {
        self.0.buf as usize
    }

    /// The length in bytes, as the exporter filled it in.
    pub(crate) fn byte_len(&self) -> ffi::Py_ssize_t {
        self.0.len
    }
}

impl Drop for BufferExport {
    fn drop(&mut self) {
        Python::with_gil(|_| {
            // SAFETY: `self.0` was filled in by a successful `PyObject_GetBuffer` (a
            // `BufferExport` is made only then) and is released here once, with the GIL
            // held, at the address it was filled in at (boxed, never moved).
            unsafe { PyBuffer_Release(&mut *self.0) }
        });
    }
}
