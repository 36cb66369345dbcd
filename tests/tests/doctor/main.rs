//! The doctor (`gpu-rdma-doctor`): its checks and JSON report, and its agent checks.
//!
//! One module per test file; `cargo xtask test` runs each module's VM tests in a process of
//! their own (xtask/src/testrun.rs), so a test file's tests are never beside another file's.

mod doctor;
mod doctor_agent;
