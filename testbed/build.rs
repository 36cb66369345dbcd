//! Embeds `kernel-patches/` (the rxe and rdma-core patches, the test exporter's sources) into
//! the testbed, so that an installed `dmabuf-testbed` builds the patched stack without a
//! checkout of this repository.

use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernel-patches");
    println!("cargo:rerun-if-changed={}", root.display());
    let mut rows = String::new();
    for sub in ["linux", "rdma-core", "test-exporter"] {
        let dir = root.join(sub);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a readable folder entry").path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        for f in files {
            let abs = f.canonicalize().expect("a patch file's full path");
            let name = f.file_name().expect("a file name").to_string_lossy();
            rows.push_str(&format!(
                "    (\"{sub}/{name}\", include_bytes!({:?})),\n",
                abs.display().to_string()
            ));
        }
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::write(out.join("kernel_patches.rs"), format!("&[\n{rows}]"))
        .expect("OUT_DIR is writable");
}
