//! The lists in the docs that name code stay equal to the code: each crate's error variants
//! (docs/architecture.md, the `error` row of each crate's table) and every `unsafe fn` of the
//! library crates (docs/safety.md, between `<!-- unsafe-fns -->` markers). Parsed with `syn`,
//! so a new variant or a new `unsafe fn` fails this test until the docs name it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The variants of `pub enum Error` in `rel`.
fn error_variants(rel: &str) -> BTreeSet<String> {
    let file = syn::parse_file(&read(rel)).unwrap();
    file.items
        .iter()
        .find_map(|i| match i {
            syn::Item::Enum(e) if e.ident == "Error" => {
                Some(e.variants.iter().map(|v| v.ident.to_string()).collect())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{rel} has no `enum Error`"))
}

/// The names in the `Error::{...}` of the `error` row under `### <krate>`.
fn documented_errors(doc: &str, krate: &str) -> BTreeSet<String> {
    let section = doc
        .split(&format!("### {krate}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("docs/architecture.md has no `### {krate}`"));
    let row = section
        .lines()
        .find(|l| l.starts_with("| `error` |"))
        .unwrap_or_else(|| panic!("no `error` row under {krate}"));
    let list = row
        .split("Error::{")
        .nth(1)
        .and_then(|r| r.split('}').next())
        .unwrap_or_else(|| panic!("the {krate} error row has no `Error::{{...}}`"));
    list.split(',').map(|s| s.trim().to_string()).collect()
}

#[test]
fn architecture_error_lists_match_the_enums() {
    let doc = read("docs/architecture.md");
    for (krate, file) in [
        ("drm-export", "drm-export/src/error.rs"),
        ("rdma-dmabuf", "rdma-dmabuf/src/error.rs"),
    ] {
        assert_eq!(
            documented_errors(&doc, krate),
            error_variants(file),
            "docs/architecture.md's {krate} error list (left) differs from {file} (right)"
        );
    }
}

/// Every `unsafe fn` as `Type::name` (methods, by the impl's type) or `module::name` (free
/// functions, by the file's stem), `#[cfg(test)]` code left out.
#[derive(Default)]
struct UnsafeFns {
    module: String,
    self_ty: Vec<String>,
    found: BTreeSet<String>,
}

fn cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test")
    })
}

impl<'a> Visit<'a> for UnsafeFns {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if f.sig.unsafety.is_some() {
            self.found
                .insert(format!("{}::{}", self.module, f.sig.ident));
        }
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        let name = match &*i.self_ty {
            syn::Type::Path(p) => p.path.segments.last().unwrap().ident.to_string(),
            _ => "?".into(),
        };
        self.self_ty.push(name);
        syn::visit::visit_item_impl(self, i);
        self.self_ty.pop();
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if f.sig.unsafety.is_some() {
            let ty = self.self_ty.last().unwrap();
            self.found.insert(format!("{ty}::{}", f.sig.ident));
        }
        syn::visit::visit_impl_item_fn(self, f);
    }
}

fn unsafe_fns_in(krate: &str, found: &mut BTreeSet<String>) {
    let mut dirs = vec![root().join(krate).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let stem = path.file_stem().unwrap().to_string_lossy();
                let module = if stem == "mod" {
                    path.parent()
                        .unwrap()
                        .file_name()
                        .unwrap()
                        .to_string_lossy()
                } else {
                    stem
                };
                let file = syn::parse_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let mut v = UnsafeFns {
                    module: module.into_owned(),
                    ..UnsafeFns::default()
                };
                v.visit_file(&file);
                found.append(&mut v.found);
            }
        }
    }
}

#[test]
fn safety_unsafe_fn_list_matches_the_code() {
    let doc = read("docs/safety.md");
    let list = doc
        .split("<!-- unsafe-fns -->")
        .nth(1)
        .and_then(|r| r.split("<!-- /unsafe-fns -->").next())
        .expect("docs/safety.md has no <!-- unsafe-fns --> list");
    let documented: BTreeSet<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    let mut code = BTreeSet::new();
    unsafe_fns_in("drm-export", &mut code);
    unsafe_fns_in("rdma-dmabuf", &mut code);
    assert_eq!(
        documented, code,
        "docs/safety.md's unsafe fn list (left) differs from the code (right)"
    );
}
