//! `cargo xtask test`: formatting, clippy, rustdoc, host tests, then the VM tests.
//!
//! Tests that need the testbed are `#[ignore = "needs the testbed VM ..."]`: the host run
//! counts them as ignored; the VM runs exactly those (`--ignored`), each in the phase of the
//! module it is in ([`crate::phase`]); each phase's script names its tests exactly, and runs
//! each test file's tests in a process of their own, one file after another: a binary of
//! several test files (`tests/tests/rdma/`) is started once per file, so a test that counts
//! process- or device-wide resources has only its own file's tests beside it, as in a binary
//! of one file.

use crate::phase::Phase;
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::{info, Step};
use dmabuf_testbed::{fail, initramfs, kernel, programs, setup, vm};
use gpu_rdma_bench::workspace::Paths;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// A test's outcome as libtest prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `... ok`
    Passed,
    /// `... FAILED`
    Failed,
    /// `... ignored`
    Ignored,
}

/// Outcomes keyed by (binary, test name).
type Results = BTreeMap<(String, String), Outcome>;

/// How many tests passed, failed and were ignored (on the host, or in one VM phase).
#[derive(Default, Debug, PartialEq, Eq)]
struct Tally {
    passed: usize,
    failed: usize,
    ignored: usize,
}

impl Tally {
    fn of(results: &Results) -> Tally {
        let mut t = Tally::default();
        for o in results.values() {
            match o {
                Outcome::Passed => t.passed += 1,
                Outcome::Failed => t.failed += 1,
                Outcome::Ignored => t.ignored += 1,
            }
        }
        t
    }
}

/// Runs the whole suite.
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    let host_only = args.iter().any(|a| a == "--host-only");
    if let Some(bad) = args.iter().find(|a| *a != "--host-only") {
        fail!("unknown option `{bad}` (cargo xtask test [--host-only])");
    }
    let started = Instant::now();
    setup::packages()?;
    // Mooncake's wheel: its HTTP metadata server is a peer of the engine's tests.
    dmabuf_testbed::wheels::fetch_all(paths)?;
    if !host_only {
        let k = kernel::fetch(paths)?;
        initramfs::build(paths, &k)?;
    }

    let step = Step::start("cargo fmt --check");
    sh::run(paths.cargo().args(["fmt", "--all", "--check"]))
        .map_err(|e| format!("{e}\n    formatting differs: run `cargo fmt --all`"))?;
    step.done();
    let step = Step::start("cargo clippy (warnings denied)");
    sh::run(paths.cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ]))?;
    step.done();
    // The Rust verbs crates' loops (bench/verbs-crates, a workspace of its own that the
    // project's builds leave out) under the same two rules.
    let step = Step::start("bench/verbs-crates: fmt and clippy (warnings denied)");
    let manifest = paths.root.join("bench/verbs-crates/Cargo.toml");
    sh::run(
        paths
            .cargo()
            .args(["fmt", "--all", "--check", "--manifest-path"])
            .arg(&manifest),
    )
    .map_err(|e| {
        format!(
            "{e}\n    formatting differs: run `cargo fmt --all --manifest-path {}`",
            manifest.display()
        )
    })?;
    sh::run(
        paths
            .verbs_crates_cargo(&["clippy", "--quiet", "--release", "--all-targets"])
            .args(["--", "-D", "warnings"]),
    )?;
    step.done();
    let step = Step::start("cargo doc (warnings denied)");
    sh::run(paths.cargo().env("RUSTDOCFLAGS", "-D warnings").args([
        "doc",
        "--workspace",
        "--no-deps",
        "--quiet",
    ]))?;
    step.done();

    let step = Step::start("host tests");
    let host_out = stream(paths.cargo().args(["test", "--workspace"]))?;
    let host = parse(&host_out.text);
    let host_tally = Tally::of(&host);
    step.done();
    info(format!(
        "host: {} passed, {} failed, {} ignored (tests that need the testbed VM)",
        host_tally.passed, host_tally.failed, host_tally.ignored
    ));
    let mut failed = host_tally.failed;
    let mut passed = host_tally.passed;
    let mut harness_ok = host_out.success || host_tally.failed > 0;
    if !host_out.success && host_tally.failed == 0 {
        info("host: cargo test failed without a failing test (a build error?)");
    }
    // The crates as a user depends on them, the Python wheel as a user installs it, and the
    // raw pointer code's unit tests under Miri: counted as one test each.
    for ok in [
        crate::packaging::check(paths)?,
        crate::wheel::check(paths)?,
        crate::miri::check(paths)?,
    ] {
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }

    let mut ran_in_vm = 0;
    let mut reboots = 0;
    if !host_only {
        if harness_self_check(paths)? {
            passed += 1;
        } else {
            failed += 1;
        }
        // The testbed program's own tests boot VMs themselves: they run here, on the host.
        let (tool_bins, bins): (Vec<_>, Vec<_>) = test_binaries(paths)?
            .into_iter()
            .partition(|(name, _)| name == TOOL_TESTS);
        for (_, exe) in &tool_bins {
            let t = tool_tests(paths, exe)?;
            passed += t.passed;
            failed += t.failed;
            ran_in_vm += t.passed + t.failed;
        }
        // For tests/tests/programs/python_package.rs: the gpu_rdma package, staged under target/.
        gpu_rdma_bench::workspace::python::stage(paths)?;
        // For tests/tests/rdma/rdma_cost.rs: instructions are counted in the release build.
        paths.release_example("rdma_bench")?;
        // And the same loop written with the Rust verbs crates, counted beside it.
        // Their build failing (a crate's own rdma-core build, the network) fails the one test
        // that counts them, for want of the programs, not the run: every other test runs.
        if let Err(e) = paths.verbs_crates() {
            eprintln!(
                "    bench/verbs-crates did not build ({e:#}): \
                 tests/tests/rdma/rdma_cost.rs will fail"
            );
        }
        for (phase, set) in vm_tests(&bins)? {
            let count: usize = set.values().map(Vec::len).sum();
            let step = Step::start(format!("{count} VM tests in the {}", phase.label()));
            let (results, vm_ok, rebooted) = run_in_vm(paths, &set, phase)?;
            reboots += usize::from(rebooted);
            step.done();
            let t = Tally::of(&results);
            let missing = count.saturating_sub(t.passed + t.failed);
            info(format!(
                "vm ({}): {} passed, {} failed{}",
                phase.label(),
                t.passed,
                t.failed,
                if missing > 0 {
                    format!(", {missing} did not report")
                } else {
                    String::new()
                }
            ));
            passed += t.passed;
            failed += t.failed + missing;
            ran_in_vm += t.passed + t.failed;
            harness_ok &= vm_ok;
        }
    }
    let skipped = host_tally.ignored.saturating_sub(ran_in_vm);
    info(format!(
        "whole run took {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    if reboots > 0 {
        info(format!(
            "{reboots} VM phase(s) booted a second time after an emulator fault (QEMU's CPU \
             state went wrong; docs/testbed.md, \"Emulator faults\"): the counts are the second \
             boot's"
        ));
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 || !harness_ok || (!host_only && skipped > 0) {
        if skipped > 0 && !host_only {
            info("some ignored tests ran nowhere: every #[ignore] test must run in the VM");
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

struct Streamed {
    text: String,
    success: bool,
}

/// Runs `cmd`, copying its stdout to ours and keeping it; stderr passes through.
fn stream(cmd: &mut Command) -> Result<Streamed> {
    let mut child = cmd.stdout(Stdio::piped()).spawn()?;
    let mut text = String::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            text.push_str(&line);
            text.push('\n');
        }
    }
    let success = child.wait()?.success();
    Ok(Streamed { text, success })
}

/// Parses libtest output. `### BIN <name>` lines (our VM script's) set the binary.
pub fn parse(text: &str) -> Results {
    let mut out = Results::new();
    let mut bin = String::new();
    for raw in text.lines() {
        let line = raw.trim_end_matches('\r');
        if let Some(b) = line.strip_prefix("### BIN ") {
            bin = b.trim().to_string();
            continue;
        }
        if let Some(b) = line.trim_start().strip_prefix("Running ") {
            bin = b.to_string();
            continue;
        }
        let Some(rest) = line.strip_prefix("test ") else {
            continue;
        };
        let Some((name, verdict)) = rest.rsplit_once(" ... ") else {
            continue;
        };
        let outcome = if verdict == "ok" {
            Outcome::Passed
        } else if verdict.starts_with("FAILED") {
            Outcome::Failed
        } else if verdict.starts_with("ignored") {
            Outcome::Ignored
        } else {
            continue;
        };
        out.insert((bin.clone(), name.to_string()), outcome);
    }
    out
}

/// Builds the test binaries; returns (short name, path) of each.
fn test_binaries(paths: &Paths) -> Result<Vec<(String, PathBuf)>> {
    let json = sh::output(paths.cargo().args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json",
        "--quiet",
    ]))?;
    let mut bins = Vec::new();
    for line in json.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" || v["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        let name = format!(
            "{}::{}",
            v["target"]["name"].as_str().unwrap_or("?"),
            v["target"]["kind"][0].as_str().unwrap_or("?")
        );
        bins.push((name, PathBuf::from(exe)));
    }
    Ok(bins)
}

/// Per binary: its VM tests of one phase (of all its test files).
pub(crate) type VmSet = BTreeMap<PathBuf, Vec<String>>;

/// The VM tests of every binary, grouped by phase (in phase order).
fn vm_tests(bins: &[(String, PathBuf)]) -> Result<BTreeMap<Phase, VmSet>> {
    let mut phases = BTreeMap::<Phase, VmSet>::new();
    for (_, exe) in bins {
        let list =
            sh::output(programs::built(exe).args(["--list", "--ignored", "--format", "terse"]))?;
        for line in list.lines() {
            let Some(name) = line.strip_suffix(": test") else {
                continue;
            };
            phases
                .entry(Phase::of(name)?)
                .or_default()
                .entry(exe.clone())
                .or_default()
                .push(name.to_string());
        }
    }
    Ok(phases)
}

/// A binary's `tests` by test file ([`Phase::file_of`]), files in name order, each file's
/// tests in the order given.
fn by_file(tests: &[String]) -> BTreeMap<&str, Vec<String>> {
    let mut files = BTreeMap::<&str, Vec<String>>::new();
    for t in tests {
        files.entry(Phase::file_of(t)).or_default().push(t.clone());
    }
    files
}

/// The script the VM runs: every binary's VM tests, one binary after another, and in each
/// binary one test file after another, each file's tests in a process of their own (the same
/// order on every node).
pub(crate) fn vm_script(set: &VmSet, phase: Phase) -> String {
    let mut s = String::from("status=0\nexport RUST_BACKTRACE=1\n");
    for (exe, tests) in set {
        let shown = exe
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        // The binary through a variable: a test binary this workspace built, not a program
        // of the table (programs::write_script checks every other command of the script).
        s.push_str(&format!(
            "echo '### BIN {shown}'\nBIN={}\n",
            sh::quote(&exe.to_string_lossy())
        ));
        for file_tests in by_file(tests).values() {
            s.push_str(&format!(
                "\"$BIN\" --ignored --color never {} || status=1\n",
                phase.args(file_tests)
            ));
        }
    }
    s.push_str("exit $status\n");
    s
}

/// Returns the phase's results, whether every node stayed clean, and whether the phase was
/// booted a second time after an emulator fault.
fn run_in_vm(paths: &Paths, set: &VmSet, phase: Phase) -> Result<(Results, bool, bool)> {
    let script = paths.testbed.join(format!("vm-tests-{phase:?}.sh"));
    programs::write_script(&script, &vm_script(set, phase))?;
    let nodes = phase.nodes();
    let opts = vm::Opts {
        nodes,
        nics: phase.nics(),
        topology: phase.topology(),
        mode: phase.mode(),
        timeout: Duration::from_secs(3600),
        expose: paths.vm_expose(),
        env: paths.cluster_env()?,
        ..vm::Opts::default()
    };
    let argv = vec!["sh".to_string(), script.to_string_lossy().into_owned()];
    let (results, rebooted) = vm::run_past_emulator_fault(paths, &argv, &opts, true)?;
    let vm_ok = results.iter().all(|r| r.ok());
    // A two-node test passed only if it passed on both nodes (and reported on both).
    let per_node: Vec<Results> = results.iter().map(|r| parse(&r.console)).collect();
    let mut merged = Results::new();
    for node in &per_node {
        for (key, &outcome) in node {
            let reported_everywhere = per_node.iter().all(|n| n.contains_key(key));
            let outcome = if reported_everywhere {
                outcome
            } else {
                Outcome::Failed
            };
            let slot = merged.entry(key.clone()).or_insert(outcome);
            if outcome != Outcome::Passed {
                *slot = outcome;
            }
        }
    }
    Ok((merged, vm_ok, rebooted))
}

/// The test binary of the `dmabuf-testbed` program (`testbed/tests/tool.rs`), as
/// [`test_binaries`] names it.
const TOOL_TESTS: &str = "tool::test";

/// Runs the `dmabuf-testbed` program's ignored tests on the host, one at a time (each boots
/// the testbed), with the cache in `target/testbed`.
fn tool_tests(paths: &Paths, exe: &std::path::Path) -> Result<Tally> {
    let step = Step::start("the dmabuf-testbed program's own tests (each boots the testbed)");
    let out = stream(
        programs::built(exe)
            .args(["--ignored", "--test-threads=1", "--color", "never"])
            .env(dmabuf_testbed::CACHE_ENV, &paths.testbed),
    )?;
    step.done();
    let t = Tally::of(&parse(&out.text));
    info(format!(
        "dmabuf-testbed (host, booting VMs): {} passed, {} failed",
        t.passed, t.failed
    ));
    if !out.success && t.failed == 0 {
        fail!("the dmabuf-testbed program's tests failed without a failing test");
    }
    Ok(t)
}

/// The self-check's command: a kernel warning, a taint flag and exit status 3.
pub(crate) const SELF_CHECK: &str =
    "echo 'WARNING: CPU: 0 PID: 1 at selftest (injected by cargo xtask test)' > /dev/kmsg; \
     echo 512 > /proc/sys/kernel/tainted; exit 3";

/// Proves on a real boot that the harness catches what it must: a command's non-zero exit
/// status, a `WARNING:` line in the kernel log, and a taint flag.
fn harness_self_check(paths: &Paths) -> Result<bool> {
    let step = Step::start("harness self-check (a failing command and a kernel warning)");
    let argv: Vec<String> = ["sh", "-c", SELF_CHECK].map(String::from).to_vec();
    let results = vm::run_quiet(paths, &argv, &vm::Opts::default())?;
    step.done();
    let r = &results[0];
    let ok = r.status == Some(3)
        && r.problems
            .iter()
            .any(|p| p.contains("WARNING: CPU: 0 PID: 1 at selftest"))
        && r.problems
            .iter()
            .any(|p| p.contains("kernel tainted:") && p.ends_with("(W)"));
    if ok {
        info("harness self-check: exit status 3, the injected warning and the W taint were caught");
    } else {
        info(format!(
            "harness self-check FAILED: status {:?}, problems {:?}",
            r.status, r.problems
        ));
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "\
     Running unittests src/lib.rs (target/debug/deps/a-1)
running 3 tests
test x::ok_one ... ok
test x::bad ... FAILED
test x::vm ... ignored, needs the testbed VM
### BIN b-2\r
test x::ok_one ... ok\r
test result: ok. 1 passed; 0 failed
";

    #[test]
    fn parses_libtest_lines_per_binary() {
        let r = parse(OUT);
        assert_eq!(r.len(), 4);
        assert_eq!(
            Tally::of(&r),
            Tally {
                passed: 2,
                failed: 1,
                ignored: 1
            }
        );
        assert_eq!(
            r[&("b-2".to_string(), "x::ok_one".to_string())],
            Outcome::Passed
        );
    }

    #[test]
    fn each_phase_script_names_its_tests_exactly_and_two_node_runs_them_in_order() {
        let mut set = VmSet::new();
        set.insert(
            PathBuf::from("/t/bin-1"),
            vec!["two_node::a".into(), "two_node::b".into()],
        );
        let s = vm_script(&set, Phase::Two);
        assert!(s.contains(
            "BIN='/t/bin-1'\n\"$BIN\" --ignored --color never --exact --test-threads=1 \
             'two_node::a' 'two_node::b'"
        ));
        programs::check(&s, false).unwrap();
        let one = vm_script(&set, Phase::One);
        assert!(one.contains("--exact 'two_node::a'") && !one.contains("--skip"));
        programs::check(&one, false).unwrap();
    }

    /// The `"$BIN" ...` lines of a script: one per process.
    fn runs(script: &str) -> Vec<&str> {
        script
            .lines()
            .filter(|l| l.starts_with("\"$BIN\""))
            .collect()
    }

    /// A binary of several test files is started once per file, files in name order, each
    /// naming its own tests only; a binary of one file is started once.
    #[test]
    fn each_test_file_of_a_binary_runs_in_a_process_of_its_own() {
        let mut set = VmSet::new();
        set.insert(
            PathBuf::from("/t/rdma-1"),
            vec![
                "rdma_srq::a".into(),
                "rdma_cm::b".into(),
                "rdma_srq::c".into(),
                "rdma_cm::inner::d".into(),
            ],
        );
        set.insert(PathBuf::from("/t/alloc-2"), vec!["x".into(), "y".into()]);
        let s = vm_script(&set, Phase::One);
        let head = "\"$BIN\" --ignored --color never --exact";
        assert_eq!(
            runs(&s),
            [
                format!("{head} 'x' 'y' || status=1"),
                format!("{head} 'rdma_cm::b' 'rdma_cm::inner::d' || status=1"),
                format!("{head} 'rdma_srq::a' 'rdma_srq::c' || status=1"),
            ],
            "{s}"
        );
        assert!(s.contains("echo '### BIN rdma-1'\nBIN='/t/rdma-1'\n"));
        programs::check(&s, false).unwrap();
    }

    /// On two nodes, each file's process steps through its tests one at a time, and the
    /// script (the same on both nodes) orders files and tests alike.
    #[test]
    fn two_node_files_run_apart_one_test_at_a_time() {
        let mut set = VmSet::new();
        set.insert(
            PathBuf::from("/t/engine-1"),
            vec![
                "engine_two_node::two_node::a".into(),
                "engine_etcd::two_node::b".into(),
                "engine_two_node::two_node::c".into(),
            ],
        );
        set.insert(PathBuf::from("/t/one-2"), vec!["two_node::x".into()]);
        let s = vm_script(&set, Phase::Two);
        let head = "\"$BIN\" --ignored --color never --exact --test-threads=1";
        assert_eq!(
            runs(&s),
            [
                format!("{head} 'engine_etcd::two_node::b' || status=1"),
                format!(
                    "{head} 'engine_two_node::two_node::a' 'engine_two_node::two_node::c' \
                     || status=1"
                ),
                format!("{head} 'two_node::x' || status=1"),
            ],
            "{s}"
        );
        programs::check(&s, false).unwrap();
    }

    /// The console of a binary started once per file: tests of the same name in two files
    /// are counted apart (keyed by the whole path), and a dead process reports nothing.
    #[test]
    fn results_of_a_binary_started_per_file_are_keyed_by_file() {
        let console = "### BIN rdma-1\nrunning 2 tests\ntest rdma_cm::same ... ok\n\
            test rdma_cm::other ... FAILED\nrunning 1 test\ntest rdma_srq::same ... ok\n\
            running 1 test\n";
        let t = Tally::of(&parse(console));
        assert_eq!((t.passed, t.failed, t.ignored), (2, 1, 0));
    }
}
