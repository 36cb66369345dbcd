//! `cargo xtask rdma-core-tests`: rdma-core's own Python test suite (`tests/`, over pyverbs),
//! built from the same v55 source as the patched stack, run on the patched rxe and on the stock
//! one, and compared test by test. The patches must change nothing the suite can see.
//!
//! Two trees under `target/testbed/rdma-core-tests-<key>/`: `patched` (our rdma-core patches,
//! everything built, pyverbs included) and `stock` (unpatched; libibverbs and the rxe provider
//! only). Both runs use the patched tree's pyverbs. The stock run puts the stock tree's
//! libibverbs first on the library path, so its rxe provider is what gets loaded, and it boots
//! Debian's own `rdma_rxe.ko`.

use crate::script;
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::{info, Step};
use dmabuf_testbed::{fail, patched, programs, setup, vm};
use gpu_rdma_bench::workspace::Paths;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Builds both trees, runs the suite in both modes, prints the comparison.
pub fn main(paths: &Paths) -> Result<ExitCode> {
    setup::packages()?;
    let (patched_tree, stock_tree) = build(paths)?;
    let suite = |mode: vm::Mode, lib_path: String| -> Result<BTreeMap<String, Outcome>> {
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
        info(format!("{name:<8} {}", tally(set.values())));
    }
    for (name, set) in [("patched", &patched), ("stock", &stock)] {
        for (id, o) in set
            .iter()
            .filter(|(_, o)| o.word == "ERROR" || o.word == "FAIL")
        {
            let why = KNOWN_ERRORS
                .iter()
                .find(|(k, _)| k == id)
                .map_or("not explained", |(_, why)| why);
            info(format!("{name:<8} {id}: {} ({why})", o.word));
        }
    }
    let mut failed = false;
    for line in dmabuf_report(&patched, &stock) {
        failed |= line.starts_with("FAILED");
        info(line);
    }
    let differ: Vec<String> = patched
        .keys()
        .chain(stock.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        // A known race may fall either way on either stack: printed above, not compared.
        .filter(|k| {
            !is_dmabuf_test(k)
                && !KNOWN_ERRORS.iter().any(|(id, _)| id == k)
                && patched.get(*k) != stock.get(*k)
        })
        .map(|k| {
            let word = |set: &BTreeMap<String, Outcome>| {
                set.get(k).map_or("absent".to_string(), |o| o.word.clone())
            };
            format!("{k}: patched {}, stock {}", word(&patched), word(&stock))
        })
        .collect();
    if differ.is_empty() {
        info("every other test had the same outcome on both stacks");
    } else {
        failed = true;
        info(format!("{} other tests differ:", differ.len()));
        for d in &differ {
            info(format!("  {d}"));
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Errors of the suite that are understood (kernel-patches/README.md, "rdma-core's own tests").
const KNOWN_ERRORS: &[(&str, &str)] = &[(
    "tests.test_cq.CQTest.test_resize_cq",
    "a race in the test: rxe completes sends on a work queue, after ibv_post_send returns, so \
     the shrink it expects to fail can run before the completions are in the CQ, succeed, and \
     make the CQ drop them",
)];

/// rdma-core's dma-buf test classes (`tests/test_mr.py`) and their number of tests in v55.
/// With the vgem allocator (`kernel-patches/rdma-core/0002-*`) every one must pass on the
/// patched stack and be refused on the stock one: skipped, or absent, is a failure.
const DMABUF_CLASSES: &[(&str, usize)] = &[
    ("tests.test_mr.DmaBufMRTest", 8),
    ("tests.test_mr.DmaBufTestCase", 2),
];

/// How the suite skips a dma-buf test when `ibv_reg_dmabuf_mr` fails with EOPNOTSUPP
/// (`check_dmabuf_mr_support`): the stock rxe's refusal. An allocation failure skips with
/// another reason, so this one also proves the vgem buffer was there.
const STOCK_REFUSAL: &str = "Reg dma-buf MR is not supported by the RDMA driver";

fn class_of(id: &str) -> &str {
    id.rsplit_once('.').map_or(id, |(c, _)| c)
}

fn is_dmabuf_test(id: &str) -> bool {
    DMABUF_CLASSES.iter().any(|(c, _)| class_of(id) == *c)
}

/// One line per dma-buf class and stack (counts per outcome), then a `FAILED` line for each
/// test whose outcome is not the expected one and each class whose count is wrong.
fn dmabuf_report(
    patched: &BTreeMap<String, Outcome>,
    stock: &BTreeMap<String, Outcome>,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (class, count) in DMABUF_CLASSES {
        let short = class.rsplit_once('.').map_or(*class, |(_, c)| c);
        for (stack, set) in [("patched", patched), ("stock", stock)] {
            let tests: Vec<(&String, &Outcome)> =
                set.iter().filter(|(k, _)| class_of(k) == *class).collect();
            let reasons: std::collections::BTreeSet<&str> = tests
                .iter()
                .filter(|(_, o)| o.word == "skipped")
                .map(|(_, o)| o.detail.as_str())
                .collect();
            let reasons: Vec<&str> = reasons.into_iter().collect();
            lines.push(format!(
                "{short:<14} {stack:<8} {}{}",
                tally(tests.iter().map(|(_, o)| *o)),
                if reasons.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", reasons.join(", "))
                }
            ));
            if tests.len() != *count {
                lines.push(format!(
                    "FAILED: {class} ran {} tests on the {stack} stack, not {count}",
                    tests.len()
                ));
            }
            for (id, o) in tests {
                let expected = if stack == "patched" {
                    o.word == "ok"
                } else {
                    o.word == "skipped" && o.detail.contains(STOCK_REFUSAL)
                };
                if !expected {
                    lines.push(format!(
                        "FAILED: {id} on the {stack} stack: {} {}",
                        o.word, o.detail
                    ));
                }
            }
        }
    }
    lines
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

/// A test's outcome (`ok`, `skipped`, `ERROR`, `FAIL`, ...) and what follows it on its line
/// (a skip's reason).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Outcome {
    word: String,
    detail: String,
}

/// `unittest -v` output: test id -> outcome.
fn parse(console: &str) -> BTreeMap<String, Outcome> {
    let body = console.split("\n======").next().unwrap_or(console);
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in body.lines() {
        if let Some(id) = test_id(line) {
            current = Some(id);
        }
        if let (Some(id), Some(outcome)) = (&current, outcome(line)) {
            out.insert(id.clone(), outcome);
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

fn outcome(line: &str) -> Option<Outcome> {
    let (_, r) = line.rsplit_once("... ")?;
    let word = [
        "ok",
        "skipped",
        "ERROR",
        "FAIL",
        "expected failure",
        "unexpected success",
    ]
    .into_iter()
    .find(|o| r.starts_with(o))?;
    Some(Outcome {
        word: word.to_string(),
        detail: r[word.len()..].trim().to_string(),
    })
}

fn tally<'a>(set: impl IntoIterator<Item = &'a Outcome>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut n = 0;
    for o in set {
        *counts.entry(o.word.as_str()).or_default() += 1;
        n += 1;
    }
    let parts: Vec<String> = counts.iter().map(|(o, n)| format!("{n} {o}")).collect();
    format!("{n} tests: {}", parts.join(", "))
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
        assert_eq!(r["tests.t.C.test_a"].word, "ok");
        assert_eq!(r["tests.t.C.test_b"].word, "skipped");
        assert_eq!(r["tests.t.C.test_b"].detail, "'no GPU'");
        assert_eq!(r["tests.t.C.test_d"].word, "ERROR");
        assert!(
            !r.contains_key("tests.t.C.test_c"),
            "noise is not an outcome"
        );
        assert_eq!(tally(r.values()), "3 tests: 1 ERROR, 1 ok, 1 skipped");
    }

    /// The dma-buf classes as the suite would report them: every test of each class with
    /// `word` and `detail`.
    fn dmabuf_run(word: &str, detail: &str) -> BTreeMap<String, Outcome> {
        let mut m = BTreeMap::new();
        for (class, n) in DMABUF_CLASSES {
            for i in 0..*n {
                m.insert(
                    format!("{class}.test_{i}"),
                    Outcome {
                        word: word.into(),
                        detail: detail.into(),
                    },
                );
            }
        }
        m
    }

    fn failures(patched: &BTreeMap<String, Outcome>, stock: &BTreeMap<String, Outcome>) -> usize {
        dmabuf_report(patched, stock)
            .iter()
            .filter(|l| l.starts_with("FAILED"))
            .count()
    }

    #[test]
    fn dmabuf_classes_must_pass_on_patched_and_be_refused_on_stock() {
        let refused = dmabuf_run("skipped", &format!("'{STOCK_REFUSAL}'"));
        let passed = dmabuf_run("ok", "");
        assert_eq!(failures(&passed, &refused), 0);
        // Skipped on the patched stack (no allocator, say) is no pass.
        let no_gpu = dmabuf_run("skipped", "'Allocating dmabuf is not supported'");
        assert_eq!(failures(&no_gpu, &refused), 10);
        // On the stock stack, a skip for another reason is not the expected refusal.
        assert_eq!(failures(&passed, &no_gpu), 10);
        // Passing on the stock stack would mean the stock rxe registered a dma-buf.
        assert_eq!(failures(&passed, &passed), 10);
        // A class that did not run at all fails too.
        assert_eq!(failures(&BTreeMap::new(), &refused), 2);
    }
}
