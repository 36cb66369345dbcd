//! `cargo xtask setup`: system packages and the testbed's kernel.
//!
//! Packages come from the distribution (apt-get, as root). The guest kernel is Debian's
//! `linux-image-6.12*-amd64`, downloaded with `apt-get download` and unpacked under
//! `target/testbed/kernel/<version>/`; it is never installed as the host's kernel.

use crate::sh::{self, Result};
use crate::ui::{info, Step};
use crate::{fail, Paths};
use std::path::PathBuf;
use std::process::Command;

/// Debian packages the project needs, each with why.
pub const PACKAGES: &[(&str, &str)] = &[
    ("qemu-system-x86", "boots the testbed VM"),
    ("busybox-static", "the testbed's initramfs userland"),
    ("kmod", "depmod for the unpacked guest kernel"),
    ("cpio", "packs the initramfs"),
    ("xz-utils", "decompresses the guest kernel's modules"),
    ("rdma-core", "the rdma tool's companions and udev rules"),
    ("ibverbs-providers", "the rxe userspace provider"),
    ("libibverbs-dev", "libibverbs headers for rdma-sys"),
    ("librdmacm-dev", "librdmacm headers for rdma-sys"),
    (
        "ibverbs-utils",
        "ibv_devinfo, ibv_rc_pingpong (testbed smoke checks)",
    ),
    ("rdmacm-utils", "rping (rdma_cm smoke checks)"),
    (
        "perftest",
        "ib_write_bw/ib_write_lat, the peer our figures are compared with",
    ),
    ("iproute2", "ip and rdma inside the testbed"),
    ("iputils-ping", "reachability of the peer node"),
    ("libclang-dev", "bindgen (rdma-sys builds its bindings)"),
    ("pkg-config", "finds libibverbs and librdmacm"),
    ("libdrm-dev", "DRM uapi headers for layout tests"),
    (
        "valgrind",
        "memcheck of the drop-before-completion path in the VM",
    ),
    (
        "cython3",
        "pyverbs, for rdma-core's own tests (cargo xtask rdma-core-tests)",
    ),
    ("python3-dev", "pyverbs' C extensions"),
];

/// The meta-package whose dependency names the newest 6.12 kernel image.
const KERNEL_META: &str = "linux-image-6.12-amd64";

/// Installs missing packages (as root) or says how.
pub fn packages() -> Result {
    let step = Step::start("checking system packages");
    let missing: Vec<&str> = PACKAGES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        step.done_with("all present");
        return Ok(());
    }
    info(format!("missing: {}", missing.join(" ")));
    let install = format!(
        "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if !sh::is_root() {
        fail!("these packages are needed; run as root:\n    sudo sh -c '{install}'");
    }
    sh::run(Command::new("sh").arg("-c").arg(&install))?;
    step.done();
    Ok(())
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Abbrev}", pkg])
        .output()
        .map(|o| o.status.success() && o.stdout.starts_with(b"ii"))
        .unwrap_or(false)
}

/// An unpacked guest kernel.
pub struct Kernel {
    /// `uname -r` of the guest, e.g. `6.12.117+deb12-amd64`.
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

/// Returns the cached guest kernel, downloading and unpacking it on first use.
///
/// `TESTBED_KERNEL=<version>` pins a version (e.g. `6.12.117+deb12-amd64`).
pub fn kernel(paths: &Paths) -> Result<Kernel> {
    let kdir = paths.testbed.join("kernel");
    let pinned = std::env::var("TESTBED_KERNEL").ok();
    if let Some(k) = cached_kernel(&kdir, pinned.as_deref()) {
        return Ok(k);
    }
    let version = match pinned {
        Some(v) => v,
        None => resolve_version()?,
    };
    let step = Step::start(format!("downloading guest kernel linux-image-{version}"));
    let debs = paths.testbed.join("debs");
    std::fs::create_dir_all(&debs)?;
    sh::run(
        Command::new("apt-get")
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
    sh::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))?;
    sh::run(Command::new("depmod").arg("-b").arg(&tmp).arg(&version))?;
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
        .filter(|v| !v.ends_with(".partial"))
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

fn resolve_version() -> Result<String> {
    let deps = sh::output(Command::new("apt-cache").args(["depends", "--important", KERNEL_META]))
        .map_err(|e| {
            format!("{e}\n    (is the package list current? run `apt-get update` as root)")
        })?;
    for line in deps.lines() {
        if let Some(name) = line.trim().strip_prefix("Depends: linux-image-") {
            return Ok(name.trim().to_string());
        }
    }
    fail!("`apt-cache depends {KERNEL_META}` names no kernel image; run `apt-get update`")
}
