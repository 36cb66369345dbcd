//! The patched stack for the testbed: `rdma_rxe.ko` rebuilt from Debian's sources of the guest
//! kernel's series ([`KERNEL_SERIES`]) with `kernel-patches/linux/*.patch` (out of tree,
//! against Debian's headers unpacked in the cache), and rdma-core v55 (the copy vendored in
//! the `ibverbs-sys` package on crates.io) with `kernel-patches/rdma-core/*.patch`, built in
//! place. With them, the test exporter `dmabuf_test_exporter.ko` (`kernel-patches/test-exporter/`,
//! a dma-buf exporter whose sg_tables carry poisoned page pointers), built out of tree the same
//! way. Cached by a hash of the patches, the exporter's sources, the kernel version, this file
//! and the script it runs (`scripts/rxe-sources.sh`). `inner.sh` (`scripts/inner.sh`) puts the
//! stack in place in the VM.

use crate::kernel::{Kernel, KERNEL_SERIES};
use crate::sh::{self, Result};
use crate::ui::Step;
use crate::{fail, programs, script, Cache};
use std::path::{Path, PathBuf};

/// rdma-core as vendored by this crates.io package.
const RDMA_CORE_CRATE: (&str, &str) = ("ibverbs-sys", "=0.3.2");

/// A built patched stack.
#[derive(Clone, Debug)]
pub struct Patched {
    /// The patched `rdma_rxe.ko`.
    pub module: PathBuf,
    /// The test exporter, `dmabuf_test_exporter.ko` (`/dev/dmabuf_test_exporter` once loaded).
    pub exporter: PathBuf,
    /// rdma-core's in-place build `lib/` (libibverbs and the providers).
    pub lib: PathBuf,
}

impl Patched {
    /// The patched `libibverbs.so.1`, which every program of a patched guest loads first
    /// (the guest's `/etc/ld.so.preload`, set up by `/init`): the system's copy or one on a
    /// command's own `LD_LIBRARY_PATH` cannot replace it.
    pub fn libibverbs(&self) -> PathBuf {
        self.lib.join("libibverbs.so.1")
    }
}

/// Builds (or reuses) the patched module and rdma-core.
pub fn build(cache: &Cache, kernel: &Kernel) -> Result<Patched> {
    let patches = patch_files(&embedded_sources(cache)?)?;
    let key = cache_key(kernel, &patches)?;
    let dir = cache.dir.join(format!("patched-{key:016x}"));
    // One builder at a time per cache: another testbed process waits here rather than
    // building into (or removing) the same folders.
    let _lock = lock(&cache.dir, "patched")?;
    let out = Patched {
        module: dir.join("rdma_rxe.ko"),
        exporter: dir.join(format!("{TEST_EXPORTER}.ko")),
        lib: dir.join("rdma-core/build/lib"),
    };
    if out.module.is_file() && out.exporter.is_file() && out.lib.join("librxe-rdmav34.so").is_file()
    {
        return Ok(out);
    }
    remove_stale(&cache.dir, "patched-", &dir);
    std::fs::create_dir_all(&dir)?;
    let headers = headers(cache, kernel)?;
    build_module(cache, kernel, &headers, &patches.linux, &dir)?;
    build_test_exporter(&headers, &patches.test_exporter, &dir)?;
    build_rdma_core(cache, &patches.rdma_core, &dir)?;
    Ok(out)
}

/// The files of a `kernel-patches/` folder, each list sorted.
pub struct Patches {
    /// `linux/*.patch`: rxe's patches.
    pub linux: Vec<PathBuf>,
    /// `rdma-core/*.patch`: rdma-core's patches.
    pub rdma_core: Vec<PathBuf>,
    /// The test exporter's sources (`kernel-patches/test-exporter/`, every file).
    pub test_exporter: Vec<PathBuf>,
}

/// The files of `kernel-patches/` built into this crate (by `build.rs`): `(sub/name, bytes)`.
const KERNEL_PATCHES: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/kernel_patches.rs"));

/// Writes the built-in `kernel-patches/` files under the cache (unless already there) and
/// returns the folder that holds `kernel-patches/`, for [`patch_files`].
fn embedded_sources(cache: &Cache) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    KERNEL_PATCHES.hash(&mut h);
    let root = cache.dir.join(format!("sources-{:016x}", h.finish()));
    if !root.join("kernel-patches").is_dir() {
        remove_stale(&cache.dir, "sources-", &root);
        let tmp = partial(&root)?;
        for (name, bytes) in KERNEL_PATCHES {
            let path = tmp.join("kernel-patches").join(name);
            std::fs::create_dir_all(path.parent().ok_or("no parent folder")?)?;
            std::fs::write(&path, bytes)?;
        }
        std::fs::rename(&tmp, &root)?;
    }
    Ok(root)
}

/// The test exporter module's name (its source folder is `kernel-patches/test-exporter/`).
pub const TEST_EXPORTER: &str = "dmabuf_test_exporter";

/// The patches and sources under `root/kernel-patches/`.
///
/// # Errors
/// A folder is missing or empty.
pub fn patch_files(root: &Path) -> Result<Patches> {
    let list = |sub: &str| -> Result<Vec<PathBuf>> {
        let dir = root.join("kernel-patches").join(sub);
        let all = sub == "test-exporter";
        let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| all || p.extension().is_some_and(|x| x == "patch"))
            .collect();
        v.sort();
        if v.is_empty() {
            fail!("no sources in {}", dir.display());
        }
        Ok(v)
    };
    Ok(Patches {
        linux: list("linux")?,
        rdma_core: list("rdma-core")?,
        test_exporter: list("test-exporter")?,
    })
}

fn cache_key(kernel: &Kernel, p: &Patches) -> Result<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    kernel.version.hash(&mut h);
    include_str!("patched.rs").hash(&mut h);
    script::RXE_SOURCES.hash(&mut h);
    for f in p.linux.iter().chain(&p.rdma_core).chain(&p.test_exporter) {
        std::fs::read(f)?.hash(&mut h);
    }
    Ok(h.finish())
}

/// How long a build cached under another key is kept: another checkout's testbed (another
/// version of the patches or of this code) may be using it at the same time, and must not
/// find it removed under a running VM.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Removes the folders of `testbed` whose names start with `prefix`, except `keep` and those
/// changed in the last day (`STALE_AFTER`): builds cached under another key that nobody has
/// built for a day.
pub fn remove_stale(testbed: &Path, prefix: &str, keep: &Path) {
    for e in std::fs::read_dir(testbed).into_iter().flatten().flatten() {
        let p = e.path();
        let recent = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < STALE_AFTER);
        if p != keep && !recent && e.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// An exclusive lock on `<testbed>/<name>.lock` (`flock`), held until the file is dropped:
/// builds of the shared cache by several testbed processes take turns.
///
/// # Errors
/// The lock file cannot be created or locked.
pub fn lock(testbed: &Path, name: &str) -> Result<std::fs::File> {
    std::fs::create_dir_all(testbed)?;
    let path = testbed.join(format!("{name}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    file.lock()
        .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
    Ok(file)
}

/// A fresh sibling `<name>.partial` of `root` (versions contain dots: no with_extension).
fn partial(root: &Path) -> Result<PathBuf> {
    let name = root.file_name().ok_or("no folder name")?.to_string_lossy();
    let parent = root.parent().ok_or("no parent folder")?;
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!("{name}.partial"));
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(tmp)
}

/// Applies `patches` (`-p1`) to the source tree `tree`.
pub fn apply_patches(tree: &Path, patches: &[PathBuf]) -> Result {
    for p in patches {
        sh::run(
            programs::cmd("patch")
                .args(["-s", "-p1", "-d"])
                .arg(tree)
                .arg("-i")
                .arg(p),
        )?;
    }
    Ok(())
}

/// Downloads the packages `pkgs` (`name` or `name=version`) into `dir` with apt.
pub(crate) fn apt_download(dir: &Path, pkgs: &[String]) -> Result {
    std::fs::create_dir_all(dir)?;
    sh::run(
        programs::cmd("apt-get")
            .current_dir(dir)
            .args(["-q", "-o", "APT::Sandbox::User=root", "download"])
            .args(pkgs),
    )
}

fn find_deb(dir: &Path, prefix: &str) -> Result<PathBuf> {
    std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix) && n.ends_with(".deb"))
        })
        .ok_or_else(|| format!("no {prefix}*.deb in {}", dir.display()).into())
}

/// Debian's kbuild tree for the guest kernel, unpacked (never installed: the headers package
/// depends on the kernel image). Returns the `linux-headers-<version>` folder.
fn headers(cache: &Cache, kernel: &Kernel) -> Result<PathBuf> {
    let root = cache.dir.join("kheaders").join(&kernel.version);
    let build = root.join(format!("usr/src/linux-headers-{}", kernel.version));
    if build.join("Module.symvers").is_file() {
        return Ok(build);
    }
    let step = Step::start(format!("downloading kernel headers for {}", kernel.version));
    let pkg = format!("linux-headers-{}", kernel.version);
    let deps = sh::output(programs::cmd("apt-cache").args(["depends", "--important", &pkg]))?;
    let mut pkgs = vec![pkg];
    for l in deps.lines() {
        if let Some(d) = l.trim().strip_prefix("Depends: ") {
            if d.starts_with("linux-headers-") || d.starts_with("linux-kbuild-") {
                pkgs.push(d.trim().to_string());
            }
        }
    }
    let debs = cache.dir.join("debs/headers");
    apt_download(&debs, &pkgs)?;
    let tmp = partial(&root)?;
    let _ = std::fs::remove_dir_all(&tmp);
    for p in &pkgs {
        sh::run(
            programs::cmd("dpkg-deb")
                .arg("-x")
                .arg(find_deb(&debs, &format!("{p}_"))?)
                .arg(&tmp),
        )?;
    }
    // The flavour's Makefile includes the common tree by absolute path: point it here.
    let mk = tmp.join(format!("usr/src/linux-headers-{}/Makefile", kernel.version));
    let text = std::fs::read_to_string(&mk)?;
    let here = format!("include {}/usr/src/", root.display());
    sh::write(&mk, &text.replace("include /usr/src/", &here))?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&tmp, &root)?;
    let _ = std::fs::remove_dir_all(&debs);
    step.done();
    Ok(build)
}

/// Debian's rxe sources for the guest kernel, from the matching `linux-source-<series>`
/// package.
fn rxe_sources(cache: &Cache, kernel: &Kernel) -> Result<PathBuf> {
    let root = cache.dir.join("ksrc").join(&kernel.version);
    let rxe = root.join("drivers/infiniband/sw/rxe");
    if rxe.join("rxe_mr.c").is_file() {
        return Ok(root);
    }
    let source = format!("linux-source-{KERNEL_SERIES}");
    let step = Step::start(format!("downloading the kernel's rxe sources ({source})"));
    // The source upload that built the image.
    let version = package_version(&format!("linux-image-{}", kernel.version))?;
    let debs = cache.dir.join("debs/source");
    apt_download(&debs, &[format!("{source}={version}")])?;
    let deb = find_deb(&debs, &format!("{source}_"))?;
    let tmp = partial(&root)?;
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    sh::run(&mut programs::shell(&source_script(&deb, &tmp)?)?)?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&tmp, &root)?;
    let _ = std::fs::remove_dir_all(&debs);
    step.done();
    Ok(root)
}

/// The script that extracts rxe's sources (and checkpatch) from the linux-source deb `deb`
/// into `into`.
pub fn source_script(deb: &Path, into: &Path) -> Result<String> {
    script::fill(
        script::RXE_SOURCES,
        &[
            ("DEB", &sh::quote(&deb.to_string_lossy())),
            ("INTO", &sh::quote(&into.to_string_lossy())),
            ("SERIES", KERNEL_SERIES),
        ],
    )
}

/// The Debian version of a package (e.g. the kernel image), from apt.
fn package_version(pkg: &str) -> Result<String> {
    let show = sh::output(programs::cmd("apt-cache").args(["show", "--no-all-versions", pkg]))?;
    match show.lines().find_map(|l| l.strip_prefix("Version: ")) {
        Some(v) => Ok(v.trim().to_string()),
        None => fail!("apt-cache show {pkg} gave no version"),
    }
}

fn build_module(
    cache: &Cache,
    kernel: &Kernel,
    headers: &Path,
    patches: &[PathBuf],
    dir: &Path,
) -> Result {
    let src = rxe_sources(cache, kernel)?;
    let step = Step::start("building the patched rdma_rxe.ko");
    let tree = dir.join("linux");
    let rxe = tree.join("drivers/infiniband/sw/rxe");
    std::fs::create_dir_all(&rxe)?;
    for e in std::fs::read_dir(src.join("drivers/infiniband/sw/rxe"))? {
        let e = e?;
        std::fs::copy(e.path(), rxe.join(e.file_name()))?;
    }
    apply_patches(&tree, patches)?;
    sh::run(
        programs::cmd("make")
            .arg("-C")
            .arg(headers)
            .arg(format!("M={}", rxe.display()))
            .args(["CC=gcc-12", "-j2", "-s", "modules"])
            .args(SPARSE),
    )?;
    std::fs::copy(rxe.join("rdma_rxe.ko"), dir.join("rdma_rxe.ko"))?;
    step.done();
    Ok(())
}

/// kbuild's arguments that run the sparse checker on every file it compiles, its warnings
/// (`__iomem` misuse among them) as errors.
const SPARSE: [&str; 3] = ["C=1", "CHECK=sparse", "CF=-Wsparse-error"];

/// Builds the test exporter module from `sources` (its folder's files) against `headers`, as
/// `dir/<TEST_EXPORTER>.ko`.
fn build_test_exporter(headers: &Path, sources: &[PathBuf], dir: &Path) -> Result {
    let step = Step::start(format!("building the test exporter {TEST_EXPORTER}.ko"));
    let tree = dir.join("test-exporter");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree)?;
    for f in sources {
        std::fs::copy(f, tree.join(f.file_name().ok_or("no file name")?))?;
    }
    sh::run(
        programs::cmd("make")
            .arg("-C")
            .arg(headers)
            .arg(format!("M={}", tree.display()))
            .args(["CC=gcc-12", "-s", "modules"])
            .args(SPARSE),
    )?;
    let ko = format!("{TEST_EXPORTER}.ko");
    std::fs::copy(tree.join(&ko), dir.join(&ko))?;
    step.done();
    Ok(())
}

/// rdma-core's source, fetched through cargo as the `ibverbs-sys` package's vendored copy.
pub fn rdma_core_source(cache: &Cache) -> Result<PathBuf> {
    let stub = cache.dir.join("fetch-rdma-core");
    sh::write(
        &stub.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"fetch-rdma-core\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n[lib]\npath = \"lib.rs\"\n\n[dependencies]\n{} = \"{}\"\n\n[workspace]\n",
            RDMA_CORE_CRATE.0, RDMA_CORE_CRATE.1
        ),
    )?;
    sh::write(&stub.join("lib.rs"), "")?;
    // cargo's own progress (fetching the crate on first use) is shown only if it fails.
    let meta = sh::output_quiet(
        programs::cmd("cargo")
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(stub.join("Cargo.toml")),
    )?;
    let v: serde_json::Value = serde_json::from_str(&meta)?;
    let manifest = v["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == RDMA_CORE_CRATE.0))
        .and_then(|p| p["manifest_path"].as_str())
        .ok_or("cargo metadata did not resolve ibverbs-sys")?;
    let src = Path::new(manifest)
        .parent()
        .ok_or("bad manifest path")?
        .join("vendor/rdma-core");
    if !src.join("CMakeLists.txt").is_file() {
        fail!("{} has no rdma-core source", src.display());
    }
    Ok(src)
}

fn build_rdma_core(cache: &Cache, patches: &[PathBuf], dir: &Path) -> Result {
    let src = rdma_core_source(cache)?;
    let step = Step::start("building patched rdma-core v55 (libibverbs and providers, in place)");
    let tree = dir.join("rdma-core");
    let _ = std::fs::remove_dir_all(&tree);
    sh::run(programs::cmd("cp").arg("-r").arg(&src).arg(&tree))?;
    apply_patches(&tree, patches)?;
    build_in_place(&tree, false)?;
    step.done();
    Ok(())
}

/// Configures and builds the rdma-core source `tree` in place (`tree/build`, its paths baked
/// in, so the tree must not move afterwards). With `pyverbs`, everything is built, pyverbs
/// against Debian's Python; without, only libibverbs and the rxe provider, and the other
/// providers' entries are dropped so that libibverbs does not warn about each.
pub fn build_in_place(tree: &Path, pyverbs: bool) -> Result {
    let build = tree.join("build");
    std::fs::create_dir_all(&build)?;
    sh::run(
        programs::cmd("cmake")
            .current_dir(&build)
            .args([
                "-GNinja",
                "-DIN_PLACE=1",
                "-DNO_MAN_PAGES=1",
                "-Wno-dev",
                // Debian's interpreter, the one cython3 and python3-dev belong to.
                "-DPython_EXECUTABLE=/usr/bin/python3",
                if pyverbs {
                    "-DNO_PYVERBS=0"
                } else {
                    "-DNO_PYVERBS=1"
                },
                "..",
            ])
            .stdout(std::process::Stdio::null()),
    )?;
    let mut ninja = programs::cmd("ninja");
    ninja.current_dir(&build).arg("--quiet");
    if !pyverbs {
        ninja.args(["ibverbs", "rxe-rdmav34"]);
    }
    sh::run(ninja.stdout(std::process::Stdio::null()))?;
    if !pyverbs {
        for e in std::fs::read_dir(build.join("etc/libibverbs.d"))? {
            let e = e?;
            if e.file_name() != "rxe.driver" {
                std::fs::remove_file(e.path())?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_builds_go_after_a_day_and_recent_ones_of_other_keys_stay() {
        let root = std::env::temp_dir().join(format!("testbed-stale-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["patched-keep", "patched-recent", "patched-old", "other-old"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let day_ago = std::time::SystemTime::now() - STALE_AFTER - STALE_AFTER / 24;
        for d in ["patched-old", "other-old"] {
            std::fs::File::open(root.join(d))
                .unwrap()
                .set_modified(day_ago)
                .unwrap();
        }
        remove_stale(&root, "patched-", &root.join("patched-keep"));
        let left = |d: &str| root.join(d).is_dir();
        assert!(left("patched-keep") && left("patched-recent") && left("other-old"));
        assert!(!left("patched-old"), "a day-old build of another key stays");
        let held = lock(&root, "patched").unwrap();
        drop(held);
        let _ = std::fs::remove_dir_all(&root);
    }
}
