//! The provider's table of extended operations (`struct verbs_context`), where libibverbs'
//! inline functions (`ibv_query_port`, `ibv_query_device_ex`, `ibv_create_qp_ex`,
//! `ibv_alloc_dm`, `ibv_free_dm`, `ibv_reg_dm_mr`) find their entry points.
//!
//! rdma-sys 0.3 has its own versions of those inline functions, but they test the context's
//! `abi_compat` marker against `u32::MAX` where libibverbs stores `UINTPTR_MAX`: on a 64-bit
//! machine they never find the table, and report `EOPNOTSUPP` (`ibv_query_device_ex` falls
//! back to the basic query, so on-demand paging and device memory read as absent). This
//! module looks the table up as libibverbs' `verbs_get_ctx_op` does, and the raw layer
//! calls the entry points through [`ctx_op!`].

use rdma_sys as ffi;

/// libibverbs' marker, in `ibv_context::abi_compat`, of a context that is the last field of
/// a `verbs_context` (`__VERBS_ABI_IS_EXTENDED`: `(void *)UINTPTR_MAX`).
const EXTENDED: usize = usize::MAX;

/// The entry point at byte `offset` of the `verbs_context` of `ctx`, as libibverbs'
/// `verbs_get_ctx_op` finds it: `None` when the context has no extended table, when the
/// provider's table is too old to reach that field, or when the provider left it empty.
/// `field` is never called: it ties `F` to the field's type (see [`ctx_op!`], which passes
/// both from one field name).
///
/// # Safety
/// `ctx` is a live context of libibverbs, and `offset` is the offset of the field `field`
/// returns.
pub(in crate::sys) unsafe fn entry<F: Copy>(
    ctx: *mut ffi::ibv_context,
    offset: usize,
    field: fn(&ffi::verbs_context) -> &Option<F>,
) -> Option<F> {
    let _ = field;
    // SAFETY: a live context (this function's contract); `abi_compat` is a plain field.
    let marker = unsafe { (*ctx).abi_compat } as usize;
    if marker != EXTENDED {
        return None;
    }
    // The provider's struct ends with the context, so it starts `context`'s offset before
    // it. A provider built against older headers lacks the first fields: its `sz` (just
    // before the context) counts only the part it has.
    let end = std::mem::size_of::<ffi::verbs_context>();
    let vc = ctx
        .cast::<u8>()
        .wrapping_sub(std::mem::offset_of!(ffi::verbs_context, context));
    let sz = vc
        .wrapping_add(std::mem::offset_of!(ffi::verbs_context, sz))
        .cast::<usize>();
    // SAFETY: the marker says `ctx` is the `context` field of a `verbs_context`, whose `sz`
    // field lies just before it.
    let sz = unsafe { sz.read() };
    if sz < end - offset {
        return None;
    }
    // SAFETY: the field at `offset` (an `Option` of an entry point, this function's
    // contract) lies inside the part of the table the provider has (`sz`).
    unsafe { vc.wrapping_add(offset).cast::<Option<F>>().read() }
}

/// The provider's entry point `$op` of the live context `$ctx` (a field of
/// `verbs_context`), or `None` (see [`entry`], whose contract the caller keeps: call it
/// inside an `unsafe` block whose SAFETY comment says the context is live).
macro_rules! ctx_op {
    ($ctx:expr, $op:ident) => {
        $crate::sys::ctx_ops::entry(
            $ctx,
            ::std::mem::offset_of!(rdma_sys::verbs_context, $op),
            |vc| &vc.$op,
        )
    };
}
pub(in crate::sys) use ctx_op;
