//! No public function of the libraries returns a tuple with two values of one integer type
//! (`(u64, u64)`, `Result<(DmaBuf, u64, u64, u64)>`): two such values are easy to swap, and a
//! swap compiles. A struct with named fields (`RangeParts`, `BufferId`) or one method per
//! value says which is which.
//!
//! Read with a Rust parser: every `pub fn` (free or in an `impl`) of the libraries' sources,
//! outside `#[cfg(test)]` items, through `Result`, `Option` and other generic wrappers of
//! its return type. `pub(crate)` and private functions, and the methods of types declared
//! without `pub`, are left out: the rule is for the public API.

use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// The library crates, whose public API the rule covers.
const LIBRARIES: &[&str] = &[
    "drm-export",
    "rdma-dmabuf",
    "engine",
    "dmabuf-alloc",
    "topology",
];

const INTEGERS: &[&str] = &[
    "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
];

/// The integer type that appears more than once among the tuple's elements, anywhere in `ty`.
fn repeated_integer(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Tuple(t) => {
            let names: Vec<String> = t
                .elems
                .iter()
                .filter_map(|e| match e {
                    syn::Type::Path(p) => p.path.get_ident().map(|i| i.to_string()),
                    _ => None,
                })
                .filter(|n| INTEGERS.contains(&n.as_str()))
                .collect();
            let twice = names
                .iter()
                .find(|n| names.iter().filter(|m| m == n).count() > 1);
            twice
                .cloned()
                .or_else(|| t.elems.iter().find_map(repeated_integer))
        }
        syn::Type::Path(p) => p.path.segments.iter().find_map(|s| match &s.arguments {
            syn::PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                syn::GenericArgument::Type(t) => repeated_integer(t),
                _ => None,
            }),
            _ => None,
        }),
        syn::Type::Paren(p) => repeated_integer(&p.elem),
        syn::Type::Group(g) => repeated_integer(&g.elem),
        _ => None,
    }
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().trim() == "test")
    })
}

/// `pub fn`s returning a tuple of repeated integers, as "file: fn name -> type".
struct Finder<'f> {
    file: &'f str,
    /// Types the file declares without `pub`: their methods are not public API.
    private_types: Vec<String>,
    found: Vec<String>,
}

impl Finder<'_> {
    fn check(&mut self, vis: &syn::Visibility, sig: &syn::Signature) {
        if !matches!(vis, syn::Visibility::Public(_)) {
            return;
        }
        if let syn::ReturnType::Type(_, ty) = &sig.output {
            if let Some(int) = repeated_integer(ty) {
                self.found.push(format!(
                    "{}: fn {} returns several {int}s in one tuple",
                    self.file, sig.ident
                ));
            }
        }
    }
}

impl<'a> Visit<'a> for Finder<'_> {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        let of_private_type = matches!(&*i.self_ty, syn::Type::Path(p)
            if p.path.get_ident().is_some_and(|t| self.private_types.contains(&t.to_string())));
        if !is_cfg_test(&i.attrs) && !of_private_type {
            syn::visit::visit_item_impl(self, i);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_cfg_test(&f.attrs) {
            self.check(&f.vis, &f.sig);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            self.check(&f.vis, &f.sig);
        }
    }
}

fn findings(file: &str, ast: &syn::File) -> Vec<String> {
    let private_types = ast
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Struct(s) if !matches!(s.vis, syn::Visibility::Public(_)) => {
                Some(s.ident.to_string())
            }
            syn::Item::Enum(e) if !matches!(e.vis, syn::Visibility::Public(_)) => {
                Some(e.ident.to_string())
            }
            _ => None,
        })
        .collect();
    let mut f = Finder {
        file,
        private_types,
        found: Vec::new(),
    };
    f.visit_file(ast);
    f.found
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_public_function_of_the_libraries_returns_a_tuple_of_one_integer_type() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut files = 0;
    for krate in LIBRARIES {
        for path in rust_files(&root.join(krate).join("src")) {
            let text = std::fs::read_to_string(&path).unwrap();
            let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let shown = path.strip_prefix(&root).unwrap().display().to_string();
            found.extend(findings(&shown, &ast));
            files += 1;
        }
    }
    assert!(files > 50, "only {files} files read");
    assert!(
        found.is_empty(),
        "name the values (a struct, or one method each):\n{}",
        found.join("\n")
    );
}

/// The checker itself: it finds the tuple through `Result` and in methods, and leaves
/// private, `pub(crate)`, test-only and mixed-type returns, and the methods of a type the
/// file declares without `pub`, alone.
#[test]
fn the_checker_finds_repeated_integers_in_public_returns_only() {
    let ast: syn::File = syn::parse_quote! {
        pub fn parts(self) -> (DmaBuf, u64, u64, u64) { todo!() }
        pub fn ids(&self) -> Result<Option<(u32, u32)>> { todo!() }
        impl Thing { pub fn sge(&self) -> (u32, u32) { todo!() } }
        pub fn mixed(&self) -> (u32, Gid, u64) { todo!() }
        pub(crate) fn inner(&self) -> (u64, u64) { todo!() }
        fn private(&self) -> (u64, u64) { todo!() }
        pub(crate) struct Slots;
        impl Slots { pub fn acquire(&mut self) -> Result<(u32, u32)> { todo!() } }
        #[cfg(test)]
        mod tests { pub fn helper() -> (u8, u8) { todo!() } }
    };
    let found = findings("x.rs", &ast);
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(
        found[0].contains("fn parts returns several u64s"),
        "{found:?}"
    );
    assert!(
        found[1].contains("fn ids returns several u32s"),
        "{found:?}"
    );
    assert!(found[2].contains("fn sge"), "{found:?}");
}
