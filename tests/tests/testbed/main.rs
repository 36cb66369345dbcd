//! The testbed itself: a real rxe moving traffic, and the PCIe topology the rails phase boots.
//!
//! One module per test file; `cargo xtask test` runs each module's VM tests in a process of
//! their own (xtask/src/testrun.rs), so a test file's tests are never beside another file's.

mod testbed_smoke;
mod testbed_topology;
