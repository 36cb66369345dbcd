//! The programs a user runs: the examples and the Python package, each run as its own process.
//!
//! One module per test file; `cargo xtask test` runs each module's VM tests in a process of
//! their own (xtask/src/testrun.rs), so a test file's tests are never beside another file's.

mod example_programs;
mod python_package;
