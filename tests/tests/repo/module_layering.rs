//! Every crate of the workspace (the libraries, the engine, and the tooling: testbed, xtask,
//! doctor, examples, tests) has modules that depend on each other in one direction only, at
//! every level:
//! among the top-level modules of a crate, and among the files of each folder (`qp/post.rs`
//! and `qp/atomic.rs` are siblings under `qp`). A cycle means two concepts that cannot be
//! read, or changed, one without the other.
//!
//! Imports are read with a Rust parser (`syn`), not by text: grouped and nested `use` trees,
//! `crate::`, `super::` and `self::` paths, paths through a child module declared in the file,
//! and paths in types and expressions as well as in `use`, and every `a::b::c`
//! chain written inside a macro call's tokens (`format!`, `json!`, `vec![...]`: syn leaves those
//! unparsed). A name re-exported by a module
//! (`crate::Error`, re-exported at the root from `error`) counts as a use of the module that
//! defines it. `#[cfg(test)]` items are left out (unit tests may reach anywhere), and so are
//! a folder's own file (`lib.rs`, `qp/mod.rs`): it declares and re-exports its children.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

type ModPath = Vec<String>;

/// One source file: its module path and its parsed contents.
struct File {
    module: ModPath,
    ast: syn::File,
}

/// Reads the module tree of the crate whose root file is `root` (`lib.rs`, `main.rs`, an
/// example or a test), following each `mod name;` to `name.rs` or `name/mod.rs` beside the
/// file that declares it (in the folder named after the file, for a file other than a root
/// or a `mod.rs`), or to the file its `#[path]` names. `#[cfg(test)]` modules are left out.
fn read_tree(root: &Path) -> Vec<File> {
    let mut files = Vec::new();
    // (file, its module path, the folder its child modules' files live in)
    let mut todo = vec![(
        root.to_path_buf(),
        ModPath::new(),
        root.parent().unwrap().to_path_buf(),
    )];
    while let Some((path, module, dir)) = todo.pop() {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for item in &ast.items {
            let syn::Item::Mod(m) = item else { continue };
            if m.content.is_some() || is_cfg_test(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            let explicit = m.attrs.iter().find_map(|a| match &a.meta {
                syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(s),
                        ..
                    }) => Some(s.value()),
                    _ => None,
                },
                _ => None,
            });
            let (file, child_dir) = match explicit {
                Some(p) => {
                    let f = path.parent().unwrap().join(p);
                    let d = f.with_extension("");
                    (f, d)
                }
                None if dir.join(format!("{name}.rs")).is_file() => {
                    (dir.join(format!("{name}.rs")), dir.join(&name))
                }
                None => (dir.join(&name).join("mod.rs"), dir.join(&name)),
            };
            let mut child = module.clone();
            child.push(name);
            todo.push((file, child, child_dir));
        }
        files.push(File { module, ast });
    }
    files
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string().trim() == "test")
    })
}

/// What one module declares: its child modules, and the names it re-exports with the module
/// path each `pub use` names.
#[derive(Default)]
struct Declared {
    children: BTreeSet<String>,
    reexports: BTreeMap<String, Vec<String>>,
}

/// Flattens a `use` tree into (path segments, name it binds); a glob binds "*".
fn flatten(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push((path, n.ident.to_string()));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push((path, r.rename.to_string()));
        }
        syn::UseTree::Glob(_) => out.push((prefix.clone(), "*".into())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix, out);
            }
        }
    }
}

fn declarations(files: &[File]) -> BTreeMap<ModPath, Declared> {
    let mut all: BTreeMap<ModPath, Declared> = BTreeMap::new();
    for f in files {
        let decl = all.entry(f.module.clone()).or_default();
        for item in &f.ast.items {
            match item {
                syn::Item::Mod(m) if !is_cfg_test(&m.attrs) => {
                    decl.children.insert(m.ident.to_string());
                }
                syn::Item::Use(u) if !matches!(u.vis, syn::Visibility::Inherited) => {
                    let mut out = Vec::new();
                    flatten(&u.tree, &mut Vec::new(), &mut out);
                    for (path, name) in out {
                        decl.reexports.insert(name, path);
                    }
                }
                _ => {}
            }
        }
    }
    all
}

/// The module that `path`, written in module `at`, lands in: `None` for paths that leave
/// the crate (std, other crates) or name something local to the file.
fn resolve(decls: &BTreeMap<ModPath, Declared>, at: &ModPath, path: &[String]) -> Option<ModPath> {
    resolve_depth(decls, at, path, 0)
}

fn resolve_depth(
    decls: &BTreeMap<ModPath, Declared>,
    at: &ModPath,
    path: &[String],
    depth: usize,
) -> Option<ModPath> {
    if depth > 16 {
        return None;
    }
    let mut segs = path.iter().peekable();
    let mut cur: ModPath = match segs.peek()?.as_str() {
        "crate" => {
            segs.next();
            Vec::new()
        }
        "self" => {
            segs.next();
            at.clone()
        }
        "super" => {
            let mut m = at.clone();
            while segs.peek().is_some_and(|s| *s == "super") {
                segs.next();
                m.pop();
            }
            m
        }
        first if decls.get(at).is_some_and(|d| d.children.contains(first)) => at.clone(),
        _ => return None,
    };
    while let Some(seg) = segs.next() {
        let decl = decls.get(&cur)?;
        if decl.children.contains(seg.as_str()) {
            cur.push(seg.clone());
        } else if let Some(target) = decl.reexports.get(seg.as_str()) {
            if target
                .first()
                .is_some_and(|t| t != "crate" && t != "self" && t != "super")
                && !decl.children.contains(&target[0])
            {
                return Some(cur); // a re-export from another crate: stops here
            }
            let mut rest = target.clone();
            rest.extend(segs.cloned());
            return resolve_depth(decls, &cur, &rest, depth + 1).or(Some(cur));
        } else {
            return Some(cur); // an item of `cur` (or a glob we do not follow)
        }
    }
    Some(cur)
}

/// Collects every path a file names (in `use`, types, expressions, patterns), skipping
/// `#[cfg(test)]` items.
#[derive(Default)]
struct Paths(Vec<Vec<String>>);

impl<'a> Visit<'a> for Paths {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if !is_cfg_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        if is_cfg_test(&u.attrs) {
            return;
        }
        let mut out = Vec::new();
        flatten(&u.tree, &mut Vec::new(), &mut out);
        self.0.extend(out.into_iter().map(|(p, _)| p));
    }
    fn visit_path(&mut self, p: &'a syn::Path) {
        self.0
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
    fn visit_macro(&mut self, m: &'a syn::Macro) {
        self.0.extend(macro_paths(m));
        syn::visit::visit_macro(self, m);
    }
}

/// The paths written inside a macro call's tokens (`format!("{}", super::table::size(n))`,
/// `json!({ "x": crate::units::num(y) })`), which syn leaves unparsed: every `a::b::c` chain,
/// at any depth of brackets, for [`resolve`] to sort out as it does the parsed paths (it keeps
/// those that start with `crate`, `self`, `super` or a child module).
fn macro_paths(m: &syn::Macro) -> Vec<Vec<String>> {
    use syn::ext::IdentExt;
    use syn::parse::{ParseStream, Parser};
    use syn::Ident;
    fn scan(input: ParseStream, out: &mut Vec<Vec<String>>) -> syn::Result<()> {
        while !input.is_empty() {
            if input.peek(syn::token::Paren) {
                let inner;
                syn::parenthesized!(inner in input);
                scan(&inner, out)?;
            } else if input.peek(syn::token::Bracket) {
                let inner;
                syn::bracketed!(inner in input);
                scan(&inner, out)?;
            } else if input.peek(syn::token::Brace) {
                let inner;
                syn::braced!(inner in input);
                scan(&inner, out)?;
            } else if input.peek(Ident::peek_any) && input.peek2(syn::Token![::]) {
                // `a::b::c`, up to the first segment that is not a name (`::<T>`, `::*`).
                let mut path = vec![input.call(Ident::parse_any)?.to_string()];
                while input.peek(syn::Token![::]) && input.peek3(Ident::peek_any) {
                    input.parse::<syn::Token![::]>()?;
                    path.push(input.call(Ident::parse_any)?.to_string());
                }
                out.push(path);
            } else {
                // Any other token (a literal, a punctuation mark, a lone name, a `$`): skipped.
                input.step(|c| Ok(((), c.token_tree().map_or(*c, |(_, next)| next))))?;
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    // A body that cannot be read as tokens (none: it was lexed already) gives what was found.
    let _ = (|input: ParseStream| scan(input, &mut out)).parse2(m.tokens.clone());
    out
}

/// File module -> the modules it uses (itself left out).
fn file_graph(files: &[File]) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let decls = declarations(files);
    let mut graph = BTreeMap::new();
    for f in files {
        let mut paths = Paths::default();
        paths.visit_file(&f.ast);
        let uses: &mut BTreeSet<ModPath> = graph.entry(f.module.clone()).or_default();
        for p in paths.0 {
            if let Some(target) = resolve(&decls, &f.module, &p) {
                if target != f.module {
                    uses.insert(target);
                }
            }
        }
    }
    graph
}

/// For each folder (module with children), the graph among its children: child A uses child
/// B when a file under A uses a module under B.
fn sibling_graphs(
    graph: &BTreeMap<ModPath, BTreeSet<ModPath>>,
) -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let mut levels: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, targets) in graph {
        for depth in 0..from.len() {
            let parent = from[..depth].to_vec();
            let a = &from[depth];
            let level = levels.entry(parent.clone()).or_default();
            let edges = level.entry(a.clone()).or_default();
            for t in targets {
                if t.len() > depth && t[..depth] == parent[..] && &t[depth] != a {
                    edges.insert(t[depth].clone());
                }
            }
        }
    }
    levels
}

/// A cycle in `graph`, if any, as the path of nodes round it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut c = path[i..].to_vec();
            c.push(node.to_string());
            return Some(c);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

/// The cycles among the modules of the crate rooted at `root`, each as "`name`, under
/// `module`: a -> b -> a".
fn cycles_in(name: &str, root: &Path) -> Vec<String> {
    let graph = file_graph(&read_tree(root));
    sibling_graphs(&graph)
        .into_iter()
        .filter_map(|(parent, level)| {
            cycle(&level).map(|c| {
                let at = if parent.is_empty() {
                    "the crate root".to_string()
                } else {
                    parent.join("::")
                };
                format!("{name}, under {at}: {}", c.join(" -> "))
            })
        })
        .collect()
}

/// Every crate of the workspace, as `cargo metadata` lists them: (package, target kind and
/// name, root file), for libraries, programs, examples, tests and build scripts alike.
fn workspace_crates() -> Vec<(String, String, PathBuf)> {
    let out = std::process::Command::new("cargo")
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut crates = Vec::new();
    for package in meta["packages"].as_array().unwrap() {
        for target in package["targets"].as_array().unwrap() {
            crates.push((
                package["name"].as_str().unwrap().to_string(),
                format!(
                    "{} {}",
                    target["kind"][0].as_str().unwrap(),
                    target["name"].as_str().unwrap()
                ),
                PathBuf::from(target["src_path"].as_str().unwrap()),
            ));
        }
    }
    crates
}

/// No crate of the workspace, library or tool, has a module cycle at any level.
#[test]
fn no_crate_of_the_workspace_has_a_module_cycle_at_any_level() {
    let crates = workspace_crates();
    let packages: BTreeSet<&str> = crates.iter().map(|(p, ..)| p.as_str()).collect();
    // The libraries, the engine, the doctor, the tests, the examples, the testbed, the C
    // library and xtask: a member that `cargo metadata` stopped listing would go unchecked.
    for must in [
        "drm-export",
        "rdma-dmabuf",
        "gpu-rdma-engine",
        "gpu-rdma-doctor",
        "gpu-rdma-bench",
        "integration-tests",
        "examples",
        "dmabuf-testbed",
        "dmabuf-alloc",
        "xtask",
    ] {
        assert!(packages.contains(must), "{must} not among {packages:?}");
    }
    let mut found = Vec::new();
    for (package, target, root) in &crates {
        found.extend(cycles_in(&format!("{package} ({target})"), root));
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

/// The tree is read from the files a crate root declares, in a program (`main.rs`) as in a
/// library, and a cycle between a file and a folder's file is found.
#[test]
fn the_checker_reads_a_program_from_its_files_and_finds_a_cycle() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("module_layering_program");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("vm")).unwrap();
    let write = |f: &str, text: &str| std::fs::write(dir.join(f), text).unwrap();
    write("main.rs", "mod programs; mod vm; fn main() {}");
    write(
        "programs.rs",
        "pub fn run() { let _ = crate::vm::QEMU_BINARY; }",
    );
    write(
        "vm/mod.rs",
        "mod node; pub const QEMU_BINARY: &str = \"qemu\";",
    );
    write("vm/node.rs", "fn boot() { crate::programs::run(); }");
    let found = cycles_in("synthetic", &dir.join("main.rs"));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("programs -> vm -> programs"), "{found:?}");
    // Without the closing edge, none.
    write("programs.rs", "pub fn run() {}");
    assert!(cycles_in("synthetic", &dir.join("main.rs")).is_empty());
}

/// The checker itself: a path written inside a macro call (a `format!` argument, a nested
/// `vec![json!(...)]`) makes an edge, so a cycle closed that way is found.
#[test]
fn the_checker_sees_paths_inside_macro_calls() {
    let a: syn::File = syn::parse_quote! {
        fn f() -> String { format!("{}", super::b::size(1)) }
    };
    let b: syn::File = syn::parse_quote! {
        pub fn size(_: u64) -> String { String::new() }
        fn g() { let _ = vec![json!({ "k": crate::top::a::f() })]; }
    };
    let top: syn::File = syn::parse_quote! { mod a; mod b; };
    let root: syn::File = syn::parse_quote! { mod top; };
    let files = vec![
        File {
            module: vec![],
            ast: root,
        },
        File {
            module: vec!["top".into()],
            ast: top,
        },
        File {
            module: vec!["top".into(), "a".into()],
            ast: a,
        },
        File {
            module: vec!["top".into(), "b".into()],
            ast: b,
        },
    ];
    let levels = sibling_graphs(&file_graph(&files));
    let under_top = &levels[&vec!["top".to_string()]];
    assert!(under_top["a"].contains("b"), "{:?}", under_top);
    assert!(under_top["b"].contains("a"), "{:?}", under_top);
    assert!(cycle(under_top).is_some());
}

/// The checker itself: a grouped `use` through `super::` and a re-export make an edge, so a
/// cycle written that way is found.
#[test]
fn the_checker_sees_grouped_super_and_reexported_uses() {
    let a: syn::File = syn::parse_quote! {
        use super::{b::{Thing}, Other};
        fn f(_: crate::top::Reexported) {}
    };
    let b: syn::File = syn::parse_quote! { pub struct Thing; fn g() { super::a::h(); } };
    let top: syn::File = syn::parse_quote! {
        mod a; mod b; pub struct Other; pub use self::b::Thing as Reexported;
    };
    let root: syn::File = syn::parse_quote! { mod top; };
    let files = vec![
        File {
            module: vec![],
            ast: root,
        },
        File {
            module: vec!["top".into()],
            ast: top,
        },
        File {
            module: vec!["top".into(), "a".into()],
            ast: a,
        },
        File {
            module: vec!["top".into(), "b".into()],
            ast: b,
        },
    ];
    let levels = sibling_graphs(&file_graph(&files));
    let under_top = &levels[&vec!["top".to_string()]];
    assert!(under_top["a"].contains("b"), "{:?}", under_top);
    assert!(under_top["b"].contains("a"), "{:?}", under_top);
    assert!(cycle(under_top).is_some());
}
