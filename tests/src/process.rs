//! Running helper programs (perftest, rdma-core's utilities), and closures that might hang,
//! with deadlines.

use serde_json::Value;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The doctor's `--json` report on stdout of `out`.
///
/// # Panics
/// If it is not JSON (with the program's output).
pub fn doctor_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", text(out)))
}

/// The check named `name` of a doctor's JSON report.
///
/// # Panics
/// If there is none (with the report).
pub fn doctor_check<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {report:#}"))
}

/// The doctor binary (`gpu-rdma-doctor`), which `cargo test` builds beside the test binary
/// (its package has tests).
///
/// # Panics
/// If it is not there.
pub fn doctor() -> Command {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = dir.join("gpu-rdma-doctor");
    assert!(
        path.exists(),
        "{} is missing: cargo test builds it",
        path.display()
    );
    // The doctor binary, built by this workspace.
    Command::new(path)
}

/// Runs `cmd` to completion, killing it after `limit`.
///
/// # Panics
/// If the program cannot be started or outlives `limit`: a hung helper is a failed test.
pub fn run(cmd: &mut Command, limit: Duration) -> Output {
    let child = spawn(cmd);
    wait(child, limit, &format!("{cmd:?}"))
}

/// Starts a server in the background with its output captured (finish it with [`wait`]).
///
/// # Panics
/// If it cannot be started.
pub fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// Waits for `child`, killing it after `limit`.
///
/// # Panics
/// If it outlives `limit`.
pub fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("wait");
            panic!(
                "{what} still ran after {limit:?}; output:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("wait")
}

/// Runs a client that may start before its server listens: retries while it fails, until
/// `limit`. Returns the first successful output, or the last failure.
pub fn run_client(mut make: impl FnMut() -> Command, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        let out = run(&mut make(), limit);
        if out.status.success() || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// stdout and stderr together, for assertions and messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The name libtest gives the test `name` of the module at `module` (the caller's
/// `module_path!()`): the path without its first segment, the test binary's crate. A test
/// that runs its own binary again names the test to run with it, so the name holds in a
/// binary of one test file (`engine_alloc` and `x` give `x`) as in a binary of several
/// (`rdma::rdma_unwind` and `x` give `rdma_unwind::x`).
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// Runs this test binary again under valgrind's memcheck, with `args` (test filters and
/// options: name tests with [`test_name`]), and asserts that it found no memory error and
/// that `passed` tests passed. Returns the output.
///
/// # Panics
/// If valgrind cannot start, reports an error, or the tests fail.
pub fn valgrind_self(args: &[&str], passed: usize) -> String {
    let me = std::env::current_exe().expect("this test binary");
    let out = Command::new("valgrind")
        .args(["--error-exitcode=99", "--leak-check=no"])
        .arg(&me)
        .args(["--ignored", "--test-threads=1", "--color", "never"])
        .args(args)
        .output()
        .expect("valgrind runs (cargo xtask setup installs it)");
    let text = text(&out);
    assert!(
        out.status.success(),
        "valgrind found errors or a test failed:\n{text}"
    );
    assert!(text.contains("ERROR SUMMARY: 0 errors"), "{text}");
    assert!(text.contains(&format!("{passed} passed")), "{text}");
    text
}

/// Runs `f` on its own thread and waits at most `limit` for it: a hang fails the test (the
/// stuck thread is left behind) instead of stalling the run; a panic in `f` goes on here.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{what}: still waiting after {limit:?}"),
    }
}

/// The test binary's lock for tests that must run alone: those that count process- or
/// system-wide resources (descriptors, MRs, the kernel's yield count) or that fail a queue
/// pair on purpose (the harness runs tests two at a time). One per test binary: each links
/// its own copy of this library; `cargo xtask test` runs each test file's VM tests in a
/// process of their own, so in the VM one file's tests share it. A test that panicked while
/// holding it does not poison it.
pub fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `n` threads that keep a CPU busy until `stop`, so that a racing test's thread is preempted
/// now and then between its calls. Join them after setting `stop`.
pub fn busy_threads(
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    n: usize,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            })
        })
        .collect()
}
