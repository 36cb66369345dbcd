//! `unsafe` lives in each library's raw layer (`src/sys/`) and nowhere else but in the few
//! places listed here, each with the contract that keeps it out of `sys`: the crates say
//! `#![deny(unsafe_code)]` (the engine `forbid`s it), so the compiler refuses an `unsafe`
//! block or `unsafe fn` anywhere without an `allow(unsafe_code)`, and this test refuses any
//! `allow(unsafe_code)` that is not in the table below (a new one fails until it is added
//! here and to docs/safety.md, "Where `unsafe` lives").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, relative to the workspace root.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// How many `allow(unsafe_code)` attributes each file under `src` has outside `src/sys/`
/// (comments left out), keyed by the path under `src`.
fn allows_outside_sys(src: &Path) -> BTreeMap<String, usize> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = BTreeMap::new();
    for file in files {
        let rel = file
            .strip_prefix(src)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.starts_with("sys/") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let n = text
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .filter(|code| code.contains("allow(unsafe_code)"))
            .count();
        if n > 0 {
            found.insert(rel, n);
        }
    }
    found
}

fn table(rows: &[(&str, usize, &str)]) -> BTreeMap<String, usize> {
    rows.iter().map(|(f, n, _)| (f.to_string(), *n)).collect()
}

/// drm-export: the CUDA driver's calls on device addresses, and one public promise.
const DRM_EXPORT: &[(&str, usize, &str)] = &[
    (
        "cuda.rs",
        1,
        "calls sys::cuda's unsafe fns on device addresses whose ranges it checked",
    ),
    (
        "dmabuf.rs",
        1,
        "DmaBuf::assume_udmabuf_small_pages: a public promise, no unsafe operation inside",
    ),
];

/// rdma-dmabuf: the ownership rules the compiler cannot see, and public promises.
const RDMA_DMABUF: &[(&str, usize, &str)] = &[
    (
        "mr.rs",
        1,
        "MemoryRegion::bytes_unchecked: a public promise, no unsafe operation inside",
    ),
    (
        "cache.rs",
        1,
        "RegistrationCache::checkout_with_unchecked: a public promise, no unsafe operation inside",
    ),
    (
        "cache/cuda.rs",
        1,
        "checkout_cuda keeps checkout_with_unchecked's promise with the driver's look-up",
    ),
    (
        "shard.rs",
        2,
        "a host shard's bytes: its range is its own (the split refused overlaps)",
    ),
    (
        "qp/entry.rs",
        5,
        "the entries of every post but a batch's and a shared queue's receive, the only \
         callers of post_raw: what a request names stays with the NIC until its completion \
         (the owned entry moves it into the handle, inline data is copied during the call, \
         scoped posts drain first)",
    ),
    (
        "qp/batch.rs",
        3,
        "a chain of writes whose parts move into one handle, posted through \
         ibv_post_send or the extended send verbs; a refused chain's slot given back",
    ),
    (
        "qp/srq.rs",
        1,
        "a shared queue's receive, its region moved into the handle or slot",
    ),
    (
        "scope/mod.rs",
        2,
        "scoped posts of borrowed parts, every one drained before the scope returns",
    ),
    (
        "slots.rs",
        1,
        "Slots::cancel: frees a slot only for a request the provider refused",
    ),
];

/// The Python package: a pinned buffer registered in place, and memory registered by address. Its raw layer (`src/sys/`) holds
/// CPython's buffer protocol (`PyObject_GetBuffer`, `PyBuffer_Release`), DLPack capsules
/// (their structs read, their tensor taken and its deleter called) and the duplicate of an
/// fd number.
const PYTHON: &[(&str, usize, &str)] = &[(
    "host.rs",
    2,
    "HostBuffer::from_foreign (a public unsafe fn of rdma-dmabuf) over a buffer export or a \
     taken DLPack tensor that the HostBuffer itself holds; and over an address the caller of \
     Agent.register_address promises stays allocated (Mooncake's register_memory)",
)];

#[test]
fn the_libraries_deny_unsafe_code_outside_their_raw_layer() {
    for (krate, lint) in [
        ("drm-export", "#![deny(unsafe_code)]"),
        ("rdma-dmabuf", "#![deny(unsafe_code)]"),
        ("python", "#![deny(unsafe_code)]"),
        ("topology", "#![deny(unsafe_code)]"),
        ("engine", "#![forbid(unsafe_code)]"),
    ] {
        let lib = std::fs::read_to_string(root().join(krate).join("src/lib.rs")).unwrap();
        assert!(lib.contains(lint), "{krate}/src/lib.rs lacks {lint}");
    }
    for krate in ["drm-export", "rdma-dmabuf", "python", "topology"] {
        let sys = std::fs::read_to_string(root().join(krate).join("src/sys/mod.rs")).unwrap();
        assert!(
            sys.contains("#![allow(unsafe_code)]"),
            "{krate}'s raw layer is where unsafe lives"
        );
    }
}

#[test]
fn unsafe_outside_the_raw_layers_is_only_where_the_table_says() {
    for (krate, rows) in [
        ("drm-export", DRM_EXPORT),
        ("rdma-dmabuf", RDMA_DMABUF),
        ("python", PYTHON),
        ("topology", &[]),
    ] {
        assert_eq!(
            allows_outside_sys(&root().join(krate).join("src")),
            table(rows),
            "{krate}: `allow(unsafe_code)` outside src/sys/ (file, count) differs from this \
             test's table: move the unsafe code into src/sys/ behind a safe function, or add \
             the file here and to docs/safety.md with the contract that keeps it out"
        );
    }
}

#[test]
fn the_scan_sees_an_allow_and_ignores_comments() {
    let dir = std::env::temp_dir().join(format!("unsafe-layer-{}", std::process::id()));
    let src = dir.join("k/src");
    std::fs::create_dir_all(src.join("sys")).unwrap();
    std::fs::write(src.join("sys/mod.rs"), "#![allow(unsafe_code)]\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "// allow(unsafe_code) in a comment\n#[allow(unsafe_code)]\nfn f() {}\n",
    )
    .unwrap();
    let found = allows_outside_sys(&src);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, BTreeMap::from([("a.rs".to_string(), 1)]));
}
