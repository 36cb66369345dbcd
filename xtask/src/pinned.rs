//! Other projects' test files, pinned by tag and SHA-256, fetched at run time from GitHub (or
//! read from a checkout) and never committed, and whether the testbed boots that run scripts
//! over them passed (`cargo xtask mooncake-tests`, `nixl-tests`; the boots are
//! `gpu_rdma_bench::workspace::boot`, which the bench's NIXL client shares).

use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::Step;
use dmabuf_testbed::{programs, vm};
use std::path::Path;

/// A project's files at a tag.
pub struct Pinned {
    /// Its GitHub repository, `owner/name`.
    pub repo: &'static str,
    /// The tag the files are taken at.
    pub tag: &'static str,
    /// Each file's path in the repository and its SHA-256.
    pub files: &'static [(&'static str, &'static str)],
}

/// Fetches each file (or reads it from `source`: a checkout, or a folder holding the files
/// by name) into `dir` at its path in the repository, checking its SHA-256.
const FETCH: &str = r#"
import hashlib, os, sys, urllib.request
repo, tag, dir, source = sys.argv[1:5]
for pair in sys.argv[5:]:
    path, want = pair.split("=")
    if source:
        cands = [os.path.join(source, path), os.path.join(source, os.path.basename(path))]
        found = [c for c in cands if os.path.isfile(c)]
        if not found:
            sys.exit(f"{source} has no {path} (nor {os.path.basename(path)})")
        data = open(found[0], "rb").read()
    else:
        url = f"https://raw.githubusercontent.com/{repo}/{tag}/{path}"
        try:
            data = urllib.request.urlopen(url, timeout=60).read()
        except OSError as e:
            sys.exit(f"{url}: {e} (no network? pass --source with a checkout at {tag})")
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        sys.exit(f"{path}: SHA-256 {got}, expected {want} ({repo} at {tag})")
    out = os.path.join(dir, path)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    open(out, "wb").write(data)
"#;

impl Pinned {
    /// Fetches the files into `dir` (see [`FETCH`]).
    ///
    /// # Errors
    /// A file cannot be had or its SHA-256 differs.
    pub fn fetch(&self, dir: &Path, source: Option<&Path>) -> Result {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let step = Step::start(format!("{}'s files at {}", self.repo, self.tag));
        let mut fetch = programs::cmd("/usr/bin/python3");
        fetch
            .arg("-c")
            .arg(FETCH)
            .arg(self.repo)
            .arg(self.tag)
            .arg(dir);
        fetch.arg(source.unwrap_or(Path::new("")));
        fetch.args(self.files.iter().map(|(n, h)| format!("{n}={h}")));
        sh::run(&mut fetch)?;
        step.done();
        Ok(())
    }
}

/// Whether every node's command exited 0 with no kernel problem.
pub fn passed(results: &[vm::NodeResult]) -> bool {
    dmabuf_testbed::cli::exit_status(results) == 0
}
