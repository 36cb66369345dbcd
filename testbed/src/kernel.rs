//! The guest kernel: Debian's `linux-image-<series>.*-amd64` of the series
//! [`KERNEL_SERIES`], downloaded with `apt-get download` and unpacked under
//! `target/testbed/kernel/<version>/`; it is never installed as the host's kernel.

use crate::sh::{self, Result};
use crate::ui::Step;
use crate::{fail, programs, Cache};
use std::path::PathBuf;

/// The guest kernel's series (Debian's `linux-image-<series>-amd64`), the one place it is
/// spelled. The patched `rdma_rxe.ko` is built from the same series' `linux-source` package
/// and must match the kernel, so changing it means a new kernel, a patch in `kernel-patches/`
/// that applies to that series' rxe, and possibly another compiler (`gcc-12` in
/// [`crate::setup::PACKAGES`] and `crate::patched`): see docs/testbed.md, "Extending it".
pub const KERNEL_SERIES: &str = "6.12";

/// The meta-package whose dependency names the series' newest kernel image.
fn kernel_meta() -> String {
    format!("linux-image-{KERNEL_SERIES}-amd64")
}

/// An unpacked guest kernel.
pub struct Kernel {
    /// `uname -r` of the guest, `<series>.<patch level>+deb12-amd64`.
    pub version: String,
    /// Root of the unpacked package (holds `boot/` and `lib/modules/`).
    pub root: PathBuf,
}

impl Kernel {
    /// The kernel image.
    pub fn vmlinuz(&self) -> PathBuf {
        self.root.join(format!("boot/vmlinuz-{}", self.version))
    }
    /// The module tree.
    pub fn modules(&self) -> PathBuf {
        self.root.join(format!("lib/modules/{}", self.version))
    }
}

/// Returns the cached guest kernel of [`KERNEL_SERIES`] (the newest cached one), downloading
/// and unpacking the series' newest on first use.
///
/// `TESTBED_KERNEL=<version>` pins a version (its full `uname -r`), which must belong to the
/// series.
pub fn fetch(cache: &Cache) -> Result<Kernel> {
    let kdir = cache.dir.join("kernel");
    let pinned = std::env::var("TESTBED_KERNEL").ok();
    if let Some(p) = pinned.as_deref().filter(|p| !in_series(p)) {
        fail!(
            "TESTBED_KERNEL={p} is not of the guest kernel series {KERNEL_SERIES} \
             (kernel::KERNEL_SERIES)"
        );
    }
    if let Some(k) = cached_kernel(&kdir, pinned.as_deref()) {
        return Ok(k);
    }
    let version = match pinned {
        Some(v) => v,
        None => resolve_version()?,
    };
    let step = Step::start(format!("downloading guest kernel linux-image-{version}"));
    let debs = cache.dir.join("debs");
    std::fs::create_dir_all(&debs)?;
    sh::run(
        programs::cmd("apt-get")
            .current_dir(&debs)
            .args(["-q", "-o", "APT::Sandbox::User=root", "download"])
            .arg(format!("linux-image-{version}")),
    )?;
    step.done();
    let deb = std::fs::read_dir(&debs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("linux-image-{version}_")))
        })
        .ok_or("apt-get download produced no .deb")?;

    let step = Step::start("unpacking guest kernel and indexing its modules");
    let root = kdir.join(&version);
    let tmp = kdir.join(format!("{version}.partial"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    sh::run(programs::cmd("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
    sh::run(programs::cmd("depmod").arg("-b").arg(&tmp).arg(&version))?;
    std::fs::rename(&tmp, &root)?;
    // The .deb is no longer needed once unpacked; keep the cache small.
    let _ = std::fs::remove_file(&deb);
    step.done();
    Ok(Kernel { version, root })
}

fn cached_kernel(kdir: &std::path::Path, pinned: Option<&str>) -> Option<Kernel> {
    let mut versions: Vec<String> = std::fs::read_dir(kdir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|v| !v.ends_with(".partial") && in_series(v))
        .filter(|v| pinned.is_none_or(|p| p == v))
        .collect();
    versions.sort();
    let version = versions.pop()?;
    let k = Kernel {
        root: kdir.join(&version),
        version,
    };
    (k.vmlinuz().is_file() && k.modules().join("modules.dep").is_file()).then_some(k)
}

/// Whether the kernel version `v` belongs to [`KERNEL_SERIES`].
fn in_series(v: &str) -> bool {
    v.strip_prefix(KERNEL_SERIES)
        .is_some_and(|rest| rest.starts_with('.'))
}

fn resolve_version() -> Result<String> {
    let meta = kernel_meta();
    let deps = sh::output(programs::cmd("apt-cache").args(["depends", "--important", &meta]))
        .map_err(|e| {
            format!("{e}\n    (is the package list current? run `apt-get update` as root)")
        })?;
    for line in deps.lines() {
        if let Some(name) = line.trim().strip_prefix("Depends: linux-image-") {
            return Ok(name.trim().to_string());
        }
    }
    fail!("`apt-cache depends {meta}` names no kernel image; run `apt-get update`")
}
