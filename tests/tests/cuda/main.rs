//! CUDA memory as dma-bufs, through the stand-in libcuda (`tests/standin`): pointers, ranges
//! and their edges, races of exports, and the C interface.
//!
//! One module per test file; `cargo xtask test` runs each module's VM tests in a process of
//! their own (xtask/src/testrun.rs), so a test file's tests are never beside another file's.

mod cuda_export_races;
mod cuda_from_c;
mod cuda_pointers;
mod cuda_range_edges;
mod cuda_range_seams;
mod cuda_ranges_adversarial;
