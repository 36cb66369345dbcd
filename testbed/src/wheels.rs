//! Python wheels whose programs the project runs (Mooncake's `transfer_engine_bench`, the peer
//! of `cargo xtask bench --peers`): each pinned by version, address and SHA-256, downloaded
//! into the cache and unpacked there (a wheel is a zip), never installed with pip. The cache is
//! under the host's root, which the guest sees at the same path, so an unpacked program runs in
//! the VM as it is; its shared libraries come with it (auditwheel's `RPATH`), except the
//! system libraries [`crate::setup::PACKAGES`] installs.

use crate::sh::{self, Result};
use crate::ui::Step;
use crate::{fail, programs, Cache};
use std::path::PathBuf;

/// One pinned wheel.
#[derive(Debug)]
pub struct Wheel {
    /// The distribution's name on PyPI.
    pub name: &'static str,
    /// Its version.
    pub version: &'static str,
    /// The file's address.
    pub url: &'static str,
    /// The file's SHA-256, hexadecimal: a download that differs is refused.
    pub sha256: &'static str,
    /// Why the project needs it.
    pub why: &'static str,
}

/// Mooncake's transfer engine, without CUDA: its `mooncake/transfer_engine_bench` runs over
/// host memory on any RDMA device (the testbed's soft-RoCE).
pub const MOONCAKE: Wheel = Wheel {
    name: "mooncake-transfer-engine-non-cuda",
    version: "0.3.13.post1",
    url: "https://files.pythonhosted.org/packages/56/23/\
          4cfbe98e9f9132f224234f393594dc841fe4a9b6a1330f5cd80df5471560/\
          mooncake_transfer_engine_non_cuda-0.3.13.post1-cp311-cp311-manylinux_2_28_x86_64.whl",
    sha256: "ca9f668a04ffe648b250fda28b97d0a7da149cb110dec5cf3d166a9e68afc940",
    why: "transfer_engine_bench, the peer of cargo xtask bench --peers",
};

/// NIXL's compiled package for CUDA 12 (its UCX backend, UCX and rdma-core bundled; it runs
/// on host memory without CUDA): the peer of our `nixl` package in `cargo xtask nixl-tests
/// --engine nixl` and `cargo xtask bench --peers --client nixl`. Fetched when first used.
pub const NIXL_CU12: Wheel = Wheel {
    name: "nixl-cu12",
    version: "1.4.0",
    url: "https://files.pythonhosted.org/packages/bc/44/\
          51d2fcc119c93bd5289c7e3172ae398225f37f7b1d88d61c142a2342cc4e/\
          nixl_cu12-1.4.0-cp311-cp311-manylinux_2_28_x86_64.whl",
    sha256: "4eaf0fc54a291fa04ffc786c82211b9504311b6729a08a5678649f88f0c0d205",
    why: "NIXL's agent with its UCX backend, the peer of our nixl package",
};

/// NIXL's `nixl` package: it finds `nixl_cu12` and names it `nixl` (`nixl._api`,
/// `nixl._bindings`, ...).
pub const NIXL: Wheel = Wheel {
    name: "nixl",
    version: "1.4.0",
    url: "https://files.pythonhosted.org/packages/d8/3d/\
          4bdcf8a39bce60e97bc92bf2c14af67d387373c907c06966fdca60bebf5d/\
          nixl-1.4.0-py3-none-any.whl",
    sha256: "aad5065c46ead71c96f485785a2cb6ef782b5a32cc6450aa7eff1735012d16c2",
    why: "the nixl name over nixl-cu12",
};

/// Every wheel `cargo xtask setup` unpacks.
pub const WHEELS: &[&Wheel] = &[&MOONCAKE];

/// Downloads (argv[1], the address) into a file next to the folder argv[3], checks its
/// SHA-256 against argv[2], unpacks it into argv[3] with each member's mode kept, and removes
/// the file.
const UNPACK: &str = r#"
import hashlib, os, sys, urllib.request, zipfile
url, want, dest = sys.argv[1:4]
part = dest + ".whl.part"
with urllib.request.urlopen(url, timeout=120) as r, open(part, "wb") as f:
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        f.write(b)
h = hashlib.sha256()
with open(part, "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
if h.hexdigest() != want:
    os.remove(part)
    sys.exit(f"{url}: SHA-256 {h.hexdigest()}, expected {want}")
with zipfile.ZipFile(part) as z:
    for m in z.infolist():
        out = z.extract(m, dest)
        mode = (m.external_attr >> 16) & 0o777
        if mode:
            os.chmod(out, mode)
os.remove(part)
"#;

impl Wheel {
    /// Where the wheel is unpacked in `cache`.
    pub fn dir(&self, cache: &Cache) -> PathBuf {
        cache.dir.join("wheels").join(format!(
            "{}-{}-{}",
            self.name,
            self.version,
            &self.sha256[..12]
        ))
    }

    /// Downloads, checks and unpacks the wheel into the cache once; returns its folder.
    ///
    /// # Errors
    /// The download fails or its SHA-256 differs, or unpacking fails.
    pub fn fetch(&self, cache: &Cache) -> Result<PathBuf> {
        let dir = self.dir(cache);
        if dir.join("complete").is_file() {
            return Ok(dir);
        }
        let step = Step::start(format!(
            "downloading {} {} (checked by its SHA-256)",
            self.name, self.version
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        sh::run(
            programs::cmd("/usr/bin/python3")
                .arg("-c")
                .arg(UNPACK)
                .arg(self.url)
                .arg(self.sha256)
                .arg(&dir),
        )
        .map_err(|e| format!("{}: {e}", self.name))?;
        sh::write(&dir.join("complete"), &format!("{}\n", self.sha256))?;
        step.done();
        Ok(dir)
    }

    /// The unpacked file `rel` (a program of the wheel), fetched first if needed.
    ///
    /// # Errors
    /// As [`Wheel::fetch`], or the wheel has no such file.
    pub fn program(&self, cache: &Cache, rel: &str) -> Result<PathBuf> {
        let file = self.fetch(cache)?.join(rel);
        if !file.is_file() {
            fail!("{} {} has no {rel}", self.name, self.version);
        }
        Ok(file)
    }
}

/// Unpacks every wheel of [`WHEELS`] (`cargo xtask setup`).
///
/// # Errors
/// As [`Wheel::fetch`].
pub fn fetch_all(cache: &Cache) -> Result {
    for w in WHEELS {
        w.fetch(cache)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheels_are_pinned_by_version_and_hash() {
        for w in WHEELS.iter().copied().chain([&NIXL_CU12, &NIXL]) {
            assert_eq!(w.sha256.len(), 64, "{}", w.name);
            assert!(w.sha256.bytes().all(|b| b.is_ascii_hexdigit()));
            let file = w.url.rsplit('/').next().unwrap();
            assert!(
                file.starts_with(&format!("{}-{}-", w.name.replace('-', "_"), w.version)),
                "{}: {file}",
                w.name
            );
            assert!(w.url.starts_with("https://") && !w.url.contains(' '));
        }
        let d = MOONCAKE.dir(&Cache::new("/c"));
        assert_eq!(
            d,
            PathBuf::from("/c/wheels/mooncake-transfer-engine-non-cuda-0.3.13.post1-ca9f668a04ff")
        );
    }
}
