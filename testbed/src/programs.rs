//! Every external program the project runs, on the host and inside the testbed VM, with the
//! Debian package that provides it. the testbed and xtask start programs only through [`cmd`] (a name from
//! [`PROGRAMS`]), [`built`] (a binary this workspace built) and [`shell`] / [`write_script`]
//! (scripts whose every command is checked against the table first). `cargo xtask setup`
//! installs the packages and then checks that each program resolves ([`verify`]); a host test
//! holds the sources, the scripts and the install list to the table.

use crate::sh::Result;
use crate::{fail, shscan};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where a program comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A Debian package from [`crate::setup::PACKAGES`].
    Deb(&'static str),
    /// An applet of the static busybox in the testbed's initramfs (`busybox-static`).
    Busybox,
    /// The Rust toolchain the README asks for (rustup).
    Toolchain,
    /// A file of a pinned Python wheel from [`crate::wheels::WHEELS`], unpacked into the cache
    /// by `cargo xtask setup` (or first use): named by the wheel's distribution name.
    Wheel(&'static str),
}

/// One program: the name scripts and code call it by (or its absolute path), where it comes
/// from, and why the project runs it.
#[derive(Debug)]
pub struct Program {
    /// The command word, or an absolute path where the project calls it by path.
    pub name: &'static str,
    /// Its package.
    pub source: Source,
    /// An environment variable that names another binary to run instead.
    pub env: Option<&'static str>,
    /// What for (and where: host, VM or both).
    pub why: &'static str,
}

const fn deb(name: &'static str, package: &'static str, why: &'static str) -> Program {
    Program {
        name,
        source: Source::Deb(package),
        env: None,
        why,
    }
}

const fn applet(name: &'static str) -> Program {
    Program {
        name,
        source: Source::Busybox,
        env: None,
        why: "the initramfs's /init (VM)",
    }
}

/// Environment variable naming the `qemu-system-x86_64` to run instead of the one on `PATH`
/// (for example a newer QEMU, which avoids the emulator fault described in docs/testbed.md).
pub const QEMU_BINARY: &str = "TESTBED_QEMU";

/// The table.
pub const PROGRAMS: &[Program] = &[
    Program {
        name: "cargo",
        source: Source::Toolchain,
        env: Some("CARGO"),
        why: "builds, tests, fetches rdma-core's source (host)",
    },
    Program {
        name: "rustup",
        source: Source::Toolchain,
        env: None,
        why: "installs the pinned nightly toolchain with Miri for cargo xtask test's Miri check, and runs cargo on it (host)",
    },
    Program {
        name: "qemu-system-x86_64",
        source: Source::Deb("qemu-system-x86"),
        env: Some(QEMU_BINARY),
        why: "boots the testbed VM (host)",
    },
    deb(
        "apt-get",
        "apt",
        "installs packages, downloads kernel debs (host)",
    ),
    deb(
        "apt-cache",
        "apt",
        "resolves the kernel's version and packages (host)",
    ),
    deb("dpkg-query", "dpkg", "which packages are installed (host)"),
    deb(
        "dpkg",
        "dpkg",
        "compares the installed QEMU's version with the one the testbed needs (host)",
    ),
    deb(
        "stress-ng",
        "stress-ng",
        "the CPU hog of cargo xtask soak --hog (host)",
    ),
    deb(
        "dpkg-deb",
        "dpkg",
        "unpacks kernel, headers and source debs (host)",
    ),
    deb(
        "depmod",
        "kmod",
        "indexes the unpacked guest kernel's modules (host)",
    ),
    deb(
        "insmod",
        "kmod",
        "loads the patched rdma_rxe.ko and the test exporter (VM)",
    ),
    deb("rmmod", "kmod", "unloads Debian's rdma_rxe (VM)"),
    deb(
        "modprobe",
        "kmod",
        "loads virtio_gpu from the guest kernel's tree under --topology (VM)",
    ),
    deb(
        "readlink",
        "coreutils",
        "follows sysfs links to PCI functions under --topology (VM)",
    ),
    deb("sh", "dash", "runs the project's scripts (host and VM)"),
    deb("cp", "coreutils", "copies source trees (host)"),
    deb("chmod", "coreutils", "makes /init executable (host)"),
    deb(
        "cat",
        "coreutils",
        "reads sysfs in the VM's set-up script (VM)",
    ),
    deb("sleep", "coreutils", "polls in scripts (VM)"),
    deb(
        "timeout",
        "coreutils",
        "bounds every step of cargo xtask bench (VM)",
    ),
    deb("uname", "coreutils", "reports the guest kernel (VM)"),
    deb(
        "tail",
        "coreutils",
        "the last lines of a bench step's log (VM)",
    ),
    deb("sed", "sed", "reads which libraries the loader loaded (VM)"),
    deb(
        "grep",
        "grep",
        "checks port state and loaded libraries (VM)",
    ),
    deb(
        "tar",
        "tar",
        "extracts the rxe sources from linux-source (host)",
    ),
    deb(
        "xz",
        "xz-utils",
        "decompresses the guest kernel's modules (host)",
    ),
    deb("gzip", "gzip", "compresses the initramfs (host)"),
    deb("find", "findutils", "lists the initramfs's files (host)"),
    deb("cpio", "cpio", "packs the initramfs (host)"),
    deb("patch", "patch", "applies kernel-patches/ (host)"),
    deb(
        "make",
        "make",
        "builds the patched rdma_rxe.ko and the test exporter; the C libraries of bench/verbs-crates' crates, run by cmake (host)",
    ),
    deb(
        "gcc-12",
        "gcc-12",
        "compiles rdma_rxe.ko with the kernel's own compiler (host)",
    ),
    deb(
        "sparse",
        "sparse",
        "checks the patched rxe and the test exporter (__iomem, locking), run by kbuild's C=1 (host)",
    ),
    deb(
        "pahole",
        "pahole",
        "BTF for the module, run by the guest kernel headers' Makefile.modfinal (host)",
    ),
    deb("ld", "binutils", "links the module, run by kbuild (host)"),
    deb(
        "cc",
        "gcc",
        "compiles rdma-core, run by cmake, and the tests' stand-in libcuda, run by tests/build.rs through the cc crate (host); the dmabuf-alloc C example and rdma_bench's cost_floor.c (VM)",
    ),
    deb(
        "cmake",
        "cmake",
        "configures rdma-core, and the C libraries of bench/verbs-crates' crates, run by their build scripts (host)",
    ),
    deb("ninja", "ninja-build", "builds rdma-core (host)"),
    deb(
        "/usr/bin/python3",
        "python3-minimal",
        "rdma-core's test suite, pyverbs' build, the dmabuf-alloc Python example (host and VM); the gpu_rdma package's tests (`-m pytest`, VM), type check (`-m mypy`, host) and bench step (`cargo xtask bench`'s `python/1peer`, VM)",
    ),
    deb(
        "/usr/bin/pytest-3",
        "python3-pytest",
        "pytest, which the gpu_rdma package's tests run under as `python3 -m pytest` (VM)",
    ),
    deb(
        "/usr/bin/mypy",
        "mypy",
        "checks the gpu_rdma package's stubs against its tests and example, as `python3 -m mypy` (host)",
    ),
    deb("ip", "iproute2", "addresses and veth links (VM)"),
    deb(
        "rdma",
        "iproute2",
        "creates the rxe device, counts resources (VM)",
    ),
    deb("ping", "iputils-ping", "waits for the peer node (VM)"),
    deb(
        "etcd",
        "etcd-server",
        "the store of the engine's etcd metadata backend's tests and of bench --peers' etcd \
         mode (VM)",
    ),
    Program {
        name: "protoc",
        source: Source::Deb("protobuf-compiler"),
        env: Some("PROTOC"),
        why: "compiles etcd's protos in etcd-client's build script (host)",
    },
    deb(
        "ibv_devices",
        "ibverbs-utils",
        "checks which libibverbs loads (VM)",
    ),
    deb("ibv_devinfo", "ibverbs-utils", "testbed smoke test (VM)"),
    deb(
        "ibv_rc_pingpong",
        "ibverbs-utils",
        "testbed smoke test (VM)",
    ),
    deb("rping", "rdmacm-utils", "rdma_cm smoke test (VM)"),
    deb(
        "ib_write_bw",
        "perftest",
        "the bandwidth peer in cargo xtask bench (VM)",
    ),
    deb(
        "ib_write_lat",
        "perftest",
        "the latency peer in cargo xtask bench (VM)",
    ),
    deb(
        "valgrind",
        "valgrind",
        "memcheck of drop paths; callgrind's instruction counts in the tests and cargo xtask bench (VM)",
    ),
    Program {
        name: "transfer_engine_bench",
        source: Source::Wheel("mooncake-transfer-engine-non-cuda"),
        env: None,
        why: "Mooncake's transfer engine bench, the peer of cargo xtask bench --peers, run by \
              its path in the unpacked wheel (VM)",
    },
    Program {
        name: BUSYBOX,
        source: Source::Busybox,
        env: None,
        why: "the initramfs's userland; /init installs its applets (VM)",
    },
    applet("mount"),
    applet("insmod"),
    applet("mkdir"),
    applet("ln"),
    applet("chroot"),
    applet("dmesg"),
    applet("cat"),
    applet("sync"),
    applet("poweroff"),
    applet("tr"),
];

/// The static busybox copied into the initramfs.
pub const BUSYBOX: &str = "/bin/busybox";

/// The table's entry for `name` (outside the initramfs).
pub fn lookup(name: &str) -> Option<&'static Program> {
    PROGRAMS
        .iter()
        .find(|p| p.name == name && p.source != Source::Busybox)
}

/// A [`Command`] for the table's program `name` (its `env` override applied).
///
/// # Panics
/// If `name` is not in the table: a bug in the caller, which the host test
/// `every_spawned_program_is_in_the_table` catches first.
pub fn cmd(name: &'static str) -> Command {
    let p = lookup(name).unwrap_or_else(|| {
        panic!(
            "the project runs `{name}`, which is not in programs::PROGRAMS: add it and its package"
        )
    });
    match p.env.and_then(std::env::var_os) {
        Some(other) => Command::new(other),
        None => Command::new(p.name),
    }
}

/// A [`Command`] for a binary this workspace built (a test or an example).
pub fn built(path: &Path) -> Command {
    Command::new(path)
}

/// `sh -c script`, after checking that every program the script runs is in the table.
///
/// # Errors
/// When the script runs a program the table lacks.
pub fn shell(script: &str) -> Result<Command> {
    check(script, false)?;
    let mut c = cmd("sh");
    c.arg("-c").arg(script);
    Ok(c)
}

/// Writes a script for `sh` (on the host or in the VM) after the same check as [`shell`].
///
/// # Errors
/// When the script runs a program the table lacks, or the file cannot be written.
pub fn write_script(path: &Path, script: &str) -> Result {
    check(script, false)?;
    crate::sh::write(path, script)
}

/// Checks that every program `script` runs is in the table (busybox applets only, for the
/// initramfs's `/init`).
///
/// # Errors
/// Names the first program the table lacks.
pub fn check(script: &str, initramfs: bool) -> Result {
    for name in shscan::programs(script) {
        let known = if initramfs {
            PROGRAMS
                .iter()
                .any(|p| p.name == name && p.source == Source::Busybox)
        } else {
            lookup(&name).is_some()
        };
        if !known {
            fail!(
                "a script runs `{name}`, which is not in the testbed's programs table{}; add it with \
                 the package that provides it (testbed/src/programs.rs)",
                if initramfs { " of busybox applets" } else { "" }
            );
        }
    }
    Ok(())
}

/// The folders the testbed's scripts search (the VM's `PATH`), after the host's own `PATH`.
const SYSTEM_PATH: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Where `name` resolves: itself if absolute, else the first executable of that name on
/// `PATH` or in the system folders.
fn resolve(name: &str) -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.starts_with('/') {
        return executable(Path::new(name)).then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SYSTEM_PATH.iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

/// Checks that every program in the table can be run: Debian programs resolve, busybox has
/// every applet, the toolchain's cargo is there.
///
/// # Errors
/// Names every missing program with its package.
pub fn verify() -> Result {
    let applets = crate::sh::output(Command::new(BUSYBOX).arg("--list")).unwrap_or_default();
    let mut missing = Vec::new();
    for p in PROGRAMS {
        let ok = match p.source {
            Source::Busybox if p.name == BUSYBOX => resolve(BUSYBOX).is_some(),
            Source::Busybox => applets.lines().any(|a| a.trim() == p.name),
            // Unpacked into the cache, not on PATH: `Wheel::program` checks it where it runs.
            Source::Wheel(_) => true,
            Source::Toolchain | Source::Deb(_) => match p.env.and_then(std::env::var_os) {
                Some(other) => resolve(&other.to_string_lossy()).is_some(),
                None => resolve(p.name).is_some(),
            },
        };
        if !ok {
            let from = match p.source {
                Source::Deb(pkg) => format!("Debian package `{pkg}`"),
                Source::Busybox => format!("an applet of {BUSYBOX} (package `busybox-static`)"),
                Source::Toolchain => "the Rust toolchain (rustup)".into(),
                Source::Wheel(w) => format!("the Python wheel `{w}`"),
            };
            missing.push(format!("`{}` from {from}: {}", p.name, p.why));
        }
    }
    if !missing.is_empty() {
        fail!(
            "after installing, these programs still cannot be found:\n    {}",
            missing.join("\n    ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::setup::PACKAGES;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            // Links are not followed: recorded sysfs trees (the doctor's fixtures) link to
            // their own ancestors, as sysfs does.
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                continue;
            }
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// The string literal that opens `text` (after `(`), if any.
    fn literal(text: &str) -> Option<&str> {
        text.strip_prefix('"')?.split('"').next()
    }

    #[test]
    fn every_package_of_the_table_is_installed_by_setup() {
        assert!(PACKAGES.iter().any(|(name, _)| *name == "busybox-static"));
        for p in PROGRAMS {
            if let Source::Deb(pkg) = p.source {
                assert!(
                    PACKAGES.iter().any(|(name, _)| *name == pkg),
                    "`{}` comes from `{pkg}`, which setup::PACKAGES does not install",
                    p.name
                );
            }
        }
    }

    #[test]
    fn every_wheel_of_the_table_is_unpacked_by_setup() {
        for p in PROGRAMS {
            if let Source::Wheel(w) = p.source {
                assert!(
                    crate::wheels::WHEELS.iter().any(|x| x.name == w),
                    "`{}` comes from the wheel `{w}`, which wheels::WHEELS does not pin",
                    p.name
                );
            }
        }
    }

    #[test]
    fn every_spawned_program_is_in_the_table() {
        let mut files = Vec::new();
        for d in [
            "xtask/src",
            "bench/src",
            "testbed/src",
            "testbed/tests",
            "tests",
            "examples",
            "drm-export",
            "rdma-dmabuf",
            "doctor",
            "dmabuf-alloc",
        ] {
            rust_files(&workspace().join(d), &mut files);
        }
        let mut bad = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            let here = f.ends_with("testbed/src/programs.rs");
            let lines: Vec<&str> = text.lines().collect();
            for (n, line) in lines.iter().enumerate() {
                let at = format!("{}:{}", f.display(), n + 1);
                let code = line.split("//").next().unwrap_or("");
                if let Some((_, rest)) = code.split_once("Command::new(") {
                    let in_xtask = f.starts_with(workspace().join("xtask"))
                        || f.starts_with(workspace().join("testbed/src"));
                    match literal(rest) {
                        _ if here => {}
                        _ if in_xtask => bad.push(format!(
                            "{at}: xtask starts programs through programs::cmd/built/shell"
                        )),
                        Some(name) if lookup(name).is_none() => {
                            bad.push(format!("{at}: `{name}` is not in programs::PROGRAMS"))
                        }
                        Some(_) => {}
                        None => {
                            let above = &lines[n.saturating_sub(2)..=n].join("\n");
                            if !above.contains("built by this workspace") {
                                bad.push(format!(
                                    "{at}: a program named at run time must be one this \
                                     workspace built (say so in a comment: \"built by this \
                                     workspace\")"
                                ));
                            }
                        }
                    }
                }
                if let Some((_, rest)) = code.split_once("programs::cmd(").filter(|_| !here) {
                    match literal(rest) {
                        Some(name) if lookup(name).is_none() => {
                            bad.push(format!("{at}: `{name}` is not in programs::PROGRAMS"))
                        }
                        Some("sh") => bad.push(format!(
                            "{at}: run scripts through programs::shell or write_script"
                        )),
                        Some(_) => {}
                        None => bad.push(format!("{at}: programs::cmd takes a literal name")),
                    }
                }
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn every_script_runs_only_programs_of_the_table() {
        for (name, script) in crate::scripts() {
            if let Err(e) = check(&script, false) {
                panic!("{name}: {e}");
            }
        }
        check(crate::script::INIT, true).unwrap();
    }

    #[test]
    fn an_unknown_program_is_refused() {
        let err = shell("echo hi | frobnicate --all").unwrap_err();
        assert!(err.to_string().contains("`frobnicate`"), "{err}");
        assert!(check("mount -t proc proc /proc", true).is_ok());
        assert!(check("valgrind x", true).is_err(), "not a busybox applet");
    }
}
