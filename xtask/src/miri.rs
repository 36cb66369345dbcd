//! The unit tests of rdma-dmabuf's raw pointer code under Miri, which reports undefined
//! behaviour that a test run cannot see (a read of bytes nothing wrote, a pointer used past
//! what its borrow allows). What runs: the poll area's tests (`sys::wc`: the completion array
//! read through field pointers, its zeroes kept, a nested poll's own area) and the slot
//! table's (`slots`: the free list threaded through the slots), under both of Miri's
//! aliasing models, Stacked Borrows and Tree Borrows. Miri needs a nightly toolchain: the
//! pinned one below is installed through rustup (the README's one prerequisite) with its
//! `miri` and `rust-src` components, once, and builds into its own target folder,
//! `target/miri-check`.

use crate::Paths;
use dmabuf_testbed::programs::cmd;
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::{info, Step};

/// The nightly toolchain Miri runs on, pinned so that a new nightly cannot change the
/// verdict unasked.
pub const NIGHTLY: &str = "nightly-2026-05-20";

/// The test filters, as `cargo test` takes them: every unit test whose path starts so.
pub const FILTERS: [&str; 2] = ["sys::wc::", "slots::"];

/// The aliasing models, by the `MIRIFLAGS` that choose them (Stacked Borrows is Miri's
/// default).
pub const MODELS: [(&str, &str); 2] = [
    ("Stacked Borrows", "-Zmiri-strict-provenance"),
    (
        "Tree Borrows",
        "-Zmiri-strict-provenance -Zmiri-tree-borrows",
    ),
];

/// Installs the toolchain if it is missing, then runs the tests under each model; `Ok(false)`
/// (reported) when one fails. A failure to install (no network) is an error of the run.
pub fn check(paths: &Paths) -> Result<bool> {
    let step = Step::start(format!("rustup: {NIGHTLY} with miri and rust-src"));
    sh::run(cmd("rustup").args([
        "toolchain",
        "install",
        NIGHTLY,
        "--profile",
        "minimal",
        "--component",
        "miri",
        "--component",
        "rust-src",
        "--no-self-update",
    ]))
    .map_err(|e| {
        format!("{e}\n    Miri's toolchain could not be installed (rustup needs the network once)")
    })?;
    step.done();
    let target = paths.root.join("target/miri-check");
    let mut ok = true;
    for (model, flags) in MODELS {
        let step = Step::start(format!(
            "Miri ({model}): rdma-dmabuf's {}",
            FILTERS.join(", ")
        ));
        let mut c = cmd("rustup");
        c.current_dir(&paths.root)
            .env("CARGO_TARGET_DIR", &target)
            .env("MIRIFLAGS", flags)
            .args(["run", NIGHTLY, "cargo", "miri", "test", "--quiet"])
            .args(["--package", "rdma-dmabuf", "--lib", "--"])
            .args(FILTERS);
        let r = sh::run(&mut c);
        step.done();
        match r {
            Ok(()) => info(format!("miri ({model}): passed")),
            Err(e) => {
                info(format!("miri ({model}): FAILED: {e}"));
                ok = false;
            }
        }
    }
    Ok(ok)
}
