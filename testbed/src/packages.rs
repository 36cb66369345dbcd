//! Debian packages added to the guest (`dmabuf-testbed run --package NAME`).
//!
//! The guest's userland is the host's root, shared read-only. Packages the host lacks are not
//! installed anywhere: apt resolves them against the host's installed set (`apt-get -s
//! install`, which needs no root), `apt-get download` fetches exactly those versions, and
//! `dpkg-deb -x` unpacks them into one folder of the cache. The guest's `/init` lays that folder
//! over the host's root (a read-only overlayfs, the unpacked packages on top) before it
//! chroots, so `/usr/bin/pytest-3` or a new compiler is simply there. Maintainer scripts do not
//! run: what a package makes in its `postinst` (alternatives links, generated caches) is
//! missing, and a package that upgrades one the host has shadows the host's files.

use crate::sh::{self, Result};
use crate::ui::{info, Step};
use crate::{fail, programs, Cache};
use std::path::PathBuf;

/// Whether `name` is a Debian package name (lower-case letters, digits, `+`, `-`, `.`; two
/// characters at least, starting with a letter or digit).
pub fn valid_name(name: &str) -> bool {
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c))
}

/// The packages (name, version) that `apt-get -s install` would install, from its output.
pub fn parse_simulation(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("Inst ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let Some(name) = words.next() else { continue };
        // `Inst name [old] (new suite [arch])`: the version is the first word in parentheses.
        let version = words.find_map(|w| w.strip_prefix('('));
        if let Some(v) = version {
            out.push((name.to_string(), v.to_string()));
        }
    }
    out.sort();
    out
}

/// Unpacks `wanted` and whatever they need that the host lacks into the cache (once per set);
/// returns the folder to lay over the guest's root, or `None` when nothing is missing.
///
/// # Errors
/// A name is not a package name, apt cannot resolve or download them, or unpacking fails.
pub fn unpack(cache: &Cache, wanted: &[String]) -> Result<Option<PathBuf>> {
    if wanted.is_empty() {
        return Ok(None);
    }
    if let Some(bad) = wanted.iter().find(|w| !valid_name(w)) {
        fail!("--package {bad:?}: not a Debian package name");
    }
    let step = Step::start(format!("resolving guest packages ({})", wanted.join(" ")));
    let sim = sh::output(
        programs::cmd("apt-get")
            .args(["-s", "-q", "install", "--no-install-recommends"])
            .args(wanted)
            .env("LC_ALL", "C"),
    )
    .map_err(|e| format!("{e}\n    (is the package list current? `apt-get update` as root)"))?;
    let needed = parse_simulation(&sim);
    if needed.is_empty() {
        step.done_with("all installed on the host already");
        return Ok(None);
    }
    step.done_with(&format!("{} to add", needed.len()));
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        needed.hash(&mut h);
        h.finish()
    };
    let dir = cache.dir.join(format!("packages-{key:016x}"));
    let root = dir.join("root");
    if dir.join("complete").is_file() {
        return Ok(Some(root));
    }
    let step = Step::start(format!(
        "downloading and unpacking {} packages",
        needed.len()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let debs = dir.join("debs");
    let specs: Vec<String> = needed.iter().map(|(n, v)| format!("{n}={v}")).collect();
    crate::patched::apt_download(&debs, &specs)?;
    std::fs::create_dir_all(&root)?;
    for e in std::fs::read_dir(&debs)? {
        let deb = e?.path();
        sh::run(programs::cmd("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    }
    let _ = std::fs::remove_dir_all(&debs);
    let names: Vec<&str> = needed.iter().map(|(n, _)| n.as_str()).collect();
    sh::write(&dir.join("complete"), &(names.join("\n") + "\n"))?;
    step.done();
    info(format!("guest packages: {}", names.join(" ")));
    Ok(Some(root))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulation_lines_give_names_and_versions() {
        let text = "NOTE: This is only a simulation!\n\
                    Inst python3-iniconfig (1.1.1-2 Debian:12.11/stable [all])\n\
                    Inst libfoo1 [1.0-1] (1.1-1 Debian:12.11/stable [amd64])\n\
                    Conf python3-iniconfig (1.1.1-2 Debian:12.11/stable [all])\n";
        assert_eq!(
            parse_simulation(text),
            [
                ("libfoo1".to_string(), "1.1-1".to_string()),
                ("python3-iniconfig".to_string(), "1.1.1-2".to_string())
            ]
        );
    }

    #[test]
    fn package_names_are_checked() {
        for good in ["python3-pytest", "g++", "libstdc++6", "gcc-12"] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", "a", "-x", "Foo", "a b", "x;rm", "x=1"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
