//! The raw layer: every call into CPython's C API that pyo3 does not wrap safely, and the
//! one system call the crate makes that libc does not. `unsafe` lives here; the rest of the
//! crate is under `deny(unsafe_code)` and reaches these calls only through the safe
//! functions and owned types below (the one exception, `host::foreign_buffer`'s call of the
//! public `unsafe fn` `HostBuffer::from_foreign`, is listed in `docs/safety.md`, "Where
//! `unsafe` lives", and kept by `tests/tests/repo/unsafe_layer.rs`).
//!
//! * [`buffer`]: the C buffer protocol. A [`buffer::BufferExport`] owns one filled-in
//!   `Py_buffer` (boxed, never moved), made only by a successful `PyObject_GetBuffer` and
//!   released once, with the GIL, when it drops; it hands out the export's fields as values.
//! * [`dlpack`]: DLPack capsules. [`dlpack::read`] copies what a capsule's tensor says into
//!   plain Rust values (every array read is bounded by the tensor's own dimension count,
//!   checked first) and [`dlpack::Offer::take`] consumes the capsule in one step that runs no
//!   Python code: it checks that the capsule still has the producer's name and the tensor
//!   read, removes its destructor and renames it `used_…`, so that no other consumer can
//!   take the tensor; the [`dlpack::Taken`] it returns calls the producer's deleter once,
//!   with the GIL, when it drops.
//! * [`fd`]: the duplicate of an fd number, owned at once.
//!
//! What every function here relies on: a `Bound` (the GIL held) of a live object, C strings
//! that outlive the calls that keep them (`'static` names), and no Python code running
//! between a check and what it guards (none of the C API calls below runs any on the paths
//! that go on: they read or set fields of the object they are given). This layer depends on
//! nothing of the crate, so every other module can depend on it.

#![allow(unsafe_code)]

pub(crate) mod buffer;
pub(crate) mod dlpack;
pub(crate) mod fd;
