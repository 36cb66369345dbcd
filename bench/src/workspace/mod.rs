//! The workspace as xtask and the bench both see it: where things live ([`Paths`]), the
//! release builds of the programs the testbed runs (the examples, the verbs crates' loops,
//! the Python package in [`python`]), and a testbed boot with the cluster key ([`boot`]).

pub mod python;

use dmabuf_testbed::sh::Result;
use dmabuf_testbed::vm;
use std::path::{Path, PathBuf};

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

/// The workspace's paths are the testbed's cache (`target/testbed`): the library's calls take them
/// where they ask for a cache.
impl std::ops::Deref for Paths {
    type Target = dmabuf_testbed::Cache;
    fn deref(&self) -> &dmabuf_testbed::Cache {
        &self.cache
    }
}

impl Paths {
    /// The workspace's paths: its root (the folder above this crate's), and Cargo's target
    /// folder (`CARGO_TARGET_DIR`, else `target/`).
    pub fn find() -> Paths {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the bench crate lives inside the workspace")
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
    /// workspace and its target folder (set these in every `dmabuf_testbed::vm::Opts::expose`
    /// of xtask and the bench).
    pub fn vm_expose(&self) -> Vec<PathBuf> {
        vec![self.root.clone(), self.target.clone()]
    }

    /// The environment that gives the engine's agents in the testbed the cluster key
    /// (`GPU_RDMA_CLUSTER_KEY_FILE`): every agent of every xtask and bench run authenticates, as in a
    /// real cluster. The key is made once, random, in `target/testbed/cluster.key`
    /// (mode 0600: the engine refuses a key file others can read).
    pub fn cluster_env(&self) -> Result<Vec<(String, String)>> {
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
    pub fn cargo(&self) -> std::process::Command {
        let mut c = dmabuf_testbed::programs::cmd("cargo");
        c.current_dir(&self.root);
        c
    }

    /// Builds the example `name` of the `examples` package in release; returns its path.
    pub fn release_example(&self, name: &str) -> Result<PathBuf> {
        self.release_example_with(name, &[])
    }

    /// As [`Paths::release_example`], with the `examples` package's `features`.
    pub fn release_example_with(&self, name: &str, features: &[&str]) -> Result<PathBuf> {
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
    pub fn verbs_crates(&self) -> Result<PathBuf> {
        let step = dmabuf_testbed::ui::Step::start("building bench/verbs-crates (release)");
        dmabuf_testbed::sh::run(&mut self.verbs_crates_cargo(&["build", "--quiet", "--release"]))?;
        step.done();
        Ok(self.target.join("verbs-crates/release"))
    }

    /// `cargo ARGS --locked` on `bench/verbs-crates` (its manifest), with its own target
    /// folder, `target/verbs-crates` (its release build and clippy share it).
    pub fn verbs_crates_cargo(&self, args: &[&str]) -> std::process::Command {
        let mut c = self.cargo();
        c.args(args)
            .args(["--locked", "--manifest-path"])
            .arg(self.root.join("bench/verbs-crates/Cargo.toml"))
            .arg("--target-dir")
            .arg(self.target.join("verbs-crates"));
        c
    }
}

/// Boots `nodes` testbed nodes (with `memory` MiB each, if given) that run `sh script`, with
/// the cluster key and `env` in their environment; each node's result.
///
/// # Errors
/// The boot fails.
pub fn boot(
    paths: &Paths,
    script: &Path,
    nodes: u32,
    memory: Option<&str>,
    env: &[(String, String)],
) -> Result<Vec<vm::NodeResult>> {
    let mut args = vec!["--nodes".to_string(), nodes.to_string()];
    if let Some(m) = memory {
        args.extend(["--memory".into(), m.into()]);
    }
    args.extend(["--".into(), "sh".into(), script.display().to_string()]);
    let (mut opts, argv) = dmabuf_testbed::cli::parse_run_args(&args)?;
    opts.expose = paths.vm_expose();
    opts.env.extend(paths.cluster_env()?);
    opts.env.extend(env.iter().cloned());
    vm::run(paths, &argv, &opts)
}
