//! Project automation. Run `cargo xtask help`.

mod bench;
mod demo;
mod miri;
mod mooncake;
mod nixl;
mod packaging;
mod phase;
mod pinned;
mod python;
mod rdmacore;
mod script;
mod soak;
mod testrun;
mod wheel;

// The testbed itself (VM, kernel, initramfs, patched stack, the programs table) is the
// `dmabuf-testbed` library, named by its own paths.
// Modules and items of the testbed are written with `dmabuf_testbed::` here too: a `use` at
// the crate root would make them `crate::` names for every module of xtask.
use std::path::PathBuf;
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
  bench [opts]          RDMA write bandwidth, message rate and latency beside perftest, over
                        host and dma-buf regions, and registration time; the transfer
                        engine's bandwidth and batch latency (4 KiB..4 MiB, one and three
                        peers) and its allocations per chunk (a gate); one node and two;
                        a table, target/bench/bench.json and plots (docs/performance.md)
      --quick             two sizes, three rounds, one node: a few minutes
      --nodes 1|2|both    which testbeds (default: both; --quick: 1)
      --rounds N          rounds of every step (default 3)
      --sizes 8,64K,1M    message sizes (default: 2 B to 8 MiB, powers of two)
      --only perftest,engine  only the series whose names start so
      --replot FILE       draw the plots of a run's bench.json again, into target/bench/
  bench --rails [opts]  the transfer engine over 1, 2 and 4 rails between two nodes (four
                        NICs, the PCIe topology): aggregate bandwidth, each rail's share,
                        vCPU use, a rail cut mid-batch; target/bench/rails.json
      --bytes 64M         each batch (default 64 MiB)
      --rounds N          batches per rail count (default 3)
      --rails 1,2,4       the rail counts
  bench --peers [opts]  the transfer engine against Mooncake's transfer_engine_bench (its
                        wheel unpacked by setup), two nodes, interleaved; a batch over
                        128 MiB is left out; target/bench/peers.json
      --sizes 64K,1M      block sizes (default 4 KiB..4 MiB)
      --batches 1,128     batch sizes (default 1,128)
      --threads 1,4       submitting threads (default 1,4)
      --ops write,read    operations (default both)
      --metadata MODE     p2p (the P2P handshake, default), etcd (an etcd on node a) or both
      --plot              draw the plots (target/bench/*-peers.png) again from peers.json
      --rounds N          rounds of every cell (default 3)
      --duration S        seconds of each run (default 5)
  bench --sched-trace [opts]  the one-node ping-pongs (ib_write_lat, rdma_bench lat and
                        lat-poll) under RUN_TO_PARITY and NO_RUN_TO_PARITY, each run traced
                        with the guest's scheduler tracepoints: per run, the median round trip
                        and the wake-ups of rxe's kworkers that waited a tick or more;
                        target/bench/sched-<time>/
      --runs N            runs of each program and setting (default 5)
      --iters N --size B  round trips per run (default 300), message size (default 2)
      --settings S,S      RUN_TO_PARITY, NO_RUN_TO_PARITY (default both)
      --host-load N       N busy threads on the host meanwhile (provokes the stalls)
      --stock             Debian's own rxe and rdma-core (host regions need no patch)
      --report DIR        print a previous run's report again
  demo                  the main job: the GPU-buffer RDMA demo in the two-node testbed
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

/// Where things live.
pub struct Paths {
    /// The workspace root.
    pub root: PathBuf,
    /// Cargo's target folder.
    pub target: PathBuf,
    /// The testbed's cache (kernel, initramfs, runs): `target/testbed`.
    pub testbed: PathBuf,
    /// The same folder as the testbed library's cache.
    cache: dmabuf_testbed::Cache,
}

/// xtask's paths are the testbed's cache (`target/testbed`): the library's calls take them
/// where they ask for a cache.
impl std::ops::Deref for Paths {
    type Target = dmabuf_testbed::Cache;
    fn deref(&self) -> &dmabuf_testbed::Cache {
        &self.cache
    }
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
            cache: dmabuf_testbed::Cache::new(&testbed),
            testbed,
        }
    }

    /// Folders the testbed must bind back when they are under `/tmp` or `/run`: the
    /// workspace and its target folder (set these in every `dmabuf_testbed::vm::Opts::expose` of xtask).
    pub fn vm_expose(&self) -> Vec<PathBuf> {
        vec![self.root.clone(), self.target.clone()]
    }

    /// The environment that gives the engine's agents in the testbed the cluster key
    /// (`GPU_RDMA_CLUSTER_KEY_FILE`): every agent of every xtask run authenticates, as in a
    /// real cluster. The key is made once, random, in `target/testbed/cluster.key`
    /// (mode 0600: the engine refuses a key file others can read).
    pub fn cluster_env(&self) -> dmabuf_testbed::sh::Result<Vec<(String, String)>> {
        use std::io::{Read, Write};
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.testbed.join("cluster.key");
        if !path.exists() {
            std::fs::create_dir_all(&self.testbed)?;
            let mut key = [0u8; 32];
            std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
            let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            writeln!(f, "{hex}")?;
        }
        let Some(shown) = path.to_str() else {
            dmabuf_testbed::fail!("{}: the key file's path is not UTF-8", path.display())
        };
        Ok(vec![("GPU_RDMA_CLUSTER_KEY_FILE".into(), shown.to_owned())])
    }

    /// `cargo` (the one running this xtask), in the workspace root.
    fn cargo(&self) -> std::process::Command {
        let mut c = dmabuf_testbed::programs::cmd("cargo");
        c.current_dir(&self.root);
        c
    }

    /// Builds the example `name` of the `examples` package in release; returns its path.
    fn release_example(&self, name: &str) -> dmabuf_testbed::sh::Result<PathBuf> {
        self.release_example_with(name, &[])
    }

    /// As [`Paths::release_example`], with the `examples` package's `features`.
    fn release_example_with(
        &self,
        name: &str,
        features: &[&str],
    ) -> dmabuf_testbed::sh::Result<PathBuf> {
        let step = dmabuf_testbed::ui::Step::start(format!("building examples/{name} (release)"));
        let mut c = self.cargo();
        c.args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "examples",
            "--example",
            name,
        ]);
        if !features.is_empty() {
            c.arg("--features").arg(features.join(","));
        }
        dmabuf_testbed::sh::run(&mut c)?;
        step.done();
        Ok(self.target.join("release/examples").join(name))
    }

    /// Builds the write-cost loops written with the Rust verbs crates (`bench/verbs-crates`,
    /// its own package and lock, outside the workspace) in release under
    /// `target/verbs-crates`; returns the folder of its programs (`sideway_cost`,
    /// `sideway_basic_cost`, `ibverbs_cost`).
    fn verbs_crates(&self) -> dmabuf_testbed::sh::Result<PathBuf> {
        let step = dmabuf_testbed::ui::Step::start("building bench/verbs-crates (release)");
        dmabuf_testbed::sh::run(&mut self.verbs_crates_cargo(&["build", "--quiet", "--release"]))?;
        step.done();
        Ok(self.target.join("verbs-crates/release"))
    }

    /// `cargo ARGS --locked` on `bench/verbs-crates` (its manifest), with its own target
    /// folder, `target/verbs-crates` (its release build and clippy share it).
    fn verbs_crates_cargo(&self, args: &[&str]) -> std::process::Command {
        let mut c = self.cargo();
        c.args(args)
            .args(["--locked", "--manifest-path"])
            .arg(self.root.join("bench/verbs-crates/Cargo.toml"))
            .arg("--target-dir")
            .arg(self.target.join("verbs-crates"));
        c
    }
}

/// Every script xtask runs or writes (the testbed library holds its own to the table),
/// generated with sample inputs: the test below checks each against the programs table.
/// Filling a template in fails here when a placeholder is left unfilled or a value names none.
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, String)> {
    use std::path::Path;
    let cwd = Path::new("/t/src");
    let mut vm_tests = std::collections::BTreeMap::new();
    vm_tests.insert(PathBuf::from("/t/bin-1"), vec!["a_test".to_string()]);
    vec![
        ("bench.sh", script::BENCH.to_string()),
        ("demo.sh", script::DEMO.to_string()),
        ("peers.sh", script::PEERS.to_string()),
        ("sched.sh", script::SCHED.to_string()),
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

/// The help text, with the testbed's run options in place.
fn help() -> String {
    HELP.replace("@OPTIONS@", dmabuf_testbed::cli::RUN_OPTIONS)
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
        "bench" => {
            dmabuf_testbed::setup::packages()?;
            bench::main(&paths, rest)
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
