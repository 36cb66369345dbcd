//! The rdma-dmabuf tests: verbs objects, posting, completions, async handles, scopes, failures
//! and leaks, on rxe in the testbed VM (and the few host checks of their arguments).
//!
//! One module per test file; `cargo xtask test` runs each module's VM tests in a process of
//! their own (xtask/src/testrun.rs), so a test file's tests are never beside another file's.

mod rdma_async;
mod rdma_async_device;
mod rdma_async_handles;
mod rdma_async_wakeups;
mod rdma_backing_release;
mod rdma_batch;
mod rdma_batch_edges;
mod rdma_batch_stack;
mod rdma_busy_poll_bound;
mod rdma_cache;
mod rdma_cache_cuda;
mod rdma_cache_keys;
mod rdma_cm;
mod rdma_connection_end;
mod rdma_cost;
mod rdma_device_removal;
mod rdma_drop_order;
mod rdma_error_window;
mod rdma_foreign_host;
mod rdma_inline_atomic;
mod rdma_leaks;
mod rdma_liveness;
mod rdma_multi;
mod rdma_parts;
mod rdma_peer_death;
mod rdma_reentrant_use;
mod rdma_region_moves;
mod rdma_retry_env;
mod rdma_scope_records;
mod rdma_shared_dmabuf;
mod rdma_shared_source;
mod rdma_spin_policy;
mod rdma_srq;
mod rdma_unwind;
mod rdma_unwind_completion;
mod rdma_unwind_handles;
mod rdma_unwind_own_poll;
mod rdma_verbs;
mod rxe_large_region;
