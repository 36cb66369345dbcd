//! The Python package `gpu_rdma` (python/): its pytest suite and its KV-cache example run in
//! the testbed on the module `cargo xtask test` built and staged (`target/debug/python`, see
//! `cargo xtask python`), and mypy checks the stubs, the tests and the example on the host.
//! A pytest run that skips or deselects anything fails here: no green without every test.

use integration_tests::process::{run, spawn, text, wait};
use integration_tests::testbed::Testbed;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const T: Duration = Duration::from_secs(540);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}

/// The staged package folder, beside this test binary's profile folder.
fn staged() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("python");
    assert!(
        dir.join("gpu_rdma/_native.abi3.so").exists(),
        "{} has no gpu_rdma module: `cargo xtask test` (or `cargo xtask python`) builds it",
        dir.display()
    );
    dir
}

/// `/usr/bin/python3 args...` with the staged package importable, run in the staged folder
/// (python/ itself holds the package's sources without the module, and `-m` puts the working
/// folder first on the path); paths in `args` are relative to python/.
fn python(args: &[&str]) -> Command {
    // The testbed's table of programs: /usr/bin/python3 (python3-minimal), with the
    // Debian packages python3-pytest, python3-numpy and mypy for the modules run.
    let mut c = Command::new("/usr/bin/python3");
    let src = workspace().join("python");
    for a in args {
        if src.join(a).exists() {
            c.arg(src.join(a));
        } else {
            c.arg(a);
        }
    }
    c.current_dir(staged())
        .env("PYTHONPATH", staged())
        .env("PYTHONDONTWRITEBYTECODE", "1");
    c
}

/// Asserts that pytest's run passed every test it collected (at least `min`), none skipped.
fn all_passed(out: &Output, min: usize) {
    let t = text(out);
    assert!(out.status.success(), "pytest failed:\n{t}");
    let summary = t
        .lines()
        .rev()
        .find(|l| l.contains(" passed"))
        .unwrap_or_else(|| panic!("no pytest summary in:\n{t}"));
    for word in ["skipped", "deselected", "xfail", "xpass", "error", "failed"] {
        assert!(!summary.contains(word), "{summary}\n{t}");
    }
    let passed: usize = summary
        .split_whitespace()
        .zip(summary.split_whitespace().skip(1))
        .find(|(_, w)| w.starts_with("passed"))
        .and_then(|(n, _)| n.trim_start_matches('=').trim().parse().ok())
        .unwrap_or_else(|| panic!("no count in {summary:?}"));
    assert!(passed >= min, "{passed} passed, expected {min}:\n{t}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn pytest_suite_passes_on_loopback_rxe() {
    let _tb = Testbed::get();
    let out = run(
        &mut python(&[
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            "tests",
        ]),
        T,
    );
    println!("{}", text(&out));
    all_passed(&out, 94);
}

/// mypy --strict over the stubs, the tests and the example (the stubs stand for the module).
#[test]
fn the_stubs_type_check_the_tests_and_the_example() {
    let cache = workspace().join("target/mypy-cache");
    let mut c = Command::new("/usr/bin/python3");
    c.args(["-m", "mypy", "--strict", "--cache-dir"])
        .arg(&cache)
        .args(["gpu_rdma", "tests", "examples"])
        .current_dir(workspace().join("python"));
    let out = run(&mut c, T);
    assert!(out.status.success(), "mypy:\n{}", text(&out));
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;
    use integration_tests::mooncake::MooncakeServer;

    const PORT: u16 = 18_800;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_kv_cache_blocks_move_in_one_batch_and_are_checked() {
        let tb = Testbed::get();
        let (role, bind) = if tb.is_server() {
            ("decode", format!("{}:{PORT}", tb.local_addr))
        } else {
            ("prefill", format!("{}:0", tb.local_addr))
        };
        let peer = format!("{}:{PORT}", tb.peer_addr);
        let mut args = vec!["examples/kv_cache.py", role, "--bind", &bind];
        args.extend(["--device", &tb.device]);
        if !tb.is_server() {
            args.extend(["--peer", &peer]);
        }
        let child = spawn(&mut python(&args));
        let out = wait(child, T, role);
        let t = text(&out);
        println!("{t}");
        assert!(out.status.success(), "{role}:\n{t}");
        assert!(t.contains("RESULT ok blocks=32"), "{role}:\n{t}");
    }

    /// The code block in `doc` after the line that starts with `intro`, of language `lang`.
    fn block(doc: &str, intro: &str, lang: &str) -> String {
        let at = doc
            .lines()
            .position(|l| l.starts_with(intro))
            .unwrap_or_else(|| panic!("docs/python.md has no line starting {intro:?}"));
        let rest: Vec<&str> = doc.lines().skip(at).collect();
        let open = format!("```{lang}");
        let start = rest.iter().position(|l| *l == open).expect("a block") + 1;
        let len = rest[start..]
            .iter()
            .position(|l| *l == "```")
            .expect("closed");
        rest[start..start + len].join("\n") + "\n"
    }

    /// docs/python.md's two-node recipe, pasted as a user would: its `two_node.sh` and
    /// `kv_handoff.py` in a folder of their own (with the staged package at
    /// `target/debug/python` there), `sh two_node.sh` on both nodes: node a runs etcd and
    /// the target, node b the initiator, ordered by `wait_for_peer` and a notification.
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_the_docs_two_node_recipe_runs_as_pasted() {
        let tb = Testbed::get();
        let doc = std::fs::read_to_string(workspace().join("docs/python.md")).expect("docs");
        let dir = std::env::temp_dir().join(format!("recipe-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("target")).expect("a folder");
        let script = block(&doc, "`two_node.sh`:", "sh");
        std::fs::write(dir.join("two_node.sh"), script).expect("written");
        let program = block(&doc, "`kv_handoff.py`:", "python");
        std::fs::write(dir.join("kv_handoff.py"), program).expect("written");
        let profile = staged().parent().expect("target/<profile>").to_path_buf();
        std::os::unix::fs::symlink(&profile, dir.join("target/debug")).expect("linked");
        let mut sh = Command::new("sh");
        sh.arg("two_node.sh").current_dir(&dir);
        let role = if tb.is_server() {
            "target"
        } else {
            "initiator"
        };
        let out = wait(spawn(&mut sh), T, role);
        let t = text(&out);
        println!("{t}");
        assert!(out.status.success(), "{role}:\n{t}");
        let expected = if tb.is_server() {
            "target: blocks [3, 5, 9] ok"
        } else {
            "initiator: blocks [3, 5, 9]: done, done, done"
        };
        assert!(t.contains(expected), "{role}:\n{t}");
    }

    /// Mooncake's API between the nodes (python/examples/mooncake_pair.py): found by
    /// address, through our HTTP metadata server, and through Mooncake's own (the pinned
    /// wheel's, on the server node).
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_mooncake_api_moves_blocks_found_by_address_and_over_http() {
        let tb = Testbed::get();
        let node_a = if tb.is_server() {
            &tb.local_addr
        } else {
            &tb.peer_addr
        };
        let theirs = format!("http://{node_a}:{MOONCAKE_PORT}/metadata");
        for metadata in ["p2p", "http", theirs.as_str()] {
            let _server = (tb.is_server() && metadata == theirs).then(|| {
                let at = format!("{}:{MOONCAKE_PORT}", tb.local_addr);
                MooncakeServer::start(at.parse().expect("an address"))
            });
            let role = if tb.is_server() {
                "target"
            } else {
                "initiator"
            };
            let mut args = vec!["examples/mooncake_pair.py", role, "--host", &tb.local_addr];
            args.extend(["--device", &tb.device, "--metadata", metadata]);
            if !tb.is_server() {
                args.extend(["--peer", &tb.peer_addr]);
            }
            let out = wait(spawn(&mut python(&args)), T, role);
            let t = text(&out);
            println!("{t}");
            assert!(out.status.success(), "{role} ({metadata}):\n{t}");
            assert!(
                t.contains("RESULT ok blocks=100"),
                "{role} ({metadata}):\n{t}"
            );
        }
    }

    /// NIXL's agent API between the nodes (python/examples/nixl_pair.py): metadata through
    /// the target's listener, prepared lists, reads by shuffled block index, writes back,
    /// notifications.
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_nixl_api_reads_and_writes_blocks_by_index() {
        let tb = Testbed::get();
        let role = if tb.is_server() {
            "target"
        } else {
            "initiator"
        };
        let mut args = vec!["examples/nixl_pair.py", role, "--host", &tb.local_addr];
        if !tb.is_server() {
            args.extend(["--peer", &tb.peer_addr]);
        }
        let out = wait(spawn(&mut python(&args)), T, role);
        let t = text(&out);
        println!("{t}");
        assert!(out.status.success(), "{role}:\n{t}");
        assert!(t.contains("RESULT ok blocks=64"), "{role}:\n{t}");
    }

    /// Where node a runs Mooncake's HTTP metadata server.
    const MOONCAKE_PORT: u16 = 18_812;
}
