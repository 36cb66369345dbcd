//! The VM phases of `cargo xtask test`, and which tests each takes.
//!
//! A test's phase is the module it is in ([`Phase::MODULES`], the one place these modules
//! are named), never words in its name: tests in `mod two_node { ... }` at the root of a test
//! file run in the two-node testbed (on both nodes, one test at a time), those in
//! `mod stock_only { ... }` on Debian's unpatched rxe, every other test in one VM with the
//! patched stack.
//!
//! A test file is a binary of its own (`tests/tests/x.rs`: paths `two_node::t`) or a module
//! of a binary of several (`tests/tests/rdma/x.rs`, declared by `tests/tests/rdma/main.rs`:
//! paths `x::two_node::t`), so the phase module is the first segment of a path or the
//! second, after the file's module ([`Phase::of`]); the path's part before it names the test
//! file ([`Phase::file_of`]), whose tests the VM runs in a process of their own
//! (xtask/src/testrun.rs). A phase's module anywhere else in a path is refused, so every VM
//! test is in exactly one phase; a test of this module reads the workspace's sources and
//! holds each phase module to the root of a test file, with only VM tests (`#[ignore]`) in
//! it.

use dmabuf_testbed::{sh, vm};

/// The VM phases, each with its label, node count, stack and the tests it takes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Phase {
    /// One VM, patched stack.
    One,
    /// One VM, stock stack.
    Stock,
    /// Two VMs, patched stack.
    Two,
    /// Two VMs, patched stack, four NICs (rails) each, placed in a PCIe tree on two NUMA
    /// nodes around a GPU (the testbed's `--topology`).
    Rails,
}

impl Phase {
    /// The phases a test enters by its module, at the root of its test file. A test in none
    /// of these modules runs in [`Phase::One`].
    pub(crate) const MODULES: [(&'static str, Phase); 3] = [
        ("two_node", Phase::Two),
        ("stock_only", Phase::Stock),
        ("two_node_rails", Phase::Rails),
    ];

    /// The phase whose module is named `segment`.
    fn module(segment: &str) -> Option<Phase> {
        Phase::MODULES
            .iter()
            .find(|(m, _)| *m == segment)
            .map(|(_, p)| *p)
    }

    /// The phase of the test at `path`, by its phase module: the first segment in a binary
    /// of one file (`two_node::x`), the second in a binary of several, after the file's
    /// module (`file::two_node::x`); [`Phase::One`] for a test in none (`x`, `file::x`). An
    /// error for a phase's module anywhere else in the path (`a::b::two_node::x`), or for
    /// two of them (`two_node::stock_only::x`), which would leave the test's phase unclear.
    pub(crate) fn of(path: &str) -> std::result::Result<Phase, String> {
        let segments: Vec<&str> = path.split("::").collect();
        // The modules: every segment but the test's name.
        let modules = &segments[..segments.len() - 1];
        let mut phases = modules
            .iter()
            .enumerate()
            .filter_map(|(at, s)| Some((at, *s, Phase::module(s)?)));
        let first = phases.next();
        let wrong = match (first, phases.next()) {
            (Some((_, m, _)), Some((_, other, _))) => Some(format!("`{m}` and `{other}`")),
            (Some((at, m, _)), None) if at > 1 => Some(format!("`{m}`")),
            _ => None,
        };
        if let Some(wrong) = wrong {
            return Err(format!(
                "test `{path}`: the phase module {wrong} must be the only one, at the root of \
                 its test file (the first segment of its path, or the second after the \
                 module of a test file in a binary of several)"
            ));
        }
        Ok(first.map_or(Phase::One, |(.., p)| p))
    }

    /// The test file of the test at `path`, as its path names it: its first module unless
    /// that is a phase's (`file::x`, `file::two_node::x`, `file::inner::x`: `file`); empty
    /// for a test at the root of its binary (`x`, `two_node::x`). In a binary of several
    /// test files, that module is the file; in a binary of one, the file is the binary and
    /// this is one of its modules, a finer group than the file.
    pub(crate) fn file_of(path: &str) -> &str {
        match path.split_once("::") {
            Some((first, _)) if Phase::module(first).is_none() => first,
            _ => "",
        }
    }

    pub(crate) fn nodes(self) -> u8 {
        if self.two_node() {
            2
        } else {
            1
        }
    }

    /// Whether it runs on two nodes (each test on both, in the same order).
    pub(crate) fn two_node(self) -> bool {
        matches!(self, Phase::Two | Phase::Rails)
    }

    /// NICs (rails) per node.
    pub(crate) fn nics(self) -> u8 {
        if self == Phase::Rails {
            4
        } else {
            1
        }
    }

    /// Whether its VMs boot with the PCIe topology (`vm::Opts::topology`).
    pub(crate) fn topology(self) -> bool {
        self == Phase::Rails
    }

    pub(crate) fn mode(self) -> vm::Mode {
        if self == Phase::Stock {
            vm::Mode::Stock
        } else {
            vm::Mode::Patched
        }
    }

    pub(crate) fn label(self) -> &'static str {
        match self {
            Phase::One => "1-node testbed, patched rxe",
            Phase::Stock => "1-node testbed, stock rxe",
            Phase::Two => "2-node testbed, patched rxe",
            Phase::Rails => "2-node testbed, patched rxe, 4 NICs per node in a PCIe topology",
        }
    }

    /// libtest arguments for this phase's `tests` of one test file (one process of its
    /// binary): each named exactly.
    pub(crate) fn args(self, tests: &[String]) -> String {
        let mut args = String::from("--exact");
        if self.two_node() {
            // Both nodes must step through the same tests in the same order.
            args.push_str(" --test-threads=1");
        }
        for t in tests {
            args.push(' ');
            args.push_str(&sh::quote(t));
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The module decides, not the name: words in a test's name send it nowhere.
    #[test]
    fn a_test_enters_a_phase_by_the_module_at_the_root_of_its_file_only() {
        // A binary of one test file: the phase module is the path's first segment.
        assert_eq!(Phase::of("two_node::x"), Ok(Phase::Two));
        assert_eq!(Phase::of("stock_only::x"), Ok(Phase::Stock));
        assert_eq!(Phase::of("two_node_rails::x"), Ok(Phase::Rails));
        assert_eq!(Phase::of("two_node_x"), Ok(Phase::One));
        assert_eq!(Phase::of("stock_only_x"), Ok(Phase::One));
        assert_eq!(Phase::of("x::y_two_node"), Ok(Phase::One));
        assert_eq!(
            Phase::of("two_node"),
            Ok(Phase::One),
            "a test, not a module"
        );
        // A binary of several: the second, after the file's module.
        assert_eq!(Phase::of("rdma_cm::two_node::x"), Ok(Phase::Two));
        assert_eq!(Phase::of("rdma_cm::stock_only::x"), Ok(Phase::Stock));
        assert_eq!(
            Phase::of("engine_rails::two_node_rails::x"),
            Ok(Phase::Rails)
        );
        assert_eq!(Phase::of("rdma_cm::x"), Ok(Phase::One));
        assert_eq!(Phase::of("rdma_cm::inner::x"), Ok(Phase::One));
        assert_eq!(Phase::of("rdma_cm::two_node"), Ok(Phase::One));
        // Deeper, or two of them: refused.
        assert!(Phase::of("a::b::two_node::x").is_err());
        assert!(Phase::of("rdma_cm::inner::two_node::x").is_err());
        assert!(Phase::of("two_node::stock_only::x").is_err());
        assert!(Phase::of("two_node::two_node::x").is_err());
    }

    /// A test's file: the module before its phase module, or its first module.
    #[test]
    fn a_tests_file_is_its_first_module_unless_that_is_a_phase() {
        assert_eq!(Phase::file_of("rdma_cm::two_node::x"), "rdma_cm");
        assert_eq!(Phase::file_of("rdma_cm::x"), "rdma_cm");
        assert_eq!(Phase::file_of("rdma_cm::inner::x"), "rdma_cm");
        assert_eq!(Phase::file_of("two_node::x"), "");
        assert_eq!(Phase::file_of("x"), "");
    }

    /// Whether `rel`, a path from the workspace root `root`, is a test file whose root is a
    /// test binary's or one module below it: `<package>/tests/x.rs` (a binary of one file) or
    /// `<package>/tests/<binary>/x.rs` (a binary of several: its `main.rs` or one of the
    /// modules it declares), where the root of the file is the first or second segment of
    /// its tests' paths ([`Phase::of`]).
    fn test_file(root: &std::path::Path, rel: &std::path::Path) -> bool {
        let parts: Vec<&std::ffi::OsStr> = rel.iter().collect();
        (2..=3).any(|up| {
            let Some(at) = parts.len().checked_sub(up) else {
                return false;
            };
            let package: std::path::PathBuf = parts[..at].iter().collect();
            parts[at] == "tests"
                && std::fs::read_to_string(root.join(package).join("Cargo.toml"))
                    .is_ok_and(|m| m.lines().any(|l| l.trim() == "[package]"))
        })
    }

    /// What a source file breaks of the rule: a phase module below the root of its file, in
    /// a file that is not a test file (`test_file`) or in a file of its own, or a test in one
    /// that is not a VM test (`#[ignore]`).
    fn misplaced(file: &str, test_file: bool, ast: &syn::File) -> (Vec<String>, usize) {
        fn has(attrs: &[syn::Attribute], name: &str) -> bool {
            attrs.iter().any(|a| a.path().is_ident(name))
        }
        fn walk(
            file: &str,
            test_file: bool,
            items: &[syn::Item],
            root: bool,
            out: &mut (Vec<String>, usize),
        ) {
            for item in items {
                let syn::Item::Mod(m) = item else { continue };
                let name = m.ident.to_string();
                let phase = Phase::MODULES.iter().any(|(p, _)| *p == name);
                let Some((_, content)) = &m.content else {
                    // A file of its own would be a test file named like a phase, its tests
                    // unchecked here.
                    if phase {
                        out.0
                            .push(format!("{file}: `mod {name};` is not written in place"));
                    }
                    continue;
                };
                if phase && !root {
                    out.0.push(format!(
                        "{file}: `mod {name}` is not at the root of its file"
                    ));
                } else if phase && !test_file {
                    out.0.push(format!(
                        "{file}: `mod {name}` is not in a test file (<package>/tests/x.rs or \
                         <package>/tests/<binary>/x.rs)"
                    ));
                }
                if phase {
                    for f in content.iter().filter_map(|i| match i {
                        syn::Item::Fn(f) if has(&f.attrs, "test") => Some(f),
                        _ => None,
                    }) {
                        if has(&f.attrs, "ignore") {
                            out.1 += 1;
                        } else {
                            out.0.push(format!(
                                "{file}: {name}::{} is not a VM test (#[ignore])",
                                f.sig.ident
                            ));
                        }
                    }
                }
                walk(file, test_file, content, false, out);
            }
        }
        let mut out = (Vec::new(), 0);
        walk(file, test_file, &ast.items, true, &mut out);
        out
    }

    /// Every phase module of the workspace's sources is at the root of a test file and holds
    /// VM tests only, so each VM test's path has its phase's module as its first segment, or
    /// its second after its file's module, or none.
    #[test]
    fn every_phase_module_is_at_the_root_of_its_file_and_holds_vm_tests() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut dirs = vec![root.clone()];
        let (mut bad, mut tests, mut files) = (Vec::new(), 0, 0);
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let entry = entry.unwrap();
                let path = entry.path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                // Not through links: the doctor's sysfs fixtures link in circles.
                let dir = entry.file_type().unwrap().is_dir();
                if dir && !name.starts_with('.') && name != "target" {
                    dirs.push(path);
                } else if name.ends_with(".rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    // Sources that do not parse (the compile-fail cases) hold no tests.
                    let Ok(ast) = syn::parse_file(&text) else {
                        continue;
                    };
                    let rel = path.strip_prefix(&root).unwrap();
                    let shown = rel.display().to_string();
                    let (b, t) = misplaced(&shown, test_file(&root, rel), &ast);
                    bad.extend(b);
                    tests += t;
                    files += 1;
                }
            }
        }
        assert!(files > 200, "{files} files read");
        assert!(tests >= 19, "only {tests} tests in phase modules");
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    /// The checker itself: a nested phase module, a host test in one and one outside the
    /// test files are found; the test files are those of a package's `tests` folder and of
    /// its binaries' folders, no deeper.
    #[test]
    fn the_source_check_finds_a_nested_phase_module_and_a_host_test_in_one() {
        let ast: syn::File = syn::parse_quote! {
            mod two_node {
                #[test] #[ignore = "needs the testbed VM"] fn ok() {}
                #[test] fn on_the_host() {}
            }
            mod other { mod stock_only { #[test] #[ignore] fn deep() {} } }
            mod two_node_rails;
        };
        let (bad, tests) = misplaced("x.rs", true, &ast);
        assert_eq!(tests, 2);
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(
            bad[0].contains("two_node::on_the_host is not a VM test"),
            "{bad:?}"
        );
        assert!(
            bad[1].contains("`mod stock_only` is not at the root"),
            "{bad:?}"
        );
        assert!(
            bad[2].contains("`mod two_node_rails;` is not written in place"),
            "{bad:?}"
        );
        let (bad, _) = misplaced("src/x.rs", false, &ast);
        assert!(
            bad[0].contains("`mod two_node` is not in a test file"),
            "{bad:?}"
        );

        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let file = |rel: &str| test_file(&root, std::path::Path::new(rel));
        assert!(file("tests/tests/x.rs") && file("tests/tests/rdma/x.rs"));
        assert!(file("tests/tests/rdma/main.rs") && file("testbed/tests/tool.rs"));
        assert!(!file("tests/tests/rdma/deeper/x.rs"));
        assert!(!file("tests/src/lib.rs") && !file("engine/src/metrics/mod.rs"));
    }
}
