//! The raw layer: every call into libibverbs and librdmacm (`rdma_sys`), and the few other
//! operations the compiler cannot check (`mmap`/`munmap` of host buffers, volatile reads of
//! memory a peer writes, registering a file descriptor with a reactor). `unsafe` blocks
//! live here; the rest of the crate is under `deny(unsafe_code)` and reaches the verbs only
//! through the safe functions and owned handles of these modules (the exceptions, each
//! with the contract its `unsafe` relies on, are listed in `docs/safety.md`, "The raw
//! layer", and kept by `tests/tests/repo/unsafe_layer.rs`).
//!
//! What every wrapper here relies on, and how it makes sure of it:
//! * **Handles are valid for their whole life.** Each verbs object is held by one owned type
//!   created only by this layer from the pointer the library returned (checked non-null at
//!   the call): [`device::Context`], [`pd::ProtectionDomain`], and the others in their
//!   modules. Its pointer never leaves `sys` except as a value for comparisons and logs; it
//!   is destroyed once, in its owner's `Drop` (or a consuming method).
//! * **Parents outlive children.** A handle holds an `Arc` to the handle of the object it
//!   was made from (a PD its context, an MR its PD, a QP its PD and CQs), dropped after the
//!   child is destroyed, so no order of drops outside this layer can destroy a parent first.
//! * **Out-pointers and in-structs come from references** to values of the type the call
//!   takes; the structs are plain C data, zeroed through [`zeroed`], which only the types
//!   listed there (all-zero is a valid value of each) can use.
//! * **What a call keeps hold of is kept alive by its caller's types, not by a comment.**
//!   The calls whose safety depends on something this layer cannot see (posting a work
//!   request: the memory it names must stay valid until its completion) are `unsafe fn`s,
//!   and their contracts say what the caller owes.
//!
//! This layer depends on nothing of the crate but `error` (its error type) and `diag`
//! (notices from `Drop`), so every other module can depend on it.

#![allow(unsafe_code)]

pub(crate) mod cm;
pub(crate) mod cq;
pub(crate) mod ctx_ops;
pub(crate) mod device;
pub(crate) mod dm;
pub(crate) mod event;
pub(crate) mod fd;
pub(crate) mod host;
pub(crate) mod mr;
pub(crate) mod pd;
pub(crate) mod qp;
pub(crate) mod qp_ex;
pub(crate) mod srq;
pub(crate) mod wc;

/// Plain C structs of `rdma_sys` for which all-zero is a valid value, so [`zeroed`] may
/// make one.
///
/// # Safety
/// Only for `#[repr(C)]` structs and unions of integers, raw pointers and arrays of them
/// (all-zero is a valid value: zero integers, null pointers).
pub(crate) unsafe trait Zeroable: Sized {}

/// An all-zero value of a plain C struct, the starting point of every in/out struct the
/// verbs take.
pub(crate) fn zeroed<T: Zeroable>() -> T {
    // SAFETY: `T: Zeroable` promises that all-zero is a valid value of `T`.
    unsafe { std::mem::zeroed() }
}

/// An all-zero send work request, for arrays of them (`[ZERO_SEND_WR; K]`: a `const` item
/// repeats without `Copy`, which bindgen's `ibv_send_wr` lacks).
// SAFETY: `ibv_send_wr` is `Zeroable` (listed below; the `const _` after this checks it):
// all-zero is a valid value of it.
pub(crate) const ZERO_SEND_WR: rdma_sys::ibv_send_wr = unsafe { std::mem::zeroed() };

// `ZERO_SEND_WR` stays tied to the `Zeroable` list: this fails to compile if `ibv_send_wr`
// leaves it.
const _: () = {
    const fn zeroable<T: Zeroable>() {}
    zeroable::<rdma_sys::ibv_send_wr>()
};

/// The 16 bytes of a GID.
pub(crate) fn gid_bytes(gid: &rdma_sys::ibv_gid) -> [u8; 16] {
    // SAFETY: `ibv_gid` is a union of a byte array and integers; any bits are valid bytes.
    unsafe { gid.raw }
}

macro_rules! zeroable {
    ($($t:ty),* $(,)?) => {
        // SAFETY: each is a bindgen-generated `#[repr(C)]` struct or union of integers,
        // raw pointers and arrays or unions of them.
        $(unsafe impl Zeroable for $t {})*
    };
}

zeroable!(
    rdma_sys::ibv_device_attr_ex,
    rdma_sys::ibv_port_attr,
    rdma_sys::ibv_gid,
    rdma_sys::ibv_qp_attr,
    rdma_sys::ibv_qp_init_attr,
    rdma_sys::ibv_qp_init_attr_ex,
    rdma_sys::ibv_srq_init_attr,
    rdma_sys::ibv_srq_attr,
    rdma_sys::ibv_send_wr,
);
