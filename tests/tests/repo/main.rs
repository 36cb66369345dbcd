//! Checks of the repository's sources: file sizes, module layering, where `unsafe` lives,
//! public returns, the lists the docs keep, the lock of counting tests, and the compile-fail
//! proofs.
//!
//! One module per test file; all of them run on the host.

mod compile_fail;
mod counted_tests_run_alone;
mod doc_lists;
mod file_sizes;
mod module_layering;
mod public_returns;
mod unsafe_layer;
