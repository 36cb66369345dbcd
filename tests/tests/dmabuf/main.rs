//! drm-export's exporters and dma-bufs (dumb buffers, udmabuf, heaps, the test exporter, foreign
//! buffers): CPU access, fences, soundness, leaks, and their registration with rdma-dmabuf.
//!
//! One module per test file; `cargo xtask test` runs each module's VM tests in a process of
//! their own (xtask/src/testrun.rs), so a test file's tests are never beside another file's.

mod dmabuf_cpu_access;
mod dmabuf_fences;
mod dmabuf_foreign;
mod dmabuf_rdma;
mod dmabuf_test_exporter;
mod drm_export;
mod drm_export_leaks;
mod drm_soundness;
mod udmabuf_thp;
