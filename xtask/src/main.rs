//! Project automation. Run `cargo xtask help`.

mod demo;
mod miri;
mod mooncake;
mod nixl;
mod packaging;
mod phase;
mod pinned;
mod rdmacore;
mod script;
mod soak;
mod testrun;
mod wheel;

// The testbed itself (VM, kernel, initramfs, patched stack, the programs table) is the
// `dmabuf-testbed` library, named by its own paths.
// Modules and items of the testbed are written with `dmabuf_testbed::` here too: a `use` at
// the crate root would make them `crate::` names for every module of xtask.
// The benchmarks are the `gpu-rdma-bench` library (`bench/`), which also holds what xtask
// shares with them (`gpu_rdma_bench::workspace`: the workspace's paths, its release builds,
// the Python package's staging, a boot with the cluster key); modules name it by that path.
use gpu_rdma_bench::workspace::{python, Paths};
use std::process::ExitCode;

const HELP: &str = "\
cargo xtask <command>

  setup                 install system packages (as root), fetch the testbed kernel and build
                        what a boot needs (initramfs, patched rxe, test exporter, rdma-core)
  vm [opts] -- CMD...   boot the testbed VM and run CMD inside; exits with CMD's status
                        (dmabuf-testbed run, with the cache in target/testbed and the
                        working folder read-only; its options:)
@OPTIONS@  test [--host-only]    fmt, clippy, host tests, then the VM tests; prints
                        `N passed, N failed, N skipped`
@BENCH@  demo                  the main job: the GPU-buffer RDMA demo in the two-node testbed
  soak [opts]           the demo many times in a row, counting failures, emulator faults
                        and second boots
      --demo N            how many demo runs (default 10)
      --hog               a CPU hog (stress-ng) on every host core meanwhile
      --test              then cargo xtask test, under the same hog
  python                build the Python package gpu_rdma's module and stage the package in
                        target/debug/python (cargo xtask test does it before the VM tests)
  wheel [--debug]       the Python package as a wheel (cp39-abi3) in target/release/wheels
                        (no maturin needed; `pip install ./python` builds one with maturin)
  rdma-core-tests       rdma-core's own test suite on the patched and the stock rxe, compared
  mooncake-tests [opts] Mooncake's own transfer-engine tests (fetched at their pinned tag,
                        never committed) in the two-node testbed against our mooncake.engine
      --source DIR        a Mooncake checkout (or a folder with the two files) instead of
                          downloading them
      --engine E          ours (default), mooncake (the pinned wheel's), or both
      --metadata M        p2p, ours, mooncake (whose HTTP metadata server), or all (default)
  nixl-tests [opts]     NIXL's own Python tests and two-peer examples (fetched at their pinned
                        tag, never committed) in the testbed against our nixl package
      --source DIR        a NIXL checkout instead of downloading them
      --engine E          ours (default), nixl (the pinned wheel's, UCX backend), or both
";

/// Every script xtask runs or writes (the testbed library and the bench check their own),
/// generated with sample inputs: the test below checks each against the programs table.
/// Filling a template in fails here when a placeholder is left unfilled or a value names none.
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, String)> {
    use std::path::Path;
    let cwd = Path::new("/t/src");
    let mut vm_tests = std::collections::BTreeMap::new();
    vm_tests.insert(
        std::path::PathBuf::from("/t/bin-1"),
        vec!["a_test".to_string()],
    );
    vec![
        ("demo.sh", script::DEMO.to_string()),
        ("self-check", testrun::SELF_CHECK.to_string()),
        ("VM tests", testrun::vm_script(&vm_tests, phase::Phase::One)),
        (
            "rdma-core-suite.sh",
            rdmacore::suite_script("/t/lib", cwd).unwrap(),
        ),
    ]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match dispatch(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The help text, with the testbed's run options and the bench's modes in place.
fn help() -> String {
    HELP.replace("@OPTIONS@", dmabuf_testbed::cli::RUN_OPTIONS)
        .replace("@BENCH@", gpu_rdma_bench::USAGE)
}

fn dispatch(args: &[String]) -> dmabuf_testbed::sh::Result<ExitCode> {
    let paths = Paths::find();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{}", help());
        return Ok(ExitCode::FAILURE);
    };
    match cmd.as_str() {
        "setup" => {
            // The same set-up as `dmabuf-testbed setup`, into target/testbed.
            let ready = dmabuf_testbed::setup::testbed(&paths)?;
            // The wheels of the project's own peers (Mooncake's bench: bench --peers).
            dmabuf_testbed::wheels::fetch_all(&paths)?;
            // Miri's pinned nightly (cargo xtask test's Miri check).
            miri::install()?;
            dmabuf_testbed::ui::info(format!("accelerator: {}", ready.accel.summary()));
            dmabuf_testbed::ui::info(ready.summary());
            Ok(ExitCode::SUCCESS)
        }
        "vm" if dmabuf_testbed::cli::wants_help(rest) => {
            eprint!("{}", help());
            Ok(ExitCode::SUCCESS)
        }
        "vm" => {
            let (mut opts, argv) = dmabuf_testbed::cli::parse_run_args(rest)?;
            opts.expose = paths.vm_expose();
            opts.env.extend(paths.cluster_env()?);
            dmabuf_testbed::setup::packages()?;
            let results = dmabuf_testbed::vm::run(&paths, &argv, &opts)?;
            Ok(ExitCode::from(dmabuf_testbed::cli::exit_status(&results)))
        }
        "test" => testrun::main(&paths, rest),
        "python" => {
            let dir = python::stage(&paths)?;
            dmabuf_testbed::ui::info(format!("PYTHONPATH={}", dir.display()));
            Ok(ExitCode::SUCCESS)
        }
        "wheel" => wheel::main(&paths, rest),
        "demo" => demo::main(&paths),
        "soak" => soak::main(&paths, rest),
        "rdma-core-tests" => rdmacore::main(&paths),
        "mooncake-tests" => mooncake::main(&paths, rest),
        "nixl-tests" => nixl::main(&paths, rest),
        "bench" if dmabuf_testbed::cli::wants_help(rest) => {
            eprint!(
                "cargo xtask bench [--rails|--peers|--sched-trace] [opts]\n\n{}",
                gpu_rdma_bench::USAGE
            );
            Ok(ExitCode::SUCCESS)
        }
        "bench" => {
            dmabuf_testbed::setup::packages()?;
            gpu_rdma_bench::main(&paths, rest)
        }
        "help" | "-h" | "--help" => {
            eprint!("{}", help());
            Ok(ExitCode::SUCCESS)
        }
        other => dmabuf_testbed::fail!("unknown command `{other}`\n{}", help()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_runs_only_programs_of_the_table() {
        for (name, script) in super::scripts() {
            if let Err(e) = dmabuf_testbed::programs::check(&script, false) {
                panic!("{name}: {e}");
            }
        }
    }
}
