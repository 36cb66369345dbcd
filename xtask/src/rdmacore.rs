//! `cargo xtask rdma-core-tests`: rdma-core's own Python test suite (`tests/`, over pyverbs),
//! built from the same v55 source as the patched stack, run on the patched rxe and on the stock
//! one, and compared test by test. The patches must change nothing the suite can see.
//!
//! Two trees under `target/testbed/rdma-core-tests-<key>/`: `patched` (our rdma-core patches,
//! everything built, pyverbs included) and `stock` (unpatched; libibverbs and the rxe provider
//! only). Both runs use the patched tree's pyverbs. The stock run puts the stock tree's
//! libibverbs first on the library path, so its rxe provider is what gets loaded, and it boots
//! Debian's own `rdma_rxe.ko`.

use crate::sh::{self, Result};
use crate::ui::{info, Step};
use crate::{fail, patched, programs, script, setup, vm, Paths};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Builds both trees, runs the suite in both modes, prints the comparison.
pub fn main(paths: &Paths) -> Result<ExitCode> {
    setup::packages()?;
    let (patched_tree, stock_tree) = build(paths)?;
    let suite = |mode: vm::Mode, lib_path: String| -> Result<BTreeMap<String, String>> {
        let script = suite_script(&lib_path, &patched_tree)?;
        programs::check(&script, false)?;
        let opts = vm::Opts {
            mode,
            timeout: Duration::from_secs(1200),
            expose: paths.vm_expose(),
            ..vm::Opts::default()
        };
        let step = Step::start(format!("rdma-core's tests on the {mode:?} stack"));
        let argv = vec!["sh".into(), "-c".into(), script];
        let results = vm::run_quiet(paths, &argv, &opts)?;
        step.done();
        let r = &results[0];
        for l in r
            .console
            .lines()
            .filter(|l| l.ends_with(".so.1") || l.ends_with(".so"))
        {
            info(format!("loaded: {}", l.trim()));
        }
        if !r.problems.is_empty() {
            fail!("kernel problems during the {mode:?} run: {:?}", r.problems);
        }
        let parsed = parse(&r.console);
        if parsed.is_empty() {
            fail!(
                "the {mode:?} run reported no tests; its output:\n{}",
                r.console
            );
        }
        Ok(parsed)
    };
    let patched = suite(
        vm::Mode::Patched,
        patched_tree.join("build/lib").display().to_string(),
    )?;
    let stock = suite(
        vm::Mode::Stock,
        format!(
            "{}:{}",
            stock_tree.join("build/lib").display(),
            patched_tree.join("build/lib").display()
        ),
    )?;
    println!();
    for (name, set) in [("patched", &patched), ("stock", &stock)] {
        info(format!("{name:<8} {}", tally(set)));
    }
    let differ: Vec<String> = patched
        .keys()
        .chain(stock.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| patched.get(*k) != stock.get(*k))
        .map(|k| {
            format!(
                "{k}: patched {}, stock {}",
                patched.get(k).map_or("absent", String::as_str),
                stock.get(k).map_or("absent", String::as_str)
            )
        })
        .collect();
    if differ.is_empty() {
        info("every test had the same outcome on both stacks");
        Ok(ExitCode::SUCCESS)
    } else {
        info(format!("{} tests differ:", differ.len()));
        for d in &differ {
            info(format!("  {d}"));
        }
        Ok(ExitCode::FAILURE)
    }
}

/// The VM command that runs the suite with `lib_path` first on the library path
/// (`scripts/rdma-core-suite.sh`).
pub(crate) fn suite_script(lib_path: &str, patched_tree: &std::path::Path) -> Result<String> {
    let path = |sub: &str| sh::quote(&patched_tree.join(sub).to_string_lossy());
    script::fill(
        script::RDMA_CORE_SUITE,
        &[
            ("LIB_PATH", &sh::quote(lib_path)),
            ("PYTHONPATH", &path("build/python")),
            ("TESTS", &path("tests")),
        ],
    )
}

/// The two trees, built once per key: the rdma-core patches, this file and the suite's
/// script.
fn build(paths: &Paths) -> Result<(PathBuf, PathBuf)> {
    let patches = patched::patch_files(&paths.root)?;
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        include_str!("rdmacore.rs").hash(&mut h);
        script::RDMA_CORE_SUITE.hash(&mut h);
        for f in &patches.rdma_core {
            std::fs::read(f)?.hash(&mut h);
        }
        h.finish()
    };
    let root = paths.testbed.join(format!("rdma-core-tests-{key:016x}"));
    let (p, s) = (root.join("patched"), root.join("stock"));
    let done = root.join("built");
    if done.is_file() {
        return Ok((p, s));
    }
    patched::remove_stale(&paths.testbed, "rdma-core-tests-", &root);
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let src = patched::rdma_core_source(paths)?;
    let step = Step::start("building rdma-core v55 with pyverbs (patched) and without patches");
    for (tree, patch, pyverbs) in [(&p, true, true), (&s, false, false)] {
        sh::run(programs::cmd("cp").arg("-r").arg(&src).arg(tree))?;
        if patch {
            patched::apply_patches(tree, &patches.rdma_core)?;
        }
        patched::build_in_place(tree, pyverbs)?;
    }
    step.done();
    sh::write(&done, "")?;
    Ok((p, s))
}

/// `unittest -v` output: test id -> `ok`, `skipped`, `ERROR`, `FAIL`, ...
fn parse(console: &str) -> BTreeMap<String, String> {
    let body = console.split("\n======").next().unwrap_or(console);
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in body.lines() {
        if let Some(id) = test_id(line) {
            current = Some(id);
        }
        if let (Some(id), Some(outcome)) = (&current, outcome(line)) {
            out.insert(id.clone(), outcome.to_string());
            current = None;
        }
    }
    out
}

/// `test_x (tests.mod.Class.test_x)` at the start of a line.
fn test_id(line: &str) -> Option<String> {
    let (name, rest) = line.split_once(" (")?;
    let id = rest.split_once(')')?.0;
    (name.starts_with("test") && id.ends_with(name) && !name.contains(' ')).then(|| id.to_string())
}

fn outcome(line: &str) -> Option<&'static str> {
    let (_, r) = line.rsplit_once("... ")?;
    [
        "ok",
        "skipped",
        "ERROR",
        "FAIL",
        "expected failure",
        "unexpected success",
    ]
    .into_iter()
    .find(|o| r.starts_with(o))
}

fn tally(set: &BTreeMap<String, String>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for o in set.values() {
        *counts.entry(o.as_str()).or_default() += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(o, n)| format!("{n} {o}")).collect();
    format!("{} tests: {}", set.len(), parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_unittest_verbose_output() {
        let out = "\
test_a (tests.t.C.test_a)
Doc line. ... ok
test_b (tests.t.C.test_b) ... skipped 'no GPU'
test_c (tests.t.C.test_c)
Doc. ... libibverbs: Warning: noise
ERROR
test_d (tests.t.C.test_d)
Doc. ... ERROR
======================================================================
ERROR: test_d (tests.t.C.test_d)
";
        let r = parse(out);
        assert_eq!(r["tests.t.C.test_a"], "ok");
        assert_eq!(r["tests.t.C.test_b"], "skipped");
        assert_eq!(r["tests.t.C.test_d"], "ERROR");
        assert!(
            !r.contains_key("tests.t.C.test_c"),
            "noise is not an outcome"
        );
        assert_eq!(tally(&r), "3 tests: 1 ERROR, 1 ok, 1 skipped");
    }
}
