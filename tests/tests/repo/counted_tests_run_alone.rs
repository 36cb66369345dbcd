//! A VM test file whose tests count process-, device- or kernel-wide resources
//! (`integration_tests::counts`: descriptors, MRs, queue pairs, dma-bufs) has every one of its
//! VM tests take a lock shared by the file's tests (`process::alone()`, or a `static` mutex or
//! read-write lock of its own): the harness runs a file's tests two at a time, and a count
//! taken while a neighbour holds an MR is off by one (one MR before, none after); this holds
//! every file to the rule.
//!
//! The unit is the file, a module of a test binary of several (`tests/tests/rdma/*.rs`) or a
//! binary of its own (`tests/tests/*.rs`): `cargo xtask test` runs each file's VM tests in a
//! process of their own (xtask/src/testrun.rs), so only that file's tests are beside a count,
//! and a lock of the binary is the file's in that process.
//!
//! Read with a Rust parser (`syn`): a VM test is a function with an `#[ignore]` attribute, in
//! the file or in a module inside it; it serializes when its body calls `alone()` or calls
//! `lock`, `read` or `write` on a `SCREAMING_CASE` static.

use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// The counting functions of `integration_tests::counts`.
const COUNTS: [&str; 3] = ["rdma_resources", "dmabuf_objects", "open_fds"];

/// A file's VM tests, and the names of those whose bodies take no lock.
#[derive(Default)]
struct Unlocked {
    vm_tests: usize,
    unlocked: Vec<String>,
}

/// Whether `body` takes a lock shared by its file's tests.
fn takes_a_lock(body: &syn::Block) -> bool {
    let mut finder = LockFinder(false);
    finder.visit_block(body);
    finder.0
}

struct LockFinder(bool);

impl<'ast> Visit<'ast> for LockFinder {
    fn visit_expr_call(&mut self, call: &'ast syn::ExprCall) {
        if let syn::Expr::Path(p) = &*call.func {
            if p.path.segments.last().is_some_and(|s| s.ident == "alone") {
                self.0 = true;
            }
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        let method = call.method.to_string();
        if ["lock", "read", "write"].contains(&method.as_str()) {
            if let syn::Expr::Path(p) = &*call.receiver {
                let name = p.path.segments.last().map(|s| s.ident.to_string());
                if name.is_some_and(|n| {
                    n.chars()
                        .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
                }) {
                    self.0 = true;
                }
            }
        }
        syn::visit::visit_expr_method_call(self, call);
    }
}

impl<'ast> Visit<'ast> for Unlocked {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if f.attrs.iter().any(|a| a.path().is_ident("ignore")) {
            self.vm_tests += 1;
            if !takes_a_lock(&f.block) {
                self.unlocked.push(f.sig.ident.to_string());
            }
        }
        syn::visit::visit_item_fn(self, f);
    }
}

/// The `.rs` files under `dir`, in its folders too.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// For each test file under `dir` that calls a counting function and has more than one VM
/// test, the VM tests that take no lock (the file named by its path under `dir`).
fn unlocked_tests(dir: &Path) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut paths = Vec::new();
    rust_files(dir, &mut paths);
    paths.sort();
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        if !COUNTS.iter().any(|c| text.contains(&format!("{c}("))) {
            continue;
        }
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut v = Unlocked::default();
        v.visit_file(&ast);
        if v.vm_tests > 1 && !v.unlocked.is_empty() {
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            found.push((name, v.unlocked));
        }
    }
    found
}

#[test]
fn every_vm_test_of_a_binary_that_counts_resources_takes_its_lock() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let found = unlocked_tests(&dir);
    assert!(
        found.is_empty(),
        "VM tests that run beside a device- or process-wide count without their file's lock \
         (take `integration_tests::process::alone()` first): {found:#?}"
    );
}

/// The check finds what it looks for: a file that counts, with one locked and one unlocked
/// VM test, names the unlocked one only, in a folder as at the top; a lone VM test needs no
/// lock.
#[test]
fn the_check_names_an_unlocked_test_beside_a_count() {
    let dir = std::env::temp_dir().join(format!("counted-tests-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("area")).unwrap();
    std::fs::write(
        dir.join("area/two.rs"),
        "static COUNTING: RwLock<()> = RwLock::new(());\n\
         #[test] #[ignore] fn counts() { let _l = COUNTING.write(); rdma_resources(\"mr\"); }\n\
         #[test] #[ignore] fn locked() { let _l = alone(); }\n\
         mod inner { #[test] #[ignore] fn bare() { make_an_mr(); } }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("one.rs"),
        "#[test] #[ignore] fn counts() { open_fds(); }\n#[test] fn host() {}\n",
    )
    .unwrap();
    let found = unlocked_tests(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        vec![("area/two.rs".to_string(), vec!["bare".to_string()])]
    );
}
