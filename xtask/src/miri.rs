//! The unit tests of rdma-dmabuf's raw pointer code under Miri, which reports undefined
//! behaviour that a test run cannot see (a read of bytes nothing wrote, a pointer used past
//! what its borrow allows). What runs: the poll area's tests (`sys::wc`: the completion array
//! read through field pointers, its zeroes kept, a nested poll's own area) and the slot
//! table's (`slots`: the free list threaded through the slots), under both of Miri's
//! aliasing models, Stacked Borrows and Tree Borrows. Miri needs a nightly toolchain: the
//! pinned one below, with its `miri` and `rust-src` components, installed through rustup (the
//! README's one prerequisite) by `cargo xtask setup` or the first test run, and used offline
//! after that; it builds into its own target folder, `target/miri-check`.

use dmabuf_testbed::programs::cmd;
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::{info, Step};
use gpu_rdma_bench::workspace::Paths;
use std::process::Stdio;

/// The nightly toolchain Miri runs on, pinned so that a new nightly cannot change the
/// verdict unasked.
pub const NIGHTLY: &str = "nightly-2026-05-20";

/// The components Miri needs.
const COMPONENTS: [&str; 2] = ["miri", "rust-src"];

/// The test filters, as libtest takes them (a test runs if its path contains one): the
/// poll area's module and the slot table's.
pub const FILTERS: [&str; 2] = ["sys::wc::", "slots::"];

/// The fewest tests the filters must run under each model: a check that ran fewer (a module
/// renamed or moved, tests ignored under Miri) fails rather than passing on nothing.
pub const MIN_TESTS: usize = 15;

/// The aliasing models, by the `MIRIFLAGS` that choose them (Stacked Borrows is Miri's
/// default).
pub const MODELS: [(&str, &str); 2] = [
    ("Stacked Borrows", "-Zmiri-strict-provenance"),
    (
        "Tree Borrows",
        "-Zmiri-strict-provenance -Zmiri-tree-borrows",
    ),
];

/// Whether the toolchain and its components are installed (asked offline).
fn installed() -> bool {
    let listed = sh::output_quiet(cmd("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        NIGHTLY,
    ]));
    listed.is_ok_and(|text| {
        COMPONENTS.iter().all(|c| {
            text.lines()
                .any(|l| l == *c || l.starts_with(&format!("{c}-")))
        })
    })
}

/// Installs the toolchain and its components unless they are there (rustup reaches the
/// network only then).
///
/// # Errors
/// When rustup cannot install them (no network the first time).
pub fn install() -> Result {
    if installed() {
        return Ok(());
    }
    let step = Step::start(format!(
        "rustup: {NIGHTLY} with miri and rust-src, for Miri"
    ));
    let mut c = cmd("rustup");
    c.args(["toolchain", "install", NIGHTLY, "--profile", "minimal"]);
    for component in COMPONENTS {
        c.args(["--component", component]);
    }
    c.arg("--no-self-update");
    sh::run(&mut c).map_err(|e| {
        format!("{e}\n    Miri's toolchain could not be installed (rustup needs the network the first time)")
    })?;
    step.done();
    Ok(())
}

/// Runs the tests under one model: how many passed, or why it failed.
fn run_model(paths: &Paths, flags: &str) -> std::result::Result<usize, String> {
    let mut c = cmd("rustup");
    c.current_dir(&paths.root)
        .env("CARGO_TARGET_DIR", paths.root.join("target/miri-check"))
        .env("MIRIFLAGS", flags)
        .args(["run", NIGHTLY, "cargo", "miri", "test"])
        .args(["--package", "rdma-dmabuf", "--lib", "--"])
        .args(FILTERS)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit());
    let out = c
        .output()
        .map_err(|e| format!("cannot start `{}`: {e}", sh::render(&c)))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // libtest's own report (which test failed) is on stdout; Miri's, on stderr, is shown.
        eprint!("{text}");
        return Err(format!("`{}` failed: {}", sh::render(&c), out.status));
    }
    Ok(text
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|rest| rest.split(' ').next()?.parse::<usize>().ok())
        .sum())
}

/// Installs the toolchain if it is missing, then runs the tests under each model; `Ok(false)`
/// (reported, counted as one failed test) when it cannot be installed or a model fails or runs
/// fewer than [`MIN_TESTS`].
pub fn check(paths: &Paths) -> Result<bool> {
    if let Err(e) = install() {
        info(format!("miri: FAILED: {e}"));
        return Ok(false);
    }
    let mut ok = true;
    for (model, flags) in MODELS {
        let step = Step::start(format!(
            "Miri ({model}): rdma-dmabuf's {}",
            FILTERS.join(", ")
        ));
        let r = run_model(paths, flags);
        step.done();
        match r {
            Ok(n) if n >= MIN_TESTS => info(format!("miri ({model}): {n} tests passed")),
            Ok(n) => {
                info(format!(
                    "miri ({model}): FAILED: {n} tests ran, fewer than the {MIN_TESTS} expected \
                     (a module renamed, or tests left out under Miri?)"
                ));
                ok = false;
            }
            Err(e) => {
                info(format!("miri ({model}): FAILED: {e}"));
                ok = false;
            }
        }
    }
    Ok(ok)
}
