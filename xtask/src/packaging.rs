//! The published crates as a user gets them: `cargo publish --dry-run` packages
//! `drm-export`, `rdma-dmabuf`, `gpu-rdma-topology` and `gpu-rdma-doctor` and builds each from its package (the
//! unpublished ones resolved from the packages just made), then `cargo doc` runs on them the
//! way docs.rs does (`DOCS_RS=1`, every feature, warnings denied). Both use their own target
//! folder, `target/packaging`, so the package builds never disturb the workspace's.

use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::{info, Step};
use gpu_rdma_bench::workspace::Paths;

/// The crates a user can depend on, by package name.
pub const PUBLISHED: [&str; 4] = [
    "drm-export",
    "rdma-dmabuf",
    "gpu-rdma-topology",
    "gpu-rdma-doctor",
];

/// Runs both checks; `Ok(false)` (reported) when one fails.
pub fn check(paths: &Paths) -> Result<bool> {
    let target = paths.root.join("target/packaging");
    let step = Step::start("cargo publish --dry-run (packages built as published)");
    let mut publish = paths.cargo();
    publish.env("CARGO_TARGET_DIR", &target).args([
        "publish",
        "--dry-run",
        "--allow-dirty",
        "--quiet",
    ]);
    for p in PUBLISHED {
        publish.args(["--package", p]);
    }
    let packaged = sh::run(&mut publish);
    step.done();
    let step = Step::start("cargo doc as docs.rs runs it (DOCS_RS=1, all features)");
    let mut doc = paths.cargo();
    doc.env("CARGO_TARGET_DIR", &target)
        .env("DOCS_RS", "1")
        .env("RUSTDOCFLAGS", "-D warnings")
        .args(["doc", "--no-deps", "--all-features", "--quiet"]);
    for p in PUBLISHED {
        doc.args(["--package", p]);
    }
    let documented = sh::run(&mut doc);
    step.done();
    for (what, r) in [
        ("publish --dry-run", &packaged),
        ("docs.rs-style doc", &documented),
    ] {
        match r {
            Ok(()) => info(format!("packaging: {what} passed")),
            Err(e) => info(format!("packaging: {what} FAILED: {e}")),
        }
    }
    Ok(packaged.is_ok() && documented.is_ok())
}
