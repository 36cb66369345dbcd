//! The testbed's set-up (`dmabuf-testbed setup`, `cargo xtask setup`): system packages, the
//! guest kernel ([`crate::kernel`]), and everything else a boot needs ([`testbed`]).
//!
//! Packages come from the distribution (apt-get, as root).

use crate::kernel::{self, Kernel};
use crate::sh::{self, Result};
use crate::ui::{self, info, Step};
use crate::{accel, backports, fail, initramfs, patched, programs, Cache};
use std::time::{Duration, Instant};

/// Debian packages the project needs, each with why. Every program the project runs is in
/// [`crate::programs::PROGRAMS`] with one of these as its package; most of the base system's
/// (apt, dpkg, dash, coreutils...) are here too, so that nothing is assumed. A host test holds
/// the two lists together.
pub const PACKAGES: &[(&str, &str)] = &[
    (
        "apt",
        "apt-get and apt-cache: installs, downloads and resolves packages",
    ),
    (
        "dpkg",
        "dpkg-query and dpkg-deb: what is installed; unpacks debs",
    ),
    ("dash", "sh, for the project's scripts"),
    (
        "python3-venv",
        "python3 -m venv with its own pip (ensurepip): the venv cargo xtask test installs the \
         gpu_rdma wheel into, offline",
    ),
    (
        "coreutils",
        "cp, chmod, cat, sleep, uname, timeout, readlink",
    ),
    ("sed", "reads the loader's log in the VM"),
    ("grep", "checks port state and loaded libraries in the VM"),
    ("tar", "extracts the rxe sources from linux-source"),
    ("gzip", "compresses the initramfs"),
    ("findutils", "find: lists the initramfs's files"),
    ("patch", "applies kernel-patches/"),
    ("make", "builds the patched rdma_rxe.ko"),
    (
        "gcc-12",
        "the compiler Debian's guest kernel was built with (the module must match)",
    ),
    (
        "sparse",
        "checks the patched rxe and the test exporter (kbuild C=1), warnings are errors",
    ),
    ("gcc", "cc: compiles rdma-core and links Rust programs"),
    ("libc6-dev", "C headers and start files for every C build"),
    ("binutils", "ld and objcopy, run by kbuild"),
    (
        "pahole",
        "BTF for modules, run by the guest kernel headers' Makefile.modfinal (bookworm's \
         dwarves is only a wrapper around this package)",
    ),
    (
        "libelf1",
        "a library of the unpacked kbuild tools (modpost)",
    ),
    (
        "libssl3",
        "a library of the unpacked kbuild tools (sign-file)",
    ),
    (
        "cmake",
        "configures rdma-core, and the rdma-core the verbs crates of bench/verbs-crates build",
    ),
    ("ninja-build", "ninja: builds rdma-core"),
    (
        "libnl-3-dev",
        "rdma-core's netlink support (ours and ibverbs-sys' in bench/verbs-crates)",
    ),
    ("libnl-route-3-dev", "rdma-core's netlink route support"),
    ("python3-minimal", "/usr/bin/python3 itself"),
    (
        "python3",
        "the standard library rdma-core's test suite and pyverbs use",
    ),
    (
        "qemu-system-x86",
        "boots the testbed VM: version 10 from bookworm-backports, pinned (crate::backports)",
    ),
    (
        "stress-ng",
        "the CPU hog of cargo xtask soak --hog (a busy host, as CI runners are)",
    ),
    ("busybox-static", "the testbed's initramfs userland"),
    (
        "kmod",
        "depmod for the unpacked guest kernel; insmod, rmmod and modprobe in the VM",
    ),
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
    (
        "etcd-server",
        "etcd: the engine's etcd metadata backend's tests and bench --peers' etcd mode start \
         one in the VM (no service of it is needed: they run their own)",
    ),
    (
        "protobuf-compiler",
        "protoc: etcd-client's build script compiles etcd's protos (the engine's `etcd` feature)",
    ),
    (
        "libprotobuf-dev",
        "google/protobuf/*.proto, which etcd's protos import",
    ),
    (
        "libclang-dev",
        "bindgen (rdma-sys builds its bindings; so do ibverbs-sys and rdma-mummy-sys)",
    ),
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
    (
        "python3-pytest",
        "pytest: runs the gpu_rdma package's tests (python/tests) in the testbed",
    ),
    (
        "python3-numpy",
        "numpy: the gpu_rdma package's tests and KV-cache example use numpy arrays",
    ),
    (
        "mypy",
        "type-checks the gpu_rdma package's stubs, tests and example",
    ),
    (
        "python3-aiohttp",
        "aiohttp: Mooncake's own HTTP metadata server (the pinned wheel's \
         mooncake.http_metadata_server), which the engine's HTTP metadata backend is tested \
         against",
    ),
    (
        "python3-torch",
        "torch (CPU): NIXL's own Python tests and examples import it (cargo xtask nixl-tests), \
         and the gpu_rdma package's NIXL tests register CPU tensors",
    ),
    (
        "libnuma1",
        "a library of Mooncake's transfer_engine_bench (crate::wheels; VM)",
    ),
    (
        "libcurl4",
        "a library of Mooncake's transfer_engine_bench (crate::wheels; VM)",
    ),
    (
        "fonts-dejavu-core",
        "DejaVuSans.ttf, the text of cargo xtask bench's plots",
    ),
];

/// Installs missing packages (as root) or says how.
pub fn packages() -> Result {
    let step = Step::check("checking system packages");
    let mut missing: Vec<&str> = PACKAGES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !installed(p))
        .collect();
    if backports::qemu_too_old() {
        info(format!(
            "{} {} is older than {}: it is upgraded from {} (only QEMU's packages and seabios \
             are pinned there; docs/testbed.md)",
            backports::QEMU_PACKAGE,
            backports::installed_qemu().unwrap_or_default(),
            backports::MIN_QEMU,
            backports::SUITE
        ));
        missing.push(backports::QEMU_PACKAGE);
    }
    if missing.is_empty() {
        step.done_with("all present");
        return programs::verify();
    }
    info(format!("missing: {}", missing.join(" ")));
    let install = install_script(&missing);
    if !sh::is_root() {
        fail!(
            "these packages are needed; run as root:\n    sudo sh -c {}",
            sh::quote(&install)
        );
    }
    sh::run(&mut programs::shell(&install)?)?;
    if backports::qemu_too_old() || backports::installed_qemu().is_none() {
        fail!(
            "{} is still not at version {} or later after installing it from {}: is the \
             archive reachable (`apt-cache policy {}`)?",
            backports::QEMU_PACKAGE,
            backports::MIN_QEMU,
            backports::SUITE,
            backports::QEMU_PACKAGE
        );
    }
    step.done();
    programs::verify()
}

/// The shell line that installs `packages`; when they include QEMU, it first adds the
/// backports source and the pin of [`backports`], so that QEMU comes from there and nothing
/// else does.
pub fn install_script(packages: &[&str]) -> String {
    let install = format!(
        "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}",
        packages.join(" ")
    );
    if packages.contains(&backports::QEMU_PACKAGE) {
        format!("{} && {install}", backports::configure_script())
    } else {
        install
    }
}

fn installed(pkg: &str) -> bool {
    programs::cmd("dpkg-query")
        .args(["-W", "-f=${db:Status-Abbrev}", pkg])
        .output()
        .map(|o| o.status.success() && o.stdout.starts_with(b"ii"))
        .unwrap_or(false)
}

/// What [`testbed`] left ready.
pub struct Ready {
    /// The guest kernel.
    pub kernel: Kernel,
    /// The accelerator the VMs will run on.
    pub accel: accel::Accel,
    /// The work steps it ran (downloads, builds), by name; empty when everything was cached.
    pub built: Vec<String>,
    /// How long it took.
    pub took: Duration,
}

impl Ready {
    /// The closing line of `setup`: how long it took, and what it built (or that nothing
    /// needed building).
    pub fn summary(&self) -> String {
        let what = if self.built.is_empty() {
            "nothing to build, all cached".to_string()
        } else {
            let names: Vec<&str> = self
                .built
                .iter()
                .map(|s| s.strip_prefix("building ").unwrap_or(s))
                .collect();
            format!("built {}: {}", names.len(), names.join(", "))
        };
        format!(
            "testbed ready in {:.1} s ({what}); kernel {}",
            self.took.as_secs_f64(),
            self.kernel.version
        )
    }
}

/// The set-up of `dmabuf-testbed setup` and `cargo xtask setup`: the host's packages (as
/// root; else the `sudo` line), then everything a boot in either mode would otherwise build
/// first (the guest kernel, its initramfs, the patched `rdma_rxe.ko`, the test exporter and
/// the patched rdma-core) and the KVM probe, so that a later run builds nothing.
///
/// # Errors
/// A package is missing (and this is not root), or a download or build failed.
pub fn testbed(cache: &Cache) -> Result<Ready> {
    let start = Instant::now();
    let mark = ui::work_mark();
    packages()?;
    let kernel = kernel::fetch(cache)?;
    let initrd = initramfs::build(cache, &kernel)?;
    patched::build(cache, &kernel)?;
    let accel = accel::choose(cache, &kernel, &initrd)?;
    Ok(Ready {
        kernel,
        accel,
        built: ui::work_since(mark),
        took: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(built: &[&str]) -> Ready {
        Ready {
            kernel: Kernel {
                version: "6.12.1+deb12-amd64".into(),
                root: "/k".into(),
            },
            accel: accel::Accel {
                kvm: true,
                cpu: "host".into(),
                why: String::new(),
                brief: String::new(),
            },
            built: built.iter().map(|s| s.to_string()).collect(),
            took: Duration::from_millis(2500),
        }
    }

    #[test]
    fn setup_says_what_it_built_or_that_nothing_needed_building() {
        assert_eq!(
            ready(&[]).summary(),
            "testbed ready in 2.5 s (nothing to build, all cached); kernel 6.12.1+deb12-amd64"
        );
        assert_eq!(
            ready(&["building the patched rdma_rxe.ko", "downloading x"]).summary(),
            "testbed ready in 2.5 s (built 2: the patched rdma_rxe.ko, downloading x); kernel \
             6.12.1+deb12-amd64"
        );
    }
}
