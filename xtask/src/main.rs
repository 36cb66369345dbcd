//! Project automation. Run `cargo xtask help`.

mod accel;
mod backports;
mod bench;
mod demo;
mod initramfs;
mod klog;
mod packaging;
mod patched;
mod programs;
mod rdmacore;
mod script;
mod setup;
mod sh;
mod shscan;
mod soak;
mod testrun;
mod ui;
mod vm;

use sh::Result;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const HELP: &str = "\
cargo xtask <command>

  setup                 install system packages (as root) and fetch the testbed kernel
  vm [opts] -- CMD...   boot the testbed VM and run CMD inside; exits with CMD's status
      --nodes 1|2         two VMs joined by a virtual wire (CMD runs on both, NODE=a|b)
      --timeout SECS      stop and fail after SECS (default 1800)
      --mode patched|stock  rxe and rdma-core with kernel-patches/ (default) or Debian's
  test [--host-only]    fmt, clippy, host tests, then the VM tests; prints
                        `N passed, N failed, N skipped`
  bench [opts]          RDMA write bandwidth, message rate and latency beside perftest, over
                        host and dma-buf regions, and registration time; one node and two;
                        a table, target/bench/bench.json and plots (docs/performance.md)
      --quick             two sizes, three rounds, one node: a few minutes
      --nodes 1|2|both    which testbeds (default: both; --quick: 1)
      --rounds N          rounds of every step (default 3)
      --sizes 8,64K,1M    message sizes (default: 2 B to 8 MiB, powers of two)
      --replot FILE       draw the plots of a run's bench.json again, into target/bench/
  demo                  the main job: the GPU-buffer RDMA demo in the two-node testbed
  soak [opts]           the demo many times in a row, counting failures, emulator faults
                        and second boots
      --demo N            how many demo runs (default 10)
      --hog               a CPU hog (stress-ng) on every host core meanwhile
      --test              then cargo xtask test, under the same hog
  rdma-core-tests       rdma-core's own test suite on the patched and the stock rxe, compared
";

/// Where things live.
pub struct Paths {
    /// The workspace root.
    pub root: PathBuf,
    /// Cargo's target folder.
    pub target: PathBuf,
    /// The testbed's cache (kernel, initramfs, runs).
    pub testbed: PathBuf,
}

impl Paths {
    fn find() -> Paths {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("xtask lives inside the workspace")
            .to_path_buf();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .map(|t| if t.is_absolute() { t } else { root.join(t) })
            .unwrap_or_else(|| root.join("target"));
        let testbed = target.join("testbed");
        Paths {
            root,
            target,
            testbed,
        }
    }

    /// `cargo` (the one running this xtask), in the workspace root.
    fn cargo(&self) -> std::process::Command {
        let mut c = programs::cmd("cargo");
        c.current_dir(&self.root);
        c
    }

    /// Builds the example `name` of the `examples` package in release; returns its path.
    fn release_example(&self, name: &str) -> Result<PathBuf> {
        let step = ui::Step::start(format!("building examples/{name} (release)"));
        sh::run(self.cargo().args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "examples",
            "--example",
            name,
        ]))?;
        step.done();
        Ok(self.target.join("release/examples").join(name))
    }
}

/// Every script xtask runs or writes (except the initramfs's `/init`, which runs busybox applets
/// only, and `cmd.sh`, the `vm` command's caller's own), generated with sample inputs: the
/// programs table's test checks each against the table. Filling a template in fails here when
/// a placeholder is left unfilled or a value names none.
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, String)> {
    use std::path::Path;
    let (dir, cwd) = (Path::new("/t/run/a"), Path::new("/t/src"));
    let patched = patched::Patched {
        module: "/t/rdma_rxe.ko".into(),
        exporter: "/t/dmabuf_test_exporter.ko".into(),
        lib: "/t/lib".into(),
    };
    let mut vm_tests = std::collections::BTreeMap::new();
    vm_tests.insert(PathBuf::from("/t/bin-1"), vec!["a_test".to_string()]);
    let mut out = vec![
        ("bench.sh", script::BENCH.to_string()),
        ("demo.sh", script::DEMO.to_string()),
        ("self-check", testrun::SELF_CHECK.to_string()),
        (
            "VM tests",
            testrun::vm_script(&vm_tests, testrun::Phase::One),
        ),
        (
            "initramfs packing",
            initramfs::pack_script(Path::new("/t/x")),
        ),
        (
            "rxe-sources.sh",
            patched::source_script(Path::new("/t/x.deb"), Path::new("/t/x")).unwrap(),
        ),
        (
            "rdma-core-suite.sh",
            rdmacore::suite_script("/t/lib", cwd).unwrap(),
        ),
        ("apt install", setup::install_script(&["a", "b"])),
        (
            "apt install with QEMU",
            setup::install_script(&["a", backports::QEMU_PACKAGE]),
        ),
    ];
    for nodes in [1, 2] {
        for p in [None, Some(&patched)] {
            let opts = vm::Opts {
                nodes,
                env: vec![("K".into(), "v".into())],
                ..vm::Opts::default()
            };
            let inner = vm::inner_script(dir, cwd, 'a', &opts, p).unwrap();
            out.push(("inner.sh", inner));
        }
    }
    out
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

fn dispatch(args: &[String]) -> Result<ExitCode> {
    let paths = Paths::find();
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{HELP}");
        return Ok(ExitCode::FAILURE);
    };
    match cmd.as_str() {
        "setup" => {
            setup::packages()?;
            let k = setup::kernel(&paths)?;
            initramfs::build(&paths, &k)?;
            ui::info(format!("testbed ready: kernel {}", k.version));
            Ok(ExitCode::SUCCESS)
        }
        "vm" => {
            let (opts, argv) = parse_vm_args(rest)?;
            setup::packages()?;
            let results = vm::run(&paths, &argv, &opts)?;
            Ok(exit_code(&results))
        }
        "test" => testrun::main(&paths, rest),
        "demo" => demo::main(&paths),
        "soak" => soak::main(&paths, rest),
        "rdma-core-tests" => rdmacore::main(&paths),
        "bench" => {
            setup::packages()?;
            bench::main(&paths, rest)
        }
        "help" | "-h" | "--help" => {
            eprint!("{HELP}");
            Ok(ExitCode::SUCCESS)
        }
        other => fail!("unknown command `{other}`\n{HELP}"),
    }
}

/// The first failing node's status (or 1 for a kernel problem), else 0.
fn exit_code(results: &[vm::NodeResult]) -> ExitCode {
    for r in results {
        match r.status {
            Some(0) if r.problems.is_empty() => continue,
            Some(s) if s != 0 => return ExitCode::from(u8::try_from(s).unwrap_or(1)),
            _ => return ExitCode::FAILURE,
        }
    }
    ExitCode::SUCCESS
}

fn parse_vm_args(args: &[String]) -> Result<(vm::Opts, Vec<String>)> {
    let mut opts = vm::Opts::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--" => return Ok((opts, it.cloned().collect())),
            "--nodes" => {
                opts.nodes = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--nodes takes 1 or 2")?
            }
            "--mode" => {
                opts.mode = match it.next().map(String::as_str) {
                    Some("patched") => vm::Mode::Patched,
                    Some("stock") => vm::Mode::Stock,
                    _ => fail!("--mode takes patched or stock"),
                }
            }
            "--timeout" => {
                let secs: u64 = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--timeout takes seconds")?;
                opts.timeout = Duration::from_secs(secs);
            }
            _ => {
                // No `--`: the rest is the command.
                let mut argv = vec![a.clone()];
                argv.extend(it.cloned());
                return Ok((opts, argv));
            }
        }
    }
    fail!("no command given: cargo xtask vm -- <command> [args...]")
}
