//! Helpers shared by the integration tests.
//!
//! Tests that need the kernel are marked `#[ignore = "needs the testbed VM"]`: a host run
//! counts them as skipped, and `cargo xtask test` runs them inside the testbed VM, where a
//! missing device is a failure. Tests in `mod two_node { ... }` at the root of a test file
//! run in the two-node testbed, on both nodes at once; tests in `mod stock_only { ... }` on
//! Debian's stock rxe (xtask/src/phase.rs).

pub mod counts;
pub mod cuda_standin;
pub mod device_admin;
pub mod engine;
pub mod etcd;
pub mod evil_waker;
pub mod exporters;
pub mod injection;
pub mod mooncake;
pub mod oob;
pub mod pki;
pub mod process;
pub mod raw_verbs;
pub mod roundtrip;
pub mod runtime;
pub mod test_exporter;
pub mod testbed;
pub mod verbs;
