//! The Python package `gpu_rdma` for the tests and the bench: `cargo build -p gpu-rdma-python` and the
//! package folder staged as `target/debug/python/gpu_rdma/` (the Python sources and stubs
//! of `python/gpu_rdma`, the extension module as `_native.abi3.so`), which
//! tests/tests/programs/python_package.rs puts on `PYTHONPATH`. `pip install ./python` builds the same
//! module with maturin instead (python/pyproject.toml).

use super::Paths;
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::Step;
use std::path::PathBuf;

/// Builds the extension module (debug) and stages the package; returns the folder to put on
/// `PYTHONPATH`.
pub fn stage(paths: &Paths) -> Result<PathBuf> {
    stage_profile(paths, false)
}

/// The same in release (`target/release/python`), for the bench's Python client.
pub fn stage_release(paths: &Paths) -> Result<PathBuf> {
    stage_profile(paths, true)
}

fn stage_profile(paths: &Paths, release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    let step = Step::start(format!("building the Python module (gpu_rdma, {profile})"));
    let mut cargo = paths.cargo();
    cargo.args([
        "build",
        "--quiet",
        "-p",
        "gpu-rdma-python",
        "--features",
        "etcd",
    ]);
    if release {
        cargo.arg("--release");
    }
    sh::run(&mut cargo)?;
    let out = paths.target.join(profile).join("python");
    let pkg = out.join("gpu_rdma");
    std::fs::create_dir_all(&pkg).map_err(|e| format!("create {}: {e}", pkg.display()))?;
    copy_tree(&paths.root.join("python/gpu_rdma"), &pkg)?;
    let lib = paths.target.join(profile).join("libgpu_rdma_native.so");
    let to = pkg.join("_native.abi3.so");
    // Replaced, not overwritten: a Python process may have the old file mapped.
    let _ = std::fs::remove_file(&to);
    std::fs::copy(&lib, &to).map_err(|e| format!("copy {}: {e}", lib.display()))?;
    step.done();
    Ok(out)
}

/// Copies the package's sources under `src` into `dst`, folders included (the `mooncake`
/// compatibility package under `_compat/`), leaving out Python's byte-code caches.
fn copy_tree(src: &std::path::Path, dst: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dst).map_err(|e| format!("create {}: {e}", dst.display()))?;
    let entries = std::fs::read_dir(src).map_err(|e| format!("read {}: {e}", src.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path.file_name().expect("an entry has a name");
        if path.is_dir() && name != "__pycache__" {
            copy_tree(&path, &dst.join(name))?;
        } else if path.is_file() {
            let to = dst.join(name);
            std::fs::copy(&path, &to).map_err(|e| format!("copy {}: {e}", path.display()))?;
        }
    }
    Ok(())
}
