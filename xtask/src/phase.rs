//! The VM phases of `cargo xtask test`, and which tests each takes.
//!
//! A test's phase is the module it is in, the first segment of its libtest path
//! ([`Phase::MODULES`], the one place these modules are named), never words in its name:
//! tests in `mod two_node { ... }` at the root of a test file run in the two-node testbed (on
//! both nodes, one test at a time), those in `mod stock_only { ... }` on Debian's unpatched
//! rxe, every other test in one VM with the patched stack. A phase's module anywhere else in
//! a path is refused, so every VM test is in exactly one phase; a test of this module reads
//! the workspace's sources and holds each phase module to the root of its file, with only
//! VM tests (`#[ignore]`) in it.

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
    /// The phases a test enters by its module: the first segment of its libtest path. A test
    /// in none of these modules runs in [`Phase::One`].
    pub(crate) const MODULES: [(&'static str, Phase); 3] = [
        ("two_node", Phase::Two),
        ("stock_only", Phase::Stock),
        ("two_node_rails", Phase::Rails),
    ];

    /// The phase of the test at `path` (`two_node::x`, `x`), by its first module; an error
    /// for a phase's module anywhere else in the path (`a::two_node::x`), which would leave
    /// the test's phase unclear.
    pub(crate) fn of(path: &str) -> std::result::Result<Phase, String> {
        let segments: Vec<&str> = path.split("::").collect();
        let module = |s: &str| {
            Phase::MODULES
                .iter()
                .find(|(m, _)| *m == s)
                .map(|(_, p)| *p)
        };
        let inner = segments
            .get(1..segments.len().saturating_sub(1))
            .unwrap_or(&[]);
        if let Some(deeper) = inner.iter().find(|s| module(s).is_some()) {
            return Err(format!(
                "test `{path}`: the phase module `{deeper}` must be the first segment of its \
                 path (at the root of its test file)"
            ));
        }
        Ok(match segments.as_slice() {
            [first, _, ..] => module(first).unwrap_or(Phase::One),
            _ => Phase::One,
        })
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

    /// libtest arguments for this phase's `tests` of one binary: each named exactly.
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
    fn a_test_enters_a_phase_by_its_first_module_only() {
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
        assert!(Phase::of("a::two_node::x").is_err());
        assert!(Phase::of("two_node::stock_only::x").is_err());
    }

    /// What a source file breaks of the rule: a phase module below the root of its file, or
    /// a test in one that is not a VM test (`#[ignore]`).
    fn misplaced(file: &str, ast: &syn::File) -> (Vec<String>, usize) {
        fn has(attrs: &[syn::Attribute], name: &str) -> bool {
            attrs.iter().any(|a| a.path().is_ident(name))
        }
        fn walk(file: &str, items: &[syn::Item], root: bool, out: &mut (Vec<String>, usize)) {
            for item in items {
                let syn::Item::Mod(m) = item else { continue };
                let Some((_, content)) = &m.content else {
                    continue;
                };
                let name = m.ident.to_string();
                let phase = Phase::MODULES.iter().any(|(p, _)| *p == name);
                if phase && !root {
                    out.0.push(format!(
                        "{file}: `mod {name}` is not at the root of its file"
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
                walk(file, content, false, out);
            }
        }
        let mut out = (Vec::new(), 0);
        walk(file, &ast.items, true, &mut out);
        out
    }

    /// Every phase module of the workspace's sources is at the root of its file and holds
    /// VM tests only, so each VM test's path starts with its phase's module or with none.
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
                    let shown = path.strip_prefix(&root).unwrap().display().to_string();
                    let (b, t) = misplaced(&shown, &ast);
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

    /// The checker itself: a nested phase module and a host test in one are found.
    #[test]
    fn the_source_check_finds_a_nested_phase_module_and_a_host_test_in_one() {
        let ast: syn::File = syn::parse_quote! {
            mod two_node {
                #[test] #[ignore = "needs the testbed VM"] fn ok() {}
                #[test] fn on_the_host() {}
            }
            mod other { mod stock_only { #[test] #[ignore] fn deep() {} } }
        };
        let (bad, tests) = misplaced("x.rs", &ast);
        assert_eq!(tests, 2);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(
            bad[0].contains("two_node::on_the_host is not a VM test"),
            "{bad:?}"
        );
        assert!(
            bad[1].contains("`mod stock_only` is not at the root"),
            "{bad:?}"
        );
    }
}
