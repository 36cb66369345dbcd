//! xtask's own shell scripts, kept as real files under `xtask/src/scripts/` and built in with
//! `include_str!`; placeholders (`@NAME@`) are filled with the testbed's [`fill`]. The
//! testbed's scripts (`/init`, `inner.sh`, ...) live in the testbed crate, the bench's in
//! `bench/src/scripts/`.

pub use dmabuf_testbed::script::fill;

/// `cargo xtask demo`'s command on both nodes (arguments, no placeholders).
pub const DEMO: &str = include_str!("scripts/demo.sh");

/// `cargo xtask rdma-core-tests`' command in the VM. Placeholders: `LIB_PATH`, `PYTHONPATH`,
/// `TESTS`.
pub const RDMA_CORE_SUITE: &str = include_str!("scripts/rdma-core-suite.sh");

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file of `xtask/src/scripts/`, by file name.
    const ALL: &[(&str, &str)] = &[("demo.sh", DEMO), ("rdma-core-suite.sh", RDMA_CORE_SUITE)];

    /// A file added to the folder needs a constant here (and a place in `crate::scripts()`).
    #[test]
    fn every_script_file_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
        dmabuf_testbed::script::check_folder(&dir, ALL).unwrap();
    }
}
