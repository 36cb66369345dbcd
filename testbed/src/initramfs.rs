//! The testbed's initramfs: static busybox, the guest kernel's modules, and `/init`
//! (`src/scripts/init.sh`, [`script::INIT`]).
//!
//! `/init` loads the modules, mounts the host's root read-only over 9p at `/host`, mounts the
//! run's writable folder (a second 9p share) at its host path inside `/host`, adds the usual
//! pseudo-filesystems and tmpfs on `/tmp` and `/run`, then runs the run's `inner.sh` chrooted
//! into `/host`: host-built binaries run unchanged. Afterwards it saves the kernel log and taint
//! to the run folder and powers off.

use crate::kernel::Kernel;
use crate::sh::{self, Result};
use crate::ui::Step;
use crate::{fail, programs, script, Cache};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Modules the testbed loads (their dependencies are added from `modules.dep`).
pub const MODULES: &[&str] = &[
    // The 9p root first: nothing else works without it.
    "netfs",
    "9pnet",
    "9pnet_virtio",
    "9p",
    // rxe needs the "crc32" shash, which crc32_generic provides.
    "crc32_generic",
    "rdma_rxe",
    "rdma_ucm",
    "vgem",
    "veth",
    "virtio_net",
    // Extra packages are laid over the host's root (crate::packages).
    "overlay",
];

/// Builds (or reuses) the initramfs for `kernel`; returns its path.
pub fn build(cache: &Cache, kernel: &Kernel) -> Result<PathBuf> {
    let order = load_order(&kernel.modules())?;
    let key = cache_key(kernel, &order);
    let out = cache.dir.join(format!("initramfs-{key:016x}.cpio.gz"));
    if out.is_file() {
        return Ok(out);
    }
    let step = Step::start(format!("building initramfs ({} modules)", order.len()));
    remove_stale_images(&cache.dir);
    let stage = cache.dir.join("initramfs.stage");
    let _ = std::fs::remove_dir_all(&stage);
    for d in ["bin", "dev", "proc", "sys", "lib/modules"] {
        std::fs::create_dir_all(stage.join(d))?;
    }
    std::fs::copy(busybox()?, stage.join("bin/busybox"))?;
    // `/init` is a script: its interpreter must exist before busybox installs its links.
    std::os::unix::fs::symlink("busybox", stage.join("bin/sh"))?;
    let mut names = String::new();
    for (name, rel) in &order {
        let src = kernel.modules().join(rel);
        let dst = stage.join(format!("lib/modules/{name}.ko"));
        decompress(&src, &dst)?;
        names.push_str(name);
        names.push('\n');
    }
    sh::write(&stage.join("modules.order"), &names)?;
    sh::write(&stage.join("init"), script::INIT)?;
    programs::check(script::INIT, true)?;
    sh::run(programs::cmd("chmod").arg("755").arg(stage.join("init")))?;
    let partial = out.with_extension("partial");
    sh::run(programs::shell(&pack_script(&partial))?.current_dir(&stage))?;
    std::fs::rename(&partial, &out)?;
    let _ = std::fs::remove_dir_all(&stage);
    step.done();
    Ok(out)
}

/// The script that packs the current folder into the gzipped cpio archive `out`.
pub fn pack_script(out: &Path) -> String {
    format!(
        "find . | cpio -o -H newc --quiet | gzip -1 > {}",
        sh::quote(&out.to_string_lossy())
    )
}

fn remove_stale_images(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_string_lossy().starts_with("initramfs-") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn busybox() -> Result<&'static str> {
    if Path::new(programs::BUSYBOX).is_file() {
        return Ok(programs::BUSYBOX);
    }
    fail!(
        "{} not found: run `dmabuf-testbed setup` or `cargo xtask setup` (package busybox-static)",
        programs::BUSYBOX
    )
}

fn decompress(src: &Path, dst: &Path) -> Result {
    let name = src.to_string_lossy();
    if name.ends_with(".ko") {
        std::fs::copy(src, dst)?;
        return Ok(());
    }
    // Debian's kernels compress modules with xz; gzip for hand-built trees.
    let mut tool = if name.ends_with(".xz") {
        programs::cmd("xz")
    } else if name.ends_with(".gz") {
        programs::cmd("gzip")
    } else {
        fail!("unknown module compression (xz or gzip expected): {name}")
    };
    let data = tool.arg("-dc").arg(src).output()?;
    if !data.status.success() {
        fail!("{} -dc {name} failed", tool.get_program().to_string_lossy());
    }
    std::fs::write(dst, data.stdout)?;
    Ok(())
}

/// Module names with their paths (relative to the module tree), dependencies first.
pub fn load_order(modules: &Path) -> Result<Vec<(String, String)>> {
    let dep_file = modules.join("modules.dep");
    let text = std::fs::read_to_string(&dep_file)
        .map_err(|e| format!("cannot read {}: {e}", dep_file.display()))?;
    let deps = parse_modules_dep(&text);
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for m in MODULES {
        visit(m, &deps, &mut seen, &mut order)?;
    }
    Ok(order)
}

/// Parses `modules.dep` into name -> (path, dependency names).
fn parse_modules_dep(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let Some((path, deps)) = line.split_once(':') else {
            continue;
        };
        let deps = deps.split_whitespace().map(module_name).collect();
        map.insert(module_name(path), (path.to_string(), deps));
    }
    map
}

/// `kernel/net/9p/9pnet_virtio.ko.xz` -> `9pnet_virtio` (dashes normalised to underscores).
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let base = file.split(".ko").next().unwrap_or(file);
    base.replace('-', "_")
}

fn visit(
    name: &str,
    deps: &BTreeMap<String, (String, Vec<String>)>,
    seen: &mut BTreeSet<String>,
    order: &mut Vec<(String, String)>,
) -> Result {
    if !seen.insert(name.to_string()) {
        return Ok(());
    }
    let Some((path, needs)) = deps.get(name) else {
        fail!("module {name} is not in the guest kernel's modules.dep")
    };
    for d in needs {
        visit(d, deps, seen, order)?;
    }
    order.push((name.to_string(), path.clone()));
    Ok(())
}

fn cache_key(kernel: &Kernel, order: &[(String, String)]) -> u64 {
    use std::hash::{Hash, Hasher};
    // FNV-1a-like stability is not needed: a changed key only rebuilds a 5 MB file.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    // This file's own text and /init's: any change to how the image is built rebuilds it.
    include_str!("initramfs.rs").hash(&mut h);
    script::INIT.hash(&mut h);
    kernel.version.hash(&mut h);
    order.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dependencies_come_first() {
        let text = "kernel/a/x.ko.xz: kernel/b/y.ko.xz kernel/c/z.ko.xz\n\
                    kernel/b/y.ko.xz: kernel/c/z.ko.xz\n\
                    kernel/c/z.ko.xz:\n";
        let deps = parse_modules_dep(text);
        let mut order = Vec::new();
        visit("x", &deps, &mut BTreeSet::new(), &mut order).unwrap();
        let names: Vec<_> = order.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["z", "y", "x"]);
    }

    #[test]
    fn module_names_are_normalised() {
        assert_eq!(module_name("kernel/fs/9p/9p.ko.xz"), "9p");
        assert_eq!(module_name("kernel/x/ip6-udp.ko"), "ip6_udp");
    }

    #[test]
    fn unknown_module_is_an_error() {
        let deps = parse_modules_dep("kernel/a.ko.xz:\n");
        let err = visit("nope", &deps, &mut BTreeSet::new(), &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("nope"));
    }
}
