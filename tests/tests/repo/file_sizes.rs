//! No source file of the libraries, the tests, the examples, xtask or the testbed is over 600 lines: a file
//! that long holds more than one concept and should be split along them.

use std::path::{Path, PathBuf};

const LIMIT: usize = 600;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n != "target" && n != "fixtures")
            {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_source_file_is_over_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "drm-export",
        "rdma-dmabuf",
        "engine",
        "doctor",
        "topology",
        "tests",
        "examples",
        "xtask",
        "bench",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).unwrap().lines().count();
            (n > LIMIT).then(|| format!("{} ({n} lines)", f.strip_prefix(&root).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "over {LIMIT} lines: {long:?}");
}
