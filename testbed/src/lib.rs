//! A VM testbed in which dma-buf RDMA runs end to end with no hardware: Debian's 6.12 kernel
//! under QEMU, with vgem, udmabuf and the system dma-heap as dma-buf exporters and soft-RoCE
//! (rxe), patched so that `ibv_reg_dmabuf_mr` works on it (or Debian's stock stack). One VM, or
//! two joined by a virtual wire.
//!
//! The `dmabuf-testbed` program (`src/main.rs`) runs a caller's command inside; `cargo xtask`
//! uses this library for the project's own tests. Start at [`vm::run`]; the README says what
//! the guest has and what it cannot do.

pub mod accel;
pub mod backports;
pub mod cli;
pub mod initramfs;
pub mod kernel;
pub mod klog;
pub mod packages;
pub mod patched;
pub mod programs;
pub mod script;
pub mod setup;
pub mod sh;
pub mod shscan;
pub mod ui;
pub mod vm;
pub mod wheels;

use std::path::PathBuf;

/// Environment variable that names the cache folder (see [`Cache::from_env`]).
pub const CACHE_ENV: &str = "DMABUF_TESTBED_CACHE";

/// The testbed's cache: the guest kernel, the initramfs, the patched stack, extra packages,
/// the KVM probe's verdicts and the run folders. Its path must be one line of UTF-8 text (the
/// guest's scripts name the run folders and the patched stack in it, [`vm::share`]); spaces,
/// commas, quotes and the like are carried escaped.
#[derive(Clone, Debug)]
pub struct Cache {
    /// The folder.
    pub dir: PathBuf,
}

impl Cache {
    /// The cache at `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Cache {
        Cache { dir: dir.into() }
    }

    /// `$DMABUF_TESTBED_CACHE` if set, else `$XDG_CACHE_HOME/dmabuf-testbed`, else
    /// `$HOME/.cache/dmabuf-testbed`; created if missing, and named by its canonical path
    /// (the patched stack's libraries are checked by path in the guest).
    ///
    /// # Errors
    /// None of the three variables is set, or the folder cannot be created.
    pub fn from_env() -> sh::Result<Cache> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let dir = if let Some(dir) = var(CACHE_ENV) {
            dir
        } else if let Some(xdg) = var("XDG_CACHE_HOME") {
            xdg.join("dmabuf-testbed")
        } else if let Some(home) = var("HOME") {
            home.join(".cache/dmabuf-testbed")
        } else {
            fail!("no cache folder: set {CACHE_ENV} (or XDG_CACHE_HOME or HOME)")
        };
        std::fs::create_dir_all(&dir)
            .and_then(|()| dir.canonicalize())
            .map(Cache::new)
            .map_err(|e| format!("cache folder {}: {e}", dir.display()).into())
    }
}

/// Every script the testbed runs or writes (except the initramfs's `/init`, which runs busybox
/// applets only, and `cmd.sh`, the caller's own command), generated with sample inputs: the
/// programs table's test checks each against the table. Filling a template in fails here when
/// a placeholder is left unfilled or a value names none.
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, String)> {
    use std::path::Path;
    let dir = Path::new("/t/run/a");
    let patched = patched::Patched {
        module: "/t/rdma_rxe.ko".into(),
        exporter: "/t/dmabuf_test_exporter.ko".into(),
        lib: "/t/lib".into(),
    };
    let mut out = vec![
        (
            "initramfs packing",
            initramfs::pack_script(Path::new("/t/x")),
        ),
        (
            "rxe-sources.sh",
            patched::source_script(Path::new("/t/x.deb"), Path::new("/t/x")).unwrap(),
        ),
        ("apt install", setup::install_script(&["a", "b"])),
        (
            "apt install with QEMU",
            setup::install_script(&["a", backports::QEMU_PACKAGE]),
        ),
        ("info.sh", script::INFO.to_string()),
    ];
    let kernel_root = std::path::Path::new("/cache/kernel/6.12");
    for (nodes, topology) in [(1, false), (2, false), (2, true)] {
        for p in [None, Some(&patched)] {
            let opts = vm::Opts {
                nodes,
                nics: if topology { vm::MAX_NICS } else { 1 },
                topology,
                env: vec![("K".into(), "v".into())],
                ..vm::Opts::default()
            };
            let inner = vm::inner_script(dir, 'a', &opts, p, kernel_root).unwrap();
            out.push(("inner.sh", inner));
        }
    }
    out
}
